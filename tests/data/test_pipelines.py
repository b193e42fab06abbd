"""Loading, tokenising, splitting, batching, packing and resumable, host-sharded iterators."""

import itertools
import json

import numpy as np
import pytest

from seqjax.data.pipelines import (
    ArrayIterator,
    BatchIterator,
    LMWindowIterator,
    TBPTTIterator,
    bucket_batches,
    host_shard,
    load_parallel,
    load_text,
    pack_sequences,
    packed_attention_mask,
    packed_lm_targets,
    pad_batch,
    random_windows,
    shard_dataset,
    split_arrays,
    split_dataset,
    split_text,
    tokenize_dataset,
)
from seqjax.data.tokenizers import CharTokenizer


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- loading
def test_load_text_skips_empty_lines(tmp_path):
    p = _write(tmp_path / "a.txt", "to be\n\n   \nor not\n\nto be\n")
    assert list(load_text(p)["text"]) == ["to be", "or not", "to be"]
    kept = load_text(p, skip_empty=False)
    assert list(kept["text"]) == ["to be", "", "   ", "or not", "", "to be"]
    # empty lines survive tokenisation as length-0 rows and padding as all-False masks
    tok = CharTokenizer.from_text("to ben")
    ds = tokenize_dataset(kept, tok)
    assert list(ds["length"]) == [5, 0, 3, 6, 0, 5]
    b = pad_batch(ds["ids"][:2])
    assert b["lengths"].tolist() == [5, 0] and not b["mask"][1].any()


def test_load_text_document_paragraph_and_folder(tmp_path):
    p = _write(tmp_path / "b.txt", "one\ntwo\n\nthree\n")
    assert list(load_text(p, sample_by="document")["text"]) == ["one\ntwo\n\nthree\n"]
    assert list(load_text(p, sample_by="paragraph")["text"]) == ["one\ntwo", "three\n"]
    _write(tmp_path / "c.txt", "four")
    assert list(load_text(tmp_path)["text"]) == ["one", "two", "three", "four"]
    with pytest.raises(ValueError, match="sample_by"):
        load_text(p, sample_by="word")


def test_load_text_missing_local_file_never_goes_to_the_hub(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_text(tmp_path / "missing.txt")


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


# ----------------------------------------------------------------------------- splits
def test_split_dataset_is_seeded_and_disjoint():
    import datasets

    ds = datasets.Dataset.from_dict({"x": list(range(100))})
    tr, va = split_dataset(ds, 0.1, seed=3)
    tr2, va2 = split_dataset(ds, 0.1, seed=3)
    assert len(tr) == 90 and len(va) == 10
    assert list(va["x"]) == list(va2["x"])
    assert sorted(list(tr["x"]) + list(va["x"])) == list(range(100))
    assert list(split_dataset(ds, 0.1, seed=4)[1]["x"]) != list(va["x"])


def test_split_text_nanogpt_numbers_and_split_arrays():
    n = 1_115_394  # Tiny Shakespeare characters
    tr, va = split_text(np.zeros(n, np.int8))
    assert (len(tr), len(va)) == (1_003_854, 111_540)
    a = {"x": np.arange(10), "y": np.arange(10) * 2}
    train, test = split_arrays(a, 0.3, seed=0)
    assert len(test["x"]) == 3 and (train["y"] == 2 * train["x"]).all()
    assert sorted(np.r_[train["x"], test["x"]].tolist()) == list(range(10))
    with pytest.raises(ValueError, match="leading dimension"):
        split_arrays({"x": np.arange(3), "y": np.arange(4)})


# ----------------------------------------------------------------------------- windows
def test_random_windows_is_nanogpt_get_batch():
    data = np.arange(1000) * 7 % 101
    rng = np.random.default_rng(0)
    b = random_windows(data, 8, 16, rng)
    ix = np.random.default_rng(0).integers(0, len(data) - 16, size=8)
    for r, i in enumerate(ix):
        np.testing.assert_array_equal(b["inputs"][r], data[i : i + 16])
        np.testing.assert_array_equal(b["targets"][r], data[i + 1 : i + 17])
    assert b["inputs"].dtype == np.int32
    with pytest.raises(ValueError, match="longer than block_size"):
        random_windows(data[:16], 1, 16, rng)


def test_lm_window_iterator_resume_and_sharding():
    data = np.arange(500)
    it = LMWindowIterator(data, 4, 8, seed=1)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(it.state()))  # JSON-able, as in a checkpoint
    rest = [next(it) for _ in range(3)]
    again = LMWindowIterator(data, 4, 8, seed=1)
    again.restore(state)
    for a, b in zip(rest, [next(again) for _ in range(3)]):
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
    # two hosts together see the single-host global batch
    full = next(iter(LMWindowIterator(data, 8, 8, seed=1)))
    parts = [next(LMWindowIterator(data, 4, 8, seed=1, shard_index=i, shard_count=2))
             for i in range(2)]
    np.testing.assert_array_equal(np.concatenate([p["inputs"] for p in parts]), full["inputs"])
    with pytest.raises(ValueError, match="global_batch_size: expected 4, got 8"):
        LMWindowIterator(data, 4, 8, seed=1).restore(LMWindowIterator(data, 8, 8, seed=1).state())
    assert len(list(LMWindowIterator(data, 2, 8, num_steps=5))) == 5


@pytest.mark.parametrize("make", [
    lambda n, i, **kw: LMWindowIterator(np.arange(500), 8 // n, 8, seed=1, shard_index=i,
                                        shard_count=n),
    lambda n, i, **kw: TBPTTIterator(np.arange(500), 8 // n, 6, shard_index=i, shard_count=n),
    lambda n, i, **kw: ArrayIterator({"x": np.arange(50)}, 8 // n, seed=3, shard_index=i,
                                     shard_count=n),
    lambda n, i, **kw: BatchIterator([[j] * (1 + j % 5) for j in range(40)], 8 // n, seed=2,
                                     shard_index=i, shard_count=n),
], ids=["windows", "tbptt", "arrays", "padded"])
def test_iterator_state_resumes_on_another_topology(make):
    """A state saved by 2 hosts (4 rows each) restores on 1 host (8 rows) and on 4 hosts
    (2 rows each): they continue the same global stream."""
    hosts2 = [make(2, i) for i in range(2)]
    for _ in range(3):
        for h in hosts2:
            next(h)
    saved = json.loads(json.dumps(hosts2[0].state()))
    assert saved == hosts2[1].state()
    expect = [next(h) for h in hosts2]
    key = "inputs" if "inputs" in expect[0] else ("x" if "x" in expect[0] else "ids")
    glob = np.concatenate([e[key] for e in expect])
    one = make(1, 0)
    one.restore(saved)
    np.testing.assert_array_equal(next(one)[key], glob)
    hosts4 = [make(4, i) for i in range(4)]
    for h in hosts4:
        h.restore(saved)
    np.testing.assert_array_equal(np.concatenate([next(h)[key] for h in hosts4]), glob)


def test_tbptt_streams_are_contiguous():
    data = np.arange(1000)
    it = TBPTTIterator(data, batch_size=4, seq_len=10, num_epochs=1)
    batches = list(it)
    stream = (1000 - 1) // 4
    assert len(batches) == stream // 10 == it.steps_per_epoch
    x = np.concatenate([b["inputs"] for b in batches], axis=1)
    y = np.concatenate([b["targets"] for b in batches], axis=1)
    for r in range(4):  # row r is one contiguous piece of the stream
        np.testing.assert_array_equal(x[r], data[r * stream : r * stream + x.shape[1]])
    np.testing.assert_array_equal(y, x + 1)
    assert [bool(b["reset"].all()) for b in batches[:2]] == [True, False]
    # sharded hosts hold disjoint streams of the same global layout
    h1 = next(TBPTTIterator(data, 2, 10, shard_index=1, shard_count=2))
    np.testing.assert_array_equal(h1["inputs"], batches[0]["inputs"][2:])
    # resume mid-epoch
    it2 = TBPTTIterator(data, 4, 10)
    for _ in range(5):
        next(it2)
    st = it2.state()
    it3 = TBPTTIterator(data, 4, 10)
    it3.restore(st)
    np.testing.assert_array_equal(next(it3)["inputs"], batches[5]["inputs"])
    with pytest.raises(ValueError, match="too few"):
        TBPTTIterator(np.arange(20), 4, 10)


# ----------------------------------------------------------------------------- padding / buckets
def test_pad_batch_reference():
    seqs = [[3, 4, 5], [6], [], [7, 8]]
    b = pad_batch(seqs, pad_id=-1, pad_to_multiple=4)
    ref = np.full((4, 4), -1)
    for i, s in enumerate(seqs):
        ref[i, : len(s)] = s
    np.testing.assert_array_equal(b["ids"], ref)
    np.testing.assert_array_equal(b["mask"], ref != -1)
    assert b["lengths"].tolist() == [3, 1, 0, 2] and b["lengths"].dtype == np.int32
    assert b["mask"].dtype == bool and b["ids"].dtype == np.int32
    with pytest.raises(ValueError, match=r"seqs\[0\]` has length 3, longer than `length`=2"):
        pad_batch(seqs, length=2)


def test_bucket_batches_cover_everything_with_less_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 100, size=1000)
    batches = bucket_batches(lengths, 10, rng=np.random.default_rng(1), drop_remainder=False)
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))

    def waste(bs):
        return sum(lengths[b].max() * len(b) - lengths[b].sum() for b in bs)

    random_batches = np.split(np.random.default_rng(1).permutation(1000), 100)
    assert waste(batches) < 0.2 * waste(random_batches)


def _dataset_of_pairs(n=23):
    rng = np.random.default_rng(0)
    return {
        "src_ids": [list(rng.integers(3, 9, size=rng.integers(1, 12))) for _ in range(n)],
        "tgt_ids": [list(rng.integers(3, 9, size=rng.integers(1, 6))) for _ in range(n)],
    }


def test_batch_iterator_columns_and_naming():
    import datasets

    ds = datasets.Dataset.from_dict(_dataset_of_pairs())
    it = BatchIterator(ds, 4, columns=("src_ids", "tgt_ids"), shuffle=False, pad_to_multiple=8)
    b = next(it)
    assert set(b) == {"src_ids", "src_lengths", "src_mask", "tgt_ids", "tgt_lengths", "tgt_mask"}
    assert b["src_ids"].shape[1] % 8 == 0
    for r in range(4):
        assert b["src_ids"][r, : b["src_lengths"][r]].tolist() == list(ds[r]["src_ids"])
    assert it.steps_per_epoch == 23 // 4


def test_batch_iterator_resume_equals_uninterrupted():
    data = _dataset_of_pairs()
    kw = dict(columns=("src_ids", "tgt_ids"), seed=5, bucket=True, bucket_window=2)
    ref = [next(it) for it in [BatchIterator(data, 4, **kw)] for _ in range(12)]  # > 2 epochs
    it = BatchIterator(data, 4, **kw)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(it.state()))
    resumed = BatchIterator(data, 4, **kw)
    resumed.restore(state)
    for a, b in zip(ref[7:], [next(resumed) for _ in range(5)]):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    # epochs differ in order but each covers distinct examples
    epoch0 = np.concatenate(it.batches(0))
    assert len(set(epoch0.tolist())) == len(epoch0) == 20
    assert not np.array_equal(epoch0, np.concatenate(it.batches(1)))


def test_batch_iterator_host_sharding_matches_single_host():
    data = _dataset_of_pairs(40)
    kw = dict(columns=("src_ids",), seed=2, bucket=True)
    single = BatchIterator(data, 8, **kw)
    hosts = [BatchIterator(data, 4, shard_index=i, shard_count=2, **kw) for i in range(2)]
    for _ in range(6):
        g = next(single)
        parts = [next(h) for h in hosts]
        assert parts[0]["src_ids"].shape == parts[1]["src_ids"].shape  # same shapes on all hosts
        np.testing.assert_array_equal(np.concatenate([p["src_ids"] for p in parts]), g["src_ids"])
    with pytest.raises(ValueError, match="drop_remainder"):
        BatchIterator(data, 4, shard_index=0, shard_count=2, drop_remainder=False, **kw)


def test_batch_iterator_bad_inputs():
    with pytest.raises(ValueError, match="example 1 of column 'ids' has length 5"):
        BatchIterator([[1], [1, 2, 3, 4, 5]], 1, pad_to_length=4)
    with pytest.raises(ValueError, match="cannot fill one global batch"):
        BatchIterator([[1], [2]], 4)
    with pytest.raises(ValueError, match="not keys"):
        BatchIterator({"a": [[1]]}, 1, columns=("b",))
    b = next(BatchIterator([[1], [2, 3]], 2, pad_to_length=6, shuffle=False))
    assert b["ids"].shape == (2, 6)


def test_array_iterator_epochs_and_resume():
    arrays = {"x": np.arange(10), "y": np.arange(10) + 100}
    it = ArrayIterator(arrays, 3, seed=0, num_epochs=2)
    out = list(it)
    assert len(out) == 6
    first = np.concatenate([o["x"] for o in out[:3]])
    assert len(set(first.tolist())) == 9
    assert all((o["y"] == o["x"] + 100).all() for o in out)
    it2 = ArrayIterator(arrays, 3, seed=0, num_epochs=2)
    next(it2)
    it3 = ArrayIterator(arrays, 3, seed=0, num_epochs=2)
    it3.restore(it2.state())
    assert [o["x"].tolist() for o in it3] == [o["x"].tolist() for o in out[1:]]


def test_host_shard_and_shard_dataset():
    import datasets

    assert host_shard() == (0, 1)  # one process in tests
    with pytest.raises(ValueError, match="shard_index"):
        host_shard(2, 2)
    ds = datasets.Dataset.from_dict({"x": list(range(10))})
    parts = [list(shard_dataset(ds, i, 3)["x"]) for i in range(3)]
    assert sum(parts, []) == list(range(10))


# ----------------------------------------------------------------------------- packing
def test_pack_sequences_keeps_every_sequence_intact():
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(1, 50, size=rng.integers(1, 9))) for _ in range(40)]
    p = pack_sequences(seqs, 16)
    assert p["ids"].shape[1] == 16 and p["ids"].shape[0] < 40 * 8 / 16 + 5
    recovered = []
    for r in range(len(p["ids"])):
        for s in range(1, p["segment_ids"][r].max() + 1):
            where = np.flatnonzero(p["segment_ids"][r] == s)
            assert (np.diff(where) == 1).all()  # contiguous
            assert p["positions"][r, where].tolist() == list(range(len(where)))
            assert p["resets"][r, where[0]] and not p["resets"][r, where[1:]].any()
            recovered.append(p["ids"][r, where].tolist())
    assert sorted(recovered) == sorted(seqs)
    np.testing.assert_array_equal(p["mask"], p["segment_ids"] > 0)
    assert (p["ids"][~p["mask"]] == 0).all()


def test_pack_sequences_overflow_options():
    seqs = [[1, 2, 3, 4, 5, 6], [7]]
    with pytest.raises(ValueError, match=r"seqs\[0\]` has length 6, longer than `seq_len`=4"):
        pack_sequences(seqs, 4)
    t = pack_sequences(seqs, 4, overflow="truncate")
    assert t["ids"].tolist() == [[1, 2, 3, 4], [7, 0, 0, 0]]
    s = pack_sequences(seqs, 4, overflow="split")
    assert s["ids"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 0]]
    assert s["segment_ids"].tolist() == [[1, 1, 1, 1], [1, 1, 2, 0]]


def test_packed_lm_targets_never_cross_segments():
    p = pack_sequences([[1, 2, 3], [4, 5]], 6)
    t = packed_lm_targets(p)
    assert t["targets"].tolist() == [[2, 3, 0, 5, 0, 0]]
    assert t["loss_mask"].tolist() == [[True, True, False, True, False, False]]


def _softmax_attention(q, k, v, mask):
    s = q @ k.T / np.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def test_packed_attention_and_rnn_resets_equal_each_sequence_alone():
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(20, 4))
    wq, wk, wv = (rng.normal(size=(4, 4)) for _ in range(3))
    u, w = rng.normal(size=(4, 4)) * 0.5, rng.normal(size=(4, 4)) * 0.5
    seqs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    p = pack_sequences(seqs, 9)
    assert p["ids"].shape == (1, 9)
    mask = packed_attention_mask(p["segment_ids"])[0, 0]
    x = emb[p["ids"][0]]
    packed_att = _softmax_attention(x @ wq, x @ wk, x @ wv, mask)
    # Elman RNN with the carry zeroed where `resets` is True
    h, packed_rnn = np.zeros(4), []
    for t in range(9):
        h = np.tanh(np.where(p["resets"][0, t], 0.0, h) @ w + x[t] @ u)
        packed_rnn.append(h)
    for s_id, seq in enumerate(seqs, start=1):
        where = np.flatnonzero(p["segment_ids"][0] == s_id)
        xs = emb[seq]
        causal = np.tril(np.ones((len(seq), len(seq)), bool))
        alone = _softmax_attention(xs @ wq, xs @ wk, xs @ wv, causal)
        np.testing.assert_allclose(packed_att[where], alone, atol=1e-12)
        h, alone_rnn = np.zeros(4), []
        for t in range(len(seq)):
            h = np.tanh(h @ w + xs[t] @ u)
            alone_rnn.append(h)
        np.testing.assert_allclose(np.array(packed_rnn)[where], alone_rnn, atol=1e-12)


def test_packed_attention_mask_matches_nn_masks():
    masks = pytest.importorskip("seqjax.nn.masks")
    seg = pack_sequences([[1, 2], [3, 4, 5], [6]], 4)["segment_ids"]
    ours = packed_attention_mask(seg)
    theirs = np.asarray(masks.combine_masks(
        masks.segment_mask(seg, seg), masks.causal_mask(4), (seg > 0)[:, None, :, None]))
    np.testing.assert_array_equal(ours, theirs)
    nc = packed_attention_mask(seg, causal=False)
    assert nc[0, 0, 0].tolist() == [True, True, False, False]


def test_iterators_are_plain_python_iterators():
    it = ArrayIterator({"x": np.arange(4)}, 2, shuffle=False)
    assert [b["x"].tolist() for b in itertools.islice(it, 3)] == [[0, 1], [2, 3], [0, 1]]


# ----------------------------------------------------------------------------- hub code paths
def _fake_hub(monkeypatch, table):
    """Replace datasets.load_dataset by an in-memory table: the hub code runs, no network."""
    import datasets

    calls = []

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return datasets.Dataset.from_dict(table)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_load_text_hub_path_without_network(monkeypatch):
    calls = _fake_hub(monkeypatch, {"content": ["a\nb", "", "c"], "id": [1, 2, 3]})
    ds = load_text("someone/corpus", text_field="content", split="validation")
    assert calls == [("someone/corpus", None, "validation")]
    assert ds.column_names == ["text"] and ds["text"][:] == ["a\nb", "c"]
    assert load_text("someone/corpus", text_field="content", sample_by="line")["text"][:] == [
        "a", "b", "c"]
    assert load_text("someone/corpus", text_field="content", sample_by="document")[
        "text"][:] == ["a\nb\n\nc"]
    with pytest.raises(ValueError, match="no column `text_field`='text'"):
        load_text("someone/corpus")


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

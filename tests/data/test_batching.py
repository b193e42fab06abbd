"""seqjax.data.batching: splits, LM windows, padding, bucketing and packing against references."""


import numpy as np
import pytest

from seqjax.data.batching import (
    bucket_batches,
    pack_sequences,
    packed_attention_mask,
    packed_lm_targets,
    pad_batch,
    split_arrays,
    split_text,
)


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


def test_lm_windows_are_nanogpt_get_batch():
    from seqjax.data import LMWindowIterator

    data = np.arange(1000) * 7 % 101
    b = next(LMWindowIterator(data, 8, 16, seed=0))
    ix = np.random.default_rng([0, 0]).integers(0, len(data) - 16, size=8)
    for r, i in enumerate(ix):
        np.testing.assert_array_equal(b["inputs"][r], data[i : i + 16])
        np.testing.assert_array_equal(b["targets"][r], data[i + 1 : i + 17])
    assert b["inputs"].dtype == np.int32
    with pytest.raises(ValueError, match="longer than block_size"):
        LMWindowIterator(data[:16], 1, 16)


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
    with pytest.raises(ValueError, match=r"seqs\[0\]` has length 6, longer than `block_size`=4"):
        pack_sequences(seqs, 4)
    with pytest.raises(TypeError, match="`seq_len` is renamed `block_size`"):
        pack_sequences(seqs, seq_len=4)
    assert pack_sequences(seqs, block_size=8)["ids"].shape == (1, 8)
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

"""Synthetic tasks (seqjax.data.synthetic): each generator against a plain reference of its
definition, seeded and reproducible, with clear errors."""

import numpy as np
import pytest

from seqjax.data.synthetic import (
    BOS_ID,
    EOS_ID,
    FIRST_SYMBOL,
    PAD_ID,
    adding_problem,
    agreement_vocabulary,
    associative_recall,
    copy_memory,
    copy_task,
    long_range_agreement,
    reverse_task,
    selective_copying,
    sort_task,
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

"""seqjax.data.iterators: resumable, host-sharded iterators; states resume on another topology."""

import itertools
import json

import numpy as np
import pytest

from seqjax.data.iterators import (
    ArrayIterator,
    BatchIterator,
    LMWindowIterator,
    ResumableIterator,
    TBPTTIterator,
)


def test_lm_window_iterator_resume_and_sharding():
    data = np.arange(500)
    it = LMWindowIterator(data, 4, 8, seed=1)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # JSON-able, as in a checkpoint
    rest = [next(it) for _ in range(3)]
    again = LMWindowIterator(data, 4, 8, seed=1)
    again.set_state(state)
    for a, b in zip(rest, [next(again) for _ in range(3)]):
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
    # two hosts together see the single-host global batch
    full = next(iter(LMWindowIterator(data, 8, 8, seed=1)))
    parts = [next(LMWindowIterator(data, 4, 8, seed=1, host_index=i, host_count=2))
             for i in range(2)]
    np.testing.assert_array_equal(np.concatenate([p["inputs"] for p in parts]), full["inputs"])
    with pytest.raises(ValueError, match="global_batch_size: expected 4, got 8"):
        LMWindowIterator(data, 4, 8, seed=1).set_state(
            LMWindowIterator(data, 8, 8, seed=1).get_state())
    assert len(list(LMWindowIterator(data, 2, 8, steps=5))) == 5


@pytest.mark.parametrize("make", [
    lambda n, i, **kw: LMWindowIterator(np.arange(500), 8 // n, 8, seed=1, host_index=i,
                                        host_count=n),
    lambda n, i, **kw: TBPTTIterator(np.arange(500), 8 // n, 6, host_index=i, host_count=n),
    lambda n, i, **kw: ArrayIterator({"x": np.arange(50)}, 8 // n, seed=3, host_index=i,
                                     host_count=n),
    lambda n, i, **kw: BatchIterator([[j] * (1 + j % 5) for j in range(40)], 8 // n, seed=2,
                                     host_index=i, host_count=n),
], ids=["windows", "tbptt", "arrays", "padded"])
def test_iterator_state_resumes_on_another_topology(make):
    """A state saved by 2 hosts (4 rows each) restores on 1 host (8 rows) and on 4 hosts
    (2 rows each): they continue the same global stream."""
    hosts2 = [make(2, i) for i in range(2)]
    for _ in range(3):
        for h in hosts2:
            next(h)
    saved = json.loads(json.dumps(hosts2[0].get_state()))
    assert saved == hosts2[1].get_state()
    expect = [next(h) for h in hosts2]
    key = "inputs" if "inputs" in expect[0] else ("x" if "x" in expect[0] else "ids")
    glob = np.concatenate([e[key] for e in expect])
    one = make(1, 0)
    one.set_state(saved)
    np.testing.assert_array_equal(next(one)[key], glob)
    hosts4 = [make(4, i) for i in range(4)]
    for h in hosts4:
        h.set_state(saved)
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
    h1 = next(TBPTTIterator(data, 2, 10, host_index=1, host_count=2))
    np.testing.assert_array_equal(h1["inputs"], batches[0]["inputs"][2:])
    # resume mid-epoch
    it2 = TBPTTIterator(data, 4, 10)
    for _ in range(5):
        next(it2)
    st = it2.get_state()
    it3 = TBPTTIterator(data, 4, 10)
    it3.set_state(st)
    np.testing.assert_array_equal(next(it3)["inputs"], batches[5]["inputs"])
    with pytest.raises(ValueError, match="too few"):
        TBPTTIterator(np.arange(20), 4, 10)


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
    state = json.loads(json.dumps(it.get_state()))
    resumed = BatchIterator(data, 4, **kw)
    resumed.set_state(state)
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
    hosts = [BatchIterator(data, 4, host_index=i, host_count=2, **kw) for i in range(2)]
    for _ in range(6):
        g = next(single)
        parts = [next(h) for h in hosts]
        assert parts[0]["src_ids"].shape == parts[1]["src_ids"].shape  # same shapes on all hosts
        np.testing.assert_array_equal(np.concatenate([p["src_ids"] for p in parts]), g["src_ids"])
    with pytest.raises(ValueError, match="drop_remainder"):
        BatchIterator(data, 4, host_index=0, host_count=2, drop_remainder=False, **kw)


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
    it3.set_state(it2.get_state())
    assert [o["x"].tolist() for o in it3] == [o["x"].tolist() for o in out[1:]]


def test_iterators_are_plain_python_iterators():
    it = ArrayIterator({"x": np.arange(4)}, 2, shuffle=False)
    assert [b["x"].tolist() for b in itertools.islice(it, 3)] == [[0, 1], [2, 3], [0, 1]]


def test_one_iterator_family_with_one_state_pair():
    import seqjax.data

    for cls in (LMWindowIterator, TBPTTIterator, ArrayIterator, BatchIterator):
        assert issubclass(cls, ResumableIterator)
        assert not hasattr(cls, "state") and not hasattr(cls, "restore")  # one name per method
        assert cls is getattr(seqjax.data, cls.__name__)
    with pytest.raises(TypeError, match="`state` must be a dict"):
        ArrayIterator({"x": np.arange(4)}, 2).set_state([0, 1])
    with pytest.raises(ValueError, match=r"lacks the keys \['step'\]"):
        ArrayIterator({"x": np.arange(4)}, 2).set_state(
            {"kind": "arrays", "seed": 0, "global_batch_size": 2, "shuffle": True,
             "num_examples": 4, "epoch": 0})


def test_states_of_older_versions_are_accepted():
    data = np.arange(500)
    # per-host batch_size + shard_count (before global_batch_size was recorded)
    it = LMWindowIterator(data, 4, 8, seed=1, host_index=0, host_count=2)
    next(it)
    old = {k: v for k, v in it.get_state().items() if k != "global_batch_size"}
    one = LMWindowIterator(data, 8, 8, seed=1)
    one.set_state({**old, "batch_size": 4, "shard_count": 2})
    assert one.step == 1
    # {"epoch", "index"} of the former seqjax.train.ArrayIterator (global batch, same order):
    # its next batch was rows [index*b, (index+1)*b) of permutation_{(seed, epoch)}(N)
    arrays = {"x": np.arange(10)}
    it = ArrayIterator(arrays, 4, seed=3)
    it.set_state({"epoch": 1, "index": 1})
    order = np.random.default_rng([3, 1]).permutation(10)
    np.testing.assert_array_equal(next(it)["x"], order[4:8])
    it.set_state({"epoch": 0, "index": 2})  # saved after epoch 0's last batch
    assert (it.epoch, it.step) == (1, 0)


def test_a_subclass_without_a_position_keeps_the_default():
    class Count(ResumableIterator):
        kind = "count"

        def __next__(self):
            return {"x": np.zeros(1)}

    it = Count()
    assert it.get_state() == {"kind": "count"}
    it.set_state({"kind": "count"})

"""Checkpoints: exact round trip, keep last K + best, bad newest skipped, mismatch errors."""

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.train.checkpoint import (
    Checkpointer,
    CheckpointMismatchError,
    CheckpointWarning,
    load_meta,
    load_tokenizer_json,
    restore_params,
)
from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer


def _state(hidden=3, step=0, seed=0, carry=None):
    rng = np.random.default_rng(seed)
    params = {
        "embed": {"embedding": rng.normal(size=(5, hidden)).astype(np.float32)},
        "head": {"kernel": rng.normal(size=(hidden, 5)).astype(np.float32),
                 "bias": rng.normal(size=(5,)).astype(np.float32)},
    }
    tx, _ = make_optimizer(OptimizerConfig(name="adamw", weight_decay=0.1, clip_norm=1.0))
    s = TrainState.create(jax.tree_util.tree_map(jnp.asarray, params), tx,
                          jax.random.PRNGKey(seed), carry=carry)
    # Non-trivial optimiser state: Adam moments filled with random values.
    opt = jax.tree_util.tree_map(
        lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype)
        if jnp.issubdtype(x.dtype, jnp.floating) else x + step, s.opt_state)
    return s.replace(step=jnp.int32(step), opt_state=opt)


def _equal(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                      for x, y in zip(la, lb))


@pytest.mark.parametrize("async_save", [True, False])
def test_round_trip_is_exact(tmp_path, async_save):
    carry = (jnp.arange(6.0).reshape(2, 3), -jnp.ones((2, 3)))
    s = _state(step=7, seed=1, carry=carry)
    with Checkpointer(tmp_path, async_save=async_save, model_config={"hidden": 3},
                      tokenizer='{"model": {"vocab": {"a": 0}}}') as ckpt:
        assert ckpt.save(s, data_state={"epoch": 2, "index": 5}, metrics={"loss": 1.5})
        assert not ckpt.save(s)  # the same step twice is a no-op
        ckpt.wait()
        r = ckpt.restore(_state(seed=2, carry=jax.tree_util.tree_map(jnp.zeros_like, carry)))
    assert r.step == 7 and int(r.state.step) == 7
    assert r.data_state == {"epoch": 2, "index": 5} and r.meta["metrics"] == {"loss": 1.5}
    assert _equal(r.state.params, s.params) and _equal(r.state.opt_state, s.opt_state)
    assert _equal(r.state.rng, s.rng) and _equal(r.state.carry, carry)
    assert r.state.tx is s.tx or r.state.tx is not None
    assert load_meta(tmp_path)["model_config"] == {"hidden": 3}
    assert load_tokenizer_json(tmp_path) == {"model": {"vocab": {"a": 0}}}
    params = restore_params(tmp_path)  # parameters alone, no optimizer needed
    assert _equal(params, s.params)


def test_keep_last_k_and_best(tmp_path):
    losses = {1: 5.0, 2: 1.0, 3: 3.0, 4: None, 5: 4.0, 6: None}
    with Checkpointer(tmp_path, keep=2, best_metric="eval/loss", best_mode="min") as ckpt:
        for step, loss in losses.items():
            metrics = {"loss": 9.0} if loss is None else {"eval/loss": loss}
            ckpt.save(_state(step=step), metrics=metrics)
        ckpt.wait()
        assert ckpt.all_steps() == [2, 5, 6]  # best (loss 1.0) + the last two
        assert ckpt.best_step() == 2
    best = restore_params(tmp_path, "best")
    assert _equal(best, _state(step=2).params)
    with Checkpointer(tmp_path / "max", keep=1, best_metric="acc", best_mode="max") as ckpt:
        for step, acc in [(1, 0.2), (2, 0.9), (3, 0.5)]:
            ckpt.save(_state(step=step), metrics={"acc": acc})
        ckpt.wait()
        assert ckpt.all_steps() == [2, 3] and ckpt.best_step() == 2


def _corrupt(step_dir):
    """Overwrite every data file of the `params` item: the index still lists it, reads fail."""
    n = 0
    for root, _, files in os.walk(os.path.join(step_dir, "params")):
        for f in files:
            if f not in ("_METADATA", "commit_success.txt"):
                with open(os.path.join(root, f), "wb") as fh:
                    fh.write(b"\x00garbage")
                n += 1
    assert n


# orbax may leave a callback on a closed event loop after a failed read; harmless.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_corrupted_newest_is_skipped_with_a_warning(tmp_path):
    with Checkpointer(tmp_path, keep=3, async_save=False) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(_state(step=step, seed=step))
    _corrupt(tmp_path / "3")
    # An interrupted write leaves only a temporary directory: never listed.
    os.makedirs(tmp_path / "4.orbax-checkpoint-tmp-123" / "params")
    with Checkpointer(tmp_path, keep=3) as ckpt:
        assert ckpt.all_steps() == [1, 2, 3]
        assert not (tmp_path / "4.orbax-checkpoint-tmp-123").exists()  # cleaned up
        with pytest.warns(CheckpointWarning, match="step 3 .* unreadable"):
            r = ckpt.restore(_state())
        assert r.step == 2 and _equal(r.state.params, _state(step=2, seed=2).params)
        assert ckpt.all_steps() == [1, 2]
        assert os.listdir(str(tmp_path) + ".corrupted")[0].startswith("3-")
        assert ckpt.save(_state(step=3, seed=9))  # the step can be written again
        ckpt.wait()
        assert ckpt.all_steps() == [1, 2, 3]
    _corrupt(tmp_path / "3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        assert _equal(restore_params(tmp_path), _state(step=2, seed=2).params)


def test_mismatch_is_a_clear_error(tmp_path):
    with Checkpointer(tmp_path, model_config={"hidden": 3, "cell": "lstm"}, async_save=False) as c:
        c.save(_state(step=1))
    with Checkpointer(tmp_path, model_config={"hidden": 3, "cell": "gru"}) as c:
        with pytest.raises(CheckpointMismatchError, match="cell: saved 'lstm', now 'gru'"):
            c.restore(_state())
        assert c.all_steps() == [1]  # a mismatch is not corruption: nothing moved
    with Checkpointer(tmp_path) as c:
        shapes = r"head/kernel: saved \(3, 5\), model \(4, 5\)"
        with pytest.raises(CheckpointMismatchError, match=shapes):
            c.restore(_state(hidden=4))
        other = _state()
        tx, _ = make_optimizer(OptimizerConfig(name="sgd"))
        with pytest.raises(CheckpointMismatchError, match="optimizer"):
            c.restore(TrainState.create(other.params, tx, other.rng))
    with pytest.raises(CheckpointMismatchError, match="differ"):
        restore_params(tmp_path, target=_state(hidden=4).params)
    with pytest.raises(FileNotFoundError):
        restore_params(tmp_path / "nope")


def test_empty_directory_restores_nothing(tmp_path):
    with Checkpointer(tmp_path / "ck") as c:
        assert c.restore(_state()) is None and c.latest_step() is None
    with pytest.raises(ValueError, match="best_mode"):
        Checkpointer(tmp_path, best_mode="lowest")

"""`Parallel` on 8 fake CPU devices: mesh parsing, mesh-derived rows per process, refused
layouts, gradient accumulation == one big batch, fit's run.json and MFU over used devices."""

import json
import types

import jax
import numpy as np
import pytest

from seqjax.train.loop import FitConfig, fit
from seqjax.train.losses import make_lm_loss
from seqjax.train.optim import TrainState, make_optimizer
from seqjax.train.parallel import Parallel, parse_mesh, resolve_strategy
from seqjax.train.sharding import make_mesh, process_data_shard
from seqjax.train.step import flax_apply_fn, make_train_step
from tests.train.test_step import MODEL, OPT, _assert_close, _batches, _params


def test_parse_mesh_and_strategy():
    assert parse_mesh("data=4, fsdp=2") == {"data": 4, "fsdp": 2, "model": 1}
    assert parse_mesh({"model": 2, "data": -1}) == {"data": -1, "fsdp": 1, "model": 2}
    assert parse_mesh(None) == parse_mesh("") == {"data": -1, "fsdp": 1, "model": 1}
    for bad, words in [("data4", "no '='"), ("pipe=2", "one of"), ("data=x", "integer"),
                       ("data=0", ">= 1"), ("data=2,data=2", "twice")]:
        with pytest.raises(ValueError, match=words):
            parse_mesh(bad)
    mesh = make_mesh(data=2, fsdp=2, model=2)
    assert resolve_strategy("auto", mesh) == "fsdp+tensor"
    assert resolve_strategy("auto", make_mesh(data=8)) == "replicated"
    with pytest.raises(ValueError, match="strategy"):
        resolve_strategy("zero3", mesh)


def test_parallel_uses_every_device_by_default_and_checks_the_batch():
    par = Parallel.create()
    assert par.num_devices == jax.device_count() == 8
    assert dict(par.mesh.shape) == {"data": 8, "fsdp": 1, "model": 1}
    assert par.describe()["devices"] == 8 and par.describe()["processes"] == 1
    assert par.host_rows() == {"host_index": 0, "host_count": 1}
    with pytest.raises(AttributeError, match="renamed Parallel.host_rows"):
        par.iterator_shard()
    assert par.local_batch_size(16) == 16
    with pytest.raises(ValueError, match=r"batch_size.*grad_accum = 8\*1\*1 = 8; got 12"):
        par.check_batch_size(12)
    with pytest.raises(ValueError, match="does not fit the 8 visible devices"):
        Parallel.create("data=3")
    assert Parallel.create("data=2,fsdp=2,model=2").strategy == "fsdp+tensor"
    assert par.round_batch_size(12) == 16 and par.round_batch_size(16) == 16
    par.check_batch_size(par.round_batch_size(1))
    with pytest.raises(ValueError, match="batch_size"):
        par.round_batch_size(0)
    assert "devices=8x" in repr(par) and "mesh='data=8,fsdp=1,model=1'" in repr(par)


def _fake_mesh(order, data, fsdp, model):
    """A mesh-like object whose devices belong to the processes in `order`."""
    devs = np.array([types.SimpleNamespace(process_index=p) for p in order], dtype=object)
    return types.SimpleNamespace(shape={"data": data, "fsdp": fsdp, "model": model},
                                 devices=devs.reshape(data, fsdp, model))


def test_rows_per_process_come_from_the_mesh():
    # 2 processes x 2 devices. `data` across processes: each feeds its own half.
    m = _fake_mesh([0, 0, 1, 1], 4, 1, 1)
    assert [process_data_shard(m, p) for p in (0, 1)] == [(0, 2), (1, 2)]
    # `model` spans the processes (data=2 x model=2, devices p0 p1 | p0 p1): both hold
    # both batch shards, so both feed ALL rows — not half each.
    m = _fake_mesh([0, 1, 0, 1], 2, 1, 2)
    assert [process_data_shard(m, p) for p in (0, 1)] == [(0, 1), (0, 1)]
    m = _fake_mesh([0, 1, 2, 3], 1, 1, 4)
    assert {process_data_shard(m, p) for p in range(4)} == {(0, 1)}
    # interleaved on `data`: process 0 holds shards 0 and 2 — not feedable per process
    m = _fake_mesh([0, 1, 0, 1], 4, 1, 1)
    with pytest.raises(ValueError, match=r"process 0 holds batch shards \[0, 2\] of 4"):
        process_data_shard(m, 0)
    # unequal blocks
    m = _fake_mesh([0, 0, 0, 1], 4, 1, 1)
    with pytest.raises(ValueError, match="not one aligned contiguous block|unequal"):
        process_data_shard(m, 1)


def test_place_and_place_global_on_8_devices():
    par = Parallel.create("data=4,model=2")
    x = np.arange(16).reshape(8, 2)
    for placed in (par.place({"x": x})["x"], par.place_global({"x": x})["x"]):
        assert placed.shape == (8, 2)
        np.testing.assert_array_equal(np.asarray(placed), x)
        assert placed.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
    with pytest.raises(ValueError, match="divisible by data\\*fsdp = 4"):
        par.place_global({"x": np.zeros((6, 2))})


@pytest.mark.parametrize("strategy_mesh", [("replicated", "data=8"), ("fsdp", "data=2,fsdp=4"),
                                           ("tensor", "data=4,model=2")])
def test_grad_accumulation_equals_one_big_batch(strategy_mesh):
    """4 micro-batches with unequal token counts (masks) give the one-batch update: the
    accumulation is token-weighted, not a mean of micro-batch means."""
    strategy, mesh = strategy_mesh
    batches = _batches(n=2, seed=3)
    loss_fn = make_lm_loss(flax_apply_fn(MODEL))
    tx, _ = make_optimizer(OPT)

    def state0():
        return TrainState.create(_params(MODEL)["params"], tx, jax.random.PRNGKey(1))

    ref_state, ref = state0(), []
    step = make_train_step(loss_fn)
    for b in batches:
        ref_state, m = step(ref_state, b)
        ref.append(m)
    par = Parallel.create(mesh, strategy, grad_accum=2, min_fsdp_size=0)
    state = par.shard_state(state0())
    step = par.train_step(loss_fn)
    for b, r in zip(batches, ref):
        state, m = step(state, par.place(b))
        # micro-batches hold different numbers of real tokens
        assert float(m["tokens"]) == float(r["tokens"]) == b["mask"].sum()
        np.testing.assert_allclose(float(m["loss"]), float(r["loss"]), rtol=1e-5)
        np.testing.assert_allclose(float(m["grad_norm"]), float(r["grad_norm"]), rtol=1e-4)
    _assert_close(par.gather(state.params), ref_state.params, rtol=5e-5, atol=2e-6)
    with pytest.raises(ValueError, match="grad_accum"):
        make_train_step(loss_fn, grad_accum=0)
    with pytest.raises(ValueError, match="carry"):
        make_train_step(loss_fn, grad_accum=2, with_carry=True)


def test_fit_writes_run_json_and_mfu_over_the_mesh(tmp_path):
    par = Parallel.create("data=4,fsdp=2", min_fsdp_size=0)
    loss_fn = make_lm_loss(flax_apply_fn(MODEL))
    tx, _ = make_optimizer(OPT)
    state = par.shard_state(TrainState.create(_params(MODEL)["params"], tx,
                                              jax.random.PRNGKey(1)))
    kernel = state.params["head"]["kernel"]
    assert not kernel.sharding.is_fully_replicated  # FSDP really shards
    cfg = FitConfig(steps=2, log_every=1, progress=False, tensorboard=False, plot=False,
                    async_checkpointing=False, flops_per_step=1e9, peak_flops=1e12)
    result = fit(state, par.train_step(loss_fn), iter(_batches(n=2)), cfg,
                 workdir=tmp_path, parallel=par)
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["devices"] == 8 and info["mesh"] == {"data": 4, "fsdp": 2, "model": 1}
    assert info["strategy"] == "fsdp" and info["processes"] == 1
    assert info["device_kind"] and info["jax"] == jax.__version__
    for r in result.history:
        np.testing.assert_allclose(r["mfu"], 1e9 * r["steps_per_s"] / (1e12 * 8), rtol=1e-6)

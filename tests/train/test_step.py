"""Sharded steps on 8 fake CPU devices: data parallel == 1 device; FSDP/TP == replicated."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from seqjax.train.losses import make_lm_loss
from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer
from seqjax.train.sharding import (
    batch_sharding,
    host_batch_slice,
    make_mesh,
    maybe_initialize_distributed,
    partition_spec,
    shard_batch,
    tree_shardings,
)
from seqjax.train.step import (
    flax_apply_fn,
    make_train_step,
)

VOCAB, B, T = 11, 8, 5


class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(8, name="down")(jax.nn.gelu(nn.Dense(16, name="up")(x)))


class MlpLM(nn.Module):
    """Embedding → attention-style projections → MLP → head: names the TP rules know."""

    @nn.compact
    def __call__(self, tokens, deterministic=True):
        x = nn.Embed(VOCAB, 8, name="embed")(tokens)
        x = x + nn.Dense(8, name="out")(nn.Dense(8, name="query")(x))
        x = x + Mlp(name="mlp")(x)
        return nn.Dense(VOCAB, name="head")(x)


MODEL = MlpLM()
OPT = OptimizerConfig(name="adamw", learning_rate=0.05, weight_decay=0.1, clip_norm=1.0)


def _batches(n=2, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tok = rng.integers(0, VOCAB, size=(B, T + 1)).astype(np.int32)
        lengths = rng.integers(1, T + 1, size=B)  # unequal token counts per shard
        out.append({"inputs": tok[:, :-1], "targets": tok[:, 1:],
                    "mask": np.arange(T)[None] < lengths[:, None]})
    return out


BATCHES = _batches()


@functools.cache
def _params(model):
    """Random parameters in the model's layout (numpy: no init compile)."""
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))
    rng = np.random.default_rng(0)
    return jax.tree_util.tree_map(
        lambda s: (0.3 * rng.normal(size=s.shape)).astype(s.dtype), shapes)


def _setup(model, mesh=None, strategy="replicated", opt=OPT, **step_kw):
    tx, schedule = make_optimizer(opt)
    state = TrainState.create(_params(model)["params"], tx, jax.random.PRNGKey(1))
    loss_fn = make_lm_loss(flax_apply_fn(model))
    kw = {}
    if mesh is not None:
        shardings = tree_shardings(state, mesh, strategy, min_fsdp_size=0)
        state = jax.device_put(state, shardings)
        kw = dict(state_sharding=shardings, batch_sharding=batch_sharding(mesh))
    return state, make_train_step(loss_fn, schedule=schedule, **kw, **step_kw), loss_fn


def _run(state, step, batches=BATCHES, mesh=None):
    losses = []
    for b in batches:
        state, m = step(state, b if mesh is None else shard_batch(b, mesh))
        losses.append(float(m["loss"]))
    return state, losses


@functools.cache
def _reference(model, opt=OPT):
    """The single-device run every sharded run must reproduce."""
    state, step, _ = _setup(model, opt=opt)
    return _run(state, step)


def _assert_close(a, b, rtol=2e-5, atol=1e-6):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def test_data_parallel_equals_single_device():
    assert jax.device_count() == 8, "tests/conftest.py should fake 8 CPU devices"
    s1, l1 = _reference(MODEL)
    mesh = make_mesh(data=8)
    s8, step8, loss_fn = _setup(MODEL, mesh)
    s8, l8 = _run(s8, step8, mesh=mesh)
    assert s8.params["head"]["kernel"].sharding.is_fully_replicated
    np.testing.assert_allclose(l8, l1, rtol=1e-5)
    _assert_close(s8.params, s1.params)
    _assert_close(s8.opt_state, s1.opt_state)



def test_fsdp_and_tensor_parallel_with_remat_equal_replicated():
    ref, lref = _reference(MODEL)
    mesh = make_mesh(data=2, fsdp=2, model=2)
    st, step, _ = _setup(MODEL, mesh, "fsdp+tensor", remat=True)
    p = st.params
    assert p["query"]["kernel"].sharding.spec == P("fsdp", "model")  # column parallel
    assert p["mlp"]["up"]["kernel"].sharding.spec == P("fsdp", "model")
    assert p["mlp"]["down"]["kernel"].sharding.spec == P("model", "fsdp")  # row parallel
    assert p["out"]["kernel"].sharding.spec == P("model", "fsdp")
    assert p["embed"]["embedding"].sharding.spec == P(None, "fsdp")  # 11 rows: not divisible
    mu = st.opt_state[1][0].mu  # (clip, (adam, decay, lr)): adam's first moment
    assert mu["mlp"]["up"]["kernel"].sharding.spec == P("fsdp", "model")
    st, lsh = _run(st, step, mesh=mesh)
    np.testing.assert_allclose(lsh, lref, rtol=1e-5)
    _assert_close(st.params, ref.params)
    _assert_close(st.opt_state, ref.opt_state)
    assert st.params["mlp"]["up"]["kernel"].sharding.spec == P("fsdp", "model")


@pytest.mark.parametrize("mesh,strategy", [("data=8", "replicated"),
                                           ("data=2,fsdp=2,model=2", "fsdp+tensor")])
def test_muon_sharded_step_equals_single_device(mesh, strategy):
    """Muon's Newton–Schulz on matrices split over fsdp/model devices: the same step."""
    opt = OptimizerConfig(name="muon", learning_rate=0.02, weight_decay=0.1, clip_norm=1.0,
                          group_learning_rates=(("embed", 0.05), ("head", 0.01)))
    ref, lref = _reference(MODEL, opt)
    mesh = make_mesh(**{k: int(v) for k, v in (x.split("=") for x in mesh.split(","))})
    st, step, _ = _setup(MODEL, mesh, strategy, opt=opt)
    st, lsh = _run(st, step, mesh=mesh)
    np.testing.assert_allclose(lsh, lref, rtol=1e-5)
    _assert_close(st.params, ref.params, rtol=1e-4, atol=2e-6)
    _assert_close(st.opt_state, ref.opt_state, rtol=1e-4, atol=2e-6)


def test_mixed_precision_keeps_float32_state():
    ref, lref = _reference(MODEL)
    s, step, _ = _setup(MODEL, compute_dtype=jnp.bfloat16, remat="dots_saveable")
    s, lbf = _run(s, step)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(s.params))
    assert all(x.dtype in (jnp.float32, jnp.int32) for x in jax.tree_util.tree_leaves(s.opt_state))
    np.testing.assert_allclose(lbf, lref, rtol=2e-2)
    assert not np.array_equal(lbf, lref)  # the compute really ran in bf16
    with pytest.raises(ValueError, match="remat"):
        _setup(MODEL, remat="no_such_policy")[1](s, BATCHES[0])


def test_mesh_and_partition_rules():
    assert dict(make_mesh(data=-1, model=2).shape) == {"data": 4, "fsdp": 1, "model": 2}
    with pytest.raises(ValueError, match="must equal the number of devices"):
        make_mesh(data=3)
    with pytest.raises(ValueError, match="at most one"):
        make_mesh(data=-1, fsdp=-1)
    mesh = make_mesh(data=1, fsdp=4, model=2)
    assert partition_spec("h/mlp/fc2/kernel", (64, 32), mesh, "tensor") == P("model")
    assert partition_spec("h/mlp/fc1/kernel", (32, 64), mesh, "tensor") == P(None, "model")
    assert partition_spec("attn/key/kernel", (32, 4, 8), mesh, "tensor") == P(None, "model")
    assert partition_spec("attn/key/kernel", (32, 3, 8), mesh, "tensor") == P()  # 3 heads
    assert partition_spec("dense/kernel", (64, 96), mesh, "fsdp") == P(None, "fsdp")
    assert partition_spec("dense/kernel", (8, 8), mesh, "fsdp") == P()  # below min size
    assert partition_spec("dense/kernel", (8, 8), mesh, "replicated") == P()
    with pytest.raises(ValueError, match="strategy"):
        partition_spec("x", (4,), mesh, "zero3")
    sh = tree_shardings({"step": jnp.zeros((), jnp.int32), "rng": jnp.zeros(8, jnp.uint32),
                         "w": jnp.zeros((4, 1024))}, mesh, "fsdp")
    assert sh["step"].spec == P() and sh["rng"].spec == P() and sh["w"].spec == P(None, "fsdp")


def test_batch_placement_and_distributed_env(monkeypatch):
    mesh = make_mesh(data=8)
    x = shard_batch({"x": np.arange(16).reshape(8, 2)}, mesh)["x"]
    assert x.sharding.spec == P(("data", "fsdp")) and len(x.addressable_shards) == 8
    with pytest.raises(ValueError, match="divisible"):
        shard_batch({"x": np.zeros((6, 2))}, mesh)
    assert host_batch_slice(8) == slice(0, 8)
    for k in ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES",
              "MEGASCALE_COORDINATOR_ADDRESS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert maybe_initialize_distributed() is False
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    assert maybe_initialize_distributed() is True
    assert calls == [{"coordinator_address": "10.0.0.1:1234", "num_processes": 2, "process_id": 1}]

"""fit's host-light paths: k steps per call (== k single calls), device-resident windows
(same batches on any device count, exact resume, ids checked once), NaN steps inside a call."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seqjax.data.device import DeviceLMWindows
from seqjax.train.loop import FitConfig, fit
from seqjax.train.losses import make_lm_loss
from seqjax.train.optim import TrainState
from seqjax.train.parallel import Parallel
from seqjax.train.records import NonFiniteLossError, read_metrics
from seqjax.train.step import flax_apply_fn, make_batch_check, make_train_step
from tests.train._tiny_lm import TinyLM

V, B, T = 13, 8, 6
TOKENS = (np.arange(600) * 7 % V).astype(np.int32)  # a learnable periodic stream


def _setup(devices=None, dropout=0.0):
    par = Parallel.create(devices=jax.devices()[:1] if devices is None else devices)
    model = TinyLM(vocab_size=V, embed_dim=8, hidden=16, dropout=dropout)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))["params"]
    state = par.shard_state(TrainState.create(params, optax.adam(1e-2), jax.random.PRNGKey(1)))
    step = par.train_step(make_lm_loss(flax_apply_fn(model)))
    return par, state, step


def _host_batches(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ix = rng.integers(0, len(TOKENS) - T, size=B)
        w = np.stack([TOKENS[i:i + T + 1] for i in ix])
        out.append({"inputs": w[:, :-1], "targets": w[:, 1:]})
    return out


def _cfg(steps, k=1, **kw):
    kw.setdefault("log_every", 2 * k if k > 1 else 2)
    return FitConfig(steps=steps, steps_per_call=k, progress=False, plot=False,
                     tensorboard=False, handle_signals=False, async_checkpointing=False, **kw)


def _leaves(state):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(state.params)]


def test_steps_per_call_equals_single_steps():
    batches = _host_batches(12)
    results = {}
    for k in (1, 4):
        par, state, step = _setup(dropout=0.1)
        r = fit(state, step, lambda i: batches[i], _cfg(12, k, log_every=4), parallel=par)
        results[k] = r
        assert r.status == "completed" and int(r.state.step) == 12
    for a, b in zip(_leaves(results[1].state), _leaves(results[4].state)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    h1 = {r["step"]: r["loss"] for r in results[1].history}
    h4 = {r["step"]: r["loss"] for r in results[4].history}
    assert sorted(h4) == [4, 8, 12]
    for s in h4:
        assert h4[s] == pytest.approx(h1[s], rel=1e-5)


def test_steps_per_call_must_divide_the_intervals_and_needs_a_train_step():
    with pytest.raises(ValueError, match="`log_every` must be a multiple of steps_per_call=4"):
        FitConfig(steps=8, steps_per_call=4, log_every=6)
    with pytest.raises(ValueError, match="`steps_per_call` must be a positive int"):
        FitConfig(steps=8, steps_per_call=0)
    par, state, step = _setup()
    with pytest.raises(TypeError, match="need the train step of make_train_step"):
        fit(state, lambda s, b: step(s, b), lambda i: _host_batches(1)[0], _cfg(4, 2))


def test_device_windows_are_windows_of_the_stream_and_independent_of_devices():
    one = DeviceLMWindows(TOKENS, B, T, seed=3)
    eight = DeviceLMWindows(TOKENS, B, T, seed=3, mesh=Parallel.create().mesh)
    for step in (0, 5):
        a = one.device_batch(one.arrays, step)
        b = jax.jit(eight.device_batch)(eight.arrays, jnp.int32(step))
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
        x, y = np.asarray(a["inputs"]), np.asarray(a["targets"])
        for row_x, row_y in zip(x, y):
            start = int(np.flatnonzero(
                [np.array_equal(TOKENS[i:i + T], row_x) for i in range(len(TOKENS) - T)])[0])
            np.testing.assert_array_equal(row_y, TOKENS[start + 1:start + T + 1])
    assert not np.array_equal(one.device_batch(one.arrays, 0)["inputs"],
                              one.device_batch(one.arrays, 1)["inputs"])


def test_device_windows_check_ids_once_and_their_state():
    bad = TOKENS.copy()
    bad[17] = V
    with pytest.raises(ValueError, match=r"tokens_N"):
        DeviceLMWindows(bad, B, T, vocab_size=V)
    with pytest.raises(ValueError, match="longer than block_size"):
        DeviceLMWindows(TOKENS[:T], B, T)
    with pytest.raises(ValueError, match="`batch_size` must be a positive int"):
        DeviceLMWindows(TOKENS, 0, T)
    src = DeviceLMWindows(TOKENS, B, T, seed=1)
    src.set_state(src.get_state())
    with pytest.raises(ValueError, match="seed: expected 1, got 2"):
        src.set_state({**src.get_state(), "seed": 2})


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.slow
def test_fit_on_device_windows_learns_and_resumes_exactly(tmp_path, k):
    full_dir, part_dir = str(tmp_path / "full"), str(tmp_path / "part")
    par, state, step = _setup(dropout=0.1)
    src = DeviceLMWindows(TOKENS, B, T, seed=0, vocab_size=V, mesh=par.mesh)
    full = fit(state, step, src, _cfg(12, k, log_every=3, checkpoint_every=6),
               parallel=par, workdir=full_dir)
    records = read_metrics(os.path.join(full_dir, "metrics.jsonl"))
    assert [r["step"] for r in records] == ([1, 3, 6, 9, 12] if k == 1 else [3, 6, 9, 12])
    assert records[-1]["loss"] < records[0]["loss"] - 0.2
    # the same run in two calls: 0 -> 6, then a new fit resumes 6 -> 12
    par, state, step = _setup(dropout=0.1)
    src = DeviceLMWindows(TOKENS, B, T, seed=0, vocab_size=V, mesh=par.mesh)
    fit(state, step, src, _cfg(6, k, log_every=3), parallel=par, workdir=part_dir)
    par, state, step = _setup(dropout=0.1)
    resumed = fit(state, step, src, _cfg(12, k, log_every=3), parallel=par, workdir=part_dir)
    assert resumed.start_step == 6
    for a, b in zip(_leaves(full.state), _leaves(resumed.state)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_fit_on_device_windows_on_eight_devices_equals_one():
    par1, s1, step1 = _setup()
    r1 = fit(s1, step1, DeviceLMWindows(TOKENS, B, T, mesh=par1.mesh), _cfg(4, 2, log_every=2),
             parallel=par1)
    par8, s8, step8 = _setup(devices=jax.devices())
    r8 = fit(s8, step8, DeviceLMWindows(TOKENS, B, T, mesh=par8.mesh), _cfg(4, 2, log_every=2),
             parallel=par8)
    for a, b in zip(_leaves(r1.state), _leaves(r8.state)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_nan_inside_a_call_names_its_step():
    def loss_fn(params, batch, rng):
        del rng
        loss = jnp.mean((params["w"] - batch["x"]) ** 2)
        return jnp.where(batch["x"][0] == 5.0, jnp.nan, loss), {}

    state = TrainState.create({"w": jnp.zeros(())}, optax.sgd(0.1), jax.random.PRNGKey(0))
    step = make_train_step(loss_fn)
    with pytest.raises(NonFiniteLossError, match="at step 6"):
        fit(state, step, lambda i: {"x": np.full((2,), float(i))}, _cfg(8, 4, log_every=4))


def test_device_stream_chunks_are_the_iterators_chunks():
    from seqjax.data.device import DeviceStreamChunks
    from seqjax.data.iterators import TBPTTIterator

    tokens = TOKENS[:260]  # 8 streams of 32: 8 chunks of 4 per epoch
    it = TBPTTIterator(tokens, 8, 4)
    eight = DeviceStreamChunks(tokens, 8, 4, mesh=Parallel.create().mesh)
    one = DeviceStreamChunks(tokens, 8, 4, vocab_size=V)
    assert one.chunks_per_epoch == it.steps_per_epoch == 8
    get = jax.jit(eight.device_batch)
    for step in range(2 * it.steps_per_epoch + 1):
        want = next(it)
        for got in (one.device_batch(one.arrays, step), get(eight.arrays, jnp.int32(step))):
            for key in ("inputs", "targets", "reset"):
                np.testing.assert_array_equal(np.asarray(got[key]), want[key])
    with pytest.raises(ValueError, match="too few for 8 streams of at least seq_len=40"):
        DeviceStreamChunks(tokens, 8, 40)
    with pytest.raises(ValueError, match="`seq_len` must be a positive int"):
        DeviceStreamChunks(tokens, 8, 0)
    with pytest.raises(ValueError, match="divide over data"):
        DeviceStreamChunks(tokens, 3, 4, mesh=Parallel.create().mesh)
    with pytest.raises(ValueError, match="seq_len: expected 4, got 5"):
        one.set_state({**one.get_state(), "seq_len": 5})


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.slow
def test_tbptt_fit_on_device_streams_equals_the_host_iterator(k):
    from seqjax.data.device import DeviceStreamChunks
    from seqjax.data.iterators import TBPTTIterator
    from seqjax.models.rnn import RNNLanguageModel, RNNLMConfig
    from seqjax.train.tbptt import make_tbptt_loss

    lm = RNNLanguageModel(RNNLMConfig(vocab_size=V, embed_dim=8, num_layers=1, cell_type="lstm"))
    tokens = TOKENS[:200]  # 4 streams of 49: 12 chunks of 4 per epoch
    results = []
    for data in ("host", "device"):
        par = Parallel.create(devices=jax.devices()[:1])
        params = lm.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
        state = par.shard_state(TrainState.create(params, optax.adam(1e-2), jax.random.PRNGKey(1),
                                                  carry=lm.zero_carry(4)))
        step = par.train_step(make_tbptt_loss(flax_apply_fn(lm)), with_carry=True)
        src = (TBPTTIterator(tokens, 4, 4) if data == "host"
               else DeviceStreamChunks(tokens, 4, 4, vocab_size=V, mesh=par.mesh))
        results.append(fit(state, step, src, _cfg(15, k if data == "device" else 1,
                                                  log_every=3), parallel=par).state)
    for a, b in zip(_leaves(results[0]), _leaves(results[1])):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


@pytest.mark.slow
def test_prefetch_gives_the_same_run_resumes_at_the_right_batch_and_names_bad_batches(tmp_path):
    from seqjax.data.iterators import LMWindowIterator

    def run(prefetch, steps, workdir=None):
        par, state, step = _setup()
        it = LMWindowIterator(TOKENS, B, T, seed=0)
        return fit(state, step, it, _cfg(steps, log_every=3, checkpoint_every=3,
                                         prefetch=prefetch), parallel=par, workdir=workdir)

    plain = run(0, 12)
    ahead = run(2, 12)
    for a, b in zip(_leaves(plain.state), _leaves(ahead.state)):
        np.testing.assert_array_equal(a, b)
    part = str(tmp_path / "part")
    run(3, 6, part)  # the thread has read past step 6; the checkpoint says where training was
    resumed = run(3, 12, part)
    assert resumed.start_step == 6
    for a, b in zip(_leaves(plain.state), _leaves(resumed.state)):
        np.testing.assert_array_equal(a, b)

    par, state, step = _setup()
    batches = _host_batches(8)
    batches[4]["targets"][0, 0] = V  # out of the vocabulary at step 5
    with pytest.raises(ValueError, match="the training batch of step 5"):
        fit(state, step, lambda i: batches[i], _cfg(8, prefetch=2), parallel=par,
            check_batch=make_batch_check(V))
    with pytest.raises(ValueError, match="`prefetch` must be None or an int >= 0"):
        FitConfig(steps=2, prefetch=-1)

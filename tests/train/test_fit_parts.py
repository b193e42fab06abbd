"""The parts of fit, one at a time: the step plan, resume, batch source, metrics log,
metrics fetch, throughput; and fit's compile-ahead path (same run, each program compiled
once)."""

import dataclasses
import json
import logging
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.data.device import DeviceLMWindows
from seqjax.train import fit_parts
from seqjax.train.fit_parts import (
    BatchSource,
    MetricsFetch,
    MetricsLog,
    StepPlan,
    Throughput,
    call_steps,
    process_uptime,
    resume,
    step_actions,
)
from seqjax.train.loop import FitConfig, checked_by_default, fit
from seqjax.train.losses import make_lm_eval
from seqjax.train.records import NonFiniteLossError
from seqjax.train.step import flax_apply_fn, make_batch_check
from tests.train._tiny_lm import TinyLM
from tests.train.test_fit_fast_paths import TOKENS, B, T, V, _cfg, _host_batches, _leaves, _setup

# (log, evaluate, save, stop) after the call that reaches step s
_ = False
X = True
PLANS = [
    # s, FitConfig fields, start, evaluates, saves, stop requested -> plan
    # one step per call: the first step, every log_every, the last step
    (1, dict(steps=10, log_every=4), 0, X, X, _, (X, _, _, _)),  # the first call
    (2, dict(steps=10, log_every=4), 0, X, X, _, (_, _, _, _)),
    (4, dict(steps=10, log_every=4), 0, X, X, _, (X, _, _, _)),
    (10, dict(steps=10, log_every=4), 0, X, X, _, (X, X, X, _)),  # the last step
    (10, dict(steps=10, log_every=4), 0, _, _, _, (X, _, _, _)),  # no eval data, no dir
    # eval_every / checkpoint_every / log_every interplay
    (8, dict(steps=20, log_every=5, eval_every=10, checkpoint_every=4), 0, X, X, _,
     (_, _, X, _)),
    (10, dict(steps=20, log_every=5, eval_every=10, checkpoint_every=4), 0, X, X, _,
     (X, X, X, _)),  # an evaluation saves a checkpoint
    (10, dict(steps=20, log_every=5, eval_every=10, checkpoint_every=4), 0, X, _, _,
     (X, X, _, _)),  # ... when there is a work dir
    (10, dict(steps=20, log_every=5, eval_every=10, checkpoint_every=4), 0, _, X, _,
     (X, _, _, _)),  # no eval data: no evaluation, no checkpoint (10 is not a multiple of 4)
    (15, dict(steps=20, log_every=5, eval_every=10, checkpoint_every=4), 0, X, X, _,
     (X, _, _, _)),
    (20, dict(steps=20, log_every=5, eval_every=10, checkpoint_every=4), 0, X, X, _,
     (X, X, X, _)),
    (7, dict(steps=20, log_every=1, eval_every=0, checkpoint_every=0), 0, X, X, _,
     (X, _, _, _)),  # 0 = only at the end
    # steps_per_call > 1: only the steps that end a call are asked about
    (4, dict(steps=12, steps_per_call=4, log_every=8, eval_every=4, checkpoint_every=8), 0,
     X, X, _, (X, X, X, _)),  # the first call's last step
    (8, dict(steps=12, steps_per_call=4, log_every=8, eval_every=4, checkpoint_every=8), 0,
     _, X, _, (X, _, X, _)),
    (4, dict(steps=12, steps_per_call=4, log_every=8, eval_every=0, checkpoint_every=8), 0,
     X, X, _, (X, _, _, _)),
    (12, dict(steps=12, steps_per_call=4, log_every=8), 8, X, X, _, (X, X, X, _)),
    (10, dict(steps=10, steps_per_call=4, log_every=8), 8, _, _, _, (X, _, _, _)),  # short
    # resumed: the first call of this run is logged (timed), on the grid or off it
    (4, dict(steps=10, log_every=10), 3, X, X, _, (X, _, _, _)),
    (5, dict(steps=10, log_every=10), 3, X, X, _, (_, _, _, _)),
    (4, dict(steps=10, steps_per_call=2, log_every=6), 3, X, X, _, (X, _, _, _)),  # off
    (6, dict(steps=10, steps_per_call=2, log_every=6), 3, X, X, _, (X, _, _, _)),
    (8, dict(steps=10, steps_per_call=2, log_every=6), 3, X, X, _, (_, _, _, _)),
    (6, dict(steps=12, steps_per_call=2, log_every=8), 4, X, X, _, (X, _, _, _)),  # on
    (10, dict(steps=12, steps_per_call=2, log_every=8), 4, X, X, _, (_, _, _, _)),
    # a stop request: save and stop, before the last step; at the last step, just finish
    (3, dict(steps=10, log_every=5), 0, X, X, X, (_, _, X, X)),
    (3, dict(steps=10, log_every=5), 0, X, _, X, (_, _, _, X)),  # no work dir: stop only
    (10, dict(steps=10, log_every=5), 0, _, X, X, (X, _, X, _)),
]


@pytest.mark.parametrize("s, fields, start, evaluates, saves, stop, want", PLANS)
def test_step_actions_table(s, fields, start, evaluates, saves, stop, want):
    cfg = FitConfig(**fields)
    plan = step_actions(s, cfg, start, evaluates=evaluates, saves=saves, stop_requested=stop)
    assert plan == StepPlan(*want)
    assert plan.fetch == any(want)


@pytest.mark.parametrize("fields, start, calls", [
    (dict(steps=10, steps_per_call=4, log_every=4), 0, [4, 4, 2]),
    (dict(steps=10, steps_per_call=4, log_every=4), 3, [1, 4, 2]),  # back on the grid
    (dict(steps=5, log_every=1), 2, [1, 1, 1]),
    (dict(steps=4, steps_per_call=4, log_every=4), 4, []),  # nothing left
    (dict(steps=4, steps_per_call=4, log_every=4), 6, []),  # past the end
])
def test_call_steps_align_calls_to_the_grid(fields, start, calls):
    cfg = FitConfig(**fields)
    got, s = [], start
    while call_steps(s, cfg):
        got.append(call_steps(s, cfg))
        s += got[-1]
    assert got == calls


def test_a_walk_of_the_plan_over_a_resumed_run():
    """What fit does at each call of a run resumed at step 3 with steps_per_call=2."""
    cfg = FitConfig(steps=12, steps_per_call=2, log_every=4, eval_every=6,
                    checkpoint_every=8)
    s, seen = 3, {}
    while s < cfg.steps:
        s += call_steps(s, cfg)
        plan = step_actions(s, cfg, 3, evaluates=True, saves=True)
        seen[s] = "".join(c for c, on in zip("LESX", (plan.log, plan.evaluate, plan.save,
                                                       plan.stop)) if on)
    assert seen == {4: "L", 6: "ES", 8: "LS", 10: "", 12: "LES"}


def test_checked_none_is_resolved_where_the_config_is_made():
    """FitConfig(checked=None) is off, or on inside checked_by_default (where the command
    line runs a recipe); an explicit value is kept; fit reads the field alone."""
    assert FitConfig(steps=1).checked is False
    with checked_by_default(True):
        assert FitConfig(steps=1).checked is True
        assert FitConfig(steps=1, checked=False).checked is False
        with checked_by_default(False):
            assert FitConfig(steps=1).checked is False
        assert dataclasses.replace(FitConfig(steps=1), steps=2).checked is True
    assert FitConfig(steps=1).checked is False
    with pytest.raises(TypeError, match="`on` must be a bool"):
        with checked_by_default("1"):
            pass


def test_metrics_fetch_holds_the_calls_in_flight(monkeypatch):
    """add() holds a call's metrics; wait_behind() waits for the call in_flight calls back
    (the host stays that far ahead); a fetch takes them all."""
    waited = []
    monkeypatch.setattr(fit_parts.jax, "block_until_ready", waited.append)
    fetch = MetricsFetch(("loss",), None, ids_checked=True, in_flight=2)
    for s in (1, 2, 3, 4):
        fetch.add(s, 1, {"loss": jnp.float32(s), "tokens": jnp.float32(1.0)})
        fetch.wait_behind()
    assert [float(m["loss"]) for m in waited] == [1.0, 2.0]  # at steps 3 and 4
    assert fetch() == {"loss": 4.0, "tokens": 1.0} and fetch.pending == []
    assert fetch.take_tokens() == 4.0


def test_throughput_rates_between_logged_steps(monkeypatch):
    now = iter([10.0, 12.0, 14.0, 15.0])
    monkeypatch.setattr(fit_parts.time, "perf_counter", lambda: next(now))
    meter = Throughput(4, flops_per_step=100.0, peak=50.0, devices=2)
    assert meter.first_step() == 2.0
    rec = meter.record(8, tokens=40.0)  # 4 steps, 40 tokens in 4 s
    assert rec == {"steps_per_s": 1.0, "time": 4.0, "tokens_per_s": 10.0, "mfu": 1.0}
    rec = meter.record(9, tokens=0.0)  # no token count: no tokens_per_s
    assert rec == {"steps_per_s": 1.0, "time": 5.0, "mfu": 1.0}


def test_metrics_fetch_checks_every_step_and_counts_tokens():
    fetch = MetricsFetch(("loss",), None, ids_checked=True)
    pending = [(2, 2, {"loss": jnp.array([1.0, 0.5]), "tokens": jnp.array([3.0, 4.0])}),
               (3, 1, {"loss": jnp.float32(0.25), "tokens": jnp.float32(5.0)})]
    assert fetch(pending) == {"loss": 0.25, "tokens": 5.0} and pending == []
    assert fetch.take_tokens() == 12.0 and fetch.take_tokens() == 0.0
    bad = [(6, 3, {"loss": jnp.array([1.0, jnp.nan, 2.0])})]
    with pytest.raises(NonFiniteLossError, match="step 5"):
        fetch(bad)


def test_metrics_log_cuts_history_back_and_writes_records(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (2, 4, 6)))
    seen = []
    log = MetricsLog(str(tmp_path), start=4, steps=8, restart=False, progress=False,
                     print_logs=True, tensorboard=False, plot=False, hooks=[seen.append])
    log.write({"step": 8, "loss": 0.5, "time": 1.0})
    log.close()
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == [2, 4, 8] and seen == log.history == [{"step": 8, "loss": 0.5, "time": 1.0}]
    assert "step 8  loss 0.5" in capsys.readouterr().out


def test_batch_source_host_batches_replay_check_and_position():
    _, _, step = _setup()
    batches = _host_batches(5)
    source = BatchSource(iter(batches), step, start=2, data_state=None, place_batch=None,
                         steps_per_call=1, prefetch=0, steps=5)
    assert not source.device and source.check_batch is None
    assert source.position(3) == {"batches_consumed": 3}
    bad = [{"inputs": np.full((B, T), V), "targets": np.zeros((B, T), np.int32)}]
    source = BatchSource(lambda i: bad[0], step, start=0, data_state=None, place_batch=None,
                         steps_per_call=1, prefetch=0, steps=1,
                         check_batch=make_batch_check(V))
    with pytest.raises(ValueError, match="training batch of step 1"):
        source.call(None, 0, 1)
    with pytest.raises(TypeError, match="TrainStep"):
        BatchSource(DeviceLMWindows(TOKENS, B, T), lambda s, b: (s, {}), start=0,
                    data_state=None, place_batch=None, steps_per_call=1, prefetch=0,
                    steps=1)


def test_resume_without_checkpoint_asks_the_history_check(tmp_path):
    _, state, _ = _setup()
    assert resume(state, None, keep=1, best_metric=None, best_mode="min", async_save=False,
                  model_config=None, tokenizer=None, check_history=None).checkpointer is None
    asked = []
    got = resume(state, str(tmp_path), keep=1, best_metric=None, best_mode="min",
                 async_save=False, model_config=None, tokenizer=None,
                 check_history=lambda w, s: asked.append((w, s)) or True)
    got.checkpointer.close()
    assert asked == [(str(tmp_path), 0)] and got.start == 0 and got.data_state is None
    assert got.started_over
    assert process_uptime() is None or process_uptime() > 0


def test_compile_ahead_gives_the_same_run_compiled_in_background_threads():
    """With compile_ahead the train and eval programs compile on the seqjax-compile threads
    (while the checkpoint is read), and the run is the one compiled at the first call."""
    import optax

    from seqjax.train.losses import make_lm_loss
    from seqjax.train.optim import TrainState
    from seqjax.train.parallel import Parallel

    threads = []

    class Where(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Finished XLA compilation of jit(wrapped)"):
                threads.append(threading.current_thread().name)

    def setup():  # sizes no other test uses: nothing of it is in JAX's in-memory cache yet
        par = Parallel.create(devices=jax.devices()[:1])
        model = TinyLM(vocab_size=V, embed_dim=12, hidden=20)
        params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))["params"]
        state = par.shard_state(TrainState.create(params, optax.adam(1e-2),
                                                  jax.random.PRNGKey(1)))
        apply = flax_apply_fn(model)
        return (par, state, par.train_step(make_lm_loss(apply)),
                par.eval_step(make_lm_eval(apply)))

    handler = Where()
    logger = logging.getLogger("jax._src.dispatch")
    logger.addHandler(handler)
    results = {}
    jax.config.update("jax_log_compiles", True)  # process-wide: the context is per thread
    try:
        for ahead in (True, False):
            par, state, step, ev = setup()
            results[ahead] = fit(
                state, step, DeviceLMWindows(TOKENS, B, T, seed=3),
                _cfg(8, 2, log_every=4, eval_every=4, compile_ahead=ahead),
                parallel=par, eval_step=ev, eval_data=_host_batches(2))
            if ahead:
                assert sorted(threads) == ["seqjax-compile-eval", "seqjax-compile-train"]
    finally:
        jax.config.update("jax_log_compiles", False)
        logger.removeHandler(handler)
    for a, b in zip(_leaves(results[False].state), _leaves(results[True].state)):
        np.testing.assert_array_equal(a, b)
    assert results[False].eval_metrics == results[True].eval_metrics
    assert results[True].first_step_s > 0


def test_a_run_started_over_purges_its_old_tensorboard_events(tmp_path, monkeypatch):
    """A work dir killed before its first checkpoint: fit starts over, and the TensorBoard
    writer is told to drop the old run's events (purge from step 1), as with --restart."""
    purges = []

    class Writer:
        def add_scalar(self, *a):
            pass

        def close(self):
            pass

    monkeypatch.setattr(fit_parts, "tensorboard_writer",
                        lambda path, purge_step=None: purges.append(purge_step) or Writer())
    monkeypatch.setattr(fit_parts, "wanted", lambda flag, module: bool(flag))
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (2, 4)))
    par, state, step = _setup()
    batches = _host_batches(2)
    cfg = dataclasses.replace(_cfg(2, log_every=2), tensorboard=True)
    fit(state, step, lambda i: batches[i], cfg, workdir=str(tmp_path), parallel=par)
    assert purges == [1]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]  # the new run only


@pytest.mark.parametrize("checked", [False, True])
def test_checked_fit_names_the_failed_value_check_and_its_step(checked):
    """An out-of-vocabulary id that reaches the jitted step (the host check turned off):
    by default the loss is NaN (NonFiniteLossError names the step); under
    FitConfig(checked=True) the step raises the check's message, noted with its steps."""
    import optax
    from jax.experimental.checkify import JaxRuntimeError

    from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block
    from seqjax.train.losses import make_lm_loss
    from seqjax.train.optim import TrainState
    from seqjax.train.step import make_train_step

    model = TransformerLM(TransformerLMConfig(
        vocab_size=V, num_layers=1, embed_dim=8, block_size=T, block=gpt_block(2)))
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))["params"]
    state = TrainState.create(params, optax.adam(1e-2), jax.random.PRNGKey(1))
    step = make_train_step(make_lm_loss(flax_apply_fn(model)))
    good = _host_batches(1)[0]
    bad = {"inputs": good["inputs"].copy(), "targets": good["targets"]}
    bad["inputs"][0, 2] = V  # one id past the vocabulary
    batches = [good, bad]
    cfg = dataclasses.replace(_cfg(2, log_every=1), checked=checked)
    if checked:
        with pytest.raises(JaxRuntimeError, match="must") as info:
            fit(state, step, lambda i: batches[i], cfg)
        assert "training call of step 2" in " ".join(info.value.__notes__)
    else:
        with pytest.raises(NonFiniteLossError, match="step 2"):
            fit(state, step, lambda i: batches[i], cfg)


def test_fit_config_refuses_non_bool_switches():
    from seqjax.train.loop import FitConfig

    for name in ("compile_ahead", "checked"):
        with pytest.raises(ValueError, match=f"`{name}` must be True, False or None; got 'yes'"):
            FitConfig(steps=1, **{name: "yes"})


def test_first_call_after_an_off_grid_resume_is_logged_and_timed(tmp_path):
    """Run 1 stops at step 3 (k=1); run 2 (k=2) resumes off the grid: its first call is the
    one step 3 -> 4, which is logged and timed (the template state said step 0)."""
    batches = _host_batches(6)
    par, state, step = _setup()
    fit(state, step, lambda i: batches[i], _cfg(3, log_every=3), workdir=str(tmp_path),
        parallel=par)
    par, state, step = _setup()
    r = fit(state, step, lambda i: batches[i], _cfg(6, 2, log_every=2), workdir=str(tmp_path),
            parallel=par)
    assert r.start_step == 3 and r.first_step_s is not None and r.first_step_s > 0
    assert [rec["step"] for rec in r.history] == [4, 6]

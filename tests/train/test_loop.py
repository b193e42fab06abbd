"""The loop: logs, curves, eval, resume; SIGKILL crash + restart == uninterrupted; SIGTERM; NaN."""

import json
import os
import signal
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seqjax.train.checkpoint import Checkpointer, restore_params
from seqjax.train.loop import FitConfig, evaluate, fit
from seqjax.train.records import NonFiniteLossError, read_metrics
from seqjax.train.step import create_train_state, make_train_step
from tests.train import _crash_worker as worker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: its records and its work dir."""
    workdir = str(tmp_path_factory.mktemp("reference"))
    result = worker.train(workdir, logs=True)
    return result, workdir


def _losses(workdir):
    return {r["step"]: r["loss"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))}


def _same_params(dir_a, dir_b):
    a = restore_params(os.path.join(dir_a, "checkpoints"))
    b = restore_params(os.path.join(dir_b, "checkpoints"))
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in
               zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_fit_writes_metrics_tensorboard_curves_and_checkpoints(reference):
    result, workdir = reference
    assert result.status == "completed" and result.start_step == 0
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    assert [r["step"] for r in records] == list(range(1, worker.STEPS + 1))
    assert all(np.isfinite(r["loss"]) and "lr" in r and "tokens_per_s" in r for r in records)
    assert records[-1]["loss"] < records[0]["loss"]
    evals = [r for r in records if "eval/loss" in r]
    assert [r["step"] for r in evals] == [4, 8, 12]
    assert evals[-1]["eval/perplexity"] == pytest.approx(np.exp(evals[-1]["eval/loss"]))
    assert result.eval_metrics["eval/tokens"] == 2 * worker.BATCH * worker.T
    assert any(f.startswith("events.out.tfevents")
               for f in os.listdir(os.path.join(workdir, "tensorboard")))
    assert os.path.getsize(os.path.join(workdir, "loss.png")) > 1000
    assert os.path.getsize(os.path.join(workdir, "perplexity.png")) > 1000
    with Checkpointer(os.path.join(workdir, "checkpoints"), best_metric="eval/loss",
                      read_only=True) as ckpt:
        steps = ckpt.all_steps()
        assert steps[-2:] == [9, 12] and set(steps) <= {4, 8, 9, 12}  # last 2 + best eval
        assert ckpt.best_step() in steps
        state = ckpt.meta(12)["data_state"]  # 12 batches of 10 per epoch: epoch 1, step 2
        assert (state["kind"], state["epoch"], state["step"]) == ("arrays", 1, 2)


@pytest.mark.slow
def test_sigkill_mid_training_then_restart_reproduces_the_uninterrupted_run(reference, tmp_path):
    _, ref_dir = reference
    workdir = str(tmp_path / "crash")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.train._crash_worker", workdir],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    killed_after = None
    for line in proc.stdout:
        if line.startswith("step ") and int(line.split()[1]) >= 7:
            killed_after = int(line.split()[1])
            proc.send_signal(signal.SIGKILL)  # no clean-up of any kind
            break
    proc.wait(timeout=120)
    assert killed_after is not None and proc.returncode == -signal.SIGKILL
    partial = [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in n]
    with Checkpointer(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
        saved = ckpt.all_steps()
    assert saved and max(saved) < worker.STEPS

    result = worker.train(workdir)  # restart in the same work dir
    assert result.status == "completed" and 0 < result.start_step == max(saved)
    assert not [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in n]
    print(f"killed after step {killed_after}; restored step {max(saved)}; "
          f"partial writes left by the kill: {partial}")
    ref, got = _losses(ref_dir), _losses(workdir)
    assert sorted(got) == sorted(ref)  # records past the restored step were replaced
    for step in ref:  # bitwise, on CPU: before the crash and after the restart
        assert got[step] == ref[step], step
    assert _same_params(workdir, ref_dir)


@pytest.mark.slow
def test_sigterm_saves_and_stops_then_resume_matches(reference, tmp_path):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed in the main thread")
    _, ref_dir = reference
    workdir = str(tmp_path / "term")

    def send_sigterm(record):
        if record["step"] == 5:
            os.kill(os.getpid(), signal.SIGTERM)

    result = worker.train(workdir, hooks=[send_sigterm])
    stopped = int(result.state.step)
    assert result.status == "interrupted" and 5 <= stopped < worker.STEPS
    with Checkpointer(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
        assert ckpt.latest_step() == stopped
    assert max(_losses(workdir)) == stopped
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    result = worker.train(workdir)
    assert result.start_step == stopped and result.status == "completed"
    assert _losses(workdir) == _losses(ref_dir)
    assert _same_params(workdir, ref_dir)


def _quadratic(poison_at=None):
    """A one-parameter problem with a cheap compile; batch ``i`` is NaN at ``poison_at``."""

    def loss_fn(params, batch, rng):
        return jnp.mean((params["w"] * batch["x"] - 1.0) ** 2), {"tokens": jnp.float32(4)}

    def batch(i):
        x = np.full((4,), 1.0 + 0.1 * i, np.float32)
        return {"x": x * np.nan if i + 1 == poison_at else x}

    state, _ = create_train_state(lambda rng: {"w": jnp.zeros(())}, optax.sgd(0.1),
                                  jax.random.PRNGKey(0))
    return state, make_train_step(loss_fn), batch


@pytest.mark.parametrize("log_every", [1, 10])  # metrics fetched every step / in bulk
def test_nan_stops_with_step_and_metric_and_keeps_last_good_checkpoint(tmp_path, log_every):
    state, step, batch = _quadratic(poison_at=5)
    cfg = FitConfig(steps=10, log_every=log_every, checkpoint_every=2, progress=False,
                    tensorboard=False, plot=False)
    with pytest.raises(NonFiniteLossError, match="non-finite loss = nan at step 5") as err:
        fit(state, step, batch, cfg, workdir=tmp_path)
    assert err.value.step == 5 and err.value.metric == "loss"
    with Checkpointer(tmp_path / "checkpoints") as ckpt:
        assert ckpt.latest_step() == 4
        restored = ckpt.restore(_quadratic()[0])
    assert np.isfinite(float(restored.state.params["w"]))
    assert max(_losses(str(tmp_path))) == (4 if log_every == 1 else 1)


def test_resume_replays_a_plain_iterator_and_without_workdir_writes_nothing(tmp_path):
    state, step, batch = _quadratic()
    cfg = FitConfig(steps=6, log_every=1, checkpoint_every=3, progress=False,
                    tensorboard=False, plot=False, async_checkpointing=False)
    once = fit(state, step, iter([batch(i) for i in range(6)]), cfg)
    assert once.status == "completed" and len(once.history) == 6
    state, step, _ = _quadratic()
    half = FitConfig(**{**cfg.__dict__, "steps": 3})
    fit(state, step, iter([batch(i) for i in range(3)]), half, workdir=tmp_path)
    state, step, _ = _quadratic()
    again = fit(state, step, iter([batch(i) for i in range(6)]), cfg, workdir=tmp_path)
    assert again.start_step == 3
    assert float(again.state.params["w"]) == float(once.state.params["w"])
    lines = open(tmp_path / "metrics.jsonl").read().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4, 5, 6]


def test_resume_restores_a_pipeline_iterator_without_replaying(tmp_path):
    """``LMWindowIterator`` (seqjax.data) speaks fit's get_state/set_state: the position is
    saved with the checkpoint and restored on resume, not replayed batch by batch."""
    from seqjax.data.iterators import LMWindowIterator

    class Counting(LMWindowIterator):
        calls = 0

        def __next__(self):
            Counting.calls += 1
            return super().__next__()

    tokens = np.arange(200) % 7
    state0, _, _ = _quadratic()

    def step(state, b):  # a step that reads the batch: the loss is a function of the data
        return state, {"loss": jnp.float32(b["inputs"].sum())}

    cfg = FitConfig(steps=6, log_every=1, checkpoint_every=3, progress=False,
                    tensorboard=False, plot=False, async_checkpointing=False)
    once = fit(state0, step, Counting(tokens, 2, 8, seed=0), cfg)
    half = FitConfig(**{**cfg.__dict__, "steps": 3})
    fit(state0, step, Counting(tokens, 2, 8, seed=0), half, workdir=tmp_path)
    Counting.calls = 0
    again = fit(state0, step, Counting(tokens, 2, 8, seed=0), cfg, workdir=tmp_path)
    assert again.start_step == 3 and Counting.calls == 3  # steps 4..6 only, no replay
    assert [h["loss"] for h in again.history] == [h["loss"] for h in once.history][3:]


def test_evaluate_weights_batches_by_tokens():
    ev = lambda params, b: {"loss": jnp.float32(b["l"]), "tokens": jnp.float32(b["n"])}
    out = evaluate(ev, None, [{"l": 1.0, "n": 1.0}, {"l": 4.0, "n": 3.0}])
    assert out["loss"] == pytest.approx(3.25) and out["tokens"] == 4.0
    assert out["perplexity"] == pytest.approx(np.exp(3.25))
    with pytest.raises(ValueError, match="empty"):
        evaluate(ev, None, [])
    with pytest.raises(ValueError, match="log_every"):
        FitConfig(steps=3, log_every=0)


def test_fit_config_names_the_new_spelling_of_num_steps():
    """``FitConfig.num_steps`` is ``steps``, the recipes' ``--steps``: the old keyword is a
    ``TypeError`` naming the new one."""
    with pytest.raises(TypeError, match=r"`num_steps` \(renamed `steps`\)"):
        FitConfig(num_steps=3)
    assert FitConfig(steps=3).steps == 3


def test_a_fit_resumed_at_its_end_returns_the_final_evaluation_again(tmp_path):
    """The same call on a finished work dir trains nothing, logs nothing, and its result
    carries the final evaluation as the first call's did (a recipe reads it)."""
    state, step, batch = _quadratic()
    cfg = FitConfig(steps=4, log_every=2, progress=False, tensorboard=False, plot=False,
                    async_checkpointing=False)
    eval_step = jax.jit(lambda p, b: {"loss": jnp.mean((p["w"] * b["x"] - 1.0) ** 2)})
    first = fit(state, step, batch, cfg, workdir=tmp_path, eval_step=eval_step,
                eval_data=[batch(0)])
    logged = open(tmp_path / "metrics.jsonl").read()
    again = fit(_quadratic()[0], step, batch, cfg, workdir=tmp_path, eval_step=eval_step,
                eval_data=[batch(0)])
    assert again.start_step == 4 and again.history == []
    assert again.eval_metrics == first.eval_metrics and "eval/loss" in first.eval_metrics
    assert open(tmp_path / "metrics.jsonl").read() == logged


def test_evaluation_data_that_raises_is_handled_as_training_data_is(tmp_path):
    """``evals``' data raising at the second evaluation (step 4): step 4 is checkpointed
    first, then one DataIteratorError names the evaluation, the step and the checkpoint; the
    same call, once the cause is gone, resumes from step 4. Each extra evaluation's metrics
    are named ``<name>/<metric>``."""
    from seqjax.train.loop import DataIteratorError

    state, step, batch = _quadratic()
    cfg = FitConfig(steps=6, log_every=2, eval_every=2, progress=False, tensorboard=False,
                    plot=False, async_checkpointing=False)
    eval_step = jax.jit(lambda p, b: {"loss": jnp.mean((p["w"] * b["x"] - 1.0) ** 2)})
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 2:
            raise OSError("the evaluation file went away")
        return [batch(0)]

    with pytest.raises(DataIteratorError, match=r"^the evaluation data of 'task' raised OSError: "
                       r"the evaluation file went away at step 4; the newest intact checkpoint "
                       r"is step 4 ") as err:
        fit(state, step, batch, cfg, workdir=tmp_path, evals={"task": (eval_step, flaky)})
    assert err.value.step == 4
    again = fit(_quadratic()[0], step, batch, cfg, workdir=tmp_path,
                evals={"task": (eval_step, flaky)})
    assert again.start_step == 4 and again.status == "completed"
    assert set(again.eval_metrics) == {"task/loss", "task/tokens", "task/perplexity"}
    with pytest.raises(ValueError, match=r"`evals\['eval'\]` must be an \(eval_step, eval_data\)"):
        fit(_quadratic()[0], step, batch, cfg, evals={"eval": (eval_step, [batch(0)])})

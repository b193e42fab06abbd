"""Faults of a long run, each ending with one clear line, after which the same command
finishes bit for bit as the uninterrupted run: the data iterator raising mid-run (exit 4,
the last completed step checkpointed first), SIGTERM while a checkpoint is being written
(saved and stopped, exit 0), SIGKILL during an evaluation (the previous checkpoint
intact, no duplicated or cut records after the resume), a failed write (exit 3).

"Bit for bit": the final checkpoint's parameters are ``np.array_equal`` to those of the
uninterrupted run and its ``metrics.jsonl`` records are equal but for their timing fields.
The run is :mod:`tests.train._crash_worker` (dropout, a shuffled stateful iterator,
AdamW with a schedule, 2 devices, evaluation every 4 steps, async checkpoints every 3),
in this process or, for the signals, a real child process
(:mod:`tests.train._fault_worker`); the command line's lines and exit statuses are
checked on ``seqjax train toy_rnn --smoke``.
"""

import errno
import os
import signal
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

from seqjax import cli
from seqjax.train import fit_parts
from seqjax.train.checkpoint import Checkpointer, load_meta, restore_params
from seqjax.train.loop import DataIteratorError
from seqjax.train.records import read_metrics
from seqjax.train.write_errors import WriteError
from tests.train import _crash_worker as worker
from tests.train.test_write_failures import _fail_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMING = {"time", "steps_per_s", "tokens_per_s", "mfu"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's work dir (shared by the tests of this file)."""
    workdir = str(tmp_path_factory.mktemp("reference"))
    assert worker.train(workdir).status == "completed"
    return workdir


def _records(workdir):
    """The records of ``metrics.jsonl`` without their timing fields; every line must read."""
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path) as f:
        lines = f.read().splitlines()
    records = read_metrics(path)
    assert len(records) == len(lines), "a cut or unreadable line in metrics.jsonl"
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def _params(workdir):
    return jax.tree_util.tree_leaves(restore_params(os.path.join(workdir, "checkpoints")))


def _assert_same_run(workdir, ref_dir, *, extra_first_steps=()):
    """``workdir`` ended where ``ref_dir`` did, with equal parameters and records; a resumed
    run also logs the first step it trained (``extra_first_steps``), which ``ref_dir`` may
    not have logged."""
    got, ref = _records(workdir), _records(ref_dir)
    steps = [r["step"] for r in got]
    assert len(steps) == len(set(steps)), f"duplicated records: {steps}"
    assert steps == sorted(steps)
    assert [r for r in got if r["step"] not in extra_first_steps
            or r["step"] in {q["step"] for q in ref}] == ref
    a, b = _params(workdir), _params(ref_dir)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in n]


class FailingData:
    """The worker's data, whose ``next()`` raises ``error`` for the batch of step ``at``
    (1-based) — before reading the wrapped iterator, or after it (``advance``: the
    iterator's position has moved past the batch it failed to deliver, as a loader that
    counts a batch before reading it does)."""

    def __init__(self, inner, at, error, advance=False):
        self.inner, self.at, self.error, self.advance, self.n = inner, at, error, advance, 0

    def __iter__(self):
        return self

    def __next__(self):
        self.n += 1
        if self.n == self.at:
            if self.advance:
                next(self.inner)
            raise self.error
        return next(self.inner)

    def get_state(self):
        return self.inner.get_state()

    def set_state(self, state):
        self.inner.set_state(state)


@pytest.mark.parametrize("error, options", [
    (OSError(errno.EIO, "Input/output error", "/data/shard-00003.bin"), {}),
    (OSError(errno.EIO, "Input/output error"), {"prefetch": 2}),  # raised in a thread
    (StopIteration(), {}),
])
def test_a_failing_data_iterator_checkpoints_the_last_step_and_the_same_call_finishes(
        reference, tmp_path, monkeypatch, error, options):
    workdir = str(tmp_path / "w")
    data = worker.data
    monkeypatch.setattr(worker, "data", lambda: FailingData(data(), 8, error, advance=True))
    with pytest.raises(DataIteratorError) as info:
        worker.train(workdir, **options)
    err = info.value
    ckpt = os.path.join(workdir, "checkpoints", "7")
    assert err.step == 8 and err.error is error and err.checkpoint == (7, ckpt)
    text = str(err)
    assert "\n" not in text
    if isinstance(error, StopIteration):
        assert text.startswith("the data iterator ran out of batches (StopIteration) at step 8; ")
    else:
        assert text.startswith(f"the data iterator raised OSError: {error} at step 8; ")
    assert text.endswith(f"the newest intact checkpoint is step 7 ({ckpt}); once the cause is "
                         "gone, rerunning the same call (same work dir) resumes from it.")
    # the last completed step, with the data position from before the failed batch
    meta = load_meta(os.path.join(workdir, "checkpoints"), 7)
    assert meta["step"] == 7 and (meta["data_state"]["epoch"], meta["data_state"]["step"]) == (0, 7)
    assert [r["step"] for r in _records(workdir)] == list(range(1, 8))
    monkeypatch.undo()
    result = worker.train(workdir, **options)
    assert result.status == "completed" and result.start_step == 7
    _assert_same_run(workdir, reference)


def test_a_data_iterator_failing_at_the_first_step_says_nothing_was_saved(tmp_path,
                                                                               monkeypatch):
    workdir = str(tmp_path / "w")
    data = worker.data
    monkeypatch.setattr(worker, "data", lambda: FailingData(data(), 1, OSError("gone")))
    with pytest.raises(DataIteratorError, match=r"^the data iterator raised OSError: gone at "
                       r"step 1; no checkpoint was written: once the cause is gone, rerunning "
                       r"the same call \(same work dir\) starts over\.$"):
        worker.train(workdir)
    assert not os.listdir(os.path.join(workdir, "checkpoints"))


def test_steps_per_call_a_failure_inside_a_call_saves_the_step_before_it(tmp_path,
                                                                        monkeypatch):
    """With 2 steps per call the batch of step 8 is the second of the call 7-8: the state
    saved is that of step 6, with the position before batch 7."""
    options = {"steps_per_call": 2, "log_every": 2, "checkpoint_every": 2, "eval_every": 4}
    ref_dir = str(tmp_path / "ref")
    worker.train(ref_dir, **options)
    workdir = str(tmp_path / "w")
    data = worker.data
    monkeypatch.setattr(worker, "data", lambda: FailingData(data(), 8, OSError("gone")))
    with pytest.raises(DataIteratorError, match="at step 8; the newest intact checkpoint is "
                       "step 6 "):
        worker.train(workdir, **options)
    assert load_meta(os.path.join(workdir, "checkpoints"))["data_state"]["step"] == 6
    monkeypatch.undo()
    assert worker.train(workdir, **options).start_step == 6
    _assert_same_run(workdir, ref_dir)


def test_a_failed_checkpoint_write_then_the_same_call_finishes_bit_for_bit(
        reference, tmp_path, monkeypatch):
    workdir = str(tmp_path / "w")
    _fail_checkpoint(monkeypatch, 6, "background")  # ENOSPC, as orbax reports it
    with pytest.raises(WriteError) as info:
        worker.train(workdir)
    assert info.value.errno == errno.ENOSPC and info.value.step == 6
    assert info.value.checkpoint == (4, os.path.join(workdir, "checkpoints", "4"))
    monkeypatch.undo()
    assert worker.train(workdir).start_step == 4
    _assert_same_run(workdir, reference)


def _child(workdir, fault, k):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.train._fault_worker", workdir, fault, str(k)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sigterm_while_a_checkpoint_is_written_saves_stops_and_the_same_call_finishes(
        reference, tmp_path):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed in the main thread")
    workdir = str(tmp_path / "w")
    proc = _child(workdir, "term-in-save", 3)
    held = None
    for line in proc.stdout:
        if line.startswith("writing checkpoint 3"):
            held = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert held is not None and "3.orbax-checkpoint-tmp" in held and "3" not in held, held
    assert proc.returncode == 0, err[-3000:]
    stopped = int(out.split("done interrupted from 0")[0].split("step ")[-1])
    assert 3 < stopped < worker.STEPS
    assert err.strip().splitlines()[-1] == (
        f"SIGTERM: stopped at step {stopped}; checkpoint saved in {workdir}; the same call "
        "resumes from it")
    assert not [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in n]
    with Checkpointer(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
        assert ckpt.latest_step() == stopped
    result = worker.train(workdir)
    assert result.status == "completed" and result.start_step == stopped
    _assert_same_run(workdir, reference)


@pytest.mark.slow
def test_sigkill_during_an_evaluation_keeps_the_previous_checkpoint_and_records(
        reference, tmp_path):
    workdir = str(tmp_path / "w")
    proc = _child(workdir, "hang-in-eval", 2)  # the evaluation of step 8
    for line in proc.stdout:
        if line.strip() == "evaluating":
            proc.send_signal(signal.SIGKILL)
            break
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    with Checkpointer(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
        saved = ckpt.latest_step()  # the evaluation's own checkpoint never started; 6's
    assert saved in (4, 6)  # is written in the background: 4's when it had not finished
    assert [r["step"] for r in _records(workdir)] == list(range(1, 8))  # 8's waits for eval
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        f.write('{"step": 8, "loss": 2.')  # what a kill in the middle of an append leaves
    result = worker.train(workdir)
    assert result.status == "completed" and result.start_step == saved
    _assert_same_run(workdir, reference)


# --------------------------------------------------------------------------- seqjax train


@pytest.fixture(scope="module")
def toy_reference(tmp_path_factory):
    """``seqjax train toy_rnn --smoke`` uninterrupted (20 steps, checkpoints at 10 and 20)."""
    workdir = str(tmp_path_factory.mktemp("toy") / "w")
    assert cli.main(["train", "toy_rnn", "--smoke", "--workdir", workdir,
                     "--progress=false"]) == 0
    return workdir


def _failing_batches(monkeypatch, at):
    """Make the training data of ``seqjax train`` raise an I/O error at step ``at``."""
    batches = fit_parts._batches

    def failing(data, start, data_state):
        get = batches(data, start, data_state)

        def batch(i):
            if i + 1 == at:
                raise OSError(errno.EIO, "Input/output error", "/data/shard-00003.bin")
            return get(i)
        return batch

    monkeypatch.setattr(fit_parts, "_batches", failing)


def test_seqjax_train_a_failing_data_iterator_exits_4_with_one_line_then_finishes(
        toy_reference, tmp_path, monkeypatch, capfd):
    from seqjax.experiments import toy_rnn

    workdir = str(tmp_path / "toy")
    argv = ["train", "toy_rnn", "--smoke", "--workdir", workdir, "--progress=false"]
    _failing_batches(monkeypatch, 13)
    assert cli.main(argv) == 4
    err = capfd.readouterr().err.strip().splitlines()
    ckpt = os.path.join(workdir, "checkpoints", "12")
    assert err[-1] == (
        "seqjax: error: the data iterator raised OSError: [Errno 5] Input/output error: "
        f"'/data/shard-00003.bin' at step 13; the newest intact checkpoint is step 12 ({ckpt}); "
        f"once the cause is gone, `seqjax train toy_rnn --smoke --workdir {workdir} "
        "--progress=false` resumes from it.")
    assert "Traceback (most recent call last):" in err and "in batch" in "\n".join(err)
    assert os.path.exists(os.path.join(workdir, "experiment.json"))  # the config was taken
    with pytest.raises(SystemExit) as exit_info:  # python -m: the same status, same line
        toy_rnn.main(argv[2:])
    assert exit_info.value.code == 4
    last = capfd.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("toy_rnn: error: the data iterator raised OSError: ") and (
        f"at step 13; the newest intact checkpoint is step 12 ({ckpt}); once the cause is "
        f"gone, `python -m seqjax.experiments.toy_rnn --smoke --workdir {workdir} "
        "--progress=false` resumes from it." in last), last
    monkeypatch.undo()
    assert cli.main(argv) == 0
    assert "resumed from step 12" in capfd.readouterr().err
    _assert_same_run(workdir, toy_reference, extra_first_steps=(13,))


def test_seqjax_train_a_failed_write_exits_3_then_the_same_command_finishes_bit_for_bit(
        toy_reference, tmp_path, monkeypatch, capfd):
    workdir = str(tmp_path / "toy")
    argv = ["train", "toy_rnn", "--smoke", "--workdir", workdir, "--progress=false"]
    _fail_checkpoint(monkeypatch, 20, "background")
    assert cli.main(argv) == 3
    last = capfd.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("seqjax: error: could not write the checkpoint of step 20 ")
    monkeypatch.undo()
    assert cli.main(argv) == 0
    assert "resumed from step 10" in capfd.readouterr().err
    _assert_same_run(workdir, toy_reference, extra_first_steps=(11,))

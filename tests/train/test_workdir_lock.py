"""One run per work dir: the lock's holder, refusal, re-entrancy, take-over from a dead
process, process 0 only; ``seqjax train`` refused before it writes anything; two real
processes."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import jax
import pytest

from seqjax import cli
from seqjax.train.records import read_metrics
from seqjax.train.workdir_lock import LOCK_FILE, WorkdirBusyError, hold_workdir
from tests.train import _lock_worker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OTHER = {"host": "elsewhere", "pid": 4242, "started": "2025-01-02 03:04:05 +0000",
         "command": "seqjax train char_lm --workdir w"}


def _hold_as_another_process(workdir, holder=OTHER):
    """Lock ``workdir`` through a descriptor of its own — to flock, another holder."""
    os.makedirs(workdir, exist_ok=True)
    fd = os.open(os.path.join(workdir, LOCK_FILE), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode(), 0)
    return fd


def _locked_by_someone(workdir):
    fd = os.open(os.path.join(workdir, LOCK_FILE), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_the_lock_records_its_holder_is_re_entrant_and_is_released(tmp_path):
    workdir = str(tmp_path / "w")
    with hold_workdir(workdir):
        holder = json.load(open(os.path.join(workdir, LOCK_FILE)))
        assert holder["pid"] == os.getpid() and holder["host"] and holder["started"]
        with hold_workdir(workdir):  # the same process: no deadlock, no refusal
            assert _locked_by_someone(workdir)
        assert _locked_by_someone(workdir)  # the outer hold still holds it
    assert not _locked_by_someone(workdir)
    assert open(os.path.join(workdir, LOCK_FILE)).read() == ""  # released: nobody to take over
    with hold_workdir(None):  # no work dir: nothing to lock
        pass


def test_a_held_work_dir_is_refused_naming_the_holder(tmp_path):
    workdir = str(tmp_path / "w")
    fd = _hold_as_another_process(workdir)
    try:
        with pytest.raises(WorkdirBusyError, match=r"in use by another run \(pid 4242 on host "
                           r"elsewhere, started 2025-01-02 03:04:05 \+0000, command: seqjax "
                           r"train char_lm --workdir w\)"):
            with hold_workdir(workdir):
                pass
        with pytest.raises(WorkdirBusyError, match="pid 4242"):  # fit, called directly
            _lock_worker.train(workdir)
        assert sorted(os.listdir(workdir)) == [LOCK_FILE]  # nothing written
    finally:
        os.close(fd)
    _lock_worker.train(workdir)  # released: it runs
    assert [r["step"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))] == [
        1, 2, 3, 4, 5, 6]


def test_fit_inside_a_hold_of_its_process_runs_and_leaves_the_hold(tmp_path):
    workdir = str(tmp_path / "w")
    with hold_workdir(workdir):
        _lock_worker.train(workdir)
        assert _locked_by_someone(workdir)  # fit released only its own hold
    assert not _locked_by_someone(workdir)


def test_seqjax_train_on_a_held_work_dir_exits_2_before_writing_anything(tmp_path, capsys):
    workdir = str(tmp_path / "toy")
    fd = _hold_as_another_process(workdir)
    try:
        assert cli.main(["train", "toy_rnn", "--smoke", "--workdir", workdir,
                         "--progress=false"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "pid 4242 on host elsewhere" in err, err
        assert sorted(os.listdir(workdir)) == [LOCK_FILE]  # no experiment.json, nothing
        with pytest.raises(SystemExit) as exit_info:  # python -m seqjax.experiments.NAME
            from seqjax.experiments import toy_rnn
            toy_rnn.main(["--smoke", "--workdir", workdir])
        assert exit_info.value.code == 2
        assert sorted(os.listdir(workdir)) == [LOCK_FILE]
    finally:
        os.close(fd)


def test_a_lock_left_by_a_dead_process_is_taken_over_in_one_line(tmp_path, capsys):
    workdir = str(tmp_path / "w")
    os.makedirs(workdir)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, json, os, sys, time\n"
        f"fd = os.open({os.path.join(workdir, LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, json.dumps({'host': 'here', 'pid': os.getpid()}).encode())\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkdirBusyError, match=f"pid {holder.pid} on host here"):
            with hold_workdir(workdir):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    capsys.readouterr()
    with hold_workdir(workdir):  # the kernel released the dead holder's lock
        assert json.load(open(os.path.join(workdir, LOCK_FILE)))["pid"] == os.getpid()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "took over the lock" in err[0] and f"pid {holder.pid}" in err[0]


def test_only_process_0_holds_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    workdir = str(tmp_path / "w")
    with hold_workdir(workdir):
        assert not os.path.exists(os.path.join(workdir, LOCK_FILE))


def test_a_second_process_on_the_same_work_dir_exits_2_and_the_first_finishes(tmp_path):
    workdir, gate = str(tmp_path / "w"), str(tmp_path / "gate")
    cmd = [sys.executable, "-m", "tests.train._lock_worker", workdir]
    first = subprocess.Popen([*cmd, gate], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "step 1"  # it holds the work dir, waiting
        t0 = time.monotonic()
        second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert f"pid {first.pid} on host" in second.stderr and "_lock_worker" in second.stderr
        assert "step" not in second.stdout  # refused before training
        assert first.poll() is None and time.monotonic() - t0 < 60  # it did not wait
    finally:
        open(gate, "w").close()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert out.strip().endswith("done")
    steps = [r["step"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))]
    assert steps == list(range(1, _lock_worker.STEPS + 1))  # each step once
    assert open(os.path.join(workdir, LOCK_FILE)).read() == ""

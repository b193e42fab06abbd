"""Real multi-process training: 2 processes x 2 CPU devices on 127.0.0.1 (gloo collectives).

Each test launches ``seqjax train char_lm`` (the user-facing path) as separate OS processes
joined by ``jax.distributed`` through the ``JAX_COORDINATOR_ADDRESS`` /
``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` environment, and compares with one process
that owns 4 devices. Loopback only, every process under a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from seqjax.train.preemption import EXIT_STOPPED

TIMEOUT_S = 240
QUIET = ["--progress=false", "--val_tokens=256", "--sample_tokens=4"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"))}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


def _cmd(workdir: str, *args: str) -> list[str]:
    preset = [] if any(a.startswith("--preset") for a in args) else ["--smoke"]
    return [sys.executable, "-m", "seqjax.cli", "train", "char_lm", *preset, *QUIET,
            f"--workdir={workdir}", *args]


def _launch(workdir: str, *args: str, processes: int = 2) -> list[subprocess.Popen]:
    port = _free_port()
    procs = []
    for i in range(processes):
        env = _env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(i))
        procs.append(subprocess.Popen(_cmd(workdir, *args), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def _wait(procs: list[subprocess.Popen], status: int = 0) -> list[str]:
    outs = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, out in zip(procs, outs):
        assert p.returncode == status, f"process exited with {p.returncode}:\n{out[-4000:]}"
    return outs


def _single(workdir: str, *args: str, devices: int = 4) -> str:
    r = subprocess.run(_cmd(workdir, *args), env=_env(devices), capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


def _records(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _run_json(workdir: str) -> dict:
    with open(os.path.join(workdir, "run.json")) as f:
        return json.load(f)


# Every strategy across two processes, each model once per sharded layout (the in-process
# tests on 8 fake devices cover every model x layout; these add the second process).
# One case per way the processes share the work: parameters split over both (fsdp), the
# recurrent layer's weights split over `model` inside each process, `model` spanning the two
# processes (both must feed the same rows). A batch split over `data` alone is every case's
# `data` axis, and tests/data/test_shard_windows_processes.py's runs on 1 and 2 processes.
CASES = [
    ("transformer", "data=2,fsdp=2", "fsdp"),
    ("lstm", "data=2,model=2", "tensor"),
    ("transformer", "model=4", "tensor"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "mesh", "strategy"), CASES,
                         ids=[f"{m}-{s}-{x}" for m, x, s in CASES])
def test_two_processes_match_one_process(tmp_path, model, mesh, strategy):
    args = [f"--mesh={mesh}", f"--strategy={strategy}", "--fsdp_min_size=16"]
    if model == "lstm":
        args.append("--preset=lstm-smoke")
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    _single(one, *args)
    outs = _wait(_launch(two, *args))
    a, b = _records(one), _records(two)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], abs=1e-5), (ra, rb)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4)
    assert b[-1]["eval/loss"] == pytest.approx(a[-1]["eval/loss"], abs=1e-5)
    info = _run_json(two)
    assert info["devices"] == 4 and info["processes"] == 2
    assert info["strategy"] == strategy
    named = {k: int(v) for k, v in (part.split("=") for part in mesh.split(","))}
    assert info["mesh"] == {"data": 1, "fsdp": 1, "model": 1, **named}
    # logs written once: one line per logged step, and both processes agree
    assert len(b) == len({r["step"] for r in b})
    assert all("Traceback" not in o for o in outs)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "victim"), [(signal.SIGTERM, 1), (signal.SIGINT, 0)],
                         ids=["sigterm-to-process-1", "ctrl-c-to-process-0"])
def test_signal_to_one_process_stops_both_at_the_same_step_and_resumes(tmp_path, sig, victim):
    work = str(tmp_path / "run")
    procs = _launch(work, "--steps=100000", "--log_every=1")
    metrics = os.path.join(work, "metrics.jsonl")
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if os.path.exists(metrics) and len(_records(work)) >= 3:
            break
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.2)
    procs[victim].send_signal(sig)  # one host is preempted (or Ctrl-C on one host)
    outs = _wait(procs, EXIT_STOPPED)  # stopped, not finished: both say so
    steps = []
    for out in outs:
        line = [ln for ln in out.splitlines() if "stopped at step" in ln]
        assert line, out[-3000:]
        steps.append(int(line[-1].split("stopped at step")[1].split(";")[0]))
    assert steps[0] == steps[1], steps
    stopped = steps[0]
    assert 3 <= stopped < 100000
    ckpts = sorted(int(d) for d in os.listdir(os.path.join(work, "checkpoints")) if d.isdigit())
    assert ckpts[-1] == stopped
    # the checkpoint restores on another topology: one process with 4 devices continues
    out = _single(work, f"--steps={stopped + 2}", "--log_every=1")
    recs = _records(work)
    assert recs[-1]["step"] == stopped + 2
    assert [r["step"] for r in recs] == list(range(1, stopped + 3))
    assert "stopped at step" not in out

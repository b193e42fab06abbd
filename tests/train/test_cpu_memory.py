"""seqjax.train.cpu_memory: glibc keeps XLA:CPU's freed temporaries (no speed is asserted;
``python -m benchmarks cpu_memory`` measures the page faults and time)."""

import ctypes.util
import re
import sys

import jax.numpy as jnp
import optax
import pytest

from seqjax.train import cpu_memory
from seqjax.train.optim import TrainState
from seqjax.train.step import make_eval_step, make_train_step

GLIBC = sys.platform.startswith("linux") and "libc" in str(ctypes.util.find_library("c"))


@pytest.fixture
def undecided(monkeypatch):
    """The process-wide outcome forgotten, so each test decides it afresh."""
    monkeypatch.setattr(cpu_memory, "_applied", None)


def _loss(p, b, rng):
    return jnp.mean((b["x"] * p["w"]) ** 2), {}


def test_the_environment_switch_leaves_glibc_alone(undecided, monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_memory, "_mallopt_thresholds", lambda v: calls.append(v) or True)
    for off in ("0", "false", "OFF"):
        monkeypatch.setattr(cpu_memory, "_applied", None)
        monkeypatch.setenv(cpu_memory.ENV, off)
        assert cpu_memory.keep_freed_memory() is False
    assert calls == []
    monkeypatch.setenv(cpu_memory.ENV, "1")
    monkeypatch.setattr(cpu_memory, "_applied", None)
    assert cpu_memory.keep_freed_memory() is True and calls == [1 << 30]
    assert cpu_memory.keep_freed_memory() is True and calls == [1 << 30]  # once per process


def test_building_steps_leaves_the_allocator_alone(undecided, monkeypatch):
    """A process-wide setting: only the program's start (seqjax train, the benchmarks) sets
    it; building and running a train or eval step does not."""
    calls = []
    monkeypatch.delenv(cpu_memory.ENV, raising=False)
    monkeypatch.setattr(cpu_memory, "_mallopt_thresholds", lambda v: calls.append(v) or True)
    step = make_train_step(_loss)
    make_eval_step(lambda p, b: {"loss": jnp.sum(p["w"])})
    state = TrainState.create({"w": jnp.ones(())}, optax.sgd(0.1), jnp.zeros(2, jnp.uint32))
    state, m = step(state, {"x": jnp.ones(4)})
    assert float(m["loss"]) == 1.0 and calls == [] and cpu_memory._applied is None


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_glibc_accepts_the_thresholds(undecided):
    assert cpu_memory._mallopt_thresholds(1 << 30) is True
    assert cpu_memory.keep_freed_memory(force=True) is True


def test_cpu_memory_bench_smoke(capsys):
    from benchmarks import cpu_memory as bench

    assert bench.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "minor faults/step" in out and "keep_freed_memory applied: False" in out
    assert re.search(r"^cpu_memory: CPU ms/step [\d.]+ -> [\d.]+; wall ms/step [\d.]+ -> "
                     r"[\d.]+$", out.rstrip().splitlines()[-1])

"""The run of :mod:`tests.train._crash_worker` with a fault held open for a parent process
to strike in (the fault-suite tests, :mod:`tests.train.test_long_run_faults`).

``python -m tests.train._fault_worker WORKDIR FAULT K`` trains as the crash worker does
(printing ``step N`` for every logged step), with, by ``FAULT``:

* ``term-in-save``: the write of the checkpoint of step ``K`` is held at its last moment —
  orbax's rename of its temporary folder to ``K`` — and ``writing checkpoint K`` printed;
  the rename waits (10 s at most) until the run has received SIGTERM, which the parent
  sends when it reads that line;
* ``hang-in-eval``: the ``K``-th evaluation prints ``evaluating`` and then sleeps (10 s),
  long enough for the parent to SIGKILL it mid-evaluation.

It ends with ``done STATUS from START``. Nothing of the package is changed: the faults are
wrappers put around ``os.rename`` and the evaluation data in this process only.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator

import jax

from tests.train import _crash_worker as worker


def _sigterm_received() -> bool:
    """Whether ``fit``'s signal guard (the SIGTERM handler while it trains) has a request."""
    handler = signal.getsignal(signal.SIGTERM)
    return getattr(getattr(handler, "__self__", None), "requested", None) is not None


def hold_checkpoint_write(step: int) -> None:
    """Hold orbax's final rename ``<step>.orbax-checkpoint-tmp* -> <step>`` until SIGTERM."""
    rename = os.rename

    def held_rename(src, dst, *args, **kwargs):  # noqa: ANN001, ANN202 - os.rename's
        if (os.path.basename(os.fspath(dst)) == str(step) and
                os.path.basename(os.fspath(src)).startswith(f"{step}.orbax-checkpoint-tmp")):
            print(f"writing checkpoint {step}", flush=True)
            deadline = time.monotonic() + 10.0
            while not _sigterm_received() and time.monotonic() < deadline:
                time.sleep(0.01)
        return rename(src, dst, *args, **kwargs)

    os.rename = held_rename


def hang_in_evaluation(nth: int) -> None:
    """The ``nth`` evaluation says so and sleeps."""
    batches, calls = worker.eval_batches, [0]

    def eval_batches() -> Iterator[dict]:
        calls[0] += 1
        if calls[0] == nth:
            print("evaluating", flush=True)
            time.sleep(10.0)
        yield from batches()

    worker.eval_batches = eval_batches


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "highest")  # as tests/conftest.py
    workdir, fault, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
    {"term-in-save": hold_checkpoint_write, "hang-in-eval": hang_in_evaluation}[fault](k)
    result = worker.train(workdir, hooks=[lambda r: print(f"step {r['step']}", flush=True)])
    print(f"done {result.status} from {result.start_step}", flush=True)

"""Stopping a run cleanly: SIGTERM/SIGINT become a save-and-stop request, agreed on by every
process of a distributed job (JAX's preemption sync point).

Used by :func:`seqjax.train.loop.fit` (:class:`SignalGuard`) and by ``seqjax train``
(:func:`stop_requests`), which catches the signals throughout, so one arriving while data is
opened, a checkpoint restored or the step compiled also stops the run at its first step
boundary; it then exits with :data:`EXIT_STOPPED`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

__all__ = ["EXIT_STOPPED", "SignalGuard", "RunStopped", "check_distributed", "pending_stop",
           "stop_requests"]

#: ``seqjax train``'s exit status when stopped by SIGTERM/SIGINT after saving (the same
#: command resumes): BSD's ``EX_TEMPFAIL``, non-zero so retry loops and requeue-on-failure
#: rerun it, and distinct from seqjax's errors (1-4) and from 128 + N (killed unsaved).
EXIT_STOPPED = 75

_pending: str | None = None  # a signal caught by stop_requests outside fit


class RunStopped(Exception):
    """``seqjax train`` was stopped by a signal; its last checkpoint (if any) is saved."""

    def __init__(self, signal_name: str, detail: str = "") -> None:
        self.signal_name = signal_name
        super().__init__(f"stopped by {signal_name}{detail}; the same command resumes the run "
                         f"(exit status {EXIT_STOPPED})")


def _catch(signum: int, frame: Any) -> None:
    global _pending
    if _pending is not None and signum == signal.SIGINT:  # a second Ctrl-C: stop now
        raise KeyboardInterrupt
    _pending = signal.Signals(signum).name


def pending_stop(*, take: bool = False) -> str | None:
    """The signal :func:`stop_requests` caught outside ``fit``, or ``None``; ``take`` clears it
    (``fit`` takes it at start and stops before its first step)."""
    global _pending
    name = _pending
    if take:
        _pending = None
    return name


@contextlib.contextmanager
def stop_requests() -> Iterator[None]:
    """For the block, catch SIGTERM/SIGINT (a second SIGINT still interrupts) for
    :func:`pending_stop` and ``fit`` instead of ending the process; the old handlers are
    restored after. Main thread only (elsewhere nothing changes)."""
    global _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, _catch) for sig in (signal.SIGTERM, signal.SIGINT)}
    _pending = None
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def check_distributed() -> None:
    """Refuse to train if the environment asks for a multi-process job ``jax.distributed`` has not
    joined."""
    from seqjax.train.sharding import distributed_requested

    if distributed_requested() and not jax.distributed.is_initialized():
        raise RuntimeError(
            "the environment asks for a multi-process job (JAX_COORDINATOR_ADDRESS, a TPU pod, "
            "SLURM or Open MPI), but jax.distributed is not initialised: call "
            "seqjax.train.sharding.maybe_initialize_distributed() (or Parallel.create()) "
            "before any other JAX call.")


class SignalGuard:
    """Turn SIGTERM/SIGINT into a stop request while training (handlers restored on exit).

    One process: the handlers set ``requested``. Several: JAX's coordination service owns SIGTERM
    and :func:`jax.experimental.multihost_utils.reached_preemption_sync_point` is True on every
    process at the same step; SIGINT is re-raised as SIGTERM so Ctrl-C takes the same path.
    Without that service, the processes all-gather their flags every step.
    """

    def __init__(self, enabled: bool) -> None:
        # a signal caught by stop_requests before fit started: stop before the first step
        self.requested: str | None = pending_stop(take=True) if enabled else None
        self._old: dict[int, Any] = {}
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.multi = jax.process_count() > 1
        self._sync_point: Callable[[int], bool] | None = None
        if self.multi:
            from jax.experimental import multihost_utils

            self._sync_point = multihost_utils.reached_preemption_sync_point
            try:
                self._sync_point(-1)  # probe: raises if the sync manager is absent
            except RuntimeError:
                self._sync_point = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        if self.multi and self._sync_point is not None and signum == signal.SIGINT:
            # hand Ctrl-C to the coordination service's SIGTERM notifier (all processes)
            signal.signal(signal.SIGINT, self._old.get(signal.SIGINT, signal.SIG_DFL))
            signal.raise_signal(signal.SIGTERM)

    def should_stop(self, step: int) -> bool:
        """Whether to save and stop after ``step`` (the same answer on every process)."""
        if not self.multi:
            return self.requested is not None
        if self._sync_point is not None:
            stop, name = bool(self._sync_point(step)), "SIGTERM"
        else:
            from jax.experimental import multihost_utils

            flags = multihost_utils.process_allgather(np.int32(self.requested is not None))
            stop, name = bool(np.asarray(flags).any()), "SIGTERM (another process)"
        if stop:
            self.requested = self.requested or name
        return stop

    def __enter__(self) -> SignalGuard:
        if self.enabled:
            # In a distributed job with the preemption service, SIGTERM belongs to it.
            sigs = (signal.SIGINT,) if self._sync_point is not None else (
                signal.SIGTERM, signal.SIGINT)
            for sig in sigs:
                self._old[sig] = signal.signal(sig, self._handler)
            if self.requested is not None and self._sync_point is not None:
                # caught before fit (stop_requests): tell the coordination service, which
                # stops every process at the same step
                signal.raise_signal(signal.SIGTERM)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

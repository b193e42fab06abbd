"""Stopping a run cleanly: SIGTERM/SIGINT become a save-and-stop request, agreed on by
every process of a distributed job (JAX's preemption sync point).

Used by :func:`seqjax.train.loop.fit`; see its docstring for the guarantees.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

__all__ = ["SignalGuard", "check_distributed"]


def check_distributed() -> None:
    """Refuse to train when the environment asks for a multi-process job that
    ``jax.distributed`` has not joined."""
    from seqjax.train.sharding import distributed_requested

    if distributed_requested() and not jax.distributed.is_initialized():
        raise RuntimeError(
            "the environment asks for a multi-process job (JAX_COORDINATOR_ADDRESS, a TPU pod, "
            "SLURM or Open MPI), but jax.distributed is not initialised: call "
            "seqjax.train.sharding.maybe_initialize_distributed() (or Parallel.create()) "
            "before any other JAX call."
        )


class SignalGuard:
    """Turn SIGTERM/SIGINT into a stop request while training (restored on exit).

    One process: Python handlers set ``requested``. Several processes: the stop must be
    agreed on. JAX's coordination service catches SIGTERM itself (its preemption notifier)
    and :func:`jax.experimental.multihost_utils.reached_preemption_sync_point` returns True
    on every process at the same step; SIGINT is re-raised as SIGTERM so that Ctrl-C on
    one host takes the same path. Without the preemption service (not initialised through
    ``jax.distributed``) the processes agree by an all-gather of their local flags at every
    step.
    """

    def __init__(self, enabled: bool) -> None:
        self.requested: str | None = None
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
            if self._sync_point(step):
                self.requested = self.requested or "SIGTERM"
                return True
            return False
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.int32(self.requested is not None))
        if np.asarray(flags).any():
            self.requested = self.requested or "SIGTERM (another process)"
            return True
        return False

    def __enter__(self) -> SignalGuard:
        if self.enabled:
            # In a distributed job with the preemption service, SIGTERM belongs to it.
            sigs = (signal.SIGINT,) if self._sync_point is not None else (
                signal.SIGTERM, signal.SIGINT)
            for sig in sigs:
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

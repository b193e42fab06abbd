"""One run per work dir: an OS file lock held for the whole run.

:func:`hold_workdir` takes ``fcntl.flock`` on ``<workdir>/seqjax.lock`` and writes the holder
(host, PID, start time, command) into it; a second run gets :class:`WorkdirBusyError` naming
the holder before it writes anything. The kernel releases the lock when its process dies, so
a stale lock file never blocks (the next run takes it over and says so). The lock is
re-entrant within a process (``seqjax train`` takes it, then ``fit`` finds it held); with
several processes, process 0 holds it and tells the others whether it got it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from seqjax.train.write_errors import WRITE_ERRNOS, WriteError

__all__ = ["LOCK_FILE", "WorkdirBusyError", "hold_workdir", "holds_workdir"]

#: The lock file's name in a work dir.
LOCK_FILE = "seqjax.lock"

P = ParamSpec("P")
R = TypeVar("R")


class WorkdirBusyError(RuntimeError):
    """Another run holds the work dir (``holder``: its host, PID, start time, command)."""

    def __init__(self, workdir: str, holder: dict) -> None:
        self.workdir, self.holder = workdir, holder
        super().__init__(f"work dir {workdir} is in use by another run ({describe(holder)}); "
                         "wait for it to end, or use another work dir.")


def describe(holder: dict) -> str:
    """``'pid 12 on host h, started 2025-01-02 03:04:05, command: seqjax train ...'``."""
    if not holder:
        return "holder not recorded yet"
    if "process" in holder:  # another process of this job reports process 0's refusal
        return str(holder["process"])
    parts = [f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"]
    if "started" in holder:
        parts.append(f"started {holder['started']}")
    if holder.get("command"):
        parts.append(f"command: {holder['command']}")
    return ", ".join(parts)


class _Held:
    """A lock this process holds: the file's descriptor and the open holds."""

    def __init__(self, fd: int | None) -> None:
        self.fd, self.depth = fd, 1


# This process's locks by work dir, making them re-entrant (flock is per open file: a second
# open and flock in this process would be refused).
_HELD: dict[str, _Held] = {}
_HELD_GUARD = threading.Lock()


def _read_holder(fd: int) -> dict:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}


def _holder_of_busy(fd: int) -> dict:
    """The holder in another process's lock file (written just after locking, so wait briefly)."""
    for _ in range(20):
        holder = _read_holder(fd)
        if holder:
            return holder
        time.sleep(0.025)
    return {}


def _acquire(workdir: str) -> _Held:
    """Lock ``workdir`` for this process, or raise :class:`WorkdirBusyError`."""
    path = os.path.join(workdir, LOCK_FILE)
    try:
        os.makedirs(workdir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno in WRITE_ERRNOS:
            raise WriteError("the lock file", path, code=err.errno) from err
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder_of_busy(fd)
        os.close(fd)
        raise WorkdirBusyError(workdir, holder) from None
    except OSError as err:  # a file system without locks (some network mounts)
        os.close(fd)
        print(f"seqjax: cannot lock {path} ({err.strerror}): another run on this work dir "
              "would not be stopped.", file=sys.stderr)
        return _Held(None)
    previous = _read_holder(fd)
    if previous:  # a holder that ended without releasing it: killed, or its machine died
        print(f"seqjax: took over the lock of {workdir} from a run that is no longer running "
              f"({describe(previous)}).", file=sys.stderr)
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
              "command": " ".join(sys.argv)}
    with contextlib.suppress(OSError):  # the holder is a courtesy; the lock is the flock
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return _Held(fd)


def _agree(workdir: str, busy: WorkdirBusyError | None) -> WorkdirBusyError | None:
    """Several processes: process 0's outcome, on every process."""
    import jax

    if jax.process_count() == 1:
        return busy
    import numpy as np
    from jax.experimental import multihost_utils

    flag = int(multihost_utils.broadcast_one_to_all(np.int32(busy is not None)))
    if flag and busy is None:
        return WorkdirBusyError(workdir, {"process": "process 0 found it held by another run"})
    return busy


@contextlib.contextmanager
def hold_workdir(workdir: str | os.PathLike | None) -> Iterator[None]:
    """Hold ``workdir``'s lock for the block (nothing for ``None``; re-entrant in a process);
    raises :class:`WorkdirBusyError` if another process holds it.

    Example:
        >>> import tempfile
        >>> w = tempfile.mkdtemp()
        >>> with hold_workdir(w), hold_workdir(w):  # the same process: re-entrant
        ...     "pid" in open(os.path.join(w, LOCK_FILE)).read()
        True
    """
    if workdir is None:
        yield
        return
    import jax

    key = os.path.realpath(os.fspath(workdir))
    held: _Held | None = None
    busy: WorkdirBusyError | None = None
    if jax.process_index() == 0:
        with _HELD_GUARD:
            held = _HELD.get(key)
            if held is not None:
                held.depth += 1
            else:
                try:
                    held = _HELD[key] = _acquire(key)
                except WorkdirBusyError as err:
                    busy = err
    try:
        busy = _agree(key, busy)
        if busy is not None:
            raise busy
        yield
    finally:
        if held is not None:
            _drop(key, held)


def _drop(key: str, held: _Held) -> None:
    with _HELD_GUARD:
        held.depth -= 1
        if held.depth == 0:
            _HELD.pop(key, None)
            if held.fd is not None:
                with contextlib.suppress(OSError):  # empty: released, nobody to take over from
                    os.ftruncate(held.fd, 0)
                os.close(held.fd)  # closing the only descriptor of the file releases the flock


def holds_workdir(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a function taking ``workdir=`` to run holding its lock (:func:`hold_workdir`)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        workdir = kwargs.get("workdir")
        with hold_workdir(workdir if isinstance(workdir, str | os.PathLike) else None):
            return fn(*args, **kwargs)

    return wrapper


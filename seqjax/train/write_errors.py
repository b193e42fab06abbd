"""A failed write (full disk, read-only or forbidden folder, I/O error) as one error saying what
failed, where, at which step, the space needed and free, the newest intact checkpoint and how
to resume.

:func:`write_failure` recognises one in any exception: an ``OSError`` with a write ``errno``
anywhere in its chain, or its text (tensorstore, under orbax, reports ``RESOURCE_EXHAUSTED:
... [os_error_code='28']`` as a ``ValueError``). :func:`writing` turns it into a
:class:`WriteError`; the checkpointer, :class:`~seqjax.train.fit_parts.MetricsLog` and
:mod:`seqjax.train.records` write through it, and ``seqjax train`` reports it in one line with
exit status 3. :func:`space_warning` checks free space before training.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["WRITE_ERRNOS", "WriteError", "newest_checkpoint", "resumed_by", "space_warning",
           "tree_bytes", "write_failure", "writing"]

#: The ``errno`` values of a write that failed for a reason outside the program.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS,
                          errno.EIO, errno.EFBIG})

# tensorstore's statuses carry the OS error: `... [os_error_code='28']`.
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
_STATUS_ERRNO = {"RESOURCE_EXHAUSTED": errno.ENOSPC, "PERMISSION_DENIED": errno.EACCES}


def write_failure(err: BaseException | None) -> int | None:
    """The write ``errno`` of ``err`` or its chain (``__cause__``, ``__context__``), else ``None``.

    Example:
        >>> write_failure(ValueError("RESOURCE_EXHAUSTED: ... [os_error_code='28']"))
        28
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:
            return err.errno
        text = str(err)
        found = _OS_ERROR_CODE.search(text)
        if found and int(found.group(1)) in WRITE_ERRNOS:
            return int(found.group(1))
        for status, code in _STATUS_ERRNO.items():
            if text.startswith(status) and ("os_error_code" in text or "Failed writing" in text):
                return code
        err = err.__cause__ or err.__context__
    return None


def _size(n: int) -> str:
    """``n`` bytes for a person: ``'12.3 MB'``."""
    value = float(n)
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{int(value)} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def free_bytes(path: str) -> int | None:
    """Free bytes of the file system holding ``path`` (or its nearest existing folder) or None."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def newest_checkpoint(directory: str | None) -> tuple[int, str] | None:
    """``(step, path)`` of the newest complete checkpoint (folder named by its step) or None."""
    if directory is None or not os.path.isdir(directory):
        return None
    step = max((int(n) for n in os.listdir(directory)
                if n.isdigit() and os.path.isdir(os.path.join(directory, n))), default=None)
    return None if step is None else (step, os.path.join(directory, str(step)))


def tree_bytes(tree: Any) -> int:
    """The bytes of the arrays of a pytree (global sizes of sharded arrays)."""
    import jax

    # An array's nbytes, also 0 (an empty array spanning other hosts cannot be read here).
    return sum(int(n) if (n := getattr(leaf, "nbytes", None)) is not None
               else np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(tree))


class WriteError(OSError):
    """A file of a run could not be written (no space, no permission, an I/O error).

    Attributes: ``what`` (e.g. ``"the checkpoint"``), ``path``, ``step``, ``needed`` and ``free``
    (bytes), ``checkpoint`` (``(step, path)`` of the newest intact one), ``resume`` (the resume
    command, set by ``seqjax train``) — each ``None`` where unknown — and ``errno``/``strerror``.
    ``str()`` is one line with all of them.
    """

    def __init__(self, what: str, path: str, *, code: int, step: int | None = None,
                 needed: int | None = None, free: int | None = None,
                 checkpoint: tuple[int, str] | None = None, resume: str | None = None) -> None:
        super().__init__(code, os.strerror(code), path)
        self.what, self.path, self.step = what, path, step
        self.needed, self.free, self.checkpoint, self.resume = needed, free, checkpoint, resume

    def __str__(self) -> str:
        at = f" of step {self.step}" if self.step is not None else ""
        name = errno.errorcode.get(self.errno or 0, str(self.errno))
        text = f"could not write {self.what}{at} to {self.path}: {self.strerror} [{name}]"
        if self.needed is not None or self.free is not None:
            sizes = [f"about {_size(self.needed)} needed" if self.needed is not None else "",
                     f"{_size(self.free)} free" if self.free is not None else ""]
            text += f" ({', '.join(s for s in sizes if s)})"
        resume = self.resume or "rerunning the same call (same work dir)"
        if self.checkpoint is not None:
            step, path = self.checkpoint
            text += (f"; the newest intact checkpoint is step {step} ({path}); once the cause "
                     f"is gone, {resume} resumes from it")
        else:
            text += f"; no checkpoint was written yet: once the cause is gone, {resume} starts over"
        return text + "."


@contextlib.contextmanager
def writing(what: str, path: str, *, step: int | None = None, needed: int | None = None,
            checkpoints: str | None = None) -> Iterator[None]:
    """Run a block writing ``what`` to ``path``; a write failure (:func:`write_failure`) becomes a
    :class:`WriteError` with ``step``, ``needed``, the free bytes and the newest checkpoint in
    ``checkpoints``; other errors pass unchanged.

    Example:
        >>> with writing("the record", "/x/metrics.jsonl", step=7):  # doctest: +ELLIPSIS
        ...     raise OSError(errno.ENOSPC, "No space left on device")
        Traceback (most recent call last):
        ...
        seqjax.train.write_errors.WriteError: could not write the record of step 7 to /x/...
    """
    try:
        yield
    except WriteError:
        raise
    except Exception as err:  # noqa: BLE001 - only write failures are turned, others re-raised
        code = write_failure(err)
        if code is None:
            raise
        raise WriteError(what, path, code=code, step=step, needed=needed,
                         free=free_bytes(path), checkpoint=newest_checkpoint(checkpoints)
                         ) from err


@contextlib.contextmanager
def resumed_by(command: str, workdir: str | None,
               resumable: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Run a whole run (``seqjax train``): a :class:`WriteError`, or an error of the ``resumable``
    types (with a ``resume`` attribute, e.g. :class:`~seqjax.train.fit_parts.DataIteratorError`;
    passed on as is), leaving it says ``command`` resumes it; any other write failure becomes a
    :class:`WriteError` of its file with ``workdir``'s newest checkpoint."""
    checkpoints = None if workdir is None else os.path.join(workdir, "checkpoints")
    passed_on: tuple[type[Exception], ...] = (WriteError, *(
        resumable if isinstance(resumable, tuple) else (resumable,)))  # one class, as `except`
    try:
        yield
    except passed_on as err:
        err.resume = f"`{command}`"  # type: ignore[attr-defined]  # the outermost run's command
        raise
    except Exception as err:  # noqa: BLE001 - only write failures are turned, others re-raised
        code = write_failure(err)
        if code is None:
            raise
        name = getattr(err, "filename", None)
        path = str(name) if name else (workdir or os.getcwd())
        what = os.path.basename(path) if name else "a file of the run"
        raise WriteError(what, path, code=code, free=free_bytes(path),
                         checkpoint=newest_checkpoint(checkpoints), resume=f"`{command}`"
                         ) from err


def space_warning(directory: str, checkpoint_bytes: int, keep: int) -> str | None:
    """The line to print before training if ``directory`` has less free space than ``keep + 1``
    checkpoints of ``checkpoint_bytes`` (the kept ones and the one being written), less what is
    already there; ``None`` if enough or unknown."""
    free = free_bytes(directory)
    if free is None or checkpoint_bytes <= 0:
        return None
    held = 0
    for root, _, files in os.walk(directory):  # nothing if it does not exist yet
        for f in files:
            with contextlib.suppress(OSError):
                held += os.lstat(os.path.join(root, f)).st_size
    needed = max(checkpoint_bytes, checkpoint_bytes * (keep + 1) - held)
    if free >= needed:
        return None
    return (f"fit: {directory} has {_size(free)} free, less than the {_size(needed)} its "
            f"checkpoints will take ({_size(checkpoint_bytes)} each, {keep} kept + 1 being "
            "written); a checkpoint write may fail.")

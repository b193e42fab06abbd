"""Keep freed memory in the process on XLA:CPU, so a jitted step does not fault it back in.

On the CPU backend each call of a compiled program allocates its temporaries with ``malloc``
and frees them on return. glibc serves large blocks with a fresh ``mmap`` (above
``M_MMAP_THRESHOLD``, at most 32 MiB; always, off the main thread, for blocks over a thread
arena's 64 MiB heap) and returns freed memory at the heap top to the kernel (above
``M_TRIM_THRESHOLD``), so each call faults in freshly zeroed pages again — up to a third of a
small model's step CPU time (``benchmarks/HISTORY.md``, "The CPU step: page faults").

:func:`keep_freed_memory` sets both thresholds to 1 GiB and ``M_ARENA_MAX`` to one (every
thread allocates from the main heap, which can grow past 64 MiB), so freed blocks up to 1 GiB
are reused. Costs: up to 1 GiB of freed heap kept (resident size stays near its peak) and one
lock for every thread's ``malloc``. It is process-wide, so set it at program start
(``seqjax train`` does, right after the backend starts; so should a CPU training script),
preferably before any JAX operation: a thread keeps the arena of its first allocation.
``SEQJAX_KEEP_FREED_MEMORY=0`` turns it off. A no-op outside Linux/glibc and on GPU/TPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import jax

from seqjax._env import env_bool

__all__ = ["ENV", "keep_freed_memory"]

#: Set to ``0`` to leave glibc's allocator settings alone.
ENV = "SEQJAX_KEEP_FREED_MEMORY"

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (<malloc.h>)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_THRESHOLD = 1 << 30  # 1 GiB

_applied: bool | None = None  # the outcome, once decided (a process-wide setting)


def keep_freed_memory(*, force: bool = False) -> bool:
    """The module docstring's settings, once per process; ``True`` if set, ``False`` where it
    cannot (not Linux/glibc) or should not act: without ``force``, on a backend other than CPU
    or with ``SEQJAX_KEEP_FREED_MEMORY`` off (:func:`seqjax._env.parse_bool`; another value is a
    ``ValueError``)."""
    global _applied
    if _applied is None or force:
        wanted = force or (env_bool(ENV, True) and jax.default_backend() == "cpu")
        _applied = wanted and _mallopt_thresholds(_THRESHOLD)
    return _applied


def _mallopt_thresholds(value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, v) == 1 for param, v in (
        (_M_MMAP_THRESHOLD, value), (_M_TRIM_THRESHOLD, value), (_M_ARENA_MAX, 1)))

"""Keep freed memory in the process on XLA:CPU, so a jitted step does not fault it back in.

On the CPU backend every call of a compiled program allocates its temporaries with the C
library's ``malloc`` and frees them when it returns. glibc serves a large block with a
fresh ``mmap`` (above ``M_MMAP_THRESHOLD``, at most 32 MiB by its own adjustment; always,
for a block larger than a thread arena's 64 MiB heap, when the allocating thread is not
the main one) and returns freed memory at the top of the heap to the kernel (above
``M_TRIM_THRESHOLD``), so the next call touches new pages again: the kernel zeroes and
maps each one on first touch. For ``char_lm``'s step (nanoGPT's CPU config, a 2-core VM)
that is about 12,600 minor page faults and 18 ms of system time per call — a third of the
step's CPU time; for an LSTM layer's forward and backward pass (B = 32, T = 128, H = 256)
13,000–14,000 faults and a fifth (``benchmarks/HISTORY.md``, "The CPU step: page faults").

:func:`keep_freed_memory` sets, with ``mallopt``, both thresholds to 1 GiB and the number
of malloc arenas to one (``M_ARENA_MAX``: every thread allocates from the main heap, which
can grow past 64 MiB): blocks up to 1 GiB come from the heap and freed ones stay there for
the next call (page faults per call fall to a few hundred). The costs: memory — the
process keeps up to 1 GiB of freed heap instead of returning it, and its resident size
stays near its peak — and one lock for every thread's ``malloc`` (XLA's operations compute
in buffers allocated up front; a program whose many threads allocate all the time may
prefer ``SEQJAX_KEEP_FREED_MEMORY=0``).
It is a setting of the whole process, so only a program's start sets it: ``seqjax train``
calls it right after the backend starts (the benchmarks do too); a CPU training script of
your own calls it first thing. ``SEQJAX_KEEP_FREED_MEMORY=0`` turns it off.
Called before any JAX operation has run, it is steadiest: a thread keeps the malloc arena
of its first allocation, so XLA threads that allocated before the call may still map their
large temporaries afresh (an LSTM layer's fwd+bwd in a session script: 682–8,140 faults
per call when applied after the model ran, against about 150 when applied first).
It does nothing outside Linux with glibc, and on GPU/TPU backends (their temporaries live
in the accelerator's allocator).
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
    """Raise glibc's mmap and trim thresholds to 1 GiB and use one arena (once per
    process); ``True`` if set.

    Without ``force`` it acts only when JAX's default backend is the CPU and the
    environment does not turn ``SEQJAX_KEEP_FREED_MEMORY`` off (``0``, ``false``, ``no``,
    ``off``: :func:`seqjax._env.parse_bool`; another value is a ``ValueError``). Returns
    ``False`` where it cannot (not Linux/glibc) or should not act.
    """
    global _applied
    if _applied is not None and not force:
        return _applied
    if not force and (not env_bool(ENV, True) or jax.default_backend() != "cpu"):
        _applied = False
        return False
    _applied = _mallopt_thresholds(_THRESHOLD)
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

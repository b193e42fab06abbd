"""JAX's persistent compilation cache, turned on with one call.

A jitted program is compiled by XLA the first time it runs with new shapes; for a GPT step
on a GPU that takes tens of seconds, and it happens again in every new process. JAX can
keep the compiled executables on disk (its *persistent compilation cache*): a second run of
the same program loads its executable instead of compiling it. :func:`enable_compile_cache`
turns that cache on for every program the process compiles from then on, together with the
XLA caches that ride along with it (on GPUs, the kernel autotuning results), so that a warm
run skips the autotuning as well.

``seqjax train`` calls it at start-up unless told not to: ``--compile_cache=false``, or the
environment variable ``SEQJAX_COMPILE_CACHE=0`` — a switch, read by the command line
(:func:`compile_cache_switch`; ``1``/``0``, ``true``/``false``, ``yes``/``no``, ``on``/``off``;
unset = on). In your own JAX code::

    import seqjax
    seqjax.enable_compile_cache()          # ~/.cache/seqjax/jax, or $SEQJAX_CACHE_DIR/jax

Where the cache lives, first match wins: the ``path`` argument, ``$JAX_COMPILATION_CACHE_DIR``
(JAX's own variable), then ``jax`` inside the per-user cache of
:func:`seqjax.data.corpora.cache_dir` (``$SEQJAX_CACHE_DIR``, else ``~/.cache/seqjax``).
``SEQJAX_COMPILE_CACHE`` no longer holds a folder: a path there is refused by the command
line and warned about by :func:`enable_compile_cache`, both naming
``JAX_COMPILATION_CACHE_DIR``. The cache is keyed by the program, the JAX/XLA versions, the
devices and the compile options, so a stale entry is never used; delete the folder to
reclaim its space.
"""

from __future__ import annotations

import os
import warnings

from seqjax._env import env_bool, is_bool

__all__ = ["enable_compile_cache", "compile_cache_switch", "COMPILE_CACHE_ENV"]

#: The command line's switch: ``0``/``false``/``no``/``off`` turn its cache off (unset = on).
COMPILE_CACHE_ENV = "SEQJAX_COMPILE_CACHE"


def _retired_path(text: str) -> str:
    """What to say about a ``$SEQJAX_COMPILE_CACHE`` that holds a folder (its old meaning)."""
    return (f"${COMPILE_CACHE_ENV} is a switch (1 or 0), no longer a folder; got {text!r}. "
            f"To put the compile cache there, set JAX_COMPILATION_CACHE_DIR={text} (or "
            f"SEQJAX_CACHE_DIR=DIR, which puts it in DIR/jax) and leave {COMPILE_CACHE_ENV} "
            "unset or 1.")


def compile_cache_switch() -> bool:
    """:data:`COMPILE_CACHE_ENV` as the command line reads it (once, at start-up): unset or
    empty = on, else a boolean (:func:`seqjax._env.parse_bool`); a folder — the variable's
    retired meaning — or any other text is a ``ValueError`` that names the variable to use
    instead."""
    text = os.environ.get(COMPILE_CACHE_ENV, "")
    if text.strip() and not is_bool(text):
        raise ValueError(_retired_path(text.strip()))
    return env_bool(COMPILE_CACHE_ENV, True)


def _default_dir() -> str:
    from_jax = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if from_jax:
        return from_jax
    from seqjax.data.corpora import cache_dir

    return os.path.join(str(cache_dir()), "jax")


def enable_compile_cache(path: str | os.PathLike | None = None, *,
                         min_compile_time_s: float = 0.0) -> str:
    """Turn on JAX's persistent compilation cache (and XLA's autotuning cache) in ``path``.

    Args:
        path: the cache folder (created if missing); ``None`` = ``$JAX_COMPILATION_CACHE_DIR``,
            else ``~/.cache/seqjax/jax`` (``$SEQJAX_CACHE_DIR/jax``). A
            ``$SEQJAX_COMPILE_CACHE`` holding a folder (its retired meaning) is not used:
            a warning names ``JAX_COMPILATION_CACHE_DIR``.
        min_compile_time_s: programs that compile faster than this are not stored
            (JAX's default is 1 s; 0 keeps every program, which is what makes a small CPU
            run start in a second).

    Returns:
        The folder in use. Programs compiled before the call are not stored; later ones are.

    Example:
        >>> import tempfile, seqjax
        >>> folder = seqjax.enable_compile_cache(tempfile.mkdtemp())
    """
    import jax

    if isinstance(min_compile_time_s, bool) or not min_compile_time_s >= 0:
        raise ValueError(
            f"`min_compile_time_s` must be a number >= 0; got {min_compile_time_s!r}.")
    if path is None:
        text = os.environ.get(COMPILE_CACHE_ENV, "").strip()
        if text and not is_bool(text):
            warnings.warn(_retired_path(text), UserWarning, stacklevel=2)
        path = _default_dir()
    folder = os.path.abspath(os.path.expanduser(os.fspath(path)))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise ValueError(f"`path`: cannot create the compile cache folder {folder!r}: "
                         f"{err.strerror}.") from None
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # Kernel autotuning results (GPU) and the other XLA caches, beside the executables
    # (an option of recent JAX releases; without it, the executables alone are cached).
    try:
        jax.config.update("jax_persistent_cache_enable_xla_caches", "all")
    except (AttributeError, KeyError, ValueError):
        pass
    return folder

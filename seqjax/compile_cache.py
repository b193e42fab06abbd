"""JAX's persistent compilation cache, turned on with one call.

A jitted program is compiled by XLA the first time it runs with new shapes; for a GPT step
on a GPU that takes tens of seconds, and it happens again in every new process. JAX can
keep the compiled executables on disk (its *persistent compilation cache*): a second run of
the same program loads its executable instead of compiling it. :func:`enable_compile_cache`
turns that cache on for every program the process compiles from then on, together with the
XLA caches that ride along with it (on GPUs, the kernel autotuning results), so that a warm
run skips the autotuning as well.

``seqjax train`` calls it at start-up unless told not to (``--compile_cache=false``, or the
environment variable ``SEQJAX_COMPILE_CACHE=0``). In your own JAX code::

    import seqjax
    seqjax.enable_compile_cache()          # ~/.cache/seqjax/jax, or $SEQJAX_CACHE_DIR/jax

Where the cache lives, first match wins: the ``path`` argument, ``$SEQJAX_COMPILE_CACHE``
when it holds a path, ``$JAX_COMPILATION_CACHE_DIR`` (JAX's own variable), then ``jax``
inside the per-user cache of :func:`seqjax.data.corpora.cache_dir`. The cache is keyed by
the program, the JAX/XLA versions, the devices and the compile options, so a stale entry is
never used; delete the folder to reclaim its space.
"""

from __future__ import annotations

import os

__all__ = ["enable_compile_cache", "compile_cache_setting", "COMPILE_CACHE_ENV"]

#: ``0``/``false``/``off``/``no`` turn the command line's cache off; a path moves it.
COMPILE_CACHE_ENV = "SEQJAX_COMPILE_CACHE"
_OFF = ("0", "false", "off", "no")
_ON = ("", "1", "true", "on", "yes")


def compile_cache_setting(flag: bool | None = None) -> tuple[bool, str | None]:
    """``(enabled, path or None)`` for the command line: ``flag`` (``--compile_cache``) when
    given, else :data:`COMPILE_CACHE_ENV` (unset = on)."""
    value = os.environ.get(COMPILE_CACHE_ENV, "").strip()
    if flag is not None:
        return flag, (None if value.lower() in _OFF + _ON else value)
    if value.lower() in _OFF:
        return False, None
    return True, (None if value.lower() in _ON else value)


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
        path: the cache folder (created if missing); ``None`` = ``$SEQJAX_COMPILE_CACHE``
            when it holds a path, else ``$JAX_COMPILATION_CACHE_DIR``, else
            ``~/.cache/seqjax/jax`` (``$SEQJAX_CACHE_DIR/jax``).
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
        env = os.environ.get(COMPILE_CACHE_ENV, "").strip()
        path = env if env and env.lower() not in _OFF + _ON else _default_dir()
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

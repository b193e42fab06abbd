"""JAX's persistent compilation cache, turned on with one call.

:func:`enable_compile_cache` makes JAX store on disk every executable the process compiles
from then on, with the XLA caches that ride along (on GPUs, the kernel autotuning results), so a
later process running the same program loads it instead of compiling and autotuning again. The
cache is keyed by the program, the JAX/XLA versions, the devices and the compile options, so a
stale entry is never used; delete the folder to reclaim its space.

``seqjax train`` calls it at start-up unless ``--compile_cache=false`` or
``SEQJAX_COMPILE_CACHE=0`` (a switch, :func:`compile_cache_switch`; unset = on). In your own
JAX code::

    import seqjax
    seqjax.enable_compile_cache()          # ~/.cache/seqjax/jax, or $SEQJAX_CACHE_DIR/jax

The folder, first match wins: the ``path`` argument, ``$JAX_COMPILATION_CACHE_DIR`` (JAX's own
variable), then ``jax`` inside :func:`seqjax.data.corpora.cache_dir` (``$SEQJAX_CACHE_DIR``, else
``~/.cache/seqjax``). A folder in ``$SEQJAX_COMPILE_CACHE`` (its retired meaning) is refused by
the command line and warned about by :func:`enable_compile_cache`, both naming
``JAX_COMPILATION_CACHE_DIR``.
"""

from __future__ import annotations

import os
import warnings

from seqjax._env import env_bool, is_bool

__all__ = ["enable_compile_cache", "compile_cache_switch", "COMPILE_CACHE_ENV"]

#: The command line's switch (:func:`compile_cache_switch`).
COMPILE_CACHE_ENV = "SEQJAX_COMPILE_CACHE"


def _retired_path() -> str | None:
    """The message for a folder in ``$SEQJAX_COMPILE_CACHE`` (its old meaning), else ``None``."""
    text = os.environ.get(COMPILE_CACHE_ENV, "").strip()
    if not text or is_bool(text):
        return None
    return (f"${COMPILE_CACHE_ENV} is a switch (1 or 0), no longer a folder; got {text!r}. "
            f"To put the compile cache there, set JAX_COMPILATION_CACHE_DIR={text} (or "
            f"SEQJAX_CACHE_DIR=DIR, which puts it in DIR/jax) and leave {COMPILE_CACHE_ENV} "
            "unset or 1.")


def compile_cache_switch() -> bool:
    """:data:`COMPILE_CACHE_ENV` as the command line reads it at start-up: unset or empty = on,
    else a boolean (:func:`seqjax._env.parse_bool`); any other text (e.g. a folder, its retired
    meaning) is a ``ValueError`` naming the variable to use instead."""
    message = _retired_path()
    if message:
        raise ValueError(message)
    return env_bool(COMPILE_CACHE_ENV, True)


def enable_compile_cache(path: str | os.PathLike | None = None, *,
                         min_compile_time_s: float = 0.0) -> str:
    """Turn on JAX's persistent compilation cache (and XLA's autotuning cache) in ``path``;
    returns the folder in use (only programs compiled after the call are stored).

    Args:
        path: the folder (created if missing); ``None``: the module docstring's default (a folder
            in ``$SEQJAX_COMPILE_CACHE`` is not used, only warned about).
        min_compile_time_s: programs compiling faster are not stored (JAX's default is 1 s;
            0 keeps every program, so a small CPU run starts in a second).

    Example:
        >>> import tempfile, seqjax
        >>> folder = seqjax.enable_compile_cache(tempfile.mkdtemp())
    """
    import jax

    if isinstance(min_compile_time_s, bool) or not min_compile_time_s >= 0:
        raise ValueError(f"`min_compile_time_s` must be a number >= 0; got {min_compile_time_s!r}.")
    if path is None:
        message = _retired_path()
        if message:
            warnings.warn(message, UserWarning, stacklevel=2)
        from seqjax.data.corpora import cache_dir

        path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(str(cache_dir()), "jax")
    folder = os.path.abspath(os.path.expanduser(os.fspath(path)))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise ValueError(f"`path`: cannot create the compile cache folder {folder!r}: "
                         f"{err.strerror}.") from None
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # Kernel autotuning results (GPU) and the other XLA caches, beside the executables.
    jax.config.update("jax_persistent_cache_enable_xla_caches", "all")
    return folder

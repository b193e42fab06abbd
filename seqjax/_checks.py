"""Input validation shared by every seqjax module.

Each check runs at trace time on static shapes/dtypes, so a bad call fails
before any compilation, and each error names the argument, what was expected
and what was received (DESIGN.md, "Errors").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def check_rank(x: Any, name: str, ranks: int | Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``x.ndim`` is one of ``ranks``."""
    allowed = (ranks,) if isinstance(ranks, int) else tuple(ranks)
    ndim = np.ndim(x)
    if ndim not in allowed:
        want = " or ".join(str(r) for r in allowed)
        raise ValueError(
            f"`{name}` must have rank {want}; got rank {ndim} with shape {tuple(np.shape(x))}."
        )


def check_dim(x: Any, name: str, axis: int, size: int, what: str = "") -> None:
    """Raise ``ValueError`` unless ``x.shape[axis] == size``."""
    actual = np.shape(x)[axis]
    if actual != size:
        extra = f" ({what})" if what else ""
        raise ValueError(
            f"`{name}` must have size {size} on axis {axis}{extra}; "
            f"got shape {tuple(np.shape(x))}."
        )


def check_integer(x: Any, name: str) -> None:
    """Raise ``TypeError`` unless ``x`` has an integer dtype."""
    dtype = jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"`{name}` must have an integer dtype; got {dtype}.")


def check_bool(x: Any, name: str) -> None:
    """Raise ``TypeError`` unless ``x`` is a boolean array."""
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    if dtype != jnp.bool_:
        raise TypeError(f"`{name}` must be a boolean array (True = keep); got dtype {dtype}.")


def is_concrete(x: Any) -> bool:
    """True when ``x`` holds values known at trace time (not a tracer)."""
    return not isinstance(x, jax.core.Tracer)


def check_range(x: Any, name: str, low: int, high: int) -> None:
    """Raise ``ValueError`` if a concrete ``x`` has values outside ``[low, high]``.

    Traced values cannot be inspected at trace time; for those the check is a
    no-op and the caller's semantics (e.g. clipping of lengths) apply.
    """
    if not is_concrete(x):
        return
    arr = np.asarray(x)
    if arr.size == 0:
        return
    lo, hi = arr.min(), arr.max()
    if lo < low or hi > high:
        raise ValueError(
            f"`{name}` must lie in [{low}, {high}]; got values in [{lo}, {hi}]."
        )


def check_tree_shapes(actual: Any, expected: Any, name: str) -> None:
    """Raise ``ValueError`` unless two pytrees have the same structure and leaf shapes."""
    a_leaves, a_def = jax.tree_util.tree_flatten(actual)
    e_leaves, e_def = jax.tree_util.tree_flatten(expected)
    if a_def != e_def:
        raise ValueError(f"`{name}` must have structure {e_def}; got {a_def}.")
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if np.shape(a) != np.shape(e):
            raise ValueError(
                f"`{name}` leaf {i} must have shape {tuple(np.shape(e))}; "
                f"got {tuple(np.shape(a))}."
            )

"""Small utilities shared across seqjax."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["count_params"]


def count_params(tree: Any) -> int:
    """Total number of scalars in a pytree of arrays (e.g. ``variables["params"]``)."""
    return int(sum(np.prod(np.shape(p), dtype=np.int64) for p in jax.tree_util.tree_leaves(tree)))

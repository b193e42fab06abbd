"""Small utilities shared across seqjax."""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

__all__ = ["count_params", "notebook_setup"]

SMOKE_ENV = "SEQJAX_SMOKE"


def count_params(tree: Any) -> int:
    """Total number of scalars in a pytree of arrays (e.g. ``variables["params"]``)."""
    return int(sum(np.prod(np.shape(p), dtype=np.int64) for p in jax.tree_util.tree_leaves(tree)))


def notebook_setup(smoke: bool | None = None) -> bool:
    """The first cell of every notebook in ``colab/``: print the JAX version, the backend and
    its devices, and return the ``SMOKE`` switch.

    ``smoke`` (``None``: ``$SEQJAX_SMOKE`` is ``1``/``true``/``yes``) runs a notebook with tiny
    sizes, one or two steps and offline data, as CI does. On a CPU backend outside smoke
    mode it says how to pick an accelerator in Colab.
    """
    if smoke is None:
        smoke = os.environ.get(SMOKE_ENV, "0").strip().lower() in ("1", "true", "yes")
    elif not isinstance(smoke, bool):
        raise TypeError(f"`smoke` must be a bool or None; got {smoke!r}.")
    devices = jax.devices()
    backend = jax.default_backend()
    print(f"jax {jax.__version__} on {backend}: {len(devices)} x {devices[0].device_kind}")
    print(f"SMOKE = {smoke}")
    if backend == "cpu" and not smoke:
        print("No accelerator found: running on the CPU, slower, with smaller sizes where "
              "it matters. Runtime -> Change runtime type -> TPU or GPU for the full run.")
    return smoke

"""Small utilities shared across seqjax."""

from __future__ import annotations

import contextlib
import os
import platform
from typing import Any

import jax
import numpy as np

from seqjax._env import env_bool

__all__ = ["count_params", "machine_info", "notebook_setup"]

SMOKE_ENV = "SEQJAX_SMOKE"


def count_params(tree: Any) -> int:
    """Total number of scalars in a pytree of arrays (e.g. ``variables["params"]``)."""
    return int(sum(np.prod(np.shape(p), dtype=np.int64) for p in jax.tree_util.tree_leaves(tree)))


def notebook_setup(smoke: bool | None = None) -> bool:
    """The first cell of every notebook in ``colab/``: print the JAX version, backend and
    devices, and return the ``SMOKE`` switch (tiny sizes, one or two steps, offline data, as CI
    runs them): ``smoke``, or for ``None`` ``$SEQJAX_SMOKE`` (:func:`seqjax._env.parse_bool`;
    unset = off). On a CPU outside smoke mode it says how to pick an accelerator in Colab."""
    if smoke is None:
        smoke = env_bool(SMOKE_ENV, False)
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


def machine_info() -> dict[str, Any]:
    """The machine a result was measured on: CPU model (``/proc/cpuinfo``, else ``platform``),
    core count, 1/5/15-minute load average, jax version, backend and the first device's kind.

    Example:
        >>> sorted(machine_info())
        ['cores', 'cpu', 'device_kind', 'jax', 'jax_backend', 'load_avg']
    """
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    dev = jax.devices()[0]
    return {"cpu": _cpu_name(), "cores": os.cpu_count(),
            "load_avg": [round(x, 2) for x in load], "jax": jax.__version__,
            "jax_backend": dev.platform, "device_kind": dev.device_kind}


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()

"""What the experiments share to train on every device (:class:`seqjax.train.parallel.Parallel`).

* :func:`pad_rows` — an evaluation batch is a *global* batch (every process holds it)
  whose rows are split over the mesh's ``data·fsdp`` batch shards; a held-out set whose
  size does not divide is padded with rows its evaluation weighs by zero;
* :func:`host_rows` — this process's rows of a global batch that every process
  generates from the same seeded stream (the experiments that draw fresh batches);
* :func:`write_run_info` — ``run.json`` at the top of a work dir whose training runs
  write theirs one level down (one ``fit`` per model and seed) or nowhere.

On one device :func:`pad_rows` and :func:`host_rows` return their input unchanged, so
every single-device result is what it was before the experiments ran on a mesh.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from seqjax.train.parallel import Parallel
from seqjax.train.records import write_run_info as _write_run_info
from seqjax.train.sharding import host_batch_slice

__all__ = ["pad_rows", "host_rows", "write_run_info"]


def pad_rows(batch: Mapping[str, Any], multiple: int,
             fill: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``batch`` with rows appended until its leading size is a multiple of ``multiple``.

    The new rows copy row 0, then take ``fill[key]`` in each key ``fill`` names — the
    values that make the evaluation ignore them (``{"mask": False}``; a length of 1 …).
    A batch that already divides is returned as it is.

    Example:
        >>> b = pad_rows({"x": np.arange(3), "mask": np.ones(3, bool)}, 4, {"mask": False})
        >>> b["x"].tolist(), b["mask"].tolist()
        ([0, 1, 2, 0], [True, True, True, False])
    """
    n = len(next(iter(batch.values())))
    extra = -n % multiple
    if not extra:
        return dict(batch)
    missing = [k for k in fill if k not in batch]
    if missing:
        raise ValueError(f"`fill` names {missing}, which are not keys of the batch "
                         f"({sorted(batch)}).")
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        pad = np.repeat(v[:1], extra, axis=0)
        if k in fill:
            pad[...] = fill[k]
        out[k] = np.concatenate([v, pad])
    return out


def host_rows(par: Parallel, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The rows of the global ``batch`` that this process feeds (all of them on one
    process), for ``fit(..., parallel=par)``, which places a process's rows."""
    n = len(next(iter(batch.values())))
    rows = host_batch_slice(n, par.mesh)
    return {k: np.asarray(v)[rows] for k, v in batch.items()}


def write_run_info(par: Parallel, workdir: str | None) -> None:
    """``workdir/run.json``: the devices, processes and mesh (process 0 writes it)."""
    if workdir:
        _write_run_info(workdir, par)

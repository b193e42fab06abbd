"""Activation and weight sharding hints for code that runs inside a sharded train step.

:func:`seqjax.train.step.make_train_step` (and so :class:`seqjax.train.parallel.Parallel`) traces
the step under the mesh's abstract mesh; there :func:`constrain` pins an array to a layout over the
mesh axes ``("data", "fsdp", "model")`` (``jax.lax.with_sharding_constraint``). Outside a sharded
step (plain ``model.apply``) it returns the array unchanged, so layers may call it unconditionally.

The recurrent layers gather their weights once before the ``lax.scan`` (:func:`replicate`) and keep
the batch split over :data:`BATCH` on the carry and per-step inputs, so their time loop needs no
collectives (without these hints GSPMD carries the weights' ``fsdp`` split into the loop and
all-gathers at every step).
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec

BATCH = ("data", "fsdp")  # the mesh axes the batch is split over
_AXES = {"data", "fsdp", "model"}


def active() -> bool:
    """Whether a seqjax device mesh is in scope (inside a sharded train/eval step)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and _AXES <= set(mesh.axis_names)


def constrain(x: Any, *spec: Any) -> Any:
    """``with_sharding_constraint(x, P(*spec))`` inside a sharded step, else ``x``."""
    if x is None or not active():
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


def replicate(tree: Any) -> Any:
    """Every array of ``tree`` replicated (gathered once, e.g. before a time loop)."""
    return jax.tree_util.tree_map(constrain, tree) if active() else tree

"""Named ``jax.checkpoint`` (rematerialisation) policies: the one vocabulary of seqjax.

The backward pass recomputes the forward activations a policy does not save. A policy is ``None``
(save nothing: recompute the whole block, least memory), a name in :data:`REMAT_POLICIES` or a
``jax.checkpoint_policies`` callable; the transformer stacks (``remat_policy=``) and the train step
(``make_train_step(remat=...)``) take the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

__all__ = ["REMAT_POLICIES", "remat_policy"]

#: Named ``jax.checkpoint`` policies.
REMAT_POLICIES: dict[str, Callable[..., Any]] = {
    name: getattr(jax.checkpoint_policies, name) for name in (
        "nothing_saveable", "everything_saveable", "dots_saveable",
        "dots_with_no_batch_dims_saveable")}


def remat_policy(policy: str | Callable[..., Any] | None,
                 name: str = "remat_policy") -> Callable[..., Any] | None:
    """The ``jax.checkpoint`` policy for ``policy`` (``None`` and callables as is); an unknown name
    is a ``ValueError`` naming ``name``.

    Example:
        >>> remat_policy("dots_saveable") is jax.checkpoint_policies.dots_saveable
        True
    """
    if policy is None or callable(policy):
        return policy
    if policy not in REMAT_POLICIES:
        raise ValueError(
            f"`{name}` must be a callable or one of {sorted(REMAT_POLICIES)}; got {policy!r}.")
    return REMAT_POLICIES[policy]

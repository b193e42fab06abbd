r"""Masked softmax over the keys, in float32, and dropout on attention weights.

.. math::
    \alpha_j = \frac{[m_j]\, e^{s_j}}{\sum_{j'} [m_{j'}]\, e^{s_{j'}}}

MEDL (7.21) with the mask of (7.27) applied to the scores; Bishop (12.3)–(12.4); rows with no
visible key give zeros (:mod:`seqjax.nn.attention.checks`). :func:`softmax_last` is
:func:`masked_softmax` with a hand-written backward pass (used by it and the XLA kernels).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from seqjax._checks import check_bool
from seqjax.nn.attention.checks import masked_weights

Array = jax.Array

__all__ = ["masked_softmax"]


def masked_softmax(scores: Any, mask: Any = None, axis: int = -1) -> Array:
    r"""Softmax over ``axis`` restricted to ``mask`` (``True`` = keep): the module's equation.

    Rows whose every entry is masked (or ``-inf``) give zeros, never NaN, with zero gradients.
    Returns float32.

    Example:
        >>> masked_softmax(jnp.array([[14.0, 12.0], [1.0, 2.0]]),
        ...                jnp.array([[True, True], [False, False]])).round(2)
        Array([[0.88, 0.12],
               [0.  , 0.  ]], dtype=float32)
    """
    if mask is not None:
        mask = jnp.asarray(mask)
        check_bool(mask, "mask")
    scores = jnp.asarray(scores)
    if scores.size == 0:  # no keys (or no rows): nothing to normalise, all zeros
        return jnp.zeros(scores.shape, jnp.float32)
    return _masked_softmax(scores, mask, axis)


@partial(jax.jit, static_argnums=2)
def _masked_softmax(scores: Array, mask: Array | None, axis: int) -> Array:
    s = jnp.moveaxis(scores.astype(jnp.float32), axis, -1)
    if mask is not None:
        mask = jnp.moveaxis(jnp.broadcast_to(mask, jnp.broadcast_shapes(mask.shape, scores.shape)),
                            axis, -1)
    return jnp.moveaxis(softmax_last(s, mask), -1, axis)


@jax.custom_vjp
def softmax_last(s: Array, mask: Array | None) -> Array:
    """Masked softmax over the last axis of float32 scores (zeros for empty rows), with a
    custom VJP ``ds = w ⊙ (g − Σ_k g_k w_k)`` from the saved weights alone (one fused pass);
    masked entries and empty rows (``w = 0``) get exactly zero gradient."""
    return masked_weights(s, mask)


def _softmax_fwd(s: Array, mask: Array | None) -> tuple[Array, Array]:
    w = masked_weights(s, mask)
    return w, w


def _softmax_bwd(w: Array, g: Array) -> tuple[Array, None]:
    return w * (g - jnp.sum(g * w, axis=-1, keepdims=True)), None


softmax_last.defvjp(_softmax_fwd, _softmax_bwd)


def dropout_weights(w: Array, rate: float, rng: Array | None) -> Array:
    """Inverted dropout on attention weights: keep with probability ``1 − rate``, scale by it."""
    if rate == 0.0:
        return w
    assert rng is not None  # the callers' checks require a key when rate > 0
    keep = jax.random.bernoulli(rng, 1.0 - rate, w.shape)
    return jnp.where(keep, w / (1.0 - rate), 0.0)

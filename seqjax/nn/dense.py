r"""``Dense`` and ``DenseGeneral``: Flax's layers, computed as one 2-D matrix product.

.. math::
    y = x W + b, \qquad x \in \mathbb{R}^{\dots \times P},\; W \in \mathbb{R}^{P \times F}

(MEDL (5.1), row-vector convention; ``DenseGeneral`` contracts several trailing input axes with the
leading kernel axes and may produce several output axes, e.g. the ``[D, H, D_h]`` head projections
of multi-head attention, MEDL (7.26)).

Parameters (names, shapes, initialisation, dtypes) are exactly those of ``flax.linen.Dense`` /
``DenseGeneral``, so checkpoints and weight converters carry over. Only the lowering differs: the
leading (batch) axes of ``x`` and the contracted/produced axes are flattened, so the call and both
gradient products (``dx = dy Wᵀ``, ``dW = xᵀ dy`` over ``N = B·T`` rows) are plain
``[N, P] @ [P, F]`` GEMMs (left 3-D, XLA:CPU lowers the weight gradient through transposes and a
slow generic dot). On GPU and TPU the reshapes are free.

    >>> import jax.numpy as jnp
    >>> layer, x = Dense(4), jnp.ones((2, 3, 5))
    >>> params = layer.init(jax.random.PRNGKey(0), x)
    >>> layer.apply(params, x).shape, params["params"]["kernel"].shape
    ((2, 3, 4), (5, 4))
"""

from __future__ import annotations

import math
from typing import Any

import jax
from flax import linen as nn

Array = jax.Array

__all__ = ["Dense", "DenseGeneral", "flat_attend", "flat_dot_general"]


def _is_trailing_leading(lhs_ndim: int, dimension_numbers: Any) -> int:
    """The number of contracted axes ``k`` if ``dimension_numbers`` contracts the last ``k``
    axes of ``lhs`` with the first ``k`` axes of ``rhs`` (in order, no batch axes); else 0."""
    (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
    k = len(lhs_c)
    trailing_leading = (tuple(lhs_c) == tuple(range(lhs_ndim - k, lhs_ndim))
                        and tuple(rhs_c) == tuple(range(k)))
    return k if trailing_leading and not lhs_b and not rhs_b else 0


def flat_dot_general(lhs: Array, rhs: Array, dimension_numbers: Any, precision: Any = None,
                     preferred_element_type: Any = None, **kwargs: Any) -> Array:
    """``jax.lax.dot_general`` that runs "contract ``lhs``'s trailing axes with ``rhs``'s
    leading axes" as one ``[N, K] @ [K, M]`` product (other cases: unchanged)."""
    k = _is_trailing_leading(lhs.ndim, dimension_numbers)
    if k == 0 or (lhs.ndim == 2 and rhs.ndim == 2):
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type, **kwargs)
    lead, out = lhs.shape[: lhs.ndim - k], rhs.shape[k:]
    kk = math.prod(lhs.shape[lhs.ndim - k :])
    y = jax.lax.dot_general(lhs.reshape(math.prod(lead), kk), rhs.reshape(kk, math.prod(out)),
                            (((1,), (0,)), ((), ())), precision=precision,
                            preferred_element_type=preferred_element_type, **kwargs)
    return y.reshape(*lead, *out)


class Dense(nn.Dense):
    """A drop-in ``flax.linen.Dense`` (same attributes and parameters) run as a 2-D GEMM."""

    dot_general: Any = flat_dot_general


class DenseGeneral(nn.DenseGeneral):
    """``flax.linen.DenseGeneral`` (same parameters) computed as a 2-D GEMM when it
    contracts trailing input axes without ``batch_dims``; see the module docstring."""

    dot_general: Any = flat_dot_general


def flat_attend(embed: nn.Embed, query: Array) -> Array:
    """``embed.attend(query)``, the tied output layer ``q Eᵀ`` (J&M (9.16); Press & Wolf 2017),
    computed on ``query`` flattened to ``[N, D]`` (see the module docstring)."""
    lead = query.shape[:-1]
    out = embed.attend(query.reshape(-1, query.shape[-1]))
    return out.reshape(*lead, out.shape[-1])  # not -1: an empty batch has 0 elements

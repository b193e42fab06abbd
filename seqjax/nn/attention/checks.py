r"""Argument checks of the attention package, and the rule for rows that see no key.

**The empty-row rule** (used by every kernel). A query row whose every key is masked (by
``mask``, ``is_causal``, ``window``, or a ``−∞`` bias) has no softmax (``0 / 0``; the texts
leave it undefined). seqjax makes its weights and output **exactly zero**, with zero (finite)
gradients, never NaN. A row that sees a key is an ordinary softmax over its visible keys (MEDL
(7.21) with the mask of (7.27) on the scores; Bishop Ex. 12.2's (12.3)–(12.4) hold):

.. math::
    \alpha_{ij} = \frac{[m_{ij}]\, e^{s_{ij} - \mu_i}}{\sum_{j'} [m_{ij'}]\, e^{s_{ij'} - \mu_i}},
    \qquad \mu_i = \begin{cases} \max_{j: m_{ij}} s_{ij} & \text{some key visible}\\
    0 & \text{none} \end{cases},\qquad \alpha_{i\cdot} = 0 \text{ when no key is visible.}

The kernels reach it by **``−∞`` masking** (the reference, the differentiated XLA block, the
weights path: :func:`masked_weights`; :func:`stable_row_max` makes an all-``−∞`` row's maximum
0, so its ``exp`` and sum are 0, and :func:`row_reciprocal` makes that a zero row, not ``0/0``),
**finite masking** (the fused and scanned XLA paths: :data:`MASKED` added to masked scores, then
:func:`row_reciprocal` with ``keep = visible_rows(mask)``), or **after the fact** (cuDNN and
Pallas, which return an average or NaN there: :func:`zero_invisible_rows`).

:func:`check_attention_args` and :func:`check_broadcast` raise ``ValueError``/``TypeError``
naming the argument, the expected and the actual value.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from seqjax._checks import check_bool, check_rank, check_rate
from seqjax.nn.masks import causal_mask

Array = jax.Array

#: Added to masked scores by the finite-masking kernels (and the floor of a ``−∞``
#: bias inside Pallas): ``exp(s + MASKED − max)`` is exactly 0 in float32 whenever
#: the row has a visible key; a bias ``≤ MASKED`` counts as "not visible".
MASKED = -1e30


# ============================================================================ the empty-row rule


def stable_row_max(s: Array) -> Array:
    """Row maximum of ``s`` (keepdims) for a stable ``exp``; 0 on rows that are all ``−∞``."""
    m = jnp.max(s, axis=-1, keepdims=True)
    return jnp.where(jnp.isfinite(m), m, 0.0)  # empty rows: exp(-inf - 0) = 0, no NaN


def row_reciprocal(denom: Array, keep: Array | None = None) -> Array:
    """``1 / l`` for the rows' exponential sums ``l``, with the empty-row rule.

    ``keep=None`` (``−∞`` masking): an empty row has ``l = 0`` and ``e = 0``; it gets 1, so its
    weights ``e / 1`` are 0. ``keep`` (finite masking, bool/float ``[..., 1]``; ``l > 0``
    always): ``keep / l``, zero on rows with ``keep = 0``.
    """
    if keep is None:
        return 1.0 / jnp.where(denom == 0.0, 1.0, denom)
    return keep.astype(jnp.float32) / denom


def visible_rows(mask: Array) -> Array:
    """``bool[..., 1]``: whether each row of ``mask`` (keys on the last axis) sees a key."""
    return jnp.any(mask, axis=-1, keepdims=True)


def masked_weights(s: Array, mask: Array | None) -> Array:
    """Masked softmax of float32 scores over the last axis (the rule above, ``−∞`` form).

    Plain autodiff: the row maximum is ``stop_gradient`` (the softmax does not depend on it);
    masked entries and empty rows get exactly zero gradient.
    """
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    e = jnp.exp(s - jax.lax.stop_gradient(stable_row_max(s)))
    return e * row_reciprocal(jnp.sum(e, axis=-1, keepdims=True))


def zero_invisible_rows(out: Array, mask: Array | None, bias: Array | None, is_causal: bool,
                        k_len: int) -> Array:
    """Zero the query rows of ``out [B, Q, H, Dv]`` that see no key (for kernels that return an
    average or NaN there): keys hidden by ``mask [B|1, H|1, Q|1, K|1]``, above the causal
    diagonal (``is_causal``), or with a bias ``≤`` :data:`MASKED` (``−∞``) are invisible."""
    if mask is None and bias is None:
        return out
    b, q_len, h, _ = out.shape
    visible = jnp.ones((1, 1, 1, 1), bool) if mask is None else mask
    if bias is not None:
        visible = visible & (bias > MASKED)
    if is_causal:
        visible = visible & causal_mask(q_len, k_len)[None, None]
    any_BxHxQ = jnp.broadcast_to(jnp.any(visible, axis=-1), (b, h, q_len))
    return jnp.where(any_BxHxQ.swapaxes(1, 2)[..., None], out, jnp.zeros((), out.dtype))


# ============================================================================ argument checks


def as_4d(x: Array | None) -> Array | None:
    """Left-pad a mask/bias with size-1 axes to rank 4 (``[B, H, Q, K]``)."""
    return None if x is None else x.reshape((1,) * (4 - x.ndim) + x.shape)


def check_broadcast(x: Array, name: str, target: tuple[int, int, int, int | None]) -> None:
    """``x`` must broadcast to ``target = [B, H, Q, K]`` (rank ≤ 4, each axis 1 or equal;
    ``K = None``, an unknown key count, admits only 1)."""
    check_rank(x, name, (0, 1, 2, 3, 4))
    shape4 = (1,) * (4 - x.ndim) + tuple(x.shape)
    for got, want in zip(shape4, target):
        if got not in (1, want):
            raise ValueError(
                f"`{name}` must broadcast to [B, H, Q, K] = {list(target)}; got shape {x.shape}."
            )


def check_kv_heads(num_heads: int, num_kv_heads: Any) -> int:
    """``G`` = ``num_kv_heads`` (``None``: ``num_heads``), a positive divisor of ``num_heads``."""
    g = num_heads if num_kv_heads is None else num_kv_heads
    if isinstance(g, bool) or not isinstance(g, int) or g <= 0 or num_heads % g:
        raise ValueError(
            f"`num_kv_heads` must be a positive divisor of num_heads={num_heads}; got {g!r}."
        )
    return g


def check_attention_args(
    q: Any, k: Any, v: Any, mask: Any, bias: Any, dropout_rate: float, dropout_rng: Array | None
) -> tuple[Array, Array, Array, Array | None, Array | None]:
    """The one check of :func:`~seqjax.nn.attention.dot_product_attention`'s arguments.

    ``q [B, Q, H, D]``, ``k [B, K, G, D]``, ``v [B, K, G, Dv]``, ``G | H``; a boolean ``mask``
    and a ``bias`` broadcastable to ``[B, H, Q, K]``; a dropout rate in ``[0, 1)``, with an rng
    when positive. Returns the arrays (``jnp.asarray``).
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_rank(x, name, 4)
    b, q_len, h, d = q.shape
    k_len, hkv = k.shape[1], k.shape[2]
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(
            f"`q`, `k`, `v` must share the batch size; got {q.shape}, {k.shape}, {v.shape}."
        )
    if k.shape[-1] != d:
        raise ValueError(f"`k` must have head dim {d} like `q`; got shape {k.shape}.")
    if v.shape[1:3] != (k_len, hkv):
        raise ValueError(f"`v` must have shape [B, {k_len}, {hkv}, Dv] like `k`; got {v.shape}.")
    if hkv == 0 or h % hkv:
        raise ValueError(
            f"the number of kv heads ({hkv}) must divide the number of query heads ({h})."
        )
    check_rate(dropout_rate, "dropout_rate")
    if dropout_rate > 0.0 and dropout_rng is None:
        raise ValueError("`dropout_rng` is required when `dropout_rate` > 0.")
    target = (b, h, q_len, k_len)
    if mask is not None:
        mask = jnp.asarray(mask)
        check_bool(mask, "mask")
        check_broadcast(mask, "mask", target)
    if bias is not None:
        bias = jnp.asarray(bias)
        check_broadcast(bias, "bias", target)
    return q, k, v, mask, bias

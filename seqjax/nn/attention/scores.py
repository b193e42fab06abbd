r"""Score functions, RNN attention (Bahdanau/Luong), and parameter-free self-attention.

A score ``s(z_q, z_k)`` per query/key pair, weights ``α = softmax_τ s(z_q, z_k^τ)`` and the
context ``u = Σ_τ α_τ v^τ`` (MEDL (7.20)–(7.21)): the scores of MEDL (7.21) (:func:`dot_score`,
…, :func:`additive_score`; ``z_q [..., Q, Dq]``, ``z_k [..., K, Dk]`` → ``[..., Q, K]``), the
module :class:`Attention`, and :func:`simple_self_attention`, ``Y = Softmax[X Xᵀ] X`` (Bishop
(12.5)–(12.6); J&M (9.30)–(9.33); MEDL (7.23)). Row vectors (Flax kernels are the transposes
of MEDL's ``W``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import (
    bound_param_shape,
    check_bool,
    check_features,
    check_lengths,
    check_rank,
    retired_flags,
)
from seqjax.nn.attention.softmax import masked_softmax
from seqjax.nn.masks import causal_mask, combine_masks, padding_mask

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = [
    "SCORE_FUNCTIONS",
    "dot_score",
    "scaled_dot_score",
    "general_score",
    "concat_score",
    "additive_score",
    "Attention",
    "simple_self_attention",
    "simple_self_attention_with_weights",
]


def dot_score(z_q: Any, z_k: Any) -> Array:
    r"""Dot-product score ``s(z_q, z_k) = z_qᵀ z_k`` (MEDL §7.4 default; Luong "dot"):
    ``[..., Q, D], [..., K, D] -> [..., Q, K]``.

    Example:
        >>> dot_score(jnp.ones((1, 2, 3)), jnp.ones((1, 4, 3))).shape
        (1, 2, 4)
    """
    z_q, z_k = jnp.asarray(z_q), jnp.asarray(z_k)
    if z_q.shape[-1] != z_k.shape[-1]:
        raise ValueError(
            f"dot score needs equal query and key sizes (m_q = m_k); got z_q {z_q.shape} "
            f"and z_k {z_k.shape}."
        )
    return jnp.einsum("...qd,...kd->...qk", z_q, z_k)


def scaled_dot_score(z_q: Any, z_k: Any, scale: float | None = None) -> Array:
    r"""Scaled dot-product score ``z_qᵀ z_k / √d_k`` (Bishop (12.14); J&M (9.39); MEDL §7.4).

    ``scale`` overrides ``1/√d_k``.

    Example:
        >>> q = jnp.ones((1, 64)); k = jnp.stack([jnp.full(64, 1.75), jnp.full(64, 1.5)])
        >>> scaled_dot_score(q, k)  # q·k = 112, 96
        Array([[14., 12.]], dtype=float32)
    """
    z_q = jnp.asarray(z_q)
    scale = 1.0 / math.sqrt(z_q.shape[-1]) if scale is None else scale
    return dot_score(z_q, z_k) * scale


def general_score(z_q: Any, z_k: Any, w_s: Any) -> Array:
    r"""General (bilinear) score ``s = z_qᵀ W_s z_k``, ``W_s ∈ ℝ^{m_q×m_k}`` (MEDL (7.21); Luong).

    ``[..., Q, Dq], [..., K, Dk], [Dq, Dk] -> [..., Q, K]``.

    Example:
        >>> general_score(jnp.ones((2, 3)), jnp.ones((4, 5)), jnp.eye(3, 5)).shape
        (2, 4)
    """
    z_q, z_k, w_s = jnp.asarray(z_q), jnp.asarray(z_k), jnp.asarray(w_s)
    check_rank(w_s, "w_s", 2)
    if w_s.shape != (z_q.shape[-1], z_k.shape[-1]):
        raise ValueError(
            f"`w_s` must have shape (m_q, m_k) = {(z_q.shape[-1], z_k.shape[-1])}; got {w_s.shape}."
        )
    return jnp.einsum("...qd,...kd->...qk", z_q @ w_s, z_k)


def additive_score(z_q: Any, z_k: Any, w_a: Any, w_b: Any, w_s: Any) -> Array:
    r"""Additive score ``s = w_sᵀ tanh(W_a z_q + W_b z_k)`` (MEDL (7.21); Bahdanau et al. 2015).

    Row-vector kernels ``w_a [Dq, M]`` (``W_aᵀ``), ``w_b [Dk, M]``, ``w_s [M]``;
    ``[..., Q, Dq], [..., K, Dk] -> [..., Q, K]`` through a materialised ``[..., Q, K, M]``.

    Example:
        >>> additive_score(jnp.ones((2, 3)), jnp.ones((4, 5)), jnp.ones((3, 6)),
        ...                jnp.ones((5, 6)), jnp.ones(6)).shape
        (2, 4)
    """
    z_q, z_k = jnp.asarray(z_q), jnp.asarray(z_k)
    w_a, w_b, w_s = jnp.asarray(w_a), jnp.asarray(w_b), jnp.asarray(w_s)
    check_rank(w_s, "w_s", 1)
    m = w_s.shape[0]
    if w_a.shape != (z_q.shape[-1], m):
        raise ValueError(f"`w_a` must have shape {(z_q.shape[-1], m)}; got {w_a.shape}.")
    if w_b.shape != (z_k.shape[-1], m):
        raise ValueError(f"`w_b` must have shape {(z_k.shape[-1], m)}; got {w_b.shape}.")
    hq = (z_q @ w_a)[..., :, None, :]
    hk = (z_k @ w_b)[..., None, :, :]
    return jnp.tanh(hq + hk) @ w_s


def concat_score(z_q: Any, z_k: Any, w_c: Any, w_s: Any) -> Array:
    r"""Concatenation score ``s = w_sᵀ tanh(W̃_s [z_q; z_k])`` (MEDL (7.21); Luong "concat").

    ``w_c [Dq + Dk, M]`` is ``W̃_sᵀ``; computed without the concatenation, as
    ``tanh(z_q W_c[:Dq] + z_k W_c[Dq:])`` (Bishop Ex. 12.9).

    Example:
        >>> concat_score(jnp.ones((2, 3)), jnp.ones((4, 5)), jnp.ones((8, 6)), jnp.ones(6)).shape
        (2, 4)
    """
    z_q = jnp.asarray(z_q)
    w_c = jnp.asarray(w_c)
    check_rank(w_c, "w_c", 2)
    dq, dk = z_q.shape[-1], jnp.shape(z_k)[-1]
    if w_c.shape[0] != dq + dk:
        raise ValueError(f"`w_c` must have {dq + dk} rows (m_q + m_k); got shape {w_c.shape}.")
    return additive_score(z_q, z_k, w_c[:dq], w_c[dq:], w_s)


SCORE_FUNCTIONS = ("dot", "scaled_dot", "general", "concat", "additive")


class Attention(nn.Module):
    r"""General (RNN) attention with a choice of score: returns ``(context, weights)``.

    ``α^{⟨t⟩} = softmax_τ s(z_q^{⟨t⟩}, z_k^{⟨τ⟩})``, ``u^{⟨t⟩} = Σ_τ α^{⟨t⟩}_τ v^{⟨τ⟩}``
    (MEDL (7.20)–(7.21), non-causal form), with ``score`` one of the ``*_score`` functions:
    ``"dot"``, ``"scaled_dot"`` (``1/√m_k``), ``"general"`` (param ``kernel [m_q, m_k]``),
    ``"concat"`` (params ``kernel [m_q+m_k, m̃]``, ``v [m̃]``) or ``"additive"`` (params
    ``query_kernel [m_q, m̃]``, ``key_kernel [m_k, m̃]``, ``v [m̃]``). General/concat are Luong
    et al. 2015 (query = current decoder state ``s^{⟨t⟩}``), additive Bahdanau et al. 2015
    (previous state ``s^{⟨t-1⟩}``, MEDL Fig. 7.10, (7.22)); the decoder chooses which it passes.

    Call ``attn(query, keys, values=None, *, mask=None, lengths=None)``: ``query [B, Dq]`` (one
    decoder step) or ``[B, Q, Dq]``; ``keys [B, K, Dk]``; ``values [B, K, Dv]`` (default
    ``keys``, MEDL §7.4); ``mask`` ``bool[B, K]`` or ``bool[B, Q, K]``; ``lengths`` ``int[B]``
    key lengths. Returns ``context [B, Dv]`` / ``[B, Q, Dv]`` and float32 ``weights [B, K]`` /
    ``[B, Q, K]``, each row summing to 1 over the visible keys (zeros when none is).

    Example:
        >>> import jax
        >>> attn = Attention(score="additive", hidden=8)
        >>> s, enc = jnp.ones((2, 4)), jnp.ones((2, 5, 6))
        >>> params = attn.init(jax.random.PRNGKey(0), s, enc)
        >>> ctx, w = attn.apply(params, s, enc, lengths=jnp.array([5, 3]))
        >>> ctx.shape, w.shape, w.sum(-1).round(4).tolist()
        ((2, 6), (2, 5), [1.0, 1.0])

    Attributes:
        score: one of ``SCORE_FUNCTIONS``.
        hidden: ``m̃``, the hidden size of concat/additive scores (default ``m_k``).
        scale: overrides ``1/√m_k`` for ``"scaled_dot"``.
    """

    score: str = "dot"
    hidden: int | None = None
    scale: float | None = None
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    v_init: Initializer = nn.initializers.normal(stddev=0.1)

    @nn.compact
    def __call__(
        self,
        query: Array,
        keys: Array,
        values: Array | None = None,
        *,
        mask: Any = None,
        lengths: Any = None,
    ) -> tuple[Array, Array]:
        if self.score not in SCORE_FUNCTIONS:
            raise ValueError(f"`score` must be one of {SCORE_FUNCTIONS}; got {self.score!r}.")
        check_rank(query, "query", (2, 3))
        check_rank(keys, "keys", 3)
        values = keys if values is None else values
        check_rank(values, "values", 3)
        single = query.ndim == 2
        q_BxQxD = query[:, None, :] if single else query
        b, k_len, dk = keys.shape
        if q_BxQxD.shape[0] != b or values.shape[0] != b:
            raise ValueError(
                f"`query`, `keys` and `values` must share the batch size; got {query.shape}, "
                f"{keys.shape}, {values.shape}."
            )
        if values.shape[1] != k_len:
            raise ValueError(
                f"`values` must have {k_len} steps like `keys`; got shape {values.shape}."
            )
        dq = q_BxQxD.shape[-1]
        self._check_sizes(query, keys)
        hidden = dk if self.hidden is None else self.hidden
        q_BxQxD, keys, values = nn.dtypes.promote_dtype(q_BxQxD, keys, values, dtype=self.dtype)

        # the score's parameters, in its arguments' order (the ``v`` of MEDL (7.21): v_init)
        params: dict[str, dict[str, tuple[int, ...]]] = {
            "general": {"kernel": (dq, dk)},
            "concat": {"kernel": (dq + dk, hidden), "v": (hidden,)},
            "additive": {"query_kernel": (dq, hidden), "key_kernel": (dk, hidden), "v": (hidden,)},
        }
        weights = [jnp.asarray(self.param(name, self.v_init if name == "v" else self.kernel_init,
                                          shape, self.param_dtype), q_BxQxD.dtype)
                   for name, shape in params.get(self.score, {}).items()]
        scores: dict[str, Callable[..., Array]] = {
            "dot": dot_score, "scaled_dot": partial(scaled_dot_score, scale=self.scale),
            "general": general_score, "concat": concat_score, "additive": additive_score}
        s_BxQxK = scores[self.score](q_BxQxD, keys, *weights)

        key_mask = None
        if mask is not None:
            mask = jnp.asarray(mask)
            check_bool(mask, "mask")
            check_rank(mask, "mask", (2, 3))
            if mask.ndim == 3 and mask.shape[1] != q_BxQxD.shape[1]:
                raise ValueError(
                    f"`mask` must have {q_BxQxD.shape[1]} query rows like `query`; got shape "
                    f"{mask.shape}."
                )
            key_mask = mask[:, None, :] if mask.ndim == 2 else mask
            if key_mask.shape[-1] != k_len:
                raise ValueError(f"`mask` must have {k_len} keys; got shape {mask.shape}.")
        if lengths is not None:
            lengths = check_lengths(lengths, "lengths", b, k_len)
            key_mask = combine_masks(key_mask, padding_mask(lengths, k_len)[:, None, :])
        w_BxQxK = masked_softmax(s_BxQxK, key_mask)
        ctx_BxQxV = jnp.einsum("bqk,bkv->bqv", w_BxQxK.astype(values.dtype), values)
        if single:
            return ctx_BxQxV[:, 0], w_BxQxK[:, 0]
        return ctx_BxQxV, w_BxQxK

    def _check_sizes(self, query: Array, keys: Array) -> None:
        """Query/key sizes against the bound score parameters (or each other for dot)."""
        dq, dk = query.shape[-1], keys.shape[-1]
        if self.score in ("dot", "scaled_dot") and dq != dk:
            raise ValueError(
                f"`query` must have the feature size of `keys` (m_q = m_k = {dk}) for the "
                f"{self.score!r} score; got shape {tuple(query.shape)}."
            )
        w = bound_param_shape(self, "kernel")
        if self.score == "concat" and w is not None and dq + dk != w[0]:
            # kernel [m_q + m_k, hidden]: only the sum is known
            raise ValueError(
                f"`query` and `keys` must have {w[0]} features together (the sizes the "
                f"'concat' kernel was created with); got {dq} + {dk} (shapes "
                f"{tuple(query.shape)}, {tuple(keys.shape)})."
            )
        # the (parameter, axis) holding the query's and the keys' sizes
        sizes = {"general": (("kernel", 0), ("kernel", 1)),
                 "additive": (("query_kernel", 0), ("key_kernel", 0))}.get(self.score, ())
        for x, name, (param, axis) in zip((query, keys), ("query", "keys"), sizes):
            shape = bound_param_shape(self, param)
            check_features(x, name, None if shape is None else shape[axis])


@retired_flags(return_weights="simple_self_attention_with_weights")
def simple_self_attention(x: Any, *, is_causal: bool = False, mask: Any = None) -> Array:
    r"""Parameter-free self-attention ``Y = Softmax[X Xᵀ] X``: queries = keys = values = ``X``.

    .. math::
        a_{nm} = \frac{\exp(x_n^\top x_m)}{\sum_{m'} \exp(x_n^\top x_{m'})},\qquad
        y_n = \sum_m a_{nm}\, x_m

    Bishop (12.5)–(12.6), non-causal (the default). With ``is_causal=True`` the sums run over
    ``m ≤ n``: J&M (9.30)–(9.33) and MEDL (7.23) ("simple" self-attention). The score is the
    *unscaled* dot product, as in all three sources (no ``1/√D``, unlike
    :func:`dot_product_attention`). Bishop (12.7)–(12.9): ``X Xᵀ`` is symmetric and nothing is
    learned; :class:`~seqjax.nn.attention.MultiHeadAttention`'s projections remove both.
    Softmax runs in float32.

    Args:
        x: ``[..., T, D]`` (e.g. ``[B, T, D]`` or one sequence ``[T, D]``).
        is_causal: keep ``m ≤ n`` only (:func:`~seqjax.nn.masks.causal_mask`).
        mask: optional extra boolean mask, broadcastable to ``[..., T, T]`` (``True`` =
            attend); a row whose keys are all masked is zero.

    Returns:
        ``Y [..., T, D]`` in ``x``'s dtype.

    Example:
        >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0]])
        >>> (100 * simple_self_attention(x, is_causal=True)).round().astype(int).tolist()
        [[100, 0], [27, 73]]
    """
    return simple_self_attention_with_weights(x, is_causal=is_causal, mask=mask)[0]


def simple_self_attention_with_weights(
    x: Any, *, is_causal: bool = False, mask: Any = None
) -> tuple[Array, Array]:
    r""":func:`simple_self_attention` (same arguments) and its weights: ``(Y, A)``.

    Returns:
        ``Y [..., T, D]`` in ``x``'s dtype and float32 ``A = Softmax[X Xᵀ] [..., T, T]``
        (masked), the matrix that multiplies ``X``; a row whose keys are all masked is zero in
        both.

    Example:
        >>> x = jnp.array([[1.0, 0.0], [0.0, 1.0]])
        >>> y, a = simple_self_attention_with_weights(x, is_causal=True)
        >>> (100 * a).round().astype(int).tolist()  # row 2: e / (e + e²), e² / (e + e²)
        [[100, 0], [27, 73]]
    """
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"`x` must have rank >= 2 ([..., T, D]); got shape {x.shape}.")
    t = x.shape[-2]
    scores = dot_score(x, x)  # [..., T, T]: x_n · x_m
    if mask is not None:
        mask = jnp.asarray(mask)
        check_bool(mask, "mask")
        try:
            jnp.broadcast_shapes(mask.shape, scores.shape)
        except ValueError:
            raise ValueError(
                f"`mask` must broadcast to [..., T, T] = {list(scores.shape)}; got shape "
                f"{mask.shape}."
            ) from None
    if is_causal:
        mask = combine_masks(mask, causal_mask(t))
    a = masked_softmax(scores, mask)
    y = jnp.einsum("...nm,...md->...nd", a, x.astype(jnp.float32)).astype(x.dtype)
    return y, a

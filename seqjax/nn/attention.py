r"""Attention: score functions, RNN attention, scaled dot-product and multi-head attention.

The textbooks build attention in three steps, and this file follows them:

1. **Scores and weights** (MEDL (7.20)–(7.21)): a score ``s(z_q, z_k)`` per
   query/key pair, weights ``α = softmax_τ s(z_q, z_k^τ)`` and the context
   ``u = Σ_τ α_τ v^τ``. :func:`dot_score`, :func:`scaled_dot_score`,
   :func:`general_score`, :func:`concat_score`, :func:`additive_score` and the
   :class:`Attention` module (Bahdanau: query = previous decoder state;
   Luong: query = current state).
2. **Scaled dot-product attention** (Bishop (12.14); J&M (9.39); LN (9), (13)):
   ``softmax(QKᵀ/√d_k + M) V`` as the pure function :func:`dot_product_attention`.
3. **Multi-head attention** (MEDL (7.25)–(7.26); Bishop (12.15)–(12.19);
   J&M (9.47)–(9.48)) with an explicit, per-row KV cache: :class:`MultiHeadAttention`,
   :class:`KVCache`.

Conventions: row vectors (``Q = X W_q``; Flax kernels are the transposes of
MEDL's ``W``), batch-major ``[B, T, ...]``, boolean masks with ``True`` =
attend. Masks act on the **scores** (MEDL (7.27) erratum): a masked score is
``-inf``, and a query row with no visible key gets all-zero weights and a zero
output, never NaN (Bishop Ex. 12.2). Softmax always runs in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax._checks import (
    bound_param_shape,
    check_bool,
    check_features,
    check_integer,
    check_lengths,
    check_range,
    check_rank,
    is_concrete,
)
from seqjax.nn.dense import DenseGeneral
from seqjax.nn.masks import causal_mask, combine_masks, padding_mask
from seqjax.nn.positional import apply_rope

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
    "masked_softmax",
    "Attention",
    "dot_product_attention",
    "KVCache",
    "MultiHeadAttention",
]

_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "pallas", "reference")


# ============================================================================ softmax


def masked_softmax(scores: Any, mask: Any = None, axis: int = -1) -> Array:
    r"""Softmax over ``axis`` restricted to ``mask`` (``True`` = keep), in float32.

    .. math::
        \alpha_j = \frac{[m_j]\, e^{s_j}}{\sum_{j'} [m_{j'}]\, e^{s_{j'}}}

    MEDL (7.21) with the mask of (7.27) applied to the scores; Bishop (12.3)–(12.4).
    Rows whose every entry is masked (or ``-inf``) give all zeros, never NaN,
    and their gradients are zero. Returns float32.

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
    return jnp.moveaxis(_softmax_last(s, mask), -1, axis)


@jax.custom_vjp
def _softmax_last(s: Array, mask: Array | None) -> Array:
    """Masked softmax over the last axis of float32 scores (zeros for empty rows).

    A custom VJP: the backward pass is ``ds = w ⊙ (g − Σ_k g_k w_k)`` from the
    saved weights alone, one fused pass instead of differentiating max/exp/sum;
    masked entries and empty rows (``w = 0``) get exactly zero gradient.
    """
    return _softmax_fwd(s, mask)[0]


def _softmax_fwd(s: Array, mask: Array | None) -> tuple[Array, Array]:
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # empty rows: exp(-inf - 0) = 0, no NaN
    e = jnp.exp(s - m)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    w = e * (1.0 / jnp.where(denom == 0.0, 1.0, denom))
    return w, w


def _softmax_bwd(w: Array, g: Array) -> tuple[Array, None]:
    return w * (g - jnp.sum(g * w, axis=-1, keepdims=True)), None


_softmax_last.defvjp(_softmax_fwd, _softmax_bwd)


# ============================================================================ score functions
# Shapes: z_q [..., Q, Dq], z_k [..., K, Dk] -> scores [..., Q, K].


def dot_score(z_q: Any, z_k: Any) -> Array:
    r"""Dot-product score ``s(z_q, z_k) = z_qᵀ z_k`` (MEDL §7.4 default; Luong "dot").

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

    ``scale`` overrides ``1/√d_k``. Slides' example: scores 112 and 96 with
    ``d_k = 64`` become 14 and 12, softmax 0.88 / 0.12.

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

    Row-vector kernels: ``w_a: [Dq, M]`` (``W_aᵀ``), ``w_b: [Dk, M]``, ``w_s: [M]``.
    ``[..., Q, Dq], [..., K, Dk] -> [..., Q, K]``; the ``[..., Q, K, M]``
    intermediate is materialised.

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

    ``w_c: [Dq + Dk, M]`` is ``W̃_sᵀ``; computed without materialising the
    concatenation, as ``tanh(z_q W_c[:Dq] + z_k W_c[Dq:])`` (Bishop Ex. 12.9:
    a linear map of a concatenation is a sum of linear maps).

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

    .. math::
        \alpha^{\langle t\rangle} = \mathrm{softmax}_\tau\, s(z_q^{\langle t\rangle},
            z_k^{\langle\tau\rangle}),\qquad
        u^{\langle t\rangle} = \sum_\tau \alpha^{\langle t\rangle}_\tau v^{\langle\tau\rangle}

    MEDL (7.20)–(7.21) (non-causal form), with ``score`` one of

    * ``"dot"``: ``z_qᵀ z_k``; ``"scaled_dot"``: ``z_qᵀ z_k / √m`` (``m = m_k``);
    * ``"general"``: ``z_qᵀ W_s z_k`` (param ``kernel``: ``[m_q, m_k]``);
    * ``"concat"``: ``w_sᵀ tanh(W̃_s [z_q; z_k])`` (params ``kernel``: ``[m_q+m_k, m̃]``,
      ``v``: ``[m̃]``);
    * ``"additive"``: ``w_sᵀ tanh(W_a z_q + W_b z_k)`` (params ``query_kernel``:
      ``[m_q, m̃]``, ``key_kernel``: ``[m_k, m̃]``, ``v``: ``[m̃]``).

    General/concat are Luong et al. 2015 (query = current decoder state
    ``s^{⟨t⟩}``); additive is Bahdanau et al. 2015 (query = previous state
    ``s^{⟨t-1⟩}``, MEDL Fig. 7.10, (7.22)). The module is agnostic to timing:
    the decoder chooses which state it passes.

    Call: ``attn(query, keys, values=None, *, mask=None, lengths=None)``

    * ``query``: ``[B, Dq]`` (one decoder step) or ``[B, Q, Dq]``;
    * ``keys``: ``[B, K, Dk]``; ``values``: ``[B, K, Dv]`` (default: ``keys``,
      MEDL §7.4 "keys = values");
    * ``mask``: ``bool[B, K]`` or ``bool[B, Q, K]``; ``lengths``: ``int[B]`` key lengths;
    * returns ``context``: ``[B, Dv]`` / ``[B, Q, Dv]`` and ``weights`` (float32)
      ``[B, K]`` / ``[B, Q, K]``, each row summing to 1 over the visible keys
      (zeros when none is visible).

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

        def param(name: str, init: Initializer, shape: tuple[int, ...]) -> Array:
            p = self.param(name, init, shape, self.param_dtype)
            return jnp.asarray(p, q_BxQxD.dtype)

        if self.score == "dot":
            s_BxQxK = dot_score(q_BxQxD, keys)
        elif self.score == "scaled_dot":
            s_BxQxK = scaled_dot_score(q_BxQxD, keys, self.scale)
        elif self.score == "general":
            s_BxQxK = general_score(q_BxQxD, keys, param("kernel", self.kernel_init, (dq, dk)))
        elif self.score == "concat":
            w_c = param("kernel", self.kernel_init, (dq + dk, hidden))
            s_BxQxK = concat_score(q_BxQxD, keys, w_c, param("v", self.v_init, (hidden,)))
        else:
            w_a = param("query_kernel", self.kernel_init, (dq, hidden))
            w_b = param("key_kernel", self.kernel_init, (dk, hidden))
            s_BxQxK = additive_score(q_BxQxD, keys, w_a, w_b, param("v", self.v_init, (hidden,)))

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
        if self.score in ("dot", "scaled_dot"):
            if dq != dk:
                raise ValueError(
                    f"`query` must have the feature size of `keys` (m_q = m_k = {dk}) for the "
                    f"{self.score!r} score; got shape {tuple(query.shape)}."
                )
            return
        if self.score == "general":
            w = bound_param_shape(self, "kernel")
            want_q, want_k = (None, None) if w is None else w
        elif self.score == "additive":
            wq, wk = bound_param_shape(self, "query_kernel"), bound_param_shape(self, "key_kernel")
            want_q, want_k = (None if wq is None else wq[0]), (None if wk is None else wk[0])
        else:  # concat: kernel [m_q + m_k, hidden]; only the sum is known
            w = bound_param_shape(self, "kernel")
            if w is not None and dq + dk != w[0]:
                raise ValueError(
                    f"`query` and `keys` must have {w[0]} features together (the sizes the "
                    f"'concat' kernel was created with); got {dq} + {dk} (shapes "
                    f"{tuple(query.shape)}, {tuple(keys.shape)})."
                )
            return
        check_features(query, "query", want_q)
        check_features(keys, "keys", want_k)


# ============================================================================ dot-product attention


def _as_4d(x: Array | None) -> Array | None:
    return None if x is None else x.reshape((1,) * (4 - x.ndim) + x.shape)


def _check_broadcast(x: Array, name: str, target: tuple[int, int, int, int]) -> None:
    check_rank(x, name, (0, 1, 2, 3, 4))
    shape4 = (1,) * (4 - x.ndim) + tuple(x.shape)
    for got, want in zip(shape4, target):
        if got not in (1, want):
            raise ValueError(
                f"`{name}` must broadcast to [B, H, Q, K] = {list(target)}; got shape {x.shape}."
            )


def _group(x4: Array, hkv: int, groups: int) -> Array:
    """``[b, h, q, k]`` (h ∈ {1, H}) -> ``[b, h', g', q, k]`` matching the grouped query layout."""
    if x4.shape[1] == 1:
        return x4[:, :, None]
    return x4.reshape(x4.shape[0], hkv, groups, *x4.shape[2:])


def _cudnn_supported(q: Array, k: Array, v: Array, dropout_rate: float,
                     return_weights: bool) -> str | None:
    """Why cuDNN flash attention cannot run this call, or ``None`` when it can."""
    if jax.default_backend() != "gpu":
        return f"it needs a GPU backend (the default backend is {jax.default_backend()!r})"
    if q.dtype not in (jnp.float16, jnp.bfloat16):
        return f"it needs float16 or bfloat16 inputs (got {q.dtype})"
    if not (q.dtype == k.dtype == v.dtype):
        return f"it needs one dtype for q, k, v (got {q.dtype}, {k.dtype}, {v.dtype})"
    d = q.shape[-1]
    if d % 8 or d > 128:
        return f"it needs a head dim that is a multiple of 8 and at most 128 (got {d})"
    if v.shape[-1] != d:
        return f"it needs equal key and value head dims (got {d} and {v.shape[-1]})"
    if dropout_rate > 0.0:
        return "it does not support attention dropout here"
    if return_weights:
        return "it does not return attention weights"
    return None


def _pallas_interpret_mode() -> bool:
    """Whether Pallas's TPU interpret mode is on (``pltpu.force_tpu_interpret_mode()``)."""
    try:
        from jax._src import config as jax_config

        return jax_config.pallas_tpu_interpret_mode_context_manager.value is not None
    except (ImportError, AttributeError):  # a JAX without TPU interpret mode
        return False


def _pallas_seq_ok(n: int) -> bool:
    """Sequence lengths the kernel's 128-blocks tile: ≤ 128 (a multiple of 8) or 128·k."""
    return (n <= 128 and n % 8 == 0) or n % 128 == 0


def _pallas_supported(q: Array, k: Array, v: Array, is_causal: bool, dropout_rate: float,
                      return_weights: bool, explicit: bool) -> str | None:
    """Why the Pallas TPU flash-attention kernel cannot run this call, or ``None``."""
    backend = jax.default_backend()
    if backend != "tpu" and not (explicit and _pallas_interpret_mode()):
        return (f"it needs a TPU backend (the default backend is {backend!r}; off TPU, run "
                "it under jax.experimental.pallas.tpu.force_tpu_interpret_mode())")
    if q.dtype not in (jnp.float32, jnp.bfloat16) or not (q.dtype == k.dtype == v.dtype):
        return f"it needs one dtype, float32 or bfloat16, for q, k, v (got {q.dtype}, " \
               f"{k.dtype}, {v.dtype})"
    if v.shape[-1] != q.shape[-1]:
        return f"it needs equal key and value head dims (got {q.shape[-1]} and {v.shape[-1]})"
    q_len, k_len = q.shape[1], k.shape[1]
    if not (_pallas_seq_ok(q_len) and _pallas_seq_ok(k_len)):
        return ("it needs query and key lengths that are multiples of 128, or at most 128 and "
                f"multiples of 8 (got {q_len} and {k_len})")
    if is_causal and q_len != k_len:
        return f"its causal mask needs as many queries as keys (got {q_len} and {k_len})"
    if dropout_rate > 0.0:
        return "it does not support attention dropout here"
    if return_weights:
        return "it does not return attention weights"
    return None


def dot_product_attention(
    q_BxQxHxD: Any,
    k_BxKxGxD: Any,
    v_BxKxGxV: Any,
    *,
    mask: Any = None,
    bias: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    implementation: str = "auto",
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    return_weights: bool = False,
) -> Array | tuple[Array, Array]:
    r"""Scaled dot-product attention over heads, with masks, bias, GQA/MQA and dropout.

    .. math::
        \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\Big(\frac{QK^\top}{\sqrt{d_k}} + B
            + M\Big) V,\qquad M_{ij} = \begin{cases}0 & \text{mask}_{ij}\\
            -\infty & \text{otherwise}\end{cases}

    Bishop (12.14); J&M (9.39); LN (9), (13); MEDL (7.25) per head, with the
    mask of (7.27) applied to the scores. Heads are independent; with ``G``
    key/value heads (``G`` divides ``H``) query head ``h`` reads kv head
    ``h // (H/G)`` (grouped-query attention; ``G = 1`` is multi-query).

    Guarantees: the softmax runs in float32 whatever the input dtype; a query
    row with no visible key returns exactly zeros (and zero gradients), never
    NaN; ``is_causal`` keeps keys ``j ≤ i`` (top-left aligned, as PyTorch's
    ``scaled_dot_product_attention`` and ``jax.nn.dot_product_attention``).

    Args:
        q_BxQxHxD: queries ``[B, Q, H, D]``.
        k_BxKxGxD: keys ``[B, K, G, D]``.
        v_BxKxGxV: values ``[B, K, G, Dv]``.
        mask: boolean, broadcastable to ``[B, H, Q, K]`` (``True`` = attend).
        bias: additive score bias broadcastable to ``[B, H, Q, K]`` (e.g. ALiBi).
        is_causal: also apply :func:`~seqjax.nn.masks.causal_mask` ``(Q, K)``.
        scale: score scale (default ``1/√D``).
        implementation: ``"xla"`` (the fast path for CPU/TPU: heads-first
            batched GEMMs, GQA without repeating K/V, a hand-written backward
            pass, causal attention in 128-query chunks that skip the masked
            upper triangle, for ≥ 1024 keys a loop over query chunks that
            recomputes the scores in the backward pass, and outside ``jax.grad``
            a select-free form that XLA:CPU fuses into one kernel per 128-query
            chunk), ``"reference"`` (plain
            einsum, K/V repeated, autodiff — for tests), ``"cudnn"``
            (``jax.nn.dot_product_attention(implementation="cudnn")``, flash
            attention on a GPU with float16/bfloat16 and head dim ≤ 128: anything
            else is a ``ValueError``), ``"pallas"`` (the Pallas TPU flash-attention
            kernel, ``jax.experimental.pallas.ops.tpu.flash_attention``: on a TPU, or
            anywhere under ``pltpu.force_tpu_interpret_mode()``; float32/bfloat16,
            equal key and value head dims, lengths that tile into 128-blocks;
            anything else is a ``ValueError``), ``"auto"`` (cuDNN on a GPU and the
            Pallas kernel on a TPU when allowed, else ``"xla"``).
        dropout_rate: attention-weight dropout (needs ``dropout_rng``).
        dropout_rng: PRNG key for dropout.
        return_weights: also return the weights ``[B, H, Q, K]`` (float32).

    Returns:
        ``out [B, Q, H, Dv]`` in the inputs' dtype, or ``(out, weights)``.

    Example:
        >>> q = jnp.ones((2, 3, 4, 8)); kv = jnp.ones((2, 5, 2, 8))
        >>> dot_product_attention(q, kv, kv, is_causal=True).shape
        (2, 3, 4, 8)
    """
    if implementation not in _IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {_IMPLEMENTATIONS}; got {implementation!r}."
        )
    q, k, v = jnp.asarray(q_BxQxHxD), jnp.asarray(k_BxKxGxD), jnp.asarray(v_BxKxGxV)
    check_rank(q, "q", 4)
    check_rank(k, "k", 4)
    check_rank(v, "v", 4)
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
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"`dropout_rate` must lie in [0, 1); got {dropout_rate}.")
    if dropout_rate > 0.0 and dropout_rng is None:
        raise ValueError("`dropout_rng` is required when `dropout_rate` > 0.")
    target = (b, h, q_len, k_len)
    if mask is not None:
        mask = jnp.asarray(mask)
        check_bool(mask, "mask")
        _check_broadcast(mask, "mask", target)
    if bias is not None:
        bias = jnp.asarray(bias)
        _check_broadcast(bias, "bias", target)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    static = dict(is_causal=bool(is_causal), scale=scale)
    if 0 in (b, q_len, k_len):
        # Nothing to attend (an empty batch, no queries, or no keys: every row then sees
        # no key and is zero, as a fully masked row is).
        out = jnp.zeros((b, q_len, h, v.shape[-1]), q.dtype)
        return (out, jnp.zeros(target, jnp.float32)) if return_weights else out

    if implementation in ("cudnn", "auto"):
        why_not = _cudnn_supported(q, k, v, dropout_rate, return_weights)
        if why_not is None:
            return _cudnn_attention(q, k, v, mask, bias, **static)
        if implementation == "cudnn":
            raise ValueError(f"implementation='cudnn' is unavailable: {why_not}.")
    if implementation in ("pallas", "auto"):
        why_not = _pallas_supported(q, k, v, bool(is_causal), dropout_rate, return_weights,
                                    explicit=implementation == "pallas")
        if why_not is None:
            return _pallas_attention(q, k, v, mask, bias, **static)
        if implementation == "pallas":
            raise ValueError(f"implementation='pallas' is unavailable: {why_not}.")
    if implementation == "reference":
        return _reference_attention(q, k, v, mask, bias, dropout_rng=dropout_rng,
                                    dropout_rate=float(dropout_rate),
                                    return_weights=bool(return_weights), **static)
    return _grouped_attention(q, k, v, mask, bias, dropout_rng=dropout_rng,
                              dropout_rate=float(dropout_rate),
                              return_weights=bool(return_weights), chunk=_CAUSAL_CHUNK,
                              scan_min_keys=_SCAN_MIN_KEYS, **static)


def _dropout(w: Array, rate: float, rng: Array | None) -> Array:
    if rate == 0.0:
        return w
    keep = jax.random.bernoulli(rng, 1.0 - rate, w.shape)
    return jnp.where(keep, w / (1.0 - rate), 0.0)


# Causal attention over at least 2 chunks is computed one query chunk at a time, each
# chunk against the keys it can see only: this skips the masked upper triangle (about
# half the FLOPs and memory traffic for Q = K). 128 rows was fastest on CPU for
# T in {128, 512, 2048} (fwd+bwd at T=512: 52-64 ms with 128-row chunks, 88 ms unchunked).
_CAUSAL_CHUNK = 128
# Non-causal attention over at least this many keys runs as a loop (lax.scan) over
# query chunks that recomputes the scores in the backward pass (FlashAttention's
# recomputation, without the key blocking): the [Q, K] scores never exist whole, so the
# working set stays ~chunk·K per head instead of Q·K (at T=2048, B·H=16: 40 MB instead of
# 270 MB of temporaries; 10–20% less CPU time than materialising the scores).
_SCAN_MIN_KEYS = 1024


def _slice_qk(x5: Array | None, q0: int, q1: int, k1: int) -> Array | None:
    """Rows ``q0:q1`` and columns ``:k1`` of a grouped mask/bias (size-1 axes broadcast)."""
    if x5 is None:
        return None
    if x5.shape[3] != 1:
        x5 = x5[:, :, :, q0:q1]
    if x5.shape[4] != 1:
        x5 = x5[..., :k1]
    return x5


@partial(jax.jit,
         static_argnames=("is_causal", "scale", "dropout_rate", "return_weights", "chunk",
                          "scan_min_keys"))
def _grouped_attention(q, k, v, mask, bias, is_causal, scale, dropout_rate, dropout_rng,
                       return_weights, chunk, scan_min_keys):
    """Fused XLA path.

    Layout: heads first (``q [B, G, H/G, Q, D]``, ``k [B, G, K, D]``), so both
    matmuls are plain batched GEMMs over ``(B, G)`` with no transposes inside the
    dot; GQA folds the ``H/G`` query heads of a group into the GEMM's rows
    instead of repeating K/V. Causal attention is split into query chunks of
    ``chunk`` rows that only read the keys they can see (see ``_CAUSAL_CHUNK``);
    long non-causal attention loops over query chunks (see ``_SCAN_MIN_KEYS``).
    """
    b, q_len, h, d = q.shape
    k_len, hkv = k.shape[1], k.shape[2]
    groups = h // hkv
    dv = v.shape[-1]
    q5 = (q * jnp.asarray(scale, q.dtype)).reshape(b, q_len, hkv, groups, d)
    q5 = q5.transpose(0, 2, 3, 1, 4)  # [B, G, H/G, Q, D]
    k4 = k.transpose(0, 2, 1, 3)  # [B, G, K, D]
    v4 = v.transpose(0, 2, 1, 3)  # [B, G, K, Dv]
    mask, bias = _as_4d(mask), _as_4d(bias)
    mask5 = None if mask is None else _group(mask, hkv, groups)
    bias5 = None if bias is None else _group(bias, hkv, groups)

    def block(q0: int, q1: int, k1: int, rng: Array | None) -> tuple[Array, Array]:
        n = q1 - q0
        # The H/G heads of a group and the queries form the rows of one GEMM: [B, G, H/G*n, D].
        qb = q5[:, :, :, q0:q1].reshape(b, hkv, groups * n, d)
        blk_mask = _slice_qk(mask5, q0, q1, k1)
        if is_causal:
            q_pos = jnp.arange(q0, q1, dtype=jnp.int32)[:, None]
            blk_mask = combine_masks(blk_mask, jnp.arange(k1, dtype=jnp.int32)[None, :] <= q_pos)
        blk_bias = _slice_qk(bias5, q0, q1, k1)
        if dropout_rate == 0.0 and not return_weights:
            out = _attend_block(qb, k4[:, :, :k1], v4[:, :, :k1], blk_mask, blk_bias, groups)
            return out.reshape(b, hkv, groups, n, dv), None
        s = jnp.einsum("bhnd,bhkd->bhnk", qb, k4[:, :, :k1], preferred_element_type=jnp.float32)
        s = s.reshape(b, hkv, groups, n, k1)
        if blk_bias is not None:
            s = s + blk_bias.astype(jnp.float32)
        if blk_mask is not None:
            blk_mask = jnp.broadcast_to(blk_mask, s.shape)
        w = _dropout(_softmax_last(s, blk_mask), dropout_rate, rng)
        out = jnp.einsum("bhnk,bhkd->bhnd", w.reshape(b, hkv, groups * n, k1).astype(v4.dtype),
                         v4[:, :, :k1])
        return out.reshape(b, hkv, groups, n, dv), w

    if is_causal and not return_weights and q_len >= 2 * chunk:
        outs = []
        for i, q0 in enumerate(range(0, q_len, chunk)):
            q1 = min(q0 + chunk, q_len)
            k1 = min(q1, k_len)
            rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, i)
            if k1 == 0:
                outs.append(jnp.zeros((b, hkv, groups, q1 - q0, dv), v.dtype))
            else:
                outs.append(block(q0, q1, k1, rng)[0])
        out5 = jnp.concatenate(outs, axis=3)
        w = None
    elif (not is_causal and bias5 is None and dropout_rate == 0.0 and not return_weights
          and k_len >= scan_min_keys and q_len >= 2 * chunk
          and (mask5 is None or mask5.shape[3] == 1)):
        pad = -q_len % chunk
        q5p = jnp.pad(q5, ((0, 0),) * 3 + ((0, pad), (0, 0))) if pad else q5
        out5 = _scan_attention(q5p, k4, v4, mask5, chunk)[:, :, :, :q_len]
        w = None
    else:
        out5, w = block(0, q_len, k_len, dropout_rng)
    out = out5.transpose(0, 3, 1, 2, 4).reshape(b, q_len, h, dv)
    if return_weights:
        return out, w.reshape(b, h, q_len, k_len)
    return out


def _split_q(x: Array, chunk: int) -> Array:
    """``[B, G, g, Q, ...] -> [Q/chunk, B, G, g, chunk, ...]`` (scan-major)."""
    b, h, g, q = x.shape[:4]
    x = x.reshape(b, h, g, q // chunk, chunk, *x.shape[4:])
    return jnp.moveaxis(x, 3, 0)


def _merge_q(x: Array) -> Array:
    """Inverse of :func:`_split_q`."""
    x = jnp.moveaxis(x, 0, 3)
    b, h, g, n, c = x.shape[:5]
    return x.reshape(b, h, g, n * c, *x.shape[5:])


def _scan_scores(q5c: Array, k4: Array, mask5: Array | None) -> Array:
    b, h, g, c, d = q5c.shape
    s = jnp.einsum("bhnd,bhkd->bhnk", q5c.reshape(b, h, g * c, d), k4,
                   preferred_element_type=jnp.float32).reshape(b, h, g, c, -1)
    return s if mask5 is None else s + jnp.where(mask5, 0.0, _MASKED)  # see _attend_block


def _scan_pv(w5: Array, x4: Array) -> Array:
    b, h, g, c, k = w5.shape
    out = jnp.einsum("bhnk,bhkd->bhnd", w5.reshape(b, h, g * c, k), x4,
                     preferred_element_type=jnp.float32)
    return out.reshape(b, h, g, c, -1)


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _scan_attention(q5, k4, v4, mask5, chunk):
    """Non-causal attention as a loop over query chunks; ``q5 [B, G, g, Q, D]`` (scaled).

    ``mask5`` broadcasts to ``[B, G, g, 1, K]`` (the same for every query). The
    forward pass keeps the output and the row log-sum-exp; the backward pass
    recomputes each chunk's weights from them (``w = exp(s − lse)``).
    """
    return _scan_fwd(q5, k4, v4, mask5, chunk)[0]


def _scan_fwd(q5, k4, v4, mask5, chunk):
    # Rows with no visible key (the mask is the same for every query of a head): output 0,
    # and lse = +∞ so that the backward pass's exp(s − lse) is 0 there too.
    keep = None if mask5 is None else jnp.any(mask5, axis=-1, keepdims=True)

    def body(_, q5c):
        s = _scan_scores(q5c, k4, mask5)
        m = jnp.max(s, axis=-1, keepdims=True)
        e = jnp.exp(s - m)
        denom = jnp.sum(e, axis=-1, keepdims=True)
        inv = 1.0 / denom if keep is None else keep.astype(jnp.float32) / denom
        o = _scan_pv(e.astype(v4.dtype), v4) * inv
        lse = m + jnp.log(denom)
        return None, (o, lse if keep is None else jnp.where(keep, lse, jnp.inf))

    _, (o, lse) = jax.lax.scan(body, None, _split_q(q5, chunk))
    o, lse = _merge_q(o), _merge_q(lse)
    return o.astype(v4.dtype), (q5, k4, v4, mask5, o, lse)


def _scan_bwd(chunk, res, do):
    """Backward pass, one query chunk at a time, with the scores *transposed* (``[K, n]``).

    ``wᵀ = exp(k qᵀ − lse)``, ``dwᵀ = v doᵀ``, ``dsᵀ = wᵀ ⊙ (dwᵀ − rowsum(do ⊙ o))``; then
    ``dv += wᵀ do``, ``dk += dsᵀ q`` and ``dqᵀ = kᵀ dsᵀ`` are all plain ``A·B`` products.
    (With ``[n, K]`` scores, ``dv`` and ``dk`` contract the scores' leading axis, an
    ``Aᵀ·B`` product that XLA:CPU sends to a slower generic path; see
    ``benchmarks/RESULTS.md``.)
    """
    q5, k4, v4, mask5, o, lse = res
    dsum = jnp.sum(do.astype(jnp.float32) * o, axis=-1, keepdims=True)
    kt4 = jnp.swapaxes(k4, -1, -2)  # [B, G, D, K], once for all chunks
    maskt = None if mask5 is None else jnp.swapaxes(mask5, -1, -2)  # [B, G, g, K, 1]

    def body(carry, xs):
        dk, dv = carry
        q5c, doc, lsec, dsumc = xs
        b, h, g, c, d = q5c.shape
        q4 = q5c.reshape(b, h, g * c, d)
        do4 = doc.reshape(b, h, g * c, -1)
        st = jnp.einsum("bhkd,bhnd->bhkn", k4, q4, preferred_element_type=jnp.float32)
        st = st.reshape(b, h, -1, g, c)
        if maskt is not None:
            st = jnp.where(jnp.moveaxis(maskt, 2, 3), st, -jnp.inf)
        wt = jnp.exp(st - jnp.moveaxis(lsec, -1, 2))  # [B, G, K, g, c]; masked: 0
        wt4 = wt.reshape(b, h, -1, g * c)
        dv = dv + jnp.einsum("bhkn,bhnd->bhkd", wt4.astype(v4.dtype), do4,
                             preferred_element_type=jnp.float32)
        dwt = jnp.einsum("bhkd,bhnd->bhkn", v4, do4, preferred_element_type=jnp.float32)
        dst4 = wt4 * (dwt - dsumc.reshape(b, h, 1, g * c))
        dk = dk + jnp.einsum("bhkn,bhnd->bhkd", dst4.astype(q4.dtype), q4,
                             preferred_element_type=jnp.float32)
        dqt = jnp.einsum("bhdk,bhkn->bhdn", kt4, dst4.astype(kt4.dtype),
                         preferred_element_type=jnp.float32)
        return (dk, dv), jnp.swapaxes(dqt, -1, -2).reshape(b, h, g, c, d)

    init = (jnp.zeros(k4.shape, jnp.float32), jnp.zeros(v4.shape, jnp.float32))
    xs = tuple(_split_q(x, chunk) for x in (q5, do, lse, dsum))
    (dk, dv), dq = jax.lax.scan(body, init, xs)
    return (_merge_q(dq).astype(q5.dtype), dk.astype(k4.dtype), dv.astype(v4.dtype), None)


_scan_attention.defvjp(_scan_fwd, _scan_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attend_block(q4, k4, v4, mask5, bias5, groups):
    """``softmax(q kᵀ + bias, mask) v`` for one block, with a hand-written backward pass.

    ``q4 [B, G, R, D]`` (``R`` = ``groups`` query heads × ``n`` queries, already
    scaled), ``k4 [B, G, K, D]``, ``v4 [B, G, K, Dv]``; ``mask5``/``bias5``
    broadcast to ``[B, G, groups, n, K]``. Both forms normalise after the value
    matmul (``o = (e v) / l``, ``e = exp(s − max)``), so the weights are never
    written; the backward pass uses ``ds = w ⊙ (dw − rowsum(do ⊙ o))`` and
    ``dv = eᵀ (do / l)`` — fewer passes over the ``[R, K]`` scores than autodiff.

    Two forward forms of the same function, chosen by what XLA:CPU runs fastest:

    * not differentiated (this primal, :func:`_attend_fused`): no select on the
      scores, in query chunks of ``_FUSED_ROWS`` — XLA:CPU then fuses each chunk's
      whole pass (both products, the max, the exp, the sums) into one multi-threaded
      kernel, 1.4–1.7× faster at T = 128 and 512 (``benchmarks/RESULTS.md``);
    * under ``jax.grad`` (:func:`_attend_fwd`, which must also write ``e`` for the
      backward pass): the scores whole, masked with ``−∞`` and guarded, the form
      that measured fastest with the backward pass.
    """
    b, g, r, d = q4.shape
    n = r // groups
    if n < 2 * _FUSED_ROWS:
        return _attend_fused(q4, k4, v4, mask5, bias5, groups)
    q5 = q4.reshape(b, g, groups, n, d)
    k_len = k4.shape[2]
    outs = []
    for q0 in range(0, n, _FUSED_ROWS):
        q1 = min(q0 + _FUSED_ROWS, n)
        qc = q5[:, :, :, q0:q1].reshape(b, g, groups * (q1 - q0), d)
        oc = _attend_fused(qc, k4, v4, _slice_qk(mask5, q0, q1, k_len),
                           _slice_qk(bias5, q0, q1, k_len), groups)
        outs.append(oc.reshape(b, g, groups, q1 - q0, -1))
    return jnp.concatenate(outs, axis=3).reshape(b, g, r, -1)


# Query rows per fused forward chunk (one chunk below 2×): at 128 rows a chunk's
# scores stay in cache; 512-row blocks fused whole ran no faster than unfused.
_FUSED_ROWS = 128
# Added to masked scores in the fused form. exp(s + _MASKED − max) is exactly 0 in
# float32 whenever the row has a visible key; rows without one are zeroed by ``keep``.
_MASKED = -1e30


def _attend_fused(q4, k4, v4, mask5, bias5, groups):
    """The primal's form: additive finite mask, ``keep / l`` for empty rows (see above)."""
    b, g, r, _ = q4.shape
    k_len = k4.shape[2]
    s = jnp.einsum("bhnd,bhkd->bhnk", q4, k4, preferred_element_type=jnp.float32)
    keep = None
    if mask5 is not None or bias5 is not None:
        s5 = s.reshape(b, g, groups, r // groups, k_len)
        if bias5 is not None:  # a bias may hold −∞: the guarded (select) form
            s5 = s5 + bias5.astype(jnp.float32)
            if mask5 is not None:
                s5 = jnp.where(mask5, s5, -jnp.inf)
        else:
            s5 = s5 + jnp.where(mask5, 0.0, _MASKED).astype(jnp.float32)
            keep5 = jnp.any(mask5, axis=-1, keepdims=True)
            keep = jnp.broadcast_to(keep5, (b, g, groups, r // groups, 1))
            keep = keep.reshape(b, g, r, 1).astype(jnp.float32)
        s = s5.reshape(b, g, r, k_len)
    m = jnp.max(s, axis=-1, keepdims=True)
    if bias5 is not None:  # a row may be all −∞: exp(−∞ − 0) = 0, no NaN
        m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    if bias5 is not None:
        denom = jnp.where(denom == 0.0, 1.0, denom)
    inv = 1.0 / denom if keep is None else keep / denom
    o = jnp.einsum("bhnk,bhkd->bhnd", e.astype(v4.dtype), v4,
                   preferred_element_type=jnp.float32) * inv
    return o.astype(v4.dtype)


def _attend_fwd(q4, k4, v4, mask5, bias5, groups):
    """The differentiated form: ``−∞`` masking, guarded max and sum; saves ``e`` and ``1/l``."""
    b, g, r, _ = q4.shape
    k_len = k4.shape[2]
    s = jnp.einsum("bhnd,bhkd->bhnk", q4, k4, preferred_element_type=jnp.float32)
    if mask5 is not None or bias5 is not None:
        s5 = s.reshape(b, g, groups, r // groups, k_len)
        if bias5 is not None:
            s5 = s5 + bias5.astype(jnp.float32)
        if mask5 is not None:
            s5 = jnp.where(mask5, s5, -jnp.inf)
        s = s5.reshape(b, g, r, k_len)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # empty rows: exp(-inf - 0) = 0, no NaN
    e = jnp.exp(s - m)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    inv = 1.0 / jnp.where(denom == 0.0, 1.0, denom)
    o = jnp.einsum("bhnk,bhkd->bhnd", e.astype(v4.dtype), v4,
                   preferred_element_type=jnp.float32) * inv
    return o.astype(v4.dtype), (q4, k4, v4, mask5, bias5, e, inv, o)


def _attend_bwd(groups, res, do):
    q4, k4, v4, mask5, bias5, e, inv, o = res
    do32 = do.astype(jnp.float32)
    dv = jnp.einsum("bhnk,bhnd->bhkd", e.astype(v4.dtype), (do32 * inv).astype(v4.dtype),
                    preferred_element_type=jnp.float32)
    dw = jnp.einsum("bhnd,bhkd->bhnk", do, v4, preferred_element_type=jnp.float32)
    ds = e * inv * (dw - jnp.sum(do32 * o, axis=-1, keepdims=True))
    dq = jnp.einsum("bhnk,bhkd->bhnd", ds.astype(k4.dtype), k4, preferred_element_type=jnp.float32)
    dk = jnp.einsum("bhnk,bhnd->bhkd", ds.astype(q4.dtype), q4, preferred_element_type=jnp.float32)
    dbias = None
    if bias5 is not None:
        b, g, r, k_len = ds.shape
        ds5 = ds.reshape(b, g, groups, r // groups, k_len)
        ds5 = ds5.reshape((1,) * (bias5.ndim - ds5.ndim) + ds5.shape)
        axes = tuple(i for i, n in enumerate(bias5.shape) if n == 1 and ds5.shape[i] != 1)
        dbias = jnp.sum(ds5, axis=axes, keepdims=True).reshape(bias5.shape).astype(bias5.dtype)
    return dq.astype(q4.dtype), dk.astype(k4.dtype), dv.astype(v4.dtype), None, dbias


_attend_block.defvjp(_attend_fwd, _attend_bwd)


@partial(jax.jit, static_argnames=("is_causal", "scale", "dropout_rate", "return_weights"))
def _reference_attention(q, k, v, mask, bias, is_causal, scale, dropout_rate, dropout_rng,
                         return_weights):
    """Plain einsum: repeat K/V to every query head, then softmax(QKᵀ·scale + B + M) V."""
    mask, bias = _as_4d(mask), _as_4d(bias)
    if is_causal:
        mask = combine_masks(mask, causal_mask(q.shape[1], k.shape[1]))
    groups = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, groups, axis=2)
    v = jnp.repeat(v, groups, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    if bias is not None:
        s = s + bias.astype(jnp.float32)
    w = masked_softmax(s, mask)
    w = _dropout(w, dropout_rate, dropout_rng)
    out = jnp.einsum("bhqk,bkhd->bqhd", w, v.astype(jnp.float32)).astype(q.dtype)
    return (out, w) if return_weights else out


@partial(jax.jit, static_argnames=("is_causal", "scale"))
def _cudnn_attention(q, k, v, mask, bias, is_causal, scale):
    """cuDNN flash attention; rows with no visible key are zeroed afterwards."""
    mask, bias = _as_4d(mask), _as_4d(bias)
    # cuDNN takes a mask/bias only with full query and key axes ([B|1, H|1, Q, K]).
    qk = (q.shape[1], k.shape[1])
    kernel_mask = None
    if mask is not None:
        mask = jnp.broadcast_to(mask, mask.shape[:2] + qk)
        # A row with no visible key gives NaN gradients inside the kernel: let it see every
        # key there (a harmless average), and zero it afterwards as the other paths do.
        visible = mask & causal_mask(*qk)[None, None] if is_causal else mask
        kernel_mask = mask | ~jnp.any(visible, axis=-1, keepdims=True)
    if bias is not None:
        bias = jnp.broadcast_to(bias, bias.shape[:2] + qk).astype(q.dtype)
    out = jax.nn.dot_product_attention(
        q, k, v, bias=bias, mask=kernel_mask, scale=scale, is_causal=is_causal,
        implementation="cudnn",
    )
    return _zero_invisible_rows(out, mask, bias, is_causal, k.shape[1])


def _zero_invisible_rows(out: Array, mask: Array | None, bias: Array | None, is_causal: bool,
                         k_len: int) -> Array:
    """Zero the query rows of ``out [B, Q, H, Dv]`` that see no key: every key masked
    (``mask``, ``is_causal``) or given a ``−∞`` (≤ ``_MASKED``) bias. For the fused kernels,
    which return a uniform average (or NaN) there."""
    if mask is None and bias is None:
        return out
    b, q_len, h, _ = out.shape
    visible = jnp.ones((1, 1, 1, 1), bool) if mask is None else mask
    if bias is not None:
        visible = visible & (bias > _MASKED)
    if is_causal:
        visible = visible & causal_mask(q_len, k_len)[None, None]
    any_BxHxQ = jnp.broadcast_to(jnp.any(visible, axis=-1), (b, h, q_len))
    return jnp.where(any_BxHxQ.swapaxes(1, 2)[..., None], out, jnp.zeros((), out.dtype))


def _pallas_attention(q, k, v, mask, bias, is_causal, scale):
    """Pallas TPU flash attention (``jax.experimental.pallas.ops.tpu.flash_attention``).

    The kernel takes ``[B, H, T, D]`` with as many kv heads as query heads (GQA's K/V
    are repeated), a bias only of the full ``[B, H, Q, K]`` shape and segment ids. A
    key-padding mask (``[B, 1, 1, K]``) becomes segment ids — the scores are never
    materialised; any other mask is added to the bias as ``_MASKED``. Rows with no
    visible key (by the mask, or a bias of ``−∞`` on the whole row) are zeroed after.
    """
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    b, q_len, h, d = q.shape
    k_len, hkv = k.shape[1], k.shape[2]
    if hkv != h:
        k, v = jnp.repeat(k, h // hkv, axis=2), jnp.repeat(v, h // hkv, axis=2)
    mask, bias = _as_4d(mask), _as_4d(bias)
    segment_ids = ab = None
    if mask is not None and bias is None and mask.shape[1] == mask.shape[2] == 1:
        kv_ids = jnp.where(jnp.broadcast_to(mask[:, 0, 0], (b, k_len)), 0, 1).astype(jnp.int32)
        segment_ids = fa.SegmentIds(q=jnp.zeros((b, q_len), jnp.int32), kv=kv_ids)
    elif mask is not None or bias is not None:
        ab = jnp.zeros((b, h, q_len, k_len), jnp.float32)
        if bias is not None:  # −∞ → _MASKED: finite inside the kernel, zeroed below
            ab = ab + jnp.maximum(bias.astype(jnp.float32), _MASKED)
        if mask is not None:
            ab = ab + jnp.where(mask, 0.0, _MASKED)
        ab = ab.astype(q.dtype)
    block_q, block_k = min(128, q_len), min(128, k_len)
    sizes = fa.BlockSizes(
        block_q=block_q, block_k_major=block_k, block_k=block_k, block_b=1,
        block_q_major_dkv=block_q, block_k_major_dkv=block_k, block_k_dkv=block_k,
        block_q_dkv=block_q, block_k_major_dq=block_k, block_k_dq=block_k, block_q_dq=block_q,
    )
    # The kernel scales ``q kᵀ + ab`` by ``sm_scale``; the bias must stay unscaled, so the
    # scale goes on q (as in the XLA path) and sm_scale is 1.
    q = q * jnp.asarray(scale, q.dtype)
    out = fa.flash_attention(
        q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), ab,
        segment_ids, causal=is_causal, sm_scale=1.0, block_sizes=sizes,
    ).transpose(0, 2, 1, 3)
    return _zero_invisible_rows(out, mask, bias, is_causal, k_len)


# ============================================================================ KV cache


@flax.struct.dataclass
class KVCache:
    r"""Key/value cache for autoregressive decoding, an explicit pytree.

    Fields:

    * ``k``: ``[B, S, G, D]`` stored keys (``S`` = ``max_len``, ``G`` kv heads);
    * ``v``: ``[B, S, G, Dv]`` stored values;
    * ``lengths``: ``int32[B]``, tokens already stored per row;
    * ``overflow``: ``int32[B]``, tokens that did not fit and were dropped (0 = none). A
      concrete update that would overflow raises; under ``jit`` the tokens past
      ``max_len`` are dropped (never written over earlier entries) and counted here —
      check ``cache.overflow`` (or :attr:`overflowed`) after a jitted loop.

    Row ``b`` writes its next tokens at its own offset ``lengths[b]``, so a
    batch of prompts of different lengths (right padded) decodes correctly:
    prefill the padded batch with ``lengths=prompt_lengths`` and the cache
    advances each row by its own length; later writes overwrite the padding.
    Aliases with shape suffixes: ``k_BxSxHkvxD``, ``v_BxSxHkvxD``, ``lengths_B``.

    Example:
        >>> c = KVCache.create(batch=2, max_len=8, num_kv_heads=1, head_dim=4)
        >>> c = c.update(jnp.ones((2, 3, 1, 4)), jnp.ones((2, 3, 1, 4)), jnp.array([3, 2]))
        >>> c.lengths.tolist(), c.max_len
        ([3, 2], 8)
    """

    k: Array
    v: Array
    lengths: Array
    overflow: Array | None = None

    @classmethod
    def create(
        cls,
        batch: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: Dtype = jnp.float32,
        value_head_dim: int | None = None,
    ) -> KVCache:
        """Empty cache: zeros ``[batch, max_len, num_kv_heads, head_dim]`` and ``lengths = 0``."""
        for name, val in (("batch", batch), ("max_len", max_len), ("num_kv_heads", num_kv_heads),
                          ("head_dim", head_dim)):
            if not isinstance(val, (int, np.integer)) or val <= 0:
                raise ValueError(f"`{name}` must be a positive int; got {val!r}.")
        dv = head_dim if value_head_dim is None else value_head_dim
        return cls(
            k=jnp.zeros((batch, max_len, num_kv_heads, head_dim), dtype),
            v=jnp.zeros((batch, max_len, num_kv_heads, dv), dtype),
            lengths=jnp.zeros((batch,), jnp.int32),
            overflow=jnp.zeros((batch,), jnp.int32),
        )

    @property
    def max_len(self) -> int:
        return self.k.shape[1]

    @property
    def overflowed(self) -> Array:
        """``bool[B]``: rows that lost tokens to a full cache (under ``jit``)."""
        if self.overflow is None:
            return jnp.zeros(self.lengths.shape, bool)
        return self.overflow > 0

    @property
    def k_BxSxHkvxD(self) -> Array:
        return self.k

    @property
    def v_BxSxHkvxD(self) -> Array:
        return self.v

    @property
    def lengths_B(self) -> Array:
        return self.lengths

    def update(self, k_BxTxGxD: Array, v_BxTxGxV: Array, num_new: Any = None) -> KVCache:
        """Write ``T`` new tokens per row at offset ``lengths[b]``; advance by ``num_new`` (or T).

        ``num_new`` (``int[B]``, ≤ T) is the number of real tokens per row when
        the new chunk is right padded; the padding is written too but is
        overwritten by the next update. Overflow past ``max_len`` is a
        ``ValueError`` when ``lengths`` are concrete; under ``jit`` the tokens
        past the end are dropped (never written over earlier entries) and counted in
        ``overflow``.
        """
        b, s = self.k.shape[:2]
        check_rank(k_BxTxGxD, "k", 4)
        if k_BxTxGxD.shape[0] != b or k_BxTxGxD.shape[2:] != self.k.shape[2:]:
            raise ValueError(
                f"new keys must have shape [{b}, T, {self.k.shape[2]}, {self.k.shape[3]}] to fit "
                f"the cache; got {k_BxTxGxD.shape}."
            )
        t = k_BxTxGxD.shape[1]
        if v_BxTxGxV.shape != (b, t, *self.v.shape[2:]):
            raise ValueError(
                f"new values must have shape {(b, t, *self.v.shape[2:])}; got {v_BxTxGxV.shape}."
            )
        if num_new is None:
            num_new = jnp.full((b,), t, jnp.int32)
        else:
            num_new = jnp.asarray(num_new)
            check_integer(num_new, "lengths")
            check_rank(num_new, "lengths", 1)
            check_range(num_new, "lengths", 0, t)
            num_new = jnp.broadcast_to(num_new.astype(jnp.int32), (b,))
        if is_concrete(self.lengths):
            longest = int(np.max(np.asarray(self.lengths) + t)) if b else 0
            if longest > s:
                raise ValueError(
                    f"KV cache overflow: writing {t} tokens at lengths "
                    f"{np.asarray(self.lengths).tolist()} needs {longest} slots but "
                    f"max_len={s}."
                )
        return _cache_write(self, k_BxTxGxD, v_BxTxGxV, num_new)

    def attention_mask(self, q_len: int) -> Array:
        """Mask ``bool[B, 1, q_len, S]`` for ``q_len`` new tokens at offsets ``lengths``.

        Query ``i`` of row ``b`` (absolute position ``lengths[b] + i``) sees
        cache slots ``j ≤ lengths[b] + i``: every stored token and the new ones
        up to itself. Call it on the cache *before* :meth:`update`.
        """
        return causal_mask(q_len, self.max_len, offset=self.lengths)


@jax.jit
def _cache_write(cache: KVCache, k_BxTxGxD: Array, v_BxTxGxV: Array, num_new: Array) -> KVCache:
    """Scatter each row's new tokens at ``lengths[b] + t``; out-of-range writes are dropped."""
    b, t = k_BxTxGxD.shape[:2]
    pos_BxT = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    rows_Bx1 = jnp.arange(b, dtype=jnp.int32)[:, None]
    k = cache.k.at[rows_Bx1, pos_BxT].set(k_BxTxGxD.astype(cache.k.dtype), mode="drop")
    v = cache.v.at[rows_Bx1, pos_BxT].set(v_BxTxGxV.astype(cache.v.dtype), mode="drop")
    wanted = cache.lengths + num_new
    lengths = jnp.minimum(wanted, cache.k.shape[1])
    overflow = None if cache.overflow is None else cache.overflow + (wanted - lengths)
    return cache.replace(k=k, v=v, lengths=lengths, overflow=overflow)


# ============================================================================ multi-head attention


class _HeadRMSNorm(nn.Module):
    """RMS norm over the last (head) axis with a learned gain ``scale`` [D]; float32 statistics."""

    epsilon: float = 1e-6
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", nn.initializers.ones_init(), (x.shape[-1],), self.param_dtype)
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.epsilon)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)


class MultiHeadAttention(nn.Module):
    r"""Multi-head (self or cross) attention with GQA/MQA, QK-norm, RoPE and a KV cache.

    .. math::
        Q_h = X_q W^{(q)}_h,\ K_h = X_{kv} W^{(k)}_{g(h)},\ V_h = X_{kv} W^{(v)}_{g(h)},\qquad
        H_h = \mathrm{softmax}\Big(\frac{Q_h K_h^\top}{\sqrt{d}} + M\Big) V_h

    .. math::
        Y = \mathrm{Concat}[H_1, \dots, H_H]\, W^{(o)} = \sum_h H_h W^{(o)}_h

    Bishop (12.15)–(12.19) and Alg. 12.2; J&M (9.47)–(9.48); LN (10). The sum
    form is MEDL (7.25)–(7.26) (``W_c^h`` = row block ``h`` of ``W^{(o)}``;
    Bishop Ex. 12.5). MEDL's heads have no projection biases: ``use_bias=False``
    reproduces them (and its parameter count, MEDL (7.32)).

    Options: ``num_kv_heads`` ``G`` < ``H`` shares each key/value head among
    ``H/G`` query heads (GQA; ``G = 1`` is MQA). ``qk_norm`` applies an RMS norm
    with a learned gain over each head's ``q`` and ``k`` (before RoPE).
    ``use_rope`` rotates ``q`` and ``k`` by their positions
    (:func:`~seqjax.nn.positional.apply_rope`).

    Call ``mha(inputs_q, inputs_kv=None, *, mask=None, bias=None, is_causal=False,
    positions=None, kv_positions=None, lengths=None, kv_lengths=None, cache=None,
    deterministic=True, return_weights=False)``:

    * ``inputs_q``: ``[B, Q, D]``; ``inputs_kv``: ``[B, K, Dkv]`` (``None`` = self-attention);
    * ``mask``: bool broadcastable to ``[B, H, Q, K]``; ``bias``: added to the scores;
    * ``is_causal``: causal mask (self-attention; decoding with a cache is always causal);
    * ``positions``: ``int[B, Q]`` RoPE positions of the queries (default
      ``arange(Q)``, or ``cache.lengths[:, None] + arange(Q)`` when decoding);
      in self-attention the keys share them; ``kv_positions`` for cross-attention keys;
    * ``lengths``: ``int[B]`` real tokens in ``inputs_q`` (right padding): in
      self-attention the padded keys are masked; padded query rows output
      zeros; with a cache, each row's cache advances by its length (mixed-length prefill);
    * ``kv_lengths``: ``int[B]`` real tokens in ``inputs_kv`` (cross-attention key padding);
    * ``cache``: a :class:`KVCache` (self-attention only): the new keys/values
      are written at each row's offset and the queries attend to the cache;
    * ``kv``: ``(k [B, K, G, d], v [B, K, G, Dv])`` returned by an earlier call with
      ``return_kv=True`` on the same ``inputs_kv`` (cross-attention only): the key and
      value projections (with ``qk_norm`` and RoPE applied) are reused instead of
      recomputed — a decoder step then costs ``O(K·d)`` instead of ``O(K·D·d)`` per head;
    * returns ``out [B, Q, out_features]``; ``(out, new_cache)`` with a cache;
      ``(out, weights [B, H, Q, K])`` with ``return_weights``;
      ``(out, new_cache, weights)`` with both; ``return_kv`` appends ``(k, v)`` last.

    Parameters (stable names; Flax ``MultiHeadDotProductAttention`` layout):
    ``query/kernel [D, H, d]``, ``key/kernel``, ``value/kernel [Dkv, G, d]``,
    ``out/kernel [H, d, D']`` (and ``bias`` for each when ``use_bias``);
    ``query_norm/scale``, ``key_norm/scale [d]`` with ``qk_norm``.

    Example (cached decoding):
        >>> import jax
        >>> mha = MultiHeadAttention(num_heads=4, head_dim=8, use_rope=True)
        >>> x = jnp.ones((2, 5, 32))
        >>> params = mha.init(jax.random.PRNGKey(0), x, is_causal=True)
        >>> cache = mha.init_cache(batch=2, max_len=16)
        >>> y, cache = mha.apply(params, x, cache=cache)          # prefill 5 tokens
        >>> y1, cache = mha.apply(params, x[:, :1], cache=cache)  # one more step
        >>> y1.shape, cache.lengths.tolist()
        ((2, 1, 32), [6, 6])

    Attributes:
        num_heads: ``H``.
        head_dim: ``d`` per head (default ``D // H``).
        num_kv_heads: ``G`` key/value heads (default ``H``); must divide ``H``.
        out_features: output size (default: ``D`` of ``inputs_q``).
        use_bias: biases on the four projections.
        dropout_rate: dropout on the attention weights (when ``deterministic=False``;
            RNG stream ``dropout``).
        qk_norm: RMS-normalise ``q`` and ``k`` per head.
        use_rope: rotary position embedding on ``q`` and ``k``.
        rope_base: RoPE ``base``; rope_layout: ``"halves"`` or ``"interleaved"``.
        implementation: see :func:`dot_product_attention`.
        dtype: compute dtype; param_dtype: storage dtype.
    """

    num_heads: int
    head_dim: int | None = None
    num_kv_heads: int | None = None
    out_features: int | None = None
    use_bias: bool = True
    dropout_rate: float = 0.0
    qk_norm: bool = False
    qk_norm_epsilon: float = 1e-6
    use_rope: bool = False
    rope_base: float = 10000.0
    rope_layout: str = "halves"
    scale: float | None = None
    implementation: str = "auto"
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    out_kernel_init: Initializer | None = None
    bias_init: Initializer = nn.initializers.zeros_init()

    def _kv_heads(self) -> int:
        g = self.num_heads if self.num_kv_heads is None else self.num_kv_heads
        if not isinstance(self.num_heads, int) or self.num_heads <= 0:
            raise ValueError(f"`num_heads` must be a positive int; got {self.num_heads!r}.")
        if not isinstance(g, int) or g <= 0 or self.num_heads % g:
            raise ValueError(
                f"`num_kv_heads` must be a positive divisor of num_heads={self.num_heads}; "
                f"got {g!r}."
            )
        return g

    def _head_dim(self, features: int) -> int:
        if self.head_dim is not None:
            if not isinstance(self.head_dim, int) or self.head_dim <= 0:
                raise ValueError(f"`head_dim` must be a positive int; got {self.head_dim!r}.")
            return self.head_dim
        if features % self.num_heads:
            raise ValueError(
                f"input size {features} is not divisible by num_heads={self.num_heads}; "
                f"set `head_dim` explicitly."
            )
        return features // self.num_heads

    def init_cache(self, batch: int, max_len: int, dtype: Dtype | None = None) -> KVCache:
        """An empty :class:`KVCache` for this layer (``[batch, max_len, G, d]``).

        Needs ``head_dim`` set, or bound parameters (``mha.apply(params, batch,
        max_len, method="init_cache")``) from which ``d`` is read.
        """
        g = self._kv_heads()
        if self.head_dim is not None:
            d = self._head_dim(0)
        elif self.scope is not None and self.has_variable("params", "key"):
            d = self.get_variable("params", "key")["kernel"].shape[-1]
        else:
            raise ValueError(
                "init_cache needs `head_dim` set on the module, or bound parameters "
                "(mha.apply(params, batch, max_len, method='init_cache'))."
            )
        dtype = dtype or self.dtype or self.param_dtype
        return KVCache.create(batch, max_len, g, d, dtype)

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array | None = None,
        *,
        mask: Any = None,
        bias: Any = None,
        is_causal: bool = False,
        positions: Any = None,
        kv_positions: Any = None,
        lengths: Any = None,
        kv_lengths: Any = None,
        cache: KVCache | None = None,
        deterministic: bool = True,
        return_weights: bool = False,
        kv: tuple[Array, Array] | None = None,
        return_kv: bool = False,
    ) -> Any:
        check_rank(inputs_q, "inputs_q", 3)
        b, q_len, features = inputs_q.shape
        self_attention = inputs_kv is None
        x_kv = inputs_q if self_attention else inputs_kv
        check_rank(x_kv, "inputs_kv", 3)
        if x_kv.shape[0] != b:
            raise ValueError(
                f"`inputs_kv` must have batch size {b} like `inputs_q`; got shape {x_kv.shape}."
            )
        if cache is not None and not self_attention:
            raise ValueError(
                "`cache` is for self-attention only; for cross-attention pass the encoder "
                "output as `inputs_kv`, and reuse its projection with `kv` / `return_kv`."
            )
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"`cache` must be a KVCache; got {type(cache).__name__}.")
        if cache is not None and cache.k.shape[0] != b:
            raise ValueError(
                f"`cache` must hold batch size {b} like `inputs_q`; got a cache of shape "
                f"{tuple(cache.k.shape)} (from init_cache(batch={cache.k.shape[0]}, ...))."
            )
        if self.rope_layout not in ("halves", "interleaved"):
            raise ValueError(
                f"`rope_layout` must be 'halves' or 'interleaved'; got {self.rope_layout!r}."
            )
        wq = bound_param_shape(self, "query", "kernel")
        check_features(inputs_q, "inputs_q", None if wq is None else wq[0])
        if kv is None and not self_attention:
            wk = bound_param_shape(self, "key", "kernel")
            check_features(x_kv, "inputs_kv", None if wk is None else wk[0])
        h, g = self.num_heads, self._kv_heads()
        d = self._head_dim(features)
        out_features = features if self.out_features is None else self.out_features

        def proj(heads: int, name: str) -> DenseGeneral:
            return DenseGeneral(
                features=(heads, d), axis=-1, use_bias=self.use_bias, dtype=self.dtype,
                param_dtype=self.param_dtype, kernel_init=self.kernel_init,
                bias_init=self.bias_init, name=name,
            )

        q_BxQxHxD = proj(h, "query")(inputs_q)
        if kv is not None:  # cross-attention keys/values projected by an earlier call
            if self_attention:
                raise ValueError("`kv` is for cross-attention: pass `inputs_kv` as well.")
            k_BxKxGxD, v_BxKxGxD = kv
            want = (b, x_kv.shape[1], g, d)
            if tuple(k_BxKxGxD.shape) != want or tuple(v_BxKxGxD.shape[:3]) != want[:3]:
                raise ValueError(
                    f"`kv` must hold keys of shape {want} (and values [B, K, G, Dv]) for "
                    f"`inputs_kv` of shape {tuple(x_kv.shape)}; got "
                    f"{tuple(k_BxKxGxD.shape)} and {tuple(v_BxKxGxD.shape)}."
                )
        else:
            k_BxKxGxD = proj(g, "key")(x_kv)
            v_BxKxGxD = proj(g, "value")(x_kv)
        if self.qk_norm:
            q_BxQxHxD = _HeadRMSNorm(self.qk_norm_epsilon, self.param_dtype,
                                     name="query_norm")(q_BxQxHxD)
            if kv is None:
                k_BxKxGxD = _HeadRMSNorm(self.qk_norm_epsilon, self.param_dtype,
                                         name="key_norm")(k_BxKxGxD)

        if lengths is not None:
            lengths = check_lengths(lengths, "lengths", b, q_len)
        if kv_lengths is not None:
            if self_attention:
                raise ValueError("`kv_lengths` is for cross-attention; use `lengths`.")
            kv_lengths = check_lengths(kv_lengths, "kv_lengths", b, x_kv.shape[1])
        if self.use_rope:
            if positions is None:
                start = cache.lengths[:, None] if cache is not None else 0
                positions = start + jnp.arange(q_len, dtype=jnp.int32)[None, :]
            q_BxQxHxD = apply_rope(q_BxQxHxD, positions, self.rope_base, self.rope_layout)
            if self_attention:
                kv_pos = positions
            else:
                kv_pos = kv_positions
            if kv is None:
                k_BxKxGxD = apply_rope(k_BxKxGxD, kv_pos, self.rope_base, self.rope_layout)
        projected_kv = (k_BxKxGxD, v_BxKxGxD)

        if cache is not None:
            attn_mask = cache.attention_mask(q_len)
            cache = cache.update(k_BxKxGxD, v_BxKxGxD, lengths)
            k_BxKxGxD, v_BxKxGxD = cache.k, cache.v
        else:
            attn_mask = None
            if lengths is not None and self_attention:
                attn_mask = combine_masks(attn_mask, padding_mask(lengths, q_len)[:, None, None])
        if kv_lengths is not None:
            key_valid = padding_mask(kv_lengths, x_kv.shape[1])
            attn_mask = combine_masks(attn_mask, key_valid[:, None, None, :])
        if mask is not None:
            mask = jnp.asarray(mask)
            check_bool(mask, "mask")
            # Checked before it meets the masks built from lengths/kv_lengths/cache, so a
            # wrong shape is reported as `mask`'s, against the keys it must cover.
            _check_broadcast(mask, "mask", (b, h, q_len, k_BxKxGxD.shape[1]))
        attn_mask = combine_masks(attn_mask, mask)

        use_dropout = self.dropout_rate > 0.0 and not deterministic
        result = dot_product_attention(
            q_BxQxHxD, k_BxKxGxD, v_BxKxGxD, mask=attn_mask, bias=bias, scale=self.scale,
            is_causal=is_causal and cache is None,
            implementation=self.implementation,
            dropout_rate=self.dropout_rate if use_dropout else 0.0,
            dropout_rng=self.make_rng("dropout") if use_dropout else None,
            return_weights=return_weights,
        )
        attn_BxQxHxD, weights = result if return_weights else (result, None)
        out_BxQxF = DenseGeneral(
            features=out_features, axis=(-2, -1), use_bias=self.use_bias, dtype=self.dtype,
            param_dtype=self.param_dtype, kernel_init=self.out_kernel_init or self.kernel_init,
            bias_init=self.bias_init, name="out",
        )(attn_BxQxHxD)
        if lengths is not None:
            valid_BxQ = padding_mask(lengths, q_len)
            out_BxQxF = jnp.where(valid_BxQ[..., None], out_BxQxF, jnp.zeros((), out_BxQxF.dtype))

        outputs: tuple[Any, ...] = (out_BxQxF,)
        if cache is not None:
            outputs += (cache,)
        if return_weights:
            outputs += (weights,)
        if return_kv:
            outputs += (projected_kv,)
        return outputs[0] if len(outputs) == 1 else outputs

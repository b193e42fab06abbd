r"""Positional information: one-hot, learned, sinusoidal, rotary (RoPE) and ALiBi.

Attention without positions is permutation-equivariant (Bishop §12.1.9 and Ex. 12.7; J&M §9.7.3:
"scramble the order of the inputs … exactly the same answer"); the encodings below break that
symmetry.

Layouts: ``"interleaved"`` pairs feature ``2i`` with ``2i+1`` (MEDL (7.29), Bishop (12.25), Vaswani;
RoPE of the original RoFormer and Meta's Llama code); ``"halves"`` pairs ``i`` with ``i + D/2``
(tensor2tensor's ``[sin | cos]``; RoPE of GPT-NeoX and Hugging Face Llama). Both use
``ω_i = base^{-2i/D}``, ``i = 0..D/2-1``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax._checks import check_integer, check_positive_int, check_range, check_rank
from seqjax.nn.dense import Dense
from seqjax.nn.embedding import embedding_lookup
from seqjax.nn.masks import _check_offset, _check_sizes, _key_and_query_positions

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = ["one_hot_positions", "LearnedPositionalEmbedding", "sinusoidal_positions",
           "SinusoidalPositionalEmbedding", "rope_frequencies", "apply_rope", "alibi_slopes",
           "alibi_bias"]

_LAYOUTS = ("interleaved", "halves")


def _check_choice(value: str, name: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}; got {value!r}.")


def _check_even(dim: int, name: str) -> None:
    if not isinstance(dim, (int, np.integer)) or dim <= 0 or dim % 2:
        raise ValueError(f"`{name}` must be a positive even int; got {dim!r}.")


def _positions_BxT(positions: Any, batch: int, length: int,
                   num_positions: int | None = None) -> Array:
    """Default ``arange(T)`` or a validated ``[T]`` / ``[B, T]`` positions array, as ``[B, T]``;
    with ``num_positions``, integers in ``[0, num_positions)`` (where concrete)."""
    if positions is None:
        positions = jnp.arange(length, dtype=jnp.int32)
    else:
        positions = jnp.asarray(positions)
        check_rank(positions, "positions", (1, 2))
        if positions.shape[-1] != length:
            raise ValueError(f"`positions` must have {length} positions on its last axis (the "
                             f"time axis of the input); got shape {positions.shape}.")
        if positions.ndim == 2 and positions.shape[0] not in (1, batch):
            raise ValueError(f"`positions` must have batch size 1 or {batch}; got shape "
                             f"{positions.shape}.")
    pos_BxT = jnp.broadcast_to(positions, (batch, length))
    if num_positions is not None:
        check_integer(pos_BxT, "positions")
        check_range(pos_BxT, "positions", 0, num_positions - 1)
    return pos_BxT


def one_hot_positions(x_BxTxP: Any, num_positions: int | None = None,
                      positions: Any = None) -> Array:
    r"""Concatenate a one-hot position code: ``x̃_t = [x_t ; e_t]``.

    MEDL §7.5 (first option; the book calls it wasteful since ``p̃ = p + T``). Positions are 0-based
    (the book's ``t = 1`` is index 0).

    Args:
        x_BxTxP: inputs ``[B, T, P]``.
        num_positions: length of ``e_t`` (≥ the largest position + 1; default ``T``).
        positions: optional ``int[T]`` or ``int[B, T]`` (default ``arange(T)``).

    Returns:
        ``[B, T, P + num_positions]`` in the dtype of ``x``.

    Example (MEDL §7.5, p = 2, T = 4):
        >>> x = jnp.tile(jnp.array([0.2, -1.3]), (1, 4, 1))
        >>> one_hot_positions(x)[0, 0]
        Array([ 0.2, -1.3,  1. ,  0. ,  0. ,  0. ], dtype=float32)
    """
    x = jnp.asarray(x_BxTxP)
    check_rank(x, "x", 3)
    b, t, _ = x.shape
    num_positions = t if num_positions is None else num_positions
    check_positive_int(num_positions, "num_positions")
    return _one_hot_concat(x, _positions_BxT(positions, b, t, num_positions), num_positions)


@partial(jax.jit, static_argnums=2)
def _one_hot_concat(x: Array, pos_BxT: Array, num_positions: int) -> Array:
    return jnp.concatenate([x, jax.nn.one_hot(pos_BxT, num_positions, dtype=x.dtype)], axis=-1)


class LearnedPositionalEmbedding(nn.Module):
    r"""Learned absolute positions, one trained vector per position.

    ``form="add"`` (default; J&M §9.7.3, Fig. 9.20; BERT/GPT-2): :math:`\tilde x_t = x_t + E_t`.
    ``form="mlp"`` (MEDL (7.28)), with ``W_3 e_t = E_t`` a column lookup:
    :math:`\tilde x_t = W_1\, S(W_2 x_t + W_3 e_t + b)`.

    Positions cannot extrapolate past ``num_positions`` (Bishop §12.1.9): a larger concrete position
    is a ``ValueError``.

    Parameters: ``embedding`` ``[num_positions, D]``; for ``form="mlp"`` also ``input``
    (``W_2ᵀ, b``: Dense ``P → D``) and ``output`` (``W_1ᵀ``: Dense ``D → D`` without bias).
    ``D = features`` (default: the input's ``P``).

    Example:
        >>> pe, x = LearnedPositionalEmbedding(num_positions=16), jnp.zeros((2, 5, 8))
        >>> pe.apply(pe.init(jax.random.PRNGKey(0), x), x).shape
        (2, 5, 8)

    Attributes:
        num_positions: maximum sequence length (positions ``0..num_positions-1``).
        features: embedding size ``p̃``; must equal ``P`` for ``form="add"``.
        activation: ``S`` for ``form="mlp"`` (ReLU, as MEDL suggests).
    """

    num_positions: int
    features: int | None = None
    form: str = "add"
    activation: Callable[[Array], Array] = nn.relu
    embedding_init: Initializer = nn.initializers.normal(stddev=0.02)
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x_BxTxP: Array, positions: Any = None) -> Array:
        """``[B, T, P] -> [B, T, D]``; ``positions``: ``int[T]`` / ``int[B, T]`` (or arange)."""
        _check_choice(self.form, "form", ("add", "mlp"))
        check_positive_int(self.num_positions, "num_positions")
        check_rank(x_BxTxP, "x", 3)
        b, t, p = x_BxTxP.shape
        d = p if self.features is None else self.features
        if self.form == "add" and d != p:
            raise ValueError(f"`features` must equal the input size {p} for form='add'; got {d}.")
        if positions is None and t > self.num_positions:
            raise ValueError(f"sequence length {t} exceeds `num_positions`={self.num_positions}.")
        pos_BxT = _positions_BxT(positions, b, t, self.num_positions)
        table = self.param("embedding", self.embedding_init, (self.num_positions, d),
                           self.param_dtype)
        # The table as given (a bf16 copy under mixed precision), not the declared storage
        # dtype: promoting with param_dtype would lift a bf16 model back to float32.
        dtype = self.dtype or jnp.result_type(x_BxTxP.dtype, table.dtype)
        e_BxTxD = embedding_lookup(table, pos_BxT).astype(dtype)
        if self.form == "add":
            return x_BxTxP.astype(dtype) + e_BxTxD
        dense = partial(Dense, d, dtype=self.dtype, param_dtype=self.param_dtype)
        h = self.activation(dense(name="input")(x_BxTxP) + e_BxTxD)
        return dense(use_bias=False, name="output")(h)


def sinusoidal_positions(num_positions: int, dim: int, base: float = 10000.0,
                         layout: str = "interleaved", start: int = 0,
                         dtype: Dtype = jnp.float32) -> Array:
    r"""Fixed sinusoidal encodings ``r_t ∈ ℝ^{dim}`` for ``t = start, …, start+num_positions-1``.

    .. math::
        r_{t,2i} = \sin(t\,\omega_i),\quad r_{t,2i+1} = \cos(t\,\omega_i),\qquad
        \omega_i = \mathrm{base}^{-2i/\mathrm{dim}},\ i = 0..\mathrm{dim}/2-1

    MEDL (7.29) (``M = base = 10⁴``, ``t = 1..T``: use ``start=1``); Bishop (12.25) (``L = base``;
    Fig. 12.10 uses ``L = 30``); LN (11); Vaswani et al. (``start=0``). Shift property
    (Bishop Ex. 12.10): ``r_{t+k} = M_k r_t`` with ``M_k`` block-diagonal of 2×2 rotations by
    ``kω_i``, independent of ``t``.

    Returns:
        ``[num_positions, dim]`` in ``dtype`` (computed in float32).

    Example:
        >>> sinusoidal_positions(1, 4).tolist()  # LN (11): f(0) = [0, 1, 0, 1]
        [[0.0, 1.0, 0.0, 1.0]]
    """
    _check_sizes(num_positions=num_positions)
    _check_even(dim, "dim")
    _check_choice(layout, "layout", _LAYOUTS)
    if not base > 0:
        raise ValueError(f"`base` must be positive; got {base!r}.")
    t = np.arange(num_positions, dtype=np.float64) + float(start)
    angles_TxF = t[:, None] * np.power(float(base), -np.arange(0, dim, 2) / dim)[None, :]
    return jnp.asarray(_sin_cos_layout(np.sin(angles_TxF), np.cos(angles_TxF), layout, np), dtype)


def _sin_cos_layout(sin: Any, cos: Any, layout: str, xp: Any) -> Any:
    """``[..., D/2]`` sines and cosines -> ``[..., D]`` in the given layout (numpy or jnp)."""
    if layout == "halves":
        return xp.concatenate([sin, cos], axis=-1)
    return xp.stack([sin, cos], axis=-1).reshape(*sin.shape[:-1], 2 * sin.shape[-1])


@partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _sinusoid_at(pos_BxT: Array, dim: int, base: float, layout: str, dtype: Dtype) -> Array:
    """Sinusoids at (possibly traced) positions: ``[B, T] -> [B, T, dim]``."""
    angles = pos_BxT.astype(jnp.float32)[..., None] * rope_frequencies(dim, base)
    return _sin_cos_layout(jnp.sin(angles), jnp.cos(angles), layout, jnp).astype(dtype)


class SinusoidalPositionalEmbedding(nn.Module):
    r"""Add (or concatenate) fixed sinusoidal positions; no parameters.

    ``mode="add"`` (MEDL (7.30); Bishop (12.24); Vaswani): ``x̃_t = x_t + r_t`` with ``dim = P``;
    ``mode="concat"`` (MEDL §7.5): ``x̃_t = [x_t ; r_t]`` with ``dim = features``. ``r_t`` is
    :func:`sinusoidal_positions` at ``positions`` (default ``start + arange(T)``), which may be
    traced, so decoding at an offset works under ``jit``. ``x`` is first multiplied by
    ``scale_input`` (default 1).

    Example:
        >>> pe = SinusoidalPositionalEmbedding()
        >>> pe.apply({}, jnp.zeros((1, 3, 4)))[0, 0].tolist()
        [0.0, 1.0, 0.0, 1.0]
    """

    base: float = 10000.0
    layout: str = "interleaved"
    start: int = 0
    mode: str = "add"
    features: int | None = None
    scale_input: float = 1.0

    @nn.compact
    def __call__(self, x_BxTxP: Array, positions: Any = None) -> Array:
        """``[B, T, P] -> [B, T, P]`` (add) or ``[B, T, P + features]`` (concat)."""
        check_rank(x_BxTxP, "x", 3)
        _check_choice(self.layout, "layout", _LAYOUTS)
        _check_choice(self.mode, "mode", ("add", "concat"))
        b, t, p = x_BxTxP.shape
        dim = p if self.mode == "add" else self.features
        if dim is None:
            raise ValueError("`features` (the encoding size) is required for mode='concat'.")
        _check_even(dim, "features" if self.mode == "concat" else "input size")
        pos_BxT = _positions_BxT(positions, b, t)
        if positions is None:
            pos_BxT = pos_BxT + self.start
        r = _sinusoid_at(pos_BxT, dim, float(self.base), self.layout, x_BxTxP.dtype)
        x = x_BxTxP * self.scale_input if self.scale_input != 1.0 else x_BxTxP
        return x + r if self.mode == "add" else jnp.concatenate([x, r], axis=-1)


def rope_frequencies(dim: int, base: float = 10000.0) -> Array:
    r"""``ω_i = base^{-2i/dim}`` for ``i = 0..dim/2-1`` (float32 ``[dim/2]``)."""
    _check_even(dim, "dim")
    return jnp.asarray(np.power(float(base), -np.arange(0, dim, 2, dtype=np.float64) / dim),
                       jnp.float32)


def apply_rope(x_BxTxHxD: Any, positions_BxT: Any = None, base: float = 10000.0,
               layout: str = "halves") -> Array:
    r"""Rotary position embedding: rotate feature pairs of ``x_t`` by ``t·ω_i``.

    .. math::
        \begin{pmatrix} y_a \\ y_b \end{pmatrix} =
        \begin{pmatrix} \cos t\omega_i & -\sin t\omega_i \\
                        \sin t\omega_i & \cos t\omega_i \end{pmatrix}
        \begin{pmatrix} x_a \\ x_b \end{pmatrix},\qquad \omega_i = \mathrm{base}^{-2i/D}

    with ``(a, b)`` the feature pairs of ``layout`` (module docstring; RoFormer, Su et al. 2021,
    eq. 34), ``"halves"`` by default so converted Hugging Face checkpoints match. Applied to queries
    and keys, ``⟨R_m q, R_n k⟩ = qᵀ R_{n-m} k`` depends only on ``n − m`` (slides, "RoPE"; cf.
    Bishop Ex. 12.10). Computed in float32.

    Args:
        x_BxTxHxD: ``[B, T, H, D]`` or ``[B, T, D]`` (``D`` even).
        positions_BxT: ``int[B, T]`` or ``int[T]`` (default ``arange(T)``); may be traced.
        base, layout: ``θ`` base (10 000 in RoFormer/Llama-2, 500 000 in Llama-3); pair layout.

    Returns:
        Array of ``x``'s shape and dtype.

    Example:
        >>> x = jnp.ones((1, 3, 2, 4))
        >>> y = apply_rope(x, jnp.arange(3)[None])
        >>> bool(jnp.allclose(y[:, 0], x[:, 0])), y.shape   # position 0: identity
        (True, (1, 3, 2, 4))
    """
    x = jnp.asarray(x_BxTxHxD)
    check_rank(x, "x", (3, 4))
    _check_choice(layout, "layout", _LAYOUTS)
    b, t, d = x.shape[0], x.shape[1], x.shape[-1]
    _check_even(d, "head dim (last axis of x)")
    return _rope(x, _positions_BxT(positions_BxT, b, t), float(base), layout)


@partial(jax.jit, static_argnums=(2, 3))
def _rope(x: Array, pos_BxT: Array, base: float, layout: str) -> Array:
    d = x.shape[-1]
    angles_BxTxF = pos_BxT.astype(jnp.float32)[..., None] * rope_frequencies(d, base)
    if x.ndim == 4:
        angles_BxTxF = angles_BxTxF[:, :, None, :]
    cos, sin = jnp.cos(angles_BxTxF), jnp.sin(angles_BxTxF)
    xf = x.astype(jnp.float32)
    if layout == "halves":
        x1, x2 = xf[..., : d // 2], xf[..., d // 2 :]
    else:
        pairs = xf.reshape(*xf.shape[:-1], d // 2, 2)
        x1, x2 = pairs[..., 0], pairs[..., 1]
    y = _sin_cos_layout(x1 * cos - x2 * sin, x2 * cos + x1 * sin, layout, jnp)
    return y.astype(x.dtype)


def alibi_slopes(num_heads: int) -> Array:
    r"""ALiBi head slopes ``m_h`` (Press et al. 2022), a geometric sequence.

    For ``H`` a power of two ``m_h = 2^{-8h/H}``, ``h = 1..H``; otherwise the ``2^⌊log₂H⌋`` slopes
    followed by every other slope of ``2·2^⌊log₂H⌋`` heads (the paper's reference code).

    Example:
        >>> [round(float(s), 4) for s in alibi_slopes(4)]
        [0.25, 0.0625, 0.0156, 0.0039]
    """
    check_positive_int(num_heads, "num_heads")

    def pow2(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    closest = 2 ** int(math.floor(math.log2(num_heads)))
    return jnp.asarray(pow2(closest) + pow2(2 * closest)[0::2][: num_heads - closest], jnp.float32)


def alibi_bias(num_heads: int, q_len: int, kv_len: int | None = None, *,
               offset: Any = None) -> Array:
    r"""ALiBi score bias ``b[h, i, j] = -m_h · |(i + offset) − j|``.

    Added to the scores ``qᵀk/√d`` before the softmax in place of position embeddings; for causal
    attention (``j ≤ i + offset``) this is the paper's ``m_h (j − i)``. ``offset`` (position of
    query 0 on the key axis) defaults to ``kv_len − q_len`` (the queries are the last ``q_len``
    keys, as when decoding); an ``int32[B]`` offset gives ``[B, H, Q, K]``.

    Returns:
        float32 ``[H, Q, K]`` (broadcasts against scores ``[B, H, Q, K]``).

    Example:
        >>> alibi_bias(1, 3)[0].tolist()
        [[-0.0, -0.00390625, -0.0078125], [-0.00390625, -0.0, -0.00390625], [-0.0078125, -0.00390625, -0.0]]
    """  # noqa: E501
    kv_len = q_len if kv_len is None else kv_len
    _check_sizes(q_len=q_len, kv_len=kv_len)
    offset = kv_len - q_len if offset is None else offset
    slopes_H = np.asarray(alibi_slopes(num_heads))
    if isinstance(offset, (int, np.integer)):
        dist_QxK = np.abs(np.arange(q_len)[:, None] + offset - np.arange(kv_len)[None, :])
        return jnp.asarray(-slopes_H[:, None, None] * dist_QxK[None], jnp.float32)
    return _alibi(jnp.asarray(slopes_H), q_len, kv_len, _check_offset(offset).astype(jnp.int32))


@partial(jax.jit, static_argnums=(1, 2))
def _alibi(slopes_H: Array, q_len: int, kv_len: int, offset: Array) -> Array:
    # |p_i − j| as [Q, K], or [B, 1, Q, K] for a per-row offset (the head axis broadcasts)
    k_pos, q_pos = _key_and_query_positions(q_len, kv_len, offset)
    return -slopes_H[:, None, None] * jnp.abs(q_pos - k_pos).astype(jnp.float32)

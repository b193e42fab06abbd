r"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs").

Softmax attention weighs ``v_j`` by ``exp(q_iᵀk_j/√d)``; linear attention uses
``sim(q, k) = φ(q)ᵀφ(k)``, ``φ(x) = elu(x) + 1 > 0``, so the sum over keys factorises:

.. math::
    y_i = \frac{\sum_j φ(q_i)ᵀφ(k_j)\, v_jᵀ}{\sum_j φ(q_i)ᵀφ(k_j)}
        = \frac{φ(q_i)ᵀ \big(\sum_j φ(k_j) v_jᵀ\big)}{φ(q_i)ᵀ \sum_j φ(k_j)}

The ``F×D_v`` bracket is computed once: ``O(N d²)`` instead of softmax's ``O(N²d)`` (Bishop
§12.1.8; the slides' complexity table). Causal, the sums run over ``j ≤ i``: an RNN with a
matrix-valued state (Katharopoulos et al. eqs. 16–20):

.. math::
    S_t = S_{t-1} + φ(k_t) v_tᵀ,\qquad z_t = z_{t-1} + φ(k_t),\qquad
    y_t = \frac{φ(q_t)ᵀ S_t}{φ(q_t)ᵀ z_t + ε}

Three equal causal forms (``implementation``): ``"parallel"``, ``cumsum`` of ``φ(k_t) v_tᵀ``
(``O(T·F·D_v)`` memory); ``"chunked"`` (training default), masked ``φ(Q)φ(K)ᵀ`` inside chunks
of ``C`` steps and the prefix state carried across (Katharopoulos et al. §3.3; Yang et al.
2023's "chunkwise parallel"; ``O(T·C + (T/C)·F·D_v)``); ``"recurrent"``, the RNN in
``lax.scan`` (:func:`linear_attention_step`: one token).

Shapes: q ``[B, Q, H, D]``, k ``[B, K, H, D]``, v ``[B, K, H, D_v]``; state ``S: [B, H, F,
D_v]``, ``z: [B, H, F]`` (``F``: ``φ``'s width, ``D`` for ``elu+1``). All sums in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import flax
import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import check_bool, check_lengths, check_positive_ints, check_rank, retired_flags
from seqjax.nn.dense import DenseGeneral
from seqjax.nn.masks import padding_mask

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]
FeatureMap = Callable[[Array], Array]
State = tuple[Array, Array]

__all__ = [
    "FEATURE_MAPS",
    "LinearAttention",
    "LinearAttentionCache",
    "elu_plus_one",
    "linear_attention",
    "linear_attention_step",
    "linear_attention_weights",
    "linear_attention_with_state",
]

IMPLEMENTATIONS = ("auto", "parallel", "chunked", "recurrent")


def elu_plus_one(x: Array) -> Array:
    r"""``φ(x) = elu(x) + 1`` (Katharopoulos et al. 2020, eq. 7): positive, smooth, ``φ(0) = 1``."""
    return jax.nn.elu(x) + 1.0


def relu_feature_map(x: Array) -> Array:
    """``φ(x) = max(x, 0)``; non-negative but can be all-zero (then ``y = 0`` thanks to ``ε``)."""
    return jax.nn.relu(x)


FEATURE_MAPS: dict[str, FeatureMap] = {"elu+1": elu_plus_one, "relu": relu_feature_map}


def _resolve_feature_map(feature_map: str | FeatureMap) -> FeatureMap:
    if callable(feature_map):
        return feature_map
    if feature_map not in FEATURE_MAPS:
        raise ValueError(
            f"`feature_map` must be one of {sorted(FEATURE_MAPS)} or a callable; "
            f"got {feature_map!r}."
        )
    return FEATURE_MAPS[feature_map]


def _features(feature_map: str | FeatureMap, *xs: Array) -> list[Array]:
    """``φ(x)`` of each ``x`` in float32 (the sums and the normaliser are float32 statistics)."""
    phi = _resolve_feature_map(feature_map)
    return [phi(x.astype(jnp.float32)).astype(jnp.float32) for x in xs]


def _check_implementation(implementation: str) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {IMPLEMENTATIONS}; got {implementation!r}."
        )


def _check_qkv(q: Array, k: Array, v: Array) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_rank(x, name, 4)
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"`k` must have shape [B, K, H, D] matching q's B, H, D = "
            f"({q.shape[0]}, {q.shape[2]}, {q.shape[3]}); got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}."
        )
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"`v` must have shape [B, K, H, D_v] with (B, K, H) = {tuple(k.shape[:3])} "
            f"as k; got {tuple(v.shape)}."
        )


def _f32_state(state: State, batch: int, heads: int, feat: int, dv: int, name: str) -> State:
    """``state = (S, z)`` checked against ``S: [B, H, F, D_v]``, ``z: [B, H, F]``, in float32."""
    s, z = state
    if tuple(s.shape) != (batch, heads, feat, dv) or tuple(z.shape) != (batch, heads, feat):
        raise ValueError(
            f"`{name}` must be (S: {(batch, heads, feat, dv)}, z: {(batch, heads, feat)}); "
            f"got (S: {tuple(s.shape)}, z: {tuple(z.shape)})."
        )
    return s.astype(jnp.float32), z.astype(jnp.float32)


def _normalise(num: Array, den: Array, eps: float) -> Array:
    return num / (den[..., None] + eps)


def _noncausal(pq, pk, v, state, eps):
    s0, z0 = state
    s_BxHxFxE = s0 + jnp.einsum("bkhf,bkhe->bhfe", pk, v)
    z_BxHxF = z0 + pk.sum(axis=1)
    num_BxQxHxE = jnp.einsum("bqhf,bhfe->bqhe", pq, s_BxHxFxE)
    den_BxQxH = jnp.einsum("bqhf,bhf->bqh", pq, z_BxHxF)
    return _normalise(num_BxQxHxE, den_BxQxH, eps), (s_BxHxFxE, z_BxHxF)


def _causal_parallel(pq, pk, v, state, eps):
    s0, z0 = state
    kv_BxTxHxFxE = pk[..., :, None] * v[..., None, :]
    s_BxTxHxFxE = jnp.cumsum(kv_BxTxHxFxE, axis=1) + s0[:, None]
    z_BxTxHxF = jnp.cumsum(pk, axis=1) + z0[:, None]
    num = jnp.einsum("bthf,bthfe->bthe", pq, s_BxTxHxFxE)
    den = jnp.einsum("bthf,bthf->bth", pq, z_BxTxHxF)
    return _normalise(num, den, eps), (s_BxTxHxFxE[:, -1], z_BxTxHxF[:, -1])


def _causal_chunked(pq, pk, v, state, eps, chunk_size):
    s0, z0 = state
    b, t, h, f = pq.shape
    e = v.shape[-1]
    c = min(chunk_size, t)
    n = -(-t // c)
    pad = n * c - t
    if pad:
        # Padded keys have φ(k) = 0, so they add nothing to any sum; padded queries are dropped.
        widths = ((0, 0), (0, pad), (0, 0), (0, 0))
        pq, pk, v = jnp.pad(pq, widths), jnp.pad(pk, widths), jnp.pad(v, widths)
    pq_BxNxCxHxF = pq.reshape(b, n, c, h, f)
    pk_BxNxCxHxF = pk.reshape(b, n, c, h, f)
    v_BxNxCxHxE = v.reshape(b, n, c, h, e)
    # Inter-chunk: exclusive prefix sums of the per-chunk states.
    kv_BxNxHxFxE = jnp.einsum("bnchf,bnche->bnhfe", pk_BxNxCxHxF, v_BxNxCxHxE)
    zc_BxNxHxF = pk_BxNxCxHxF.sum(axis=2)
    s_prev_BxNxHxFxE = jnp.cumsum(kv_BxNxHxFxE, axis=1) - kv_BxNxHxFxE + s0[:, None]
    z_prev_BxNxHxF = jnp.cumsum(zc_BxNxHxF, axis=1) - zc_BxNxHxF + z0[:, None]
    # Intra-chunk: masked φ(Q)φ(K)ᵀ on C×C blocks.
    a_BxNxHxCxC = jnp.einsum("bnchf,bndhf->bnhcd", pq_BxNxCxHxF, pk_BxNxCxHxF)
    a_BxNxHxCxC = jnp.where(jnp.tril(jnp.ones((c, c), jnp.bool_)), a_BxNxHxCxC, 0.0)
    num = jnp.einsum("bnhcd,bndhe->bnche", a_BxNxHxCxC, v_BxNxCxHxE)
    num = num + jnp.einsum("bnchf,bnhfe->bnche", pq_BxNxCxHxF, s_prev_BxNxHxFxE)
    den = jnp.swapaxes(a_BxNxHxCxC.sum(axis=-1), 2, 3)
    den = den + jnp.einsum("bnchf,bnhf->bnch", pq_BxNxCxHxF, z_prev_BxNxHxF)
    y_BxTxHxE = _normalise(num, den, eps).reshape(b, n * c, h, e)[:, :t]
    return y_BxTxHxE, (s_prev_BxNxHxFxE[:, -1] + kv_BxNxHxFxE[:, -1],
                       z_prev_BxNxHxF[:, -1] + zc_BxNxHxF[:, -1])


def _step(state: State, pq_BxHxF: Array, pk_BxHxF: Array, v_BxHxE: Array, eps: float):
    s, z = state
    s = s + pk_BxHxF[..., :, None] * v_BxHxE[..., None, :]
    z = z + pk_BxHxF
    num = jnp.einsum("bhf,bhfe->bhe", pq_BxHxF, s)
    den = jnp.einsum("bhf,bhf->bh", pq_BxHxF, z)
    return (s, z), _normalise(num, den, eps)


def _causal_recurrent(pq, pk, v, state, eps):
    xs = (jnp.swapaxes(pq, 0, 1), jnp.swapaxes(pk, 0, 1), jnp.swapaxes(v, 0, 1))
    final, y_TxBxHxE = jax.lax.scan(lambda carry, x_t: _step(carry, *x_t, eps), state, xs)
    return jnp.swapaxes(y_TxBxHxE, 0, 1), final


@retired_flags(return_state="linear_attention_with_state")
def linear_attention(
    q_BxQxHxD: Array,
    k_BxKxHxD: Array,
    v_BxKxHxE: Array,
    *,
    key_mask: Array | None = None,
    is_causal: bool = False,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
    implementation: str = "auto",
    chunk_size: int = 64,
    initial_state: State | None = None,
) -> Array:
    r"""Linear attention of already projected, per-head queries, keys and values.

    ``y_i = φ(q_i)ᵀ(S₀ + Σ_j φ(k_j)v_jᵀ) / (φ(q_i)ᵀ(z₀ + Σ_j φ(k_j)) + ε)``, over ``j ≤ i`` when
    causal; ``(S₀, z₀)`` (``initial_state``, zeros by default) summarises the keys before this
    call, which is how a decoding cache continues a sequence.

    Args:
        key_mask: optional ``bool[B, K]``, True = attend; masked keys add nothing to ``S``,
            ``z``. A query that sees no key gets ``y = 0`` (numerator 0, ``ε``).
        is_causal: sums over ``j ≤ i`` (needs ``Q == K``, else ValueError).
        feature_map: ``"elu+1"`` (default), ``"relu"`` or a callable ``[..., D] -> [..., F]``.
        eps: ``ε`` in the denominator.
        implementation: causal form, ``"parallel"``, ``"chunked"`` or ``"recurrent"``
            (``"auto"`` = ``"chunked"``); ignored when not causal.
        chunk_size: ``C`` for ``"chunked"`` (positive).
        initial_state: optional ``(S₀: f32[B, H, F, E], z₀: f32[B, H, F])``.

    Returns:
        ``y: [B, Q, H, E]`` in ``v``'s dtype (:func:`linear_attention_with_state` adds ``(S, z)``).

    Example:
        >>> import jax.numpy as jnp
        >>> q = k = v = jnp.ones((1, 5, 2, 4))
        >>> linear_attention(q, k, v, is_causal=True).shape
        (1, 5, 2, 4)
    """
    return linear_attention_with_state(
        q_BxQxHxD, k_BxKxHxD, v_BxKxHxE, key_mask=key_mask, is_causal=is_causal,
        feature_map=feature_map, eps=eps, implementation=implementation,
        chunk_size=chunk_size, initial_state=initial_state,
    )[0]


def linear_attention_with_state(
    q_BxQxHxD: Array,
    k_BxKxHxD: Array,
    v_BxKxHxE: Array,
    *,
    key_mask: Array | None = None,
    is_causal: bool = False,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
    implementation: str = "auto",
    chunk_size: int = 64,
    initial_state: State | None = None,
) -> tuple[Array, State]:
    r""":func:`linear_attention` (same arguments) and its final state ``(S, z)``.

    ``S = S₀ + Σ_j φ(k_j)v_jᵀ``, ``z = z₀ + Σ_j φ(k_j)`` over every unmasked key, so ``(S, z)``
    passed back as ``initial_state`` continues the sequence (by chunks, or
    :func:`linear_attention_step` by tokens).

    Returns:
        ``(y, (S: f32[B, H, F, E], z: f32[B, H, F]))``, ``y`` as :func:`linear_attention`'s.

    Example:
        >>> import jax.numpy as jnp
        >>> q = k = v = jnp.ones((1, 6, 2, 4))
        >>> y, state = linear_attention_with_state(q[:, :4], k[:, :4], v[:, :4], is_causal=True)
        >>> y2 = linear_attention(q[:, 4:], k[:, 4:], v[:, 4:], is_causal=True,
        ...                       initial_state=state)
        >>> bool(jnp.allclose(jnp.concatenate([y, y2], 1),
        ...                   linear_attention(q, k, v, is_causal=True)))
        True
    """
    _check_qkv(q_BxQxHxD, k_BxKxHxD, v_BxKxHxE)
    _check_implementation(implementation)
    check_positive_ints(chunk_size=chunk_size)
    b, qlen, h, _ = q_BxQxHxD.shape
    klen, e = k_BxKxHxD.shape[1], v_BxKxHxE.shape[-1]
    if is_causal and qlen != klen:
        raise ValueError(
            f"causal linear attention needs as many queries as keys; got q length {qlen}, "
            f"k length {klen}."
        )
    pq, pk = _features(feature_map, q_BxQxHxD, k_BxKxHxD)
    if pq.shape[:3] != q_BxQxHxD.shape[:3] or pk.shape[-1] != pq.shape[-1]:
        raise ValueError(
            f"`feature_map` must map [..., D] to [..., F] elementwise over the leading axes; "
            f"got {tuple(q_BxQxHxD.shape)} -> {tuple(pq.shape)}."
        )
    if key_mask is not None:
        check_bool(key_mask, "key_mask")
        if tuple(key_mask.shape) != (b, klen):
            raise ValueError(
                f"`key_mask` must have shape [B, K] = {(b, klen)}; got {tuple(key_mask.shape)}."
            )
        pk = jnp.where(key_mask[:, :, None, None], pk, 0.0)
    f = pq.shape[-1]
    if initial_state is None:
        initial_state = (jnp.zeros((b, h, f, e), jnp.float32), jnp.zeros((b, h, f), jnp.float32))
    state = _f32_state(initial_state, b, h, f, e, "initial_state")
    v32 = v_BxKxHxE.astype(jnp.float32)
    if not is_causal:
        y, final = _noncausal(pq, pk, v32, state, eps)
    elif implementation == "parallel":
        y, final = _causal_parallel(pq, pk, v32, state, eps)
    elif implementation == "recurrent":
        y, final = _causal_recurrent(pq, pk, v32, state, eps)
    else:
        y, final = _causal_chunked(pq, pk, v32, state, eps, chunk_size)
    return y.astype(v_BxKxHxE.dtype), final


def linear_attention_step(
    state: State,
    q_BxHxD: Array,
    k_BxHxD: Array,
    v_BxHxE: Array,
    *,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
    valid: Array | None = None,
) -> tuple[State, Array]:
    r"""One recurrent step: ``S ← S + φ(k)vᵀ``, ``z ← z + φ(k)``, ``y = φ(q)ᵀS / (φ(q)ᵀz + ε)``.

    Katharopoulos et al. (2020) eqs. 18–20; ``state = (S: f32[B, H, F, E], z: f32[B, H, F])``.
    Rows where the optional ``valid: bool[B]`` is False keep their state. Returns ``(state, y)``.

    Example:
        >>> import jax.numpy as jnp
        >>> state = (jnp.zeros((1, 2, 4, 3)), jnp.zeros((1, 2, 4)))
        >>> state, y = linear_attention_step(state, jnp.ones((1, 2, 4)), jnp.ones((1, 2, 4)),
        ...                                  jnp.ones((1, 2, 3)))
        >>> y.shape
        (1, 2, 3)
    """
    check_rank(q_BxHxD, "q", 3)
    pq, pk = _features(feature_map, q_BxHxD, k_BxHxD)
    b, h, f = pq.shape
    state = _f32_state(state, b, h, f, v_BxHxE.shape[-1], "state")
    if valid is not None:
        pk = jnp.where(valid[:, None, None], pk, 0.0)
    new_state, y = _step(state, pq, pk, v_BxHxE.astype(jnp.float32), eps)
    return new_state, y.astype(v_BxHxE.dtype)


def linear_attention_weights(
    q_BxQxHxD: Array,
    k_BxKxHxD: Array,
    *,
    key_mask: Array | None = None,
    is_causal: bool = False,
    feature_map: str | FeatureMap = "elu+1",
    eps: float = 1e-6,
) -> Array:
    r"""The implicit attention matrix ``A_ij = φ(q_i)ᵀφ(k_j) / (Σ_{j'} φ(q_i)ᵀφ(k_{j'}) + ε)``.

    ``O(Q·K)``: for inspection only (``y = A V`` equals :func:`linear_attention`).
    Returns ``f32[B, H, Q, K]``; masked (and, if causal, future) keys get weight 0.

    Example:
        >>> import jax.numpy as jnp
        >>> w = linear_attention_weights(jnp.ones((1, 3, 1, 2)), jnp.ones((1, 3, 1, 2)),
        ...                              is_causal=True)
        >>> [round(float(x), 3) for x in w[0, 0, 2]]
        [0.333, 0.333, 0.333]
    """
    pq, pk = _features(feature_map, q_BxQxHxD, k_BxKxHxD)
    a_BxHxQxK = jnp.einsum("bqhf,bkhf->bhqk", pq, pk)
    if key_mask is not None:
        a_BxHxQxK = jnp.where(key_mask[:, None, None, :], a_BxHxQxK, 0.0)
    if is_causal:
        a_BxHxQxK = jnp.where(jnp.tril(jnp.ones(a_BxHxQxK.shape[-2:], jnp.bool_)), a_BxHxQxK, 0.0)
    return a_BxHxQxK / (a_BxHxQxK.sum(axis=-1, keepdims=True) + eps)


@flax.struct.dataclass
class LinearAttentionCache:
    """Decoding state of :class:`LinearAttention`: a constant-size summary of the prefix.

    * ``s_BxHxFxE``: ``S = Σ_{j<t} φ(k_j) v_jᵀ`` (float32);
    * ``z_BxHxF``: ``z = Σ_{j<t} φ(k_j)`` (float32);
    * ``lengths_B``: int32, tokens already folded into the state per row.
    """

    s_BxHxFxE: Array
    z_BxHxF: Array
    lengths_B: Array

    if TYPE_CHECKING:
        # flax.struct.dataclass adds it at runtime: dataclasses.replace(self, **changes).
        def replace(self, **changes: Any) -> LinearAttentionCache: ...

    @classmethod
    def create(cls, batch: int, num_heads: int, feature_dim: int, value_dim: int,
               dtype: Dtype = jnp.float32) -> LinearAttentionCache:
        """An empty state (zeros) for ``batch`` rows."""
        return cls(
            s_BxHxFxE=jnp.zeros((batch, num_heads, feature_dim, value_dim), dtype),
            z_BxHxF=jnp.zeros((batch, num_heads, feature_dim), dtype),
            lengths_B=jnp.zeros((batch,), jnp.int32),
        )


def _padding(lengths: Array, name: str, batch: int, size: int) -> Array:
    """``bool[B, size]`` validity (:func:`~seqjax.nn.masks.padding_mask`) of checked ``lengths``."""
    return padding_mask(check_lengths(lengths, name, batch, size), size)


def _and(a: Array | None, b: Array | None) -> Array | None:
    if a is None:
        return b
    return a if b is None else a & b


def _key_valid_from_mask(mask: Array, batch: int, qlen: int, klen: int) -> tuple[Array, Array]:
    """``(key_valid_BxK, query_has_key_BxQ)`` of a ``bool[B, K]`` or ``bool[B|1, H|1, Q|1, K]``
    mask: a key is valid when some query may attend to it, a query kept when it may attend to
    some key (exact for padding and causal+padding masks; other patterns are not expressible)."""
    check_bool(mask, "mask")
    if mask.ndim == 2:
        if tuple(mask.shape) != (batch, klen):
            raise ValueError(
                f"`mask` of rank 2 must be [B, K] = {(batch, klen)}; got {tuple(mask.shape)}."
            )
        return mask, jnp.ones((batch, qlen), jnp.bool_)
    if mask.ndim != 4 or mask.shape[0] not in (1, batch) or mask.shape[2] not in (1, qlen) or (
        mask.shape[3] != klen
    ):
        raise ValueError(
            f"`mask` must be bool[B, K] = {(batch, klen)} or broadcastable bool[B, H, Q, K] "
            f"with (B, Q, K) = {(batch, qlen, klen)}; got shape {tuple(mask.shape)}."
        )
    m_BxQxK = jnp.broadcast_to(mask.any(axis=1), (batch, qlen, klen))
    return m_BxQxK.any(axis=1), m_BxQxK.any(axis=2)


class LinearAttention(nn.Module):
    r"""Multi-head linear attention, a drop-in for :class:`~seqjax.nn.attention.MultiHeadAttention`.

    .. math::
        q_i = W^Q x_i,\ k_j = W^K x'_j,\ v_j = W^V x'_j \ \text{(per head)},\qquad
        \mathrm{out}_i = W^O\,\mathrm{concat}_h\Big[
            \frac{φ(q_i)ᵀ\sum_j φ(k_j) v_jᵀ}{φ(q_i)ᵀ\sum_j φ(k_j) + ε}\Big]

    (Katharopoulos et al. 2020, eqs. 4–6, with the heads and projections of Bishop
    (12.15)–(12.19), the factorised kernel replacing (12.15)'s ``softmax(Q_h K_hᵀ/√D)``). Sums
    over all keys, or ``j ≤ i`` with ``is_causal=True`` (causal forms: :func:`linear_attention`).

    Called as MultiHeadAttention -> ``out [B, Q, D']``; ``inputs_kv=None``: self-attention.

    * ``mask``: ``bool[B, K]`` key padding, or broadcastable ``bool[B, H, Q, K]`` reduced to key
      padding (exact for padding and causal+padding masks; other patterns are not expressible,
      so ask for causality with ``is_causal``). Queries that see no key get zero heads (output:
      the ``out`` bias, as MultiHeadAttention).
    * ``lengths``: ``int[B]`` real tokens of ``inputs_q`` (right padding): padded keys masked in
      self-attention, padded query rows output exact zeros, and in :meth:`decode` each row's
      state advances by its own length. ``kv_lengths``: cross-attention key padding.
    * ``bias`` must be None (no score matrix); ``positions``, ``kv_positions`` are ignored.

    :meth:`with_weights` (same arguments) -> ``(out, weights f32[B, H, Q, K])``, the implicit
    weights (:func:`linear_attention_weights`). :meth:`decode` -> ``(out, new_cache)``,
    MultiHeadAttention's method
    (so a :class:`~seqjax.nn.TransformerBlock` decodes with either), folds the ``Q`` new tokens
    causally into the :class:`LinearAttentionCache` from :meth:`init_cache` (one token: the
    recurrent step; more: ``implementation``).

    Parameters (MultiHeadAttention's names): ``query``, ``key``, ``value`` with ``kernel: [D, H,
    Dh]``, ``bias: [H, Dh]``; ``out`` with ``kernel: [H, Dh, D']``, ``bias: [D']``:
    ``3(D·H·Dh + H·Dh) + H·Dh·D' + D'`` (no biases: ``3·D·H·Dh + H·Dh·D'``; ``4D²`` when ``H·Dh =
    D' = D``, as softmax MHA).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> attn = LinearAttention(num_heads=2)
        >>> x = jnp.ones((1, 6, 8)); params = attn.init(jax.random.PRNGKey(0), x)
        >>> y = attn.apply(params, x, is_causal=True)
        >>> cache = attn.apply(params, 1, 6, method="init_cache")
        >>> y1, cache = attn.apply(params, x[:, :1], cache, method="decode")
        >>> bool(jnp.allclose(y1, y[:, :1], atol=1e-5)), y.shape
        (True, (1, 6, 8))

    Attributes:
        num_heads, head_dim: ``H``; ``Dh`` (default ``D // H``).
        out_features: ``D'``; default the query width ``D``.
        use_bias: biases on the four projections.
        feature_map, eps, implementation, chunk_size: as :func:`linear_attention`'s.
        dropout_rate: dropout on the per-head outputs before ``out`` (no weight matrix to drop
            out from); only when ``deterministic=False``.
    """

    num_heads: int
    head_dim: int | None = None
    out_features: int | None = None
    use_bias: bool = True
    feature_map: str | FeatureMap = "elu+1"
    eps: float = 1e-6
    implementation: str = "auto"
    chunk_size: int = 64
    dropout_rate: float = 0.0
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()

    def decode(
        self,
        inputs_q: Array,
        cache: LinearAttentionCache,
        *,
        mask: Array | None = None,
        bias: Array | None = None,
        positions: Array | None = None,
        lengths: Array | None = None,
    ) -> tuple[Array, LinearAttentionCache]:
        """Causal self-attention on the cache: ``(out [B, Q, D'], new_cache)``
        (:meth:`~seqjax.nn.attention.MultiHeadAttention.decode`'s contract)."""
        del positions  # no positional term in linear attention
        if not isinstance(cache, LinearAttentionCache):
            raise TypeError(
                f"`cache` must be a LinearAttentionCache (init_cache); got {type(cache).__name__}."
            )
        out, new_cache, _ = self._attend(inputs_q, None, mask=mask, bias=bias, lengths=lengths,
                                         cache=cache)
        assert new_cache is not None  # _attend returns one with a cache
        return out, new_cache

    def _dense(self, features: Any, axis: Any, name: str) -> DenseGeneral:
        return DenseGeneral(features, axis=axis, use_bias=self.use_bias, dtype=self.dtype,
                            param_dtype=self.param_dtype, kernel_init=self.kernel_init,
                            bias_init=self.bias_init, name=name)

    def _check_config(self, width: int) -> int:
        check_positive_ints(num_heads=self.num_heads)
        _check_implementation(self.implementation)
        if self.head_dim is not None:
            return self.head_dim
        if width % self.num_heads:
            raise ValueError(
                f"input width {width} must be divisible by `num_heads` ({self.num_heads}) "
                "when `head_dim` is not given."
            )
        return width // self.num_heads

    @retired_flags(return_weights="LinearAttention.with_weights", cache="LinearAttention.decode")
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array | None = None,
        *,
        mask: Array | None = None,
        bias: Array | None = None,
        is_causal: bool = False,
        positions: Array | None = None,
        kv_positions: Array | None = None,
        lengths: Array | None = None,
        kv_lengths: Array | None = None,
        deterministic: bool = True,
    ) -> Array:
        """``out [B, Q, D']`` (the class docstring)."""
        del positions, kv_positions  # no positional term in linear attention
        return self._attend(
            inputs_q, inputs_kv, mask=mask, bias=bias, is_causal=is_causal, lengths=lengths,
            kv_lengths=kv_lengths, deterministic=deterministic,
        )[0]

    def with_weights(
        self,
        inputs_q: Array,
        inputs_kv: Array | None = None,
        *,
        mask: Array | None = None,
        bias: Array | None = None,
        is_causal: bool = False,
        positions: Array | None = None,
        kv_positions: Array | None = None,
        lengths: Array | None = None,
        kv_lengths: Array | None = None,
        deterministic: bool = True,
    ) -> tuple[Array, Array]:
        """``(out [B, Q, D'], weights f32[B, H, Q, K])`` (:func:`linear_attention_weights`; zero
        rows for queries that see no key and for padded queries)."""
        del positions, kv_positions
        out, _, weights = self._attend(
            inputs_q, inputs_kv, mask=mask, bias=bias, is_causal=is_causal, lengths=lengths,
            kv_lengths=kv_lengths, deterministic=deterministic, return_weights=True,
        )
        assert weights is not None
        return out, weights

    @nn.compact
    def _attend(
        self, inputs_q: Array, inputs_kv: Array | None, *, mask: Array | None,
        bias: Array | None, lengths: Array | None, is_causal: bool = False,
        kv_lengths: Array | None = None, cache: LinearAttentionCache | None = None,
        deterministic: bool = True, return_weights: bool = False,
    ) -> tuple[Array, LinearAttentionCache | None, Array | None]:
        """``(out, new_cache | None, weights | None)``; the four projections are created here
        (:meth:`decode`: ``cache`` given, ``is_causal`` off as the cache makes it causal)."""
        self_attention = inputs_kv is None
        inputs_kv = _check_call(inputs_q, inputs_kv, bias=bias)
        batch, qlen, width = inputs_q.shape
        klen = inputs_kv.shape[1]
        dh = self._check_config(width)
        h = self.num_heads

        q_BxQxHxD = self._dense((h, dh), -1, "query")(inputs_q)
        k_BxKxHxD = self._dense((h, dh), -1, "key")(inputs_kv)
        v_BxKxHxD = self._dense((h, dh), -1, "value")(inputs_kv)

        key_valid_BxK, query_keep_BxQ = None, None
        if mask is not None:
            key_valid_BxK, query_keep_BxQ = _key_valid_from_mask(mask, batch, qlen, klen)
        query_valid_BxQ = None
        if lengths is not None:
            query_valid_BxQ = _padding(lengths, "lengths", batch, qlen)
            if self_attention:
                key_valid_BxK = _and(key_valid_BxK, query_valid_BxQ)
        if kv_lengths is not None:
            if self_attention:
                raise ValueError("`kv_lengths` is for cross-attention; use `lengths`.")
            key_valid_BxK = _and(key_valid_BxK, _padding(kv_lengths, "kv_lengths", batch, klen))
        kwargs: dict[str, Any] = dict(feature_map=self.feature_map, eps=self.eps)
        qkv = (q_BxQxHxD, k_BxKxHxD, v_BxKxHxD)
        form = dict(implementation=self.implementation, chunk_size=self.chunk_size, **kwargs)
        new_cache = None
        if cache is None:
            y_BxQxHxD = linear_attention(*qkv, key_mask=key_valid_BxK, is_causal=is_causal, **form)
        else:
            y_BxQxHxD, new_cache = _cached(cache, *qkv, key_valid_BxK, **form)
        if query_keep_BxQ is not None:
            y_BxQxHxD = jnp.where(query_keep_BxQ[:, :, None, None], y_BxQxHxD, 0.0)
        if self.dropout_rate > 0.0:
            y_BxQxHxD = nn.Dropout(self.dropout_rate)(y_BxQxHxD, deterministic=deterministic)
        out_features = width if self.out_features is None else self.out_features
        out = self._dense(out_features, (-2, -1), "out")(y_BxQxHxD)
        if query_valid_BxQ is not None:
            out = jnp.where(query_valid_BxQ[..., None], out, jnp.zeros((), out.dtype))

        weights = None
        if return_weights:
            weights = linear_attention_weights(q_BxQxHxD, k_BxKxHxD, key_mask=key_valid_BxK,
                                               is_causal=is_causal, **kwargs)
            keep_BxQ = _and(query_keep_BxQ, query_valid_BxQ)
            if keep_BxQ is not None:
                weights = jnp.where(keep_BxQ[:, None, :, None], weights, 0.0)
        return out, new_cache, weights

    def init_cache(
        self, batch: int, max_len: int | None = None, dtype: Dtype | None = None
    ) -> LinearAttentionCache:
        """An empty :class:`LinearAttentionCache` (``[B, H, F, Dh]``, float32 unless ``dtype``).

        ``max_len`` (shared decoding interface) is unused. ``head_dim`` None is read from the
        bound ``query`` kernel (call through ``apply(..., method=...)``; ValueError otherwise).
        """
        del max_len
        dh = self.head_dim
        if dh is None:
            params = self.variables.get("params", {}) if self.scope is not None else {}
            if "query" not in params:
                raise ValueError(
                    "`init_cache` needs `head_dim`: set it, or call through "
                    "`module.apply(variables, batch, max_len, method='init_cache')`."
                )
            dh = params["query"]["kernel"].shape[-1]
        phi = _resolve_feature_map(self.feature_map)
        feat = jax.eval_shape(phi, jax.ShapeDtypeStruct((dh,), jnp.float32)).shape[-1]
        return LinearAttentionCache.create(batch, self.num_heads, feat, dh, dtype or jnp.float32)


def _check_call(inputs_q: Array, inputs_kv: Array | None, *, bias: Any) -> Array:
    """Checked call arguments (ranks, batch, no ``bias``); returns the keys' inputs
    (``inputs_q`` for self-attention)."""
    check_rank(inputs_q, "inputs_q", 3)
    if bias is not None:
        raise ValueError(
            "`bias` must be None: linear attention never forms the score matrix that an "
            "additive bias would modify."
        )
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    check_rank(inputs_kv, "inputs_kv", 3)
    if inputs_kv.shape[0] != inputs_q.shape[0]:
        raise ValueError(
            f"`inputs_kv` must have batch {inputs_q.shape[0]}; got {tuple(inputs_kv.shape)}."
        )
    return inputs_kv


def _cached(cache: LinearAttentionCache, q_BxQxHxD: Array, k_BxKxHxD: Array,
            v_BxKxHxD: Array, key_valid_BxK: Array | None, *, implementation: Any,
            chunk_size: Any, **kwargs: Any) -> tuple[Array, LinearAttentionCache]:
    """Causal linear attention from the cache's ``(S, z)`` (one token: a recurrent step) and the
    cache advanced by this call's valid keys."""
    batch, qlen = q_BxQxHxD.shape[:2]
    state = (cache.s_BxHxFxE, cache.z_BxHxF)
    if qlen == 1:
        valid_B = None if key_valid_BxK is None else key_valid_BxK[:, 0]
        (s, z), y_BxHxD = linear_attention_step(
            state, q_BxQxHxD[:, 0], k_BxKxHxD[:, 0], v_BxKxHxD[:, 0], valid=valid_B, **kwargs)
        y_BxQxHxD = y_BxHxD[:, None]
    else:
        y_BxQxHxD, (s, z) = linear_attention_with_state(
            q_BxQxHxD, k_BxKxHxD, v_BxKxHxD, key_mask=key_valid_BxK, is_causal=True,
            implementation=implementation, chunk_size=chunk_size,
            initial_state=state, **kwargs,
        )
    added_B = (jnp.full((batch,), qlen, jnp.int32) if key_valid_BxK is None
               else key_valid_BxK.sum(axis=1).astype(jnp.int32))
    return y_BxQxHxD, cache.replace(
        s_BxHxFxE=s.astype(cache.s_BxHxFxE.dtype),
        z_BxHxF=z.astype(cache.z_BxHxF.dtype),
        lengths_B=cache.lengths_B + added_B,
    )

r"""Multi-head attention with GQA/MQA, QK-norm, RoPE, a sliding window and a KV cache.

``H_h = softmax((X_q W^{(q)}_h)(X_kv W^{(k)}_{g(h)})ᵀ/√d + M) X_kv W^{(v)}_{g(h)}``,
``Y = Concat[H_1, …, H_H] W^{(o)}``: Bishop (12.15)–(12.19), Alg. 12.2; J&M (9.47)–(9.48);
LN (10); MEDL (7.25)–(7.26). With one head and no output matrix (``num_heads=1``,
``output_projection=False``) it is MEDL (7.24)'s single-head self-attention
``u_t = Σ_τ α_τ W_v x_τ``, ``α ∝ exp s(W_q x_t, W_k x_τ)``. The attention itself is
:func:`~seqjax.nn.attention.dot_product_attention`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import (
    ValidLengths,
    bound_param_shape,
    check_bool,
    check_count_or_off,
    check_features,
    check_lengths,
    check_positive_int,
    check_rank,
    lengths_array,
    retired_flags,
)
from seqjax._traced_checks import poison_bad_lengths
from seqjax.nn.attention.checks import check_broadcast, check_kv_heads
from seqjax.nn.attention.dot_product import (
    dot_product_attention,
    dot_product_attention_with_weights,
)
from seqjax.nn.attention.kv_cache import KVCache
from seqjax.nn.dense import DenseGeneral
from seqjax.nn.masks import combine_masks, padding_mask
from seqjax.nn.positional import apply_rope

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = ["MultiHeadAttention"]

#: Cross-attention keys and values projected from ``inputs_kv``: ``(k [B, K, G, d],
#: v [B, K, G, Dv])`` (:meth:`MultiHeadAttention.decode_cross`).
ProjectedKV = tuple[Array, Array]


class Attended(NamedTuple):
    """What one attention pass can produce; each public method returns the part it declares
    (``None`` unless asked for: a ``KVCache``, ``f32[B, H, Q, K]`` weights, a ``ProjectedKV``)."""

    out: Array
    cache: Any = None
    weights: Any = None
    kv: Any = None


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
        H_h = \mathrm{softmax}\Big(\frac{Q_h K_h^\top}{\sqrt{d}} + M\Big) V_h,\quad
        Q_h = X_q W^{(q)}_h,\ K_h = X_{kv} W^{(k)}_{g(h)},\ V_h = X_{kv} W^{(v)}_{g(h)},\\
        Y = \mathrm{Concat}[H_1, \dots, H_H]\, W^{(o)} = \sum_h H_h W^{(o)}_h

    Citations in the module docstring. The sum form is MEDL (7.25)–(7.26) (``W_c^h`` = row
    block ``h`` of ``W^{(o)}``; Bishop Ex. 12.5); MEDL's heads have no projection biases:
    ``use_bias=False`` reproduces them (and its parameter count, MEDL (7.32)).

    Call ``mha(inputs_q, inputs_kv=None, *, ...) -> out [B, Q, F]`` (``F = out_features``,
    default ``D``; ``H·d`` without the output projection); every keyword defaults to off:

    * ``inputs_q [B, Q, D]``; ``inputs_kv [B, K, Dkv]`` (``None`` = self-attention);
    * ``mask``: bool broadcastable to ``[B, H, Q, K]``; ``bias``: added to the scores;
    * ``is_causal``: causal mask (self-attention; a ``window`` implies it); ``deterministic``:
      ``False`` enables dropout;
    * ``positions``: ``int[B, Q]`` RoPE positions of the queries (default ``arange(Q)``), shared
      by the keys in self-attention; ``kv_positions``: those of cross-attention keys;
    * ``lengths``: ``int[B]`` real tokens of ``inputs_q`` (right padding; in self-attention
      padded keys are masked); padded query rows output zeros; ``kv_lengths``: the same for
      ``inputs_kv`` (cross-attention key padding). A length outside ``[0, Q]`` (``[0, K]``) is
      a ``ValueError``, and under ``jit`` makes its row's output NaN (an error under
      ``seqjax.checked``).

    Other results have their own methods: :meth:`with_weights` (the attention weights),
    :meth:`decode` (on a :class:`KVCache`, :meth:`init_cache`) and :meth:`decode_cross`.

    Parameters (stable names; Flax ``MultiHeadDotProductAttention`` layout):
    ``query/kernel [D, H, d]``, ``key/kernel``, ``value/kernel [Dkv, G, d]``,
    ``out/kernel [H, d, D']`` (none without the output projection), each with a ``bias`` when
    ``use_bias``; ``query_norm/scale``, ``key_norm/scale [d]`` with ``qk_norm``.

    Example (cached decoding):
        >>> import jax
        >>> mha = MultiHeadAttention(num_heads=4, head_dim=8, use_rope=True)
        >>> x = jnp.ones((2, 5, 32))
        >>> params = mha.init(jax.random.PRNGKey(0), x, is_causal=True)
        >>> cache = mha.init_cache(batch=2, max_len=16)
        >>> y, cache = mha.apply(params, x, cache, method="decode")          # prefill 5 tokens
        >>> y1, cache = mha.apply(params, x[:, :1], cache, method="decode")  # one more step
        >>> y1.shape, cache.lengths.tolist()
        ((2, 1, 32), [6, 6])

    Attributes:
        num_heads: ``H``.
        head_dim: ``d`` per head (default ``D // H``).
        num_kv_heads: ``G`` key/value heads (default ``H``), dividing ``H``; ``G < H`` shares
            each among ``H/G`` query heads (GQA; ``G = 1`` is MQA).
        out_features: output size (default: ``D`` of ``inputs_q``).
        use_bias: biases on the four projections.
        dropout_rate: attention-weight dropout when ``deterministic=False`` (RNG ``dropout``).
        qk_norm: RMS norm with a learned gain over each head's ``q`` and ``k`` (before RoPE).
        use_rope: rotate ``q`` and ``k`` by position (:func:`~seqjax.nn.positional.apply_rope`);
            rope_base: its ``base``; rope_layout: ``"halves"`` or ``"interleaved"``.
        implementation: see :func:`dot_product_attention`.
        dtype: compute dtype; param_dtype: storage dtype.
        kernel_init, bias_init: initialisers of the projections.
        out_kernel_init: initialiser of ``out/kernel`` (``W^{(o)}``; default ``kernel_init``),
            e.g. GPT-2's ``N(0, (0.02/√(2L))²)`` for a residual branch.
        window: ``w``: causal local self-attention, position ``p`` sees keys ``p − w < j ≤ p``
            (Longformer/Mistral-style; the absolute position when decoding with a cache;
            :func:`~seqjax.nn.masks.sliding_window_mask`); ``0``: all keys.
        output_projection: apply ``W^{(o)}``; ``False`` returns the concatenated heads.
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
    window: int = 0
    output_projection: bool = True

    def _kv_heads(self) -> int:
        return check_kv_heads(check_positive_int(self.num_heads, "num_heads"), self.num_kv_heads)

    def _head_dim(self, features: int) -> int:
        if self.head_dim is not None:
            return check_positive_int(self.head_dim, "head_dim")
        if features % self.num_heads:
            raise ValueError(
                f"input size {features} is not divisible by num_heads={self.num_heads}; "
                f"set `head_dim` explicitly."
            )
        return features // self.num_heads

    def init_cache(self, batch: int, max_len: int, dtype: Dtype | None = None) -> KVCache:
        """An empty :class:`KVCache` for this layer (``[batch, max_len, G, d]``); needs
        ``head_dim`` set, or bound parameters to read ``d`` from
        (``mha.apply(params, batch, max_len, method="init_cache")``)."""
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
        return KVCache.create(batch, max_len, g, d, dtype or self.dtype or self.param_dtype)

    @retired_flags(return_weights="MultiHeadAttention.with_weights")
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
        deterministic: bool = True,
    ) -> Array:
        """Self-attention (``inputs_kv=None``) or cross-attention: ``out [B, Q, F]``."""
        return self._attend(inputs_q, inputs_kv, mask=mask, bias=bias, is_causal=is_causal,
                            positions=positions, kv_positions=kv_positions, lengths=lengths,
                            kv_lengths=kv_lengths, deterministic=deterministic).out

    def with_weights(
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
        deterministic: bool = True,
    ) -> tuple[Array, Array]:
        """As :meth:`__call__`, and the attention weights:
        ``(out [B, Q, F], weights f32[B, H, Q, K])``."""
        out, _, weights, _ = self._attend(
            inputs_q, inputs_kv, mask=mask, bias=bias, is_causal=is_causal, positions=positions,
            kv_positions=kv_positions, lengths=lengths, kv_lengths=kv_lengths,
            deterministic=deterministic, return_weights=True)
        return out, weights

    def decode(
        self,
        inputs_q: Array,
        cache: KVCache,
        *,
        mask: Any = None,
        bias: Any = None,
        positions: Any = None,
        lengths: Any = None,
    ) -> tuple[Array, KVCache]:
        """Causal self-attention of ``inputs_q`` on the cache: ``(out [B, Q, F], new_cache)``.

        The new keys/values go at each row's offset (``lengths`` real tokens per row, default
        ``Q``: prompts of different lengths prefill in one call); ``positions`` default to
        ``cache.lengths[:, None] + arange(Q)``; ``mask`` covers the cache's ``max_len`` keys.
        """
        if not isinstance(cache, KVCache):  # None would attend without a cache, non-causal
            raise TypeError(f"`cache` must be a KVCache (init_cache); got "
                            f"{type(cache).__name__}.")
        out, cache, _, _ = self._attend(inputs_q, None, mask=mask, bias=bias,
                                        positions=positions, lengths=lengths, cache=cache)
        return out, cache

    def decode_cross(
        self,
        inputs_q: Array,
        inputs_kv: Array,
        kv: ProjectedKV | None = None,
        *,
        mask: Any = None,
        kv_lengths: Any = None,
    ) -> tuple[Array, ProjectedKV]:
        """Cross-attention while decoding: ``(out [B, Q, F], kv)``, ``kv = (k [B, K, G, d],
        v [B, K, G, Dv])`` being ``inputs_kv`` projected (with ``qk_norm``): computed when ``kv``
        is ``None``, else reused from an earlier call on the same ``inputs_kv`` (the encoder
        output is fixed while the decoder runs, MEDL (7.33)), saving the projections."""
        out, _, _, kv = self._attend(inputs_q, inputs_kv, mask=mask, kv_lengths=kv_lengths,
                                     kv=kv, return_kv=True)
        return out, kv

    def _check_call(self, inputs_q: Any, inputs_kv: Any, mask: Any, lengths: Any,
                    kv_lengths: Any, cache: Any, kv: Any) -> tuple[Any, Any, Any]:
        """Every argument check of a call; returns the checked ``(lengths, kv_lengths, mask)``."""
        check_rank(inputs_q, "inputs_q", 3)
        b, q_len, features = inputs_q.shape
        self_attention = inputs_kv is None
        x_kv = inputs_q if self_attention else inputs_kv
        check_rank(x_kv, "inputs_kv", 3)
        if x_kv.shape[0] != b:
            raise ValueError(
                f"`inputs_kv` must have batch size {b} like `inputs_q`; got shape {x_kv.shape}."
            )
        if cache is not None:
            if not self_attention:
                raise ValueError(
                    "`cache` is for self-attention only; for cross-attention pass the encoder "
                    "output as `inputs_kv`, and reuse its projection with `decode_cross`."
                )
            if not isinstance(cache, KVCache):
                raise TypeError(f"`cache` must be a KVCache; got {type(cache).__name__}.")
            if cache.k.shape[0] != b:
                raise ValueError(
                    f"`cache` must hold batch size {b} like `inputs_q`; got a cache of shape "
                    f"{tuple(cache.k.shape)} (from init_cache(batch={cache.k.shape[0]}, ...))."
                )
        window = check_count_or_off(self.window, "window", "MultiHeadAttention",
                                    "no window, every key")
        if window and not self_attention:
            raise ValueError(
                "`window` (sliding-window attention) is for self-attention; got "
                "`inputs_kv` (cross-attention)."
            )
        if not self.output_projection and self.out_features is not None:
            raise ValueError(
                f"`out_features` ({self.out_features}) needs the output projection; got "
                "output_projection=False (the output is the concatenated heads, H·d wide)."
            )
        if self.rope_layout not in ("halves", "interleaved"):
            raise ValueError(
                f"`rope_layout` must be 'halves' or 'interleaved'; got {self.rope_layout!r}."
            )
        check_features(inputs_q, "inputs_q", _in_features(self, "query"))
        if kv is None and not self_attention:
            check_features(x_kv, "inputs_kv", _in_features(self, "key"))
        g, d = self._kv_heads(), self._head_dim(features)
        if kv is not None:
            if self_attention:
                raise ValueError("`kv` is for cross-attention: pass `inputs_kv` as well.")
            k, v = kv
            want = (b, x_kv.shape[1], g, d)
            if tuple(k.shape) != want or tuple(v.shape[:3]) != want[:3]:
                raise ValueError(
                    f"`kv` must hold keys of shape {want} (and values [B, K, G, Dv]) for "
                    f"`inputs_kv` of shape {tuple(x_kv.shape)}; got "
                    f"{tuple(k.shape)} and {tuple(v.shape)}."
                )
        if lengths is not None:
            lengths = check_lengths(lengths, "lengths", b, q_len)
        if kv_lengths is not None:
            if self_attention:
                raise ValueError("`kv_lengths` is for cross-attention; use `lengths`.")
            kv_lengths = check_lengths(kv_lengths, "kv_lengths", b, x_kv.shape[1])
        if mask is not None:
            mask = jnp.asarray(mask)
            check_bool(mask, "mask")
            # Checked before it meets the masks built from lengths/kv_lengths/cache, so a
            # wrong shape is reported as `mask`'s, against the keys it must cover.
            keys = x_kv.shape[1] if cache is None else cache.k.shape[1]
            check_broadcast(mask, "mask", (b, self.num_heads, q_len, keys))
        return lengths, kv_lengths, mask

    @nn.compact
    def _attend(
        self, inputs_q: Array, inputs_kv: Array | None, *, mask: Any = None, bias: Any = None,
        is_causal: bool = False, positions: Any = None, kv_positions: Any = None,
        lengths: Any = None, kv_lengths: Any = None, cache: KVCache | None = None,
        deterministic: bool = True, return_weights: bool = False, kv: ProjectedKV | None = None,
        return_kv: bool = False,
    ) -> Attended:
        """Every public call: the checks (:meth:`_check_call`), the attention, then the
        traced-lengths policy."""
        # Lengths read here (not a checked ValidLengths from a layer above): under jit a
        # value outside [0, Q] / [0, K] makes its row's output NaN (seqjax._traced_checks).
        raw_q, raw_kv = (None if isinstance(n, ValidLengths) else n for n in (lengths, kv_lengths))
        lengths, kv_lengths, mask = self._check_call(
            inputs_q, inputs_kv, mask, lengths, kv_lengths, cache, kv
        )
        b, q_len, features = inputs_q.shape
        self_attention = inputs_kv is None
        x_kv = inputs_q if inputs_kv is None else inputs_kv
        h, g, d = self.num_heads, self._kv_heads(), self._head_dim(features)

        q_BxQxHxD = _dense(self, (h, d), -1, "query")(inputs_q)
        if kv is not None:  # cross-attention keys/values projected by an earlier call
            k_BxKxGxD, v_BxKxGxD = kv
        else:
            k_BxKxGxD = _dense(self, (g, d), -1, "key")(x_kv)
            v_BxKxGxD = _dense(self, (g, d), -1, "value")(x_kv)
        if self.qk_norm:
            norm = partial(_HeadRMSNorm, self.qk_norm_epsilon, self.param_dtype)
            q_BxQxHxD = norm(name="query_norm")(q_BxQxHxD)
            if kv is None:
                k_BxKxGxD = norm(name="key_norm")(k_BxKxGxD)

        if self.use_rope:
            if positions is None:
                start = cache.lengths[:, None] if cache is not None else 0
                positions = start + jnp.arange(q_len, dtype=jnp.int32)[None, :]
            q_BxQxHxD = apply_rope(q_BxQxHxD, positions, self.rope_base, self.rope_layout)
            if kv is None:
                kv_pos = positions if self_attention else kv_positions
                k_BxKxGxD = apply_rope(k_BxKxGxD, kv_pos, self.rope_base, self.rope_layout)
        projected_kv = (k_BxKxGxD, v_BxKxGxD)

        attn_mask, cache, k_BxKxGxD, v_BxKxGxD = _mask_and_cache(
            k_BxKxGxD, v_BxKxGxD, q_len=q_len, kv_len=x_kv.shape[1], mask=mask,
            lengths=lengths if self_attention or cache is not None else None,
            kv_lengths=kv_lengths, cache=cache, window=self.window)

        use_dropout = self.dropout_rate > 0.0 and not deterministic
        attend: Callable[..., Any] = (dot_product_attention_with_weights if return_weights
                                      else dot_product_attention)
        result = attend(
            q_BxQxHxD, k_BxKxGxD, v_BxKxGxD, mask=attn_mask, bias=bias, scale=self.scale,
            is_causal=is_causal and cache is None,
            window=self.window if cache is None else 0,  # with a cache: in attn_mask
            implementation=self.implementation,
            dropout_rate=self.dropout_rate if use_dropout else 0.0,
            dropout_rng=self.make_rng("dropout") if use_dropout else None)
        attn_BxQxHxD, weights = result if return_weights else (result, None)
        if self.output_projection:
            out_BxQxF = _dense(self, features if self.out_features is None else self.out_features,
                               (-2, -1), "out",
                               self.out_kernel_init or self.kernel_init)(attn_BxQxHxD)
        else:  # Concat[H_1, ..., H_H]: [B, Q, H·Dv]
            out_BxQxF = attn_BxQxHxD.reshape(b, q_len, -1)
        if lengths is not None:
            valid_BxQ = padding_mask(lengths, q_len)
            out_BxQxF = jnp.where(valid_BxQ[..., None], out_BxQxF, jnp.zeros((), out_BxQxF.dtype))
        out_BxQxF = poison_bad_lengths(out_BxQxF, raw_q, 0, q_len)
        if inputs_kv is not None:
            out_BxQxF = poison_bad_lengths(out_BxQxF, raw_kv, 0, inputs_kv.shape[1])
        return Attended(out_BxQxF, cache, weights, projected_kv if return_kv else None)


def _dense(layer: MultiHeadAttention, features: Any, axis: Any, name: str,
           kernel_init: Any = None) -> DenseGeneral:
    """Projection submodule ``name`` of ``layer``, with its bias switch, dtypes and initialisers."""
    return DenseGeneral(features=features, axis=axis, use_bias=layer.use_bias,
                        dtype=layer.dtype, param_dtype=layer.param_dtype,
                        kernel_init=kernel_init or layer.kernel_init,
                        bias_init=layer.bias_init, name=name)


def _mask_and_cache(
    k_BxKxGxD: Array, v_BxKxGxD: Array, *, q_len: int, kv_len: int, mask: Any,
    lengths: ValidLengths | None, kv_lengths: ValidLengths | None, cache: KVCache | None,
    window: int,
) -> tuple[Any, KVCache | None, Array, Array]:
    """The boolean mask of every head and the keys/values it applies to: with a ``cache``, the
    cache's mask (filled slots, causal, ``window``) and the cache updated at each row's
    ``lengths``; without, the queries' padding mask (self-attention); then and-ed with the
    ``kv_lengths`` padding mask and ``mask``."""
    attn_mask = None
    if cache is not None:
        attn_mask = cache.attention_mask(q_len, window=window)
        cache = cache.update(k_BxKxGxD, v_BxKxGxD, lengths_array(lengths))
        k_BxKxGxD, v_BxKxGxD = cache.k, cache.v
    elif lengths is not None:
        attn_mask = padding_mask(lengths, q_len)[:, None, None]
    if kv_lengths is not None:
        attn_mask = combine_masks(attn_mask, padding_mask(kv_lengths, kv_len)[:, None, None, :])
    attn_mask = combine_masks(attn_mask, None if mask is None else jnp.asarray(mask))
    return attn_mask, cache, k_BxKxGxD, v_BxKxGxD


def _in_features(layer: MultiHeadAttention, name: str) -> int | None:
    """Input size of the bound projection ``name`` (``None`` when unbound or initialising)."""
    shape = bound_param_shape(layer, name, "kernel")
    return None if shape is None else shape[0]

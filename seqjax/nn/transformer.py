r"""Transformer blocks and stacks: pre/post norm, LayerNorm/RMSNorm, MLP/GLU, cross-attention.

:class:`TransformerBlock` (the equations are there) is a residual stack of norm-wrapped sublayers on
a batch-major stream ``x_BxTxD``: causal or bidirectional self-attention, optional cross-attention
on an encoder output and a position-wise feed-forward layer. :class:`TransformerEncoder` and
:class:`TransformerDecoder` stack ``num_layers`` blocks, optionally as one ``nn.scan`` over layers
(one traced block, so compile time does not grow with depth; parameters stacked on a leading layer
axis) and with rematerialisation (``jax.checkpoint``) of each block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import check_positive_int, lengths_array
from seqjax.nn import _sharding
from seqjax.nn._block_config import BlockConfig, check_block
from seqjax.nn._transformer_checks import (
    BlockInputs,
    DecoderLayerCache,
    check_cache_given,
    run_checked,
)
from seqjax.nn.attention import MultiHeadAttention
from seqjax.nn.ffn import GLU, MLP
from seqjax.nn.masks import padding_mask
from seqjax.nn.remat import REMAT_POLICIES
from seqjax.nn.remat import remat_policy as resolve_remat_policy

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = [
    "REMAT_POLICIES",
    "BlockConfig",
    "DecoderLayerCache",
    "TransformerBlock",
    "TransformerDecoder",
    "TransformerEncoder",
]


class TransformerBlock(nn.Module):
    r"""One transformer block: self-attention, optional cross-attention, feed-forward.

    Post-norm (``norm="post"``; Vaswani et al. 2017, PyTorch's default), MEDL (7.31) + its step 4,
    J&M (9.40)–(9.41), Bishop (12.20)/(12.22):

    .. math::
        Z = \mathrm{N}_1\big(X + \mathrm{Drop}(\mathrm{SA}(X))\big),\quad
        [\,Z = \mathrm{N}_c\big(Z + \mathrm{Drop}(\mathrm{CA}(Z, E))\big)\,],\quad
        \tilde X = \mathrm{N}_2\big(Z + \mathrm{Drop}(\mathrm{FFN}(Z))\big)

    Pre-norm (``norm="pre"``, default; GPT-2, Llama, ViT), Bishop (12.21)/(12.23); it normalises the
    sublayer's *input*, as Xiong et al. 2020 and GPT-2 do (LN (17) and the slides print
    ``x + Norm(Sublayer(x))``), and a stack ends with a final norm:

    .. math::
        Z = X + \mathrm{Drop}(\mathrm{SA}(\mathrm{N}_1(X))),\quad
        [\,Z = Z + \mathrm{Drop}(\mathrm{CA}(\mathrm{N}_c(Z), E))\,],\quad
        \tilde X = Z + \mathrm{Drop}(\mathrm{FFN}(\mathrm{N}_2(Z)))

    ``SA`` is multi-head self-attention (causal with ``config.causal``), ``CA`` cross-attention on
    the encoder output ``E`` (the decoder block of MEDL Fig. 7.15b; Bishop §12.3.4), ``N`` LayerNorm
    or RMSNorm, ``FFN`` an :class:`~seqjax.nn.ffn.MLP` or :class:`~seqjax.nn.ffn.GLU`, ``Drop``
    residual dropout (Vaswani et al. §5.4; attention-weight dropout is inside ``SA``/``CA``).

    Parameters (stable names): ``self_attn`` (``query``, ``key``, ``value``, ``out``),
    ``self_attn_norm``, ``cross_attn``, ``cross_attn_norm`` (with ``cross_attention``), ``ffn``
    (``up``, ``down`` [, ``gate``]), ``ffn_norm`` (``scale`` [, ``bias``]). With
    ``attention_use_bias=False`` and ``activation="relu"`` the count is MEDL (7.32)'s
    ``4p + 2N₁p + N₁ + p + H(2mp + 2m_vp)``, plus ``H(2mp + 2m_vp) + 2p`` for the decoder block.

    Call ``block(x, *, mask, lengths, bias, encoder_out, encoder_mask, encoder_lengths, positions,``
    ``deterministic=True) -> [B, T, D]`` on ``x: [B, T, D]``, the keywords default ``None``:

    * ``mask``: bool self-attention mask, broadcastable to ``[B, H, T, K]`` (``K = T``, or the
      cache's ``max_len`` when decoding); combined with ``causal``;
    * ``lengths``: ``int32[B]`` real tokens per row (right padding): padded keys are masked; when
      decoding, each row's cache advances by its own length. A custom ``attention`` receives the
      plain ``int32[B]`` array;
    * ``bias``: additive self-attention score bias (e.g. ALiBi);
    * ``encoder_out``: ``[B, S, D_e]`` (required iff ``config.cross_attention``); ``encoder_mask``:
      ``bool[B, S]`` or broadcastable ``[B, H, T, S]``; ``encoder_lengths``: ``int32[B]``;
    * ``positions``: ``int32[B, T]`` RoPE positions (default ``arange`` or cache offsets).

    A length outside ``[0, T]`` (``[0, S]``) is a ``ValueError``; under ``jit`` it makes its row's
    output NaN (an error under ``seqjax.checked``). ``decode(x, cache, *, ...)`` (the same keywords
    but ``deterministic``) appends ``x`` to the cache of :meth:`init_cache` and returns
    ``(y, new_cache)``. The residual stream keeps the input's dtype promoted with ``dtype``: a
    float32 stream with ``dtype=bfloat16`` stays float32 (only the sublayers compute in bf16).

    Example:
        >>> block = TransformerBlock(BlockConfig.decoder(2, mlp_dim=32, cross_attention=False))
        >>> x = jnp.ones((2, 5, 16))
        >>> block.apply(block.init(jax.random.PRNGKey(0), x), x).shape
        (2, 5, 16)

    Attributes:
        config: the block's :class:`BlockConfig` (every option; validated when built).
    """

    config: BlockConfig

    def __post_init__(self) -> None:
        check_block(self.config, name="config", owner="TransformerBlock")
        super().__post_init__()

    def setup(self) -> None:
        cfg = self.cfg = self.config
        # MultiHeadAttention's own options; the cross-attention has no RoPE, window or GQA (its
        # keys are the encoder output's), a custom `attention` none of them
        mha: dict[str, Any] = dict(implementation=cfg.implementation, bias_init=cfg.bias_init,
                                   kernel_init=cfg.kernel_init, out_kernel_init=cfg.residual_init)
        self.self_attn = _attention(cfg, cfg.attention) if cfg.attention else _attention(
            cfg, num_kv_heads=cfg.num_kv_heads, qk_norm=cfg.qk_norm, use_rope=cfg.use_rope,
            rope_base=cfg.rope_base, window=cfg.window, **mha)
        self.self_attn_norm = cfg.make_norm()
        if cfg.cross_attention:
            self.cross_attn = _attention(cfg, **mha)
            self.cross_attn_norm = cfg.make_norm()
        ffn = dict(mlp_dim=cfg.mlp_dim, use_bias=cfg.use_bias, dropout_rate=cfg.ffn_dropout_rate,
                   dtype=cfg.dtype, param_dtype=cfg.param_dtype, kernel_init=cfg.kernel_init,
                   out_kernel_init=cfg.residual_init, bias_init=cfg.bias_init)
        self.ffn = (MLP(**ffn, activation=cfg.activation) if cfg.mlp == "mlp"
                    else GLU(**ffn, variant=cfg.mlp, multiple_of=cfg.multiple_of))
        self.ffn_norm = cfg.make_norm()
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def _sublayer(self, x: Array, norm: nn.Module, fn: Callable[[Array], tuple[Array, Any]],
                  deterministic: bool) -> tuple[Array, Any]:
        """One residual sublayer in the configured norm placement; ``fn`` returns
        ``(y, extra)`` and the sublayer ``(x, extra)``."""
        pre = self.cfg.norm == "pre"
        h = norm(x) if pre else x
        y, extra = fn(h)
        x = x + self.dropout(y, deterministic=deterministic)
        return (x if pre else norm(x)), extra

    def __call__(
        self,
        x: Array,
        *,
        mask: Any = None,
        lengths: Any = None,
        bias: Any = None,
        encoder_out: Array | None = None,
        encoder_mask: Any = None,
        encoder_lengths: Any = None,
        positions: Any = None,
        deterministic: bool = True,
    ) -> Array:
        inputs = BlockInputs(mask=mask, lengths=lengths, bias=bias, encoder_out=encoder_out,
                             encoder_mask=encoder_mask, encoder_lengths=encoder_lengths,
                             positions=positions, deterministic=deterministic)
        return run_checked(self, x, inputs, None)[0]

    def decode(
        self,
        x: Array,
        cache: Any,
        *,
        mask: Any = None,
        lengths: Any = None,
        bias: Any = None,
        encoder_out: Array | None = None,
        encoder_mask: Any = None,
        encoder_lengths: Any = None,
        positions: Any = None,
    ) -> tuple[Array, Any]:
        """``x [B, T, D]`` appended to the cache (:meth:`init_cache`): ``(y, new_cache)``."""
        check_cache_given(cache, "TransformerBlock")
        inputs = BlockInputs(mask=mask, lengths=lengths, bias=bias, encoder_out=encoder_out,
                             encoder_mask=encoder_mask, encoder_lengths=encoder_lengths,
                             positions=positions)
        return run_checked(self, x, inputs, cache)

    def _forward(self, x: Array, inputs: BlockInputs, cache: Any) -> tuple[Array, Any]:
        """The block on ``inputs`` checked by :func:`run_checked` (its own or its stack's;
        sublayers check shapes only): ``(x, new_cache)``, ``new_cache`` ``None`` without a
        cache."""
        cfg = self.cfg
        deterministic = inputs.deterministic
        cross_kv = None
        if isinstance(cache, DecoderLayerCache):
            cache, cross_kv = cache.self_attn, cache.cross_kv
        custom = not isinstance(self.self_attn, MultiHeadAttention)
        sa_kwargs = {key: value for key, value in dict(
            positions=inputs.positions, bias=inputs.bias,
            # a custom attention gets the int32[B] array
            lengths=lengths_array(inputs.lengths) if custom else inputs.lengths,
            mask=None if inputs.mask is None else jnp.asarray(inputs.mask),
        ).items() if value is not None}

        def self_attention(h: Array) -> tuple[Array, Any]:
            if cache is None:
                y = self.self_attn(h, is_causal=cfg.causal, deterministic=deterministic,
                                   **sa_kwargs)
                return y, None
            return self.self_attn.decode(h, cache, **sa_kwargs)

        x, new_cache = self._sublayer(x, self.self_attn_norm, self_attention, deterministic)
        if cfg.cross_attention:
            def cross_attention(h: Array) -> tuple[Array, Any]:
                kw = dict(mask=inputs.encoder_mask, kv_lengths=inputs.encoder_lengths)
                if cache is not None:  # decoding: project the encoder output once, then reuse it
                    return self.cross_attn.decode_cross(h, inputs.encoder_out, cross_kv, **kw)
                y = self.cross_attn(h, inputs.encoder_out, deterministic=deterministic, **kw)
                return y, None

            x, cross_kv = self._sublayer(x, self.cross_attn_norm, cross_attention, deterministic)
            if cache is not None:
                new_cache = DecoderLayerCache(new_cache, cross_kv)
        x, _ = self._sublayer(x, self.ffn_norm,
                              lambda h: (self.ffn(h, deterministic=deterministic), None),
                              deterministic)
        return x, new_cache

    def init_cache(self, batch: int, max_len: int, dtype: Dtype | None = None) -> Any:
        """The self-attention's empty cache (a :class:`~seqjax.nn.attention.KVCache` for the default
        attention), with ``cross_attention`` in a :class:`DecoderLayerCache` whose cross keys/values
        the first call fills. Needs bound parameters:
        ``block.apply(params, batch, max_len, method="init_cache")``."""
        cache = self.self_attn.init_cache(batch, max_len, dtype)
        return DecoderLayerCache(cache, None) if self.cfg.cross_attention else cache


def _attention(cfg: BlockConfig, factory: Callable[..., nn.Module] = MultiHeadAttention,
               **options: Any) -> Any:
    """A block's attention sublayer: ``factory`` with the options every attention receives."""
    return factory(num_heads=cfg.num_heads, head_dim=cfg.head_dim, use_bias=cfg.attention_bias,
                   dropout_rate=cfg.attention_dropout_rate, dtype=cfg.dtype,
                   param_dtype=cfg.param_dtype, **options)


class _TransformerStack(nn.Module, kw_only=True):
    """``num_layers`` identical blocks (no weight sharing, Bishop §12.1.7), scanned or unrolled."""

    config: BlockConfig
    num_layers: int
    scan_layers: bool = False
    remat: bool = False
    remat_policy: str | Callable[..., Any] | None = None
    final_norm: bool | None = None

    #: ``config.causal`` required by the stack (the decoder's True, the encoder's False).
    _causal: ClassVar[bool] = False

    def __post_init__(self) -> None:
        # the encoder: bidirectional, no encoder output; the decoder: causal, either
        check_block(self.config, causal=self._causal, cross_attention=None if self._causal
                    else False, name="config", owner=type(self).__name__)
        check_positive_int(self.num_layers, "num_layers")
        resolve_remat_policy(self.remat_policy)
        super().__post_init__()

    @nn.compact
    def _forward(self, x: Array, inputs: BlockInputs, cache: Any) -> tuple[Array, Any]:
        """The stack on checked ``inputs``: every block receives ``config`` and ``inputs`` whole
        (lengths as :class:`~seqjax._checks.ValidLengths`)."""
        cfg = self.config

        def body(block: TransformerBlock, x: Array, cache_l: Any,
                 inputs: BlockInputs) -> tuple[Array, Any]:
            # In a sharded step keep the residual stream split over the batch only (_sharding);
            # else GSPMD may carry an FSDP weight's split into it and reshuffle between layers.
            x = _sharding.constrain(x, _sharding.BATCH)
            return block._forward(x, inputs, cache_l)

        if self.remat:
            body = nn.remat(body, policy=resolve_remat_policy(self.remat_policy),
                            prevent_cse=not self.scan_layers)
        if self.scan_layers:
            scanned = nn.scan(body, variable_axes={"params": 0}, in_axes=(0, nn.broadcast),
                              split_rngs={"params": True, "dropout": True},
                              length=self.num_layers)
            x, new_cache = scanned(TransformerBlock(config=cfg, name="layers"), x, cache, inputs)
        else:
            new_caches = []
            for i in range(self.num_layers):
                block = TransformerBlock(config=cfg, name=f"layers_{i}")
                x, c = body(block, x, None if cache is None else cache[i], inputs)
                new_caches.append(c)
            new_cache = None if cache is None else new_caches
        use_final = cfg.norm == "pre" if self.final_norm is None else self.final_norm
        if use_final:
            x = cfg.make_norm(name="final_norm")(x)
        if inputs.lengths is not None:
            valid_BxT = padding_mask(inputs.lengths, x.shape[1])
            x = jnp.where(valid_BxT[..., None], x, jnp.zeros((), x.dtype))
        return x, new_cache


class TransformerEncoder(_TransformerStack):
    r"""A stack of ``num_layers`` bidirectional :class:`TransformerBlock` s (BERT/ViT encoder).

    .. math::
        Z^{(0)} = X,\qquad Z^{(l)} = \mathrm{Block}_l(Z^{(l-1)}),\qquad
        Z^\star = \mathrm{N}_f(Z^{(L)})\ \text{(pre-norm only)}

    MEDL §7.5 ("≥ 6 blocks in series", Fig. 7.15a); Bishop §12.1.7 (no weight sharing); J&M §9.7.
    Every block gets the same ``config`` (e.g. :meth:`BlockConfig.encoder`); a causal one or one
    with cross-attention is a ``ValueError`` (use :class:`TransformerDecoder`). The call's inputs
    are checked once here (the blocks receive the lengths as :class:`~seqjax._checks.ValidLengths`
    and check shapes only); under ``jit`` a length outside ``[0, T]`` makes its row's output NaN (an
    error under ``seqjax.checked``).

    Call ``encoder(x, *, mask=None, lengths=None, positions=None, deterministic=True) -> [B, T, D]``
    with ``x: [B, T, D]`` (embedded and positionally encoded) and ``lengths: int32[B]`` (right
    padding; outputs at padded positions are zero and do not influence the real ones).

    Parameters: ``layers_{i}`` (one block each) or, with ``scan_layers``, ``layers`` with every leaf
    stacked on a leading ``[num_layers]`` axis; ``final_norm`` when pre-norm.

    Example:
        >>> enc = TransformerEncoder(config=BlockConfig.encoder(2, mlp_dim=32), num_layers=2,
        ...                          scan_layers=True)
        >>> x = jnp.ones((2, 5, 16))
        >>> enc.apply(enc.init(jax.random.PRNGKey(0), x), x, lengths=jnp.array([5, 3])).shape
        (2, 5, 16)

    Attributes:
        config: the blocks' :class:`BlockConfig` (``causal`` and ``cross_attention`` False).
        num_layers: ``L`` (a positive int, else ``ValueError``).
        scan_layers: one ``nn.scan`` over layers (fast compile, stacked parameters).
        remat: rematerialise each block in the backward pass (``jax.checkpoint``).
        remat_policy: a name in :data:`REMAT_POLICIES` or a ``jax.checkpoint_policies`` callable
            (default: save nothing).
        final_norm: norm after the last block (default: with ``config.norm="pre"`` only).
    """

    def __call__(
        self,
        x: Array,
        *,
        mask: Any = None,
        lengths: Any = None,
        positions: Any = None,
        deterministic: bool = True,
    ) -> Array:
        inputs = BlockInputs(mask=mask, lengths=lengths, positions=positions,
                             deterministic=deterministic)
        return run_checked(self, x, inputs, None)[0]


class TransformerDecoder(_TransformerStack):
    r"""A stack of causal :class:`TransformerBlock` s, with cross-attention and a KV cache.

    .. math::
        Z^{(l)} = \mathrm{Block}_l(Z^{(l-1)}, Z^\star_{enc}),\qquad
        \text{output} = \mathrm{N}_f(Z^{(L)})\ \text{(pre-norm only)}

    The decoder of MEDL Fig. 7.15b (every block reads the same encoder output ``z*``; masked
    self-attention (7.27), cross-attention (7.33)) and Bishop §12.3.4; with
    ``config.cross_attention=False`` the decoder-only stack of GPT (Bishop §12.3.1; J&M §9.8).
    ``config`` must be causal (:meth:`BlockConfig.decoder`), else a ``ValueError`` naming
    ``config.causal``.

    Call ``decoder(x, *, mask=None, lengths=None, encoder_out=None, encoder_mask=None,``
    ``encoder_lengths=None, positions=None, deterministic=True) -> [B, T, D]``. Decoding:
    :meth:`init_cache`, then :meth:`decode` ``(x, cache, *, ...)`` (the call's keywords but
    ``deterministic``) returns ``(y, new_cache)``: prefill the (right padded) prompts with
    ``lengths=prompt_lengths``, then feed one or more tokens per step. The result equals one causal
    pass over the whole sequence.

    Example:
        >>> cfg = BlockConfig.decoder(2, mlp_dim=32, cross_attention=False)
        >>> dec = TransformerDecoder(config=cfg, num_layers=2)
        >>> x = jnp.ones((2, 6, 16))
        >>> params = dec.init(jax.random.PRNGKey(0), x)
        >>> cache = dec.apply(params, 2, 8, method="init_cache")
        >>> y, cache = dec.apply(params, x[:, :4], cache, lengths=jnp.array([4, 2]),
        ...                      method="decode")
        >>> y1, cache = dec.apply(params, x[:, 4:5], cache, method="decode")
        >>> y1.shape, cache[0].lengths.tolist()
        ((2, 1, 16), [5, 3])

    Attributes: as :class:`TransformerEncoder`, with ``config.causal`` True and
    ``config.cross_attention`` either.
    """

    _causal: ClassVar[bool] = True

    def __call__(
        self,
        x: Array,
        *,
        mask: Any = None,
        lengths: Any = None,
        encoder_out: Array | None = None,
        encoder_mask: Any = None,
        encoder_lengths: Any = None,
        positions: Any = None,
        deterministic: bool = True,
    ) -> Array:
        inputs = BlockInputs(mask=mask, lengths=lengths, encoder_out=encoder_out,
                             encoder_mask=encoder_mask, encoder_lengths=encoder_lengths,
                             positions=positions, deterministic=deterministic)
        return run_checked(self, x, inputs, None)[0]

    def decode(
        self,
        x: Array,
        cache: Any,
        *,
        mask: Any = None,
        lengths: Any = None,
        encoder_out: Array | None = None,
        encoder_mask: Any = None,
        encoder_lengths: Any = None,
        positions: Any = None,
    ) -> tuple[Array, Any]:
        """``x [B, T, D]`` appended to the per-layer caches (:meth:`init_cache`):
        ``(y, new_cache)``; ``lengths`` tokens of each row are written (default all ``T``)."""
        check_cache_given(cache, "TransformerDecoder")
        inputs = BlockInputs(mask=mask, lengths=lengths, encoder_out=encoder_out,
                             encoder_mask=encoder_mask, encoder_lengths=encoder_lengths,
                             positions=positions)
        return run_checked(self, x, inputs, cache)

    def init_cache(self, batch: int, max_len: int, dtype: Dtype | None = None) -> Any:
        """Empty per-layer caches: a list of ``num_layers`` caches, or with ``scan_layers`` one
        cache with a leading ``[num_layers]`` axis. Needs bound parameters (head sizes are read from
        them; else ``ValueError``):
        ``decoder.apply(params, batch, max_len, method="init_cache")``."""
        if self.scope is None or not self.has_variable(
            "params", "layers" if self.scan_layers else "layers_0"
        ):
            raise ValueError(
                "init_cache needs bound parameters: "
                "decoder.apply(params, batch, max_len, method='init_cache')."
            )
        params = self.variables["params"]
        block = TransformerBlock(config=self.config, parent=None)

        def layer_cache(layer_params: Any) -> Any:
            return block.apply(
                {"params": layer_params}, batch, max_len, dtype, method=TransformerBlock.init_cache
            )

        if self.scan_layers:
            one = layer_cache(jax.tree_util.tree_map(lambda a: a[0], params["layers"]))
            return jax.tree_util.tree_map(
                lambda a: jnp.broadcast_to(a[None], (self.num_layers, *a.shape)), one
            )
        return [layer_cache(params[f"layers_{i}"]) for i in range(self.num_layers)]

r"""Transformer blocks and stacks: pre/post norm, LayerNorm/RMSNorm, MLP/GLU, cross-attention.

A block is a residual stack of sublayers, each wrapped in a norm, on a
batch-major stream ``x_BxTxD``:

* **post-norm** (``norm="post"``; Vaswani et al. 2017, PyTorch's default):
  ``x ← Norm(x + Sublayer(x))`` — MEDL (7.31) and its FFN step, J&M (9.40)–(9.41),
  Bishop (12.20) and (12.22);
* **pre-norm** (``norm="pre"``, the default; GPT-2, Llama, ViT):
  ``x ← x + Sublayer(Norm(x))`` — Bishop (12.21) and (12.23); a stack then ends with
  a final norm. (LN (17) and the slides print ``x + Norm(Sublayer(x))``, which
  normalises the sublayer *output*; SEEDS_NOTES lists it as an erratum.)

The sublayers are causal or bidirectional self-attention, an optional
cross-attention on an encoder output (the decoder block of MEDL Fig. 7.15b) and a
position-wise feed-forward layer (:class:`~seqjax.nn.ffn.MLP` or a gated
:class:`~seqjax.nn.ffn.GLU`). Dropout acts on each sublayer's output before the
residual sum ("residual dropout", Vaswani et al. §5.4) and on the attention
weights.

:class:`TransformerEncoder` and :class:`TransformerDecoder` stack ``num_layers``
blocks, optionally as one ``nn.scan`` over layers (one traced block, so compile
time does not grow with depth; parameters stacked on a leading layer axis) and
with rematerialisation (``jax.checkpoint``) of each block.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import (
    bound_param_shape,
    check_bool,
    check_features,
    check_lengths,
    check_rank,
)
from seqjax.nn import _sharding
from seqjax.nn.attention import KVCache, MultiHeadAttention
from seqjax.nn.attention.checks import check_broadcast, check_positive_int
from seqjax.nn.attention.dot_product import IMPLEMENTATIONS
from seqjax.nn.ffn import GLU, GLU_VARIANTS, MLP, get_activation
from seqjax.nn.masks import combine_masks, padding_mask_checked
from seqjax.nn.norms import LayerNorm, RMSNorm
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

_NORMS = ("pre", "post")
_NORM_TYPES = ("layernorm", "rmsnorm")
_FFN_TYPES = ("mlp", *GLU_VARIANTS)
# BlockConfig fields that configure the default MultiHeadAttention only: a custom
# `attention` factory does not receive them, so they must keep their defaults with one.
_MHA_ONLY = ("num_kv_heads", "qk_norm", "use_rope", "rope_base", "window", "implementation")


def _check_optional_positive_int(value: Any, name: str) -> None:
    if value is not None:
        check_positive_int(value, name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockConfig:
    """Every option of a transformer block, validated once (Flax lm1b's ``TransformerConfig``).

    One frozen config is handed whole to :class:`TransformerBlock`,
    :class:`TransformerEncoder` and :class:`TransformerDecoder` (``config=``) and, by the
    models, down their stacks; each layer reads its options from it instead of a restated
    keyword list. ``__post_init__`` checks every field (a ``ValueError``/``TypeError``
    naming the field, what it must be and what it is), so a layer given a ``BlockConfig``
    trusts it. ``replace(**changes)`` returns a new (re-validated) config.

    Example:
        >>> cfg = BlockConfig(num_heads=2, mlp_dim=32, causal=True)
        >>> cfg.replace(norm="post").norm, cfg.attention_bias
        ('post', True)
        >>> BlockConfig(num_heads=2, norm="middle")
        Traceback (most recent call last):
        ...
        ValueError: `norm` must be one of ('pre', 'post'); got 'middle'.

    Attributes:
        num_heads: ``H``.
        mlp_dim: FFN hidden size (MEDL's ``N₁``); default ``4D`` for ``"mlp"`` and
            :func:`~seqjax.nn.ffn.glu_hidden_dim` ``(D, multiple_of)`` for GLUs.
        head_dim: per-head size ``m = m_v`` (default ``D // H``).
        num_kv_heads: GQA/MQA key-value heads, a divisor of ``num_heads`` (default MHA).
        norm: ``"pre"`` (default) or ``"post"``.
        norm_type: ``"layernorm"`` (default) or ``"rmsnorm"``.
        norm_epsilon: ``ε`` of the norms (default: LayerNorm 1e-5, RMSNorm 1e-6).
        norm_use_bias: learn LayerNorm's ``β`` (nanoGPT's ``bias=False`` drops it; RMSNorm
            has none).
        mlp: ``"mlp"`` or a GLU variant (``"swiglu"``, ``"geglu"``, ``"reglu"``, ``"glu"``,
            ``"bilinear"``).
        activation: MLP activation (``"gelu"`` exact, ``"gelu_tanh"``, ``"relu"``, …).
        multiple_of: rounding of the default GLU hidden size.
        causal: causal self-attention (decoder / language model).
        cross_attention: add the cross-attention sublayer.
        dropout_rate: residual dropout on every sublayer output.
        attention_dropout_rate: dropout on the attention weights.
        mlp_dropout_rate: dropout on the FFN hidden layer (default ``dropout_rate``,
            as ``torch.nn.TransformerEncoderLayer``).
        use_bias: biases in the FFN and (unless ``attention_use_bias``) the attention.
        attention_use_bias: biases on the attention projections (default ``use_bias``;
            MEDL's heads have none).
        qk_norm, use_rope, rope_base, implementation: passed to the default
            :class:`~seqjax.nn.attention.MultiHeadAttention` self-attention.
        window: sliding-window (local) causal self-attention of ``w`` keys, position ``i``
            attending to ``i-w+1 .. i`` (MultiHeadAttention's ``window``; ``None``: all);
            ``L`` such layers see ``L(w-1)+1`` positions back.
        attention: factory for the self-attention module, called with keywords
            ``num_heads, head_dim, use_bias, dropout_rate, dtype, param_dtype``; it must
            follow MultiHeadAttention's call signature (e.g.
            :class:`~seqjax.nn.linear_attention.LinearAttention`). Bind other options with
            ``functools.partial``: the fields of the default attention (``num_kv_heads``,
            ``qk_norm``, ``use_rope``, ``rope_base``, ``window``, ``implementation``) must
            keep their defaults. Default: MultiHeadAttention.
        dtype, param_dtype: compute and storage dtypes.
        kernel_init, bias_init: initialisers of the projection and FFN weights.
    """

    num_heads: int
    mlp_dim: int | None = None
    head_dim: int | None = None
    num_kv_heads: int | None = None
    norm: str = "pre"
    norm_type: str = "layernorm"
    norm_epsilon: float | None = None
    norm_use_bias: bool = True
    mlp: str = "mlp"
    activation: str | Callable[[Array], Array] = "gelu"
    multiple_of: int = 256
    causal: bool = False
    cross_attention: bool = False
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    mlp_dropout_rate: float | None = None
    use_bias: bool = True
    attention_use_bias: bool | None = None
    qk_norm: bool = False
    use_rope: bool = False
    rope_base: float = 10000.0
    window: int | None = None
    implementation: str = "auto"
    attention: Callable[..., nn.Module] | None = None
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()

    def __post_init__(self) -> None:
        if (
            isinstance(self.num_heads, bool)
            or not isinstance(self.num_heads, int)
            or self.num_heads <= 0
        ):
            raise ValueError(f"`num_heads` must be a positive int; got {self.num_heads!r}.")
        for field in ("mlp_dim", "head_dim", "window"):
            _check_optional_positive_int(getattr(self, field), field)
        check_positive_int(self.multiple_of, "multiple_of")
        g = self.num_kv_heads
        if g is not None and (
            isinstance(g, bool) or not isinstance(g, int) or g <= 0 or self.num_heads % g
        ):
            raise ValueError(
                f"`num_kv_heads` must be a positive divisor of num_heads={self.num_heads}; "
                f"got {g!r}."
            )
        for field, allowed in (
            ("norm", _NORMS),
            ("norm_type", _NORM_TYPES),
            ("mlp", _FFN_TYPES),
            ("implementation", IMPLEMENTATIONS),
        ):
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"`{field}` must be one of {allowed}; got {value!r}.")
        if self.mlp == "mlp":
            get_activation(self.activation)  # a ValueError naming `activation` if unknown
        if self.norm_epsilon is not None and not self.norm_epsilon > 0:
            raise ValueError(f"`norm_epsilon` must be > 0; got {self.norm_epsilon!r}.")
        for field in ("dropout_rate", "attention_dropout_rate", "mlp_dropout_rate"):
            rate = getattr(self, field)
            if rate is not None and not 0.0 <= rate < 1.0:
                raise ValueError(f"`{field}` must lie in [0, 1); got {rate}.")
        if self.attention is not None:
            defaults = {f.name: f.default for f in dataclasses.fields(BlockConfig)}
            changed = [k for k in _MHA_ONLY if getattr(self, k) != defaults[k]]
            if changed:
                raise ValueError(
                    f"{changed} configure the default MultiHeadAttention and are not passed to "
                    "a custom `attention` factory; bind them with functools.partial instead."
                )

    def replace(self, **changes: Any) -> BlockConfig:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def attention_bias(self) -> bool:
        """Biases on the attention projections: ``attention_use_bias``, else ``use_bias``."""
        return self.use_bias if self.attention_use_bias is None else self.attention_use_bias

    @property
    def ffn_dropout_rate(self) -> float:
        """Dropout on the FFN hidden layer: ``mlp_dropout_rate``, else ``dropout_rate``."""
        return self.dropout_rate if self.mlp_dropout_rate is None else self.mlp_dropout_rate

    def make_norm(self, name: str | None = None) -> nn.Module:
        """The configured norm (LayerNorm or RMSNorm) as a module."""
        kw: dict[str, Any] = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        if self.norm_epsilon is not None:
            kw["epsilon"] = self.norm_epsilon
        if self.norm_type == "layernorm":
            cls = LayerNorm
            kw["use_bias"] = self.norm_use_bias
        else:
            cls = RMSNorm
        return cls(**kw) if name is None else cls(**kw, name=name)


_BLOCK_FIELDS = tuple(f.name for f in dataclasses.fields(BlockConfig))


def _keyword_form() -> type[nn.Module]:
    """A Module base whose fields are :class:`BlockConfig`'s (same names and defaults;
    ``num_heads`` defaults to ``None``) plus ``config``: the keyword construction
    ``TransformerBlock(num_heads=2, causal=True)`` next to ``TransformerBlock(config=cfg)``,
    declared once, by the config."""
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": "_BlockOptions"}
    for f in dataclasses.fields(BlockConfig):
        required = f.default is dataclasses.MISSING
        annotations[f.name] = f"{f.type} | None" if required else f.type
        namespace[f.name] = None if required else f.default
    annotations["config"] = "BlockConfig | None"
    namespace["config"] = None
    namespace["__annotations__"] = annotations
    return type("_BlockOptions", (nn.Module,), namespace)


class _BlockModule(_keyword_form()):  # type: ignore[misc]
    """The block options of a module: ``config`` whole, or the keyword fields."""

    def block_config(self) -> BlockConfig:
        """``config`` when given (validated when it was built); else a :class:`BlockConfig`
        built — and so validated — from the keyword fields. Giving both is an error."""
        if self.config is None:
            return BlockConfig(**{n: getattr(self, n) for n in _BLOCK_FIELDS})
        if not isinstance(self.config, BlockConfig):
            raise TypeError(f"`config` must be a BlockConfig; got {type(self.config).__name__}.")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        given = [
            n
            for n in _BLOCK_FIELDS
            if getattr(self, n) is not defaults[n] and getattr(self, n) != defaults[n]
        ]
        if given:
            raise ValueError(
                f"give the block options in `config` or as keywords, not both; got `config` "
                f"and {given}."
            )
        return self.config


def _accepts_keyword(module: nn.Module, keyword: str) -> bool:
    """Whether ``module.__call__`` takes ``keyword`` (or ``**kwargs``)."""
    try:
        params = inspect.signature(type(module).__call__).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _key_mask(mask: Any, name: str) -> Array | None:
    """``bool[B, K]`` key validity -> ``bool[B, 1, 1, K]``; rank-4 masks pass through."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    check_rank(mask, name, (2, 4))
    return mask[:, None, None, :] if mask.ndim == 2 else mask


class DecoderLayerCache(NamedTuple):
    """Decoding state of a block with cross-attention: the self-attention cache and the
    encoder output's projected keys/values ``(k [B, S, G, d], v [B, S, G, Dv])`` — ``None``
    until the first call computes them; later calls reuse them (MEDL (7.33): the encoder
    output is fixed while the decoder runs)."""

    self_attn: Any
    cross_kv: Any = None


class TransformerBlock(_BlockModule):
    r"""One transformer block: self-attention, optional cross-attention, feed-forward.

    Post-norm (``norm="post"``), MEDL (7.31) + its step 4, J&M (9.40)–(9.41),
    Bishop (12.20)/(12.22):

    .. math::
        Z = \mathrm{N}_1\big(X + \mathrm{Drop}(\mathrm{SA}(X))\big),\quad
        [\,Z = \mathrm{N}_c\big(Z + \mathrm{Drop}(\mathrm{CA}(Z, E))\big)\,],\quad
        \tilde X = \mathrm{N}_2\big(Z + \mathrm{Drop}(\mathrm{FFN}(Z))\big)

    Pre-norm (``norm="pre"``, default), Bishop (12.21)/(12.23):

    .. math::
        Z = X + \mathrm{Drop}(\mathrm{SA}(\mathrm{N}_1(X))),\quad
        [\,Z = Z + \mathrm{Drop}(\mathrm{CA}(\mathrm{N}_c(Z), E))\,],\quad
        \tilde X = Z + \mathrm{Drop}(\mathrm{FFN}(\mathrm{N}_2(Z)))

    ``SA`` is multi-head self-attention (causal with ``causal=True``), ``CA``
    cross-attention with keys/values from the encoder output ``E`` (the decoder
    block of MEDL Fig. 7.15b, its 6 steps; Bishop §12.3.4), ``N`` LayerNorm or
    RMSNorm, ``FFN`` an :class:`~seqjax.nn.ffn.MLP` (ReLU/GELU) or a gated
    :class:`~seqjax.nn.ffn.GLU` (SwiGLU, GeGLU).

    Parameters (stable names): ``self_attn`` (``query``, ``key``, ``value``, ``out``),
    ``self_attn_norm``, ``cross_attn``, ``cross_attn_norm`` (with ``cross_attention``),
    ``ffn`` (``up``, ``down`` [, ``gate``]), ``ffn_norm`` (``scale`` [, ``bias``]).
    With ``attention_use_bias=False`` and ``activation="relu"`` the count is MEDL (7.32):
    ``4p + 2N₁p + N₁ + p + H(2mp + 2m_vp)`` (3,150,336 for p=512, N₁=2048, H=8,
    m=m_v=64), plus ``H(2mp + 2m_vp) + 2p`` for the decoder block (4,199,936).

    Call ``block(x, *, mask=None, lengths=None, bias=None, encoder_out=None,
    encoder_mask=None, encoder_lengths=None, positions=None, cache=None,
    deterministic=True)``:

    * ``x``: ``[B, T, D]``;
    * ``mask``: self-attention mask, bool broadcastable to ``[B, H, T, K]`` (``K = T``,
      or the cache's ``max_len`` when decoding); combined with ``causal``;
    * ``lengths``: ``int32[B]`` real tokens per row of ``x`` (right padding): padded keys
      are masked; when decoding, each row's cache advances by its own length (prompts of
      different lengths). A custom ``attention`` module without a ``lengths`` argument
      receives it as a ``bool[B, T]`` key mask instead;
    * ``bias``: additive self-attention score bias (e.g. ALiBi);
    * ``encoder_out``: ``[B, S, D_e]`` (required iff ``cross_attention``);
      ``encoder_mask``: ``bool[B, S]`` or broadcastable ``[B, H, T, S]``;
      ``encoder_lengths``: ``int32[B]``;
    * ``positions``: ``int32[B, T]`` RoPE positions (default ``arange`` or cache offsets);
    * ``cache``: the self-attention cache (:meth:`init_cache`): returns ``(x, new_cache)``.

    Returns ``[B, T, D]`` (or ``(x, new_cache)``). The residual stream keeps the input's
    dtype promoted with ``dtype``: a float32 stream with ``dtype=bfloat16`` stays float32
    (only the sublayers compute in bf16); a bf16 stream stays bf16.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> block = TransformerBlock(num_heads=2, mlp_dim=32, causal=True)
        >>> x = jnp.ones((2, 5, 16))
        >>> params = block.init(jax.random.PRNGKey(0), x)
        >>> block.apply(params, x).shape
        (2, 5, 16)

    Options: every :class:`BlockConfig` field, given whole as ``config=BlockConfig(...)``
    or as keyword fields of the block (``TransformerBlock(num_heads=2, causal=True)``,
    built into one validated ``BlockConfig`` by :meth:`block_config`); not both.

    Attributes:
        config: the block's :class:`BlockConfig` (``None``: the keyword fields).
        (every :class:`BlockConfig` field, as a keyword)
    """

    def setup(self) -> None:
        cfg = self.cfg = self.block_config()
        attn = dict(
            num_heads=cfg.num_heads,
            head_dim=cfg.head_dim,
            use_bias=cfg.attention_bias,
            dropout_rate=cfg.attention_dropout_rate,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
        )
        mha = dict(
            attn,
            kernel_init=cfg.kernel_init,
            bias_init=cfg.bias_init,
            implementation=cfg.implementation,
        )
        if cfg.attention is None:
            self.self_attn = MultiHeadAttention(
                **mha,
                num_kv_heads=cfg.num_kv_heads,
                qk_norm=cfg.qk_norm,
                use_rope=cfg.use_rope,
                rope_base=cfg.rope_base,
                window=cfg.window,
            )
        else:
            self.self_attn = cfg.attention(**attn)
        self.self_attn_norm = cfg.make_norm()
        if cfg.cross_attention:
            self.cross_attn = MultiHeadAttention(**mha)
            self.cross_attn_norm = cfg.make_norm()
        ffn = dict(
            hidden_dim=cfg.mlp_dim,
            use_bias=cfg.use_bias,
            dropout_rate=cfg.ffn_dropout_rate,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            kernel_init=cfg.kernel_init,
            bias_init=cfg.bias_init,
        )
        if cfg.mlp == "mlp":
            self.ffn = MLP(**ffn, activation=cfg.activation)
        else:
            self.ffn = GLU(**ffn, variant=cfg.mlp, multiple_of=cfg.multiple_of)
        self.ffn_norm = cfg.make_norm()
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def _sublayer(
        self, x: Array, norm: nn.Module, fn: Callable[[Array], Any], deterministic: bool
    ) -> tuple[Array, Any]:
        """One residual sublayer in the configured norm placement; ``fn`` may return extras."""
        pre = self.cfg.norm == "pre"
        h = norm(x) if pre else x
        out = fn(h)
        y, extra = out if isinstance(out, tuple) else (out, None)
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
        cache: Any = None,
        deterministic: bool = True,
    ) -> Any:
        check_rank(x, "x", 3)
        batch, length = x.shape[:2]
        width = bound_param_shape(self, "self_attn", "query", "kernel") or bound_param_shape(
            self, "self_attn_norm", "scale"
        )
        check_features(x, "x", None if width is None else width[0])
        _check_encoder_given(self.cfg, encoder_out)
        if lengths is not None:
            lengths = check_lengths(lengths, "lengths", batch, length)
        cross_kv = None
        if self.cfg.cross_attention:
            _check_layer_cache(cache, True)
            if isinstance(cache, DecoderLayerCache):
                cross_kv = cache.cross_kv
            check_rank(encoder_out, "encoder_out", 3)
            _check_encoder_batch(encoder_out, batch)
            if cross_kv is None:
                w_k = bound_param_shape(self, "cross_attn", "key", "kernel")
                check_features(encoder_out, "encoder_out", None if w_k is None else w_k[0])
            if encoder_lengths is not None:
                encoder_lengths = check_lengths(
                    encoder_lengths, "encoder_lengths", batch, encoder_out.shape[1]
                )
        elif isinstance(cache, DecoderLayerCache):
            raise ValueError("a DecoderLayerCache needs `cross_attention=True`.")
        return self._forward(
            x,
            mask=mask,
            lengths=lengths,
            bias=bias,
            encoder_out=encoder_out,
            encoder_mask=_key_mask(encoder_mask, "encoder_mask"),
            encoder_lengths=encoder_lengths,
            positions=positions,
            cache=cache,
            deterministic=deterministic,
            trusted=False,
        )

    def _forward(
        self,
        x: Array,
        *,
        mask: Any,
        lengths: Array | None,
        bias: Any,
        encoder_out: Array | None,
        encoder_mask: Array | None,
        encoder_lengths: Array | None,
        positions: Any,
        cache: Any,
        deterministic: bool,
        trusted: bool,
    ) -> Any:
        """The block on checked inputs (``lengths`` ``int32[B]``, ``encoder_mask`` rank 4).

        ``trusted``: the caller (a stack, so a model) also checked what the attention
        layers would (masks, caches, feature sizes), so the default attention runs
        without its argument checks (:meth:`MultiHeadAttention._attend`).
        """
        cfg = self.cfg
        length = x.shape[1]
        cross_kv = None
        if isinstance(cache, DecoderLayerCache):
            cache, cross_kv = cache.self_attn, cache.cross_kv
        sa_kwargs: dict[str, Any] = dict(is_causal=cfg.causal, deterministic=deterministic)
        if positions is not None:
            sa_kwargs["positions"] = positions
        if bias is not None:
            sa_kwargs["bias"] = bias
        if cache is not None:
            sa_kwargs["cache"] = cache
        sa_mask = None if mask is None else jnp.asarray(mask)
        if lengths is not None:
            if _accepts_keyword(self.self_attn, "lengths"):
                sa_kwargs["lengths"] = lengths
            elif sa_mask is None:
                sa_mask = padding_mask_checked(lengths, length)
            else:
                sa_mask = combine_masks(
                    sa_mask, padding_mask_checked(lengths, length)[:, None, None, :]
                )
        if sa_mask is not None:
            sa_kwargs["mask"] = sa_mask

        self_attn = _attention_call(self.self_attn, trusted)
        x, new_cache = self._sublayer(
            x, self.self_attn_norm, lambda h: self_attn(h, **sa_kwargs), deterministic
        )
        if cfg.cross_attention:
            ca_kwargs: dict[str, Any] = dict(
                mask=encoder_mask, kv_lengths=encoder_lengths, deterministic=deterministic
            )
            reuse = cache is not None and _accepts_keyword(self.cross_attn, "kv")
            if reuse:  # decoding: project the encoder output once, then reuse it
                ca_kwargs.update(kv=cross_kv, return_kv=True)
            cross_attn = _attention_call(self.cross_attn, trusted)
            x, cross_kv = self._sublayer(
                x,
                self.cross_attn_norm,
                lambda h: cross_attn(h, encoder_out, **ca_kwargs),
                deterministic,
            )
            if cache is not None:
                new_cache = DecoderLayerCache(new_cache, cross_kv if reuse else None)
        x, _ = self._sublayer(
            x, self.ffn_norm, lambda h: self.ffn(h, deterministic=deterministic), deterministic
        )
        return x if cache is None else (x, new_cache)

    def init_cache(self, batch: int, max_len: int, dtype: Dtype | None = None) -> Any:
        """The self-attention module's empty cache (a :class:`~seqjax.nn.attention.KVCache`
        for the default attention); with ``cross_attention`` a :class:`DecoderLayerCache`
        whose cross-attention keys/values are filled by the first call. Call with bound
        parameters: ``block.apply(params, batch, max_len, method="init_cache")``."""
        cache = self.self_attn.init_cache(batch, max_len, dtype)
        return DecoderLayerCache(cache, None) if self.cfg.cross_attention else cache


def _attention_call(module: nn.Module, trusted: bool) -> Callable[..., Any]:
    """The attention sublayer's entry: without argument checks for a trusted caller
    (the default attention's :meth:`~MultiHeadAttention._attend`), else its ``__call__``."""
    if trusted and isinstance(module, MultiHeadAttention):
        return module._attend
    return module


def _check_encoder_given(cfg: BlockConfig, encoder_out: Any) -> None:
    if cfg.cross_attention and encoder_out is None:
        raise ValueError("`encoder_out` is required when `cross_attention=True`.")
    if not cfg.cross_attention and encoder_out is not None:
        raise ValueError("`encoder_out` was given but the block has `cross_attention=False`.")


def _check_encoder_batch(encoder_out: Any, batch: int) -> None:
    if encoder_out.shape[0] != batch:
        raise ValueError(
            f"`encoder_out` must have batch size {batch} like `x`; got shape "
            f"{tuple(encoder_out.shape)}."
        )


def _check_layer_cache(cache: Any, cross_attention: bool) -> None:
    """A cross-attention block's cache must be a :class:`DecoderLayerCache`."""
    if cache is not None and cross_attention and not isinstance(cache, DecoderLayerCache):
        raise TypeError(
            "`cache` of a cross-attention block must be the DecoderLayerCache of "
            f"init_cache; got {type(cache).__name__}."
        )


class _TransformerStack(_BlockModule, kw_only=True):
    """``num_layers`` identical blocks (no weight sharing, Bishop §12.1.7), scanned or unrolled."""

    num_layers: int
    scan_layers: bool = False
    remat: bool = False
    remat_policy: str | Callable[..., Any] | None = None
    final_norm: bool | None = None

    def _layer_name(self, i: int) -> str:
        return "layers" if self.scan_layers else f"layers_{i}"

    def _layer_param_shape(self, *path: str) -> tuple[int, ...] | None:
        """Shape of one layer's parameter ``path`` (the layer axis of a scan dropped)."""
        shape = bound_param_shape(self, self._layer_name(0), *path)
        return shape[1:] if shape is not None and self.scan_layers else shape

    def _check_call(
        self,
        cfg: BlockConfig,
        x: Any,
        cache: Any,
        mask: Any,
        lengths: Any,
        encoder_out: Any,
        encoder_mask: Any,
        encoder_lengths: Any,
    ) -> tuple[Any, Any, Any]:
        """Every check of a stack's call, done once for all its layers (which then trust
        their inputs): returns ``(lengths, encoder_mask, encoder_lengths)`` checked."""
        check_rank(x, "x", 3)
        batch, length = x.shape[:2]
        width = self._layer_param_shape("self_attn", "query", "kernel") or self._layer_param_shape(
            "self_attn_norm", "scale"
        )
        check_features(x, "x", None if width is None else width[0])
        if not isinstance(self.num_layers, int) or self.num_layers <= 0:
            raise ValueError(f"`num_layers` must be a positive int; got {self.num_layers!r}.")
        resolve_remat_policy(self.remat_policy)
        if lengths is not None:
            lengths = check_lengths(lengths, "lengths", batch, length)
        layer_caches = self._check_cache(cfg, cache, batch)
        _check_encoder_given(cfg, encoder_out)
        custom = cfg.attention is not None
        if mask is not None and not custom:
            mask = jnp.asarray(mask)
            check_bool(mask, "mask")
            keys = length if cache is None else _cache_len(cache)
            check_broadcast(mask, "mask", (batch, cfg.num_heads, length, keys))
        if cfg.cross_attention:
            check_rank(encoder_out, "encoder_out", 3)
            _check_encoder_batch(encoder_out, batch)
            projected = any(c.cross_kv is not None for c in layer_caches)
            if not projected:
                w_k = self._layer_param_shape("cross_attn", "key", "kernel")
                check_features(encoder_out, "encoder_out", None if w_k is None else w_k[0])
            if encoder_lengths is not None:
                encoder_lengths = check_lengths(
                    encoder_lengths, "encoder_lengths", batch, encoder_out.shape[1]
                )
            encoder_mask = _key_mask(encoder_mask, "encoder_mask")
            if encoder_mask is not None:
                check_bool(encoder_mask, "encoder_mask")
                check_broadcast(
                    encoder_mask,
                    "encoder_mask",
                    (batch, cfg.num_heads, length, encoder_out.shape[1]),
                )
        return lengths, encoder_mask, encoder_lengths

    def _check_cache(self, cfg: BlockConfig, cache: Any, batch: int) -> list[Any]:
        """The per-layer caches of ``cache`` (one for a scanned stack), checked."""
        if cache is None:
            return []
        if self.scan_layers:
            for leaf in jax.tree_util.tree_leaves(cache):
                if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != self.num_layers:
                    raise ValueError(
                        f"`cache` of a scanned stack must have a leading [num_layers] = "
                        f"[{self.num_layers}] axis on every leaf (from init_cache); got a leaf "
                        f"of shape {jnp.shape(leaf)}."
                    )
            layers = [cache]
        else:
            if not isinstance(cache, Sequence) or len(cache) != self.num_layers:
                raise ValueError(
                    f"`cache` must be a list of {self.num_layers} per-layer caches "
                    f"(from init_cache); got {type(cache).__name__}."
                )
            layers = list(cache)
        for layer in layers:
            _check_layer_cache(layer, cfg.cross_attention)
            if isinstance(layer, DecoderLayerCache) and not cfg.cross_attention:
                raise ValueError("a DecoderLayerCache needs `cross_attention=True`.")
            kv = _first_kv_cache(layer)
            if kv is not None and cfg.attention is None and kv.k.shape[-4] != batch:
                raise ValueError(
                    f"`cache` must hold batch size {batch} like `x`; got a cache of shape "
                    f"{tuple(kv.k.shape)} (from init_cache(batch={kv.k.shape[-4]}, ...))."
                )
        return [c for c in layers if isinstance(c, DecoderLayerCache)]

    @nn.compact
    def _forward(
        self,
        cfg: BlockConfig,
        x: Array,
        cache: Any,
        mask: Any,
        lengths: Array | None,
        encoder_out: Any,
        encoder_mask: Array | None,
        encoder_lengths: Array | None,
        positions: Any,
        deterministic: bool,
    ) -> tuple[Array, Any]:
        """The stack on checked inputs (:meth:`_check_call`, or a model that checked them):
        every block receives ``cfg`` whole and runs without argument checks."""

        def body(block, x, cache_l, mask, lengths, enc, enc_mask, enc_lengths, positions):
            # Inside a sharded step the residual stream stays split over the batch only
            # (seqjax.nn._sharding): without this, GSPMD may carry an FSDP weight's split
            # into the activations and reshuffle them between layers.
            x = _sharding.constrain(x, _sharding.BATCH)
            out = block._forward(
                x,
                mask=mask,
                lengths=lengths,
                bias=None,
                encoder_out=enc,
                encoder_mask=enc_mask,
                encoder_lengths=enc_lengths,
                positions=positions,
                cache=cache_l,
                deterministic=deterministic,
                trusted=True,
            )
            return out if cache_l is not None else (out, None)

        if self.remat:
            body = nn.remat(
                body,
                policy=resolve_remat_policy(self.remat_policy),
                prevent_cse=not self.scan_layers,
            )
        args = (mask, lengths, encoder_out, encoder_mask, encoder_lengths, positions)
        if self.scan_layers:
            scanned = nn.scan(
                body,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(0,) + (nn.broadcast,) * len(args),
                length=self.num_layers,
            )
            x, new_cache = scanned(TransformerBlock(config=cfg, name="layers"), x, cache, *args)
        else:
            new_caches = []
            for i in range(self.num_layers):
                block = TransformerBlock(config=cfg, name=f"layers_{i}")
                x, c = body(block, x, None if cache is None else cache[i], *args)
                new_caches.append(c)
            new_cache = None if cache is None else new_caches
        use_final = cfg.norm == "pre" if self.final_norm is None else self.final_norm
        if use_final:
            x = cfg.make_norm(name="final_norm")(x)
        if lengths is not None:
            valid_BxT = padding_mask_checked(lengths, x.shape[1])
            x = jnp.where(valid_BxT[..., None], x, jnp.zeros((), x.dtype))
        return x, new_cache

    def _call(
        self,
        x: Any,
        cache: Any,
        mask: Any,
        lengths: Any,
        encoder_out: Any,
        encoder_mask: Any,
        encoder_lengths: Any,
        positions: Any,
        deterministic: bool,
    ) -> tuple[Array, Any]:
        cfg = self.block_config()
        lengths, encoder_mask, encoder_lengths = self._check_call(
            cfg, x, cache, mask, lengths, encoder_out, encoder_mask, encoder_lengths
        )
        return self._forward(
            cfg,
            x,
            cache,
            mask,
            lengths,
            encoder_out,
            encoder_mask,
            encoder_lengths,
            positions,
            deterministic,
        )

    def _call_checked(
        self,
        x: Array,
        *,
        lengths: Array | None = None,
        encoder_out: Array | None = None,
        encoder_lengths: Array | None = None,
        positions: Any = None,
        cache: Any = None,
        deterministic: bool = True,
    ) -> Any:
        """The models' private path: the stack on inputs its model built and checked
        (``x`` its embeddings, ``lengths``/``encoder_lengths`` from
        :func:`~seqjax._checks.check_lengths`, ``cache`` from its decoding state), without
        the checks of ``__call__``."""
        x, new_cache = self._forward(
            self.block_config(),
            x,
            cache,
            None,
            lengths,
            encoder_out,
            None,
            encoder_lengths,
            positions,
            deterministic,
        )
        return x if cache is None else (x, new_cache)


def _first_kv_cache(cache: Any) -> KVCache | None:
    leaves = jax.tree_util.tree_leaves(cache, is_leaf=lambda c: isinstance(c, KVCache))
    return next((c for c in leaves if isinstance(c, KVCache)), None)


def _cache_len(cache: Any) -> int | None:
    """Key slots (``max_len``) of a stack's default-attention cache; ``None`` if none."""
    kv = _first_kv_cache(cache)
    return None if kv is None else kv.k.shape[-3]


class TransformerEncoder(_TransformerStack):
    r"""A stack of ``num_layers`` bidirectional :class:`TransformerBlock` s (BERT/ViT encoder).

    .. math::
        Z^{(0)} = X,\qquad Z^{(l)} = \mathrm{Block}_l(Z^{(l-1)}),\qquad
        Z^\star = \mathrm{N}_f(Z^{(L)})\ \text{(pre-norm only)}

    MEDL §7.5 ("≥ 6 blocks in series", Fig. 7.15a); Bishop §12.1.7 (no weight sharing);
    J&M §9.7. The block options are one :class:`BlockConfig`, given as ``config=`` or
    built from the keyword fields (every :class:`TransformerBlock` option); it is validated
    once and handed whole to every block. The call's arguments are checked once here; the
    blocks and their attention layers trust them.

    Call ``encoder(x, *, mask=None, lengths=None, positions=None, deterministic=True)``
    with ``x: [B, T, D]`` (embedded and positionally encoded), ``lengths: int32[B]``
    (right padding; outputs at padded positions are zero and do not influence the real
    ones) -> ``[B, T, D]``.

    Parameters: ``layers_{i}`` (one block each) or, with ``scan_layers``, ``layers`` with
    every leaf stacked on a leading ``[num_layers]`` axis; ``final_norm`` when pre-norm.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> enc = TransformerEncoder(num_heads=2, num_layers=2, mlp_dim=32, scan_layers=True)
        >>> x = jnp.ones((2, 5, 16))
        >>> params = enc.init(jax.random.PRNGKey(0), x)
        >>> params["params"]["layers"]["ffn"]["up"]["kernel"].shape
        (2, 16, 32)
        >>> enc.apply(params, x, lengths=jnp.array([5, 3])).shape
        (2, 5, 16)

    Attributes:
        num_layers: ``L``.
        scan_layers: one ``nn.scan`` over layers (fast compile, stacked parameters).
        remat: rematerialise each block in the backward pass (``jax.checkpoint``).
        remat_policy: a name in :data:`REMAT_POLICIES` or a ``jax.checkpoint_policies``
            callable (default: save nothing).
        final_norm: norm after the last block (default: with ``norm="pre"`` only).
        config: the blocks' :class:`BlockConfig` (``None``: the keyword fields).
        (every :class:`BlockConfig` field, as a keyword)
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
        x, _ = self._call(x, None, mask, lengths, None, None, None, positions, deterministic)
        return x


class TransformerDecoder(_TransformerStack):
    r"""A stack of causal :class:`TransformerBlock` s, with cross-attention and a KV cache.

    .. math::
        Z^{(l)} = \mathrm{Block}_l(Z^{(l-1)}, Z^\star_{enc}),\qquad
        \text{output} = \mathrm{N}_f(Z^{(L)})\ \text{(pre-norm only)}

    The decoder of MEDL Fig. 7.15b (every block reads the same encoder output ``z*``;
    masked self-attention (7.27), cross-attention (7.33)) and Bishop §12.3.4; with
    ``cross_attention=False`` the decoder-only stack of GPT (Bishop §12.3.1; J&M §9.8).

    Call ``decoder(x, *, mask=None, lengths=None, encoder_out=None, encoder_mask=None,
    encoder_lengths=None, positions=None, cache=None, deterministic=True)``.

    Decoding: ``cache = decoder.apply(params, batch, max_len, method="init_cache")``
    gives one cache per layer (a list), or, with ``scan_layers``, one cache pytree with a
    leading ``[num_layers]`` axis. Prefill the (right padded) prompts with
    ``lengths=prompt_lengths``, then feed one or more tokens per step; each call returns
    ``(y, new_cache)``. The result equals one causal pass over the whole sequence.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> dec = TransformerDecoder(num_heads=2, num_layers=2, mlp_dim=32,
        ...                          cross_attention=False)
        >>> x = jnp.ones((2, 6, 16))
        >>> params = dec.init(jax.random.PRNGKey(0), x)
        >>> cache = dec.apply(params, 2, 8, method="init_cache")
        >>> y, cache = dec.apply(params, x[:, :4], cache=cache, lengths=jnp.array([4, 2]))
        >>> y1, cache = dec.apply(params, x[:, 4:5], cache=cache)
        >>> y1.shape, cache[0].lengths.tolist()
        ((2, 1, 16), [5, 3])

    Attributes: as :class:`TransformerEncoder`, with ``causal=True`` and
    ``cross_attention=True`` by default.
    """

    causal: bool = True
    cross_attention: bool = True

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
        cache: Any = None,
        deterministic: bool = True,
    ) -> Any:
        x, new_cache = self._call(
            x,
            cache,
            mask,
            lengths,
            encoder_out,
            encoder_mask,
            encoder_lengths,
            positions,
            deterministic,
        )
        return x if cache is None else (x, new_cache)

    def init_cache(self, batch: int, max_len: int, dtype: Dtype | None = None) -> Any:
        """Empty per-layer caches: a list of ``num_layers`` caches, or one stacked cache
        (leading ``[num_layers]`` axis) with ``scan_layers``.

        Needs the parameters (head sizes are read from them):
        ``decoder.apply(params, batch, max_len, method="init_cache")``.
        """
        if self.scope is None or not self.has_variable("params", self._layer_name(0)):
            raise ValueError(
                "init_cache needs bound parameters: "
                "decoder.apply(params, batch, max_len, method='init_cache')."
            )
        params = self.variables["params"]
        block = TransformerBlock(config=self.block_config(), parent=None)

        def layer_cache(layer_params: Any) -> Any:
            return block.apply(
                {"params": layer_params}, batch, max_len, dtype, method=TransformerBlock.init_cache
            )

        if self.scan_layers:
            one = layer_cache(jax.tree_util.tree_map(lambda a: a[0], params["layers"]))
            return jax.tree_util.tree_map(
                lambda a: jnp.broadcast_to(a[None], (self.num_layers, *a.shape)), one
            )
        return [layer_cache(params[self._layer_name(i)]) for i in range(self.num_layers)]

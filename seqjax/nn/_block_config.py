"""The options of a transformer block: :class:`BlockConfig` (re-exported by
:mod:`seqjax.nn.transformer` and :mod:`seqjax.nn`)."""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import (
    ConfigBase,
    check_count_or_off,
    check_optional_positive_int,
    check_positive_int,
    check_rate,
    replace_fields,
)
from seqjax.nn.attention.checks import check_kv_heads
from seqjax.nn.attention.dot_product import IMPLEMENTATIONS
from seqjax.nn.ffn import GLU_VARIANTS, get_activation
from seqjax.nn.norms import LayerNorm, RMSNorm

if TYPE_CHECKING:
    from typing_extensions import Unpack

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = ["BlockConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockConfig(ConfigBase):
    """Every option of a transformer block, validated once (Flax lm1b's ``TransformerConfig``).

    The ``config=`` of :class:`TransformerBlock`, :class:`TransformerEncoder` and
    :class:`TransformerDecoder`, and the ``block`` of every transformer model config.
    ``__post_init__`` checks every field (a ``ValueError``/``TypeError`` naming the field, what it
    must be and what it is), so layers trust it. :meth:`encoder` (also the plain constructor's
    defaults) and :meth:`decoder` hold the two stacks' defaults.

    Example:
        >>> cfg = BlockConfig.decoder(num_heads=2, mlp_dim=32, cross_attention=False)
        >>> cfg.causal, cfg.replace(norm="post").norm, cfg.attention_bias
        (True, 'post', True)

    Attributes:
        num_heads: ``H``.
        mlp_dim: FFN hidden size (MEDL's ``N₁``); default ``4D`` for ``"mlp"``, for GLUs
            :func:`~seqjax.nn.ffn.glu_hidden_dim` ``(D, multiple_of)``.
        head_dim: per-head size ``m = m_v`` (default ``D // H``).
        num_kv_heads: GQA/MQA key-value heads, a divisor of ``num_heads`` (default MHA).
        norm: ``"pre"`` (default) or ``"post"``.
        norm_type: ``"layernorm"`` (default) or ``"rmsnorm"``.
        norm_epsilon: ``ε`` of the norms (default: LayerNorm 1e-5, RMSNorm 1e-6).
        norm_use_bias: learn LayerNorm's ``β`` (nanoGPT's ``bias=False`` drops it).
        mlp: ``"mlp"`` or a GLU variant in :data:`~seqjax.nn.ffn.GLU_VARIANTS` (``"swiglu"``, …).
        activation: MLP activation, a name in :data:`~seqjax.nn.ffn.ACTIVATIONS` (default exact
            ``"gelu"``; ``"gelu_tanh"``, ``"relu"``, ``"relu_squared"``, …) or a callable.
        multiple_of: rounding of the default GLU hidden size.
        causal: causal self-attention (decoder / language model).
        cross_attention: add the cross-attention sublayer.
        dropout_rate: residual dropout on every sublayer output.
        attention_dropout_rate: dropout on the attention weights.
        mlp_dropout_rate: dropout on the FFN hidden layer (default ``dropout_rate``, as
            ``torch.nn.TransformerEncoderLayer``).
        use_bias: biases in the FFN and (unless ``attention_use_bias``) the attention.
        attention_use_bias: biases on the attention projections (default ``use_bias``; MEDL's heads
            have none).
        qk_norm, use_rope, rope_base, implementation: passed to the default
            :class:`~seqjax.nn.attention.MultiHeadAttention` self-attention.
        window: sliding-window causal self-attention over ``w`` keys, position ``i`` attending to
            ``i-w+1 .. i`` (``0``: all); ``L`` such layers see ``L(w-1)+1`` positions back.
        attention: self-attention factory (default MultiHeadAttention), called with
            ``num_heads, head_dim, use_bias, dropout_rate, dtype, param_dtype``; it must take
            MultiHeadAttention's call arguments (``lengths`` included) and, for cached decoding,
            have ``init_cache`` and ``decode(x, cache, ...) -> (y, cache)`` (e.g.
            :class:`~seqjax.nn.linear_attention.LinearAttention`). Bind other options with
            ``functools.partial``: the fields ``num_kv_heads``, ``qk_norm``, ``use_rope``,
            ``rope_base``, ``window`` and ``implementation`` configure only the default and must
            keep their defaults (else ``ValueError``).
        dtype, param_dtype: compute and storage dtypes.
        kernel_init, bias_init: initialisers of the projection and FFN weights.
        residual_init_std: ``σ`` of an ``N(0, σ²)`` init of the kernels writing into the residual
            stream, ``self_attn/out``, ``cross_attn/out`` and ``ffn/down`` (``None``:
            ``kernel_init``). GPT-2 (Radford et al. 2019, §2.3) uses ``0.02/√(2L)`` for ``L``
            blocks, so the sum of ``2L`` branches keeps one branch's variance; the model configs
            compute it. ``0.0``: zeros (modded-nanogpt), every block starts as the identity.
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
    window: int = 0
    implementation: str = "auto"
    attention: Callable[..., nn.Module] | None = None
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()
    residual_init_std: float | None = None

    @classmethod
    def encoder(cls, num_heads: int, **options: Any) -> BlockConfig:
        """An encoder block's config: bidirectional self-attention, no cross-attention."""
        return cls(num_heads=num_heads, causal=False, cross_attention=False, **options)

    @classmethod
    def decoder(cls, num_heads: int, *, cross_attention: bool = True,
                **options: Any) -> BlockConfig:
        """A decoder block's config: causal self-attention and (default) cross-attention on an
        encoder output; ``cross_attention=False`` gives GPT's decoder-only block."""
        return cls(num_heads=num_heads, causal=True, cross_attention=cross_attention, **options)

    def __post_init__(self) -> None:
        check_positive_int(self.num_heads, "num_heads")
        for field in ("mlp_dim", "head_dim"):
            check_optional_positive_int(getattr(self, field), field)
        check_count_or_off(self.window, "window", "BlockConfig", "no window, every key")
        check_positive_int(self.multiple_of, "multiple_of")
        check_kv_heads(self.num_heads, self.num_kv_heads)
        for field, allowed in (("norm", ("pre", "post")), ("norm_type", ("layernorm", "rmsnorm")),
                               ("mlp", ("mlp", *GLU_VARIANTS)),
                               ("implementation", IMPLEMENTATIONS)):
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"`{field}` must be one of {allowed}; got {value!r}.")
        if self.mlp == "mlp":
            get_activation(self.activation)  # a ValueError naming `activation` if unknown
        for field in ("causal", "cross_attention"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"`{field}` must be a bool; got {getattr(self, field)!r}.")
        for field, ok, want in (
            ("residual_init_std", lambda x: 0 <= x < math.inf, "finite number >= 0 (0: zero init)"),
            ("norm_epsilon", lambda x: x > 0, "number > 0"),
        ):
            value = getattr(self, field)
            real = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if value is not None and not (real and ok(value)):
                raise ValueError(f"`{field}` must be a {want} or None; got {value!r}.")
        for field in ("dropout_rate", "attention_dropout_rate", "mlp_dropout_rate"):
            rate = getattr(self, field)
            if rate is not None:
                check_rate(rate, field)
        if self.attention is not None:
            # options of the default MultiHeadAttention that a custom factory never receives
            defaults = {f.name: f.default for f in dataclasses.fields(BlockConfig)}
            mha_only = ("num_kv_heads", "qk_norm", "use_rope", "rope_base", "window",
                        "implementation")
            changed = [k for k in mha_only if getattr(self, k) != defaults[k]]
            if changed:
                raise ValueError(
                    f"{changed} configure the default MultiHeadAttention and are not passed to "
                    "a custom `attention` factory; bind them with functools.partial instead."
                )

    def replace(self, **changes: Unpack[BlockOptions]) -> BlockConfig:  # type: ignore[override]
        """A copy with ``changes``, re-validated by ``__post_init__``.

        Keywords are typed as the fields (:class:`BlockOptions`; narrower than
        :meth:`ConfigBase.replace`, hence the override): a misspelt name is a mypy error and, at run
        time, a ``TypeError`` naming it and the closest field.

        Example:
            >>> BlockConfig(num_heads=2).replace(num_headz=4)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            TypeError: BlockConfig.replace: `num_headz` (did you mean `num_heads`?) ...
        """
        return replace_fields(self, dict(changes))

    @property
    def attention_bias(self) -> bool:
        """Biases on the attention projections: ``attention_use_bias``, else ``use_bias``."""
        return self.use_bias if self.attention_use_bias is None else self.attention_use_bias

    @property
    def ffn_dropout_rate(self) -> float:
        """Dropout on the FFN hidden layer: ``mlp_dropout_rate``, else ``dropout_rate``."""
        return self.dropout_rate if self.mlp_dropout_rate is None else self.mlp_dropout_rate

    @property
    def residual_init(self) -> Initializer:
        """Initialiser of the residual-branch output kernels: ``N(0, residual_init_std²)``, zeros
        for ``0.0``, ``kernel_init`` for ``None``."""
        if self.residual_init_std is None:
            return self.kernel_init
        if self.residual_init_std == 0:
            return nn.initializers.zeros
        return normal_init(self.residual_init_std)

    def make_norm(self, name: str | None = None) -> nn.Module:
        """The configured norm (LayerNorm or RMSNorm) as a module."""
        kw: dict[str, Any] = dict(dtype=self.dtype, param_dtype=self.param_dtype, name=name)
        if self.norm_epsilon is not None:
            kw["epsilon"] = self.norm_epsilon
        if self.norm_type == "rmsnorm":
            return RMSNorm(**kw)
        return LayerNorm(use_bias=self.norm_use_bias, **kw)


class BlockOptions(TypedDict, total=False):
    """The keywords of :meth:`BlockConfig.replace`: every field of :class:`BlockConfig` with its
    type, none required (``tests/nn/test_transformer_configs.py`` checks that the two match)."""

    num_heads: int
    mlp_dim: int | None
    head_dim: int | None
    num_kv_heads: int | None
    norm: str
    norm_type: str
    norm_epsilon: float | None
    norm_use_bias: bool
    mlp: str
    activation: str | Callable[[Array], Array]
    multiple_of: int
    causal: bool
    cross_attention: bool
    dropout_rate: float
    attention_dropout_rate: float
    mlp_dropout_rate: float | None
    use_bias: bool
    attention_use_bias: bool | None
    qk_norm: bool
    use_rope: bool
    rope_base: float
    window: int
    implementation: str
    attention: Callable[..., nn.Module] | None
    dtype: Dtype | None
    param_dtype: Dtype
    kernel_init: Initializer
    bias_init: Initializer
    residual_init_std: float | None


def check_block(block: Any, *, causal: bool | None = None, cross_attention: bool | None = None,
                name: str = "block", owner: str = "") -> None:
    """Check that ``block`` is a :class:`BlockConfig` (else ``TypeError``) with the ``causal`` /
    ``cross_attention`` its owner requires (else a ``ValueError`` naming ``{name}.causal`` or
    ``{name}.cross_attention``, the expected and the actual value)."""
    where = f" of {owner}" if owner else ""
    if not isinstance(block, BlockConfig):
        raise TypeError(f"`{name}`{where} must be a BlockConfig; got {type(block).__name__}.")
    if causal is not None and block.causal != causal:
        hint = "BlockConfig.decoder(...)" if causal else "BlockConfig.encoder(...)"
        raise ValueError(f"`{name}.causal`{where} must be {causal} ({hint}); got {block.causal}.")
    if cross_attention is not None and block.cross_attention != cross_attention:
        raise ValueError(
            f"`{name}.cross_attention`{where} must be {cross_attention}; "
            f"got {block.cross_attention}."
        )


def _dtype_name(dtype: Any) -> str:
    return "None" if dtype is None else jnp.dtype(dtype).name


def model_block(
    block: BlockConfig, dtype: Dtype | None, param_dtype: Dtype, *, name: str = "block",
    owner: str = "",
) -> BlockConfig:
    """``block`` with the model's ``dtype`` and ``param_dtype``.

    The block's dtypes must be their defaults (``None``, ``float32``) or the model's: any other
    value would be overwritten, so it is a ``ValueError`` naming ``{name}.dtype`` (or
    ``.param_dtype``), its value and the model's.

    Example:
        >>> model_block(BlockConfig(num_heads=2), jnp.bfloat16, jnp.float32).dtype
        <class 'jax.numpy.bfloat16'>
    """
    where = f" of {owner}" if owner else ""
    for field, model_value, default, what in (
        ("dtype", dtype, None, "computes in"),
        ("param_dtype", param_dtype, jnp.float32, "stores its parameters in"),
    ):
        was, shown, default_name = map(_dtype_name, (getattr(block, field), model_value, default))
        if was not in (default_name, shown):
            raise ValueError(
                f"`{name}.{field}`{where} is {was} but the model {what} {shown} (its "
                f"`{field}`): leave `{name}.{field}` at {default_name} (the model's), or "
                f"build the model with {field}={was}."
            )
    return block.replace(dtype=dtype, param_dtype=param_dtype)


@functools.cache
def normal_init(stddev: float) -> Initializer:
    """``N(0, stddev²)``, one initialiser object per ``stddev``: configs built with equal
    values compare (and hash) equal, so a model rebuilt from them is not compiled again."""
    return nn.initializers.normal(stddev=stddev)

"""Position-wise feed-forward sublayers: ``MLP`` (ReLU/GELU) and gated ``GLU`` (SwiGLU, GeGLU).

Both act on each position independently (``[..., D] -> [..., D']``): the same
weights for every token (MEDL §7.5 step 3; Bishop §12.1.7; the slides' "per-token
operation"). Row-vector convention: kernels are ``[in, out]``, so ``x @ kernel``
here is ``W x`` in the textbooks.

Parameter names (stable, documented):

* ``MLP``: ``up`` = ``W^{[1]}, b^{[1]}`` (``[D, F]``), ``down`` = ``W^{[2]}, b^{[2]}``
  (``[F, D']``);
* ``GLU``: ``gate`` = ``W`` (activated branch), ``up`` = ``V`` (linear branch), ``down`` = ``W_2``
  (Shazeer 2020's letters; Llama's ``gate_proj / up_proj / down_proj``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import NamedFields
from seqjax.nn.dense import Dense

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]
Activation = Callable[[Array], Array]

__all__ = ["ACTIVATIONS", "GLU", "GLU_VARIANTS", "MLP", "get_activation", "glu_hidden_dim"]



def _relu_squared(x: Array) -> Array:
    r"""Squared ReLU, :math:`\max(x, 0)^2` (So et al. 2021, "Primer"; modded-nanogpt)."""
    return jnp.square(jax.nn.relu(x))


#: Activations by name. ``"gelu"`` is the exact ``x Φ(x)`` (PyTorch's default);
#: ``"gelu_tanh"`` is the tanh approximation (Hendrycks & Gimpel 2016; Flax's default
#: ``nn.gelu``, GPT-2). ``"silu"`` = ``"swish"`` = ``x σ(x)`` (Swish with β = 1).
#: ``"relu_squared"`` is ``max(x, 0)²`` (Primer's squared ReLU; modded-nanogpt's MLP).
ACTIVATIONS: dict[str, Activation] = {
    "relu": jax.nn.relu,
    "relu_squared": _relu_squared,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
    "identity": lambda x: x,
}

#: Gated-unit variants of Shazeer (2020), "GLU Variants Improve Transformer": the
#: activation applied to the gate branch ``x W``.
GLU_VARIANTS: dict[str, str] = {
    "swiglu": "silu",
    "geglu": "gelu",
    "reglu": "relu",
    "glu": "sigmoid",
    "bilinear": "identity",
}


def get_activation(activation: str | Activation) -> Activation:
    """Look up an activation by name in :data:`ACTIVATIONS`, or pass a callable through."""
    if callable(activation):
        return activation
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"`activation` must be a callable or one of {sorted(ACTIVATIONS)}; got {activation!r}."
        )
    return ACTIVATIONS[activation]


def glu_hidden_dim(features: int, multiple_of: int = 256) -> int:
    r"""Default gated-unit hidden size: ``⌈(8/3)·D / multiple_of⌉ · multiple_of``.

    A GLU has three ``D×F`` matrices where an MLP has two, so ``F = (2/3)·4D = (8/3)·D``
    keeps the parameter count (and FLOPs) of the ``4D`` MLP (Shazeer 2020, §2);
    rounding up to a multiple of ``multiple_of`` (256 in Llama) keeps matmuls
    hardware friendly. ``int((8/3)·D)`` is taken first, as Llama does.

    Example:
        >>> glu_hidden_dim(4096)  # Llama-7B
        11008
        >>> glu_hidden_dim(512, multiple_of=1)
        1365
    """
    if features <= 0:
        raise ValueError(f"`features` must be a positive int; got {features}.")
    if multiple_of <= 0:
        raise ValueError(f"`multiple_of` must be a positive int; got {multiple_of}.")
    hidden = int(8 * features / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


def _check_features(x: Any) -> None:
    if jnp.ndim(x) < 1:
        raise ValueError(f"`x` must have a feature axis (rank >= 1); got shape {jnp.shape(x)}.")


def _check_rate(rate: float) -> None:
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"`dropout_rate` must lie in [0, 1); got {rate}.")


class MLP(NamedFields, nn.Module):
    r"""Two-layer position-wise feed-forward network.

    .. math::
        \mathrm{FFN}(x) = W^{[2]}\,S(W^{[1]}x + b^{[1]}) + b^{[2]}

    MEDL §7.5 step 3 (``S`` = ReLU, ``W^{[1]} ∈ ℝ^{N_1×p}``); J&M (9.41)'s FFNN;
    Bishop (12.22)–(12.23)'s MLP; the slides' ``W_2 ReLU(W_1 x_i + b_1) + b_2``.
    ``S`` is ReLU, squared ReLU ``max(x, 0)²`` (So et al. 2021) or GELU (exact ``x Φ(x)``
    or its tanh approximation).
    Dropout (``dropout_rate``) acts on the hidden activations ``S(·)``, as in
    ``torch.nn.TransformerEncoderLayer``; the residual dropout belongs to the block.

    Parameters: ``up/kernel [D, F]``, ``up/bias [F]``, ``down/kernel [F, D']``,
    ``down/bias [D']`` — ``2DF + F + D`` for ``D' = D`` (MEDL (7.32)'s
    ``2N_1p + N_1 + p``).

    Shapes: ``x: [..., D] -> [..., D']`` (``D' = out_features or D``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> mlp = MLP(mlp_dim=32, activation="relu")
        >>> x = jnp.ones((2, 5, 8))
        >>> params = mlp.init(jax.random.PRNGKey(0), x)
        >>> mlp.apply(params, x).shape
        (2, 5, 8)

    Attributes:
        mlp_dim: ``F`` (MEDL's ``N_1``); default ``4·D`` (Vaswani et al.; the slides).
        out_features: ``D'``; default ``D``.
        activation: name in :data:`ACTIVATIONS` (``"relu"``, ``"gelu"``,
            ``"gelu_tanh"``, …) or a callable. Default ``"gelu"`` (exact).
        use_bias: biases ``b^{[1]}, b^{[2]}`` (MEDL counts them).
        dropout_rate: dropout on the hidden activations when ``deterministic=False``.
        dtype, param_dtype: compute and storage dtypes.
        kernel_init, bias_init: initialisers of the kernels and biases.
        out_kernel_init: initialiser of ``down/kernel`` (``W^{[2]}``; default
            ``kernel_init``): GPT-2's ``N(0, (0.02/√(2L))²)`` for a residual branch.
    """

    mlp_dim: int | None = None
    out_features: int | None = None
    activation: str | Activation = "gelu"
    use_bias: bool = True
    dropout_rate: float = 0.0
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()
    out_kernel_init: Initializer | None = None

    @nn.compact
    def __call__(self, x: Array, *, deterministic: bool = True) -> Array:
        """``x: [..., D] -> [..., D']``; dropout only when ``deterministic=False``."""
        _check_features(x)
        _check_rate(self.dropout_rate)
        features = x.shape[-1]
        hidden = self.mlp_dim if self.mlp_dim is not None else 4 * features
        if hidden <= 0:
            raise ValueError(f"`mlp_dim` must be a positive int; got {hidden}.")
        act = get_activation(self.activation)
        dense = functools.partial(
            Dense,
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            bias_init=self.bias_init,
        )
        h_xF = act(dense(hidden, name="up")(x))
        h_xF = nn.Dropout(self.dropout_rate)(h_xF, deterministic=deterministic)
        down_init = self.kernel_init if self.out_kernel_init is None else self.out_kernel_init
        return dense(self.out_features or features, kernel_init=down_init, name="down")(h_xF)


class GLU(NamedFields, nn.Module):
    r"""Gated linear unit feed-forward layer: SwiGLU, GeGLU and the other variants (Shazeer 2020).

    .. math::
        \mathrm{FFN}_{\mathrm{GLU}}(x) = W_2\big(S(W x + b)\odot(V x + c)\big) + b_2

    with ``S`` = Swish/SiLU ``x σ(x)`` (SwiGLU), GELU (GeGLU), ReLU (ReGLU),
    sigmoid (the original GLU of Dauphin et al. 2017) or the identity (bilinear).
    Shazeer's layers have no biases (``use_bias=False``, the default, as in
    Llama). The slides' ``Swish(Wx_i + b) ⊙ Vx_i + c`` adds ``c`` after the
    product; Shazeer (2020) writes ``(Vx + c)``, and with ``use_bias=True`` this
    layer adds ``c`` inside the product, as he does.

    Hidden size ``F`` defaults to :func:`glu_hidden_dim`: ``(8/3)·D`` rounded
    up to a multiple of ``multiple_of`` (256), which matches a ``4D`` MLP's
    parameter count; pass ``multiple_of=1`` for tiny models or set ``mlp_dim``.

    Parameters: ``gate/kernel [D, F]`` (``W``), ``up/kernel [D, F]`` (``V``),
    ``down/kernel [F, D']`` (``W_2``), plus biases with ``use_bias``.

    Shapes: ``x: [..., D] -> [..., D']``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> ffn = GLU(variant="swiglu", multiple_of=8)
        >>> x = jnp.ones((2, 5, 12))
        >>> params = ffn.init(jax.random.PRNGKey(0), x)
        >>> params["params"]["gate"]["kernel"].shape  # 8/3 * 12 = 32
        (12, 32)
        >>> ffn.apply(params, x).shape
        (2, 5, 12)

    Attributes:
        variant: one of :data:`GLU_VARIANTS` (``"swiglu"``, ``"geglu"``, ``"reglu"``,
            ``"glu"``, ``"bilinear"``).
        mlp_dim: ``F``; default :func:`glu_hidden_dim` ``(D, multiple_of)``.
        multiple_of: rounding of the default hidden size.
        out_features: ``D'``; default ``D``.
        activation: overrides the variant's gate activation (e.g. ``"gelu_tanh"``
            for GeGLU with the tanh GELU, as in T5 v1.1).
        use_bias: biases ``b, c, b_2``.
        dropout_rate: dropout on the gated hidden ``S(xW) ⊙ xV``.
        dtype, param_dtype: compute and storage dtypes.
        kernel_init, bias_init: initialisers of the kernels and biases.
        out_kernel_init: initialiser of ``down/kernel`` (``W_2``; default ``kernel_init``).
    """

    variant: str = "swiglu"
    mlp_dim: int | None = None
    multiple_of: int = 256
    out_features: int | None = None
    activation: str | Activation | None = None
    use_bias: bool = False
    dropout_rate: float = 0.0
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()
    out_kernel_init: Initializer | None = None

    @nn.compact
    def __call__(self, x: Array, *, deterministic: bool = True) -> Array:
        """``x: [..., D] -> [..., D']``; dropout only when ``deterministic=False``."""
        _check_features(x)
        _check_rate(self.dropout_rate)
        if self.variant not in GLU_VARIANTS:
            raise ValueError(
                f"`variant` must be one of {sorted(GLU_VARIANTS)}; got {self.variant!r}."
            )
        act = get_activation(
            self.activation if self.activation is not None else GLU_VARIANTS[self.variant]
        )
        features = x.shape[-1]
        hidden = (
            self.mlp_dim
            if self.mlp_dim is not None
            else glu_hidden_dim(features, self.multiple_of)
        )
        if hidden <= 0:
            raise ValueError(f"`mlp_dim` must be a positive int; got {hidden}.")
        dense = functools.partial(
            Dense,
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            bias_init=self.bias_init,
        )
        h_xF = act(dense(hidden, name="gate")(x)) * dense(hidden, name="up")(x)
        h_xF = nn.Dropout(self.dropout_rate)(h_xF, deterministic=deterministic)
        down_init = self.kernel_init if self.out_kernel_init is None else self.out_kernel_init
        return dense(self.out_features or features, kernel_init=down_init, name="down")(h_xF)

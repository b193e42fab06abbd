"""Position-wise feed-forward sublayers: ``MLP`` (ReLU/GELU) and gated ``GLU`` (SwiGLU, GeGLU).

Both apply the same weights to each position independently, ``[..., D] -> [..., D']`` (MEDL §7.5
step 3; Bishop §12.1.7; the slides' "per-token operation"). Kernels are ``[in, out]`` (row vectors),
so ``x @ kernel`` is the textbooks' ``W x``. Parameter names are stable.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import NamedFields, check_positive_ints, check_rate
from seqjax.nn.dense import Dense

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]
Activation = Callable[[Array], Array]

__all__ = ["ACTIVATIONS", "GLU", "GLU_VARIANTS", "MLP", "get_activation", "glu_hidden_dim"]


def _relu_squared(x: Array) -> Array:
    return jnp.square(jax.nn.relu(x))


#: Activations by name. ``"gelu"`` is the exact ``x Φ(x)`` (PyTorch's default), ``"gelu_tanh"``
#: its tanh approximation (Hendrycks & Gimpel 2016; Flax's ``nn.gelu``, GPT-2); ``"silu"`` =
#: ``"swish"`` = ``x σ(x)``; ``"relu_squared"`` = ``max(x, 0)²`` (So et al. 2021, "Primer";
#: modded-nanogpt's MLP).
ACTIVATIONS: dict[str, Activation] = {
    "relu": jax.nn.relu, "relu_squared": _relu_squared,  # a def: it pickles
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu, "swish": jax.nn.silu, "sigmoid": jax.nn.sigmoid, "tanh": jnp.tanh,
    "identity": lambda x: x,
}

#: Gated-unit variants of Shazeer (2020): the activation applied to the gate branch ``x W``.
GLU_VARIANTS: dict[str, str] = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu",
                                "glu": "sigmoid", "bilinear": "identity"}


def get_activation(activation: str | Activation) -> Activation:
    """The activation named in :data:`ACTIVATIONS` (else ``ValueError``), or a callable as is."""
    if callable(activation):
        return activation
    if activation not in ACTIVATIONS:
        raise ValueError(f"`activation` must be a callable or one of {sorted(ACTIVATIONS)}; got "
                         f"{activation!r}.")
    return ACTIVATIONS[activation]


def glu_hidden_dim(features: int, multiple_of: int = 256) -> int:
    r"""Default gated-unit hidden size: ``⌈int((8/3)·D) / multiple_of⌉ · multiple_of`` (as Llama).

    A GLU has three ``D×F`` matrices to an MLP's two, so ``F = (2/3)·4D`` keeps the parameters (and
    FLOPs) of the ``4D`` MLP (Shazeer 2020, §2); rounding up to a multiple of ``multiple_of`` (256
    in Llama) keeps matmuls hardware friendly. A non-positive argument is a ``ValueError``.

    Example:
        >>> glu_hidden_dim(4096)  # Llama-7B
        11008
    """
    check_positive_ints(features=features, multiple_of=multiple_of)
    return multiple_of * math.ceil(int(8 * features / 3) / multiple_of)


class MLP(NamedFields, nn.Module):
    r"""Two-layer position-wise feed-forward network.

    .. math::
        \mathrm{FFN}(x) = W^{[2]}\,S(W^{[1]}x + b^{[1]}) + b^{[2]}

    MEDL §7.5 step 3 (``S`` = ReLU, ``W^{[1]} ∈ ℝ^{N_1×p}``); J&M (9.41)'s FFNN;
    Bishop (12.22)–(12.23)'s MLP; the slides' ``W_2 ReLU(W_1 x_i + b_1) + b_2``. Dropout acts on the
    hidden ``S(·)``, as in ``torch.nn.TransformerEncoderLayer``; the residual dropout belongs to the
    block.

    Parameters: ``up/kernel [D, F]``, ``up/bias [F]``, ``down/kernel [F, D']``, ``down/bias [D']``
    (``W^{[1]}, b^{[1]}, W^{[2]}, b^{[2]}``): ``2DF + F + D`` for ``D' = D`` (MEDL (7.32)'s
    ``2N_1p + N_1 + p``). Shapes: ``x: [..., D] -> [..., D']``.

    Example:
        >>> mlp, x = MLP(mlp_dim=32, activation="relu"), jnp.ones((2, 5, 8))
        >>> mlp.apply(mlp.init(jax.random.PRNGKey(0), x), x).shape
        (2, 5, 8)

    Attributes:
        mlp_dim: ``F`` (MEDL's ``N_1``); default ``4·D`` (Vaswani et al.; the slides).
        out_features: ``D'``; default ``D``.
        activation: name in :data:`ACTIVATIONS` or a callable; default ``"gelu"`` (exact).
        use_bias: biases ``b^{[1]}, b^{[2]}`` (MEDL counts them).
        dropout_rate: dropout on the hidden activations when ``deterministic=False``.
        dtype, param_dtype, kernel_init, bias_init: compute and storage dtypes; initialisers.
        out_kernel_init: initialiser of ``down/kernel`` (default ``kernel_init``), e.g. GPT-2's
            ``N(0, (0.02/√(2L))²)`` for a residual branch.
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
        return _feed_forward(self, x, self.activation, lambda d: 4 * d, deterministic)


def _feed_forward(ffn: MLP | GLU, x: Array, activation: str | Activation,
                  default_hidden: Callable[[int], int], deterministic: bool) -> Array:
    """Both layers' body, from their compact ``__call__``: ``h = S(x W_up)`` (a GLU:
    ``S(x W_gate) ⊙ x W_up``) of ``mlp_dim`` (default ``default_hidden(D)``) features, dropout,
    then the ``down`` projection to ``out_features`` (default ``D``)."""
    if jnp.ndim(x) < 1:
        raise ValueError(f"`x` must have a feature axis (rank >= 1); got shape {jnp.shape(x)}.")
    check_rate(ffn.dropout_rate, "dropout_rate")
    act = get_activation(activation)
    features = x.shape[-1]
    hidden = ffn.mlp_dim if ffn.mlp_dim is not None else default_hidden(features)
    check_positive_ints(mlp_dim=hidden)
    dense = functools.partial(Dense, use_bias=ffn.use_bias, dtype=ffn.dtype,
                              param_dtype=ffn.param_dtype, kernel_init=ffn.kernel_init,
                              bias_init=ffn.bias_init)
    if isinstance(ffn, GLU):
        h_xF = act(dense(hidden, name="gate")(x)) * dense(hidden, name="up")(x)
    else:
        h_xF = act(dense(hidden, name="up")(x))
    h_xF = nn.Dropout(ffn.dropout_rate)(h_xF, deterministic=deterministic)
    down_init = ffn.kernel_init if ffn.out_kernel_init is None else ffn.out_kernel_init
    return dense(ffn.out_features or features, kernel_init=down_init, name="down")(h_xF)


class GLU(NamedFields, nn.Module):
    r"""Gated linear unit feed-forward layer: SwiGLU, GeGLU and the other variants (Shazeer 2020).

    .. math::
        \mathrm{FFN}_{\mathrm{GLU}}(x) = W_2\big(S(W x + b)\odot(V x + c)\big) + b_2

    with ``S`` = SiLU ``x σ(x)`` (SwiGLU), GELU (GeGLU), ReLU (ReGLU), sigmoid (the original GLU of
    Dauphin et al. 2017) or the identity (bilinear). No biases by default (Shazeer; Llama); with
    ``use_bias=True`` ``c`` is added inside the product as in Shazeer (2020), not after it as on the
    slides (``Swish(Wx_i + b) ⊙ Vx_i + c``).

    Parameters: ``gate/kernel [D, F]`` (``W``, the activated branch), ``up/kernel [D, F]`` (``V``),
    ``down/kernel [F, D']`` (``W_2``), plus biases with ``use_bias`` (Llama's
    ``gate_proj / up_proj / down_proj``). Shapes: ``x: [..., D] -> [..., D']``.

    Example:
        >>> ffn, x = GLU(variant="swiglu", multiple_of=8), jnp.ones((2, 5, 12))
        >>> ffn.init(jax.random.PRNGKey(0), x)["params"]["gate"]["kernel"].shape  # 8/3 * 12 = 32
        (12, 32)

    Attributes:
        variant: a name in :data:`GLU_VARIANTS` (default ``"swiglu"``).
        mlp_dim: ``F``; default :func:`glu_hidden_dim` ``(D, multiple_of)``, a ``4D`` MLP's
            parameter count (``multiple_of=1`` for tiny models).
        multiple_of: rounding of the default hidden size (256).
        activation: overrides the variant's gate activation (e.g. ``"gelu_tanh"`` for T5 v1.1's
            GeGLU).
        use_bias: biases ``b, c, b_2``.
        dropout_rate: dropout on the gated hidden ``S(xW) ⊙ xV``.
        out_features, dtype, param_dtype, kernel_init, bias_init, out_kernel_init: as in
            :class:`MLP` (``down/kernel`` is ``W_2``).
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
        if self.variant not in GLU_VARIANTS:
            raise ValueError(f"`variant` must be one of {sorted(GLU_VARIANTS)}; got "
                             f"{self.variant!r}.")
        act = self.activation if self.activation is not None else GLU_VARIANTS[self.variant]
        return _feed_forward(self, x, act, lambda d: glu_hidden_dim(d, self.multiple_of),
                             deterministic)

"""Normalisation layers: ``LayerNorm`` (Ba et al. 2016) and ``RMSNorm`` (Zhang & Sennrich 2019).

Both normalise each position over its last (feature) axis, never mixing positions or batch rows. The
statistics are computed in float32 whatever the input dtype (float64 stays float64), then the result
is cast to the compute dtype (docs/design.md, "Conventions"): a bf16 input with a large common
offset is normalised as accurately as an fp32 one. The math is in the pure functions
:func:`layer_norm` and :func:`rms_norm`; the Modules own only the parameters ``scale`` and ``bias``
(Flax's names, so a ``flax.linen.LayerNorm`` checkpoint restores as is).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = ["LayerNorm", "RMSNorm", "layer_norm", "rms_norm"]


def _check_input(x: Any, epsilon: float, **params: Array | None) -> None:
    """``x`` floating with a feature axis, ``epsilon >= 0``, and each given parameter ``[D]``."""
    if jnp.ndim(x) < 1:
        raise ValueError(f"`x` must have a feature axis (rank >= 1); got shape {jnp.shape(x)}.")
    if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        raise TypeError(f"`x` must have a floating dtype; got {jnp.result_type(x)}.")
    if not epsilon >= 0.0:
        raise ValueError(f"`epsilon` must be >= 0; got {epsilon}.")
    features = jnp.shape(x)[-1]
    for name, p in params.items():
        if p is not None and jnp.shape(p) != (features,):
            raise ValueError(f"`{name}` must have shape (features,) = ({features},); got "
                             f"{jnp.shape(p)}.")


def layer_norm(x: Array, scale: Array | None = None, bias: Array | None = None, *,
               epsilon: float = 1e-5, dtype: Dtype | None = None) -> Array:
    r"""Layer normalisation over the last axis, with the biased (population) variance.

    .. math::
        \mu = \frac1D\sum_{i=1}^D x_i,\qquad
        \sigma^2 = \frac1D\sum_{i=1}^D (x_i-\mu)^2,\qquad
        \mathrm{LN}(x;\gamma,\beta) = \gamma\odot\frac{x-\mu}{\sqrt{\sigma^2+\varepsilon}}+\beta

    J&M (9.42)–(9.45); MEDL (7.31) (with ``γ, β``); the slides' ``LN(z; α, β)``. The texts divide by
    ``σ`` itself; ``ε`` (PyTorch's default ``1e-5``) only keeps a constant row finite and changes
    the result by a relative ``ε/(2σ²)``. ``μ`` and ``σ²`` are computed in float32, two-pass (not
    ``E[x²] − μ²``).

    Args:
        x: ``[..., D]``.
        scale: gain ``γ: [D]`` or None (no gain).
        bias: offset ``β: [D]`` or None (no offset).
        epsilon: ``ε >= 0`` added to the variance.
        dtype: output dtype; default ``x.dtype`` promoted with the parameters'.

    Returns:
        ``[..., D]``.

    Example:
        >>> layer_norm(jnp.array([2., 4., 6., 8., 10.]), epsilon=0.0).round(2)
        Array([-1.41, -0.71,  0.  ,  0.71,  1.41], dtype=float32)
    """
    return _normalize(x, scale, bias, epsilon, dtype, center=True)


def rms_norm(x: Array, scale: Array | None = None, *, epsilon: float = 1e-6,
             dtype: Dtype | None = None) -> Array:
    r"""Root-mean-square normalisation over the last axis (no centring, no offset).

    .. math::
        \mathrm{RMS}(x) = \sqrt{\frac1D\sum_{i=1}^D x_i^2 + \varepsilon},\qquad
        \mathrm{RMSNorm}(x; g) = g\odot\frac{x}{\mathrm{RMS}(x)}

    Zhang & Sennrich (2019), eq. (4); the slides' "LayerNorm => RMSNorm". It drops LayerNorm's
    re-centring: for zero-mean ``x`` the two agree. ``ε`` defaults to ``1e-6`` (Flax's and Llama's
    choice); the mean square is computed in float32. Arguments and result as in
    :func:`layer_norm` (no ``bias``).

    Example:
        >>> rms_norm(jnp.array([3., -3., 3., -3.]), epsilon=0.0)
        Array([ 1., -1.,  1., -1.], dtype=float32)
    """
    return _normalize(x, scale, None, epsilon, dtype, center=False)


def _normalize(x: Array, scale: Array | None, bias: Array | None, epsilon: float,
               dtype: Dtype | None, center: bool) -> Array:
    """:func:`layer_norm` (``center``: subtract the mean first, two-pass) or :func:`rms_norm`;
    the statistics in float32, or the input dtype when it is wider (float64)."""
    _check_input(x, epsilon, scale=scale, bias=bias)
    if dtype is None:
        dtype = jnp.result_type(*(a for a in (x, scale, bias) if a is not None))
    x_f = jnp.asarray(x).astype(jnp.promote_types(jnp.result_type(x), jnp.float32))
    if center:
        x_f = x_f - jnp.mean(x_f, axis=-1, keepdims=True)
    y = x_f * jax.lax.rsqrt(jnp.mean(jnp.square(x_f), axis=-1, keepdims=True) + epsilon)
    if scale is not None:
        y = y * scale.astype(y.dtype)
    if bias is not None:
        y = y + bias.astype(y.dtype)
    return y.astype(dtype)


def _norm_module(module: LayerNorm | RMSNorm, x: Array, use_bias: bool, center: bool) -> Array:
    """Both modules' compact ``__call__``: their ``scale`` and (``use_bias``) ``bias``,
    ``[D]`` in ``param_dtype``; the compute dtype promoted with them as given (bf16 copies under
    mixed precision)."""
    _check_input(x, module.epsilon)
    shape = (jnp.shape(x)[-1],)
    scale = (module.param("scale", module.scale_init, shape, module.param_dtype)
             if module.use_scale else None)
    bias = (module.param("bias", module.bias_init, shape, module.param_dtype)
            if use_bias else None)
    given = [p for p in (scale, bias) if p is not None] or [module.param_dtype]
    dtype = module.dtype or jnp.result_type(x, *given)
    return _normalize(x, scale, bias, module.epsilon, dtype, center)


class LayerNorm(nn.Module):
    r"""Layer normalisation with learned gain and offset: :func:`layer_norm` as a Module.

    ``LN(x; γ, β) = γ ⊙ (x − μ)/√(σ² + ε) + β`` with the biased ``σ²``: J&M (9.42)–(9.45);
    MEDL (7.31); Ba et al. (2016). Same math as ``torch.nn.LayerNorm`` (default ``ε = 1e-5`` as
    there; Flax uses ``1e-6``). Parameters: ``scale`` (``γ: [D]``, ones) and ``bias`` (``β: [D]``,
    zeros), ``2D`` in all as MEDL (7.32) counts. Shapes: ``x: [..., D] -> [..., D]``.

    Example:
        >>> ln, x = LayerNorm(), jnp.array([[2., 4., 6., 8., 10.]])  # the slides' worked example
        >>> ln.apply(ln.init(jax.random.PRNGKey(0), x), x).round(2)
        Array([[-1.41, -0.71,  0.  ,  0.71,  1.41]], dtype=float32)

    Attributes:
        epsilon: ``ε`` added to the variance (``1e-5``).
        use_scale: learn ``γ`` (else ``γ = 1``).
        use_bias: learn ``β`` (else ``β = 0``).
        dtype: compute/output dtype (default: input promoted with ``param_dtype``).
        param_dtype: storage dtype of ``scale``/``bias``.
    """

    epsilon: float = 1e-5
    use_scale: bool = True
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    scale_init: Initializer = nn.initializers.ones_init()
    bias_init: Initializer = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x: Array) -> Array:
        return _norm_module(self, x, self.use_bias, center=True)


class RMSNorm(nn.Module):
    r"""Root-mean-square normalisation with a learned gain: :func:`rms_norm` as a Module.

    ``RMSNorm(x; g) = g ⊙ x/√(mean(x²) + ε)``: Zhang & Sennrich (2019); the slides' modern
    replacement for LayerNorm (Llama, Mamba). Same math as ``torch.nn.RMSNorm(eps=ε)``. Shapes:
    ``x: [..., D] -> [..., D]``. Parameter: ``scale`` (``g: [D]``, ones; Flax's name).

    Example:
        >>> norm, x = RMSNorm(), jnp.ones((2, 3, 8))
        >>> norm.apply(norm.init(jax.random.PRNGKey(0), x), x).shape
        (2, 3, 8)

    Attributes:
        epsilon: ``ε`` added to the mean square (``1e-6``).
        use_scale: learn ``g`` (else ``g = 1``).
        dtype, param_dtype: as in :class:`LayerNorm`.
    """

    epsilon: float = 1e-6
    use_scale: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    scale_init: Initializer = nn.initializers.ones_init()

    @nn.compact
    def __call__(self, x: Array) -> Array:
        return _norm_module(self, x, False, center=False)

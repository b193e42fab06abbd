r"""Causal 1-D convolution over time (the "CNN" of the slides' RNN vs CNN vs self-attention).

.. math::
    y_t = b + \sum_{j=0}^{K-1} W_j^\top\, x_{t-(K-1-j)\,r}, \qquad
    x_s = 0 \text{ for } s < 1,\quad W_j \in \mathbb{R}^{D \times F},\ b \in \mathbb{R}^F

Kernel size ``K``, dilation ``r``: output ``t`` reads ``t, t − r, …, t − (K−1)r`` and nothing
later (the input is left-padded with ``(K−1)r`` zeros). One layer on ``T`` steps costs
``2·K·T·D·F`` FLOPs, the slides' and Vaswani et al.'s (2017, Table 1) ``O(k·n·d²)`` with ``F =
D``, all outputs independent. A stack of ``L`` layers sees ``1 + (K−1)·L`` steps (``r = 1``, path
``O(N/k)``) or ``K^L`` with dilations ``1, K, K², …`` (WaveNet, van den Oord et al. 2016; path
``O(log_k N)``). Unlike :class:`~seqjax.nn.CausalDepthwiseConv1d` (Mamba's per-channel conv,
``K·D`` weights) it mixes channels: ``K·D·F`` weights.

Parameters (``flax.linen.Conv``'s layout): ``kernel: [K, D, F]``, ``bias: [F]``; PyTorch's
``Conv1d(D, F, K, dilation=r, padding=0)`` on the left-padded input has ``weight[f, d, j] =
kernel[j, d, f]``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import check_lengths, check_positive_ints, check_rank

Array = jax.Array
Dtype = Any


class CausalConv1D(nn.Module):
    r"""Causal, optionally dilated, 1-D convolution ``[B, T, D] -> [B, T, F]`` (see the module).

    ``conv(x_BxTxD, lengths=None)``; with ``lengths`` (right padding) outputs past each row's
    end are zero (real outputs never read the padding).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> conv = CausalConv1D(features=4, kernel_size=3, dilation=2)
        >>> x = jnp.ones((2, 7, 5)); params = conv.init(jax.random.PRNGKey(0), x)
        >>> conv.apply(params, x).shape, params["params"]["kernel"].shape
        ((2, 7, 4), (3, 5, 4))

    Attributes:
        features, kernel_size, dilation: ``F``, ``K``, ``r`` (positive ints, else ValueError).
        use_bias: learn ``b``; ``kernel_init``, ``bias_init`` default to Flax ``Conv``'s.
    """

    features: int
    kernel_size: int = 3
    dilation: int = 1
    use_bias: bool = True
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros_init()
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x_BxTxD: Array, lengths: Array | None = None) -> Array:
        check_rank(x_BxTxD, "x", 3)
        check_positive_ints(features=self.features, kernel_size=self.kernel_size,
                            dilation=self.dilation)
        batch, steps, feat = x_BxTxD.shape
        k, r = self.kernel_size, self.dilation
        kernel_KxDxF = self.param("kernel", self.kernel_init, (k, feat, self.features),
                                  self.param_dtype)
        bias_F = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                  if self.use_bias else None)
        x_BxTxD, kernel_KxDxF, bias_F = nn.dtypes.promote_dtype(x_BxTxD, kernel_KxDxF, bias_F,
                                                                dtype=self.dtype)
        # One XLA convolution (cross-correlation): left padding (K-1)r makes it causal.
        y_BxTxF = jax.lax.conv_general_dilated(x_BxTxD, kernel_KxDxF, window_strides=(1,),
                                               padding=[((k - 1) * r, 0)], rhs_dilation=(r,),
                                               dimension_numbers=("NWC", "WIO", "NWC"))
        if bias_F is not None:
            y_BxTxF = y_BxTxF + bias_F
        if lengths is not None:
            lengths = check_lengths(lengths, "lengths", batch, steps).value
            keep_BxT = jnp.arange(steps)[None, :] < lengths[:, None]
            y_BxTxF = jnp.where(keep_BxT[..., None], y_BxTxF, 0)
        return y_BxTxF

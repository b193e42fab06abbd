r"""cuDNN kernel of :func:`seqjax.nn.attention.dot_product_attention` (``implementation="cudnn"``).

``jax.nn.dot_product_attention``'s cuDNN flash attention on a GPU, then the empty-row rule
(:func:`~seqjax.nn.attention.checks.zero_invisible_rows`). Equals
:func:`~seqjax.nn.attention.dot_product.reference_attention` in output and gradients to
float16/bfloat16 tolerance; checked by ``tests/test_gpu_paths.py`` on a GPU (skipped on CPU).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from seqjax.nn.attention.checks import as_4d, visible_rows, zero_invisible_rows
from seqjax.nn.masks import causal_mask

Array = jax.Array


def cudnn_unsupported(q: Array, k: Array, v: Array, is_causal: bool, dropout_rate: float,
                      return_weights: bool, explicit: bool) -> str | None:
    """Why cuDNN flash attention cannot run this call, or ``None`` when it can."""
    del is_causal, explicit
    if jax.default_backend() != "gpu":
        return f"it needs a GPU backend (the default backend is {jax.default_backend()!r})"
    if q.dtype not in (jnp.float16, jnp.bfloat16):
        return f"it needs float16 or bfloat16 inputs (got {q.dtype})"
    if not (q.dtype == k.dtype == v.dtype):
        return f"it needs one dtype for q, k, v (got {q.dtype}, {k.dtype}, {v.dtype})"
    d = q.shape[-1]
    if d % 8 or d > 128:
        return f"it needs a head dim that is a multiple of 8 and at most 128 (got {d})"
    if v.shape[-1] != d:
        return f"it needs equal key and value head dims (got {d} and {v.shape[-1]})"
    if dropout_rate > 0.0:
        return "it does not support attention dropout here"
    if return_weights:
        return "it does not return attention weights"
    return None


@partial(jax.jit, static_argnames=("is_causal", "scale"))
def cudnn_attention(q, k, v, mask, bias, is_causal, scale):
    """cuDNN flash attention; rows with no visible key are zeroed afterwards."""
    mask, bias = as_4d(mask), as_4d(bias)
    # cuDNN takes a mask/bias only with full query and key axes ([B|1, H|1, Q, K]).
    qk = (q.shape[1], k.shape[1])
    kernel_mask = None
    if mask is not None:
        mask = jnp.broadcast_to(mask, mask.shape[:2] + qk)
        # A row with no visible key gives NaN gradients inside the kernel: let it see every
        # key there (a harmless average), and zero it afterwards as the other paths do.
        visible = mask & causal_mask(*qk)[None, None] if is_causal else mask
        kernel_mask = mask | ~visible_rows(visible)
    if bias is not None:
        bias = jnp.broadcast_to(bias, bias.shape[:2] + qk).astype(q.dtype)
    out = jax.nn.dot_product_attention(
        q, k, v, bias=bias, mask=kernel_mask, scale=scale, is_causal=is_causal,
        implementation="cudnn",
    )
    return zero_invisible_rows(out, mask, bias, is_causal, k.shape[1])

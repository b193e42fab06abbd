r"""Pallas TPU kernel of :func:`seqjax.nn.attention.dot_product_attention` (``"pallas"``).

``jax.experimental.pallas.ops.tpu.flash_attention`` on a TPU, or anywhere under
``jax.experimental.pallas.tpu.force_tpu_interpret_mode()`` (how the tests run it on CPU), then
the empty-row rule (:func:`~seqjax.nn.attention.checks.zero_invisible_rows`). Equals
:func:`~seqjax.nn.attention.dot_product.reference_attention` in output and gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from seqjax.nn.attention.checks import MASKED, as_4d, zero_invisible_rows

Array = jax.Array


def _copy_kernel(x_ref, o_ref):  # the probe's trivial kernel
    o_ref[...] = x_ref[...]


def pallas_interpret_mode() -> bool:
    """Whether Pallas's TPU interpret mode is on, read through public API: a trivial
    ``pallas_call`` is traced (never run) and its ``interpret`` parameter inspected."""
    try:
        from jax.experimental import pallas as pl
    except ImportError:  # a JAX without Pallas
        return False
    probe = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    call = pl.pallas_call(_copy_kernel, out_shape=probe)
    for eqn in jax.make_jaxpr(call)(probe).jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            return bool(eqn.params.get("interpret"))
    return False


def _pallas_seq_ok(n: int) -> bool:
    """Sequence lengths the kernel's 128-blocks tile: ≤ 128 (a multiple of 8) or 128·k."""
    return (n <= 128 and n % 8 == 0) or n % 128 == 0


def pallas_unsupported(q: Array, k: Array, v: Array, is_causal: bool, dropout_rate: float,
                       return_weights: bool, explicit: bool) -> str | None:
    """Why the Pallas TPU flash-attention kernel cannot run this call, or ``None``."""
    backend = jax.default_backend()
    if backend != "tpu" and not (explicit and pallas_interpret_mode()):
        return (f"it needs a TPU backend (the default backend is {backend!r}; off TPU, run "
                "it under jax.experimental.pallas.tpu.force_tpu_interpret_mode())")
    if q.dtype not in (jnp.float32, jnp.bfloat16) or not (q.dtype == k.dtype == v.dtype):
        return f"it needs one dtype, float32 or bfloat16, for q, k, v (got {q.dtype}, " \
               f"{k.dtype}, {v.dtype})"
    if v.shape[-1] != q.shape[-1]:
        return f"it needs equal key and value head dims (got {q.shape[-1]} and {v.shape[-1]})"
    q_len, k_len = q.shape[1], k.shape[1]
    if not (_pallas_seq_ok(q_len) and _pallas_seq_ok(k_len)):
        return ("it needs query and key lengths that are multiples of 128, or at most 128 and "
                f"multiples of 8 (got {q_len} and {k_len})")
    if is_causal and q_len != k_len:
        return f"its causal mask needs as many queries as keys (got {q_len} and {k_len})"
    if dropout_rate > 0.0:
        return "it does not support attention dropout here"
    if return_weights:
        return "it does not return attention weights"
    return None


def pallas_attention(q, k, v, mask, bias, is_causal, scale):
    """Pallas TPU flash attention; the kernel takes ``[B, H, T, D]``, so GQA's K/V are repeated.

    A key-padding mask (``[B, 1, 1, K]``) becomes segment ids (no scores materialised); any other
    mask is added as ``MASKED`` to a bias of the full ``[B, H, Q, K]`` shape, the only one the
    kernel takes. Fewer than 128 keys are padded to 128 masked keys (the backward pass tiles keys
    in 128-lane blocks). Rows with no visible key (mask, or a row of ``−∞`` bias) are zeroed after.
    """
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    b, q_len, h, d = q.shape
    k_len, hkv = k.shape[1], k.shape[2]
    if hkv != h:
        k, v = jnp.repeat(k, h // hkv, axis=2), jnp.repeat(v, h // hkv, axis=2)
    mask, bias = as_4d(mask), as_4d(bias)
    kv_ids = ab = None
    if mask is not None and bias is None and mask.shape[1] == mask.shape[2] == 1:
        kv_ids = jnp.where(jnp.broadcast_to(mask[:, 0, 0], (b, k_len)), 0, 1).astype(jnp.int32)
    elif mask is not None or bias is not None:
        ab = jnp.zeros((b, h, q_len, k_len), jnp.float32)
        if bias is not None:  # −∞ → MASKED: finite inside the kernel, zeroed below
            ab = ab + jnp.maximum(bias.astype(jnp.float32), MASKED)
        if mask is not None:
            ab = ab + jnp.where(mask, 0.0, MASKED)
        ab = ab.astype(q.dtype)
    pad = -k_len % 128  # > 0 only below 128 keys (pallas_unsupported)
    if pad:
        k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (k, v))
        if ab is not None:
            ab = jnp.pad(ab, ((0, 0),) * 3 + ((0, pad),), constant_values=MASKED)
        else:  # padded keys: a segment of their own
            kv_ids = jnp.zeros((b, k_len), jnp.int32) if kv_ids is None else kv_ids
            kv_ids = jnp.pad(kv_ids, ((0, 0), (0, pad)), constant_values=1)
    segment_ids = None if kv_ids is None else fa.SegmentIds(
        q=jnp.zeros((b, q_len), jnp.int32), kv=kv_ids)
    block_q, block_k = min(128, q_len), k_len + pad
    sizes = fa.BlockSizes(
        block_q=block_q, block_k_major=block_k, block_k=block_k, block_b=1,
        block_q_major_dkv=block_q, block_k_major_dkv=block_k, block_k_dkv=block_k,
        block_q_dkv=block_q, block_k_major_dq=block_k, block_k_dq=block_k, block_q_dq=block_q,
    )
    # The kernel scales ``q kᵀ + ab`` by ``sm_scale``; the bias must stay unscaled, so the
    # scale goes on q (as in the XLA path) and sm_scale is 1.
    q = q * jnp.asarray(scale, q.dtype)
    out = fa.flash_attention(
        q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), ab,
        segment_ids, causal=is_causal, sm_scale=1.0, block_sizes=sizes,
    ).transpose(0, 2, 1, 3)
    return zero_invisible_rows(out, mask, bias, is_causal, k_len)

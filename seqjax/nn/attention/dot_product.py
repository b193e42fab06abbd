r"""Scaled dot-product attention: the public functions, their reference, and the kernel table.

.. math::
    \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\Big(\frac{QK^\top}{\sqrt{d_k}} + B + M\Big) V

Bishop (12.14); J&M (9.39); LN (9), (13); MEDL (7.25) per head with the mask of (7.27) on the
scores. Both public functions check their arguments once
(:func:`~seqjax.nn.attention.checks.check_attention_args`) and run one kernel of
:data:`KERNELS`: :func:`reference_attention` (the definition the others are tested against) or a
fast kernel from a private module per backend (``_xla_kernels``, ``_cudnn``, ``_pallas``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp

from seqjax._checks import check_count_or_off, check_positive_int, retired_flags
from seqjax.nn.attention import _xla_kernels
from seqjax.nn.attention._cudnn import cudnn_attention, cudnn_unsupported
from seqjax.nn.attention._pallas import pallas_attention, pallas_unsupported
from seqjax.nn.attention.checks import (
    as_4d,
    check_attention_args,
    masked_weights,
)
from seqjax.nn.attention.softmax import dropout_weights
from seqjax.nn.masks import causal_mask, combine_masks, sliding_window_mask

Array = jax.Array

__all__ = [
    "dot_product_attention",
    "dot_product_attention_with_weights",
    "reference_attention",
    "KERNELS",
    "IMPLEMENTATIONS",
]


@partial(jax.jit, static_argnames=("is_causal", "scale", "dropout_rate", "return_weights"))
def reference_attention(q: Array, k: Array, v: Array, mask: Array | None, bias: Array | None,
                        is_causal: bool, scale: float, dropout_rate: float,
                        dropout_rng: Array | None, return_weights: bool) -> Any:
    r"""The definition: ``softmax(Q Kᵀ·scale + B + M) V`` with K/V repeated to every query head.

    Plain ``einsum`` in float32 (float64 for float64 inputs) and
    :func:`~seqjax.nn.attention.checks.masked_weights`, differentiated by plain autodiff (no
    custom VJP: ``jax.test_util.check_grads`` checks it, and every other kernel's gradients are
    checked against it). Arguments as :func:`dot_product_attention` after its checks.
    """
    mask, bias = as_4d(mask), as_4d(bias)
    if is_causal:
        mask = combine_masks(mask, causal_mask(q.shape[1], k.shape[1]))
    groups = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, groups, axis=2)
    v = jnp.repeat(v, groups, axis=2)
    f32 = jnp.promote_types(q.dtype, jnp.float32)  # float32, or float64 under x64
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(f32), k.astype(f32)) * scale
    if bias is not None:
        s = s + bias.astype(f32)
    w = dropout_weights(masked_weights(s, mask), dropout_rate, dropout_rng)
    out = jnp.einsum("bhqk,bkhd->bqhd", w, v.astype(f32)).astype(q.dtype)
    return (out, w) if return_weights else out


@dataclasses.dataclass(frozen=True)
class _Call:
    """One checked call of :func:`dot_product_attention`, as the kernels receive it."""

    q: Array
    k: Array
    v: Array
    mask: Array | None
    bias: Array | None
    is_causal: bool
    scale: float
    dropout_rate: float
    dropout_rng: Array | None
    return_weights: bool
    query_chunk: int
    scan_min_keys: int
    fused_rows: int

    @property
    def common(self) -> tuple[Any, ...]:
        """The arguments every kernel takes: ``(q, k, v, mask, bias, is_causal, scale)``."""
        return self.q, self.k, self.v, self.mask, self.bias, self.is_causal, self.scale


class Kernel(NamedTuple):
    """An entry of :data:`KERNELS`: how to run a call, and why it cannot (``None`` = it can)."""

    run: Callable[[_Call], Any]
    unsupported: Callable[..., str | None] | None


def _run_reference(c: _Call) -> Any:
    return reference_attention(*c.common, c.dropout_rate, c.dropout_rng, c.return_weights)


#: Implementation name → kernel. ``"auto"`` takes the first of :data:`AUTO_ORDER` whose
#: ``unsupported`` says nothing (cuDNN on a GPU, Pallas on a TPU, else XLA).
KERNELS: dict[str, Kernel] = {
    "xla": Kernel(lambda c: _xla_kernels.xla_attention(
        *c.common, c.dropout_rate, c.dropout_rng, c.return_weights, c.query_chunk,
        c.scan_min_keys, c.fused_rows), None),
    "cudnn": Kernel(lambda c: cudnn_attention(*c.common), cudnn_unsupported),
    "pallas": Kernel(lambda c: pallas_attention(*c.common), pallas_unsupported),
    "reference": Kernel(_run_reference, None),
}
AUTO_ORDER = ("cudnn", "pallas", "xla")
IMPLEMENTATIONS = ("auto", *KERNELS)


def _choose(implementation: str, q: Array, k: Array, v: Array, is_causal: bool,
            dropout_rate: float, return_weights: bool) -> str:
    """The kernel that runs: ``implementation``, or ``"auto"``'s first supported one."""
    explicit = implementation != "auto"
    for name in (implementation,) if explicit else AUTO_ORDER:
        unsupported = KERNELS[name].unsupported
        why_not = None if unsupported is None else unsupported(
            q, k, v, is_causal, dropout_rate, return_weights, explicit)
        if why_not is None:
            return name
        if explicit:
            raise ValueError(f"implementation={name!r} is unavailable: {why_not}.")
    raise AssertionError("unreachable: 'xla' always runs")  # pragma: no cover


@retired_flags(return_weights="dot_product_attention_with_weights")
def dot_product_attention(
    q_BxQxHxD: Any,
    k_BxKxGxD: Any,
    v_BxKxGxV: Any,
    *,
    mask: Any = None,
    bias: Any = None,
    is_causal: bool = False,
    window: int = 0,
    scale: float | None = None,
    implementation: str = "auto",
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    query_chunk: int = _xla_kernels.QUERY_CHUNK,
    scan_min_keys: int = _xla_kernels.SCAN_MIN_KEYS,
    fused_rows: int = _xla_kernels.FUSED_ROWS,
) -> Array:
    r"""Scaled dot-product attention over heads, with masks, bias, GQA/MQA, windows and dropout.

    .. math::
        \mathrm{softmax}\Big(\frac{QK^\top}{\sqrt{d_k}} + B + M\Big) V,\qquad
        M_{ij} = \begin{cases}0 & \text{mask}_{ij}\\ -\infty & \text{otherwise}\end{cases}

    (citations: module docstring). Heads are independent; with ``G`` kv heads (``G | H``) query
    head ``h`` reads kv head ``h // (H/G)`` (GQA; ``G = 1`` is MQA). The softmax runs in float32
    whatever the input dtype; a query row with no visible key returns exactly zeros (and zero
    gradients), never NaN (:mod:`seqjax.nn.attention.checks`). Every implementation equals
    ``"reference"`` in output and gradients.

    Args:
        q_BxQxHxD: queries ``[B, Q, H, D]``.
        k_BxKxGxD: keys ``[B, K, G, D]``.
        v_BxKxGxV: values ``[B, K, G, Dv]``.
        mask: boolean, broadcastable to ``[B, H, Q, K]`` (``True`` = attend).
        bias: additive score bias broadcastable to ``[B, H, Q, K]`` (e.g. ALiBi).
        is_causal: keep keys ``j ≤ i`` (:func:`~seqjax.nn.masks.causal_mask`, top-left aligned
            as in PyTorch's ``scaled_dot_product_attention`` and ``jax.nn.dot_product_attention``).
        window: ``w ≥ 1`` keeps ``i − w < j ≤ i`` (causal local attention, implies ``is_causal``;
            :func:`~seqjax.nn.masks.sliding_window_mask`); ``0`` = no window.
        scale: score scale (default ``1/√D``).
        implementation: ``"auto"`` (cuDNN on a GPU, Pallas on a TPU, when they can run the
            call; else ``"xla"``), ``"xla"`` (the fast CPU/TPU path, ``_xla_kernels``),
            ``"reference"`` (plain einsum and autodiff, K/V repeated: the definition),
            ``"cudnn"`` (``jax.nn.dot_product_attention``'s flash attention: a GPU,
            float16/bfloat16, head dim ≤ 128) or ``"pallas"`` (the Pallas TPU flash-attention
            kernel: a TPU or ``pltpu.force_tpu_interpret_mode()``, float32/bfloat16, equal key
            and value head dims, lengths that tile into 128-blocks); an explicit one that cannot
            run the call is a ``ValueError``.
        dropout_rate: attention-weight dropout (needs ``dropout_rng``, a PRNG key).
        query_chunk, scan_min_keys, fused_rows: ``"xla"`` only (its sub-paths:
            :mod:`~seqjax.nn.attention._xla_kernels`): query rows per chunk of the causal and
            scan paths (default 128); the key count from which non-causal attention loops over
            query chunks, recomputing the scores in the backward pass (default 1024); query rows
            per fused chunk outside ``jax.grad`` (default 128).

    Returns:
        ``out [B, Q, H, Dv]`` in the inputs' dtype (weights:
        :func:`dot_product_attention_with_weights`).

    Example:
        >>> x = jnp.eye(4)[None, :, None, :]  # 4 orthogonal tokens, one head
        >>> dot_product_attention(x, x, x, window=2, scale=0.0)[0, :, 0].round(2).tolist()
        [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.5, 0.5]]
    """
    return cast(Array, _attention(
        q_BxQxHxD, k_BxKxGxD, v_BxKxGxV, mask, bias, is_causal, window, scale, implementation,
        dropout_rate, dropout_rng, query_chunk, scan_min_keys, fused_rows, return_weights=False))


def dot_product_attention_with_weights(
    q_BxQxHxD: Any,
    k_BxKxGxD: Any,
    v_BxKxGxV: Any,
    *,
    mask: Any = None,
    bias: Any = None,
    is_causal: bool = False,
    window: int = 0,
    scale: float | None = None,
    implementation: str = "auto",
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    query_chunk: int = _xla_kernels.QUERY_CHUNK,
    scan_min_keys: int = _xla_kernels.SCAN_MIN_KEYS,
    fused_rows: int = _xla_kernels.FUSED_ROWS,
) -> tuple[Array, Array]:
    """:func:`dot_product_attention` (same arguments, checks and kernels) and its weights.

    Returns:
        ``(out [B, Q, H, Dv], weights f32[B, H, Q, K])``: ``out`` as from
        :func:`dot_product_attention`; the weights are the softmax probabilities (after dropout,
        if any) that multiply ``V``, all zero on a row with no visible key. ``"cudnn"`` and
        ``"pallas"`` cannot write them (a ``ValueError``; ``"auto"`` runs ``"xla"``).

    Example:
        >>> q = jnp.ones((2, 3, 4, 8)); kv = jnp.ones((2, 5, 2, 8))
        >>> out, w = dot_product_attention_with_weights(q, kv, kv, is_causal=True)
        >>> out.shape, w.shape, w[0, 0, 1].tolist()
        ((2, 3, 4, 8), (2, 4, 3, 5), [0.5, 0.5, 0.0, 0.0, 0.0])
    """
    return cast(tuple[Array, Array], _attention(
        q_BxQxHxD, k_BxKxGxD, v_BxKxGxV, mask, bias, is_causal, window, scale, implementation,
        dropout_rate, dropout_rng, query_chunk, scan_min_keys, fused_rows, return_weights=True))


def _attention(
    q_BxQxHxD: Any, k_BxKxGxD: Any, v_BxKxGxV: Any, mask: Any, bias: Any, is_causal: bool,
    window: int, scale: float | None, implementation: str, dropout_rate: float,
    dropout_rng: Array | None, query_chunk: int, scan_min_keys: int, fused_rows: int, *,
    return_weights: bool,
) -> Any:
    """The body of both public functions, their arguments in order (``return_weights`` chooses
    the result)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {IMPLEMENTATIONS}; got {implementation!r}."
        )
    q, k, v, mask, bias = check_attention_args(q_BxQxHxD, k_BxKxGxD, v_BxKxGxV, mask, bias,
                                               dropout_rate, dropout_rng)
    for name, value in (("query_chunk", query_chunk), ("scan_min_keys", scan_min_keys),
                        ("fused_rows", fused_rows)):
        check_positive_int(value, name)
    window = check_count_or_off(window, "window", "dot_product_attention",
                                "no window, every key")
    b, q_len, h, d = q.shape
    k_len = k.shape[1]
    if 0 in (b, q_len, k_len):
        # Nothing to attend: every row sees no key and is zero, as a fully masked row is.
        out = jnp.zeros((b, q_len, h, v.shape[-1]), q.dtype)
        return (out, jnp.zeros((b, h, q_len, k_len), jnp.float32)) if return_weights else out
    if window:  # a band below the diagonal: causal, so the causal paths apply
        mask = combine_masks(mask, sliding_window_mask(q_len, k_len, window=window))
        is_causal = True
    name = _choose(implementation, q, k, v, bool(is_causal), dropout_rate,
                   bool(return_weights))
    return KERNELS[name].run(_Call(
        q, k, v, mask, bias, is_causal=bool(is_causal),
        scale=1.0 / math.sqrt(d) if scale is None else float(scale),
        dropout_rate=float(dropout_rate), dropout_rng=dropout_rng,
        return_weights=bool(return_weights), query_chunk=query_chunk,
        scan_min_keys=scan_min_keys, fused_rows=fused_rows,
    ))

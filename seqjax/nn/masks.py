"""Boolean attention masks (``True`` = attend).

A mask acts on the attention **scores** before the softmax, ``softmax(M + QKᵀ/√d_k)`` of LN (13):
the scores of masked keys become ``-inf``. (MEDL (7.27) sets the masked key vectors ``z_k`` to
``-∞``, which would make their scores NaN; its intent, zero weight on each masked key, is this.)
Every helper returns a boolean array that broadcasts against scores ``[B, H, Q, K]``, so masks
compose with ``&`` (:func:`combine_masks`).

Variable length is ``lengths: int32[B]`` with right padding (docs/design.md, "Conventions"):
position ``t`` of row ``b`` is real iff ``t < lengths[b]``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import (
    check_bool,
    check_integer,
    check_lengths,
    check_positive_int,
    check_rank,
    lengths_array,
)

Array = jax.Array

__all__ = [
    "causal_mask",
    "sliding_window_mask",
    "padding_mask",
    "make_attention_mask",
    "segment_mask",
    "combine_masks",
]


def causal_mask(q_len: int, kv_len: int | None = None, *, offset: Any = 0) -> Array:
    r"""Causal (autoregressive) mask: query ``i`` sees keys ``j ≤ i + offset``.

    MEDL (7.23)/(7.27); J&M §9.7 ("masked" upper triangle); Bishop §12.3.1 (Fig. 12.16); LN (13).

    Args:
        q_len: number of queries ``Q``.
        kv_len: number of keys ``K`` (default ``Q``).
        offset: absolute position of query 0 on the key axis (e.g. tokens already in a KV cache): an
            int, a scalar array or an ``int32[B]`` array (one per row; traced values allowed).

    Returns:
        ``bool[Q, K]`` (scalar offset) or ``bool[B, 1, Q, K]`` (per-row offset).

    Example:
        >>> causal_mask(3).astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    kv_len, offset = _check_positions(q_len, kv_len, offset)
    return _causal(q_len, kv_len, offset)


def sliding_window_mask(q_len: int, kv_len: int | None = None, *, window: int,
                        offset: Any = 0) -> Array:
    r"""Causal sliding-window (local) mask ``M_ij = [p_i − w < j ≤ p_i]``, ``p_i = i + offset``.

    Query ``i`` sees the ``window`` keys ending at itself: at most ``w`` keys (itself and the
    ``w − 1`` before); ``window ≥ kv_len + offset`` gives :func:`causal_mask`, and ``L`` stacked
    layers reach ``L·(w − 1)`` positions back. The causal (Mistral 7B, Jiang et al. 2023) form of
    Longformer's local attention (Beltagy et al. 2020, §3.1, whose window is centred on ``i``).

    Args:
        q_len: number of queries ``Q``.
        kv_len: number of keys ``K`` (default ``Q``).
        window: ``w ≥ 1`` keys per query, itself included (else ``ValueError``).
        offset: position of query 0 on the key axis, as in :func:`causal_mask`.

    Returns:
        ``bool[Q, K]`` (scalar offset) or ``bool[B, 1, Q, K]`` (per-row offset).

    Example:
        >>> sliding_window_mask(4, window=2).astype(int).tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    """
    check_positive_int(window, "window")
    kv_len, offset = _check_positions(q_len, kv_len, offset)
    return _sliding_window(q_len, kv_len, window, offset)


def _check_positions(q_len: Any, kv_len: Any, offset: Any) -> tuple[int, Array]:
    if not isinstance(q_len, int) or q_len < 0:
        raise ValueError(f"`q_len` must be a non-negative int; got {q_len!r}.")
    kv_len = q_len if kv_len is None else kv_len
    if not isinstance(kv_len, int) or kv_len < 0:
        raise ValueError(f"`kv_len` must be a non-negative int; got {kv_len!r}.")
    offset = jnp.asarray(offset)
    check_integer(offset, "offset")
    check_rank(offset, "offset", (0, 1))
    return kv_len, offset


def _key_and_query_positions(q_len: int, kv_len: int, offset: Array) -> tuple[Array, Array]:
    """Key positions and absolute query positions, broadcast to ``[Q, K]`` or ``[B, 1, Q, K]``."""
    q_pos = jnp.arange(q_len, dtype=jnp.int32)
    k_pos = jnp.arange(kv_len, dtype=jnp.int32)
    if offset.ndim == 0:
        return k_pos[None, :], q_pos[:, None] + offset
    return k_pos[None, None, None, :], (q_pos[None, :] + offset[:, None])[:, None, :, None]


@partial(jax.jit, static_argnums=(0, 1))
def _causal(q_len: int, kv_len: int, offset: Array) -> Array:
    k_pos, p = _key_and_query_positions(q_len, kv_len, offset)
    return k_pos <= p


@partial(jax.jit, static_argnums=(0, 1, 2))
def _sliding_window(q_len: int, kv_len: int, window: int, offset: Array) -> Array:
    k_pos, p = _key_and_query_positions(q_len, kv_len, offset)
    return (k_pos <= p) & (k_pos > p - window)


def padding_mask(lengths_B: Any, max_len: int) -> Array:
    r"""Right-padding mask from per-row lengths: ``valid[b, t] = t < lengths[b]``.

    Args:
        lengths_B: ``int[B]`` lengths in ``[0, max_len]``, or a
            :class:`~seqjax._checks.ValidLengths` (already checked: not read again).
        max_len: padded length ``T``.

    Returns:
        ``bool[B, T]``.

    Example:
        >>> padding_mask(jnp.array([1, 3]), 3).astype(int).tolist()
        [[1, 0, 0], [1, 1, 1]]
    """
    if not isinstance(max_len, int) or max_len < 0:
        raise ValueError(f"`max_len` must be a non-negative int; got {max_len!r}.")
    check_rank(lengths_array(lengths_B), "lengths", 1)
    batch = np.shape(lengths_array(lengths_B))[0]
    return _padding(check_lengths(lengths_B, "lengths", batch, max_len).value, max_len)


@partial(jax.jit, static_argnums=1)
def _padding(lengths_B: Array, max_len: int) -> Array:
    return jnp.arange(max_len, dtype=jnp.int32)[None, :] < lengths_B[:, None]


def _query_key_pair(
    q_BxQ: Any, k_BxK: Any, check: Callable[[Any, str], None], q_name: str, k_name: str
) -> tuple[Array, Array]:
    """``(q, k)`` as arrays, each checked by ``check`` (its dtype) and of rank 2, with one batch
    size; errors name ``q_name`` and ``k_name``."""
    q = jnp.asarray(q_BxQ)
    k = jnp.asarray(k_BxK)
    check(q, q_name)
    check(k, k_name)
    check_rank(q, q_name, 2)
    check_rank(k, k_name, 2)
    if q.shape[0] != k.shape[0]:
        raise ValueError(
            f"`{q_name}` and `{k_name}` must share the batch size; got {q.shape} and {k.shape}."
        )
    return q, k


def make_attention_mask(query_valid_BxQ: Any, key_valid_BxK: Any) -> Array:
    r"""Pairwise mask from per-position validity: ``M[b, 0, i, j] = q[b, i] ∧ k[b, j]``.

    Args:
        query_valid_BxQ: ``bool[B, Q]``.
        key_valid_BxK: ``bool[B, K]`` (the same ``B``, else ``ValueError``).

    Returns:
        ``bool[B, 1, Q, K]`` (the head axis broadcasts).

    Example:
        >>> m = make_attention_mask(jnp.array([[True, False]]), jnp.array([[True, True, False]]))
        >>> m.shape, m[0, 0].astype(int).tolist()
        ((1, 1, 2, 3), [[1, 1, 0], [0, 0, 0]])
    """
    q, k = _query_key_pair(query_valid_BxQ, key_valid_BxK, check_bool, "query_valid", "key_valid")
    return q[:, None, :, None] & k[:, None, None, :]


def segment_mask(segment_ids_q_BxQ: Any, segment_ids_kv_BxK: Any) -> Array:
    r"""Packed-sequence mask: attend only within the same segment id.

    ``M[b, 0, i, j] = (seg_q[b, i] == seg_kv[b, j])``. Combine with :func:`causal_mask` for packed
    causal LM training. Give padding its own id (e.g. 0) and, if it must see nothing, AND with a
    padding mask.

    Example:
        >>> s = jnp.array([[1, 1, 2]])
        >>> segment_mask(s, s)[0, 0].astype(int).tolist()
        [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    """
    q, k = _query_key_pair(
        segment_ids_q_BxQ, segment_ids_kv_BxK, check_integer, "segment_ids_q", "segment_ids_kv"
    )
    return q[:, None, :, None] == k[:, None, None, :]


def combine_masks(*masks: Any) -> Array | None:
    """Logical AND of the non-``None`` masks (numpy broadcasting), or ``None`` if all are ``None``.

    Example:
        >>> combine_masks(None, causal_mask(2), jnp.array([True, False])).astype(int).tolist()
        [[1, 0], [1, 0]]
    """
    present = [jnp.asarray(m) for m in masks if m is not None]
    if not present:
        return None
    for i, m in enumerate(present):
        check_bool(m, f"masks[{i}]")
    out = present[0]
    for m in present[1:]:
        out = jnp.logical_and(out, m)
    return out

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
from functools import partial, reduce
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

__all__ = ["causal_mask", "sliding_window_mask", "padding_mask", "make_attention_mask",
           "segment_mask", "combine_masks"]


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
    return _causal(q_len, kv_len, None, offset)


def sliding_window_mask(q_len: int, kv_len: int | None = None, *, window: int,
                        offset: Any = 0) -> Array:
    r"""Causal sliding-window (local) mask ``M_ij = [p_i − w < j ≤ p_i]``, ``p_i = i + offset``.

    Query ``i`` sees the ``window`` keys ending at itself: at most ``w`` keys (itself and the
    ``w − 1`` before); ``window ≥ kv_len + offset`` gives :func:`causal_mask`, and ``L`` stacked
    layers reach ``L·(w − 1)`` positions back. The causal (Mistral 7B, Jiang et al. 2023) form of
    Longformer's local attention (Beltagy et al. 2020, §3.1, whose window is centred on ``i``).

    Args:
        q_len, kv_len, offset: as in :func:`causal_mask`.
        window: ``w ≥ 1`` keys per query, itself included (else ``ValueError``).

    Returns:
        ``bool[Q, K]`` (scalar offset) or ``bool[B, 1, Q, K]`` (per-row offset).

    Example:
        >>> sliding_window_mask(4, window=2).astype(int).tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    """
    check_positive_int(window, "window")
    kv_len, offset = _check_positions(q_len, kv_len, offset)
    return _causal(q_len, kv_len, window, offset)


def _check_sizes(**sizes: Any) -> None:
    """Each a non-negative int (a length), else a ``ValueError`` naming it."""
    for name, value in sizes.items():
        if not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"`{name}` must be a non-negative int; got {value!r}.")


def _check_offset(offset: Any) -> Array:
    offset = jnp.asarray(offset)
    check_integer(offset, "offset")
    check_rank(offset, "offset", (0, 1))
    return offset


def _check_positions(q_len: Any, kv_len: Any, offset: Any) -> tuple[int, Array]:
    kv_len = q_len if kv_len is None else kv_len
    _check_sizes(q_len=q_len, kv_len=kv_len)
    return kv_len, _check_offset(offset)


def _key_and_query_positions(q_len: int, kv_len: int, offset: Array) -> tuple[Array, Array]:
    """Key positions and absolute query positions, broadcast to ``[Q, K]`` or ``[B, 1, Q, K]``."""
    q_pos, k_pos = jnp.arange(q_len, dtype=jnp.int32), jnp.arange(kv_len, dtype=jnp.int32)
    if offset.ndim == 0:
        return k_pos[None, :], q_pos[:, None] + offset
    return k_pos[None, None, None, :], (q_pos[None, :] + offset[:, None])[:, None, :, None]


@partial(jax.jit, static_argnums=(0, 1, 2))
def _causal(q_len: int, kv_len: int, window: int | None, offset: Array) -> Array:
    """``k ≤ p`` (causal) and, with a ``window``, ``k > p − window``."""
    k_pos, p = _key_and_query_positions(q_len, kv_len, offset)
    return k_pos <= p if window is None else (k_pos <= p) & (k_pos > p - window)


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
    _check_sizes(max_len=max_len)
    check_rank(lengths_array(lengths_B), "lengths", 1)
    batch = np.shape(lengths_array(lengths_B))[0]
    return _padding(check_lengths(lengths_B, "lengths", batch, max_len).value, max_len)


@partial(jax.jit, static_argnums=1)
def _padding(lengths_B: Array, max_len: int) -> Array:
    return jnp.arange(max_len, dtype=jnp.int32)[None, :] < lengths_B[:, None]


def _pairwise(q_BxQ: Any, k_BxK: Any, check: Callable[[Any, str], None], q_name: str,
              k_name: str, op: Callable[[Array, Array], Array]) -> Array:
    """``M[b, 0, i, j] = op(q[b, i], k[b, j])``; ``q`` and ``k`` are checked by ``check`` (their
    dtype), of rank 2 and with one batch size, errors naming ``q_name`` and ``k_name``."""
    q, k = jnp.asarray(q_BxQ), jnp.asarray(k_BxK)
    for a, name in ((q, q_name), (k, k_name)):
        check(a, name)
        check_rank(a, name, 2)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"`{q_name}` and `{k_name}` must share the batch size; got {q.shape} "
                         f"and {k.shape}.")
    return op(q[:, None, :, None], k[:, None, None, :])


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
    return _pairwise(query_valid_BxQ, key_valid_BxK, check_bool, "query_valid", "key_valid",
                     jnp.logical_and)


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
    return _pairwise(segment_ids_q_BxQ, segment_ids_kv_BxK, check_integer, "segment_ids_q",
                     "segment_ids_kv", jnp.equal)


def combine_masks(*masks: Any) -> Array | None:
    """Logical AND of the non-``None`` masks (numpy broadcasting), or ``None`` if all are ``None``.

    Example:
        >>> combine_masks(None, causal_mask(2), jnp.array([True, False])).astype(int).tolist()
        [[1, 0], [1, 0]]
    """
    present = [jnp.asarray(m) for m in masks if m is not None]
    for i, m in enumerate(present):
        check_bool(m, f"masks[{i}]")
    return reduce(jnp.logical_and, present) if present else None

r"""Key/value cache for autoregressive decoding: :class:`KVCache` and its write.

The keys and values of earlier positions are stored, and new queries attend to them with the
causal mask at absolute positions, ``M_{ij} = [j ≤ lengths_b + i]`` (MEDL (7.23)/(7.27);
J&M §9.7; Bishop §12.3.2), or a sliding window ``[lengths_b + i − w < j ≤ lengths_b + i]``
(:func:`~seqjax.nn.masks.sliding_window_mask`). Cached decoding equals the full causal pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import check_integer, check_positive_ints, check_range, check_rank, is_concrete
from seqjax._traced_checks import poison, record
from seqjax.nn.masks import causal_mask, sliding_window_mask

Array = jax.Array
Dtype = Any

__all__ = ["KVCache"]


@flax.struct.dataclass
class KVCache:
    r"""Key/value cache for autoregressive decoding, an explicit pytree.

    Fields: ``k [B, S, G, D]`` and ``v [B, S, G, Dv]``, the stored keys and values (``S`` =
    ``max_len``, ``G`` kv heads); ``lengths int32[B]``, tokens stored per row; ``overflow
    int32[B]``, tokens dropped by a jitted write to a full cache (0 = none). Aliases:
    ``k_BxSxHkvxD``, ``v_BxSxHkvxD``, ``lengths_B``.

    Overflow: a write past ``max_len`` is a ``ValueError`` when ``lengths`` are concrete. Under
    ``jit`` (:mod:`seqjax._traced_checks`) the tokens past the end are dropped (never written
    over earlier entries) and counted in ``overflow``, and the row's last slot becomes NaN, so
    the overflowing query and every later query of the row read NaN rather than a cache that
    silently lost tokens; check ``overflow`` (or :attr:`overflowed`) after a jitted loop, or run
    it under ``seqjax.checked`` for an error. A sliding window that no longer reaches the last
    slot sees no key (a fully masked row's output).

    Row ``b`` writes at its own offset ``lengths[b]``, so right-padded prompts of different
    lengths decode correctly: prefill the padded batch with ``lengths=prompt_lengths``; later
    writes overwrite the padding.

    Example:
        >>> c = KVCache.create(batch=2, max_len=8, num_kv_heads=1, head_dim=4)
        >>> c = c.update(jnp.ones((2, 3, 1, 4)), jnp.ones((2, 3, 1, 4)), jnp.array([3, 2]))
        >>> c.lengths.tolist(), c.max_len
        ([3, 2], 8)
    """

    k: Array
    v: Array
    lengths: Array
    overflow: Array | None = None

    if TYPE_CHECKING:
        # flax.struct.dataclass adds it at runtime: dataclasses.replace(self, **changes).
        def replace(self, **changes: Any) -> KVCache: ...

    @classmethod
    def create(
        cls,
        batch: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: Dtype = jnp.float32,
        value_head_dim: int | None = None,
    ) -> KVCache:
        """Empty cache: zeros ``[batch, max_len, num_kv_heads, head_dim]`` and ``lengths = 0``."""
        check_positive_ints(batch=batch, max_len=max_len, num_kv_heads=num_kv_heads,
                            head_dim=head_dim)
        dv = head_dim if value_head_dim is None else value_head_dim
        return cls(
            k=jnp.zeros((batch, max_len, num_kv_heads, head_dim), dtype),
            v=jnp.zeros((batch, max_len, num_kv_heads, dv), dtype),
            lengths=jnp.zeros((batch,), jnp.int32),
            overflow=jnp.zeros((batch,), jnp.int32),
        )

    @property
    def max_len(self) -> int:
        return self.k.shape[1]

    @property
    def overflowed(self) -> Array:
        """``bool[B]``: rows that lost tokens to a full cache (under ``jit``)."""
        if self.overflow is None:
            return jnp.zeros(self.lengths.shape, bool)
        return self.overflow > 0

    k_BxSxHkvxD = property(lambda self: self.k)
    v_BxSxHkvxD = property(lambda self: self.v)
    lengths_B = property(lambda self: self.lengths)

    def update(self, k_BxTxGxD: Array, v_BxTxGxV: Array, num_new: Any = None) -> KVCache:
        """Write ``T`` new tokens per row at offset ``lengths[b]``; advance by ``num_new`` (or T).

        ``num_new`` (``int[B]``, ≤ T): the real tokens per row of a right-padded chunk (the
        padding is written too, then overwritten by the next update). Overflow: see the class.
        """
        b, s = self.k.shape[:2]
        check_rank(k_BxTxGxD, "k", 4)
        if k_BxTxGxD.shape[0] != b or k_BxTxGxD.shape[2:] != self.k.shape[2:]:
            raise ValueError(
                f"new keys must have shape [{b}, T, {self.k.shape[2]}, {self.k.shape[3]}] to fit "
                f"the cache; got {k_BxTxGxD.shape}."
            )
        t = k_BxTxGxD.shape[1]
        if v_BxTxGxV.shape != (b, t, *self.v.shape[2:]):
            raise ValueError(
                f"new values must have shape {(b, t, *self.v.shape[2:])}; got {v_BxTxGxV.shape}."
            )
        if num_new is None:
            num_new = jnp.full((b,), t, jnp.int32)
        else:
            num_new = jnp.asarray(num_new)
            check_integer(num_new, "lengths")
            check_rank(num_new, "lengths", 1)
            check_range(num_new, "lengths", 0, t)
            num_new = jnp.broadcast_to(num_new.astype(jnp.int32), (b,))
        if is_concrete(self.lengths):
            longest = int(np.max(np.asarray(self.lengths) + t)) if b else 0
            if longest > s:
                raise ValueError(
                    f"KV cache overflow: writing {t} tokens at lengths "
                    f"{np.asarray(self.lengths).tolist()} needs {longest} slots but "
                    f"max_len={s}."
                )
        else:
            need_B = self.lengths + num_new
            record(
                need_B <= s,
                f"KV cache overflow: writing up to {t} tokens per row needs up to {{need}} "
                f"slots but max_len={s} (lengths before the write: {{lengths}}).",
                need=jnp.max(need_B), lengths=self.lengths,
            )
        return _cache_write(self, k_BxTxGxD, v_BxTxGxV, num_new)

    def attention_mask(self, q_len: int, window: int = 0) -> Array:
        """Mask ``bool[B, 1, q_len, S]`` for ``q_len`` new tokens; call it *before* :meth:`update`.

        Query ``i`` of row ``b`` (absolute position ``p = lengths[b] + i``; slot ``j`` holds
        position ``j``) sees slots ``j ≤ p``: the stored tokens and the new ones up to itself;
        with ``window = w`` (0: no window) only ``p − w < j ≤ p``
        (:func:`~seqjax.nn.masks.sliding_window_mask`).
        """
        if not window:
            return causal_mask(q_len, self.max_len, offset=self.lengths)
        return sliding_window_mask(q_len, self.max_len, window=window, offset=self.lengths)


@jax.jit
def _cache_write(cache: KVCache, k_BxTxGxD: Array, v_BxTxGxV: Array, num_new: Array) -> KVCache:
    """Scatter each row's new tokens at ``lengths[b] + t`` (out-of-range writes dropped); the
    last slot of a row that lost real tokens becomes NaN."""
    b, t = k_BxTxGxD.shape[:2]
    pos_BxT = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    rows_Bx1 = jnp.arange(b, dtype=jnp.int32)[:, None]
    k = cache.k.at[rows_Bx1, pos_BxT].set(k_BxTxGxD.astype(cache.k.dtype), mode="drop")
    v = cache.v.at[rows_Bx1, pos_BxT].set(v_BxTxGxV.astype(cache.v.dtype), mode="drop")
    wanted = cache.lengths + num_new
    over_B = wanted > cache.k.shape[1]
    # NaN in the last slot (a [B, G, D] select, not a pass over the cache): every query
    # at or past the end attends to it, so the overflowing row's outputs are NaN.
    k = k.at[:, -1].set(poison(k[:, -1], ~over_B))
    v = v.at[:, -1].set(poison(v[:, -1], ~over_B))
    lengths = jnp.minimum(wanted, cache.k.shape[1])
    overflow = None if cache.overflow is None else cache.overflow + (wanted - lengths)
    return cache.replace(k=k, v=v, lengths=lengths, overflow=overflow)

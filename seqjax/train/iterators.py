"""Checkpointable batch iterators: their position is a small JSON dict saved with each checkpoint.

The training loop (:func:`seqjax.train.loop.fit`) accepts any iterator of batches; one
with ``get_state() -> dict`` and ``set_state(dict)`` resumes exactly where the
checkpoint was taken (others are fast-forwarded by skipping batches).
:class:`ArrayIterator` is such an iterator over in-memory arrays, with a per-epoch
shuffle that depends only on ``(seed, epoch)`` and per-process sharding for multi-host
runs (each process yields its own rows of every global batch).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["ArrayIterator"]


class ArrayIterator(Iterator[dict[str, np.ndarray]]):
    """Endless mini-batches ``{name: array[b, ...]}`` from equal-length arrays.

    Each epoch visits ``⌊N / global_batch_size⌋`` batches (the remainder is dropped) in
    the order ``permutation(N)`` drawn from ``np.random.default_rng([seed, epoch])``
    (or in order, ``shuffle=False``). With ``num_shards`` blocks (default 1: the whole
    global batch), shard ``shard_index`` gets rows ``[i·b, (i+1)·b)`` of each global batch, ``b =
    global_batch_size / num_shards``.

    State: ``{"epoch": int, "index": int}`` (the next batch).

    Example:
        >>> it = ArrayIterator({"x": np.arange(10)}, global_batch_size=4, shuffle=False)
        >>> next(it)["x"].tolist(), it.get_state()
        ([0, 1, 2, 3], {'epoch': 0, 'index': 1})
    """

    def __init__(
        self,
        arrays: Mapping[str, Any],
        global_batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_shards: int | None = None,
        shard_index: int | None = None,
    ) -> None:
        self.arrays = {k: np.asarray(v) for k, v in arrays.items()}
        if not self.arrays:
            raise ValueError("`arrays` must hold at least one array.")
        lengths = {k: v.shape[0] if v.ndim else None for k, v in self.arrays.items()}
        n = next(iter(lengths.values()))
        if any(v != n for v in lengths.values()) or n is None:
            raise ValueError(f"`arrays` must share their leading length; got {lengths}.")
        if not 0 < global_batch_size <= n:
            raise ValueError(f"`global_batch_size` must lie in [1, {n}]; got {global_batch_size}.")
        # Default: the whole global batch. Multi-process runs pass the mesh's blocks
        # (Parallel.iterator_shard(): processes sharing batch shards feed the same rows).
        self.num_shards = 1 if num_shards is None else num_shards
        self.shard_index = 0 if shard_index is None else shard_index
        if global_batch_size % self.num_shards:
            raise ValueError(
                f"`global_batch_size` ({global_batch_size}) must be divisible by the number of "
                f"shards ({self.num_shards})."
            )
        self.n = n
        self.global_batch_size = global_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.index = 0
        self._order: np.ndarray | None = None

    @property
    def batches_per_epoch(self) -> int:
        return self.n // self.global_batch_size

    def _epoch_order(self) -> np.ndarray:
        if self._order is None:
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
            else:
                self._order = np.arange(self.n)
        return self._order

    def __iter__(self) -> ArrayIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.index >= self.batches_per_epoch:
            self.epoch, self.index, self._order = self.epoch + 1, 0, None
        b = self.global_batch_size
        rows = self._epoch_order()[self.index * b : (self.index + 1) * b]
        per = b // self.num_shards
        rows = rows[self.shard_index * per : (self.shard_index + 1) * per]
        self.index += 1
        return {k: v[rows] for k, v in self.arrays.items()}

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def set_state(self, state: Mapping[str, Any]) -> None:
        try:
            epoch, index = int(state["epoch"]), int(state["index"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"`state` must be {{'epoch': int, 'index': int}}; got {state!r}."
            ) from err
        self.epoch, self.index, self._order = epoch, index, None

"""Training windows from token shards on disk: step ``s``'s batch is a function of ``(seed, s)``.

:class:`ShardWindows` draws each step's global batch of ``G`` windows of ``T + 1`` tokens from
every training shard (nanoGPT's ``get_batch`` over :func:`~seqjax.data.shards.open_tokens`'s
memmaps):

* step ``s``'s ``G`` start offsets come from ``np.random.default_rng([seed, s])``, uniform over
  every window that fits inside one shard (``align="random"``) or over the documents' first
  tokens (``align="document"``: each window starts at an EOT);
* this process keeps rows ``[i·B, (i+1)·B)`` (``B = G / processes``,
  :meth:`seqjax.train.parallel.Parallel.host_rows`) and reads only those from disk;
  :meth:`~seqjax.train.parallel.Parallel.place` builds the global array;
* the position is the step alone (levanter's way): a checkpoint records the step and the
  configuration (seed, global batch, block, token count), so a run resumes on any number of
  processes with the same batches bit for bit.

With ``FitConfig(prefetch=k)`` (default 2 on accelerators) a background thread reads and places
the next batches while the current step runs.

Example:
    >>> import tempfile, os, numpy as np
    >>> from seqjax.data.shards import open_tokens, write_shard
    >>> d = tempfile.mkdtemp()
    >>> write_shard(os.path.join(d, "x_val_000000.bin"), np.arange(50))
    >>> write_shard(os.path.join(d, "x_train_000001.bin"), np.arange(500) % 97)
    >>> data = open_tokens(d, vocab_size=97)
    >>> it = ShardWindows(data.train, batch_size=4, block_size=16, seed=0)
    >>> b = next(it)
    >>> b["inputs"].shape, bool((b["targets"][:, :-1] == b["inputs"][:, 1:]).all())
    ((4, 16), True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from seqjax._checks import check_positive_ints, check_vocab_ids, renamed_keywords
from seqjax.data.iterators import HOST_RENAMES, ResumableIterator, _iterator_host

__all__ = ["ALIGNS", "LMWindowIterator", "ShardWindows", "ValidationWindows"]

ALIGNS = ("random", "document")


class ShardWindows(ResumableIterator):
    """Endless random windows over token shards (see the module docstring).

    Args:
        shards: 1-D integer arrays (memmaps from :func:`~seqjax.data.shards.open_tokens`, which
            checked the ids).
        batch_size: this process's rows per step (the global batch over ``host_count``).
        block_size: ``T``; each row holds ``T + 1`` consecutive tokens of one shard.
        seed: the windows of step ``s`` depend on ``(seed, s)`` only.
        align: ``"random"`` (any start) or ``"document"`` (starts at an ``eot``; needs ``eot``).
        host_index, host_count: this process's block of rows (default: the whole global batch; a
            multi-process run passes ``Parallel.host_rows()``).
        steps: stop after this many steps (``None``: endless).
        source: e.g. the ``--data`` path; recorded in the state (not compared) to name the data.

    Yields ``{"inputs": int32[B, T], "targets": int32[B, T]}`` (targets shifted by one).
    """

    kind = "shard_windows"

    @renamed_keywords(**HOST_RENAMES)
    def __init__(self, shards: Sequence[np.ndarray], batch_size: int, block_size: int, *,
                 seed: int = 0, align: str = "random", eot: int | None = None,
                 host_index: int | None = None, host_count: int | None = None,
                 steps: int | None = None, source: str | None = None) -> None:
        check_positive_ints(batch_size=batch_size, block_size=block_size)
        self.source = source
        if align not in ALIGNS:
            raise ValueError(f"`align` must be one of {ALIGNS}; got {align!r}.")
        self.shards = [np.asarray(s) if not isinstance(s, np.ndarray) else s for s in shards]
        if not self.shards:
            raise ValueError("`shards` is empty: no training tokens.")
        for i, s in enumerate(self.shards):
            if s.ndim != 1 or not np.issubdtype(s.dtype, np.integer):
                raise ValueError(f"shard {i} must be 1-D integer ids; got {s.dtype} {s.shape}.")
        self.batch_size, self.block_size, self.seed = int(batch_size), int(block_size), seed
        self.align, self.steps, self.step = align, steps, 0
        self.host_index, self.host_count = _iterator_host(host_index, host_count)
        if align == "random":
            # shard i has len - T starts whose window of T + 1 tokens fits inside it
            counts = np.array([max(len(s) - self.block_size, 0) for s in self.shards], np.int64)
            self._starts: list[np.ndarray] | None = None
        else:
            if eot is None:
                raise ValueError("`align='document'` needs the end-of-text id `eot`.")
            self._starts = [np.flatnonzero(np.asarray(s[: max(len(s) - self.block_size, 0)])
                                           == eot).astype(np.int64) for s in self.shards]
            counts = np.array([len(x) for x in self._starts], np.int64)
        if not counts.sum():
            what = "window" if align == "random" else f"window starting at a document (eot={eot})"
            raise ValueError(f"the training shards are too short for one {what} of block_size + 1 "
                             f"= {self.block_size + 1} tokens (the longest shard holds "
                             f"{max(len(s) for s in self.shards)}).")
        self._bounds = np.cumsum(counts)
        self.num_windows = int(self._bounds[-1])
        self.num_tokens = int(sum(len(s) for s in self.shards))

    def _config(self) -> dict[str, Any]:
        return {"seed": self.seed, "global_batch_size": self.batch_size * self.host_count,
                "block_size": self.block_size, "num_tokens": self.num_tokens,
                "align": self.align}

    def _position(self) -> dict[str, int]:
        return {"step": self.step}

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        return state if self.source is None else {**state, "source": self.source}

    def _set_position(self, position: dict[str, int]) -> None:
        self.step = position["step"]

    def global_starts(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(shard index, start offset)`` of each row of (0-based) step ``step``'s global batch."""
        g = self.batch_size * self.host_count
        u_G = np.random.default_rng([self.seed, step]).integers(0, self.num_windows, size=g)
        shard_G = np.searchsorted(self._bounds, u_G, side="right")
        local_G = u_G - np.concatenate([[0], self._bounds])[shard_G]
        if self._starts is not None:
            local_G = np.array([self._starts[s][j] for s, j in zip(shard_G, local_G,
                                                                   strict=True)], np.int64)
        return shard_G, local_G

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's rows of step ``step``'s global batch (reads only those)."""
        shard_G, start_G = self.global_starts(step)
        rows = slice(self.host_index * self.batch_size, (self.host_index + 1) * self.batch_size)
        w = self.block_size + 1
        window_BxW = np.array([self.shards[s][i: i + w] for s, i in
                               zip(shard_G[rows], start_G[rows], strict=True)], np.int32)
        return {"inputs": window_BxW[:, :-1], "targets": window_BxW[:, 1:]}

    def __next__(self) -> dict[str, np.ndarray]:
        if self.steps is not None and self.step >= self.steps:
            raise StopIteration
        out = self.batch(self.step)
        self.step += 1
        return out


class LMWindowIterator(ShardWindows):
    """:class:`ShardWindows` over one in-memory array: nanoGPT's ``get_batch`` (uniform over the
    ``N - T`` windows), resumable and host-sharded.

    Given ``vocab_size``, every id of ``tokens_N`` is checked once, here, to lie in
    ``[0, vocab_size)``. Its state keeps the ``kind`` ``"lm_windows"`` and its old keys (old
    checkpoints resume).

    Example:
        >>> it = LMWindowIterator(np.arange(50), batch_size=2, block_size=8, seed=0)
        >>> _ = next(it); s = it.get_state(); a = next(it)
        >>> it2 = LMWindowIterator(np.arange(50), 2, 8, seed=0); it2.set_state(s)
        >>> bool((next(it2)["inputs"] == a["inputs"]).all())
        True
    """

    kind = "lm_windows"

    @renamed_keywords(**HOST_RENAMES)
    def __init__(self, tokens_N: np.ndarray, batch_size: int, block_size: int, *,
                 seed: int = 0, steps: int | None = None, host_index: int | None = None,
                 host_count: int | None = None, vocab_size: int | None = None) -> None:
        check_positive_ints(batch_size=batch_size, block_size=block_size)
        self.tokens = np.asarray(tokens_N)
        if vocab_size is not None:
            check_vocab_ids(self.tokens, "tokens_N", int(vocab_size))
        if self.tokens.ndim != 1 or len(self.tokens) <= block_size:
            raise ValueError(f"`tokens_N` must be 1-D and longer than block_size={block_size}; "
                             f"got shape {self.tokens.shape}.")
        super().__init__([self.tokens], batch_size, block_size, seed=seed, steps=steps,
                         host_index=host_index, host_count=host_count)

    def _config(self) -> dict[str, Any]:
        return {k: v for k, v in super()._config().items() if k != "align"}


class ValidationWindows(Sequence[dict[str, np.ndarray]]):
    """The first ``num_tokens`` predicted tokens of the validation ``shards``, in non-overlapping
    windows of ``block_size`` read in order, as global batches of ``batch_size`` rows: the same
    tokens every evaluation (llm.c's validation loss).

    ``tail=True`` also predicts each shard's last tokens in a shorter window (``mask`` False past
    them), so every token of a shard but its first is predicted exactly once (a held-out text's
    whole loss, as ``char_lm`` reports it). Rows never cross a shard boundary; the last batch is
    padded with ``mask`` False rows so every batch has one shape. Batches are read from the
    memmaps when indexed. ``len(...)`` is the batch count; :attr:`tokens` the predicted tokens.
    Yields ``{"inputs", "targets": int32[B, T], "mask": bool[B, T]}``.
    """

    def __init__(self, shards: Sequence[np.ndarray], batch_size: int, block_size: int,
                 num_tokens: int | None = None, *, tail: bool = False) -> None:
        check_positive_ints(batch_size=batch_size, block_size=block_size)
        if num_tokens is not None:
            check_positive_ints(num_tokens=num_tokens)
        self.shards, self.batch_size, self.block_size = list(shards), batch_size, block_size
        rows: list[tuple[int, int, int]] = []  # (shard, start, predicted tokens)
        budget = num_tokens if num_tokens is not None else np.inf
        for i, s in enumerate(self.shards):
            last = len(s) - 1 if tail else len(s) - block_size
            for start in range(0, last, block_size):
                if len(rows) * block_size >= budget:
                    break
                rows.append((i, start, min(block_size, len(s) - 1 - start)))
        if not rows:
            longest = max((len(s) for s in self.shards), default=0)
            raise ValueError(f"the validation shards are too short for one window of "
                             f"block_size + 1 = {block_size + 1} tokens (the longest holds "
                             f"{longest}).")
        self.rows = rows
        self.tokens = sum(n for _, _, n in rows)

    def __len__(self) -> int:
        return -(-len(self.rows) // self.batch_size)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        inputs_BxT, targets_BxT = (np.zeros((self.batch_size, self.block_size), np.int32)
                                   for _ in range(2))
        mask_BxT = np.zeros((self.batch_size, self.block_size), bool)
        for r, (s, start, n) in enumerate(
                self.rows[i * self.batch_size: (i + 1) * self.batch_size]):
            window = self.shards[s][start: start + n + 1]
            inputs_BxT[r, :n], targets_BxT[r, :n], mask_BxT[r, :n] = window[:-1], window[1:], True
        return {"inputs": inputs_BxT, "targets": targets_BxT, "mask": mask_BxT}

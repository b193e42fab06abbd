r"""Arrays out: splits, padding, length bucketing, packing and LM windows, all in numpy.

The array stages of the input pipeline (text in: :mod:`seqjax.data.loading`; the resumable
iterators that call these: :mod:`seqjax.data.iterators`):

* **Next-token pairs.** With teacher forcing (J&M §9.3) a language model sees the gold history
  ``w_{1:t}`` and predicts ``w_{t+1}`` (J&M (9.9): ``P(w_{t+1} = i | w_{1:t}) = y_t[i]``), so a
  window of ``T + 1`` tokens gives

  .. math::  \text{inputs}_t = w_{i+t},\qquad \text{targets}_t = w_{i+t+1},
             \qquad t = 0, \dots, T-1

  (:class:`~seqjax.data.shard_windows.LMWindowIterator`, nanoGPT's ``get_batch``;
  :func:`packed_lm_targets` for packed rows).
* **Padding.** :func:`pad_batch` right-pads to a common ``T`` with mask ``m_{bt} = [t < \ell_b]``
  (MEDL §7.4 footnote 9: no loss on ``<empty>``; Bishop §12.3.1: ``<pad>`` plus a per-sequence
  mask); :func:`bucket_batches` groups similar lengths so less padding is needed.
* **Packing.** :func:`pack_sequences` puts several sequences in one row with segment ids ``s_{bt}``;
  attention stays inside a segment, ``M_{b,ij} = [s_{bi} = s_{bj} > 0] \wedge [j \le i]``
  (:func:`packed_attention_mask`); ``resets`` tells an RNN where to zero its carry.
* **Splits.** :func:`split_text` (contiguous, nanoGPT's 90/10), :func:`split_arrays` (shuffled).

Conventions (docs/design.md): arrays are numpy, batch-major, ids ``int32``, masks ``bool`` with
``True`` = real token / keep, lengths ``int32`` with right padding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from seqjax._checks import check_positive_ints, renamed_keywords

__all__ = [
    "split_text",
    "split_arrays",
    "pad_batch",
    "bucket_batches",
    "pack_sequences",
    "packed_lm_targets",
    "packed_attention_mask",
    "make_streams",
]


# ----------------------------------------------------------------------------- splits
def split_text(data: Any, train_fraction: float = 0.9) -> tuple[Any, Any]:
    """Contiguous ``(data[:n], data[n:])``, ``n = int(len(data) * train_fraction)`` (nanoGPT's).

    Example:
        >>> split_text("abcdefghij")
        ('abcdefghi', 'j')
    """
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"`train_fraction` must lie in (0, 1); got {train_fraction}.")
    n = int(len(data) * train_fraction)
    return data[:n], data[n:]


def split_arrays(
    arrays: Mapping[str, np.ndarray], test_fraction: float = 0.2, *, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Seeded shuffled ``(train, test)`` split of arrays sharing their leading dimension."""
    n = _leading_dim(arrays)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"`test_fraction` must lie in (0, 1); got {test_fraction}.")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(round(n * test_fraction)))
    train, test = ({k: np.asarray(v)[idx] for k, v in arrays.items()}
                   for idx in (perm[n_test:], perm[:n_test]))
    return train, test


def _leading_dim(arrays: Mapping[str, Any]) -> int:
    if not arrays:
        raise ValueError("`arrays` must not be empty.")
    sizes = {k: len(v) for k, v in arrays.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"`arrays` must share their leading dimension; got {sizes}.")
    return next(iter(sizes.values()))


# ----------------------------------------------------------------------------- padding
def pad_batch(seqs: Sequence[Sequence[int] | np.ndarray], *, pad_id: int = 0,
              length: int | None = None, pad_to_multiple: int = 1) -> dict[str, np.ndarray]:
    """Right-pad variable-length sequences into one array.

    Returns ``{"ids": int32[B, T], "lengths": int32[B], "mask": bool[B, T]}``, ``T = length`` if
    given (a longer sequence raises), else the longest rounded up to a multiple of
    ``pad_to_multiple`` (fewer shapes, fewer recompilations); ``mask[b, t] = t < lengths[b]``.

    Example:
        >>> b = pad_batch([[5, 6, 7], [8]], pad_id=0)
        >>> b["ids"].tolist(), b["lengths"].tolist()
        ([[5, 6, 7], [8, 0, 0]], [3, 1])
    """
    check_positive_ints(pad_to_multiple=pad_to_multiple)
    if length is not None and (not isinstance(length, int | np.integer) or length < 0):
        raise ValueError(f"`length` must be an int >= 0 or None; got {length!r}.")
    lengths = np.array([len(s) for s in seqs], np.int32)
    longest = int(lengths.max()) if len(lengths) else 0
    if length is None:
        length = -(-longest // pad_to_multiple) * pad_to_multiple
    elif longest > length:
        i = int(lengths.argmax())
        raise ValueError(
            f"`seqs[{i}]` has length {longest}, longer than `length`={length}; truncate when "
            "tokenising (truncation=True) or raise `length`."
        )
    ids = np.full((len(seqs), length), pad_id, np.int32)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = np.asarray(s, np.int32)
    mask = np.arange(length)[None, :] < lengths[:, None]
    return {"ids": ids, "lengths": lengths, "mask": mask}


def bucket_batches(lengths: Sequence[int] | np.ndarray, batch_size: int, *,
                   rng: np.random.Generator, window: int = 50,
                   drop_remainder: bool = True) -> list[np.ndarray]:
    """Batches of indices grouping similar lengths ("sortish" bucketing).

    Shuffle all indices, sort each window of ``window * batch_size`` by length, cut into batches
    and shuffle the batch order: little padding, yet random batches.

    Example:
        >>> bs = bucket_batches([1, 9, 2, 8, 1, 9], 2, rng=np.random.default_rng(0))
        >>> sorted(sorted([1, 9, 2, 8, 1, 9][i] for i in b) for b in bs)
        [[1, 1], [2, 8], [9, 9]]
    """
    lengths = np.asarray(lengths)
    perm = rng.permutation(len(lengths))
    chunk = max(1, window) * batch_size
    order = np.concatenate(
        [perm[s : s + chunk][np.argsort(lengths[perm[s : s + chunk]], kind="stable")]
         for s in range(0, len(perm), chunk)]
    ) if len(perm) else perm
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    if drop_remainder and batches and len(batches[-1]) < batch_size:
        batches = batches[:-1]
    return [batches[i] for i in rng.permutation(len(batches))]


# ----------------------------------------------------------------------------- packing
@renamed_keywords(seq_len="block_size")
def pack_sequences(seqs: Sequence[Sequence[int] | np.ndarray], block_size: int, *, pad_id: int = 0,
                   overflow: Literal["error", "truncate", "split"] = "error",
                   lookback: int = 64) -> dict[str, np.ndarray]:
    """Pack sequences end to end into rows of ``block_size`` tokens (greedy first fit).

    Each sequence, in order, goes into the first of the last ``lookback`` rows with room, else a
    new row (``O(N * lookback)``; ``lookback=1`` is next fit). Sequences longer than
    ``block_size`` raise ``ValueError`` (``overflow="error"``), are cut (``"truncate"``) or
    continue in fresh rows as separate segments (``"split"``). Empty sequences are skipped.

    Returns, each ``[R, block_size]``: ``ids`` int32 (``pad_id`` after the last segment);
    ``segment_ids`` int32 (``1, 2, …`` per sequence within a row, ``0`` on padding, as
    :func:`seqjax.nn.masks.segment_mask`); ``positions`` int32 (inside the segment); ``mask``
    bool (real tokens); ``resets`` bool (each segment's first token: an RNN zeroes its carry).

    Example:
        >>> p = pack_sequences([[1, 2], [3, 4, 5], [6]], 4)
        >>> p["ids"].tolist(), p["segment_ids"].tolist()
        ([[1, 2, 6, 0], [3, 4, 5, 0]], [[1, 1, 2, 0], [1, 1, 1, 0]])
    """
    check_positive_ints(block_size=block_size, lookback=lookback)
    if overflow not in ("error", "truncate", "split"):
        raise ValueError(f"`overflow` must be 'error', 'truncate' or 'split'; got {overflow!r}.")
    pieces: list[np.ndarray] = []
    for i, seq in enumerate(seqs):
        s = np.asarray(seq, np.int32).reshape(-1)
        if len(s) > block_size and overflow == "error":
            raise ValueError(
                f"`seqs[{i}]` has length {len(s)}, longer than `block_size`={block_size}; "
                "pass overflow='truncate' or 'split'.")
        # One piece (cut to block_size) per non-empty sequence; "split": every block_size tokens.
        stop = len(s) if overflow == "split" else min(len(s), 1)
        pieces.extend(s[j : j + block_size] for j in range(0, stop, block_size))
    rows: list[list[np.ndarray]] = []
    free: list[int] = []
    open_rows: list[int] = []  # the last `lookback` rows that still have room
    for s in pieces:
        target = next((r for r in open_rows if free[r] >= len(s)), None)
        if target is None:
            rows.append([])
            free.append(block_size)
            target = len(rows) - 1
            open_rows.append(target)
            if len(open_rows) > lookback:
                open_rows.pop(0)
        rows[target].append(s)
        free[target] -= len(s)
        if free[target] == 0:
            open_rows.remove(target)

    def padded(parts: list[list[np.ndarray]], pad: int = 0) -> np.ndarray:  # row r: parts[r]
        return pad_batch([np.concatenate(p) for p in parts], pad_id=pad, length=block_size)["ids"]

    seg = padded([[np.full(len(s), k) for k, s in enumerate(row, start=1)] for row in rows])
    pos = padded([[np.arange(len(s)) for s in row] for row in rows])
    return {"ids": padded(rows, pad_id), "segment_ids": seg, "positions": pos, "mask": seg > 0,
            "resets": (pos == 0) & (seg > 0)}


def packed_lm_targets(
    packed: Mapping[str, np.ndarray], *, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """Next-token targets for packed rows, never crossing a segment boundary.

    ``targets[r, t] = ids[r, t+1]`` and ``loss_mask[r, t] = True`` when tokens ``t`` and ``t+1``
    are in the same segment, else ``pad_id`` / ``False``; both ``[R, T]``.
    """
    ids, seg = np.asarray(packed["ids"]), np.asarray(packed["segment_ids"])
    same = np.zeros_like(seg, dtype=bool)
    same[:, :-1] = (seg[:, :-1] == seg[:, 1:]) & (seg[:, :-1] > 0)
    targets = np.full_like(ids, pad_id)
    targets[:, :-1] = np.where(same[:, :-1], ids[:, 1:], pad_id)
    return {"targets": targets, "loss_mask": same}


def packed_attention_mask(segment_ids_BxT: np.ndarray, *, causal: bool = True) -> np.ndarray:
    """``bool[B, 1, T, T]``: query ``i`` attends key ``j`` iff both are in the same segment
    (ids ``> 0``) and, when ``causal``, ``j <= i``.

    ``segment_mask(s, s) & padding & causal_mask`` of :mod:`seqjax.nn.masks`, in numpy.
    Padding queries attend to nothing.

    Example:
        >>> packed_attention_mask(np.array([[1, 1, 2]]))[0, 0].astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    seg = np.asarray(segment_ids_BxT)
    if seg.ndim != 2:
        raise ValueError(f"`segment_ids_BxT` must have rank 2; got shape {seg.shape}.")
    m = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
    if causal:
        t = seg.shape[1]
        m &= np.tril(np.ones((t, t), bool))[None]
    return m[:, None]


# ----------------------------------------------------------------------------- windows
def _prefix(column: str) -> str:
    """``"ids" -> ""``, ``"src_ids" -> "src_"``, ``"x" -> "x_"``: names of companion columns."""
    return column[:-3] if column.endswith("ids") else column + "_"


def make_streams(tokens: Any, batch_size: int) -> np.ndarray:
    """Cut a 1-D token stream into ``batch_size`` contiguous rows ``[B, L]``, ``L = N // B``.

    Row ``b`` is ``tokens[b L : (b + 1) L]``; the remainder is dropped (needs ``L >= 2``). For
    evaluating a recurrent LM with its state carried along each row (training chunks:
    :class:`~seqjax.data.iterators.TBPTTIterator`).

    Example:
        >>> make_streams(np.arange(10), 3).tolist()
        [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"`tokens` must be 1-D; got shape {tokens.shape}.")
    check_positive_ints(batch_size=batch_size)
    if tokens.shape[0] < 2 * batch_size:
        raise ValueError(
            f"`batch_size` must leave at least 2 tokens per row; got {batch_size} rows "
            f"for {tokens.shape[0]} tokens."
        )
    length = tokens.shape[0] // batch_size
    return tokens[: batch_size * length].reshape(batch_size, length)

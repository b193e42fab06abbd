r"""word2vec's training data: skip-gram pairs, CBOW windows, the noise distribution, subsampling.

word2vec (Mikolov et al. 2013; Bishop §12.2.1; MEDL §7.1) learns from a window of ``M`` words
either side of each centre word ``w_t``: **skip-gram** examples are the pairs ``(w_t, w_{t+j})``,
``0 < |j| <= M`` (:func:`skipgram_pairs`); **CBOW** examples are the windows
``C_t = (w_{t-M}, …, w_{t-1}, w_{t+1}, …, w_{t+M})`` with their centre ``w_t``
(:func:`cbow_windows`, masked at the text's ends). Negative sampling draws noise from
``P_n(w) ∝ count(w)^{3/4}`` (Mikolov et al. 2013, eq. 4; :func:`noise_distribution`);
subsampling keeps a token of relative frequency ``f`` with probability
``min(1, (\sqrt{f/t} + 1)\,t/f)`` (:func:`subsample_mask`).

Model, losses, similarity/analogy tools: :mod:`seqjax.models.word2vec`; training loop:
:func:`seqjax.train.word2vec.train_word2vec`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqjax._checks import check_positive_ints

__all__ = ["skipgram_pairs", "cbow_windows", "noise_distribution", "subsample_mask"]


def _ids(ids_N: Any) -> np.ndarray:
    ids = np.asarray(ids_N)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"`ids_N` must be a 1-D integer array; got {ids.dtype}{ids.shape}.")
    return ids.astype(np.int32)


def skipgram_pairs(ids_N: Any, window: int) -> tuple[np.ndarray, np.ndarray]:
    """All ``(centre, context)`` pairs with ``0 < |offset| <= window``: ``(int32[P], int32[P])``.

    Example:
        >>> c, o = skipgram_pairs([7, 8, 9], 1)
        >>> sorted(zip(c.tolist(), o.tolist()))
        [(7, 8), (8, 7), (8, 9), (9, 8)]
    """
    ids = _ids(ids_N)
    check_positive_ints(window=window)
    offsets, none = range(1, min(window, len(ids) - 1) + 1), [np.zeros(0, np.int32)]
    centers = none + [x for j in offsets for x in (ids[:-j], ids[j:])]
    contexts = none + [x for j in offsets for x in (ids[j:], ids[:-j])]
    return np.concatenate(centers), np.concatenate(contexts)


def cbow_windows(ids_N: Any, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Context windows for CBOW: ``(contexts int32[N, 2W], mask bool[N, 2W], centers int32[N])``.

    Row ``t`` holds ``ids[t-W .. t-1, t+1 .. t+W]``; positions outside the text are masked
    (``False``) and hold 0.

    Example:
        >>> ctx, m, c = cbow_windows([5, 6, 7], 1)
        >>> ctx.tolist(), m.tolist(), c.tolist()
        ([[0, 6], [5, 7], [6, 0]], [[False, True], [True, True], [True, False]], [5, 6, 7])
    """
    ids = _ids(ids_N)
    check_positive_ints(window=window)
    n = len(ids)
    offsets = np.r_[np.arange(-window, 0), np.arange(1, window + 1)]
    pos = np.arange(n)[:, None] + offsets[None, :]
    mask = (pos >= 0) & (pos < n)
    contexts = np.where(mask, ids[np.clip(pos, 0, max(n - 1, 0))], 0).astype(np.int32)
    return contexts, mask, ids


def noise_distribution(ids_N: Any, vocab_size: int, power: float = 0.75) -> np.ndarray:
    """``P_n(w) ∝ count(w)^power`` over ``vocab_size`` words (``power=3/4``, Mikolov et al.)."""
    ids = _ids(ids_N)
    if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(
            f"`ids_N` has values in [{ids.min()}, {ids.max()}], outside the vocabulary "
            f"[0, {vocab_size}) (vocab_size={vocab_size})."
        )
    p = np.bincount(ids, minlength=vocab_size).astype(np.float64) ** power
    if p.sum() == 0:
        raise ValueError("`ids_N` is empty: no counts for the noise distribution.")
    return p / p.sum()


def subsample_mask(
    ids_N: Any, vocab_size: int, threshold: float, rng: np.random.Generator
) -> np.ndarray:
    """Keep-mask for frequent-word subsampling (word2vec's C code, Mikolov et al. 2013).

    A token of relative frequency ``f`` is kept with probability
    ``min(1, (sqrt(f / t) + 1) t / f)``, ``t = threshold`` (e.g. ``1e-3``).
    """
    ids = _ids(ids_N)
    f = np.bincount(ids, minlength=vocab_size) / max(len(ids), 1)
    fw = np.maximum(f[ids], 1e-12)
    keep = np.minimum(1.0, (np.sqrt(fw / threshold) + 1.0) * threshold / fw)
    return rng.random(len(ids)) < keep

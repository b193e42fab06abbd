"""word2vec's training data: skip-gram pairs and CBOW windows against loops, noise, subsampling."""

import numpy as np
import pytest

from seqjax.data.word2vec import cbow_windows, noise_distribution, skipgram_pairs, subsample_mask


def test_skipgram_pairs_and_cbow_windows_against_loops():
    ids = np.array([4, 1, 3, 1, 5, 9, 2])
    w = 2
    centers, contexts = skipgram_pairs(ids, w)
    ref = [(ids[t], ids[t + j]) for t in range(len(ids)) for j in range(-w, w + 1)
           if j != 0 and 0 <= t + j < len(ids)]
    assert sorted(zip(centers.tolist(), contexts.tolist())) == sorted(
        (int(a), int(b)) for a, b in ref)
    ctx, mask, cen = cbow_windows(ids, w)
    assert ctx.shape == mask.shape == (7, 4) and cen.tolist() == ids.tolist()
    for t in range(len(ids)):
        expect = [ids[t + j] for j in (-2, -1, 1, 2) if 0 <= t + j < len(ids)]
        assert ctx[t][mask[t]].tolist() == expect
    with pytest.raises(ValueError, match="window"):
        skipgram_pairs(ids, 0)


def test_noise_distribution_and_subsampling():
    ids = np.array([0] * 16 + [1] * 1 + [2] * 0 + [3] * 81)
    p = noise_distribution(ids, 4)
    ref = np.array([16, 1, 0, 81]) ** 0.75
    np.testing.assert_allclose(p, ref / ref.sum())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        noise_distribution(ids, 3)
    keep = subsample_mask(ids, 4, 1e-2, np.random.default_rng(0))
    assert keep[16] and keep[:16].mean() > keep[17:].mean()

"""word2vec: MEDL §7.1 cosines, similarity and analogy tools, parameters, a tiny training run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.models.word2vec import (
    Word2Vec,
    analogy,
    cosine_similarity,
    evaluate_analogies,
    nearest_neighbours,
)
from seqjax.train.word2vec import Word2VecConfig, train_word2vec

KING = [0.41, 1.2, 3.4, -1.3]
QUEEN = [0.39, 1.1, 3.5, 1.6]
MEAN = [-0.2, -3.2, 1.3, 0.8]


def test_medl_7_1_cosines():
    # MEDL §7.1: 0.729, -0.04, 0.156
    assert round(float(cosine_similarity(KING, QUEEN)), 3) == 0.729
    assert round(float(cosine_similarity(MEAN, KING)), 2) == -0.04
    assert round(float(cosine_similarity(MEAN, QUEEN)), 3) == 0.156
    np.testing.assert_allclose(
        cosine_similarity([KING, MEAN, MEAN], [QUEEN, KING, QUEEN]),
        [0.72897, -0.03960, 0.15630], atol=5e-6)
    with pytest.raises(ValueError, match="last dimension"):
        cosine_similarity(KING, [1.0, 2.0])


def test_nearest_neighbours_and_analogies_on_constructed_vectors():
    # royal/male/female/capital/country axes: exact vector arithmetic (Bishop (12.27))
    words = ["king", "queen", "man", "woman", "paris", "france", "rome", "italy"]
    e = np.array([
        [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0],
        [0, 0, 0, 1, 0.2], [0, 0, 0, 0, 1.2], [0, 0, 0, 1, -0.2], [0, 0, 0, 0, 0.8],
    ], float) + 0.01 * np.random.default_rng(0).normal(size=(8, 5))
    w = {x: i for i, x in enumerate(words)}
    assert words[analogy(e, w["man"], w["king"], w["woman"])[0]] == "queen"
    assert words[analogy(e, w["france"], w["paris"], w["italy"])[0]] == "rome"
    acc = evaluate_analogies(e, [[w["man"], w["king"], w["woman"], w["queen"]],
                                 [w["france"], w["paris"], w["italy"], w["rome"]],
                                 [w["france"], w["paris"], w["italy"], w["king"]]])
    assert acc == pytest.approx(2 / 3)
    ids, sims = nearest_neighbours(e, w["king"], k=3)
    assert w["king"] not in ids and sims[0] >= sims[1] >= sims[2]
    ref = cosine_similarity(e, e[w["king"]])
    ref[w["king"]] = -np.inf
    np.testing.assert_array_equal(ids, np.argsort(-ref)[:3])
    vec_ids, _ = nearest_neighbours(e, e[w["king"]], k=1)
    assert vec_ids.tolist() == [w["king"]]  # a vector query does not exclude anything
    with pytest.raises(ValueError, match=r"`query`=8 is outside the vocabulary \[0, 8\)"):
        nearest_neighbours(e, 8)
    with pytest.raises(ValueError, match="`c`=-1"):
        analogy(e, 0, 1, -1)


def test_word2vec_module_parameters():
    m = Word2Vec(vocab_size=10, features=4, mode="cbow")
    batch = {"contexts": jnp.zeros((2, 4), jnp.int32), "mask": jnp.ones((2, 4), bool),
             "centers": jnp.array([1, 2]), "negatives": jnp.zeros((2, 5), jnp.int32)}
    params = m.init(jax.random.PRNGKey(0), batch)["params"]
    assert {k: v.shape for k, v in params.items()} == {
        "input_embedding": (10, 4), "output_embedding": (10, 4)}
    assert np.abs(params["input_embedding"]).max() <= 0.5 / 4
    # output vectors start at zero: every sigmoid is 1/2, loss = (1 + K) log 2
    np.testing.assert_allclose(float(m.apply({"params": params}, batch)), 6 * np.log(2), rtol=1e-6)


def _two_topic_corpus(seed=0):
    rng = np.random.default_rng(seed)
    sents = [rng.integers(0, 6, size=8) + 6 * rng.integers(2) for _ in range(300)]
    return np.concatenate(sents)


@pytest.mark.parametrize("mode", ["skipgram", "cbow"])
def test_training_groups_words_that_share_contexts(mode):
    ids = _two_topic_corpus()
    cfg = Word2VecConfig(features=16, mode=mode, window=2, steps=200, batch_size=128,
                         learning_rate=0.02)
    emb, losses = train_word2vec(ids, 12, cfg)
    assert emb.shape == (12, 16) and losses.shape == (200,)
    assert losses[-20:].mean() < 0.7 * losses[:20].mean()
    topic = np.arange(12) // 6
    cos = cosine_similarity(emb[:, None], emb[None])
    same = (topic[:, None] == topic[None]) & ~np.eye(12, dtype=bool)
    assert cos[same].mean() > cos[topic[:, None] != topic[None]].mean() + 0.4
    for i in range(12):
        assert topic[nearest_neighbours(emb, i, 1)[0][0]] == topic[i]


def test_each_name_has_one_home():
    """The model and its losses in seqjax.models, the examples in seqjax.data, the training
    loop in seqjax.train: no layer imports one above it, and no old spelling lingers."""
    import seqjax.data
    import seqjax.models

    assert seqjax.models.Word2Vec is Word2Vec
    for gone in ("Word2Vec", "train_word2vec", "skipgram_ns_loss"):
        assert not hasattr(seqjax.data, gone)

"""Bishop §12.2.3–12.2.4 count baselines against hand-computed numbers and numpy references."""

import math

import numpy as np
import pytest

from seqjax.models.baselines import (
    BagOfWordsLM,
    NaiveBayes,
    NGramClassifier,
    NGramLM,
    bag_of_words,
)

# tokens: a=0 b=1 c=2 d=3 (d never occurs)
CORPUS = [[0, 1, 2, 0], [0, 1, 1]]  # "abca", "abb"


def test_bag_of_words_is_relative_frequency_eq_12_28():
    # Ex. 12.11: the ML table is the fraction of times each word occurs: a 3, b 3, c 1 of 7
    ml = BagOfWordsLM(4, smoothing="none").fit(CORPUS)
    np.testing.assert_allclose(ml.conditional([]), [3 / 7, 3 / 7, 1 / 7, 0.0])
    # (12.28): the joint is the product of the per-token probabilities
    assert math.isclose(ml.log_prob([2, 0, 0]), math.log(1 / 7 * 3 / 7 * 3 / 7))
    assert ml.log_prob([3]) == -math.inf  # the zero Bishop's smoothing removes
    # add-k: (c + k) / (N + kK) with k = 1, K = 4, N = 7
    lap = BagOfWordsLM(4, k=1.0).fit(CORPUS)
    np.testing.assert_allclose(lap.conditional([]), [4 / 11, 4 / 11, 2 / 11, 1 / 11])
    # uniform reassignment: (1 - λ) c / N + λ / K
    uni = BagOfWordsLM(4, smoothing="uniform", lam=0.2).fit(CORPUS)
    np.testing.assert_allclose(uni.conditional([]),
                               0.8 * np.array([3, 3, 1, 0]) / 7 + 0.2 / 4)
    # add-k is uniform reassignment with λ = kK / (N + kK)
    lam = 4 / 11
    np.testing.assert_allclose(lap.conditional([]),
                               (1 - lam) * np.array([3, 3, 1, 0]) / 7 + lam / 4)


def test_trigram_eq_12_32_by_hand():
    lm = NGramLM(3, 4, smoothing="none").fit(CORPUS)
    # bigram counts: ab 2, bc 1, ca 1, bb 1  -> p(b|a) = 1, p(·|b) = {c: 1/2, b: 1/2}
    bi = NGramLM(2, 4, smoothing="none").fit(CORPUS)
    np.testing.assert_allclose(bi.conditional([0]), [0, 1, 0, 0])
    np.testing.assert_allclose(bi.conditional([1]), [0, 0.5, 0.5, 0])
    # history (c, a) ends "abca": never followed by a token -> unseen -> 1/K
    np.testing.assert_allclose(lm.conditional([2, 0]), [0.25] * 4)
    # trigram counts: abc 1, bca 1, abb 1  -> p(·|a,b) = {c: 1/2, b: 1/2}
    np.testing.assert_allclose(lm.conditional([0, 1]), [0, 0.5, 0.5, 0])
    # (12.32): p(x1) p(x2|x1) prod_{n>=3} p(xn | xn-1, xn-2) for "abca"
    p = (3 / 7) * 1.0 * 0.5 * 1.0  # p(a) p(b|a) p(c|a,b) p(a|b,c)
    assert math.isclose(lm.log_prob([0, 1, 2, 0]), math.log(p))
    np.testing.assert_allclose(np.exp(lm.token_log_probs([0, 1, 2, 0])), [3 / 7, 1, 0.5, 1])


def test_unseen_history_is_uniform_and_rows_sum_to_one():
    rng = np.random.default_rng(0)
    text = rng.integers(0, 5, 300)
    for smoothing in ("add_k", "uniform", "none"):
        lm = NGramLM(3, 5, smoothing=smoothing, k=0.5, lam=0.1).fit(text)
        for h in [(0, 1), (4, 4), (2, 3)]:
            assert math.isclose(lm.conditional(h).sum(), 1.0, rel_tol=1e-12)
    lm = NGramLM(2, 6).fit([[0, 1, 0, 1]])
    np.testing.assert_allclose(lm.conditional([5]), np.full(6, 1 / 6))


def test_exercise_12_13_ratio_needs_the_final_token_dropped():
    """(12.46): p(x_n | h) = p_L(h, x_n) / p_{L-1}(h); the (L-1)-gram counts must omit the
    final token of each sequence, or the conditionals do not sum to one."""
    seqs = [[0, 1, 0, 2], [1, 0, 1], [0, 0, 1, 2, 0]]
    lm = NGramLM(2, 3, smoothing="none").fit(seqs)
    pairs = np.zeros((3, 3))
    firsts_all, firsts_dropped = np.zeros(3), np.zeros(3)
    for s in seqs:
        for a, b in zip(s, s[1:]):
            pairs[a, b] += 1
        for a in s:
            firsts_all[a] += 1
        for a in s[:-1]:
            firsts_dropped[a] += 1
    right = pairs / firsts_dropped[:, None]
    wrong = pairs / firsts_all[:, None]
    np.testing.assert_allclose(right.sum(1), 1.0)
    assert not np.allclose(wrong.sum(1), 1.0)
    for h in range(3):
        np.testing.assert_allclose(lm.conditional([h]), right[h])


def test_streams_and_sampling():
    # A deterministic cycle: the bigram model reproduces it when sampled.
    lm = NGramLM(2, 4, smoothing="none").fit(np.array([0, 1, 2, 3] * 5))
    assert lm.sample(np.random.default_rng(0), 6, prompt=[2]) == [3, 0, 1, 2, 3, 0]
    assert math.isclose(lm.nll([np.array([0, 1, 2, 3, 0])]), -math.log(5 / 20) / 5)


def test_naive_bayes_eq_12_29_12_30_numpy_reference():
    # restaurant reviews (Bishop §12.2.3): words good=0 bad=1 food=2 service=3 slow=4
    reviews = [[0, 2], [0, 3, 0], [2, 0], [1, 3], [4, 3, 1], [1, 2]]
    labels = [1, 1, 1, 0, 0, 0]  # 1 = positive
    nb = NaiveBayes(5, 2, k=1.0).fit(reviews, labels)
    counts = bag_of_words(reviews, 5)
    # class-conditional tables by hand: add-1 over K = 5 words
    table = np.stack([(counts[np.array(labels) == c].sum(0) + 1)
                      / (counts[np.array(labels) == c].sum() + 5) for c in (0, 1)])
    np.testing.assert_allclose(np.exp(nb.word_log_probs()), table)
    test = [[0, 2, 2], [1, 4], [3]]
    ref = np.log([0.5, 0.5]) + bag_of_words(test, 5) @ np.log(table).T  # (12.30)
    ref -= np.log(np.exp(ref).sum(1, keepdims=True))
    np.testing.assert_allclose(nb.log_posterior(test), ref, rtol=1e-12)
    assert nb.predict(test).tolist() == [1, 0, int(np.argmax(ref[2]))]
    # the posterior of "good food food" by hand
    p1 = 0.5 * table[1, 0] * table[1, 2] ** 2
    p0 = 0.5 * table[0, 0] * table[0, 2] ** 2
    assert math.isclose(np.exp(nb.log_posterior(test[:1])[0, 1]), p1 / (p0 + p1))


def test_ngram_classifier_sees_order_that_naive_bayes_cannot():
    # class 0: "a b" repeated; class 1: "b a" repeated — same bags of words.
    seqs = [[0, 1] * 3, [1, 0] * 3] * 4
    labels = [0, 1] * 4
    test = [[0, 1, 0, 1], [1, 0, 1, 0]]
    nb = NaiveBayes(2, 2).fit(seqs, labels)
    np.testing.assert_allclose(nb.log_posterior(test), np.log(0.5))  # order is invisible
    bi = NGramClassifier(2, 2, 2).fit(seqs, labels)
    assert bi.predict(test).tolist() == [0, 1]


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="order"):
        NGramLM(0, 4)
    with pytest.raises(ValueError, match="smoothing"):
        NGramLM(2, 4, smoothing="kneser_ney")
    with pytest.raises(ValueError, match="vocab_size"):
        NGramLM(2, 4).fit([[0, 4]])
    with pytest.raises(ValueError, match="lam"):
        NGramLM(2, 4, smoothing="uniform", lam=1.5)
    with pytest.raises(RuntimeError, match="fit"):
        NGramLM(2, 4).nll([[0, 1]])
    with pytest.raises(ValueError, match="labels"):
        NaiveBayes(4, 2).fit([[0], [1]], [0, 2])
    with pytest.raises(ValueError, match="class 1"):
        NaiveBayes(4, 2).fit([[0], [1]], [0, 0])
    with pytest.raises(ValueError, match="int64"):
        NGramLM(12, 65)

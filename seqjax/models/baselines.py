r"""Count-based baselines of Bishop §12.2.3–12.2.4 over token ids ``0..K-1`` (numpy; fitted
by counting, priors and tables are training frequencies).

* :class:`NGramLM`: Bishop (12.31) truncated to the ``L = order - 1`` latest tokens ((12.32)
  for ``L = 2``; :class:`BagOfWordsLM`, Bishop (12.28), is ``L = 0``):

  .. math::
      p(x_1, \dots, x_N) = \prod_{n=1}^N p(x_n \mid x_{\max(1, n-L)}, \dots, x_{n-1}),
      \qquad p(w \mid h) = \frac{c(h, w)}{\sum_{w'} c(h, w')};

* :class:`NGramClassifier`: Bayes' rule with an n-gram model per class (sees word order);
  :class:`NaiveBayes`, Bishop (12.29)–(12.30), is its ``order=1``.

Example:
    >>> lm = NGramLM(order=2, vocab_size=3, smoothing="none").fit([[0, 1, 0, 1, 2]])
    >>> lm.conditional([0]).tolist()  # after 0 always 1
    [0.0, 1.0, 0.0]
    >>> nb = NaiveBayes(vocab_size=3, num_classes=2).fit([[0, 0], [2, 2, 1]], [0, 1])
    >>> nb.predict([[0], [2]]).tolist()
    [0, 1]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from seqjax._checks import check_positive_ints

__all__ = [
    "SMOOTHINGS", "BagOfWordsLM", "NGramClassifier", "NGramLM", "NaiveBayes", "bag_of_words",
]

SMOOTHINGS = ("add_k", "uniform", "none")


def _as_sequences(sequences: Any, vocab_size: int, name: str) -> list[np.ndarray]:
    """A 1-D stream or an iterable of 1-D sequences -> list of int64 arrays, ids checked."""
    one_stream = isinstance(sequences, np.ndarray) and sequences.ndim == 1
    seqs = [sequences] if one_stream else [np.asarray(s) for s in sequences]
    out = []
    for i, s in enumerate(seqs):
        if s.ndim != 1:
            raise ValueError(f"`{name}[{i}]` must be a 1-D sequence of token ids; got shape "
                             f"{s.shape}.")
        if s.size and not np.issubdtype(s.dtype, np.integer):
            raise TypeError(f"`{name}[{i}]` must hold integer token ids; got dtype {s.dtype}.")
        s = s.astype(np.int64)
        if s.size and (s.min() < 0 or s.max() >= vocab_size):
            bad = int(s[(s < 0) | (s >= vocab_size)][0])
            raise ValueError(f"`{name}[{i}]` holds token id {bad}, outside [0, {vocab_size}) "
                             "(vocab_size).")
        out.append(s)
    return out


def bag_of_words(sequences: Iterable[Sequence[int]], vocab_size: int) -> np.ndarray:
    """Token counts ``[N, K]``: the bag-of-words representation (Bishop §12.2.3).

    Example:
        >>> bag_of_words([[0, 2, 2], []], 3).tolist()
        [[1, 0, 2], [0, 0, 0]]
    """
    seqs = _as_sequences(list(sequences), vocab_size, "sequences")
    out = np.zeros((len(seqs), vocab_size), np.int64)
    for i, s in enumerate(seqs):
        out[i] = np.bincount(s, minlength=vocab_size)
    return out


def _codes(windows_NxJ: np.ndarray, base: int) -> np.ndarray:
    code = np.zeros(len(windows_NxJ), np.int64)
    for j in range(windows_NxJ.shape[1]):
        code = code * base + windows_NxJ[:, j]
    return code


class NGramLM:
    r"""n-gram language model, Bishop (12.31)–(12.32) (equation in the module docstring).

    The first ``L`` tokens use the shorter histories they have (Bishop's :math:`p(x_1)\,p(x_2
    \mid x_1)`); tables are shared across positions. ``c(h)`` counts ``h`` only where a token
    follows it: Bishop's ratio (12.46) :math:`p_L(h, w) / p_{L-1}(h)` with each sequence's last
    token dropped from the :math:`(L-1)`-gram counts (Ex. 12.13), so conditionals sum to one.

    Smoothing (Bishop §12.2.3: reassign a little probability uniformly, else unseen tokens get
    zero): ``"add_k"`` (default; Lidstone, ``k = 1`` Laplace) :math:`(c(h, w) + k) / (c(h) +
    kK)`; ``"uniform"`` :math:`(1 - \lambda)\, c(h, w) / c(h) + \lambda / K`; ``"none"``
    maximum likelihood (zeros allowed, log 0 = -inf). An unseen history gives ``1/K``. No
    Kneser–Ney or back-off.

    Args:
        order: ``n = L + 1`` (1: bag of words, 2: bi-gram, 3: tri-gram).
        vocab_size: ``K``.
        smoothing: ``"add_k"``, ``"uniform"`` or ``"none"``.
        k: add-k pseudo-count (> 0). lam: uniform mixing weight ``λ`` in ``[0, 1]``.
    """

    def __init__(self, order: int, vocab_size: int, *, smoothing: str = "add_k",
                 k: float = 1.0, lam: float = 0.01) -> None:
        check_positive_ints(order=order, vocab_size=vocab_size)
        if float(vocab_size) ** order >= 2.0 ** 62:
            raise ValueError(f"vocab_size**order = {vocab_size}**{order} does not fit the "
                             "int64 n-gram codes; use a smaller `order`.")
        if smoothing not in SMOOTHINGS:
            raise ValueError(f"`smoothing` must be one of {SMOOTHINGS}; got {smoothing!r}.")
        if smoothing == "add_k" and not k > 0:
            raise ValueError(f"`k` (add-k pseudo-count) must be > 0; got {k}.")
        if smoothing == "uniform" and not 0.0 <= lam <= 1.0:
            raise ValueError(f"`lam` (uniform mixing weight) must be in [0, 1]; got {lam}.")
        self.order, self.vocab_size = int(order), int(vocab_size)
        self.smoothing, self.k, self.lam = smoothing, float(k), float(lam)
        self._tables: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] | None = None

    def fit(self, sequences: Any) -> NGramLM:
        """Count every j-gram, ``j = 1..order``, in ``sequences`` (a 1-D stream or a list;
        histories never cross sequences); returns ``self``."""
        seqs = _as_sequences(sequences, self.vocab_size, "sequences")
        if not any(len(s) for s in seqs):
            raise ValueError("`sequences` is empty: an n-gram model needs tokens to count.")
        base = self.vocab_size
        self._tables = []
        for j in range(1, self.order + 1):
            parts = [_codes(np.lib.stride_tricks.sliding_window_view(s, j), base)
                     for s in seqs if len(s) >= j]
            joint = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            jcodes, jcounts = np.unique(joint, return_counts=True)
            # c(h) = sum_w c(h, w): histories followed by a token (Ex. 12.13's dropped final)
            hcodes, inverse = np.unique(jcodes // base, return_inverse=True)
            htotals = np.bincount(inverse, weights=jcounts, minlength=len(hcodes))
            self._tables.append((jcodes, jcounts.astype(np.float64), hcodes, htotals))
        return self

    def _check_fitted(self) -> list:
        if self._tables is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(sequences) first.")
        return self._tables

    @staticmethod
    def _lookup(codes: np.ndarray, table_codes: np.ndarray, values: np.ndarray) -> np.ndarray:
        if len(table_codes) == 0:
            return np.zeros(len(codes))
        idx = np.clip(np.searchsorted(table_codes, codes), 0, len(table_codes) - 1)
        return np.where(table_codes[idx] == codes, values[idx], 0.0)

    def _prob(self, count: np.ndarray, total: np.ndarray) -> np.ndarray:
        K = self.vocab_size
        if self.smoothing == "add_k":
            return (count + self.k) / (total + self.k * K)
        seen = total > 0
        ml = np.divide(count, total, out=np.zeros_like(count), where=seen)
        lam = self.lam if self.smoothing == "uniform" else 0.0  # "none": ml exactly
        return np.where(seen, (1.0 - lam) * ml + lam / K, 1.0 / K)

    def _probs_of(self, windows_NxJ: np.ndarray) -> np.ndarray:
        """``p(w | h)`` for rows ``[h..., w]`` of one history length."""
        j = windows_NxJ.shape[1]
        jcodes, jcounts, hcodes, htotals = self._check_fitted()[j - 1]
        code = _codes(windows_NxJ, self.vocab_size)
        count = self._lookup(code, jcodes, jcounts)
        total = self._lookup(code // self.vocab_size, hcodes, htotals)
        return self._prob(count, total)

    def token_log_probs(self, sequence: Sequence[int] | np.ndarray) -> np.ndarray:
        r""":math:`\log p(x_n \mid x_{\max(1,n-L)}, \dots, x_{n-1})` for each token (float64)."""
        (s,) = _as_sequences([sequence], self.vocab_size, "sequence")
        self._check_fitted()
        n, L = len(s), self.order - 1
        out = np.empty(n)
        for t in range(min(L, n)):  # the first tokens: the shorter histories they have
            out[t] = self._probs_of(s[None, : t + 1])[0]
        if n > L:
            out[L:] = self._probs_of(np.lib.stride_tricks.sliding_window_view(s, L + 1))
        with np.errstate(divide="ignore"):
            return np.log(out)

    def log_prob(self, sequence: Sequence[int]) -> float:
        """``log p(x_1, …, x_N)`` (natural log)."""
        return float(self.token_log_probs(sequence).sum())

    def nll(self, sequences: Any) -> float:
        """Mean negative log-likelihood per token (nats) over ``sequences`` (a stream or list)."""
        seqs = _as_sequences(sequences, self.vocab_size, "sequences")
        lps = [self.token_log_probs(s) for s in seqs if len(s)]
        if not lps:
            raise ValueError("`sequences` is empty: no tokens to score.")
        return float(-np.concatenate(lps).mean())

    def conditional(self, history: Sequence[int]) -> np.ndarray:
        """``p(· | history)`` over the ``K`` tokens; only the last ``order - 1`` tokens count."""
        L = self.order - 1
        h = np.asarray(history, np.int64)[len(history) - L:] if L else np.zeros(0, np.int64)
        if len(h) and (h.min() < 0 or h.max() >= self.vocab_size):
            raise ValueError(f"`history` holds ids outside [0, {self.vocab_size}).")
        rows = np.concatenate([np.tile(h, (self.vocab_size, 1)),
                               np.arange(self.vocab_size)[:, None]], axis=1)
        return self._probs_of(rows)

    def sample(self, rng: np.random.Generator, length: int,
               prompt: Sequence[int] = ()) -> list[int]:
        """Generate ``length`` tokens after ``prompt`` (Bishop §12.2.4: run generatively)."""
        out = [int(t) for t in prompt]
        for _ in range(length):
            p = self.conditional(out)
            out.append(int(rng.choice(self.vocab_size, p=p / p.sum())))
        return out[len(prompt):]


class BagOfWordsLM(NGramLM):
    r"""Bag-of-words LM, Bishop (12.28): :math:`p(x_{1:N}) = \prod_n p(x_n)`; an :class:`NGramLM`
    of ``order=1`` (maximum likelihood: relative frequencies, Bishop Ex. 12.11)."""

    def __init__(self, vocab_size: int, *, smoothing: str = "add_k", k: float = 1.0,
                 lam: float = 0.01) -> None:
        super().__init__(1, vocab_size, smoothing=smoothing, k=k, lam=lam)


class NGramClassifier:
    r"""Bayes' rule over class-conditional n-gram models (Bishop (12.30) with (12.32)).

    .. math::
        \log p(\mathcal C_k \mid x_{1:N}) = \log p(\mathcal C_k)
            + \sum_n \log p(x_n \mid x_{n-L:n-1}, \mathcal C_k) - \log Z

    ``p(C_k)`` is the class frequency; each class's :class:`NGramLM` is fitted on its sequences.
    """

    def __init__(self, order: int, vocab_size: int, num_classes: int, *,
                 smoothing: str = "add_k", k: float = 1.0, lam: float = 0.01) -> None:
        if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
            raise ValueError(f"`num_classes` must be an int >= 2; got {num_classes!r}.")
        self.num_classes = int(num_classes)
        self.models = [NGramLM(order, vocab_size, smoothing=smoothing, k=k, lam=lam)
                       for _ in range(self.num_classes)]
        self.vocab_size, self.order = int(vocab_size), int(order)
        self.log_prior: np.ndarray | None = None

    def fit(self, sequences: Sequence[Sequence[int]], labels: Sequence[int]) -> NGramClassifier:
        seqs = _as_sequences(list(sequences), self.vocab_size, "sequences")
        y = np.asarray(labels)
        if y.shape != (len(seqs),):
            raise ValueError(f"`labels` must have one label per sequence ({len(seqs)}); got "
                             f"shape {y.shape}.")
        if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
            raise ValueError(f"`labels` must lie in [0, {self.num_classes}) (num_classes); "
                             f"got {int(y.min())}..{int(y.max())}.")
        counts = np.bincount(y, minlength=self.num_classes)
        if (counts == 0).any():
            raise ValueError(f"every class needs a training sequence; class "
                             f"{int(np.argmin(counts))} has none.")
        self.log_prior = np.log(counts / counts.sum())
        for c, model in enumerate(self.models):
            model.fit([s for s, lab in zip(seqs, y) if lab == c])
        return self

    def log_joint(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """``log p(C_k) + log p(x | C_k)``, ``[N, C]`` (unnormalised (12.30))."""
        if self.log_prior is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(...) first.")
        seqs = _as_sequences(list(sequences), self.vocab_size, "sequences")
        out = np.empty((len(seqs), self.num_classes))
        for c, model in enumerate(self.models):
            out[:, c] = [model.token_log_probs(s).sum() for s in seqs]
        return out + self.log_prior

    def log_posterior(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """``log p(C_k | x)``, ``[N, C]``, normalised over the classes."""
        lj = self.log_joint(sequences)
        m = lj.max(axis=1, keepdims=True)
        return lj - (m + np.log(np.exp(lj - m).sum(axis=1, keepdims=True)))

    def predict(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """The most probable class of each sequence (int64 ``[N]``)."""
        return np.argmax(self.log_joint(sequences), axis=1)


class NaiveBayes(NGramClassifier):
    r"""Naive Bayes, Bishop (12.29)–(12.30): a bag of words per class.

    .. math::
        p(\mathcal C_k \mid x_{1:N}) \propto p(\mathcal C_k) \prod_n p(x_n \mid \mathcal C_k)
            = p(\mathcal C_k) \prod_w p(w \mid \mathcal C_k)^{c_w(x)}

    (``c_w(x)``: :func:`bag_of_words` counts). An :class:`NGramClassifier` of ``order=1``.
    """

    def __init__(self, vocab_size: int, num_classes: int, *, smoothing: str = "add_k",
                 k: float = 1.0, lam: float = 0.01) -> None:
        super().__init__(1, vocab_size, num_classes, smoothing=smoothing, k=k, lam=lam)

    def word_log_probs(self) -> np.ndarray:
        """``log p(w | C_k)``, ``[C, K]``."""
        return np.stack([m.token_log_probs(np.arange(self.vocab_size)) for m in self.models])

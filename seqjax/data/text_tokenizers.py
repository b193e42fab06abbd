"""The tokenizers a pretraining run uses, behind one small interface.

:class:`TextTokenizer` is what ``seqjax prepare`` (:mod:`seqjax.data.prepare`) and a
pretraining run need from a tokenizer: ``encode(text) -> list[int]`` of ordinary text
(a special token's spelling inside the text, e.g. ``"<|endoftext|>"``, is encoded as the
characters it is made of, never as the special id: data cannot inject control tokens),
``decode(ids) -> str``, the end-of-text id ``eot`` that separates documents, ``vocab_size``,
and ``describe()``: ``{"kind", "name", "vocab_size", "eot"}`` (and ``"sha256"`` of the file
for a tokenizer loaded from a file), what a shard folder's ``manifest.json`` records so a
run can check it reads shards made by its own tokenizer
(:meth:`seqjax.data.shards.TokenData.check_tokenizer`).

:func:`load_text_tokenizer` builds one from a spec:

* ``"gpt2"``: GPT-2's byte-level BPE (Radford et al. 2019; Bishop §12.2.2) through
  ``tiktoken`` (``pip install "seqjax[pretrain]"``): 50,257 ids, ``<|endoftext|>`` = 50256.
  The merge ranks come from ``rank_file`` (a ``.tiktoken`` file), else from the copy the
  package ``openai-whisper`` ships (:func:`gpt2_rank_file`, found without importing it),
  else from ``tiktoken.get_encoding("gpt2")`` (tiktoken's cache, or a download). A rank file
  is checked against GPT-2's SHA-256.
* ``"hf:PATH"`` or a path ending in ``tokenizer.json``: any Hugging Face ``tokenizer.json``
  (``tokenizers``, ``pip install "seqjax[hf]"``). EOT: ``eot=`` if given, else the first of
  ``<|endoftext|>``, ``</s>``, ``[SEP]``, ``<eos>`` in its vocabulary.
* ``"seqjax:PATH"``: a tokenizer saved by seqjax (:func:`seqjax.data.tokenizers.load_tokenizer`:
  :class:`~seqjax.data.tokenizers.CharTokenizer`, ``WordTokenizer``, or a ``train_bpe``
  tokenizer.json). EOT: ``eot=`` if given, else its ``eos`` special token.

Example:
    >>> import os, tempfile
    >>> from seqjax.data.tokenizers import CharTokenizer
    >>> path = os.path.join(tempfile.mkdtemp(), "chars.json")
    >>> CharTokenizer.from_text("hello world").save(path)
    >>> tok = load_text_tokenizer(f"seqjax:{path}")
    >>> tok.decode(tok.encode("hello")), tok.eot, tok.describe()["kind"]
    ('hello', 3, 'seqjax')
"""

from __future__ import annotations

import abc
import importlib.util
import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

from seqjax.data.shards import sha256_file

__all__ = [
    "GPT2_EOT",
    "GPT2_RANKS_SHA256",
    "GPT2_VOCAB_SIZE",
    "HFTextTokenizer",
    "SeqjaxTextTokenizer",
    "TextTokenizer",
    "TiktokenTokenizer",
    "gpt2_rank_file",
    "load_text_tokenizer",
]

#: GPT-2's vocabulary: 50,000 merges + 256 bytes + ``<|endoftext|>`` (its last id).
GPT2_VOCAB_SIZE, GPT2_EOT = 50257, 50256
#: SHA-256 of GPT-2's ranks as a ``.tiktoken`` file (tiktoken's ``r50k_base``; whisper's
#: ``assets/gpt2.tiktoken``).
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pre-tokenisation regex as tiktoken writes it (tiktoken_ext/openai_public.py,
# `r50k_pat_str`); read from the installed module when it exposes it.
_GPT2_PAT_STR = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
# Hugging Face end-of-text spellings, tried in order.
_HF_EOT_CANDIDATES = ("<|endoftext|>", "</s>", "[SEP]", "<eos>")
_SPECS = ("'gpt2'", "'hf:PATH' (or a path ending in tokenizer.json)", "'seqjax:PATH'")


class TextTokenizer(abc.ABC):
    """What a pretraining pipeline needs from a tokenizer.

    Attributes:
        eot: the end-of-text id that separates documents.
        vocab_size: the number of ids; every id is below it.
    """

    eot: int
    vocab_size: int

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` as ordinary text: special tokens' spellings are not special."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens written out)."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """``{"kind", "name", "vocab_size", "eot"}`` (and ``"sha256"`` of a tokenizer file):
        a shard manifest's ``tokenizer``."""

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        """``[encode(t) for t in texts]`` (one thread: ``seqjax prepare`` parallelises over
        processes)."""
        return [self.encode(t) for t in texts]


def gpt2_rank_file() -> str | None:
    """The path of GPT-2's ranks shipped by ``openai-whisper`` (``whisper/assets/gpt2.tiktoken``),
    found without importing ``whisper``; ``None`` when it is not installed."""
    try:
        spec = importlib.util.find_spec("whisper")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "assets", "gpt2.tiktoken")
        if os.path.isfile(path):
            return path
    return None


def tiktoken_cache_dir() -> str:
    """The folder tiktoken caches its downloads in: ``$TIKTOKEN_CACHE_DIR``, else
    ``$DATA_GYM_CACHE_DIR``, else ``<temp>/data-gym-cache`` (tiktoken's ``load.py``)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if os.environ.get(var):
            return os.environ[var]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _no_gpt2_ranks(err: BaseException) -> str:
    """The one line of a GPT-2 tokenizer that has no ranks here and could not download them."""
    cause = " ".join(str(err).split())[:160]
    return (
        "GPT-2's BPE ranks are not on this machine and could not be downloaded "
        f"({type(err).__name__}: {cause}). Looked in: openai-whisper's "
        "whisper/assets/gpt2.tiktoken (not installed), tiktoken's cache "
        f"{tiktoken_cache_dir()!r} (TIKTOKEN_CACHE_DIR). Pass --rank_file PATH to a "
        "gpt2.tiktoken, or `pip install --no-deps openai-whisper`, or fill the cache on a "
        "machine with network: TIKTOKEN_CACHE_DIR=DIR python -c \"import tiktoken; "
        "tiktoken.get_encoding('gpt2')\", then copy DIR here and set TIKTOKEN_CACHE_DIR=DIR.")


def _tiktoken() -> Any:
    from seqjax._optional import require

    tiktoken = require("tiktoken", "the GPT-2 tokenizer (tiktoken)")
    require("tiktoken.load", "the GPT-2 tokenizer (tiktoken)")
    return tiktoken


def _gpt2_pat_str() -> str:
    try:
        from tiktoken_ext import openai_public
    except ImportError:
        return _GPT2_PAT_STR
    return getattr(openai_public, "r50k_pat_str", _GPT2_PAT_STR)


class TiktokenTokenizer(TextTokenizer):
    """A ``tiktoken.Encoding`` (GPT-2's BPE from :func:`load_text_tokenizer`): ``encode`` is
    ``encode_ordinary``.

    Example (with ``openai-whisper`` installed for the offline ranks)::

        >>> tok = load_text_tokenizer("gpt2")                      # doctest: +SKIP
        >>> tok.encode("Hello world"), tok.eot, tok.vocab_size     # doctest: +SKIP
        ([15496, 995], 50256, 50257)
    """

    def __init__(self, encoding: Any, *, eot: int | None = None):
        self.encoding = encoding
        self.eot = int(encoding.eot_token if eot is None else eot)
        self.vocab_size = int(encoding.n_vocab)

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode([int(i) for i in ids])

    def describe(self) -> dict[str, Any]:
        return {"kind": "tiktoken", "name": self.encoding.name, "vocab_size": self.vocab_size,
                "eot": self.eot}


def _gpt2(rank_file: str | os.PathLike | None) -> TiktokenTokenizer:
    tiktoken = _tiktoken()
    path = os.fspath(rank_file) if rank_file is not None else gpt2_rank_file()
    if path is None:
        # No local ranks: tiktoken's own cache ($TIKTOKEN_CACHE_DIR), else a download.
        try:
            return TiktokenTokenizer(tiktoken.get_encoding("gpt2"))
        except Exception as err:  # noqa: BLE001 — offline: requests', urllib3's, OSError...
            raise ValueError(_no_gpt2_ranks(err)) from None
    if not os.path.isfile(path):
        raise ValueError(f"`rank_file` {path!r} does not exist; expected GPT-2's ranks as a "
                         ".tiktoken file (e.g. openai-whisper's whisper/assets/gpt2.tiktoken).")
    digest = sha256_file(path)
    if digest != GPT2_RANKS_SHA256:
        raise ValueError(f"`rank_file` {path!r} is not GPT-2's ranks: its SHA-256 is {digest}, "
                         f"expected {GPT2_RANKS_SHA256} (tiktoken's r50k_base, "
                         "whisper's gpt2.tiktoken).")
    encoding = tiktoken.Encoding(
        name="gpt2",
        pat_str=_gpt2_pat_str(),
        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(path),
        special_tokens={"<|endoftext|>": GPT2_EOT},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )
    return TiktokenTokenizer(encoding)


def _resolve_eot(eot: int | str | None, vocab_size: int, lookup: Any, found: int | None,
                 where: str, tried: str) -> int:
    """``eot`` (an id, or a token looked up with ``lookup``), else ``found``, else an error."""
    if isinstance(eot, str):
        i = lookup(eot)
        if i is None:
            raise ValueError(f"`eot` {eot!r} is not a token of {where}.")
        return int(i)
    if eot is not None:
        if not 0 <= int(eot) < vocab_size:
            raise ValueError(f"`eot` must be an id in [0, {vocab_size}) for {where}; got {eot}.")
        return int(eot)
    if found is None:
        raise ValueError(f"{where} has no end-of-text token (looked for {tried}); give its id "
                         "or token with `eot=` (--eot).")
    return int(found)


def _file_sha256(path: str) -> str:
    if not os.path.isfile(path):
        raise ValueError(f"the tokenizer file {path!r} does not exist.")
    return sha256_file(path)


class HFTextTokenizer(TextTokenizer):
    """A Hugging Face ``tokenizers.Tokenizer`` (loaded from a ``tokenizer.json``), with its
    special tokens encoded as ordinary text (``encode_special_tokens``) and no template."""

    def __init__(self, tokenizer: Any, *, eot: int | str | None = None, name: str = "hf",
                 sha256: str | None = None):
        self.tokenizer = tokenizer
        self.tokenizer.encode_special_tokens = True
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        found = next((i for t in _HF_EOT_CANDIDATES
                      if (i := tokenizer.token_to_id(t)) is not None), None)
        self.eot = _resolve_eot(eot, self.vocab_size, tokenizer.token_to_id, found,
                                f"the tokenizer {name!r}", ", ".join(_HF_EOT_CANDIDATES))
        self.name, self.sha256 = name, sha256

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, eot: int | str | None = None
                  ) -> HFTextTokenizer:
        """Load a ``tokenizer.json``."""
        from seqjax._optional import require

        tk = require("tokenizers", "a Hugging Face tokenizer.json (`tokenizers`)")
        path = os.fspath(path)
        digest = _file_sha256(path)
        try:
            tokenizer = tk.Tokenizer.from_file(path)
        except Exception as err:  # tokenizers raises its own Exception on a bad file
            raise ValueError(f"{path!r} is not a Hugging Face tokenizer.json: {err}") from None
        return cls(tokenizer, eot=eot, name=os.path.basename(path), sha256=digest)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A pickled tokenizers.Tokenizer forgets encode_special_tokens (worker processes).
        self.__dict__.update(state)
        self.tokenizer.encode_special_tokens = True

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def describe(self) -> dict[str, Any]:
        out = {"kind": "hf", "name": self.name, "vocab_size": self.vocab_size, "eot": self.eot}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out


class SeqjaxTextTokenizer(TextTokenizer):
    """A seqjax :class:`~seqjax.data.tokenizers.Tokenizer` (char, word, or BPE) behind the
    pretraining interface; a BPE's special tokens are encoded as ordinary text (a character
    tokenizer has no other rule; a word tokenizer keeps its own: a ``<word>`` marker in the
    text is that token, as in Penn Treebank's ``<unk>``)."""

    def __init__(self, tokenizer: Any, *, eot: int | str | None = None, name: str = "seqjax",
                 sha256: str | None = None):
        self.tokenizer = tokenizer
        self._set_ordinary()
        self.vocab_size = int(tokenizer.vocab_size)
        self.eot = _resolve_eot(eot, self.vocab_size, tokenizer.token_to_id, tokenizer.eos_id,
                                f"the seqjax tokenizer {name!r}", "its `eos` special token")
        self.name, self.sha256 = name, sha256

    def _set_ordinary(self) -> None:
        # A BPE (seqjax's HFTokenizer) would read "<eos>" in the text as its special id.
        inner = getattr(self.tokenizer, "tokenizer", None)
        if inner is not None and hasattr(inner, "encode_special_tokens"):
            inner.encode_special_tokens = True

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._set_ordinary()

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, eot: int | str | None = None
                  ) -> SeqjaxTextTokenizer:
        """Load a tokenizer saved by seqjax (:func:`seqjax.data.tokenizers.load_tokenizer`)."""
        from seqjax.data.tokenizers import load_tokenizer

        path = os.fspath(path)
        digest = _file_sha256(path)
        return cls(load_tokenizer(path), eot=eot, name=os.path.basename(path), sha256=digest)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def describe(self) -> dict[str, Any]:
        out = {"kind": "seqjax", "name": self.name, "vocab_size": self.vocab_size,
               "eot": self.eot}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out


def load_text_tokenizer(spec: str, *, rank_file: str | os.PathLike | None = None,
                        eot: int | str | None = None) -> TextTokenizer:
    """The tokenizer named by ``spec`` (see the module docstring).

    Args:
        spec: ``"gpt2"``, ``"hf:PATH"`` (or a path ending in ``tokenizer.json``), or
            ``"seqjax:PATH"``.
        rank_file: GPT-2's ranks as a ``.tiktoken`` file (``"gpt2"`` only); default
            :func:`gpt2_rank_file`, then tiktoken's own cache or download.
        eot: the end-of-text id, or its token, overriding the one found (``hf:`` and
            ``seqjax:`` only).

    Returns: a :class:`TextTokenizer`. An unknown spec, a missing file, a rank file that is
    not GPT-2's, or no end-of-text token is a ``ValueError`` naming it; a missing optional
    package a ``ModuleNotFoundError`` naming the extra.
    """
    if not isinstance(spec, str):
        raise TypeError(f"`tokenizer` must be a str spec ({', '.join(_SPECS)}); got "
                        f"{type(spec).__name__}.")
    if rank_file is not None and spec != "gpt2":
        raise ValueError(f"`rank_file` is for the 'gpt2' tokenizer only; got tokenizer {spec!r}.")
    if spec == "gpt2":
        if eot is not None:
            raise ValueError(f"`eot` cannot be changed for 'gpt2' (its <|endoftext|> is "
                             f"{GPT2_EOT}); got {eot!r}.")
        return _gpt2(rank_file)
    if spec.startswith("hf:"):
        return HFTextTokenizer.from_file(spec[3:], eot=eot)
    if spec.startswith("seqjax:"):
        return SeqjaxTextTokenizer.from_file(spec[7:], eot=eot)
    if spec.endswith("tokenizer.json"):
        return HFTextTokenizer.from_file(spec, eot=eot)
    raise ValueError(f"`tokenizer` must be one of {', '.join(_SPECS)}; got {spec!r}.")

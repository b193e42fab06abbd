"""GPT-2's BPE as a seqjax tokenizer, and the specs a pretraining run names its tokenizer by.

A pretraining run (``seqjax prepare``, ``seqjax train gpt2``, the evaluations) names its
:class:`~seqjax.data.tokenizers.Tokenizer` by a spec, which :func:`load_text_tokenizer` loads:

* ``"gpt2"``: GPT-2's byte-level BPE (Radford et al. 2019; Bishop §12.2.2) through ``tiktoken``
  (``pip install "seqjax[pretrain]"``): 50,257 ids, ``<|endoftext|>`` = 50256. Merge ranks come
  from ``rank_file`` (a ``.tiktoken`` file, checked against GPT-2's SHA-256), else from
  ``openai-whisper``'s copy (:func:`gpt2_rank_file`), else ``tiktoken.get_encoding("gpt2")``
  (tiktoken's cache, or a download).
* ``"hf:PATH"`` or a path ending in ``tokenizer.json``: any Hugging Face ``tokenizer.json``
  (``pip install "seqjax[hf]"``). EOT: ``eot=`` if given, else the first of ``<|endoftext|>``,
  ``</s>``, ``[SEP]``, ``<eos>`` in its vocabulary.
* ``"seqjax:PATH"``: a tokenizer saved by seqjax (:func:`seqjax.data.tokenizers.load_tokenizer`:
  char, word, or a ``train_bpe`` tokenizer.json). EOT: ``eot=`` if given, else its ``eos``.

A tokenizer with no end-of-text token (nanoGPT's ``shakespeare_char``) loads with ``eot`` ``None``;
what needs one says so: ``split="documents"`` in ``seqjax prepare``, document-aligned windows, a
sample started from EOT.

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

import base64
import collections
import dataclasses
import importlib.util
import os
import tempfile
from typing import Any

from seqjax._optional import require
from seqjax.data.shards import sha256_file
from seqjax.data.tokenizers import HFTokenizer, SpecialTokens, Tokenizer, _check_ids, load_tokenizer

__all__ = ["GPT2_EOT", "GPT2_RANKS_SHA256", "GPT2_VOCAB_SIZE", "TiktokenTokenizer",
           "gpt2_rank_file", "load_text_tokenizer"]

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


def gpt2_rank_file() -> str | None:
    """Path of ``openai-whisper``'s ``whisper/assets/gpt2.tiktoken`` (found without importing it),
    or ``None`` when it is not installed."""
    try:
        spec = importlib.util.find_spec("whisper")
    except (ImportError, ValueError):
        return None
    folders = (spec.submodule_search_locations or []) if spec is not None else []
    paths = (os.path.join(folder, "assets", "gpt2.tiktoken") for folder in folders)
    return next((path for path in paths if os.path.isfile(path)), None)


def tiktoken_cache_dir() -> str:
    """tiktoken's download cache: ``$TIKTOKEN_CACHE_DIR``, ``$DATA_GYM_CACHE_DIR``, or
    ``<temp>/data-gym-cache`` (tiktoken's ``load.py``)."""
    return (os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
            or os.path.join(tempfile.gettempdir(), "data-gym-cache"))


def _no_gpt2_ranks(err: BaseException) -> str:
    """The error message when GPT-2's ranks are not here and could not be downloaded."""
    cause = " ".join(str(err).split())[:160]
    return (
        "GPT-2's BPE ranks are not on this machine and could not be downloaded "
        f"({type(err).__name__}: {cause}). Looked in: openai-whisper's "
        "whisper/assets/gpt2.tiktoken (not installed), tiktoken's cache "
        f"{tiktoken_cache_dir()!r} (TIKTOKEN_CACHE_DIR). Pass --rank_file PATH to a "
        "gpt2.tiktoken, or `pip install --no-deps openai-whisper`, or fill the cache on a "
        "machine with network: TIKTOKEN_CACHE_DIR=DIR python -c \"import tiktoken; "
        "tiktoken.get_encoding('gpt2')\", then copy DIR here and set TIKTOKEN_CACHE_DIR=DIR.")


def _gpt2_pat_str() -> str:
    try:
        from tiktoken_ext import openai_public
    except ImportError:
        return _GPT2_PAT_STR
    return getattr(openai_public, "r50k_pat_str", _GPT2_PAT_STR)


class TiktokenTokenizer(Tokenizer):
    """A ``tiktoken.Encoding`` (GPT-2's BPE) as a :class:`~seqjax.data.tokenizers.Tokenizer`.

    ``encode`` and ``encode_ordinary`` are tiktoken's ``encode_ordinary`` (byte-level: no id is
    unknown); ``<|endoftext|>`` is ``eot`` and ``eos_id``.

    Example (with ``openai-whisper`` installed for the offline ranks)::

        >>> tok = load_text_tokenizer("gpt2")                      # doctest: +SKIP
        >>> tok.encode("Hello world"), tok.eot, tok.vocab_size     # doctest: +SKIP
        ([15496, 995], 50256, 50257)
    """

    def __init__(self, encoding: Any):
        self.encoding = encoding
        self.origin, self.name = "tiktoken", encoding.name
        eot = getattr(encoding, "eot_token", None)
        eos = None if eot is None else encoding.decode_single_token_bytes(eot).decode()
        self.special_tokens = dataclasses.replace(SpecialTokens.none(), eos=eos)

    @property
    def vocab_size(self) -> int:
        return int(self.encoding.n_vocab)

    def token_to_id(self, token: str) -> int | None:
        try:
            return int(self.encoding.encode_single_token(token))
        except KeyError:
            return None

    def id_to_token(self, i: int) -> str:
        (i,) = _check_ids([i], self.vocab_size, "i")
        return self.encoding.decode_single_token_bytes(i).decode("utf-8", "replace")

    def _encode_text(self, text: str) -> tuple[list[int], collections.Counter[str]]:
        return self.encoding.encode_ordinary(text), collections.Counter()

    def _decode_ids(self, ids: list[int], skip_special: bool) -> str:
        if skip_special:
            ids = [i for i in ids if i not in self.special_ids]
        return self.encoding.decode(ids)

    def save(self, path: str | os.PathLike) -> None:
        """Write the ranks as a ``.tiktoken`` file (``base64(bytes) rank`` lines, no special
        tokens; what ``rank_file=`` reads): GPT-2's is byte for byte whisper's ``gpt2.tiktoken``."""
        from seqjax._io import write_atomic

        specials = {self.encoding.encode_single_token(t)
                    for t in self.encoding.special_tokens_set}
        lines = (base64.b64encode(self.encoding.decode_single_token_bytes(i)) + b" %d\n" % i
                 for i in range(self.vocab_size) if i not in specials)
        write_atomic(path, b"".join(lines))


def _gpt2(rank_file: str | os.PathLike | None) -> TiktokenTokenizer:
    tiktoken = require("tiktoken", "the GPT-2 tokenizer (tiktoken)")
    load = require("tiktoken.load", "the GPT-2 tokenizer (tiktoken)")
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
    return TiktokenTokenizer(tiktoken.Encoding(
        name="gpt2", pat_str=_gpt2_pat_str(), mergeable_ranks=load.load_tiktoken_bpe(path),
        special_tokens={"<|endoftext|>": GPT2_EOT}, explicit_n_vocab=GPT2_VOCAB_SIZE))


def _resolve_eot(eot: int | str | None, vocab_size: int, lookup: Any, found: int | None,
                 where: str) -> int | None:
    """``eot`` (an id, or a token looked up with ``lookup``), else ``found`` (``None``: none)."""
    if isinstance(eot, str):
        i = lookup(eot)
        if i is None:
            raise ValueError(f"`eot` {eot!r} is not a token of {where}.")
        return int(i)
    if eot is not None:
        if not 0 <= int(eot) < vocab_size:
            raise ValueError(f"`eot` must be an id in [0, {vocab_size}) for {where}; got {eot}.")
        return int(eot)
    return None if found is None else int(found)


def _from_file(path: str | os.PathLike, eot: int | str | None, *, kind: str) -> Tokenizer:
    """The ``hf:``/``seqjax:`` tokenizer at ``path``, named by its file and SHA-256, with its EOT
    (the module docstring's rules)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"the tokenizer file {path!r} does not exist.")
    if kind == "hf":
        tk = require("tokenizers", "a Hugging Face tokenizer.json (`tokenizers`)")
        try:
            tok: Tokenizer = HFTokenizer(tk.Tokenizer.from_file(path))
        except Exception as err:  # tokenizers raises its own Exception on a bad file
            raise ValueError(f"{path!r} is not a Hugging Face tokenizer.json: {err}") from None
        found = next((i for t in _HF_EOT_CANDIDATES if (i := tok.token_to_id(t)) is not None),
                     None)
    else:
        tok = load_tokenizer(path)
        found = tok.eos_id
    tok.origin, tok.name, tok.sha256 = kind, os.path.basename(path), sha256_file(path)
    tok._eot = _resolve_eot(eot, tok.vocab_size, tok.token_to_id, found,
                            f"the tokenizer {os.path.basename(path)!r}")
    return tok


def load_text_tokenizer(spec: str, *, rank_file: str | os.PathLike | None = None,
                        eot: int | str | None = None) -> Tokenizer:
    """The tokenizer named by ``spec``, ``rank_file`` (``"gpt2"`` only) and ``eot`` (``hf:`` and
    ``seqjax:`` only), as the module docstring says: a :class:`TiktokenTokenizer`,
    :class:`~seqjax.data.tokenizers.HFTokenizer` or the seqjax tokenizer saved at the path.

    Raises:
        ValueError: an unknown spec (a non-str: ``TypeError``), a missing file, a non-GPT-2 rank
            file, a ``rank_file``/``eot`` the spec does not take, an ``eot`` not in the vocabulary.
        ModuleNotFoundError: a missing optional package (the message names the extra).
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
    kind, colon, path = spec.partition(":")
    if colon and kind in ("hf", "seqjax"):
        return _from_file(path, eot, kind=kind)
    if spec.endswith("tokenizer.json"):
        return _from_file(spec, eot, kind="hf")
    raise ValueError(f"`tokenizer` must be one of {', '.join(_SPECS)}; got {spec!r}.")


#: Names this module held before the tokenizers had one interface.
_RETIRED = {
    "TextTokenizer": "seqjax.data.tokenizers.Tokenizer (encode_ordinary, eot, describe)",
    "HFTextTokenizer": "seqjax.data.tokenizers.HFTokenizer (load_text_tokenizer('hf:PATH'))",
    "SeqjaxTextTokenizer": "the seqjax tokenizer itself (load_text_tokenizer('seqjax:PATH'))",
}


def __getattr__(name: str) -> Any:
    if name in _RETIRED:
        raise ImportError(f"seqjax.data.text_tokenizers.{name} was removed: use {_RETIRED[name]}.")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Tokenizers with one interface: characters, words, BPE, and any Hugging Face ``tokenizer.json``.

Text becomes ids through a vocabulary, the first step of every model in the texts: one-hot /
embedding lookup of token ``i`` (MEDL §7.1; Bishop (12.26) ``v_n = E x_n``), the tokens being
characters, words, or sub-words learned by byte-pair encoding (Bishop §12.2.2;
:mod:`seqjax.data.bpe_teaching` has the textbook merge rule in plain Python).

Every :class:`Tokenizer` has ``encode``/``encode_batch`` (optional BOS/EOS; ``max_length`` raises
or truncates), ``encode_with_unknowns``, ``decode``/``decode_batch`` (an id outside
``[0, vocab_size)`` raises ``ValueError``, never a silent clamp), special ids ``pad_id``,
``unk_id``, … (``None`` when absent), ``save`` to JSON and :func:`load_tokenizer` (never pickle);
and for a pretraining stream ``encode_ordinary`` (a special token's spelling in the text is
encoded as its characters, so data cannot inject control tokens), ``eot`` and ``describe()``,
which a shard manifest records so a run can check its shards were made by its own tokenizer
(:func:`seqjax.data.text_tokenizers.load_text_tokenizer` loads one by spec). Special tokens come
first in the vocabularies built here, in the order ``pad, unk, bos, eos, mask, sep, cls``, so
``pad_id == 0``.
"""

from __future__ import annotations

import abc
import collections
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, astuple, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from seqjax._io import write_json
from seqjax._optional import require

__all__ = ["SpecialTokens", "Tokenizer", "CharTokenizer", "WordTokenizer", "HFTokenizer",
           "train_bpe", "load_tokenizer"]

PathLike = str | os.PathLike

_FORMAT_VERSION = 1


@dataclass(frozen=True)
class SpecialTokens:
    """The strings used for the special tokens; ``None`` leaves a token out.

    ``tokens()`` lists them in vocabulary order ``pad, unk, bos, eos, mask, sep, cls``. MEDL §7.1's
    ``<start>``, ``<stop>``, ``<empty>`` are our bos, eos, pad; Bishop §12.3 uses
    ``<start>``/``<stop>`` and BERT's ``[CLS]``, ``[SEP]``, ``[MASK]`` (§12.3.2).

    Example:
        >>> SpecialTokens().tokens()[:4]
        ['<pad>', '<unk>', '<bos>', '<eos>']
    """

    pad: str | None = "<pad>"
    unk: str | None = "<unk>"
    bos: str | None = "<bos>"
    eos: str | None = "<eos>"
    mask: str | None = "<mask>"
    sep: str | None = "<sep>"
    cls: str | None = "<cls>"

    @classmethod
    def none(cls) -> SpecialTokens:
        """No special tokens at all (e.g. nanoGPT's plain character vocabulary)."""
        return cls(**{f.name: None for f in fields(cls)})

    def tokens(self) -> list[str]:
        return list(dict.fromkeys(t for t in astuple(self) if t is not None))

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def _check_ids(ids: Any, vocab_size: int, name: str = "ids") -> list[int]:
    """Validate a 1-D sequence of ids against ``[0, vocab_size)``; return it as ``list[int]``."""
    arr = np.asarray(ids)
    if arr.size == 0:
        return []
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D sequence of ids; got shape {arr.shape}.")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"`{name}` must contain integers; got dtype {arr.dtype}.")
    bad = arr[(arr < 0) | (arr >= vocab_size)]
    if bad.size:
        raise ValueError(f"`{name}` contains id {int(bad[0])}, outside the vocabulary "
                         f"[0, {vocab_size}) (vocab_size={vocab_size}).")
    return [int(i) for i in arr]


def _special_id_property(role: str) -> Any:
    """``Tokenizer.<role>_id``: the id of that special token (``None`` when absent)."""
    return property(lambda self: self._special_id(role),
                    doc=f"Id of the {role} token (``None`` when absent).")


class Tokenizer(abc.ABC):
    """Common interface; subclasses implement the abstract methods.

    Attributes:
        origin, name, sha256: recorded by :meth:`describe` as ``kind``, ``name``, ``sha256``:
            the source library (``"seqjax"``, ``"hf"``, ``"tiktoken"``), the file it was loaded
            from, and that file's SHA-256 (``None`` when not loaded from a file).
    """

    special_tokens: SpecialTokens
    origin: str = "seqjax"
    name: str = ""
    sha256: str | None = None
    _eot: int | None = None  # set by load_text_tokenizer (eot=), else eos_id

    # --- what a subclass provides -------------------------------------------------
    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """Id of ``token`` or ``None`` if it is not in the vocabulary."""

    @abc.abstractmethod
    def id_to_token(self, i: int) -> str:
        """Token string of id ``i`` (``ValueError`` outside the vocabulary)."""

    @abc.abstractmethod
    def _encode_text(self, text: str) -> tuple[list[int], collections.Counter[str]]:
        """Ids of ``text`` (no BOS/EOS) and the counter of symbols mapped to ``<unk>``."""

    @abc.abstractmethod
    def _decode_ids(self, ids: list[int], skip_special: bool) -> str:
        """Text of already-validated ids."""

    @abc.abstractmethod
    def save(self, path: PathLike) -> None:
        """Write the tokenizer as JSON to ``path``."""

    # --- shared behaviour ---------------------------------------------------------
    def __len__(self) -> int:
        return self.vocab_size

    def _special_id(self, role: str) -> int | None:
        tok = getattr(self.special_tokens, role)
        return None if tok is None else self.token_to_id(tok)

    pad_id = _special_id_property("pad")
    unk_id = _special_id_property("unk")
    bos_id = _special_id_property("bos")
    eos_id = _special_id_property("eos")
    mask_id = _special_id_property("mask")
    sep_id = _special_id_property("sep")
    cls_id = _special_id_property("cls")

    @property
    def special_ids(self) -> list[int]:
        """Ids of all special tokens present in the vocabulary."""
        ids = (self.token_to_id(t) for t in self.special_tokens.tokens())
        return sorted({i for i in ids if i is not None})

    def _require(self, role: str) -> int:
        i = self._special_id(role)
        if i is None:
            raise ValueError(f"this {type(self).__name__} has no {role!r} special token "
                             f"(special_tokens.{role}={getattr(self.special_tokens, role)!r}).")
        return i

    def encode_with_unknowns(self, text: str, *, add_bos: bool = False, add_eos: bool = False,
                             max_length: int | None = None, truncation: bool = False
                             ) -> tuple[list[int], collections.Counter[str]]:
        """Like :meth:`encode`, also returning ``Counter`` of the symbols mapped to ``<unk>``."""
        if not isinstance(text, str):
            raise TypeError(f"`text` must be a str; got {type(text).__name__}.")
        ids, unknown = self._encode_text(text)
        head = [self._require("bos")] if add_bos else []
        tail = [self._require("eos")] if add_eos else []
        if max_length is not None:
            room = max_length - len(head) - len(tail)  # for the text's ids
            if room < 0:
                raise ValueError(f"`max_length` must be at least {len(head) + len(tail)} to hold "
                                 f"the BOS/EOS tokens; got {max_length}.")
            if len(ids) > room and not truncation:
                raise ValueError(f"sequence has {len(head) + len(ids) + len(tail)} tokens, more "
                                 f"than max_length={max_length} (text starts {text[:40]!r}); "
                                 "pass truncation=True to cut it.")
            ids = ids[:room]
        return head + ids + tail, unknown

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False,
               max_length: int | None = None, truncation: bool = False) -> list[int]:
        """Ids of ``text``: ``[bos] + tokens + [eos]`` (BOS/EOS only when asked).

        ``max_length`` bounds the total length: longer sequences raise ``ValueError`` unless
        ``truncation=True``, which drops tokens from the end (BOS/EOS are kept).
        """
        return self.encode_with_unknowns(text, add_bos=add_bos, add_eos=add_eos,
                                         max_length=max_length, truncation=truncation)[0]

    def encode_batch(self, texts: Iterable[str], **kwargs: Any) -> list[list[int]]:
        """:meth:`encode` of each text (keyword arguments as for :meth:`encode`)."""
        return [self.encode(t, **kwargs) for t in texts]

    # --- the pretraining stream -----------------------------------------------------
    @property
    def eot(self) -> int | None:
        """End-of-text id between documents: the loader's ``eot=``, else ``eos_id`` (or None)."""
        return self.eos_id if self._eot is None else self._eot

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of ``text`` as plain text: no BOS/EOS, no template, special tokens' spellings not
        special (a word tokenizer keeps its rule: a ``<word>`` marker is that token, as PTB's)."""
        if not isinstance(text, str):
            raise TypeError(f"`text` must be a str; got {type(text).__name__}.")
        return self._encode_text(text)[0]

    def describe(self) -> dict[str, Any]:
        """Shard manifest's ``tokenizer``: ``{"kind", "name", "vocab_size", "eot"[, "sha256"]}``."""
        out = {"kind": self.origin, "name": self.name or type(self).__name__,
               "vocab_size": self.vocab_size, "eot": self.eot}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out

    def decode(self, ids: Sequence[int] | np.ndarray, *, skip_special: bool = False) -> str:
        """Text of ``ids``; ``ValueError`` naming the first id outside ``[0, vocab_size)``."""
        return self._decode_ids(_check_ids(ids, self.vocab_size), skip_special)

    def decode_batch(self, ids_batch: Iterable[Sequence[int]] | np.ndarray, *,
                     skip_special: bool = False) -> list[str]:
        """:meth:`decode` of each row (a padded ``int[B, T]`` array or a list of lists)."""
        return [self.decode(row, skip_special=skip_special) for row in ids_batch]


class _VocabTokenizer(Tokenizer):
    """A tokenizer backed by an explicit ``list[str]`` vocabulary."""

    kind = ""
    _joiner = ""  # between decoded tokens

    def __init__(self, vocab: Sequence[str], special_tokens: SpecialTokens | None = None):
        self.special_tokens = SpecialTokens() if special_tokens is None else special_tokens
        vocab = list(vocab)
        if len(set(vocab)) != len(vocab):
            dup = [t for t, c in collections.Counter(vocab).items() if c > 1]
            raise ValueError(f"`vocab` must not contain duplicates; got {dup[:5]} repeated.")
        missing = [t for t in self.special_tokens.tokens() if t not in vocab]
        if missing:
            raise ValueError(f"`vocab` lacks the special tokens {missing}.")
        self.vocab: list[str] = vocab
        self._index = {t: i for i, t in enumerate(vocab)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_to_id(self, token: str) -> int | None:
        return self._index.get(token)

    def id_to_token(self, i: int) -> str:
        return self.vocab[_check_ids([i], self.vocab_size, "i")[0]]

    def _lookup(self, symbols: Sequence[str]) -> tuple[list[int], collections.Counter[str]]:
        ids = [self._index.get(s, -1) for s in symbols]
        unknown = collections.Counter(s for s, i in zip(symbols, ids) if i < 0)
        unk = self.unk_id
        if unknown and unk is None:
            raise ValueError(f"{next(iter(unknown))!r} is not in the vocabulary of this "
                             f"{type(self).__name__} and it has no <unk> token "
                             "(special_tokens.unk is None).")
        return [unk if i < 0 else i for i in ids] if unknown else ids, unknown

    def _decode_ids(self, ids: list[int], skip_special: bool) -> str:
        skip = set(self.special_ids) if skip_special else set()
        return self._joiner.join(self.vocab[i] for i in ids if i not in skip)

    def _config(self) -> dict[str, Any]:
        return {}

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "format_version": _FORMAT_VERSION, "vocab": self.vocab,
                "special_tokens": self.special_tokens.as_dict(), **self._config()}

    def save(self, path: PathLike) -> None:
        """Write :meth:`to_json` to ``path`` (UTF-8 JSON, atomically)."""
        write_json(path, self.to_json())


class CharTokenizer(_VocabTokenizer):
    """One token per character (Bishop §12.2.2's character-level dictionary; char-rnn/nanoGPT).

    The vocabulary is the special tokens, then the sorted distinct characters of the training
    text; with ``SpecialTokens.none()`` the ids are nanoGPT's ``shakespeare_char`` ids
    (``stoi = {ch: i for i, ch in enumerate(sorted(set(text)))}``). Unknown characters map to
    ``<unk>``.

    Example:
        >>> tok = CharTokenizer.from_text("hello", special_tokens=SpecialTokens.none())
        >>> tok.vocab, tok.encode("hole")
        (['e', 'h', 'l', 'o'], [1, 3, 2, 0])
    """

    kind = "char"

    @classmethod
    def from_text(
        cls, text: str | Iterable[str], special_tokens: SpecialTokens | None = None
    ) -> CharTokenizer:
        """Vocabulary of the characters in ``text`` (a str or an iterable of str)."""
        special_tokens = SpecialTokens() if special_tokens is None else special_tokens
        chars = {c for t in ([text] if isinstance(text, str) else text) for c in t}
        if not chars:
            raise ValueError("`text` is empty: a character vocabulary needs at least one "
                             "character (got no text, or only empty strings).")
        specials = special_tokens.tokens()
        return cls(specials + sorted(chars - set(specials)), special_tokens)

    def _encode_text(self, text: str) -> tuple[list[int], collections.Counter[str]]:
        return self._lookup(text)



# ``<word>`` first: markers such as ``<unk>`` and ``<eos>`` in a text stay one token (Penn
# Treebank's ``<unk>``) instead of ``<``, ``unk``, ``>``.
WORD_PATTERN = r"<\w+>|\w+|[^\w\s]"
#: Split on whitespace only, for corpora that are already tokenized (Penn Treebank, where
#: ``n't``, ``mr.`` and ``u.s.`` are words).
WHITESPACE_PATTERN = r"\S+"


class WordTokenizer(_VocabTokenizer):
    """One token per word or punctuation mark, with a frequency-pruned vocabulary.

    Words are matches of the regex ``pattern`` (default ``<\\w+>|\\w+|[^\\w\\s]``: a marker such
    as ``<unk>`` kept whole, runs of letters/digits, single punctuation marks;
    :data:`WHITESPACE_PATTERN` splits an already tokenized corpus on whitespace only). The
    vocabulary keeps words seen at least ``min_freq`` times (at most ``max_size`` tokens, specials
    included), most frequent first, ties alphabetical; everything else becomes ``<unk>`` (MEDL
    §7.1's fixed lexicon; Bishop §12.2.2: it "cannot cope with words not in the dictionary").
    ``decode`` joins tokens with single spaces.

    Example:
        >>> tok = WordTokenizer.from_texts(["the cat sat", "the dog"], min_freq=1)
        >>> ids = tok.encode("the bird sat")
        >>> tok.decode(ids)
        'the <unk> sat'
    """

    kind = "word"
    _joiner = " "

    def __init__(self, vocab: Sequence[str], special_tokens: SpecialTokens | None = None, *,
                 lowercase: bool = False, pattern: str = WORD_PATTERN):
        super().__init__(vocab, special_tokens)
        self.lowercase, self.pattern, self._regex = lowercase, pattern, re.compile(pattern)

    @classmethod
    def from_texts(cls, texts: Iterable[str], *, min_freq: int = 1, max_size: int | None = None,
                   lowercase: bool = False, pattern: str = WORD_PATTERN,
                   special_tokens: SpecialTokens | None = None) -> WordTokenizer:
        """Count words in ``texts`` and keep those with count ``>= min_freq``."""
        if min_freq < 1:
            raise ValueError(f"`min_freq` must be >= 1; got {min_freq}.")
        special_tokens = SpecialTokens() if special_tokens is None else special_tokens
        regex = re.compile(pattern)
        counts = collections.Counter(w for t in texts
                                     for w in regex.findall(t.lower() if lowercase else t))
        if not counts:
            raise ValueError(f"`texts` hold no words (pattern {pattern!r}): a word vocabulary "
                             "needs at least one; got no texts or only empty ones.")
        specials = special_tokens.tokens()
        words = sorted((w for w, c in counts.items() if c >= min_freq and w not in specials),
                       key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[: max(0, max_size - len(specials))]
        return cls(specials + words, special_tokens, lowercase=lowercase, pattern=pattern)

    def split(self, text: str) -> list[str]:
        """The word/punctuation strings that :meth:`encode` looks up."""
        return self._regex.findall(text.lower() if self.lowercase else text)

    def _encode_text(self, text: str) -> tuple[list[int], collections.Counter[str]]:
        return self._lookup(self.split(text))


    def _config(self) -> dict[str, Any]:
        return {"lowercase": self.lowercase, "pattern": self.pattern}


def _hf_tokenizers() -> Any:
    return require("tokenizers", "BPE / tokenizer.json support (Hugging Face `tokenizers`)")


# Names that common tokenizer.json files use for each role, tried in order.
_SPECIAL_CANDIDATES: dict[str, tuple[str, ...]] = {
    "pad": ("<pad>", "[PAD]", "<|pad|>"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
    "bos": ("<bos>", "<s>", "[BOS]", "<|startoftext|>", "<|endoftext|>"),
    "eos": ("<eos>", "</s>", "[EOS]", "<|endoftext|>"),
    "mask": ("<mask>", "[MASK]"),
    "sep": ("<sep>", "[SEP]"),
    "cls": ("<cls>", "[CLS]"),
}


class HFTokenizer(Tokenizer):
    """The Hugging Face wrapper: a ``tokenizers.Tokenizer`` (BPE, WordPiece, Unigram, …).

    Loads any ``tokenizer.json`` (:meth:`from_file`) or hub tokenizer (:meth:`from_pretrained`,
    needs a network). Special-token roles are detected from common spellings (``<pad>``/``[PAD]``,
    ``<s>``/``</s>``, ``[CLS]``, …) unless ``special_tokens`` is given. ``encode`` runs the
    tokenizer's own template (e.g. BERT's ``[CLS] … [SEP]``) only if ``use_template=True``;
    BOS/EOS come from ``add_bos``/``add_eos``. Unknown symbols are the spans whose id is ``unk_id``.

    Example:
        >>> tok = train_bpe(["low lower lowest"] * 10, vocab_size=300)
        >>> tok.decode(tok.encode("lowest low"))
        'lowest low'
    """

    def __init__(self, tokenizer: Any, special_tokens: SpecialTokens | None = None, *,
                 use_template: bool = False):
        self.tokenizer, self.use_template, self.origin = tokenizer, use_template, "hf"
        if special_tokens is None:
            vocab = tokenizer.get_vocab(with_added_tokens=True)
            special_tokens = SpecialTokens(**{role: next((c for c in cands if c in vocab), None)
                                              for role, cands in _SPECIAL_CANDIDATES.items()})
        self.special_tokens = special_tokens

    @classmethod
    def from_file(cls, path: PathLike, special_tokens: SpecialTokens | None = None,
                  **kwargs: Any) -> HFTokenizer:
        """Load a ``tokenizer.json`` (e.g. a BERT WordPiece or GPT-2 BPE tokenizer)."""
        return cls(_hf_tokenizers().Tokenizer.from_file(str(path)), special_tokens, **kwargs)

    @classmethod
    def from_pretrained(cls, name: str, special_tokens: SpecialTokens | None = None,
                        **kwargs: Any) -> HFTokenizer:
        """Download the ``tokenizer.json`` of hub model ``name`` (needs a network)."""
        return cls(_hf_tokenizers().Tokenizer.from_pretrained(name), special_tokens, **kwargs)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, i: int) -> str:
        return self.tokenizer.id_to_token(_check_ids([i], self.vocab_size, "i")[0])

    def tokens(self, text: str) -> list[str]:
        """The token strings of ``text`` (e.g. ``['un', '##aff', '##able']``)."""
        return self.tokenizer.encode(text, add_special_tokens=self.use_template).tokens

    def _encode_text(self, text: str) -> tuple[list[int], collections.Counter[str]]:
        enc = self.tokenizer.encode(text, add_special_tokens=self.use_template)
        unk = self.unk_id  # None: no id is unknown
        return list(enc.ids), collections.Counter(
            text[start:end] for i, (start, end) in zip(enc.ids, enc.offsets) if i == unk)

    def _decode_ids(self, ids: list[int], skip_special: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def encode_ordinary(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"`text` must be a str; got {type(text).__name__}.")
        before = self.tokenizer.encode_special_tokens
        self.tokenizer.encode_special_tokens = True  # "<|endoftext|>" in text is its characters
        try:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        finally:
            self.tokenizer.encode_special_tokens = before

    def save(self, path: PathLike) -> None:
        """Write Hugging Face's ``tokenizer.json`` format (readable by :func:`load_tokenizer`)."""
        self.tokenizer.save(str(path))


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    special_tokens: SpecialTokens | None = None,
) -> HFTokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 style) with Hugging Face ``tokenizers``.

    Byte-pair encoding (Sennrich et al. 2015; Bishop §12.2.2, Fig. 12.12): from the 256 byte
    symbols, repeatedly merge the most frequent adjacent pair inside a pre-token (GPT-2's regex
    split: contractions, runs of letters, of digits or of other symbols, each with at most one
    leading space, written ``Ġ``, and runs of white space) until ``vocab_size`` tokens exist or no
    pair occurs ``min_frequency`` times (then the vocabulary is smaller). Pre-splitting enforces
    Bishop's rule that a merge never joins a token starting with white space to the token before
    it (``'Ġ'+'p'`` is allowed). Byte-level symbols make every string encodable (no ``<unk>``)
    and ``decode(encode(s)) == s``. The special tokens take ids ``0..6``.

    **Merge order** (Hugging Face's ``BpeTrainer``): highest pair count first; a tie goes to the
    smaller ``(left id, right id)``, where the 256 byte symbols have ids ``7..262`` in code-point
    order of their byte-level characters (so ``Ġ`` sorts after every ASCII letter) and merged
    tokens follow in the order made. On Fig. 12.12's "Peter Piper picked a peck of pickled
    peppers" this gives ``pe`` (4), ``ck`` (3), then ``ed``, ``ick``, ``pick``, ``Ġpe``,
    ``Ġpick``, ``per`` (2 each), not the figure's ``pe``, ``ck``, ``pi``, ``ed``, ``per``
    (``i``+``ck`` beats ``p``+``i`` because ``i`` < ``p``).

    Example:
        >>> tok = train_bpe(["peter piper picked a peck"] * 5, vocab_size=270)
        >>> tok.pad_id, tok.vocab_size <= 270
        (0, True)
    """
    tk = _hf_tokenizers()
    special_tokens = SpecialTokens() if special_tokens is None else special_tokens
    alphabet = tk.pre_tokenizers.ByteLevel.alphabet()
    minimum = len(alphabet) + len(special_tokens.tokens())
    if vocab_size < minimum:
        raise ValueError(f"`vocab_size` must be at least {minimum} (256 bytes + special "
                         f"tokens); got {vocab_size}.")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                     special_tokens=special_tokens.tokens(),
                                     initial_alphabet=alphabet, show_progress=False)
    chars = [0]

    def counted() -> Iterator[str]:  # the corpus may be a stream: count as it flows
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"`texts` must yield str; got {type(t).__name__}.")
            chars[0] += len(t)
            yield t

    tokenizer.train_from_iterator(counted(), trainer)
    if chars[0] == 0:
        raise ValueError("`texts` is empty: BPE needs a corpus to learn merges from (got no "
                         "text, or only empty strings).")
    return HFTokenizer(tokenizer, special_tokens)


def load_tokenizer(path: PathLike, **kwargs: Any) -> Tokenizer:
    """Load a tokenizer saved by ``save``: seqjax's char/word JSON or any ``tokenizer.json``.

    Example:
        >>> import tempfile, os
        >>> tok = CharTokenizer.from_text("abc")
        >>> p = os.path.join(tempfile.mkdtemp(), "tok.json"); tok.save(p)
        >>> load_tokenizer(p).encode("cab") == tok.encode("cab")
        True
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"`path` {str(path)!r} is not a JSON tokenizer file: {e}") from e
    kind = data.get("type") if isinstance(data, dict) else None
    if kind in ("char", "word"):
        version = data.get("format_version", _FORMAT_VERSION)
        if version > _FORMAT_VERSION:
            raise ValueError(f"{str(path)!r} has format_version {version}; this seqjax reads "
                             f"<= {_FORMAT_VERSION}.")
        specials = SpecialTokens(**data["special_tokens"])
        if kind == "char":
            return CharTokenizer(data["vocab"], specials)
        return WordTokenizer(data["vocab"], specials, lowercase=data["lowercase"],
                             pattern=data["pattern"])
    if isinstance(data, dict) and "model" in data:
        return HFTokenizer.from_file(path, **kwargs)
    raise ValueError(f"`path` {str(path)!r} is neither a seqjax tokenizer (type 'char'/'word') "
                     "nor a Hugging Face tokenizer.json (no 'model' key).")

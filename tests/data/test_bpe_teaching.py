"""Bishop §12.2.2 byte-pair encoding (Fig. 12.12) by the textbook merge rule."""

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqjax.data.bpe_teaching import Merge, apply_merges, learn_merges

PETER = "Peter Piper picked a peck of pickled peppers"


def test_bishop_fig_12_12_merges():
    merges = learn_merges(PETER, 5)
    assert [(m.left, m.right, m.count) for m in merges] == [
        ("p", "e", 4),  # 'Pe' is not counted: P and p are distinct characters
        ("c", "k", 3),
        ("p", "i", 2),
        ("e", "d", 2),
        ("pe", "r", 2),
    ]
    assert [m.token for m in merges] == ["pe", "ck", "pi", "ed", "per"]


def test_segmentation_after_the_figure_merges():
    merges = learn_merges(PETER, 5)
    tokens = apply_merges(PETER, merges)
    assert tokens[:5] == ["P", "e", "t", "e", "r"]
    assert apply_merges("pickled peppers", merges) == ["pi", "ck", "l", "ed", "pe", "p", "per", "s"]
    # each merge removed `count` tokens (no overlapping pairs in this text)
    n_chars = len(PETER.replace(" ", ""))
    assert len(tokens) == n_chars - sum(m.count for m in merges) == 24


def test_literal_rule_without_word_splitting_gives_another_order():
    # With spaces as tokens, ' '+'p' ties 'pe' at 4 and later beats 'pi': the figure's
    # order needs word-internal counting (Bishop §12.2.2, Fig. 12.12).
    merges = learn_merges(PETER, 5, word_internal=False)
    assert [m.token for m in merges] == ["pe", "ck", " p", "ed", "per"]
    # Bishop's rule: never merge when the second token starts with white space
    long = learn_merges(PETER, 40, word_internal=False)
    assert all(not m.right[0].isspace() for m in long)


def test_stopping_and_arguments():
    assert learn_merges(PETER, 0) == []
    assert len(learn_merges("ab ab", 10)) == 1  # only one distinct pair exists
    assert len(learn_merges(PETER, 10, min_count=2)) == 6  # ... pe ck pi ed per pick
    with pytest.raises(ValueError, match="num_merges"):
        learn_merges(PETER, -1)
    assert Merge("pe", "r", 2).token == "per"


def _pair_counts(words):
    c = collections.Counter()
    for w in words:
        c.update(zip(w, w[1:]))
    return c


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="abc", min_size=1, max_size=6), min_size=1, max_size=8))
def test_each_merge_is_a_most_frequent_pair(words):
    text = " ".join(words)
    merges = learn_merges(text, 6)
    for i, m in enumerate(merges):
        # recount independently on the segmentation after the first i merges
        segmented = [apply_merges(w, merges[:i]) for w in words]
        counts = _pair_counts(segmented)
        assert counts[(m.left, m.right)] == m.count == max(counts.values())

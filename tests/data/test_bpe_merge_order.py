"""The merge order that the BPE docstrings state: ``train_bpe`` (Hugging Face's trainer)
against an independent reference of the stated rule, and Fig. 12.12's sentence under
each of the three orders (Bishop's figure, the literal rule, the byte-level trainer)."""

import collections
import json

import numpy as np
import pytest

from seqjax.data.bpe_teaching import learn_merges
from seqjax.data.tokenizers import train_bpe

pytest.importorskip("tokenizers")

PETER = "Peter Piper picked a peck of pickled peppers"
N_SPECIAL = 7


def _merges(tok):
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
            for m in json.loads(tok.tokenizer.to_str())["model"]["merges"]]


def reference_merges(texts, num_merges, min_frequency, pre_tokenize):
    """The docstring's rule: the most frequent pair inside a pre-token; ties to the smaller
    ``(left id, right id)``, bytes by code point (ids 7..262), merged tokens after them."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=ord)  # the 256 byte symbols
    ids = {ch: N_SPECIAL + i for i, ch in enumerate(alphabet)}
    words = collections.Counter(w for t in texts for w in pre_tokenize(t))
    segs = {w: list(w) for w in words}
    merges = []
    while len(merges) < num_merges:
        counts = collections.Counter()
        for w, n in words.items():
            for pair in zip(segs[w], segs[w][1:]):
                counts[pair] += n
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], ids[p[0]], ids[p[1]]))
        if counts[best] < min_frequency:
            break
        merges.append(best)
        ids[best[0] + best[1]] = N_SPECIAL + len(alphabet) + len(merges) - 1
        for w in segs:
            s, out, i = segs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            segs[w] = out
    return merges


def test_fig_12_12_under_the_three_orders():
    assert [m.token for m in learn_merges(PETER, 5)] == ["pe", "ck", "pi", "ed", "per"]
    assert [m.token for m in learn_merges(PETER, 5, word_internal=False)] == [
        "pe", "ck", " p", "ed", "per"]
    tok = train_bpe([PETER], vocab_size=263 + 20, min_frequency=2)
    assert ["".join(m) for m in _merges(tok)] == [
        "pe", "ck", "ed", "ick", "pick", "Ġpe", "Ġpick", "per"]  # stops: no pair left twice
    assert tok.vocab_size == 263 + 8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_train_bpe_follows_the_stated_tie_break(seed):
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list("abcé"), rng.integers(1, 6))) for _ in range(40)]
    texts = [" ".join(words[i:i + 8]) + rng.choice(["", ".", "!"]) for i in range(0, 40, 8)]
    tok = train_bpe(texts, vocab_size=263 + 25, min_frequency=2)
    pre = tok.tokenizer.pre_tokenizer

    def pre_tokenize(text):
        return [w for w, _ in pre.pre_tokenize_str(text)]

    assert _merges(tok) == reference_merges(texts, 25, 2, pre_tokenize)

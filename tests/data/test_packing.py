"""J&M §9.9 packing ``(x, δ, y)`` for a causal LM, and pretrain-then-fine-tune (J&M §9.9.1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.data.packing import pack_pair, pack_pairs
from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.train.losses import masked_cross_entropy
from tests.models.helpers import fit, np_init

PAD, DELIM, EOS = 0, 1, 2


def test_packing_by_hand():
    # (x1..xm, δ, y1..yn) has length m + n + 1 (J&M §9.9)
    assert pack_pair([5, 6, 7], [8, 9], DELIM) == [5, 6, 7, DELIM, 8, 9]
    b = pack_pairs([[5, 6, 7], [4]], [[8, 9], [10, 11, 12]], DELIM, eos_id=EOS, bos_id=3)
    # strings: [3 5 6 7 δ 8 9 eos] (8) and [3 4 δ 10 11 12 eos] (7, one pad)
    assert b["inputs"].tolist() == [[3, 5, 6, 7, 1, 8, 9], [3, 4, 1, 10, 11, 12, 2]]
    assert b["targets"].tolist() == [[5, 6, 7, 1, 8, 9, 2], [4, 1, 10, 11, 12, 2, 0]]
    assert b["lengths"].tolist() == [7, 6] and b["prompt_lengths"].tolist() == [5, 3]
    # J&M: the loss is over the whole string (every real prediction)
    assert b["loss_mask"].astype(int).tolist() == [[1] * 7, [1] * 6 + [0]]
    t = pack_pairs([[5, 6, 7], [4]], [[8, 9], [10, 11, 12]], DELIM, eos_id=EOS, bos_id=3,
                   loss_on="target")
    # target-only: the predictions of y (from δ on) and of eos
    assert t["loss_mask"].astype(int).tolist() == [[0, 0, 0, 0, 1, 1, 1],
                                                   [0, 0, 1, 1, 1, 1, 0]]
    np.testing.assert_array_equal(t["targets"][t["loss_mask"]], [8, 9, 2, 10, 11, 12, 2])
    assert pack_pairs([[5]], [[6]], DELIM, block_size=4)["inputs"].shape == (1, 4)
    with pytest.raises(TypeError, match="`max_len` is renamed `block_size` \\(the inputs' width"):
        pack_pairs([[5]], [[6]], DELIM, max_len=5)


def test_packing_errors_name_the_argument():
    with pytest.raises(ValueError, match="unique marker"):
        pack_pairs([[5, DELIM]], [[6]], DELIM)
    with pytest.raises(ValueError, match="loss_on"):
        pack_pairs([[5]], [[6]], DELIM, loss_on="source")
    with pytest.raises(ValueError, match=r"`block_size` is 2 but pair 0 packs to 5 tokens"):
        pack_pairs([[5, 6, 7]], [[6]], DELIM, block_size=2)
    with pytest.raises(ValueError, match="same length"):
        pack_pairs([[5]], [], DELIM)
    with pytest.raises(ValueError, match="negative"):
        pack_pairs([[5, -1]], [[6]], DELIM)


# ----------------------------------------------------------------------------- training

V, FIRST = 16, 3  # ids 3..15 are "words"
SUCC = np.random.default_rng(0).integers(FIRST, V, (V, 2))  # each word has 2 successors


def markov_text(rng, n, length):
    """Plain text: a Markov chain, two equally likely successors per word (<= ln 2 nats)."""
    out = np.empty((n, length), np.int32)
    out[:, 0] = rng.integers(FIRST, V, n)
    for t in range(1, length):
        out[:, t] = SUCC[out[:, t - 1], rng.integers(0, 2, n)]
    return out


def test_pretrain_then_fine_tune_on_packed_summaries():
    rng = np.random.default_rng(1)
    steps, batch = 120, 16
    model = TransformerLM(TransformerLMConfig(vocab_size=V, num_layers=1, embed_dim=32,
                                              block_size=16, block=gpt_block(2)))

    def lm_loss(p, b):
        logits = model.apply({"params": p}, b["inputs"])
        return masked_cross_entropy(logits, b["targets"], b["loss_mask"])

    # 1. Pretrain on plain text (self-supervised, J&M §9.9.1).
    text = markov_text(rng, steps * batch, 15).reshape(steps, batch, 15)
    plain = {"inputs": text[..., :-1], "targets": text[..., 1:],
             "loss_mask": np.ones(text[..., 1:].shape, bool)}
    v0 = np_init(model, jnp.asarray(text[0, :, :-1]), scale=None)
    pretrained, pre_losses = fit(lm_loss, v0["params"], plain, lr=3e-3)
    pre_level = float(np.mean(pre_losses[-10:]))
    assert pre_level < 0.9  # near the chain's entropy (<= ln 2), far below ln 13 = 2.56

    # 2. Fine-tune on packed (article, δ, summary) strings; the summary is the article's
    #    first 3 words (cf. J&M Fig. 9.23, whose summary is the article's opening).
    arts = markov_text(rng, steps * batch, 10)
    packed = pack_pairs(list(arts), [a[:3] for a in arts], DELIM, eos_id=EOS)  # loss: all
    target_only = pack_pairs(list(arts), [a[:3] for a in arts], DELIM, eos_id=EOS,
                             loss_on="target")["loss_mask"]
    source = packed["loss_mask"] & (np.arange(14)[None] < 9)  # predictions of x_2..x_10
    data = {**{k: packed[k].reshape(steps, batch, -1) for k in ("inputs", "targets")},
            "loss_mask": packed["loss_mask"].reshape(steps, batch, -1),
            "source": source.reshape(steps, batch, -1),
            "summary": target_only.reshape(steps, batch, -1)}

    def ft_loss(p, b):
        logits = model.apply({"params": p}, b["inputs"])
        parts = {k: masked_cross_entropy(logits, b["targets"], b[k])
                 for k in ("source", "summary")}
        return masked_cross_entropy(logits, b["targets"], b["loss_mask"]), parts

    _, (losses, parts) = fit(ft_loss, pretrained, data, lr=3e-3, has_aux=True)
    src0, sum0 = float(parts["source"][0]), float(parts["summary"][0])
    # It starts from the pretrained loss level on the article part ...
    assert abs(src0 - pre_level) < 0.25
    # ... unlike a fresh model, which starts at about ln |V| everywhere.
    _, fresh = ft_loss(v0["params"], jax.tree_util.tree_map(lambda a: a[0], data))
    assert float(fresh["source"]) > 2.0 > src0 + 1.0
    # Training on the packed strings (whole-string loss) teaches the summaries.
    assert float(np.mean(losses[-10:])) < float(losses[0])
    assert float(np.mean(parts["summary"][-10:])) < 0.5 * sum0


def test_pack_pair_needs_a_delimiter():
    assert pack_pair([1], [2], 9) == [1, 9, 2]
    with pytest.raises(TypeError):
        pack_pair([1], [2], None)

"""RNN language model, classifier and tagger (J&M §9.3–9.4)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.decoding import greedy_search, recompute_decoder
from seqjax.models._common import masked_pool, token_cross_entropy
from seqjax.models.rnn import RNNClassifier, RNNLanguageModel, RNNTagger
from seqjax.utils import count_params
from tests.models.helpers import fit, np_cross_entropy

KEY = jax.random.PRNGKey(0)
V = 13


@pytest.fixture(scope="module")
def lm_params():
    lm = RNNLanguageModel(vocab_size=V, embed_dim=8, num_layers=2, cell_type="gru",
                          tie_weights=True)
    return lm, jax.jit(lm.init)(KEY, jnp.zeros((1, 4), jnp.int32))


def test_lm_shapes_carries_and_tied_output(lm_params):
    lm, v = lm_params
    x = jax.random.randint(KEY, (3, 7), 0, V)
    logits, carries = jax.jit(functools.partial(lm.apply, return_carries=True))(
        v, x, jnp.array([7, 3, 0]))
    assert logits.shape == (3, 7, V) and logits.dtype == jnp.float32
    assert len(carries) == 2 and carries[0].shape == (3, 8)
    assert float(jnp.abs(carries[1][2]).max()) == 0.0  # length 0 keeps the zero carry
    # J&M (9.16): y = softmax(E h + b) with the input embedding E.
    h, _ = lm.apply(v, x[:1], method=RNNLanguageModel.hidden_states)
    emb, bias = v["params"]["embed"]["embedding"], v["params"]["output_bias"]
    np.testing.assert_allclose(logits[0], h[0] @ emb.T + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cell", ["lstm", "gru", "elman"])
def test_tying_removes_exactly_v_times_d(cell):
    x = jnp.zeros((1, 3), jnp.int32)
    counts = {}
    for tie in (False, True):
        lm = RNNLanguageModel(vocab_size=29, embed_dim=6, num_layers=2, cell_type=cell,
                              tie_weights=tie)
        counts[tie] = count_params(jax.eval_shape(lm.init, KEY, x)["params"])
    assert counts[False] - counts[True] == 29 * 6


def test_bad_inputs(lm_params):
    lm, v = lm_params
    with pytest.raises(ValueError, match="tokens"):
        lm.apply(v, jnp.array([[1, V]]))
    with pytest.raises(TypeError, match="tokens"):
        lm.apply(v, jnp.ones((1, 2)))
    with pytest.raises(ValueError, match="lengths"):
        lm.apply(v, jnp.ones((1, 2), jnp.int32), jnp.array([3]))
    with pytest.raises(ValueError, match="tie_weights"):
        RNNLanguageModel(vocab_size=5, embed_dim=4, hidden_size=5, tie_weights=True).init(
            KEY, jnp.zeros((1, 2), jnp.int32))
    with pytest.raises(ValueError, match="pooling"):
        jax.eval_shape(RNNClassifier(2, vocab_size=5, pooling="median").init, KEY,
                       jnp.zeros((1, 2), jnp.int32))


def test_teacher_forced_loss_is_sum_of_step_losses_and_steps_match_scan(lm_params):
    """The scanned teacher-forced pass == one ``decode_step`` at a time (J&M Fig. 9.6)."""
    lm, v = lm_params
    x = jax.random.randint(jax.random.PRNGKey(3), (2, 9), 0, V)
    logits = jax.jit(lm.apply)(v, x)
    total = float(token_cross_entropy(logits[:, :-1], x[:, 1:]).sum())
    state = lm.init_decode_state(v, x[:, :1])
    step = jax.jit(lm.decode_step)
    step_total = 0.0
    for t in range(8):
        step_logits, state = step(v, state, x[:, t])
        np.testing.assert_allclose(step_logits, logits[:, t], rtol=1e-5, atol=1e-5)
        step_total += np_cross_entropy(step_logits, x[:, t + 1]).sum()
    np.testing.assert_allclose(total, step_total, rtol=1e-5)


def _rnn_logits(lm, v, tokens):
    return lm.apply(v, tokens)


def test_generation_equals_scanned_forward_with_ragged_prompts(lm_params):
    lm, v = lm_params
    prompts = jax.random.randint(KEY, (3, 5), 0, V)
    lengths = jnp.array([5, 2, 1])
    out = greedy_search(lm, v, prompts, lengths, max_new_tokens=6)
    ref = greedy_search(recompute_decoder(functools.partial(_rnn_logits, lm)), v, prompts,
                        lengths, max_new_tokens=6)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.log_probs, ref.log_probs, rtol=1e-5)
    alone = greedy_search(lm, v, prompts[1:2, :2], max_new_tokens=6)  # a prompt alone
    np.testing.assert_array_equal(alone.tokens[0], out.tokens[1])


@pytest.mark.parametrize("mode", ["last", "mean", "max", "first"])
def test_masked_pool_reference(mode):
    h = np.asarray(jax.random.normal(KEY, (3, 5, 6)))
    lengths = np.array([5, 2, 0])
    ref = {"mean": lambda r: r.mean(0), "max": lambda r: r.max(0), "last": lambda r: r[-1],
           "first": lambda r: r[0]}[mode]
    garbage = h.copy()
    garbage[1, 2:] = 1e3
    out = masked_pool(jnp.asarray(garbage), jnp.asarray(lengths), mode)
    for b in range(2):
        np.testing.assert_allclose(out[b], ref(h[b, :lengths[b]]), rtol=1e-6)
    np.testing.assert_array_equal(out[2], 0.0)  # empty row
    bi = masked_pool(jnp.asarray(h), jnp.asarray(lengths), "last", bidirectional=True)[1]
    np.testing.assert_allclose(bi, np.concatenate([h[1, 1, :3], h[1, 0, 3:]]))  # J&M Fig. 9.12


@pytest.mark.parametrize("pooling,bidirectional", [("last", True), ("max", False)])
def test_classifier_masked_pooling_equals_unpadded(pooling, bidirectional):
    clf = RNNClassifier(num_classes=3, vocab_size=11, embed_dim=6, hidden_size=5,
                        bidirectional=bidirectional, pooling=pooling, cell_type="gru")
    x = jax.random.randint(KEY, (3, 6), 1, 11)
    lengths = jnp.array([6, 3, 1])
    v = jax.jit(clf.init)(KEY, x)
    apply = jax.jit(clf.apply)
    padded = apply(v, x.at[1, 3:].set(7).at[2, 1:].set(9), lengths)
    alone = apply(v, x[1:2, :3])
    np.testing.assert_allclose(padded[1], alone[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(padded[0], apply(v, x, lengths)[0], rtol=1e-6)


def test_tagger_padding_invariance_bidirectional():
    tagger = RNNTagger(num_tags=4, vocab_size=10, embed_dim=6, hidden_size=5)
    x = jax.random.randint(KEY, (2, 6), 0, 10)
    v = jax.jit(tagger.init)(KEY, x)
    out = jax.jit(tagger.apply)(v, x, jnp.array([6, 3]))
    out2 = jax.jit(tagger.apply)(v, x.at[1, 3:].set(0), jnp.array([6, 3]))
    np.testing.assert_allclose(out[1, :3], out2[1, :3], rtol=1e-6)
    assert out.shape == (2, 6, 4)
    assert set(v["params"]["encoder"]["rnn"]["layer_0"]) == {"forward", "backward"}


def test_feature_inputs():
    clf = RNNClassifier(num_classes=2, hidden_size=4)
    shapes = jax.eval_shape(clf.init, KEY, jnp.ones((2, 5, 3)))
    assert "embed" not in shapes["params"]["encoder"]
    assert jax.eval_shape(clf.apply, shapes, jnp.ones((2, 5, 3))).shape == (2, 2)


def test_lm_learns_a_periodic_language():
    """x_{t+1} = (x_t + 3) mod V after a random start: next-token accuracy ~1."""
    lm = RNNLanguageModel(vocab_size=V, embed_dim=16, cell_type="gru", tie_weights=True)
    starts = jax.random.randint(KEY, (120, 16, 1), 0, V)
    data = (starts + 3 * jnp.arange(10)) % V
    v = jax.jit(lm.init)(KEY, data[0])

    def loss(p, x):
        return token_cross_entropy(lm.apply(p, x[:, :-1]), x[:, 1:]).mean()

    v, _ = fit(loss, v, data, lr=3e-2)
    test = (jnp.arange(V)[:, None] + 3 * jnp.arange(9)) % V
    out = greedy_search(lm, v, test[:, :1], max_new_tokens=8)
    np.testing.assert_array_equal(out.tokens, test[:, 1:])


def test_classifier_and_tagger_learn():
    """Classify 'is token 1 present?'; tag each token with its predecessor (needs memory)."""
    n_tok = 6
    x = jax.random.randint(KEY, (101, 16, 8), 2, n_tok)
    flip = jax.random.bernoulli(jax.random.PRNGKey(1), 0.5, (101, 16))
    pos = jax.random.randint(jax.random.PRNGKey(2), (101, 16), 0, 8)
    x = jnp.where(flip[..., None] & (jnp.arange(8) == pos[..., None]), 1, x)
    labels = (x == 1).any(-1).astype(jnp.int32)
    tags = jnp.concatenate([jnp.zeros_like(x[..., :1]), x[..., :-1]], axis=-1)
    clf = RNNClassifier(num_classes=2, vocab_size=n_tok, embed_dim=8, hidden_size=16,
                        cell_type="gru", pooling="max")
    tagger = RNNTagger(num_tags=n_tok, vocab_size=n_tok, embed_dim=8, hidden_size=16,
                       cell_type="gru", bidirectional=False)
    params = (clf.init(KEY, x[0]), tagger.init(KEY, x[0]))

    def loss(p, batch):
        xb, yb, tb = batch
        lc = token_cross_entropy(clf.apply(p[0], xb)[:, None], yb[:, None]).mean()
        lt = token_cross_entropy(tagger.apply(p[1], xb), tb).mean()
        return lc + lt

    (vc, vt), _ = fit(loss, params, (x[:-1], labels[:-1], tags[:-1]), lr=2e-2)
    xt, yt, tt = x[-1], labels[-1], tags[-1]  # held out
    assert float((clf.apply(vc, xt).argmax(-1) == yt).mean()) > 0.95
    assert float((tagger.apply(vt, xt).argmax(-1) == tt).mean()) > 0.98

"""RNN language model, classifier and tagger (J&M §9.3–9.4)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.decoding import greedy_search, recompute_decoder
from seqjax.models._common import masked_pool
from seqjax.models.rnn import (
    RNNClassifier,
    RNNClassifierConfig,
    RNNLanguageModel,
    RNNLMConfig,
    RNNTagger,
    RNNTaggerConfig,
)
from seqjax.train.losses import token_cross_entropy
from seqjax.utils import count_params
from tests.models.helpers import accuracy, fit, np_cross_entropy, np_init

KEY = jax.random.PRNGKey(0)
V = 13


@pytest.fixture(scope="module")
def lm_params():
    lm = RNNLanguageModel(
        RNNLMConfig(vocab_size=V, embed_dim=8, num_layers=2, cell_type="gru", tie_embeddings=True)
    )
    return lm, np_init(lm, jnp.zeros((1, 4), jnp.int32))


def test_lm_shapes_carries_and_tied_output(lm_params):
    lm, v = lm_params
    x = jnp.asarray(np.random.default_rng(1).integers(0, V, (3, 7)), jnp.int32)

    @jax.jit
    def run(v, x, lengths):
        return (
            lm.apply(v, x, lengths, method="with_state"),
            lm.apply(v, x, method=RNNLanguageModel.hidden_states)[0],
        )

    (logits, carries), h = run(v, x, jnp.array([7, 3, 0]))
    assert logits.shape == (3, 7, V) and logits.dtype == jnp.float32
    assert len(carries) == 2 and carries[0].shape == (3, 8)
    assert float(jnp.abs(carries[1][2]).max()) == 0.0  # length 0 keeps the zero carry
    # Tied output: logits = h Eᵀ + b. J&M (9.16) is y = softmax(Eᵀ h) with no bias; the
    # bias b is seqjax's default (output_bias=True, see RNNLanguageModel's docstring).
    emb, bias = v["params"]["embed"]["embedding"], v["params"]["output_bias"]
    np.testing.assert_allclose(logits[0], h[0] @ emb.T + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cell", ["lstm", "gru", "elman"])
def test_tying_removes_exactly_v_times_d(cell):
    x = jnp.zeros((1, 3), jnp.int32)
    counts = {}
    for tie in (False, True):
        lm = RNNLanguageModel(
            RNNLMConfig(vocab_size=29, embed_dim=6, num_layers=2, cell_type=cell,
                        tie_embeddings=tie)
        )
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


@functools.partial(jax.jit, static_argnums=0)
def _tf_and_steps(model, v, tokens):
    logits = model.apply(v, tokens)
    state = model.init_decode_state(v, tokens[:, :1])

    def body(state, tok):
        step_logits, state = model.decode_step(v, state, tok)
        return state, step_logits

    _, steps = jax.lax.scan(body, state, tokens.T)
    return logits, jnp.swapaxes(steps, 0, 1)


def test_teacher_forced_loss_is_sum_of_step_losses_and_steps_match_scan(lm_params):
    """The scanned teacher-forced pass == one ``decode_step`` at a time (J&M Fig. 9.6)."""
    lm, v = lm_params
    x = jnp.asarray(np.random.default_rng(3).integers(0, V, (2, 9)), jnp.int32)
    logits, steps = _tf_and_steps(lm, v, x)
    np.testing.assert_allclose(steps, logits, rtol=1e-5, atol=1e-5)
    total = float(token_cross_entropy(logits[:, :-1], x[:, 1:]).sum())
    np.testing.assert_allclose(total, np_cross_entropy(steps[:, :-1], x[:, 1:]).sum(), rtol=1e-5)


def _rnn_logits(lm, v, tokens):
    return lm.apply(v, tokens)


def test_generation_equals_scanned_forward_with_ragged_prompts(lm_params):
    """Greedy decoding with carries == argmax of the scanned forward pass recomputed each step,
    for a batch of prompts of different lengths."""
    lm, v = lm_params
    prompts = jnp.asarray(np.random.default_rng(4).integers(0, V, (3, 5)), jnp.int32)
    lengths = jnp.array([5, 2, 1])
    out = greedy_search(lm, v, prompts, lengths, max_new_tokens=6)
    ref = greedy_search(
        recompute_decoder(functools.partial(_rnn_logits, lm)), v, prompts, lengths, max_new_tokens=6
    )
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.log_probs, ref.log_probs, rtol=1e-5)
    assert len({tuple(r) for r in np.asarray(out.tokens).tolist()}) > 1


@pytest.mark.parametrize("mode", ["last", "mean", "max", "first"])
def test_masked_pool_reference(mode):
    h = np.asarray(jax.random.normal(KEY, (3, 5, 6)))
    lengths = np.array([5, 2, 0])
    ref = {
        "mean": lambda r: r.mean(0),
        "max": lambda r: r.max(0),
        "last": lambda r: r[-1],
        "first": lambda r: r[0],
    }[mode]
    garbage = h.copy()
    garbage[1, 2:] = 1e3
    out = masked_pool(jnp.asarray(garbage), jnp.asarray(lengths), mode)
    for b in range(2):
        np.testing.assert_allclose(out[b], ref(h[b, : lengths[b]]), rtol=1e-6)
    np.testing.assert_array_equal(out[2], 0.0)  # empty row
    bi = masked_pool(jnp.asarray(h), jnp.asarray(lengths), "last", bidirectional=True)[1]
    np.testing.assert_allclose(bi, np.concatenate([h[1, 1, :3], h[1, 0, 3:]]))  # J&M Fig. 9.12


def test_classifier_masked_pooling_equals_unpadded():
    """A padded row classifies exactly as the row alone (bidirectional, last pooling)."""
    clf = RNNClassifier(
        RNNClassifierConfig(
            num_classes=3,
            vocab_size=11,
            embed_dim=6,
            hidden_size=5,
            bidirectional=True,
            pooling="last",
            cell_type="gru",
        )
    )
    x = jnp.asarray(np.random.default_rng(5).integers(1, 11, (3, 6)), jnp.int32)
    v = np_init(clf, x)

    @jax.jit
    def run(v, x, lengths):
        return clf.apply(v, x, lengths), clf.apply(v, x[1:2, :3])

    padded, alone = run(v, x.at[1, 3:].set(7).at[2, 1:].set(9), jnp.array([6, 3, 1]))
    np.testing.assert_allclose(padded[1], alone[0], rtol=1e-5, atol=1e-6)
    tagger = RNNTagger(
        RNNTaggerConfig(num_tags=4, vocab_size=10, embed_dim=6, hidden_size=5, bidirectional=True)
    )
    shapes = jax.eval_shape(tagger.init, KEY, x)
    assert set(shapes["params"]["encoder"]["rnn"]["layer_0"]) == {"forward", "backward"}
    assert jax.eval_shape(tagger.apply, shapes, x).shape == (3, 6, 4)


def test_feature_inputs():
    clf = RNNClassifier(RNNClassifierConfig(num_classes=2, hidden_size=4))
    shapes = jax.eval_shape(clf.init, KEY, jnp.ones((2, 5, 3)))
    assert "embed" not in shapes["params"]["encoder"]
    assert jax.eval_shape(clf.apply, shapes, jnp.ones((2, 5, 3))).shape == (2, 2)


def test_lm_learns_a_periodic_language():
    """x_{t+1} = (x_t + 3) mod V after a random start: next-token accuracy ~1 on fresh data."""
    lm = RNNLanguageModel(
        RNNLMConfig(vocab_size=V, embed_dim=16, cell_type="gru", tie_embeddings=True)
    )
    starts = np.random.default_rng(6).integers(0, V, (120, 16, 1))
    data = jnp.asarray((starts + 3 * np.arange(10)) % V, jnp.int32)
    v = np_init(lm, data[0], scale=None)

    def loss(p, x):
        logits = lm.apply(p, x[:, :-1])
        return token_cross_entropy(logits, x[:, 1:]).mean(), accuracy(logits, x[:, 1:])

    _, (_, acc) = fit(loss, v, data, lr=3e-2, has_aux=True)
    assert float(acc[-10:].mean()) > 0.98  # on batches before training on them


def test_classifier_and_tagger_learn():
    """Classify 'is token 1 present?'; tag each token with its predecessor (needs memory)."""
    n_tok, rng = 6, np.random.default_rng(7)
    x = rng.integers(2, n_tok, (120, 16, 8))
    has_one = rng.random((120, 16)) < 0.5
    x[has_one, rng.integers(0, 8, has_one.sum())] = 1
    labels = jnp.asarray(has_one, jnp.int32)
    tags = jnp.asarray(np.concatenate([np.zeros_like(x[..., :1]), x[..., :-1]], -1), jnp.int32)
    x = jnp.asarray(x, jnp.int32)
    clf = RNNClassifier(
        RNNClassifierConfig(
            num_classes=2, vocab_size=n_tok, embed_dim=8, hidden_size=16, cell_type="gru",
            pooling="max",
        )
    )
    tagger = RNNTagger(
        RNNTaggerConfig(
            num_tags=n_tok,
            vocab_size=n_tok,
            embed_dim=8,
            hidden_size=16,
            cell_type="gru",
            bidirectional=False,
        )
    )
    params = (np_init(clf, x[0], scale=None), np_init(tagger, x[0], scale=None))

    def loss(p, batch):
        xb, yb, tb = batch
        lc, lt = clf.apply(p[0], xb), tagger.apply(p[1], xb)
        total = (
            token_cross_entropy(lc[:, None], yb[:, None]).mean()
            + token_cross_entropy(lt, tb).mean()
        )
        return total, (accuracy(lc, yb), accuracy(lt, tb))

    _, (_, (acc_c, acc_t)) = fit(loss, params, (x, labels, tags), lr=2e-2, has_aux=True)
    assert float(acc_c[-10:].mean()) > 0.95
    assert float(acc_t[-10:].mean()) > 0.98


def test_lm_carry_protocol_and_removed_names(lm_params):
    """initial_carry in, (logits, carry) out of with_state (the call: the logits alone);
    the removed names are errors, the retired ``return_carry`` one naming ``with_state``."""
    lm, v = lm_params
    x = jnp.asarray(np.random.default_rng(2).integers(0, V, (2, 6)), jnp.int32)
    full, carry_full = lm.apply(v, x, method="with_state")
    np.testing.assert_array_equal(lm.apply(v, x), full)
    first, carry = lm.apply(v, x[:, :4], initial_carry=lm.zero_carry(2), method="with_state")
    rest, carry = lm.apply(v, x[:, 4:], initial_carry=carry, method="with_state")
    with pytest.raises(TypeError, match="RNNLanguageModel.with_state"):
        lm.apply(v, x, return_carry=True)
    np.testing.assert_allclose(jnp.concatenate([first, rest], 1), full, atol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(carry), jax.tree_util.tree_leaves(carry_full)):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for removed in ("initial_carries", "return_carries"):  # gone: an error, not a warning
        with pytest.raises(TypeError, match=removed):
            lm.apply(v, x[:, 4:], **{removed: carry})

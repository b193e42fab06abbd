"""Losses and metrics vs numpy: MEDL (7.4)–(7.5), J&M (9.1)–(9.2), (9.12)–(9.13), word2vec NS."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seqjax.models.word2vec import cbow_ns_loss, skipgram_ns_loss
from seqjax.train.losses import (
    bits_per_char,
    make_lm_eval,
    make_lm_loss,
    masked_cross_entropy,
    nll_to_perplexity,
    perplexity,
    token_accuracy,
    token_cross_entropy,
)


def np_log_softmax(z):
    z = np.asarray(z, np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def np_cross_entropy(z, y, mask=None, eps=0.0):
    """C = Σ_t m_t (-Σ_k q_k log ŷ_k) / Σ_t m_t, q = (1-ε) e_y + ε/V (J&M (9.12))."""
    logp = np_log_softmax(z)
    v = z.shape[-1]
    q = (1 - eps) * np.eye(v)[np.where(mask, y, 0) if mask is not None else y] + eps / v
    per = -(q * logp).sum(-1)
    m = np.ones(y.shape, bool) if mask is None else mask
    return (per * m).sum() / max(m.sum(), 1), per


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(3, 5, 7)).astype(np.float32) * 3
    y = rng.integers(0, 7, size=(3, 5))
    mask = np.arange(5)[None, :] < np.array([5, 2, 0])[:, None]
    return z, y, mask


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_masked_cross_entropy_matches_numpy(batch, eps):
    z, y, mask = batch
    want, per = np_cross_entropy(z, y, mask, eps)
    got = masked_cross_entropy(z, y, mask, label_smoothing=eps)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    got_per = token_cross_entropy(z, y, label_smoothing=eps, mask=mask)
    np.testing.assert_allclose(np.asarray(got_per), np.where(mask, per, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        float(masked_cross_entropy(z, y, mask, label_smoothing=eps, reduction="sum")),
        (np.where(mask, per, 0)).sum(), rtol=1e-5,
    )


def test_unmasked_is_time_average_and_matches_optax(batch):
    z, y, _ = batch
    # MEDL (7.5): C = (1/T) Σ_t C^<t>, with C^<t> = -log ŷ_{y_t} (J&M (9.13)).
    per = -np.take_along_axis(np_log_softmax(z), y[..., None], -1)[..., 0]
    np.testing.assert_allclose(float(masked_cross_entropy(z, y)), per.mean(), rtol=1e-5)
    ref = optax.softmax_cross_entropy_with_integer_labels(z, y).mean()
    np.testing.assert_allclose(float(masked_cross_entropy(z, y)), float(ref), rtol=1e-6)
    smooth = optax.smooth_labels(jax.nn.one_hot(y, 7), 0.2)
    np.testing.assert_allclose(
        float(masked_cross_entropy(z, y, label_smoothing=0.2)),
        float(optax.softmax_cross_entropy(z, smooth).mean()), rtol=1e-5,
    )


def test_padding_labels_ignored_and_all_masked_is_zero(batch):
    z, y, mask = batch
    y_pad = np.where(mask, y, -100)  # HF-style ignore index where masked
    np.testing.assert_allclose(
        float(masked_cross_entropy(z, y_pad, mask)), float(masked_cross_entropy(z, y, mask))
    )
    none = np.zeros_like(mask)
    loss, grad = jax.value_and_grad(lambda z: masked_cross_entropy(z, y_pad, none))(jnp.asarray(z))
    assert float(loss) == 0.0 and np.all(np.isfinite(grad)) and not np.any(grad)


def test_bf16_logits_computed_in_float32(batch):
    z, y, mask = batch
    got = masked_cross_entropy(jnp.asarray(z, jnp.bfloat16), y, mask)
    assert got.dtype == jnp.float32
    want = masked_cross_entropy(jnp.asarray(z, jnp.bfloat16).astype(jnp.float32), y, mask)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)


def _autodiff_cross_entropy(z, y, mask, eps):
    """The loss as plain autodiff sees it (float32 log-softmax), the gradient's reference."""
    z = jnp.asarray(z, jnp.float32)
    log_z = jax.nn.logsumexp(z, axis=-1)
    per = log_z - jnp.take_along_axis(z, jnp.where(mask, y, 0)[..., None], axis=-1)[..., 0]
    per = (1 - eps) * per + eps * (log_z - jnp.mean(z, axis=-1))
    per = jnp.where(mask, per, 0.0)
    return jnp.sum(per) / jnp.maximum(jnp.sum(mask), 1)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_hand_written_gradient_equals_autodiff_in_float32(batch, eps):
    z, y, mask = batch
    loss, grad = jax.value_and_grad(
        lambda z_: masked_cross_entropy(z_, y, mask, label_smoothing=eps))(jnp.asarray(z))
    want_loss, want_grad = jax.value_and_grad(
        lambda z_: _autodiff_cross_entropy(z_, y, mask, eps))(jnp.asarray(z))
    assert abs(float(loss) - float(want_loss)) <= 1e-6
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), atol=1e-6, rtol=0)
    # And against the float64 numpy gradient ŷ - q (J&M (9.12)), masked and averaged.
    v = z.shape[-1]
    q = (1 - eps) * np.eye(v)[np.where(mask, y, 0)] + eps / v
    want = (np.exp(np_log_softmax(z)) - q) * mask[..., None] / max(mask.sum(), 1)
    np.testing.assert_allclose(np.asarray(grad), want, atol=1e-6)


def test_bf16_logits_keep_no_float32_copy_for_the_backward(batch):
    """Mixed precision: the residuals the backward pass keeps hold no float32 [..., V] array
    (plain autodiff of the float32 log-softmax keeps one), and the gradient is bfloat16."""
    z, y, mask = batch
    zb = jnp.asarray(z, jnp.bfloat16)
    loss, vjp = jax.vjp(lambda z_: masked_cross_entropy(z_, y, mask), zb)
    big = [r for r in jax.tree_util.tree_leaves(vjp)
           if hasattr(r, "dtype") and r.dtype == jnp.float32 and r.shape[-1:] == z.shape[-1:]]
    assert not big, [(r.shape, r.dtype) for r in big]
    _, plain_vjp = jax.vjp(lambda z_: _autodiff_cross_entropy(z_, y, mask, 0.0), zb)
    assert any(getattr(r, "dtype", None) == jnp.float32 and r.shape[-1:] == z.shape[-1:]
               for r in jax.tree_util.tree_leaves(plain_vjp))  # the check can fail
    (grad,) = vjp(jnp.ones_like(loss))
    assert grad.dtype == jnp.bfloat16
    want = jax.grad(lambda z_: _autodiff_cross_entropy(z_, y, mask, 0.0))(zb.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(grad, np.float32), np.asarray(want), atol=2e-3)


def test_traced_labels_outside_the_vocabulary_give_nan_or_a_checked_error(batch):
    """Under jit a label id cannot be range-checked on the host: an invalid one makes the
    loss NaN (never the loss of a neighbouring id); seqjax.checked names it; masked-out
    padding labels (-100) stay allowed."""
    import seqjax

    z, y, mask = batch
    bad = y.copy()
    bad[0, 0] = z.shape[-1]  # kept by the mask: row 0 keeps all 5 positions
    loss = jax.jit(masked_cross_entropy)
    assert np.isnan(float(loss(z, bad, mask)))
    assert np.isfinite(float(loss(z, np.where(mask, y, -100), mask)))
    with pytest.raises(Exception, match="`labels` must hold token ids in"):
        seqjax.checked(loss)(z, bad, mask)
    grad = jax.jit(jax.grad(masked_cross_entropy))(jnp.asarray(z), y, mask)
    assert np.all(np.isfinite(np.asarray(grad)))


def test_input_errors(batch):
    z, y, mask = batch
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 6\]"):
        masked_cross_entropy(z, np.full_like(y, 7))
    with pytest.raises(ValueError, match="logits.shape"):
        masked_cross_entropy(z, y[:, :4])
    with pytest.raises(TypeError, match="integer"):
        masked_cross_entropy(z, y.astype(np.float32))
    with pytest.raises(TypeError, match="boolean"):
        masked_cross_entropy(z, y, mask.astype(np.int32))
    with pytest.raises(ValueError, match="label_smoothing"):
        masked_cross_entropy(z, y, label_smoothing=1.0)
    with pytest.raises(ValueError, match="reduction"):
        masked_cross_entropy(z, y, reduction="avg")


def test_token_accuracy(batch):
    z, y, mask = batch
    hits = (z.argmax(-1) == y) & mask
    np.testing.assert_allclose(float(token_accuracy(z, y, mask)), hits.sum() / mask.sum())
    np.testing.assert_allclose(float(token_accuracy(z, y)), (z.argmax(-1) == y).mean())


def test_perplexity_log_space_equals_product_form(batch):
    z, y, mask = batch
    # J&M (9.2): PP = (Π_i 1/P(w_i | w_<i))^(1/n), in float64 numpy on the kept positions.
    p = np.exp(np_log_softmax(z))
    probs = np.take_along_axis(p, y[..., None], -1)[..., 0][mask]
    product_form = np.prod(1.0 / probs) ** (1.0 / probs.size)
    np.testing.assert_allclose(float(perplexity(z, y, mask)), product_form, rtol=1e-5)
    # A uniform model over |V| words has perplexity |V| (J&M §9.1).
    uniform = perplexity(jnp.zeros((2, 4, 11)), jnp.zeros((2, 4), jnp.int32))
    assert float(uniform) == pytest.approx(11)
    # Log space never underflows where the product of probabilities would.
    assert float(nll_to_perplexity(50.0)) == pytest.approx(math.exp(50.0), rel=1e-5)


def test_bits_per_char():
    assert float(bits_per_char(math.log(2.0))) == pytest.approx(1.0)
    assert float(bits_per_char(math.log(16.0), chars_per_token=4.0)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="chars_per_token"):
        bits_per_char(1.0, 0.0)


def test_lm_loss_and_eval(batch):
    z, y, mask = batch
    apply = lambda p, x, rng, train: p * jnp.asarray(z)
    b = {"inputs": y, "targets": y, "mask": mask}
    loss, m = make_lm_loss(apply, label_smoothing=0.1)(jnp.float32(1.0), b, jax.random.PRNGKey(0))
    np.testing.assert_allclose(float(loss), np_cross_entropy(z, y, mask, 0.1)[0], rtol=1e-5)
    np.testing.assert_allclose(float(m["nll"]), np_cross_entropy(z, y, mask)[0], rtol=1e-5)
    assert float(m["tokens"]) == mask.sum()
    ev = make_lm_eval(apply)(jnp.float32(1.0), b)
    np.testing.assert_allclose(float(ev["loss"]), np_cross_entropy(z, y, mask)[0], rtol=1e-5)


def _np_log_sigmoid(x):
    return -np.log1p(np.exp(-x))


def test_negative_sampling_losses_against_numpy():
    rng = np.random.default_rng(0)
    v, d, b, k = 11, 6, 5, 3
    inp, out = rng.normal(size=(v, d)), rng.normal(size=(v, d))
    centers, contexts = rng.integers(0, v, b), rng.integers(0, v, b)
    negatives = rng.integers(0, v, (b, k))
    ref = np.mean([
        -_np_log_sigmoid(out[contexts[i]] @ inp[centers[i]])
        - sum(_np_log_sigmoid(-out[n] @ inp[centers[i]]) for n in negatives[i])
        for i in range(b)])
    got = skipgram_ns_loss(jnp.asarray(inp), jnp.asarray(out), centers, contexts, negatives)
    np.testing.assert_allclose(float(got), ref, rtol=1e-5)

    ctx = rng.integers(0, v, (b, 4))
    mask = rng.random((b, 4)) < 0.7
    mask[:, 0] = True
    ref_c = np.mean([
        -_np_log_sigmoid(out[centers[i]] @ inp[ctx[i][mask[i]]].mean(0))
        - sum(_np_log_sigmoid(-out[n] @ inp[ctx[i][mask[i]]].mean(0)) for n in negatives[i])
        for i in range(b)])
    got_c = cbow_ns_loss(jnp.asarray(inp), jnp.asarray(out), ctx, mask, centers, negatives)
    np.testing.assert_allclose(float(got_c), ref_c, rtol=1e-5)


def test_token_cross_entropy_is_one_function():
    """One token cross-entropy (seqjax.models used to hold a second one); the mask is the
    third positional argument, as in masked_cross_entropy/token_accuracy."""
    import seqjax.models

    assert not hasattr(seqjax.models, "token_cross_entropy")
    z = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 5)), jnp.float32)
    y = jnp.array([[0, 4, 2], [1, 1, 3]])
    mask = jnp.array([[True, True, False], [True, False, False]])
    np.testing.assert_array_equal(token_cross_entropy(z, y, mask),
                                  token_cross_entropy(z, y, mask=mask))
    _, per = np_cross_entropy(np.asarray(z), np.asarray(y), np.asarray(mask))
    np.testing.assert_allclose(token_cross_entropy(z, y, mask), per * np.asarray(mask),
                               rtol=1e-5, atol=1e-6)

"""Targets outside ``[0, V)`` never read another class, in every loss.

One rule for every id: under ``jax.jit`` a kept target outside the vocabulary (-1 and -100
included: ids never wrap around to the last class) makes its position's loss NaN, and so
the mean loss; the same ids under a False mask never matter (the masked loss exactly); on
the host (concrete labels, ``make_batch_check``) it is a ``ValueError`` naming the argument,
the range and the values; accuracy never counts it as right.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import seqjax
from seqjax.experiments._seq2seq import _metrics as seq2seq_metrics
from seqjax.train.losses import (
    make_lm_eval,
    make_lm_loss,
    masked_cross_entropy,
    token_accuracy,
    token_cross_entropy,
)
from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer
from seqjax.train.step import make_batch_check, make_train_step
from seqjax.train.tbptt import make_tbptt_loss

V, B, T = 7, 3, 5
BAD_IDS = [-1, -100, V]


def _lm_apply(params, x, rng, train):  # logits = a row of `params` per input id
    return params[x]


def _losses():
    """``name -> (loss(logits, targets, mask) -> scalar, logits shape)``: each loss the
    library and its recipes train with, under ``jax.jit``."""

    def lm(logits, y, m):  # make_lm_loss of a "model" that returns the given logits
        batch = {"inputs": jnp.zeros(y.shape, jnp.int32), "targets": y, "mask": m}
        return make_lm_loss(lambda p, x, r, t: logits)(None, batch, jax.random.PRNGKey(0))[0]

    def lm_smoothed(logits, y, m):
        batch = {"inputs": jnp.zeros(y.shape, jnp.int32), "targets": y, "mask": m}
        loss_fn = make_lm_loss(lambda p, x, r, t: logits, label_smoothing=0.1)
        return loss_fn(None, batch, jax.random.PRNGKey(0))[0]

    def lm_eval(logits, y, m):
        batch = {"inputs": jnp.zeros(y.shape, jnp.int32), "targets": y, "mask": m}
        return make_lm_eval(lambda p, x, r, t: logits)(None, batch)["loss"]

    def tbptt(logits, y, m):
        batch = {"inputs": jnp.zeros(y.shape, jnp.int32), "targets": y, "mask": m}
        loss_fn = make_tbptt_loss(lambda p, x, r, t, c: (logits, c))
        return loss_fn(None, batch, jax.random.PRNGKey(0), jnp.zeros(()))[0]

    def seq2seq(logits, y, m):  # the encoder–decoder recipes' loss
        return seq2seq_metrics(logits, {"tgt_out": y, "tgt_mask": m})[0]

    def masked(logits, y, m):  # classifier (logits [B, C]), tagger and MLM ([B, T, V])
        return masked_cross_entropy(logits, y, m)

    def summed(logits, y, m):
        return masked_cross_entropy(logits, y, m, reduction="sum")

    def per_position(logits, y, m):  # HellaSwag's per-token scores
        return jnp.sum(token_cross_entropy(logits, y, m))

    return {
        "lm": (lm, (B, T, V)),
        "lm_smoothed": (lm_smoothed, (B, T, V)),
        "lm_eval": (lm_eval, (B, T, V)),
        "tbptt": (tbptt, (B, T, V)),
        "seq2seq": (seq2seq, (B, T, V)),
        "classifier": (masked, (B, V)),
        "tagger": (masked, (B, T, V)),
        "mlm": (masked, (B, T, V)),
        "sum": (summed, (B, T, V)),
        "token": (per_position, (B, T, V)),
    }


LOSSES = _losses()


def _data(shape):
    rng = np.random.default_rng(0)
    z = (3 * rng.normal(size=shape)).astype(np.float32)
    y = rng.integers(0, V, size=shape[:-1]).astype(np.int32)
    mask = np.ones(shape[:-1], bool)
    mask.reshape(-1)[1::2] = False  # every other position padded
    return z, y, mask


def _kept(mask):
    return np.unravel_index(int(np.flatnonzero(mask)[0]), mask.shape)


def _padded(mask):
    return np.unravel_index(int(np.flatnonzero(~mask)[0]), mask.shape)


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("name", list(LOSSES))
def test_a_kept_target_outside_the_vocabulary_is_nan_under_jit(name, bad):
    loss, shape = LOSSES[name]
    z, y, mask = _data(shape)
    f = jax.jit(loss)
    assert np.isfinite(float(f(z, y, mask)))
    y_bad = y.copy()
    y_bad[_kept(mask)] = bad
    assert np.isnan(float(f(z, y_bad, mask))), (name, bad)
    # Without a mask every position counts.
    assert np.isnan(float(f(z, y_bad, np.ones_like(mask)))), (name, bad)


@pytest.mark.parametrize("name", list(LOSSES))
def test_any_id_under_a_false_mask_gives_the_masked_loss_exactly(name):
    loss, shape = LOSSES[name]
    z, y, mask = _data(shape)
    f = jax.jit(loss)
    g = jax.jit(jax.grad(loss))
    want, want_grad = float(f(z, y, mask)), np.asarray(g(jnp.asarray(z), y, mask))
    for pad in BAD_IDS:
        y_pad = np.where(mask, y, pad).astype(np.int32)
        assert float(f(z, y_pad, mask)) == want, (name, pad)
        np.testing.assert_array_equal(np.asarray(g(jnp.asarray(z), y_pad, mask)), want_grad)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_the_per_position_loss_is_nan_only_where_the_target_is_bad(bad):
    z, y, mask = _data((B, T, V))
    y_bad = y.copy()
    y_bad[_kept(mask)] = bad
    y_bad[_padded(mask)] = bad
    per = np.asarray(jax.jit(token_cross_entropy)(z, y_bad, mask))
    want = np.asarray(jax.jit(token_cross_entropy)(z, y, mask))
    nan = np.isnan(per)
    assert nan[_kept(mask)] and nan.sum() == 1
    np.testing.assert_array_equal(per[~nan], want[~nan])


@pytest.mark.parametrize("bad", [-1, -100])
def test_a_negative_target_never_reads_the_last_class(bad):
    """The regression: -1 used to read the last logit, a loss equal to the last class's."""
    z, y, _ = _data((B, T, V))
    y_bad, y_last = y.copy(), y.copy()
    y_bad[0, 0], y_last[0, 0] = bad, V - 1
    f = jax.jit(masked_cross_entropy)
    assert np.isnan(float(f(z, y_bad))) and np.isfinite(float(f(z, y_last)))
    ref = optax.softmax_cross_entropy_with_integer_labels(z, y_last).mean()
    np.testing.assert_allclose(float(f(z, y_last)), float(ref), rtol=1e-6)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_accuracy_never_counts_a_bad_target_as_right(bad):
    z = np.zeros((1, 2, V), np.float32)
    z[..., V - 1] = 5.0  # argmax: the last class everywhere
    z[0, 1, 0] = 9.0  # position 1 predicts class 0
    y = np.array([[bad, 0]], np.int32)  # position 0: bad, position 1: right
    acc = float(jax.jit(token_accuracy)(z, y, np.ones((1, 2), bool)))
    assert acc == 0.5


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_jitted_train_step_reports_nan_for_a_bad_target(bad):
    """The issue's setting: ``make_lm_loss`` inside ``make_train_step``."""
    params = jnp.asarray(np.random.default_rng(1).normal(size=(V, V)), jnp.float32)
    tx, schedule = make_optimizer(OptimizerConfig(name="sgd", learning_rate=0.1))
    state = TrainState.create(params, tx, jax.random.PRNGKey(0))
    step = make_train_step(make_lm_loss(_lm_apply), schedule=schedule, donate=False)
    x = np.arange(B * T, dtype=np.int32).reshape(B, T) % V
    y = (x + 1) % V
    mask = np.ones((B, T), bool)
    _, m = step(state, {"inputs": x, "targets": y, "mask": mask})
    assert np.isfinite(float(m["loss"]))
    # No check staged outside `checked`: an effect would cost the step jit's fast path.
    assert not jax.make_jaxpr(step)(state, {"inputs": x, "targets": y, "mask": mask}).effects
    y_bad = y.copy()
    y_bad[1, 2] = bad
    _, m = step(state, {"inputs": x, "targets": y_bad, "mask": mask})
    assert np.isnan(float(m["loss"]))
    mask[1, 2] = False  # the same id as padding: fine
    _, m = step(state, {"inputs": x, "targets": y_bad, "mask": mask})
    assert np.isfinite(float(m["loss"]))


@pytest.mark.parametrize("bad", BAD_IDS)
def test_checked_names_a_bad_target(bad):
    z, y, mask = _data((B, T, V))
    y_bad = y.copy()
    y_bad[_kept(mask)] = bad
    with pytest.raises(Exception, match=r"`labels` must hold token ids in \[0, 6\]"):
        seqjax.checked(jax.jit(masked_cross_entropy))(z, y_bad, mask)
    seqjax.checked(jax.jit(masked_cross_entropy))(z, np.where(mask, y, bad), mask)  # fine


@pytest.mark.parametrize("fn", [masked_cross_entropy, token_cross_entropy, token_accuracy])
def test_the_host_check_names_the_argument_the_range_and_the_values(fn):
    z, y, mask = _data((B, T, V))
    y_bad = y.copy()
    kept = np.flatnonzero(mask.reshape(-1))
    y_bad.reshape(-1)[kept[:3]] = BAD_IDS
    with pytest.raises(ValueError, match=r"`labels` must lie in \[0, 6\].*outside it: -100, -1, 7"):
        fn(z, y_bad, mask)
    with pytest.raises(ValueError, match=r"outside it: -100, -1, 7"):
        fn(z, y_bad)
    fn(z, np.where(mask, y, -100), mask)  # padding under a False mask: fine
    fn(z, np.where(mask, y, -1), mask)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_make_batch_check_refuses_a_bad_target_on_the_host(bad):
    check = make_batch_check(V)
    x = np.zeros((B, T), np.int32)
    y = np.ones((B, T), np.int32)
    mask = np.ones((B, T), bool)
    y[0, 1] = bad
    with pytest.raises(ValueError, match=rf'`batch\["targets"\]` must hold token ids in \[0, 6\]'
                                         rf".*\(e\.g\. {bad}\)"):
        check({"inputs": x, "targets": y, "mask": mask})
    mask[0, 1] = False
    check({"inputs": x, "targets": y, "mask": mask})  # padding: fine

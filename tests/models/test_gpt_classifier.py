"""TransformerLMClassifier: the decoder-form classifier of J&M §9.4.2 / §9.9.1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.models import TransformerLM, TransformerLMClassifier, TransformerLMConfig, gpt_block

V, C, T = 19, 3, 7
KEY = jax.random.PRNGKey(0)


def _cfg(dropout_rate=0.0, **kw):
    return TransformerLMConfig(
        vocab_size=V, num_layers=2, embed_dim=16, block_size=T,
        block=gpt_block(2, dropout_rate=dropout_rate), **kw
    )


@pytest.fixture(scope="module")
def tied():
    clf = TransformerLMClassifier(_cfg(), num_classes=C)
    return clf, clf.init(KEY, jnp.zeros((1, T), jnp.int32))


def test_shapes_and_tree_are_the_lms_plus_a_class_head(tied):
    clf, v = tied
    x = jnp.ones((4, T), jnp.int32)
    out = clf.apply(v, x, jnp.array([7, 1, 3, 5]))
    assert out.shape == (4, C) and out.dtype == jnp.float32
    assert v["params"]["class_head"]["kernel"].shape == (16, C)
    assert v["params"]["class_head"]["bias"].shape == (C,)
    for tie in (True, False):
        cfg = _cfg(tie_embeddings=tie)
        lm_tree = jax.eval_shape(TransformerLM(cfg).init, KEY, x)["params"]
        clf_tree = jax.eval_shape(TransformerLMClassifier(cfg, num_classes=C).init, KEY, x)
        clf_tree = dict(clf_tree["params"])
        assert clf_tree.pop("class_head") is not None
        assert jax.tree_util.tree_structure(clf_tree) == jax.tree_util.tree_structure(lm_tree)
        assert ("lm_head" in clf_tree) == (not tie)


def test_last_real_token_under_padding_matches_numpy(tied):
    """class_logits[b] = H_b[n_b - 1] W_c + b_c, H_b from the row alone; padding (here
    random ids) changes nothing, and ``mask`` gives the same as ``lengths``."""
    clf, v = tied
    rng = np.random.default_rng(0)
    x = rng.integers(0, V, (4, T)).astype(np.int32)
    lengths = np.array([7, 1, 4, 2], np.int32)
    out = np.asarray(clf.apply(v, jnp.asarray(x), jnp.asarray(lengths)))
    w = np.asarray(v["params"]["class_head"]["kernel"])
    b = np.asarray(v["params"]["class_head"]["bias"])
    for r in range(4):
        n = lengths[r]
        h, _ = clf.apply(
            v, jnp.asarray(x[r : r + 1, :n]), None, True, method=TransformerLMClassifier._trunk
        )
        np.testing.assert_allclose(out[r], np.asarray(h)[0, n - 1] @ w + b, rtol=1e-5, atol=1e-6)
    mask = np.arange(T)[None] < lengths[:, None]
    np.testing.assert_allclose(
        clf.apply(v, jnp.asarray(x), mask=jnp.asarray(mask)), out, rtol=1e-6, atol=1e-6
    )
    # Without lengths every row is T long: the last position.
    h, _ = clf.apply(v, jnp.asarray(x), None, True, method=TransformerLMClassifier._trunk)
    np.testing.assert_allclose(
        clf.apply(v, jnp.asarray(x)), np.asarray(h)[:, -1] @ w + b, rtol=1e-5, atol=1e-6
    )
    # Traced lengths (under jit) pick the same tokens.
    jitted = jax.jit(lambda v, x, n: clf.apply(v, x, n))(v, jnp.asarray(x), jnp.asarray(lengths))
    np.testing.assert_allclose(jitted, out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tie", [True, False])
def test_lm_parameters_drop_in_and_the_lm_head_is_the_lms(tie):
    """Pre-train as an LM, fine-tune as a classifier: the LM's params load unchanged and
    ``lm_logits`` is the LM's forward pass."""
    cfg = _cfg(tie_embeddings=tie)
    x = jnp.asarray(np.random.default_rng(1).integers(0, V, (3, T)), jnp.int32)
    lengths = jnp.array([7, 2, 5])
    lm = TransformerLM(cfg)
    lm_params = lm.init(jax.random.PRNGKey(5), x)["params"]
    clf = TransformerLMClassifier(cfg, num_classes=C)
    params = {**clf.init(KEY, x)["params"], **lm_params}
    np.testing.assert_allclose(
        clf.apply({"params": params}, x, lengths, method=TransformerLMClassifier.lm_logits),
        lm.apply({"params": lm_params}, x, lengths),
        rtol=1e-6,
        atol=1e-6,
    )
    # The trunk is the LM's: the classifier's features are the LM's hidden states.
    h, _ = clf.apply({"params": params}, x, lengths, True, method=TransformerLMClassifier._trunk)
    h_lm, _ = lm.apply({"params": lm_params}, x, lengths, True, method=TransformerLM._trunk)
    np.testing.assert_allclose(h, h_lm, rtol=1e-6, atol=1e-6)


def test_dropout_on_the_pooled_state_only_when_training():
    cfg = _cfg(dropout_rate=0.5)
    clf = TransformerLMClassifier(cfg, num_classes=C)
    x = jnp.ones((2, T), jnp.int32)
    v = clf.init(KEY, x)
    a = clf.apply(v, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
    b = clf.apply(v, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(2)})
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(clf.apply(v, x), clf.apply(v, x))


def test_bad_inputs(tied):
    clf, v = tied
    x = jnp.ones((2, T), jnp.int32)
    with pytest.raises(ValueError, match=r"`lengths` must lie in \[1, 7\]"):
        clf.apply(v, x, jnp.array([3, 0]))
    with pytest.raises(ValueError, match="not both"):
        clf.apply(v, x, jnp.array([3, 2]), mask=jnp.ones((2, T), bool))
    with pytest.raises(ValueError, match="right padding"):
        clf.apply(v, x, mask=jnp.asarray(np.array([[1, 0, 1, 0, 0, 0, 0]] * 2, bool)))
    with pytest.raises(ValueError, match=r"`mask` must have the shape of `tokens` \(2, 7\)"):
        clf.apply(v, x, mask=jnp.ones((2, 5), bool))
    with pytest.raises(TypeError, match="`mask` must be a boolean"):
        clf.apply(v, x, mask=jnp.ones((2, T), jnp.int32))
    with pytest.raises(ValueError, match="`tokens`"):
        clf.apply(v, x + V)
    with pytest.raises(ValueError, match="block_size"):
        clf.apply(v, jnp.ones((2, T + 1), jnp.int32))
    with pytest.raises(ValueError, match="`num_classes` must be a positive int; got 0"):
        TransformerLMClassifier(_cfg(), num_classes=0).init(KEY, x)

"""Embedding lookup: forward and gradient against numpy (J&M (9.6)), every backward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from seqjax.nn import Embed, embedding_lookup
from seqjax.nn.embedding import BACKWARDS, ONE_HOT_MAX_ROWS, resolve_backward


def _numpy_grad(ids, g, rows):
    """∂L/∂E = Σ_n onehot(i_n) g_nᵀ, written as the loop of the definition."""
    out = np.zeros((rows, g.shape[-1]), np.float64)
    for i, row in zip(ids.reshape(-1), g.reshape(-1, g.shape[-1])):
        out[i] += row
    return out


@pytest.mark.parametrize("backward", BACKWARDS)
def test_lookup_and_gradient_match_numpy(backward):
    rng = np.random.default_rng(0)
    table = rng.normal(size=(9, 6)).astype(np.float32)
    ids = rng.integers(0, 9, size=(4, 11)).astype(np.int32)  # rows repeat: a sum per row
    w = rng.normal(size=(4, 11, 6)).astype(np.float32)
    y = embedding_lookup(jnp.asarray(table), jnp.asarray(ids), backward=backward)
    np.testing.assert_array_equal(np.asarray(y), table[ids])
    grad = jax.jit(jax.grad(lambda t: jnp.sum(
        embedding_lookup(t, jnp.asarray(ids), backward=backward) * w)))(jnp.asarray(table))
    np.testing.assert_allclose(np.asarray(grad), _numpy_grad(ids, w, 9), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backward", ["one_hot", "scatter"])
def test_bfloat16_table_gradient_is_summed_in_float32(backward):
    rng = np.random.default_rng(1)
    ids = np.zeros((512,), np.int32)  # one row receives every update
    g = rng.normal(size=(512, 4)).astype(np.float32)
    table = jnp.zeros((3, 4), jnp.bfloat16)
    _, vjp = jax.vjp(lambda t: embedding_lookup(t, jnp.asarray(ids), backward=backward), table)
    (d,) = vjp(jnp.asarray(g, jnp.bfloat16))
    assert d.dtype == jnp.bfloat16
    exact = g.astype(jnp.bfloat16).astype(np.float32).sum(0)  # float32 sum of the bf16 rows
    np.testing.assert_allclose(np.asarray(d[0], np.float32), exact, rtol=1e-2)
    np.testing.assert_array_equal(np.asarray(d[1:], np.float32), 0.0)


def test_auto_resolution():
    assert resolve_backward("auto", 65, "cpu") == "autodiff"
    assert resolve_backward("auto", 65, "gpu") == "one_hot"
    assert resolve_backward("auto", ONE_HOT_MAX_ROWS, "tpu") == "one_hot"
    assert resolve_backward("auto", ONE_HOT_MAX_ROWS + 1, "gpu") == "scatter"
    assert resolve_backward("scatter", 65, "cpu") == "scatter"
    with pytest.raises(ValueError, match="`backward` must be one of"):
        resolve_backward("gather", 65)


def test_bad_inputs_are_named():
    with pytest.raises(TypeError, match="`ids` must be integers"):
        embedding_lookup(jnp.zeros((3, 2)), jnp.zeros((2,), jnp.float32))
    with pytest.raises(ValueError, match=r"`table_VxD` must be \[V, D\]"):
        embedding_lookup(jnp.zeros((3,)), jnp.zeros((2,), jnp.int32))
    with pytest.raises(TypeError, match="`inputs` must be integer ids"):
        Embed(4, 2).init(jax.random.PRNGKey(0), jnp.zeros((2,), jnp.float32))


@pytest.mark.parametrize("backward", BACKWARDS)
def test_embed_equals_flax_embed(backward):
    ids = jnp.array([[1, 3, 3, 0]], jnp.int32)
    ours, theirs = Embed(5, 4, backward=backward), nn.Embed(5, 4)
    params = ours.init(jax.random.PRNGKey(0), ids)
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
        theirs.init(jax.random.PRNGKey(0), ids))
    np.testing.assert_array_equal(ours.apply(params, ids), theirs.apply(params, ids))
    q = jnp.ones((2, 4))
    np.testing.assert_array_equal(ours.apply(params, q, method="attend"),
                                  theirs.apply(params, q, method="attend"))
    g1 = jax.grad(lambda p: jnp.sum(ours.apply(p, ids) ** 2))(params)
    g2 = jax.grad(lambda p: jnp.sum(theirs.apply(p, ids) ** 2))(params)
    np.testing.assert_allclose(g1["params"]["embedding"], g2["params"]["embedding"], rtol=1e-6)

"""seqjax.nn.dense: Flax's Dense/DenseGeneral parameters, computed as one 2-D GEMM."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.nn.dense import Dense, DenseGeneral, flat_attend, flat_dot_general

X = np.random.default_rng(0).normal(size=(2, 3, 5)).astype(np.float32)

CASES = [
    pytest.param(Dense, nn.Dense, dict(features=4), X, id="dense"),
    pytest.param(DenseGeneral, nn.DenseGeneral, dict(features=(2, 3)), X, id="heads"),
    pytest.param(DenseGeneral, nn.DenseGeneral, dict(features=4, axis=(-2, -1)),
                 X.reshape(2, 3, 5, 1).repeat(2, -1), id="merge-heads"),
    pytest.param(DenseGeneral, nn.DenseGeneral, dict(features=4, axis=1, batch_dims=0),
                 X, id="batch-dims-fallback"),
]


@pytest.mark.parametrize("ours, flax_cls, kw, x", CASES)
def test_same_parameters_values_and_gradients_as_flax(ours, flax_cls, kw, x):
    v_ours = ours(**kw).init(jax.random.PRNGKey(0), x)
    v_flax = flax_cls(**kw).init(jax.random.PRNGKey(0), x)
    # Same names, shapes and initial values: checkpoints and converters are unchanged.
    assert jax.tree_util.tree_structure(v_ours) == jax.tree_util.tree_structure(v_flax)
    for a, b in zip(jax.tree_util.tree_leaves(v_ours), jax.tree_util.tree_leaves(v_flax)):
        np.testing.assert_array_equal(a, b)
    y_ours = ours(**kw).apply(v_ours, x)
    y_flax = flax_cls(**kw).apply(v_ours, x)
    assert y_ours.shape == y_flax.shape
    np.testing.assert_allclose(y_ours, y_flax, rtol=1e-6, atol=1e-6)

    def loss(m):
        return lambda v, xx: jnp.sum(jnp.sin(m(**kw).apply(v, xx)))

    g_ours = jax.grad(loss(ours), argnums=(0, 1))(v_ours, x)
    g_flax = jax.grad(loss(flax_cls), argnums=(0, 1))(v_ours, x)
    for a, b in zip(jax.tree_util.tree_leaves(g_ours), jax.tree_util.tree_leaves(g_flax)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_dense_numpy_reference():
    """``y = x W + b`` (MEDL (5.1), row vectors) on a [B, T, P] input."""
    layer = Dense(4, bias_init=nn.initializers.normal(1.0))
    v = layer.init(jax.random.PRNGKey(1), X)
    w, b = np.asarray(v["params"]["kernel"]), np.asarray(v["params"]["bias"])
    np.testing.assert_allclose(layer.apply(v, X), X @ w + b, rtol=1e-5, atol=1e-6)


def test_flat_dot_general_is_one_2d_product_and_falls_back_otherwise():
    lhs = jnp.asarray(X)
    rhs = jnp.asarray(np.random.default_rng(1).normal(size=(5, 2, 3)).astype(np.float32))
    dn = (((2,), (0,)), ((), ()))
    np.testing.assert_allclose(flat_dot_general(lhs, rhs, dn),
                               jax.lax.dot_general(lhs, rhs, dn), rtol=1e-6, atol=1e-6)
    hlo = jax.jit(lambda a, b: flat_dot_general(a, b, dn)).lower(lhs, rhs).as_text()
    assert "tensor<6x5xf32>" in hlo and "tensor<5x6xf32>" in hlo  # [B·T, P] @ [P, H·D]
    # A batched contraction is not the trailing/leading pattern: plain dot_general.
    dn_b = (((2,), (1,)), ((0,), (0,)))
    rhs_b = jnp.ones((2, 5, 4))
    np.testing.assert_allclose(flat_dot_general(lhs, rhs_b, dn_b),
                               jax.lax.dot_general(lhs, rhs_b, dn_b), rtol=1e-6)


def test_flat_attend_equals_embed_attend():
    embed = nn.Embed(7, 5)
    v = embed.init(jax.random.PRNGKey(0), jnp.zeros((1,), jnp.int32))
    got = embed.apply(v, jnp.asarray(X), method=lambda m, q: flat_attend(m, q))
    want = embed.apply(v, jnp.asarray(X), method=nn.Embed.attend)
    assert got.shape == (2, 3, 7)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

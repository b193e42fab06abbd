"""Tests for seqjax.nn.norms: LayerNorm (J&M (9.42)–(9.45)) and RMSNorm (Zhang & Sennrich 2019)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.nn.norms import LayerNorm, RMSNorm, layer_norm, rms_norm


def np_layer_norm(x, gamma, beta, eps):
    """J&M (9.42)–(9.45) with ε under the root: population (biased) variance."""
    x = np.asarray(x, np.float64)
    mu = x.mean(-1, keepdims=True)  # (9.42)
    sigma = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)  # (9.43)
    return gamma * (x - mu) / sigma + beta  # (9.44)–(9.45)


def np_rms_norm(x, g, eps):
    x = np.asarray(x, np.float64)
    return g * x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


def test_layernorm_slides_example():
    """Slides: [2, 4, 6, 8, 10] -> [-1.41, -0.71, 0, 0.71, 1.41] (ε ≈ 0, biased σ)."""
    x = jnp.array([[2.0, 4.0, 6.0, 8.0, 10.0]])
    y = jax.jit(LayerNorm(epsilon=0.0).apply)(
        {"params": {"scale": np.ones(5), "bias": np.zeros(5)}}, x
    )
    np.testing.assert_allclose(y[0], [-1.41421, -0.70711, 0.0, 0.70711, 1.41421], atol=1e-5)
    np.testing.assert_allclose(np.round(y[0], 2), [-1.41, -0.71, 0.0, 0.71, 1.41])
    # With an unbiased (n-1) variance the first entry would be -1.26: biased is what we compute.
    assert abs(float(y[0, 0]) - (-4 / np.std([2, 4, 6, 8, 10], ddof=1))) > 0.1
    # Default ε = 1e-5 changes the example only in the 6th digit.
    y_eps = jax.jit(LayerNorm().apply)({"params": {"scale": np.ones(5), "bias": np.zeros(5)}}, x)
    np.testing.assert_allclose(y_eps, y, rtol=1e-5)


@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_layernorm_numpy_reference(eps):
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, (2, 3, 7)).astype(np.float32)
    gamma = rng.normal(size=7).astype(np.float32)
    beta = rng.normal(size=7).astype(np.float32)
    y = jax.jit(LayerNorm(epsilon=eps).apply)({"params": {"scale": gamma, "bias": beta}}, x)
    np.testing.assert_allclose(y, np_layer_norm(x, gamma, beta, eps), rtol=1e-5, atol=1e-5)
    # Pure function agrees with the Module.
    y_fn = jax.jit(functools.partial(layer_norm, epsilon=eps))(x, gamma, beta)
    np.testing.assert_allclose(y_fn, y, rtol=1e-6)


def test_layernorm_params_and_options():
    x = jax.ShapeDtypeStruct((2, 6), jnp.float32)

    def init(mod):
        return jax.eval_shape(mod.init, jax.random.PRNGKey(0), x)

    params = init(LayerNorm())["params"]
    assert {k: v.shape for k, v in params.items()} == {"scale": (6,), "bias": (6,)}
    assert init(LayerNorm(use_bias=False))["params"].keys() == {"scale"}
    assert init(LayerNorm(use_scale=False, use_bias=False)) == {}
    rng = np.random.default_rng(1)
    xr = rng.normal(size=(4, 6)).astype(np.float32)
    y = jax.jit(LayerNorm(use_scale=False, use_bias=False).apply)({}, xr)
    np.testing.assert_allclose(y, np_layer_norm(xr, 1.0, 0.0, 1e-5), rtol=1e-5, atol=1e-6)


def test_layernorm_matches_flax_and_torch_formula():
    import flax.linen as fnn

    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 10)).astype(np.float32)
    params = {"scale": rng.normal(size=10).astype(np.float32), "bias": np.zeros(10, np.float32)}
    ours = jax.jit(LayerNorm(epsilon=1e-5).apply)({"params": params}, x)
    theirs = jax.jit(fnn.LayerNorm(epsilon=1e-5).apply)({"params": params}, x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_bf16_input_has_fp32_accurate_statistics():
    """A large common offset: bf16 statistics would lose every digit; ours are float32."""
    rng = np.random.default_rng(3)
    x16 = jnp.asarray(256.0 + rng.normal(size=(4, 64)), jnp.bfloat16)
    x64 = np.asarray(x16.astype(jnp.float32), np.float64)  # the exact values the layer sees
    ref = np_layer_norm(x64, 1.0, 0.0, 1e-5)
    y32 = jax.jit(functools.partial(layer_norm, epsilon=1e-5, dtype=jnp.float32))(x16)
    assert y32.dtype == jnp.float32
    np.testing.assert_allclose(y32, ref, atol=1e-4)

    # The same math done naively in bf16 is far off: the test can tell.
    @jax.jit
    def naive_ln(x16):
        mu = x16.mean(-1, keepdims=True)
        return (x16 - mu) / jnp.sqrt(((x16 - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

    naive = naive_ln(x16)
    assert np.max(np.abs(np.asarray(naive, np.float64) - ref)) > 1e-2
    # Module with bf16 compute: output is bf16, accurate to bf16 rounding of the fp32 result.
    y16 = jax.jit(LayerNorm(dtype=jnp.bfloat16).apply)(
        {"params": {"scale": np.ones(64, np.float32), "bias": np.zeros(64, np.float32)}}, x16
    )
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float64), ref, atol=2e-2)
    # RMSNorm too.
    r32 = jax.jit(functools.partial(rms_norm, epsilon=1e-6, dtype=jnp.float32))(x16)
    np.testing.assert_allclose(r32, np_rms_norm(x64, 1.0, 1e-6), rtol=1e-5)


def test_rmsnorm_numpy_reference():
    rng = np.random.default_rng(4)
    x = rng.normal(1.0, 2.0, (2, 3, 9)).astype(np.float32)
    g = rng.normal(size=9).astype(np.float32)
    y = jax.jit(RMSNorm(epsilon=1e-6).apply)({"params": {"scale": g}}, x)
    np.testing.assert_allclose(y, np_rms_norm(x, g, 1e-6), rtol=1e-5, atol=1e-6)
    # RMSNorm is not LayerNorm for non-centred inputs, and equals it (γ only) for centred ones.
    assert np.max(np.abs(y - np_layer_norm(x, g, 0.0, 1e-6))) > 1e-2
    xc = x - x.mean(-1, keepdims=True)
    np.testing.assert_allclose(
        jax.jit(functools.partial(rms_norm, epsilon=1e-6))(xc, g),
        jax.jit(functools.partial(layer_norm, epsilon=1e-6))(xc, g),
        rtol=1e-4,
        atol=1e-5,
    )
    params = jax.eval_shape(RMSNorm().init, jax.random.PRNGKey(0), x)["params"]
    assert {k: v.shape for k, v in params.items()} == {"scale": (9,)}


def test_rmsnorm_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    g = rng.normal(size=8).astype(np.float32)
    tn = torch.nn.RMSNorm(8, eps=1e-6)
    tn.weight.data = torch.tensor(g)
    with torch.no_grad():
        ref = tn(torch.tensor(x)).numpy()
    np.testing.assert_allclose(
        jax.jit(RMSNorm().apply)({"params": {"scale": g}}, x), ref, atol=1e-5
    )
    tl = torch.nn.LayerNorm(8)
    tl.weight.data = torch.tensor(g)
    with torch.no_grad():
        ref = tl(torch.tensor(x)).numpy()
    ours = jax.jit(LayerNorm().apply)({"params": {"scale": g, "bias": np.zeros(8, np.float32)}}, x)
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_jit_grad_and_errors():
    x = jnp.arange(12.0).reshape(3, 4)
    g = jax.jit(jax.grad(lambda x: layer_norm(x, epsilon=1e-5).sum()))(x)
    np.testing.assert_allclose(g, 0.0, atol=1e-5)  # Σ LN(x) = 0 for every x.
    with pytest.raises(ValueError, match="epsilon"):
        layer_norm(x, epsilon=-1.0)
    with pytest.raises(ValueError, match="scale"):
        layer_norm(x, jnp.ones(3))
    with pytest.raises(ValueError, match="x"):
        rms_norm(jnp.float32(1.0))
    with pytest.raises(TypeError, match="floating"):
        jax.eval_shape(LayerNorm().init, jax.random.PRNGKey(0), jnp.ones((2, 3), jnp.int32))

"""Tests for seqjax.nn.ffn: MLP (MEDL §7.5 step 3) and gated units (Shazeer 2020)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.nn.ffn import GLU, MLP, glu_hidden_dim
from seqjax.utils import count_params

KEY = jax.random.PRNGKey(0)


def np_gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / np.sqrt(2.0)))


def np_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def np_silu(x):
    return x / (1.0 + np.exp(-x))


NP_ACT = {"relu": lambda x: np.maximum(x, 0.0), "gelu": np_gelu, "gelu_tanh": np_gelu_tanh,
          "relu_squared": lambda x: np.maximum(x, 0.0) ** 2}  # Primer (So et al. 2021)


def np_mlp(x, p, act):
    """W2 S(W1 x + b1) + b2 in the row-vector convention."""
    h = act(x @ p["up"]["kernel"] + p["up"]["bias"])
    return h @ p["down"]["kernel"] + p["down"]["bias"]


def np_glu(x, p, act):
    """Shazeer (2020): (S(xW) ⊙ xV) W2, no biases."""
    return (act(x @ p["gate"]["kernel"]) * (x @ p["up"]["kernel"])) @ p["down"]["kernel"]


def random_params(module, x, seed=0):
    """Parameters with the module's tree and shapes, random values (no init compile)."""
    shapes = jax.eval_shape(module.init, KEY, x)["params"]
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda s: rng.normal(0.0, 1.0 / np.sqrt(s.shape[0]), s.shape).astype(np.float32), shapes
    )


def _f64(params):
    return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "relu_squared"])
def test_mlp_numpy_reference(activation):
    x = np.random.default_rng(0).normal(size=(2, 3, 6)).astype(np.float32)
    mlp = MLP(mlp_dim=10, activation=activation)
    params = random_params(mlp, x)
    y = jax.jit(mlp.apply)({"params": params}, x)
    ref = np_mlp(x.astype(np.float64), _f64(params), NP_ACT[activation])
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_gelu_exact_and_tanh_differ():
    x = np.linspace(-3, 3, 13).astype(np.float32)[None]
    eye, zero = np.eye(13, dtype=np.float32), np.zeros(13, np.float32)
    p = {"up": {"kernel": eye, "bias": zero}, "down": {"kernel": eye, "bias": zero}}
    exact = jax.jit(MLP(mlp_dim=13, activation="gelu").apply)({"params": p}, x)
    approx = jax.jit(MLP(mlp_dim=13, activation="gelu_tanh").apply)({"params": p}, x)
    np.testing.assert_allclose(exact[0], np_gelu(x[0].astype(np.float64)), atol=1e-6)
    np.testing.assert_allclose(approx[0], np_gelu_tanh(x[0].astype(np.float64)), atol=1e-6)
    assert np.max(np.abs(exact - approx)) > 1e-4


def _shapes(module, d):
    return jax.eval_shape(module.init, KEY, jax.ShapeDtypeStruct((1, d), jnp.float32))["params"]


def test_mlp_param_count_and_default_hidden():
    # MEDL (7.32)'s FFN term: 2 N1 p + N1 + p.
    assert count_params(_shapes(MLP(mlp_dim=2048), 512)) == 2 * 2048 * 512 + 2048 + 512
    p = _shapes(MLP(), 8)
    assert p["up"]["kernel"].shape == (8, 32) and p["down"]["kernel"].shape == (32, 8)
    p = _shapes(MLP(mlp_dim=4, out_features=3, use_bias=False), 8)
    assert jax.tree_util.tree_map(jnp.shape, p) == {
        "up": {"kernel": (8, 4)},
        "down": {"kernel": (4, 3)},
    }


@pytest.mark.parametrize(
    "variant,act",
    [("swiglu", np_silu), ("geglu", np_gelu), ("reglu", NP_ACT["relu"]), ("bilinear", None)],
)
def test_glu_numpy_reference(variant, act):
    x = np.random.default_rng(1).normal(size=(2, 3, 6)).astype(np.float32)
    ffn = GLU(variant=variant, mlp_dim=16)
    params = random_params(ffn, x, seed=1)
    assert set(params) == {"gate", "up", "down"} and "bias" not in params["gate"]
    y = jax.jit(ffn.apply)({"params": params}, x)
    ref = np_glu(x.astype(np.float64), _f64(params), act or (lambda z: z))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_glu_with_bias_is_shazeer_form():
    """Swish(xW + b) ⊙ (xV + c), then W2 (+ b2): c sits inside the product."""
    x = np.random.default_rng(2).normal(size=(4, 5)).astype(np.float32)
    ffn = GLU(mlp_dim=7, use_bias=True)
    p = random_params(ffn, x, seed=2)
    q, x64 = _f64(p), x.astype(np.float64)
    h = np_silu(x64 @ q["gate"]["kernel"] + q["gate"]["bias"]) * (
        x64 @ q["up"]["kernel"] + q["up"]["bias"]
    )
    ref = h @ q["down"]["kernel"] + q["down"]["bias"]
    np.testing.assert_allclose(jax.jit(ffn.apply)({"params": p}, x), ref, rtol=1e-5, atol=1e-5)


def test_glu_hidden_dim_default():
    assert glu_hidden_dim(4096) == 11008  # Llama-7B's 11008
    assert glu_hidden_dim(12, multiple_of=8) == 32
    assert glu_hidden_dim(512, multiple_of=1) == 1365
    assert glu_hidden_dim(16) == 256  # rounds up: pass multiple_of for tiny models
    assert _shapes(GLU(multiple_of=8), 12)["gate"]["kernel"].shape == (12, 32)
    # (8/3)·D with three matrices ≈ a 4D MLP's two matrices (no biases).
    d = 768
    glu = count_params(_shapes(GLU(multiple_of=1), d))
    mlp = count_params(_shapes(MLP(use_bias=False), d))
    assert abs(glu - mlp) / mlp < 1e-3
    with pytest.raises(ValueError, match="multiple_of"):
        glu_hidden_dim(8, multiple_of=0)


def test_dropout_only_when_not_deterministic():
    x = jnp.ones((2, 4, 8))
    for mod in (MLP(mlp_dim=64, dropout_rate=0.5), GLU(mlp_dim=64, dropout_rate=0.5)):
        params = {"params": random_params(mod, x)}
        apply = jax.jit(mod.apply, static_argnames="deterministic")
        y0 = apply(params, x)
        np.testing.assert_array_equal(y0, apply(params, x, deterministic=True))
        # "rbg" keys: the same dropout semantics, much cheaper to compile than threefry.
        y1 = apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(1, impl="rbg")})
        y2 = apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(2, impl="rbg")})
        assert not np.allclose(y0, y1) and not np.allclose(y1, y2)


def test_position_wise_and_dtypes():
    x = np.random.default_rng(3).normal(size=(2, 5, 8)).astype(np.float32)
    mlp = MLP(mlp_dim=16)
    params = {"params": random_params(mlp, x)}
    apply = jax.jit(mlp.apply)
    y = apply(params, x)
    np.testing.assert_allclose(apply(params, x[:, 2:3]), y[:, 2:3], rtol=1e-6)
    y16 = jax.jit(MLP(mlp_dim=16, dtype=jnp.bfloat16).apply)(params, x)
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float32), y, atol=0.1)


def test_errors():
    x = jnp.ones((2, 4))
    with pytest.raises(ValueError, match="activation"):
        jax.eval_shape(MLP(activation="nope").init, KEY, x)
    with pytest.raises(ValueError, match="variant"):
        jax.eval_shape(GLU(variant="swish").init, KEY, x)
    with pytest.raises(ValueError, match="dropout_rate"):
        jax.eval_shape(MLP(dropout_rate=1.0).init, KEY, x)
    with pytest.raises(ValueError, match="mlp_dim"):
        jax.eval_shape(GLU(mlp_dim=0).init, KEY, x)

"""CausalConv1D against a numpy loop of its equation, PyTorch's Conv1d, causality, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.nn import CausalConv1D

KEY = jax.random.PRNGKey(0)


def numpy_causal_conv(x, kernel, bias, dilation):
    """y_t = b + Σ_j W_jᵀ x_{t-(K-1-j)r}, with x_s = 0 before the start (0-based t)."""
    batch, steps, _ = x.shape
    k = kernel.shape[0]
    y = np.zeros((batch, steps, kernel.shape[2])) + bias
    for t in range(steps):
        for j in range(k):
            s = t - (k - 1 - j) * dilation
            if s >= 0:
                y[:, t] += x[:, s] @ kernel[j]
    return y


@pytest.mark.parametrize("k, r", [(1, 1), (3, 1), (3, 2), (2, 4)])
def test_matches_the_numpy_equation(k, r):
    x = np.random.default_rng(0).normal(size=(2, 9, 5)).astype(np.float32)
    conv = CausalConv1D(
        features=4, kernel_size=k, dilation=r, bias_init=jax.nn.initializers.normal(1.0)
    )
    v = conv.init(KEY, jnp.asarray(x))
    p = jax.tree_util.tree_map(np.asarray, v["params"])
    assert p["kernel"].shape == (k, 5, 4) and p["bias"].shape == (4,)
    np.testing.assert_allclose(
        conv.apply(v, jnp.asarray(x)),
        numpy_causal_conv(x, p["kernel"], p["bias"], r),
        rtol=1e-5,
        atol=1e-5,
    )


def test_matches_pytorch_conv1d_on_the_left_padded_input():
    torch = pytest.importorskip("torch")
    k, r = 3, 2
    x = np.random.default_rng(1).normal(size=(2, 8, 5)).astype(np.float32)
    conv = CausalConv1D(features=4, kernel_size=k, dilation=r)
    v = conv.init(KEY, jnp.asarray(x))
    ref = torch.nn.Conv1d(5, 4, k, dilation=r)
    with torch.no_grad():  # weight[f, d, j] = kernel[j, d, f]
        ref.weight.copy_(
            torch.from_numpy(np.array(v["params"]["kernel"]).transpose(2, 1, 0).copy())
        )
        ref.bias.copy_(torch.from_numpy(np.array(v["params"]["bias"])))
        xp = torch.nn.functional.pad(torch.from_numpy(x).transpose(1, 2), ((k - 1) * r, 0))
        want = ref(xp).transpose(1, 2).numpy()
    np.testing.assert_allclose(conv.apply(v, jnp.asarray(x)), want, rtol=1e-5, atol=1e-5)


def test_causal_receptive_field_and_padding():
    """dy_t/dx_s ≠ 0 exactly for s ∈ {t, t−r, …, t−(K−1)r}; padded outputs are zero and
    a padded batch equals each row alone."""
    k, r, steps = 3, 2, 8
    conv = CausalConv1D(features=3, kernel_size=k, dilation=r)
    x = jax.random.normal(KEY, (1, steps, 3))
    v = conv.init(KEY, x)
    jac = jax.jacrev(lambda x: conv.apply(v, x))(x)[0, :, :, 0]  # [T, F, T, D]
    seen = np.abs(np.asarray(jac)).max(axis=(1, 3)) > 0
    want = np.zeros((steps, steps), bool)
    for t in range(steps):
        for j in range(k):
            if t - j * r >= 0:
                want[t, t - j * r] = True
    np.testing.assert_array_equal(seen, want)
    xb = jax.random.normal(jax.random.PRNGKey(3), (2, steps, 3))
    out = conv.apply(v, xb, jnp.array([8, 5]))
    np.testing.assert_array_equal(out[1, 5:], 0.0)
    np.testing.assert_allclose(out[1, :5], conv.apply(v, xb[1:, :5])[0], rtol=1e-6, atol=1e-6)


def test_bad_inputs():
    x = jnp.ones((1, 4, 2))
    with pytest.raises(ValueError, match="`x` must have rank 3"):
        CausalConv1D(features=2).init(KEY, jnp.ones((4, 2)))
    for field in ("features", "kernel_size", "dilation"):
        kw = {"features": 2, field: 0}
        with pytest.raises(ValueError, match=f"`{field}` must be a positive int; got 0"):
            CausalConv1D(**kw).init(KEY, x)
    with pytest.raises(ValueError, match="`lengths` must lie in"):
        CausalConv1D(features=2).init(KEY, x, jnp.array([5]))

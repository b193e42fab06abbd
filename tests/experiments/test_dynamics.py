"""The slides' BPTT section: the logistic map and the gradient bound, asserted."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.experiments import dynamics


def test_logistic_map_r35_four_cycle_and_lyapunov():
    """Slides' Fig. 2, f(x) = 3.5x(1 − x): the orbit ends on the 4-cycle (the fixed points
    of f⁴ that are not fixed points of f²), where |(f⁴)'| < 1 and λ < 0."""
    orbit = dynamics.logistic_orbit(3.5, 0.2, 4000)
    cycle = np.sort(orbit[-4:])
    f = lambda x: 3.5 * x * (1 - x)  # noqa: E731
    np.testing.assert_allclose(f(f(f(f(cycle)))), cycle, atol=1e-12)
    assert len(set(np.round(cycle, 6))) == 4
    np.testing.assert_allclose(cycle, [0.382820, 0.500884, 0.826941, 0.874997], atol=1e-6)
    slope = np.prod(3.5 * (1 - 2 * cycle))
    assert abs(slope) < 1
    _, lyap = dynamics.bifurcation(np.array([2.8, 3.5, 3.9]), transient=1000, keep=4000)
    # r = 2.8: fixed point 1 − 1/r, λ = log|2 − r|; r = 3.5: the cycle's log|slope|/4
    np.testing.assert_allclose(lyap[:2], [np.log(0.8), np.log(abs(slope)) / 4], atol=1e-3)
    assert lyap[2] > 0.3  # chaos
    auto, prod = dynamics.composition_derivative(3.5, 0.2, 30)
    np.testing.assert_allclose(auto, prod, rtol=1e-3)


@pytest.mark.parametrize("form", dynamics.FORMS)
@pytest.mark.parametrize("activation", ["tanh", "sigmoid"])
def test_bptt_bound_holds_for_random_weights(form, activation):
    """‖∂h_T/∂h_t‖ ≤ ∏_{j=t+1}^T ‖Wᵀ‖ ‖diag σ'(·)‖ ≤ (γ‖W‖)^{T−t} (slides), for spectral
    norms below and above 1, and ∂h_T/∂h_t equals the product of the per-step factors."""
    key = jax.random.PRNGKey(0 if form == "slides" else 1)
    for norm in (0.5, 0.9, 1.1, 2.0):
        for _ in range(2):
            key, kw, kx, kh = jax.random.split(key, 4)
            w = dynamics.random_weights(kw, 6, 3, norm)
            xs = jax.random.normal(kx, (12, 3))
            h0 = jax.random.normal(kh, (6,))
            r = dynamics.bptt_bound(form, w, xs, h0, activation)
            np.testing.assert_allclose(r["w_norm"], norm, rtol=1e-5)
            assert np.all(r["exact"] <= r["product"] * (1 + 1e-5)), r["exact"] / r["product"]
            assert np.all(r["product"] <= r["coarse"] * (1 + 1e-5))
            assert r["formula_gap"] < 1e-5
            if r["gamma"] * norm < 1:  # the slides' "if |Wᵀ| < 1 → 0": vanishing
                assert r["exact"][-1] <= (r["gamma"] * norm) ** 12 * (1 + 1e-5)


def test_linear_recurrence_attains_the_bound():
    """σ = identity, W = ρQ (Q orthogonal): ‖∂h_T/∂h_t‖ = ρ^{T−t} exactly — the bound is
    tight, and it explodes for ρ > 1 (MEDL (7.12))."""
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(5, 5)))
    for rho in (0.8, 1.3):
        w = {"W": jnp.asarray(rho * q, jnp.float32), "W_xh": jnp.ones((5, 2)),
             "b": jnp.zeros(5)}
        for form in dynamics.FORMS:
            r = dynamics.bptt_bound(form, w, jnp.ones((10, 2)), jnp.ones(5), "identity")
            np.testing.assert_allclose(r["exact"], rho ** np.arange(1, 11), rtol=1e-4)
            np.testing.assert_allclose(r["coarse"], rho ** np.arange(1, 11), rtol=1e-4)


def test_dynamics_smoke(tmp_path):
    s = dynamics.main(["--smoke", "--workdir", str(tmp_path)])
    assert len(s["cycle"]) == 4 and s["lyapunov_orbit_r"] < 0 < s["lyapunov_3.9"]
    assert all(r["max_exact_over_product"] <= 1 + 1e-5 for r in s["bound"])
    for name in ("dynamics.md", "dynamics_logistic_map.png", "dynamics_bptt_bound.png"):
        assert (tmp_path / name).exists()

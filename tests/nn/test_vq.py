"""Vector quantisation (Bishop (12.38)) and the straight-through estimator vs numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.nn import VectorQuantizer, kmeans_codebook, nearest_code, quantize, vq_losses

RNG = np.random.default_rng(0)


def _np_nearest(z, c):
    d = ((z[..., None, :] - c) ** 2).sum(-1)  # direct ‖z − c_k‖², no expansion
    return d.argmin(-1), d


def test_nearest_code_matches_numpy():
    z = RNG.normal(size=(3, 7, 5)).astype(np.float32)
    c = RNG.normal(size=(11, 5)).astype(np.float32)
    k, d = nearest_code(jnp.asarray(z), jnp.asarray(c))
    k_ref, d_ref = _np_nearest(z, c)
    np.testing.assert_array_equal(k, k_ref)
    np.testing.assert_allclose(d, d_ref, rtol=1e-5, atol=1e-5)


def test_vector_quantizer_forward_losses_and_gradients_vs_numpy():
    vq = VectorQuantizer(num_codes=6, features=3, beta=0.25)
    z = jnp.asarray(RNG.normal(size=(4, 5, 3)), jnp.float32)
    params = vq.init(jax.random.PRNGKey(1), z)
    c = np.asarray(params["params"]["codebook"])
    zn = np.asarray(z)
    k_ref, _ = _np_nearest(zn, c)
    q_ref = c[k_ref]
    q, aux = vq.apply(params, z)
    np.testing.assert_array_equal(aux["codes"], k_ref)
    np.testing.assert_allclose(q, q_ref, atol=1e-6)
    mse = np.mean((zn - q_ref) ** 2)
    np.testing.assert_allclose(aux["codebook_loss"], mse, rtol=1e-6)
    np.testing.assert_allclose(aux["commitment_loss"], 0.25 * mse, rtol=1e-6)
    usage = np.bincount(k_ref.ravel(), minlength=6) / k_ref.size
    nz = usage[usage > 0]
    np.testing.assert_allclose(aux["perplexity"], np.exp(-(nz * np.log(nz)).sum()), rtol=1e-6)

    # Gradients of L = <w, q̃> + codebook + commitment, by hand:
    #   dL/dz = w (straight through: ∂q̃/∂z = I) + 2β(z − q)/(ND),
    #   dL/dc_k = Σ_{n: k_n = k} 2(q_n − z_n)/(ND).
    w = RNG.normal(size=zn.shape).astype(np.float32)

    def loss(p, z):
        q, aux = vq.apply(p, z)
        return jnp.sum(q * w) + aux["loss"]

    gp, gz = jax.grad(loss, argnums=(0, 1))(params, z)
    nd = zn.size
    np.testing.assert_allclose(gz, w + 2 * 0.25 * (zn - q_ref) / nd, rtol=1e-5, atol=1e-6)
    gc = np.zeros_like(c)
    np.add.at(gc, k_ref.ravel(), (2 * (q_ref - zn) / nd).reshape(-1, 3))
    np.testing.assert_allclose(gp["params"]["codebook"], gc, rtol=1e-5, atol=1e-7)


def test_straight_through_jacobian_is_identity():
    """∂q̃/∂z = I exactly, although q̃ is piecewise constant in z (Bishop §12.4.2)."""
    c = jnp.asarray(RNG.normal(size=(4, 3)), jnp.float32)
    z = jnp.asarray(RNG.normal(size=(2, 3)), jnp.float32)
    jac = jax.jacobian(lambda z: quantize(z, c)[0])(z)
    np.testing.assert_array_equal(np.asarray(jac).reshape(6, 6), np.eye(6))
    # no gradient reaches the codebook through q̃
    gc = jax.grad(lambda c: quantize(z, c)[0].sum())(c)
    assert float(jnp.abs(gc).max()) == 0.0
    # the true derivative of the forward value is 0 (a small move keeps the code)
    q0, k0 = quantize(z, c)
    q1, k1 = quantize(z + 1e-4, c)
    np.testing.assert_array_equal(k0, k1)
    np.testing.assert_allclose(q0, q1, atol=1e-6)
    np.testing.assert_allclose(q0, c[k0], atol=1e-6)


def test_vq_losses_gradients_split():
    z = jnp.array([[1.0, 2.0]])
    q = jnp.array([[0.0, 1.0]])
    gz_cb, gq_cb = jax.grad(lambda z, q: vq_losses(z, q)[0], argnums=(0, 1))(z, q)
    gz_cm, gq_cm = jax.grad(lambda z, q: vq_losses(z, q, 0.5)[1], argnums=(0, 1))(z, q)
    np.testing.assert_allclose(gz_cb, 0.0)
    np.testing.assert_allclose(gq_cb, [[-1.0, -1.0]])  # 2(q − z)/2
    np.testing.assert_allclose(gz_cm, [[0.5, 0.5]])  # β·2(z − q)/2
    np.testing.assert_allclose(gq_cm, 0.0)


def test_kmeans_codebook_separates_clusters():
    centres = np.array([[0.0, 0.0], [5.0, 5.0], [10.0, 0.0]])
    x = np.concatenate([c + 0.1 * RNG.normal(size=(50, 2)) for c in centres])
    cb = kmeans_codebook(x, 3, seed=1)
    np.testing.assert_allclose(cb, centres, atol=0.05)


def test_errors_name_the_argument():
    c = jnp.zeros((4, 3))
    with pytest.raises(ValueError, match="`z` must end in the code width D = 3"):
        nearest_code(jnp.zeros((2, 2)), c)
    with pytest.raises(ValueError, match="codebook"):
        nearest_code(jnp.zeros((2, 3)), jnp.zeros(3))
    with pytest.raises(ValueError, match="`beta` must be >= 0"):
        vq_losses(jnp.zeros(2), jnp.zeros(2), beta=-1.0)
    with pytest.raises(ValueError, match="`num_codes` must be in"):
        kmeans_codebook(np.zeros((3, 1)), 4)
    with pytest.raises(ValueError, match="`num_codes` and `features`"):
        VectorQuantizer(0, 2).init(jax.random.PRNGKey(0), jnp.zeros((1, 2)))
    params = VectorQuantizer(4, 2).init(jax.random.PRNGKey(0), jnp.zeros((1, 2)))
    with pytest.raises(ValueError, match="`beta` must be >= 0"):  # decode alone checks it too
        VectorQuantizer(4, 2, beta=-1.0).apply(params, jnp.zeros(1, jnp.int32), method="decode")

"""Tests for seqjax.nn.positional against the textbook formulas and their stated properties."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.nn.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    one_hot_positions,
    sinusoidal_positions,
)


def randn(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def np_sinusoid(positions, dim, base):
    """MEDL (7.29) / Bishop (12.25), interleaved: r[t, 2i] = sin(t w_i), r[t, 2i+1] = cos(t w_i)."""
    r = np.zeros((len(positions), dim))
    for a, t in enumerate(positions):
        for i in range(dim // 2):
            r[a, 2 * i] = np.sin(t / base ** (2 * i / dim))
            r[a, 2 * i + 1] = np.cos(t / base ** (2 * i / dim))
    return r


# ----------------------------------------------------------------------------- one-hot


def test_one_hot_positions_medl_example_e8():
    # MEDL §7.5: p = 2, T = 4, x<1> = x<4> = (0.2, -1.3).
    x = jnp.tile(jnp.array([0.2, -1.3]), (1, 4, 1))
    y = one_hot_positions(x)
    assert y.shape == (1, 4, 6)
    np.testing.assert_allclose(y[0, 0], [0.2, -1.3, 1, 0, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(y[0, 3], [0.2, -1.3, 0, 0, 0, 1], rtol=1e-6)


def test_one_hot_positions_errors():
    with pytest.raises(ValueError, match="positions"):
        one_hot_positions(jnp.zeros((1, 3, 2)), num_positions=3, positions=jnp.array([0, 1, 3]))
    with pytest.raises(ValueError, match="rank"):
        one_hot_positions(jnp.zeros((3, 2)))


# ----------------------------------------------------------------------------- learned


def test_learned_add_is_table_lookup():
    pe = LearnedPositionalEmbedding(num_positions=6)
    x = randn((2, 4, 3), seed=0)
    params = jax.jit(pe.init)(jax.random.PRNGKey(1), x)
    table = np.asarray(params["params"]["embedding"])
    assert table.shape == (6, 3)
    pos = np.array([[5, 4, 3, 2], [0, 0, 1, 1]])
    apply = jax.jit(pe.apply)
    np.testing.assert_allclose(apply(params, x, pos), x + table[pos], rtol=1e-6)
    np.testing.assert_allclose(pe.apply(params, x), x + table[:4][None], rtol=1e-6)


def test_learned_mlp_form_matches_medl_7_28():
    # x~ = W1 S(W2 x + W3 e_t + b), S = ReLU; W3 e_t is column t of W3 (= embedding[t]).
    pe = LearnedPositionalEmbedding(num_positions=5, features=4, form="mlp")
    x = randn((1, 3, 2), seed=0)
    params = jax.jit(pe.init)(jax.random.PRNGKey(1), x)["params"]
    w2, b = np.asarray(params["input"]["kernel"]), np.asarray(params["input"]["bias"])
    w1, e = np.asarray(params["output"]["kernel"]), np.asarray(params["embedding"])
    xn = np.asarray(x[0])
    onehot = np.eye(5)[:3]
    expected = np.maximum(xn @ w2 + onehot @ e + b, 0) @ w1
    np.testing.assert_allclose(jax.jit(pe.apply)({"params": params}, x)[0], expected, rtol=1e-5,
                               atol=1e-6)


def test_learned_errors():
    pe = LearnedPositionalEmbedding(num_positions=3)
    with pytest.raises(ValueError, match="num_positions"):
        pe.init(jax.random.PRNGKey(0), jnp.zeros((1, 4, 2)))
    with pytest.raises(ValueError, match="form"):
        LearnedPositionalEmbedding(num_positions=3, form="bad").init(
            jax.random.PRNGKey(0), jnp.zeros((1, 2, 2)))


# ----------------------------------------------------------------------------- sinusoidal


@pytest.mark.parametrize("start", [0, 1])
def test_sinusoidal_matches_numpy(start):
    r = sinusoidal_positions(7, 6, base=30.0, start=start)
    np.testing.assert_allclose(r, np_sinusoid(range(start, start + 7), 6, 30.0), atol=1e-6)


def test_sinusoidal_halves_is_permuted_interleaved():
    inter = sinusoidal_positions(5, 8)
    halves = sinusoidal_positions(5, 8, layout="halves")
    perm = list(range(0, 8, 2)) + list(range(1, 8, 2))
    np.testing.assert_allclose(halves, inter[:, perm], atol=1e-7)


def test_sinusoidal_lecture_notes_properties():
    # LN (11): f(0) = [0, 1, 0, 1, ...], sin^2 + cos^2 = 1, values in [-1, 1].
    r = np.asarray(sinusoidal_positions(50, 10))
    np.testing.assert_allclose(r[0], [0, 1] * 5)
    np.testing.assert_allclose(r[:, 0::2] ** 2 + r[:, 1::2] ** 2, 1.0, atol=1e-6)
    assert np.all(np.abs(r) <= 1.0)


def test_sinusoid_shift_matrix_bishop_ex_12_10():
    # r_{t+k} = M_k r_t, M_k block-diagonal with [[cos kw, sin kw], [-sin kw, cos kw]] on
    # (sin, cos) pairs and independent of t.
    dim, base, k = 8, 30.0, 3
    r = np.asarray(sinusoidal_positions(40, dim, base=base), np.float64)
    w = base ** (-np.arange(0, dim, 2) / dim)
    m_k = np.zeros((dim, dim))
    for j, wj in enumerate(w):
        c, s = np.cos(k * wj), np.sin(k * wj)
        m_k[2 * j: 2 * j + 2, 2 * j: 2 * j + 2] = [[c, s], [-s, c]]
    np.testing.assert_allclose(r[:-k] @ m_k.T, r[k:], atol=2e-5)
    # Negative control: with sines only, no single linear map fits the shift.
    sines = r[:, 0::2]
    m_fit, *_ = np.linalg.lstsq(sines[:-k], sines[k:], rcond=None)
    assert np.abs(sines[:-k] @ m_fit - sines[k:]).max() > 1e-3


def test_sinusoidal_module_add_concat_and_offset_positions():
    x = randn((2, 3, 4), seed=0)
    add = SinusoidalPositionalEmbedding(base=100.0)
    np.testing.assert_allclose(add.apply({}, x), x + sinusoidal_positions(3, 4, 100.0)[None],
                               atol=1e-6)
    cat = SinusoidalPositionalEmbedding(mode="concat", features=6, start=1, layout="halves")
    y = cat.apply({}, x)
    np.testing.assert_allclose(y[..., 4:], jnp.broadcast_to(
        sinusoidal_positions(3, 6, start=1, layout="halves"), (2, 3, 6)), atol=1e-6)
    pos = jnp.array([[5, 6, 7], [0, 1, 2]])
    y = jax.jit(lambda x, p: add.apply({}, x, p))(x, pos)
    np.testing.assert_allclose(y[0], x[0] + sinusoidal_positions(3, 4, 100.0, start=5), atol=1e-5)
    with pytest.raises(ValueError, match="features"):
        SinusoidalPositionalEmbedding(mode="concat").apply({}, x)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_positions(3, 5)
    with pytest.raises(ValueError, match="layout"):
        sinusoidal_positions(3, 4, layout="bad")


# ----------------------------------------------------------------------------- RoPE


def np_rope(x, positions, base, layout):
    """Rotate pairs (a, b) by t * w_i; pairs are (2i, 2i+1) or (i, i + D/2)."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    y = x.copy()
    for bi in range(x.shape[0]):
        for t in range(x.shape[1]):
            for i in range(d // 2):
                a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + d // 2)
                ang = positions[bi, t] * base ** (-2 * i / d)
                c, s = np.cos(ang), np.sin(ang)
                y[bi, t, ..., a] = c * x[bi, t, ..., a] - s * x[bi, t, ..., b]
                y[bi, t, ..., b] = s * x[bi, t, ..., a] + c * x[bi, t, ..., b]
    return y


@pytest.mark.parametrize("layout", ["halves", "interleaved"])
def test_rope_matches_numpy(layout):
    x = randn((2, 3, 2, 6), seed=0)
    pos = np.array([[0, 1, 2], [7, 3, 11]])
    y = apply_rope(x, jnp.asarray(pos), base=100.0, layout=layout)
    np.testing.assert_allclose(y, np_rope(x, pos, 100.0, layout), atol=1e-5)
    # A rotation: norms of each pair and of the vector are preserved.
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_rope_relative_property():
    # <R_m q, R_n k> depends only on n - m.
    q = randn((1, 1, 1, 8), seed=0)
    k = randn((1, 1, 1, 8), seed=1)

    def dot(m, n, layout):
        rq = apply_rope(q, jnp.array([[m]]), layout=layout)
        rk = apply_rope(k, jnp.array([[n]]), layout=layout)
        return float(jnp.sum(rq * rk))

    for layout in ("halves", "interleaved"):
        np.testing.assert_allclose(dot(0, 3, layout), dot(10, 13, layout), rtol=1e-4)
        np.testing.assert_allclose(dot(5, 2, layout), dot(105, 102, layout), rtol=1e-4)
        assert abs(dot(0, 3, layout) - dot(0, 4, layout)) > 1e-3


def test_rope_dtype_default_positions_and_errors():
    x = jnp.ones((1, 4, 2, 8), jnp.bfloat16)
    y = apply_rope(x)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y[:, 0], np.float32), 1.0)
    y3 = apply_rope(jnp.ones((1, 4, 8)), jnp.arange(4))  # [B, T, D] also works
    np.testing.assert_allclose(y3, apply_rope(jnp.ones((1, 4, 1, 8)))[:, :, 0], atol=1e-6)
    with pytest.raises(ValueError, match="even"):
        apply_rope(jnp.ones((1, 2, 1, 5)))
    with pytest.raises(ValueError, match="positions"):
        apply_rope(jnp.ones((1, 2, 1, 4)), jnp.arange(3))
    with pytest.raises(ValueError, match="layout"):
        apply_rope(jnp.ones((1, 2, 1, 4)), layout="bad")


# ----------------------------------------------------------------------------- ALiBi


def test_alibi_slopes():
    np.testing.assert_allclose(alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)])
    # 6 heads: 4 power-of-two slopes, then every other slope of 8 heads.
    np.testing.assert_allclose(alibi_slopes(6), [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8,
                                                 2 ** -1, 2 ** -3])
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)


def test_alibi_bias_values_and_offset():
    b = np.asarray(alibi_bias(2, 3))
    assert b.shape == (2, 3, 3)
    slopes = np.asarray(alibi_slopes(2))
    i, j = np.meshgrid(np.arange(3), np.arange(3), indexing="ij")
    np.testing.assert_allclose(b, -slopes[:, None, None] * np.abs(i - j)[None])
    # Decoding: one query at the last of 4 positions -> m (j - 3).
    np.testing.assert_allclose(alibi_bias(2, 1, 4)[:, 0], slopes[:, None] * (np.arange(4) - 3))
    per_row = alibi_bias(2, 1, 4, offset=jnp.array([3, 1]))
    assert per_row.shape == (2, 2, 1, 4)
    np.testing.assert_allclose(per_row[1, :, 0], -slopes[:, None] * np.abs(np.arange(4) - 1))

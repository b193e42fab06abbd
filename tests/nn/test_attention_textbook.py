"""Issue #20 items 2 and 8 against the sources: parameter-free self-attention
(Bishop (12.5)-(12.6); J&M (9.30)-(9.33); MEDL (7.23)), single-head attention without an
output matrix (MEDL (7.24)), J&M Fig. 9.17's N = 5 causal mask, and sliding-window (local)
attention, each against a numpy loop over the source's equation."""

import jax
import numpy as np
import pytest

import seqjax
from seqjax.nn.attention import (
    MultiHeadAttention,
    dot_product_attention,
    dot_product_attention_with_weights,
    simple_self_attention,
    simple_self_attention_with_weights,
)
from seqjax.nn.masks import causal_mask, sliding_window_mask


def randn(shape, seed=0, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def softmax(s):
    e = np.exp(s - s.max())
    return e / e.sum()


# ============================================================================ Softmax[XXᵀ]X


def test_simple_self_attention_is_bishop_12_6_row_by_row():
    # Bishop (12.5): a_nm = exp(x_nᵀx_m) / Σ_m' exp(x_nᵀx_m'); (12.6): Y = Softmax[XXᵀ] X.
    x = randn((2, 4, 3), 1)
    y, a = simple_self_attention_with_weights(x)
    for b in range(2):
        for n in range(4):
            a_n = softmax(np.array([x[b, n] @ x[b, m] for m in range(4)], np.float64))
            np.testing.assert_allclose(a[b, n], a_n, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(y[b, n], a_n @ x[b], rtol=1e-5, atol=1e-5)
    # Nothing is learned: the same function on one unbatched sequence, no parameters at all.
    np.testing.assert_allclose(simple_self_attention(x[1]), y[1], rtol=1e-6)


def test_simple_self_attention_causal_is_jm_9_30_to_9_33_and_medl_7_23():
    # J&M (9.30) score(x_i, x_j) = x_i·x_j; (9.31)-(9.32) α_ij = softmax over k ≤ i;
    # (9.33) y_i = Σ_{j≤i} α_ij x_j. MEDL (7.23) is the same sum with z_q = z_k = v = x.
    x = randn((5, 3), 2)
    y, a = simple_self_attention_with_weights(x, is_causal=True)
    for i in range(5):
        scores = np.array([x[i] @ x[j] for j in range(i + 1)], np.float64)
        alpha = softmax(scores)
        np.testing.assert_allclose(a[i, : i + 1], alpha, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(a[i, i + 1:], 0.0)
        np.testing.assert_allclose(y[i], sum(alpha[j] * x[j] for j in range(i + 1)),
                                   rtol=1e-5, atol=1e-5)
    assert seqjax.nn.simple_self_attention is simple_self_attention
    with pytest.raises(ValueError, match="`mask` must broadcast"):
        simple_self_attention(x, mask=np.ones((4, 4), bool))
    with pytest.raises(ValueError, match="`x` must have rank"):
        simple_self_attention(x[0])


@pytest.mark.parametrize("is_causal", [False, True])
def test_simple_self_attention_returns_y_and_with_weights_the_pair(is_causal):
    # The call returns Y; simple_self_attention_with_weights returns (Y, A) with the same Y;
    # the retired return_weights= is a TypeError naming the pair's function.
    x = randn((2, 4, 3), 3)
    y, a = simple_self_attention_with_weights(x, is_causal=is_causal)
    np.testing.assert_array_equal(simple_self_attention(x, is_causal=is_causal), y)
    np.testing.assert_allclose(y, a @ x, rtol=1e-5, atol=1e-6)
    assert seqjax.nn.simple_self_attention_with_weights is simple_self_attention_with_weights
    with pytest.raises(TypeError, match="simple_self_attention_with_weights"):
        simple_self_attention(x, is_causal=is_causal, return_weights=True)


# ============================================================================ MEDL (7.24)


def test_single_head_without_output_matrix_is_medl_7_24():
    # u_t = Σ_{τ≤t} α_τ W_v x_τ, α_τ ∝ exp s(W_q x_t, W_k x_τ), W_q, W_k, W_v all p × p, no
    # biases; s the scaled dot product (MEDL §7.4: "typical" to divide by √m), or the plain one.
    p_dim, t = 4, 5
    x = randn((2, t, p_dim), 3)
    for scale in (None, 1.0):
        sha = MultiHeadAttention(num_heads=1, use_bias=False, output_projection=False,
                                 scale=scale)
        params = sha.init(jax.random.PRNGKey(0), x, is_causal=True)
        assert sorted(params["params"]) == ["key", "query", "value"]  # no W_o
        w = {n: np.asarray(params["params"][n]["kernel"][:, 0, :], np.float64).T  # MEDL's W
             for n in ("query", "key", "value")}
        assert all(m.shape == (p_dim, p_dim) for m in w.values())
        u = sha.apply(params, x, is_causal=True)
        assert u.shape == (2, t, p_dim)
        c = 1.0 / np.sqrt(p_dim) if scale is None else scale
        for b in range(2):
            for s in range(t):
                zq = w["query"] @ x[b, s]
                alpha = softmax(np.array([c * zq @ (w["key"] @ x[b, r]) for r in range(s + 1)]))
                want = sum(alpha[r] * (w["value"] @ x[b, r]) for r in range(s + 1))
                np.testing.assert_allclose(u[b, s], want, rtol=1e-5, atol=1e-5)
    # Several heads without W_o: the concatenated heads, [B, T, H·d].
    mh = MultiHeadAttention(num_heads=2, head_dim=3, output_projection=False)
    assert mh.init_with_output(jax.random.PRNGKey(0), x)[0].shape == (2, t, 6)
    with pytest.raises(ValueError, match="output_projection=False"):
        MultiHeadAttention(num_heads=1, out_features=8, output_projection=False).init(
            jax.random.PRNGKey(0), x)


# ============================================================================ J&M Fig. 9.17


def test_jm_figure_9_17_causal_mask_n5():
    # J&M Fig. 9.17: the N × N matrix QKᵀ with q_i·k_j on and below the diagonal and −∞ above
    # (N = 5). The figure, row by row ("qk" = kept, "-inf" = masked):
    figure = [
        ["qk", "-inf", "-inf", "-inf", "-inf"],
        ["qk", "qk", "-inf", "-inf", "-inf"],
        ["qk", "qk", "qk", "-inf", "-inf"],
        ["qk", "qk", "qk", "qk", "-inf"],
        ["qk", "qk", "qk", "qk", "qk"],
    ]
    keep = np.array([[c == "qk" for c in row] for row in figure])
    np.testing.assert_array_equal(causal_mask(5), keep)
    q, k = randn((5, 4), 4), randn((5, 4), 5)
    qk = q @ k.T
    masked = np.where(causal_mask(5), qk, -np.inf)
    for i in range(5):
        for j in range(5):
            assert masked[i, j] == (qk[i, j] if j <= i else -np.inf)
    # J&M Fig. 9.17: the softmax weights are lower-triangular, rows sum to 1, α_11 = 1.
    _, w = dot_product_attention_with_weights(q[None, :, None], k[None, :, None],
                                              k[None, :, None], is_causal=True, scale=1.0)
    w = np.asarray(w[0, 0])
    np.testing.assert_array_equal(w[~keep], 0.0)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
    assert w[0, 0] == 1.0


# ============================================================================ sliding window


def np_window(q_len, kv_len, w, offset):
    return np.array([[offset + i - w < j <= offset + i for j in range(kv_len)]
                     for i in range(q_len)])


def test_sliding_window_mask_convention():
    # i − w < j ≤ i + offset (offset: absolute position of query 0), per row under jit too.
    for q_len, kv_len, w, off in ((6, 6, 1, 0), (6, 6, 3, 0), (2, 7, 3, 4), (4, 3, 2, 0),
                                  (5, 5, 9, 0)):
        np.testing.assert_array_equal(sliding_window_mask(q_len, kv_len, window=w, offset=off),
                                      np_window(q_len, kv_len, w, off))
    np.testing.assert_array_equal(sliding_window_mask(5, window=5), causal_mask(5))
    np.testing.assert_array_equal(sliding_window_mask(5, window=1), np.eye(5, dtype=bool))
    offsets = np.array([0, 3])
    per_row = jax.jit(lambda o: sliding_window_mask(2, 6, window=2, offset=o))(offsets)
    assert per_row.shape == (2, 1, 2, 6)
    for b in range(2):
        np.testing.assert_array_equal(per_row[b, 0], np_window(2, 6, 2, offsets[b]))
    assert seqjax.nn.sliding_window_mask is sliding_window_mask
    for bad in (0, -2, 1.5, None):
        with pytest.raises(ValueError, match="`window` must be a positive int"):
            sliding_window_mask(3, window=bad)


def test_dot_product_attention_window_matches_numpy():
    # y_i = Σ_{i−w<j≤i} softmax_j(q_i·k_j / √d) v_j, per head (GQA: head h reads kv head h//2).
    q, k, v = randn((2, 7, 4, 3), 6), randn((2, 7, 2, 3), 7), randn((2, 7, 2, 3), 8)
    out = dot_product_attention(q, k, v, window=3)
    for b in range(2):
        for h in range(4):
            for i in range(7):
                js = [j for j in range(7) if i - 3 < j <= i]
                a = softmax(np.array([q[b, i, h] @ k[b, j, h // 2] for j in js]) / np.sqrt(3))
                want = sum(a[n] * v[b, j, h // 2] for n, j in enumerate(js))
                np.testing.assert_allclose(out[b, i, h], want, rtol=1e-5, atol=1e-5)
    # A window wider than the sequence is causal attention.
    np.testing.assert_allclose(dot_product_attention(q, k, v, window=50),
                               dot_product_attention(q, k, v, is_causal=True), rtol=1e-6)


def test_mha_window_with_kv_cache_applies_to_absolute_positions():
    # Decoding token by token after a prefill (mixed prompt lengths) with window = 3 equals
    # the full windowed pass: the window slides over absolute positions, not cache slots
    # of one call.
    mha = MultiHeadAttention(num_heads=2, num_kv_heads=1, head_dim=4, use_rope=True, window=3)
    x = randn((2, 8, 8), 9)
    params = mha.init(jax.random.PRNGKey(1), x)
    full = mha.apply(params, x)  # window implies causal
    np.testing.assert_allclose(full, mha.apply(params, x, is_causal=True), rtol=1e-6)
    wide = mha.clone(window=0).apply(params, x, is_causal=True)  # 0: no window
    assert not np.allclose(full[:, 3:], wide[:, 3:], atol=1e-4)  # the window does cut keys
    step = jax.jit(lambda xt, c, n: mha.apply(params, xt, c, lengths=n, method="decode"))
    prompt_lens = np.array([2, 4], np.int32)
    prompt = np.where(np.arange(4)[None, :, None] < prompt_lens[:, None, None], x[:, :4], 50.0)
    y, cache = step(prompt.astype(np.float32), mha.init_cache(2, 10), prompt_lens)
    for b in range(2):
        np.testing.assert_allclose(y[b, : prompt_lens[b]], full[b, : prompt_lens[b]],
                                   rtol=1e-5, atol=1e-5)
    pos = prompt_lens.copy()
    for _ in range(4):
        xt = np.stack([x[b, pos[b]: pos[b] + 1] for b in range(2)])
        y, cache = step(xt, cache, np.ones(2, np.int32))
        for b in range(2):
            np.testing.assert_allclose(y[b, 0], full[b, pos[b]], rtol=1e-5, atol=1e-5)
        pos += 1
    with pytest.raises(ValueError, match="`window` \\(sliding-window attention\\) is for self"):
        mha.apply(params, x, x[:, :5])
    with pytest.raises(ValueError, match="`window` of MultiHeadAttention must be an int >= 0"):
        mha.clone(window=-1).apply(params, x)
    with pytest.raises(TypeError, match="`window=None` of MultiHeadAttention is spelled "
                                        "`window=0`"):
        mha.clone(window=None).apply(params, x)

"""Tests for seqjax.nn.attention: numpy references of the textbook equations, properties,
cached decoding, errors, and parity with PyTorch."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqjax.nn.attention import (
    Attention,
    MultiHeadAttention,
    additive_score,
    concat_score,
    dot_product_attention,
    dot_product_attention_with_weights,
    dot_score,
    general_score,
    masked_softmax,
    scaled_dot_score,
)
from seqjax.nn.positional import apply_rope


def randn(shape, seed=0, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def np_masked_softmax(s, mask=None):
    s = np.asarray(s, np.float64)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    d = e.sum(-1, keepdims=True)
    return e / np.where(d == 0, 1.0, d)


def np_mha(xq, xkv, p, mask=None, qk_norm=False, rope=None):
    """Multi-head attention, one head at a time (Bishop (12.15)-(12.19); MEDL (7.25)-(7.26)).

    ``p``: Flax params (kernels ``[D, heads, d]``, out ``[H, d, D']``); head h uses kv head
    ``h // (H / G)``. ``mask``: bool broadcastable to [B, H, Q, K].
    """
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), p)

    def proj(x, name):
        y = np.einsum("btd,dhk->bthk", x, p[name]["kernel"])
        return y + p[name]["bias"] if "bias" in p[name] else y

    q, k, v = proj(xq, "query"), proj(xkv, "key"), proj(xkv, "value")
    if qk_norm:
        q = q / np.sqrt((q ** 2).mean(-1, keepdims=True) + 1e-6) * p["query_norm"]["scale"]
        k = k / np.sqrt((k ** 2).mean(-1, keepdims=True) + 1e-6) * p["key_norm"]["scale"]
    if rope is not None:
        q, k = rope(q), rope(k)
    h, g, d = q.shape[2], k.shape[2], q.shape[3]
    b, nq, nk = q.shape[0], q.shape[1], k.shape[1]
    mask = np.ones((b, h, nq, nk), bool) if mask is None else np.broadcast_to(mask, (b, h, nq, nk))
    heads, weights = [], []
    for i in range(h):
        j = i // (h // g)
        a = np_masked_softmax(np.einsum("bqd,bkd->bqk", q[:, :, i], k[:, :, j]) / np.sqrt(d),
                              mask[:, i])
        weights.append(a)
        heads.append(np.einsum("bqk,bkd->bqd", a, v[:, :, j]))
    concat = np.stack(heads, axis=2)  # [B, Q, H, d]
    out = np.einsum("bqhd,hdo->bqo", concat, p["out"]["kernel"])
    if "bias" in p["out"]:
        out = out + p["out"]["bias"]
    return out, np.stack(weights, axis=1)


def init(module, *args, seed=0, **kwargs):
    """Random parameters of the module's shapes (eval_shape: no compilation of the initialisers).

    Biases and norm gains are random too, so that every parameter is exercised.
    """
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *args, **kwargs))
    leaves, tree = jax.tree_util.tree_flatten(shapes["params"])
    return jax.tree_util.tree_unflatten(
        tree, [randn(s.shape, seed + i, 0.5) for i, s in enumerate(leaves)])


# ============================================================================ multi-head attention


def test_mha_matches_numpy_reference_gqa_mask_qknorm():
    mha = MultiHeadAttention(num_heads=4, num_kv_heads=2, head_dim=3, qk_norm=True)
    x = randn((2, 5, 6))
    mask = np.random.default_rng(1).random((2, 1, 5, 5)) < 0.6
    mask[0, 0, 2] = False  # a fully masked query row
    params = init(mha, x)
    out, w = jax.jit(lambda p, x, m: mha.apply({"params": p}, x, mask=m, method="with_weights"))(
        params, x, mask)
    ref, ref_w = np_mha(x, x, params, mask, qk_norm=True)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    assert w.shape == (2, 4, 5, 5) and w.dtype == jnp.float32
    np.testing.assert_array_equal(w[0, :, 2], 0.0)
    # Parameter names and shapes (checkpoint compatibility).
    shapes = jax.tree_util.tree_map(jnp.shape, params)
    assert shapes == {
        "query": {"kernel": (6, 4, 3), "bias": (4, 3)},
        "key": {"kernel": (6, 2, 3), "bias": (2, 3)},
        "value": {"kernel": (6, 2, 3), "bias": (2, 3)},
        "out": {"kernel": (4, 3, 6), "bias": (6,)},
        "query_norm": {"scale": (3,)},
        "key_norm": {"scale": (3,)},
    }


def test_mha_cross_attention_rope_and_kv_lengths_match_numpy():
    mha = MultiHeadAttention(num_heads=2, out_features=3, use_rope=True)
    xq, xkv = randn((2, 3, 4), 1), randn((2, 5, 7), 2)
    params = init(mha, xq, xkv)
    kv_len = np.array([5, 2])
    pos_q = np.array([[4, 5, 6], [0, 1, 2]])
    out = jax.jit(lambda p, a, b, n, pq: mha.apply({"params": p}, a, b, kv_lengths=n,
                                                    positions=pq))(params, xq, xkv, kv_len, pos_q)
    key_valid = np.arange(5)[None, :] < kv_len[:, None]
    calls = iter([pos_q, np.broadcast_to(np.arange(5), (2, 5))])
    ref, _ = np_mha(xq, xkv, params, key_valid[:, None, None, :],
                    rope=lambda t: np.asarray(apply_rope(t.astype(np.float32), next(calls)),
                                              np.float64))
    assert out.shape == (2, 3, 3)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_sum_over_heads_equals_concat_then_project():
    # MEDL (7.25)-(7.26) / Bishop Ex. 12.5: Y = sum_h softmax(Q_h K_h^T / sqrt(d)) X W^(h),
    # W^(h) = W_h^(v) W_h^(o) of rank <= d; equal to Concat[H_1..H_H] W^(o).
    mha = MultiHeadAttention(num_heads=3, head_dim=2, use_bias=False)
    x = randn((1, 4, 6))
    params = init(mha, x)
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    xd = x.astype(np.float64)[0]
    y = np.zeros((4, 6))
    for h in range(3):
        q, k = xd @ p["query"]["kernel"][:, h], xd @ p["key"]["kernel"][:, h]
        w_h = p["value"]["kernel"][:, h] @ p["out"]["kernel"][h]  # [D, D]
        assert np.linalg.matrix_rank(w_h) <= 2
        y += np_masked_softmax(q @ k.T / np.sqrt(2)) @ xd @ w_h
    np.testing.assert_allclose(jax.jit(mha.apply)({"params": params}, x)[0], y, rtol=1e-5,
                               atol=1e-6)


def test_slides_worked_example_112_96():
    # q.k1 = 112, q.k2 = 96, d_k = 64 -> 14, 12 -> softmax 0.88 / 0.12.
    q = np.ones((1, 1, 1, 64), np.float32)
    k = np.stack([np.full(64, 1.75), np.full(64, 1.5)]).astype(np.float32)[None, :, None]
    _, w = dot_product_attention_with_weights(q, k, k)
    np.testing.assert_allclose(w[0, 0, 0], [0.8808, 0.1192], atol=1e-4)
    np.testing.assert_allclose(scaled_dot_score(q[0, :, 0], k[0, :, 0]), [[14.0, 12.0]])


def test_causality_outputs_and_gradients():
    mha = MultiHeadAttention(num_heads=2, use_rope=True)
    x = randn((1, 6, 4))
    params = init(mha, x)
    f = jax.jit(lambda x: mha.apply({"params": params}, x, is_causal=True))
    x2 = x.copy()
    x2[:, 4:] += 10.0
    np.testing.assert_allclose(f(x)[:, :4], f(x2)[:, :4], rtol=1e-6, atol=1e-6)
    assert not np.allclose(f(x)[:, 4:], f(x2)[:, 4:])
    grad = jax.jit(jax.grad(lambda x: f(x)[0, 2].sum()))(x)
    np.testing.assert_array_equal(grad[0, 3:], 0.0)
    assert np.abs(grad[0, :3]).sum() > 0


@pytest.mark.parametrize("variant", ["plain", "rope", "causal"])
def test_permutation_equivariance_bishop_ex_12_7(variant):
    mha = MultiHeadAttention(num_heads=2, use_rope=variant == "rope")
    x = randn((1, 5, 4))
    params = init(mha, x)
    f = jax.jit(lambda x: mha.apply({"params": params}, x, is_causal=variant == "causal"))
    perm = np.array([3, 0, 4, 1, 2])
    equivariant = np.allclose(f(x[:, perm]), f(x)[:, perm], rtol=1e-5, atol=1e-5)
    assert equivariant == (variant == "plain")


def _mixed_length_decode(mha, params, x, prompt_lens, max_len, schedule):
    """Prefill right-padded prompts, then decode chunks of `schedule` tokens per step."""
    b = x.shape[0]
    p0 = int(prompt_lens.max())
    pad = np.arange(p0)[None, :, None] >= prompt_lens[:, None, None]
    prompt = np.where(pad, 99.0, x[:, :p0]).astype(np.float32)  # junk in the padding
    step = jax.jit(lambda p, xt, c, n: mha.apply({"params": p}, xt, c, lengths=n, method="decode"))
    cache = mha.init_cache(b, max_len)
    y, cache = step(params, prompt, cache, prompt_lens)
    outs = [[y[i, : prompt_lens[i]]] for i in range(b)]
    pos = prompt_lens.copy()
    for n in schedule:
        xt = np.stack([x[i, pos[i]: pos[i] + n] for i in range(b)])
        y, cache = step(params, xt, cache, np.full(b, n, np.int32))
        for i in range(b):
            outs[i].append(y[i])
        pos += n
    return [np.concatenate(o) for o in outs], cache


def test_cached_decoding_equals_full_causal_pass_mixed_lengths():
    mha = MultiHeadAttention(num_heads=4, num_kv_heads=2, head_dim=4, use_rope=True,
                             qk_norm=True)
    x = randn((3, 9, 8))
    params = init(mha, x)
    full = jax.jit(lambda p, x: mha.apply({"params": p}, x, is_causal=True))(params, x)
    prompt_lens = np.array([2, 4, 3], np.int32)
    outs, cache = _mixed_length_decode(mha, params, x, prompt_lens, 12, [1, 1, 2, 1])
    for i in range(3):
        n = len(outs[i])
        assert n == prompt_lens[i] + 5
        np.testing.assert_allclose(outs[i], full[i, :n], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cache.lengths, prompt_lens + 5)


def test_cache_init_update_and_errors():
    mha = MultiHeadAttention(num_heads=4, num_kv_heads=1, head_dim=2)
    cache = mha.init_cache(2, 5)  # unbound: works because head_dim is set
    assert cache.k.shape == (2, 5, 1, 2) and cache.lengths.dtype == jnp.int32
    assert cache.k_BxSxHkvxD is cache.k and cache.max_len == 5
    x = randn((2, 3, 8))
    params = init(mha, x)
    bound = MultiHeadAttention(num_heads=2).apply({"params": init(MultiHeadAttention(2), x)},
                                                  2, 7, method="init_cache")
    assert bound.k.shape == (2, 7, 2, 4)
    with pytest.raises(ValueError, match="head_dim"):
        MultiHeadAttention(num_heads=2).init_cache(2, 7)
    c = cache.update(np.ones((2, 3, 1, 2)), np.ones((2, 3, 1, 2)), np.array([3, 1]))
    np.testing.assert_array_equal(c.lengths, [3, 1])
    c = c.update(np.full((2, 1, 1, 2), 2.0), np.full((2, 1, 1, 2), 2.0))
    np.testing.assert_array_equal(c.k[1, :, 0, 0], [1, 2, 1, 0, 0])  # row 1 wrote at offset 1
    with pytest.raises(ValueError, match="overflow"):
        c.update(np.ones((2, 2, 1, 2)), np.ones((2, 2, 1, 2)))
    with pytest.raises(ValueError, match="overflow"):
        mha.apply({"params": params}, x, c, method="decode")
    with pytest.raises(ValueError, match="new keys"):
        cache.update(np.ones((2, 1, 2, 2)), np.ones((2, 1, 2, 2)))
    # Under jit the overflow cannot be seen: the extra tokens are dropped, never written
    # over earlier entries, and the overflowing row's last slot is NaN (seqjax._traced_checks).
    full = jax.jit(lambda c, k: c.update(k, k))(c, np.full((2, 3, 1, 2), 5.0))
    np.testing.assert_array_equal(full.lengths, [5, 5])
    np.testing.assert_array_equal(full.k[0, :, 0, 0], [1, 1, 1, 2, np.nan])
    np.testing.assert_array_equal(full.k[1, :, 0, 0], [1, 2, 5, 5, 5])  # fits exactly


def test_padding_invariance_self_and_cross():
    mha = MultiHeadAttention(num_heads=2)
    x = randn((2, 5, 4))
    params = init(mha, x)
    lengths = np.array([3, 5], np.int32)
    f = jax.jit(lambda x, n: mha.apply({"params": params}, x, lengths=n, is_causal=False))
    x2 = x.copy()
    x2[0, 3:] = 123.0
    y, y2 = f(x, lengths), f(x2, lengths)
    np.testing.assert_allclose(y, y2, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y[0, 3:], 0.0)  # padded query rows output zeros
    # Each sequence alone gives the same result as inside the padded batch.
    alone = jax.jit(lambda x: mha.apply({"params": params}, x))(x[:1, :3])
    np.testing.assert_allclose(y[:1, :3], alone, rtol=1e-5, atol=1e-6)
    # Cross-attention: padded encoder states do not matter.
    g = jax.jit(lambda q, kv: mha.apply({"params": params}, q, kv, kv_lengths=lengths))
    np.testing.assert_allclose(g(x, x), g(x, x2), rtol=1e-6, atol=1e-6)


def test_bf16_close_to_fp32():
    x = randn((2, 6, 8))
    mha32 = MultiHeadAttention(num_heads=2)
    mha16 = MultiHeadAttention(num_heads=2, dtype=jnp.bfloat16)
    params = init(mha32, x)
    y32 = jax.jit(lambda p, x: mha32.apply({"params": p}, x, is_causal=True))(params, x)
    y16 = jax.jit(lambda p, x: mha16.apply({"params": p}, x, is_causal=True))(params, x)
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float32), y32, rtol=5e-2, atol=5e-2)


def test_dropout_on_weights():
    mha = MultiHeadAttention(num_heads=2, dropout_rate=0.5)
    x = randn((1, 4, 4))
    params = init(mha, x)
    f = jax.jit(lambda x, key, det: mha.apply({"params": params}, x, deterministic=det,
                                              rngs={"dropout": key}), static_argnums=2)
    base = jax.jit(MultiHeadAttention(num_heads=2).apply)({"params": params}, x)
    np.testing.assert_allclose(f(x, jax.random.PRNGKey(0), True), base, rtol=1e-6)
    a, b = f(x, jax.random.PRNGKey(0), False), f(x, jax.random.PRNGKey(1), False)
    assert not np.allclose(a, b) and not np.allclose(a, base)


def test_mha_jit_vmap_grad():
    mha = MultiHeadAttention(num_heads=2, num_kv_heads=1)
    x = randn((3, 4, 4))
    params = init(mha, x)
    f = lambda p, x: mha.apply({"params": p}, x, is_causal=True)
    batched = jax.jit(f)(params, x)
    per_row = jax.jit(jax.vmap(lambda xi: f(params, xi[None])[0]))(x)
    np.testing.assert_allclose(batched, per_row, rtol=1e-5, atol=1e-6)
    grads = jax.jit(jax.grad(lambda p: jnp.sum(f(p, x) ** 2)))(params)
    assert all(np.isfinite(g).all() and np.abs(g).sum() > 0
               for g in jax.tree_util.tree_leaves(grads))


def test_mha_errors():
    mha = MultiHeadAttention(num_heads=3)
    with pytest.raises(ValueError, match="num_heads=3"):
        mha.init(jax.random.PRNGKey(0), jnp.ones((1, 2, 4)))
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiHeadAttention(num_heads=4, num_kv_heads=3).init(jax.random.PRNGKey(0),
                                                             jnp.ones((1, 2, 8)))
    with pytest.raises(ValueError, match="inputs_q"):
        MultiHeadAttention(num_heads=2).init(jax.random.PRNGKey(0), jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="inputs_kv"):
        MultiHeadAttention(num_heads=2).init(jax.random.PRNGKey(0), jnp.ones((1, 2, 4)),
                                             jnp.ones((2, 2, 4)))


# ============================================================================ dot_product_attention


def _qkv(b=2, q=5, k=6, h=4, g=2, d=3, seed=0):
    return randn((b, q, h, d), seed), randn((b, k, g, d), seed + 1), randn((b, k, g, d), seed + 2)


def test_fused_path_matches_jax_nn_and_reference():
    # Grouped GQA path == jax.nn.dot_product_attention (xla) == the plain reference, with mask,
    # bias, causal masking and a custom scale.
    q, k, v = _qkv()
    mask = np.random.default_rng(3).random((2, 1, 5, 6)) < 0.8
    mask[..., 0] = True  # jax.nn gives uniform weights (not zeros) to fully masked rows
    bias = randn((1, 4, 5, 6), 4)
    for kw in ({}, {"mask": mask}, {"bias": bias, "is_causal": True},
               {"mask": mask, "bias": bias, "scale": 0.3}):
        fast = dot_product_attention(q, k, v, implementation="xla", **kw)
        jx = jax.jit(lambda q, k, v, kw=kw: jax.nn.dot_product_attention(
            q, k, v, implementation="xla", **kw))(q, k, v)
        np.testing.assert_allclose(fast, jx, rtol=1e-5, atol=1e-6)
    kw = {"mask": mask, "is_causal": True, "scale": 0.3}
    attend = lambda q, k, v, bias, impl: dot_product_attention(q, k, v, bias=bias,
                                                               implementation=impl, **kw)
    np.testing.assert_allclose(attend(q, k, v, bias, "reference"), attend(q, k, v, bias, "xla"),
                               rtol=1e-5, atol=1e-6)
    # The fused path's hand-written backward pass (q, k, v and a learned bias) == autodiff.
    grad = lambda impl: jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(attend(*a, impl))),
                                         argnums=(0, 1, 2, 3)))(q, k, v, bias)
    for a, b in zip(grad("xla"), grad("reference")):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_chunked_causal_path():
    # Causal attention in query chunks that skip invisible keys == numpy; gradients == reference.
    q, k, v = _qkv(q=7, k=7)
    jaxpr = str(jax.make_jaxpr(lambda q: dot_product_attention(q, k, v, is_causal=True,
                                                               query_chunk=2))(q))
    assert jaxpr.count("dot_general") == 8  # 4 chunks x (scores, values)
    for qn, kn in ((7, 7), (7, 4), (3, 7)):  # causal is top-left aligned for Q != K
        q, k, v = _qkv(q=qn, k=kn, seed=5)
        ref, _ = np_mha_core(q, k, v, np.tril(np.ones((qn, kn), bool)))
        np.testing.assert_allclose(dot_product_attention(q, k, v, is_causal=True, query_chunk=2),
                                   ref, rtol=1e-5, atol=1e-6)
    q, k, v = _qkv(q=7, k=7, seed=6)
    loss = lambda impl: jax.jit(jax.grad(lambda q, k, v: jnp.sum(dot_product_attention(
        q, k, v, is_causal=True, implementation=impl, query_chunk=2) ** 2),
        argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(loss("xla"), loss("reference")):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_long_noncausal_scan_path():
    # Long non-causal attention loops over query chunks and recomputes the scores in its
    # backward pass: == reference with GQA, a key-padding mask with an empty row, and a
    # query count that is not a multiple of the chunk.
    q, k, v = _qkv(q=8, k=6, d=5, seed=7)
    mask = np.ones((2, 1, 1, 6), bool)
    mask[0, ..., 3:] = False
    mask[1] = False
    attend = lambda impl: lambda q, k, v: dot_product_attention(  # noqa: E731
        q, k, v, mask=mask, implementation=impl, scan_min_keys=4, query_chunk=3)
    assert "scan" in str(jax.make_jaxpr(attend("xla"))(q, k, v))
    out = attend("xla")(q, k, v)
    np.testing.assert_allclose(out, attend("reference")(q, k, v), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[1], 0.0)
    grad = lambda impl: jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(attend(impl)(*a))),
                                         argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(grad("xla"), grad("reference")):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_forward_in_fused_query_chunks_matches_reference():
    # Not differentiated, long blocks run in query chunks of `fused_rows` (additive mask,
    # keep/l for empty rows): == reference with GQA, masks with an empty row, and biases.
    q, k, v = _qkv(q=9, k=7, h=4, g=2, d=5, seed=21)
    rng = np.random.default_rng(21)
    mask = rng.random((2, 1, 9, 7)) < 0.6
    mask[0, 0, 3] = False
    bias = randn((1, 4, 9, 7), 22)
    f = lambda impl, **kw: dot_product_attention(  # noqa: E731
        q, k, v, implementation=impl, fused_rows=2, **kw)
    assert "concatenate" in str(jax.make_jaxpr(
        lambda q: dot_product_attention(q, k, v, fused_rows=2))(q))
    assert "concatenate" not in str(jax.make_jaxpr(lambda q: dot_product_attention(q, k, v))(q))
    for kw in ({}, {"mask": mask}, {"bias": bias}, {"mask": mask, "bias": bias}):
        out = f("xla", **kw)
        np.testing.assert_allclose(out, f("reference", **kw), rtol=1e-5, atol=1e-6)
        assert np.isfinite(out).all()
    np.testing.assert_array_equal(f("xla", mask=mask)[0, 3], 0.0)


def np_mha_core(q, k, v, mask):
    h, g = q.shape[2], k.shape[2]
    kk, vv = np.repeat(k, h // g, axis=2), np.repeat(v, h // g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) / np.sqrt(q.shape[-1])
    w = np_masked_softmax(s, mask)
    return np.einsum("bhqk,bkhd->bqhd", w, vv), w


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), density=st.floats(0.0, 1.0))
def test_weights_rows_sum_to_one_under_any_mask(seed, density):
    q, k, v = _qkv(b=1, q=4, k=5, h=2, g=1, seed=seed % 1000)
    mask = np.random.default_rng(seed).random((1, 2, 4, 5)) < density
    out, w = dot_product_attention_with_weights(q * 30, k, v, mask=mask)
    w = np.asarray(w)
    visible = mask.any(-1)
    np.testing.assert_allclose(w.sum(-1), visible.astype(np.float32), atol=1e-5)
    assert np.all((w >= 0) & (w <= 1))
    assert np.all(w[~mask] == 0)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("implementation", ["xla", "reference"])
def test_fully_masked_rows_are_zero_without_nan_also_in_gradients(implementation):
    q, k, v = _qkv(b=1, q=3, k=4, h=2, g=2)
    mask = np.ones((1, 1, 3, 4), bool)
    mask[:, :, 1] = False

    def f(q, k, v):
        return dot_product_attention(q, k, v, mask=mask, implementation=implementation)

    out = f(q, k, v)
    np.testing.assert_array_equal(out[:, 1], 0.0)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2)))(q, k, v)
    for g in grads:
        assert np.isfinite(g).all()
    np.testing.assert_array_equal(grads[0][:, 1], 0.0)


def test_bias_with_inf_rows_and_mask_edge_cases():
    # A bias may hold -inf: a row whose visible keys all carry -inf bias (the mask hides the
    # others), and a row that is -inf everywhere, are zero and finite in gradients, as in the
    # reference; masked keys never get weight, even when their scores are the largest.
    q, k, v = _qkv(b=1, q=3, k=4, h=2, g=2, seed=11)
    mask = np.ones((1, 1, 3, 4), bool)
    mask[..., 0, 2:] = False
    bias = np.zeros((1, 2, 3, 4), np.float32)
    bias[:, :, 0, :2] = -np.inf  # row 0: its only visible keys are -inf
    bias[:, :, 1] = -np.inf  # row 1: -inf everywhere
    for args in (dict(mask=mask, bias=bias), dict(bias=bias)):
        f = lambda impl, a=args: lambda q, k, v: dot_product_attention(  # noqa: E731
            q, k, v, implementation=impl, **a)
        out = f("xla")(q, k, v)
        np.testing.assert_allclose(out, f("reference")(q, k, v), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out[:, 1], 0.0)
        grads = jax.jit(jax.grad(lambda *a, f=f: jnp.sum(f("xla")(*a) ** 2),
                                 argnums=(0, 1, 2)))(q, k, v)
        for g in grads:
            assert np.isfinite(g).all()
    # Masked keys with huge scores: zero weight (the additive mask is exact in float32).
    k_big = np.asarray(k).copy()
    k_big[:, 2:] = 1e4 * np.sign(np.asarray(q)[:, :1, ::2]).repeat(2, axis=1)
    key_mask = np.array([True, True, False, False])[None, None, None]
    out = dot_product_attention(q, k_big, v, mask=key_mask)
    np.testing.assert_allclose(out, dot_product_attention(q[:, :], k_big[:, :2], v[:, :2]),
                               rtol=1e-5, atol=1e-6)


def test_masked_softmax_edge_cases():
    # Exercise 12.2: rows sum to 1 even with logits of +-1e4; -inf scores and fully masked rows
    # give zeros (and finite gradients), never NaN.
    s = np.array([[-np.inf, -np.inf, -np.inf], [1e4, -1e4, 0.0], [1.0, 2.0, 3.0]], np.float32)
    w = masked_softmax(s, np.array([True, True, False]))
    np.testing.assert_allclose(w, [[0, 0, 0], [1, 0, 0], [0.268941, 0.731059, 0]], atol=1e-6)
    g = jax.jit(jax.grad(lambda s: masked_softmax(s)[:, 0].sum()))(s)
    assert np.isfinite(g).all()


def test_dot_product_attention_bf16_float32_softmax_and_vmap():
    q, k, v = _qkv()
    out32 = dot_product_attention(q, k, v, is_causal=True)
    out16 = dot_product_attention(*(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)),
                                  is_causal=True)
    assert out16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=5e-2)
    # Large logits in bf16: softmax in float32 keeps rows normalised.
    _, w = dot_product_attention_with_weights(
        jnp.asarray(q * 100, jnp.bfloat16), jnp.asarray(k, jnp.bfloat16),
        jnp.asarray(v, jnp.bfloat16))
    assert w.dtype == jnp.float32
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    stacked = np.stack([q, q * 0.5])
    vm = jax.vmap(lambda q: dot_product_attention(q, k, v))(stacked)
    np.testing.assert_allclose(vm[1], dot_product_attention(q * 0.5, k, v), rtol=1e-5, atol=1e-6)


def test_dot_product_attention_errors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="cudnn"):
        dot_product_attention(q, k, v, implementation="cudnn")
    with pytest.raises(ValueError, match="implementation"):
        dot_product_attention(q, k, v, implementation="flash")
    with pytest.raises(ValueError, match="kv heads"):
        dot_product_attention(q, randn((2, 6, 3, 3)), randn((2, 6, 3, 3)))
    with pytest.raises(ValueError, match="head dim"):
        dot_product_attention(q, randn((2, 6, 2, 5)), v)
    with pytest.raises(ValueError, match="rank"):
        dot_product_attention(q[0], k, v)
    with pytest.raises(ValueError, match="mask"):
        dot_product_attention(q, k, v, mask=np.ones((2, 4, 5, 7), bool))
    with pytest.raises(TypeError, match="mask"):
        dot_product_attention(q, k, v, mask=np.ones((5, 6)))
    with pytest.raises(ValueError, match="dropout_rng"):
        dot_product_attention(q, k, v, dropout_rate=0.1)


def _calls(which):
    """``(plain(**kw), pair(), the pair's name)`` of one attention callable on one input."""
    if which == "MultiHeadAttention":
        mha, x = MultiHeadAttention(num_heads=2), randn((2, 5, 8), 3)
        params = mha.init(jax.random.PRNGKey(0), x)
        return (lambda **kw: mha.apply(params, x, is_causal=True, **kw),
                lambda: mha.apply(params, x, is_causal=True, method="with_weights"),
                "MultiHeadAttention.with_weights")
    q, k, v = _qkv()
    if which == "jit(partial(dot_product_attention))":  # as the notebooks call it
        plain = jax.jit(functools.partial(dot_product_attention, is_causal=True))
        return (lambda **kw: plain(q, k, v, **kw),
                lambda: jax.jit(functools.partial(dot_product_attention_with_weights,
                                                  is_causal=True))(q, k, v),
                "dot_product_attention_with_weights")
    return (lambda **kw: dot_product_attention(q, k, v, is_causal=True, **kw),
            lambda: dot_product_attention_with_weights(q, k, v, is_causal=True),
            "dot_product_attention_with_weights")


@pytest.mark.parametrize("which", ["dot_product_attention", "jit(partial(dot_product_attention))",
                                   "MultiHeadAttention"])
def test_the_call_returns_the_array_and_with_weights_the_pair(which):
    """The call returns ``out``; ``…with_weights`` returns ``(out, weights)`` with the same
    ``out``; the retired ``return_weights=`` is a TypeError naming the pair's callable."""
    plain, pair, name = _calls(which)
    out = plain()
    y, w = pair()
    # Equal up to rounding: writing the weights out takes the XLA kernel's weights path.
    np.testing.assert_allclose(out, y, rtol=1e-6, atol=1e-6)
    assert w.dtype == jnp.float32 and w.ndim == 4
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    with pytest.raises(TypeError, match=name):
        plain(return_weights=True)


# ============================================================================ scores and Attention


def test_score_functions_match_numpy():
    zq, zk = randn((2, 3, 4), 1), randn((2, 5, 4), 2)
    w = randn((4, 4), 3)
    wa, wb, ws = randn((4, 6), 4), randn((4, 6), 5), randn((6,), 6)
    dot = np.einsum("bqd,bkd->bqk", zq, zk)
    np.testing.assert_allclose(dot_score(zq, zk), dot, rtol=1e-5)
    np.testing.assert_allclose(scaled_dot_score(zq, zk), dot / 2.0, rtol=1e-5)
    np.testing.assert_allclose(general_score(zq, zk, w), np.einsum("bqi,ij,bkj->bqk", zq, w, zk),
                               rtol=1e-4, atol=1e-5)
    add = np.tanh((zq @ wa)[:, :, None] + (zk @ wb)[:, None]) @ ws
    np.testing.assert_allclose(additive_score(zq, zk, wa, wb, ws), add, rtol=1e-4, atol=1e-5)
    # concat: w^T tanh(W [z_q; z_k]) with the concatenation materialised.
    wc = np.concatenate([wa, wb])
    cat = np.concatenate([np.broadcast_to(zq[:, :, None], (2, 3, 5, 4)),
                          np.broadcast_to(zk[:, None], (2, 3, 5, 4))], -1)
    np.testing.assert_allclose(concat_score(zq, zk, wc, ws), np.tanh(cat @ wc) @ ws, rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(ValueError, match="m_q = m_k"):
        dot_score(zq, randn((2, 5, 3)))
    with pytest.raises(ValueError, match="w_s"):
        general_score(zq, zk, np.ones((3, 4)))


@pytest.mark.parametrize("score", ["dot", "scaled_dot", "general", "concat", "additive"])
def test_attention_module_weights_sum_to_one_and_respect_lengths(score):
    attn = Attention(score=score, hidden=5)
    s, enc = randn((2, 4), 1), randn((2, 6, 4), 2)
    vals = randn((2, 6, 3), 3)
    params = {"params": init(attn, s, enc, vals)} if score in ("general", "concat",
                                                                 "additive") else {}
    lengths = np.array([6, 2])
    ctx, w = jax.jit(lambda p, s, e, v, n: attn.apply(p, s, e, v, lengths=n))(
        params, s, enc, vals, lengths)
    assert ctx.shape == (2, 3) and w.shape == (2, 6)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(w[1, 2:], 0.0)
    np.testing.assert_allclose(ctx, np.einsum("bk,bkv->bv", w, vals), rtol=1e-5, atol=1e-6)
    # Reference scores for the same parameters.
    p = params.get("params", {})
    sq, ek = s[:, None], enc
    ref_s = {
        "dot": lambda: dot_score(sq, ek),
        "scaled_dot": lambda: dot_score(sq, ek) / 2.0,
        "general": lambda: general_score(sq, ek, p["kernel"]),
        "concat": lambda: concat_score(sq, ek, p["kernel"], p["v"]),
        "additive": lambda: additive_score(sq, ek, p["query_kernel"], p["key_kernel"], p["v"]),
    }[score]()[:, 0]
    mask = np.arange(6)[None] < lengths[:, None]
    np.testing.assert_allclose(w, np_masked_softmax(ref_s, mask), rtol=1e-4, atol=1e-6)


def test_attention_module_sequence_queries_and_errors():
    attn = Attention(score="general")
    q, enc = randn((2, 3, 4), 1), randn((2, 5, 6), 2)
    params = {"params": init(attn, q, enc)}
    mask = np.random.default_rng(0).random((2, 3, 5)) < 0.5
    mask[0, 0] = False
    ctx, w = attn.apply(params, q, enc, mask=mask)  # keys = values
    assert ctx.shape == (2, 3, 6) and w.shape == (2, 3, 5)
    np.testing.assert_allclose(w.sum(-1), mask.any(-1).astype(np.float32), atol=1e-6)
    with pytest.raises(ValueError, match="score"):
        Attention(score="cosine").init(jax.random.PRNGKey(0), q, enc)
    with pytest.raises(ValueError, match="batch"):
        attn.apply(params, q[:1], enc)
    with pytest.raises(ValueError, match="m_q = m_k"):
        Attention(score="dot").init(jax.random.PRNGKey(0), q, enc)


# ============================================================================ PyTorch parity


def test_parity_with_torch_multihead_attention():
    torch = pytest.importorskip("torch")
    d, h, b, t = 8, 2, 2, 5
    tm = torch.nn.MultiheadAttention(d, h, batch_first=True).double()
    with torch.no_grad():
        tm.in_proj_bias.normal_()
        tm.out_proj.bias.normal_()
    w_in = tm.in_proj_weight.detach().numpy()
    b_in = tm.in_proj_bias.detach().numpy()
    params = {
        name: {"kernel": w_in[i * d:(i + 1) * d].T.reshape(d, h, d // h),
               "bias": b_in[i * d:(i + 1) * d].reshape(h, d // h)}
        for i, name in enumerate(["query", "key", "value"])
    }
    params["out"] = {"kernel": tm.out_proj.weight.detach().numpy().T.reshape(h, d // h, d),
                     "bias": tm.out_proj.bias.detach().numpy()}
    params = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32), params)
    x = randn((b, t, d))
    lengths = np.array([5, 3])
    causal = np.triu(np.ones((t, t), bool), 1)  # torch: True = NOT allowed
    pad = np.arange(t)[None] >= lengths[:, None]
    ref, ref_w = tm(*(torch.tensor(x, dtype=torch.float64),) * 3, attn_mask=torch.tensor(causal),
                    key_padding_mask=torch.tensor(pad), average_attn_weights=False)
    mha = MultiHeadAttention(num_heads=h)
    out, w = jax.jit(lambda p, x, m: mha.apply({"params": p}, x, is_causal=True, mask=m,
                                               method="with_weights"))(
        params, x, ~pad[:, None, None])
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w, ref_w.detach().numpy(), rtol=1e-4, atol=1e-6)


def test_parity_with_torch_sdpa():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    q, k, v = _qkv(b=2, q=5, k=5, h=4, g=2, d=8)
    tq, tk, tv = (torch.tensor(a).transpose(1, 2) for a in (q, k, v))  # torch: [B, H, T, D]
    mask = np.random.default_rng(0).random((2, 1, 5, 5)) < 0.7
    mask[..., 0] = True
    for kw_t, kw_j in (({"is_causal": True}, {"is_causal": True}),
                       ({"attn_mask": torch.tensor(mask)}, {"mask": mask}),
                       ({"scale": 0.2}, {"scale": 0.2})):
        ref = F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True, **kw_t)
        out = dot_product_attention(q, k, v, **kw_j)
        np.testing.assert_allclose(out, ref.transpose(1, 2).numpy(), rtol=1e-5, atol=1e-5)
    assert math.isclose(float(jnp.abs(out).sum()), float(ref.abs().sum()), rel_tol=1e-4)


# --------------------------------------------------------------------------- Pallas TPU kernel


def _pallas_case(seed, b=2, t=128, h=2, g=1, d=32):
    return (randn((b, t, h, d), seed), randn((b, t, g, d), seed + 1),
            randn((b, t, g, d), seed + 2))


def test_pallas_kernel_matches_reference_in_interpret_mode():
    # The TPU flash-attention kernel, run by Pallas's TPU interpreter on CPU: == reference for
    # causal, GQA, a key-padding mask with an empty batch row (segment ids), a general mask
    # and a bias with a row of -inf (the bias path); gradients too, finite everywhere.
    pltpu = pytest.importorskip("jax.experimental.pallas.tpu")
    q, k, v = _pallas_case(31)
    key_mask = np.ones((2, 1, 1, 128), bool)
    key_mask[0, ..., 100:] = False
    key_mask[1] = False
    general = np.random.default_rng(31).random((2, 1, 128, 128)) < 0.7
    bias = np.asarray(randn((1, 2, 128, 128), 34)) * 0.5
    bias[:, :, 5] = -np.inf
    cases = [dict(is_causal=True), dict(mask=key_mask), dict(mask=general, is_causal=True),
             dict(bias=bias)]
    with pltpu.force_tpu_interpret_mode():
        for kw in cases:
            f = lambda impl, kw=kw: lambda q, k, v: dot_product_attention(  # noqa: E731
                q, k, v, implementation=impl, **kw)
            out = jax.jit(f("pallas"))(q, k, v)
            np.testing.assert_allclose(out, f("reference")(q, k, v), rtol=2e-5, atol=2e-5)
        np.testing.assert_array_equal(out[:, 5], 0.0)
        loss = lambda impl: jax.jit(jax.grad(  # noqa: E731
            lambda q, k, v: jnp.sum(jnp.sin(dot_product_attention(
                q, k, v, mask=key_mask, implementation=impl))), argnums=(0, 1, 2)))
        for a, r in zip(loss("pallas")(q, k, v), loss("reference")(q, k, v)):
            assert np.isfinite(a).all()
            np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)
    q4, k4, v4 = _pallas_case(41, h=4, g=2)
    with pltpu.force_tpu_interpret_mode():
        out = dot_product_attention(q4, k4, v4, is_causal=True, implementation="pallas")
    np.testing.assert_allclose(out, dot_product_attention(q4, k4, v4, is_causal=True,
                                                          implementation="reference"),
                               rtol=2e-5, atol=2e-5)


def test_pallas_unavailable_is_a_clear_error_and_auto_stays_on_xla():
    q, k, v = _pallas_case(51, t=16)
    with pytest.raises(ValueError, match="implementation='pallas' is unavailable: it needs a TPU"):
        dot_product_attention(q, k, v, implementation="pallas")
    jaxpr = str(jax.make_jaxpr(lambda q: dot_product_attention(q, k, v))(q))
    assert "pallas_call" not in jaxpr
    pltpu = pytest.importorskip("jax.experimental.pallas.tpu")
    with pltpu.force_tpu_interpret_mode():
        assert "pallas_call" not in str(
            jax.make_jaxpr(lambda q: dot_product_attention(q, k, v))(q))  # auto: TPU only
        for kw, why in [(dict(q=q[:, :12]), "multiples of 128"),
                        (dict(v=jnp.concatenate([v, v], -1)), "equal key and value head dims"),
                        (dict(dropout_rate=0.1, dropout_rng=jax.random.PRNGKey(0)), "dropout"),
                        (dict(with_weights=True), "weights"),
                        (dict(q=q[:, :8], is_causal=True), "as many queries as keys")]:
            args = dict(q=q, k=k, v=v)
            args.update({n: kw.pop(n) for n in ("q", "v") if n in kw})
            attend = (dot_product_attention_with_weights if kw.pop("with_weights", False)
                      else dot_product_attention)
            with pytest.raises(ValueError, match=why):
                attend(args["q"], args["k"], args["v"], implementation="pallas", **kw)


def test_multihead_attention_with_the_pallas_kernel_and_lengths():
    pltpu = pytest.importorskip("jax.experimental.pallas.tpu")
    x = randn((2, 128, 16), 61)
    lengths = np.array([128, 70])
    make = lambda impl: MultiHeadAttention(num_heads=2, implementation=impl)  # noqa: E731
    params = make("xla").init(jax.random.PRNGKey(0), x)
    with pltpu.force_tpu_interpret_mode():
        got = make("pallas").apply(params, x, lengths=lengths)
    np.testing.assert_allclose(got, make("xla").apply(params, x, lengths=lengths),
                               rtol=2e-5, atol=2e-5)


def test_decode_needs_a_cache():
    # Without the check, `cache=None` attended without a cache and without the causal mask.
    mha = MultiHeadAttention(num_heads=2, head_dim=4)
    x = jnp.ones((1, 3, 8))
    params = mha.init(jax.random.PRNGKey(0), x)["params"]
    with pytest.raises(TypeError, match="`cache` must be a KVCache"):
        mha.apply({"params": params}, x, None, method="decode")

"""Linear attention: numpy references, parallel == chunked == recurrent, cache decoding, masks.

Compile time dominates these tiny tests, so every call goes through a jitted function that
is shared between tests (same shapes, same static arguments); conftest compiles at -O0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.nn.linear_attention import (
    LinearAttention,
    LinearAttentionCache,
    elu_plus_one,
    linear_attention,
    linear_attention_step,
    linear_attention_weights,
    linear_attention_with_state,
)
from seqjax.utils import count_params

IMPLS = ["parallel", "chunked", "recurrent"]
jit = jax.jit
_STATIC = ("is_causal", "feature_map", "eps", "implementation", "chunk_size")
la = jit(linear_attention, static_argnames=_STATIC)
la_state = jit(linear_attention_with_state, static_argnames=_STATIC)
la_step = jit(linear_attention_step, static_argnames=("feature_map", "eps"))
la_weights = jit(linear_attention_weights, static_argnames=("is_causal", "feature_map", "eps"))


@functools.cache
def japply(module, **static):
    """``module.apply`` jitted (and shared between tests), with ``static`` keywords fixed."""
    return jit(functools.partial(module.apply, **static))


def _random_params(module, *args, seed=0):
    """Parameters of ``module``'s shapes filled from numpy (no jitted RNG init to compile)."""
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), *args)
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda s: jnp.asarray(0.5 * rng.normal(size=s.shape), s.dtype), shapes
    )


def _phi(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))  # elu(x) + 1


def _np_linear_attention(q, k, v, causal, key_mask=None, state=None, eps=1e-6, phi=_phi):
    """Katharopoulos et al. eq. 5 with explicit loops, plus an initial (S₀, z₀)."""
    b, qlen, h, _ = q.shape
    klen = k.shape[1]
    out = np.zeros((b, qlen, h, v.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            for i in range(qlen):
                pq = phi(q[bi, i, hi])
                num = np.zeros(v.shape[-1]) if state is None else pq @ state[0][bi, hi]
                den = 0.0 if state is None else pq @ state[1][bi, hi]
                for j in range(klen):
                    if (causal and j > i) or (key_mask is not None and not key_mask[bi, j]):
                        continue
                    s = pq @ phi(k[bi, j, hi])
                    num = num + s * v[bi, j, hi]
                    den += s
                out[bi, i, hi] = num / (den + eps)
    return out


def _qkv(b=2, t=7, h=2, d=3, e=4, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(b, t, h, d)).astype(np.float32),
        rng.normal(size=(b, t, h, d)).astype(np.float32),
        rng.normal(size=(b, t, h, e)).astype(np.float32),
    )


_MASK = np.ones((2, 7), bool)
_MASK[0, 5:] = False
_MASK[1, 2] = False
_STATE = (np.full((2, 2, 3, 4), 0.3, np.float32), np.full((2, 2, 3), 2.0, np.float32))


def _causal(q, k, v, impl, mask=_MASK, state=_STATE, **kw):
    """The one causal call signature shared by the tests (one compile per implementation)."""
    return la_state(q, k, v, key_mask=jnp.asarray(mask), is_causal=True, implementation=impl,
                    chunk_size=3, initial_state=state, **kw)


def test_noncausal_matches_numpy():
    q, k, v = _qkv()
    k, v = k[:, :5], v[:, :5]  # cross-attention: 7 queries, 5 keys
    np.testing.assert_allclose(la(q, k, v), _np_linear_attention(q, k, v, False),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_causal_forms_match_numpy_with_mask_and_state(impl):
    q, k, v = _qkv()
    # chunk 3 does not divide 7: the padded tail must not leak into the sums.
    y, (s, z) = _causal(q, k, v, impl)
    ref = _np_linear_attention(q, k, v, True, key_mask=_MASK, state=_STATE)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    pk = _phi(k) * _MASK[:, :, None, None]
    s_ref = _STATE[0] + np.einsum("bthf,bthe->bhfe", pk, v)
    np.testing.assert_allclose(s, s_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, _STATE[1] + pk.sum(1), rtol=1e-5, atol=1e-5)


def test_masked_keys_are_ignored_and_empty_rows_are_zero():
    q, k, v = _qkv()
    mask = np.ones((2, 7), bool)
    mask[0, 3:] = False
    mask[1, :] = False
    y = la(q, k, v, key_mask=jnp.asarray(mask))
    ref = _np_linear_attention(q[:1], k[:1, :3], v[:1, :3], False)
    np.testing.assert_allclose(y[:1], ref, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(y[1]) == 0.0)  # no key visible: 0, not NaN
    k2 = k.copy()
    k2[0, 3:] = 100.0  # content of masked keys must not matter
    np.testing.assert_allclose(la(q, k2, v, key_mask=jnp.asarray(mask)), y, rtol=1e-6)


def test_recurrent_step_by_step_equals_full_causal():
    q, k, v = _qkv()
    y_full, final = _causal(q, k, v, "chunked")
    state = _STATE
    for t in range(7):
        state, yt = la_step(state, q[:, t], k[:, t], v[:, t], valid=jnp.asarray(_MASK[:, t]))
        np.testing.assert_allclose(yt, y_full[:, t], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state[0], final[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state[1], final[1], rtol=1e-5, atol=1e-5)


def test_weights_times_values_is_the_output():
    q, k, v = _qkv()
    mask = jnp.asarray(_MASK)
    zero = tuple(np.zeros_like(s) for s in _STATE)
    for causal, y in ((False, la(q, k, v, key_mask=mask)),
                      (True, _causal(q, k, v, "chunked", state=zero)[0])):
        w = la_weights(q, k, key_mask=mask, is_causal=causal)
        np.testing.assert_allclose(jnp.einsum("bhqk,bkhe->bqhe", w, v), y, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
        if causal:
            assert np.all(np.asarray(w) * np.triu(np.ones((7, 7)), 1) == 0.0)


def _two_sided_relu(x):  # F = 2D, positive
    return jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1) + 0.1


def test_pluggable_feature_map_with_other_feature_dim():
    def phi_np(x):
        return np.concatenate([np.maximum(x, 0), np.maximum(-x, 0)]) + 0.1

    q, k, v = _qkv()
    state = (np.full((2, 2, 6, 4), 0.3, np.float32), np.full((2, 2, 6), 2.0, np.float32))
    ref = _np_linear_attention(q, k, v, True, key_mask=_MASK, state=state, phi=phi_np)
    for impl in ("chunked", "recurrent"):
        y, (s, z) = _causal(q, k, v, impl, state=state, feature_map=_two_sided_relu)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
        assert s.shape == (2, 2, 6, 4) and z.shape == (2, 2, 6)
    attn = LinearAttention(num_heads=2, feature_map=_two_sided_relu)
    params = jax.eval_shape(attn.init, jax.random.PRNGKey(0), jnp.ones((1, 3, 6)))
    cache = attn.apply(params, 1, 3, method="init_cache")
    assert cache.s_BxHxFxE.shape == (1, 2, 6, 3)


@pytest.mark.parametrize("use_bias", [True, False])
def test_parameter_names_and_count(use_bias):
    attn = LinearAttention(num_heads=2, head_dim=3, out_features=5, use_bias=use_bias)
    shapes = jax.eval_shape(attn.init, jax.random.PRNGKey(0), jnp.ones((1, 4, 8)))["params"]
    d, h, dh, dout = 8, 2, 3, 5
    assert sorted(shapes) == ["key", "out", "query", "value"]
    assert shapes["query"]["kernel"].shape == (d, h, dh)
    assert shapes["out"]["kernel"].shape == (h, dh, dout)
    if use_bias:
        expected = 3 * (d * h * dh + h * dh) + h * dh * dout + dout
    else:
        expected = 3 * d * h * dh + h * dh * dout
    assert count_params(jax.tree_util.tree_map(lambda s: np.zeros(s.shape), shapes)) == expected


# One module and one parameter set for the module tests: T = 6 with chunks of 4 (padded).
ATTN = LinearAttention(num_heads=2, chunk_size=4)
_X = np.random.default_rng(1).normal(size=(2, 6, 8)).astype(np.float32)
_PARAMS = _random_params(ATTN, _X)


def test_module_matches_manual_heads():
    p = jax.tree_util.tree_map(np.asarray, _PARAMS["params"])
    q, k, v = (
        np.einsum("btd,dhk->bthk", _X, p[n]["kernel"]) + p[n]["bias"]
        for n in ("query", "key", "value")
    )
    ref = _np_linear_attention(q, k, v, True)
    ref = np.einsum("bthk,hkd->btd", ref, p["out"]["kernel"]) + p["out"]["bias"]
    np.testing.assert_allclose(japply(ATTN, is_causal=True)(_PARAMS, _X), ref, rtol=1e-4,
                               atol=1e-5)


def test_cache_prefill_then_steps_equals_full_forward():
    full = japply(ATTN, is_causal=True)(_PARAMS, _X)
    cache = ATTN.apply(_PARAMS, 2, 6, method="init_cache")
    assert isinstance(cache, LinearAttentionCache)
    run = japply(ATTN, method="decode")
    y0, cache = run(_PARAMS, _X[:, :3], cache=cache)  # prefill: chunked form from a state
    ys = [y0]
    for t in range(3, 6):
        yt, cache = run(_PARAMS, _X[:, t : t + 1], cache=cache)  # one token: recurrent step
        ys.append(yt)
    np.testing.assert_allclose(jnp.concatenate(ys, 1), full, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cache.lengths_B, [6, 6])


def test_ragged_prefill_counts_only_real_tokens():
    run = japply(ATTN, method="decode")
    valid = jnp.arange(6)[None] < jnp.array([6, 4])[:, None]
    _, cache = run(_PARAMS, _X, mask=valid, cache=ATTN.apply(_PARAMS, 2, 8, method="init_cache"))
    np.testing.assert_array_equal(cache.lengths_B, [6, 4])
    # Row 1's state must equal a prefill with its 4 real tokens only.
    _, c1 = run(_PARAMS, _X[1:, :4], cache=ATTN.apply(_PARAMS, 1, 8, method="init_cache"))
    np.testing.assert_allclose(cache.s_BxHxFxE[1], c1.s_BxHxFxE[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cache.z_BxHxF[1], c1.z_BxHxF[0], rtol=1e-5, atol=1e-5)


def test_attention_masks_reduce_to_key_padding():
    run, run_causal = japply(ATTN), japply(ATTN, is_causal=True)
    valid = jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], bool)
    mask4 = valid[:, None, :, None] & valid[:, None, None, :]
    y2 = run(_PARAMS, _X, mask=valid)
    y4 = run(_PARAMS, _X, mask=mask4)
    np.testing.assert_allclose(y4[0], y2[0], rtol=1e-6)
    np.testing.assert_allclose(y4[1, :3], y2[1, :3], rtol=1e-6)
    # Padded queries see no key: zero heads, so the output is the `out` bias.
    out_bias = _PARAMS["params"]["out"]["bias"]
    np.testing.assert_allclose(y4[1, 3:], jnp.broadcast_to(out_bias, (3, 8)), atol=1e-6)
    # causal & padding: the real prefix equals the causal output of the prefix alone.
    yc = run_causal(_PARAMS, _X, mask=mask4 & jnp.tril(jnp.ones((6, 6), bool)))
    full = run_causal(_PARAMS, _X)
    np.testing.assert_allclose(yc[0], full[0], rtol=1e-6)
    np.testing.assert_allclose(yc[1, :3], full[1, :3], rtol=1e-6)


def test_causality_by_gradient():
    # Jacobian of every output step w.r.t. every input step: [T_out, B, T_in, D].
    def per_step(x):
        return ATTN.apply(_PARAMS, x, is_causal=True).sum(axis=(0, 2))

    influence_TxT = np.abs(np.asarray(jit(jax.jacrev(per_step))(_X))).sum(axis=(1, 3))
    assert np.all(np.triu(influence_TxT, k=1) == 0.0)
    assert np.all(np.diag(influence_TxT) > 0.0)


def test_bf16_compute_close_to_fp32_and_grad():
    y32 = japply(ATTN, is_causal=True)(_PARAMS, _X)
    attn16 = LinearAttention(num_heads=2, chunk_size=4, dtype=jnp.bfloat16)
    y16 = japply(attn16, is_causal=True)(_PARAMS, _X)
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float32), y32, rtol=0.05, atol=0.05)

    grads = jit(jax.grad(lambda p: jnp.mean(ATTN.apply(p, _X, is_causal=True) ** 2)))(_PARAMS)
    leaves = jax.tree_util.tree_leaves(grads)
    assert all(np.all(np.isfinite(g)) and np.any(np.asarray(g) != 0) for g in leaves)


def test_bad_inputs_raise():
    # Errors are raised while tracing: eval_shape never compiles.
    def trace(module=ATTN, **kw):
        return jax.eval_shape(functools.partial(module.apply, **kw), _PARAMS, _X)

    with pytest.raises(ValueError, match="bias"):
        trace(bias=jnp.zeros((2, 1, 6, 6)))
    with pytest.raises(ValueError, match="implementation"):
        trace(LinearAttention(num_heads=2, implementation="fft"))
    with pytest.raises(ValueError, match="mask"):
        trace(mask=jnp.ones((2, 5), bool))
    with pytest.raises(TypeError, match="mask"):
        trace(mask=jnp.ones((2, 6)))
    with pytest.raises(ValueError, match="num_heads"):
        trace(LinearAttention(num_heads=3))
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="causal"):
        jax.eval_shape(functools.partial(linear_attention, is_causal=True), q, k[:, :4], v[:, :4])
    with pytest.raises(ValueError, match="feature_map"):
        jax.eval_shape(functools.partial(linear_attention, feature_map="softmax"), q, k, v)
    with pytest.raises(ValueError, match="`v`"):
        jax.eval_shape(linear_attention, q, k, v[:, :4])
    np.testing.assert_allclose(elu_plus_one(np.array([-1.0, 0.0, 2.0])),
                               [np.exp(-1.0), 1.0, 3.0], rtol=1e-6)


@pytest.mark.parametrize("which", ["linear_attention", "LinearAttention"])
def test_the_call_returns_the_array_and_the_named_form_the_pair(which):
    """The call returns ``y``; ``linear_attention_with_state`` returns ``(y, (S, z))`` and
    ``LinearAttention.with_weights`` ``(y, weights)``, with the same ``y``; the retired
    flags are a TypeError naming them."""
    if which == "linear_attention":
        q, k, v = _qkv()
        y, (s, z) = _causal(q, k, v, "chunked")
        plain = functools.partial(la, q, k, v, key_mask=jnp.asarray(_MASK), is_causal=True,
                                  implementation="chunked", chunk_size=3, initial_state=_STATE)
        assert s.shape == _STATE[0].shape and z.shape == _STATE[1].shape
        flag, name = "return_state", "linear_attention_with_state"
    else:
        lengths = jnp.array([6, 4])
        y, w = japply(ATTN, is_causal=True, method="with_weights")(_PARAMS, _X, lengths=lengths)
        plain = functools.partial(japply(ATTN, is_causal=True), _PARAMS, _X, lengths=lengths)
        valid_BxQ = np.arange(6)[None] < np.asarray(lengths)[:, None]
        np.testing.assert_allclose(w.sum(-1), np.broadcast_to(valid_BxQ[:, None], w.shape[:3]),
                                   atol=1e-4)  # rows of real queries sum to 1, padded are 0
        np.testing.assert_array_equal(np.triu(np.asarray(w), 1), 0.0)  # causal
        flag, name = "return_weights", "LinearAttention.with_weights"
    np.testing.assert_array_equal(plain(), y)
    with pytest.raises(TypeError, match=name):
        plain(**{flag: True})
    if which == "LinearAttention":  # the cached call is decode, not a keyword of the call
        with pytest.raises(TypeError, match="LinearAttention.decode"):
            plain(cache=ATTN.apply(_PARAMS, 2, 8, method="init_cache"))


def test_lengths_zero_padded_rows_and_advance_the_cache():
    run = japply(ATTN)
    lengths = jnp.array([6, 4])
    y = run(_PARAMS, _X, lengths=lengths)
    valid = jnp.arange(6)[None] < lengths[:, None]
    np.testing.assert_allclose(y, jnp.where(valid[..., None], run(_PARAMS, _X, mask=valid), 0.0),
                               rtol=1e-6)
    assert np.all(np.asarray(y[1, 4:]) == 0.0)
    with pytest.raises(ValueError, match="kv_lengths"):
        jax.eval_shape(functools.partial(ATTN.apply, kv_lengths=lengths), _PARAMS, _X)

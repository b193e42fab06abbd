"""Selective SSM / Mamba block / minGRU: numpy references and associative == sequential == step.

Compile time dominates these tiny tests, so every call goes through a jitted function that
is shared between tests (same shapes, same static arguments); conftest compiles at -O0.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from seqjax.nn.linear_attention import LinearAttention
from seqjax.nn.ssm import (
    CausalDepthwiseConv1d,
    MambaBlock,
    MambaCache,
    MinGRU,
    SelectiveSSM,
    discretize,
    linear_recurrence,
    selective_scan,
    selective_scan_with_state,
    selective_step,
)
from seqjax.nn.transformer import BlockConfig, TransformerBlock

jit = jax.jit
scan = jit(selective_scan, static_argnames=("impl", "discretization"))
scan_state = jit(selective_scan_with_state, static_argnames=("impl", "discretization"))
recurrence = jit(linear_recurrence, static_argnames=("impl",))


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


def _n_params(module, *args):
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), *args)["params"]
    return sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(shapes))


def _np_selective_scan(x, dt, a, b, c, d, h0=None, zoh=False):
    """Gu & Dao (2023) Algorithm 2, one channel and one state at a time."""
    bsz, t, e = x.shape
    n = a.shape[1]
    h = np.zeros((bsz, e, n)) if h0 is None else np.array(h0, np.float64)
    y = np.zeros((bsz, t, e))
    for bi in range(bsz):
        for ti in range(t):
            for ei in range(e):
                for ni in range(n):
                    a_bar = math.exp(dt[bi, ti, ei] * a[ei, ni])
                    if zoh:
                        b_bar = (a_bar - 1.0) / a[ei, ni] * b[bi, ti, ni]
                    else:
                        b_bar = dt[bi, ti, ei] * b[bi, ti, ni]
                    h[bi, ei, ni] = a_bar * h[bi, ei, ni] + b_bar * x[bi, ti, ei]
                y[bi, ti] = (h[bi] * c[bi, ti][None, :]).sum(-1) + d * x[bi, ti]
    return y, h


def _ssm_inputs(bsz=2, t=5, e=3, n=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(bsz, t, e)).astype(np.float32)
    dt = rng.uniform(0.01, 0.5, size=(bsz, t, e)).astype(np.float32)
    a = -rng.uniform(0.5, 3.0, size=(e, n)).astype(np.float32)
    b = rng.normal(size=(bsz, t, n)).astype(np.float32)
    c = rng.normal(size=(bsz, t, n)).astype(np.float32)
    d = rng.normal(size=(e,)).astype(np.float32)
    h0 = rng.normal(size=(bsz, e, n)).astype(np.float32)
    return x, dt, a, b, c, d, h0


def test_linear_recurrence_forms_match_numpy():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.0, 1.0, size=(2, 7, 3)).astype(np.float32)
    b = rng.normal(size=(2, 7, 3)).astype(np.float32)
    h0 = rng.normal(size=(2, 3)).astype(np.float32)
    ref = np.zeros_like(b)
    h = h0.copy()
    for t in range(7):
        h = a[:, t] * h + b[:, t]
        ref[:, t] = h
    for impl in ("associative", "sequential"):
        np.testing.assert_allclose(recurrence(a, b, h0, impl=impl), ref, rtol=1e-5, atol=1e-6)


def test_zoh_one_step_against_the_integral():
    """Exact ZOH: h(Δ) = e^{ΔA} h0 + ∫_0^Δ e^{(Δ−s)A} ds · B x, integrated numerically."""
    dt, a_val, b_val, x, h0 = 0.3, -2.0, 0.7, 1.5, 0.4
    s = np.linspace(0.0, dt, 20001)
    integral = np.trapezoid(np.exp((dt - s) * a_val), s) if hasattr(np, "trapezoid") else (
        np.trapz(np.exp((dt - s) * a_val), s)
    )
    exact = math.exp(dt * a_val) * h0 + integral * b_val * x
    a_bar, b_bar = discretize(jnp.array([dt]), jnp.array([[a_val]]), jnp.array([b_val]), "zoh")
    np.testing.assert_allclose(float(a_bar[0, 0] * h0 + b_bar[0, 0] * x), exact, rtol=1e-6)
    # Mamba's B̄ = ΔB is ZOH to first order: the error is O((ΔA)²).
    _, b_mamba = discretize(jnp.array([dt]), jnp.array([[a_val]]), jnp.array([b_val]), "mamba")
    err = abs(float(b_mamba[0, 0]) - float(b_bar[0, 0]))
    assert 0 < err <= abs(b_val) * (dt * a_val) ** 2 / (2 * abs(a_val))


@pytest.mark.parametrize("disc", ["mamba", "zoh"])
def test_selective_scan_forms_match_numpy(disc):
    x, dt, a, b, c, d, h0 = _ssm_inputs()
    ref_y, ref_h = _np_selective_scan(x, dt, a, b, c, d, h0, zoh=disc == "zoh")
    for impl in ("associative", "sequential"):
        y, h = scan_state(x, dt, a, b, c, d, initial_state=h0, impl=impl, discretization=disc)
        np.testing.assert_allclose(y, ref_y, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(h, ref_h, rtol=1e-4, atol=1e-5)
    step = jit(functools.partial(selective_step, discretization=disc))
    h = h0
    for t in range(x.shape[1]):
        h, yt = step(h, x[:, t], dt[:, t], a, b[:, t], c[:, t], d)
        np.testing.assert_allclose(yt, ref_y[:, t], rtol=1e-4, atol=1e-5)


def test_selective_scan_accumulates_in_float32():
    x, dt, a, b, c, d, h0 = _ssm_inputs()
    kw = dict(initial_state=h0, impl="associative", discretization="mamba")
    y32, _ = scan_state(x, dt, a, b, c, d, **kw)
    y16, h16 = scan_state(*(jnp.asarray(v, jnp.bfloat16) for v in (x, dt)), a, b, c, d, **kw)
    assert y16.dtype == jnp.bfloat16 and h16.dtype == jnp.float32
    scale = float(np.abs(y32).max())
    np.testing.assert_allclose(np.asarray(y16, np.float32), y32, atol=0.02 * scale)


_X_SSM = np.random.default_rng(2).normal(size=(2, 6, 4)).astype(np.float32)
_P_SSM = jax.jit(SelectiveSSM(features=4, d_state=3, dt_rank=2).init)(jax.random.PRNGKey(0), _X_SSM)


def _ssm(scan_impl="associative"):
    ssm = SelectiveSSM(features=4, d_state=3, dt_rank=2, scan_impl=scan_impl)
    return ssm, _P_SSM, jnp.asarray(_X_SSM)


def test_selective_ssm_parameters_and_count():
    ssm = SelectiveSSM(features=6, d_state=5, dt_rank=2)
    shapes = jax.eval_shape(ssm.init, jax.random.PRNGKey(0), jnp.ones((1, 3, 6)))["params"]
    assert sorted(shapes) == ["A_log", "D", "dt_proj", "x_proj"]
    assert shapes["x_proj"]["kernel"].shape == (6, 2 + 2 * 5)
    assert shapes["dt_proj"]["kernel"].shape == (2, 6)
    e, n, r = 6, 5, 2
    assert _n_params(ssm, jnp.ones((1, 3, 6))) == e * (2 * r + 3 * n + 2)


def test_selective_ssm_init_follows_mamba():
    ssm, params, _ = _ssm()
    p = params["params"]
    np.testing.assert_allclose(-np.exp(p["A_log"]), -np.tile(np.arange(1.0, 4.0), (4, 1)),
                               rtol=1e-6)
    dt0 = np.log1p(np.exp(np.asarray(p["dt_proj"]["bias"])))  # softplus(b_Δ)
    assert np.all((dt0 >= 1e-3 - 1e-7) & (dt0 <= 0.1 + 1e-7))
    np.testing.assert_array_equal(p["D"], np.ones(4))


def _np_ssm_module(x):
    """SelectiveSSM in numpy: selection projections, softplus, then Algorithm 2."""
    p = jax.tree_util.tree_map(np.asarray, _P_SSM["params"])
    xn = np.asarray(x, np.float64)
    proj = xn @ p["x_proj"]["kernel"]
    dt = np.log1p(np.exp(proj[..., :2] @ p["dt_proj"]["kernel"] + p["dt_proj"]["bias"]))
    return _np_selective_scan(xn, dt, -np.exp(p["A_log"]), proj[..., 2:5], proj[..., 5:], p["D"])


def test_selective_ssm_module_matches_numpy_and_steps():
    ssm, params, x = _ssm()
    ref_y, ref_h = _np_ssm_module(x)
    y_assoc, h_assoc = japply(ssm, method="with_state")(params, x)
    ssm_seq = _ssm("sequential")[0]
    y_seq, h_seq = japply(ssm_seq, method="with_state")(params, x)
    for y, h in ((y_assoc, h_assoc), (y_seq, h_seq)):
        np.testing.assert_allclose(y, ref_y, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(h, ref_h, rtol=1e-4, atol=1e-5)
    step = japply(ssm, method="step")
    h = jnp.zeros((2, 4, 3))
    for t in range(6):
        h, yt = step(params, h, x[:, t])
        np.testing.assert_allclose(yt, ref_y[:, t], rtol=1e-4, atol=1e-5)


def test_selective_ssm_lengths_freeze_the_state():
    ssm, params, x = _ssm()
    y, h = japply(ssm, method="with_state")(params, x, lengths=jnp.array([6, 3]))
    ref_y, ref_h = _np_ssm_module(x)
    ref_y3, ref_h3 = _np_ssm_module(x[1:, :3])
    np.testing.assert_allclose(y[0], ref_y[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h[0], ref_h[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y[1, :3], ref_y3[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h[1], ref_h3[0], rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(y[1, 3:]) == 0.0)


def test_lti_ablation_is_the_s4_convolution_and_selective_is_not_linear():
    lti = SelectiveSSM(features=4, d_state=3, selective=False)
    assert _n_params(lti, _X_SSM) == 4 * (3 + 2) + 2 * 3
    params = _random_params(lti, _X_SSM)
    p = jax.tree_util.tree_map(np.asarray, params["params"])
    # K_k = Σ_n C_n Ā_n^k B̄_n per channel, with Ā = exp(ΔA), B̄ = ΔB; y = K * x + D x.
    dt_E = np.log1p(np.exp(p["dt_bias"]))
    a_bar_ExN = np.exp(dt_E[:, None] * -np.exp(p["A_log"]))
    b_bar_ExN = dt_E[:, None] * p["B"][None, :]
    k_TxE = np.stack([(p["C"] * a_bar_ExN**k * b_bar_ExN).sum(-1) for k in range(6)])
    x = np.asarray(_X_SSM, np.float64)
    ref = np.stack(
        [sum(k_TxE[k] * x[:, t - k] for k in range(t + 1)) + p["D"] * x[:, t] for t in range(6)],
        axis=1,
    )
    run = japply(lti)
    np.testing.assert_allclose(run(params, _X_SSM), ref, rtol=1e-4, atol=1e-5)
    # Superposition holds for the LTI layer and fails for the selective one.
    x2 = np.roll(_X_SSM, 1, axis=0)
    np.testing.assert_allclose(run(params, _X_SSM + 2 * x2),
                               run(params, _X_SSM) + 2 * run(params, x2), rtol=1e-4, atol=1e-5)
    ssm, sparams, _ = _ssm()
    sel = japply(ssm)
    gap = np.abs(sel(sparams, _X_SSM + 2 * x2) - sel(sparams, _X_SSM) - 2 * sel(sparams, x2))
    assert gap.max() > 1e-2


def test_causal_depthwise_conv_matches_numpy_and_streams():
    conv = CausalDepthwiseConv1d(features=3, kernel_size=4)
    x = np.random.default_rng(0).normal(size=(2, 6, 3)).astype(np.float32)
    params = _random_params(conv, x)
    w, bias = np.asarray(params["params"]["kernel"]), np.asarray(params["params"]["bias"])
    xp = np.concatenate([np.zeros((2, 3, 3)), x], axis=1)
    ref = np.stack([(xp[:, t : t + 4] * w).sum(1) + bias for t in range(6)], axis=1)
    run = japply(conv)
    y, state = run(params, x)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, x[:, 3:])
    y1, s1 = run(params, x[:, :3], np.zeros((2, 3, 3), np.float32))
    y2, _ = run(params, x[:, 3:], s1)
    np.testing.assert_allclose(np.concatenate([y1, y2], 1), ref, rtol=1e-5, atol=1e-6)


def test_mamba_block_parameter_count_formula():
    def formula(d, e, n, r, k, bias=False):
        return 3 * d * e + k * e + e + e * (2 * r + 3 * n + 2) + (2 * e + d if bias else 0)

    block = MambaBlock(features=8, d_state=4, expand=2, dt_rank=3)
    assert _n_params(block, jnp.ones((1, 2, 8))) == formula(8, 16, 4, 3, 4)
    block = MambaBlock(features=8, d_state=4, use_bias=True, d_conv=3)
    assert _n_params(block, jnp.ones((1, 2, 8))) == formula(8, 16, 4, 1, 3, bias=True)
    # One layer of Mamba-130m (d_model 768, 24 layers): 3,770,880 parameters.
    assert _n_params(MambaBlock(features=768), jnp.ones((1, 1, 768))) == 3_770_880


_X_BLOCK = np.random.default_rng(1).normal(size=(2, 7, 4)).astype(np.float32)
_P_BLOCK = _random_params(MambaBlock(features=4, d_state=3), _X_BLOCK)


def _block(scan_impl="associative", dtype=None):
    """One parameter set shared by every configuration (names and shapes do not change)."""
    block = MambaBlock(features=4, d_state=3, expand=2, scan_impl=scan_impl, dtype=dtype)
    return block, _P_BLOCK, jnp.asarray(_X_BLOCK)


def test_mamba_prefill_then_decode_equals_full_forward():
    block, params, x = _block()
    full = japply(block)(params, x)
    cache = block.init_cache(2, 16)
    assert isinstance(cache, MambaCache)
    with pytest.raises(TypeError, match="MambaBlock.decode"):  # the call takes no cache
        japply(block)(params, x, cache=cache)
    run = japply(block, method="decode")
    y0, cache = run(params, x[:, :3], cache=cache)
    ys = [y0]
    for t in range(3, 7):
        yt, cache = run(params, x[:, t : t + 1], cache=cache)
        ys.append(yt)
    np.testing.assert_allclose(jnp.concatenate(ys, 1), full, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(cache.lengths_B, [7, 7])


def test_mamba_scan_impls_agree_and_ragged_prefill():
    block, params, x = _block()
    seq_block = _block("sequential")[0]
    np.testing.assert_allclose(japply(seq_block)(params, x), japply(block)(params, x),
                               rtol=1e-5, atol=1e-6)
    # Row 1 has 4 real tokens: its cache must equal that of a prefill with those 4 alone,
    # and decoding on from it must match the full forward of the 5-token sequence.
    run = japply(block, method="decode")
    lengths = jnp.array([7, 4])
    y, cache = run(params, x, lengths=lengths, cache=block.init_cache(2))
    assert np.all(np.asarray(y[1, 4:]) == 0.0)
    np.testing.assert_array_equal(cache.lengths_B, [7, 4])
    _, c1 = run(params, x[1:, :4], cache=block.init_cache(1))
    np.testing.assert_allclose(cache.conv_BxKm1xE[1], c1.conv_BxKm1xE[0], rtol=1e-6)
    np.testing.assert_allclose(cache.ssm_BxExN[1], c1.ssm_BxExN[0], rtol=1e-5, atol=1e-6)
    nxt = x[:, 4:5]
    y5, _ = run(params, nxt, cache=cache)
    full5 = japply(block)(params, x[1:, :5])
    np.testing.assert_allclose(y5[1], full5[0, 4:], rtol=1e-5, atol=1e-6)


def test_mamba_causality_by_gradient_and_every_parameter_learns():
    block, params, x = _block()

    def per_step(x):
        return block.apply(params, x).sum(axis=(0, 2))

    def both(params, x):  # one compile for the input Jacobian and the parameter gradient
        return jax.jacrev(per_step)(x), jax.grad(lambda p: jnp.mean(block.apply(p, x) ** 2))(
            params)

    jac, grads = jit(both)(params, x)
    influence_TxT = np.abs(np.asarray(jac)).sum(axis=(1, 3))
    assert np.all(np.triu(influence_TxT, k=1) == 0.0)
    assert np.all(np.diag(influence_TxT) > 0.0)
    leaves = jax.tree_util.tree_leaves(grads)
    assert all(np.all(np.isfinite(g)) and np.any(np.asarray(g) != 0) for g in leaves)


def test_mamba_bf16_close_to_fp32():
    block, params, x = _block()
    y32 = japply(block)(params, x)
    block16 = _block(dtype=jnp.bfloat16)[0]
    y16 = japply(block16)(params, x)
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float32), y32, atol=0.03 * float(
        np.abs(y32).max()))


def test_min_gru_forms_match_numpy():
    rnn = MinGRU(features=3)
    x = np.random.default_rng(0).normal(size=(2, 5, 4)).astype(np.float32)
    params = _random_params(rnn, x)
    p = jax.tree_util.tree_map(np.asarray, params["params"])
    assert _n_params(rnn, x) == 2 * 4 * 3 + 2 * 3
    g = x @ p["gates"]["kernel"] + p["gates"]["bias"]
    z, htilde = 1 / (1 + np.exp(-g[..., :3])), g[..., 3:]
    h = np.zeros((2, 3))
    ref = []
    for t in range(5):
        h = (1 - z[:, t]) * h + z[:, t] * htilde[:, t]
        ref.append(h)
    ref = np.stack(ref, 1)
    np.testing.assert_allclose(japply(rnn)(params, x), ref, rtol=1e-5, atol=1e-6)
    seq = MinGRU(features=3, scan_impl="sequential")
    np.testing.assert_allclose(japply(seq)(params, x), ref, rtol=1e-5, atol=1e-6)
    step = japply(rnn, method="step")
    h = jnp.zeros((2, 3))
    for t in range(5):
        h, yt = step(params, h, x[:, t])
    np.testing.assert_allclose(yt, ref[:, -1], rtol=1e-5, atol=1e-6)


_MIN_GRU = MinGRU(features=4)


@pytest.mark.parametrize("which", ["selective_scan", "SelectiveSSM", "MinGRU"])
def test_the_call_returns_the_array_and_with_state_the_pair(which):
    """The call returns ``y``; ``selective_scan_with_state`` / ``with_state`` return
    ``(y, h_T)`` with the same ``y``; the retired ``return_state=`` is a TypeError naming
    the pair's callable."""
    if which == "selective_scan":
        x, dt, a, b, c, d, h0 = _ssm_inputs()
        y, h = scan_state(x, dt, a, b, c, d, initial_state=h0)
        plain = functools.partial(scan, x, dt, a, b, c, d, initial_state=h0)
        assert h.shape == h0.shape and h.dtype == jnp.float32
        name = "selective_scan_with_state"
    else:
        module, params, x = (_ssm() if which == "SelectiveSSM"
                             else (_MIN_GRU, _random_params(_MIN_GRU, _X_SSM), _X_SSM))
        y, h = japply(module, method="with_state")(params, x)
        plain = functools.partial(japply(module), params, x)
        if which == "MinGRU":
            np.testing.assert_array_equal(h, y[:, -1])  # h_T is the last output
        name = f"{which}.with_state"
    np.testing.assert_array_equal(plain(), y)
    with pytest.raises(TypeError, match=name):
        plain(return_state=True)


def test_bad_inputs_raise():
    x, dt, a, b, c, d, _ = _ssm_inputs()
    with pytest.raises(ValueError, match="impl"):
        selective_scan(x, dt, a, b, c, d, impl="fft")
    with pytest.raises(ValueError, match="`b`"):
        selective_scan(x, dt, a, b[:, :2], c, d)
    with pytest.raises(ValueError, match="initial_state"):
        selective_scan(x, dt, a, b, c, d, initial_state=np.zeros((2, 3, 5)))
    block = MambaBlock(features=4, d_state=3)
    with pytest.raises(ValueError, match="features"):
        jax.eval_shape(block.init, jax.random.PRNGKey(0), jnp.ones((1, 3, 5)))
    with pytest.raises(ValueError, match="scan_impl"):
        jax.eval_shape(SelectiveSSM(4, scan_impl="fast").init, jax.random.PRNGKey(0),
                       jnp.ones((1, 3, 4)))
    with pytest.raises(ValueError, match="lengths"):
        jax.eval_shape(functools.partial(block.init, lengths=jnp.array([3])),
                       jax.random.PRNGKey(0), jnp.ones((2, 3, 4)))


class _HybridLM(nn.Module):
    """Embedding → linear-attention block → residual Mamba block → head (both decode caches)."""

    vocab: int = 11
    width: int = 8

    def setup(self):
        self.embed = nn.Embed(self.vocab, self.width)
        self.block = TransformerBlock(BlockConfig.decoder(
            num_heads=2, mlp_dim=16, cross_attention=False,
            attention=functools.partial(LinearAttention, chunk_size=4)))
        self.mamba = MambaBlock(features=self.width, d_state=4)
        self.head = nn.Dense(self.vocab)

    def __call__(self, tokens_BxT, lengths=None, caches=None):
        x = self.embed(tokens_BxT)
        if caches is None:
            x = self.block(x, lengths=lengths)
            return self.head(x + self.mamba(x, lengths=lengths))
        x, c_attn = self.block.decode(x, caches[0], lengths=lengths)
        y, c_ssm = self.mamba.decode(x, caches[1], lengths=lengths)
        return self.head(x + y), (c_attn, c_ssm)

    def init_caches(self, batch, max_len):
        return self.block.init_cache(batch, max_len), self.mamba.init_cache(batch)


_LM = _HybridLM()
_LM_PARAMS = _random_params(_LM, np.zeros((1, 4), np.int32), seed=5)


def _lm_logits(params, tokens_BxL):
    return _LM.apply(params, tokens_BxL)


def _lm_init_state(params, prompt_BxT, lengths_B, max_len):
    caches = _LM.apply(params, prompt_BxT.shape[0], max_len, method="init_caches")
    # Consume every prompt token but the last (the decoding interface feeds that one).
    _, caches = _LM.apply(params, prompt_BxT[:, :-1], lengths_B - 1, caches)
    return caches


def _lm_step(params, caches, tokens_B):
    logits_Bx1xV, caches = _LM.apply(params, tokens_B[:, None], None, caches)
    return logits_Bx1xV[:, 0], caches


def test_cached_generation_through_the_decoding_interface_equals_recomputation():
    from seqjax.decoding import FunctionalDecoder, greedy_search, recompute_decoder

    prompt = jnp.array([[3, 4, 5, 6], [7, 8, 0, 0]])
    lengths = jnp.array([4, 2])  # ragged prompts, right padded
    cached = greedy_search(FunctionalDecoder(_lm_init_state, _lm_step), _LM_PARAMS, prompt,
                           lengths, max_new_tokens=5)
    reference = greedy_search(recompute_decoder(_lm_logits), _LM_PARAMS, prompt, lengths,
                              max_new_tokens=5)
    np.testing.assert_array_equal(cached.tokens, reference.tokens)
    np.testing.assert_allclose(cached.log_probs, reference.log_probs, rtol=1e-4, atol=1e-4)

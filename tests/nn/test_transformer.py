"""Tests for seqjax.nn.transformer: blocks (pre/post norm) and encoder/decoder stacks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.nn.attention import MultiHeadAttention
from seqjax.nn.linear_attention import LinearAttention
from seqjax.nn.transformer import (
    BlockConfig,
    TransformerBlock,
    TransformerDecoder,
    TransformerEncoder,
)
from seqjax.utils import count_params

D, H, F = 16, 2, 32  # tiny model width, heads, FFN hidden
KEY = jax.random.PRNGKey(0)


def _x(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def random_params(module, *args, seed=0, **kwargs):
    """The module's parameter tree filled with numpy random values.

    Cheaper than ``module.init`` (no compilation of the initialisers), and every leaf is
    non-trivial: norm gains ≈ 1, offsets and biases ≈ 0.1, kernels with std 1/√fan_in.
    """
    shapes = jax.eval_shape(functools.partial(module.init, **kwargs), KEY, *args)["params"]
    rng = np.random.default_rng(seed)

    def fill(path, s):
        name = path[-1].key
        if name == "scale":
            v = 1.0 + 0.1 * rng.normal(size=s.shape)
        elif name == "bias":
            v = 0.1 * rng.normal(size=s.shape)
        else:
            fan_in = F if "down" in str(path) else D
            v = rng.normal(size=s.shape) / np.sqrt(fan_in)
        return v.astype(np.float32)

    return {"params": jax.tree_util.tree_map_with_path(fill, shapes)}


# ------------------------------------------------------------------ numpy reference (one block)


def np_ln(x, p, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return p["scale"] * (x - mu) / np.sqrt(var + eps) + p["bias"]


def np_rms(x, p, eps=1e-6):
    return p["scale"] * x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


def np_softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def np_mha(xq, xkv, p, causal=False, key_valid=None):
    """Concat-then-project multi-head attention, Bishop (12.15)–(12.19), with biases."""
    q = np.einsum("btd,dhk->bthk", xq, p["query"]["kernel"]) + p["query"]["bias"]
    k = np.einsum("btd,dhk->bthk", xkv, p["key"]["kernel"]) + p["key"]["bias"]
    v = np.einsum("btd,dhk->bthk", xkv, p["value"]["kernel"]) + p["value"]["bias"]
    s = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if key_valid is not None:
        s = np.where(key_valid[:, None, None, :], s, -np.inf)
    heads = np.einsum("bhqs,bshk->bqhk", np_softmax(s), v)
    return np.einsum("bqhk,hkd->bqd", heads, p["out"]["kernel"]) + p["out"]["bias"]


def np_silu(x):
    return x / (1.0 + np.exp(-x))


def np_block(x, p, *, norm, norm_type, mlp, causal, enc=None, enc_valid=None):
    """MEDL (7.31)/Bishop (12.20),(12.22) (post) or Bishop (12.21),(12.23) (pre), numpy."""
    nrm = np_ln if norm_type == "layernorm" else np_rms

    def ffn(h):
        f = p["ffn"]
        if mlp == "mlp":
            a = np.maximum(h @ f["up"]["kernel"] + f["up"]["bias"], 0.0)
            return a @ f["down"]["kernel"] + f["down"]["bias"]
        g = np_silu(h @ f["gate"]["kernel"] + f["gate"]["bias"])
        return (g * (h @ f["up"]["kernel"] + f["up"]["bias"])) @ f["down"]["kernel"] + f["down"][
            "bias"
        ]

    subs = [("self_attn_norm", lambda h: np_mha(h, h, p["self_attn"], causal=causal))]
    if enc is not None:
        subs.append(
            ("cross_attn_norm", lambda h: np_mha(h, enc, p["cross_attn"], key_valid=enc_valid))
        )
    subs.append(("ffn_norm", ffn))
    for norm_name, f in subs:
        if norm == "post":
            x = nrm(x + f(x), p[norm_name])  # Z = LN[Y(X) + X]
        else:
            x = x + f(nrm(x, p[norm_name]))  # Z = Y(LN[X]) + X
    return x


@pytest.mark.parametrize(
    "norm,norm_type,mlp", [("post", "layernorm", "mlp"), ("pre", "rmsnorm", "swiglu")]
)
def test_block_numpy_reference(norm, norm_type, mlp):
    x, enc = _x(2, 5, D), _x(2, 4, D, seed=1)
    enc_lengths = np.array([4, 2], np.int32)
    block = TransformerBlock(
        BlockConfig.decoder(
            H, mlp_dim=F, norm=norm, norm_type=norm_type, mlp=mlp, activation="relu"
        )
    )
    params = random_params(block, x, encoder_out=enc)
    y = jax.jit(block.apply)(params, x, encoder_out=enc, encoder_lengths=enc_lengths)
    p64 = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params["params"])
    ref = np_block(
        x.astype(np.float64),
        p64,
        norm=norm,
        norm_type=norm_type,
        mlp=mlp,
        causal=True,
        enc=enc.astype(np.float64),
        enc_valid=np.arange(4)[None] < enc_lengths[:, None],
    )
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_pre_norm_with_zero_sublayers_is_identity():
    """Bishop (12.21)/(12.23): with zero sublayer weights a pre-norm block is the identity."""
    x = _x(2, 4, D)
    block = TransformerBlock(BlockConfig(num_heads=H, mlp_dim=F))
    apply = jax.jit(block.apply)
    params = random_params(block, x)
    zeroed = jax.tree_util.tree_map_with_path(
        lambda path, a: a if "norm" in str(path) else np.zeros_like(a), params
    )
    np.testing.assert_allclose(apply(zeroed, x), x, atol=1e-6)
    assert not np.allclose(apply(params, x), x, atol=1e-2)


# ------------------------------------------------------------------ parameter counts, MEDL (7.32)


def test_medl_parameter_counts():
    """MEDL (7.32): 4p + 2N₁p + N₁ + p + H(2mp + 2m_v p) = 3,150,336; decoder 4,199,936.

    MEDL counts both LayerNorms' γ and β (4p), the FFN's weights *and* biases
    (2N₁p + N₁ + p) and the four per-head projections W_q, W_k (m×p), W_v (m_v×p),
    W_c^h (p×m_v) *without* biases. That is exactly our block with
    ``attention_use_bias=False`` (the FFN keeps ``use_bias=True``): query/key/value
    ``[p, H, m]`` and out ``[H, m_v, p]`` give 4·512·8·64 = 1,048,576 = H(2mp + 2m_v p).
    The decoder block adds a bias-free cross-attention and its LayerNorm: H(2mp+2m_v p) + 2p.
    """
    p, n1, heads, m = 512, 2048, 8, 64
    kw = dict(num_heads=heads, mlp_dim=n1, norm="post", activation="relu", attention_use_bias=False)
    x = jax.ShapeDtypeStruct((1, 3, p), jnp.float32)
    enc = TransformerBlock(BlockConfig.encoder(**kw))
    shapes = jax.eval_shape(enc.init, KEY, x)["params"]
    assert count_params(shapes) == 4 * p + 2 * n1 * p + n1 + p + heads * (2 * m * p + 2 * m * p)
    assert count_params(shapes) == 3_150_336
    assert count_params(shapes["self_attn"]) == heads * 4 * m * p
    assert count_params(shapes["self_attn_norm"]) + count_params(shapes["ffn_norm"]) == 4 * p
    assert count_params(shapes["ffn"]) == 2 * n1 * p + n1 + p
    dec = TransformerBlock(BlockConfig.decoder(**kw))
    shapes = jax.eval_shape(lambda k, x: dec.init(k, x, encoder_out=x), KEY, x)["params"]
    assert count_params(shapes) == 4_199_936 == 3_150_336 + heads * 4 * m * p + 2 * p
    # With attention biases (PyTorch's default) each attention has 3·H·m + p more.
    biased_cfg = BlockConfig.encoder(**{**kw, "attention_use_bias": True})
    biased = jax.eval_shape(TransformerBlock(biased_cfg).init, KEY, x)
    assert count_params(biased) == 3_150_336 + 3 * heads * m + p


# ------------------------------------------------------------------ FLOPs, Bishop §12.1.8


def test_cost_analysis_attention_quadratic_mlp_linear():
    """XLA's FLOP count of a block is a·N²D + b·ND² + c·ND + e·N²H with a = 4, b = 24.

    Bishop §12.1.8: the dot products of attention cost O(N²D) (QKᵀ and AV: 2·N²D
    each), while the projections (4 × 2ND²) and a 4D-wide MLP (2 × 2N·D·4D) cost O(ND²).
    A least-squares fit over five (N, D) pairs recovers both coefficients.
    """
    sizes = [(16, 16), (32, 16), (16, 32), (32, 32), (64, 16)]
    rows, flops = [], []
    for n, d in sizes:
        x = jax.ShapeDtypeStruct((1, n, d), jnp.float32)
        block = TransformerBlock(BlockConfig(num_heads=4, mlp_dim=4 * d, activation="relu"))
        params = jax.eval_shape(block.init, KEY, x)
        cost = jax.jit(block.apply).lower(params, x).cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        rows.append([n * n * d, n * d * d, n * d, n * n * 4])
        flops.append(cost["flops"])
    coef, *_ = np.linalg.lstsq(np.array(rows, float), np.array(flops), rcond=None)
    assert abs(coef[0] - 4.0) < 0.2, coef  # attention scores and mixing: ∝ N²D
    assert abs(coef[1] - 24.0) < 0.5, coef  # projections + MLP: ∝ ND²
    np.testing.assert_allclose(np.array(rows, float) @ coef, flops, rtol=1e-3)
    # Doubling N (16 -> 32 at D = 16) doubles the ND² part but quadruples the N²D part.
    att = coef[0] * np.array(rows)[:, 0]
    mlp = coef[1] * np.array(rows)[:, 1]
    assert att[1] / att[0] == pytest.approx(4.0) and mlp[1] / mlp[0] == pytest.approx(2.0)


# ------------------------------------------------------------------ causality and decoding


def test_causal_stack_outputs_and_gradients():
    """Output at t unchanged when inputs after t change; zero gradient from future tokens."""
    cfg = BlockConfig.decoder(H, mlp_dim=F, cross_attention=False)
    dec = TransformerDecoder(config=cfg, num_layers=2)
    x = _x(2, 6, D)
    params = random_params(dec, x)
    t = 2
    w = _x(D, seed=3)  # a plain sum of a LayerNorm output would have zero gradient

    def probe(x):
        y = dec.apply(params, x)
        return (y[:, t] @ w).sum(), y

    grad_fn = jax.jit(jax.grad(probe, has_aux=True))  # one compile: outputs and gradients
    g, y = grad_fn(x)
    assert np.all(g[:, t + 1 :] == 0.0)
    assert np.all(np.abs(g[:, : t + 1]).sum(-1) > 1e-3)
    x2 = x.copy()
    x2[:, t + 1 :] = _x(2, 6 - t - 1, D, seed=7)
    _, y2 = grad_fn(x2)
    np.testing.assert_allclose(y2[:, : t + 1], y[:, : t + 1], atol=1e-5)
    assert not np.allclose(y2[:, t + 1 :], y[:, t + 1 :], atol=1e-3)


def _decode_and_compare(dec, params, x_full, prompt_lengths, chunks, **enc_kwargs):
    """Prefill right-padded prompts, then feed `chunks` tokens per step; compare with one pass."""
    b = x_full.shape[0]
    y_full = jax.jit(dec.apply)(params, x_full, **enc_kwargs)
    decode = jax.jit(functools.partial(dec.apply, method="decode"))
    cache = dec.apply(params, b, x_full.shape[1], method="init_cache")
    p_max = int(max(prompt_lengths))
    y, cache = decode(
        params, x_full[:, :p_max], cache, lengths=jnp.asarray(prompt_lengths), **enc_kwargs
    )
    for i, pl in enumerate(prompt_lengths):
        np.testing.assert_allclose(y[i, :pl], y_full[i, :pl], atol=2e-5)
    pos = np.asarray(prompt_lengths)
    for n in chunks:
        idx = pos[:, None] + np.arange(n)[None]
        x_step = np.take_along_axis(x_full, idx[..., None], axis=1)
        y, cache = decode(params, x_step, cache, **enc_kwargs)
        np.testing.assert_allclose(y, np.take_along_axis(y_full, idx[..., None], 1), atol=2e-5)
        pos = pos + n
    return cache


@pytest.mark.parametrize(
    "scan_layers,cross,chunks", [(False, False, [1, 1]), (True, True, [2])], ids=["gpt", "seq2seq"]
)
def test_cached_decoding_equals_full_pass(scan_layers, cross, chunks):
    """Mixed prompt lengths and RoPE; per-layer (list) or stacked (scan) caches; 1- or 2-token
    steps; with cross-attention on a padded source for the encoder-decoder stack."""
    cfg = BlockConfig.decoder(H, mlp_dim=F, use_rope=True, cross_attention=cross)
    dec = TransformerDecoder(config=cfg, num_layers=2, scan_layers=scan_layers)
    x_full, enc = _x(2, 7, D), _x(2, 5, D, seed=1)
    enc_kwargs = dict(encoder_out=enc, encoder_lengths=jnp.array([5, 3])) if cross else {}
    params = random_params(dec, x_full, **enc_kwargs)
    cache = _decode_and_compare(dec, params, x_full, [3, 5], chunks, **enc_kwargs)
    if scan_layers:
        self_cache = cache.self_attn if cross else cache
        assert self_cache.k.shape[:2] == (2, 2)  # stacked on a leading layer axis
        np.testing.assert_array_equal(self_cache.lengths, [[5, 7], [5, 7]])
        if cross:  # the encoder's keys/values, projected once at prefill, per layer
            k, v = cache.cross_kv
            assert k.shape == v.shape == (2, 2, 5, H, D // H)
    else:
        assert len(cache) == 2
        np.testing.assert_array_equal(cache[1].lengths, [5, 7])


def test_cross_attention_keys_values_are_projected_once():
    """After prefill, decoding steps reuse the cached cross-attention K/V: the encoder output
    is not projected again (the steps' results do not depend on it) and a step's program has
    two fewer matmuls per layer than one that recomputes them."""
    dec = TransformerDecoder(config=BlockConfig.decoder(H, mlp_dim=F), num_layers=2)
    x_full, enc = _x(2, 4, D), _x(2, 5, D, seed=1)
    params = random_params(dec, x_full, encoder_out=enc)
    y_full = dec.apply(params, x_full, encoder_out=enc)
    cache = dec.apply(params, 2, 4, method="init_cache")
    assert all(c.cross_kv is None for c in cache)
    _, cache = dec.apply(params, x_full[:, :2], cache, encoder_out=enc, method="decode")
    y3, _ = dec.apply(params, x_full[:, 2:3], cache, encoder_out=enc * 0.0, method="decode")
    np.testing.assert_allclose(y3[:, 0], y_full[:, 2], atol=2e-5)

    def n_dots(c):
        jaxpr = jax.make_jaxpr(lambda p, x, e: dec.apply(p, x, c, encoder_out=e, method="decode"))(
            params, x_full[:, 2:3], enc
        )
        return str(jaxpr).count("dot_general")

    fresh = [c._replace(cross_kv=None) for c in cache]
    assert n_dots(fresh) - n_dots(cache) == 2 * 2  # key and value projections, 2 layers
    with pytest.raises(ValueError, match="kv"):
        k, v = cache[0].cross_kv
        MultiHeadAttention(num_heads=H).apply(
            {"params": params["params"]["layers_0"]["cross_attn"]},
            x_full[:, :1],
            enc[:, :3],
            (k, v),
            method="decode_cross",
        )


def test_linear_attention_drop_in():
    """`attention=` factory: LinearAttention replaces self-attention, cache included."""
    attention = functools.partial(LinearAttention, feature_map="elu+1")
    cfg = BlockConfig.decoder(H, mlp_dim=F, cross_attention=False, attention=attention)
    dec = TransformerDecoder(config=cfg, num_layers=1)
    x_full = _x(2, 5, D)
    params = random_params(dec, x_full)
    assert set(params["params"]["layers_0"]["self_attn"]) == {"query", "key", "value", "out"}
    _decode_and_compare(dec, params, x_full, [2, 4], [1])
    with pytest.raises(ValueError, match="use_rope"):
        cfg.replace(use_rope=True)


# ------------------------------------------------------------------ padding, scan, remat


def test_encoder_padding_invariance():
    enc = TransformerEncoder(config=BlockConfig.encoder(H, mlp_dim=F), num_layers=2)
    x = _x(2, 6, D)
    apply = jax.jit(enc.apply)
    params = random_params(enc, x)
    lengths = jnp.array([6, 4])
    x2 = x.copy()
    x2[1, 4:] = 100.0
    y, y2, y_nolen = np.split(
        np.asarray(
            apply(params, np.concatenate([x, x2, x2]), lengths=jnp.array([6, 4, 6, 4, 6, 6]))
        ),
        3,
    )
    np.testing.assert_allclose(y2, y, atol=1e-5)
    np.testing.assert_array_equal(y[1, 4:], 0.0)
    # Without the lengths the padding leaks into the real tokens (the test can fail).
    assert not np.allclose(y_nolen[1, :4], y[1, :4], atol=1e-3)
    alone = apply(params, x[1:, :4], lengths=lengths[1:])
    np.testing.assert_allclose(y[1:, :4], alone, atol=1e-5)


def _stack_layers(params, num_layers):
    params = dict(params)
    layers = [params.pop(f"layers_{i}") for i in range(num_layers)]
    params["layers"] = jax.tree_util.tree_map(lambda *a: np.stack(a), *layers)
    return params


def test_scan_layers_and_remat_match_unrolled():
    """scan_layers + remat == plain unrolled layers: same parameters (stacked), same grads.

    One comparison covers both transforms (a compensating error in the two is implausible);
    the jaxprs show that remat really checkpoints and the scan really scans.
    """
    kw = dict(config=BlockConfig(num_heads=H, mlp_dim=F, norm_type="rmsnorm", mlp="geglu"))
    kw["num_layers"] = 2
    x = _x(2, 5, D)
    unrolled = TransformerEncoder(**kw)
    scanned = TransformerEncoder(**kw, scan_layers=True, remat=True, remat_policy="dots_saveable")
    p = random_params(unrolled, x)["params"]
    p_scan = _stack_layers(p, 2)
    shapes = jax.eval_shape(scanned.init, KEY, x)["params"]
    assert jax.tree_util.tree_map(np.shape, p_scan) == jax.tree_util.tree_map(np.shape, shapes)

    def loss(model, params):
        return jnp.sum(model.apply({"params": params}, x) ** 2)

    v0, g0 = jax.jit(jax.value_and_grad(functools.partial(loss, unrolled)))(p)
    v1, g1 = jax.jit(jax.value_and_grad(functools.partial(loss, scanned)))(p_scan)
    close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5)
    close(v1, v0)
    jax.tree_util.tree_map(close, g1, _stack_layers(g0, 2))
    jaxpr = str(jax.make_jaxpr(functools.partial(loss, scanned))(p_scan))
    assert "remat" in jaxpr and "scan" in jaxpr  # jax.checkpoint's primitive is "remat2"
    assert "remat" not in str(jax.make_jaxpr(functools.partial(loss, unrolled))(p))
    unrolled_remat = TransformerEncoder(**kw, remat=True)
    assert "remat" in str(jax.make_jaxpr(functools.partial(loss, unrolled_remat))(p))


# ------------------------------------------------------------------ dropout, dtypes, errors


def test_dropout_and_bf16():
    cfg = BlockConfig(num_heads=H, mlp_dim=F, dropout_rate=0.3, attention_dropout_rate=0.3)
    block = TransformerBlock(cfg)
    x = _x(2, 5, D)
    apply = jax.jit(block.apply, static_argnames="deterministic")
    params = random_params(block, x)
    y = apply(params, x)
    # An "rbg" key: the same dropout semantics, several times cheaper to compile than threefry.
    y1 = apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(1, impl="rbg")})
    assert not np.allclose(y, y1)
    # bf16 compute: a bf16 residual stream stays bf16 and is close to the float32 result.
    y16 = jax.jit(TransformerBlock(cfg.replace(dtype=jnp.bfloat16)).apply)(
        params, x.astype(jnp.bfloat16)
    )
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float32), y, atol=0.15)


def test_errors():
    x = jax.ShapeDtypeStruct((1, 3, D), jnp.float32)

    def init(module, **kw):
        return jax.eval_shape(functools.partial(module.init, **kw), KEY, x)

    cfg = BlockConfig(num_heads=H)
    with pytest.raises(ValueError, match="encoder_out"):
        init(TransformerBlock(BlockConfig.decoder(H)))
    with pytest.raises(ValueError, match="encoder_out"):
        init(TransformerBlock(cfg), encoder_out=jnp.ones((1, 3, D)))
    with pytest.raises(ValueError, match="lengths"):
        init(TransformerEncoder(config=cfg, num_layers=1), lengths=jnp.array([1, 2]))
    with pytest.raises(ValueError, match="remat_policy"):
        TransformerEncoder(config=cfg, num_layers=1, remat=True, remat_policy="most")
    with pytest.raises(ValueError, match="num_layers"):
        TransformerEncoder(config=cfg, num_layers=0)
    dec = TransformerDecoder(config=BlockConfig.decoder(H, cross_attention=False), num_layers=2)
    params = random_params(dec, x)
    cache = dec.apply(params, 1, 4, method="init_cache")
    with pytest.raises(ValueError, match="cache"):
        jax.eval_shape(
            lambda c: dec.apply(params, jnp.ones((1, 1, D)), c, method="decode"), cache[:1]
        )
    with pytest.raises(ValueError, match="bound parameters"):
        dec.init_cache(1, 4)


# ------------------------------------------------------------------ torch parity


def _torch_to_params(layer, d, heads):
    """nn.TransformerEncoderLayer state -> our TransformerBlock params (kernels transposed)."""
    sd = {k: v.detach().numpy() for k, v in layer.state_dict().items()}
    hd = d // heads
    w_q, w_k, w_v = np.split(sd["self_attn.in_proj_weight"], 3)
    b_q, b_k, b_v = np.split(sd["self_attn.in_proj_bias"], 3)

    def proj(w, b):
        return {"kernel": w.T.reshape(d, heads, hd), "bias": b.reshape(heads, hd)}

    out_kernel = sd["self_attn.out_proj.weight"].T.reshape(heads, hd, d)
    return {
        "self_attn": {
            "query": proj(w_q, b_q),
            "key": proj(w_k, b_k),
            "value": proj(w_v, b_v),
            "out": {"kernel": out_kernel, "bias": sd["self_attn.out_proj.bias"]},
        },
        "self_attn_norm": {"scale": sd["norm1.weight"], "bias": sd["norm1.bias"]},
        "ffn": {
            "up": {"kernel": sd["linear1.weight"].T, "bias": sd["linear1.bias"]},
            "down": {"kernel": sd["linear2.weight"].T, "bias": sd["linear2.bias"]},
        },
        "ffn_norm": {"scale": sd["norm2.weight"], "bias": sd["norm2.bias"]},
    }


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_torch_encoder_layer_parity(norm_first, activation):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        D,
        H,
        dim_feedforward=F,
        dropout=0.0,
        activation=activation,
        batch_first=True,
        norm_first=norm_first,
    ).eval()
    with torch.no_grad():  # non-trivial norm parameters and biases
        for name, p in layer.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.3 * torch.randn_like(p))
    x = _x(2, 5, D)
    with torch.no_grad():
        ref = layer(torch.tensor(x)).numpy()
    block = TransformerBlock(
        BlockConfig(
            num_heads=H, mlp_dim=F, norm="pre" if norm_first else "post", activation=activation
        )
    )
    params = _torch_to_params(layer, D, H)
    np.testing.assert_allclose(jax.jit(block.apply)({"params": params}, x), ref, atol=2e-5)


# ------------------------------------------------------------------ BlockConfig


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_heads", 0),
        ("num_heads", True),
        ("mlp_dim", -4),
        ("head_dim", 2.5),
        ("num_kv_heads", 3),
        ("norm", "middle"),
        ("norm_type", "batchnorm"),
        ("mlp", "swish"),
        ("activation", "nope"),
        ("multiple_of", 0),
        ("norm_epsilon", 0.0),
        ("dropout_rate", 1.0),
        ("attention_dropout_rate", -0.1),
        ("mlp_dropout_rate", 1.5),
        ("window", -1),  # 0: no window
        ("implementation", "magic"),
    ],
)
def test_block_config_names_the_bad_field(field, value):
    kw = {"num_heads": 4, field: value}
    with pytest.raises(ValueError, match=f"`{field}`"):
        BlockConfig(**kw)


def test_block_config_custom_attention_rule():
    with pytest.raises(ValueError, match="use_rope"):
        BlockConfig(num_heads=H, attention=LinearAttention, use_rope=True)
    cfg = BlockConfig(num_heads=H, attention=LinearAttention)
    with pytest.raises(ValueError, match="window"):
        cfg.replace(window=4)  # replace validates again


def test_config_is_the_one_option():
    """A block and a stack take one ``config``: a BlockConfig, nothing else; the stack's
    fields are declared in the class body (type checkers and ``help()`` see them)."""
    x = _x(2, 5, D)
    with pytest.raises(TypeError, match="BlockConfig"):
        TransformerBlock(config={"num_heads": H})
    with pytest.raises(TypeError):
        TransformerBlock(num_heads=H)  # no keyword form
    fields = set(TransformerEncoder.__dataclass_fields__)
    assert {"config", "num_layers", "scan_layers", "remat", "final_norm"} <= fields
    assert "num_heads" not in fields and "causal" not in TransformerDecoder.__dataclass_fields__
    cfg = BlockConfig.decoder(H, mlp_dim=F)
    y = TransformerBlock(cfg).apply(
        random_params(TransformerBlock(cfg), x, encoder_out=x), x, encoder_out=x
    )
    assert y.shape == x.shape


def test_lengths_read_once_at_the_door(monkeypatch):
    """A model checks ``lengths`` once; its stack, blocks and attention trust it (no
    per-layer re-check, and no module-level cache of checked arrays)."""
    import seqjax._checks as checks
    from seqjax.models import TransformerLM, TransformerLMConfig

    assert not hasattr(checks, "_CHECKED_LENGTHS")
    names = []
    real = checks.check_range
    monkeypatch.setattr(
        checks, "check_range", lambda x, name, *a: (names.append(name), real(x, name, *a))
    )
    lm = TransformerLM(
        TransformerLMConfig(
            vocab_size=11,
            num_layers=3,
            embed_dim=D,
            block_size=8,
            block=BlockConfig.decoder(H, cross_attention=False),
        )
    )
    tokens = jnp.ones((2, 6), jnp.int32)
    params = jax.eval_shape(lm.init, KEY, tokens)
    params = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), params)
    names.clear()
    lm.apply(params, tokens, jnp.array([6, 4]))
    assert names.count("lengths") == 1
    enc = TransformerEncoder(config=BlockConfig(num_heads=H, mlp_dim=F), num_layers=3)
    x = _x(2, 5, D)
    p = random_params(enc, x)
    names.clear()
    enc.apply(p, x, lengths=jnp.array([5, 2]))
    assert names.count("lengths") == 1

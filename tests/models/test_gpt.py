"""GPT-style TransformerLM (Bishop §12.3.1; J&M §9.8)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.decoding import greedy_search, recompute_decoder
from seqjax.models.gpt import (
    TransformerLM,
    TransformerLMClassifier,
    TransformerLMConfig,
    gpt_block,
)
from seqjax.train.losses import token_cross_entropy
from seqjax.utils import count_params
from tests.models.helpers import accuracy, fit, np_cross_entropy, np_init

V = 11
RNG = np.random.default_rng(0)
PROMPTS = jnp.asarray(RNG.integers(0, V, (3, 5)), jnp.int32)
LENGTHS = jnp.array([5, 2, 1])


def _cfg(num_heads=2, **kw):
    """A small LM; ``kw`` are TransformerLMConfig fields or block options."""
    model_fields = set(TransformerLMConfig.__dataclass_fields__)
    block = {k: kw.pop(k) for k in list(kw) if k not in model_fields}
    rope = kw.get("positions") == "rope"
    return TransformerLMConfig(**{**dict(vocab_size=V, num_layers=2, embed_dim=16, block_size=24),
                                  **kw, "block": gpt_block(num_heads, use_rope=rope, **block)})


def _count(model):
    return count_params(jax.eval_shape(model.init, jax.random.PRNGKey(0),
                                       jnp.zeros((1, 4), jnp.int32))["params"])


def test_preset_parameter_counts():
    """GPT-2 small has 124,439,808 parameters (tied; Hugging Face's count); nanoGPT's
    shakespeare-char model prints "10.65M" (it does not count the position table)."""
    gpt2 = TransformerLM.from_preset("gpt2-small")
    assert _count(gpt2) == 124_439_808
    nano = TransformerLM.from_preset("nanogpt-shakespeare-char")
    non_pos = _count(nano) - 256 * 384
    assert round(non_pos / 1e6, 2) == 10.65
    # nanoGPT's bias=False also drops the LayerNorm offsets (2 per block + final): 13 · 384.
    assert non_pos - 13 * 384 == 10_646_784
    exact = TransformerLM(nano.config.replace(block=nano.config.block.replace(norm_use_bias=False)))
    assert _count(exact) - 256 * 384 == 10_646_784


def test_norm_epsilon_and_bias_reach_every_norm():
    model = TransformerLM(_cfg(norm_use_bias=False, norm_epsilon=1e-3))
    tokens = jnp.arange(8, dtype=jnp.int32).reshape(1, 8) % V
    v = model.init(jax.random.PRNGKey(0), tokens)
    flat = jax.tree_util.tree_flatten_with_path(v["params"])[0]
    names = ["/".join(str(getattr(k, "key", k)) for k in path) for path, _ in flat]
    norms = [n for n in names if "norm" in n]
    assert norms and all(n.endswith("scale") for n in norms)
    # ε changes the output (a model with the default ε differs on the same parameters).
    default = TransformerLM(_cfg(norm_use_bias=False))
    assert not np.allclose(model.apply(v, tokens), default.apply(v, tokens), atol=1e-6)
    with pytest.raises(ValueError, match="preset"):
        TransformerLM.from_preset("gpt-5")


def test_tying_removes_exactly_v_times_d_and_rope_has_no_position_table():
    tied, untied = _count(TransformerLM(_cfg())), _count(TransformerLM(_cfg(tie_embeddings=False)))
    assert untied - tied == V * 16
    assert tied - _count(TransformerLM(_cfg(positions="rope"))) == 24 * 16


@functools.partial(jax.jit, static_argnums=0)
def _probe(model, v, tokens, lengths, repadded):
    logits = model.apply(v, tokens)
    state = model.init_decode_state(v, tokens[:, :1], None, tokens.shape[1] + 1)

    def body(state, tok):
        step_logits, state = model.decode_step(v, state, tok)
        return state, step_logits

    _, steps = jax.lax.scan(body, state, tokens.T)
    return (logits, jnp.swapaxes(steps, 0, 1), model.apply(v, tokens, lengths),
            model.apply(v, repadded, lengths))


def test_teacher_forced_loss_is_sum_of_cached_step_losses_and_padding():
    model = TransformerLM(_cfg())
    x = jnp.asarray(RNG.integers(0, V, (3, 9)), jnp.int32)
    lengths = jnp.array([9, 4, 1])
    v = np_init(model, x)
    logits, steps, padded, repadded = _probe(model, v, x, lengths,
                                             x.at[1, 4:].set(0).at[2, 1:].set(3))
    np.testing.assert_allclose(steps, logits, rtol=1e-4, atol=1e-4)
    total = float(token_cross_entropy(logits[:, :-1], x[:, 1:]).sum())
    np.testing.assert_allclose(total, np_cross_entropy(steps[:, :-1], x[:, 1:]).sum(), rtol=1e-5)
    # Causal: real positions ignore the padding; padded positions output zero logits.
    np.testing.assert_allclose(padded[1, :4], logits[1, :4], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(repadded[1, :4], logits[1, :4], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(padded[2, 1:], 0.0)


def _full_logits(model, v, tokens):
    return model.apply(v, tokens)


#: Every "modern GPT" switch at once (modded-nanogpt): RoPE, QK-norm, RMSNorm, ReLU², no
#: biases, zero-initialised residual projections, an untied head and the logit soft-cap.
MODERN = dict(positions="rope", tie_embeddings=False, logit_softcap=15.0, qk_norm=True,
              norm_type="rmsnorm", activation="relu_squared", use_bias=False,
              residual_init_std=0.0)


@pytest.mark.parametrize("kw", [dict(positions="rope", scan_layers=True),
                                {**MODERN, "scan_layers": True}, {**MODERN, "scan_layers": False}],
                         ids=["rope-scanned", "modern-scanned", "modern-unrolled"])
def test_cached_generation_equals_recomputation(kw):
    """KV-cached decoding (RoPE; layers scanned or not; the modern switches) == the full causal
    pass recomputed at every step (Bishop §12.3.1), for prompts of different lengths."""
    model = TransformerLM(_cfg(**kw))
    v = np_init(model, PROMPTS, scale=None, seed=3)
    out = greedy_search(model, v, PROMPTS, LENGTHS, max_new_tokens=7)
    ref = greedy_search(recompute_decoder(functools.partial(_full_logits, model)), v, PROMPTS,
                        LENGTHS, max_new_tokens=7)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.log_probs, ref.log_probs, rtol=1e-4)
    assert len({tuple(r) for r in np.asarray(out.tokens).tolist()}) > 1  # rows differ


def test_sliding_window_receptive_field_and_cached_generation():
    """``window=w`` in every layer: L layers see L(w-1) positions back, no further (changing
    token 0 moves the logits at positions 0..L(w-1) only); KV-cached decoding equals the full
    windowed pass recomputed at every step."""
    model = TransformerLM(_cfg(window=2))  # 2 layers: positions t-2..t
    v = np_init(model, PROMPTS, scale=None, seed=5)
    x = jnp.asarray(RNG.integers(0, V, (1, 8)), jnp.int32)
    moved = np.abs(np.asarray(model.apply(v, x.at[0, 0].set((x[0, 0] + 1) % V))
                              - model.apply(v, x)))[0].max(-1)
    assert (moved[:3] > 1e-6).all() and (moved[3:] == 0).all(), moved
    full = TransformerLM(_cfg())  # same parameters, all keys: position 3+ sees token 0
    assert float(np.abs(full.apply(v, x.at[0, 0].set((x[0, 0] + 1) % V))
                        - full.apply(v, x))[0, 3:].max()) > 1e-6
    out = greedy_search(model, v, PROMPTS, LENGTHS, max_new_tokens=7)
    ref = greedy_search(recompute_decoder(functools.partial(_full_logits, model)), v, PROMPTS,
                        LENGTHS, max_new_tokens=7)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.log_probs, ref.log_probs, rtol=1e-4)


def test_modern_switches_together_scanned_equals_unrolled():
    """The modern config builds the tree its switches promise (no position table or biases,
    an ``lm_head``, per-head ``query_norm``/``key_norm`` scales) and, on the same parameters
    stacked over layers, scanned layers give the unrolled logits."""
    unrolled, scanned = (TransformerLM(_cfg(**MODERN, scan_layers=s)) for s in (False, True))
    x = jnp.asarray(RNG.integers(0, V, (2, 7)), jnp.int32)
    v = np_init(unrolled, x, scale=None, seed=1)
    p = v["params"]
    assert "pos_embed" not in p and "lm_head" in p
    assert p["decoder"]["layers_0"]["self_attn"]["key_norm"]["scale"].shape == (8,)  # d = 16/2
    leaves = [k.key for path, _ in jax.tree_util.tree_flatten_with_path(p)[0] for k in path]
    assert "bias" not in leaves
    stacked = {**p, "decoder": {"final_norm": p["decoder"]["final_norm"], "layers": jax.tree.map(
        lambda *a: jnp.stack(a), *(p["decoder"][f"layers_{i}"] for i in range(2)))}}
    np.testing.assert_allclose(scanned.apply({"params": stacked}, x), unrolled.apply(v, x),
                               rtol=1e-5, atol=1e-5)


def test_logit_softcap_is_c_tanh_of_the_plain_logits():
    """``logit_softcap=c`` (Gemma 2): on the same parameters the logits are ``c·tanh(z/c)`` of
    the uncapped model's ``z`` (numpy), inside ``(-c, c)``, through ``__call__``, cached
    decoding and the classifier's ``lm_logits``; in bfloat16 the tanh runs in float32. 0 is
    off; a negative, NaN, infinite or non-number cap is an error naming the field."""
    c = 2.0  # small, so that the cap bites
    plain, capped = (TransformerLM(_cfg(activation="relu", logit_softcap=k)) for k in (0.0, c))
    x = jnp.asarray(RNG.integers(0, V, (2, 7)), jnp.int32)
    v = np_init(plain, x, scale=1.0)
    z = np.asarray(plain.apply(v, x), np.float64)
    y = capped.apply(v, x)
    np.testing.assert_allclose(y, c * np.tanh(z / c), rtol=1e-5, atol=1e-6)
    assert np.abs(z).max() > c > np.abs(np.asarray(y)).max()
    step, _ = capped.decode_step(v, capped.init_decode_state(v, x[:, :1]), x[:, 0])
    np.testing.assert_allclose(step, y[:, 0], rtol=1e-5, atol=1e-6)
    clf = TransformerLMClassifier(capped.config)
    vc = {"params": {**np_init(clf, x)["params"], **v["params"]}}
    np.testing.assert_array_equal(clf.apply(vc, x, method=clf.lm_logits), y)
    bf16 = TransformerLM(capped.config, dtype=jnp.bfloat16)
    assert bf16.apply(v, x).dtype == jnp.bfloat16
    tanh = [ln for ln in str(jax.make_jaxpr(bf16.apply)(v, x)).splitlines() if "tanh" in ln]
    assert tanh and all("f32[" in ln and "bf16[" not in ln for ln in tanh), tanh
    for bad in (-1.0, float("nan"), float("inf"), "15", True):
        with pytest.raises(ValueError, match="`logit_softcap` must be a finite number >= 0"):
            _cfg(logit_softcap=bad)


def test_bad_inputs():
    model = TransformerLM(_cfg())
    v = np_init(model, PROMPTS)
    with pytest.raises(ValueError, match="block_size=24"):
        model.apply(v, jnp.zeros((1, 25), jnp.int32))
    with pytest.raises(ValueError, match="tokens"):
        model.apply(v, jnp.full((1, 3), V))
    with pytest.raises(ValueError, match="positions"):
        greedy_search(model, v, PROMPTS, max_new_tokens=30)
    with pytest.raises(ValueError, match="positions"):
        _cfg(positions="alibi")
    with pytest.raises(ValueError, match="block.use_rope"):
        TransformerLMConfig(vocab_size=V, block=gpt_block(2, use_rope=True))


def test_gpt_learns_to_continue_a_pattern():
    """Each sequence repeats a random 3-token motif: after one motif the rest is predictable."""
    model = TransformerLM(_cfg(num_layers=1, embed_dim=32, num_heads=2))
    motifs = np.random.default_rng(2).integers(0, V, (200, 16, 3))
    data = jnp.asarray(np.tile(motifs, (1, 1, 4)), jnp.int32)  # length 12
    v = np_init(model, data[0], scale=None)

    def loss(p, x):
        logits = model.apply(p, x[:, :-1])[:, 2:]
        return token_cross_entropy(logits, x[:, 3:]).mean(), accuracy(logits, x[:, 3:])

    _, (_, acc) = fit(loss, v, data, lr=3e-3, has_aux=True)
    assert float(acc[-10:].mean()) > 0.97  # on batches before training on them

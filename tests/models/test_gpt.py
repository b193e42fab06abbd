"""GPT-style TransformerLM (Bishop §12.3.1; J&M §9.8)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.decoding import beam_search, greedy_search, recompute_decoder
from seqjax.models._common import token_cross_entropy
from seqjax.models.gpt import TransformerLM, TransformerLMConfig
from seqjax.utils import count_params
from tests.models.helpers import fit, np_cross_entropy, np_init

V = 11
RNG = np.random.default_rng(0)
PROMPTS = jnp.asarray(RNG.integers(0, V, (3, 5)), jnp.int32)
LENGTHS = jnp.array([5, 2, 1])


def _cfg(**kw):
    return TransformerLMConfig(**{**dict(vocab_size=V, num_layers=2, num_heads=2, embed_dim=16,
                                         max_len=24), **kw})


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
    with pytest.raises(ValueError, match="preset"):
        TransformerLM.from_preset("gpt-5")


def test_tying_removes_exactly_v_times_d_and_rope_has_no_position_table():
    tied, untied = _count(TransformerLM(_cfg())), _count(TransformerLM(_cfg(tie_embeddings=False)))
    assert untied - tied == V * 16
    assert tied - _count(TransformerLM(_cfg(positions="rope"))) == 24 * 16


@functools.partial(jax.jit, static_argnums=0)
def _tf_and_steps(model, v, tokens):
    logits = model.apply(v, tokens)
    state = model.init_decode_state(v, tokens[:, :1], None, tokens.shape[1] + 1)

    def body(state, tok):
        step_logits, state = model.decode_step(v, state, tok)
        return state, step_logits

    _, steps = jax.lax.scan(body, state, tokens.T)
    return logits, jnp.swapaxes(steps, 0, 1)


def test_teacher_forced_loss_is_sum_of_cached_step_losses():
    model = TransformerLM(_cfg())
    x = jnp.asarray(RNG.integers(0, V, (2, 9)), jnp.int32)
    v = np_init(model, x)
    logits, steps = _tf_and_steps(model, v, x)
    np.testing.assert_allclose(steps, logits, rtol=1e-4, atol=1e-4)
    total = float(token_cross_entropy(logits[:, :-1], x[:, 1:]).sum())
    np.testing.assert_allclose(total, np_cross_entropy(steps[:, :-1], x[:, 1:]).sum(), rtol=1e-5)


def _full_logits(model, v, tokens):
    return model.apply(v, tokens)


@pytest.mark.parametrize("positions,scan_layers", [("learned", False), ("rope", True)])
def test_cached_generation_equals_recomputation(positions, scan_layers):
    """KV-cached decoding == the full causal pass recomputed at every step (Bishop §12.3.1)."""
    model = TransformerLM(_cfg(positions=positions, scan_layers=scan_layers))
    v = np_init(model, PROMPTS, scale=None, seed=3)
    out = greedy_search(model, v, PROMPTS, LENGTHS, max_new_tokens=7)
    ref = greedy_search(recompute_decoder(functools.partial(_full_logits, model)), v, PROMPTS,
                        LENGTHS, max_new_tokens=7)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.log_probs, ref.log_probs, rtol=1e-4)
    assert len(set(map(tuple, np.asarray(out.tokens).tolist()))) > 1  # rows differ


def test_padding_is_invisible_and_bad_inputs():
    model = TransformerLM(_cfg())
    v = np_init(model, PROMPTS)
    apply = jax.jit(model.apply)
    a = apply(v, PROMPTS, LENGTHS)
    b = apply(v, PROMPTS.at[1, 2:].set(0).at[2, 1:].set(3), LENGTHS)
    np.testing.assert_allclose(a[1, :2], b[1, :2], rtol=1e-6)
    np.testing.assert_array_equal(a[2, 1:], 0.0)  # padded positions: zero state, zero logits
    with pytest.raises(ValueError, match="max_len"):
        model.apply(v, jnp.zeros((1, 25), jnp.int32))
    with pytest.raises(ValueError, match="tokens"):
        model.apply(v, jnp.full((1, 3), V))
    with pytest.raises(ValueError, match="positions"):
        greedy_search(model, v, PROMPTS, max_new_tokens=30)


def test_gpt_learns_to_continue_a_pattern():
    """Each sequence repeats a random 3-token motif; after one motif the rest is predictable."""
    model = TransformerLM(_cfg(num_layers=2, embed_dim=32, num_heads=2))
    rng = np.random.default_rng(2)
    motifs = rng.integers(0, V, (201, 16, 3))
    data = jnp.asarray(np.tile(motifs, (1, 1, 4)), jnp.int32)  # length 12
    v = np_init(model, data[0], scale=None)

    def loss(p, x):
        return token_cross_entropy(model.apply(p, x[:, :-1]), x[:, 1:])[:, 2:].mean()

    v, _ = fit(loss, v, data[:-1], lr=3e-3)
    test = data[-1]
    out = greedy_search(model, v, test[:, :4], max_new_tokens=8)
    assert float((out.tokens == test[:, 4:]).mean()) > 0.97
    beam = beam_search(model, v, test[:, :4], beam_size=2, max_new_tokens=8)
    assert float((beam.tokens[:, 0] == test[:, 4:]).mean()) > 0.97

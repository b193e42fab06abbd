"""Encoder–decoder transformer (Vaswani et al. 2017; MEDL §7.5; Bishop §12.3.4)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.decoding import greedy_search, recompute_decoder
from seqjax.models.encoder_decoder import (
    TRANSFORMER_PRESETS,
    Transformer,
    TransformerConfig,
    vaswani_block,
)
from seqjax.utils import count_params
from tests.models.helpers import np_init, reversal_accuracy

RNG = np.random.default_rng(0)
SRC = jnp.asarray(RNG.integers(0, 13, (3, 6)), jnp.int32)
SRC_LEN = jnp.array([6, 4, 2])
CFG = TransformerConfig(src_vocab_size=13, num_layers=1, embed_dim=16,
                        block=vaswani_block(2, mlp_dim=32, dropout_rate=0.0))
MEDL_BLOCK = TRANSFORMER_PRESETS["vaswani-base"].block.replace(attention_use_bias=False)


def _params(model):
    tok = jnp.zeros((1, 4), jnp.int32)
    return jax.eval_shape(model.init, jax.random.PRNGKey(0), tok, tok)["params"]


def test_vaswani_base_parameter_count_reconciles_medl():
    """MEDL §7.5, (7.32): 63,046,144 with d_V = 37,000; Vaswani et al.: ≈65M."""
    p, d_v = 512, 37_000
    medl = Transformer.from_preset("vaswani-base", block=MEDL_BLOCK)
    params = _params(medl)
    assert count_params(params["encoder"]["layers_0"]) == 3_150_336  # MEDL (7.32)
    assert count_params(params["decoder"]["layers_0"]) == 4_199_936
    assert count_params(params["encoder"]) == 18_902_016
    assert count_params(params["decoder"]) == 25_199_616
    # Output layer: d_V·p weights (the shared embedding, tied) + one bias per word. MEDL
    # prints "d_V × p + p": the bias term should be d_V, a difference of d_V - p.
    total = count_params(params)
    assert total == 63_046_144 - p + d_v == 63_082_632
    no_out_bias = count_params(_params(Transformer.from_preset(
        "vaswani-base", block=MEDL_BLOCK, output_bias=False)))
    assert no_out_bias == 63_046_144 - p
    # Vaswani's projections have biases: +4p per attention layer (6 + 2·6 layers).
    vaswani = count_params(_params(Transformer.from_preset("vaswani-base")))
    assert vaswani == total + 18 * 4 * p == 63_119_496
    assert abs(vaswani - 65e6) / 65e6 < 0.03
    assert sorted(params) == ["decoder", "encoder", "output_bias", "shared_embed"]


def test_separate_vocabularies_and_untied_output():
    params = _params(Transformer(CFG.replace(tgt_vocab_size=7, tie_embeddings=False)))
    assert params["src_embed"]["embedding"].shape == (13, 16)
    assert params["tgt_embed"]["embedding"].shape == (7, 16)
    assert params["output"]["kernel"].shape == (16, 7)


def _full_logits(model, src, src_len, v, tokens):
    return model.apply(v, src, tokens, src_len)


def test_cached_generation_equals_recomputation_and_source_padding():
    """Cached decoding == the full pass recomputed at every step; the reference sees the
    sources with different padding content, which must not matter."""
    model = Transformer(CFG.replace(tgt_vocab_size=9))
    prompts = jnp.asarray(RNG.integers(0, 9, (3, 4)), jnp.int32)
    p_len = jnp.array([1, 4, 2])
    v = np_init(model, SRC, prompts, scale=None, seed=1)
    out = greedy_search(model, v, prompts, p_len, max_new_tokens=6,
                        inputs={"src": SRC, "src_lengths": SRC_LEN})
    repadded = SRC.at[1, 4:].set(0).at[2, 2:].set(12)
    ref = greedy_search(recompute_decoder(functools.partial(_full_logits, model, repadded,
                                                            SRC_LEN)),
                        v, prompts, p_len, max_new_tokens=6)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.log_probs, ref.log_probs, rtol=1e-4)
    assert len({tuple(r) for r in np.asarray(out.tokens).tolist()}) > 1


@pytest.mark.parametrize("prompt_len", [1, 3])
def test_decode_state_holds_the_projected_source_once(prompt_len):
    """init_decode_state projects the encoded source into every layer's cross-attention K/V
    (also for 1-token prompts); a step reuses them: its result does not read state["enc"]."""
    model = Transformer(CFG.replace(tgt_vocab_size=9, num_layers=2))
    prompts = jnp.asarray(RNG.integers(0, 9, (3, prompt_len)), jnp.int32)
    v = np_init(model, SRC, prompts, scale=None, seed=2)
    state = model.init_decode_state(v, prompts, max_len=prompt_len + 2, src=SRC,
                                    src_lengths=SRC_LEN)
    for layer in state["cache"]:
        k, val = layer.cross_kv
        assert k.shape == val.shape == (3, 6, 2, 8)  # [B, S, G, d]
    logits, _ = model.decode_step(v, state, prompts[:, -1])
    blind, _ = model.decode_step(v, {**state, "enc": state["enc"] * 0.0}, prompts[:, -1])
    np.testing.assert_array_equal(logits, blind)


def test_bad_inputs():
    model = Transformer(CFG)
    with pytest.raises(ValueError, match="src_lengths"):
        model.init(jax.random.PRNGKey(0), SRC, SRC, jnp.array([7, 1, 1]))
    with pytest.raises(ValueError, match="positions"):
        CFG.replace(positions="alibi")


def test_transformer_learns_to_reverse():
    block = CFG.block.replace(mlp_dim=64, norm="pre")
    model = Transformer(CFG.replace(src_vocab_size=10, embed_dim=32, block=block,
                                    scale_embeddings=False))
    assert reversal_accuracy(model, vocab=10, length=6, lr=3e-3) > 0.97

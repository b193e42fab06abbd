"""RNN encoder–decoder (MEDL §7.4; lecture notes §1–2)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.models.seq2seq import reverse_sequences
from seqjax.train.losses import token_cross_entropy
from seqjax.utils import count_params
from tests.models.helpers import np_cross_entropy, np_init, reversal_accuracy, seq2seq

SRC_V, TGT_V = 9, 7
RNG = np.random.default_rng(0)
SRC = jnp.asarray(RNG.integers(0, SRC_V, (3, 6)), jnp.int32)
SRC_LEN = jnp.array([6, 4, 2])
TGT = jnp.asarray(RNG.integers(0, TGT_V, (3, 5)), jnp.int32)

VARIANTS = {
    "sutskever": dict(context="initial_state", cell_type="lstm", num_layers=2,
                      decoder_layers=2),
    "cho": dict(context="every_step", cell_type="gru", bidirectional=True),
    "bahdanau": dict(context="attention", attention="bahdanau", cell_type="gru",
                     bidirectional=True),
    "luong": dict(context="attention", attention="luong_general", cell_type="lstm",
                  reverse_source=True),
}


def _model(name, **kw):
    return seq2seq(SRC_V, TGT_V, embed_dim=6, hidden_size=8, **{**VARIANTS[name], **kw})


@functools.partial(jax.jit, static_argnums=0)
def _probe(model, v, src, src_len, tgt):
    """Teacher-forced pass, step-by-step decoding and the checks' variations, in one compile."""
    logits, alpha = model.apply(v, src, tgt, src_len, method="with_weights")
    called = model.apply(v, src, tgt, src_len)  # the call: the logits alone
    alpha_other_y0 = None
    if model.config.context == "attention":
        alpha_other_y0 = model.apply(v, src, tgt.at[:, 0].set((tgt[:, 0] + 1) % TGT_V),
                                     src_len, method="with_weights")[1]
    state = model.init_decode_state(v, tgt[:, :1], None, tgt.shape[1], src=src,
                                    src_lengths=src_len)

    def body(state, tok):
        step_logits, state = model.decode_step(v, state, tok)
        return state, step_logits

    _, steps = jax.lax.scan(body, state, tgt.T)
    alone = model.apply(v, src[2:, :2], tgt[2:])  # the last row (length 2) without padding
    plain = None
    if model.config.reverse_source:  # the same parameters without the trick, fed reversed
        plain = model.clone(config=model.config.replace(reverse_source=False)).apply(
            v, reverse_sequences(src, src_len), tgt, src_len, method="with_weights")
    return logits, alpha, alpha_other_y0, jnp.swapaxes(steps, 0, 1), alone, plain, called


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_teacher_forcing_equals_step_by_step_decoding(name):
    model = _model(name)
    v = np_init(model, SRC, TGT)
    logits, alpha, alpha2, steps, alone, plain, called = _probe(model, v, SRC, SRC_LEN, TGT)
    assert logits.shape == (3, 5, TGT_V) and alpha.shape == (3, 5, 6)
    np.testing.assert_array_equal(called, logits)  # with_weights' logits are the call's
    np.testing.assert_allclose(steps, logits, rtol=1e-5, atol=1e-5)
    # Teacher-forced loss == sum of the per-step cross-entropies.
    total = float(token_cross_entropy(logits[:, :-1], TGT[:, 1:]).sum())
    np.testing.assert_allclose(total, np_cross_entropy(steps[:, :-1], TGT[:, 1:]).sum(),
                               rtol=1e-5)
    # A padded source gives the same result as the unpadded sentence (row of length 2).
    np.testing.assert_allclose(logits[2], alone[0], rtol=1e-5, atol=1e-5)
    if plain is not None:
        # reverse_source == feeding the reversed source (MEDL §7.4); the weights are
        # reported against the source as given (reversed back within each length).
        np.testing.assert_allclose(logits, plain[0], rtol=1e-6)
        np.testing.assert_allclose(alpha[1, :, :4], plain[1][1, :, :4][:, ::-1], rtol=1e-6)
    if VARIANTS[name]["context"] != "attention":
        assert float(jnp.abs(alpha).max()) == 0.0
        return
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-5)  # rows of alpha sum to 1
    assert float(alpha[1, :, 4:].max()) == 0.0 and float(alpha[2, :, 2:].max()) == 0.0
    # Timing: Bahdanau's query at step 1 is s^{0} (from the encoder only), so alpha^{1}
    # ignores y^{0}; Luong's query is s^{1} = f(s^{0}, y^{0}), so it does not.
    diff = float(jnp.abs(alpha[:, 0] - alpha2[:, 0]).max())
    if VARIANTS[name]["attention"] == "bahdanau":
        assert diff == 0.0 and float(jnp.abs(alpha[:, 1] - alpha2[:, 1]).max()) > 0
    else:
        assert diff > 0


def test_retired_return_attention_names_with_weights():
    model = _model("bahdanau")
    v = jax.eval_shape(model.init, jax.random.PRNGKey(0), SRC, TGT)
    with pytest.raises(TypeError, match="Seq2Seq.with_weights"):
        model.apply(v, SRC, TGT, SRC_LEN, return_attention=True)


def test_reverse_sequences():
    x = jnp.array([[1, 2, 3, 0], [4, 5, 6, 7]])
    assert reverse_sequences(x, jnp.array([3, 4])).tolist() == [[3, 2, 1, 0], [7, 6, 5, 4]]


def test_parameter_names_and_bridges():
    shapes = {name: jax.eval_shape(_model(name).init, jax.random.PRNGKey(0), SRC, TGT)
              for name in VARIANTS}
    p = shapes["bahdanau"]["params"]
    assert sorted(p) == ["bridge_layers_0", "decoder", "encoder", "output", "src_embed",
                         "tgt_embed"]
    assert sorted(p["decoder"]["attention"]) == ["key_kernel", "query_kernel", "v"]
    # Decoder input = [y; u] with u the 2H-wide bidirectional context.
    assert p["decoder"]["layer_0"]["input"]["kernel"].shape == (6 + 16, 24)
    assert "bridge_layers_0" not in shapes["sutskever"]["params"]  # copies encoder carries
    assert p["output"]["kernel"].shape == (8 + 16, TGT_V)  # g([s; u])
    assert shapes["luong"]["params"]["decoder"]["combine"]["kernel"].shape == (16, 8)
    assert count_params(shapes["cho"]) > 0


def test_bad_configuration():  # refused when the config is built, before any call
    with pytest.raises(ValueError, match="context"):
        _model("cho", context="nope")
    with pytest.raises(ValueError, match="bridge"):
        _model("cho", bridge="copy")
    with pytest.raises(ValueError, match="src"):  # out-of-vocabulary ids (concrete input)
        _model("cho").init(jax.random.PRNGKey(0), SRC + SRC_V, TGT)


def test_attention_seq2seq_learns_to_reverse():
    """Reverse 5-token sequences (a toy translation) with Bahdanau attention."""
    model = seq2seq(8, 8, embed_dim=16, hidden_size=32, cell_type="gru", context="attention",
                    attention="bahdanau")
    assert reversal_accuracy(model, vocab=8, length=5, lr=1e-2) > 0.97

"""The RNN encoder–decoder against the textbooks: the code vector's paths into the decoder
(MEDL Fig. 7.9(a)/(b)), a numpy reference of the lecture notes' eqs. (3)–(5), the eq. (5)
output layer on ``s`` alone, and scheduled sampling (Bengio et al. 2015)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.decoding import greedy_search
from seqjax.models.seq2seq import (
    Seq2Seq,
    scheduled_sampling_epsilon,
    scheduled_sampling_inputs,
)
from seqjax.train.losses import masked_cross_entropy
from tests.models.helpers import fit, np_init, seq2seq

SRC_V, TGT_V, E, H = 9, 7, 5, 6
RNG = np.random.default_rng(3)
SRC_A = jnp.asarray(RNG.integers(0, SRC_V, (3, 6)), jnp.int32)
SRC_B = jnp.asarray(RNG.integers(0, SRC_V, (3, 6)), jnp.int32)
SRC_LEN = jnp.array([6, 4, 2])
TGT = jnp.asarray(RNG.integers(0, TGT_V, (3, 5)), jnp.int32)


def _model(**kw):
    return seq2seq(SRC_V, TGT_V, embed_dim=E, hidden_size=H, **kw)


def _parts(model, v, src):
    """``(v_enc, src_valid, z*, decoder initial carries)`` of ``src``."""
    return model.apply(v, src, SRC_LEN, method=Seq2Seq.encode)


def _decode_from(model, v, init, enc, src_valid, z):
    """The teacher-forced decoder given the encoder's outputs (any source's)."""
    valid = jnp.ones(TGT.shape, bool)
    return model.apply(v, init, TGT, valid, enc, src_valid, z, True,
                       method=Seq2Seq._decode)[1]


def _differs_at_every_step(a, b):
    return bool(np.all(np.abs(np.asarray(a) - np.asarray(b)).max(axis=(0, 2)) > 1e-6))


# ----------------------------------------------------------------------------- MEDL Fig. 7.9(a)


def test_fig_7_9a_code_vector_reaches_the_decoder_only_as_its_initial_state():
    model = _model(context="initial_state", cell_type="lstm", bridge="dense")
    v = np_init(model, SRC_A, TGT)
    logits_a = model.apply(v, SRC_A, TGT, SRC_LEN)
    logits_b = model.apply(v, SRC_B, TGT, SRC_LEN)
    assert _differs_at_every_step(logits_a, logits_b)  # the source reaches every output
    enc_a, valid_a, z_a, init_a = _parts(model, v, SRC_A)
    enc_b, valid_b, z_b, init_b = _parts(model, v, SRC_B)
    # s^{0} = bridge(z*) is the only edge: the other source's z*/outputs change nothing ...
    np.testing.assert_array_equal(_decode_from(model, v, init_a, enc_b, valid_b, z_b), logits_a)
    # ... and its initial state alone moves the decoder to the other source's outputs.
    np.testing.assert_array_equal(_decode_from(model, v, init_b, enc_a, valid_a, z_a), logits_b)
    # Cut that edge (s^{0} = 0): the decoder no longer sees the source at all.
    cut = model.clone(config=model.config.replace(bridge="zeros"))
    vc = np_init(cut, SRC_A, TGT)
    np.testing.assert_array_equal(cut.apply(vc, SRC_A, TGT, SRC_LEN),
                                  cut.apply(vc, SRC_B, TGT, SRC_LEN))


def test_fig_7_9a_copy_bridge_hands_over_the_encoder_state():
    # Sutskever et al.: s^{0} is the encoder's final carry, layer by layer (MEDL Fig. 7.9(a)).
    model = _model(context="initial_state", cell_type="lstm", num_layers=2,
                   decoder_layers=2, bridge="copy")
    v = np_init(model, SRC_A, TGT)
    _, _, z, init = _parts(model, v, SRC_A)
    np.testing.assert_array_equal(init[-1][1], z)  # top layer's h is the code vector z*


# ----------------------------------------------------------------------------- MEDL Fig. 7.9(b)


def _cut_z(v, *, inputs=False, output=False):
    """Zero the rows of the decoder-input / output kernels that multiply ``z*``."""
    p = jax.tree_util.tree_map(np.array, v["params"])
    if inputs:
        p["decoder"]["layer_0"]["input"]["kernel"][E:] = 0.0
    if output:
        p["output"]["kernel"][H:] = 0.0
    return {"params": p}


def test_fig_7_9b_code_vector_reaches_every_step_and_every_output():
    model = _model(context="every_step", cell_type="gru", bridge="zeros")
    v = np_init(model, SRC_A, TGT)

    def moved(params):
        return _differs_at_every_step(model.apply(params, SRC_A, TGT, SRC_LEN),
                                      model.apply(params, SRC_B, TGT, SRC_LEN))

    # s^{0} = 0, so the source can only come in through z* — and it does, at every step.
    assert moved(v)
    # The figure's two edges from z*: into each step's input, and into each output.
    assert moved(_cut_z(v, inputs=True))  # the output edge alone
    assert moved(_cut_z(v, output=True))  # the input edge alone (through s^{t})
    both = _cut_z(v, inputs=True, output=True)  # no edge left: no dependence on the source
    np.testing.assert_array_equal(model.apply(both, SRC_A, TGT, SRC_LEN),
                                  model.apply(both, SRC_B, TGT, SRC_LEN))
    # Swapping only z* moves the decoder to the other source's outputs exactly.
    enc_a, valid_a, _, init_a = _parts(model, v, SRC_A)
    _, _, z_b, _ = _parts(model, v, SRC_B)
    np.testing.assert_allclose(_decode_from(model, v, init_a, enc_a, valid_a, z_b),
                               model.apply(v, SRC_B, TGT, SRC_LEN), rtol=1e-6, atol=1e-6)


def test_output_on_s_alone_is_eq_5():
    full = _model(context="every_step", cell_type="gru", bridge="zeros")
    eq5 = full.clone(config=full.config.replace(output_context=False))
    v = np_init(full, SRC_A, TGT)
    v5 = np_init(eq5, SRC_A, TGT)
    assert v["params"]["output"]["kernel"].shape == (H + H, TGT_V)  # g([s; z*]) by default
    assert v5["params"]["output"]["kernel"].shape == (H, TGT_V)  # g(s): notes eq. (5)
    # g([s; z*]) with the z* rows of W zeroed is g(s) with the s rows of W.
    p5 = jax.tree_util.tree_map(np.array, v["params"])
    p5["output"]["kernel"] = p5["output"]["kernel"][:H]
    np.testing.assert_allclose(eq5.apply({"params": p5}, SRC_A, TGT, SRC_LEN),
                               full.apply(_cut_z(v, output=True), SRC_A, TGT, SRC_LEN),
                               rtol=1e-6, atol=1e-6)
    # Bahdanau's output on s alone is MEDL (7.22)'s f_decoder-out(s^{t}).
    bahdanau = _model(context="attention", attention="bahdanau", output_context=False)
    vb = np_init(bahdanau, SRC_A, TGT)
    assert vb["params"]["output"]["kernel"].shape == (H, TGT_V)
    no_bias = _model(context="every_step", output_context=False, output_bias=False)
    assert "bias" not in np_init(no_bias, SRC_A, TGT)["params"]["output"]
    with pytest.raises(ValueError, match="output_context"):
        np_init(_model(context="attention", attention="luong_dot", output_context=False),
                SRC_A, TGT)


def test_lecture_notes_eqs_3_to_5_numpy_reference():
    """h_t = f(x_t, h_{t-1}), c = h_T (3); h'_t = σ(y_{t-1}, h'_{t-1}, c) (4);
    y_t = softmax(W_y h'_t) (5), with f, σ Elman tanh cells and h'_0 = 0."""
    model = _model(context="every_step", cell_type="elman", bridge="zeros",
                   output_context=False, output_bias=False)
    v = np_init(model, SRC_A, TGT)
    probs = jax.nn.softmax(model.apply(v, SRC_A, TGT, SRC_LEN), axis=-1)
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), v["params"])
    enc, dec = p["encoder"]["layer_0"]["cell"], p["decoder"]["layer_0"]
    for b in range(SRC_A.shape[0]):
        h = np.zeros(H)
        for t in range(int(SRC_LEN[b])):  # (3), over the real tokens only
            x = p["src_embed"]["embedding"][int(SRC_A[b, t])]
            h = np.tanh(x @ enc["input"]["kernel"] + enc["input"]["bias"]
                        + h @ enc["recurrent_kernel"])
        c = h
        s = np.zeros(H)
        for t in range(TGT.shape[1]):
            y_prev = p["tgt_embed"]["embedding"][int(TGT[b, t])]
            s = np.tanh(np.concatenate([y_prev, c]) @ dec["input"]["kernel"]
                        + dec["input"]["bias"] + s @ dec["recurrent_kernel"])  # (4)
            a = s @ p["output"]["kernel"]  # (5): W_y h'_t, no bias
            ref = np.exp(a - a.max()) / np.exp(a - a.max()).sum()
            np.testing.assert_allclose(probs[b, t], ref, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- scheduled sampling


def test_epsilon_schedules_follow_bengio_et_al_2015():
    i = np.arange(0, 3000, 250)
    np.testing.assert_allclose(scheduled_sampling_epsilon(i, "linear", k=1.0, c=5e-4,
                                                          minimum=0.2),
                               np.maximum(0.2, 1.0 - 5e-4 * i), rtol=1e-6)
    np.testing.assert_allclose(scheduled_sampling_epsilon(i, "exponential", k=0.999),
                               0.999 ** i, rtol=1e-5)
    np.testing.assert_allclose(scheduled_sampling_epsilon(i, "inverse_sigmoid", k=300.0),
                               300.0 / (300.0 + np.exp(i / 300.0)), rtol=1e-5)
    assert float(scheduled_sampling_epsilon(7, "constant")) == 1.0
    # traced steps work (a schedule inside a jitted step)
    np.testing.assert_allclose(jax.jit(lambda s: scheduled_sampling_epsilon(
        s, "exponential", k=0.5))(jnp.int32(3)), 0.125)
    for bad in (dict(schedule="cosine"), dict(schedule="linear"),
                dict(schedule="exponential", k=1.5), dict(schedule="inverse_sigmoid", k=0.5),
                dict(schedule="constant", k=2.0)):
        with pytest.raises(ValueError, match="schedule|`c`|`k`"):
            scheduled_sampling_epsilon(1, **bad)


@pytest.fixture(scope="module")
def attention_model():
    model = _model(context="attention", attention="bahdanau", cell_type="gru",
                   bidirectional=True)
    return model, np_init(model, SRC_A, TGT)


def test_epsilon_one_is_teacher_forcing_exactly(attention_model):
    model, v = attention_model
    mixed, truth = scheduled_sampling_inputs(model, v, SRC_A, TGT, SRC_LEN, epsilon=1.0,
                                             rng=jax.random.PRNGKey(0))
    assert bool(truth.all())
    np.testing.assert_array_equal(mixed, TGT)
    np.testing.assert_array_equal(model.apply(v, SRC_A, mixed, SRC_LEN),
                                  model.apply(v, SRC_A, TGT, SRC_LEN))


def test_epsilon_zero_feeds_back_the_greedy_decode(attention_model):
    model, v = attention_model
    mixed, truth = scheduled_sampling_inputs(model, v, SRC_A, TGT, SRC_LEN, epsilon=0.0,
                                             rng=jax.random.PRNGKey(0))
    assert bool(truth[:, 0].all()) and not bool(truth[:, 1:].any())
    out = greedy_search(model, v, TGT[:, :1], max_new_tokens=TGT.shape[1] - 1,
                        inputs={"src": SRC_A, "src_lengths": SRC_LEN})
    np.testing.assert_array_equal(mixed[:, 0], TGT[:, 0])
    np.testing.assert_array_equal(mixed[:, 1:], out.tokens)
    # the teacher-forced pass over the mixed inputs sees what the loop saw: its argmax at
    # t is the token fed at t + 1
    logits = model.apply(v, SRC_A, mixed, SRC_LEN)
    np.testing.assert_array_equal(jnp.argmax(logits[:, :-1], -1), mixed[:, 1:])


def test_mixing_rate_per_row_and_sampling(attention_model):
    model, v = attention_model
    src = jnp.tile(SRC_A, (30, 1))
    tgt = jnp.tile(TGT, (30, 1))
    lens = jnp.tile(SRC_LEN, 30)
    eps = jnp.where(jnp.arange(90) < 45, 0.25, 0.75)
    _, truth = scheduled_sampling_inputs(model, v, src, tgt, lens, epsilon=eps,
                                         rng=jax.random.PRNGKey(1), sample=True)
    rate_lo, rate_hi = float(truth[:45, 1:].mean()), float(truth[45:, 1:].mean())
    assert abs(rate_lo - 0.25) < 0.1 and abs(rate_hi - 0.75) < 0.1
    with pytest.raises(ValueError, match="epsilon"):
        scheduled_sampling_inputs(model, v, SRC_A, TGT, SRC_LEN, epsilon=1.5,
                                  rng=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="epsilon"):
        scheduled_sampling_inputs(model, v, SRC_A, TGT, SRC_LEN, epsilon=jnp.ones(2),
                                  rng=jax.random.PRNGKey(0))


def test_scheduled_sampling_trains_inside_a_jitted_step():
    # The reverse task; epsilon decays over the steps from the schedule inside the scan.
    rng = np.random.default_rng(0)
    steps, batch, n = 40, 16, 4
    x = rng.integers(3, SRC_V, (steps, batch, n)).astype(np.int32)
    tgt_out = np.concatenate([x[..., ::-1], np.full((steps, batch, 1), 2)], -1) % TGT_V
    tgt_in = np.concatenate([np.ones((steps, batch, 1), np.int32), tgt_out[..., :-1]], -1)
    model = _model(context="every_step", cell_type="gru")
    v = np_init(model, jnp.asarray(x[0]), jnp.asarray(tgt_in[0]), scale=None)
    batches = {"src": x, "tgt_in": tgt_in, "tgt_out": tgt_out, "step": np.arange(steps)}

    def loss_fn(p, b):
        eps = scheduled_sampling_epsilon(b["step"], "linear", c=1.0 / steps, minimum=0.5)
        mixed, _ = scheduled_sampling_inputs(model, p, b["src"], b["tgt_in"], epsilon=eps,
                                             rng=jax.random.fold_in(jax.random.PRNGKey(0),
                                                                    b["step"]))
        return masked_cross_entropy(model.apply({"params": p}, b["src"], mixed), b["tgt_out"])

    _, losses = fit(loss_fn, v["params"], batches, lr=3e-2)
    assert np.isfinite(losses).all() and losses[-5:].mean() < losses[:5].mean()

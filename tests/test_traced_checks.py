"""The traced-value policy (``seqjax._traced_checks``): under ``jit`` an invalid token id,
length or KV-cache overflow makes the affected outputs NaN, and ``seqjax.checked`` turns
the same conditions into errors with the host check's message. Each case runs jitted in
both modes; outside ``jit`` the host checks still raise ``ValueError``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.checkify import JaxRuntimeError

import seqjax
from seqjax import nn as snn
from seqjax.models import RNNClassifier, RNNClassifierConfig, RNNTagger, RNNTaggerConfig
from tests.test_bad_inputs import KEY, X8, V, bound, decode_state, i32

OK = np.array([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]], np.int32)


def bad_row(bad_id: int, pos: int = 2) -> np.ndarray:
    """``OK`` with one invalid id in row 1."""
    tokens = OK.copy()
    tokens[1, pos] = bad_id
    return tokens


def assert_row_nan(out, row: int = 1) -> None:
    """Every output of ``row`` is NaN, every output of the other rows finite."""
    for leaf in jax.tree_util.tree_leaves(out):
        leaf = np.asarray(leaf)
        if not np.issubdtype(leaf.dtype, np.floating):
            continue
        assert np.isnan(leaf[row]).all(), leaf[row]
        assert np.isfinite(np.delete(leaf, row, axis=0)).all()


def assert_refused(fn, *args, words: list[str]) -> None:
    with pytest.raises(JaxRuntimeError) as info:
        seqjax.checked(fn)(*args)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# ------------------------------------------------------------------ token ids


@pytest.mark.parametrize("bad_id", [-1, V])
@pytest.mark.parametrize("kind", ["rnnlm", "gpt", "bert"])
def test_an_invalid_id_makes_its_row_nan_and_checked_raises(kind, bad_id):
    m, v = bound(kind)
    f = jax.jit(m.apply)
    assert np.isfinite(jax.tree_util.tree_leaves(f(v, OK))[0]).all()
    assert not jax.make_jaxpr(m.apply)(v, OK).effects  # no check staged outside `checked`
    assert_row_nan(f(v, bad_row(bad_id)))  # -1 no longer reads the last id
    assert_refused(f, v, bad_row(bad_id),
                   words=["`tokens`", f"[0, {V - 1}]", f"vocab_size={V}", str(bad_id)])
    with pytest.raises(ValueError, match="`tokens`"):  # outside jit: the host check
        m.apply(v, bad_row(bad_id))


@pytest.mark.parametrize("side", ["src", "tgt_in"])
@pytest.mark.parametrize("kind", ["transformer", "seq2seq"])
def test_encoder_decoders_poison_the_row_of_an_invalid_source_or_target_id(kind, side):
    m, v = bound(kind)
    f = jax.jit(m.apply)
    src, tgt = i32(2, 5), i32(2, 3)
    args = (bad_row(-1), tgt) if side == "src" else (src, bad_row(-1)[:, :3])
    assert not jax.make_jaxpr(m.apply)(v, *args).effects
    assert_row_nan(f(v, *args))
    assert_refused(f, v, *args, words=[f"`{side}`", "-1"])


@pytest.mark.parametrize("cls", [RNNClassifier, RNNTagger])
def test_rnn_classifier_and_tagger_poison_the_row(cls):
    if cls is RNNClassifier:
        m = cls(RNNClassifierConfig(vocab_size=V, embed_dim=4, hidden_size=4, pooling="first",
                                    num_classes=3))
    else:
        m = cls(RNNTaggerConfig(vocab_size=V, embed_dim=4, hidden_size=4, bidirectional=True,
                                num_tags=3))
    v = m.init(KEY, OK)
    f = jax.jit(m.apply)
    # An id late in the row: the "first" pooling does not read it, the row is NaN anyway.
    assert_row_nan(f(v, bad_row(V, pos=4)))
    assert_refused(f, v, bad_row(V, pos=4), words=["`inputs`", str(V)])


def test_embed_layer_and_lookup_read_nan_for_invalid_ids():
    table = jnp.arange(6.0).reshape(3, 2)
    for backward in ("autodiff", "one_hot", "scatter"):
        f = jax.jit(lambda ids, b=backward: snn.embedding_lookup(table, ids, backward=b))
        out = np.asarray(f(jnp.array([0, -1, 3, 2])))
        np.testing.assert_array_equal(out[[0, 3]], [[0, 1], [4, 5]])
        assert np.isnan(out[[1, 2]]).all()
        assert_refused(f, jnp.array([0, -1]), words=["`ids`", "[0, 2]", "-1"])
    emb = snn.Embed(3, 2)
    p = emb.init(KEY, jnp.zeros((1,), jnp.int32))
    g = jax.jit(emb.apply)
    assert np.isnan(g(p, jnp.array([-1]))).all()
    assert_refused(g, p, jnp.array([5]), words=["`inputs`", "5"])


def test_a_traced_decode_step_token_is_refused_under_checked():
    m, v = bound("gpt")
    state = decode_state("gpt")
    step = jax.jit(m.decode_step)
    logits, _ = step(v, state, jnp.array([1, V]))
    assert np.isnan(logits[1]).all() and np.isfinite(logits[0]).all()
    assert_refused(step, v, state, jnp.array([1, V]), words=["`tokens`", str(V)])


def test_a_grad_of_the_loss_is_nan_and_checked_raises():
    m, v = bound("rnnlm")

    def loss(params, tokens):
        return jnp.mean(m.apply(params, tokens))

    g = jax.jit(jax.value_and_grad(loss))
    value, grads = g(v, bad_row(-1))
    assert np.isnan(value) and any(np.isnan(x).any() for x in jax.tree_util.tree_leaves(grads))
    assert_refused(g, v, bad_row(-1), words=["`tokens`", "-1"])
    seqjax.checked(g)(v, OK)  # the happy path passes



def test_a_model_traced_again_is_the_same_program():
    """checkify numbers each check it traces from a process-wide counter, and the number is a
    constant of the program: the checks are staged through jit's trace cache so that the same
    model traced again (a second run in one process) lowers to the same module, which JAX's
    persistent compilation cache then finds instead of compiling it again."""
    m, v = bound("gpt")

    def lowered() -> str:
        step = jax.jit(lambda params, tokens: m.apply(params, tokens))  # a new function
        return step.lower(v, OK).as_text()

    first = lowered()
    assert "stablehlo" in first and lowered() == first
    # ... and still checked where it runs under checkify.
    assert_refused(jax.jit(lambda params, tokens: m.apply(params, tokens)), v, bad_row(V),
                   words=["`tokens`", str(V)])

# ------------------------------------------------------------------ lengths


@pytest.mark.parametrize("kind", ["rnn-lstm", "rnn-gru", "bi", "stacked", "stacked-bi"])
@pytest.mark.parametrize("bad", [6, -1])
def test_rnn_lengths_outside_0_T_make_the_row_nan(kind, bad):
    m, v = bound(kind)  # x: [2, 5, 8], so lengths must lie in [0, 5]
    f = jax.jit(m.apply)
    lengths = jnp.array([3, bad])
    leaves = jax.tree_util.tree_leaves(f(v, X8, jnp.array([3, 5])))
    assert all(np.isfinite(x).all() for x in leaves)
    assert_row_nan(f(v, X8, lengths))  # outputs and carries: never clipped to [0, T]
    assert_refused(f, v, X8, lengths, words=["`lengths`", "[0, 5]", str(bad)])
    with pytest.raises(ValueError, match="`lengths`"):
        m.apply(v, X8, np.array([3, bad]))


def test_rnn_lm_lengths_and_their_gradient():
    m, v = bound("rnnlm")
    f = jax.jit(m.apply)
    assert_row_nan(f(v, OK, jnp.array([5, 9])))
    assert_refused(f, v, OK, jnp.array([5, 9]), words=["`lengths`", "[0, 5]", "9"])
    g = jax.jit(jax.grad(lambda p, n: jnp.sum(m.apply(p, OK, n))))
    assert_refused(g, v, jnp.array([5, 9]), words=["`lengths`", "9"])


@pytest.mark.parametrize("bad", [7, -1])  # -1: never zeroed by the padding mask either
@pytest.mark.parametrize("kind", ["gpt", "bert"])
def test_transformer_models_poison_the_row_of_a_bad_length(kind, bad):
    m, v = bound(kind)
    f = jax.jit(m.apply)
    assert_row_nan(f(v, OK, jnp.array([5, bad])))
    assert_refused(f, v, OK, jnp.array([5, bad]), words=["`lengths`", "[0, 5]", str(bad)])


def _decoder_stack():
    m = snn.TransformerDecoder(config=snn.BlockConfig.decoder(num_heads=2), num_layers=2)
    return m, m.init(KEY, X8, encoder_out=np.ones((2, 4, 6), np.float32))


# Each layer that reads a lengths argument itself: (module, variables, call with the
# lengths as the only traced argument, the argument's name, its range).
ENC = np.ones((2, 4, 6), np.float32)
LENGTH_DOORS = {
    "mha-lengths": (lambda: bound("mha"), lambda m, v, n: m.apply(v, X8, lengths=n),
                    "lengths", 5),
    "mha-kv_lengths": (lambda: bound("mha-cross"),
                       lambda m, v, n: m.apply(v, X8, ENC, kv_lengths=n), "kv_lengths", 4),
    "mha-cached": (lambda: bound("mha"),
                   lambda m, v, n: m.apply(
                       v, X8, snn.MultiHeadAttention(num_heads=2, head_dim=4).init_cache(2, 8),
                       lengths=n, method="decode")[0],
                   "lengths", 5),
    "block": (lambda: bound("block"), lambda m, v, n: m.apply(v, X8, lengths=n), "lengths", 5),
    "block-encoder_lengths": (lambda: bound("block-cross"),
                              lambda m, v, n: m.apply(v, X8, encoder_out=ENC,
                                                      encoder_lengths=n),
                              "encoder_lengths", 4),
    "encoder": (lambda: bound("encoder"), lambda m, v, n: m.apply(v, X8, lengths=n),
                "lengths", 5),
    "decoder": (_decoder_stack, lambda m, v, n: m.apply(v, X8, lengths=n, encoder_out=ENC),
                "lengths", 5),
    "decoder-encoder_lengths": (_decoder_stack,
                                lambda m, v, n: m.apply(v, X8, encoder_out=ENC,
                                                        encoder_lengths=n),
                                "encoder_lengths", 4),
}


@pytest.mark.parametrize("door", sorted(LENGTH_DOORS))
def test_attention_and_transformer_stacks_poison_the_row_of_a_bad_length(door):
    build, call, name, high = LENGTH_DOORS[door]
    m, v = build()
    f = jax.jit(lambda v, n: call(m, v, n))
    assert np.isfinite(np.asarray(f(v, jnp.array([high, 1])))).all()
    assert not jax.make_jaxpr(lambda v, n: call(m, v, n))(v, jnp.array([high, 1])).effects
    for bad in (high + 1, -1):  # never clipped: above T and below 0
        lengths = jnp.array([high, bad])
        assert_row_nan(f(v, lengths))
        assert_refused(f, v, lengths, words=[f"`{name}`", f"[0, {high}]", str(bad)])
        with pytest.raises(ValueError, match=f"`{name}`"):  # outside jit: the host check
            call(m, v, np.array([high, bad]))
    seqjax.checked(f)(v, jnp.array([high, 0]))  # the happy path passes


@pytest.mark.parametrize("side", ["src_lengths", "tgt_lengths"])
def test_the_encoder_decoder_poisons_the_row_of_a_bad_source_or_target_length(side):
    m, v = bound("transformer")  # src [2, 5]: src_lengths in [1, 5]; tgt [2, 3]: [0, 3]
    src, tgt = i32(2, 5), i32(2, 3)
    low, high = (1, 5) if side == "src_lengths" else (0, 3)

    def call(n):
        return lambda v, n: m.apply(v, src, tgt, **{side: n})

    f = jax.jit(call(None))
    assert np.isfinite(np.asarray(f(v, jnp.array([high, low])))).all()
    for bad in (low - 1, high + 1):
        lengths = jnp.array([high, bad])
        assert_row_nan(f(v, lengths))
        assert_refused(f, v, lengths, words=[f"`{side}`", f"[{low}, {high}]", str(bad)])
        with pytest.raises(ValueError, match=f"`{side}`"):
            m.apply(v, src, tgt, **{side: np.array([high, bad])})
    g = jax.jit(jax.grad(lambda v, n: jnp.sum(m.apply(v, src, tgt, **{side: n}))))
    assert_refused(g, v, jnp.array([high, high + 1]), words=[f"`{side}`"])


# ------------------------------------------------------------------ KV cache


def test_kv_cache_overflow_poisons_the_row_and_checked_raises():
    cache = snn.KVCache.create(2, 3, 1, 2)
    write = jax.jit(lambda c, k, n: c.update(k, k, n))
    cache = write(cache, jnp.ones((2, 2, 1, 2)), jnp.array([2, 1]))
    full = write(cache, jnp.ones((2, 2, 1, 2)), jnp.array([2, 2]))
    assert not jax.make_jaxpr(write)(cache, jnp.ones((2, 2, 1, 2)), jnp.array([2, 2])).effects
    assert full.overflow.tolist() == [1, 0]
    assert np.isnan(full.k[0, -1]).all() and np.isnan(full.v[0, -1]).all()
    assert np.isfinite(full.k[1]).all() and np.isfinite(full.k[0, :2]).all()
    assert_refused(write, cache, jnp.ones((2, 2, 1, 2)), jnp.array([2, 2]),
                   words=["KV cache overflow", "max_len=3", "4"])
    seqjax.checked(write)(cache, jnp.ones((2, 2, 1, 2)), jnp.array([1, 2]))  # fits


def test_decoding_past_max_len_gives_nan_logits_from_the_overflowing_step():
    m, v = bound("gpt")
    # Prompts of 3 and 1 tokens in a 4-slot cache: row 0 fills up first.
    state = m.init_decode_state(v, np.array([[1, 2, 3], [4, 0, 0]]), np.array([3, 1]), 4)
    step = jax.jit(m.decode_step)
    finite = []
    for n in range(4):
        if n == 2:
            assert_refused(step, v, state, jnp.array([1, 1]),
                           words=["KV cache overflow", "max_len=4"])
        elif n < 2:
            seqjax.checked(step)(v, state, jnp.array([1, 1]))
        logits, state = step(v, state, jnp.array([1, 1]))
        finite.append(np.isfinite(logits).all(axis=-1).tolist())
    # Row 0 stores positions 2 and 3, then overflows at its third step; row 1 never does.
    assert finite == [[True, True], [True, True], [False, True], [False, True]]


# ------------------------------------------------------------------ the switch


def test_checked_returns_the_outputs_and_hands_checks_to_an_enclosing_checked():
    m, v = bound("gpt")
    f = jax.jit(m.apply)
    np.testing.assert_array_equal(seqjax.checked(f)(v, OK), f(v, OK))

    def outer(params, tokens):  # a checked function called inside another one
        return seqjax.checked(m.apply)(params, tokens) * 2

    assert_refused(jax.jit(outer), v, bad_row(-1), words=["`tokens`", "-1"])


def test_the_unchecked_program_has_no_callback():
    m, v = bound("gpt")
    text = jax.jit(m.apply).lower(v, OK).as_text()
    assert "callback" not in text


def test_the_switch_is_off_outside_checked_and_survives_a_reload():
    import importlib

    from seqjax import _traced_checks

    switch = _traced_checks._SWITCH
    assert switch is not None and not _traced_checks._staging()  # this JAX has the state
    with _traced_checks._checks_on():
        assert _traced_checks._staging()
    assert importlib.reload(_traced_checks)._SWITCH is switch  # not defined twice


def test_checked_traces_again_a_function_jit_already_traced_without_checks():
    m, v = bound("gpt")
    f = jax.jit(m.apply)
    assert np.isnan(f(v, bad_row(-1))).any()  # traced and cached without the checks
    assert_refused(f, v, bad_row(-1), words=["`tokens`", "-1"])
    assert np.isnan(f(v, bad_row(-1))).any()  # and the plain program is still the plain one
    assert not jax.make_jaxpr(f)(v, bad_row(-1)).effects


# ------------------------------------------------------------------ deliverable 2


def test_pad_id_is_a_token_id():
    lm, v = bound("rnnlm")
    for pad in (-1, V):
        with pytest.raises(ValueError, match=rf"`pad_id` must be a token id in \[0, {V - 1}\]"
                                             rf".*got {pad}"):
            seqjax.greedy_search(lm, v, i32(2, 3), max_new_tokens=2, pad_id=pad)


def test_models_that_read_a_first_or_last_token_refuse_t_0():
    with pytest.raises(ValueError, match=r"`tokens`.*at least one.*\[CLS\].*\(2, 0\)"):
        bound("bert")[0].apply(bound("bert")[1], i32(2, 0))
    m = RNNClassifier(RNNClassifierConfig(vocab_size=V, embed_dim=4, hidden_size=4,
                                          num_classes=3, pooling="first"))
    v = m.init(KEY, OK)
    with pytest.raises(ValueError, match=r"`inputs`.*at least one.*pooling='first'"):
        m.apply(v, i32(2, 0))


def test_seq2seq_source_lengths_outside_1_S_make_the_row_nan():
    m, v = bound("seq2seq")
    f = jax.jit(m.apply)
    src, tgt = i32(2, 5), i32(2, 3)
    for bad in (0, 6):  # 0: the encoder would pass on its initial state as if it had read
        assert_row_nan(f(v, src, tgt, jnp.array([5, bad])))
        assert_refused(f, v, src, tgt, jnp.array([5, bad]),
                       words=["`src_lengths`", "[1, 5]", str(bad)])

"""Fuzzing masks, lengths and token ids across the layers (hypothesis).

For any combination the guards either accept the input and give finite values that respect
it (padding rows zero, fully masked rows zero, weights summing to 1 over visible keys), or
refuse it with an error naming the argument — never an internal error, never a NaN that
was not asked for. Shapes are fixed, so each jitted function compiles once.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqjax import nn as snn
from seqjax.models import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.train.step import make_batch_check

B, T, K, D, V = 3, 5, 4, 8, 7
FUZZ = settings(max_examples=25, deadline=None)

lengths_in_range = st.lists(st.integers(0, T), min_size=B, max_size=B)
any_lengths = st.lists(st.integers(-2, T + 2), min_size=B, max_size=B)
masks = st.lists(st.booleans(), min_size=B * T * T, max_size=B * T * T)
ids = st.lists(st.integers(-3, V + 3), min_size=B * T, max_size=B * T)
keep = st.lists(st.booleans(), min_size=B * T, max_size=B * T)


@functools.cache
def mha() -> tuple:
    m = snn.MultiHeadAttention(num_heads=2, head_dim=4)
    x = np.random.default_rng(0).normal(size=(B, T, D)).astype(np.float32)
    kv = np.random.default_rng(1).normal(size=(B, K, D)).astype(np.float32)
    v = m.init(jax.random.PRNGKey(0), x, kv)
    self_attn = jax.jit(lambda n, mk: m.apply(v, x, lengths=n, mask=mk))
    cross = jax.jit(lambda n, kn: m.apply(v, x, kv, lengths=n, kv_lengths=kn))
    return m, v, x, self_attn, cross


@functools.cache
def gpt() -> tuple:
    m = TransformerLM(TransformerLMConfig(vocab_size=V, num_layers=1, embed_dim=D,
                                          block_size=16, block=gpt_block(2)))
    v = m.init(jax.random.PRNGKey(0), np.ones((B, T), np.int32))
    state = m.init_decode_state(v, np.ones((B, 2), np.int32), None, 8)
    return m, v, state, jax.jit(m.decode_step)


@FUZZ
@given(lengths=lengths_in_range, mask=masks)
def test_self_attention_with_any_lengths_and_mask_is_finite_and_zero_past_the_end(
        lengths, mask):
    *_, self_attn, _ = mha()
    n = np.array(lengths, np.int32)
    mk = np.array(mask, bool).reshape(B, 1, T, T)
    out = np.asarray(self_attn(n, mk))
    assert np.isfinite(out).all()
    past = np.arange(T)[None, :] >= n[:, None]
    assert not out[past].any()


@FUZZ
@given(lengths=lengths_in_range, kv_lengths=st.lists(st.integers(0, K), min_size=B, max_size=B))
def test_cross_attention_with_any_key_lengths_is_finite(lengths, kv_lengths):
    *_, cross = mha()
    out = np.asarray(cross(np.array(lengths, np.int32), np.array(kv_lengths, np.int32)))
    assert np.isfinite(out).all()
    past = np.arange(T)[None, :] >= np.array(lengths)[:, None]
    assert not out[past].any()


@FUZZ
@given(lengths=any_lengths, kv_lengths=st.lists(st.integers(-2, K + 2), min_size=B,
                                                 max_size=B))
def test_out_of_range_lengths_are_refused_by_name(lengths, kv_lengths):
    m, v, x, _, _ = mha()
    kv = x[:, :K]
    n, kn = np.array(lengths, np.int32), np.array(kv_lengths, np.int32)
    bad_q = (n < 0).any() or (n > T).any()
    bad_k = (kn < 0).any() or (kn > K).any()
    if not (bad_q or bad_k):
        assert np.isfinite(m.apply(v, x, kv, lengths=n, kv_lengths=kn)).all()
        return
    with pytest.raises(ValueError) as info:
        m.apply(v, x, kv, lengths=n, kv_lengths=kn)
    assert ("`lengths`" if bad_q else "`kv_lengths`") in str(info.value)


@FUZZ
@given(lengths=st.lists(st.integers(0, T), min_size=B, max_size=B),
       mask=st.lists(st.booleans(), min_size=B * T, max_size=B * T))
def test_attention_weights_sum_to_one_over_visible_keys(lengths, mask):
    attn, variables = _additive()
    n, mk = np.array(lengths, np.int32), np.array(mask, bool).reshape(B, T)
    ctx, w = attn.apply(variables, np.ones((B, D), np.float32), _keys(), mask=mk, lengths=n)
    visible = mk & (np.arange(T)[None, :] < n[:, None])
    np.testing.assert_allclose(np.asarray(w).sum(-1), visible.any(-1).astype(np.float32),
                               atol=1e-5)
    assert not np.asarray(w)[~visible].any() and np.isfinite(ctx).all()


@functools.cache
def _additive() -> tuple:
    attn = snn.Attention(score="additive")
    return attn, attn.init(jax.random.PRNGKey(0), np.ones((B, D), np.float32), _keys())


@functools.cache
def _keys() -> np.ndarray:
    return np.random.default_rng(2).normal(size=(B, T, D)).astype(np.float32)


@FUZZ
@given(values=ids, kept=keep)
def test_batch_check_raises_exactly_when_a_kept_id_is_out_of_the_vocabulary(values, kept):
    tokens = np.array(values, np.int32).reshape(B, T)
    mask = np.array(kept, bool).reshape(B, T)
    batch = {"inputs": np.clip(tokens, 0, V - 1), "targets": tokens, "mask": mask}
    bad = mask & ((tokens < 0) | (tokens >= V))
    if not bad.any():
        make_batch_check(V)(batch)
        return
    with pytest.raises(ValueError, match=r'`batch\["targets"\]`.*where the mask is True'):
        make_batch_check(V)(batch)


@FUZZ
@given(values=st.lists(st.integers(-3, V + 3), min_size=B, max_size=B))
def test_decode_step_under_jit_flags_exactly_the_oov_rows(values):
    m, v, state, step = gpt()
    tokens = np.array(values, np.int32)
    logits, new = step(v, state, jnp.asarray(tokens))
    oov = (tokens < 0) | (tokens >= V)
    assert np.isnan(logits[oov]).all() and np.isfinite(logits[~oov]).all()
    # An out-of-vocabulary row neither advances nor writes anything that a later step sees.
    np.testing.assert_array_equal(new["positions"], state["positions"] + ~oov)
    np.testing.assert_array_equal(new["cache"][0].lengths, state["cache"][0].lengths + ~oov)
    eager = pytest.raises(ValueError, match="`tokens`") if oov.any() else nullcontext()
    with eager:  # eager, the same ids are an error
        m.decode_step(v, state, tokens)


@FUZZ
@given(lengths=st.lists(st.integers(0, T), min_size=B, max_size=B))
def test_recurrent_padding_is_zero_for_any_lengths(lengths):
    rnn, variables = _rnn()
    n = np.array(lengths, np.int32)
    y = np.asarray(rnn.apply(variables, _keys(), n))
    assert np.isfinite(y).all()
    assert not y[np.arange(T)[None, :] >= n[:, None]].any()


@functools.cache
def _rnn() -> tuple:
    rnn = snn.RNN(snn.GRUCell(4))
    return rnn, rnn.init(jax.random.PRNGKey(0), _keys())

"""Truncated BPTT: contiguous streams, carry passed under stop_gradient, one chunk == full BPTT."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seqjax.data.batching import make_streams
from seqjax.data.iterators import TBPTTIterator
from seqjax.models.rnn import RNNLanguageModel, RNNLMConfig
from seqjax.train.losses import make_lm_loss, masked_cross_entropy
from seqjax.train.optim import TrainState
from seqjax.train.step import flax_apply_fn, make_train_step
from seqjax.train.tbptt import make_tbptt_loss, reset_carry
from tests.train._tiny_lm import TinyLM

V, B = 7, 2
MODEL = TinyLM(V, embed_dim=4, hidden=6)
APPLY = flax_apply_fn(MODEL)
LR = 0.5


def _params():
    shapes = jax.eval_shape(MODEL.init, jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))
    rng = np.random.default_rng(0)
    return jax.tree_util.tree_map(
        lambda s: jnp.asarray(0.5 * rng.normal(size=s.shape), s.dtype), shapes)["params"]


@jax.jit
def _forward(params, inputs):
    return MODEL.apply({"params": params}, inputs, method="with_state")


def _chunks(length, k):
    """TBPTT chunks of ``k`` over ``B`` random streams of ``length`` tokens (+1 target)."""
    return TBPTTIterator(np.random.default_rng(1).integers(0, V, size=B * length + 1), B, k)


def test_streams_and_iterator():
    s = make_streams(np.arange(20), 3)
    assert s.tolist() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17]]
    with pytest.raises(ValueError, match="batch_size"):
        make_streams(np.arange(5), 3)
    it = TBPTTIterator(np.arange(19), batch_size=3, seq_len=2)  # 3 streams of 6 tokens
    assert it.steps_per_epoch == 3
    b0, b1, _, b3 = next(it), next(it), next(it), next(it)
    assert b0["inputs"].tolist() == [[0, 1], [6, 7], [12, 13]]
    assert b0["targets"].tolist() == [[1, 2], [7, 8], [13, 14]]
    assert b1["inputs"][:, 0].tolist() == [2, 8, 14]  # each row continues where it stopped
    assert b0["reset"].all() and not b1["reset"].any() and b3["reset"].all()  # new epoch
    state = it.get_state()
    again = TBPTTIterator(np.arange(19), batch_size=3, seq_len=2)
    again.set_state(state)
    np.testing.assert_array_equal(next(again)["inputs"], next(it)["inputs"])
    with pytest.raises(ValueError, match="seq_len"):
        TBPTTIterator(np.arange(19), batch_size=3, seq_len=7)


def test_reset_carry_zeroes_rows():
    c = (jnp.ones((3, 2)), 2 * jnp.ones((3, 2)))
    r = reset_carry(c, jnp.array([True, False, True]))
    assert r[0][:, 0].tolist() == [0, 1, 0] and r[1][:, 1].tolist() == [0, 2, 0]


TBPTT_STEP = make_train_step(make_tbptt_loss(APPLY), with_carry=True, donate=False)


def test_one_chunk_equals_full_bptt():
    it = _chunks(4, 4)  # one chunk of 4 steps
    inputs, targets = it.x, it.y
    tx = optax.sgd(LR)
    full = TrainState.create(_params(), tx, jax.random.PRNGKey(0))
    full_step = make_train_step(make_lm_loss(APPLY))
    full, m_full = full_step(full, {"inputs": inputs, "targets": targets})
    chunked = TrainState.create(_params(), tx, jax.random.PRNGKey(0), carry=MODEL.zero_carry(B))
    chunk = next(it)
    chunked, m_tb = TBPTT_STEP(chunked, chunk)
    np.testing.assert_allclose(float(m_tb["loss"]), float(m_full["loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(m_tb["grad_norm"]), float(m_full["grad_norm"]), rtol=1e-5)
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(chunked.params), leaves(full.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    # The carry handed on is the full pass's final carry.
    _, final = _forward(_params(), inputs)
    for a, b in zip(jax.tree_util.tree_leaves(chunked.carry), jax.tree_util.tree_leaves(final)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_carry_threads_between_chunks_without_gradient():
    it = _chunks(8, 4)
    c1, c2 = next(it), next(it)
    state = TrainState.create(_params(), optax.sgd(LR), jax.random.PRNGKey(0),
                              carry=MODEL.zero_carry(B))
    s1, _ = TBPTT_STEP(state, c1)
    s2, m2 = TBPTT_STEP(s1, c2)

    # Chunk 2 starts from chunk 1's final carry, computed with the parameters of step 1.
    p0, p1 = state.params, s1.params
    _, carry1 = _forward(p0, c1["inputs"])  # same shapes as the full pass of the first test
    for a, b in zip(jax.tree_util.tree_leaves(s1.carry), jax.tree_util.tree_leaves(carry1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    carry1 = jax.tree_util.tree_map(np.asarray, carry1)  # a constant: gradients stop here

    def chunk2_loss(p, carry):
        logits, _ = MODEL.apply({"params": p}, jnp.asarray(c2["inputs"]), initial_carry=carry,
                              method="with_state")
        return masked_cross_entropy(logits, jnp.asarray(c2["targets"]))

    loss, g = jax.jit(jax.value_and_grad(chunk2_loss))(p1, carry1)
    np.testing.assert_allclose(float(m2["loss"]), float(loss), rtol=1e-6)
    want = jax.tree_util.tree_map(lambda p, g: p - LR * g, p1, g)
    for a, b in zip(jax.tree_util.tree_leaves(s2.params), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)

    # Full BPTT through both chunks gives a different gradient for the same chunk-2 loss:
    # the truncation is real.
    def through(p):
        _, c = MODEL.apply({"params": p}, jnp.asarray(c1["inputs"]), method="with_state")
        return chunk2_loss(p, c)

    g_full = jax.jit(jax.grad(through))(p1)
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_full)))
    assert diff > 1e-4


# The library's own recurrent LM through the documented route (flax_apply_fn → TBPTT).
LM = RNNLanguageModel(RNNLMConfig(vocab_size=V, embed_dim=8, num_layers=2, cell_type="lstm"))
LM_STEP = make_train_step(make_tbptt_loss(flax_apply_fn(LM)), with_carry=True, donate=False)


def _lm_params():
    return LM.init(jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))["params"]


def test_rnn_lm_windows_with_carried_state_equal_the_full_sequence():
    """With the parameters held fixed (lr 0), chunk i's loss is the full pass's loss on
    window i, and the carry handed on after the last chunk is the full pass's final carry."""
    k = 4
    it = _chunks(12, k)  # 3 chunks of 4 steps
    params = _lm_params()
    state = TrainState.create(params, optax.sgd(0.0), jax.random.PRNGKey(0),
                              carry=LM.zero_carry(B))
    losses = []
    for _ in range(it.steps_per_epoch):
        state, m = LM_STEP(state, next(it))
        losses.append(float(m["loss"]))
    n = it.steps_per_epoch * k
    inputs, targets = it.x[:, :n], it.y[:, :n]
    logits, final = LM.apply({"params": params}, jnp.asarray(inputs), method="with_state")
    for i, loss in enumerate(losses):
        window = slice(i * k, (i + 1) * k)
        want = masked_cross_entropy(logits[:, window], jnp.asarray(targets[:, window]))
        np.testing.assert_allclose(loss, float(want), rtol=1e-5)
    assert len(state.carry) == 2  # one (c, h) per layer
    for a, b in zip(jax.tree_util.tree_leaves(state.carry), jax.tree_util.tree_leaves(final)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_rnn_lm_trains_with_tbptt():
    """A few epochs of TBPTT on a short periodic stream: the loss falls, the carry flows
    between chunks (non-zero after the first) and is reset at each epoch's first chunk."""
    stream = np.tile(np.arange(V), 6)
    it = TBPTTIterator(stream, B, 5)
    state = TrainState.create(_lm_params(), optax.adam(0.05), jax.random.PRNGKey(0),
                              carry=LM.zero_carry(B))
    first = None
    for _ in range(4 * it.steps_per_epoch):
        batch = next(it)
        state, m = LM_STEP(state, batch)
        first = float(m["loss"]) if first is None else first
        assert any(float(jnp.abs(c).max()) > 0 for c in jax.tree_util.tree_leaves(state.carry))
    assert float(m["loss"]) < 0.5 * first

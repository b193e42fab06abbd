"""RNN / Bidirectional / StackedRNN: equivalences, masking, transforms, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from seqjax.nn import RNN, Bidirectional, ElmanCell, GRUCell, LSTMCell, StackedRNN

B, T, P, H = 4, 6, 3, 5
CELLS = [
    pytest.param(lambda: ElmanCell(H), id="elman"),
    pytest.param(lambda: LSTMCell(H), id="lstm"),
    pytest.param(lambda: GRUCell(H), id="gru"),
    pytest.param(lambda: GRUCell(H, reset_after=False), id="gru_before"),
]
LENGTHS = np.array([6, 3, 0, 1], np.int32)
# More cells with a layer kernel: its bias-free and other-activation forms.
KERNEL_VARIANTS = [
    pytest.param(lambda: ElmanCell(H, use_bias=False, activation=jax.nn.sigmoid),
                 id="elman_nobias_sigmoid"),
    pytest.param(lambda: LSTMCell(H, use_bias=False), id="lstm_nobias"),
    pytest.param(lambda: GRUCell(H, use_bias=False), id="gru_nobias"),
    pytest.param(lambda: LSTMCell(H, recurrent_bias=True,
                                  bias_init=jax.nn.initializers.normal(0.5)),
                 id="lstm_two_biases"),
]


@pytest.fixture
def x():
    return jnp.asarray(np.random.default_rng(1).normal(size=(B, T, P)).astype(np.float32))


def _init(module, x, **kw):
    return module.init(jax.random.PRNGKey(0), x, **kw)


def _tree_close(a, b, atol=1e-5):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), atol=atol)


class _LeakyElman(ElmanCell):
    """A subclass with its own step: h_t = ½ h_{t-1} + ½ tanh(...)."""

    def step(self, carry, xp):
        h = jnp.tanh(xp + self.recurrent(carry))
        return 0.5 * carry + 0.5 * h, 0.5 * carry + 0.5 * h


class _LeakyLSTM(LSTMCell):
    def step(self, carry, xp):
        (c, h), y = super().step(carry, xp)
        return (0.5 * c, h), y


# Subclasses that redefine step(): the layer must run their equation, not the parent's
# kernel (their layer_weights() is None, so "auto" scans their own step).
SUBCLASSES = [pytest.param(lambda: _LeakyElman(H), id="elman_subclass"),
              pytest.param(lambda: _LeakyLSTM(H), id="lstm_subclass")]


@pytest.mark.parametrize("make_cell", CELLS + SUBCLASSES)
def test_scan_equals_python_loop(make_cell, x):
    cell = make_cell()
    rnn = RNN(cell)
    v = _init(rnn, x)
    y, carry = rnn.apply(v, x, method="with_state")
    c = cell.initialize_carry(None, (B, P))
    ys = []
    for t in range(T):
        c, y_t = cell.apply({"params": v["params"]["cell"]}, c, x[:, t])
        ys.append(y_t)
    np.testing.assert_allclose(y, jnp.stack(ys, 1), atol=1e-5)
    _tree_close(carry, c)


@pytest.mark.parametrize("make_cell", CELLS)
@pytest.mark.parametrize("reverse", [False, True])
def test_padded_batch_equals_each_sequence_alone(make_cell, reverse, x):
    rnn = RNN(make_cell(), reverse=reverse)
    v = _init(rnn, x)
    # Garbage in the padding must not leak anywhere.
    pad = jnp.arange(T)[None, :, None] >= LENGTHS[:, None, None]
    x_dirty = jnp.where(pad, 1e3, x)
    y, carry = rnn.apply(v, x_dirty, lengths=LENGTHS, method="with_state")
    init = rnn.cell.initialize_carry(None, (1, P))
    for b, n in enumerate(LENGTHS):
        assert np.all(np.asarray(y[b, n:]) == 0.0)
        if n == 0:
            _tree_close(jax.tree_util.tree_map(lambda a, b=b: a[b : b + 1], carry), init)
            continue
        y_b, c_b = rnn.apply(v, x[b : b + 1, :n], method="with_state")
        np.testing.assert_allclose(y[b, :n], y_b[0], atol=1e-5)
        _tree_close(jax.tree_util.tree_map(lambda a, b=b: a[b : b + 1], carry), c_b)


@pytest.mark.parametrize("make_cell", CELLS)
def test_reverse_with_lengths_is_flip_run_flip(make_cell, x):
    fwd = RNN(make_cell())
    v = _init(fwd, x)
    y_rev = RNN(make_cell(), reverse=True).apply(v, x, lengths=LENGTHS)
    for b, n in enumerate(LENGTHS):
        if n == 0:
            continue
        flipped = x[b : b + 1, :n][:, ::-1]
        expected = fwd.apply(v, flipped)[:, ::-1]
        np.testing.assert_allclose(y_rev[b : b + 1, :n], expected, atol=1e-5)


def test_time_major_and_unroll_agree(x):
    rnn = RNN(LSTMCell(H))
    v = _init(rnn, x)
    y = rnn.apply(v, x, lengths=LENGTHS)
    y_tm = RNN(LSTMCell(H), time_major=True).apply(v, jnp.swapaxes(x, 0, 1), lengths=LENGTHS)
    y_unroll = RNN(LSTMCell(H), unroll=4).apply(v, x, lengths=LENGTHS)
    np.testing.assert_allclose(y, jnp.swapaxes(y_tm, 0, 1), atol=1e-6)
    np.testing.assert_allclose(y, y_unroll, atol=1e-6)


def test_initial_carry_is_used(x):
    rnn = RNN(GRUCell(H))
    v = _init(rnn, x)
    h0 = jnp.ones((B, H))
    y_a, c_a = rnn.apply(v, x, initial_carry=h0, method="with_state")
    _, c_b = rnn.apply(v, x[:, :2], initial_carry=h0, method="with_state")
    y_c, c_c = rnn.apply(v, x[:, 2:], initial_carry=c_b, method="with_state")
    np.testing.assert_allclose(y_a[:, 2:], y_c, atol=1e-5)
    np.testing.assert_allclose(c_a, c_c, atol=1e-5)
    # Lengths 0 returns the given initial carry.
    _, c0 = rnn.apply(v, x, lengths=jnp.zeros((B,), jnp.int32), initial_carry=h0,
                      method="with_state")
    np.testing.assert_array_equal(c0, h0)


def test_resets_equal_separate_segments(x):
    """Packing: a reset at t restarts from the initial carry, as if two sequences."""
    rnn = RNN(LSTMCell(H))
    v = _init(rnn, x)
    resets = jnp.zeros((B, T), bool).at[:, 3].set(True)
    y = rnn.apply(v, x, resets=resets)
    np.testing.assert_allclose(y[:, :3], rnn.apply(v, x[:, :3]), atol=1e-5)
    np.testing.assert_allclose(y[:, 3:], rnn.apply(v, x[:, 3:]), atol=1e-5)


def test_bidirectional_concat_and_merges(x):
    bi = Bidirectional(RNN(LSTMCell(H)), RNN(LSTMCell(H)))
    v = _init(bi, x)
    y, (cf, cb) = bi.apply(v, x, lengths=LENGTHS, method="with_state")
    assert y.shape == (B, T, 2 * H)
    fwd = RNN(LSTMCell(H)).apply({"params": v["params"]["forward"]}, x, lengths=LENGTHS)
    bwd = RNN(LSTMCell(H), reverse=True).apply(
        {"params": v["params"]["backward"]}, x, lengths=LENGTHS
    )
    np.testing.assert_allclose(y, jnp.concatenate([fwd, bwd], -1), atol=1e-6)
    # The backward carry is the state after reading each sequence's first token.
    for b, n in enumerate(LENGTHS):
        if n:
            np.testing.assert_allclose(cb[1][b], bwd[b, 0], atol=1e-6)
    for merge, fn in (("sum", jnp.add), ("mul", jnp.multiply), (lambda a, b: a - b, jnp.subtract)):
        y_m = Bidirectional(RNN(LSTMCell(H)), RNN(LSTMCell(H)), merge=merge).apply(
            v, x, lengths=LENGTHS
        )
        np.testing.assert_allclose(y_m, fn(fwd, bwd), atol=1e-6)
    with pytest.raises(ValueError, match="merge"):
        Bidirectional(RNN(LSTMCell(H)), RNN(LSTMCell(H)), merge="max").apply(v, x)


def test_stacked_matches_manual_composition(x):
    stack = StackedRNN(H, num_layers=3, cell_type="gru")
    v = _init(stack, x)
    y, finals = stack.apply(v, x, LENGTHS, method="with_state")
    h = x
    for layer in range(3):
        h, c = RNN(GRUCell(H)).apply(
            {"params": v["params"][f"layer_{layer}"]}, h, lengths=LENGTHS, method="with_state"
        )
        np.testing.assert_allclose(finals[layer], c, atol=1e-5)
    np.testing.assert_allclose(y, h, atol=1e-5)
    assert len(finals) == 3


def test_stacked_bidirectional_residual_dropout(x):
    stack = StackedRNN(H, num_layers=2, bidirectional=True, dropout_rate=0.5, residual=True)
    v = _init(stack, x)
    y_det, finals = stack.apply(v, x, LENGTHS, method="with_state")
    assert y_det.shape == (B, T, 2 * H)
    assert len(finals) == 2 and len(finals[0]) == 2  # (fwd, bwd) per layer
    y1 = stack.apply(v, x, LENGTHS, deterministic=False, rngs={"dropout": jax.random.key(1)})
    y2 = stack.apply(v, x, LENGTHS, deterministic=False, rngs={"dropout": jax.random.key(2)})
    assert not np.allclose(y1, y2)
    pad = np.arange(T)[None, :] >= LENGTHS[:, None]
    assert np.all(np.asarray(y1)[pad] == 0.0)
    # residual: layer 2 output = its RNN output + its input
    no_res = StackedRNN(H, num_layers=2, bidirectional=True)
    y_nores = no_res.apply(v, x, LENGTHS)
    assert not np.allclose(y_det, y_nores)


def test_stacked_errors(x):
    with pytest.raises(ValueError, match="cell_type"):
        _init(StackedRNN(H, cell_type="transformer"), x)
    with pytest.raises(ValueError, match="dropout"):
        _init(StackedRNN(H, dropout_rate=1.5), x)
    with pytest.raises(ValueError, match="initial_carry"):
        stack = StackedRNN(H, num_layers=2)
        stack.apply(_init(stack, x), x, initial_carry=[None])


def test_errors_name_the_argument(x):
    rnn = RNN(LSTMCell(H))
    v = _init(rnn, x)
    with pytest.raises(ValueError, match="`x` must have rank 3"):
        rnn.apply(v, x[0])
    with pytest.raises(ValueError, match=r"`lengths` must lie in \[0, 6\]"):
        rnn.apply(v, x, lengths=jnp.array([7, 1, 1, 1]))
    with pytest.raises(ValueError, match=r"`lengths` must lie"):
        rnn.apply(v, x, lengths=jnp.array([-1, 1, 1, 1]))
    with pytest.raises(ValueError, match="`lengths` must have shape"):
        rnn.apply(v, x, lengths=jnp.array([1, 1]))
    with pytest.raises(TypeError, match="`lengths` must have an integer dtype"):
        rnn.apply(v, x, lengths=jnp.ones((B,)))
    with pytest.raises(ValueError, match="initial_carry"):
        rnn.apply(v, x, initial_carry=(jnp.zeros((B, H)), jnp.zeros((B, H + 1))))
    with pytest.raises(ValueError, match="resets"):
        rnn.apply(v, x, resets=jnp.zeros((B, T + 1), bool))


def test_jit_vmap_grad_remat(x):
    rnn = RNN(LSTMCell(H))
    v = _init(rnn, x)
    f = lambda p, x, n: rnn.apply(p, x, lengths=n).sum()
    ref = f(v, x, LENGTHS)
    np.testing.assert_allclose(jax.jit(f)(v, x, LENGTHS), ref, rtol=1e-5)
    # vmap over an extra leading axis
    xs = jnp.stack([x, 2 * x])
    out = jax.vmap(lambda xx: rnn.apply(v, xx, lengths=LENGTHS))(xs)
    np.testing.assert_allclose(out[1], rnn.apply(v, 2 * x, lengths=LENGTHS), atol=1e-6)
    g = jax.grad(f)(v, x, LENGTHS)
    g_remat = jax.grad(jax.checkpoint(f))(v, x, LENGTHS)
    _tree_close(g, g_remat, atol=1e-6)
    # Linen remat of the whole layer.
    RematRNN = __import__("flax").linen.remat(RNN)
    y = RematRNN(LSTMCell(H)).apply(v, x, lengths=LENGTHS)
    np.testing.assert_allclose(y, rnn.apply(v, x, lengths=LENGTHS), atol=1e-6)


def test_padding_gets_no_gradient(x):
    rnn = RNN(GRUCell(H))
    v = _init(rnn, x)
    gx = jax.grad(lambda xx: rnn.apply(v, xx, lengths=LENGTHS).sum())(x)
    pad = np.arange(T)[None, :] >= LENGTHS[:, None]
    assert np.all(np.asarray(gx)[pad] == 0.0)
    assert np.any(np.asarray(gx)[~pad] != 0.0)


@pytest.mark.parametrize("make_cell", CELLS)
def test_gradients_numerically(make_cell, x):
    rnn = RNN(make_cell())
    v = _init(rnn, x[:2, :4])
    f = lambda p, xx: jnp.sum(rnn.apply(p, xx, lengths=jnp.array([4, 2])) ** 2)
    with jax.default_matmul_precision("highest"):
        check_grads(f, (v, x[:2, :4]), order=1, modes=("rev",), atol=2e-2, rtol=2e-2, eps=1e-2)


@pytest.mark.parametrize("make_cell", CELLS)
def test_bf16_compute_close_to_fp32(make_cell, x):
    cell = make_cell()
    rnn32 = RNN(cell)
    v = _init(rnn32, x)
    cell16 = cell.clone(dtype=jnp.bfloat16)
    y16 = RNN(cell16).apply(v, x, lengths=LENGTHS)
    y32 = rnn32.apply(v, x, lengths=LENGTHS)
    assert v["params"]["cell"]["recurrent_kernel"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y16, np.float32), y32, atol=5e-2)


@pytest.mark.parametrize("make_cell", CELLS[:3] + KERNEL_VARIANTS)
@pytest.mark.parametrize("reverse", [False, True])
def test_fused_custom_vjp_equals_autodiff_of_scan(make_cell, reverse, x):
    """The layer kernels' hand-written VJPs == autodiff of the plain nn.scan of the step."""
    cell = make_cell()
    fused = RNN(cell, reverse=reverse, implementation="fused")
    generic = RNN(cell, reverse=reverse, implementation="scan")
    v = _init(fused, x)
    c0 = jax.tree_util.tree_map(lambda z: z + 0.3, cell.initialize_carry(None, (B, P)))

    def loss(m):
        def f(p, xx, c):
            y, c_T = m.apply(p, xx, lengths=LENGTHS, initial_carry=c, method="with_state")
            return (y**2).sum() + sum((leaf**3).sum() for leaf in jax.tree_util.tree_leaves(c_T))

        return f

    np.testing.assert_allclose(loss(fused)(v, x, c0), loss(generic)(v, x, c0), rtol=1e-6)
    g_fused = jax.grad(loss(fused), argnums=(0, 1, 2))(v, x, c0)
    g_generic = jax.grad(loss(generic), argnums=(0, 1, 2))(v, x, c0)
    _tree_close(g_fused, g_generic, atol=1e-5)


@pytest.mark.parametrize("make_cell", CELLS[:3])
def test_empty_sequence_values_and_gradients(make_cell, x):
    """T = 0: the output is empty, the final carry is the initial one, and the layer
    kernels' gradients equal the scan's (the carry's cotangent passes straight through)."""
    cell = make_cell()
    fused = RNN(cell, implementation="fused")
    generic = RNN(cell, implementation="scan")
    v = _init(fused, x)
    x0 = x[:, :0]
    c0 = jax.tree_util.tree_map(lambda z: z + 0.3, cell.initialize_carry(None, (B, P)))

    def loss(m):
        def f(p, c):
            y, c_T = m.apply(p, x0, initial_carry=c, method="with_state")
            assert y.shape == (B, 0, H)
            return sum((leaf**2).sum() for leaf in jax.tree_util.tree_leaves(c_T))

        return f

    np.testing.assert_allclose(loss(fused)(v, c0), loss(generic)(v, c0), rtol=1e-6)
    _tree_close(jax.grad(loss(fused), argnums=(0, 1))(v, c0),
                jax.grad(loss(generic), argnums=(0, 1))(v, c0))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="reads XLA:CPU's compiled program")
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_lstm_gradient_keeps_its_residuals_in_place(with_lengths, reverse, x):
    """The LSTM's training pass writes each step's activations over its slot of the hoisted
    ``x W_ih`` buffer, and the backward writes ``dG_t`` over the same slot: the compiled
    gradient holds no zero-filled ``[T, B, 4H]`` buffer and copies none (XLA copies the
    whole buffer at every step when a read of the slot is not ordered before its
    overwrite)."""
    import re

    m = RNN(LSTMCell(H), reverse=reverse)
    v = _init(m, x)
    lengths = jnp.asarray(LENGTHS) if with_lengths else None
    grad = jax.jit(jax.grad(lambda v, xx: (m.apply(v, xx, lengths=lengths) ** 2).sum()))
    hlo = grad.lower(v, x).compile().as_text()
    made = re.findall(rf"= f32\[{T},{B},{4 * H}\]\{{[0-9,]*\}} ([a-z-]+)\(", hlo)
    assert made.count("dynamic-update-slice") >= 2, made  # activations, then dG, in place
    assert "copy" not in made and "broadcast" not in made, made
    np.testing.assert_allclose(
        jax.tree_util.tree_leaves(grad(v, x))[0],
        jax.tree_util.tree_leaves(jax.grad(lambda v, xx: (
            RNN(LSTMCell(H), reverse=reverse, implementation="scan").apply(
                v, xx, lengths=lengths) ** 2).sum())(v, x))[0],
        atol=1e-5,
    )


@pytest.mark.parametrize("two_biases", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cudnn_weight_packing_matches_jax_reference_lstm(bidirectional, two_biases, x):
    """The GPU path's packed weights, run through jax.experimental.rnn's reference LSTM
    (the cuDNN semantics, runnable on CPU), give the scan's outputs and final carries."""
    from jax.experimental import rnn as jrnn

    from seqjax.nn.recurrent import cudnn_lstm_weights

    kwargs = ({"recurrent_bias": True, "bias_init": jax.nn.initializers.normal(0.5)}
              if two_biases else None)
    stack = StackedRNN(H, num_layers=2, bidirectional=bidirectional, implementation="scan",
                       cell_kwargs=kwargs)
    v = _init(stack, x)
    lengths = jnp.full((B,), T, jnp.int32)  # jax's reference LSTM does not handle ragged
    y, finals = stack.apply(v, x, lengths, method="with_state")
    w = cudnn_lstm_weights(v["params"], 2, bidirectional)
    dirs = 2 if bidirectional else 1
    assert w.shape == (jrnn.get_num_params_in_lstm(P, H, 2, bidirectional),)
    W_ih, W_hh, b_ih, b_hh = jrnn.unpack_lstm_weights(w, P, H, 2, bidirectional)
    zeros = jnp.zeros((2 * dirs, B, H))
    y_ref, h_n, c_n = jrnn.lstm_ref(x, zeros, zeros, W_ih, W_hh, b_ih, b_hh, lengths, P, H, 2,
                                    0.0, bidirectional)
    np.testing.assert_allclose(y, y_ref, atol=1e-5)
    for layer in range(2):
        per = finals[layer] if bidirectional else (finals[layer],)
        for d in range(dirs):
            np.testing.assert_allclose(per[d][0], c_n[layer * dirs + d], atol=1e-5)
            np.testing.assert_allclose(per[d][1], h_n[layer * dirs + d], atol=1e-5)


def test_cudnn_requested_on_cpu_is_a_clear_error(x):
    stack = StackedRNN(H, implementation="cudnn")
    v = _init(stack, x)  # init always builds params with the scan
    with pytest.raises(ValueError, match="GPU"):
        stack.apply(v, x)
    with pytest.raises(ValueError, match="plain LSTM"):
        gru = StackedRNN(H, cell_type="gru", implementation="cudnn")
        gru.apply(_init(gru, x), x)
    with pytest.raises(ValueError, match="implementation"):
        StackedRNN(H, implementation="fast").apply(v, x)


@pytest.mark.parametrize("make_cell", CELLS)
def test_bf16_gradients_close_to_fp32(make_cell, x):
    """Mixed precision through the fused VJP: bf16 compute, fp32 params and carry."""
    cell = make_cell()
    v = _init(RNN(cell), x)

    def loss(c):
        return lambda p, xx: (RNN(c).apply(p, xx, lengths=LENGTHS) ** 2).sum()

    g32 = jax.grad(loss(cell))(v, x)
    g16 = jax.grad(loss(cell.clone(dtype=jnp.bfloat16)))(v, x)
    for a, b in zip(jax.tree_util.tree_leaves(g16), jax.tree_util.tree_leaves(g32)):
        assert a.dtype == jnp.float32
        np.testing.assert_allclose(a, b, atol=0.15, rtol=0.1)




def test_implementation_switch_errors_and_removed_keywords(x):
    rnn = RNN(LSTMCell(H))
    v = _init(rnn, x)
    with pytest.raises(ValueError, match="implementation"):
        RNN(LSTMCell(H), implementation="fast").apply(v, x)
    with pytest.raises(ValueError, match="GPU"):
        RNN(LSTMCell(H), implementation="cudnn").apply(v, x)
    with pytest.raises(ValueError, match="LSTM cell"):
        RNN(LSTMCell(H), implementation="cudnn", reverse=True).apply(v, x)
    with pytest.raises(ValueError, match="no `resets`"):
        RNN(LSTMCell(H), implementation="fused").apply(v, x, resets=jnp.zeros((B, T), bool))
    gru = RNN(GRUCell(H, reset_after=False), implementation="fused")
    with pytest.raises(ValueError, match="layer kernel"):
        gru.apply(_init(RNN(GRUCell(H, reset_after=False)), x), x)
    with pytest.raises(TypeError, match="fused"):  # the removed keyword is an error
        RNN(LSTMCell(H), fused=False)
    stack = StackedRNN(H, num_layers=1)
    with pytest.raises(TypeError, match="initial_carries"):
        stack.apply(_init(stack, x), x, initial_carries=[LSTMCell(H).initialize_carry(
            None, (B, P))])


def _lstm_ref_as_cudnn(calls):
    """jax.experimental.rnn.lstm on CPU: its reference LSTM on the same packed weights."""
    from jax.experimental import rnn as jrnn

    def lstm(x, h0, c0, w, seq_lengths, input_size, hidden_size, num_layers, dropout,
             bidirectional):
        calls.append((num_layers, bidirectional))
        W_ih, W_hh, b_ih, b_hh = jrnn.unpack_lstm_weights(w, input_size, hidden_size,
                                                           num_layers, bidirectional)
        return jrnn.lstm_ref(x, h0, c0, W_ih, W_hh, b_ih, b_hh, seq_lengths, input_size,
                             hidden_size, num_layers, dropout, bidirectional)

    return lstm


def test_rnn_cudnn_layer_equals_the_fused_kernel(monkeypatch, x):
    """RNN(implementation="cudnn") packs the cell's layer_weights for cuDNN and returns the
    carry in the cell's layout; checked on CPU through jax's reference LSTM, which has
    cuDNN's semantics. "auto" on a GPU runs the unrolled scan instead (measured faster)."""
    from jax.experimental import rnn as jrnn

    from seqjax.nn.recurrent import layers  # where the backend probe is read

    calls = []
    monkeypatch.setattr(layers, "_on_gpu", lambda: True)
    monkeypatch.setattr(jrnn, "lstm", _lstm_ref_as_cudnn(calls))
    cell = LSTMCell(H)
    v = _init(RNN(cell, implementation="fused"), x)
    c0 = jax.tree_util.tree_map(lambda z: z + 0.3, cell.initialize_carry(None, (B, P)))
    want = RNN(cell, implementation="fused").apply(v, x, initial_carry=c0,
                                                      method="with_state")
    for impl in ("cudnn", "auto"):
        got = RNN(cell, implementation=impl).apply(v, x, initial_carry=c0, method="with_state")
        _tree_close(got, want)
    tm = RNN(cell, implementation="cudnn", time_major=True).apply(v, jnp.swapaxes(x, 0, 1))
    np.testing.assert_allclose(jnp.swapaxes(tm, 0, 1), RNN(cell).apply(v, x), atol=1e-5)
    assert calls == [(1, False)] * 2  # cudnn, time-major cudnn; "auto" never calls cuDNN
    RNN(cell, reverse=True).apply(v, x)
    RNN(GRUCell(H)).apply(_init(RNN(GRUCell(H)), x), x)
    StackedRNN(H).apply(_init(StackedRNN(H), x), x)
    assert len(calls) == 2


def test_auto_on_a_gpu_is_the_unrolled_scan(monkeypatch, x):
    """On a GPU "auto" runs the scan with GPU_SCAN_UNROLL steps per iteration (unless
    `unroll` is given); on CPU the fused kernel, not unrolled."""
    import seqjax.nn.recurrent as recurrent
    from seqjax.nn.recurrent import layers  # where the backend probe is read

    cell = LSTMCell(H)
    v = _init(RNN(cell), x)
    seen = []
    real_scan = jax.lax.scan

    def spy(*args, **kwargs):
        seen.append(kwargs.get("unroll", 1))
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(jax.lax, "scan", spy)
    want = RNN(cell, implementation="scan").apply(v, x, lengths=LENGTHS)
    assert seen[-1] == 1  # CPU: no unrolling by default
    monkeypatch.setattr(layers, "_on_gpu", lambda: True)
    assert recurrent.GPU_SCAN_UNROLL == layers.GPU_SCAN_UNROLL
    for unroll, expect in ((None, recurrent.GPU_SCAN_UNROLL), (2, 2)):
        seen.clear()
        got = RNN(cell, unroll=unroll).apply(v, x, lengths=LENGTHS)
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert expect in seen
        assert RNN(cell, unroll=unroll)._implementation(None, x, None, False) == "scan"


def test_lstm_recurrent_bias_is_the_summed_bias_with_two_parameters(x):
    """LSTMCell(recurrent_bias=True) keeps PyTorch's / Torch7's b_ih and b_hh: the layer
    computes the one-bias LSTM with b = b_ih + b_hh, each half gets the gradient of b, and
    it has 4H more parameters."""
    normal = jax.nn.initializers.normal(0.5)
    two = RNN(LSTMCell(H, recurrent_bias=True, bias_init=normal))
    one = RNN(LSTMCell(H))
    v2 = _init(two, x)
    c2 = v2["params"]["cell"]
    assert c2["recurrent_bias"].shape == (4 * H,)
    v1 = {"params": {"cell": {"input": {"kernel": c2["input"]["kernel"],
                                        "bias": c2["input"]["bias"] + c2["recurrent_bias"]},
                              "recurrent_kernel": c2["recurrent_kernel"]}}}
    for impl in ("fused", "scan"):
        np.testing.assert_allclose(two.clone(implementation=impl).apply(v2, x, lengths=LENGTHS),
                                   one.apply(v1, x, lengths=LENGTHS), atol=1e-6)
    g2 = jax.grad(lambda v: (two.apply(v, x, lengths=LENGTHS) ** 2).sum())(v2)["params"]["cell"]
    g1 = jax.grad(lambda v: (one.apply(v, x, lengths=LENGTHS) ** 2).sum())(v1)["params"]["cell"]
    np.testing.assert_allclose(g2["recurrent_bias"], g1["input"]["bias"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g2["input"]["bias"], g1["input"]["bias"], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="`recurrent_bias=True` needs `use_bias=True`"):
        _init(RNN(LSTMCell(H, recurrent_bias=True, use_bias=False)), x)
    torch = pytest.importorskip("torch")
    from seqjax.interop import seqjax_to_torch_rnn

    stack = StackedRNN(H, cell_kwargs={"recurrent_bias": True, "bias_init": normal})
    vs = _init(stack, x)
    module = seqjax_to_torch_rnn(stack, vs, P)
    np.testing.assert_allclose(module.bias_hh_l0.detach().numpy(),
                               vs["params"]["layer_0"]["cell"]["recurrent_bias"], rtol=1e-6)
    y_torch = module(torch.from_numpy(np.array(x)))[0].detach().numpy()
    np.testing.assert_allclose(stack.apply(vs, x), y_torch, atol=1e-5)


def test_call_returns_the_array_and_with_state_the_pair(x):
    """One call convention: ``__call__`` -> y; ``with_state`` -> (y, carry); the retired
    ``return_carry`` is a TypeError naming ``with_state``."""
    layers_ = [RNN(LSTMCell(H)), Bidirectional(RNN(LSTMCell(H)), RNN(LSTMCell(H))),
               StackedRNN(H, num_layers=2)]
    for layer in layers_:
        v = _init(layer, x)
        y, carry = layer.apply(v, x, LENGTHS, method="with_state")
        np.testing.assert_array_equal(layer.apply(v, x, LENGTHS), y)
        assert jax.tree_util.tree_leaves(carry)
    with pytest.raises(TypeError, match="`return_carry` is retired.*`with_state`"):
        RNN(LSTMCell(H), return_carry=True)
    with pytest.raises(TypeError, match="`return_carry` is retired.*`with_state`"):
        Bidirectional(RNN(LSTMCell(H)), RNN(LSTMCell(H)), return_carry=True)
    with pytest.raises(TypeError, match="`RNN.with_state`"):
        layers_[0].apply(_init(layers_[0], x), x, return_carry=True)

"""Issue #20.1: bias-free recurrences (J&M (9.3)–(9.5), (9.22)–(9.29), the slides' GRU),
MEDL (7.3)'s output-feedback RNN and the slides' simple gated cell, against numpy
step-by-step references; and the ``layer_weights`` door to the fast layer kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.nn import (
    RNN,
    ElmanCell,
    GRUCell,
    LayerWeights,
    LSTMCell,
    OutputFeedbackCell,
    SimpleGatedCell,
)
from seqjax.utils import count_params

B, T, P, H = 2, 5, 3, 4


def sig(z):
    return 1.0 / (1.0 + np.exp(-z))


def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def _random_params(cell, x):
    v = cell.init(jax.random.PRNGKey(0), cell.initialize_carry(None, x.shape[:1] + x.shape[2:]),
                  x[:, 0])
    leaves, tree = jax.tree_util.tree_flatten(v)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    leaves = [0.7 * jax.random.normal(k, leaf.shape) for k, leaf in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(tree, leaves)


def _run(cell, v, x, implementation="auto"):
    y, carry = RNN(cell, implementation=implementation).apply(
        {"params": {"cell": v["params"]}}, jnp.asarray(x), method="with_state")
    return carry, np.asarray(y)


@pytest.fixture
def x():
    return np.random.default_rng(0).normal(size=(B, T, P)).astype(np.float32)


def _blk(m, k):
    return m[k * H : (k + 1) * H]


def jm_elman(p, xs):
    """J&M (9.3)–(9.4) / Fig. 9.4: h_t = g(U h_{t-1} + W x_t), no bias."""
    W, U = p["input"]["kernel"].T, p["recurrent_kernel"].T
    h, out = np.zeros(H), []
    for x_t in xs:
        h = np.tanh(U @ h + W @ x_t)
        out.append(h)
    return np.stack(out)


def jm_lstm(p, xs):
    """J&M (9.22)–(9.29): the gates with no biases (order i, f, g, o)."""
    W, U = p["input"]["kernel"].T, p["recurrent_kernel"].T
    c, h, out = np.zeros(H), np.zeros(H), []
    for x_t in xs:
        i = sig(_blk(U, 0) @ h + _blk(W, 0) @ x_t)
        f = sig(_blk(U, 1) @ h + _blk(W, 1) @ x_t)
        g = np.tanh(_blk(U, 2) @ h + _blk(W, 2) @ x_t)
        o = sig(_blk(U, 3) @ h + _blk(W, 3) @ x_t)
        c = f * c + i * g
        h = o * np.tanh(c)
        out.append(h)
    return np.stack(out)


def slides_gru(p, xs):
    """Slides: z = σ(W⁽ᶻ⁾x + U⁽ᶻ⁾h), r = σ(W⁽ʳ⁾x + U⁽ʳ⁾h), h̃ = tanh(Wx + r ⊙ Uh),
    h_t = z ⊙ h_{t-1} + (1 − z) ⊙ h̃ — no biases, reset after U."""
    W, U = p["input"]["kernel"].T, p["recurrent_kernel"].T
    h, out = np.zeros(H), []
    for x_t in xs:
        r = sig(_blk(W, 0) @ x_t + _blk(U, 0) @ h)
        z = sig(_blk(W, 1) @ x_t + _blk(U, 1) @ h)
        h_tilde = np.tanh(_blk(W, 2) @ x_t + r * (_blk(U, 2) @ h))
        h = z * h + (1 - z) * h_tilde
        out.append(h)
    return np.stack(out)


BIAS_FREE = [
    pytest.param(lambda: ElmanCell(H, use_bias=False), jm_elman, id="elman-jm-9.3"),
    pytest.param(lambda: LSTMCell(H, use_bias=False), jm_lstm, id="lstm-jm-9.22"),
    pytest.param(lambda: GRUCell(H, use_bias=False), slides_gru, id="gru-slides"),
]


@pytest.mark.parametrize(("make_cell", "ref"), BIAS_FREE)
@pytest.mark.parametrize("implementation", ["fused", "scan"])
def test_bias_free_cells_match_the_textbooks(make_cell, ref, implementation, x):
    cell = make_cell()
    v = _random_params(cell, x)
    assert all("bias" not in "/".join(map(str, path)) for path, _ in
               jax.tree_util.tree_leaves_with_path(v))
    _, y = _run(cell, v, x, implementation)
    p = jax.tree_util.tree_map(np.asarray, v["params"])
    for b in range(B):
        np.testing.assert_allclose(y[b], ref(p, x[b]), atol=1e-5)


@pytest.mark.parametrize(("cell", "expected"), [
    (ElmanCell(H, use_bias=False), H * H + H * P),
    (LSTMCell(H, use_bias=False), 4 * H * H + 4 * H * P),
    (GRUCell(H, use_bias=False), 3 * H * H + 3 * H * P),
    (GRUCell(H, use_bias=False, reset_after=False), 3 * H * H + 3 * H * P),
    (OutputFeedbackCell(H), H * P + H + H * H + H * P + P),
    (OutputFeedbackCell(H, out_features=6, feedback="linear", use_bias=False),
     H * P + H * H + H * 6 + 6 * P),
    (SimpleGatedCell(P), 2 * P * P + P),
])
def test_parameter_counts(cell, expected):
    x = jnp.zeros((1, P))
    v = cell.init(jax.random.PRNGKey(0), cell.initialize_carry(None, x.shape), x)
    assert count_params(v) == expected


def medl_7_3(p, xs, feedback):
    """MEDL (7.3): h_t = S_h(W_hh h_{t-1} + W_hx(x_t + T(ŷ_{t-1})) + b_h),
    ŷ_t = S_y(W_yh h_t + b_y), with ŷ_0 = 0."""
    W_hx, b_h, W_hh = p["input"]["kernel"].T, p["input"]["bias"], p["recurrent_kernel"].T
    W_yh, b_y = p["output"]["kernel"].T, p["output"]["bias"]
    h, y, out = np.zeros(H), np.zeros(W_yh.shape[0]), []
    for x_t in xs:
        h = np.tanh(W_hh @ h + W_hx @ (x_t + feedback(p, y)) + b_h)
        y = softmax(W_yh @ h + b_y)
        out.append(y)
    return np.stack(out)


@pytest.mark.parametrize(("kwargs", "feedback"), [
    ({}, lambda p, y: y),
    ({"out_features": 6, "feedback": "linear"}, lambda p, y: p["feedback"]["kernel"].T @ y),
    ({"feedback": lambda y: 2.0 * y}, lambda p, y: 2.0 * y),
], ids=["identity", "linear", "callable"])
def test_output_feedback_matches_medl_7_3(kwargs, feedback, x):
    cell = OutputFeedbackCell(H, **kwargs)
    v = _random_params(cell, x)
    (h_T, y_T), y = _run(cell, v, x)
    p = jax.tree_util.tree_map(np.asarray, v["params"])
    for b in range(B):
        ref = medl_7_3(p, x[b], feedback)
        np.testing.assert_allclose(y[b], ref, atol=1e-5)
        np.testing.assert_allclose(np.asarray(y_T)[b], ref[-1], atol=1e-5)
    np.testing.assert_allclose(y.sum(-1), 1.0, atol=1e-5)  # S_y = softmax


def test_output_feedback_really_feeds_back_the_output(x):
    """Changing ŷ_{t-1} (through W_yh) changes h_t: the feedback path is live."""
    cell = OutputFeedbackCell(H)
    v = _random_params(cell, x)
    _, y = _run(cell, v, x)
    w = jax.tree_util.tree_map(lambda a: a, v)
    w["params"]["output"]["bias"] = w["params"]["output"]["bias"] + 3.0 * jnp.arange(P)
    (h_a, _), _ = _run(cell, v, x[:, :2])
    (h_b, _), _ = _run(cell, w, x[:, :2])
    assert float(jnp.abs(h_a - h_b).max()) > 1e-3


def test_output_feedback_errors(x):
    with pytest.raises(ValueError, match="feedback='identity'.*out_features"):
        _run(OutputFeedbackCell(H, out_features=P + 1),
             _random_params(OutputFeedbackCell(H, out_features=P + 1, feedback="linear"), x), x)
    cell = OutputFeedbackCell(H, feedback="tanh")
    with pytest.raises(ValueError, match="feedback"):
        cell.init(jax.random.PRNGKey(0), cell.initialize_carry(None, (B, P)), x[:, 0])


def slides_gate(p, xs, use_bias):
    """Slides, "Simple Gate": g = σ(W_hh h + W_xh x), c = g ⊙ c + (1 − g) ⊙ x, h = tanh(c)."""
    W_xh, W_hh = p["input"]["kernel"].T, p["recurrent_kernel"].T
    b = p["input"]["bias"] if use_bias else 0.0
    c, h, out = np.zeros(P), np.zeros(P), []
    for x_t in xs:
        g = sig(W_hh @ h + W_xh @ x_t + b)
        c = g * c + (1 - g) * x_t
        h = np.tanh(c)
        out.append(h)
    return np.stack(out), c


@pytest.mark.parametrize("use_bias", [False, True])
def test_simple_gated_cell_matches_the_slides(use_bias, x):
    cell = SimpleGatedCell(P, use_bias=use_bias)
    v = _random_params(cell, x)
    (c_T, _), y = _run(cell, v, x)
    p = jax.tree_util.tree_map(np.asarray, v["params"])
    for b in range(B):
        ref, c_ref = slides_gate(p, x[b], use_bias)
        np.testing.assert_allclose(y[b], ref, atol=1e-5)
        np.testing.assert_allclose(np.asarray(c_T)[b], c_ref, atol=1e-5)


def test_simple_gate_extremes_keep_or_take(x):
    """g = 1 keeps the state and discards the input; g = 0 takes the input."""
    cell = SimpleGatedCell(P)
    v = _random_params(cell, x)
    carry = (jnp.ones((B, P)), jnp.tanh(jnp.ones((B, P))))
    for bias, expect in ((50.0, carry[0]), (-50.0, jnp.asarray(x[:, 0]))):
        w = {"params": {**v["params"], "input": {**v["params"]["input"],
                                                 "bias": jnp.full((P,), bias)}}}
        (c, _), _ = cell.apply(w, carry, jnp.asarray(x[:, 0]))
        np.testing.assert_allclose(c, expect, atol=1e-6)
    with pytest.raises(ValueError, match="features == 5"):
        SimpleGatedCell(5).init(jax.random.PRNGKey(0), (jnp.zeros((B, 5)),) * 2, x[:, 0])


class _KeepsEquation(LSTMCell):
    """Changes only an initialisation default: still the LSTM equation."""

    forget_bias: float = 1.0


class _OwnStep(GRUCell):
    def step(self, carry, xp):
        h, _ = super().step(carry, xp)
        return 0.5 * h, 0.5 * h


@pytest.mark.parametrize(("cell", "equation"), [
    (ElmanCell(H), "elman"),
    (ElmanCell(H, use_bias=False), "elman"),
    (LSTMCell(H), "lstm"),
    (_KeepsEquation(H), "lstm"),
    (GRUCell(H), "gru"),
    (GRUCell(H, use_bias=False), "gru"),
    (GRUCell(H, reset_after=False), None),
    (_OwnStep(H), None),
    (OutputFeedbackCell(H), None),
    (SimpleGatedCell(P), None),
])
def test_layer_weights_is_the_one_door_to_the_kernels(cell, equation, x):
    v = _random_params(cell, x)
    w = cell.apply(v, method=type(cell).layer_weights)
    if equation is None:
        assert w is None
        return
    assert isinstance(w, LayerWeights) and w.equation == equation
    p = v["params"]
    np.testing.assert_array_equal(w.input_kernel, p["input"]["kernel"])
    np.testing.assert_array_equal(w.recurrent_kernel, p["recurrent_kernel"])
    np.testing.assert_array_equal(w.bias, p["input"].get("bias", np.zeros(w.bias.shape)))
    if equation == "gru":
        np.testing.assert_array_equal(
            w.recurrent_bias, p.get("recurrent_bias_n", np.zeros((H,))))
    # The kernel computes the cell's own step.
    _, y_fused = _run(cell, v, x, "fused")
    _, y_scan = _run(cell, v, x, "scan")
    np.testing.assert_allclose(y_fused, y_scan, atol=1e-5)

# %% [markdown]
# # Recurrent networks from the equations
#
# <a href="https://colab.research.google.com/github/seqjax/seqjax/blob/main/colab/01_rnns_from_the_equations.ipynb" target="_parent"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open In Colab"/></a>
#
# The Elman, LSTM and GRU cells of `seqjax.nn` checked line by line against the
# textbook equations written in NumPy (MEDL §7.2–7.3, with its column-vector
# notation); back-propagation through time done by hand and compared with
# `jax.grad`; and the vanishing / exploding gradient of MEDL (7.11)–(7.12).

# %%
from seqjax.utils import notebook_setup

SMOKE = notebook_setup()  # notebook_setup(smoke=True): tiny sizes, offline data

# %%
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax.nn import RNN, ElmanCell, GRUCell, LSTMCell
from seqjax.utils import count_params

# TPUs multiply float32 matrices in bfloat16 passes unless told otherwise; the
# comparisons with NumPy below want full float32 precision.
jax.config.update("jax_default_matmul_precision", "highest")

B, T, P, H = (2, 5, 3, 4) if SMOKE else (4, 12, 6, 8)
x_BxTxP = np.random.default_rng(0).normal(size=(B, T, P)).astype(np.float32)


def run_layer(cell, x):
    """Initialise ``RNN(cell)`` and run it over ``x``: ``(cell params, y_BxTxH)``."""
    rnn = RNN(cell)

    @jax.jit
    def init_and_apply(key, x):
        variables = rnn.init(key, x)
        return variables["params"]["cell"], rnn.apply(variables, x)

    params, y = init_and_apply(jax.random.PRNGKey(0), x)
    return jax.tree_util.tree_map(np.asarray, params), np.asarray(y)


def sig(a):
    return 1.0 / (1.0 + np.exp(-a))


# %% [markdown]
# ## The Elman cell, MEDL (7.2)
#
# $$h^{\langle t\rangle}=S_h\big(W_{hh}h^{\langle t-1\rangle}+W_{hx}x^{\langle t\rangle}+b_h\big)$$
#
# The book writes column vectors and `W x`; Flax layers compute `x @ kernel`, so the
# book's matrices are the transposed kernels: `W_hx = input/kernel.T`,
# `W_hh = recurrent_kernel.T`. `RNN` computes `x W_hxᵀ + b` for all time steps in
# one matmul and scans only the recurrent part.

# %%
def elman_np(p, x_TxP):
    W_hx, b_h, W_hh = p["input"]["kernel"].T, p["input"]["bias"], p["recurrent_kernel"].T
    h = np.zeros(W_hh.shape[0])
    out = []
    for x in x_TxP:                        # t = 1..T
        h = np.tanh(W_hh @ h + W_hx @ x + b_h)
        out.append(h)
    return np.stack(out)


p, y = run_layer(ElmanCell(H), x_BxTxP)
err = max(np.abs(elman_np(p, x_BxTxP[b]) - y[b]).max() for b in range(B))
print(f"Elman: max |seqjax - numpy| = {err:.2e}")
assert err < 1e-5


# %% [markdown]
# ## LSTM, MEDL (7.16)–(7.17)
#
# $$g_\star=\sigma(W_{\star h}h^{\langle t-1\rangle}+W_{\star x}x^{\langle t\rangle}+b_\star),\quad
# c^{\langle t\rangle}=g_f\odot c^{\langle t-1\rangle}+g_i\odot\tanh(W_{\tilde ch}h^{\langle t-1\rangle}+W_{\tilde cx}x^{\langle t\rangle}+b_{\tilde c}),\quad
# h^{\langle t\rangle}=g_o\odot\tanh(c^{\langle t\rangle})$$
#
# The four gates are stacked in one kernel in PyTorch's order `i, f, c̃, o`. MEDL
# notes that the memory moves by at most 1 per step,
# $|c^{\langle t\rangle}-g_f\odot c^{\langle t-1\rangle}|\le 1$: checked too.

# %%
def lstm_np(p, x_TxP):
    W_x, b, W_h = p["input"]["kernel"].T, p["input"]["bias"], p["recurrent_kernel"].T
    (W_ix, W_fx, W_cx, W_ox), (W_ih, W_fh, W_ch, W_oh) = np.split(W_x, 4), np.split(W_h, 4)
    b_i, b_f, b_c, b_o = np.split(b, 4)
    c = h = np.zeros(W_h.shape[1])
    out = []
    for x in x_TxP:
        g_i = sig(W_ih @ h + W_ix @ x + b_i)
        g_f = sig(W_fh @ h + W_fx @ x + b_f)
        g_o = sig(W_oh @ h + W_ox @ x + b_o)
        c_tilde = np.tanh(W_ch @ h + W_cx @ x + b_c)
        c_new = g_f * c + g_i * c_tilde
        assert np.all(np.abs(c_new - g_f * c) <= 1.0)  # MEDL: memory moves by <= 1
        c, h = c_new, g_o * np.tanh(c_new)
        out.append(h)
    return np.stack(out)


p, y = run_layer(LSTMCell(H, forget_bias=1.0), x_BxTxP)
err = max(np.abs(lstm_np(p, x_BxTxP[b]) - y[b]).max() for b in range(B))
print(f"LSTM: max |seqjax - numpy| = {err:.2e}; parameters {count_params(p)} "
      f"= 4H² + 4HP + 4H = {4 * H * H + 4 * H * P + 4 * H}")
assert err < 1e-5


# %% [markdown]
# ## GRU, MEDL (7.18)–(7.19): the reset gate before the matmul
#
# $$h^{\langle t\rangle}=(1-g_u)\odot h^{\langle t-1\rangle}+g_u\odot\tanh\big(W_{\tilde hh}(g_r\odot h^{\langle t-1\rangle})+W_{\tilde hx}x^{\langle t\rangle}+b_{\tilde h}\big)$$
#
# `GRUCell(reset_after=False)` is MEDL's GRU. Its `z` is PyTorch's and Flax's *keep*
# gate, the complement of MEDL's update gate: $g_u = 1 - z$. The default
# `reset_after=True` (PyTorch, cuDNN) applies the reset gate after the matmul,
# $r\odot(W_{nh}h + b_{hn})$: it is checked below as well.

# %%
def gru_np(p, x_TxP, reset_after):
    W_x, b, W_h = p["input"]["kernel"].T, p["input"]["bias"], p["recurrent_kernel"].T
    (W_rx, W_zx, W_nx), (W_rh, W_zh, W_nh), (b_r, b_z, b_n) = (
        np.split(W_x, 3), np.split(W_h, 3), np.split(b, 3))
    h = np.zeros(W_h.shape[1])
    out = []
    for x in x_TxP:
        g_r = sig(W_rh @ h + W_rx @ x + b_r)
        g_u = 1.0 - sig(W_zh @ h + W_zx @ x + b_z)  # MEDL's update gate = 1 - z
        if reset_after:
            h_tilde = np.tanh(W_nx @ x + b_n + g_r * (W_nh @ h + p["recurrent_bias_n"]))
        else:
            h_tilde = np.tanh(W_nh @ (g_r * h) + W_nx @ x + b_n)
        h = (1.0 - g_u) * h + g_u * h_tilde
        out.append(h)
    return np.stack(out)


for reset_after in (False, True):
    p, y = run_layer(GRUCell(H, reset_after=reset_after), x_BxTxP)
    err = max(np.abs(gru_np(p, x_BxTxP[b], reset_after) - y[b]).max() for b in range(B))
    print(f"GRU reset_after={reset_after}: max |seqjax - numpy| = {err:.2e}")
    assert err < 1e-5

# %% [markdown]
# ## MEDL's toy example and back-propagation through time
#
# MEDL §7.2's "simple concrete toy example": the eight-word lexicon in alphabetical
# order, one-hot inputs, an Elman RNN with $m = 20$ sigmoid units and a softmax
# output, trained to predict the next word of *"the mathematical engineering of deep
# learning"*: $8\cdot20 + 20\cdot20 + 20 + 20\cdot8 + 8 = 748$ parameters.

# %%
import optax

LEXICON = sorted("deep engineering learning machine mathematical of statistics the".split())
sentence = "the mathematical engineering of deep learning".split()
ids = [LEXICON.index(w) for w in sentence]
x_1xTxV = jax.nn.one_hot(jnp.asarray([ids[:-1]]), len(LEXICON))  # x<t> = e_i
y_1xT = jnp.asarray([ids[1:]])                                      # y<t> = x<t+1>


class ToyRNN(nn.Module):
    """MEDL (7.2): sigmoid Elman cell, softmax read-out."""

    hidden: int = 20

    @nn.compact
    def __call__(self, x_BxTxV):
        # parent=None: the cell belongs to the RNN (parameters rnn/cell/...).
        cell = ElmanCell(self.hidden, activation=nn.sigmoid, parent=None)
        h_BxTxH = RNN(cell, name="rnn")(x_BxTxV)
        return nn.Dense(x_BxTxV.shape[-1], name="out")(h_BxTxH)


toy = ToyRNN()
params = jax.jit(toy.init)(jax.random.PRNGKey(0), x_1xTxV)["params"]
print("parameters:", count_params(params))
assert count_params(params) == 748


def loss_fn(params):  # MEDL (7.4)-(7.5): cross-entropy averaged over time
    logits = toy.apply({"params": params}, x_1xTxV)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y_1xT).mean()


tx = optax.adam(0.05)


@jax.jit
def train_step(params, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(params)  # BPTT = autodiff through the scan
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss


opt_state = tx.init(params)
for _ in range(2 if SMOKE else 200):
    params, opt_state, loss = train_step(params, opt_state)
pred = np.argmax(jax.jit(toy.apply)({"params": params}, x_1xTxV), -1)[0]
print(f"loss {float(loss):.4f}; predicted next words:", [LEXICON[i] for i in pred])
if not SMOKE:
    assert [LEXICON[i] for i in pred] == sentence[1:]


# %% [markdown]
# **BPTT by hand.** With $a^{\langle t\rangle} = W_{hh}h^{\langle t-1\rangle}+W_{hx}x^{\langle t\rangle}+b_h$,
# $\hat y^{\langle t\rangle}=\mathrm{softmax}(W_{yh}h^{\langle t\rangle}+b_y)$ and the
# time-averaged loss, the adjoint $\zeta^{\langle t\rangle}=\partial C/\partial h^{\langle t\rangle}$ runs
# backwards in time (MEDL (7.6), (7.11)):
#
# $$\zeta^{\langle t\rangle} = W_{yh}^\top \tfrac1T(\hat y^{\langle t\rangle}-y^{\langle t\rangle})
# + W_{hh}^\top\big(\sigma'(a^{\langle t+1\rangle})\odot\zeta^{\langle t+1\rangle}\big),$$
#
# and each weight's gradient sums its local contributions over time (MEDL (7.9)–(7.10)),
# e.g. $g_{W_{hh}}=\sum_t \big(\sigma'(a^{\langle t\rangle})\odot\zeta^{\langle t\rangle}\big)\,h^{\langle t-1\rangle\top}$.
# `jax.grad` through `lax.scan` computes exactly this.

# %%
def bptt_np(params, x_TxV, y_T):
    c, o = params["rnn"]["cell"], params["out"]
    W_hx, b_h, W_hh = (np.asarray(c["input"]["kernel"]).T, np.asarray(c["input"]["bias"]),
                       np.asarray(c["recurrent_kernel"]).T)
    W_yh, b_y = np.asarray(o["kernel"]).T, np.asarray(o["bias"])
    steps = len(x_TxV)
    hs, as_, dz = [np.zeros(W_hh.shape[0])], [], []
    for t in range(steps):                                  # forward
        as_.append(W_hh @ hs[-1] + W_hx @ x_TxV[t] + b_h)
        hs.append(sig(as_[-1]))
        z = W_yh @ hs[-1] + b_y
        y_hat = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        dz.append((y_hat - np.eye(len(b_y))[y_T[t]]) / steps)
    g = {k: 0.0 for k in ("W_hx", "b_h", "W_hh", "W_yh", "b_y")}
    zeta_next = np.zeros(W_hh.shape[0])
    for t in reversed(range(steps)):                        # backward in time
        zeta = W_yh.T @ dz[t] + zeta_next                    # dC/dh<t>
        delta = hs[t + 1] * (1 - hs[t + 1]) * zeta            # sigma'(a<t>) * zeta
        g["W_hh"] = g["W_hh"] + np.outer(delta, hs[t])
        g["W_hx"] = g["W_hx"] + np.outer(delta, x_TxV[t])
        g["b_h"] = g["b_h"] + delta
        g["W_yh"] = g["W_yh"] + np.outer(dz[t], hs[t + 1])
        g["b_y"] = g["b_y"] + dz[t]
        zeta_next = W_hh.T @ delta                           # (7.11)
    return g


g_hand = bptt_np(params, np.asarray(x_1xTxV[0]), np.asarray(y_1xT[0]))
g_jax = jax.jit(jax.grad(loss_fn))(params)
pairs = {"W_hh": g_jax["rnn"]["cell"]["recurrent_kernel"].T,
         "W_hx": g_jax["rnn"]["cell"]["input"]["kernel"].T,
         "b_h": g_jax["rnn"]["cell"]["input"]["bias"],
         "W_yh": g_jax["out"]["kernel"].T, "b_y": g_jax["out"]["bias"]}
for k, v in pairs.items():
    err = np.abs(np.asarray(v) - g_hand[k]).max()
    print(f"dC/d{k}: max |jax.grad - BPTT by hand| = {err:.1e}")
    assert err < 1e-5

# %% [markdown]
# ## Vanishing and exploding gradients
#
# With the identity activation and no input, (7.11) becomes
# $\zeta^{\langle t\rangle}=(W_{hh}^\top)^{T-t}\zeta^{\langle T\rangle}$ (MEDL (7.12)): the
# adjoint shrinks or grows like $\rho^{T-t}$ with $\rho$ the spectral radius of
# $W_{hh}$. Below, $W_{hh}=\rho Q$ with $Q$ orthogonal, the loss is a random linear
# read-out of $h^{\langle T\rangle}$, and $\|\zeta^{\langle t\rangle}\|$ is measured by
# autodiff as the gradient with respect to a zero perturbation added to
# $h^{\langle t\rangle}$ — for the linear RNN, a tanh RNN and an LSTM at
# initialisation (forget-gate bias 1).

# %%
STEPS_BACK = 20 if SMOKE else 100
HID, BATCH = 16, 8
xs = np.random.default_rng(1).normal(size=(BATCH, STEPS_BACK, HID)).astype(np.float32)
readout = jax.random.normal(jax.random.PRNGKey(2), (HID,))


def h_of(carry):
    return carry[1] if isinstance(carry, tuple) else carry  # LSTM carry is (c, h)


def adjoint_norms(cell, params, x_BxTxP):
    """||dL/dh<t>|| for t = 1..T (mean over the batch), L = readout . h<T>."""
    carry0 = cell.initialize_carry(jax.random.PRNGKey(0), x_BxTxP[:, 0].shape)

    def loss(deltas_TxBxH):
        def step(carry, inputs):
            x_BxP, d_BxH = inputs
            carry, _ = cell.apply(params, carry, x_BxP)
            if isinstance(carry, tuple):
                return (carry[0], carry[1] + d_BxH), None
            return carry + d_BxH, None

        carry, _ = jax.lax.scan(step, carry0, (jnp.swapaxes(x_BxTxP, 0, 1), deltas_TxBxH))
        return jnp.sum(h_of(carry) @ readout)

    zeros = jnp.zeros((x_BxTxP.shape[1], x_BxTxP.shape[0], HID))
    return jnp.linalg.norm(jax.grad(loss)(zeros), axis=-1).mean(axis=1)


def init_cell(cell, x_BxP):
    return jax.jit(cell.init)(jax.random.PRNGKey(4), cell.initialize_carry(None, x_BxP.shape),
                              x_BxP)


Q = np.linalg.qr(np.random.default_rng(3).normal(size=(HID, HID)))[0]  # orthogonal
curves = {}
for name, cell, x in (("linear", ElmanCell(HID, activation=lambda a: a), 0 * xs),
                      ("tanh", ElmanCell(HID), xs)):
    params0 = init_cell(cell, x[:, 0])
    norms = jax.jit(lambda p, x, cell=cell: adjoint_norms(cell, p, x))
    for rho in (0.8, 1.0, 1.2):  # W_hh = rho Q: spectral radius rho
        p = {"params": {**params0["params"], "recurrent_kernel": rho * Q}}
        curves[f"{name}, rho = {rho}"] = np.asarray(norms(p, x))
lstm = LSTMCell(HID, forget_bias=1.0)
lstm_norms = jax.jit(lambda p, x: adjoint_norms(lstm, p, x))
p_lstm = init_cell(lstm, xs[:, 0])
curves["LSTM, forget bias 1"] = np.asarray(lstm_norms(p_lstm, xs))
bias = p_lstm["params"]["input"]["bias"]  # gate blocks i, f, c~, o
p_lstm3 = {"params": {**p_lstm["params"], "input": {
    **p_lstm["params"]["input"], "bias": bias.at[HID:2 * HID].add(2.0)}}}
curves["LSTM, forget bias 3"] = np.asarray(lstm_norms(p_lstm3, xs))

# MEDL (7.12): the linear RNN's adjoint is exactly rho^(T-t) ||zeta<T>||.
lin = curves["linear, rho = 1.2"]
expected = lin[-1] * 1.2 ** np.arange(STEPS_BACK)[::-1]
print("linear RNN follows rho^(T-t):", np.allclose(lin, expected, rtol=1e-3))
assert np.allclose(lin, expected, rtol=1e-3)

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 4))
distance = np.arange(STEPS_BACK)[::-1]  # T - t
for label, norms in curves.items():
    ax.plot(distance, norms / norms[-1], label=label,
            ls="--" if label.startswith("linear") else "-")
ax.set_yscale("log")
ax.set_ylim(bottom=1e-20)
ax.set_xlabel("T - t (steps back in time)")
ax.set_ylabel("||dL/dh<t>|| / ||dL/dh<T>||")
ax.set_title("Vanishing and exploding gradients (MEDL (7.11)-(7.12))")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The linear RNN follows $\rho^{T-t}$ exactly. The tanh RNN vanishes even at
# $\rho \ge 1$: $\tanh' < 1$ shrinks the adjoint at every step. An LSTM at
# initialisation is no exception — along its memory $c$ the adjoint is multiplied by
# the forget gate, about $\sigma(1) \approx 0.73$ per step with a forget-gate bias
# of 1 — but a bias of 3 ($\sigma(3) \approx 0.95$) keeps it orders of magnitude
# longer, and training learns to hold $g_f \approx 1$ where the task needs memory.
# Gradient clipping (`OptimizerConfig(clip_norm=1.0)`) tames the exploding side;
# `python -m seqjax.experiments.gradients` trains all three cells on the adding problem.

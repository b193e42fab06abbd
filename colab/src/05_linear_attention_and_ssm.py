# %% [markdown]
# # Linear-time sequence layers: linear attention and selective state spaces
#
# <a href="https://colab.research.google.com/github/seqjax/seqjax/blob/main/colab/05_linear_attention_and_ssm.ipynb" target="_parent"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open In Colab"/></a>
#
# Softmax attention costs $O(T^2)$ in the sequence length. Linear attention
# (Katharopoulos et al. 2020) and selective state-space models (Mamba, Gu & Dao
# 2023) cost $O(T)$ and can be computed two ways: in parallel for training, or as a
# recurrence for generation. This notebook checks that the forms agree
# (`seqjax.nn.linear_attention`, `seqjax.nn.ssm`) and measures the cost curves.

# %%
import jax

from seqjax.utils import notebook_setup

SMOKE = notebook_setup()  # notebook_setup(smoke=True): tiny sizes, offline data
BACKEND, DEVICES = jax.default_backend(), jax.devices()  # "tpu", "gpu" or "cpu"

# %%
from functools import partial

import jax.numpy as jnp
import numpy as np

from seqjax.nn import (
    dot_product_attention,
    dot_product_attention_with_weights,
    linear_attention,
    linear_attention_step,
    linear_attention_weights,
    linear_recurrence,
    selective_scan,
    selective_step,
)

jax.config.update("jax_default_matmul_precision", "highest")  # exact comparisons on TPU

B, T, H, D = (1, 16, 2, 8) if SMOKE else (2, 256, 4, 32)
CHUNK = 8 if SMOKE else 64
rng = np.random.default_rng(0)
q, k, v = (jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32) for _ in range(3))

# One compiled function per form, reused for the cost curves at the end.
causal_linear = {impl: jax.jit(partial(linear_attention, is_causal=True, implementation=impl,
                                       chunk_size=CHUNK))
                 for impl in ("parallel", "chunked", "recurrent")}
softmax_attention = jax.jit(partial(dot_product_attention, is_causal=True))


# %% [markdown]
# ## Linear attention: the quadratic form, three linear ones, and an RNN
#
# With a positive feature map $\phi(x)=\mathrm{elu}(x)+1$ instead of $\exp(q^\top k)$,
# causal attention is
#
# $$y_i=\frac{\sum_{j\le i}\phi(q_i)^\top\phi(k_j)\,v_j}{\sum_{j\le i}\phi(q_i)^\top\phi(k_j)}
# =\frac{\phi(q_i)^\top S_i}{\phi(q_i)^\top z_i},\qquad
# S_i=S_{i-1}+\phi(k_i)v_i^\top,\quad z_i=z_{i-1}+\phi(k_i).$$
#
# The left side is the $T\times T$ attention matrix (written below in NumPy); the
# right side is an RNN whose state is a $D\times D$ matrix. `implementation=`
# `"parallel"` (prefix sums), `"chunked"` (quadratic inside chunks, recurrent across
# them) and `"recurrent"` (`lax.scan`) compute the same thing; so does feeding one
# token at a time to `linear_attention_step`, which is how generation works.

# %%
def phi(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0)))  # elu(x) + 1


def quadratic_np(q, k, v):
    pq, pk = phi(np.asarray(q, np.float64)), phi(np.asarray(k, np.float64))
    a_BxHxTxT = np.einsum("bqhd,bkhd->bhqk", pq, pk) * np.tril(np.ones((T, T)))
    a_BxHxTxT /= a_BxHxTxT.sum(-1, keepdims=True) + 1e-6
    return np.einsum("bhqk,bkhe->bqhe", a_BxHxTxT, np.asarray(v, np.float64))


reference = quadratic_np(q, k, v)
for impl, fn in causal_linear.items():
    print(f"{impl:>9}: max |y - quadratic form| = {np.abs(fn(q, k, v) - reference).max():.1e}")
    assert np.allclose(fn(q, k, v), reference, atol=1e-4)

step = jax.jit(linear_attention_step)
state = (jnp.zeros((B, H, D, D)), jnp.zeros((B, H, D)))  # (S, z)
ys = []
for t in range(T):
    state, y_t = step(state, q[:, t], k[:, t], v[:, t])
    ys.append(y_t)
err = np.abs(np.stack(ys, axis=1) - reference).max()
print(f"one token at a time: max |y - quadratic form| = {err:.1e}")
assert err < 1e-4

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

_, softmax_w = jax.jit(partial(dot_product_attention_with_weights, is_causal=True))(
    q, k, v)
linear_w = jax.jit(partial(linear_attention_weights, is_causal=True))(q, k)
fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
for ax, w, title in ((axes[0], softmax_w, "softmax: exp(q.k / sqrt(d))"),
                     (axes[1], linear_w, "linear: phi(q).phi(k)")):
    im = ax.imshow(np.asarray(w[0, 0]), cmap="viridis")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    fig.colorbar(im, ax=ax, fraction=0.046)
fig.suptitle("causal attention weights of head 0 (rows sum to 1)", fontsize=9)
plt.show()

# %% [markdown]
# Linear attention's weights are flatter: the kernel $\phi(q)^\top\phi(k)$ is less
# peaked than the exponential, which is the price of linear cost.
#
# ## Selective state spaces: an associative scan and a loop
#
# A diagonal state-space layer keeps, per channel $e$, a state $h_t\in\mathbb R^N$:
# $h_t=\bar A_t\odot h_{t-1}+\bar B_t x_t$, $y_t=C_t h_t + D x_t$, with the zero-order
# hold $\bar A_t=\exp(\Delta_t A)$, $\bar B_t\approx\Delta_t B_t$. Mamba makes
# $\Delta_t, B_t, C_t$ functions of the input (selection). The recurrence is linear
# in $h$, so the pairs $(a, b)$ compose associatively,
# $(a_1,b_1)\circ(a_2,b_2)=(a_1a_2,\;a_2b_1+b_2)$, and `jax.lax.associative_scan`
# evaluates all $T$ states in $O(\log T)$ depth.

# %%
E, N = (8, 4) if SMOKE else (64, 16)
x = jnp.asarray(rng.normal(size=(B, T, E)), jnp.float32)
delta = jax.nn.softplus(jnp.asarray(rng.normal(size=(B, T, E)) - 2.0, jnp.float32))
A = -jnp.exp(jnp.asarray(rng.normal(size=(E, N)) * 0.5, jnp.float32))  # negative: stable
Bt, Ct = (jnp.asarray(rng.normal(size=(B, T, N)), jnp.float32) for _ in range(2))
Dskip = jnp.ones((E,), jnp.float32)

ssm = {impl: jax.jit(partial(selective_scan, impl=impl))
       for impl in ("associative", "sequential")}
y_assoc, y_seq = (ssm[impl](x, delta, A, Bt, Ct, Dskip) for impl in ssm)


def ssm_np(x, delta, A, Bt, Ct, Dskip):  # the recurrence, one step at a time
    x, delta, A, Bt, Ct = (np.asarray(a, np.float64) for a in (x, delta, A, Bt, Ct))
    h = np.zeros((B, E, N))
    ys = []
    for t in range(T):
        a_bar = np.exp(delta[:, t, :, None] * A)             # exp(dt A)
        b_bar = delta[:, t, :, None] * Bt[:, t, None, :]     # dt B
        h = a_bar * h + b_bar * x[:, t, :, None]
        ys.append(np.einsum("ben,bn->be", h, Ct[:, t]) + np.asarray(Dskip) * x[:, t])
    return np.stack(ys, axis=1)


reference = ssm_np(x, delta, A, Bt, Ct, Dskip)
for name, y in (("associative scan", y_assoc), ("sequential scan", y_seq)):
    print(f"{name:>16}: max |y - numpy recurrence| = {np.abs(y - reference).max():.1e}")
    assert np.allclose(y, reference, atol=1e-4)

step = jax.jit(selective_step)
h = jnp.zeros((B, E, N))
ys = []
for t in range(T):
    h, y_t = step(h, x[:, t], delta[:, t], A, Bt[:, t], Ct[:, t], Dskip)
    ys.append(y_t)
err = np.abs(np.stack(ys, axis=1) - reference).max()
print(f"one token at a time: max |y - numpy recurrence| = {err:.1e}")
assert err < 1e-4
# The same operator on its own: h_t = a_t h_{t-1} + b_t.
print(linear_recurrence(jnp.full((1, 4, 1), 0.5), jnp.ones((1, 4, 1)))[0, :, 0])

# %% [markdown]
# `SelectiveSSM` and `MambaBlock` wrap this scan with the learned projections
# (`scan_impl="associative"` or `"sequential"`; `.step` / `init_cache` for
# generation), and `TransformerBlock(BlockConfig(..., attention=LinearAttention))` swaps the
# attention of a transformer block.
#
# ## Cost curves
#
# Time per call against the sequence length $T$ (one batch, forward only, after
# compilation): softmax attention grows like $T^2$, the others like $T$. On a TPU or
# GPU the parallel forms win at short lengths (the hardware is idle otherwise); the
# sequential scan pays one loop step per token.

# %%
import time

LENGTHS = [16, 32] if SMOKE else [256, 512, 1024, 2048, 4096] + (
    [8192] if BACKEND != "cpu" else [])


def seconds(fn, *args, repeats=3):
    jax.block_until_ready(fn(*args))  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


costs = {name: [] for name in ("softmax attention", "linear attention (chunked)",
                               "linear attention (recurrent)", "SSM (associative)",
                               "SSM (sequential)")}
for n in LENGTHS:
    qn, kn, vn = (jnp.asarray(rng.normal(size=(1, n, H, D)), jnp.float32) for _ in range(3))
    xn, dn = jnp.ones((1, n, E)), jnp.full((1, n, E), 0.1)
    bn = cn = jnp.ones((1, n, N)) / N
    costs["softmax attention"].append(seconds(softmax_attention, qn, kn, vn))
    costs["linear attention (chunked)"].append(seconds(causal_linear["chunked"], qn, kn, vn))
    costs["linear attention (recurrent)"].append(
        seconds(causal_linear["recurrent"], qn, kn, vn))
    costs["SSM (associative)"].append(seconds(ssm["associative"], xn, dn, A, bn, cn))
    costs["SSM (sequential)"].append(seconds(ssm["sequential"], xn, dn, A, bn, cn))

fig, ax = plt.subplots(figsize=(6.5, 4))
for name, ts in costs.items():
    ax.plot(LENGTHS, np.asarray(ts) * 1e3, "o-", label=name)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("sequence length T")
ax.set_ylabel("ms per call")
ax.set_title(f"forward cost on {BACKEND} ({DEVICES[0].device_kind})", fontsize=9)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
plt.show()
print("ms per call:  T = " + "  ".join(f"{n:>7}" for n in LENGTHS))
for name, ts in costs.items():
    print(f"{name:>28}: " + "  ".join(f"{1e3 * t:7.2f}" for t in ts))

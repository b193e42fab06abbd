"""Scratch prototype (not imported by the library): faster LSTM/GRU recurrences for CPU.

The idea measured here: a ``jax.custom_vjp`` around the *recurrent part* of the
layer (the input projection stays outside, hoisted, and is differentiated by
autodiff as usual). Its backward pass is a reverse ``lax.scan`` that carries only
``(dh, dc)`` and emits the pre-activation gate gradients ``dgates_TxBxG``; the
weight gradient is then ONE matmul after the loop,

    dW_hh = Σ_t h_{t-1}ᵀ dgates_t = H_prevᵀ @ dG   ([H, T·B] x [T·B, G·H]),

instead of a ``[H, G·H]`` accumulator read and written at every step of the
loop as autodiff of ``lax.scan`` does. The input gradient of the recurrence is
``dgates`` itself (``∂gates/∂xp = I``).

Variants (``--impls``): ``ref`` (bare scan, autodiff), ``fast`` (custom VJP on the
recurrence), ``fast1`` (plus one ``tanh`` for all four LSTM gates), suffix ``-tm``
(input made time-major before the projection), ``layer`` (LSTM: custom VJP on the
whole layer with the input projection back inside the loop as one
``[x_t, h] @ [W_ih; W_hh]`` dot; every weight/input gradient one matmul after the
backward loop). Measured numbers are in ``benchmarks/RESULTS.md``.

Run: ``python -m benchmarks._proto_lstm [--cell lstm|gru] [--shape BxTxH] [--forward]
[--check]``.
"""

from __future__ import annotations

import argparse
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness

# ----------------------------------------------------------------------------- LSTM


def _gate_consts(hsz: int, dtype) -> tuple:
    """``s`` and ``shift`` per gate column: ``act = s*tanh(s*g) + shift``.

    ``s = shift = 1/2`` gives ``sigmoid(g) = (1 + tanh(g/2))/2`` (gates i, f, o);
    ``s = 1, shift = 0`` gives ``tanh(g)`` (candidate c̃). One tanh over the whole
    ``[B, 4H]`` block is one fused loop instead of four (and XLA:CPU's tanh is a
    vectorised rational approximation, cheaper than ``1/(1+exp(-x))``).
    """
    half = jnp.full((hsz,), 0.5, dtype)
    s = jnp.concatenate([half, half, jnp.ones((hsz,), dtype), half])
    shift = jnp.concatenate([half, half, jnp.zeros((hsz,), dtype), half])
    return s, shift


def _lstm_fwd_scan(xp_TxBx4H, w_Hx4H, c0_BxH, h0_BxH, unroll, one_tanh=False):
    hsz = w_Hx4H.shape[0]
    s4, shift4 = _gate_consts(hsz, xp_TxBx4H.dtype)

    def body(carry, xp_Bx4H):
        c, h = carry
        gates = xp_Bx4H + h @ w_Hx4H
        if one_tanh:
            acts = jnp.tanh(gates * s4) * s4 + shift4
            i, f, g, o = jnp.split(acts, 4, axis=-1)
        else:
            i, f, g, o = jnp.split(gates, 4, axis=-1)
            i, f, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jax.nn.sigmoid(o)
            g = jnp.tanh(g)
            acts = jnp.concatenate([i, f, g, o], -1)
        c_new = f * c + i * g
        tc = jnp.tanh(c_new)
        h_new = o * tc
        return (c_new, h_new), (h_new, c_new, acts)

    return jax.lax.scan(body, (c0_BxH, h0_BxH), xp_TxBx4H, unroll=unroll)


def lstm_ref(xp_TxBx4H, w_Hx4H, c0_BxH, h0_BxH, unroll=1):
    """Plain scan (what autodiff of seqjax.nn.RNN(LSTMCell) differentiates)."""
    (c, h), (hs, _, _) = _lstm_fwd_scan(xp_TxBx4H, w_Hx4H, c0_BxH, h0_BxH, unroll)
    return hs, (c, h)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def lstm_fast(xp_TxBx4H, w_Hx4H, c0_BxH, h0_BxH, unroll=1, one_tanh=False):
    """Same values as :func:`lstm_ref`; custom backward with dW_hh as one matmul."""
    (c, h), (hs, _, _) = _lstm_fwd_scan(xp_TxBx4H, w_Hx4H, c0_BxH, h0_BxH, unroll, one_tanh)
    return hs, (c, h)


def _lstm_fast_fwd(xp_TxBx4H, w_Hx4H, c0_BxH, h0_BxH, unroll, one_tanh):
    (c, h), (hs, cs, acts) = _lstm_fwd_scan(xp_TxBx4H, w_Hx4H, c0_BxH, h0_BxH, unroll,
                                            one_tanh)
    return (hs, (c, h)), (w_Hx4H, c0_BxH, h0_BxH, hs, cs, acts)


def _lstm_fast_bwd(unroll, one_tanh, res, cot):
    w_Hx4H, c0_BxH, h0_BxH, hs_TxBxH, cs_TxBxH, acts_TxBx4H = res
    dhs_TxBxH, (dcT, dhT) = cot
    c_prev_TxBxH = jnp.concatenate([c0_BxH[None], cs_TxBxH[:-1]], 0)
    w_t = w_Hx4H.T
    s4, shift4 = _gate_consts(w_Hx4H.shape[0], w_Hx4H.dtype)
    s4sq = s4 * s4

    def body(carry, inp):
        dc, dh = carry
        dy, c_prev, c, acts = inp
        i, f, g, o = jnp.split(acts, 4, axis=-1)
        dh = dh + dy
        tc = jnp.tanh(c)
        do = dh * tc
        dc = dc + dh * o * (1.0 - tc * tc)
        di = dc * g
        df = dc * c_prev
        dg = dc * i
        if one_tanh:
            # d act/d pre = s² - (act - shift)²: a(1-a) for the sigmoids, 1-a² for tanh.
            dacts = jnp.concatenate([di, df, dg, do], -1)
            dgates = dacts * (s4sq - (acts - shift4) ** 2)
        else:
            dgates = jnp.concatenate(
                [di * i * (1.0 - i), df * f * (1.0 - f), dg * (1.0 - g * g), do * o * (1.0 - o)],
                -1,
            )
        return (dc * f, dgates @ w_t), dgates

    (dc0, dh0), dgates_TxBx4H = jax.lax.scan(
        body, (dcT, dhT), (dhs_TxBxH, c_prev_TxBxH, cs_TxBxH, acts_TxBx4H),
        reverse=True, unroll=unroll,
    )
    h_prev_TxBxH = jnp.concatenate([h0_BxH[None], hs_TxBxH[:-1]], 0)
    hsz = w_Hx4H.shape[0]
    dw = h_prev_TxBxH.reshape(-1, hsz).T @ dgates_TxBx4H.reshape(-1, 4 * hsz)
    return dgates_TxBx4H, dw, dc0, dh0


lstm_fast.defvjp(_lstm_fast_fwd, _lstm_fast_bwd)


# ----------------------------------------------------------------------------- LSTM, whole layer


def _lstm_layer_scan(x_TxBxP, w_ih_Px4H, b_4H, w_hh_Hx4H, c0_BxH, h0_BxH):
    """Input projection *inside* the loop: ``[x_t, h] @ [W_ih; W_hh]`` (one dot per step)."""
    hsz = w_hh_Hx4H.shape[0]
    s4, shift4 = _gate_consts(hsz, x_TxBxP.dtype)
    w_cat = jnp.concatenate([w_ih_Px4H, w_hh_Hx4H], 0)

    def body(carry, x_BxP):
        c, h = carry
        gates = jnp.concatenate([x_BxP, h], -1) @ w_cat + b_4H
        acts = jnp.tanh(gates * s4) * s4 + shift4
        i, f, g, o = jnp.split(acts, 4, axis=-1)
        c_new = f * c + i * g
        h_new = o * jnp.tanh(c_new)
        return (c_new, h_new), (h_new, c_new, acts)

    return jax.lax.scan(body, (c0_BxH, h0_BxH), x_TxBxP)


@jax.custom_vjp
def lstm_layer_fast(x_TxBxP, w_ih_Px4H, b_4H, w_hh_Hx4H, c0_BxH, h0_BxH):
    """Whole LSTM layer (time-major) with a custom VJP: every weight/input gradient is
    one matmul after the backward loop, which carries only ``(dc, dh)``."""
    (c, h), (hs, _, _) = _lstm_layer_scan(x_TxBxP, w_ih_Px4H, b_4H, w_hh_Hx4H, c0_BxH, h0_BxH)
    return hs, (c, h)


def _lstm_layer_fwd(x, w_ih, b, w_hh, c0, h0):
    (c, h), (hs, cs, acts) = _lstm_layer_scan(x, w_ih, b, w_hh, c0, h0)
    return (hs, (c, h)), (x, w_ih, w_hh, c0, h0, hs, cs, acts)


def _lstm_layer_bwd(res, cot):
    x, w_ih, w_hh, c0, h0, hs, cs, acts = res
    dgates, dw_hh, dc0, dh0 = _lstm_fast_bwd(1, True, (w_hh, c0, h0, hs, cs, acts), cot)
    t, b, p = x.shape
    dg_Nx4H = dgates.reshape(t * b, -1)
    dx = (dg_Nx4H @ w_ih.T).reshape(t, b, p)
    dw_ih = x.reshape(t * b, p).T @ dg_Nx4H
    return dx, dw_ih, dg_Nx4H.sum(0), dw_hh, dc0, dh0


lstm_layer_fast.defvjp(_lstm_layer_fwd, _lstm_layer_bwd)


# ----------------------------------------------------------------------------- GRU (reset after)


def _gru_fwd_scan(xp_TxBx3H, w_Hx3H, bhn_H, h0_BxH, unroll):
    hsz = w_Hx3H.shape[0]

    def body(h, xp):
        hp = h @ w_Hx3H
        r = jax.nn.sigmoid(xp[:, :hsz] + hp[:, :hsz])
        z = jax.nn.sigmoid(xp[:, hsz:2 * hsz] + hp[:, hsz:2 * hsz])
        hn = hp[:, 2 * hsz:] + bhn_H
        n = jnp.tanh(xp[:, 2 * hsz:] + r * hn)
        h_new = (1.0 - z) * n + z * h
        return h_new, (h_new, jnp.concatenate([r, z, n, hn], -1))

    return jax.lax.scan(body, h0_BxH, xp_TxBx3H, unroll=unroll)


def gru_ref(xp_TxBx3H, w_Hx3H, bhn_H, h0_BxH, unroll=1):
    h, (hs, _) = _gru_fwd_scan(xp_TxBx3H, w_Hx3H, bhn_H, h0_BxH, unroll)
    return hs, h


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def gru_fast(xp_TxBx3H, w_Hx3H, bhn_H, h0_BxH, unroll=1):
    return gru_ref(xp_TxBx3H, w_Hx3H, bhn_H, h0_BxH, unroll)


def _gru_fast_fwd(xp, w, bhn, h0, unroll):
    h, (hs, acts) = _gru_fwd_scan(xp, w, bhn, h0, unroll)
    return (hs, h), (w, h0, hs, acts)


def _gru_fast_bwd(unroll, res, cot):
    w_Hx3H, h0_BxH, hs_TxBxH, acts_TxBx4H = res
    dhs, dhT = cot
    hsz = w_Hx3H.shape[0]
    h_prev = jnp.concatenate([h0_BxH[None], hs_TxBxH[:-1]], 0)
    w_t = w_Hx3H.T

    def body(dh, inp):
        dy, hp, acts = inp
        r, z, n, hn = jnp.split(acts, 4, axis=-1)
        dh = dh + dy
        dn = dh * (1.0 - z) * (1.0 - n * n)  # d pre-tanh
        dz = dh * (hp - n) * z * (1.0 - z)
        dr = dn * hn * r * (1.0 - r)
        dhn = dn * r
        dxp = jnp.concatenate([dr, dz, dn], -1)
        dhp = jnp.concatenate([dr, dz, dhn], -1)
        return dh * z + dhp @ w_t, (dxp, dhp)

    dh0, (dxp, dhp) = jax.lax.scan(
        body, dhT, (dhs, h_prev, acts_TxBx4H), reverse=True, unroll=unroll
    )
    dw = h_prev.reshape(-1, hsz).T @ dhp.reshape(-1, 3 * hsz)
    dbhn = dhp[..., 2 * hsz:].sum((0, 1))
    return dxp, dw, dbhn, dh0


gru_fast.defvjp(_gru_fast_fwd, _gru_fast_bwd)


# ----------------------------------------------------------------------------- layers + bench


def init_params(cell: str, hsz: int, seed: int = 0) -> dict:
    g = 4 if cell == "lstm" else 3
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    p = {
        "w_ih": jax.random.normal(k[0], (hsz, g * hsz)) / np.sqrt(hsz),
        "b": jnp.zeros((g * hsz,)),
        "w_hh": jax.nn.initializers.orthogonal()(k[1], (hsz, g * hsz)),
    }
    if cell == "gru":
        p["b_hn"] = jnp.zeros((hsz,))
    return p


def layer(cell: str, impl: str, unroll: int, params: dict, x_BxTxH):
    """Batch-major layer: hoisted input projection, then the recurrence; returns y_BxTxH.

    ``impl``: ``ref``/``fast`` (autodiff / custom-VJP recurrence), with suffix
    ``-tm`` the input is made time-major *before* the projection (a ``[B,T,P]``
    transpose instead of a ``[B,T,G*H]`` one, and the backward's ``dx``/``dW_ih``
    matmuls read ``dgates`` in the layout the scan wrote it).
    """
    b, _, hsz = x_BxTxH.shape
    if impl == "layer":
        x_TxBxP = jnp.swapaxes(x_BxTxH, 0, 1)
        h0 = jnp.zeros((b, hsz), x_BxTxH.dtype)
        hs, _ = lstm_layer_fast(x_TxBxP, params["w_ih"], params["b"], params["w_hh"], h0, h0)
        return jnp.swapaxes(hs, 0, 1)
    if impl.endswith("-tm"):
        xp_TxBxG = jnp.swapaxes(x_BxTxH, 0, 1) @ params["w_ih"] + params["b"]
    else:
        xp_TxBxG = jnp.swapaxes(x_BxTxH @ params["w_ih"] + params["b"], 0, 1)
    impl = impl.removesuffix("-tm")
    one_tanh = impl.endswith("1")
    impl = impl.removesuffix("1")
    h0 = jnp.zeros((b, hsz), x_BxTxH.dtype)
    if cell == "lstm":
        fn = lstm_fast if impl == "fast" else lstm_ref
        hs, _ = (fn(xp_TxBxG, params["w_hh"], h0, h0, unroll, one_tanh) if impl == "fast"
                 else fn(xp_TxBxG, params["w_hh"], h0, h0, unroll))
    else:
        fn = gru_fast if impl == "fast" else gru_ref
        hs, _ = fn(xp_TxBxG, params["w_hh"], params["b_hn"], h0, unroll)
    return jnp.swapaxes(hs, 0, 1)


def grad_fn(cell: str, impl: str, unroll: int):
    def loss(p, x):
        return jnp.sum(layer(cell, impl, unroll, p, x))

    return jax.grad(loss, argnums=(0, 1))


def check(cell: str, b: int = 3, t: int = 7, h: int = 5) -> float:
    """Max abs difference of the fast grads from the autodiff grads."""
    params = init_params(cell, h)
    x = jax.random.normal(jax.random.PRNGKey(1), (b, t, h))
    ga = grad_fn(cell, "ref", 1)(params, x)
    worst = 0.0
    for impl in ("fast-tm", "fast1-tm") + (("layer",) if cell == "lstm" else ()):
        gb = grad_fn(cell, impl, 1)(params, x)
        diffs = jax.tree_util.tree_map(lambda a, c: float(jnp.max(jnp.abs(a - c))), ga, gb)
        worst = max(worst, *jax.tree_util.tree_leaves(diffs))
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", default="lstm")
    ap.add_argument("--shape", default="32x128x256")
    ap.add_argument("--unrolls", default="1")
    ap.add_argument("--impls", default="ref,fast-tm,fast1-tm",
                    help="ref | fast | fast1 (one tanh for all gates), optional -tm suffix; "
                         "layer (LSTM: whole layer custom VJP, projection in the loop)")
    ap.add_argument("--extra", default="seqjax,flax,torch")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--forward", action="store_true", help="time the forward pass only")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (JAX: set XLA_FLAGS)")
    args = ap.parse_args(argv)
    if args.check:
        for c in ("lstm", "gru"):
            print(c, "max |fast - autodiff| grad:", check(c))
        return 0
    b, t, h = (int(v) for v in args.shape.split("x"))
    harness.configure_threads(args.threads)
    x = jax.random.normal(jax.random.PRNGKey(1), (b, t, h))
    params = init_params(args.cell, h)
    peers = []
    for impl in args.impls.split(","):
        for u in (int(v) for v in args.unrolls.split(",")):
            if args.forward:
                fn = functools.partial(layer, args.cell, impl, u)
            else:
                fn = grad_fn(args.cell, impl, u)
            peers.append(harness.Peer(
                f"proto-{impl}-u{u}", lambda fn=fn: harness.jax_prepared(fn, params, x)
            ))
    from benchmarks import rnn

    cfg = rnn.Config(args.cell, b, t, h, backward=not args.forward)
    for name in [e for e in args.extra.split(",") if e]:
        peers.append(harness.Peer(name, lambda n=name: rnn._BUILDERS[n](cfg)))
    res = harness.run_row(cfg.label, peers, b * t, repeats=args.repeats,
                          log=lambda s: print(s, file=sys.stderr, flush=True))
    print(harness.results_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

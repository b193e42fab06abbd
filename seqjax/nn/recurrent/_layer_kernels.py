"""Whole-layer Elman, LSTM and GRU recurrences with hand-written backward passes (CPU/GPU/TPU).

The ``implementation="fused"`` kernels of :class:`seqjax.nn.RNN`, reached only through
:meth:`seqjax.nn.RecurrentCell.layer_weights` (a :class:`seqjax.nn.cells.LayerWeights`, on
which :func:`layer_scan` dispatches). Each computes exactly its cell's ``step`` (row vectors;
``b`` the cell's bias or zeros):

* ``"elman"`` (:class:`~seqjax.nn.ElmanCell`; MEDL (7.2), J&M (9.3) without bias):
  ``h_t = σ(x_t W_ih + h_{t-1} W_hh + b)``;
* ``"lstm"`` (:class:`~seqjax.nn.LSTMCell`; MEDL (7.16)–(7.17), J&M (9.22)–(9.29)):
  ``[i, f, c̃, o] = [σ, σ, tanh, σ](x_t W_ih + h_{t-1} W_hh + b)``,
  ``c_t = f ⊙ c_{t-1} + i ⊙ c̃``, ``h_t = o ⊙ tanh(c_t)``;
* ``"gru"`` (:class:`~seqjax.nn.GRUCell`, ``reset_after=True`` only; order r, z, n):
  ``[r, z] = σ(x_t W_ih + b + h_{t-1} W_hh)[:2H]``, ``n = tanh((x_t W_ih + b)_n + r ⊙
  ((h_{t-1} W_hh)_n + b_hn))``, ``h_t = (1 − z) ⊙ n + z ⊙ h_{t-1}``.

Exact gradients, with ``dh = ∂L/∂h_t`` (from the output and step t+1): Elman
``du = σ′(u_t) ⊙ dh``, ``dh_{t-1} = du W_hhᵀ``; LSTM ``dc ← dc + dh ⊙ o ⊙ (1 − tanh²c_t)``,
``dG = [dc ⊙ c̃, dc ⊙ c_{t-1}, dc ⊙ i, dh ⊙ tanh c_t] ⊙ act′``, ``dc_{t-1} = dc ⊙ f``,
``dh_{t-1} = dG W_hhᵀ``; GRU ``dn̂ = dh ⊙ (1 − z) ⊙ (1 − n²)``, ``dẑ = dh ⊙ (h_{t-1} − n) ⊙
z(1 − z)``, ``dr̂ = dn̂ ⊙ ĥ_n ⊙ r(1 − r)``, ``dh_{t-1} = dh ⊙ z + [dr̂, dẑ, dn̂ ⊙ r] W_hhᵀ``.
Only the scheduling differs from autodiff of ``lax.scan``:

* Forward passes without gradients, and Elman/GRU training: ``x_t W_ih`` inside the loop
  (hoisted, it would write and re-read a ``[T, B, G·H]`` buffer; per step it stays in cache).
* LSTM training: the backward needs a ``[T, B, 4H]`` residual of gates anyway, so ``x W_ih``
  is one GEMM into it; step ``t`` overwrites its slot with its activations, the backward with
  ``dG_t`` (no buffer zero-filled or copied; a test reads the compiled gradient for it).
* Backward: a reverse loop carrying only the state cotangents and emitting ``dG_t`` from the
  saved post-activation gates (Elman: pre-activations), with no recomputed matmul or autodiff
  of the step; each weight gradient is then one matmul over all ``T·B`` rows, ``dW_hh = Σ_t
  h_{t-1}ᵀ dG_t`` (``dW_ih = Σ_t x_tᵀ dG_t``, ``dx = dG W_ihᵀ``).
* One tanh for the four LSTM gates: ``σ(u) = ½ + ½·tanh(u/2)``, so ``act = s·tanh(s·u) + shift``
  with ``(s, shift) = (½, ½)`` for i, f, o and ``(1, 0)`` for c̃; ``act′ = a(1 − a)`` for the
  sigmoid gates, ``1 − a²`` for c̃.

Variable length (``valid_TxB``, right padding): a padded step passes the carry through and
outputs 0; ``reverse=True`` scans ``T-1`` to 0, so each sequence starts at its last real step.
Mixed precision: matmuls in ``compute_dtype`` (float32 accumulation), elementwise math and the
carry in the carry's dtype; gradients in the primal inputs' dtypes.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from seqjax.nn.cells import LayerWeights

Array = jax.Array

__all__ = ["layer_scan", "elman_layer", "lstm_layer", "gru_layer"]

_F32 = jnp.float32


def _dot(a: Array, b: Array, dtype: Any) -> Array:
    return jnp.dot(a.astype(dtype), b.astype(dtype), preferred_element_type=_F32)


def _at(a_TxN: Array, t: Array) -> Array:
    """Slot ``t`` of a time-major array."""
    return lax.dynamic_index_in_dim(a_TxN, t, keepdims=False)


def _shift(seq_TxBxH: Array, first_BxH: Array, reverse: bool) -> Array:
    """The carry *before* each step: ``[c0, c_0, …, c_{T-2}]`` (reversed order if ``reverse``)."""
    if seq_TxBxH.shape[0] == 0:
        return seq_TxBxH
    first = first_BxH[None].astype(seq_TxBxH.dtype)
    return jnp.concatenate([seq_TxBxH[1:], first] if reverse else [first, seq_TxBxH[:-1]], 0)


def _keep(valid_B: Array | None, new: Any, old: Any) -> Array:
    """``new`` in the valid rows, ``old`` (an array or a scalar) in the padded ones."""
    return new if valid_B is None else jnp.where(valid_B[:, None], new, old)


def _mask_y(hs_TxBxH: Array, valid_TxB: Array | None) -> Array:
    return hs_TxBxH if valid_TxB is None else jnp.where(
        valid_TxB[..., None], hs_TxBxH, jnp.zeros_like(hs_TxBxH))


def _gate_consts(hsz: int, dtype: Any) -> tuple[Array, Array]:
    half = jnp.full((hsz,), 0.5, dtype)
    s = jnp.concatenate([half, half, jnp.ones((hsz,), dtype), half])
    shift = jnp.concatenate([half, half, jnp.zeros((hsz,), dtype), half])
    return s, shift


def _weight_grads(x, w_ih, b, w_hh, h_prev_TxBxH, dg_TxBxG, compute_dtype):
    """``(dx, dW_ih, db, dW_hh)`` from the pre-activation cotangents ``dG`` (module docstring)."""
    num_steps, batch, in_features = x.shape
    dg = dg_TxBxG.reshape(num_steps * batch, dg_TxBxG.shape[-1])
    dw_ih = _dot(x.reshape(-1, in_features).T, dg, compute_dtype)
    dw_hh = _dot(h_prev_TxBxH.reshape(-1, w_hh.shape[0]).T, dg, compute_dtype)
    dx = _dot(dg, w_ih.T, compute_dtype).reshape(num_steps, batch, in_features)
    return (dx.astype(x.dtype), dw_ih.astype(w_ih.dtype), dg.sum(0).astype(b.dtype),
            dw_hh.astype(w_hh.dtype))


def layer_scan(weights: LayerWeights, x_TxBxP: Array, carry: Any, valid_TxB: Array | None,
               reverse: bool, compute_dtype: Any, unroll: int = 1) -> tuple[Any, Array]:
    """Kernel ``weights.equation`` over a time-major layer: ``(final_carry, y_TxBxH)``; carry
    as the cell's (Elman/GRU ``h``, LSTM ``(c, h)``, each ``[B, H]``)."""
    w = weights
    xw = (x_TxBxP, w.input_kernel, w.bias, w.recurrent_kernel)
    loop = (reverse, compute_dtype, unroll)
    if w.equation == "elman":
        y, carry = elman_layer(*xw, carry, valid_TxB, w.activation, *loop)
    elif w.equation == "lstm":
        y, carry = lstm_layer(*xw, *carry, valid_TxB, *loop)
    elif w.equation == "gru":
        y, carry = gru_layer(*xw, w.recurrent_bias, carry, valid_TxB, *loop)
    else:
        raise ValueError(
            f"`weights.equation` must be 'elman', 'lstm' or 'gru'; got {w.equation!r}.")
    return carry, y


# ---------------------------------------------------------------------------------- Elman


@partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def elman_layer(
    x_TxBxP, w_ih, b, w_hh, h0, valid_TxB, activation, reverse, compute_dtype, unroll=1
):
    """Elman layer, time-major: ``(y_TxBxH, h_T)``; ``w_ih: [P, H]``, ``w_hh: [H, H]``."""
    return _elman_fwd(x_TxBxP, w_ih, b, w_hh, h0, valid_TxB, activation, reverse, compute_dtype,
                      unroll, keep=False)[0]


def _elman_fwd(x, w_ih, b, w_hh, h0, valid, activation, reverse, compute_dtype, unroll, keep=True):
    """``((y, h_T), residuals)``; the primal (``keep=False``) keeps no pre-activations."""
    ew = h0.dtype
    w_i, w_h = w_ih.astype(compute_dtype), w_hh.astype(compute_dtype)
    b_ew = b.astype(ew)

    def body(h, inputs):
        x_BxP, valid_B = inputs
        u = _dot(x_BxP, w_i, compute_dtype) + _dot(h, w_h, compute_dtype)
        u = u.astype(ew) + b_ew
        h_new = _keep(valid_B, activation(u).astype(ew), h)
        return h_new, (h_new, u if keep else None)

    h, (hs, us) = lax.scan(body, h0, (x, valid), reverse=reverse, unroll=unroll)
    return (_mask_y(hs, valid), h), (x, w_ih, b, w_hh, h0, valid, hs, us)


def _elman_bwd(activation, reverse, compute_dtype, unroll, res, cot):
    x, w_ih, b, w_hh, h0, valid, hs, us = res
    dy_TxBxH, dh_T = cot
    ew = us.dtype
    w_hh_t = w_hh.astype(compute_dtype).T
    dy = _mask_y(dy_TxBxH.astype(ew), valid)

    def body(dh, inputs):
        dy_BxH, u, valid_B = inputs
        dh_all = dh + dy_BxH
        du = jax.vjp(activation, u)[1](dh_all.astype(ew))[0].astype(ew)  # σ′(u) ⊙ dh
        du = _keep(valid_B, du, 0.0)
        # A padded step passed the carry through.
        return _keep(valid_B, _dot(du, w_hh_t, compute_dtype).astype(ew), dh_all), du

    dh0, du_TxBxH = lax.scan(body, dh_T.astype(ew), (dy, us, valid), reverse=not reverse,
                             unroll=unroll)
    grads = _weight_grads(x, w_ih, b, w_hh, _shift(hs, h0, reverse), du_TxBxH, compute_dtype)
    return (*grads, dh0.astype(h0.dtype), None)


elman_layer.defvjp(_elman_fwd, _elman_bwd)


# ----------------------------------------------------------------------------------- LSTM


def _lstm_update(gates, c, s4, shift4):
    """``(acts = [i, f, c̃, o], c_t, h_t)`` from pre-activations ``gates: [B, 4H]`` and ``c``."""
    acts = jnp.tanh(gates * s4) * s4 + shift4
    i, f, g, o = jnp.split(acts, 4, axis=-1)
    c_new = f * c + i * g
    return acts, c_new, o * jnp.tanh(c_new)


@partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def lstm_layer(x_TxBxP, w_ih, b, w_hh, c0, h0, valid_TxB, reverse, compute_dtype, unroll=1):
    """LSTM layer, time-major: ``(y_TxBxH, (c_T, h_T))``; ``w_ih: [P, 4H]``, ``w_hh: [H, 4H]``."""
    ew = c0.dtype  # elementwise / carry dtype
    w_i, w_h = w_ih.astype(compute_dtype), w_hh.astype(compute_dtype)
    b_ew = b.astype(ew)
    s4, shift4 = _gate_consts(w_hh.shape[0], ew)

    def body(carry, inputs):
        c, h = carry
        x_BxP, valid_B = inputs
        gates = _dot(x_BxP, w_i, compute_dtype) + _dot(h, w_h, compute_dtype)
        _, c_new, h_new = _lstm_update(gates.astype(ew) + b_ew, c, s4, shift4)
        c_new, h_new = _keep(valid_B, c_new, c), _keep(valid_B, h_new, h)
        return (c_new, h_new), h_new

    (c, h), hs = lax.scan(body, (c0, h0), (x_TxBxP, valid_TxB), reverse=reverse, unroll=unroll)
    return _mask_y(hs, valid_TxB), (c, h)


def _lstm_fwd(x, w_ih, b, w_hh, c0, h0, valid, reverse, compute_dtype, unroll):
    """The training pass (module docstring); residuals ``hs, cs, acts`` in time order."""
    num_steps, batch, in_features = x.shape
    hsz = w_hh.shape[0]
    ew = c0.dtype
    xw = _dot(x.reshape(num_steps * batch, in_features), w_ih, compute_dtype)
    xw = xw.astype(ew).reshape(num_steps, batch, 4 * hsz)
    w_h = w_hh.astype(compute_dtype)
    b_ew = b.astype(ew)
    s4, shift4 = _gate_consts(hsz, ew)

    def body(i, carry):
        c, h, buf, hs, cs = carry
        t = num_steps - 1 - i if reverse else i
        gates = _at(buf, t) + b_ew
        gates = gates + _dot(h, w_h, compute_dtype).astype(ew)
        acts, c_new, h_new = _lstm_update(gates, c, s4, shift4)
        valid_B = None if valid is None else _at(valid, t)
        c_new, h_new = _keep(valid_B, c_new, c), _keep(valid_B, h_new, h)
        put = partial(lax.dynamic_update_index_in_dim, index=t, axis=0)
        return c_new, h_new, put(buf, acts), put(hs, h_new), put(cs, c_new)

    c, h, acts = c0, h0, xw
    hs = jnp.zeros((num_steps, batch, hsz), ew)
    cs = jnp.zeros((num_steps, batch, hsz), ew)
    if num_steps:  # (no slot to index in an empty sequence)
        c, h, acts, hs, cs = lax.fori_loop(0, num_steps, body, (c, h, acts, hs, cs),
                                           unroll=unroll)
    return (_mask_y(hs, valid), (c, h)), (x, w_ih, b, w_hh, c0, h0, valid, hs, cs, acts)


def _lstm_bwd(reverse, compute_dtype, unroll, res, cot):
    x, w_ih, b, w_hh, c0, h0, valid, hs, cs, acts = res
    dy_TxBxH, (dc_T, dh_T) = cot
    num_steps = x.shape[0]
    ew = acts.dtype
    w_hh_t = w_hh.astype(compute_dtype).T
    dy = _mask_y(dy_TxBxH.astype(ew), valid)
    c_first = c0.astype(ew)

    def body(i, carry):
        dc, dh, buf = carry
        t = i if reverse else num_steps - 1 - i  # forward time, visited in reverse
        t_prev = t + 1 if reverse else t - 1  # the step before t in the forward pass
        first = t == (num_steps - 1 if reverse else 0)
        cp = jnp.where(first, c_first, _at(cs, jnp.clip(t_prev, 0, num_steps - 1)))
        ig, fg, gg, og = jnp.split(_at(buf, t), 4, axis=-1)
        dh_all = dh + _at(dy, t)
        tc = jnp.tanh(_at(cs, t))
        dc_all = dc + dh_all * og * (1.0 - tc * tc)
        valid_B = None if valid is None else _at(valid, t)  # a padded step: carry passed through
        dc_prev = _keep(valid_B, dc_all * fg, dc)
        # dG = dacts ⊙ act′. The forget term goes through dc_prev (= dc ⊙ f at a real step) so
        # every read of slot t feeds the value overwriting it: XLA updates the buffer in place.
        dg = jnp.concatenate([dc_all * gg * ig * (1.0 - ig), dc_prev * cp * (1.0 - fg),
                              dc_all * ig * (1.0 - gg * gg), dh_all * tc * og * (1.0 - og)], -1)
        dg = _keep(valid_B, dg, 0.0)
        dh_prev = _keep(valid_B, _dot(dg, w_hh_t, compute_dtype).astype(ew), dh_all)
        return dc_prev, dh_prev, lax.dynamic_update_index_in_dim(buf, dg, t, 0)

    carry = (dc_T.astype(ew), dh_T.astype(ew), acts)
    if num_steps:  # (no slot to index in an empty sequence)
        carry = lax.fori_loop(0, num_steps, body, carry, unroll=unroll)
    dc0, dh0, dg_TxBx4H = carry
    grads = _weight_grads(x, w_ih, b, w_hh, _shift(hs, h0, reverse), dg_TxBx4H, compute_dtype)
    return (*grads, dc0.astype(c0.dtype), dh0.astype(h0.dtype), None)


lstm_layer.defvjp(_lstm_fwd, _lstm_bwd)


# ------------------------------------------------------------------------------------ GRU


@partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def gru_layer(x_TxBxP, w_ih, b, w_hh, b_hn, h0, valid_TxB, reverse, compute_dtype, unroll=1):
    """GRU (``reset_after``) layer, time-major: ``(y_TxBxH, h_T)``; ``w_ih: [P, 3H]``,
    ``w_hh: [H, 3H]``, ``b_hn: [H]``."""
    return _gru_fwd(x_TxBxP, w_ih, b, w_hh, b_hn, h0, valid_TxB, reverse, compute_dtype, unroll,
                    keep=False)[0]


def _gru_fwd(x, w_ih, b, w_hh, b_hn, h0, valid, reverse, compute_dtype, unroll, keep=True):
    """``((y, h_T), residuals)``; the primal (``keep=False``) keeps no activations."""
    ew = h0.dtype
    hsz = w_hh.shape[0]
    w_i, w_h = w_ih.astype(compute_dtype), w_hh.astype(compute_dtype)
    b_ew, b_hn_ew = b.astype(ew), b_hn.astype(ew)

    def body(h, inputs):
        x_BxP, valid_B = inputs
        # Both projections inside the loop (no [T, B, 3H] buffer): x_t W_ih and h W_hh.
        xp = _dot(x_BxP, w_i, compute_dtype).astype(ew) + b_ew
        hp = _dot(h, w_h, compute_dtype).astype(ew)
        rz = jax.nn.sigmoid(xp[:, : 2 * hsz] + hp[:, : 2 * hsz])
        r, z = rz[:, :hsz], rz[:, hsz:]
        hn = hp[:, 2 * hsz :] + b_hn_ew
        n = jnp.tanh(xp[:, 2 * hsz :] + r * hn)
        h_new = _keep(valid_B, n + z * (h - n), h)
        return h_new, (h_new, jnp.concatenate([rz, n, hn], -1) if keep else None)

    h, (hs, acts) = lax.scan(body, h0, (x, valid), reverse=reverse, unroll=unroll)
    return (_mask_y(hs, valid), h), (x, w_ih, b, w_hh, b_hn, h0, valid, hs, acts)


def _gru_bwd(reverse, compute_dtype, unroll, res, cot):
    x, w_ih, b, w_hh, b_hn, h0, valid, hs, acts = res
    num_steps, batch, in_features = x.shape
    dy_TxBxH, dh_T = cot
    hsz = w_hh.shape[0]
    ew = acts.dtype
    h_prev = _shift(hs, h0, reverse)
    w_hh_t = w_hh.astype(compute_dtype).T
    dy = _mask_y(dy_TxBxH.astype(ew), valid)

    def body(dh, inputs):
        dy_BxH, hp, a, valid_B = inputs
        r, z, n, hn = a[:, :hsz], a[:, hsz : 2 * hsz], a[:, 2 * hsz : 3 * hsz], a[:, 3 * hsz :]
        dh_all = dh + dy_BxH
        dn = dh_all * (1.0 - z) * (1.0 - n * n)  # d (pre-tanh)
        dz = dh_all * (hp - n) * z * (1.0 - z)
        dr = dn * hn * r * (1.0 - r)
        dxp = _keep(valid_B, jnp.concatenate([dr, dz, dn], -1), 0.0)
        dhp = _keep(valid_B, jnp.concatenate([dr, dz, dn * r], -1), 0.0)
        dh_prev = dh_all * z + _dot(dhp, w_hh_t, compute_dtype).astype(ew)
        return _keep(valid_B, dh_prev, dh_all), (dxp, dhp)

    dh0, (dxp, dhp) = lax.scan(body, dh_T.astype(ew), (dy, h_prev, acts, valid),
                               reverse=not reverse, unroll=unroll)
    dhp_N = dhp.reshape(-1, 3 * hsz)
    dw_hh = _dot(h_prev.reshape(-1, hsz).T, dhp_N, compute_dtype)
    db_hn = dhp_N[:, 2 * hsz :].sum(0)
    dxp_N = dxp.reshape(-1, 3 * hsz)
    dw_ih = _dot(x.reshape(-1, in_features).T, dxp_N, compute_dtype)
    dx = _dot(dxp_N, w_ih.T, compute_dtype).reshape(num_steps, batch, in_features)
    return (dx.astype(x.dtype), dw_ih.astype(w_ih.dtype), dxp_N.sum(0).astype(b.dtype),
            dw_hh.astype(w_hh.dtype), db_hn.astype(b_hn.dtype), dh0.astype(h0.dtype), None)


gru_layer.defvjp(_gru_fwd, _gru_bwd)

"""A time scan for cells whose recurrence is one matmul ``rec_t = h_{t-1} @ W``, with a custom VJP.

Autodiff of ``lax.scan`` accumulates ``dW += h_{t-1}ᵀ d(rec_t)`` inside the
backward loop: ``T`` small ``[H, B] x [B, G*H]`` matmuls plus ``T`` read-modify-writes
of the whole ``[H, G*H]`` gradient. Here the backward loop only propagates the
carry cotangent (``d h_{t-1} += d(rec_t) Wᵀ``) and stores ``d(rec_t)``; the weight
gradient is then one ``[H, T*B] x [T*B, G*H]`` matmul after the loop. The
elementwise part of each step is differentiated with ``jax.vjp`` of the cell's
own step function, so the math lives in one place (the cell).

A step function has the signature ``step(aux, carry, xp_t, rec_t) -> (carry, y_t)``
where ``aux`` holds small per-cell parameters (e.g. the GRU's ``b_hn``),
``get_h(carry)`` selects the matmul input and ``add_h(d_carry, dh)`` adds a
cotangent to that part of a carry cotangent.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
Carry = Any

_tmap = jax.tree_util.tree_map


def _where(valid_B: Array | None, a: Any, b: Any) -> Any:
    if valid_B is None:
        return a
    return _tmap(lambda u, v: jnp.where(valid_B.reshape(valid_B.shape + (1,) * (u.ndim - 1)), u, v),
                 a, b)


def _rec(h: Array, w: Array, dtype: Any) -> Array:
    return jnp.dot(h.astype(dtype), w.astype(dtype))


def _forward(step, get_h, aux, w, carry0, xp_TxBxG, valid_TxB, reverse, unroll, keep):
    dtype = xp_TxBxG.dtype

    def body(carry, inputs):
        xp_BxG, valid_B = inputs
        rec_BxG = _rec(get_h(carry), w, dtype)
        new, y = step(aux, carry, xp_BxG, rec_BxG)
        new = _tmap(lambda n, o: n.astype(o.dtype), new, carry)
        new = _where(valid_B, new, carry)
        if valid_B is not None:
            y = jnp.where(valid_B[:, None], y, jnp.zeros_like(y))
        res = (carry, rec_BxG) if keep else None
        return new, (y, res)

    return jax.lax.scan(body, carry0, (xp_TxBxG, valid_TxB), reverse=reverse, unroll=unroll)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 8, 9))
def fused_scan(
    step: Callable,
    get_h: Callable,
    add_h: Callable,
    aux: Any,
    w: Array,
    carry0: Carry,
    xp_TxBxG: Array,
    valid_TxB: Array | None,
    reverse: bool,
    unroll: int,
) -> tuple[Carry, Array]:
    """Scan ``step`` over time; returns ``(final_carry, y_TxBxH)`` (see module docstring)."""
    carry, (y, _) = _forward(step, get_h, aux, w, carry0, xp_TxBxG, valid_TxB, reverse, unroll,
                             keep=False)
    return carry, y


def _fused_fwd(step, get_h, add_h, aux, w, carry0, xp_TxBxG, valid_TxB, reverse, unroll):
    carry, (y, (carries_prev, recs)) = _forward(
        step, get_h, aux, w, carry0, xp_TxBxG, valid_TxB, reverse, unroll, keep=True
    )
    return (carry, y), (aux, w, carries_prev, recs, xp_TxBxG, valid_TxB)


def _fused_bwd(step, get_h, add_h, reverse, unroll, residuals, cotangents):
    aux, w, carries_prev, recs, xp_TxBxG, valid_TxB = residuals
    d_carry_T, dy_TxBxH = cotangents
    dtype = xp_TxBxG.dtype
    w_t = w.astype(dtype).T

    def body(state, inputs):
        d_carry, d_aux = state
        carry_prev, rec_BxG, xp_BxG, dy_BxH, valid_B = inputs
        (new_out, y_out), vjp = jax.vjp(step, aux, carry_prev, xp_BxG, rec_BxG)
        # The forward pass casts the new carry back to the carry's dtype (e.g. bf16 compute
        # with an fp32 carry): cotangents enter the step in the dtypes the step produced.
        d_new = _tmap(lambda d, o: d.astype(o.dtype), d_carry, new_out)
        if valid_B is not None:
            d_new = _where(valid_B, d_new, _tmap(jnp.zeros_like, d_new))
            dy_BxH = jnp.where(valid_B[:, None], dy_BxH, jnp.zeros_like(dy_BxH))
        da, d_prev, d_xp, d_rec = vjp((d_new, dy_BxH.astype(y_out.dtype)))
        d_prev = add_h(d_prev, jnp.dot(d_rec.astype(dtype), w_t).astype(get_h(carry_prev).dtype))
        if valid_B is not None:  # masked steps pass the carry cotangent straight through
            d_prev = _tmap(lambda p, c: p + jnp.where(
                valid_B.reshape(valid_B.shape + (1,) * (c.ndim - 1)), jnp.zeros_like(c), c),
                d_prev, d_carry)
        d_aux = _tmap(jnp.add, d_aux, da)
        return (d_prev, d_aux), (d_xp, d_rec)

    d_aux0 = _tmap(jnp.zeros_like, aux)
    (d_carry0, d_aux), (d_xp, d_rec) = jax.lax.scan(
        body,
        (d_carry_T, d_aux0),
        (carries_prev, recs, xp_TxBxG, dy_TxBxH, valid_TxB),
        reverse=not reverse,
        unroll=unroll,
    )
    # One big matmul for the recurrent weight gradient: Σ_t h_{t-1}ᵀ d(rec_t).
    h_prev = get_h(carries_prev)
    dw = jnp.einsum("tbh,tbg->hg", h_prev.astype(dtype), d_rec.astype(dtype),
                    preferred_element_type=jnp.float32).astype(w.dtype)
    d_valid = None
    return d_aux, dw, d_carry0, d_xp.astype(xp_TxBxG.dtype), d_valid


fused_scan.defvjp(_fused_fwd, _fused_bwd)

r"""The cuDNN LSTM behind ``implementation="cudnn"``: seqjax's weights in cuDNN's layout.

``jax.experimental.rnn.lstm`` runs a whole (stacked, optionally bidirectional) LSTM as one
cuDNN call (GPU only, float32), the LSTM of :class:`~seqjax.nn.LSTMCell` (MEDL (7.16)–(7.17);
J&M (9.22)–(9.29); gate order i, f, c̃, o):

.. math::
    [i, f, \tilde c, o] = [\sigma, \sigma, \tanh, \sigma](W_{ih} x_t + b_{ih} + W_{hh} h_{t-1}
    + b_{hh}),\quad c_t = f \odot c_{t-1} + i \odot \tilde c,\quad h_t = o \odot \tanh c_t

with ``W_ih = kernelᵀ``, ``b_ih`` seqjax's bias (``b + b_hh`` with
``LSTMCell(recurrent_bias=True)``) and ``b_hh = 0``. The layers (``layers.py``) decide when it
runs and check the request. Tested on CPU through ``jax.experimental.rnn.lstm_ref``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from seqjax.nn.cells import LayerWeights
from seqjax.nn.masks import padding_mask

Array = jax.Array
Carry = Any

__all__ = ["cudnn_lstm_weights", "lstm_layer", "lstm_stack"]


def _pack(cells: Sequence[tuple[Array, Array, Array]]) -> Array:
    """cuDNN's flat weights (:func:`cudnn_lstm_weights`) from per-pseudo-layer
    ``(input_kernel, bias, recurrent_kernel)``."""
    mats = []
    for w_ih, _, w_hh in cells:
        mats.append(w_ih.T.reshape(-1))
        mats.append(w_hh.T.reshape(-1))
    for _, b, _ in cells:
        mats.append(b)
        mats.append(jnp.zeros_like(b))
    return jnp.concatenate([m.astype(jnp.float32) for m in mats])


def cudnn_lstm_weights(params: Any, num_layers: int, bidirectional: bool) -> Array:
    """Pack a ``StackedRNN(cell_type="lstm")`` parameter tree into cuDNN's flat weight vector.

    Layout: for every pseudo-layer ``l = layer * dirs + direction``, ``W_ih [4H, P_l]`` then
    ``W_hh [4H, H]``; then, for every pseudo-layer, ``b_ih [4H]`` then ``b_hh [4H]`` (gate order
    i, f, g, o). ``b_ih`` is seqjax's bias (zeros without; with ``recurrent_bias=True`` the
    sum of both), ``b_hh`` is zero.
    """
    cells = []
    for layer in range(num_layers):
        lp = params[f"layer_{layer}"]
        cells.extend(
            [lp["forward"]["cell"], lp["backward"]["cell"]] if bidirectional else [lp["cell"]]
        )
    packed = []
    for cell in cells:
        kernel = cell["input"]["kernel"]
        bias = cell["input"].get("bias", jnp.zeros(kernel.shape[-1:], kernel.dtype))
        if "recurrent_bias" in cell:  # LSTMCell(recurrent_bias=True): b_ih + b_hh
            bias = bias + cell["recurrent_bias"]
        packed.append((kernel, bias, cell["recurrent_kernel"]))
    return _pack(packed)


def lstm_layer(
    weights: LayerWeights, x_BxTxP: Array, carry: Carry, lengths: Array | None
) -> tuple[Carry, Array]:
    """One forward LSTM layer through cuDNN (float32): ``((c_T, h_T), y_BxTxH)``.

    ``weights``: the cell's ``"lstm"`` :meth:`~seqjax.nn.RecurrentCell.layer_weights`;
    ``lengths`` checked by the caller (``None``: all full). Outputs past a row's length are
    zero; a row of length 0 keeps its initial carry.
    """
    from jax.experimental import rnn as jrnn

    batch, num_steps, in_features = x_BxTxP.shape
    hidden = weights.recurrent_kernel.shape[0]
    padded = lengths is not None
    lengths_B = jnp.full((batch,), num_steps, jnp.int32) if lengths is None else lengths
    c0, h0 = carry
    w = _pack([(weights.input_kernel, weights.bias, weights.recurrent_kernel)])
    # A row of length 0 keeps its initial carry (cuDNN is given at least one step).
    y, h_n, c_n = jrnn.lstm(
        x_BxTxP.astype(jnp.float32),
        h0[None].astype(jnp.float32),
        c0[None].astype(jnp.float32),
        w,
        jnp.maximum(lengths_B, 1),
        input_size=in_features,
        hidden_size=hidden,
        num_layers=1,
        dropout=0.0,
        bidirectional=False,
    )
    if padded:
        y = jnp.where(padding_mask(lengths_B, num_steps)[..., None], y, 0.0)
    y = y.astype(x_BxTxP.dtype)
    ran = (lengths_B > 0)[:, None]
    return (
        jnp.where(ran, c_n[0], c0).astype(c0.dtype),
        jnp.where(ran, h_n[0], h0).astype(h0.dtype),
    ), y


def lstm_stack(
    params: Any,
    x_BxTxP: Array,
    lengths: Array | None,
    initial_carry: Sequence[Carry] | None,
    *,
    features: int,
    num_layers: int,
    bidirectional: bool,
) -> tuple[Array, tuple[Carry, ...]]:
    """A whole ``StackedRNN(cell_type="lstm")`` as one cuDNN call: ``(y_BxTxD, carries)``.

    ``lengths`` checked by the caller (``None``: all full); carries as
    :class:`~seqjax.nn.StackedRNN`'s (per layer ``(c, h)``, or ``((c, h), (c, h))``
    forward/backward). ``D = features`` (``2·features`` when bidirectional).
    """
    from jax.experimental import rnn as jrnn

    batch, num_steps, in_features = x_BxTxP.shape
    padded = lengths is not None
    lengths_B = jnp.full((batch,), num_steps, jnp.int32) if lengths is None else lengths
    dirs = 2 if bidirectional else 1
    zeros = jnp.zeros((num_layers * dirs, batch, features), jnp.float32)
    h0, c0 = zeros, zeros
    if initial_carry is not None:
        per = [c for carry in initial_carry for c in (carry if dirs == 2 else (carry,))]
        c0 = jnp.stack([c for c, _ in per])
        h0 = jnp.stack([h for _, h in per])
    weights = cudnn_lstm_weights(params, num_layers, bidirectional)
    # cuDNN runs in float32: bf16 inputs are upcast, outputs come back in the input's dtype.
    out_dtype = x_BxTxP.dtype
    y, h_n, c_n = jrnn.lstm(
        x_BxTxP.astype(jnp.float32),
        h0.astype(jnp.float32),
        c0.astype(jnp.float32),
        weights,
        lengths_B,
        input_size=in_features,
        hidden_size=features,
        num_layers=num_layers,
        dropout=0.0,
        bidirectional=bidirectional,
    )
    if padded:
        y = jnp.where(padding_mask(lengths_B, num_steps)[..., None], y, 0.0)
    y = y.astype(out_dtype)
    h_n, c_n = h_n.astype(out_dtype), c_n.astype(out_dtype)
    finals = []
    for layer in range(num_layers):
        carries = tuple((c_n[layer * dirs + d], h_n[layer * dirs + d]) for d in range(dirs))
        finals.append(carries if dirs == 2 else carries[0])
    return y, tuple(finals)

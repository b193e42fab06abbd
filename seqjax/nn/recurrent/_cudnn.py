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
    mats = [m for w_ih, _, w_hh in cells for m in (w_ih.T.reshape(-1), w_hh.T.reshape(-1))]
    mats += [m for _, b, _ in cells for m in (b, jnp.zeros_like(b))]
    return jnp.concatenate([m.astype(jnp.float32) for m in mats])


def cudnn_lstm_weights(params: Any, num_layers: int, bidirectional: bool) -> Array:
    """Pack a ``StackedRNN(cell_type="lstm")`` parameter tree into cuDNN's flat weight vector.

    Layout: for every pseudo-layer ``l = layer * dirs + direction``, ``W_ih [4H, P_l]`` then
    ``W_hh [4H, H]``; then, for every pseudo-layer, ``b_ih [4H]`` then ``b_hh [4H]`` (gate order
    i, f, g, o). ``b_ih`` is seqjax's bias (zeros without; with ``recurrent_bias=True`` the
    sum of both), ``b_hh`` is zero.
    """
    layers = [params[f"layer_{layer}"] for layer in range(num_layers)]
    cells = ([lp[d]["cell"] for lp in layers for d in ("forward", "backward")] if bidirectional
             else [lp["cell"] for lp in layers])
    packed = []
    for cell in cells:
        kernel = cell["input"]["kernel"]
        bias = cell["input"].get("bias", jnp.zeros(kernel.shape[-1:], kernel.dtype))
        if "recurrent_bias" in cell:  # LSTMCell(recurrent_bias=True): b_ih + b_hh
            bias = bias + cell["recurrent_bias"]
        packed.append((kernel, bias, cell["recurrent_kernel"]))
    return _pack(packed)


def _lstm(
    x_BxTxP: Array, c0: Array, h0: Array, weights: Array, lengths: Array | None, hidden: int,
    num_layers: int = 1, bidirectional: bool = False, min_length: int = 0,
) -> tuple[Array, Array, Array]:
    """``jax.experimental.rnn.lstm`` in float32 (bf16 inputs are upcast): ``(y, h_n, c_n)``,
    ``y`` in ``x``'s dtype and zero past each row's length; cuDNN is given lengths of at least
    ``min_length``."""
    from jax.experimental import rnn as jrnn

    batch, num_steps, in_features = x_BxTxP.shape
    lengths_B = jnp.full((batch,), num_steps, jnp.int32) if lengths is None else lengths
    f32 = jnp.float32
    y, h_n, c_n = jrnn.lstm(
        x_BxTxP.astype(f32), h0.astype(f32), c0.astype(f32), weights,
        jnp.maximum(lengths_B, min_length) if min_length else lengths_B,
        input_size=in_features, hidden_size=hidden, num_layers=num_layers, dropout=0.0,
        bidirectional=bidirectional,
    )
    if lengths is not None:
        y = jnp.where(padding_mask(lengths_B, num_steps)[..., None], y, 0.0)
    return y.astype(x_BxTxP.dtype), h_n, c_n


def lstm_layer(weights: LayerWeights, x_BxTxP: Array, carry: Carry,
               lengths: Array | None) -> tuple[Carry, Array]:
    """One forward LSTM layer through cuDNN (float32): ``((c_T, h_T), y_BxTxH)``.

    ``weights``: the cell's ``"lstm"`` :meth:`~seqjax.nn.RecurrentCell.layer_weights`;
    ``lengths`` checked by the caller (``None``: all full). Outputs past a row's length are
    zero; a row of length 0 keeps its initial carry.
    """
    c0, h0 = carry
    w = _pack([(weights.input_kernel, weights.bias, weights.recurrent_kernel)])
    # A row of length 0 keeps its initial carry (cuDNN is given at least one step).
    y, h_n, c_n = _lstm(x_BxTxP, c0[None], h0[None], w, lengths,
                        weights.recurrent_kernel.shape[0], min_length=1)
    ran = x_BxTxP.shape[1] > 0 if lengths is None else (lengths > 0)[:, None]
    c, h = (jnp.where(ran, new[0], old).astype(old.dtype) for new, old in ((c_n, c0), (h_n, h0)))
    return (c, h), y


def lstm_stack(
    params: Any, x_BxTxP: Array, lengths: Array | None, initial_carry: Sequence[Carry] | None,
    *, features: int, num_layers: int, bidirectional: bool,
) -> tuple[Array, tuple[Carry, ...]]:
    """A whole ``StackedRNN(cell_type="lstm")`` as one cuDNN call: ``(y_BxTxD, carries)``.

    ``lengths`` checked by the caller (``None``: all full); carries as
    :class:`~seqjax.nn.StackedRNN`'s (per layer ``(c, h)``, or ``((c, h), (c, h))``
    forward/backward). ``D = features`` (``2·features`` when bidirectional).
    """
    dirs = 2 if bidirectional else 1
    c0 = h0 = jnp.zeros((num_layers * dirs, x_BxTxP.shape[0], features), jnp.float32)
    if initial_carry is not None:
        per = [c for carry in initial_carry for c in (carry if dirs == 2 else (carry,))]
        c0, h0 = (jnp.stack(states) for states in zip(*per))
    weights = cudnn_lstm_weights(params, num_layers, bidirectional)
    y, h_n, c_n = _lstm(x_BxTxP, c0, h0, weights, lengths, features, num_layers, bidirectional)
    finals = [(c, h) for c, h in zip(c_n.astype(y.dtype), h_n.astype(y.dtype))]
    return y, tuple(tuple(finals[layer * dirs : (layer + 1) * dirs]) if bidirectional
                    else finals[layer] for layer in range(num_layers))

"""Convert ``torch.nn.RNN/LSTM/GRU`` weights to and from ``seqjax.nn.StackedRNN``.

PyTorch stores, per layer ``k`` and direction (suffix ``_reverse``), ``weight_ih_l{k} [G*H, P]``,
``weight_hh_l{k} [G*H, H]``, ``bias_ih_l{k}`` and ``bias_hh_l{k} [G*H]``, gate blocks in seqjax's
order ``i, f, g, o`` (LSTM) and ``r, z, n`` (GRU). seqjax keeps one input bias per gate (MEDL's
count), so the two biases import as their sum, except the GRU's ``b_hn`` (inside the reset
product), which maps to ``recurrent_bias_n``. Only tensors are read (``state_dict()``);
``torch`` is imported lazily (a test/parity extra, never a runtime dependency).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.nn.recurrent import StackedRNN

__all__ = ["torch_rnn_to_seqjax", "seqjax_to_torch_rnn"]

_KINDS = {"LSTM": ("lstm", 4), "GRU": ("gru", 3), "RNN": ("elman", 1)}
#: ``torch.nn.RNN``'s ``nonlinearity`` -> the Elman cell's ``activation``.
_NONLINEARITIES = {"tanh": jnp.tanh, "relu": jax.nn.relu}


def _directions(bidirectional: bool) -> dict[str, str | None]:
    """PyTorch's name suffix -> the direction's sub-tree in seqjax (``None``: the layer's own)."""
    return {"": "forward", "_reverse": "backward"} if bidirectional else {"": None}


def torch_rnn_to_seqjax(module: Any) -> tuple[StackedRNN, dict]:
    """Build a :class:`~seqjax.nn.StackedRNN` and its variables from a torch RNN module.

    Any ``num_layers``, ``bidirectional``, ``bias``, ``batch_first`` (seqjax is always
    batch-major: transpose time-major inputs yourself) and ``dropout`` (``dropout_rate``);
    ``proj_size`` (LSTM projections) is rejected. Returns ``(stack, {"params": ...})`` with
    ``stack.apply(variables, x [B, T, P], lengths)`` equal to the padded output of ``module``
    on the packed sequence.
    """
    kind = type(module).__name__
    if kind not in _KINDS:
        raise TypeError(f"`module` must be torch.nn.RNN, LSTM or GRU; got {kind}.")
    if getattr(module, "proj_size", 0):
        raise ValueError(f"`module.proj_size` must be 0; got {module.proj_size}.")
    cell_type, gates = _KINDS[kind]
    hidden = module.hidden_size
    cell_kwargs = {"activation": _NONLINEARITIES[module.nonlinearity]} if kind == "RNN" else {}
    stack = StackedRNN(features=hidden, num_layers=module.num_layers, cell_type=cell_type,
                       bidirectional=module.bidirectional, dropout_rate=float(module.dropout),
                       cell_kwargs=cell_kwargs or None)
    sd = {k: t.detach().cpu().numpy().astype(np.float32) for k, t in module.state_dict().items()}
    params: dict[str, Any] = {}
    for layer in range(module.num_layers):
        cells: dict[str | None, Any] = {}
        for suffix, name in _directions(module.bidirectional).items():
            w_ih, w_hh = (sd[f"weight_{n}_l{layer}{suffix}"] for n in ("ih", "hh"))
            zeros = np.zeros(gates * hidden, np.float32)
            b_ih, b_hh = (sd[f"bias_{n}_l{layer}{suffix}"] if module.bias else zeros
                          for n in ("ih", "hh"))
            bias = b_ih + b_hh
            cell = {"recurrent_kernel": w_hh.T, "input": {"kernel": w_ih.T, "bias": bias}}
            if kind == "GRU":  # b_hn stays inside the reset product
                bias[2 * hidden :] = b_ih[2 * hidden :]
                cell["recurrent_bias_n"] = b_hh[2 * hidden :]
            cells[name] = {"cell": cell}
        params[f"layer_{layer}"] = cells[None] if None in cells else cells
    return stack, {"params": jax.tree_util.tree_map(jnp.asarray, params)}


def seqjax_to_torch_rnn(stack: StackedRNN, variables: dict, input_size: int) -> Any:
    """The reverse: a ``torch.nn.LSTM/GRU/RNN`` (``batch_first=True``) with the same weights.
    GRUs need ``reset_after=True`` (PyTorch's only form); their ``bias_hh`` holds only ``b_hn``,
    the summed input bias going to ``bias_ih``."""
    import torch

    cell_type = stack.cell_type if isinstance(stack.cell_type, str) else stack.cell_type.__name__
    kwargs = dict(stack.cell_kwargs or {})
    key = {"lstm": "LSTM", "lstmcell": "LSTM", "gru": "GRU", "grucell": "GRU",
           "elman": "RNN", "rnn": "RNN", "elmancell": "RNN"}.get(cell_type.lower())
    if key is None:
        raise ValueError(f"`stack.cell_type` must be lstm, gru or elman; got {cell_type!r}.")
    if key == "GRU" and not kwargs.get("reset_after", True):
        raise ValueError("`reset_after` must be True to export a GRU to PyTorch; got False.")
    ctor_kwargs: dict[str, Any] = {}
    if key == "RNN":
        act = kwargs.get("activation", jnp.tanh)
        ctor_kwargs["nonlinearity"] = next(
            (n for n, f in _NONLINEARITIES.items() if f is act), None)
        if ctor_kwargs["nonlinearity"] is None:
            raise ValueError(f"Elman `activation` must be tanh or relu to export; got {act}.")
    module = getattr(torch.nn, key)(
        input_size, stack.features, num_layers=stack.num_layers, bias=True, batch_first=True,
        dropout=stack.dropout_rate, bidirectional=stack.bidirectional, **ctor_kwargs)
    hidden = stack.features
    sd = {}
    for layer in range(stack.num_layers):
        for suffix, name in _directions(stack.bidirectional).items():
            lp = variables["params"][f"layer_{layer}"]
            cell = lp["cell"] if name is None else lp[name]["cell"]
            w_ih = np.asarray(cell["input"]["kernel"], np.float32).T
            w_hh = np.asarray(cell["recurrent_kernel"], np.float32).T
            b_ih = np.asarray(cell["input"]["bias"], np.float32)
            # LSTMCell(recurrent_bias=True) has PyTorch's layout
            b_hh = np.array(cell.get("recurrent_bias", np.zeros_like(b_ih)), np.float32)
            if key == "GRU":
                b_hh[2 * hidden :] = np.asarray(cell["recurrent_bias_n"], np.float32)
            for nm, arr in (("weight_ih", w_ih), ("weight_hh", w_hh), ("bias_ih", b_ih),
                            ("bias_hh", b_hh)):
                sd[f"{nm}_l{layer}{suffix}"] = torch.from_numpy(np.array(arr, np.float32))
    module.load_state_dict(sd)
    return module

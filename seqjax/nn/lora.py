r"""Low-rank adaptation (LoRA) of attention projections, as a transformation of parameter trees.

.. math::
    X W_0 + X A B = X (W_0 + A B), \qquad \widehat W = W_0 + A B

Bishop §12.3.5, Fig. 12.21 and (12.36); Hu et al. 2021. ``W_0`` (``D_in × D_out``, e.g. an
attention projection with its heads flattened) stays frozen; only ``A`` (``D_in × R``) and
``B`` (``R × D_out``) are trained, ``R(D_in + D_out)`` parameters instead of ``D_in D_out``.
``B`` starts at zero, so the adapted model starts as the pre-trained one.

By the identity above the model needs no change: :func:`merge_lora` puts ``W_0 + s·AB`` in
place of each targeted kernel, and training differentiates with respect to the adapter only::

    lora = init_lora(key, params, rank=4)
    loss = lambda lora: loss_fn(model.apply({"params": merge_lora(params, lora)}, x))
    grads = jax.grad(loss)(lora)          # W_0 is a constant

After fine-tuning :func:`merge_lora` gives the deployable weights (no inference overhead);
:func:`unmerge_lora` recovers ``W_0``. The adapter tree mirrors the parameter tree, with
``{"lora_a", "lora_b"}`` at each targeted module (default: every ``query``, ``key``, ``value``
and ``out`` of :class:`~seqjax.nn.attention.MultiHeadAttention`, self- and cross-attention);
kernels stacked over layers (``scan_layers``) get stacked adapters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import check_positive_ints

Array = jax.Array

__all__ = ["LORA_TARGETS", "init_lora", "lora_delta", "merge_lora", "unmerge_lora"]

#: Module name -> (number of input axes, number of output axes) of its kernel:
#: ``query/key/value`` kernels are ``[D, H, d]``, ``out`` kernels ``[H, d, D]``
#: (:class:`~seqjax.nn.attention.MultiHeadAttention`); a plain Dense is ``(1, 1)``.
LORA_TARGETS: dict[str, tuple[int, int]] = {"query": (1, 2), "key": (1, 2), "value": (1, 2),
                                             "out": (2, 1)}


def _walk(params: Any, targets: Mapping[str, tuple[int, int]],
          path_filter: Callable[[tuple[str, ...]], bool] | None, path: tuple[str, ...] = ()
          ) -> list[tuple[tuple[str, ...], tuple[int, int], tuple[int, ...]]]:
    """``(path, axes, kernel shape)`` of every targeted module (with a ``kernel``) below."""
    found = []
    for name, child in params.items():
        if not hasattr(child, "keys"):
            continue
        here = (*path, name)
        if name in targets and "kernel" in child:
            if path_filter is None or path_filter(here):
                found.append((here, targets[name], tuple(np.shape(child["kernel"]))))
        else:
            found.extend(_walk(child, targets, path_filter, here))
    return found


def init_lora(key: Array, params: Any, rank: int, *,
              targets: Mapping[str, tuple[int, int]] | None = None,
              path_filter: Callable[[tuple[str, ...]], bool] | None = None,
              dtype: Any = jnp.float32) -> dict:
    r"""Adapters ``A ~ N(0, 1/D_in)``, ``B = 0`` for every targeted kernel (Bishop Fig. 12.21).

    Args:
        params: the model's ``variables["params"]``.
        rank: ``R`` (a positive int, else ValueError).
        targets: module name -> its kernel's (input, output) axis counts; default
            :data:`LORA_TARGETS`. ValueError if no targeted module with a ``kernel`` is found.
        path_filter: optional predicate on the module's path (a tuple of names), e.g.
            ``lambda p: "self_attn" in p`` to adapt self-attention only.

    Returns:
        ``params``' tree with ``{"lora_a": [..., D_in, R], "lora_b": [..., R, D_out]}`` per target.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from seqjax.nn.attention import MultiHeadAttention
        >>> mha = MultiHeadAttention(num_heads=2)
        >>> params = mha.init(jax.random.PRNGKey(0), jnp.ones((1, 3, 8)))["params"]
        >>> lora = init_lora(jax.random.PRNGKey(1), params, rank=2)
        >>> lora["query"]["lora_a"].shape, lora["out"]["lora_b"].shape
        ((8, 2), (2, 8))
    """
    check_positive_ints(rank=rank)
    targets = LORA_TARGETS if targets is None else dict(targets)
    found = _walk(params, targets, path_filter)
    if not found:
        raise ValueError(f"no module named one of {sorted(targets)} with a `kernel` in `params`.")
    lora: dict = {}
    for k, (path, (n_in, n_out), shape) in zip(jax.random.split(key, len(found)), found):
        n_lead = len(shape) - n_in - n_out  # leading (stacked-layer) axes
        if n_lead < 0:
            raise ValueError(f"kernel at {'/'.join(path)} has shape {shape}; expected at least "
                             f"{n_in} input and {n_out} output axes.")
        lead = shape[:n_lead]
        d_in, d_out = int(np.prod(shape[n_lead:n_lead + n_in])), int(np.prod(shape[n_lead + n_in:]))
        node = lora
        for name in path:
            node = node.setdefault(name, {})
        node["lora_a"] = (jax.random.normal(k, (*lead, d_in, rank), dtype)
                          / np.sqrt(d_in)).astype(dtype)
        node["lora_b"] = jnp.zeros((*lead, rank, d_out), dtype)
    return lora


def lora_delta(adapter: Mapping[str, Array], kernel_shape: tuple[int, ...]) -> Array:
    """``A B`` reshaped to the kernel's shape (``[..., D_in, R] @ [..., R, D_out]``)."""
    return jnp.matmul(adapter["lora_a"], adapter["lora_b"]).reshape(kernel_shape)


def _apply(params: Any, lora: Mapping, sign: float, scale: float) -> Any:
    out = dict(params)
    for name, sub in lora.items():
        if name not in out:
            raise ValueError(f"adapter for {name!r} has no matching entry in `params`.")
        if "lora_a" in sub:
            kernel = out[name]["kernel"]
            delta = lora_delta(sub, tuple(kernel.shape)).astype(jnp.float32)
            merged = kernel.astype(jnp.float32) + sign * scale * delta
            out[name] = {**out[name], "kernel": merged.astype(kernel.dtype)}
        else:
            out[name] = _apply(out[name], sub, sign, scale)
    return out


def merge_lora(params: Any, lora: Mapping, scale: float = 1.0) -> dict:
    r"""``W ← W_0 + scale · A B`` for every adapted kernel (Bishop (12.36)); other leaves shared.

    ``scale`` is Hu et al.'s ``α / R`` (1 in Bishop). Differentiable in ``lora``.
    """
    return _apply(params, lora, 1.0, scale)


def unmerge_lora(params: Any, lora: Mapping, scale: float = 1.0) -> dict:
    r"""``W_0 = W - scale · A B``: undo :func:`merge_lora` (up to rounding)."""
    return _apply(params, lora, -1.0, scale)

r"""Model FLOPs per token, for the trainer's MFU (model FLOPs utilisation).

A decoder-only transformer with ``N`` parameters, ``L`` layers, ``H`` heads of size ``Q``
and context ``T`` costs per token of a training step (forward + backward)

.. math::
    C = 6N + 12\,L\,H\,Q\,T

FLOPs (Chowdhery et al. 2022, *PaLM*, App. B; nanoGPT's ``estimate_mfu``, llm.c): ``6N``
for the weight matmuls (2 forward, 4 backward), ``12 L H Q T`` for ``Q Kᵀ`` and ``A V``. A
causal mask halves the attention term to ``6 L H Q T`` (nanoGPT's and llm.c's convention).
MFU = ``C · tokens/s ÷ (devices · peak)``, peak the device's dense one
(:func:`peak_flops_per_device`).
"""

from __future__ import annotations

import math
from typing import Any

import jax

from seqjax._checks import check_positive_int, renamed_keywords

__all__ = ["lm_flops_per_token", "peak_flops_per_device", "transformer_flops_per_token"]

# Dense bf16 peak FLOP/s per chip, by jax `device_kind` substring (vendor data sheets).
_PEAK_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L4": 121e12,
    "V100": 125e12,
}


def peak_flops_per_device(device: Any = None) -> float | None:
    """Peak dense bf16 FLOP/s of ``device`` (default: the first) from a small table, or None."""
    kind = (device or jax.devices()[0]).device_kind.lower()
    return next((flops for name, flops in _PEAK_FLOPS.items() if name.lower() in kind), None)


@renamed_keywords(seq_len="block_size")
def transformer_flops_per_token(
    num_params: int, num_layers: int, num_heads: int, head_dim: int, block_size: int,
    *, causal: bool = True,
) -> float:
    """Training FLOPs per token, ``6N + 12·L·H·Q·T`` (attention term halved when causal).

    Example:
        >>> transformer_flops_per_token(124_000_000, 12, 12, 64, 1024, causal=False)
        857246208.0
    """
    if isinstance(num_params, bool) or not isinstance(num_params, int) or num_params < 0:
        raise ValueError(f"`num_params` must be a non-negative int; got {num_params!r}.")
    sizes = dict(num_layers=num_layers, num_heads=num_heads, head_dim=head_dim,
                 block_size=block_size)
    attention = 12.0 * math.prod(check_positive_int(v, n) for n, v in sizes.items())
    return 6.0 * num_params + (attention / 2 if causal else attention)


@renamed_keywords(seq_len="block_size")
def lm_flops_per_token(config: Any, params: Any, block_size: int | None = None) -> float:
    """:func:`transformer_flops_per_token` (causal) for a :class:`seqjax.models.gpt.TransformerLM`.

    ``N`` excludes the learned position table (``pos_embed``, a lookup: nanoGPT's
    "non-embedding" count); a tied token embedding counts once, as the output matrix.
    ``Q = embed_dim / num_heads``.

    Args:
        config: the model's :class:`~seqjax.models.gpt.TransformerLMConfig`.
        params: its parameters (with or without the ``{"params": ...}`` wrapper).
        block_size: the training context ``T`` if shorter than ``config.block_size``.
    """
    tree = params.get("params", params) if hasattr(params, "get") else params
    counted = {k: v for k, v in tree.items() if k != "pos_embed"}
    n = sum(int(x.size) for x in jax.tree_util.tree_leaves(counted))
    heads = config.block.num_heads
    if config.embed_dim % heads:
        raise ValueError(f"`embed_dim` ({config.embed_dim}) must be divisible by "
                         f"`block.num_heads` ({heads}).")
    return transformer_flops_per_token(
        n, config.num_layers, heads, config.embed_dim // heads,
        config.block_size if block_size is None else block_size, causal=True)

"""Argument checks of the transformer blocks and stacks, and the decoder-layer cache (private).

:class:`DecoderLayerCache` is re-exported by :mod:`seqjax.nn.transformer`. A block or stack checks
its call once here (shapes, dtypes, masks, caches); its blocks and their attention layers then run
on the checked inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from seqjax._checks import (
    ValidLengths,
    bound_param_shape,
    check_bool,
    check_features,
    check_lengths,
    check_rank,
)
from seqjax._traced_checks import poison_bad_lengths
from seqjax.nn.attention import KVCache
from seqjax.nn.attention.checks import check_broadcast

Array = jax.Array


@struct.dataclass
class BlockInputs:
    """What a transformer block reads besides ``x`` and its cache, as one pytree value.

    A block's or stack's public call (``__call__``, ``decode``) gathers its keywords (the fields,
    documented in :class:`~seqjax.nn.transformer.TransformerBlock`; absent ones ``None``,
    ``deterministic`` static) into one ``BlockInputs``, checks it once (:func:`check_call`: lengths
    become :class:`~seqjax._checks.ValidLengths`, key masks rank 4) and hands it whole to every
    block, through ``nn.scan`` and ``nn.remat`` alike.
    """

    mask: Any = None
    lengths: Any = None
    encoder_out: Any = None
    encoder_mask: Any = None
    encoder_lengths: Any = None
    positions: Any = None
    bias: Any = None
    deterministic: bool = struct.field(pytree_node=False, default=True)


class DecoderLayerCache(NamedTuple):
    """Decoding state of a cross-attention block: the self-attention cache and the encoder output's
    projected ``(k [B, S, G, d], v [B, S, G, Dv])``, ``None`` until the first call computes them
    (then reused: the encoder output is fixed while the decoder runs, MEDL (7.33))."""

    self_attn: Any
    cross_kv: Any = None


def check_cache_given(cache: Any, owner: str) -> None:
    """``decode`` needs the cache of ``init_cache``."""
    if cache is None:
        raise ValueError(
            f"{owner}.decode needs a `cache`: "
            f"{owner.lower()}.apply(params, batch, max_len, method='init_cache')."
        )


def _in_features(module: Any, *paths: tuple[str, ...]) -> int | None:
    """Input size of the first bound parameter of ``paths`` in a block, or in a stack's first
    layer (a scan's layer axis skipped); ``None`` when unbound or initialising."""
    stacked = hasattr(module, "num_layers")
    scanned = stacked and module.scan_layers
    layer = ("layers" if scanned else "layers_0",) if stacked else ()
    for path in paths:
        shape = bound_param_shape(module, *layer, *path)
        if shape is not None:
            return shape[int(scanned)]
    return None


def _layer_caches(module: Any, cache: Any) -> list[Any]:
    """The per-layer caches of a block's or a stack's ``cache`` (itself for a block or a
    scanned stack, whose leaves must have a leading ``[num_layers]`` axis)."""
    if cache is None:
        return []
    if not hasattr(module, "num_layers"):
        return [cache]
    if not module.scan_layers:
        if not isinstance(cache, Sequence) or len(cache) != module.num_layers:
            raise ValueError(
                f"`cache` must be a list of {module.num_layers} per-layer caches "
                f"(from init_cache); got {type(cache).__name__}."
            )
        return list(cache)
    for leaf in jax.tree_util.tree_leaves(cache):
        if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != module.num_layers:
            raise ValueError(
                f"`cache` of a scanned stack must have a leading [num_layers] = "
                f"[{module.num_layers}] axis on every leaf (from init_cache); got a leaf "
                f"of shape {jnp.shape(leaf)}."
            )
    return [cache]


def check_call(module: Any, x: Any, cache: Any, inputs: BlockInputs) -> BlockInputs:
    """Every check of a block's or a stack's call; returns ``inputs`` with lengths as
    :class:`~seqjax._checks.ValidLengths` (layers below check shapes only, no value is read again)
    and ``encoder_mask`` as ``bool[B|1, H|1, T|1, S]``. The self-attention checks its ``mask``."""
    cfg = module.config
    check_rank(x, "x", 3)
    batch, length = x.shape[:2]
    width = _in_features(module, ("self_attn", "query", "kernel"), ("self_attn_norm", "scale"))
    check_features(x, "x", width)
    lengths, encoder_out = inputs.lengths, inputs.encoder_out
    encoder_mask, encoder_lengths = inputs.encoder_mask, inputs.encoder_lengths
    if lengths is not None:
        lengths = check_lengths(lengths, "lengths", batch, length)
    layer_caches = _layer_caches(module, cache)
    for layer in layer_caches:
        if cfg.cross_attention and not isinstance(layer, DecoderLayerCache):
            raise TypeError(
                "`cache` of a cross-attention block must be the DecoderLayerCache of "
                f"init_cache; got {type(layer).__name__}."
            )
        if isinstance(layer, DecoderLayerCache) and not cfg.cross_attention:
            raise ValueError("a DecoderLayerCache needs `config.cross_attention=True`.")
        is_kv = lambda c: isinstance(c, KVCache)
        kvs = [c.k.shape for c in jax.tree_util.tree_leaves(layer, is_leaf=is_kv) if is_kv(c)]
        if kvs and cfg.attention is None and kvs[0][-4] != batch:
            raise ValueError(
                f"`cache` must hold batch size {batch} like `x`; got a cache of shape "
                f"{tuple(kvs[0])} (from init_cache(batch={kvs[0][-4]}, ...))."
            )
    if cfg.cross_attention and encoder_out is None:
        raise ValueError("`encoder_out` is required when `config.cross_attention=True`.")
    if not cfg.cross_attention and encoder_out is not None:
        raise ValueError(
            "`encoder_out` was given but the block has `config.cross_attention=False`."
        )
    if encoder_mask is not None:  # bool[B, S] key validity -> bool[B, 1, 1, S]
        encoder_mask = jnp.asarray(encoder_mask)
        check_rank(encoder_mask, "encoder_mask", (2, 4))
        if encoder_mask.ndim == 2:
            encoder_mask = encoder_mask[:, None, None, :]
    if cfg.cross_attention:
        check_rank(encoder_out, "encoder_out", 3)
        if encoder_out.shape[0] != batch:
            raise ValueError(
                f"`encoder_out` must have batch size {batch} like `x`; got shape "
                f"{tuple(encoder_out.shape)}."
            )
        if not any(c.cross_kv is not None for c in layer_caches):
            check_features(encoder_out, "encoder_out",
                           _in_features(module, ("cross_attn", "key", "kernel")))
        if encoder_lengths is not None:
            encoder_lengths = check_lengths(
                encoder_lengths, "encoder_lengths", batch, encoder_out.shape[1]
            )
        if encoder_mask is not None:
            check_bool(encoder_mask, "encoder_mask")
            check_broadcast(
                encoder_mask, "encoder_mask", (batch, cfg.num_heads, length, encoder_out.shape[1])
            )
    return dataclasses.replace(
        inputs, lengths=lengths, encoder_mask=encoder_mask, encoder_lengths=encoder_lengths
    )


def run_checked(module: Any, x: Any, inputs: BlockInputs, cache: Any) -> tuple[Array, Any]:
    """A block's or a stack's public call: check ``inputs`` once (:func:`check_call`), run
    ``module._forward`` on the checked value, then NaN in the rows whose traced ``lengths`` lie
    outside ``[0, T]`` or ``encoder_lengths`` outside ``[0, S]`` (:mod:`seqjax._traced_checks`),
    for the lengths no layer above has checked (a :class:`~seqjax._checks.ValidLengths` was read,
    and its rows poisoned, by its maker)."""
    y, new_cache = module._forward(x, check_call(module, x, cache, inputs), cache)
    if not isinstance(inputs.lengths, ValidLengths):
        y = poison_bad_lengths(y, inputs.lengths, 0, x.shape[1])
    if inputs.encoder_out is not None and not isinstance(inputs.encoder_lengths, ValidLengths):
        y = poison_bad_lengths(y, inputs.encoder_lengths, 0, inputs.encoder_out.shape[1])
    return y, new_cache

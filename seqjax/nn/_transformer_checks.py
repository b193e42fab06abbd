"""Argument checks of the transformer blocks and stacks, and the decoder-layer cache (private).

:class:`DecoderLayerCache` is re-exported by :mod:`seqjax.nn.transformer`. A stack checks its call
once here (shapes, dtypes, masks, caches); its blocks and their attention layers then run on the
checked inputs.
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
    ``deterministic`` static) into one ``BlockInputs``, checks it once (:func:`check_block_call`,
    :func:`check_stack_call`: lengths become :class:`~seqjax._checks.ValidLengths`, key masks rank
    4) and hands it whole to every block, through ``nn.scan`` and ``nn.remat`` alike.
    """

    mask: Any = None
    lengths: Any = None
    encoder_out: Any = None
    encoder_mask: Any = None
    encoder_lengths: Any = None
    positions: Any = None
    bias: Any = None
    deterministic: bool = struct.field(pytree_node=False, default=True)


def poison_unread_lengths(x_BxTxD: Array, inputs: BlockInputs) -> Array:
    """``x`` with NaN in the rows whose traced ``lengths`` lie outside ``[0, T]`` or
    ``encoder_lengths`` outside ``[0, S]`` (:mod:`seqjax._traced_checks`), for the lengths of
    ``inputs`` no layer above has checked (a :class:`~seqjax._checks.ValidLengths` was read, and its
    rows poisoned, by its maker)."""
    if not isinstance(inputs.lengths, ValidLengths):
        x_BxTxD = poison_bad_lengths(x_BxTxD, inputs.lengths, 0, x_BxTxD.shape[1])
    if inputs.encoder_out is not None and not isinstance(inputs.encoder_lengths, ValidLengths):
        x_BxTxD = poison_bad_lengths(
            x_BxTxD, inputs.encoder_lengths, 0, inputs.encoder_out.shape[1]
        )
    return x_BxTxD


class DecoderLayerCache(NamedTuple):
    """Decoding state of a cross-attention block: the self-attention cache and the encoder output's
    projected ``(k [B, S, G, d], v [B, S, G, Dv])``, ``None`` until the first call computes them
    (then reused: the encoder output is fixed while the decoder runs, MEDL (7.33))."""

    self_attn: Any
    cross_kv: Any = None


def key_mask(mask: Any, name: str) -> Array | None:
    """``bool[B, K]`` key validity -> ``bool[B, 1, 1, K]``; rank-4 masks pass through."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    check_rank(mask, name, (2, 4))
    return mask[:, None, None, :] if mask.ndim == 2 else mask


def check_encoder_given(cross_attention: bool, encoder_out: Any) -> None:
    """``encoder_out`` is given exactly when the block has cross-attention."""
    if cross_attention and encoder_out is None:
        raise ValueError("`encoder_out` is required when `config.cross_attention=True`.")
    if not cross_attention and encoder_out is not None:
        raise ValueError(
            "`encoder_out` was given but the block has `config.cross_attention=False`."
        )


def check_encoder_batch(encoder_out: Any, batch: int) -> None:
    if encoder_out.shape[0] != batch:
        raise ValueError(
            f"`encoder_out` must have batch size {batch} like `x`; got shape "
            f"{tuple(encoder_out.shape)}."
        )


def check_layer_cache(cache: Any, cross_attention: bool) -> None:
    """A cross-attention block's cache must be a :class:`DecoderLayerCache`, and only its."""
    if cache is not None and cross_attention and not isinstance(cache, DecoderLayerCache):
        raise TypeError(
            "`cache` of a cross-attention block must be the DecoderLayerCache of "
            f"init_cache; got {type(cache).__name__}."
        )
    if isinstance(cache, DecoderLayerCache) and not cross_attention:
        raise ValueError("a DecoderLayerCache needs `config.cross_attention=True`.")


def check_block_call(block: Any, x: Any, cache: Any, inputs: BlockInputs) -> BlockInputs:
    """Every check of a lone block's call; returns ``inputs`` with lengths as
    :class:`~seqjax._checks.ValidLengths` and ``encoder_mask`` rank 4 (attention layers check their
    own masks)."""
    cross = block.config.cross_attention
    check_rank(x, "x", 3)
    batch, length = x.shape[:2]
    width = bound_param_shape(block, "self_attn", "query", "kernel") or bound_param_shape(
        block, "self_attn_norm", "scale"
    )
    check_features(x, "x", None if width is None else width[0])
    encoder_out, lengths, encoder_lengths = (
        inputs.encoder_out, inputs.lengths, inputs.encoder_lengths
    )
    check_encoder_given(cross, encoder_out)
    check_layer_cache(cache, cross)
    if lengths is not None:
        lengths = check_lengths(lengths, "lengths", batch, length)
    if encoder_out is not None:  # given exactly when config.cross_attention
        check_rank(encoder_out, "encoder_out", 3)
        check_encoder_batch(encoder_out, batch)
        if cache is None or cache.cross_kv is None:
            w_k = bound_param_shape(block, "cross_attn", "key", "kernel")
            check_features(encoder_out, "encoder_out", None if w_k is None else w_k[0])
        if encoder_lengths is not None:
            encoder_lengths = check_lengths(
                encoder_lengths, "encoder_lengths", batch, encoder_out.shape[1]
            )
    return dataclasses.replace(
        inputs,
        lengths=lengths,
        encoder_lengths=encoder_lengths,
        encoder_mask=key_mask(inputs.encoder_mask, "encoder_mask"),
    )


def check_cache_given(cache: Any, owner: str) -> None:
    """``decode`` needs the cache of ``init_cache``."""
    if cache is None:
        raise ValueError(
            f"{owner}.decode needs a `cache`: "
            f"{owner.lower()}.apply(params, batch, max_len, method='init_cache')."
        )


def first_kv_cache(cache: Any) -> KVCache | None:
    leaves = jax.tree_util.tree_leaves(cache, is_leaf=lambda c: isinstance(c, KVCache))
    return next((c for c in leaves if isinstance(c, KVCache)), None)


def cache_len(cache: Any) -> int | None:
    """Key slots (``max_len``) of a stack's default-attention cache; ``None`` if none."""
    kv = first_kv_cache(cache)
    return None if kv is None else kv.k.shape[-3]


def check_stack_cache(stack: Any, cache: Any, batch: int) -> list[Any]:
    """The checked per-layer caches of a stack's ``cache`` (one for a scanned stack); returns those
    that are :class:`DecoderLayerCache` s."""
    if cache is None:
        return []
    cfg = stack.config
    if stack.scan_layers:
        for leaf in jax.tree_util.tree_leaves(cache):
            if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != stack.num_layers:
                raise ValueError(
                    f"`cache` of a scanned stack must have a leading [num_layers] = "
                    f"[{stack.num_layers}] axis on every leaf (from init_cache); got a leaf "
                    f"of shape {jnp.shape(leaf)}."
                )
        layers = [cache]
    else:
        if not isinstance(cache, Sequence) or len(cache) != stack.num_layers:
            raise ValueError(
                f"`cache` must be a list of {stack.num_layers} per-layer caches "
                f"(from init_cache); got {type(cache).__name__}."
            )
        layers = list(cache)
    for layer in layers:
        check_layer_cache(layer, cfg.cross_attention)
        kv = first_kv_cache(layer)
        if kv is not None and cfg.attention is None and kv.k.shape[-4] != batch:
            raise ValueError(
                f"`cache` must hold batch size {batch} like `x`; got a cache of shape "
                f"{tuple(kv.k.shape)} (from init_cache(batch={kv.k.shape[-4]}, ...))."
            )
    return [c for c in layers if isinstance(c, DecoderLayerCache)]


def check_stack_call(stack: Any, x: Any, cache: Any, inputs: BlockInputs) -> BlockInputs:
    """Every check of a stack's call; returns ``inputs`` with lengths as
    :class:`~seqjax._checks.ValidLengths` (layers below check shapes only, no value is read again)
    and ``encoder_mask`` rank 4."""
    cfg = stack.config
    mask, lengths, encoder_out = inputs.mask, inputs.lengths, inputs.encoder_out
    encoder_mask, encoder_lengths = inputs.encoder_mask, inputs.encoder_lengths
    check_rank(x, "x", 3)
    batch, length = x.shape[:2]
    width = stack._layer_param_shape("self_attn", "query", "kernel") or stack._layer_param_shape(
        "self_attn_norm", "scale"
    )
    check_features(x, "x", None if width is None else width[0])
    if lengths is not None:
        lengths = check_lengths(lengths, "lengths", batch, length)
    layer_caches = check_stack_cache(stack, cache, batch)
    check_encoder_given(cfg.cross_attention, encoder_out)
    if mask is not None and cfg.attention is None:
        mask = jnp.asarray(mask)
        check_bool(mask, "mask")
        keys = length if cache is None else cache_len(cache)
        check_broadcast(mask, "mask", (batch, cfg.num_heads, length, keys))
    if cfg.cross_attention:
        check_rank(encoder_out, "encoder_out", 3)
        check_encoder_batch(encoder_out, batch)
        if not any(c.cross_kv is not None for c in layer_caches):
            w_k = stack._layer_param_shape("cross_attn", "key", "kernel")
            check_features(encoder_out, "encoder_out", None if w_k is None else w_k[0])
        if encoder_lengths is not None:
            encoder_lengths = check_lengths(
                encoder_lengths, "encoder_lengths", batch, encoder_out.shape[1]
            )
        encoder_mask = key_mask(encoder_mask, "encoder_mask")
        if encoder_mask is not None:
            check_bool(encoder_mask, "encoder_mask")
            check_broadcast(
                encoder_mask, "encoder_mask", (batch, cfg.num_heads, length, encoder_out.shape[1])
            )
    return dataclasses.replace(
        inputs,
        mask=mask, lengths=lengths, encoder_mask=encoder_mask, encoder_lengths=encoder_lengths
    )

"""Pure functions shared by the models (which own their parameters): token checks, masked
pooling, decoding-state helpers."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import (
    ValidLengths,
    check_integer,
    check_lengths,
    check_rank,
    check_vocab_ids,
    lengths_array,
)
from seqjax.nn.masks import padding_mask

Array = jax.Array

__all__ = [
    "POOLINGS",
    "as_variables",
    "check_preset",
    "check_lengths",
    "check_nonempty",
    "check_prompt",
    "check_same_batch",
    "check_step_tokens",
    "check_tokens",
    "flag_oov_rows",
    "split_oov",
    "gather_time",
    "layers_from_batch_major",
    "layers_to_batch_major",
    "masked_pool",
]

POOLINGS = ("last", "mean", "max", "first")


def as_variables(params: Any) -> dict:
    """Accept either a full variables dict ``{"params": ...}`` or the bare params tree."""
    if isinstance(params, dict) and "params" in params:
        return params
    if hasattr(params, "keys") and "params" in params.keys():
        return dict(params)
    return {"params": params}


def check_tokens(tokens: Any, name: str, vocab_size: int | None, rank: int = 2) -> Array:
    """Integer ids of rank ``rank`` in ``[0, vocab_size)`` (:func:`~seqjax._checks.check_vocab_ids`
    when concrete; :func:`split_oov` is the traced form); ``vocab_size=None``: rank and dtype only.
    """
    check_rank(tokens, name, rank)
    check_integer(tokens, name)
    if vocab_size is not None:
        check_vocab_ids(tokens, name, vocab_size)
    return jnp.asarray(tokens).astype(jnp.int32)


def check_prompt(
    prompt_BxT: Any, prompt_lengths_B: Any, vocab_size: int | None
) -> tuple[Array, Array]:
    """The decoding-prompt check (:mod:`seqjax.decoding`, every ``init_decode_state``):
    ``(prompt int32[B, T], prompt_lengths int32[B])``, ids in ``[0, vocab_size)``, ``T >= 1``
    (the first decode step feeds the last token), lengths (default ``T``) in ``[1, T]``.
    """
    prompt_BxT = check_tokens(prompt_BxT, "prompt", vocab_size)
    check_nonempty(prompt_BxT, "prompt", "its last token is fed by the first decode step")
    batch, num_steps = prompt_BxT.shape
    if prompt_lengths_B is None:
        prompt_lengths_B = jnp.full((batch,), num_steps, jnp.int32)
    prompt_lengths_B = check_lengths(prompt_lengths_B, "prompt_lengths", batch, num_steps, 1)
    return prompt_BxT, prompt_lengths_B.value


def check_nonempty(tokens_BxT: Any, name: str, why: str) -> None:
    """``ValueError`` unless ``tokens_BxT`` has at least one position (``T >= 1``)."""
    if np.shape(tokens_BxT)[1] < 1:
        raise ValueError(
            f"`{name}` must hold at least one token per row ({why}); got shape "
            f"{tuple(np.shape(tokens_BxT))}."
        )


def check_same_batch(x: Any, name: str, ref: Any, ref_name: str) -> None:
    """``ValueError`` unless ``x`` and ``ref`` have the same leading (batch) size."""
    if np.shape(x)[0] != np.shape(ref)[0]:
        raise ValueError(
            f"`{name}` must have the batch size of `{ref_name}` ({np.shape(ref)[0]}); got shape "
            f"{tuple(np.shape(x))}."
        )


def check_step_tokens(tokens_B: Any, vocab_size: int, state: Any) -> Array:
    """A ``decode_step``'s ``tokens_B``: ``int[B]``, ``B`` the state's batch, ids in
    ``[0, vocab_size)`` when concrete. Traced, the step uses :func:`split_oov` /
    :func:`flag_oov_rows`: an out-of-vocabulary row gets NaN logits and keeps its state.
    """
    check_rank(tokens_B, "tokens", 1)
    check_integer(tokens_B, "tokens")
    leaves = jax.tree_util.tree_leaves(state)
    if leaves and np.ndim(leaves[0]) and np.shape(leaves[0])[0] != np.shape(tokens_B)[0]:
        raise ValueError(
            f"`tokens` must have shape (batch,) = ({np.shape(leaves[0])[0]},) like the decoding "
            f"state; got {tuple(np.shape(tokens_B))}."
        )
    check_vocab_ids(tokens_B, "tokens", vocab_size)
    return jnp.asarray(tokens_B).astype(jnp.int32)


def split_oov(tokens_B: Array, vocab_size: int) -> tuple[Array, Array]:
    """``(safe_tokens_B, valid_B)``: ids outside ``[0, vocab_size)`` set to 0, ``valid_B`` False
    there."""
    valid_B = (tokens_B >= 0) & (tokens_B < vocab_size)
    return jnp.where(valid_B, tokens_B, 0), valid_B


def flag_oov_rows(logits_BxV: Array, valid_B: Array) -> Array:
    """NaN logits for out-of-vocabulary rows (a traced ``decode_step``'s error signal)."""
    return jnp.where(valid_B[:, None], logits_BxV, jnp.nan)


def gather_time(x_BxTxD: Array, index_B: Array) -> Array:
    """``x[b, index[b]]`` for every row: ``[B, T, D] -> [B, D]`` (index clipped to ``[0, T)``)."""
    index_B = jnp.clip(index_B, 0, x_BxTxD.shape[1] - 1)
    return jnp.take_along_axis(x_BxTxD, index_B[:, None, None], axis=1)[:, 0]


def masked_pool(
    h_BxTxD: Array,
    lengths_B: Array | ValidLengths | None,
    mode: str,
    *,
    bidirectional: bool = False,
) -> Array:
    r"""Pool ``h_BxTxD`` to ``[B, D]`` over each row's ``lengths_B`` (``None``: all ``T``).

    * ``"last"``: :math:`h_n` (J&M §9.4.2); with ``bidirectional=True`` the second half of
      the features is the backward RNN, so :math:`[h^f_n; h^b_1]` (J&M Fig. 9.12).
    * ``"first"``: :math:`h_1` (``<cls>``-style); ``"max"``: element-wise :math:`\max_{t\le n} h_t`.
    * ``"mean"``: :math:`\frac1n\sum_{t\le n} h_t` (J&M (9.17)).

    Padding never contributes (a padded batch pools like each row alone); a length-0 row
    pools to zeros. A :class:`~seqjax._checks.ValidLengths` is not checked again.
    """
    if mode not in POOLINGS:
        raise ValueError(f"`pooling` must be one of {POOLINGS}; got {mode!r}.")
    batch, num_steps, feat = h_BxTxD.shape
    n_B: Array
    if lengths_B is None:  # every row full: nothing to check or mask
        n_B = jnp.full((batch,), num_steps, jnp.int32)
        valid_BxT = jnp.ones((batch, num_steps), bool)
    else:
        valid_BxT = padding_mask(lengths_B, num_steps)
        n_B = lengths_array(lengths_B)
    nonempty_Bx1 = (n_B > 0)[:, None]
    if mode == "last":
        last = gather_time(h_BxTxD, n_B - 1)
        if bidirectional:
            half = feat // 2
            first = h_BxTxD[:, 0]
            last = jnp.concatenate([last[:, :half], first[:, half:]], axis=-1)
        return jnp.where(nonempty_Bx1, last, 0).astype(h_BxTxD.dtype)
    if mode == "first":
        return jnp.where(nonempty_Bx1, h_BxTxD[:, 0], 0).astype(h_BxTxD.dtype)
    if mode == "mean":
        summed = jnp.sum(jnp.where(valid_BxT[..., None], h_BxTxD, 0).astype(jnp.float32), axis=1)
        denom = jnp.maximum(n_B, 1).astype(jnp.float32)[:, None]
        return (summed / denom).astype(h_BxTxD.dtype)
    neg = jnp.finfo(h_BxTxD.dtype).min
    pooled = jnp.max(jnp.where(valid_BxT[..., None], h_BxTxD, neg), axis=1)
    return jnp.where(nonempty_Bx1, pooled, 0).astype(h_BxTxD.dtype)


def layers_to_batch_major(cache: Any, scan_layers: bool) -> Any:
    """A stacked (``scan_layers``) cache ``[L, B, ...]`` -> ``[B, L, ...]``: the decoding loop
    reorders/tiles along the leading axis (a per-layer list already has the batch there)."""
    if not scan_layers:
        return cache
    return jax.tree_util.tree_map(lambda a: jnp.moveaxis(a, 0, 1), cache)


def layers_from_batch_major(cache: Any, scan_layers: bool) -> Any:
    """Inverse of :func:`layers_to_batch_major`."""
    if not scan_layers:
        return cache
    return jax.tree_util.tree_map(lambda a: jnp.moveaxis(a, 1, 0), cache)


def check_preset(name: str, presets: dict) -> Any:
    """Look up a preset by name with a helpful error."""
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(presets)}.")
    return presets[name]

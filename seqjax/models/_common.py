"""Shared by the models (which own their parameters): token checks, masked pooling, the
decoding interface (:class:`DecodingModel`) and its state helpers."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax._checks import (
    ValidLengths,
    check_integer,
    check_lengths,
    check_rank,
    check_vocab_ids,
    lengths_array,
)
from seqjax.nn._block_config import model_block
from seqjax.nn.masks import padding_mask

Array = jax.Array

__all__ = [
    "ConfiguredModel", "DecodingModel", "POOLINGS", "as_variables", "block_stack", "cached_step",
    "check_block_size", "check_decode_len", "check_filled", "check_lengths", "check_nonempty",
    "check_preset", "check_prompt", "check_same_batch", "check_step_tokens", "check_tokens",
    "flag_oov_rows", "gather_time", "masked_pool", "preset_constructor", "split_oov",
    "swap_layers_batch",
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


def check_prompt(prompt_BxT: Any, prompt_lengths_B: Any,
                 vocab_size: int | None) -> tuple[Array, Array]:
    """The decoding-prompt check (:mod:`seqjax.decoding`, every ``init_decode_state``):
    ``(prompt int32[B, T], prompt_lengths int32[B])`` (:func:`check_filled`; the first decode
    step feeds the last token)."""
    why = "its last token is fed by the first decode step"
    prompt_BxT, checked = check_filled(prompt_BxT, prompt_lengths_B, vocab_size, "prompt", why)
    return prompt_BxT, checked.value


def check_filled(tokens_BxT: Any, lengths_B: Any, vocab_size: int | None, name: str,
                 why: str) -> tuple[Array, ValidLengths]:
    """``(tokens int32[B, T], checked lengths)``: ids in ``[0, vocab_size)``, ``T >= 1``
    (:func:`check_nonempty`, ``why``), ``{name}_lengths`` (default ``T``) in ``[1, T]``."""
    tokens_BxT = check_tokens(tokens_BxT, name, vocab_size)
    check_nonempty(tokens_BxT, name, why)
    batch, num_steps = tokens_BxT.shape
    if lengths_B is None:
        lengths_B = jnp.full((batch,), num_steps, jnp.int32)
    return tokens_BxT, check_lengths(lengths_B, f"{name}_lengths", batch, num_steps, 1)


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


def masked_pool(h_BxTxD: Array, lengths_B: Array | ValidLengths | None, mode: str, *,
                bidirectional: bool = False) -> Array:
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
    if mode == "mean":
        summed = jnp.sum(jnp.where(valid_BxT[..., None], h_BxTxD, 0).astype(jnp.float32), axis=1)
        denom = jnp.maximum(n_B, 1).astype(jnp.float32)[:, None]
        return (summed / denom).astype(h_BxTxD.dtype)
    if mode == "first":
        pooled = h_BxTxD[:, 0]
    elif mode == "max":
        neg = jnp.finfo(h_BxTxD.dtype).min
        pooled = jnp.max(jnp.where(valid_BxT[..., None], h_BxTxD, neg), axis=1)
    else:
        pooled = gather_time(h_BxTxD, n_B - 1)
        if bidirectional:
            half = feat // 2
            pooled = jnp.concatenate([pooled[:, :half], h_BxTxD[:, 0, half:]], axis=-1)
    return jnp.where((n_B > 0)[:, None], pooled, 0).astype(h_BxTxD.dtype)


def swap_layers_batch(cache: Any, scan_layers: bool) -> Any:
    """A stacked (``scan_layers``) cache ``[L, B, ...]`` <-> ``[B, L, ...]`` (its own inverse):
    the decoding loop reorders/tiles along the leading axis (a per-layer list already has the
    batch there)."""
    if not scan_layers:
        return cache
    return jax.tree_util.tree_map(lambda a: jnp.swapaxes(a, 0, 1), cache)


def check_preset(name: str, presets: dict) -> Any:
    """Look up a preset by name with a helpful error."""
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(presets)}.")
    return presets[name]


def preset_constructor(presets: dict[str, Any]) -> Any:
    """A model's ``from_preset(name, **overrides)`` classmethod: the model of
    ``presets[name]`` (:func:`check_preset`) with config fields overridden."""

    def from_preset(cls: Any, name: str, **overrides: Any) -> Any:
        return cls(check_preset(name, presets).replace(**overrides))

    from_preset.__doc__ = f"A model from a preset ({', '.join(presets)}), fields overridden."
    return classmethod(from_preset)


class ConfiguredModel(nn.Module):
    """Base of a model whose ``config`` must be an instance of its class attribute
    ``config_type``, when set (a ``TypeError`` naming both when built)."""

    def __post_init__(self) -> None:
        want = getattr(type(self), "config_type", None)
        if want is not None and not isinstance(self.config, want):
            article = "an" if want.__name__[0] in "AEIOU" else "a"
            raise TypeError(
                f"`config` of {type(self).__name__} must be {article} {want.__name__}; got "
                f"{type(self.config).__name__}."
            )
        super().__post_init__()


def block_stack(model: Any, cls: type, block: Any, num_layers: int, **kw: Any) -> Any:
    """``cls`` (:class:`~seqjax.nn.TransformerEncoder` or ``TransformerDecoder``) of
    ``num_layers`` blocks ``block`` in ``model``'s dtypes (``model_block``, errors naming its
    config class), with the config's ``scan_layers`` and ``remat``; ``kw``: e.g. ``name``."""
    cfg = model.config
    block = model_block(block, model.dtype, model.param_dtype, owner=type(cfg).__name__)
    return cls(config=block, num_layers=num_layers, scan_layers=cfg.scan_layers, remat=cfg.remat,
               **kw)


def check_block_size(num_steps: int, name: str, config: Any) -> None:
    """``ValueError`` if ``num_steps`` positions overflow a learned position table
    (``config.block_size``; a config with ``positions`` other than ``"learned"`` has none)."""
    if getattr(config, "positions", "learned") == "learned" and num_steps > config.block_size:
        raise ValueError(f"`{name}` has {num_steps} positions but block_size={config.block_size}.")


def check_decode_len(max_len: int | None, num_steps: int, config: Any) -> int:
    """A KV cache's capacity ``max_len`` (default: the prompt length ``T``), ``>= T`` and, with
    learned positions, at most ``block_size + 1`` (the last fed token's position is
    ``max_len - 2``)."""
    max_len = num_steps if max_len is None else int(max_len)
    if max_len < num_steps:
        raise ValueError(f"`max_len` must be >= the prompt length {num_steps}; got {max_len}.")
    if config.positions == "learned" and max_len - 1 > config.block_size:
        raise ValueError(
            f"prompt + generated tokens need {max_len - 1} positions but the learned table "
            f"has block_size={config.block_size}."
        )
    return max_len


def cached_step(model: Any, state: dict, tokens_B: Array, embed: Any, **cross: Any
                ) -> tuple[Array, dict]:
    """One KV-cache decoding step of a transformer (``model.decoder``, ``model._head``) on
    ``embed(tokens_Bx1, positions_Bx1)``; ``cross``: the decoder's encoder inputs. An
    out-of-vocabulary id (seen only here under jit) embeds as id 0 with length 0: its row's
    cache does not advance (the slot is overwritten next) and its logits are NaN."""
    tokens_B, valid_B = split_oov(tokens_B, model.vocab_size)
    x_Bx1xD = embed(tokens_B[:, None], state["positions"][:, None])
    cache = swap_layers_batch(state["cache"], model.config.scan_layers)
    valid = check_lengths(valid_B.astype(jnp.int32), "lengths", tokens_B.shape[0], 1)
    h_Bx1xD, cache = model.decoder.decode(x_Bx1xD, cache, lengths=valid, **cross)
    logits_BxV = flag_oov_rows(model._head(h_Bx1xD)[:, 0].astype(jnp.float32), valid_B)
    cache = swap_layers_batch(cache, model.config.scan_layers)
    return logits_BxV, {**state, "cache": cache, "positions": state["positions"] + valid_B}


class DecodingModel(ConfiguredModel):
    """Base of the models :mod:`seqjax.decoding` runs: a subclass defines ``_prefill(prompt_BxT,
    lengths_B, *inputs) -> state`` and ``_step(state, tokens_B) -> (logits_BxV, state)`` (run
    under ``apply``), and its ``init_decode_state`` calls :meth:`_init_state`."""

    @property
    def vocab_size(self) -> int:
        """``|V|``, what the model emits (what :mod:`seqjax.decoding` reads)."""
        return self.config.vocab_size

    def _init_state(self, params: Any, prompt_BxT: Any, prompt_lengths_B: Any, *inputs: Any,
                    src: Any = None) -> Any:
        """:func:`check_prompt` (and ``src``'s batch), then ``_prefill(prompt, lengths - 1,
        *inputs)``: the first step feeds ``prompt[b, len_b - 1]``."""
        prompt_BxT, prompt_lengths_B = check_prompt(prompt_BxT, prompt_lengths_B, self.vocab_size)
        if src is not None:
            check_same_batch(src, "src", prompt_BxT, "prompt")
        return self.apply(as_variables(params), prompt_BxT, prompt_lengths_B - 1, *inputs,
                          method=type(self)._prefill)  # type: ignore[attr-defined]

    def decode_step(self, params: Any, state: Any, tokens_B: Array) -> tuple[Array, Any]:
        """Feed one token per row: ``(logits_BxV, new_state)``. An id outside the vocabulary is
        a ``ValueError``; under ``jit`` its row's logits are NaN and its state is kept (a
        recurrent carry kept, a KV cache not advanced)."""
        tokens_B = check_step_tokens(tokens_B, self.vocab_size, state)
        return self.apply(as_variables(params), state, tokens_B, method=type(self)._step)  # type: ignore[attr-defined]

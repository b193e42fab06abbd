r"""Truncated backpropagation through time for recurrent language models (J&M §9.2.2; MEDL §7.2).

A token stream is cut into ``B`` contiguous rows and each row into chunks of ``k`` steps
(:class:`seqjax.data.TBPTTIterator`, or :class:`seqjax.data.device.DeviceStreamChunks`; row
``b`` continues where it stopped). Chunk ``i`` starts from the previous chunk's final carry
under ``stop_gradient``:

.. math::  h^{\langle ik\rangle} = \mathrm{sg}\big(h^{\langle ik\rangle}_{\text{chunk } i-1}\big),
           \qquad g_i = \nabla_θ \frac1{Bk}\sum_{t=ik+1}^{(i+1)k} C^{\langle t\rangle}

so the forward pass sees the whole history while gradients flow back at most ``k`` steps
(MEDL (7.13) keeps only the near terms of (7.10)); one chunk per sequence is full BPTT. The
carry lives in ``TrainState.carry`` (checkpointed); a batch's ``reset`` flags (True at each
epoch's first chunk) zero it. ``apply_fn(params, inputs, rng, train, carry) -> (logits,
new_carry)``, e.g. :func:`seqjax.train.step.flax_apply_fn` of a model with the carry protocol
(:class:`seqjax.nn.StackedRNN`, :class:`seqjax.models.RNNLanguageModel`)::

    lm = RNNLanguageModel(RNNLMConfig(vocab_size=V, embed_dim=32, num_layers=2))
    state = TrainState.create(params, tx, rng, carry=lm.zero_carry(batch_size))
    step = make_train_step(make_tbptt_loss(flax_apply_fn(lm)), with_carry=True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from seqjax.train.losses import _metrics, masked_cross_entropy

Array = jax.Array

__all__ = ["reset_carry", "make_tbptt_loss"]


def reset_carry(carry: Any, reset_B: Array) -> Any:
    """Zero the rows ``b`` of every carry leaf ``[B, ...]`` where ``reset_B[b]`` is True."""

    def zero(c: Array) -> Array:
        r = reset_B.reshape(reset_B.shape + (1,) * (c.ndim - 1))
        return jnp.where(r, jnp.zeros_like(c), c)

    return jax.tree_util.tree_map(zero, carry)


def make_tbptt_loss(
    apply_fn: Callable[..., tuple[Array, Any]],
    *,
    label_smoothing: float = 0.0,
) -> Callable[..., tuple[Array, tuple[dict[str, Array], Any]]]:
    """``loss_fn(params, batch, rng, carry) -> (loss, (metrics, new_carry))`` for one chunk.

    Resets the carry where ``batch["reset"]``, runs ``apply_fn(params, batch["inputs"], rng,
    True, carry)`` and takes the masked, smoothed mean cross-entropy against
    ``batch["targets"]``; ``make_train_step(with_carry=True)`` applies the ``stop_gradient``.
    """

    def loss_fn(params: Any, batch: Mapping[str, Array], rng: Array, carry: Any) -> tuple:
        if "reset" in batch:
            carry = reset_carry(carry, batch["reset"])
        logits, new_carry = apply_fn(params, batch["inputs"], rng, True, carry)
        labels, mask = batch["targets"], batch.get("mask")
        loss = masked_cross_entropy(logits, labels, mask, label_smoothing=label_smoothing)
        return loss, (_metrics(logits, labels, mask), new_carry)

    return loss_fn

r"""Truncated backpropagation through time for recurrent language models (J&M §9.2.2; MEDL §7.2).

A long token stream is cut into ``B`` contiguous rows (:func:`make_streams`; row ``b``
continues in the next chunk exactly where it stopped) and each row into chunks of ``k``
steps. Chunk ``i`` is trained with the recurrence started from the carry the previous
chunk ended with, under ``stop_gradient``:

.. math::  h^{\langle ik\rangle} = \mathrm{sg}\big(h^{\langle ik\rangle}_{\text{chunk } i-1}\big),
           \qquad g_i = \nabla_θ \frac1{Bk}\sum_{t=ik+1}^{(i+1)k} C^{\langle t\rangle}

so the forward pass sees the whole history while gradients flow back at most ``k`` steps
("limits the number of time steps the signal can backpropagate", MEDL §7.2; MEDL (7.13)
keeps only the near terms of (7.10)). With one chunk covering the sequence this is full
BPTT. The carry lives in ``TrainState.carry`` and is checkpointed with it; a batch's
``reset`` flags (True at the first chunk of every epoch) zero it.

Use with ``make_train_step(make_tbptt_loss(apply_fn), with_carry=True)`` where
``apply_fn(params, inputs, rng, train, carry) -> (logits, new_carry)``, e.g.
:func:`seqjax.train.step.flax_apply_fn` of any model that follows the carry protocol
(:class:`seqjax.nn.StackedRNN`): ``model(inputs, initial_carry=carry, return_carry=True)
-> (logits, carry)``, as :class:`seqjax.models.RNNLanguageModel` does. Start the state
from the model's zero carry::

    lm = RNNLanguageModel(vocab_size=V, embed_dim=32, num_layers=2)
    state = TrainState.create(params, tx, rng, carry=lm.zero_carry(batch_size))
    step = make_train_step(make_tbptt_loss(flax_apply_fn(lm)), with_carry=True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import check_rank
from seqjax.train.losses import attach_batch_check, masked_cross_entropy, token_accuracy

Array = jax.Array

__all__ = ["make_streams", "StreamChunkIterator", "reset_carry", "make_tbptt_loss"]


def make_streams(tokens: Any, batch_size: int) -> np.ndarray:
    """Cut a 1-D token stream into ``batch_size`` contiguous rows ``[B, L]``, ``L = N // B``.

    Row ``b`` is ``tokens[b L : (b + 1) L]``; the remainder is dropped.

    Example:
        >>> make_streams(np.arange(10), 3).tolist()
        [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    """
    tokens = np.asarray(tokens)
    check_rank(tokens, "tokens", 1)
    if batch_size < 1 or tokens.shape[0] < 2 * batch_size:
        raise ValueError(
            f"`batch_size` must be >= 1 with at least 2 tokens per row; got {batch_size} rows "
            f"for {tokens.shape[0]} tokens."
        )
    length = tokens.shape[0] // batch_size
    return tokens[: batch_size * length].reshape(batch_size, length)


class StreamChunkIterator(Iterator[dict[str, np.ndarray]]):
    """Consecutive chunks ``{"inputs", "targets": int[B, k], "reset": bool[B]}`` of streams.

    Chunk ``i`` has ``inputs = streams[:, ik : (i+1)k]`` and ``targets`` shifted by one
    (next-token prediction); an epoch has ``(L - 1) // k`` chunks and then starts over
    with ``reset`` True. State (checkpointed): ``{"epoch", "chunk"}``.

    Example:
        >>> it = StreamChunkIterator(make_streams(np.arange(14), 2), chunk_len=3)
        >>> b = next(it); b["inputs"].tolist(), b["targets"].tolist(), b["reset"].tolist()
        ([[0, 1, 2], [7, 8, 9]], [[1, 2, 3], [8, 9, 10]], [True, True])
        >>> next(it)["reset"].tolist(), it.get_state()
        ([False, False], {'epoch': 0, 'chunk': 2})
    """

    def __init__(self, streams: Any, chunk_len: int) -> None:
        self.streams = np.asarray(streams)
        check_rank(self.streams, "streams", 2)
        if chunk_len < 1 or chunk_len > self.streams.shape[1] - 1:
            raise ValueError(
                f"`chunk_len` must lie in [1, {self.streams.shape[1] - 1}] for streams of length "
                f"{self.streams.shape[1]}; got {chunk_len}."
            )
        self.chunk_len = chunk_len
        self.chunks_per_epoch = (self.streams.shape[1] - 1) // chunk_len
        self.epoch = 0
        self.chunk = 0

    def __iter__(self) -> StreamChunkIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.chunk >= self.chunks_per_epoch:
            self.epoch, self.chunk = self.epoch + 1, 0
        k, i = self.chunk_len, self.chunk
        window = self.streams[:, i * k : (i + 1) * k + 1]
        self.chunk += 1
        return {
            "inputs": window[:, :-1],
            "targets": window[:, 1:],
            "reset": np.full((self.streams.shape[0],), i == 0),
        }

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "chunk": self.chunk}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.epoch, self.chunk = int(state["epoch"]), int(state["chunk"])


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
    vocab_size: int | None = None,
) -> Callable[..., tuple[Array, tuple[dict[str, Array], Any]]]:
    """``loss_fn(params, batch, rng, carry) -> (loss, (metrics, new_carry))`` for one chunk.

    The carry is reset where ``batch["reset"]`` is True, then
    ``(logits, new_carry) = apply_fn(params, batch["inputs"], rng, True, carry)``;
    the loss is the (masked, smoothed) mean cross-entropy against ``batch["targets"]``.
    :func:`seqjax.train.step.make_train_step` (``with_carry=True``) applies the
    ``stop_gradient`` to the incoming carry. The host-side token-id check is attached as
    in :func:`seqjax.train.losses.make_lm_loss` (``vocab_size`` or ``apply_fn.vocab_size``).
    """

    def loss_fn(params: Any, batch: Mapping[str, Array], rng: Array, carry: Any) -> tuple:
        if "reset" in batch:
            carry = reset_carry(carry, batch["reset"])
        logits, new_carry = apply_fn(params, batch["inputs"], rng, True, carry)
        labels, mask = batch["targets"], batch.get("mask")
        loss = masked_cross_entropy(logits, labels, mask, label_smoothing=label_smoothing)
        tokens = (jnp.asarray(labels.size, jnp.float32) if mask is None
                  else jnp.sum(mask, dtype=jnp.float32))
        metrics = {"accuracy": token_accuracy(logits, labels, mask), "tokens": tokens}
        return loss, (metrics, new_carry)

    return attach_batch_check(loss_fn, apply_fn, vocab_size)

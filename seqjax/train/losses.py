r"""Losses and metrics for sequence models: masked cross-entropy, accuracy, perplexity, bits/char.

Cross-entropy between a target ``q`` and the softmax output ``ŷ = softmax(z)`` at one position
(J&M (9.12); MEDL (7.4)):

.. math::  C^{\langle t\rangle} = -\sum_{k=1}^{V} q_k \log \hat y_k ,

``-log ŷ_y`` for a one-hot ``q = e_y`` (J&M (9.13)). The sequence loss averages over time
(MEDL (7.5)), over the positions whose mask is True only (MEDL §7.4 fn. 9). Label smoothing
(Szegedy et al. 2016; Vaswani et al. 2017 §5.4), ``q = (1 - ε) e_y + ε / V``, gives

.. math::  C^{\langle t\rangle} = (1-ε)(\log Z - z_y) + ε(\log Z - \tfrac1V\sum_k z_k),
           \qquad \log Z = \operatorname{logsumexp}(z),

with no ``[..., V]`` one-hot. Logits stay in their compute dtype (bf16 under mixed precision);
log-sum-exp and loss run in float32. The gradient is a :func:`jax.custom_vjp`,

.. math::  \frac{\partial C^{\langle t\rangle}}{\partial z_k} = \hat y_k - q_k,
           \qquad \hat y_k = \exp(z_k - \log Z),

in float32 from the saved ``log Z``, returned in the logits' dtype: no float32 ``[..., V]``
copy in either pass. In float32 it equals plain autodiff to rounding.

Perplexity (J&M (9.1)–(9.2)) ``PP = exp(-(1/n) Σ log P(w_i | w_{<i}))`` is computed in log
space, never as a product of probabilities; bits per character
``bpc = NLL_nats / (ln 2 · chars)``. Shapes: ``logits [..., V]``, integer ``labels [...]``
(usually ``[B, T]``), boolean ``mask [...]`` (True = counts).

Targets outside the vocabulary: every ``y ∉ [0, V)``, negative included, never wraps or is
clamped. Concrete labels raise ``ValueError`` naming ``labels``, ``[0, V-1]`` and the values
outside; under ``jax.jit`` the position's loss is NaN (so the mean is NaN) and
:func:`seqjax.checked` makes it an error (:mod:`seqjax._traced_checks`);
:func:`token_accuracy` counts it wrong. Positions with a False mask never matter: there is no
ignore index (PyTorch's ``-100``), so padding ids need a False mask. Every model and recipe
loss (:func:`make_lm_loss`, :func:`make_lm_eval`, :func:`seqjax.train.tbptt.make_tbptt_loss`)
is :func:`token_cross_entropy` underneath. word2vec's negative-sampling loss is
:mod:`seqjax.models.word2vec`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import check_bool, check_integer, check_rate, is_concrete
from seqjax._traced_checks import record_vocab_ids

Array = jax.Array

__all__ = ["token_cross_entropy", "masked_cross_entropy", "token_accuracy", "perplexity",
           "nll_to_perplexity", "bits_per_char", "make_lm_loss", "make_lm_eval"]


def _check_logits_labels(logits: Array, labels: Array, mask: Array | None) -> None:
    shape, label_shape = tuple(np.shape(logits)), tuple(np.shape(labels))
    if not shape:
        raise ValueError(f"`logits` must have a trailing vocabulary axis; got shape {shape}.")
    check_integer(labels, "labels")
    if label_shape != shape[:-1]:
        raise ValueError(
            f"`labels` must have shape logits.shape[:-1] = {shape[:-1]}; got {label_shape}.")
    if mask is not None:
        check_bool(mask, "mask")
        if tuple(np.shape(mask)) != label_shape:
            raise ValueError(f"`mask` must have the shape of `labels` {label_shape}; "
                             f"got {tuple(np.shape(mask))}.")
    # Ids outside [0, V), negative included, are an error, never clamped or wrapped
    # (docs/design.md, "Values inside jit"); masked-out positions are ignored.
    vocab = shape[-1]
    if not (is_concrete(labels) and (mask is None or is_concrete(mask))):
        # Traced: its loss is NaN (the gather's fill); seqjax.checked makes it an error.
        record_vocab_ids(labels, "labels", vocab, mask)
        return
    lab = np.asarray(labels) if mask is None else np.asarray(labels)[np.asarray(mask)]
    bad = np.unique(lab[(lab < 0) | (lab >= vocab)])
    if bad.size:
        shown = ", ".join(str(int(b)) for b in bad[:8]) + (", ..." if bad.size > 8 else "")
        where = " where `mask` is True" if mask is not None else ""
        raise ValueError(
            f"`labels` must lie in [0, {vocab - 1}] (the vocabulary of `logits`){where}; "
            f"got values in [{int(lab.min())}, {int(lab.max())}], outside it: {shown} "
            "(there is no ignore index: pass `mask`).")


def token_cross_entropy(logits: Array, labels: Array, mask: Array | None = None, *,
                        label_smoothing: float = 0.0) -> Array:
    r"""Per-position cross-entropy ``C^{<t>}`` (J&M (9.12)–(9.13); MEDL (7.4)), float32 ``[...]``.

    Shapes and labels outside ``[0, V)``: the module docstring; masked-out positions get 0 (any
    label). ``label_smoothing``: ε in ``[0, 1)``.

    Example:
        >>> import jax.numpy as jnp
        >>> loss = token_cross_entropy(jnp.zeros((1, 2, 4)), jnp.array([[0, 3]]))
        >>> bool(jnp.allclose(loss, jnp.log(4.0)))
        True
    """
    _check_logits_labels(logits, labels, mask)
    check_rate(label_smoothing, "label_smoothing")
    z = jnp.asarray(logits)
    if not jnp.issubdtype(z.dtype, jnp.floating):
        z = z.astype(jnp.float32)
    safe_labels = labels if mask is None else jnp.where(mask, labels, 0)
    loss = _cross_entropy(z, jnp.asarray(safe_labels).astype(jnp.int32), float(label_smoothing))
    if mask is not None:
        loss = jnp.where(mask, loss, 0.0)
    return loss


def _cross_entropy_and_lse(z: Array, labels: Array, smoothing: float) -> tuple[Array, Array]:
    """``(C [...], log Z [...])`` in float32 from logits ``z [..., V]`` of any float dtype."""
    z32 = z.astype(jnp.float32)  # fused into the reductions: no float32 [..., V] buffer
    log_z = jax.nn.logsumexp(z32, axis=-1)
    # An id outside [0, V), negative ones included, reads NaN (never another class's logit:
    # no wrap-around from the end, no clamp): the loss says so.
    z_y = jnp.take_along_axis(z32, labels[..., None], axis=-1, mode="fill", fill_value=jnp.nan,
                              wrap_negative_indices=False)[..., 0]
    loss = log_z - z_y  # -log ŷ_y
    if smoothing > 0.0:
        uniform = log_z - jnp.mean(z32, axis=-1)  # -(1/V) Σ_k log ŷ_k
        loss = (1.0 - smoothing) * loss + smoothing * uniform
    return loss, log_z


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cross_entropy(z: Array, labels: Array, smoothing: float) -> Array:
    return _cross_entropy_and_lse(z, labels, smoothing)[0]


def _cross_entropy_fwd(z: Array, labels: Array, smoothing: float) -> tuple[Array, tuple]:
    loss, log_z = _cross_entropy_and_lse(z, labels, smoothing)
    return loss, (z, labels, log_z)


def _cross_entropy_bwd(smoothing: float, res: tuple, g: Array) -> tuple[Array, None]:
    z, labels, log_z = res
    probs = jnp.exp(z.astype(jnp.float32) - log_z[..., None])  # ŷ
    ids = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1)
    target = (ids == labels[..., None]).astype(jnp.float32)  # e_y, never stored
    if smoothing > 0.0:
        target = (1.0 - smoothing) * target + smoothing / z.shape[-1]
    dz = g.astype(jnp.float32)[..., None] * (probs - target)
    return dz.astype(z.dtype), None


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def _count(labels: Array, mask: Array | None) -> Array:
    if mask is None:
        return jnp.asarray(math.prod(np.shape(labels)), jnp.float32)
    return jnp.sum(mask, dtype=jnp.float32)


def _metrics(logits: Array, labels: Array, mask: Array | None) -> dict[str, Array]:
    """``accuracy`` and ``tokens`` (kept positions: the weight of shards and eval batches)."""
    return {"accuracy": token_accuracy(logits, labels, mask), "tokens": _count(labels, mask)}


def masked_cross_entropy(logits: Array, labels: Array, mask: Array | None = None, *,
                         label_smoothing: float = 0.0, reduction: str = "mean") -> Array:
    r"""Cross-entropy averaged over the kept positions (MEDL (7.4)–(7.5); J&M (9.12)–(9.13)).

    .. math::  C = \frac{\sum_t m_t C^{\langle t\rangle}}{\max(1, \sum_t m_t)}

    Args: those of :func:`token_cross_entropy`, and ``reduction``: ``"mean"`` (over kept
    positions) or ``"sum"`` (float32 scalars), or ``"none"`` (``[...]``).

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.array([[[2.0, 0.0], [0.0, 2.0], [9.0, -9.0]]])
        >>> mask = jnp.array([[True, True, False]])
        >>> float(masked_cross_entropy(logits, jnp.array([[0, 1, 1]]), mask)) < 0.13
        True
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"`reduction` must be 'mean', 'sum' or 'none'; got {reduction!r}.")
    loss = token_cross_entropy(logits, labels, label_smoothing=label_smoothing, mask=mask)
    if reduction == "none":
        return loss
    total = jnp.sum(loss)
    if reduction == "sum":
        return total
    return total / jnp.maximum(_count(labels, mask), 1.0)


def token_accuracy(logits: Array, labels: Array, mask: Array | None = None) -> Array:
    """Fraction of kept positions where ``argmax_k z_k == y`` (float32 scalar; 0 if none kept).

    Example:
        >>> import jax.numpy as jnp
        >>> float(token_accuracy(jnp.array([[[1.0, 0.0], [1.0, 0.0]]]), jnp.array([[0, 1]])))
        0.5
    """
    _check_logits_labels(logits, labels, mask)
    hit = jnp.argmax(logits, axis=-1) == labels
    if mask is not None:
        hit = hit & mask
    return jnp.sum(hit, dtype=jnp.float32) / jnp.maximum(_count(labels, mask), 1.0)


def nll_to_perplexity(mean_nll: Array | float) -> Array:
    r"""``PP = exp(mean NLL)`` (J&M (9.1)–(9.2) in log space); ``mean_nll`` in nats/token.

    Example:
        >>> import math
        >>> round(float(nll_to_perplexity(math.log(8.0))), 4)   # uniform over 8 words
        8.0
    """
    return jnp.exp(jnp.asarray(mean_nll, jnp.float32))


def perplexity(logits: Array, labels: Array, mask: Array | None = None) -> Array:
    r"""Perplexity of the labels (J&M (9.1)–(9.2)), in log space over the ``n`` kept positions.

    .. math::  PP = \exp\Big(-\frac1n\sum_{i=1}^n \log P(w_i\mid w_{<i})\Big)
                  = \sqrt[n]{\prod_i 1/P(w_i\mid w_{<i})}

    No label smoothing: perplexity is a property of the model, not the training target.

    Example:
        >>> import jax.numpy as jnp
        >>> round(float(perplexity(jnp.zeros((2, 5, 8)), jnp.zeros((2, 5), jnp.int32))), 4)
        8.0
    """
    return nll_to_perplexity(masked_cross_entropy(logits, labels, mask))


def bits_per_char(mean_nll: Array | float, chars_per_token: float = 1.0) -> Array:
    r"""Bits per character ``mean_nll / (ln 2 · chars_per_token)``, ``mean_nll`` in nats/token.

    ``chars_per_token``: 1 for a character model, else the corpus's ``num_chars / num_tokens``.

    Example:
        >>> import math
        >>> float(bits_per_char(math.log(2.0)))
        1.0
    """
    if chars_per_token <= 0:
        raise ValueError(f"`chars_per_token` must be positive; got {chars_per_token}.")
    return jnp.asarray(mean_nll, jnp.float32) / (math.log(2.0) * chars_per_token)


ApplyFn = Callable[[Any, Array, Array, bool], Array]


def make_lm_loss(apply_fn: ApplyFn, *, label_smoothing: float = 0.0, inputs_key: str = "inputs",
                 targets_key: str = "targets", mask_key: str = "mask"
                 ) -> Callable[[Any, Mapping[str, Array], Array], tuple[Array, dict[str, Array]]]:
    """A language-model loss ``loss_fn(params, batch, rng) -> (loss, metrics)`` for
    :func:`seqjax.train.step.make_train_step`.

    ``logits = apply_fn(params, batch["inputs"], rng, True)``; the loss is the masked (by
    ``batch["mask"]`` if present), optionally smoothed cross-entropy against
    ``batch["targets"]``. ``metrics``: ``accuracy``, ``tokens`` (kept positions, the weight of
    shards and evaluation batches) and, with smoothing, ``nll`` (unsmoothed). An invalid kept
    target makes the loss NaN; refuse such batches on the host with ``fit``'s
    ``check_batch=make_batch_check(V)`` (:func:`seqjax.train.step.make_batch_check`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> apply = lambda p, x, rng, train: jax.nn.one_hot(x, 4) * p
        >>> loss_fn = make_lm_loss(apply)
        >>> batch = {"inputs": jnp.array([[1, 2]]), "targets": jnp.array([[1, 2]])}
        >>> loss, m = loss_fn(jnp.float32(3.0), batch, jax.random.PRNGKey(0))
        >>> float(m["accuracy"]), float(m["tokens"])
        (1.0, 2.0)
    """

    def loss_fn(params: Any, batch: Mapping[str, Array], rng: Array) -> tuple[Array, dict]:
        logits = apply_fn(params, batch[inputs_key], rng, True)
        labels, mask = batch[targets_key], batch.get(mask_key)
        loss = masked_cross_entropy(logits, labels, mask, label_smoothing=label_smoothing)
        metrics = _metrics(logits, labels, mask)
        if label_smoothing > 0.0:
            metrics["nll"] = masked_cross_entropy(logits, labels, mask)
        return loss, metrics

    return loss_fn


def make_lm_eval(apply_fn: ApplyFn, *, inputs_key: str = "inputs", targets_key: str = "targets",
                 mask_key: str = "mask") -> Callable[[Any, Mapping[str, Array]], dict[str, Array]]:
    """An evaluation function ``eval_fn(params, batch) -> {"loss", "accuracy", "tokens"}``.

    ``loss`` is the unsmoothed mean NLL over kept positions; :func:`seqjax.train.loop.evaluate`
    weights batches by ``tokens`` and adds ``perplexity = exp(loss)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> eval_fn = make_lm_eval(lambda p, x, rng, train: jnp.zeros(x.shape + (8,)))
        >>> m = eval_fn(None, {"inputs": jnp.zeros((1, 3), int), "targets": jnp.ones((1, 3), int)})
        >>> round(float(m["loss"]), 4) == round(float(jnp.log(8.0)), 4)
        True
    """

    def eval_fn(params: Any, batch: Mapping[str, Array]) -> dict[str, Array]:
        logits = apply_fn(params, batch[inputs_key], jax.random.PRNGKey(0), False)
        labels, mask = batch[targets_key], batch.get(mask_key)
        return {"loss": masked_cross_entropy(logits, labels, mask),
                **_metrics(logits, labels, mask)}

    return eval_fn

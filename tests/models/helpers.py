"""Shared test helpers: a compiled training loop and numpy cross-entropy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax


def fit(loss_fn: Callable[[Any, Any], Any], params: Any, batches: Any, lr: float = 1e-2,
        has_aux: bool = False) -> tuple[Any, Any]:
    """Adam on ``loss_fn(params, batch)`` over the leading axis of ``batches``, as one scan.

    One compilation for the whole run keeps the "learns in seconds" tests fast. With
    ``has_aux``, ``loss_fn`` returns ``(loss, metrics)``; the metrics of step ``t`` are
    computed on batch ``t`` *before* the update on it, i.e. on unseen data when every
    batch is fresh. Returns ``(params, losses)`` or ``(params, (losses, metrics))``.
    """
    opt = optax.adam(lr)

    @jax.jit
    def run(params: Any, batches: Any) -> tuple[Any, Any]:
        def step(carry: tuple, batch: Any) -> tuple[tuple, Any]:
            params, state = carry
            out, grads = jax.value_and_grad(loss_fn, has_aux=has_aux)(params, batch)
            updates, state = opt.update(grads, state, params)
            return (optax.apply_updates(params, updates), state), out

        (params, _), outs = jax.lax.scan(step, (params, opt.init(params)), batches)
        return params, outs

    return run(params, batches)


def accuracy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Fraction of ``argmax(logits) == targets``."""
    return jnp.mean(jnp.argmax(logits, axis=-1) == targets)


def np_cross_entropy(logits: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``-log softmax(logits)[target]`` along the last axis, in float64 numpy."""
    logits = np.asarray(logits, np.float64)
    m = logits.max(-1, keepdims=True)
    logz = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
    return logz - np.take_along_axis(logits, np.asarray(target)[..., None], -1)[..., 0]


def shape_tree(tree: Any) -> dict[str, list[int]]:
    """``{"a/b/kernel": [shape]}`` for every leaf of a parameter tree."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    out = {}
    for path, leaf in flat:
        name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        out[name] = [int(d) for d in jnp.shape(leaf)]
    return dict(sorted(out.items()))


def np_init(model: Any, *args: Any, scale: float | None = 0.3, seed: int = 0,
            **kwargs: Any) -> dict:
    """Random parameters with the model's tree, drawn in numpy: no init compilation.

    ``scale``: every leaf ~ N(0, scale²) (equivalence tests, where any parameters do).
    ``scale=None``: a trainable initialisation — norm scales 1, biases 0, embeddings
    N(0, 0.1²), other kernels N(0, 1/fan_in).
    """
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *args, **kwargs))
    rng = np.random.default_rng(seed)

    def draw(path: Any, s: Any) -> jax.Array:
        name = str(getattr(path[-1], "key", path[-1]))
        if scale is not None:
            std = scale
        elif name == "scale":
            return jnp.ones(s.shape, s.dtype)
        elif name == "bias" or len(s.shape) < 2:
            return jnp.zeros(s.shape, s.dtype)
        elif name == "embedding" or "token" in name:
            std = 0.1
        else:
            std = 1.0 / np.sqrt(np.prod(s.shape[:-1]))
        return jnp.asarray(std * rng.standard_normal(s.shape), s.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def reversal_accuracy(model: Any, vocab: int, length: int, lr: float) -> float:
    """Train ``model(src, tgt_in) -> logits`` on reversing random sequences of ``length``
    tokens from ``[2, vocab)`` (``1`` = BOS), 200 batches of 32; the mean accuracy over the
    last 10 batches, each measured before training on it."""
    from seqjax.train.losses import token_cross_entropy

    bos = 1
    src = jnp.asarray(np.random.default_rng(1).integers(2, vocab, (200, 32, length)), jnp.int32)
    tgt = src[..., ::-1]
    tgt_in = jnp.concatenate([jnp.full_like(tgt[..., :1], bos), tgt[..., :-1]], axis=-1)
    v = np_init(model, src[0], tgt_in[0], scale=None)

    def loss(p: Any, batch: Any) -> Any:
        s, ti, t = batch
        logits = model.apply(p, s, ti)
        return token_cross_entropy(logits, t).mean(), accuracy(logits, t)

    _, (_, acc) = fit(loss, v, (src, tgt_in, tgt), lr=lr, has_aux=True)
    return float(acc[-10:].mean())


def seq2seq(src_vocab_size: int, tgt_vocab_size: int, **options: Any) -> Any:
    """A :class:`~seqjax.models.Seq2Seq` from flat options: the fields of
    :class:`~seqjax.models.RNNConfig` go to ``config.encoder`` (``cell_type`` defaults to
    ``"gru"`` here), the others to :class:`~seqjax.models.Seq2SeqConfig`."""
    import dataclasses

    from seqjax.models import RNNConfig, Seq2Seq, Seq2SeqConfig

    rnn_fields = {f.name for f in dataclasses.fields(RNNConfig)}
    encoder = {"cell_type": "gru", **{k: v for k, v in options.items() if k in rnn_fields}}
    rest = {k: v for k, v in options.items() if k not in rnn_fields}
    return Seq2Seq(Seq2SeqConfig(encoder=RNNConfig(vocab_size=src_vocab_size, **encoder),
                                 tgt_vocab_size=tgt_vocab_size, **rest))

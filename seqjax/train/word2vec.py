r"""Training word2vec (Mikolov et al. 2013; Bishop §12.2.1): sampled examples, Adam, ``lax.scan``.

The model and its negative-sampling losses are :class:`seqjax.models.word2vec.Word2Vec`; the
examples (skip-gram pairs, CBOW windows), the noise distribution ``P_n(w) ∝ count(w)^{3/4}``
and subsampling are :mod:`seqjax.data.word2vec`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax

from seqjax._checks import ConfigBase
from seqjax.data.word2vec import (
    _ids,
    cbow_windows,
    noise_distribution,
    skipgram_pairs,
    subsample_mask,
)
from seqjax.models.word2vec import Mode, Word2Vec

Array = jax.Array

__all__ = ["Word2VecConfig", "train_word2vec"]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _train_chunk(
    model: Word2Vec, learning_rate: float, params: Any, opt_state: Any, batches: dict[str, Array]
) -> tuple[Any, Any, Array]:
    """Adam steps over the leading axis of ``batches`` with ``lax.scan``; returns the losses."""
    tx = optax.adam(learning_rate)

    def step(carry: Any, batch: dict[str, Array]) -> tuple[Any, Array]:
        params, opt_state = carry
        loss, grads = jax.value_and_grad(model.apply)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), batches)
    return params, opt_state, losses


@dataclass(frozen=True, kw_only=True)
class Word2VecConfig(ConfigBase):
    """Training settings for :func:`train_word2vec` (defaults: Mikolov et al. 2013, Adam)."""

    features: int = 100
    mode: Mode = "skipgram"
    window: int = 5  # Bishop's M
    negatives: int = 5  # K
    noise_power: float = 0.75
    subsample: float | None = None  # e.g. 1e-3; None keeps every token
    batch_size: int = 256
    steps: int = 1000
    learning_rate: float = 0.01
    seed: int = 0


def train_word2vec(
    ids_N: Any, vocab_size: int, config: Word2VecConfig = Word2VecConfig()
) -> tuple[np.ndarray, np.ndarray]:
    """Train word2vec on a token-id stream; returns ``(embeddings float32[V, D], losses [steps])``.

    Each step samples ``batch_size`` examples uniformly and ``negatives`` noise words each
    (:func:`noise_distribution`), then takes an Adam step on :class:`Word2Vec`'s loss; steps run
    in ``lax.scan`` chunks.

    Example:
        >>> ids = np.tile([0, 1, 2, 3], 50)
        >>> e, losses = train_word2vec(ids, 4, Word2VecConfig(features=8, window=1, steps=20))
        >>> e.shape, bool(losses[-1] < losses[0])
        ((4, 8), True)
    """
    ids = _ids(ids_N)
    rng = np.random.default_rng(config.seed)
    noise = noise_distribution(ids, vocab_size, config.noise_power)
    if config.subsample is not None:
        ids = ids[subsample_mask(ids, vocab_size, config.subsample, rng)]
    if config.mode == "skipgram":
        data = dict(zip(("centers", "contexts"), skipgram_pairs(ids, config.window)))
    elif config.mode == "cbow":
        data = dict(zip(("contexts", "mask", "centers"), cbow_windows(ids, config.window)))
    else:
        raise ValueError(f"`config.mode` must be 'skipgram' or 'cbow'; got {config.mode!r}.")
    n = len(data["centers"])
    if n == 0:
        raise ValueError(f"`ids_N` is too short for any training example (window={config.window}).")

    model = Word2Vec(vocab_size, config.features, config.mode)
    b, k = config.batch_size, config.negatives

    def sample(steps: int) -> dict[str, np.ndarray]:
        rows = rng.integers(0, n, size=(steps, b))
        out = {key: v[rows] for key, v in data.items()}
        out["negatives"] = rng.choice(vocab_size, size=(steps, b, k), p=noise).astype(np.int32)
        return out

    first = {key: v[0] for key, v in sample(1).items()}
    params = model.init(jax.random.PRNGKey(config.seed), first)
    opt_state = optax.adam(config.learning_rate).init(params)
    losses = []
    for done in range(0, config.steps, 200):  # chunks of 200 steps
        params, opt_state, l = _train_chunk(model, config.learning_rate, params, opt_state,
                                            sample(min(200, config.steps - done)))
        losses.append(np.asarray(l))
    emb = np.asarray(params["params"]["input_embedding"], np.float32)
    return emb, np.concatenate(losses) if losses else np.zeros(0, np.float32)

r"""word2vec: skip-gram and CBOW with negative sampling, in JAX; similarity and analogy tools.

Word embeddings map word ``i`` to a dense vector ``v_i = E x_i`` (Bishop
(12.26); MEDL §7.1), learned so that words used in similar contexts get
similar vectors, measured by the cosine of their angle (MEDL §7.1):

.. math::
    \cos\theta = \frac{a^\top b}{\lVert a\rVert\,\lVert b\rVert}.

word2vec (Mikolov et al. 2013; Bishop §12.2.1) is a two-layer linear network
over a window of ``M`` words either side of a centre word:

* **skip-gram** predicts each context word ``o`` from the centre ``c``;
* **CBOW** predicts the centre from the mean of its context vectors.

Instead of a softmax over the whole vocabulary, *negative sampling* contrasts
the true pair with ``K`` words drawn from the noise distribution
``P_n(w) ∝ count(w)^{3/4}`` (Mikolov et al. 2013, eq. 4):

.. math::
    \ell = -\log\sigma(u_o^\top h) - \sum_{k=1}^{K}\log\sigma(-u_{w_k}^\top h),
    \qquad h = v_c\ \text{(skip-gram)},\quad
    h = \tfrac{1}{|C|}\textstyle\sum_{j\in C} v_j\ \text{(CBOW)},

with ``v`` the input ("embedding", Bishop's ``E``) and ``u`` the output
vectors. Analogies follow Bishop (12.27):
``v(Paris) − v(France) + v(Italy) ≈ v(Rome)``.

The examples and the noise distribution come from :mod:`seqjax.data.word2vec`; the two
losses are :func:`seqjax.train.losses.skipgram_ns_loss` and
:func:`~seqjax.train.losses.cbow_ns_loss`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from seqjax.data.word2vec import (
    _ids,
    cbow_windows,
    noise_distribution,
    skipgram_pairs,
    subsample_mask,
)
from seqjax.train.losses import cbow_ns_loss, skipgram_ns_loss

__all__ = [
    "cosine_similarity",
    "nearest_neighbours",
    "analogy",
    "evaluate_analogies",
    "Word2Vec",
    "Word2VecConfig",
    "train_word2vec",
]

Array = jax.Array
Mode = Literal["skipgram", "cbow"]


# ----------------------------------------------------------------------------- similarity
def cosine_similarity(a: Any, b: Any, *, eps: float = 1e-12) -> np.ndarray:
    r"""``cos θ = a·b / (‖a‖ ‖b‖)`` over the last axis, broadcasting the rest (MEDL §7.1).

    Example (MEDL §7.1's king/queen/mean):
        >>> king, queen = [0.41, 1.2, 3.4, -1.3], [0.39, 1.1, 3.5, 1.6]
        >>> round(float(cosine_similarity(king, queen)), 3)
        0.729
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape[-1:] != b.shape[-1:]:
        raise ValueError(
            f"`a` and `b` must share their last dimension; got shapes {a.shape} and {b.shape}."
        )
    num = np.sum(a * b, axis=-1)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return num / np.maximum(den, eps)


def _unit_rows(embeddings_VxD: Any) -> np.ndarray:
    e = np.asarray(embeddings_VxD, np.float64)
    if e.ndim != 2:
        raise ValueError(f"`embeddings_VxD` must have rank 2; got shape {e.shape}.")
    return e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)


def _check_id(i: int, vocab_size: int, name: str) -> int:
    if not 0 <= int(i) < vocab_size:
        raise ValueError(
            f"`{name}`={int(i)} is outside the vocabulary [0, {vocab_size}) "
            f"(vocab_size={vocab_size})."
        )
    return int(i)


def nearest_neighbours(
    embeddings_VxD: Any, query: int | Any, k: int = 5, *, exclude: Sequence[int] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` rows most cosine-similar to ``query`` (an id or a vector ``[D]``).

    A query id excludes itself. Returns ``(ids int32[k], cosines float32[k])``,
    most similar first.

    Example:
        >>> e = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
        >>> nearest_neighbours(e, 0, k=1)[0].tolist()
        [1]
    """
    unit = _unit_rows(embeddings_VxD)
    skip = set(int(i) for i in exclude)
    if np.ndim(query) == 0:
        q = _check_id(query, len(unit), "query")
        skip.add(q)
        vec = unit[q]
    else:
        vec = np.asarray(query, np.float64)
        vec = vec / max(np.linalg.norm(vec), 1e-12)
    sims = unit @ vec
    if skip:
        sims[list(skip)] = -np.inf
    k = min(k, len(unit) - len(skip))
    top = np.argsort(-sims, kind="stable")[:k]
    return top.astype(np.int32), sims[top].astype(np.float32)


def analogy(embeddings_VxD: Any, a: int, b: int, c: int, k: int = 1) -> np.ndarray:
    """``a : b :: c : ?`` — the ``k`` ids nearest to ``v_b − v_a + v_c`` (Bishop (12.27)).

    Uses unit-normalised vectors (3CosAdd, Mikolov et al. 2013) and excludes
    ``a, b, c``. Bishop's example is ``analogy(E, France, Paris, Italy) -> Rome``.

    Example:
        >>> e = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 1, 1]], float)
        >>> analogy(e, 0, 1, 2).tolist()
        [3]
    """
    unit = _unit_rows(embeddings_VxD)
    ia, ib, ic = (_check_id(i, len(unit), n) for i, n in ((a, "a"), (b, "b"), (c, "c")))
    target = unit[ib] - unit[ia] + unit[ic]
    return nearest_neighbours(unit, target, k, exclude=(ia, ib, ic))[0]


def evaluate_analogies(embeddings_VxD: Any, questions_Nx4: Any) -> float:
    """Accuracy on analogy questions ``(a, b, c, d)`` meaning ``a : b :: c : d``.

    A question counts as correct when :func:`analogy` ranks ``d`` first (as in
    Mikolov et al.'s word-analogy test set).

    Example:
        >>> e = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 1, 1]], float)
        >>> evaluate_analogies(e, [[0, 1, 2, 3], [0, 1, 2, 0]])
        0.5
    """
    q = np.asarray(questions_Nx4)
    if q.ndim != 2 or q.shape[1] != 4:
        raise ValueError(f"`questions_Nx4` must have shape [N, 4]; got {q.shape}.")
    if len(q) == 0:
        raise ValueError("`questions_Nx4` is empty.")
    hits = [int(analogy(embeddings_VxD, a, b, c)[0]) == int(d) for a, b, c, d in q]
    return float(np.mean(hits))


# ----------------------------------------------------------------------------- model
class Word2Vec(nn.Module):
    """Parameters of word2vec and its negative-sampling loss.

    Parameters: ``input_embedding`` ``[V, D]`` (the word vectors, Bishop's
    ``E``; initialised ``U(−0.5/D, 0.5/D)`` as in the C code) and
    ``output_embedding`` ``[V, D]`` (context vectors ``u``; zeros).

    ``__call__(batch)`` returns the mean loss of :func:`skipgram_ns_loss`
    (``batch`` keys ``centers [B]``, ``contexts [B]``, ``negatives [B, K]``) or of
    :func:`cbow_ns_loss` (``contexts [B, C]``, ``mask [B, C]``, ``centers [B]``,
    ``negatives [B, K]``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> m = Word2Vec(vocab_size=10, features=4)
        >>> b = {"centers": jnp.array([1, 2]), "contexts": jnp.array([3, 4]),
        ...      "negatives": jnp.array([[5, 6], [7, 8]])}
        >>> params = m.init(jax.random.PRNGKey(0), b)
        >>> round(float(m.apply(params, b)), 4)  # output vectors start at 0: 3 log 2
        2.0794
    """

    vocab_size: int
    features: int
    mode: Mode = "skipgram"
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, batch: dict[str, Array]) -> Array:
        if self.mode not in ("skipgram", "cbow"):
            raise ValueError(f"`mode` must be 'skipgram' or 'cbow'; got {self.mode!r}.")
        scale = 0.5 / self.features
        emb = self.param(
            "input_embedding",
            lambda k, s, d: jax.random.uniform(k, s, d, -scale, scale),
            (self.vocab_size, self.features),
            self.param_dtype,
        )
        out = self.param(
            "output_embedding", nn.initializers.zeros_init(),
            (self.vocab_size, self.features), self.param_dtype,
        )
        if self.mode == "skipgram":
            return skipgram_ns_loss(emb, out, batch["centers"], batch["contexts"],
                                    batch["negatives"])
        return cbow_ns_loss(emb, out, batch["contexts"], batch["mask"], batch["centers"],
                            batch["negatives"])


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


@dataclass(frozen=True)
class Word2VecConfig:
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

    Each step samples ``batch_size`` examples (skip-gram pairs or CBOW windows)
    uniformly and ``negatives`` noise words per example from
    :func:`noise_distribution`, and takes an Adam step on the loss of
    :class:`Word2Vec`. Steps run in chunks inside ``lax.scan``.

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
        centers, contexts = skipgram_pairs(ids, config.window)
        data = {"centers": centers, "contexts": contexts}
    elif config.mode == "cbow":
        contexts, mask, centers = cbow_windows(ids, config.window)
        data = {"contexts": contexts, "mask": mask, "centers": centers}
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
    chunk = 200
    losses = []
    done = 0
    while done < config.steps:
        todo = min(chunk, config.steps - done)
        params, opt_state, l = _train_chunk(model, config.learning_rate, params, opt_state,
                                            sample(todo))
        losses.append(np.asarray(l))
        done += todo
    emb = np.asarray(params["params"]["input_embedding"], np.float32)
    return emb, np.concatenate(losses) if losses else np.zeros(0, np.float32)

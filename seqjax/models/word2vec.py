r"""word2vec (Mikolov et al. 2013; Bishop §12.2.1): skip-gram and CBOW with negative sampling,
in JAX; similarity and analogy tools.

Word ``i`` maps to ``v_i = E x_i`` (Bishop (12.26); MEDL §7.1), learned so that words in
similar contexts get similar vectors by cosine, :math:`\cos\theta = a^\top b / (\lVert
a\rVert\,\lVert b\rVert)` (MEDL §7.1). Over a window of ``M`` words either side, skip-gram
predicts each context word ``o`` from the centre ``c``, CBOW the centre from the mean of its
context vectors; negative sampling contrasts the true pair with ``K`` words drawn from
``P_n(w) ∝ count(w)^{3/4}`` (Mikolov et al. 2013, eq. 4):

.. math::
    \ell = -\log\sigma(u_o^\top h) - \sum_{k=1}^{K}\log\sigma(-u_{w_k}^\top h),
    \qquad h = v_c\ \text{(skip-gram)},\quad
    h = \tfrac{1}{|C|}\textstyle\sum_{j\in C} v_j\ \text{(CBOW)},

``v`` the input vectors (Bishop's ``E``), ``u`` the output vectors. Analogies: Bishop (12.27),
``v(Paris) − v(France) + v(Italy) ≈ v(Rome)``. Examples and noise distribution:
:mod:`seqjax.data.word2vec`; training loop: :func:`seqjax.train.word2vec.train_word2vec`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

__all__ = [
    "cosine_similarity", "nearest_neighbours", "analogy", "evaluate_analogies", "Word2Vec",
    "skipgram_ns_loss", "cbow_ns_loss",
]

Array = jax.Array
Mode = Literal["skipgram", "cbow"]


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


def nearest_neighbours(embeddings_VxD: Any, query: int | Any, k: int = 5, *,
                       exclude: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """``(ids int32[k], cosines float32[k])``, most similar first: the ``k`` rows most
    cosine-similar to ``query`` (an id, which excludes itself, or a vector ``[D]``).

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

    Unit-normalised vectors (3CosAdd, Mikolov et al. 2013); ``a, b, c`` excluded. Bishop's
    example: ``analogy(E, France, Paris, Italy) -> Rome``.

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
    """Accuracy on questions ``(a, b, c, d)``, ``a : b :: c : d``: :func:`analogy` ranks ``d``
    first (Mikolov et al.'s word-analogy test).

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


def _ns_loss(h_BxD: Array, out_VxD: Array, targets_B: Array, negatives_BxK: Array) -> Array:
    h = h_BxD.astype(jnp.float32)
    pos_B = jnp.einsum("bd,bd->b", h, out_VxD[targets_B].astype(jnp.float32))
    neg_BxK = jnp.einsum("bd,bkd->bk", h, out_VxD[negatives_BxK].astype(jnp.float32))
    per_example = -jax.nn.log_sigmoid(pos_B) - jnp.sum(jax.nn.log_sigmoid(-neg_BxK), axis=-1)
    return jnp.mean(per_example)


def skipgram_ns_loss(in_VxD: Array, out_VxD: Array, centers_B: Array, contexts_B: Array,
                     negatives_BxK: Array) -> Array:
    r"""Mean skip-gram negative-sampling loss ``ℓ`` (Mikolov et al. 2013, eq. 4; module
    docstring), a scalar: ``v_c = in_VxD[centers]``, ``u_o = out_VxD[contexts]``,
    ``u_{w_k} = out_VxD[negatives]``."""
    return _ns_loss(in_VxD[centers_B], out_VxD, contexts_B, negatives_BxK)


def cbow_ns_loss(in_VxD: Array, out_VxD: Array, contexts_BxC: Array, mask_BxC: Array,
                 centers_B: Array, negatives_BxK: Array) -> Array:
    r"""Mean CBOW negative-sampling loss, a scalar: :func:`skipgram_ns_loss` with the centre as
    target and ``h = Σ_j m_j v_{x_j} / Σ_j m_j``, the masked mean of the context vectors."""
    m = mask_BxC.astype(jnp.float32)[..., None]
    h_BxD = jnp.sum(in_VxD[contexts_BxC].astype(jnp.float32) * m, axis=1) / jnp.maximum(
        jnp.sum(m, axis=1), 1.0)
    return _ns_loss(h_BxD, out_VxD, centers_B, negatives_BxK)


class Word2Vec(nn.Module):
    """Parameters of word2vec and its negative-sampling loss.

    Parameters: ``input_embedding`` ``[V, D]`` (the word vectors ``E``; ``U(−0.5/D, 0.5/D)`` as
    in the C code) and ``output_embedding`` ``[V, D]`` (context vectors ``u``; zeros).
    ``__call__(batch)`` returns the mean loss of :func:`skipgram_ns_loss` (keys
    ``centers [B]``, ``contexts [B]``, ``negatives [B, K]``) or, ``mode="cbow"``, of
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
        shape = (self.vocab_size, self.features)
        uniform = lambda k, s, d: jax.random.uniform(k, s, d, -scale, scale)
        emb = self.param("input_embedding", uniform, shape, self.param_dtype)
        out = self.param("output_embedding", nn.initializers.zeros_init(), shape, self.param_dtype)
        if self.mode == "skipgram":
            return skipgram_ns_loss(emb, out, batch["centers"], batch["contexts"],
                                    batch["negatives"])
        return cbow_ns_loss(emb, out, batch["contexts"], batch["mask"], batch["centers"],
                            batch["negatives"])

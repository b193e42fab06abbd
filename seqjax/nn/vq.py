r"""Vector quantisation with the straight-through estimator (VQ-VAE's bottleneck).

Nearest-codebook assignment (Bishop §12.4.2, (12.38)) replaces each ``z_n ∈ ℝ^D`` by the closest of
``K`` code vectors ``c_1..c_K`` (the codebook ``C``):

.. math::
    k_n = \arg\min_{k} \lVert z_n - c_k \rVert^2,\qquad q_n = c_{k_n}.

The ``argmin`` has no useful gradient, so training uses the **straight-through** estimator
(Bishop §12.4.2; van den Oord et al. 2017, §3.2; Bengio et al. 2013),
:math:`\tilde q_n = z_n + \mathrm{sg}[q_n - z_n]` (``sg`` = ``jax.lax.stop_gradient``): the forward
pass outputs ``q_n``, the backward pass copies the gradient from ``q_n`` to ``z_n`` unchanged
(:math:`\partial \tilde q_n / \partial z_n = I`).

Two losses pull codebook and encoder together (van den Oord et al. 2017, eq. 3, averaged over
vectors and dimensions):

.. math::
    \mathcal L_{\rm codebook} = \frac1{ND}\sum_n \lVert \mathrm{sg}[z_n] - q_n \rVert^2,\qquad
    \mathcal L_{\rm commit} = \frac{β}{ND}\sum_n \lVert z_n - \mathrm{sg}[q_n] \rVert^2.

Equal in value up to ``β`` (0.25 in the paper), they differ in gradient: the codebook loss moves
only ``C`` (the chosen codes towards the encoder outputs), the commitment loss only ``z`` (towards
their codes).

Codebooks can also be fitted without gradients by K-means (Bishop §12.4.2; ImageGPT's colour
palette): :func:`kmeans_codebook` is Lloyd's algorithm, whose assignment step is (12.38).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax._checks import check_rank

Array = jax.Array
Initializer = Callable[..., Array]

__all__ = ["VectorQuantizer", "kmeans_codebook", "nearest_code", "quantize", "vq_losses"]


def nearest_code(z: Array, codebook_KxD: Array) -> tuple[Array, Array]:
    r"""``(k, d)``: the index ``k = argmin_k ‖z − c_k‖²`` (Bishop (12.38)) and all distances.

    Shapes: ``z: [..., D]``, ``codebook_KxD: [K, D]`` -> ``k: int32[...]``, ``d: f32[..., K]``.
    ``d = ‖z‖² − 2 zᵀc + ‖c‖²`` (one matmul); ties go to the lowest index.

    Example:
        >>> c = jnp.array([[0.0, 0.0], [1.0, 1.0], [4.0, 0.0]])
        >>> k, d = nearest_code(jnp.array([[0.9, 0.7], [3.0, 0.1]]), c)
        >>> k.tolist()
        [1, 2]
    """
    check_rank(codebook_KxD, "codebook", 2)
    k, d = codebook_KxD.shape
    if k < 1:
        raise ValueError(f"`codebook` must hold at least one code; got shape {(k, d)}.")
    if jnp.ndim(z) < 1 or z.shape[-1] != d:
        raise ValueError(f"`z` must end in the code width D = {d}; got shape "
                         f"{tuple(jnp.shape(z))}.")
    z32, c32 = z.astype(jnp.float32), codebook_KxD.astype(jnp.float32)
    d_xK = jnp.sum(z32 * z32, -1, keepdims=True) - 2.0 * z32 @ c32.T + jnp.sum(c32 * c32, -1)
    return jnp.argmin(d_xK, axis=-1).astype(jnp.int32), d_xK


def quantize(z: Array, codebook_KxD: Array) -> tuple[Array, Array]:
    r"""``(q̃, k)``: the straight-through quantisation ``q̃ = z + sg[c_k − z]`` and the codes.

    The forward value is the nearest code ``c_k`` (up to one rounding of ``z + (c_k − z)``); the
    gradient with respect to ``z`` is the identity and none reaches the codebook (use
    :func:`vq_losses` for that).

    Example:
        >>> c = jnp.array([[0.0], [1.0]])
        >>> jax.grad(lambda z: (3.0 * quantize(z, c)[0]).sum())(jnp.array([[0.2]])).tolist()
        [[3.0]]
    """
    k, _ = nearest_code(z, codebook_KxD)
    q = jnp.take(codebook_KxD, k, axis=0).astype(z.dtype)
    return z + jax.lax.stop_gradient(q - z), k


def _check_beta(beta: float) -> None:
    if not beta >= 0:
        raise ValueError(f"`beta` must be >= 0; got {beta}.")


def vq_losses(z: Array, q: Array, beta: float = 0.25) -> tuple[Array, Array]:
    r"""``(codebook_loss, commitment_loss)`` of van den Oord et al. (2017), eq. 3.

    ``codebook = mean ‖sg[z] − q‖²`` (gradient to the codes only),
    ``commitment = β · mean ‖z − sg[q]‖²`` (gradient to ``z`` only); ``q`` are the selected codes
    *with* their gradient path to the codebook (``codebook[k]``), not ``q̃``. ``β < 0`` or unequal
    shapes are a ``ValueError``.

    Example:
        >>> cb, cm = vq_losses(jnp.array([[1.0, 2.0]]), jnp.array([[0.0, 0.0]]), beta=0.5)
        >>> float(cb), float(cm)
        (2.5, 1.25)
    """
    _check_beta(beta)
    if jnp.shape(z) != jnp.shape(q):
        raise ValueError(f"`z` and `q` must have the same shape; got {tuple(jnp.shape(z))} "
                         f"and {tuple(jnp.shape(q))}.")
    sg = jax.lax.stop_gradient
    z32, q32 = z.astype(jnp.float32), q.astype(jnp.float32)
    return jnp.mean(jnp.square(sg(z32) - q32)), beta * jnp.mean(jnp.square(z32 - sg(q32)))


class VectorQuantizer(nn.Module):
    r"""A learned codebook with nearest-code assignment and the straight-through estimator.

    ``k = argmin_k ‖z − c_k‖²`` (Bishop (12.38)), ``q̃ = z + sg[c_k − z]`` and the losses of
    van den Oord et al. 2017, eq. 3 (module docstring). Call ``vq(z) -> (q̃, aux)``:
    ``z, q̃: [..., D]`` (forward value ``c_k``, gradient ``I`` with respect to ``z``); ``aux`` holds
    ``codes: int32[...]``, ``codebook_loss``, ``commitment_loss``, ``loss`` (their sum: add it to
    the task loss) and ``perplexity`` (``exp`` of the entropy of the batch's code usage: ``K`` when
    every code is used equally, 1 when one code takes everything).

    Parameters: ``codebook: [K, D]``. ``decode(codes)`` looks codes up.

    Example:
        >>> vq, z = VectorQuantizer(num_codes=8, features=4), jnp.ones((2, 5, 4))
        >>> q, aux = vq.apply(vq.init(jax.random.PRNGKey(0), z), z)
        >>> q.shape, aux["codes"].shape, bool(aux["perplexity"] == 1.0)
        ((2, 5, 4), (2, 5), True)

    Attributes:
        num_codes: ``K`` (positive).
        features: ``D``, the code width (positive; must equal the last axis of ``z``).
        beta: commitment weight ``β ≥ 0`` (0.25 as van den Oord et al.).
        codebook_init: initialiser of ``[K, D]`` (default uniform ±1/K, as VQ-VAE's code).
    """

    num_codes: int
    features: int
    beta: float = 0.25
    codebook_init: Initializer | None = None

    def setup(self) -> None:
        if self.num_codes < 1 or self.features < 1:
            raise ValueError(f"`num_codes` and `features` must be positive ints; got "
                             f"{self.num_codes} and {self.features}.")
        _check_beta(self.beta)  # here too: decode alone never reaches vq_losses
        k = self.num_codes
        uniform = nn.initializers.uniform(2.0 / k)  # on [-1/K, 1/K) after the shift
        init = self.codebook_init or (lambda key, shape, dtype=jnp.float32:
                                      uniform(key, shape, dtype) - 1.0 / k)
        self.codebook = self.param("codebook", init, (k, self.features))

    def __call__(self, z: Array) -> tuple[Array, dict[str, Array]]:
        q_st, k = quantize(z, self.codebook)
        codebook_loss, commitment_loss = vq_losses(z, self.decode(k), self.beta)
        usage_K = jnp.mean(jax.nn.one_hot(k.reshape(-1), self.num_codes), axis=0)
        entropy = -jnp.sum(usage_K * jnp.log(jnp.where(usage_K > 0, usage_K, 1.0)))
        return q_st, {"codes": k, "codebook_loss": codebook_loss,
                      "commitment_loss": commitment_loss, "loss": codebook_loss + commitment_loss,
                      "perplexity": jnp.exp(entropy)}

    def decode(self, codes: Array) -> Array:
        """The code vectors ``c_k`` of ``codes: int[...]`` -> ``[..., D]``."""
        return jnp.take(self.codebook, codes, axis=0)


def kmeans_codebook(x_NxD: Any, num_codes: int, *, iterations: int = 50,
                    seed: int = 0) -> np.ndarray:
    r"""A ``[K, D]`` float32 codebook by K-means (Lloyd's algorithm), in numpy.

    k-means++ seeding, then each iteration assigns every vector to its nearest code (Bishop (12.38))
    and moves each code to the mean of its vectors (an empty cluster keeps its code). Codes are
    sorted by their first coordinate, so a 1-D codebook (grey levels) is increasing. ``x`` not
    ``[N, D]`` or ``num_codes`` outside ``[1, N]`` is a ``ValueError``.

    Example:
        >>> x = np.array([[0.0], [0.1], [0.9], [1.0]])
        >>> [round(float(v), 2) for v in kmeans_codebook(x, 2).ravel()]
        [0.05, 0.95]
    """
    x = np.asarray(x_NxD, np.float64)
    if x.ndim != 2:
        raise ValueError(f"`x` must be [N, D]; got shape {x.shape}.")
    if not 1 <= num_codes <= len(x):
        raise ValueError(f"`num_codes` must be in [1, N = {len(x)}]; got {num_codes}.")
    rng = np.random.default_rng(seed)
    codes = [x[rng.integers(len(x))]]
    for _ in range(1, num_codes):  # k-means++: sample far from the codes chosen so far
        d2 = np.min(((x[:, None, :] - np.asarray(codes)[None]) ** 2).sum(-1), axis=1)
        p = d2 / d2.sum() if d2.sum() > 0 else np.full(len(x), 1.0 / len(x))
        codes.append(x[rng.choice(len(x), p=p)])
    c = np.asarray(codes)
    for _ in range(iterations):
        k = np.argmin(((x[:, None, :] - c[None]) ** 2).sum(-1), axis=1)
        new = np.array([x[k == j].mean(0) if np.any(k == j) else c[j] for j in range(num_codes)])
        if np.allclose(new, c):
            break
        c = new
    return c[np.argsort(c[:, 0], kind="stable")].astype(np.float32)

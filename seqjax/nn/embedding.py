r"""Embedding lookup ``x_n = E[i_n]`` with a backward pass chosen for the accelerator.

.. math::
    x_n = E_{i_n,:} = \mathbf{1}_{i_n}^\top E, \qquad
    \frac{\partial L}{\partial E} = \sum_n \mathbf{1}_{i_n} g_n^\top = \mathrm{onehot}(i)^\top G,
    \qquad g_n = \frac{\partial L}{\partial x_n}

(J&M (9.6): ``e_t = E x_t`` with one-hot ``x_t``, a row of our ``[V, D]`` table; MEDL (7.28) for
learned positions.) The forward pass is a gather. Autodiff's gradient is a scatter-add of the
``N = B·T`` rows of ``G`` into ``V`` rows: on a GPU, atomic adds that collide when ``V`` is small
(slow; in bf16 value-dependent). The matrix product ``onehot(i)ᵀ G`` (``[V, N] @ [N, D]``, float32
accumulation, ``2·N·V·D`` FLOPs) is fast and deterministic.

:func:`embedding_lookup` picks the backward pass (:data:`BACKWARDS`; all give the same values and
gradients up to float summation order):

* ``"autodiff"`` — ``jnp.take`` differentiated by JAX (a scatter-add in the table's dtype);
* ``"one_hot"`` — the matrix product above;
* ``"scatter"`` — a scatter-add accumulated in float32 (native float atomics on GPUs);
* ``"auto"`` (default) — ``"autodiff"`` on CPU (a scatter is cheap there), ``"one_hot"`` elsewhere
  when ``V ≤ ONE_HOT_MAX_ROWS``, else ``"scatter"`` (e.g. GPT-2's 50,304 rows: few conflicts, and a
  one-hot product would be costly).

Invalid ids (the traced-value policy of :mod:`seqjax._traced_checks`): an id outside ``[0, V)``,
negative ones included (no Python-style wrap-around), reads a row of NaN (the gather's fill mode, no
extra pass) and receives no gradient; the condition is also recorded as a checkify check, an error
under ``seqjax.checked``. Outside ``jit`` the models refuse such ids with a ``ValueError``.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._traced_checks import poison, record_vocab_ids, valid_ids

Array = jax.Array

__all__ = ["BACKWARDS", "ONE_HOT_MAX_ROWS", "Embed", "embedding_lookup", "resolve_backward"]

BACKWARDS = ("auto", "autodiff", "one_hot", "scatter")
# Tables of at most this many rows take the one-hot product (2·N·V·D FLOPs) on accelerators.
ONE_HOT_MAX_ROWS = 2048


def resolve_backward(backward: str, num_rows: int, platform: str | None = None) -> str:
    """The backward pass ``backward`` means for a table of ``num_rows`` on ``platform`` (default:
    JAX's default backend); a name not in :data:`BACKWARDS` is a ``ValueError``."""
    if backward not in BACKWARDS:
        raise ValueError(f"`backward` must be one of {BACKWARDS}; got {backward!r}.")
    if backward != "auto":
        return backward
    if (platform or jax.default_backend()) == "cpu":
        return "autodiff"
    return "one_hot" if num_rows <= ONE_HOT_MAX_ROWS else "scatter"


def _rows(table_VxD: Array, ids: Array) -> Array:
    """``table[ids]``; an id outside ``[0, V)`` (negative too: no wrap-around) reads NaN."""
    return table_VxD.at[ids].get(mode="fill", fill_value=jnp.nan, wrap_negative_indices=False)


def embedding_lookup(table_VxD: Array, ids: Array, *, backward: str = "auto",
                     name: str = "ids") -> Array:
    """``table[ids]`` (shape ``ids.shape + (D,)``) with the backward pass ``backward``.

    An id outside ``[0, V)`` reads a row of NaN and gets no gradient (module docstring; its checkify
    check names ``name``). A table not ``[V, D]`` is a ``ValueError``, non-integer ``ids`` a
    ``TypeError``.

    Example:
        >>> E = jnp.arange(6.0).reshape(3, 2)
        >>> embedding_lookup(E, jnp.array([[2, 0]]), backward="one_hot").tolist()
        [[[4.0, 5.0], [0.0, 1.0]]]
    """
    if table_VxD.ndim != 2:
        raise ValueError(f"`table_VxD` must be [V, D]; got shape {table_VxD.shape}.")
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise TypeError(f"`ids` must be integers; got {ids.dtype}.")
    how = resolve_backward(backward, table_VxD.shape[0])
    record_vocab_ids(ids, name, table_VxD.shape[0])
    return _rows(table_VxD, ids) if how == "autodiff" else _lookup(how, table_VxD, ids)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _lookup(how: str, table_VxD: Array, ids: Array) -> Array:
    return _rows(table_VxD, ids)


def _lookup_fwd(how: str, table_VxD: Array, ids: Array) -> tuple[Array, tuple]:
    # The backward pass needs only the table's row count and dtype: an empty [V, 0] array.
    return _rows(table_VxD, ids), (ids, jnp.zeros((table_VxD.shape[0], 0), table_VxD.dtype))


def _lookup_bwd(how: str, res: tuple, g: Array) -> tuple[Array, None]:
    ids, like_Vx0 = res
    num_rows, dim = like_Vx0.shape[0], g.shape[-1]
    ids_N, g_NxD = ids.reshape(-1), g.reshape(-1, dim)
    if how == "one_hot":
        onehot_NxV = jax.nn.one_hot(ids_N, num_rows, dtype=g.dtype)
        d_VxD = jax.lax.dot_general(onehot_NxV, g_NxD, (((0,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32)
    else:  # "scatter", accumulated in float32
        d_VxD = jnp.zeros((num_rows, dim), jnp.float32).at[ids_N].add(
            g_NxD.astype(jnp.float32), mode="drop", wrap_negative_indices=False)
    return d_VxD.astype(like_Vx0.dtype), None


_lookup.defvjp(_lookup_fwd, _lookup_bwd)


class Embed(nn.Embed):
    """``flax.linen.Embed`` (same attributes, parameter ``embedding [V, D]`` and ``attend``) whose
    lookup runs through :func:`embedding_lookup`, plus ``backward`` (one of :data:`BACKWARDS`). An
    id outside ``[0, num_embeddings)`` reads a row of NaN.

    Example:
        >>> emb, ids = Embed(10, 4), jnp.ones((2, 3), jnp.int32)
        >>> emb.apply(emb.init(jax.random.PRNGKey(0), ids), ids).shape
        (2, 3, 4)
    """

    backward: str = "auto"

    def __call__(self, inputs: Array) -> Array:
        """``int[...] -> [..., features]``: the rows of the table."""
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise TypeError(f"`inputs` must be integer ids; got {inputs.dtype}.")
        (embedding,) = self.promote_dtype(self.embedding, dtype=self.dtype, inexact=False)
        assert embedding is not None  # promote_dtype returns None only for a None input
        if self.num_embeddings == 1:
            record_vocab_ids(inputs, "inputs", 1)
            rows = jnp.broadcast_to(embedding, inputs.shape + (self.features,))
            return poison(rows, valid_ids(inputs, 1))
        return embedding_lookup(embedding, inputs, backward=self.backward, name="inputs")

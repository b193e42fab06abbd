r"""XLA kernels of :func:`seqjax.nn.attention.dot_product_attention` (``implementation="xla"``).

Each equals :func:`~seqjax.nn.attention.dot_product.reference_attention`, the plain-autodiff
``softmax(QKᵀ/√d_k + B + M) V`` (Bishop (12.14); J&M (9.39); LN (9), (13)), in output *and*
gradients (``tests/nn/test_attention_kernels.py``), with the empty-row rule of
:mod:`seqjax.nn.attention.checks`; they differ only in speed. :func:`xla_attention` picks a
sub-path by ``dot_product_attention``'s thresholds:

* **one block** (default): :func:`_attend_block` — heads-first batched GEMMs, GQA without
  repeating K/V, normalising after the value matmul, a hand-written backward pass; outside
  ``jax.grad``, blocks of ≥ ``2·fused_rows`` queries run as select-free ``fused_rows``-row
  chunks that XLA:CPU fuses into one kernel each;
* **causal chunks** (``is_causal``, ``Q ≥ 2·query_chunk``): one block per ``query_chunk``
  queries against the keys they can see, skipping the masked upper triangle;
* **scan** (non-causal, ``K ≥ scan_min_keys``, ``Q ≥ 2·query_chunk``, a key-only mask, no
  bias/dropout/weights): :func:`_scan_attention`, a loop over query chunks that recomputes the
  scores in its backward pass;
* **weights** (``return_weights`` or dropout): the block with the weights written
  (:func:`~seqjax.nn.attention.softmax.softmax_last`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from seqjax.nn.attention.checks import (
    MASKED,
    as_4d,
    row_reciprocal,
    stable_row_max,
    visible_rows,
)
from seqjax.nn.attention.softmax import dropout_weights, softmax_last
from seqjax.nn.masks import combine_masks

Array = jax.Array

# Defaults of dot_product_attention's thresholds of the sub-paths above (CPU timings:
# benchmarks/HISTORY.md). Causal chunks do about half the FLOPs for Q = K; the scan's working
# set is ~chunk·K per head instead of Q·K (FlashAttention's recomputation, without key
# blocking); a fused chunk's scores stay in cache.
QUERY_CHUNK = 128
SCAN_MIN_KEYS = 1024
FUSED_ROWS = 128


def _group(x4: Array | None, hkv: int, groups: int) -> Array | None:
    """``[b, h, q, k]`` (h ∈ {1, H}) -> ``[b, h', g', q, k]`` matching the grouped query layout."""
    if x4 is None:
        return None
    if x4.shape[1] == 1:
        return x4[:, :, None]
    return x4.reshape(x4.shape[0], hkv, groups, *x4.shape[2:])


def _slice_qk(x5: Array | None, q0: int, q1: int, k1: int) -> Array | None:
    """Rows ``q0:q1`` and columns ``:k1`` of a grouped mask/bias (size-1 axes broadcast)."""
    if x5 is None:
        return None
    if x5.ndim < 5:  # a causal block mask alone is [n, K]
        x5 = x5.reshape((1,) * (5 - x5.ndim) + x5.shape)
    if x5.shape[3] != 1:
        x5 = x5[:, :, :, q0:q1]
    if x5.shape[4] != 1:
        x5 = x5[..., :k1]
    return x5


@partial(jax.jit,
         static_argnames=("is_causal", "scale", "dropout_rate", "return_weights", "chunk",
                          "scan_min_keys", "fused_rows"))
def xla_attention(q, k, v, mask, bias, is_causal, scale, dropout_rate, dropout_rng,
                  return_weights, chunk, scan_min_keys, fused_rows):
    """The XLA path (sub-paths: module docstring).

    Heads-first layout (``q [B, G, H/G, Q, D]``, ``k [B, G, K, D]``): both matmuls are plain
    batched GEMMs over ``(B, G)``, and GQA folds a group's ``H/G`` query heads into the GEMM's
    rows instead of repeating K/V.
    """
    b, q_len, h, d = q.shape
    k_len, hkv = k.shape[1], k.shape[2]
    groups = h // hkv
    dv = v.shape[-1]
    q5 = (q * jnp.asarray(scale, q.dtype)).reshape(b, q_len, hkv, groups, d)
    q5 = q5.transpose(0, 2, 3, 1, 4)  # [B, G, H/G, Q, D]
    k4 = k.transpose(0, 2, 1, 3)  # [B, G, K, D]
    v4 = v.transpose(0, 2, 1, 3)  # [B, G, K, Dv]
    mask5, bias5 = (_group(as_4d(x), hkv, groups) for x in (mask, bias))

    def block(q0: int, q1: int, k1: int, rng: Array | None) -> tuple[Array, Array | None]:
        n = q1 - q0
        # The H/G heads of a group and the queries form the rows of one GEMM: [B, G, H/G*n, D].
        qb = q5[:, :, :, q0:q1].reshape(b, hkv, groups * n, d)
        blk_mask = _slice_qk(mask5, q0, q1, k1)
        if is_causal:
            q_pos = jnp.arange(q0, q1, dtype=jnp.int32)[:, None]
            blk_mask = combine_masks(blk_mask, jnp.arange(k1, dtype=jnp.int32)[None, :] <= q_pos)
        blk_bias = _slice_qk(bias5, q0, q1, k1)
        if dropout_rate == 0.0 and not return_weights:
            out = _attend_block(qb, k4[:, :, :k1], v4[:, :, :k1], blk_mask, blk_bias, groups,
                                fused_rows)
            return out.reshape(b, hkv, groups, n, dv), None
        s = jnp.einsum("bhnd,bhkd->bhnk", qb, k4[:, :, :k1], preferred_element_type=jnp.float32)
        s = s.reshape(b, hkv, groups, n, k1)
        if blk_bias is not None:
            s = s + blk_bias.astype(jnp.float32)
        if blk_mask is not None:
            blk_mask = jnp.broadcast_to(blk_mask, s.shape)
        w = dropout_weights(softmax_last(s, blk_mask), dropout_rate, rng)
        out = jnp.einsum("bhnk,bhkd->bhnd", w.reshape(b, hkv, groups * n, k1).astype(v4.dtype),
                         v4[:, :, :k1])
        return out.reshape(b, hkv, groups, n, dv), w

    w = None
    if is_causal and not return_weights and q_len >= 2 * chunk:
        outs = []
        for i, q0 in enumerate(range(0, q_len, chunk)):
            q1 = min(q0 + chunk, q_len)
            rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, i)
            outs.append(block(q0, q1, min(q1, k_len), rng)[0])  # K > 0 (dot_product_attention)
        out5 = jnp.concatenate(outs, axis=3)
    elif (not is_causal and bias5 is None and dropout_rate == 0.0 and not return_weights
          and k_len >= scan_min_keys and q_len >= 2 * chunk
          and (mask5 is None or mask5.shape[3] == 1)):
        pad = -q_len % chunk
        q5p = jnp.pad(q5, ((0, 0),) * 3 + ((0, pad), (0, 0))) if pad else q5
        out5 = _scan_attention(q5p, k4, v4, mask5, chunk)[:, :, :, :q_len]
    else:
        out5, w = block(0, q_len, k_len, dropout_rng)
    out = out5.transpose(0, 3, 1, 2, 4).reshape(b, q_len, h, dv)
    if return_weights:
        assert w is not None  # block returns the weights when return_weights
        return out, w.reshape(b, h, q_len, k_len)
    return out


def _split_q(x: Array, chunk: int) -> Array:
    """``[B, G, g, Q, ...] -> [Q/chunk, B, G, g, chunk, ...]`` (scan-major)."""
    b, h, g, q = x.shape[:4]
    x = x.reshape(b, h, g, q // chunk, chunk, *x.shape[4:])
    return jnp.moveaxis(x, 3, 0)


def _merge_q(x: Array) -> Array:
    """Inverse of :func:`_split_q`."""
    x = jnp.moveaxis(x, 0, 3)
    b, h, g, n, c = x.shape[:5]
    return x.reshape(b, h, g, n * c, *x.shape[5:])


def _scan_scores(q5c: Array, k4: Array, mask5: Array | None) -> Array:
    b, h, g, c, d = q5c.shape
    s = jnp.einsum("bhnd,bhkd->bhnk", q5c.reshape(b, h, g * c, d), k4,
                   preferred_element_type=jnp.float32).reshape(b, h, g, c, -1)
    return s if mask5 is None else s + jnp.where(mask5, 0.0, MASKED)  # see checks


def _scan_pv(w5: Array, x4: Array) -> Array:
    b, h, g, c, k = w5.shape
    out = jnp.einsum("bhnk,bhkd->bhnd", w5.reshape(b, h, g * c, k), x4,
                     preferred_element_type=jnp.float32)
    return out.reshape(b, h, g, c, -1)


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _scan_attention(q5, k4, v4, mask5, chunk):
    """Non-causal attention looped over query chunks; ``q5 [B, G, g, Q, D]`` (scaled), ``mask5``
    broadcasts to ``[B, G, g, 1, K]``. Saves the output and the row log-sum-exp; the backward
    pass recomputes each chunk's weights as ``w = exp(s − lse)``."""
    return _scan_fwd(q5, k4, v4, mask5, chunk)[0]


def _scan_fwd(q5, k4, v4, mask5, chunk):
    # Rows with no visible key (the mask is the same for every query of a head): output 0,
    # and lse = +∞ so that the backward pass's exp(s − lse) is 0 there too.
    keep = None if mask5 is None else visible_rows(mask5)

    def body(_, q5c):
        s = _scan_scores(q5c, k4, mask5)
        m = jnp.max(s, axis=-1, keepdims=True)
        e = jnp.exp(s - m)
        denom = jnp.sum(e, axis=-1, keepdims=True)
        inv = 1.0 / denom if keep is None else row_reciprocal(denom, keep)
        o = _scan_pv(e.astype(v4.dtype), v4) * inv
        lse = m + jnp.log(denom)
        return None, (o, lse if keep is None else jnp.where(keep, lse, jnp.inf))

    _, (o, lse) = jax.lax.scan(body, None, _split_q(q5, chunk))
    o, lse = _merge_q(o), _merge_q(lse)
    return o.astype(v4.dtype), (q5, k4, v4, mask5, o, lse)


def _scan_bwd(chunk, res, do):
    """Backward pass per query chunk, with the scores *transposed* (``[K, n]``).

    ``wᵀ = exp(k qᵀ − lse)``, ``dwᵀ = v doᵀ``, ``dsᵀ = wᵀ ⊙ (dwᵀ − rowsum(do ⊙ o))``; then
    ``dv += wᵀ do``, ``dk += dsᵀ q``, ``dqᵀ = kᵀ dsᵀ`` are all plain ``A·B`` products (``[n, K]``
    scores would make ``dv``/``dk`` ``Aᵀ·B`` products, which XLA:CPU runs on a slower path).
    """
    q5, k4, v4, mask5, o, lse = res
    dsum = jnp.sum(do.astype(jnp.float32) * o, axis=-1, keepdims=True)
    kt4 = jnp.swapaxes(k4, -1, -2)  # [B, G, D, K], once for all chunks
    maskt = None if mask5 is None else jnp.swapaxes(mask5, -1, -2)  # [B, G, g, K, 1]

    def body(carry, xs):
        dk, dv = carry
        q5c, doc, lsec, dsumc = xs
        b, h, g, c, d = q5c.shape
        q4 = q5c.reshape(b, h, g * c, d)
        do4 = doc.reshape(b, h, g * c, -1)
        st = jnp.einsum("bhkd,bhnd->bhkn", k4, q4, preferred_element_type=jnp.float32)
        st = st.reshape(b, h, -1, g, c)
        if maskt is not None:
            st = jnp.where(jnp.moveaxis(maskt, 2, 3), st, -jnp.inf)
        wt = jnp.exp(st - jnp.moveaxis(lsec, -1, 2))  # [B, G, K, g, c]; masked: 0
        wt4 = wt.reshape(b, h, -1, g * c)
        dv = dv + jnp.einsum("bhkn,bhnd->bhkd", wt4.astype(v4.dtype), do4,
                             preferred_element_type=jnp.float32)
        dwt = jnp.einsum("bhkd,bhnd->bhkn", v4, do4, preferred_element_type=jnp.float32)
        dst4 = wt4 * (dwt - dsumc.reshape(b, h, 1, g * c))
        dk = dk + jnp.einsum("bhkn,bhnd->bhkd", dst4.astype(q4.dtype), q4,
                             preferred_element_type=jnp.float32)
        dqt = jnp.einsum("bhdk,bhkn->bhdn", kt4, dst4.astype(kt4.dtype),
                         preferred_element_type=jnp.float32)
        return (dk, dv), jnp.swapaxes(dqt, -1, -2).reshape(b, h, g, c, d)

    init = (jnp.zeros(k4.shape, jnp.float32), jnp.zeros(v4.shape, jnp.float32))
    xs = tuple(_split_q(x, chunk) for x in (q5, do, lse, dsum))
    (dk, dv), dq = jax.lax.scan(body, init, xs)
    return (_merge_q(dq).astype(q5.dtype), dk.astype(k4.dtype), dv.astype(v4.dtype), None)


_scan_attention.defvjp(_scan_fwd, _scan_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attend_block(q4, k4, v4, mask5, bias5, groups, fused_rows):
    """``softmax(q kᵀ + bias, mask) v`` for one block, with a hand-written backward pass.

    ``q4 [B, G, R, D]`` (``R`` = ``groups`` heads × ``n`` queries, pre-scaled), ``k4 [B, G, K, D]``,
    ``v4 [B, G, K, Dv]``; ``mask5``/``bias5`` broadcast to ``[B, G, groups, n, K]``. Normalises
    after the value matmul (``o = (e v) / l``, ``e = exp(s − max)``), never writing the weights;
    backward: ``ds = w ⊙ (dw − rowsum(do ⊙ o))``, ``dv = eᵀ (do / l)``. Two forward forms of
    one function, by what XLA:CPU runs fastest: undifferentiated (this primal), the select-free,
    chunked :func:`_attend_fused`; under ``jax.grad`` (:func:`_attend_fwd`, which also saves
    ``e``), the whole scores masked with ``−∞`` and guarded.
    """
    b, g, r, d = q4.shape
    n = r // groups
    if n < 2 * fused_rows:
        return _attend_fused(q4, k4, v4, mask5, bias5, groups)
    q5 = q4.reshape(b, g, groups, n, d)
    k_len = k4.shape[2]
    outs = []
    for q0 in range(0, n, fused_rows):
        q1 = min(q0 + fused_rows, n)
        qc = q5[:, :, :, q0:q1].reshape(b, g, groups * (q1 - q0), d)
        oc = _attend_fused(qc, k4, v4, _slice_qk(mask5, q0, q1, k_len),
                           _slice_qk(bias5, q0, q1, k_len), groups)
        outs.append(oc.reshape(b, g, groups, q1 - q0, -1))
    return jnp.concatenate(outs, axis=3).reshape(b, g, r, -1)


def _block(q4, k4, v4, mask5, bias5, groups, finite):
    """One block's float32 ``(o, e, 1/l)`` (:func:`_attend_block`); ``finite``: the primal's
    masking, finite unless a bias (which may hold ``−∞``) is given (see checks)."""
    b, g, r, _ = q4.shape
    k_len = k4.shape[2]
    finite = finite and bias5 is None
    s = jnp.einsum("bhnd,bhkd->bhnk", q4, k4, preferred_element_type=jnp.float32)
    keep = None
    if mask5 is not None or bias5 is not None:
        s5 = s.reshape(b, g, groups, r // groups, k_len)
        if bias5 is not None:
            s5 = s5 + bias5.astype(jnp.float32)
        if mask5 is not None and not finite:
            s5 = jnp.where(mask5, s5, -jnp.inf)
        elif mask5 is not None:
            s5 = s5 + jnp.where(mask5, 0.0, MASKED).astype(jnp.float32)
            keep = jnp.broadcast_to(visible_rows(mask5), (b, g, groups, r // groups, 1))
            keep = keep.reshape(b, g, r, 1).astype(jnp.float32)
        s = s5.reshape(b, g, r, k_len)
    if not finite:
        e = jnp.exp(s - stable_row_max(s))
        inv = row_reciprocal(jnp.sum(e, axis=-1, keepdims=True))
    else:
        e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
        denom = jnp.sum(e, axis=-1, keepdims=True)
        inv = 1.0 / denom if keep is None else row_reciprocal(denom, keep)
    o = jnp.einsum("bhnk,bhkd->bhnd", e.astype(v4.dtype), v4,
                   preferred_element_type=jnp.float32) * inv
    return o, e, inv


def _attend_fused(q4, k4, v4, mask5, bias5, groups):
    """The primal's form: additive finite mask, ``keep / l`` for empty rows."""
    return _block(q4, k4, v4, mask5, bias5, groups, finite=True)[0].astype(v4.dtype)


def _attend_fwd(q4, k4, v4, mask5, bias5, groups, fused_rows):
    """The differentiated form: ``−∞`` masking, guarded max and sum; saves ``e`` and ``1/l``."""
    o, e, inv = _block(q4, k4, v4, mask5, bias5, groups, finite=False)
    return o.astype(v4.dtype), (q4, k4, v4, mask5, bias5, e, inv, o)


def _attend_bwd(groups, fused_rows, res, do):
    del fused_rows  # a forward-only option
    q4, k4, v4, mask5, bias5, e, inv, o = res
    do32 = do.astype(jnp.float32)
    dv = jnp.einsum("bhnk,bhnd->bhkd", e.astype(v4.dtype), (do32 * inv).astype(v4.dtype),
                    preferred_element_type=jnp.float32)
    dw = jnp.einsum("bhnd,bhkd->bhnk", do, v4, preferred_element_type=jnp.float32)
    ds = e * inv * (dw - jnp.sum(do32 * o, axis=-1, keepdims=True))
    dq = jnp.einsum("bhnk,bhkd->bhnd", ds.astype(k4.dtype), k4, preferred_element_type=jnp.float32)
    dk = jnp.einsum("bhnk,bhnd->bhkd", ds.astype(q4.dtype), q4, preferred_element_type=jnp.float32)
    dbias = None
    if bias5 is not None:
        b, g, r, k_len = ds.shape
        ds5 = ds.reshape(b, g, groups, r // groups, k_len)
        ds5 = ds5.reshape((1,) * (bias5.ndim - ds5.ndim) + ds5.shape)
        axes = tuple(i for i, n in enumerate(bias5.shape) if n == 1 and ds5.shape[i] != 1)
        dbias = jnp.sum(ds5, axis=axes, keepdims=True).reshape(bias5.shape).astype(bias5.dtype)
    return dq.astype(q4.dtype), dk.astype(k4.dtype), dv.astype(v4.dtype), None, dbias


_attend_block.defvjp(_attend_fwd, _attend_bwd)



r"""Attention: score functions, RNN attention, scaled dot-product and multi-head attention.

Three steps, as in the textbooks:

1. **Scores and weights** ``α = softmax_τ s(z_q, z_k^τ)``, context ``u = Σ_τ α_τ v^τ``
   (MEDL (7.20)–(7.21)): ``scores.py`` (:func:`dot_score`, …, :class:`Attention`
   (Bahdanau/Luong), :func:`simple_self_attention` ``Softmax[XXᵀ]X``: Bishop (12.6),
   J&M (9.30)–(9.33), MEDL (7.23)) and ``softmax.py`` (:func:`masked_softmax`).
2. **Scaled dot-product attention** ``softmax(QKᵀ/√d_k + B + M) V`` (Bishop (12.14);
   J&M (9.39); LN (9), (13)): ``dot_product.py`` (:func:`dot_product_attention`, the reference,
   the kernel table), per-backend kernels ``_xla_kernels.py``, ``_cudnn.py``, ``_pallas.py``,
   and ``checks.py`` (argument checks, the rule for rows with no visible key).
3. **Multi-head attention** (MEDL (7.25)–(7.26); Bishop (12.15)–(12.19); J&M (9.47)–(9.48)):
   ``multi_head.py`` (:class:`MultiHeadAttention`) and ``kv_cache.py`` (:class:`KVCache`).

Conventions: ``…_with_weights`` (functions, :meth:`MultiHeadAttention.with_weights`) return
``(out, weights)``, plain calls the array; row vectors (``Q = X W_q``; Flax kernels are the
transposes of MEDL's ``W``); batch-major ``[B, T, ...]``; boolean masks, ``True`` = attend,
acting on the **scores** (MEDL (7.27) erratum): a masked score is ``-inf``, and a query row with
no visible key gets zero weights and a zero output, never NaN (Bishop Ex. 12.2). Softmax always
runs in float32.
"""

from seqjax.nn.attention.dot_product import (
    dot_product_attention,
    dot_product_attention_with_weights,
)
from seqjax.nn.attention.kv_cache import KVCache
from seqjax.nn.attention.multi_head import MultiHeadAttention
from seqjax.nn.attention.scores import (
    SCORE_FUNCTIONS,
    Attention,
    additive_score,
    concat_score,
    dot_score,
    general_score,
    scaled_dot_score,
    simple_self_attention,
    simple_self_attention_with_weights,
)
from seqjax.nn.attention.softmax import masked_softmax

__all__ = [
    "SCORE_FUNCTIONS",
    "dot_score",
    "scaled_dot_score",
    "general_score",
    "concat_score",
    "additive_score",
    "masked_softmax",
    "Attention",
    "simple_self_attention",
    "simple_self_attention_with_weights",
    "dot_product_attention",
    "dot_product_attention_with_weights",
    "KVCache",
    "MultiHeadAttention",
]

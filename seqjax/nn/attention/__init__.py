r"""Attention: score functions, RNN attention, scaled dot-product and multi-head attention.

The textbooks build attention in three steps, and this package follows them:

1. **Scores and weights** (MEDL (7.20)–(7.21)): a score ``s(z_q, z_k)`` per
   query/key pair, weights ``α = softmax_τ s(z_q, z_k^τ)`` and the context
   ``u = Σ_τ α_τ v^τ`` — ``scores.py`` (:func:`dot_score`, …, the :class:`Attention`
   module, Bahdanau/Luong; :func:`simple_self_attention`, ``Softmax[XXᵀ]X``,
   Bishop (12.6), J&M (9.30)–(9.33), MEDL (7.23), and
   :func:`simple_self_attention_with_weights`, ``(Y, A)``) and ``softmax.py``
   (:func:`masked_softmax`).
2. **Scaled dot-product attention** (Bishop (12.14); J&M (9.39); LN (9), (13)):
   ``softmax(QKᵀ/√d_k + B + M) V`` — ``dot_product.py`` (:func:`dot_product_attention`,
   :func:`dot_product_attention_with_weights` for ``(out, weights)``, the plain-autodiff
   reference and the table of kernels); the kernels live in
   private modules per backend (``_xla_kernels.py``, ``_cudnn.py``, ``_pallas.py``), each
   documented to equal the reference; ``checks.py`` holds the argument checks and the
   rule for rows with no visible key (zeros, never NaN), written once.
3. **Multi-head attention** (MEDL (7.25)–(7.26); Bishop (12.15)–(12.19);
   J&M (9.47)–(9.48)) — ``multi_head.py`` (:class:`MultiHeadAttention`, with GQA,
   QK-norm, RoPE, sliding windows, and without the output matrix MEDL (7.24)) and
   ``kv_cache.py`` (:class:`KVCache`, an explicit per-row cache for decoding).

Conventions: a call returns the array, and a callable named ``…_with_weights`` (a
function, or the method :meth:`MultiHeadAttention.with_weights`) returns the pair
``(out, weights)``; row vectors (``Q = X W_q``; Flax kernels are the transposes of
MEDL's ``W``), batch-major ``[B, T, ...]``, boolean masks with ``True`` =
attend. Masks act on the **scores** (MEDL (7.27) erratum): a masked score is
``-inf``, and a query row with no visible key gets all-zero weights and a zero
output, never NaN (Bishop Ex. 12.2). Softmax always runs in float32.
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

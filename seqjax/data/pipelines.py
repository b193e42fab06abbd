"""Former home of the input pipeline, kept so that ``seqjax.data.pipelines.X`` still imports.

The pipeline now lives in three modules (issue #18.6):

* :mod:`seqjax.data.loading` — load text / translation pairs, tokenise, split datasets;
* :mod:`seqjax.data.batching` — splits, padding, bucketing, packing, LM windows (numpy);
* :mod:`seqjax.data.iterators` — the resumable, host-sharded iterators.

Every name below is the same object as in its new module (and in :mod:`seqjax.data`).
"""

from seqjax.data.batching import (
    bucket_batches,
    pack_sequences,
    packed_attention_mask,
    packed_lm_targets,
    pad_batch,
    random_windows,
    split_arrays,
    split_text,
)
from seqjax.data.iterators import (
    ArrayIterator,
    BatchIterator,
    LMWindowIterator,
    ResumableIterator,
    TBPTTIterator,
    host_shard,
)
from seqjax.data.loading import (
    load_parallel,
    load_text,
    shard_dataset,
    split_dataset,
    tokenize_dataset,
)

__all__ = [
    "host_shard", "load_text", "load_parallel", "tokenize_dataset", "split_dataset", "split_text",
    "split_arrays", "shard_dataset", "random_windows", "pad_batch", "bucket_batches",
    "pack_sequences", "packed_lm_targets", "packed_attention_mask", "ResumableIterator",
    "LMWindowIterator", "TBPTTIterator", "BatchIterator", "ArrayIterator",
]

"""Former home of the input pipeline, kept so that ``seqjax.data.pipelines.X`` still imports.

The pipeline now lives in three modules (issue #18.6):

* :mod:`seqjax.data.loading` — load text / translation pairs, tokenise, split datasets;
* :mod:`seqjax.data.batching` — splits, padding, bucketing, packing, LM windows (numpy);
* :mod:`seqjax.data.iterators` — the resumable, host-sharded iterators.

Every name below is the same object as in its new module (and in :mod:`seqjax.data`).
"""

from seqjax.data import batching, iterators, loading
from seqjax.data.batching import *  # noqa: F403
from seqjax.data.iterators import *  # noqa: F403
from seqjax.data.loading import *  # noqa: F403

__all__ = [*loading.__all__, *batching.__all__, *iterators.__all__]

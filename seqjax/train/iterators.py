"""The iterator protocol of :func:`seqjax.train.fit`, and where its iterators live.

``fit`` accepts any iterator of batches. One with ``get_state() -> dict`` and
``set_state(dict)`` resumes exactly where a checkpoint was taken (``fit`` saves
``get_state()`` with every checkpoint and hands it back on resume); others are
fast-forwarded by skipping the batches already consumed.

seqjax's resumable iterators are one family, :class:`seqjax.data.iterators.ResumableIterator`
(:class:`~seqjax.data.iterators.ArrayIterator`, :class:`~seqjax.data.iterators.LMWindowIterator`,
:class:`~seqjax.data.iterators.TBPTTIterator`, :class:`~seqjax.data.iterators.BatchIterator`);
``seqjax.train.ArrayIterator`` is the same class as ``seqjax.data.ArrayIterator``. It also
accepts the ``{"epoch", "index"}`` states of the ``ArrayIterator`` that used to be defined
here (which took the global batch size; ``ArrayIterator(arrays, global_batch_size)`` without
sharding gives the same batches in the same order).
"""

from seqjax.data.iterators import ArrayIterator, ResumableIterator

__all__ = ["ArrayIterator", "ResumableIterator"]

"""Moved: HellaSwag is one of the downstream tasks of :mod:`seqjax.evals` (``load_task`` reads
``hellaswag_val.jsonl``, ``score_task`` scores it; ``TaskBatches`` and ``make_task_eval`` on a
mesh or in ``fit``)."""

raise ImportError(
    "seqjax.train.hellaswag moved to seqjax.evals: load_hellaswag(path) is "
    "load_task(path), hellaswag_scores(...) is score_task(apply_fn, params, task, encode, "
    "block_size=...)."
)

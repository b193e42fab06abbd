"""HellaSwag moved to :mod:`seqjax.evals` (``load_task``, ``score_task``, ``TaskBatches``,
``make_task_eval``)."""

raise ImportError(
    "seqjax.train.hellaswag moved to seqjax.evals: load_hellaswag(path) is "
    "load_task(path), hellaswag_scores(...) is score_task(apply_fn, params, task, encode, "
    "block_size=...)."
)

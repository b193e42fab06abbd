"""seqjax.train: the training API — losses, optimisers, the sharded step, checkpoints, ``fit``.

One module per concern, each importable alone; this package exports what a training script
uses:

* :mod:`~seqjax.train.step` — :func:`make_train_step` (``jax.jit`` over a mesh, gradient
  accumulation, remat, mixed precision), :class:`TrainStep`, :func:`make_eval_step`;
* :mod:`~seqjax.train.losses`, :mod:`~seqjax.train.tbptt` — LM losses, metrics, truncated BPTT;
* :mod:`~seqjax.train.optim` — :class:`OptimizerConfig`, schedules, :class:`TrainState`;
  :mod:`~seqjax.train.options` — :class:`TrainOptions`, every experiment's shared options;
* :mod:`~seqjax.train.parallel`, :mod:`~seqjax.train.sharding` — :class:`Parallel` (mesh,
  layout, batch placement), sharding rules, :func:`host_value` (the one host fetch);
* :mod:`~seqjax.train.checkpoint` — atomic, resumable checkpoints;
* :mod:`~seqjax.train.loop` — :func:`fit`; :mod:`~seqjax.train.records` (metrics, plots,
  TensorBoard, ``run.json``), :mod:`~seqjax.train.preemption` (signals, multi-host checks),
  :mod:`~seqjax.train.flops` (model FLOPs, peak FLOPs), :mod:`~seqjax.train.workdir_lock`
  (:class:`WorkdirBusyError`), :mod:`~seqjax.train.write_errors` (:class:`WriteError`).

Import anything else from its module, e.g. ``from seqjax.train.sharding import shard_batch``.
"""

from seqjax.train.checkpoint import (
    Checkpointer,
    CheckpointMismatchError,
    load_meta,
    load_tokenizer_json,
    restore_params,
)
from seqjax.train.flops import lm_flops_per_token
from seqjax.train.loop import FitConfig, FitResult, ResumeError, evaluate, fit
from seqjax.train.losses import (
    bits_per_char,
    make_lm_eval,
    make_lm_loss,
    masked_cross_entropy,
    nll_to_perplexity,
    perplexity,
    token_accuracy,
    token_cross_entropy,
)
from seqjax.train.optim import (
    OptimizerConfig,
    TrainState,
    freeze,
    make_optimizer,
    make_schedule,
    trainable_mask,
)
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import LayoutError, Parallel, ParallelOptions
from seqjax.train.records import NonFiniteLossError, read_metrics
from seqjax.train.sharding import host_value, make_mesh
from seqjax.train.step import (
    TrainStep,
    create_train_state,
    flax_apply_fn,
    make_eval_step,
    make_train_step,
)
from seqjax.train.tbptt import make_tbptt_loss, reset_carry
from seqjax.train.workdir_lock import WorkdirBusyError
from seqjax.train.write_errors import WriteError

__all__ = [
    # the loop
    "fit", "FitConfig", "FitResult", "ResumeError", "evaluate", "NonFiniteLossError",
    "read_metrics", "WorkdirBusyError", "WriteError",
    # the step
    "make_train_step", "TrainStep", "make_eval_step", "create_train_state", "flax_apply_fn",
    "TrainState",
    # losses and metrics
    "make_lm_loss", "make_lm_eval", "masked_cross_entropy", "token_cross_entropy",
    "token_accuracy", "perplexity", "nll_to_perplexity", "bits_per_char", "make_tbptt_loss",
    "reset_carry", "lm_flops_per_token",
    # optimisers
    "OptimizerConfig", "make_optimizer", "make_schedule", "freeze", "trainable_mask",
    "TrainOptions",
    # devices
    "Parallel", "ParallelOptions", "LayoutError", "make_mesh", "host_value",
    # checkpoints
    "Checkpointer", "CheckpointMismatchError", "restore_params", "load_meta",
    "load_tokenizer_json",
]

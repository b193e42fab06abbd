"""seqjax.train: losses, optimisers, sharded train steps, checkpoints, the fit loop, TBPTT."""

from seqjax.train.checkpoint import (
    Checkpointer,
    CheckpointMismatchError,
    CheckpointWarning,
    load_meta,
    load_tokenizer_json,
    restore_params,
)
from seqjax.train.config import ConfigError, apply_overrides, config_from_dict, parse_overrides
from seqjax.train.flops import (
    lm_flops_per_token,
    peak_flops_per_device,
    transformer_flops_per_token,
)
from seqjax.train.iterators import ArrayIterator
from seqjax.train.loop import FitConfig, FitResult, evaluate, fit, host_value
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
    DEFAULT_NO_DECAY,
    OptimizerConfig,
    TrainState,
    constant_schedule,
    decay_mask,
    freeze,
    inverse_sqrt_schedule,
    linear_schedule,
    make_optimizer,
    make_schedule,
    trainable_mask,
    warmup_cosine_schedule,
)
from seqjax.train.parallel import Parallel, ParallelOptions, parse_mesh
from seqjax.train.records import NonFiniteLossError, plot_curves, read_metrics, write_run_info
from seqjax.train.sharding import (
    TENSOR_PARALLEL_RULES,
    batch_sharding,
    distributed_requested,
    host_batch_slice,
    make_mesh,
    maybe_initialize_distributed,
    partition_spec,
    process_data_shard,
    replicated,
    shard_batch,
    shard_global_batch,
    tree_shardings,
)
from seqjax.train.step import (
    TrainStep,
    cast_floating,
    create_train_state,
    flax_apply_fn,
    make_eval_step,
    make_pmap_train_step,
    make_train_step,
    pmap_replicate,
    pmap_unreplicate,
    split_for_pmap,
)
from seqjax.train.tbptt import StreamChunkIterator, make_streams, make_tbptt_loss, reset_carry

__all__ = [
    "ArrayIterator", "CheckpointMismatchError", "CheckpointWarning", "Checkpointer", "ConfigError",
    "DEFAULT_NO_DECAY", "FitConfig", "FitResult", "NonFiniteLossError", "OptimizerConfig",
    "Parallel", "ParallelOptions", "distributed_requested", "host_value", "parse_mesh",
    "process_data_shard", "shard_global_batch", "write_run_info",
    "StreamChunkIterator", "TENSOR_PARALLEL_RULES", "TrainState", "apply_overrides",
    "batch_sharding",
    "bits_per_char", "cast_floating", "config_from_dict", "constant_schedule",
    "create_train_state", "decay_mask", "evaluate", "fit", "flax_apply_fn", "host_batch_slice",
    "freeze", "trainable_mask",
    "inverse_sqrt_schedule", "linear_schedule", "load_meta", "load_tokenizer_json",
    "make_eval_step",
    "lm_flops_per_token", "make_lm_eval", "make_lm_loss", "make_mesh", "make_optimizer",
    "make_pmap_train_step",
    "make_schedule", "make_streams", "make_tbptt_loss", "make_train_step", "TrainStep",
    "masked_cross_entropy",
    "maybe_initialize_distributed", "nll_to_perplexity", "parse_overrides", "partition_spec",
    "peak_flops_per_device", "perplexity", "plot_curves", "pmap_replicate", "pmap_unreplicate",
    "read_metrics", "replicated", "reset_carry", "restore_params", "shard_batch",
    "split_for_pmap", "token_accuracy", "token_cross_entropy",
    "transformer_flops_per_token", "tree_shardings", "warmup_cosine_schedule",
]


# Names that meant something else here than in the rest of seqjax (issue #18.3); they keep
# working for a while, with a DeprecationWarning that names the new spelling.
_RENAMED = {"TBPTTIterator": ("StreamChunkIterator", StreamChunkIterator),
            "load_tokenizer": ("load_tokenizer_json", load_tokenizer_json)}


def __getattr__(name: str):
    if name in _RENAMED:
        import warnings

        new, value = _RENAMED[name]
        warnings.warn(f"seqjax.train.{name} is now seqjax.train.{new}.", DeprecationWarning,
                      stacklevel=2)
        return value
    raise AttributeError(f"module 'seqjax.train' has no attribute {name!r}")

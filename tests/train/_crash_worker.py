"""A tiny training run used by the fault-tolerance tests (in-process and as a subprocess).

``python -m tests.train._crash_worker WORKDIR STEPS`` trains ``TinyLM`` (LSTM with
dropout, so the RNG state matters) on shuffled synthetic data (so the iterator position
matters) with AdamW + warmup-cosine + clipping, data-parallel over 2 devices,
evaluating every 4 steps and checkpointing every 3 steps asynchronously; it prints
``step N`` for every logged step (all of them) and sleeps a little so that a parent
process can kill it mid-run.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.data.iterators import ArrayIterator
from seqjax.train.loop import FitConfig, FitResult, fit
from seqjax.train.losses import make_lm_eval, make_lm_loss
from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer
from seqjax.train.sharding import batch_sharding, make_mesh, shard_batch, tree_shardings
from seqjax.train.step import flax_apply_fn, make_eval_step, make_train_step
from tests.train._tiny_lm import TinyLM

VOCAB, T, N, BATCH, STEPS = 13, 6, 40, 4, 12
MODEL = TinyLM(vocab_size=VOCAB, embed_dim=8, hidden=12, dropout=0.2)


def data() -> ArrayIterator:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(N, T + 1)).astype(np.int32)
    return ArrayIterator({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}, BATCH, seed=1)


def eval_batches() -> list[dict]:
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, VOCAB, size=(2, BATCH, T + 1)).astype(np.int32)
    return [{"inputs": t[:, :-1], "targets": t[:, 1:]} for t in tokens]


@functools.cache
def _setup() -> tuple:
    """Mesh, initial state (host copy), shardings and jitted steps — built once per process."""
    mesh = make_mesh(data=2, devices=jax.devices()[:2])
    tx, schedule = make_optimizer(OptimizerConfig(
        name="adamw", learning_rate=3e-2, schedule="warmup_cosine", warmup_steps=3, steps=STEPS,
        weight_decay=0.01, clip_norm=1.0,
    ))
    # Random parameters drawn with numpy in the model's layout (no init compile).
    shapes = jax.eval_shape(MODEL.init, jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(
        lambda x: (0.3 * rng.normal(size=x.shape)).astype(x.dtype), shapes["params"])
    state = TrainState.create(params, tx, jax.random.PRNGKey(0))
    shardings = tree_shardings(state, mesh, "replicated")
    step = make_train_step(
        make_lm_loss(flax_apply_fn(MODEL)), state_sharding=shardings,
        batch_sharding=batch_sharding(mesh), schedule=schedule,
    )
    evaluate = make_eval_step(make_lm_eval(flax_apply_fn(MODEL)),
                              params_sharding=shardings.params, batch_sharding=batch_sharding(mesh))
    return mesh, jax.device_get(state), shardings, step, evaluate


def train(
    workdir: str,
    *,
    logs: bool = False,
    hooks: Sequence[Callable[[dict], None]] = (),
    **fit_options: Any,
) -> FitResult:
    """The run in ``workdir``; ``fit_options`` replace fields of its :class:`FitConfig`."""
    mesh, host_state, shardings, step, evaluate = _setup()
    options = dict(steps=STEPS, log_every=1, eval_every=4, checkpoint_every=3,
                   keep_checkpoints=2, progress=False, tensorboard=logs, plot=logs)
    return fit(
        jax.device_put(host_state, shardings), step, data(),
        FitConfig(**{**options, **fit_options}),
        workdir=workdir,
        eval_step=evaluate,
        eval_data=eval_batches,
        place_batch=lambda b: shard_batch(b, mesh),
        model_config={"vocab": VOCAB, "hidden": 12},
        hooks=hooks,
    )


def _announce(record: dict) -> None:
    print(f"step {record['step']}", flush=True)
    time.sleep(0.1)  # slow enough for the parent to kill it mid-run


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "highest")  # as tests/conftest.py
    result = train(sys.argv[1], hooks=[_announce])
    print(f"done {result.status} from {result.start_step}", flush=True)

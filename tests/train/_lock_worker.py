"""A tiny ``fit`` run for the work-dir lock tests, run as a subprocess.

``python -m tests.train._lock_worker WORKDIR GATE`` trains a one-parameter model for
``STEPS`` steps in ``WORKDIR``, printing ``step N`` for every logged step; after the first
it waits (at most a minute) until the file ``GATE`` exists, so that the parent can start a
second run while this one holds the work dir. A work dir held by another run exits 2 with
the error's one line, as ``seqjax train`` does.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from seqjax.data.iterators import ArrayIterator
from seqjax.train.loop import FitConfig, fit
from seqjax.train.step import create_train_state, make_train_step
from seqjax.train.workdir_lock import WorkdirBusyError

STEPS = 6


def loss_fn(params: dict, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
    return jnp.mean((params["w"] * batch["x"] - 1.0) ** 2), {}


def train(workdir: str, gate: str | None = None) -> None:
    state, _ = create_train_state(lambda r: {"w": jnp.zeros(())}, optax.sgd(0.1),
                                  jax.random.PRNGKey(0))

    def hook(record: dict) -> None:
        print(f"step {record['step']}", flush=True)
        if gate is not None and record["step"] == 1:
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.05)

    fit(state, make_train_step(loss_fn), ArrayIterator({"x": np.ones((4,), np.float32)}, 2),
        FitConfig(steps=STEPS, log_every=1, checkpoint_every=2, progress=False,
                  tensorboard=False, plot=False, handle_signals=False),
        workdir=workdir, hooks=[hook])


if __name__ == "__main__":
    try:
        train(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    except WorkdirBusyError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    print("done", flush=True)

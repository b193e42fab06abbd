"""What every experiment shares: the machine, the command line, results files, the training wiring.

An experiment (``seqjax/experiments/NAME.py``) is a recipe: it builds its data and models
and calls downward into :mod:`seqjax.train`; what more than one recipe needs lives here,
written once, and no experiment imports another. The pipelines that some recipes share have
kit modules of their own: :mod:`~seqjax.experiments._text` (the character LM on Tiny
Shakespeare), :mod:`~seqjax.experiments._seq2seq` (sentence pairs and the seq2seq models),
:mod:`~seqjax.experiments._images` (digits as raster-order codes for a transformer LM).

* **Provenance** — :func:`machine_info` (:func:`seqjax.utils.machine_info`, the one probe
  of the CPU, cores, load and backend), :func:`machine` (the same, one line for a results
  file), :func:`load_average`,
  :func:`command_line` (``python -m seqjax.experiments.NAME`` with the options that differ
  from the defaults).
* **Results files** — :func:`write_results` (the markdown, figures and JSON summary in the
  work dir and the results folder), :func:`write_json` (:func:`seqjax._io.write_json`,
  atomic), :func:`mean_sd`.
* **Devices** — :func:`pad_rows` (an evaluation set split over the mesh's batch shards,
  padded with rows that weigh zero), :func:`host_rows` (this process's rows of a global
  batch), :func:`write_run_info` (``run.json``).
* **Training wiring** — :func:`init_state` (the optimiser and the sharded ``TrainState``)
  and :func:`fit_arrays` (``fit`` over a dict of arrays through a resumable, host-sharded
  :class:`~seqjax.data.iterators.ArrayIterator`, with the step and evaluation step laid
  out on the mesh): the ~15 lines each recipe used to write; :func:`train_classifier` on
  top of them (cross-entropy, AdamW with warm-up and cosine decay, test accuracy).

On one device :func:`pad_rows` and :func:`host_rows` return their input unchanged, so a
single-device result is what it was before the experiments ran on a mesh.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from seqjax._io import write_atomic, write_json
from seqjax.data.iterators import ArrayIterator
from seqjax.train.loop import FitConfig, FitResult, fit
from seqjax.train.losses import masked_cross_entropy, token_accuracy
from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer
from seqjax.train.parallel import Parallel
from seqjax.train.records import write_run_info as _write_run_info
from seqjax.train.sharding import host_batch_slice
from seqjax.utils import machine_info

__all__ = [
    "machine_info", "machine", "load_average", "command_line", "write_json", "write_results",
    "mean_sd",
    "pad_rows", "host_rows", "write_run_info", "init_state", "fit_arrays", "train_classifier",
]


# ----------------------------------------------------------------------------- provenance
def machine() -> str:
    """:func:`machine_info` as one line: ``"CPU, N cores; jax V on BACKEND (KIND)"``."""
    info = machine_info()
    return (f"{info['cpu']}, {info['cores']} cores; jax {info['jax']} on "
            f"{info['jax_backend']} ({info['device_kind']})")


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, or ``"n/a"``."""
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def command_line(name: str, cfg: Any) -> str:
    """``python -m seqjax.experiments.NAME`` with the options that differ from ``Config()``.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Config:
        ...     steps: int = 10
        ...     sizes: tuple[int, ...] = (1, 2)
        >>> command_line("toy", Config(steps=5, sizes=(3, 4)))
        'python -m seqjax.experiments.toy --steps=5 --sizes=3,4'
    """
    default = type(cfg)()
    opts = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if v != getattr(default, f.name):
            if isinstance(v, tuple):
                v = ",".join(str(x) for x in v)
            opts.append(f"--{f.name}={v}")
    return " ".join([f"python -m seqjax.experiments.{name}", *opts])


# ----------------------------------------------------------------------------- results files
def write_results(name: str, cfg: Any, markdown: str, summary: Mapping[str, Any], *,
                  plot: Callable[[str], Any] | None = None) -> list[str]:
    """An experiment's outputs, written by process 0: ``NAME.md`` (and the figures,
    ``plot(folder)``) in ``cfg.workdir`` and ``cfg.results_dir`` (those that are set), and
    the summary as ``NAME.json`` in the work dir. Returns the folders written."""
    if jax.process_index() != 0:
        return []
    folders = list(dict.fromkeys(d for d in (getattr(cfg, "workdir", None),
                                             getattr(cfg, "results_dir", None)) if d))
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
        if plot is not None:
            plot(folder)
        write_atomic(os.path.join(folder, f"{name}.md"), markdown)
        if folder == getattr(cfg, "workdir", None):
            write_json(os.path.join(folder, f"{name}.json"), summary)
    return folders


def mean_sd(xs: Sequence[float]) -> str:
    """``"m ± sd"`` (sample sd; ``"m"`` for one value), three decimals.

    Example:
        >>> mean_sd([1.0, 2.0, 3.0]), mean_sd([0.5])
        ('2.000 ± 1.000', '0.500')
    """
    xs = [float(x) for x in xs]
    m = float(np.mean(xs))
    return f"{m:.3f}" if len(xs) < 2 else f"{m:.3f} ± {float(np.std(xs, ddof=1)):.3f}"


# ----------------------------------------------------------------------------- devices
def pad_rows(batch: Mapping[str, Any], multiple: int,
             fill: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``batch`` with rows appended until its leading size is a multiple of ``multiple``.

    An evaluation batch is a *global* batch (every process holds it) whose rows are split
    over the mesh's ``data·fsdp`` batch shards; a held-out set whose size does not divide
    is padded. The new rows copy row 0, then take ``fill[key]`` in each key ``fill`` names —
    the values that make the evaluation ignore them (``{"mask": False}``; a length of 1 …).
    A batch that already divides is returned as it is.

    Example:
        >>> b = pad_rows({"x": np.arange(3), "mask": np.ones(3, bool)}, 4, {"mask": False})
        >>> b["x"].tolist(), b["mask"].tolist()
        ([0, 1, 2, 0], [True, True, True, False])
    """
    n = len(next(iter(batch.values())))
    extra = -n % multiple
    if not extra:
        return dict(batch)
    missing = [k for k in fill if k not in batch]
    if missing:
        raise ValueError(f"`fill` names {missing}, which are not keys of the batch "
                         f"({sorted(batch)}).")
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        pad = np.repeat(v[:1], extra, axis=0)
        if k in fill:
            pad[...] = fill[k]
        out[k] = np.concatenate([v, pad])
    return out


def host_rows(par: Parallel, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The rows of the global ``batch`` that this process feeds (all of them on one
    process), for ``fit(..., parallel=par)``, which places a process's rows; for the
    experiments that draw every batch from the same seeded stream on every process."""
    n = len(next(iter(batch.values())))
    rows = host_batch_slice(n, par.mesh)
    return {k: np.asarray(v)[rows] for k, v in batch.items()}


def write_run_info(par: Parallel, workdir: str | None) -> None:
    """``workdir/run.json``: the devices, processes and mesh (process 0 writes it) — for a
    work dir whose training runs write theirs one level down (one ``fit`` per model and
    seed) or nowhere."""
    if workdir:
        _write_run_info(workdir, par)


# ----------------------------------------------------------------------------- training
def init_state(par: Parallel, params: Any, optimizer: OptimizerConfig,
               key: jax.Array) -> tuple[TrainState, optax.Schedule]:
    """``(state, schedule)``: the optimiser of ``optimizer`` and a ``TrainState`` of
    ``params`` laid out on ``par``'s mesh (``key`` is the state's dropout key)."""
    tx, schedule = make_optimizer(optimizer)
    return par.shard_state(TrainState.create(params, tx, key)), schedule


def fit_arrays(
    par: Parallel,
    state: TrainState,
    loss_fn: Callable[..., Any],
    arrays: Mapping[str, np.ndarray],
    config: FitConfig,
    *,
    batch_size: int,
    seed: int,
    schedule: optax.Schedule | None = None,
    eval_fn: Callable[..., Any] | None = None,
    eval_data: Any = None,
    workdir: str | None = None,
    model_config: Mapping[str, Any] | None = None,
    **fit_kwargs: Any,
) -> FitResult:
    """:func:`~seqjax.train.loop.fit` over the rows of ``arrays`` on ``par``'s devices.

    Global batches of ``batch_size`` rows (checked against the mesh) are drawn by a seeded,
    resumable :class:`~seqjax.data.iterators.ArrayIterator` of this process's share; the
    train step is ``par.train_step(loss_fn, schedule=schedule)`` and, with ``eval_fn``, the
    evaluation step ``par.eval_step(eval_fn)`` over ``eval_data``. Other keywords go to
    ``fit``.
    """
    par.check_batch_size(batch_size)
    batches = ArrayIterator(dict(arrays), par.local_batch_size(batch_size), seed=seed,
                            **par.iterator_shard())
    eval_step = None if eval_fn is None else par.eval_step(eval_fn)
    return fit(state, par.train_step(loss_fn, schedule=schedule), batches, config,
               workdir=workdir, eval_step=eval_step, eval_data=eval_data,
               model_config=None if model_config is None else dict(model_config),
               parallel=par, **fit_kwargs)


def train_classifier(model: Any, train: dict[str, np.ndarray], test: dict[str, np.ndarray],
                     cfg: Any, seed: int, workdir: str | None, model_config: dict,
                     par: Parallel) -> tuple[Any, float, float, list[dict]]:
    """A classifier of ``train["x"] -> train["y"]`` trained by cross-entropy on ``par``'s
    devices (AdamW, linear warm-up then cosine decay), the whole ``test`` set evaluated as one
    global batch at the end; returns the parameters (a host copy), the test accuracy, the
    seconds and the logged records.

    ``cfg`` gives ``learning_rate``, ``warmup_steps``, ``steps``, ``weight_decay``,
    ``clip_norm``, ``batch_size``, ``log_every`` and ``progress`` (the ``digits`` and
    ``audio`` experiments' ``Config``); the parameters are drawn from ``seed``, the state's
    dropout key from ``seed + 1000``.
    """
    params = jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.asarray(train["x"][:1]))["params"]
    opt = OptimizerConfig(
        "adamw", learning_rate=cfg.learning_rate, schedule="warmup_cosine",
        warmup_steps=min(cfg.warmup_steps, cfg.steps - 1), total_steps=cfg.steps,
        end_lr_ratio=0.0, weight_decay=cfg.weight_decay, clip_norm=cfg.clip_norm)
    state, schedule = init_state(par, params, opt, jax.random.PRNGKey(seed + 1000))

    def loss_fn(p: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
        logits = model.apply({"params": p}, batch["x"])
        acc = jnp.mean(jnp.argmax(logits, -1) == batch["y"])
        return masked_cross_entropy(logits, batch["y"]), {"accuracy": acc}

    def eval_fn(p: Any, batch: dict) -> dict:
        logits = model.apply({"params": p}, batch["x"])
        keep = batch["mask"]  # False on the rows that pad the test set to the mesh
        return {"loss": masked_cross_entropy(logits, batch["y"], keep),
                "accuracy": token_accuracy(logits, batch["y"], keep),
                "tokens": jnp.sum(keep).astype(jnp.float32)}

    # The whole test set is one global evaluation batch, padded to split over the devices.
    test = pad_rows({**test, "mask": np.ones(len(test["y"]), bool)}, par.batch_shards,
                    {"mask": False})
    batch_size = min(cfg.batch_size, len(train["y"]))
    par.check_batch_size(batch_size)
    start = time.perf_counter()
    result = fit_arrays(
        par,
        state,
        loss_fn,
        train,
        FitConfig(num_steps=cfg.steps, log_every=cfg.log_every, checkpoint_every=0,
                  best_metric=None, progress=cfg.progress, tensorboard=False,
                  plot=workdir is not None),
        batch_size=batch_size,
        seed=seed,
        schedule=schedule,
        workdir=workdir,
        eval_fn=eval_fn,
        eval_data=[test],
        model_config=model_config,
    )
    return (par.gather(result.state.params), float(result.eval_metrics["eval/accuracy"]),
            time.perf_counter() - start, result.history)

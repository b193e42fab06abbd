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
* **Training** — a recipe's ``build(cfg)`` returns a :class:`Task`: its runs (each a :class:`Run`:
  model, initial parameters, loss, data, optimiser, ``FitConfig``, evaluation) and the
  hooks of its results (``summarize``, ``report``, ``files``; a run's own ``evaluate``).
  :func:`train` is the one path that trains it: for each run the sharded state
  (:func:`init_state`), the train and evaluation steps on the mesh, ``fit`` (a dict of
  arrays through a resumable, host-sharded :class:`~seqjax.data.iterators.ArrayIterator`),
  the final evaluation, giving a :class:`Trained`; then the summary (provenance + the
  recipe's figures) and :func:`write_results`. A recipe's ``run(cfg)`` is
  ``train(build(cfg), cfg)``. :func:`classifier_run` builds the run of a classifier
  (cross-entropy, AdamW with warm-up and cosine decay, test accuracy).

On one device :func:`pad_rows` and :func:`host_rows` return their input unchanged, so a
single-device result is what it was before the experiments ran on a mesh.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from seqjax._io import write_atomic, write_json
from seqjax.data.iterators import ArrayIterator
from seqjax.train.loop import FitConfig, FitResult, fit
from seqjax.train.loop import evaluate as evaluate_batches
from seqjax.train.losses import masked_cross_entropy, token_accuracy
from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer
from seqjax.train.parallel import Parallel
from seqjax.train.records import NonFiniteLossError, read_metrics
from seqjax.train.records import write_run_info as _write_run_info
from seqjax.train.sharding import host_batch_slice
from seqjax.utils import count_params, machine_info

#: A run's optimiser: a config, or an optax transformation built with its schedule.
Optimizer = OptimizerConfig | tuple[optax.GradientTransformation, optax.Schedule]

__all__ = [
    "machine_info", "machine", "load_average", "command_line", "write_json", "write_results",
    "mean_sd", "pad_rows", "host_rows", "write_run_info", "init_state", "compiled_with",
    "Optimizer", "Run", "Trained", "Task", "train", "train_run", "logged_seconds",
    "classifier_run",
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
    """``python -m seqjax.experiments.NAME`` with the options that differ from ``Config()`` (a
    group's as ``--model.KEY=VALUE``).

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Config:
        ...     steps: int = 10
        ...     sizes: tuple[int, ...] = (1, 2)
        >>> command_line("toy", Config(steps=5, sizes=(3, 4)))
        'python -m seqjax.experiments.toy --steps=5 --sizes=3,4'
    """
    return " ".join([f"python -m seqjax.experiments.{name}", *_changed(cfg, type(cfg)(), "")])


def _changed(cfg: Any, default: Any, prefix: str) -> list[str]:
    """``--key=value`` of each option of ``cfg`` that differs from ``default``'s."""
    opts = []
    for f in dataclasses.fields(cfg):
        v, d = getattr(cfg, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            opts += _changed(v, d, f"{prefix}{f.name}.")
        elif v != d:
            v = ",".join(map(str, v)) if isinstance(v, tuple) else v
            opts.append(f"--{prefix}{f.name}={v}")
    return opts


# ----------------------------------------------------------------------------- results files
def write_results(name: str, cfg: Any, markdown: str | None, summary: Mapping[str, Any], *,
                  plot: Callable[[str], Any] | None = None) -> list[str]:
    """An experiment's outputs, written by process 0: ``NAME.md`` (unless ``markdown`` is
    ``None``) and the figures (``plot(folder)``) in ``cfg.workdir`` and ``cfg.results_dir``
    (those that are set), and the summary as ``NAME.json`` in the work dir. Returns the
    folders written."""
    if jax.process_index() != 0:
        return []
    folders = list(dict.fromkeys(d for d in (getattr(cfg, "workdir", None),
                                             getattr(cfg, "results_dir", None)) if d))
    for folder in folders:
        os.makedirs(folder, exist_ok=True)
        if plot is not None:
            plot(folder)
        if markdown is not None:
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
def init_state(par: Parallel, params: Any, optimizer: Optimizer, key: jax.Array, *,
               carry: Any = None) -> tuple[TrainState, optax.Schedule]:
    """``(state, schedule)``: the optimiser of ``optimizer`` (an :class:`OptimizerConfig`, or
    an optax transformation already built with its schedule) and a ``TrainState`` of
    ``params`` (and ``carry``) laid out on ``par``'s mesh (``key`` is the state's dropout
    key)."""
    tx, schedule = (make_optimizer(optimizer) if isinstance(optimizer, OptimizerConfig)
                    else optimizer)
    return par.shard_state(TrainState.create(params, tx, key, carry=carry)), schedule


def compiled_with(step: Callable[..., Any],
                  options: Mapping[str, Any] | None) -> Callable[..., Any]:
    """``step`` (a jitted function) compiled with the XLA compiler ``options`` at its first
    call (e.g. ``{"xla_backend_optimization_level": 0}``: faster compiles, slower steps);
    ``step`` itself without options."""
    if not options:
        return step
    compiled: dict[str, Any] = {}

    def call(*args: Any) -> Any:
        if "fn" not in compiled:
            compiled["fn"] = step.lower(*args).compile(compiler_options=dict(options))
        return compiled["fn"](*args)

    return call


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a recipe: what :func:`train` needs to fit one model.

    Attributes:
        model: the Flax module (for the recipe's hooks; ``train`` reads only ``params``).
        params: the initial parameters (a host copy, the same on every process).
        loss_fn: ``(params, batch, rng) -> (loss, metrics)``, laid out on the mesh by
            ``par.train_step``.
        data: the training batches: a dict of arrays, whose rows a seeded, resumable
            :class:`~seqjax.data.iterators.ArrayIterator` draws (this process's share of
            every global batch), or a function of the :class:`Parallel` that returns
            ``fit``'s ``train_data`` (an iterator, ``f(i) -> batch``, a device source).
        optimizer: the optimiser and its schedule: an :class:`OptimizerConfig`, or an
            optax transformation already built with its schedule, ``(tx, schedule)``.
        fit: how ``fit`` runs (steps, logging, checkpoints, ``flops_per_step``, ...).
        batch_size: rows of every global batch (checked against the mesh first); ``None``
            when ``data`` is a function that sizes the batches to the mesh itself.
        seed: the batch order of a dict ``data``; the state's dropout key too, unless
            ``dropout_seed`` is given.
        dropout_seed: the seed of the state's dropout key, or the key itself; ``None`` =
            ``seed``.
        carry: the state's initial carry (truncated BPTT: the RNN state carried from batch to
            batch; with ``step_options={"with_carry": True}``).
        step_options: more keywords of the train step (``par.train_step``).
        eval_fn: ``(params, batch) -> metrics``, laid out on the mesh by ``par.eval_step``;
            with ``eval_data``, evaluated by ``fit`` (every ``fit.eval_every`` steps and at
            the end) and by :meth:`Trained.evaluate`.
        eval_data: a list of global evaluation batches, or a function of the
            :class:`Parallel` that returns one.
        evals: more evaluations ``fit`` runs with ``eval_fn``'s, ``{name: (eval_fn,
            eval_data)}`` (``eval_data`` as above; each ``eval_fn`` laid out as ``eval_fn``),
            their metrics named ``<name>/<metric>`` (e.g. :mod:`seqjax.evals`' tasks).
        make_eval_step: builds the evaluation step from the :class:`Parallel`, instead of
            ``par.eval_step(eval_fn)`` (e.g. one that evaluates on the host): ``(params,
            batch) -> metrics``, given the ``eval_data`` batches as they are (not placed on
            the devices).
        wrap_eval_step: ``(eval_step, par) -> eval_step``: what ``fit`` evaluates with
            instead (e.g. a step that also keeps the parameters of the best evaluation —
            early stopping); :meth:`Trained.evaluate` uses the step unwrapped.
        compute_dtype: the steps' compute dtype (``None`` = the parameters').
        compiler_options: XLA options the train and evaluation steps compile with
            (:func:`compiled_with`; one step per call); ``None`` = the defaults.
        on_log: called with every logged record (``fit``'s ``hooks``).
        model_config: saved with the checkpoints and checked when they are restored.
        tokenizer: saved with the checkpoints and as ``tokenizer.json`` in the run's folder
            (an object with ``to_json()`` and ``save(path)``).
        check_batch: ``fit``'s check of every host batch before it is placed (e.g.
            ``make_batch_check(vocab_size)``: an out-of-vocabulary id is a ``ValueError``);
            ``None`` = none (data whose ids were checked once, where it was made).
        name: the run's folder under the work dir (runs of a multi-run recipe);
            ``""`` = the work dir itself.
        writes: ``False``: the run writes nothing (no folder, checkpoint or
            ``metrics.jsonl``; a rerun trains it again) — for the many short runs of a
            recipe whose results are its rows.
        evaluate: the run's own evaluation after ``fit``: its dict is
            :attr:`Trained.results`.
        divergence_is_result: a NaN/inf loss or gradient norm ends this run as a result
            (:attr:`Trained.diverged_at`, the step; no checkpoint after the last finite
            step, no final evaluation) instead of an error that ends the task: for the
            recipes that show which settings diverge.
    """

    model: Any
    params: Any
    loss_fn: Callable[..., Any]
    data: Mapping[str, np.ndarray] | Callable[[Parallel], Any]
    optimizer: Optimizer
    fit: FitConfig
    batch_size: int | None
    seed: int
    dropout_seed: int | jax.Array | None = None
    carry: Any = None
    step_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    eval_fn: Callable[..., Any] | None = None
    eval_data: Sequence[Any] | Callable[[Parallel], Any] | None = None
    evals: Mapping[str, tuple[Callable[..., Any], Any]] = dataclasses.field(default_factory=dict)
    make_eval_step: Callable[[Parallel], Callable[[Any, Any], Mapping[str, Any]]] | None = None
    wrap_eval_step: Callable[[Callable[..., Any], Parallel], Callable[..., Any]] | None = None
    compute_dtype: Any = None
    compiler_options: Mapping[str, Any] | None = None
    on_log: Sequence[Callable[[dict], None]] = ()
    model_config: Mapping[str, Any] | None = None
    tokenizer: Any = None
    check_batch: Callable[[Any], None] | None = None
    name: str = ""
    writes: bool = True
    evaluate: Callable[[Trained], dict] | None = None
    divergence_is_result: bool = False


@dataclasses.dataclass
class Trained:
    """A :class:`Run` after :func:`train` fitted it.

    Attributes:
        run: the run.
        result: what ``fit`` returned (its ``state`` on the mesh); ``None`` for a run that
            diverged (``Run.divergence_is_result``).
        params: a host copy of the trained parameters (the same on every process; the
            initial ones for a run that diverged).
        eval: the final evaluation's metrics (``"eval/loss"``, ...; empty without
            ``eval_fn``).
        seconds: the training time (of every call, for a resumed run: its records').
        records: every logged record (``metrics.jsonl`` with a work dir, else ``fit``'s).
        results: what the run's ``evaluate`` hook returned (empty without one).
        folder: the run's folder (``None`` without a work dir).
        par: the devices it trained on.
        eval_step: the evaluation step (``None`` without ``eval_fn`` or ``make_eval_step``).
        eval_data: the run's evaluation batches.
        diverged_at: the step whose loss or gradient norm was NaN/inf (``None``: finite);
            ``records`` end before it.
    """

    run: Run
    result: FitResult | None
    params: Any
    eval: dict
    seconds: float
    records: list[dict]
    folder: str | None
    par: Parallel
    eval_step: Callable[..., Any] | None
    eval_data: Any
    results: dict = dataclasses.field(default_factory=dict)
    diverged_at: int | None = None

    @property
    def steps(self) -> int:
        """The optimiser steps the state has taken (the finite ones, for a run that
        diverged)."""
        if self.result is None:
            return (self.diverged_at or 1) - 1
        return int(jax.device_get(self.result.state.step))

    @property
    def status(self) -> str:
        """``fit``'s status (``"completed"``, ``"interrupted"``), or ``"diverged"``."""
        return "diverged" if self.result is None else self.result.status

    def evaluate(self, batches: Iterable[Any] | None = None) -> dict[str, float]:
        """The trained parameters' metrics over global ``batches`` (default: the run's
        evaluation data), on the mesh (:func:`seqjax.train.loop.evaluate`)."""
        if self.eval_step is None:
            raise ValueError("the run has no `eval_fn`: nothing to evaluate with.")
        if self.result is None:
            raise ValueError(f"the run diverged at step {self.diverged_at}: no trained "
                             "parameters to evaluate.")
        place = self.par.place_global if self.run.make_eval_step is None else None
        return evaluate_batches(self.eval_step, self.result.state.params,
                                self.eval_data if batches is None else batches,
                                place_batch=place)


@dataclasses.dataclass(frozen=True)
class Task:
    """What a recipe's ``build(cfg)`` returns: its runs and the hooks of its summary.

    Attributes:
        name: the recipe (``NAME.json``, ``NAME.md``).
        runs: the runs, trained in order (a generator builds each when its turn comes).
        about: printed before training, ``"NAME: ABOUT; PARALLEL"``.
        summarize: the summary's figures from the trained runs (joined to the
            provenance that :func:`train` records).
        report: the markdown of ``NAME.md`` from the summary (printed, and written to
            the work dir and the results folder); ``None`` = no markdown.
        files: writes the recipe's own files (figures, samples) into a folder, given the
            folder and the summary; called for the work dir and the results folder.
        started: ``time.perf_counter()`` when the recipe began (its data preparation then
            counts in ``wall_s``); ``None`` = when :func:`train` is called.
    """

    name: str
    runs: Iterable[Run]
    about: str = ""
    summarize: Callable[[list[Trained]], dict] | None = None
    report: Callable[[dict], str] | None = None
    files: Callable[[str, dict], Any] | None = None
    started: float | None = None


def train(task: Task, cfg: Any, par: Parallel | None = None) -> dict:
    """Train each of ``task``'s runs on ``par``'s devices (default:
    ``Parallel.from_options(cfg)``), then summarise and write the results once.

    The summary is the provenance (``config``, ``parallel``, ``machine``, the load
    averages, ``wall_s``; for one run in the work dir itself, no ``name``, also its
    ``params``, ``steps``, ``resumed_from``, ``status`` and ``train_wall_s``) updated by
    ``task.summarize``; :func:`write_results` writes it as ``NAME.json`` in ``cfg.workdir``,
    with ``task.report``'s markdown and ``task.files``' files there and in
    ``cfg.results_dir``. Returns the summary.

    A run stopped by SIGTERM/SIGINT (``fit``'s ``"interrupted"``, its checkpoint saved)
    ends the recipe there: no later run starts, nothing is evaluated, summarised or
    written from a part-trained run, and the returned summary is ``{"status":
    "interrupted", "run", "steps", "runs_trained", "signal"}``. The same command then resumes: the
    finished runs restore their last checkpoint (and evaluate it again), the stopped one
    trains on.
    """
    start = time.perf_counter() if task.started is None else task.started
    par = Parallel.from_options(cfg) if par is None else par
    load_before = load_average()
    print(f"{task.name}: {task.about}; {par}" if task.about else f"{task.name}: {par}")
    trained: list[Trained] = []
    for run in task.runs:
        trained.append(train_run(run, par, getattr(cfg, "workdir", None)))
        if trained[-1].status == "interrupted":  # no later run, no results from part of one
            where = f"run {run.name!r}" if run.name else "the run"
            if jax.process_index() == 0:
                print(f"{task.name}: {where} was stopped at step {trained[-1].steps}; no "
                      "later run started and no results were written; the same command "
                      "resumes it", file=sys.stderr, flush=True)
            result = trained[-1].result
            return {"status": "interrupted", "run": run.name, "steps": trained[-1].steps,
                    "runs_trained": len(trained),
                    "signal": None if result is None else result.stopped_by}
    summary: dict[str, Any] = {
        "config": dataclasses.asdict(cfg), "parallel": par.describe(), "machine": machine(),
        "load_average_before": load_before, "load_average_after": load_average(),
    }
    if len(trained) == 1 and not trained[0].run.name:  # the run of the work dir itself
        t = trained[0]
        summary.update(params=count_params(t.params), steps=t.steps,
                       resumed_from=t.result.start_step if t.result else 0, status=t.status,
                       train_wall_s=t.seconds)
    summary["wall_s"] = time.perf_counter() - start
    if task.summarize is not None:
        summary.update(task.summarize(trained))
    markdown = None if task.report is None else task.report(summary)
    if markdown:
        print("\n" + markdown)
    files = task.files
    write_results(task.name, cfg, markdown, summary,
                  plot=None if files is None else (lambda folder: files(folder, summary)))
    return summary


def train_run(run: Run, par: Parallel, workdir: str | None = None) -> Trained:
    """Fit one :class:`Run` on ``par``'s devices, in ``workdir/run.name`` (nothing written
    without a work dir), then evaluate it (``fit``'s last evaluation and the run's
    ``evaluate`` hook)."""
    if run.batch_size is not None:
        par.check_batch_size(run.batch_size)
    elif isinstance(run.data, Mapping):
        raise ValueError("a Run whose `data` is a dict of arrays needs a `batch_size`.")
    if workdir and (run.name or not run.writes):  # the work dir's run.json: fit writes a
        write_run_info(par, workdir)  # run's own one level down, or none
    if not run.writes:
        workdir = None
    folder = None if not workdir else os.path.join(workdir, run.name) if run.name else workdir
    key = run.seed if run.dropout_seed is None else run.dropout_seed
    key = jax.random.PRNGKey(key) if isinstance(key, int) else key
    state, schedule = init_state(par, run.params, run.optimizer, key, carry=run.carry)
    train_step = par.train_step(run.loss_fn, schedule=schedule, compute_dtype=run.compute_dtype,
                                **run.step_options)
    eval_step = (run.make_eval_step(par) if run.make_eval_step is not None
                 else None if run.eval_fn is None
                 else par.eval_step(run.eval_fn, compute_dtype=run.compute_dtype))
    if run.compiler_options:
        if run.fit.steps_per_call > 1:
            raise ValueError("`compiler_options` compile one step per call; got "
                             f"steps_per_call={run.fit.steps_per_call}.")
        train_step = compiled_with(train_step, run.compiler_options)
        eval_step = None if eval_step is None else compiled_with(eval_step,
                                                                 run.compiler_options)
    eval_data = run.eval_data(par) if callable(run.eval_data) else run.eval_data
    evals = {name: (par.eval_step(fn, compute_dtype=run.compute_dtype),
                    data(par) if callable(data) else data)
             for name, (fn, data) in run.evals.items()}
    if isinstance(run.data, Mapping):
        data = ArrayIterator(dict(run.data), par.local_batch_size(run.batch_size),
                             seed=run.seed, **par.host_rows())
    else:
        data = run.data(par)
    if folder:
        check_resumed_data(data, folder)
    tokenizer = None
    if run.tokenizer is not None:
        tokenizer = run.tokenizer.to_json()
        if folder and jax.process_index() == 0:
            os.makedirs(folder, exist_ok=True)
            run.tokenizer.save(os.path.join(folder, "tokenizer.json"))
    begin = time.perf_counter()
    fit_eval_step = eval_step
    if eval_step is not None and run.wrap_eval_step is not None:
        fit_eval_step = run.wrap_eval_step(eval_step, par)
    logged: list[dict] = []  # fit's history, also when it raises
    try:
        result: FitResult | None = fit(
            state, train_step, data, run.fit, workdir=folder, eval_step=fit_eval_step,
            eval_data=eval_data, tokenizer=tokenizer, parallel=par,
            model_config=None if run.model_config is None else dict(run.model_config),
            check_batch=run.check_batch, hooks=[logged.append, *run.on_log],
            place_eval_batch=None if run.make_eval_step is None else (lambda b: b), evals=evals)
        diverged_at = None
    except NonFiniteLossError as err:
        if not run.divergence_is_result:
            raise
        result, diverged_at = None, err.step
        print(f"{run.name or 'run'}: diverged at step {err.step} ({err.metric} = {err.value})",
              flush=True)
    seconds = time.perf_counter() - begin
    records = (read_metrics(os.path.join(folder, "metrics.jsonl")) if folder
               else logged if result is None else list(result.history))
    if result is not None and result.start_step:  # resumed: the logged calls' times summed
        seconds = logged_seconds(records) or seconds
    params = run.params if result is None else par.gather(result.state.params)
    trained = Trained(run=run, result=result, params=params,
                      eval={} if result is None else dict(result.eval_metrics),
                      seconds=seconds, records=records, folder=folder, par=par,
                      eval_step=eval_step, eval_data=eval_data, diverged_at=diverged_at)
    if run.evaluate is not None and trained.status != "interrupted":
        trained.results = dict(run.evaluate(trained))
    return trained


def check_resumed_data(data: Any, folder: str) -> None:
    """Before training: a work dir whose newest checkpoint was trained on other data than
    ``data`` (its recorded position does not fit the iterator: other token counts, seed,
    batch, ...) is a :class:`~seqjax.experiments._config.ConfigError` naming the work dir,
    the data it was started on and how to start anew. Nothing to compare (no checkpoint, an
    unreadable one — ``fit`` deals with it — or an iterator without ``check_state``): no-op."""
    from seqjax.experiments._config import ConfigError
    from seqjax.train.checkpoint import load_meta

    ckpt_dir = os.path.join(folder, "checkpoints")
    if not callable(getattr(data, "check_state", None)) or not os.path.isdir(ckpt_dir):
        return
    try:
        saved = load_meta(ckpt_dir).get("data_state")
    except Exception:  # noqa: BLE001 — no readable checkpoint: fit's resume reports it
        return
    if not isinstance(saved, Mapping):
        return
    try:
        data.check_state(saved)
    except ValueError as err:
        source = saved.get("source")
        started = f" (--data_path {source!r})" if source else ""
        raise ConfigError(
            f"the work dir {folder!r} holds a run trained on other data{started}: its "
            f"checkpoint's data position does not fit this data ({err}). Resume it with the "
            "data it was started on, or start anew with another --workdir.") from None


def logged_seconds(records: Sequence[Mapping[str, Any]]) -> float:
    """The training time of a run logged over several calls of ``fit``: each call's records
    count ``time`` from 0, so the time is the sum of each call's last ``time``.

    Example:
        >>> logged_seconds([{"time": 1.0}, {"time": 3.0}, {"time": 0.5}, {"time": 2.0}])
        5.0
    """
    times = [float(r["time"]) for r in records if "time" in r]
    return sum(a for a, b in zip(times, times[1:]) if b < a) + (times[-1] if times else 0.0)


def classifier_run(model: Any, train: Mapping[str, np.ndarray],
                   test: Mapping[str, np.ndarray], cfg: Any, seed: int, *,
                   name: str = "", model_config: Mapping[str, Any] | None = None,
                   evaluate: Callable[[Trained], dict] | None = None) -> Run:
    """A classifier of ``train["x"] -> train["y"]`` trained by cross-entropy (AdamW, linear
    warm-up then cosine decay to 0), the whole ``test`` set evaluated as one global batch
    at the end (``eval/accuracy``).

    ``cfg`` gives ``learning_rate``, ``warmup_steps``, ``steps``, ``weight_decay``,
    ``clip_norm``, ``batch_size`` (capped at the training set), ``log_every``,
    ``progress`` and ``workdir`` (the ``digits`` and ``audio`` experiments' ``Config``);
    the parameters are drawn from ``seed``, the state's dropout key from ``seed + 1000``.
    """
    params = jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.asarray(train["x"][:1]))["params"]

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

    def test_batch(par: Parallel) -> list[dict]:  # one global batch, padded to the mesh
        rows = {**test, "mask": np.ones(len(test["y"]), bool)}
        return [pad_rows(rows, par.batch_shards, {"mask": False})]

    return Run(
        model=model, params=params, loss_fn=loss_fn, data=dict(train),
        optimizer=cfg.optimizer_config("adamw"),
        fit=cfg.fit_config(best_metric=None, tensorboard=False, plot=cfg.workdir is not None),
        batch_size=min(cfg.batch_size, len(train["y"])), seed=seed, dropout_seed=seed + 1000,
        eval_fn=eval_fn, eval_data=test_batch, model_config=model_config, name=name,
        evaluate=evaluate)


"""The training loop: ``fit`` with evaluation, progress, logs, checkpoints and fault handling.

``fit(state, train_step, train_data, FitConfig(steps=...), workdir=...)`` runs
``state, metrics = train_step(state, batch)`` until ``state.step == steps``, keeping in the
work dir

* ``checkpoints/`` (:mod:`seqjax.train.checkpoint`) every ``checkpoint_every`` steps, at
  every evaluation and at the end; a rerun in the same work dir restores the newest readable
  one (state, RNG, data position) and continues bit for bit on the same hardware;
* ``metrics.jsonl``, one JSON object per logged step (``step``, ``loss``, ``grad_norm``,
  ``lr``, ``tokens_per_s``, ``eval/*``, ...), cut back to the restored step on resume. A
  history with no readable checkpoint is never overwritten silently: after a kill before the
  first checkpoint, ``fit`` keeps it as ``metrics.jsonl.<time>.old`` and starts over; with
  every checkpoint unreadable it raises :class:`ResumeError` unless ``restart=True``;
* ``tensorboard/``, ``loss.png``, ``perplexity.png`` (optional, by default when their package
  is installed) and ``run.json`` (:meth:`seqjax.train.parallel.Parallel.describe`).

Faults. ``fit`` holds the work dir's lock (:mod:`seqjax.train.workdir_lock`): a second run
raises :class:`~seqjax.train.workdir_lock.WorkdirBusyError` before writing. A failed write
raises :class:`~seqjax.train.write_errors.WriteError` naming file, step, bytes needed and
free and the newest intact checkpoint (background checkpoints are checked at each logged
step; a failed one's temporary folder is removed), so the same call resumes once the cause
is gone; one line warns before training when free space is short. A failing data iterator
(an error, or ``StopIteration`` before the last step) raises
:class:`~seqjax.train.fit_parts.DataIteratorError` after checkpointing the last completed step
with the data position before the failed batch (single process only), so the same call later
finishes as the uninterrupted run would. A non-finite ``loss`` or ``grad_norm`` raises
:class:`NonFiniteLossError` naming step, metric and likely causes; nothing is saved after the
last finite step. Metrics stay on the devices between logged steps (the host at most 8 steps
ahead) and are fetched and checked at log, eval and checkpoint steps.

SIGTERM/SIGINT finish the current step, save and return ``status="interrupted"`` (a second
Ctrl-C aborts at once); one caught before ``fit`` started
(:func:`seqjax.train.preemption.stop_requests`) stops it before its first step. With several
processes only process 0 writes logs, metrics, curves and ``run.json``, and the stop step is
agreed through JAX's preemption sync point, so all processes save the same step.

``check_batch=make_batch_check(V)`` (:func:`seqjax.train.step.make_batch_check`) checks each
host batch before placement, so an out-of-vocabulary id is a ``ValueError``, not a NaN. With
``FitConfig(steps_per_call=k)`` ``k`` steps run per jitted call; a ``train_data`` with
``device_batch`` (:class:`~seqjax.data.device.DeviceLMWindows`,
:class:`~seqjax.data.device.DeviceStreamChunks`) is drawn inside the call
(:meth:`~seqjax.train.step.TrainStep.steps_from`); host batches are otherwise prefetched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from seqjax.train.fit_parts import (
    CHECKED_ENV,
    BatchSource,
    DataIteratorError,
    FitConfig,
    MetricsFetch,
    MetricsLog,
    Throughput,
    call_steps,
    checked_by_default,
    compile_in_background,
    process_uptime,
    resume,
    step_actions,
)
from seqjax.train.flops import peak_flops_per_device
from seqjax.train.optim import TrainState
from seqjax.train.preemption import SignalGuard, check_distributed
from seqjax.train.records import (
    plot_curves,
    read_metrics,
    run_info,
    set_aside_history,
    wanted,
    write_run_info,
)
from seqjax.train.sharding import host_value
from seqjax.train.step import TrainStep
from seqjax.train.workdir_lock import holds_workdir
from seqjax.train.write_errors import newest_checkpoint

__all__ = ["CHECKED_ENV", "DataIteratorError", "FitConfig", "FitResult", "ResumeError",
           "checked_by_default", "evaluate", "fit"]

# Steps the host may run ahead of the device between logged steps.
_MAX_IN_FLIGHT = 8


@dataclasses.dataclass
class FitResult:
    """What :func:`fit` returns.

    Attributes:
        state: the final state.
        status: ``"completed"`` or ``"interrupted"`` (a signal).
        start_step: the step training started from (restored checkpoint, else 0).
        history: the logged records of this call.
        eval_metrics: the last evaluation's metrics.
        first_step_s: seconds from calling ``fit`` to the first call's results (compilation
            included); ``None`` when no step ran.
        stopped_by: the interrupting signal (``"SIGTERM"``, ...), else ``None``.
    """

    state: TrainState
    status: str
    start_step: int
    history: list[dict]
    eval_metrics: dict
    first_step_s: float | None = None
    stopped_by: str | None = None


def evaluate(eval_step: Callable[[Any, Any], Mapping[str, Any]], params: Any,
             batches: Iterable[Any], *, place_batch: Callable[[Any], Any] | None = None,
             check_batch: Callable[[Any], None] | None = None) -> dict[str, float]:
    """Average ``eval_step(params, batch)`` over ``batches``, weighted by ``tokens``.

    Each metric is ``Σ_b m_b w_b / Σ_b w_b``, ``w_b`` the batch's ``tokens`` (1 if absent);
    ``tokens`` is summed and ``perplexity = exp(loss)`` added. ``check_batch(batch)`` runs on each
    host batch before ``place_batch``. Raises ``ValueError`` when ``batches`` is empty.

    Example:
        >>> ev = lambda p, b: {"loss": b["l"], "tokens": b["n"]}
        >>> evaluate(ev, None, [{"l": 1.0, "n": 1.0}, {"l": 4.0, "n": 3.0}])["loss"]
        3.25
    """
    sums: dict[str, float] = {}
    total, n = 0.0, 0
    for batch in batches:
        if check_batch is not None:
            check_batch(batch)
        if place_batch is not None:
            batch = place_batch(batch)
        m = {k: float(v) for k, v in host_value(dict(eval_step(params, batch))).items()}
        w = m.pop("tokens", 1.0)
        total += w
        n += 1
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + v * w
    if n == 0:
        raise ValueError("`batches` is empty: nothing to evaluate.")
    out = {k: v / max(total, 1e-30) for k, v in sums.items()}
    out["tokens"] = total
    if "loss" in out:
        out["perplexity"] = math.exp(min(out["loss"], 700.0))
    return out


class ResumeError(RuntimeError):
    """The work dir holds a run's history but nothing to resume it from (``fit``'s ``restart``)."""


def _fetch_and_meter(cfg: FitConfig, workdir: str | None, ids_checked: bool, start: int,
                     devices: int) -> tuple[MetricsFetch, Throughput]:
    """``fit``'s :class:`MetricsFetch` and :class:`Throughput` (MFU over ``devices``)."""
    fetch = MetricsFetch(cfg.finite_check, workdir, ids_checked,
                         in_flight=max(1, _MAX_IN_FLIGHT // cfg.steps_per_call))
    meter = Throughput(start, flops_per_step=cfg.flops_per_step,
                       peak=cfg.peak_flops or peak_flops_per_device(), devices=devices)
    return fetch, meter


def _check_history(workdir: str, start: int, restart: bool) -> bool:
    """With no restorable checkpoint and a history past ``start``: killed before the first
    checkpoint (no ``checkpoints.corrupted``) → set the history aside and start over with a
    notice; all checkpoints unreadable → :class:`ResumeError` unless ``restart``. ``True`` when
    set aside."""
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    last = max((int(r.get("step", 0)) for r in records), default=0)
    corrupted = os.path.join(workdir, "checkpoints.corrupted")
    # 0: nothing recorded past start; 1: start over; 2: refuse (process 0 decides for all)
    action = 0 if last <= start else (1 if restart or not os.path.isdir(corrupted) else 2)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        action = int(multihost_utils.broadcast_one_to_all(np.int32(action)))
    if action == 1:
        kept = set_aside_history(workdir)
        if not restart and kept is not None:
            print(f"fit: {workdir} holds steps 1-{last} of a run killed before its first "
                  f"checkpoint finished; starting over (that history is kept as "
                  f"{os.path.basename(kept)}).", file=sys.stderr)
    if action != 2:
        return action == 1
    raise ResumeError(
        f"work dir {workdir} holds the history of a run up to step {last} (metrics.jsonl) but "
        f"no readable checkpoint to resume it from (unreadable checkpoints were moved to "
        f"{corrupted}); starting at step {start} would "
        "overwrite that history. Start over explicitly with fit(..., restart=True) "
        "(`seqjax train ... --restart`), which keeps the old metrics as "
        "metrics.jsonl.<time>.old, or use a new work dir.")


@holds_workdir
def fit(
    state: TrainState,
    train_step: Callable[[TrainState, Any], tuple[TrainState, Mapping[str, Any]]],
    train_data: Any,
    config: FitConfig,
    *,
    workdir: str | os.PathLike | None = None,
    eval_step: Callable[[Any, Any], Mapping[str, Any]] | None = None,
    eval_data: Callable[[], Iterable[Any]] | Sequence[Any] | None = None,
    place_batch: Callable[[Any], Any] | None = None,
    model_config: Mapping[str, Any] | None = None,
    tokenizer: Mapping[str, Any] | str | None = None,
    hooks: Sequence[Callable[[dict], None]] = (),
    parallel: Any = None,
    place_eval_batch: Callable[[Any], Any] | None = None,
    check_batch: Callable[[Any], None] | None = None,
    restart: bool = False,
    evals: Mapping[str, tuple[Callable[[Any, Any], Mapping[str, Any]], Any]] | None = None,
) -> FitResult:
    """Train ``state`` to ``config.steps`` steps, resuming from ``workdir``'s checkpoints.

    Args:
        state: the initial state, also the template (structure, shapes, shardings) for restoring.
        train_step: ``(state, batch) -> (state, metrics)``, e.g.
            :func:`seqjax.train.step.make_train_step`.
        train_data: an iterator of batches (``get_state``/``set_state`` resume its position
            exactly; otherwise it is replayed), or ``f(i) -> batch`` for 0-based step ``i``.
        config: a :class:`FitConfig`.
        workdir: where checkpoints, logs and plots go; ``None`` = nothing is written.
        eval_step: ``(params, batch) -> metrics`` (e.g. :func:`seqjax.train.step.make_eval_step`).
        eval_data: a list of batches or a function returning a fresh iterable of them.
        evals: more evaluations, ``{name: (eval_step, eval_data)}`` (e.g. :mod:`seqjax.evals`),
            run alongside ``eval_step``'s; metrics ``<name>/<metric>`` (``eval_step``'s:
            ``eval/<metric>``).
        place_batch: applied to every training batch; default ``parallel.place``.
        place_eval_batch: the same for evaluation batches; default ``parallel.place_global``
            (global batches) if ``parallel`` is given, else ``place_batch``.
        model_config: JSON-able dict saved with checkpoints and checked on restore.
        tokenizer: JSON dict/string saved with checkpoints.
        hooks: called with every logged record.
        check_batch: run on every host batch (training and evaluation) before placement, e.g.
            :func:`seqjax.train.step.make_batch_check`; its ``ValueError`` names the step.
        parallel: the :class:`seqjax.train.parallel.Parallel` of the state and steps, recorded
            in ``run.json``; MFU is over its devices (else the state's shardings').
        restart: start from ``state`` although ``workdir`` holds a history with no readable
            checkpoint, moving it to ``metrics.jsonl.<time>.old``.

    Returns:
        A :class:`FitResult`; the module docstring's faults raise :class:`NonFiniteLossError`,
        ``WorkdirBusyError``, ``WriteError`` or ``DataIteratorError``.
    """
    cfg = config
    t_fit = time.perf_counter()
    check_distributed()
    place_batch, place_eval_batch = _placements(parallel, place_batch, place_eval_batch)
    info = (write_run_info(workdir, parallel, state) if workdir is not None
            else run_info(state, parallel))
    workdir = None if workdir is None else os.path.abspath(os.fspath(workdir))
    evaluations = _evaluations(eval_step, eval_data, evals)
    evaluates = bool(evaluations)
    # The template state has the restored state's shapes and shardings: the first call's
    # program (and the evaluation's) compile while the checkpoint is read.
    warm = [] if cfg.checked else _compile_ahead(  # the checked program is another program
        cfg, state, train_data, train_step, call_steps(int(host_value(state.step)), cfg),
        eval_step if evaluates else None, eval_data, place_eval_batch)
    ckpt, state, start, data_state, started_over = resume(
        state, workdir, keep=cfg.keep_checkpoints, best_metric=cfg.best_metric,
        best_mode=cfg.best_mode, async_save=cfg.async_checkpointing, model_config=model_config,
        tokenizer=tokenizer, check_history=lambda w, s0: _check_history(w, s0, restart))
    for thread in warm:  # compiled while the checkpoint was read; a call made before a
        thread.join()  # background compile finished would compile the same program again
    status, eval_metrics = "completed", {}
    if start >= cfg.steps and evaluates:  # resumed at its end: the result carries the final
        eval_metrics = _evaluation(  # evaluation as the uninterrupted run's (logged already)
            evaluations, state.params, place_eval_batch, check_batch, start)
    with SignalGuard(cfg.handle_signals) as guard, contextlib.ExitStack() as parts:
        if ckpt is not None:
            parts.callback(ckpt.close)  # closed last, after the batch source and the log
        source = parts.enter_context(contextlib.closing(BatchSource(
            train_data, train_step, start=start, data_state=data_state, place_batch=place_batch,
            steps_per_call=cfg.steps_per_call, prefetch=cfg.prefetch, steps=cfg.steps,
            checked=bool(cfg.checked), check_batch=check_batch)))
        log = parts.enter_context(contextlib.closing(MetricsLog(
            workdir, start=start, steps=cfg.steps, restart=restart or started_over,
            progress=cfg.progress, print_logs=cfg.print_logs, tensorboard=cfg.tensorboard,
            plot=cfg.plot, hooks=hooks)))
        fetch, meter = _fetch_and_meter(cfg, workdir, check_batch is not None or source.device,
                                        start, int(info["devices"]))
        parts.enter_context(_gc_frozen(cfg.freeze_gc))
        s, first_end = start, start + call_steps(start, cfg)  # the first call's last step
        if _stopped_before_training(guard, s, cfg, log):
            status = "interrupted"
        while s < cfg.steps and status != "interrupted":
            n = call_steps(s, cfg)
            with _saved_on_data_error(ckpt, state, s, lambda: source.call_position, fetch,
                                      save=s > start):  # not when step s is saved already
                state, m_dev = source.call(state, s, n)
            s += n
            fetch.add(s, n, m_dev)
            if s == first_end:
                _report_first_step(meter, m_dev, warm, log, t_fit)
            plan = step_actions(s, cfg, start, evaluates=evaluates, saves=ckpt is not None,
                                stop_requested=guard.should_stop(s))
            if not plan.fetch:
                fetch.wait_behind()  # back-pressure: stay a few steps ahead
                continue
            last = fetch()
            if ckpt is not None:
                ckpt.check()  # a failed background checkpoint write stops the run here
            rec = {"step": s, **last, **meter.record(s, fetch.take_tokens())} if plan.log else None
            log.advance(s, rec)
            if plan.evaluate:
                eval_metrics = _evaluation_at(s, evaluations, state, ckpt, source, last,
                                              place_eval_batch, check_batch)
                rec = {**(rec or {"step": s, **last}), **eval_metrics}
            if rec is not None:
                log.write(rec)
            if plan.save:
                assert ckpt is not None
                ckpt.save(state, data_state=source.position(s), step=s,
                          metrics={**last, **eval_metrics} if plan.evaluate else last)
            if plan.stop:
                status = "interrupted"
                log.say(f"{guard.requested}: stopped at step {s}" + (
                    f"; checkpoint saved in {workdir}; the same call resumes from it"
                    if ckpt else ""), sys.stderr)
                break
    _plot_curves(cfg, workdir)
    return FitResult(state=state, status=status, start_step=start, history=log.history,
                     eval_metrics=eval_metrics, first_step_s=meter.first_step_s,
                     stopped_by=guard.requested if status == "interrupted" else None)


def _plot_curves(cfg: FitConfig, workdir: str | None) -> None:
    """The loss curves of ``workdir/metrics.jsonl`` (process 0; none before a first record)."""
    if jax.process_index() == 0 and workdir is not None and wanted(cfg.plot, "matplotlib"):
        if records := read_metrics(os.path.join(workdir, "metrics.jsonl")):
            plot_curves(records, workdir)


def _placements(parallel: Any, place_batch: Callable[[Any], Any] | None,
                place_eval_batch: Callable[[Any], Any] | None) -> tuple[Any, Any]:
    """``fit``'s ``(place_batch, place_eval_batch)`` with their defaults (see :func:`fit`)."""
    if parallel is not None:
        place_batch = parallel.place if place_batch is None else place_batch
        if place_eval_batch is None:
            place_eval_batch = parallel.place_global
    return place_batch, place_batch if place_eval_batch is None else place_eval_batch


def _evaluations(eval_step: Any, eval_data: Any, evals: Mapping[str, tuple[Any, Any]] | None
                 ) -> list[tuple[str, Any, Any]]:
    """``[(prefix, eval_step, eval_data)]``: ``eval`` first (if given), then ``evals`` in order."""
    out = [] if eval_step is None or eval_data is None else [("eval", eval_step, eval_data)]
    for name, pair in (evals or {}).items():
        if name == "eval" or not isinstance(pair, tuple) or len(pair) != 2:
            raise ValueError(f"`evals[{name!r}]` must be an (eval_step, eval_data) pair named "
                             f"other than 'eval'; got {type(pair).__name__}.")
        out.append((name, *pair))
    return out


def _evaluation(evaluations: Sequence[tuple[str, Any, Any]], params: Any,
                place_eval_batch: Callable[[Any], Any] | None,
                check_batch: Callable[[Any], None] | None, step: int = 0) -> dict[str, float]:
    """:func:`evaluate` on a fresh pass over each evaluation's data, metrics ``<prefix>/<name>``;
    failing data is a :class:`DataIteratorError` naming it and ``step``."""
    out: dict[str, float] = {}
    for prefix, eval_step, eval_data in evaluations:
        where = "the evaluation data" + ("" if prefix == "eval" else f" of {prefix!r}")
        out.update({f"{prefix}/{name}": v for name, v in evaluate(
            eval_step, params, _guarded(eval_data, where, step), place_batch=place_eval_batch,
            check_batch=check_batch if prefix == "eval" else None).items()})
    return out


def _guarded(eval_data: Any, where: str, step: int) -> Iterator[Any]:
    """The batches of ``eval_data``; an error making them is a :class:`DataIteratorError`."""
    try:
        yield from eval_data() if callable(eval_data) else eval_data
    except DataIteratorError:
        raise
    except Exception as err:  # noqa: BLE001 — a loader's error, whatever its type
        raise DataIteratorError(step, err, source=where) from err


@contextlib.contextmanager
def _saved_on_data_error(ckpt: Any, state: TrainState, s: int, position: Callable[[], Any],
                         metrics: Callable[[], dict], save: bool = True) -> Iterator[None]:
    """On a :class:`DataIteratorError` in the block (the training call after step ``s``, or the
    evaluation at it): first checkpoint ``state`` as step ``s`` with ``metrics()`` (checked
    finite) and the data at ``position()``, if ``save`` and one process trains (a collective save
    would hang); then note the newest intact checkpoint on the error and raise it."""
    try:
        yield
    except DataIteratorError as err:
        if ckpt is not None:
            if save and jax.process_count() == 1:
                last = metrics()  # a non-finite metric raises here: nothing saved after it
                ckpt.check()
                ckpt.save(state, data_state=position(), step=s, metrics=last)
                ckpt.wait()
            err.checkpoint = newest_checkpoint(ckpt.directory)
        raise


def _stopped_before_training(guard: SignalGuard, s: int, cfg: FitConfig, log: MetricsLog
                             ) -> bool:
    """Whether a signal came while restoring or compiling (said on stderr)."""
    if s >= cfg.steps or not guard.should_stop(s):
        return False
    log.say(f"{guard.requested}: stopped at step {s} before training; the same call "
            + ("resumes from its checkpoint" if s else "starts it"), sys.stderr)
    return True


def _evaluation_at(s: int, evaluations: Sequence[tuple[str, Any, Any]], state: TrainState,
                   ckpt: Any, source: BatchSource, last: dict,
                   place_eval_batch: Callable[[Any], Any] | None,
                   check_batch: Callable[[Any], None] | None) -> dict[str, float]:
    """The evaluations at step ``s``; failing data first checkpoints ``s``
    (:func:`_saved_on_data_error`)."""
    with _saved_on_data_error(ckpt, state, s, functools.partial(source.position, s),
                              functools.partial(dict, last)):
        return _evaluation(evaluations, state.params, place_eval_batch, check_batch, s)


@contextlib.contextmanager
def _gc_frozen(freeze: bool) -> Iterator[None]:
    """With ``freeze`` and the collector on: collect, then ``gc.freeze()`` for the block."""
    frozen = freeze and gc.isenabled()
    if frozen:
        gc.collect()
        gc.freeze()
    try:
        yield
    finally:
        if frozen:
            gc.unfreeze()


def _compile_ahead(cfg: FitConfig, state: TrainState, train_data: Any, train_step: Any,
                   first_n: int, eval_step: Any, eval_data: Any,
                   place_eval_batch: Callable[[Any], Any] | None) -> list[threading.Thread]:
    """Start :attr:`FitConfig.compile_ahead`'s background compiles: the first call (device-resident
    data) and the evaluation step on the first evaluation batch."""
    ahead = jax.default_backend() != "cpu" if cfg.compile_ahead is None else cfg.compile_ahead
    if not ahead or first_n <= 0:
        return []
    threads = []
    if callable(getattr(train_data, "device_batch", None)) and isinstance(train_step, TrainStep):
        threads.append(BatchSource.compile_ahead_of(train_step, train_data, state, first_n))
    lower = getattr(eval_step, "lower", None)
    if lower is not None and isinstance(eval_data, Sequence) and len(eval_data):
        first = eval_data[0]
        placed = first if place_eval_batch is None else place_eval_batch(first)
        threads.append(compile_in_background(lambda: lower(state.params, placed), "eval"))
    return threads


def _report_first_step(meter: Throughput, metrics: Any, warm: list[threading.Thread],
                       log: MetricsLog, since: float) -> None:
    """Wait for the first call's results; print the time since ``since`` (the call of ``fit``)."""
    jax.block_until_ready(metrics)
    seconds = meter.first_step(since)
    uptime = process_uptime()
    if jax.process_index() == 0:
        log.say(f"first step: {seconds:.2f} s in fit"
                + (f", {uptime:.2f} s since the process started" if uptime is not None else "")
                + (" (compiled ahead)" if warm else ""), sys.stderr)

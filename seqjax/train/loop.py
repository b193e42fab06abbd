"""The training loop: ``fit`` with evaluation, progress, logs, checkpoints and fault handling.

``fit(state, train_step, train_data, FitConfig(num_steps=...), workdir=...)`` runs
``state, metrics = train_step(state, batch)`` until ``state.step == num_steps`` and, in the
work dir, keeps

* ``checkpoints/`` — orbax checkpoints (:mod:`seqjax.train.checkpoint`) every
  ``checkpoint_every`` steps, at every evaluation and at the end; a rerun in the same work
  dir restores the newest readable one (state, RNG and data-iterator position) and
  continues — bit-for-bit the same run on the same hardware;
* ``metrics.jsonl`` — one JSON object per logged step (``step``, ``loss``, ``grad_norm``,
  ``lr``, ``tokens_per_s``, ``eval/*``, ...); lines past the restored step are dropped on
  resume. A history with no readable checkpoint to resume it from (all corrupted, or a
  kill before the first one) is never overwritten silently: ``fit`` raises
  :class:`ResumeError` unless called with ``restart=True``;
* ``tensorboard/`` — TensorBoard event files (tensorboardX, ``pip install
  "seqjax[tensorboard]"``) of the same scalars;
* ``loss.png``, ``perplexity.png`` — curves drawn at the end (matplotlib, Agg; ``pip install
  "seqjax[plot]"``). Both are optional: by default they are written when their package is
  installed.

* ``run.json`` — where the run ran: ``devices``, ``processes``, ``mesh`` (axis → size),
  ``strategy``, ``device_kind``, ``platform``, ``jax`` (see
  :meth:`seqjax.train.parallel.Parallel.describe`), rewritten by every (resumed) run.

A tqdm bar shows loss, tokens/s and the ETA. SIGTERM/SIGINT (preemption on Colab or a TPU
VM, Ctrl-C) finish the current step, save a checkpoint and return with
``status="interrupted"`` (a second Ctrl-C aborts at once).

**Several processes** (``jax.distributed``): only process 0 writes logs, metrics, curves
and ``run.json``; checkpoints are written collectively by orbax. A SIGTERM that reaches
*one* process (a preempted host) must stop *every* process at the same step, or one
would wait in the checkpoint's collectives while the other waits in the next step's: the
stop decision is taken with JAX's preemption sync point
(``multihost_utils.reached_preemption_sync_point``, fed by the coordination service,
which owns SIGTERM in a distributed job; SIGINT is forwarded to it), so all processes
agree on the step, save it together and return ``"interrupted"``. A non-finite ``loss`` or
``grad_norm`` raises :class:`NonFiniteLossError` naming the step, the metric and the likely
causes (learning rate, gradients, unchecked token ids, half precision); nothing is saved
after the last finite step, so the last good checkpoint stays the newest.

**Batch check.** A train step with a ``check_batch`` (e.g. from
:func:`seqjax.train.step.make_train_step` given ``vocab_size``, or a
:func:`~seqjax.train.losses.make_lm_loss` that knows the model's vocabulary) has every host
batch checked *before* it is placed on the devices: an out-of-vocabulary id is a
``ValueError`` naming the batch key and the step, not a NaN or a silently wrong loss.

Metrics stay on the device between logged steps (the host runs at most 8 steps ahead)
and are fetched together at log, eval and checkpoint steps, where every one of them is
checked for NaN/inf — so a non-finite value is reported, with its step, at the next
logged step at the latest, and no checkpoint is ever written after it.

**Keeping the devices busy.** ``FitConfig(steps_per_call=k)`` runs ``k`` steps per jitted
call (:meth:`~seqjax.train.step.TrainStep.steps`); a ``train_data`` with
``device_batch`` (:class:`seqjax.data.device.DeviceLMWindows`,
:class:`~seqjax.data.device.DeviceStreamChunks`) has its batches drawn inside the call
from the step number (:meth:`~seqjax.train.step.TrainStep.steps_from`: nothing crosses from
the host; ids checked once); host batches are otherwise prepared by a background thread
``prefetch`` batches ahead on accelerators. The cost of each, measured:
``python -m benchmarks loop`` (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from seqjax.train.checkpoint import Checkpointer
from seqjax.train.flops import peak_flops_per_device
from seqjax.train.optim import TrainState
from seqjax.train.preemption import SignalGuard, check_distributed
from seqjax.train.records import (
    NonFiniteLossError,
    non_finite_hint,
    plot_curves,
    read_metrics,
    run_info,
    set_aside_history,
    tensorboard_writer,
    wanted,
    write_run_info,
)
from seqjax.train.sharding import host_value
from seqjax.train.step import CheckedStep, TrainStep

__all__ = ["FitConfig", "FitResult", "ResumeError", "evaluate", "fit"]

# Steps the host may run ahead of the device between logged steps.
_MAX_IN_FLIGHT = 8



@dataclasses.dataclass(frozen=True)
class FitConfig:
    """How :func:`fit` runs.

    Attributes:
        num_steps: train until ``state.step == num_steps``.
        log_every: steps between logged records (also the first step and the last).
        eval_every: steps between evaluations; 0 = only at the end (needs ``eval_data``).
        checkpoint_every: steps between checkpoints; 0 = only at the end (needs a work dir).
        keep_checkpoints: the most recent checkpoints kept.
        best_metric: also keep the best checkpoint by this logged metric (``None`` = off).
        best_mode: ``"min"`` or ``"max"``.
        async_checkpointing: write checkpoints in a background thread.
        progress: show a tqdm bar.
        print_logs: print one line per logged record.
        tensorboard: write TensorBoard event files: ``True`` (needs tensorboardX,
            ``seqjax[tensorboard]``; an error naming the extra without it), ``False``, or
            ``None`` (default: when tensorboardX is installed).
        plot: draw ``loss.png`` and ``perplexity.png`` at the end: ``True`` (needs
            matplotlib, ``seqjax[plot]``), ``False``, or ``None`` (default: when matplotlib
            is installed).
        handle_signals: SIGTERM/SIGINT save and stop (main thread only).
        finite_check: metrics that must stay finite.
        flops_per_step: model FLOPs per step (e.g. ``6 · params · tokens``) to report MFU.
        peak_flops: peak FLOP/s per device for MFU; ``None`` = look up the device kind.
        steps_per_call: run this many steps in one jitted call (a ``lax.scan`` of the
            step; :meth:`~seqjax.train.step.TrainStep.steps`), so the host dispatches once
            per ``k`` steps — the usual answer to host overhead on TPUs and for small
            models. ``log_every``, ``eval_every`` and ``checkpoint_every`` must be
            multiples of it; a stop request (SIGTERM) is honoured at the end of a call.
            Needs the train step of :func:`~seqjax.train.step.make_train_step`.
        prefetch: host batches a background thread prepares ahead (the next batch, its
            check and its placement on the devices, while the step runs); ``None``
            (default): 2 on an accelerator, 0 (none) on the CPU, where the thread would
            compete with XLA for the same cores. Not used with a device-resident source.
        freeze_gc: ``gc.freeze()`` everything allocated before training (the model, the
            data, the compiled programs), so Python's full collections — pauses of 0.1 s
            and more with a large heap — stop walking it; undone when ``fit`` returns.
    """

    num_steps: int
    log_every: int = 50
    eval_every: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    best_metric: str | None = "eval/loss"
    best_mode: str = "min"
    async_checkpointing: bool = True
    progress: bool = True
    print_logs: bool = False
    tensorboard: bool | None = None
    plot: bool | None = None
    handle_signals: bool = True
    finite_check: tuple[str, ...] = ("loss", "grad_norm")
    flops_per_step: float | None = None
    peak_flops: float | None = None
    steps_per_call: int = 1
    prefetch: int | None = None
    freeze_gc: bool = True

    def __post_init__(self) -> None:
        minimum = {"num_steps": 0, "log_every": 1, "eval_every": 0, "checkpoint_every": 0,
                   "keep_checkpoints": 1, "steps_per_call": 1}
        for name, low in minimum.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"`{name}` must be an int >= {low}; got {v!r}.")
        if self.prefetch is not None and (isinstance(self.prefetch, bool) or not isinstance(
                self.prefetch, int) or self.prefetch < 0):
            raise ValueError(f"`prefetch` must be None or an int >= 0; got {self.prefetch!r}.")
        k = self.steps_per_call
        for name in ("log_every", "eval_every", "checkpoint_every"):
            v = getattr(self, name)
            if v % k:
                raise ValueError(f"`{name}` must be a multiple of steps_per_call={k}; "
                                 f"got {v}.")


@dataclasses.dataclass
class FitResult:
    """What :func:`fit` returns.

    Attributes:
        state: the final state.
        status: ``"completed"`` or ``"interrupted"`` (a signal).
        start_step: the step training started from (restored checkpoint, else 0).
        history: the logged records of this call.
        eval_metrics: the last evaluation's metrics.
    """

    state: TrainState
    status: str
    start_step: int
    history: list[dict]
    eval_metrics: dict


def evaluate(
    eval_step: Callable[[Any, Any], Mapping[str, Any]],
    params: Any,
    batches: Iterable[Any],
    *,
    place_batch: Callable[[Any], Any] | None = None,
) -> dict[str, float]:
    """Average ``eval_step(params, batch)`` over ``batches``, weighted by ``tokens``.

    Each metric ``m`` is ``Σ_b m_b w_b / Σ_b w_b`` with ``w_b`` the batch's ``tokens``
    (1 if absent); ``tokens`` itself is summed and ``perplexity = exp(loss)`` added.

    Example:
        >>> ev = lambda p, b: {"loss": b["l"], "tokens": b["n"]}
        >>> evaluate(ev, None, [{"l": 1.0, "n": 1.0}, {"l": 4.0, "n": 3.0}])["loss"]
        3.25
    """
    sums: dict[str, float] = {}
    total = 0.0
    n = 0
    check = eval_step.check_batch if isinstance(eval_step, CheckedStep) else None
    if check is not None and place_batch is not None:  # check the host batch, then place it
        eval_step = eval_step.unchecked
    for batch in batches:
        if place_batch is not None:
            if check is not None:
                check(batch)
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
    """The work dir holds a run's history but nothing to resume it from (see ``fit``'s
    ``restart``)."""


def _check_history(workdir: str, start: int, restart: bool) -> None:
    """Refuse to start at ``start`` over a recorded history that goes further (no readable
    checkpoint: all corrupted and moved aside, or a kill before the first one)."""
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    last = max((int(r.get("step", 0)) for r in records), default=0)
    lost = last > start
    if jax.process_count() > 1:  # the same answer on every process (process 0 decides)
        from jax.experimental import multihost_utils

        lost = bool(multihost_utils.broadcast_one_to_all(np.int32(lost)))
    if not lost:
        return
    if restart:
        set_aside_history(workdir)
        return
    corrupted = os.path.join(workdir, "checkpoints.corrupted")
    where = (f" (unreadable checkpoints were moved to {corrupted})"
             if os.path.isdir(corrupted) else "")
    raise ResumeError(
        f"work dir {workdir} holds the history of a run up to step {last} (metrics.jsonl) but "
        f"no readable checkpoint to resume it from{where}; starting at step {start} would "
        "overwrite that history. Start over explicitly with fit(..., restart=True) "
        "(`seqjax train ... --restart`), which keeps the old metrics as "
        "metrics.jsonl.<time>.old, or use a new work dir."
    )


class _Prefetcher:
    """Host batches ``start .. end − 1`` made ahead by a background thread: ``produce(i)``
    (next, check, place) and the data position after it (``position_after(i + 1)``), at
    most ``depth`` ahead. An error is raised by :meth:`get` at the batch it belongs to."""

    def __init__(self, produce: Callable[[int], Any], position_after: Callable[[int], Any],
                 start: int, end: int, depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.position: Any = None
        self._thread = threading.Thread(
            target=self._run, args=(produce, position_after, start, end),
            name="seqjax-prefetch", daemon=True)
        self._thread.start()

    def _run(self, produce: Callable[[int], Any], position_after: Callable[[int], Any],
             start: int, end: int) -> None:
        for i in range(start, end):
            try:
                item = (i, produce(i), position_after(i + 1), None)
            except BaseException as err:  # handed to the main thread at batch i
                item = (i, None, None, err)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or item[3] is not None:
                return

    def get(self, i: int) -> Any:
        j, batch, position, err = self._queue.get()
        if j != i:  # cannot happen: batches are consumed in order
            raise RuntimeError(f"prefetched batch {j} where batch {i} was expected.")
        if err is not None:
            raise err
        self.position = position
        return batch

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass


def _batches(data: Any, start: int, data_state: Any) -> Callable[[int], Any]:
    """``get(i)`` = the batch of 0-based step ``i``, for a callable or an iterator."""
    if not hasattr(data, "__next__"):
        if callable(data):
            return data
        data = iter(data)
    if start:
        if data_state is not None and hasattr(data, "set_state"):
            data.set_state(data_state)
        else:
            for _ in range(start):  # no saved position: replay the stream
                next(data)
    return lambda i: next(data)


def _data_state(data: Any, step: int) -> Any:
    if hasattr(data, "get_state"):
        return data.get_state()
    return {"batches_consumed": step}


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
    restart: bool = False,
) -> FitResult:
    """Train ``state`` to ``config.num_steps`` steps, resuming from ``workdir``'s checkpoints.

    Args:
        state: the initial state (also the template — structure, shapes, shardings —
            for restoring).
        train_step: ``(state, batch) -> (state, metrics)``, e.g. from
            :func:`seqjax.train.step.make_train_step`.
        train_data: an iterator of batches (with ``get_state``/``set_state`` to resume
            its position exactly; otherwise it is replayed), or ``f(i) -> batch`` for the
            0-based step ``i``.
        config: a :class:`FitConfig`.
        workdir: checkpoints, logs and plots go here; ``None`` = nothing is written.
        eval_step: ``(params, batch) -> metrics`` (e.g. :func:`seqjax.train.step.make_eval_step`).
        eval_data: a list of batches or a function returning a fresh iterable of them.
        place_batch: applied to every training batch before the step; default
            ``parallel.place`` (this process's rows → global arrays) when ``parallel`` is
            given.
        place_eval_batch: the same for evaluation batches; default ``place_batch``, or
            ``parallel.place_global`` (evaluation batches are global, held by every
            process) when ``parallel`` is given.
        model_config: JSON-able dict saved with checkpoints and checked on restore.
        tokenizer: JSON dict/string saved with checkpoints.
        hooks: called with every logged record.
        parallel: the :class:`seqjax.train.parallel.Parallel` the state and steps were
            built with: recorded in ``run.json``; MFU is over its devices. Without it the
            devices are read off the state's shardings.
        restart: start from ``state`` although ``workdir`` holds the history
            (``metrics.jsonl``) of a run that has no readable checkpoint to resume from;
            that history is moved to ``metrics.jsonl.<time>.old``. Without it such a work
            dir is a :class:`ResumeError` — a run's history is never overwritten silently.

    Returns:
        A :class:`FitResult`. Raises :class:`NonFiniteLossError` on NaN/inf.
    """
    cfg = config
    check_distributed()
    primary = jax.process_index() == 0
    if parallel is not None:
        place_batch = parallel.place if place_batch is None else place_batch
        if place_eval_batch is None:
            place_eval_batch = parallel.place_global
    if place_eval_batch is None:
        place_eval_batch = place_batch
    info = (write_run_info(workdir, parallel, state) if workdir is not None
                else run_info(state, parallel))
    workdir = None if workdir is None else os.path.abspath(os.fspath(workdir))
    ckpt = None
    start = int(host_value(state.step))
    data_state = None
    if workdir is not None:
        os.makedirs(workdir, exist_ok=True)
        ckpt = Checkpointer(
            os.path.join(workdir, "checkpoints"),
            keep=cfg.keep_checkpoints,
            best_metric=cfg.best_metric,
            best_mode=cfg.best_mode,
            async_save=cfg.async_checkpointing,
            model_config=model_config,
            tokenizer=tokenizer,
        )
        try:
            restored = ckpt.restore(state)
            if restored is None:
                _check_history(workdir, start, restart)
        except BaseException:
            ckpt.close()
            raise
        if restored is not None:
            state, start, data_state = restored.state, restored.step, restored.data_state
            if primary:
                print(f"resumed from step {start} ({workdir}/checkpoints)", file=sys.stderr)
    # A device-resident source (e.g. seqjax.data.device.DeviceLMWindows) draws each step's
    # batch inside the jitted call; anything else yields host batches.
    device_source = callable(getattr(train_data, "device_batch", None))
    if (device_source or cfg.steps_per_call > 1) and not isinstance(train_step, TrainStep):
        raise TypeError(
            "a device-resident `train_data` and `steps_per_call` > 1 need the train step of "
            "make_train_step / Parallel.train_step (a TrainStep); got "
            f"{type(train_step).__name__}.")
    if device_source:
        if data_state is not None and hasattr(train_data, "set_state"):
            train_data.set_state(data_state)
        get_batch = None
    else:
        get_batch = _batches(train_data, start, data_state)

    metrics_path = None if workdir is None else os.path.join(workdir, "metrics.jsonl")
    if primary and workdir is not None:  # an optional output left out says so, once
        for flag, module, what, extra in (
                (cfg.tensorboard, "tensorboardX", "TensorBoard events", "tensorboard"),
                (cfg.plot, "matplotlib", "loss.png and perplexity.png", "plot")):
            if flag is None and not wanted(None, module):
                print(f"fit: {what} not written: {module} is not installed "
                      f'(pip install "seqjax[{extra}]").', file=sys.stderr)
    writer = None
    if primary and metrics_path is not None:
        kept = [r for r in read_metrics(metrics_path) if r.get("step", 0) <= start]
        with open(metrics_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        if wanted(cfg.tensorboard, "tensorboardX"):
            writer = tensorboard_writer(os.path.join(workdir, "tensorboard"),
                                         purge_step=start + 1 if start or restart else None)

    # Token ids are checked on the host batch, before it is placed on the devices (the
    # jitted step cannot see them; see seqjax.train.step.make_batch_check).
    check_batch = train_step.check_batch if isinstance(train_step, CheckedStep) else None
    run_step = train_step.unchecked if isinstance(train_step, CheckedStep) else train_step
    peak = cfg.peak_flops or peak_flops_per_device()
    n_dev = int(info["devices"])
    history: list[dict] = []
    eval_metrics: dict = {}
    last_metrics: dict = {}
    last_finite: dict = {}
    bar = None
    if cfg.progress and primary and start < cfg.num_steps:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.num_steps, initial=start, desc="train", unit="step",
                   dynamic_ncols=True, file=sys.stderr, mininterval=0.5)
    t0 = time.perf_counter()
    clock = {"t": t0, "step": start, "tokens": 0.0}

    def write(record: dict) -> None:
        history.append(record)
        if metrics_path is not None and primary:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if writer is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, int | float):
                    writer.add_scalar(k, v, record["step"])
        if cfg.print_logs and primary:
            text = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                             for k, v in record.items() if k != "time")
            (bar.write if bar is not None else print)(text)
        for hook in hooks:
            hook(record)

    k = cfg.steps_per_call
    first_end = min(start + k - start % k, cfg.num_steps)  # the last step of the first call

    def is_log(s: int) -> bool:
        return s % cfg.log_every == 0 or s == first_end or s == cfg.num_steps

    def flush(pending: list[tuple[int, int, Any]]) -> dict | None:
        """Fetch the pending calls' metrics (all transfers started together), check every
        step's in order, and return the record of the last step if it is logged."""
        fetched = host_value([m for _, _, m in pending])  # every transfer started at once
        for (s_end, n, _), m_host in zip(pending, fetched):
            for j in range(n):  # a call of n steps returns every metric stacked on [n]
                s = s_end - n + 1 + j
                m = {key: float(v[j] if np.ndim(v) else v) for key, v in m_host.items()}
                for name in cfg.finite_check:
                    if name in m and not math.isfinite(m[name]):
                        hint = non_finite_hint(m, last_finite or None,
                                               check_batch is not None or device_source)
                        raise NonFiniteLossError(s, name, m[name], workdir, hint)
                last_finite.clear()
                last_finite.update(m)
                clock["tokens"] += m.get("tokens", 0.0)
        last_metrics.clear()
        last_metrics.update(m)
        s = pending[-1][0]
        pending.clear()
        if bar is not None:
            bar.update(s - bar.n)
        if not is_log(s):
            return None
        now = time.perf_counter()
        dt, ds = max(now - clock["t"], 1e-9), s - clock["step"]
        record = {"step": s, **m, "steps_per_s": ds / dt, "time": now - t0}
        if clock["tokens"]:
            record["tokens_per_s"] = clock["tokens"] / dt
        if cfg.flops_per_step and peak:
            record["mfu"] = cfg.flops_per_step * ds / dt / (peak * n_dev)
        clock.update(t=now, step=s, tokens=0.0)
        if bar is not None:
            post = {"loss": f"{m.get('loss', float('nan')):.4f}"}
            if "tokens_per_s" in record:
                post["tok/s"] = f"{record['tokens_per_s']:.3g}"
            if "mfu" in record:
                post["mfu"] = f"{record['mfu']:.1%}"
            bar.set_postfix(post, refresh=False)
        return record

    def save(s: int, metrics: Mapping[str, Any]) -> None:
        if ckpt is not None:
            # the position after the batches trained on (a prefetcher has read further)
            position = (prefetcher.position if prefetcher is not None
                        else _data_state(train_data, s))
            ckpt.save(state, data_state=position, metrics=metrics, step=s)

    def run_eval() -> dict:
        batches = eval_data() if callable(eval_data) else eval_data
        out = evaluate(eval_step, state.params, batches, place_batch=place_eval_batch)
        return {f"eval/{k}": v for k, v in out.items()}

    def host_batch(i: int) -> Any:
        """The checked, placed batch of 0-based step ``i``."""
        batch = get_batch(i)
        if check_batch is not None:
            try:
                check_batch(batch)
            except ValueError as err:
                raise ValueError(f"{err} (the training batch of step {i + 1}; nothing "
                                 "was trained on it)") from None
        return batch if place_batch is None else place_batch(batch)

    depth = cfg.prefetch if cfg.prefetch is not None else (
        0 if jax.default_backend() == "cpu" else 2)
    prefetcher = None  # started inside the try below, so that `finally` always stops it

    def run_call(state: TrainState, s: int, n: int) -> tuple[TrainState, Any]:
        """Steps ``s + 1 .. s + n`` in one jitted call."""
        if device_source:
            return train_step.steps_from(train_data, n)(state, train_data.arrays)
        next_batch = host_batch if prefetcher is None else prefetcher.get
        if k == 1:
            return run_step(state, next_batch(s))
        batches = tuple(next_batch(i) for i in range(s, s + n))
        return train_step.steps(n)(state, batches)

    status = "completed"
    frozen = cfg.freeze_gc and gc.isenabled()
    in_flight = max(1, _MAX_IN_FLIGHT // k)
    with SignalGuard(cfg.handle_signals) as guard:
        try:
            if frozen:
                gc.collect()
                gc.freeze()
            if depth and not device_source and start < cfg.num_steps:
                prefetcher = _Prefetcher(host_batch, lambda i: _data_state(train_data, i),
                                         start, cfg.num_steps, depth)
            pending: list[tuple[int, int, Any]] = []
            s = start
            while s < cfg.num_steps:
                # k steps per call, aligned to multiples of k; a shorter call to reach one
                # (a run resumed off the grid) or the last step.
                n = min(k - s % k, cfg.num_steps - s)
                state, m_dev = run_call(state, s, n)
                s += n
                pending.append((s, n, m_dev))
                final = s == cfg.num_steps
                stop = guard.should_stop(s)
                do_eval = eval_step is not None and eval_data is not None and (
                    final or (cfg.eval_every and s % cfg.eval_every == 0))
                do_save = ckpt is not None and (
                    final or do_eval or (cfg.checkpoint_every and s % cfg.checkpoint_every == 0)
                    or stop)
                if not (is_log(s) or do_eval or do_save or final or stop):
                    if len(pending) > in_flight:  # back-pressure: stay a few steps ahead
                        jax.block_until_ready(pending[-1 - in_flight][2])
                    continue
                rec = flush(pending)
                if do_eval:
                    eval_metrics = run_eval()
                    rec = {**(rec or {"step": s, **last_metrics}), **eval_metrics}
                if rec is not None:
                    write(rec)
                if do_save:
                    save(s, {**last_metrics, **eval_metrics} if do_eval else last_metrics)
                if stop and not final:
                    status = "interrupted"
                    msg = (f"{guard.requested}: stopped at step {s}"
                           + (f"; checkpoint saved in {workdir}" if ckpt is not None else ""))
                    (bar.write if bar is not None else print)(msg, file=sys.stderr)
                    break
        finally:
            if prefetcher is not None:
                prefetcher.close()
            if frozen:
                gc.unfreeze()
            if bar is not None:
                bar.close()
            if ckpt is not None:
                ckpt.close()
            if writer is not None:
                writer.close()
    if primary and workdir is not None and wanted(cfg.plot, "matplotlib"):
        plot_curves(read_metrics(metrics_path), workdir)
    return FitResult(state=state, status=status, start_step=start, history=history,
                     eval_metrics=eval_metrics)

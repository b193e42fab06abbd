"""The parts :func:`seqjax.train.loop.fit` is made of, each usable and testable alone:
:func:`resume`, :class:`BatchSource`, :class:`MetricsLog`, :class:`MetricsFetch`,
:class:`Throughput`, and the pure functions :func:`step_actions` and :func:`call_steps`."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.experimental.checkify import JaxRuntimeError

from seqjax._checks import ConfigBase, check_positive_int
from seqjax._io import write_atomic
from seqjax.train.checkpoint import Checkpointer
from seqjax.train.records import (
    NonFiniteLossError,
    non_finite_hint,
    read_metrics,
    tensorboard_writer,
    wanted,
)
from seqjax.train.sharding import host_value
from seqjax.train.step import TrainStep
from seqjax.train.write_errors import writing

__all__ = ["CHECKED_ENV", "FitConfig", "checked_by_default", "BatchSource",
           "DataIteratorError", "MetricsFetch", "MetricsLog", "Resumed", "StepPlan", "Throughput",
           "call_steps", "process_uptime", "resume", "step_actions"]


#: ``1`` runs every ``fit`` of ``seqjax train`` under :func:`seqjax.checked`; read by the
#: command line (:class:`seqjax.experiments._runner.Switches`), not by ``fit``.
CHECKED_ENV = "SEQJAX_CHECKED"

# What ``FitConfig(checked=None)`` means where it is made (see ``checked_by_default``).
_CHECKED_DEFAULT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "seqjax_checked_default", default=False)


@contextlib.contextmanager
def checked_by_default(on: bool) -> Iterator[None]:
    """Within the block, a :class:`FitConfig` made with ``checked=None`` (the default) has
    ``checked=on``; outside any block it is off. How ``seqjax train --checked`` (or
    ``$SEQJAX_CHECKED``, read by the command line) reaches the configs a recipe makes.

    Example:
        >>> with checked_by_default(True):
        ...     FitConfig(steps=1).checked
        True
    """
    if not isinstance(on, bool):
        raise TypeError(f"`on` must be a bool; got {on!r}.")
    token = _CHECKED_DEFAULT.set(on)
    try:
        yield
    finally:
        _CHECKED_DEFAULT.reset(token)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitConfig(ConfigBase):
    """How :func:`fit` runs.

    Attributes:
        steps: train until ``state.step == steps``.
        log_every: steps between logged records (also the first step and the last).
        eval_every: steps between evaluations; 0 = only at the end (needs ``eval_data``).
        checkpoint_every: steps between checkpoints; 0 = only at the end (needs a work dir).
        keep_checkpoints: the most recent checkpoints kept.
        best_metric: also keep the best checkpoint by this logged metric (``None`` = off).
        best_mode: ``"min"`` or ``"max"``.
        async_checkpointing: write checkpoints in a background thread.
        progress: show a tqdm bar.
        print_logs: print one line per logged record.
        tensorboard: write TensorBoard events (``True`` needs ``seqjax[tensorboard]``);
            ``None`` (default) = if tensorboardX is installed.
        plot: draw ``loss.png`` and ``perplexity.png`` at the end (``True`` needs
            ``seqjax[plot]``); ``None`` (default) = if matplotlib is installed.
        handle_signals: SIGTERM/SIGINT save and stop (main thread only).
        finite_check: metrics that must stay finite.
        flops_per_step: model FLOPs per step (e.g. ``6 · params · tokens``) to report MFU.
        peak_flops: peak FLOP/s per device for MFU; ``None`` = look up the device kind.
        steps_per_call: steps per jitted call (:meth:`~seqjax.train.step.TrainStep.steps`),
            cutting host overhead; the ``*_every`` intervals must be multiples of it, and a stop
            is honoured at a call's end. Needs :func:`~seqjax.train.step.make_train_step`'s step.
        prefetch: host batches a thread prepares ahead; ``None`` (default): 2 on an
            accelerator, 0 on the CPU (where it would compete with XLA).
        freeze_gc: ``gc.freeze()`` everything allocated before training (shorter collections);
            undone when ``fit`` returns.
        compile_ahead: compile the first call (device-resident data) and the evaluation step in
            threads while the checkpoint is read; ``None`` (default): not on the CPU.
        checked: run every call under :func:`seqjax.checked` (debugging): an invalid token id,
            length or cache overflow raises instead of making the loss NaN. ``None`` (default)
            is resolved at creation: on inside :func:`checked_by_default`, else off.
    """

    steps: int
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
    compile_ahead: bool | None = None
    checked: bool | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "eval_every", "checkpoint_every"):
            if isinstance(v := getattr(self, name), bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"`{name}` must be an int >= 0; got {v!r}.")
        for name in ("log_every", "keep_checkpoints", "steps_per_call"):
            check_positive_int(getattr(self, name), name)
        if self.prefetch is not None and (isinstance(self.prefetch, bool) or not isinstance(
                self.prefetch, int) or self.prefetch < 0):
            raise ValueError(f"`prefetch` must be None or an int >= 0; got {self.prefetch!r}.")
        for name in ("compile_ahead", "checked"):
            if (v := getattr(self, name)) is not None and not isinstance(v, bool):
                raise ValueError(f"`{name}` must be True, False or None; got {v!r}.")
        k = self.steps_per_call
        for name in ("log_every", "eval_every", "checkpoint_every"):
            if (v := getattr(self, name)) % k:
                raise ValueError(f"`{name}` must be a multiple of steps_per_call={k}; got {v}.")
        if self.checked is None:
            object.__setattr__(self, "checked", _CHECKED_DEFAULT.get())


def process_uptime() -> float | None:
    """Seconds since this process started (Linux ``/proc``), ``None`` where unknown."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# --------------------------------------------------------------------------- step plan


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """What ``fit`` does after the call that reaches a step (:func:`step_actions`).

    Attributes:
        log: write a record (``metrics.jsonl``, TensorBoard, the bar, the hooks).
        evaluate: run the evaluation (its metrics join the record and the checkpoint).
        save: write a checkpoint.
        stop: return ``"interrupted"`` after the save (a stop requested before the last step).
    """

    log: bool = False
    evaluate: bool = False
    save: bool = False
    stop: bool = False

    @property
    def fetch(self) -> bool:
        """Whether the step's metrics are fetched (and checked finite): anything to do at all."""
        return self.log or self.evaluate or self.save or self.stop


def call_steps(s: int, cfg: FitConfig) -> int:
    """Steps in the call that starts after step ``s``: ``k = cfg.steps_per_call``, aligned to
    multiples of ``k`` (shorter to reach one, or the last step ``cfg.steps``); 0 when done.

    Example:
        >>> cfg = FitConfig(steps=10, steps_per_call=4, log_every=4)
        >>> [call_steps(s, cfg) for s in (0, 3, 4, 8, 10)]
        [4, 1, 4, 2, 0]
    """
    k = cfg.steps_per_call
    return max(0, min(k - s % k, cfg.steps - s))


def step_actions(s: int, cfg: FitConfig, start: int, *, evaluates: bool, saves: bool,
                 stop_requested: bool = False) -> StepPlan:
    """What ``fit`` does after the call that reaches step ``s`` of a run (re)started at ``start``.

    * log: every ``cfg.log_every`` steps, the first call's last step and the last step;
    * evaluate (if ``evaluates``): every ``cfg.eval_every`` steps (0 = never) and the last step;
    * save (if ``saves``: a work dir): every ``cfg.checkpoint_every`` steps (0 = never), at every
      evaluation, the last step, and on a stop request;
    * stop: ``stop_requested`` (SIGTERM/SIGINT, agreed by every process) before the last step.

    Only steps that end a call (:func:`call_steps`) are asked about.

    Example:
        >>> cfg = FitConfig(steps=6, log_every=4, checkpoint_every=3)
        >>> step_actions(3, cfg, 0, evaluates=False, saves=True)
        StepPlan(log=False, evaluate=False, save=True, stop=False)
    """
    final = s == cfg.steps
    first = s == start + call_steps(start, cfg)
    evaluate = evaluates and (final or _every(s, cfg.eval_every))
    return StepPlan(
        log=_every(s, cfg.log_every) or first or final,
        evaluate=evaluate,
        save=saves and (final or evaluate or _every(s, cfg.checkpoint_every) or stop_requested),
        stop=stop_requested and not final)


def _every(s: int, interval: int) -> bool:
    """Whether step ``s`` is one of every ``interval`` steps (0 = never)."""
    return interval > 0 and s % interval == 0


# --------------------------------------------------------------------------- resume


class Resumed(NamedTuple):
    """What :func:`resume` found: checkpointer (``None`` without a work dir), state, 0-based start
    step, the data position saved with it (or ``None``), whether a history was set aside."""

    checkpointer: Checkpointer | None
    state: Any
    start: int
    data_state: Any
    started_over: bool = False


def resume(state: Any, workdir: str | None, *, keep: int, best_metric: str | None,
           best_mode: str, async_save: bool, model_config: Mapping[str, Any] | None,
           tokenizer: Any, check_history: Callable[[str, int], bool]) -> Resumed:
    """Open ``workdir``'s checkpoints and restore the newest readable one into ``state``'s
    structure; with none, ``check_history(workdir, start)`` decides whether a recorded history may
    be started over (raises if not; ``True`` when set aside). Prints
    :meth:`~seqjax.train.checkpoint.Checkpointer.space_warning` if free space is short."""
    start = int(host_value(state.step))
    if workdir is None:
        return Resumed(None, state, start, None)
    os.makedirs(workdir, exist_ok=True)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep=keep,
                        best_metric=best_metric, best_mode=best_mode, async_save=async_save,
                        model_config=model_config, tokenizer=tokenizer)
    try:
        restored = ckpt.restore(state)
        started_over = bool(check_history(workdir, start)) if restored is None else False
    except BaseException:
        ckpt.close()
        raise
    if jax.process_index() == 0 and (warning := ckpt.space_warning(state)) is not None:
        print(warning, file=sys.stderr)
    if restored is None:
        return Resumed(ckpt, state, start, None, started_over)
    if jax.process_index() == 0:
        print(f"resumed from step {restored.step} ({workdir}/checkpoints)", file=sys.stderr)
    return Resumed(ckpt, restored.state, restored.step, restored.data_state)


# --------------------------------------------------------------------------- batches


class _Prefetcher:
    """Host batches ``start .. end − 1`` made up to ``depth`` ahead by a thread: ``produce(i)`` and
    ``position_after(i + 1)``; an error is raised by :meth:`get` at its batch."""

    def __init__(self, produce: Callable[[int], Any], position_after: Callable[[int], Any],
                 start: int, end: int, depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self.position: Any = None

        def run() -> None:
            for i in range(start, end):
                item: tuple[int, Any, Any, BaseException | None]
                try:
                    item = (i, produce(i), position_after(i + 1), None)
                except BaseException as err:  # handed to the main thread at batch i
                    item = (i, None, None, err)
                while not self._stop.is_set():
                    with contextlib.suppress(queue.Full):
                        self._queue.put(item, timeout=0.05)
                        break
                if self._stop.is_set() or item[3] is not None:
                    return

        self._thread = threading.Thread(target=run, name="seqjax-prefetch", daemon=True)
        self._thread.start()

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
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)


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
    return data.get_state() if hasattr(data, "get_state") else {"batches_consumed": step}


def compile_in_background(lower: Callable[[], Any], name: str) -> threading.Thread:
    """Compile ``lower()``'s program in a daemon thread for JAX's cache; failures are left to the
    real call."""

    def run() -> None:
        with contextlib.suppress(Exception):  # the real call raises it with its context
            lower().compile()

    thread = threading.Thread(target=run, name=f"seqjax-compile-{name}", daemon=True)
    thread.start()
    return thread


class DataIteratorError(RuntimeError):
    """The training data failed: ``next()`` of the iterator (or ``f(i)``) raised, or the stream
    ended before the last step. Failing evaluation data is the same error, ``source`` naming it.

    Attributes: ``step`` (1-based step whose batch could not be made, nothing trained on it; for
    evaluation, the last completed step, which ``fit`` saves first), ``source``, ``error`` (also
    ``__cause__``), ``checkpoint`` (``(step, path)`` of the newest intact checkpoint or ``None``;
    filled in by ``fit`` after saving), ``resume`` (the resume command; set by ``seqjax train``).
    ``str()`` is one line with all of them.
    """

    def __init__(self, step: int, error: BaseException,
                 source: str = "the data iterator") -> None:
        super().__init__(step, error)
        self.step, self.error, self.source = step, error, source
        self.checkpoint: tuple[int, str] | None = None
        self.resume: str | None = None

    def __str__(self) -> str:
        if isinstance(self.error, StopIteration):
            what = f"{self.source} ran out of batches (StopIteration) at step {self.step}"
        else:
            text = str(self.error).strip().splitlines()
            what = (f"{self.source} raised {type(self.error).__name__}"
                    + (f": {text[0]}" if text else "") + f" at step {self.step}")
        resume = self.resume or "rerunning the same call (same work dir)"
        if self.checkpoint is None:
            return (f"{what}; no checkpoint was written: once the cause is gone, {resume} "
                    "starts over.")
        step, path = self.checkpoint
        return (f"{what}; the newest intact checkpoint is step {step} ({path}); once the "
                f"cause is gone, {resume} resumes from it.")


class BatchSource:
    """What each jitted call of ``fit`` trains on, from 0-based step ``start``.

    A ``data`` with ``device_batch`` (:class:`seqjax.data.device.DeviceLMWindows`) is drawn inside
    the call (:meth:`~seqjax.train.step.TrainStep.steps_from`); anything else gives host batches,
    from an iterator (``get_state``/``set_state`` resume its position, else it is replayed) or
    ``f(i) -> batch``, checked by ``check_batch``, placed by ``place_batch`` and prefetched
    (``prefetch``: as in :class:`FitConfig`).
    """

    def __init__(self, data: Any, train_step: Callable, *, start: int, data_state: Any,
                 place_batch: Callable[[Any], Any] | None, steps_per_call: int,
                 prefetch: int | None, steps: int, checked: bool = False,
                 check_batch: Callable[[Any], None] | None = None) -> None:
        self.device = callable(getattr(data, "device_batch", None))
        if (self.device or steps_per_call > 1) and not isinstance(train_step, TrainStep):
            raise TypeError(
                "a device-resident `train_data` and `steps_per_call` > 1 need the train step "
                "of make_train_step / Parallel.train_step (a TrainStep); got "
                f"{type(train_step).__name__}.")
        self.data, self.k = data, steps_per_call
        self.train_step: Any = train_step  # a TrainStep, or any step(state, batch) when k = 1
        self.check_batch = check_batch
        self._place = place_batch
        self._checked: dict[Any, Callable] | None = {} if checked else None
        self._prefetcher: _Prefetcher | None = None
        self._get: Callable[[int], Any] | None = None
        #: the data position before the batches of the last call (host data): what a
        #: checkpoint of the state before a failed call is saved with.
        self.call_position: Any = data_state
        if self.device:
            if data_state is not None and hasattr(data, "set_state"):
                data.set_state(data_state)
        else:
            self._get = _batches(data, start, data_state)
            if prefetch is None:
                prefetch = 0 if jax.default_backend() == "cpu" else 2
            if prefetch and start < steps:
                self._prefetcher = _Prefetcher(self._host_batch,
                                               lambda i: _data_state(data, i),
                                               start, steps, prefetch)

    def _host_batch(self, i: int) -> Any:
        """Step ``i``'s (0-based) checked, placed batch; an iterator error is a
        :class:`DataIteratorError` of step ``i + 1``."""
        assert self._get is not None  # host data
        try:
            batch = self._get(i)
        except Exception as err:  # noqa: BLE001 - any failure of the data is reported so
            raise DataIteratorError(i + 1, err) from err
        if self.check_batch is not None:
            try:
                self.check_batch(batch)
            except ValueError as err:
                raise ValueError(f"{err} (the training batch of step {i + 1}; nothing "
                                 "was trained on it)") from None
        return batch if self._place is None else self._place(batch)

    @staticmethod
    def compile_ahead_of(train_step: TrainStep, data: Any, state: Any,
                         n: int) -> threading.Thread:
        """Start compiling in a thread the call of ``n`` steps on device-resident ``data`` for
        ``state``'s shapes and shardings."""
        run = train_step.steps_from(data, n)
        return compile_in_background(lambda: run.lower(state, data.arrays), "train")

    def _fn(self, kind: str, n: int) -> Callable:
        fn = {"device": lambda: self.train_step.steps_from(self.data, n),
              "one": lambda: self.train_step, "steps": lambda: self.train_step.steps(n)}[kind]
        if self._checked is None:
            return fn()
        if (kind, n) not in self._checked:
            from seqjax._traced_checks import checked

            self._checked[(kind, n)] = checked(fn())
        return self._checked[(kind, n)]

    def call(self, state: Any, s: int, n: int) -> tuple[Any, Any]:
        """Steps ``s + 1 .. s + n`` in one jitted call: ``(state, metrics)``; with
        ``checked``, a failed check raises, noted with the call's steps."""
        try:
            if self.device:
                return self._fn("device", n)(state, self.data.arrays)
            self.call_position = self.position(s)  # where a failed call leaves the data
            next_batch = self._host_batch if self._prefetcher is None else self._prefetcher.get
            if self.k == 1:
                return self._fn("one", 1)(state, next_batch(s))
            batches = tuple(next_batch(i) for i in range(s, s + n))
            return self._fn("steps", n)(state, batches)
        except JaxRuntimeError as err:
            if self._checked is not None:
                steps = f"step {s + 1}" if n == 1 else f"steps {s + 1}-{s + n}"
                note = f"fit: raised by the training call of {steps}."
                if sys.version_info >= (3, 11):
                    err.add_note(note)
                else:  # no notes before Python 3.11: the note joins the message
                    err.args = (*err.args[:1], note, *err.args[1:])
            raise

    def position(self, s: int) -> Any:
        """The data position after steps ``1 .. s`` (a prefetcher's, which has read further)."""
        return _data_state(self.data, s) if self._prefetcher is None else self._prefetcher.position

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()


# --------------------------------------------------------------------------- metrics


class MetricsLog:
    """Where ``fit``'s records go (process 0 only): ``metrics.jsonl`` (cut back to ``start`` on
    resume), TensorBoard, a printed line (``print_logs``), a tqdm bar and ``hooks``."""

    def __init__(self, workdir: str | None, *, start: int, steps: int, restart: bool,
                 progress: bool, print_logs: bool, tensorboard: bool | None,
                 plot: bool | None, hooks: Sequence[Callable[[dict], None]] = ()) -> None:
        self.primary = jax.process_index() == 0
        self.path = None if workdir is None else os.path.join(workdir, "metrics.jsonl")
        self._checkpoints = None if workdir is None else os.path.join(workdir, "checkpoints")
        self.history: list[dict] = []
        self.print_logs, self.hooks = print_logs, hooks
        self.writer = None
        self.bar = None
        if self.primary and workdir is not None and self.path is not None:
            for flag, module, what, extra in (  # an optional output left out says so, once
                    (tensorboard, "tensorboardX", "TensorBoard events", "tensorboard"),
                    (plot, "matplotlib", "loss.png and perplexity.png", "plot")):
                if flag is None and not wanted(None, module):
                    print(f"fit: {what} not written: {module} is not installed "
                          f'(pip install "seqjax[{extra}]").', file=sys.stderr)
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= start]
            with writing("metrics.jsonl", self.path, step=start, checkpoints=self._checkpoints):
                write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
            if wanted(tensorboard, "tensorboardX"):
                self.writer = tensorboard_writer(
                    os.path.join(workdir, "tensorboard"),
                    purge_step=start + 1 if start or restart else None)
        if progress and self.primary and start < steps:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=steps, initial=start, desc="train", unit="step",
                            dynamic_ncols=True, file=sys.stderr, mininterval=0.5)

    def write(self, record: dict) -> None:
        self.history.append(record)
        if self.path is not None and self.primary:
            line = json.dumps(record) + "\n"
            with writing("the metrics record", self.path, step=record.get("step"),
                         needed=len(line), checkpoints=self._checkpoints), \
                    open(self.path, "a") as f:
                f.write(line)
        if self.writer is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, int | float):
                    self.writer.add_scalar(k, v, record["step"])
        if self.print_logs and self.primary:
            self.say("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in record.items() if k != "time"))
        for hook in self.hooks:
            hook(record)

    def say(self, text: str, file: Any = None) -> None:
        """Print a line without breaking the progress bar."""
        (print if self.bar is None else self.bar.write)(text, file=file)

    def advance(self, step: int, record: dict | None) -> None:
        """Move the bar to ``step``; a logged ``record`` updates its loss, tok/s and MFU."""
        if self.bar is None:
            return
        self.bar.update(step - self.bar.n)
        if record is not None:
            post = {"loss": f"{record.get('loss', float('nan')):.4f}"}
            for key, name, fmt in (("tokens_per_s", "tok/s", ".3g"), ("mfu", "mfu", ".1%")):
                if key in record:
                    post[name] = format(record[key], fmt)
            self.bar.set_postfix(post, refresh=False)

    def close(self) -> None:
        for part in (self.bar, self.writer):
            if part is not None:
                part.close()


class MetricsFetch:
    """Holds the devices' metrics of calls since the last fetch (:meth:`add`), fetches them,
    checks each step's ``finite_check`` metrics in order (a
    :class:`~seqjax.train.records.NonFiniteLossError` naming the step) and counts ``tokens``."""

    def __init__(self, finite_check: Sequence[str], workdir: str | None,
                 ids_checked: bool, *, in_flight: int = 8) -> None:
        self.finite_check, self.workdir, self.ids_checked = finite_check, workdir, ids_checked
        self.in_flight = in_flight
        self.pending: list[tuple[int, int, Any]] = []
        self.last: dict = {}
        self.tokens = 0.0

    def add(self, s_end: int, n: int, metrics: Any) -> None:
        """Hold the metrics of a call of ``n`` steps that ends at step ``s_end``."""
        self.pending.append((s_end, n, metrics))

    def wait_behind(self) -> None:
        """Back-pressure: keep the host at most ``in_flight`` calls ahead of the devices."""
        if len(self.pending) > self.in_flight:
            jax.block_until_ready(self.pending[-1 - self.in_flight][2])

    def __call__(self, pending: list[tuple[int, int, Any]] | None = None) -> dict:
        """The last step's metrics; empties ``pending`` (``(last step, steps, metrics)`` per call;
        default: those from :meth:`add`)."""
        pending = self.pending if pending is None else pending
        fetched = host_value([m for _, _, m in pending])
        for (s_end, n, _), m_host in zip(pending, fetched):
            for j in range(n):  # a call of n steps returns every metric stacked on [n]
                m = {key: float(v[j] if np.ndim(v) else v) for key, v in m_host.items()}
                for name in self.finite_check:
                    if name in m and not math.isfinite(m[name]):
                        hint = non_finite_hint(m, self.last or None, self.ids_checked)
                        raise NonFiniteLossError(s_end - n + 1 + j, name, m[name],
                                                 self.workdir, hint)
                self.last = m
                self.tokens += m.get("tokens", 0.0)
        pending.clear()
        return self.last

    def take_tokens(self) -> float:
        tokens, self.tokens = self.tokens, 0.0
        return tokens


class Throughput:
    """Rates between logged steps: ``steps_per_s``, ``tokens_per_s`` (when metrics count tokens),
    ``mfu`` (with ``flops_per_step`` and ``peak``), and ``time`` since the start."""

    def __init__(self, start: int, *, flops_per_step: float | None, peak: float | None,
                 devices: int) -> None:
        self.t0 = time.perf_counter()
        self._t, self._step = self.t0, start
        self.flops, self.peak, self.devices = flops_per_step, peak, devices
        self.first_step_s: float | None = None

    def first_step(self, since: float | None = None) -> float:
        """Seconds from ``since`` (``time.perf_counter()``; default: the start) to now, the
        time to the first step."""
        self.first_step_s = time.perf_counter() - (self.t0 if since is None else since)
        return self.first_step_s

    def record(self, step: int, tokens: float) -> dict:
        now = time.perf_counter()
        dt, ds = max(now - self._t, 1e-9), step - self._step
        out = {"steps_per_s": ds / dt, "time": now - self.t0}
        if tokens:
            out["tokens_per_s"] = tokens / dt
        if self.flops and self.peak:
            out["mfu"] = self.flops * ds / dt / (self.peak * self.devices)
        self._t, self._step = now, step
        return out

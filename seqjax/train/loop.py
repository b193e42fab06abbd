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
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from seqjax._optional import require
from seqjax.train.checkpoint import Checkpointer
from seqjax.train.optim import TrainState

__all__ = [
    "FitConfig",
    "FitResult",
    "NonFiniteLossError",
    "ResumeError",
    "fit",
    "non_finite_hint",
    "evaluate",
    "read_metrics",
    "plot_curves",
    "set_aside_history",
    "write_run_info",
    "peak_flops_per_device",
]

# Steps the host may run ahead of the device between logged steps.
_MAX_IN_FLIGHT = 8

# Dense bf16 peak FLOP/s per chip, by jax `device_kind` substring (vendor data sheets).
_PEAK_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L4": 121e12,
    "V100": 125e12,
}


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN/inf metric; ``step``, ``metric`` and ``value`` say where,
    ``hint`` the likely causes (see :func:`non_finite_hint`)."""

    def __init__(self, step: int, metric: str, value: float, workdir: str | None = None,
                 hint: str | None = None) -> None:
        self.step, self.metric, self.value, self.hint = step, metric, value, hint
        where = f"; the last good checkpoint is in {workdir}/checkpoints" if workdir else ""
        more = f" {hint}" if hint else ""
        super().__init__(
            f"non-finite {metric} = {value} at step {step}; training stopped{where}.{more}")


def non_finite_hint(metrics: Mapping[str, float], last_finite: Mapping[str, float] | None,
                    batches_checked: bool) -> str:
    """The likely causes of a NaN/inf step, most specific first, from what fit saw.

    ``metrics``: the bad step's metrics; ``last_finite``: the previous finite step's
    (``None`` if the first step failed); ``batches_checked``: whether token ids were
    range-checked on the host (a train step with ``check_batch``).
    """
    causes = []
    lr = metrics.get("lr")
    if lr is not None and math.isfinite(lr):
        causes.append(f"a learning rate too high (lr = {lr:.3g} at this step)")
    else:
        causes.append("a learning rate too high")
    if last_finite and "grad_norm" in last_finite:
        causes.append(f"exploding gradients (grad_norm = {last_finite['grad_norm']:.3g} at the "
                      "previous step; clip them, e.g. max_grad_norm=1.0)")
    else:
        causes.append("exploding gradients (clip them, e.g. max_grad_norm=1.0)")
    if not batches_checked:
        causes.append("token ids outside the vocabulary — the batches were not range-checked: "
                      "give make_train_step / Parallel.train_step `vocab_size=` (or use "
                      "make_lm_loss on flax_apply_fn(model)) to check them before the step")
    causes.append("a float16/bfloat16 overflow, if the step computes in half precision")
    return "Likely causes: " + "; ".join(causes) + "."


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

    def __post_init__(self) -> None:
        minimum = {"num_steps": 0, "log_every": 1, "eval_every": 0, "checkpoint_every": 0,
                   "keep_checkpoints": 1}
        for name, low in minimum.items():
            v = getattr(self, name)
            if not isinstance(v, int) or v < low:
                raise ValueError(f"`{name}` must be an int >= {low}; got {v!r}.")


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


def peak_flops_per_device(device: Any = None) -> float | None:
    """Peak dense bf16 FLOP/s of ``device`` (default: the first) from a small table, or None."""
    kind = (device or jax.devices()[0]).device_kind
    for name, flops in _PEAK_FLOPS.items():
        if name.lower() in kind.lower():
            return flops
    return None


def host_value(tree: Any) -> Any:
    """``jax.device_get`` that also reads replicated arrays spanning other processes.

    A global array whose devices are not all addressable (several processes) cannot be
    fetched whole; a fully replicated one is read from this process's first shard.
    """

    def get(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if not x.is_fully_replicated:
                raise ValueError(
                    f"cannot read a sharded array of shape {x.shape} spanning other processes "
                    "on the host; replicate it (out_shardings P()) first."
                )
            return np.asarray(x.addressable_data(0))
        return jax.device_get(x)

    return jax.tree_util.tree_map(get, tree)


def _check_distributed() -> None:
    from seqjax.train.sharding import distributed_requested

    if distributed_requested() and not jax.distributed.is_initialized():
        raise RuntimeError(
            "the environment asks for a multi-process job (JAX_COORDINATOR_ADDRESS, a TPU pod, "
            "SLURM or Open MPI), but jax.distributed is not initialised: call "
            "seqjax.train.maybe_initialize_distributed() (or Parallel.create()) before any "
            "other JAX call."
        )


def _run_info(state: Any, parallel: Any) -> dict[str, Any]:
    from seqjax.train.parallel import describe_state

    info = parallel.describe() if parallel is not None else describe_state(state)
    return {**info, "seqjax": _version()}


def write_run_info(workdir: str | os.PathLike, parallel: Any = None, state: Any = None) -> dict:
    """Write ``workdir/run.json`` (process 0 only, atomically) — what :func:`fit` writes —
    for a run laid out by ``parallel`` (or, without it, by ``state``'s shardings). For
    experiments whose several ``fit`` calls write theirs one level down. Returns the record.
    """
    if parallel is None and state is None:
        raise ValueError("give `parallel` or `state`.")
    info = _run_info(state, parallel)
    if jax.process_index() == 0:
        _write_json(os.path.join(os.path.abspath(os.fspath(workdir)), "run.json"), info)
    return info


def _version() -> str:
    import seqjax

    return seqjax.__version__


def _write_json(path: str, obj: Any) -> None:
    """Atomic JSON write (temporary file + rename)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


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
    check = getattr(eval_step, "check_batch", None)
    if check is not None and place_batch is not None:  # check the host batch, then place it
        eval_step = getattr(eval_step, "unchecked", eval_step)
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


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a ``metrics.jsonl`` file (unreadable trailing lines are ignored)."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a crash; everything after it is suspect
    return out


def plot_curves(records: Sequence[Mapping[str, Any]], workdir: str | os.PathLike) -> list[str]:
    """Draw ``loss.png`` (train and eval cross-entropy) and ``perplexity.png`` in ``workdir``.

    Needs matplotlib (``pip install "seqjax[plot]"``)."""
    matplotlib = require("matplotlib", "plotting training curves (FitConfig(plot=True))")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, transform, ylabel in (
        ("loss", lambda v: v, "cross-entropy (nats/token)"),
        ("perplexity", lambda v: math.exp(min(v, 700.0)), "perplexity"),
    ):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        fig.subplots_adjust(left=0.13, right=0.97, bottom=0.14, top=0.95)  # tight_layout is slow
        for key, label in (("loss", "train"), ("eval/loss", "eval")):
            pts = [(r["step"], transform(r[key])) for r in records
                   if key in r and r[key] is not None and math.isfinite(r[key])]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=label, marker="o" if key != "loss" else None, ms=3)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
        path = os.path.join(os.fspath(workdir), f"{name}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _wanted(flag: bool | None, module: str) -> bool:
    """An optional output of :class:`FitConfig`: ``True``/``False`` as given, ``None`` = when
    ``module`` is installed (``True`` without it fails with the extra to install)."""
    if flag is None:
        if module in sys.modules:  # imported already (or blocked: None)
            return sys.modules[module] is not None
        return importlib.util.find_spec(module) is not None
    return bool(flag)


def _tensorboard_writer(logdir: str, purge_step: int | None) -> Any:
    # tensorboardX imports torch when it can (~5 s) only to accept torch tensors; we log
    # floats, so hide torch during the import unless the user already imported it.
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        tensorboardX = require("tensorboardX",
                               "writing TensorBoard events (FitConfig(tensorboard=True))")
    finally:
        if hide:
            del sys.modules["torch"]
    return tensorboardX.SummaryWriter(logdir=logdir, purge_step=purge_step)


class _SignalGuard:
    """Turn SIGTERM/SIGINT into a stop request while training (restored on exit).

    One process: Python handlers set ``requested``. Several processes: the stop must be
    agreed on. JAX's coordination service catches SIGTERM itself (its preemption notifier)
    and :func:`jax.experimental.multihost_utils.reached_preemption_sync_point` returns True
    on every process at the same step; SIGINT is re-raised as SIGTERM so that Ctrl-C on
    one host takes the same path. Without the preemption service (not initialised through
    ``jax.distributed``) the processes agree by an all-gather of their local flags at every
    step.
    """

    def __init__(self, enabled: bool) -> None:
        self.requested: str | None = None
        self._old: dict[int, Any] = {}
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.multi = jax.process_count() > 1
        self._sync_point: Callable[[int], bool] | None = None
        if self.multi:
            from jax.experimental import multihost_utils

            self._sync_point = multihost_utils.reached_preemption_sync_point
            try:
                self._sync_point(-1)  # probe: raises if the sync manager is absent
            except RuntimeError:
                self._sync_point = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        if self.multi and self._sync_point is not None and signum == signal.SIGINT:
            # hand Ctrl-C to the coordination service's SIGTERM notifier (all processes)
            signal.signal(signal.SIGINT, self._old.get(signal.SIGINT, signal.SIG_DFL))
            signal.raise_signal(signal.SIGTERM)

    def should_stop(self, step: int) -> bool:
        """Whether to save and stop after ``step`` (the same answer on every process)."""
        if not self.multi:
            return self.requested is not None
        if self._sync_point is not None:
            if self._sync_point(step):
                self.requested = self.requested or "SIGTERM"
                return True
            return False
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.int32(self.requested is not None))
        if np.asarray(flags).any():
            self.requested = self.requested or "SIGTERM (another process)"
            return True
        return False

    def __enter__(self) -> _SignalGuard:
        if self.enabled:
            # In a distributed job with the preemption service, SIGTERM belongs to it.
            sigs = (signal.SIGINT,) if self._sync_point is not None else (
                signal.SIGTERM, signal.SIGINT)
            for sig in sigs:
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class ResumeError(RuntimeError):
    """The work dir holds a run's history but nothing to resume it from (see ``fit``'s
    ``restart``)."""


def set_aside_history(workdir: str | os.PathLike) -> str | None:
    """Move ``workdir/metrics.jsonl`` to ``metrics.jsonl.<time>.old`` (process 0); returns
    the new path, or ``None`` when there was none. What ``fit(restart=True)`` and
    ``seqjax train --restart`` do before starting over."""
    path = os.path.join(os.fspath(workdir), "metrics.jsonl")
    if jax.process_index() != 0 or not os.path.exists(path):
        return None
    dst = f"{path}.{int(time.time())}.old"
    os.replace(path, dst)
    return dst


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
    _check_distributed()
    primary = jax.process_index() == 0
    if parallel is not None:
        place_batch = parallel.place if place_batch is None else place_batch
        if place_eval_batch is None:
            place_eval_batch = parallel.place_global
    if place_eval_batch is None:
        place_eval_batch = place_batch
    run_info = (write_run_info(workdir, parallel, state) if workdir is not None
                else _run_info(state, parallel))
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
    get_batch = _batches(train_data, start, data_state)

    metrics_path = None if workdir is None else os.path.join(workdir, "metrics.jsonl")
    writer = None
    if primary and metrics_path is not None:
        kept = [r for r in read_metrics(metrics_path) if r.get("step", 0) <= start]
        with open(metrics_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        if _wanted(cfg.tensorboard, "tensorboardX"):
            writer = _tensorboard_writer(os.path.join(workdir, "tensorboard"),
                                         purge_step=start + 1 if start or restart else None)

    # Token ids are checked on the host batch, before it is placed on the devices (the
    # jitted step cannot see them; see seqjax.train.step.make_batch_check).
    check_batch = getattr(train_step, "check_batch", None)
    run_step = getattr(train_step, "unchecked", train_step) if check_batch else train_step
    peak = cfg.peak_flops or peak_flops_per_device()
    n_dev = int(run_info["devices"])
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

    def is_log(s: int) -> bool:
        return s % cfg.log_every == 0 or s == start + 1 or s == cfg.num_steps

    def flush(pending: list[tuple[int, Any]]) -> dict | None:
        """Fetch the pending steps' metrics (one transfer), check them in order, and
        return the record of the last one if it is logged."""
        fetched = host_value([m for _, m in pending])
        for (s, _), m_host in zip(pending, fetched):
            m = {k: float(v) for k, v in m_host.items()}
            for name in cfg.finite_check:
                if name in m and not math.isfinite(m[name]):
                    hint = non_finite_hint(m, last_finite or None, check_batch is not None)
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
            ckpt.save(state, data_state=_data_state(train_data, s), metrics=metrics, step=s)

    def run_eval() -> dict:
        batches = eval_data() if callable(eval_data) else eval_data
        out = evaluate(eval_step, state.params, batches, place_batch=place_eval_batch)
        return {f"eval/{k}": v for k, v in out.items()}

    status = "completed"
    with _SignalGuard(cfg.handle_signals) as guard:
        try:
            pending: list[tuple[int, Any]] = []
            for s in range(start + 1, cfg.num_steps + 1):
                batch = get_batch(s - 1)
                if check_batch is not None:
                    try:
                        check_batch(batch)
                    except ValueError as err:
                        raise ValueError(f"{err} (the training batch of step {s}; nothing "
                                         "was trained on it)") from None
                if place_batch is not None:
                    batch = place_batch(batch)
                state, m_dev = run_step(state, batch)
                pending.append((s, m_dev))
                final = s == cfg.num_steps
                stop = guard.should_stop(s)
                do_eval = eval_step is not None and eval_data is not None and (
                    final or (cfg.eval_every and s % cfg.eval_every == 0))
                do_save = ckpt is not None and (
                    final or do_eval or (cfg.checkpoint_every and s % cfg.checkpoint_every == 0)
                    or stop)
                if not (is_log(s) or do_eval or do_save or final or stop):
                    if len(pending) > _MAX_IN_FLIGHT:  # back-pressure: stay a few steps ahead
                        jax.block_until_ready(pending[-1 - _MAX_IN_FLIGHT][1])
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
            if bar is not None:
                bar.close()
            if ckpt is not None:
                ckpt.close()
            if writer is not None:
                writer.close()
    if primary and workdir is not None and _wanted(cfg.plot, "matplotlib"):
        plot_curves(read_metrics(metrics_path), workdir)
    return FitResult(state=state, status=status, start_step=start, history=history,
                     eval_metrics=eval_metrics)

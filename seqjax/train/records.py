"""What a run leaves behind: ``run.json``, ``metrics.jsonl``, TensorBoard events, curves, and
the report of a non-finite step.

:func:`seqjax.train.loop.fit` writes them (process 0 only); :func:`read_metrics` reads them
back. JSON files are written atomically (:func:`seqjax._io.write_json`), so a crash never
leaves half a record; a failed write is a :class:`~seqjax.train.write_errors.WriteError`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from seqjax._io import write_json
from seqjax._optional import require
from seqjax.train.write_errors import writing

__all__ = ["NonFiniteLossError", "non_finite_hint", "plot_curves", "read_metrics",
           "set_aside_history", "write_run_info"]


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN/inf metric: ``step``, ``metric``, ``value``, and ``hint`` (the
    likely causes, :func:`non_finite_hint`)."""

    def __init__(self, step: int, metric: str, value: float, workdir: str | None = None,
                 hint: str | None = None) -> None:
        self.step, self.metric, self.value, self.hint = step, metric, value, hint
        where = f"; the last good checkpoint is in {workdir}/checkpoints" if workdir else ""
        more = f" {hint}" if hint else ""
        super().__init__(
            f"non-finite {metric} = {value} at step {step}; training stopped{where}.{more}")


def non_finite_hint(metrics: Mapping[str, float], last_finite: Mapping[str, float] | None,
                    batches_checked: bool) -> str:
    """The likely causes of a NaN/inf step, most specific first.

    ``metrics``: the bad step's; ``last_finite``: the previous finite step's (``None`` if the
    first failed); ``batches_checked``: whether token ids were range-checked on the host.
    """
    lr, grad_norm = metrics.get("lr"), (last_finite or {}).get("grad_norm")
    causes = [
        "a learning rate too high"
        + (f" (lr = {lr:.3g} at this step)" if lr is not None and math.isfinite(lr) else ""),
        "exploding gradients ("
        + (f"grad_norm = {grad_norm:.3g} at the previous step; " if grad_norm is not None else "")
        + "clip them, e.g. max_grad_norm=1.0)",
    ]
    if not batches_checked:
        causes.append("token ids outside the vocabulary — the batches were not range-checked: "
                      "give fit `check_batch=make_batch_check(vocab_size)` to check them "
                      "before each step")
    causes.append("a float16/bfloat16 overflow, if the step computes in half precision")
    return "Likely causes: " + "; ".join(causes) + "."


def run_info(state: Any, parallel: Any) -> dict[str, Any]:
    from seqjax import __version__
    from seqjax.train.parallel import describe_state

    info = parallel.describe() if parallel is not None else describe_state(state)
    return {**info, "seqjax": __version__}


def write_run_info(workdir: str | os.PathLike, parallel: Any = None, state: Any = None) -> dict:
    """Write ``workdir/run.json`` as :func:`fit` does (process 0, atomically) for a run laid out by
    ``parallel`` (else ``state``'s shardings), for experiments whose ``fit`` calls write theirs a
    level down; returns the record."""
    if parallel is None and state is None:
        raise ValueError("give `parallel` or `state`.")
    info = run_info(state, parallel)
    if jax.process_index() == 0:
        workdir = os.path.abspath(os.fspath(workdir))
        path = os.path.join(workdir, "run.json")
        with writing("run.json", path, checkpoints=os.path.join(workdir, "checkpoints")):
            write_json(path, info)
    return info


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a ``metrics.jsonl`` file (unreadable trailing lines are ignored)."""
    out: list[dict] = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a crash; everything after it is suspect
    return out


def plot_curves(records: Sequence[Mapping[str, Any]], workdir: str | os.PathLike) -> list[str]:
    """Draw ``loss.png`` (train and eval cross-entropy) and ``perplexity.png`` in ``workdir``
    (needs ``seqjax[plot]``)."""
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
        ax.set(xlabel="step", ylabel=ylabel, yscale="log")
        ax.grid(alpha=0.3)
        ax.legend()
        path = os.path.join(os.fspath(workdir), f"{name}.png")
        try:
            with writing(f"{name}.png", path, step=records[-1].get("step") if records else None,
                         checkpoints=os.path.join(os.fspath(workdir), "checkpoints")):
                fig.savefig(path, dpi=100, bbox_inches="tight")  # long tick labels fit
        finally:
            plt.close(fig)
        paths.append(path)
    return paths


def wanted(flag: bool | None, module: str) -> bool:
    """An optional output of :class:`FitConfig`: ``True``/``False`` as given, ``None`` = if
    ``module`` is installed."""
    if flag is not None:
        return bool(flag)
    if module in sys.modules:  # imported already (or blocked: None)
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def tensorboard_writer(logdir: str, purge_step: int | None) -> Any:
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


def set_aside_history(workdir: str | os.PathLike) -> str | None:
    """Move ``workdir/metrics.jsonl`` to ``metrics.jsonl.<time>.old`` (process 0), as
    ``fit(restart=True)`` does; returns the new path or ``None``."""
    path = os.path.join(os.fspath(workdir), "metrics.jsonl")
    if jax.process_index() != 0 or not os.path.exists(path):
        return None
    dst = f"{path}.{int(time.time())}.old"
    os.replace(path, dst)
    return dst

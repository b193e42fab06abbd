"""norm_placement's report: ``norm_placement{tag}.md`` and ``norm_placement{tag}.png``.

:func:`report` writes the table of pre-norm vs post-norm runs, with and without warm-up
(loss at steps 50/100/200, final train and validation loss, gradient norms, or the step
a run diverged at); :func:`plot_curves` draws the train loss and gradient norm of every
run as moving averages. Both read the run dicts of :mod:`seqjax.experiments.norm_placement`;
``cfg`` is its ``Config``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from seqjax.experiments._kit import machine


def _smooth(y: np.ndarray, k: int) -> np.ndarray:
    if len(y) < k or k <= 1:
        return y
    return np.convolve(y, np.ones(k) / k, mode="valid")


def plot_curves(cfg: Any, runs: list[dict], outdir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.9, wspace=0.22)
    colors = {"pre": "tab:blue", "post": "tab:red"}
    k = max(1, min(20, cfg.steps // 20))
    for r in runs:
        if not r["curve"]:
            continue
        steps, loss, gnorm, _ = (np.asarray(v, float) for v in zip(*r["curve"]))
        label = f"{r['norm']}-norm, warm-up {r['warmup']}"
        ls = "-" if r["warmup"] else "--"
        axes[0].plot(steps[k - 1 :], _smooth(loss, k), color=colors[r["norm"]], ls=ls, label=label)
        axes[1].plot(steps[k - 1 :], _smooth(gnorm, k), color=colors[r["norm"]], ls=ls, label=label)
    axes[0].set_ylabel(f"train loss (moving average of {k})")
    axes[1].set_ylabel(f"gradient norm (moving average of {k})")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(
        f"{cfg.model.num_layers}-layer char LM, d={cfg.model.embed_dim}, AdamW "
        f"{cfg.learning_rate:g}, cosine decay",
        fontsize=10,
    )
    path = os.path.join(outdir, f"norm_placement{cfg.tag}.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]


def report(cfg: Any, runs: list[dict], wall: float, command: str, loads: tuple[str, str]) -> str:
    lines = [
        "# norm_placement — pre-norm vs post-norm, with and without warm-up",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Wall time: {wall / 60:.1f} min (load average {loads[0]} before, {loads[1]} after; "
        "the 2 cores were shared with other jobs).",
        "",
        f"Character LM on Tiny Shakespeare (nanoGPT's split): {cfg.model.num_layers} layers, "
        f"d = {cfg.model.embed_dim}, {cfg.model.num_heads} heads, block {cfg.block_size}, batch "
        f"{cfg.batch_size}, {cfg.steps} steps; AdamW (β₂ = 0.99, weight decay "
        f"{cfg.weight_decay:g}), peak learning rate {cfg.learning_rate:g}, cosine decay to "
        f"{cfg.min_lr_ratio:g}× after a linear warm-up of the given length (0 = none); "
        f"gradient clipping {'at ' + format(cfg.clip_norm, 'g') if cfg.clip_norm else 'off'}. "
        "Same initialisation and data order in every run. Validation loss: mean over "
        f"{cfg.eval_batches} random validation windows.",
        "",
        "Anchor: the lecture notes' claim that pre-LN converges faster, and Xiong et al. "
        "(2020) — post-LN needs warm-up, pre-LN does not.",
        "",
        "| norm | warm-up | params | loss @50 | loss @100 | loss @200 | final train loss "
        "| val loss | mean ‖g‖, first 10 steps | max ‖g‖ | train s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        la = [f"{r['loss_at'][s]:.3f}" if s in r["loss_at"] else "" for s in (50, 100, 200)]
        val = (
            f"{r['val_loss']:.3f}"
            if r["val_loss"] is not None
            else f"diverged at {r['diverged_at']}"
        )
        tail = f"{r['train_loss_tail']:.3f}" if r["train_loss_tail"] is not None else ""
        g10 = f"{r['grad_norm_first10']:.3g}" if r["grad_norm_first10"] is not None else ""
        gmax = f"{r['grad_norm_max']:.3g}" if r["grad_norm_max"] is not None else ""
        lines.append(
            f"| {r['norm']} | {r['warmup']} | {r['params']:,} | {' | '.join(la)} | "
            f"{tail} | {val} | {g10} | {gmax} | {r['train_s']:.0f} |"
        )
    lines += ["", f"![loss curves](norm_placement{cfg.tag}.png)", ""]
    return "\n".join(lines)

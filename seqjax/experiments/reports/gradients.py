"""Gradients' report: ``gradients.md``, ``gradients_distance.png``, ``gradients_adding.png``.

:func:`ratio_at` reads ``‖ζ_{T−d}‖ / ‖ζ_T‖`` off a profile of adjoint norms;
:func:`report` tabulates it against ρ^d (MEDL (7.12)) for each model, then the adding
problem's runs against the always-predict-1 baseline (:data:`ADDING_BASELINE_MSE`);
:func:`plot_gradients` draws both parts; the recipe writes ``NAME.json``,
``NAME.md`` and the plots into the work dir and/or ``results_dir``. The profiles and runs
come from :mod:`seqjax.experiments.gradients`, which prints :func:`ratio_at` too.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from seqjax.experiments._kit import machine

ADDING_BASELINE_MSE = 1.0 / 6.0  # always predict 1: Var(u_1 + u_2) = 2/12


def ratio_at(profile: list[float], d: int) -> float:
    """``‖ζ_{T−d}‖ / ‖ζ_T‖`` (``d = 0`` is the last step)."""
    p = np.asarray(profile)
    return float(p[len(p) - 1 - d] / p[-1])


def plot_gradients(cfg: Any, profiles: dict, runs: list[dict], outdir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")

    return [_plot_distance(cfg, profiles, runs, outdir), _plot_adding(runs, outdir)]


def _plot_distance(cfg: Any, profiles: dict, runs: list[dict], outdir: str) -> str:
    """``gradients_distance.png``: the adjoint norms against the distance T − t (Elman, the
    gated cells)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.9, wspace=0.22)
    colors = {r: c for r, c in zip(cfg.radii, ("tab:blue", "tab:green", "tab:red", "tab:purple"))}
    ax = axes[0]
    for name, prof in profiles.items():
        if not name.startswith("elman"):
            continue
        rho = float(name.rsplit("=", 1)[1])
        p = np.asarray(prof)
        d = np.arange(len(p))[::-1]
        style = "--" if "linear" in name else ("-" if f"{cfg.input_scales[0]:g}²" in name else "-.")
        ax.plot(
            d,
            p / p[-1],
            color=colors.get(rho, "k"),
            ls=style,
            lw=1.2,
            label=name.replace("elman ", ""),
        )
    d = np.arange(cfg.distance_steps)
    for rho in cfg.radii:
        ax.plot(d, float(rho) ** d, color=colors.get(rho, "k"), ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_ylim(1e-100, 1e100)
    ax.set_xlabel("distance T − t")
    ax.set_ylabel("‖∂L/∂h_t‖ / ‖∂L/∂h_T‖")
    ax.set_title("Elman, W_hh = ρQ (dotted: ρ^(T−t), the bound)")
    ax.legend(fontsize=6, loc="lower left", ncol=2)
    ax.grid(alpha=0.3)
    ax = axes[1]
    for name, prof in profiles.items():
        if name.startswith("elman"):
            continue
        p = np.asarray(prof)
        ax.plot(np.arange(len(p))[::-1], p / p[-1], label=name)
    for r in runs:
        if "profile" in r:
            p = np.asarray(r["profile"])
            ax.plot(
                np.arange(len(p))[::-1],
                p / p[-1],
                ls="--",
                label=f"{r['cell']} trained, adding T={r['length']}",
            )
    ax.set_yscale("log")
    ax.set_xlabel("distance T − t")
    ax.set_title("gated cells at init (solid) and trained (dashed)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower left")
    ax.grid(alpha=0.3)
    path = os.path.join(outdir, "gradients_distance.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _plot_adding(runs: list[dict], outdir: str) -> str:
    """``gradients_adding.png``: the adding problem's test MSE by step, one panel per T."""
    import matplotlib.pyplot as plt

    lengths = sorted({r["length"] for r in runs})
    fig, axes = plt.subplots(
        1, len(lengths), figsize=(3.2 * len(lengths) + 1, 3.4), squeeze=False, sharey=True
    )
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.15, top=0.88, wspace=0.25)
    cc = {"elman": "tab:red", "lstm": "tab:blue", "gru": "tab:green"}
    for ax, length in zip(axes[0], lengths):
        for r in runs:
            if r["length"] != length or not r["curve"]:
                continue
            s, m = zip(*r["curve"])
            ax.plot(
                s,
                m,
                color=cc[r["cell"]],
                ls="-" if r["clip"] else "--",
                label=f"{r['cell']} {'clip' if r['clip'] else 'no clip'}",
            )
        ax.axhline(ADDING_BASELINE_MSE, color="k", lw=0.8, ls=":", label="baseline 0.167")
        ax.set_yscale("log")
        ax.set_ylim(3e-3, 0.4)
        ax.set_title(f"adding problem, T = {length}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test MSE")
    axes[0][0].legend(fontsize=7, loc="lower left")
    path = os.path.join(outdir, "gradients_adding.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def report(
    cfg: Any, profiles: dict, runs: list[dict], wall: float, command: str, loads: tuple[str, str]
) -> str:
    """``gradients.md``: part A (the adjoint norms against T − t) and part B (the adding
    problem)."""
    dists = [d for d in (1, 10, 50, 100, 200, cfg.distance_steps - 1) if d < cfg.distance_steps]
    lines = [
        "# gradients — BPTT, vanishing/exploding gradients, the adding problem",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Wall time: {wall / 60:.1f} min (load average {loads[0]} before, {loads[1]} after; "
        "the 2 cores were shared with other jobs).",
        "",
        "## A. ‖∂L/∂h_t‖ against the distance T − t (MEDL (7.11)–(7.13))",
        "",
        f"Hidden size {cfg.model.hidden_size}, T = {cfg.distance_steps} (MEDL's T = 300 example), "
        f"batch {cfg.profile_batch} of Gaussian inputs of size {cfg.model.input_size} (scaled by "
        f"{', '.join(f'{v:g}' for v in cfg.input_scales)}: small inputs keep tanh near its "
        "linear regime, N(0, 1) inputs saturate it); "
        "W_hh = ρQ with Q orthogonal (‖W_hh‖₂ = ρ); L = wᵀh_T with a random w. "
        "Entries: ‖∂L/∂h_{T−d}‖ / ‖∂L/∂h_T‖ (mean over the batch), computed by autodiff. "
        "For the linear RNN without input MEDL (7.12) predicts exactly ρ^d; the slides' "
        "bound for tanh (max σ' = 1) is the same ρ^d.",
        "",
        "| model | " + " | ".join(f"d={d}" for d in dists) + " |",
        "|---|" + "---:|" * len(dists),
    ]
    for name, prof in profiles.items():
        lines.append(f"| {name} | " + " | ".join(f"{ratio_at(prof, d):.3g}" for d in dists) + " |")
    for rho in cfg.radii:
        lines.append(
            f"| ρ^d, ρ={rho:g} | " + " | ".join(f"{float(rho) ** d:.3g}" for d in dists) + " |"
        )
    trained = [r for r in runs if "profile" in r]
    if trained:
        lines += [
            "",
            f"Trained on the adding problem (T = {cfg.profile_length}, clipping on; "
            "L = squared error of one test sequence, mean over "
            f"{cfg.profile_batch} sequences):",
            "",
            "| model | " + " | ".join(f"d={d}" for d in dists if d < cfg.profile_length) + " |",
            "|---|" + "---:|" * len([d for d in dists if d < cfg.profile_length]),
        ]
        for r in trained:
            lines.append(
                f"| {r['cell']} (test MSE {r['test_mse']:.4f}) | "
                + " | ".join(
                    f"{ratio_at(r['profile'], d):.3g}" for d in dists if d < cfg.profile_length
                )
                + " |"
            )
    lines += ["", "![gradient norms](gradients_distance.png)", "", *_adding_section(cfg, runs),
              "", "![adding problem](gradients_adding.png)", ""]
    return "\n".join(lines)


def _adding_section(cfg: Any, runs: list[dict]) -> list[str]:
    """Part B of the report: the adding problem's table, one row per (T, cell, clipping)."""
    lines = [
        "## B. The adding problem (baseline: MSE 0.167 by always predicting 1)",
        "",
        f"One recurrent layer of {cfg.model.hidden_size} units, last hidden state → linear "
        f"read-out; Adam {cfg.learning_rate:g}, {cfg.steps} steps × batch {cfg.batch_size} of "
        "fresh sequences; "
        f"test MSE on {cfg.test_examples} held-out sequences. Clipping: global norm "
        f"{cfg.clip_norm:g}. `clipped` is the fraction of steps whose gradient norm exceeded "
        f"{cfg.clip_norm:g}.",
        "",
        "| T | cell | clipping | params | test MSE | vs 0.167 | median ‖g‖ | max ‖g‖ | clipped "
        "| train s |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(runs, key=lambda r: (r["length"], r["cell"], not r["clip"])):
        mse = r["test_mse"]
        status = (
            f"diverged at step {r['diverged_at']}" if r["status"] == "diverged" else f"{mse:.4f}"
        )
        rel = "" if r["status"] == "diverged" else f"{mse / ADDING_BASELINE_MSE:.2f}×"
        lines.append(
            f"| {r['length']} | {r['cell']} | {'on' if r['clip'] else 'off'} | {r['params']:,} | "
            f"{status} | {rel} | {r['grad_norm_median']:.3g} | {r['grad_norm_max']:.3g} | "
            f"{r['clipped_fraction']:.0%} | {r['wall_s']:.0f} |"
        )
    return lines

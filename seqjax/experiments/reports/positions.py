"""Positions' report: ``positions.md`` and its three figures.

:func:`plot_positions` draws the sinusoidal encodings as MEDL Fig. 7.14 and Bishop
Fig. 12.10 show them and, when runs exist, the ablation's exact-match accuracy against
the sequence length for each positional encoding and task in ``tasks``; :func:`report`
writes the sessions' commands and machines, the figures' checks and the ablation table.
The figures' arrays and the runs come from :mod:`seqjax.experiments.positions`; ``cfg``
is its ``Config``.
"""

from __future__ import annotations

import os
from typing import Any

from seqjax.experiments._kit import machine


def plot_positions(
    cfg: Any, medl: dict, bishop: dict, runs: list[dict], outdir: str, *, tasks: tuple[str, ...]
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1.3, 1]})
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.15, top=0.88, wspace=0.25)
    t_max, j_max = min(60, cfg.medl_length), min(200, cfg.medl_dim)
    im = axes[0].imshow(
        medl["r"][:t_max, :j_max],
        aspect="auto",
        cmap="viridis",
        origin="lower",
        extent=(-0.5, j_max - 0.5, 0.5, t_max + 0.5),
        interpolation="nearest",
    )
    axes[0].set_xlabel("embedding index j")
    axes[0].set_ylabel("time t")
    axes[0].set_title(f"(a) r_j^<t>, p_e={cfg.medl_dim}, T={cfg.medl_length}, M=10^4")
    fig.colorbar(im, ax=axes[0])
    axes[1].plot(medl["diff"], lw=0.8)
    axes[1].set_xlabel("embedding index j")
    axes[1].set_title("(b) r^<51> − r^<50>")
    axes[1].grid(alpha=0.3)
    path = os.path.join(outdir, "positions_medl_fig7_14.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    paths.append(path)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.13, top=0.9)
    n_pos = bishop["r"].shape[0]
    im = ax.imshow(
        bishop["r"],
        aspect="auto",
        cmap="viridis",
        origin="upper",
        interpolation="nearest",
        extent=(-0.5, cfg.bishop_dim - 0.5, n_pos + 0.5, 0.5),
    )
    ax.set_xlabel("component i")
    ax.set_ylabel("position n")
    ax.set_title(
        f"Bishop (12.25): D={cfg.bishop_dim}, L={cfg.bishop_base:g}, N={cfg.bishop_length}"
    )
    fig.colorbar(im, ax=ax)
    path = os.path.join(outdir, "positions_bishop_fig12_10.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    paths.append(path)

    if runs:
        tasks = [t for t in tasks if any(r["task"] == t for r in runs)]
        fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 3.6), squeeze=False)
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.15, top=0.88, wspace=0.2)
        for ax, task in zip(axes[0], tasks):
            for r in runs:
                if r["task"] != task:
                    continue
                ns = sorted(int(n) for n in r["exact"])
                ax.plot(ns, [r["exact"][n] for n in ns], marker="o", ms=3, label=r["positions"])
            ax.axvline(cfg.train_max_length + 0.5, color="k", ls=":", lw=1)
            ax.set_title(f"{task}: exact match vs source length (train ≤ {cfg.train_max_length})")
            ax.set_xlabel("source length")
            ax.set_ylim(-0.03, 1.03)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("exact match")
        axes[0][0].legend()
        path = os.path.join(outdir, "positions_ablation.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def report(cfg: Any, medl: dict, bishop: dict, runs: list[dict], sessions: list[dict]) -> str:
    lines = ["# positions — sinusoid heat maps and a positional-encoding ablation", ""]
    for sess in sessions:
        lines += [
            f"Command: `{sess['command']}`  ",
            f"Wall time: {sess['wall_s'] / 60:.1f} min (load average "
            f"{sess['load_average'][0]} before, {sess['load_average'][1]} after; the 2 "
            "cores were shared with other jobs)  ",
        ]
    lines += [
        f"Machine: {machine()}",
        "",
        "## MEDL Fig. 7.14 (p_e = 768, T = 4000, M = 10⁴, t = 1..T)",
        "",
        f"Values lie in [{medl['min']:.3f}, {medl['max']:.3f}]. In (b), |r^⟨51⟩ − r^⟨50⟩| > 0.1 "
        f"at {medl['count_above_0.1']} of {cfg.medl_dim} indices, the last at j = "
        f'{medl["last_j_above_0.1"]} (MEDL: "a significant difference … around the first '
        'hundred vector positions").',
        "",
        "![MEDL Fig. 7.14](positions_medl_fig7_14.png)",
        "",
        f"## Bishop Fig. 12.10(b) (D = {cfg.bishop_dim}, L = {cfg.bishop_base:g}, "
        f"N = {cfg.bishop_length}, n = 1..N)",
        "",
        f"Values lie in [{bishop['min']:.3f}, {bishop['max']:.3f}].",
        "",
        "![Bishop Fig. 12.10](positions_bishop_fig12_10.png)",
        "",
    ]
    if runs:
        unseen = f"{cfg.train_max_length + 1}–{cfg.test_max_length}"
        lines += [
            "## Ablation: no positions vs sinusoidal vs learned vs RoPE",
            "",
            f"Causal transformer, {cfg.model.num_layers} layers, d = {cfg.model.embed_dim}, "
            f"{cfg.model.num_heads} heads, pre-norm; {cfg.num_symbols} symbols; trained on source "
            f"lengths 1–{cfg.train_max_length} ({cfg.steps} steps × batch {cfg.batch_size}, "
            f"AdamW {cfg.learning_rate:g}, warm-up + cosine); evaluated on "
            f"{cfg.test_per_length} held-out sequences per length. Exact match = every "
            "target token (and <eos>) right under teacher forcing = greedy decoding "
            "reproduces the target.",
            "",
            f"| task | positions | params | exact match, lengths 1–{cfg.train_max_length} | "
            f"exact match, lengths {unseen} | token accuracy, lengths {unseen} | train s |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in runs:
            ex_u = "" if r["exact_unseen"] is None else f"{r['exact_unseen']:.3f}"
            tk_u = "" if r["token_unseen"] is None else f"{r['token_unseen']:.3f}"
            lines.append(
                f"| {r['task']} | {r['positions']} | {r['params']:,} | "
                f"{r['exact_seen']:.3f} | {ex_u} | {tk_u} | {r['train_s']:.0f} |"
            )
        lines += [
            "",
            "Exact match per source length:",
            "",
            "| task | positions | "
            + " | ".join(str(n) for n in range(1, cfg.test_max_length + 1))
            + " |",
            "|---|---|" + "---:|" * cfg.test_max_length,
        ]
        for r in runs:
            lines.append(
                f"| {r['task']} | {r['positions']} | "
                + " | ".join(f"{r['exact'][n]:.2f}" for n in range(1, cfg.test_max_length + 1))
                + " |"
            )
        lines += ["", "![ablation](positions_ablation.png)", ""]
    return "\n".join(lines)

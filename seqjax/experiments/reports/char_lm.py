"""char_lm's report: ``char_lm.md`` and ``char_lm_loss.png`` from finished work dirs.

:func:`write_results` reads each run's ``char_lm.json`` and ``metrics.jsonl`` and writes
the loss curves (train and validation against iteration, nanoGPT's CPU validation loss
as the reference line) and the results table with the command that trained each run.
The nanoGPT reference numbers (:data:`NANOGPT_CPU_VAL_LOSS`, :data:`NANOGPT_GPU_VAL_LOSS`)
live here; :mod:`seqjax.experiments.char_lm` imports them. Rewrite the results file with
``from seqjax.experiments.reports.char_lm import write_results``.
"""

from __future__ import annotations

import json
import os

from seqjax.train.records import read_metrics

NANOGPT_CPU_VAL_LOSS = 1.88  # nanoGPT README, CPU config, "val loss of about 1.88"
NANOGPT_GPU_VAL_LOSS = 1.4697  # nanoGPT README, train_shakespeare_char on one A100


def write_results(
    workdirs: list[str], results_dir: str, commands: dict[str, str], notes: tuple[str, ...] = ()
) -> str:
    """``results_dir/char_lm.md`` and ``char_lm_loss.png`` from finished runs' work dirs.

    ``commands`` maps each work dir to the command that trained it. Every number comes
    from the runs' ``char_lm.json`` and ``metrics.jsonl``.
    """
    runs = []
    for wd in workdirs:
        with open(os.path.join(wd, "char_lm.json")) as f:
            runs.append((wd, json.load(f), read_metrics(os.path.join(wd, "metrics.jsonl"))))
    os.makedirs(results_dir, exist_ok=True)
    _plot_losses(runs, os.path.join(results_dir, "char_lm_loss.png"))

    first = runs[0][1]
    lines = [
        "# char_lm — Tiny Shakespeare character LM (nanoGPT's split and CPU config)",
        "",
        f"Machine: {first['machine']}. The 2 cores were shared with other jobs during every "
        "run (load averages below; a 2-core machine is saturated at 2), so wall times are "
        "upper bounds, not benchmarks.",
        "",
        "Commands:",
        "",
    ]
    default_command = "python -m seqjax.experiments.char_lm"
    lines += [f"* `{commands.get(wd, default_command)}`" for wd, _, _ in runs]
    lines += ["", *notes] if notes else []
    lines += [
        "",
        "Data: nanoGPT's `shakespeare_char` (65 characters; 1,003,854 train / 111,540 val). "
        "Recipe (both models): AdamW, β₂ = 0.99, weight decay 0.1 on every matrix, 100 "
        "warm-up iterations, cosine decay to 0.1× at the last iteration, gradient clipping 1.0, "
        "dropout 0, random windows of 64 characters, batch 12.",
        "",
        *_results_table(runs),
        "",
        "![loss curves](char_lm_loss.png)",
        "",
        *_eval_table(runs),
        *_samples(runs),
        "",
        "The transformer's checkpoint, tokenizer and config stay in its work dir "
        f"(`{runs[0][0]}`: `checkpoints/`, `tokenizer.json`, `experiment.json`); "
        "`seqjax.experiments._text.load_model(workdir)` returns `(model, params, tokenizer, "
        "config)`.",
        "",
        "nanoGPT's GPU config (`--preset gpu`: 6 layers, 6 heads, d = 384, block 256, batch "
        f"64, 5000 iterations, dropout 0.2; val {NANOGPT_GPU_VAL_LOSS} on one A100) is "
        "implemented and smoke-tested; it has not been run here (no GPU).",
        "",
    ]
    text = "\n".join(lines)
    with open(os.path.join(results_dir, "char_lm.md"), "w", encoding="utf-8") as f:
        f.write(text)
    return text


def _network(c: dict) -> dict:
    """A summary config's network, the ``model`` group (``--model.*``; ``model``: its
    architecture), also from a run saved before the group
    (:func:`~seqjax.experiments._config.saved_config`)."""
    from seqjax.experiments._config import saved_config
    from seqjax.experiments.char_lm import Config

    m = saved_config(Config, c).get("model", {})
    return {**m, "model": m.get("architecture", "transformer")}


def _plot_losses(runs: list[tuple[str, dict, list[dict]]], path: str) -> None:
    """``char_lm_loss.png``: each run's train and validation loss against the iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.14, top=0.92)
    for _wd, s, recs in runs:
        name = f"{_network(s['config'])['model']} ({s['params'] / 1e6:.2f}M, {s['steps']} it.)"
        pts = [(r["step"], r["eval/loss"]) for r in recs if "eval/loss" in r]
        tr = [(r["step"], r["loss"]) for r in recs if "loss" in r]
        (line,) = ax.plot(*zip(*pts), marker="o", ms=3, label=f"{name} val")
        ax.plot(*zip(*tr), color=line.get_color(), alpha=0.35, lw=0.8, label=f"{name} train")
    ax.axhline(NANOGPT_CPU_VAL_LOSS, color="k", ls=":", lw=1, label="nanoGPT CPU val ≈ 1.88")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.set_ylim(1.3, 3.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("Tiny Shakespeare, nanoGPT CPU config (block 64, batch 12)", fontsize=9)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _results_table(runs: list[tuple[str, dict, list[dict]]]) -> list[str]:
    """The results table's lines: one row per run (config, losses, wall time, load)."""
    lines = [
        "| model | params | iterations | peak lr | val loss (20 random batches, as nanoGPT) "
        "| val loss (whole val split) | train loss (20 batches) | training wall time "
        "| load average (1/5/15 min) before → after | anchor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for _wd, s, _ in runs:
        c = s["config"]
        n = _network(c)
        full = s.get("val_loss", s.get("val_loss_full"))  # the name before char_lm was gpt2's
        full = "" if full is None else f"{full:.4f}"
        loads = (
            f"{s['load_average_before']} → {s['load_average_after']}"
            if not s["resumed_from"]
            else "not recorded (evaluated in a resumed run)"
        )
        lines.append(
            f"| {n['model']} {n['num_layers']}L/{n['embed_dim']}d | {s['params']:,} | "
            f"{s['steps']} | {c['learning_rate']:g} | {s['val_loss_estimate']:.4f} | {full} | "
            f"{s['train_loss_estimate']:.4f} | {s['train_wall_s'] / 60:.1f} min | {loads} | "
            f"nanoGPT val ≈ {s['anchor_val_loss']} (~3 min on a laptop CPU) |"
        )
    return lines


def _eval_table(runs: list[tuple[str, dict, list[dict]]]) -> list[str]:
    """The validation loss during training: one row per evaluated iteration, a column a run."""
    lines = [
        "Validation loss during training (20 fixed random batches):",
        "",
        "| iteration | "
        + " | ".join(f"{_network(s['config'])['model']}, {s['steps']} it." for _, s, _ in runs)
        + " |",
        "|---:|" + "---:|" * len(runs),
    ]
    evals = [{r["step"]: r["eval/loss"] for r in recs if "eval/loss" in r} for _, _, recs in runs]
    for step in sorted(set().union(*evals)):
        lines.append(
            f"| {step} | " + " | ".join(f"{e[step]:.4f}" if step in e else "" for e in evals) + " |"
        )
    return lines


def _samples(runs: list[tuple[str, dict, list[dict]]]) -> list[str]:
    """Each run's sample, with how it was drawn, as fenced blocks."""
    lines = []
    for _wd, s, _ in runs:
        c = s["config"]
        lines += [
            "",
            f"Sample of the {_network(c)['model']} after {s['steps']} iterations (prompt a "
            "newline, temperature "
            f"{c['sample_temperature']:g}, top-k {c['sample_top_k']}, "
            f"{c.get('sample_tokens', c.get('sample_chars'))} characters):",
            "",
            "```",
            s["sample"].strip(),
            "```",
        ]
    return lines

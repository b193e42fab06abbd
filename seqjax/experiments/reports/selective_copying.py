"""Selective copying's report: the markdown results file (``--out``).

:func:`report` writes one table per task in ``tasks`` (each model's parameters, accuracy,
exact match, eval loss and training time) under the command, machine and wall time,
then the Mamba paper's Table 1 (:data:`PAPER_TABLE1`). The results are the rows of the
trained runs (:func:`seqjax.experiments.selective_copying.task_run`, one per task and model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from seqjax.experiments._kit import machine

PAPER_TABLE1 = {
    "S4 (no gate)": 18.3,
    "H3 (S4)": 57.0,
    "Mamba arch. with S4": 56.4,
    "Mamba (S6)": 99.8,
}


def _network(c: dict[str, Any]) -> dict[str, Any]:
    """A saved run's network options, the ``model`` group, also from a run saved before the
    group or before a rename (``d_model``): :func:`~seqjax.experiments._config.saved_config`."""
    from seqjax.experiments._config import saved_config
    from seqjax.experiments.selective_copying import Config

    return saved_config(Config, c).get("model", {})


def report(
    results: Sequence[dict[str, Any]], command: str, wall_s: float, *, tasks: Sequence[str]
) -> str:
    """Markdown: one table per task, the paper's Table 1 beside it, machine and wall time."""
    lines = [
        "# Selective copying and associative recall (Mamba Table 1, reduced scale)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}, {len(jax.devices())} device(s); "
        f"total wall time {wall_s / 60:.1f} min (shared 2-core CPU).",
        "",
    ]
    for task in tasks:
        rows = [r for r in results if r["task"] == task]
        if not rows:
            continue
        cfg = rows[0]["config"]
        if task == "selective_copying":
            setting = (
                f"{cfg['seq_len']} noise positions + {cfg['num_tokens']} content "
                f"tokens (length {cfg['seq_len'] + cfg['num_tokens']}), "
                f"{cfg['num_symbols']} symbols"
            )
        else:
            setting = (
                f"{cfg['num_pairs']} key–value pairs (length {2 * cfg['num_pairs'] + 2}), "
                f"{cfg['num_keys']} keys, {cfg['num_values']} values"
            )
        net = _network(cfg)
        lines += [
            f"## {task.replace('_', ' ')}",
            "",
            f"{setting}; {net['num_layers']} layers, d = {net['embed_dim']}, "
            # results saved before the rename: batch
            f"{cfg['steps']} steps × batch {cfg.get('batch_size', cfg.get('batch'))} (fresh "
            f"samples), AdamW "
            f"{cfg['learning_rate']:g} with warm-up + cosine; evaluated on "
            f"{cfg['eval_examples']} held-out examples.",
            "",
            "| model | params | accuracy % | exact match % | eval loss | train s |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in sorted(rows, key=lambda r: -r["eval_accuracy"]):
            lines.append(
                f"| {r['model']} | {r['params']:,} | {100 * r['eval_accuracy']:.1f} | "
                f"{100 * r['eval_exact_match']:.1f} | {r['eval_loss']:.3f} | "
                f"{r['train_s']:.0f} |"
            )
        lines.append("")
    lines += (
        [
            "## Reference: Mamba paper, Table 1 (selective copying, length 4096, 2 layers)",
            "",
            "| model | accuracy % |",
            "|---|---:|",
        ]
        + [f"| {k} | {v} |" for k, v in PAPER_TABLE1.items()]
        + [""]
    )
    return "\n".join(lines)

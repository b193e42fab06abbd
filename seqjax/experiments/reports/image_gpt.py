"""image_gpt's report: ``image_gpt.md`` and ``image_gpt_samples.png``.

:func:`report` writes the bits-per-image table (the transformer against the
independent-position baseline and the uniform code, per tokenisation), the validation
curve and the sample paragraph from the summary :func:`seqjax.experiments.image_gpt.run`
returns; :func:`plot_samples` draws generated digits above quantised test digits.
``cfg`` is :class:`seqjax.experiments.image_gpt.Config` (the network's sizes in its group
``cfg.model``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def report(cfg: Any, s: dict, command: str) -> str:
    from seqjax.experiments._kit import machine

    m = cfg.model  # the network's options (--model.*)
    split = (
        f"{s['n_fit']} training images ({s['n_train']} trained on, {s['n_val']} held "
        f"out for early stopping)"
        if s["n_val"]
        else f"{s['n_fit']} training images"
    )
    lines = [
        "# image_gpt — a raster-order transformer on 8×8 digits (Bishop §12.4.2)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Wall time: {s['wall_s']:.0f} s.",
        "",
        f"scikit-learn digits, {split} / {s['n_test']} test images (seeded 80/20 split). "
        f"Codebooks by K-means on the training images (Bishop (12.38)); TransformerLM "
        f"({m.num_layers} layers, {m.num_heads} heads, d = {m.embed_dim}, dropout "
        f"{m.dropout_rate:g}), causal LM loss on raster-order tokens after `<start>` (Bishop "
        f"(12.37)), AdamW {cfg.learning_rate:g} (weight decay {cfg.weight_decay:g}) with "
        f"warm-up + cosine, {cfg.steps} steps × batch {cfg.batch_size}"
        + (
            f"; the parameters of the step with the lowest validation NLL (evaluated every "
            f"{cfg.eval_every} steps) are kept"
            if s["n_val"]
            else ""
        )
        + ". NLL of the test tokens in bits per image, over the same codes and the same test "
        "images for every column; the independent-position baseline is a categorical per "
        "position (add-one counts on all the training images).",
        "",
        *_bits_table(s["runs"]),
        *_palette_and_curves(s["runs"]),
        "",
        "The transformer beats the independent-position baseline on "
        + " and ".join(
            f"`{r['tokens']}` ({r['test_bits_per_image']:.1f} vs "
            f"{r['independent_bits_per_image']:.1f})"
            for r in s["runs"]
            if r["test_bits_per_image"] < r["independent_bits_per_image"]
        )
        + "."
        if any(r["test_bits_per_image"] < r["independent_bits_per_image"] for r in s["runs"])
        else "",
        "",
        "Without dropout and early stopping the same model over-fits and loses to the "
        "baseline on patches; which remedy does what, measured: "
        "[image_gpt_ablation.md](image_gpt_ablation.md).",
        "",
        f"Samples (temperature {cfg.temperature:g}, drawn token by token in raster order from "
        "`<start>`), next to quantised test digits:",
        "",
        "![samples](image_gpt_samples.png)",
        "",
    ]
    return "\n".join(lines)


def _bits_table(runs: list[dict]) -> list[str]:
    """The table of bits per image: one row per tokenisation, the transformer's against the
    baselines'."""
    lines = [
        "| tokens | codes K | tokens / image | codebook RMSE (grey level 0–1) | params | "
        "transformer bits / image | at step | (last step) | (train, last batch) | "
        "independent positions | uniform | train s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r['tokens']} | {r['codes']} | {r['sequence_length']} | "
            f"{r['reconstruction_rmse']:.3f} | {r['params']:,} | "
            f"**{r['test_bits_per_image']:.1f}** | {r['best_step']} | "
            f"{r['last_test_bits_per_image']:.1f} | "
            f"{r['last_loss'] * r['sequence_length'] / np.log(2.0):.1f} | "
            f"{r['independent_bits_per_image']:.1f} | "
            f"{r['uniform_bits_per_image']:.0f} | {r['train_s']:.0f} |"
        )
    return lines


def _palette_and_curves(runs: list[dict]) -> list[str]:
    """The grey levels of the pixel codebook and each run's validation curve."""
    lines = []
    for r in runs:
        if r["tokens"] == "pixels":
            lines += [
                "",
                "Grey palette (K-means on pixel values): "
                + ", ".join(f"{c[0]:.3f}" for c in r["codebook"])
                + ".",
            ]
        if r["val_curve"]:
            lines += [
                "",
                f"Validation bits/image of `{r['tokens']}` by step: "
                + ", ".join(f"{st}: {b:.1f}" for st, b in r["val_curve"])
                + ".",
            ]
    return lines


def plot_samples(samples: dict[str, tuple[np.ndarray, np.ndarray]], outdir: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(samples)
    cols = min(16, samples[kinds[0]][0].shape[0])
    fig, axes = plt.subplots(
        2 * len(kinds), cols, figsize=(cols * 0.6, 2 * len(kinds) * 0.75), squeeze=False
    )
    for i, kind in enumerate(kinds):
        gen, real = samples[kind]
        for j in range(cols):
            for row, imgs, name in (
                (2 * i, gen, f"{kind}: samples"),
                (2 * i + 1, real, f"{kind}: test"),
            ):
                ax = axes[row, j]
                if j < len(imgs):
                    ax.imshow(imgs[j], cmap="gray_r", vmin=0, vmax=1)
                ax.set_xticks([])
                ax.set_yticks([])
                if j == 0:
                    ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=7)
    fig.tight_layout(pad=0.2)
    path = os.path.join(outdir, "image_gpt_samples.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

"""text_to_image's report: ``text_to_image.md`` and ``text_to_image_samples.png``.

:func:`report` writes the per-prompt accuracy of the digit classifier on generated samples,
the classifier's calibration on real and quantised digits, and the bits-per-image table
(with and without the prompt, the per-digit and the independent baselines) from the
summary :func:`seqjax.experiments.text_to_image.run` returns; :func:`plot_samples` draws
the sample grid, one row per prompt. ``cfg`` is
:class:`seqjax.experiments.text_to_image.Config` (the network's sizes in its group
``cfg.model``); ``words`` are the digit words of the prompts (``DIGIT_WORDS``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np


def report(cfg: Any, s: dict, command: str, *, words: Sequence[str]) -> str:
    from seqjax.experiments._kit import machine

    m = cfg.model  # the network's options (--model.*)
    lines = [
        "# text_to_image — text and image tokens in one sequence (Bishop §12.4.5)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Wall time: {s['wall_s']:.0f} s.",
        "",
        f"scikit-learn digits, {s['n_fit']} training images ({s['n_train']} trained on, "
        f"{s['n_val']} held out for early stopping) / {s['n_test']} test images (image_gpt's "
        f"splits and codebook). One vocabulary of {s['vocab']} ids: {s['codes']} image codes "
        f"(K-means {cfg.tokens}, Bishop (12.38)), the words `a zero … nine` and `<sep>`; each "
        f"sequence is `a DIGIT <sep>` then the {s['sequence_length']} raster-order codes. "
        f"TransformerLM ({m.num_layers} layers, {m.num_heads} heads, d = {m.embed_dim}, "
        f"dropout {m.dropout_rate:g}, {s['params']:,} parameters), causal LM loss on the image "
        f"codes only (the prompt is given, not modelled), AdamW {cfg.learning_rate:g}, "
        f"{cfg.steps} steps × batch {cfg.batch_size}, the parameters of the best validation "
        f"step ({s['best_step']}) kept.",
        "",
        "## Does the text steer the image?",
        "",
        f"{cfg.samples_per_prompt} samples per prompt (temperature {cfg.temperature:g}), "
        "each labelled by scikit-learn's gallery classifier `SVC(gamma=0.001)` trained on "
        f"the real training digits. The classifier scores "
        f"{100 * s['classifier_test_accuracy']:.1f}% on the real test digits and "
        f"{100 * s['classifier_quantised_test_accuracy']:.1f}% on the same digits quantised "
        "through the codebook (what the samples are made of); chance is 10%.",
        "",
        "| prompt | " + " | ".join(f"a {w}" for w in words) + " | all |",
        "|---|" + "---:|" * 11,
        "| samples classified as the prompt (%) | "
        + " | ".join(f"{100 * a:.0f}" for a in s["accuracy_per_prompt"])
        + f" | **{100 * s['accuracy']:.1f}** |",
        "",
        "## Test NLL of the image codes",
        "",
        "Bits per image over the same codes and test images (lower is better):",
        "",
        "| model | bits / image |",
        "|---|---:|",
        f"| transformer given the prompt | **{s['test_bits_per_image']:.1f}** |",
        f"| (same, last step {cfg.steps}) | {s['last_test_bits_per_image']:.1f} |",
        *(
            [
                f"| the same transformer without the text (`<sep>` then the codes) | "
                f"{s['unconditional_bits_per_image']:.1f} |"
            ]
            if "unconditional_bits_per_image" in s
            else []
        ),
        "| the transformer given the prompt, summed over the ten prompts "
        f"(−log₂ Σ_y p(y) p(x \\| y): no text needed) | {s['mixture_bits_per_image']:.1f} |",
        f"| independent positions given the digit | {s['class_independent_bits_per_image']:.1f} |",
        f"| independent positions | {s['independent_bits_per_image']:.1f} |",
        f"| uniform | {s['uniform_bits_per_image']:.0f} |",
        "",
        *_saving(s),
        "Samples, one row per prompt (the classifier's label above each):",
        "",
        "![samples](text_to_image_samples.png)",
        "",
    ]
    return "\n".join(lines)


def _saving(s: dict) -> list[str]:
    """The paragraph on what the text is worth (needs the unconditional run)."""
    if "unconditional_bits_per_image" not in s:
        return []
    unc, mix = s["unconditional_bits_per_image"], s["mixture_bits_per_image"]
    verdict = (
        "better than the one trained without text: the labels help the training itself, not "
        "only the sampling"
        if mix < unc
        else "no better than the one trained without text"
    )
    return [
        f"The prompt saves {unc - s['test_bits_per_image']:.1f} bits per image against the "
        "same transformer trained without it. A digit label carries at most log₂ 10 ≈ 3.3 "
        "bits about an image; the prompted model summed over the ten prompts "
        f"({mix:.1f}) is an unconditional model too, and it is {verdict}.",
        "",
    ]


def plot_samples(images: np.ndarray, labels: np.ndarray, predicted: np.ndarray, outdir: str,
                 *, words: Sequence[str]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(10, int(np.sum(labels == 0)))
    fig, axes = plt.subplots(10, cols, figsize=(cols * 0.6 + 0.8, 10 * 0.7), squeeze=False)
    for d in range(10):
        rows = np.flatnonzero(labels == d)[:cols]
        for j in range(cols):
            ax = axes[d, j]
            ax.imshow(images[rows[j]], cmap="gray_r", vmin=0, vmax=1)
            ax.set_title(
                str(predicted[rows[j]]),
                fontsize=6,
                pad=1,
                color="black" if predicted[rows[j]] == d else "red",
            )
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(
                    f"a {words[d]}", rotation=0, ha="right", va="center", fontsize=7
                )
    fig.tight_layout(pad=0.2)
    path = os.path.join(outdir, "text_to_image_samples.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

"""Digits' report: the accuracy table (``table_md`` of ``digits.json``) and bar chart.

:func:`accuracy_table` writes one markdown row per model — mean ± sd of the test
accuracy over seeds (:func:`seqjax.experiments._kit.mean_sd`), parameters, training
seconds per seed — and a row for the scikit-learn SVM baseline; :func:`plot_accuracy`
draws the same means as bars with each seed as a dot (``digits_accuracy.png``).
Called by :mod:`seqjax.experiments.digits`.
"""

from __future__ import annotations

import numpy as np

from seqjax.experiments._kit import mean_sd


def accuracy_table(
    by: dict[str, list[dict]], svm: float, labels: dict[str, str], patch_size: int
) -> str:
    """The markdown table: one row per model (mean ± sd over seeds) and the SVM's row."""
    lines = [
        "| model | input | params | test accuracy (%) | train s / seed |",
        "|---|---|---:|---:|---:|",
    ]
    for name, rs in by.items():
        inp = (
            "8 rows × 8 px"
            if name not in ("vit",)
            else f"{(8 // patch_size) ** 2} patches × {patch_size**2} px"
        )
        lines.append(
            f"| {labels[name]} | {inp} | {rs[0]['params']:,} | "
            f"{mean_sd([100 * r['test_accuracy'] for r in rs])} | "
            f"{np.mean([r['train_s'] for r in rs]):.0f} |"
        )
    lines.append(f"| SVC(gamma=0.001) (scikit-learn gallery) | 64 px | – | {100 * svm:.2f} | – |")
    return "\n".join(lines)


def plot_accuracy(by: dict[str, list[dict]], svm: float, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(by)
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    means = [100 * np.mean([r["test_accuracy"] for r in by[n]]) for n in names]
    sds = [100 * np.std([r["test_accuracy"] for r in by[n]]) for n in names]
    ax.bar(range(len(names)), means, yerr=sds, capsize=3, color="tab:blue")
    for i, r in enumerate(by.values()):
        ax.scatter([i] * len(r), [100 * x["test_accuracy"] for x in r], color="k", s=8, zorder=3)
    ax.axhline(100 * svm, color="tab:red", ls="--", lw=1, label="SVC(gamma=0.001)")
    short = {
        "elman": "Elman",
        "lstm": "LSTM",
        "gru": "GRU",
        "bilstm": "BiLSTM",
        "transformer": "transformer\n(rows)",
        "vit": "ViT\n(2×2 patches)",
    }
    ax.set_xticks(range(len(names)), [short[n] for n in names], fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(max(0.0, min(means) - 4), 100)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

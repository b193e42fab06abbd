"""Numbers' report: ``numbers_exact_match.png``.

:func:`plot_exact_match` draws the exact-match rate of each architecture against the
number of digits (mean ± sd over seeds), with the count of held-out numbers per length;
``labels`` names the architectures. The attention heat maps of
:mod:`seqjax.experiments.numbers` are drawn by
:func:`seqjax.experiments.reports.translation.plot_attention`.
"""

from __future__ import annotations

import numpy as np


def plot_exact_match(
    table: dict[str, dict[int, list[float]]],
    counts: dict[int, int],
    path: str,
    *,
    labels: dict[str, str],
) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    digits = sorted(counts)
    width = 0.8 / max(1, len(table))
    fig, ax = plt.subplots(figsize=(5.6, 3.3))
    for j, (arch, by_d) in enumerate(table.items()):
        xs = np.arange(len(digits)) + (j - (len(table) - 1) / 2) * width
        ax.bar(
            xs,
            [100 * np.mean(by_d[d]) for d in digits],
            width,
            yerr=[100 * np.std(by_d[d]) for d in digits],
            capsize=2,
            label=labels.get(arch, arch),
        )
    ax.set_xticks(
        range(len(digits)),
        [f"{d} digit{'s' if d > 1 else ''}\n(n={counts[d]})" for d in digits],
        fontsize=8,
    )
    ax.set_ylabel("exact match, held-out numbers (%)", fontsize=8)
    ax.set_ylim(0, 135)
    ax.set_yticks(range(0, 101, 20))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="upper center", ncol=min(2, len(table)))
    ax.set_title("English→French number names", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

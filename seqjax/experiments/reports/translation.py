"""Translation's report: the attention heat maps and the BLEU-by-length plot.

:func:`plot_attention` draws one sentence's attention weights (target words × source
words, MEDL Fig. 7.11 style); :func:`plot_bleu_vs_length` draws held-out BLEU against the
source length for each architecture (mean ± sd over seeds; ``labels`` names them). The
weights come from :func:`seqjax.experiments._seq2seq.attention_map`, the BLEU scores
from translation's ``run``; :mod:`seqjax.experiments.numbers` draws its heat maps with the same
:func:`plot_attention`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np


def plot_attention(
    alpha: np.ndarray, src_tokens: Sequence[str], out_tokens: Sequence[str], path: str, title: str
) -> str:
    """A heatmap of ``alpha`` (rows: output tokens + <eos>; columns: source tokens)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [*out_tokens, "<eos>"]
    width = max(3.4, 1.0 + 0.55 * len(src_tokens))  # room for the title of short sentences
    fig, ax = plt.subplots(figsize=(width, 0.9 + 0.42 * len(rows)))
    ax.imshow(alpha, cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=45, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    for t in range(alpha.shape[0]):
        for s in range(alpha.shape[1]):
            ax.text(
                s,
                t,
                f"{alpha[t, s]:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if alpha[t, s] > 0.5 else "black",
            )
    ax.set_title(textwrap.fill(title, width=int(9 * width)), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_bleu_vs_length(
    curves: dict[str, dict[int, list[float]]],
    counts: dict[int, int],
    path: str,
    *,
    labels: dict[str, str],
) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for arch, by_len in curves.items():
        lens = sorted(by_len)
        means = [np.mean(by_len[n]) for n in lens]
        sds = [np.std(by_len[n]) for n in lens]
        ax.errorbar(
            lens, means, yerr=sds, marker="o", ms=4, capsize=2, label=labels.get(arch, arch)
        )
    ax.set_xlabel("source length (words, punctuation excluded)")
    ax.set_ylabel("BLEU (held-out, multi-ref)")
    ax.set_xticks(sorted(counts), [f"{n}\n(n={counts[n]})" for n in sorted(counts)], fontsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("BLEU against source length (cf. Bahdanau et al. 2015, Fig. 2)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

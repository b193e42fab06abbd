"""Sampling's report: ``sampling.png``.

:func:`plot_sampling` draws each decoding strategy's diversity (distinct-2) against the
log-likelihood per character under the model, and the probability of each generated
character for a few strategies (moving mean; cf. Bishop Fig. 12.17). The rows and
traces come from :func:`seqjax.experiments.sampling.run`.
"""

from __future__ import annotations

import numpy as np


def plot_sampling(rows: list[dict], traces: dict[str, list[float]], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9.0, 3.4))
    for r in rows:
        a.scatter(
            r["distinct_2"],
            r["loglik_per_char"],
            s=18,
            color="tab:red" if r["strategy"] == "human" else "tab:blue",
        )
        a.annotate(
            r["strategy"],
            (r["distinct_2"], r["loglik_per_char"]),
            fontsize=7,
            xytext=(3, 2),
            textcoords="offset points",
        )
    a.set_xlabel("distinct-2 (diversity)")
    a.set_ylabel("log-likelihood / char under the model")
    a.grid(alpha=0.3)
    window = 10
    for name in ("human", "beam4", "greedy", "temp1.0"):
        if name in traces and len(traces[name]) >= window:
            p = np.convolve(np.exp(traces[name]), np.ones(window) / window, mode="valid")
            b.plot(np.arange(len(p)) + window - 1, p, lw=1.0, label=name)
    b.set_xlabel("generated character")
    b.set_ylabel(f"p(character), mean of {window}")
    b.set_ylim(0, 1)
    b.set_title("prompt 1: p(each generated character)\n(cf. Bishop Fig. 12.17)", fontsize=8)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=85)
    plt.close(fig)
    return path

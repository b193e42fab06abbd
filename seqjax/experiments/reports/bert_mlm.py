"""bert_mlm's report: the fine-tuning table (``table_md``) and the label-budget plot.

:func:`results_table` gives accuracy and macro-F1 (mean ± sd over seeds) per label
budget, classifier form (:data:`FORMS`: BERT's ``<cls>`` or the causal LM's last token)
and initialisation (pre-trained or from scratch), with the majority-class baseline;
:func:`plot_results` draws accuracy against the number of labels (``bert_mlm.png``).
Both read the run dicts :func:`seqjax.experiments.bert_mlm.run` collects.
"""

from __future__ import annotations

import collections

import numpy as np

from seqjax.experiments._kit import mean_sd

FORMS = {"bert": "BERT, `<cls>` (encoder)", "gpt": "causal LM, last token (decoder)"}


def results_table(runs: list[dict], majority: float) -> str:
    """Mean ± sd per label budget, classifier form and initialisation (BERT's rows first)."""
    groups: dict[tuple[int, int, str], list[dict]] = collections.defaultdict(list)
    order = list(FORMS)
    for r in runs:
        groups[(r["n_labels"], order.index(r.get("model", "bert")), r["init"])].append(r)
    lines = [
        "| labelled sentences | classifier | init | test accuracy (%) | macro-F1 |",
        "|---:|---|---|---:|---:|",
    ]
    for (n, form, init), rs in sorted(groups.items(), key=lambda kv: kv[0][:2]):
        lines.append(
            f"| {n} | {FORMS[order[form]]} | {init} | "
            f"{mean_sd([100 * r['accuracy'] for r in rs])} | "
            f"{mean_sd([r['macro_f1'] for r in rs])} |"
        )
    lines.append(f"| – | majority class | – | {100 * majority:.3f} | – |")
    return "\n".join(lines)


def plot_results(runs: list[dict], majority: float, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.0, 3.3))
    for form, style in (("bert", "-"), ("gpt", "--")):
        for init, color in (("pretrained", "tab:blue"), ("scratch", "tab:orange")):
            sel = [r for r in runs if r.get("model", "bert") == form and r["init"] == init]
            if not sel:
                continue
            ns = sorted({r["n_labels"] for r in sel})
            vals = [[r["macro_f1"] for r in sel if r["n_labels"] == n] for n in ns]
            ax.errorbar(
                ns,
                [np.mean(v) for v in vals],
                yerr=[np.std(v) for v in vals],
                marker="o" if form == "bert" else "s",
                linestyle=style,
                capsize=3,
                color=color,
                label=f"{init} {'BERT' if form == 'bert' else 'causal LM'}",
            )
    ax.set_xscale("log")
    ax.set_xlabel("labelled training sentences")
    ax.set_ylabel("test macro-F1 (. ? !)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(
        f"fine-tuning, encoder vs decoder form (majority class {100 * majority:.1f}%)", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

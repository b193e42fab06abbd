"""Complexity's report: ``complexity.md`` and ``complexity.png``.

:func:`report` sets the measured rows (FLOPs per token, sequential operations, maximum
path length, for each layer and length T) and the fitted growth exponents beside what the
slides (:data:`SLIDES`) and Vaswani et al. (2017), Table 1 (:data:`VASWANI`) state;
:func:`plot_costs` draws the three measures against T on log axes. The numbers come from
:func:`seqjax.experiments.complexity.measure`; ``cnns`` names the convolutional rows
(whose layer count is shown). ``cfg`` is :class:`seqjax.experiments.complexity.Config` (the
layers' sizes in its group ``cfg.model``).
"""

from __future__ import annotations

import os
from typing import Any

LABELS = {
    "rnn": "RNN (Elman, scan)",
    "cnn": "CNN (causal conv, stacked)",
    "cnn_dilated": "CNN (causal conv, dilated stack)",
    "attention": "self-attention (causal MHA)",
    "linear_attention": "linear attention (causal, chunked)",
    "ssm": "SSM (Mamba S6, associative scan)",
}


# What the slides state: cost per layer, maximum path length ("—": not stated).
SLIDES = {
    "rnn": ("O(N d²)", "O(N)"),
    "cnn": ("O(k N d²)", "O(N/k)"),
    "cnn_dilated": ("O(k N d²)", "—"),
    "attention": ("O(N² d)", "O(1)"),
    "linear_attention": ("O(N d²)", "—"),
    "ssm": ("linear in N", "—"),
}


# Vaswani et al. (2017) Table 1: complexity per layer, sequential operations, path length.
VASWANI = {
    "rnn": ("O(n d²)", "O(n)", "O(n)"),
    "cnn": ("O(k n d²)", "O(1)", "O(n/k)"),
    "cnn_dilated": ("O(k n d²)", "O(1)", "O(log_k n)"),
    "attention": ("O(n² d)", "O(1)", "O(1)"),
    "linear_attention": None,
    "ssm": None,
}


def report(
    cfg: Any, rows: list[dict], fits: dict, wall: float, command: str, *, cnns: tuple[str, ...]
) -> str:
    from seqjax.experiments._kit import machine

    lens = sorted({r["T"] for r in rows})
    by = {(r["model"], r["T"]): r for r in rows}
    m = cfg.model
    lines = [
        "# complexity — cost, sequential operations and path length per layer",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Wall time: {wall:.0f} s (compilation only: nothing is timed).",
        "",
        f"Width d = {m.width}, {m.num_heads} heads (attention, linear attention), SSM state "
        f"N_s = {m.d_state}, CNN kernel k = {m.kernel_size}; one forward pass of one layer "
        "on x: [1, T, d] (the CNNs' path lengths are those of the stack that covers T). "
        "See the module docstring of `seqjax/experiments/complexity.py` for how each column "
        "is measured. Growth exponents are least-squares slopes in log–log over T = "
        f"{', '.join(map(str, lens[-cfg.fit_last :]))}.",
        "",
        "## Vaswani et al. (2017) Table 1, measured",
        "",
        "The last two columns are what the sources *state*; every other number is measured. "
        'The slides give cost and path length as bullet lists under "RNN vs CNN vs '
        'self-attention" (their only table, "Transformers vs RNNs", says fast/slow '
        "training and inference); Vaswani et al.'s Table 1 has the three columns but no "
        "linear attention or SSM row.",
        "",
        *_table1(cfg, by, lens, fits),
        "",
        "Max path lengths are at the largest T (T + 1 = the chain x_1 → s_1 → … → s_T → y_T; "
        "1 = a direct edge; for a CNN, the depth L of the stack that covers T); the RNN has no "
        "parallel form, a CNN no recurrent one (both columns are its stack).",
        "",
        "## Every length",
        "",
        *_every_length(cfg, by, lens, cnns),
        "",
        "Reading: attention's cost per token grows with T (the N²d term; at small T the ND² "
        "projections dominate, so the exponent approaches 2 only as T ≫ d), the others are "
        "linear in T; a conv layer's cost per token is 2·k·d² (+ d for the bias), k times a "
        "d × d projection, whatever its dilation. The RNN's chain of T dependent steps shows "
        "in the sequential operations (∝ T); the CNN's, attention's and linear attention's "
        "critical paths do not grow with T (a convolution, a matmul or a prefix sum counts "
        "as one operation), and the associative scan of the SSM grows like log T. Path "
        "length is where the CNNs differ: a plain stack needs ⌈(T − 1)/(k − 1)⌉ layers to "
        "connect the ends (O(N/k)), a dilated one ⌈log_k T⌉ (O(log_k N)), where attention "
        "needs one hop and the RNN's and the recurrent forms' chains T + 1.",
        "",
        "![FLOPs, sequential operations and path length](complexity.png)",
        "",
    ]
    return "\n".join(lines)


def _table1(cfg: Any, by: dict, lens: list[int], fits: dict) -> list[str]:
    """Vaswani et al.'s Table 1, measured: one row per layer, the smallest and largest T,
    the fitted exponents and what the sources state."""
    lines = [
        "| layer | FLOPs / token at T = "
        + f"{lens[0]} → {lens[-1]}"
        + " | FLOPs ∝ T^k, k | sequential ops at T = "
        + f"{lens[0]} → {lens[-1]}"
        + " | seq. ops ∝ T^k, k | max path (parallel form) | max path (recurrent form) "
        "| slides: complexity, path | Vaswani Table 1: complexity, seq. ops, path |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for m in cfg.models:
        a, b = by[(m, lens[0])], by[(m, lens[-1])]
        sl, vt = SLIDES[m], VASWANI[m]
        lines.append(
            f"| {LABELS[m]} | {a['flops_per_token']:,.0f} → {b['flops_per_token']:,.0f} | "
            f"{round(fits[m]['flops'], 2) + 0.0:.2f} | "
            f"{a['sequential_ops']:,} → {b['sequential_ops']:,} | "
            f"{round(fits[m]['sequential_ops'], 2) + 0.0:.2f} | "
            f"{'—' if m == 'rnn' else format(b['path_parallel'], ',')} | "
            f"{b['path_recurrent']:,} | {sl[0]}, {sl[1]} | "
            f"{'not in the table' if vt is None else ', '.join(vt)} |"
        )
    return lines


def _every_length(cfg: Any, by: dict, lens: list[int], cnns: tuple[str, ...]) -> list[str]:
    """The measured rows at every length T, one per layer and T."""
    lines = [
        "| layer | T | FLOPs | FLOPs / token | sequential ops | path (parallel) "
        "| path (recurrent) | CNN stack depth L |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in cfg.models:
        for t in lens:
            r = by[(m, t)]
            lines.append(
                f"| {m} | {t} | {r['flops']:,.0f} | {r['flops_per_token']:,.0f} | "
                f"{r['sequential_ops']:,} | {r['path_parallel']} | "
                f"{r['path_recurrent']} | {r['layers'] if m in cnns else '—'} |"
            )
    return lines


def plot_costs(cfg: Any, rows: list[dict], outdir: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(14, 3.6))
    for m in cfg.models:
        rs = sorted((r for r in rows if r["model"] == m), key=lambda r: r["T"])
        t = [r["T"] for r in rs]
        ax[0].loglog(t, [r["flops"] for r in rs], "o-", label=m)
        ax[1].loglog(t, [r["sequential_ops"] for r in rs], "o-", label=m)
        ax[2].loglog(t, [r["path_parallel"] for r in rs], "o-", label=m)
    ax[0].set(xlabel="T", ylabel="forward FLOPs (XLA cost analysis)", title="cost per layer")
    ax[1].set(xlabel="T", ylabel="critical path (primitives)", title="sequential operations")
    ax[2].set(
        xlabel="T",
        ylabel="longest shortest path (hops)",
        title="max path length (RNN: chain, CNN: stack)",
    )
    for a in ax:
        a.grid(alpha=0.3, which="both")
    ax[0].legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(outdir, "complexity.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

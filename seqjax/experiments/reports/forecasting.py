"""Forecasting's report: ``forecasting.md`` and ``forecasting.png``.

:func:`report` writes the closed-loop RMSE-by-horizon table of the GRU forecaster
(mean ± sd over seeds) beside the least-squares AR(p) model, persistence and the training
mean, and the one-step RMSEs, from the summary :func:`seqjax.experiments.forecasting.run`
returns;
:func:`plot_forecasts` draws the sunspot series, the test origins and one forecast of each
model. ``cfg`` is :class:`seqjax.experiments.forecasting.Config`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def report(cfg: Any, s: dict, years: np.ndarray, command: str) -> str:
    from seqjax.experiments._kit import machine

    r, net = s["rmse"], cfg.model
    hs = [h for h in (1, 2, 3, 5, 8, 11, 16, 22) if h <= cfg.horizon]
    ar = f"ar{net.ar_order}"
    lines = [
        "# forecasting — yearly sunspot numbers, predictions fed back (MEDL Fig. 7.1(a))",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Wall time: {s['wall_s']:.0f} s.",
        "",
        f"Training years {int(years[0])}–{cfg.train_until} ({s['n_train']} values), test years "
        f"{cfg.train_until + 1}–{int(years[-1])} ({s['n_test']}). GRU({net.hidden_size}) + linear "
        f"read-out, one-step squared error on windows of {cfg.window} years, Adam "
        f"{cfg.learning_rate:g}, {cfg.steps} steps × batch {cfg.batch_size}, "
        f"{len(cfg.seeds)} seeds (mean ± sd). Closed loop: warm up on the true history up to "
        f"the origin, then feed the forecasts back for {cfg.horizon} years; RMSE (sunspot "
        f"units) over the {s['n_origins']} test origins with a full horizon. AR({net.ar_order}) "
        "by least squares on the training years, iterated the same way.",
        "",
        "| horizon (years) | " + " | ".join(str(h) for h in hs) + " |",
        "|---|" + "---:|" * len(hs),
        "| RNN (GRU), closed loop | "
        + " | ".join(f"{r['rnn_mean'][h - 1]:.1f} ± {r['rnn_sd'][h - 1]:.1f}" for h in hs)
        + " |",
        f"| AR({net.ar_order}), closed loop | "
        + " | ".join(f"{r[ar][h - 1]:.1f}" for h in hs)
        + " |",
        "| persistence (x̂ = last value) | "
        + " | ".join(f"{r['persistence'][h - 1]:.1f}" for h in hs)
        + " |",
        "| climatology (training mean) | "
        + " | ".join(f"{r['climatology'][h - 1]:.1f}" for h in hs)
        + " |",
        "",
        f"One-step (teacher-forced) test RMSE: RNN "
        f"{np.mean(s['one_step_rnn']):.1f} ± {np.std(s['one_step_rnn']):.1f}, AR({net.ar_order}) "
        f"{s['one_step_ar']:.1f}.",
        "",
        "![forecasts](forecasting.png)",
        "",
    ]
    return "\n".join(lines)


def plot_forecasts(
    cfg: Any,
    series: np.ndarray,
    years: np.ndarray,
    n_train: int,
    starts: np.ndarray,
    rnn_fc: np.ndarray,
    ar_fc: np.ndarray,
    outdir: str,
) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.6))
    ax.plot(years, series, "k", lw=1, label="observed")
    ax.axvline(years[n_train - 1] + 0.5, color="grey", ls=":", lw=1)
    picks = [0, len(starts) // 2] if len(starts) > 1 else [0]
    for i, k in enumerate(picks):
        o = starts[k]
        yy = years[o] + np.arange(cfg.horizon)
        ax.plot(yy, rnn_fc[k], "tab:red", lw=1.5, label="RNN, fed back" if i == 0 else None)
        ax.plot(
            yy, ar_fc[k], "tab:blue", lw=1, ls="--", label=f"AR({cfg.model.ar_order})" if i == 0
            else None
        )
    ax.set(
        xlabel="year",
        ylabel="sunspot number",
        title=f"closed-loop forecasts of {cfg.horizon} years from two test origins",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(outdir, "forecasting.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

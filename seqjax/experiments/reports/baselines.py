"""baselines' report: the language-model and classification tables, ``baselines.md``.

:func:`tables` makes the two markdown tables from the rows of
:mod:`seqjax.experiments.baselines` (the count models' and the networks'); :func:`report`
joins them with the wall time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def tables(rows: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """``(lm table, classification table)``: model, size, validation nats and bits per
    character (or test accuracy), seconds."""
    lm = ["| model | size | val nats/char | val bits/char | s |", "|---|---:|---:|---:|---:|"]
    lm += [f"| {r['model']} | {r['size']} | {r['nats']:.3f} | {r['bpc']:.3f} | "
           f"{r['seconds']:.0f} |" for r in rows if r["task"] == "lm"]
    cl = ["| model | size | test accuracy (%) | s |", "|---|---:|---:|---:|"]
    cl += [f"| {r['model']} | {r['size']} | {100 * r['accuracy']:.2f} | "
           f"{r['seconds']:.0f} |" for r in rows if r["task"] == "classification"]
    return "\n".join(lm), "\n".join(cl)


def report(s: dict[str, Any]) -> str:
    """``baselines.md``: the two tables and the wall time."""
    return s["lm_table_md"] + "\n\n" + s["class_table_md"] + f"\n\nwall time {s['wall_s']:.0f}s"

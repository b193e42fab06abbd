"""The check that a smoke run *learned*: its training loss fell by a margin.

Every training experiment's smoke test asserts, besides its ranges and files, that the
metric the experiment trains on moved: the loss at the end of training is below the loss of
the first logged step by at least a fraction ``rel`` of it (or by ``abs_drop``, when given).
The first record ``fit`` logs is step 1 (with ``steps_per_call`` = 1), whose loss is that of
the initial parameters on the first batch, so ``first - last`` is what training did. "The
end" is the last logged loss, or the mean of the last ``tail`` ones where single mini-batch
losses are noisy (few masked tokens, tiny batches); likewise "the start" can be the mean of
the first ``head`` logged losses, where the initial loss itself depends on the batch (a
regression's first batch can sit far above or below the typical one; a classifier at
initialisation predicts near-uniform probabilities, so its first loss is ≈ ln V whatever the
batch, and ``head`` = 1 is enough). Means can be weighted by a record field (``weight=
"tokens"``: a masked LM's batches hold a handful of masked tokens each, some none).

Use::

    from tests.experiments._learning import assert_curve_learned, assert_loss_dropped

    first, last = assert_loss_dropped(workdir, rel=0.2)   # WORKDIR/metrics.jsonl of `fit`
    assert_curve_learned(run["curve"], rel=0.2, head=5, tail=5)  # [(step, loss, ...), ...]

Margins are set per experiment from its fixed-seed smoke run, well inside the drop it
shows there (the test files say the measured figures), and fail for a run that does not
train: no steps (no curve), or a learning rate of 1e-9 (the experiments refuse 0).
"""

import math
import os
from collections.abc import Sequence

from seqjax.train.records import read_metrics


def losses(
    workdir: str | os.PathLike, key: str = "loss", weight: str | None = None
) -> list[tuple[int, float, float]]:
    """``(step, value, weight)`` of every record of ``WORKDIR/metrics.jsonl`` that has
    ``key``; ``weight`` is the record's field of that name, or 1 without one."""
    path = os.path.join(os.fspath(workdir), "metrics.jsonl")
    assert os.path.exists(path), f"{path} does not exist: the run logged no metrics"
    return [
        (int(r["step"]), float(r[key]), 1.0 if weight is None else float(r[weight]))
        for r in read_metrics(path)
        if key in r
    ]


def assert_learned(
    first: float,
    last: float,
    *,
    rel: float = 0.1,
    abs_drop: float | None = None,
    what: str = "training loss",
) -> tuple[float, float]:
    """Assert ``last <= first - margin``: ``margin = abs_drop`` if given, else ``rel * |first|``.

    Both values must be finite. Returns ``(first, last)``."""
    assert math.isfinite(first) and math.isfinite(last), (what, first, last)
    margin = abs_drop if abs_drop is not None else rel * abs(first)
    need = f"by {abs_drop}" if abs_drop is not None else f"by {rel:.0%}"
    assert first - last >= margin, (
        f"{what} did not fall {need}: first {first:.4f}, last {last:.4f} "
        f"(drop {first - last:.4f}, needed {margin:.4f})"
    )
    return first, last


def _mean(rows: Sequence[Sequence[float]], index: int, weight_index: int | None) -> float:
    w = [1.0 if weight_index is None else float(r[weight_index]) for r in rows]
    assert sum(w) > 0, f"no weight in {rows}"
    return sum(wi * float(r[index]) for wi, r in zip(w, rows)) / sum(w)


def assert_curve_learned(
    curve: Sequence[Sequence[float]],
    *,
    rel: float = 0.1,
    abs_drop: float | None = None,
    head: int = 1,
    tail: int = 1,
    what: str = "training loss",
    index: int = 1,
    weight_index: int | None = None,
) -> tuple[float, float]:
    """:func:`assert_learned` on a ``[(step, loss, ...), ...]`` curve (``index`` picks the
    column): the mean of its first ``head`` rows against the mean of its last ``tail`` rows
    (the two sets may not overlap), weighted by column ``weight_index`` if given. Returns
    ``(start, end)``, those means."""
    assert head >= 1 and tail >= 1 and len(curve) >= head + tail, (
        f"{what}: a curve of {len(curve)} rows has no {head} first and {tail} last rows"
    )
    start = _mean(curve[:head], index, weight_index)
    end = _mean(curve[-tail:], index, weight_index)
    return assert_learned(start, end, rel=rel, abs_drop=abs_drop, what=what)


def assert_loss_dropped(
    workdir: str | os.PathLike,
    *,
    rel: float = 0.1,
    abs_drop: float | None = None,
    head: int = 1,
    tail: int = 1,
    key: str = "loss",
    weight: str | None = None,
) -> tuple[float, float]:
    """:func:`assert_curve_learned` on ``WORKDIR/metrics.jsonl`` (``key``, default the
    training loss; means weighted by the field ``weight`` if given). Returns ``(start,
    end)``: the means of the first ``head`` and the last ``tail`` logged values."""
    return assert_curve_learned(
        losses(workdir, key, weight),
        rel=rel,
        abs_drop=abs_drop,
        head=head,
        tail=tail,
        what=f"{key} in {os.fspath(workdir)}/metrics.jsonl",
        weight_index=None if weight is None else 2,
    )

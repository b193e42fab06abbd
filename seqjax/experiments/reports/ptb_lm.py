"""ptb_lm's report: the per-epoch results file (``ptb_lm.md``) and the seed summary.

:func:`results_markdown` writes one run's table — the paper's numbers
(:data:`ZAREMBA_SMALL_VALID_PPL`, :data:`ZAREMBA_SMALL_TEST_PPL`), the command, the config,
one row per finished epoch, the final number or "in progress";
:func:`seed_summary_markdown` writes the runs over seeds (mean, sample std, 95% Student-t
interval of the mean, range, per-epoch test perplexity); :func:`write_text` saves either.
The numbers come from :mod:`seqjax.experiments.ptb_lm` (``epoch_table``,
``seed_summary``), whose ``write_results(WORKDIR, PATH, COMMAND)`` and
``write_seed_summary(WORKDIRS, PATH, COMMANDS)`` read the work dirs and call these — the
names the results files tell users to run.
"""

from __future__ import annotations

import os
from typing import Any

from seqjax.experiments._kit import machine

ZAREMBA_SMALL_TEST_PPL = 114.5  # arXiv:1409.2329, Table 1, non-regularized LSTM
ZAREMBA_SMALL_VALID_PPL = 120.7


def write_text(text: str, path: str) -> str:
    """Write ``text`` to ``path`` (UTF-8, creating its folder) and return it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return text


def results_markdown(
    cfg: Any,
    rows: list[dict],
    summary: dict | None,
    *,
    workdir: str,
    command: str | None,
    per_epoch: int,
    last_step: int,
    lr: float,
    clip: float,
) -> str:
    """The results table of one run (markdown): the reference, the command, the config
    (``cfg``, the recipe's ``Config``), one row per finished epoch (``rows``, from
    :func:`seqjax.experiments.ptb_lm.epoch_table`) and the final number when ``summary``
    (the run's ``ptb_lm.json``) says the run finished; ``lr`` and ``clip`` are the
    mean-loss settings the run used."""
    cmd = command or (f"seqjax train ptb_lm --workdir {workdir}")
    done = summary is not None and summary["steps"] >= cfg.epochs * per_epoch
    lines = [
        "# ptb_lm — Penn Treebank, Zaremba et al. (2014) small LSTM",
        "",
        f"Reference: Zaremba, Sutskever & Vinyals (2014), Table 1, non-regularized LSTM: valid "
        f"{ZAREMBA_SMALL_VALID_PPL}, **test {ZAREMBA_SMALL_TEST_PPL}** (13 epochs).",
        "",
        f"Command: `{cmd}` (the run writes this table to `WORKDIR/ptb_lm.md`; "
        "`seqjax.experiments.ptb_lm.write_results(WORKDIR, PATH, COMMAND)` rewrites it from the "
        "work dir, also during a run).",
        "",
        f"Config: 2×{cfg.model.hidden_size} LSTM (embedding {cfg.model.hidden_size}), dropout "
        f"{cfg.model.dropout_rate:g}, init U(±{cfg.model.init_scale:g}), batch {cfg.batch_size}, "
        f"truncated BPTT "
        f"over windows of {cfg.block_size} with the state carried, {cfg.epochs} epochs of "
        f"{per_epoch} steps; SGD lr {cfg.learning_rate:g}, clip {cfg.clip_norm:g}, lr × "
        f"{cfg.lr_decay:g} after every epoch e > {cfg.max_epoch} (`main.lua`'s rule: the lr "
        "column) — Zaremba's numbers for a loss "
        f"summed over the {cfg.block_size} steps, run as lr {lr:g}, clip {clip:g} on seqjax's "
        "mean loss (the same update; see the module docstring of seqjax/experiments/ptb_lm.py).",
        "",
        'Unroll: `main.lua`\'s small config ("Trains 1h and gives test 115 perplexity") reads '
        'windows of `seq_length = 20`; the paper\'s "unrolled for 35 steps" describes its '
        "medium and large (regularized) models (`--preset unroll35` runs 35).",
        "",
        "Perplexity = exp(mean NLL per token); train: mean over the epoch's windows (as "
        f"`main.lua`); valid: the whole split in {cfg.batch_size} rows, test: the whole split "
        f"in {cfg.test_batch_size} row(s), the state carried across each row.",
        "",
    ]
    if summary:
        lines += [
            f"Machine: {summary['machine']}; load average (1/5/15 min) "
            f"{summary['load_average_before']} before → {summary['load_average_after']} "
            "after (the cores were shared with other jobs: wall times are upper bounds).",
            "",
        ]
    else:
        lines += [f"Machine: {machine()}. The cores were shared with other jobs.", ""]
    lines += [
        "| epoch | lr (summed loss) | train ppl | valid ppl | test ppl | elapsed |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        t = "" if r["time"] is None else f"{r['time'] / 60:.1f} min"
        tr = "" if r["train_ppl"] is None else f"{r['train_ppl']:.2f}"
        lr_e = "" if r["lr"] is None else f"{r['lr']:g}"
        lines.append(
            f"| {r['epoch']} | {lr_e} | {tr} | {r['valid_ppl']:.2f} | {r['test_ppl']:.2f} | {t} |"
        )
    lines.append("")
    if done:
        lines += _final_result(cfg, rows, summary)
    else:
        lines += [
            f"**Run in progress / incomplete:** {len(rows)} of {cfg.epochs} epochs "
            f"finished (last logged step {last_step} of {cfg.epochs * per_epoch}); "
            "no final number yet."
        ]
    lines.append("")
    return "\n".join(lines)


def _final_result(cfg: Any, rows: list[dict], summary: dict) -> list[str]:
    """The finished run's lines: the final test perplexity against the target, the best
    validation epoch, the biases and the parameter count."""
    lines = [
        f"**Final test perplexity: {summary['test_ppl']:.2f}** (valid "
        f"{summary['valid_ppl']:.2f}) after {summary['steps']} steps; wall time "
        f"{summary['wall_s'] / 60:.1f} min"
        + (" (resumed run: this process's time)" if summary["resumed_from"] else "")
        + f". Target ≤ {ZAREMBA_SMALL_TEST_PPL}: "
        + ("met." if summary["test_ppl"] <= ZAREMBA_SMALL_TEST_PPL else "NOT met.")
    ]
    best = min(rows, key=lambda r: r["valid_ppl"])
    lines += [
        "",
        f"Best validation perplexity: epoch {best['epoch']}, valid "
        f"{best['valid_ppl']:.2f}, test {best['test_ppl']:.2f} (the table's final row is "
        "the reported number; no early stopping). One run, seed "
        f"{cfg.seed}; the spread over seeds: `write_seed_summary` "
        "([ptb_lm_seeds.md](ptb_lm_seeds.md)). "
        + (
            "Two biases per LSTM gate as `main.lua` (i2h and h2h)."
            if cfg.model.recurrent_bias
            else "One bias per LSTM gate; `main.lua` has two (i2h and h2h)."
        )
        + f" {summary['params']:,} parameters.",
    ]
    if cfg.model.recurrent_bias:
        lines += [
            "",
            "The first full run had one bias per gate (`--model.recurrent_bias=false`): "
            "[ptb_lm_one_bias.md](ptb_lm_one_bias.md).",
        ]
    return lines


def seed_summary_markdown(summary: dict, commands: dict[int, str] | None = None) -> str:
    """The seed summary (markdown) of :func:`seqjax.experiments.ptb_lm.seed_summary`'s
    ``summary``: one row per seed, the mean, sample std, Student-t interval and range
    against the paper's number, and the test perplexity after every epoch; ``commands``
    maps a seed to the command that ran it."""
    cfg, runs, test, valid = (summary[k] for k in ("config", "runs", "test_ppl", "valid_ppl"))
    net = _network(cfg)
    commands = commands or {}
    lines = [
        "# ptb_lm over seeds — Zaremba et al. (2014) small LSTM on Penn Treebank",
        "",
        f"Reference: Zaremba et al. (2014), Table 1, non-regularized LSTM: valid "
        f"{ZAREMBA_SMALL_VALID_PPL}, **test {ZAREMBA_SMALL_TEST_PPL}** (one run; `main.lua`'s "
        'comment on this config: "gives test 115 perplexity").',
        "",
        f"The same config for every run but the seed: {net['num_layers']}×{net['hidden_size']} "
        f"LSTM, {'two biases' if net.get('recurrent_bias') else 'one bias'} per gate, "
        f"{cfg['epochs']} epochs, batch {cfg['batch_size']}, "
        f"windows of {cfg.get('block_size', cfg.get('num_steps'))}, "  # num_steps: an older run
        f"SGD lr {cfg['learning_rate']:g} / clip {cfg['clip_norm']:g} on the summed loss "
        "(the setup of [ptb_lm.md](ptb_lm.md)). The seed draws the initial parameters; the data "
        "order is fixed (contiguous streams, as `main.lua`). Each row is the run's final number "
        'after the last epoch, as reported; "best valid" is the epoch with the lowest '
        "validation perplexity and the test perplexity there (not used for the reported number).",
        "",
        "| seed | valid ppl | test ppl | best valid (epoch: valid / test) | wall | command |",
        "|---:|---:|---:|---|---:|---|",
    ]
    for r in runs:
        cmd = commands.get(r["seed"]) or f"seqjax train ptb_lm --seed {r['seed']} --workdir DIR"
        lines.append(
            f"| {r['seed']} | {r['valid_ppl']:.2f} | {r['test_ppl']:.2f} | "
            f"{r['best_epoch']}: {r['best_valid_ppl']:.2f} / {r['best_test_ppl']:.2f} | "
            f"{r['wall_s'] / 60:.0f} min | `{cmd}` |"
        )
    lines += [
        "",
        f"**Test perplexity over {test['n']} seeds: mean {test['mean']:.2f}, sample std "
        f"{test['std']:.2f}, range {test['min']:.2f}–{test['max']:.2f}** (valid: mean "
        f"{valid['mean']:.2f}, std {valid['std']:.2f}).",
        "",
    ]
    if test["ci95"] is not None:
        lo, hi = test["ci95"]
        inside = lo <= ZAREMBA_SMALL_TEST_PPL <= hi
        lines += [
            f"Standard error of the mean {test['sem']:.2f}; 95% Student-t interval (df = "
            f"{test['n'] - 1}) for the mean test perplexity: {lo:.2f}–{hi:.2f}. The "
            f"paper's {ZAREMBA_SMALL_TEST_PPL} (one run) lies "
            + ("inside" if inside else "outside")
            + " it.",
            "",
        ]
    lines += [
        _target_sentence(test, runs),
        "",
        "Test perplexity at the end of each epoch:",
        "",
        *_test_ppl_by_epoch(runs),
        "",
        'Rewrite this file from the work dirs: `python -c "from seqjax.experiments.ptb_lm import '
        "write_seed_summary as w; w(['DIR0', 'DIR1', ...], 'ptb_lm_seeds.md', "
        "{0: 'COMMAND0', ...})\"` (the last argument fills the command column).",
        "",
    ]
    return "\n".join(lines)


def _network(c: dict) -> dict:
    """A saved config's network: the ``model`` group (``--model.*``), or the flat keys of a
    run from before the group (no ``recurrent_bias`` there: a run from before that option,
    one bias per gate)."""
    from seqjax.experiments._config import saved_config
    from seqjax.experiments.ptb_lm import Config

    return saved_config(Config, c).get("model", {})


def _target_sentence(test: dict, runs: list[dict]) -> str:
    """Whether the mean test perplexity and each run reach the paper's number."""
    met = [r["seed"] for r in runs if r["test_ppl"] <= ZAREMBA_SMALL_TEST_PPL]
    # runs above the target whose 2-decimal figure in the table reads as meeting it
    near = [
        r
        for r in runs
        if r["test_ppl"] > ZAREMBA_SMALL_TEST_PPL
        and round(r["test_ppl"], 2) <= ZAREMBA_SMALL_TEST_PPL
    ]
    return (
        f"Target ≤ {ZAREMBA_SMALL_TEST_PPL}: the mean is "
        + ("at or below it" if test["mean"] <= ZAREMBA_SMALL_TEST_PPL else "above it")
        + f" ({test['mean'] - ZAREMBA_SMALL_TEST_PPL:+.2f}); "
        + f"{len(met)} of {test['n']} runs reach it"
        + (f" (seed{'s' if len(met) > 1 else ''} {', '.join(map(str, met))})" if met else "")
        + "".join(
            f"; seed {r['seed']}'s {r['test_ppl']:.4f} shows as {r['test_ppl']:.2f} but is above it"
            for r in near
        )
        + "."
    )


def _test_ppl_by_epoch(runs: list[dict]) -> list[str]:
    """The table of each run's test perplexity after every epoch, and their mean."""
    lines = [
        "| epoch | " + " | ".join(f"seed {r['seed']}" for r in runs) + " | mean |",
        "|---:|" + "---:|" * (len(runs) + 1),
    ]
    for e in range(min(len(r["epoch_test_ppl"]) for r in runs)):
        row = [r["epoch_test_ppl"][e] for r in runs]
        lines.append(
            f"| {e + 1} | "
            + " | ".join(f"{x:.2f}" for x in row)
            + f" | {sum(row) / len(row):.2f} |"
        )
    return lines

"""gpt2's report: ``gpt2.md``, the run's table beside llm.c's GPT-2 124M anchor.

:func:`report` makes the markdown from the recipe's ``Config`` and its summary
(:mod:`seqjax.experiments.gpt2`, which trains and summarises).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: llm.c's GPT-2 (124M) on FineWeb 10B: val loss and HellaSwag acc_norm it reports.
LLMC_124M_VAL_LOSS, LLMC_124M_HELLASWAG = 3.27, 0.299


def _fmt(x: Any, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def model_shape(m: Any) -> str:
    """``GPT-2 12L/12H/768`` or ``LSTM 2 x 224``: the recipe's ``--model.*`` (``m``) in a few
    characters."""
    return (f"GPT-2 {m.num_layers}L/{m.num_heads}H/{m.embed_dim}"
            if m.architecture == "transformer" else f"LSTM {m.num_layers} x {m.embed_dim}")


def report(cfg: Any, s: dict, tasks: Sequence[str] = ()) -> str:
    """``gpt2.md``: the run's configuration (``cfg``, the recipe's ``Config``), its final
    metrics (the summary ``s``; each of ``tasks``' scores) beside llm.c's GPT-2 124M anchor,
    the throughput and the sample."""
    rows = [
        ("model", f"{model_shape(cfg.model)}, T = "
                  f"{cfg.block_size}, vocabulary {cfg.vocab_size}, "
                  f"{s.get('params', 0):,} parameters"),
        ("data", f"`{cfg.data_path}`"),
        ("steps", f"{s.get('steps')} of {cfg.steps}, {cfg.batch_size * cfg.block_size:,} "
                  f"tokens per step, {_fmt(s.get('tokens_trained'), ',')} tokens"),
        ("validation loss", f"{_fmt(s.get('val_loss'), '.4f')} on "
                            f"{_fmt(s.get('val_tokens'), ',.0f')} tokens"),
        ("training", f"{_fmt(s.get('train_wall_s'), '.1f')} s, "
                     f"{_fmt(s.get('tokens_per_s'), ',.0f')} tokens/s "
                     f"({s.get('parallel', {}).get('device_kind', '?')} x "
                     f"{s.get('parallel', {}).get('devices', '?')})"),
    ]
    for task in tasks:
        scores = [f"{k} {s[f'{task}_{k}']:.4f}" for k in ("acc_norm", "acc")
                  if s.get(f"{task}_{k}") is not None]
        if scores:
            rows.append((task, f"{', '.join(scores)} ({s.get(f'{task}_items')} items)"))
    rows.append(("anchor", f"llm.c's GPT-2 124M on FineWeb 10B tokens: val {LLMC_124M_VAL_LOSS}, "
                           f"HellaSwag acc_norm {LLMC_124M_HELLASWAG}"))
    lines = ["# gpt2 — pretraining on token shards", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    if s.get("sample"):
        start = (f"the prompt {cfg.sample_prompt!r}" if cfg.sample_prompt
                 else "the end-of-text token")
        lines += ["", f"Sample (from {start}):", "", "```", s["sample"], "```"]
    return "\n".join(lines) + "\n"

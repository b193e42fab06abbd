"""Audio's report: ``audio.md``, the AST-vs-CNN results file.

:func:`report` writes the command, machine and wall time, the data and model set-up read
from the ``Config``, and the test-accuracy table (mean ± sd over seeds, per model) from
the summary dict :func:`seqjax.experiments.audio.run` returns. Called by
:mod:`seqjax.experiments.audio`; ``cfg`` is that recipe's ``Config``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LABELS = {"ast": "Audio Spectrogram Transformer", "cnn": "CNN on the spectrogram"}


def report(cfg: Any, s: dict, command: str) -> str:
    from seqjax.experiments._kit import machine, mean_sd
    from seqjax.models.ast import patch_grid

    m = cfg.model
    grid = patch_grid((cfg.n_mels, s["frames"]), tuple(m.patch_size), tuple(m.patch_stride))
    lines = [
        "# audio — Audio Spectrogram Transformer vs a CNN on log-mel spectrograms (Bishop §12.4.3)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Wall time: {s['wall_s']:.0f} s (data, {len(s['runs'])} training runs, evaluation).",
        "",
        f"Data: `seqjax.data.audio.tone_order_dataset` (synthetic; no small labelled audio "
        f"data set ships in a PyPI or Debian package), {s['n_train']} training / "
        f"{s['n_test']} test clips (independent draws), 6 balanced classes = the order of "
        f"two tones from two of three pitch bands, ≥ {cfg.min_gap:g} s "
        f"(≥ {s['min_gap_frames']} frames) apart. Features: log-mel spectrogram in JAX "
        f"(HTK scale, Hann window n_fft = {cfg.n_fft}, hop {cfg.hop_length}, {cfg.n_mels} "
        f"bins: {s['frames']} frames × {cfg.n_mels}), normalised by the training mean and sd.",
        "",
        f"AST: {tuple(m.patch_size)} patches (mel bins × frames) with stride "
        f"{tuple(m.patch_stride)} → {grid[0]} × {grid[1]} = {grid[0] * grid[1]} tokens "
        f"+ `<class>`, {m.num_layers} pre-norm blocks, {m.num_heads} heads, "
        f"d = {m.embed_dim}. "
        f"CNN: 3 × 3 convolutions with {list(m.cnn_channels)} channels, 2 × 2 max-pools "
        f"between them, global average pooling (receptive field {s['cnn_receptive_field']} "
        f"frames). Both: AdamW {cfg.learning_rate:g}, warm-up {cfg.warmup_steps} + cosine, "
        f"{cfg.steps} steps × batch {cfg.batch_size}, clip {cfg.clip_norm:g}, "
        f"seeds {list(cfg.seeds)}.",
        "",
        "| model | params | test accuracy (%) | train loss, first → last logged | train s / seed |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in cfg.models:
        rs = [r for r in s["runs"] if r["model"] == name]
        if not rs:
            continue
        loss = (
            f"{np.mean([r['first_train_loss'] for r in rs]):.3f} → "
            f"{np.mean([r['final_train_loss'] for r in rs]):.3f}"
            if rs[0]["final_train_loss"] is not None
            else "–"
        )
        lines.append(
            f"| {LABELS[name]} | {rs[0]['params']:,} | "
            f"{mean_sd([100 * r['test_accuracy'] for r in rs])} | {loss} | "
            f"{np.mean([r['train_s'] for r in rs]):.0f} |"
        )
    lines += [
        "| chance (6 classes) | – | 16.7 | – | – |",
        "| which two tones, not their order | – | 50.0 | – | – |",
        "",
    ]
    return "\n".join(lines)

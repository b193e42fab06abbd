r"""Audio classification from log-mel spectrograms: AST vs a CNN (Bishop §12.4.3).

Bishop §12.4.3: audio is turned into a mel spectrogram and classified as an image; "until
the development of the transformer, the state-of-the-art approach ... was based on mel
spectrograms treated as images and used as the input to a convolutional neural network
(CNN). However, although a CNN is good at understanding local relationships, one drawback
is that it struggles with longer-range dependencies"; the Audio Spectrogram Transformer
(Gong, Chung & Glass 2021) replaced it. This experiment trains both on the same clips:

* ``ast`` — :class:`seqjax.models.AST`: the spectrogram cut into (optionally overlapping)
  patches, a ``<class>`` token, learned positions, a pre-norm transformer encoder, a
  linear + softmax head, cross-entropy;
* ``cnn`` — :class:`SpectrogramCNN`, the CNN-on-spectrogram baseline: 3 × 3 convolutions
  with ReLU and 2 × 2 max-pooling, global average pooling, a linear + softmax head.

Data: :func:`seqjax.data.audio.tone_order_dataset` — synthetic, because no small labelled
audio data set ships in a PyPI or Debian package (the project's only offline sources). Each
clip (1.55 s at 8 kHz) holds two tones from two of three pitch bands, at least
``min_gap`` = 0.4 s apart and ``margin`` = 0.3 s (19 frames) from the clip's ends; the
class is the ordered pair (6 classes). Which two bands occur is local evidence; their
**order** needs relating two time steps ≥ 25 frames apart — the long-range dependency of
Bishop's argument. The CNN's receptive field is 18 frames (:func:`receptive_field`), so
after global pooling it can tell which tones occur but not in which order (at best 1/2 of
the classes; chance 1/6), and the margin keeps it from reading the order off a tone's
distance to an edge (a first run without the margin, on 64-frame clips, let the CNN reach
94% by that route). This is a constructed test of that one argument, not a benchmark: a
CNN with more or strided layers, or a head that keeps positions, reaches further.

Features: :func:`seqjax.data.audio.log_mel_spectrogram` (HTK mel scale, ``n_fft`` = 256
with a Hann window, hop 128 = 16 ms, 32 mel bins; 96 frames × 32 bins), normalised by the
training set's mean and standard deviation (as Gong et al. normalise their fbank inputs).

Both models train with the same AdamW schedule, steps, batches and seed
(:func:`seqjax.experiments._kit.classifier_run`, as ``digits``), on every visible device.

Run:  python -m seqjax.experiments.audio --results_dir seqjax/experiments/results
      python -m seqjax.experiments.audio --smoke --workdir /tmp/audio     (seconds, for CI)
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax.data.audio import log_mel_spectrogram, num_frames, tone_order_classes
from seqjax.data.audio import tone_order_dataset as _tone_order_dataset
from seqjax.experiments._config import NonNegFloat, NonNegInt, PosFloat, PosInt, moved_into
from seqjax.experiments._kit import Task, Trained, classifier_run, command_line, train
from seqjax.experiments.reports.audio import report
from seqjax.models.ast import AST, ASTConfig
from seqjax.models.vit import vit_block
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import ParallelOptions
from seqjax.utils import count_params

Array = jax.Array
Model = Literal["ast", "cnn"]
MODELS: tuple[str, ...] = get_args(Model)


@dataclass(frozen=True)
class ModelOptions:
    """The two networks the recipe compares, one group of options ``--model.KEY``: the AST's
    patching of the spectrogram and its encoder, and the CNN's channels. ``--models`` (a
    top-level option) picks which of them are trained; the features they read (``--n_mels``,
    ``--n_fft``, ...) are the data's.

    Attributes:
        patch_size: the AST's patch, mel bins × frames (one int = square).
        patch_stride: the AST's patch stride, mel bins × frames; below ``patch_size`` the
            patches overlap (Gong et al.: 16 × 16 patches, stride 10).
        num_layers: AST encoder blocks.
        num_heads: AST attention heads.
        embed_dim: AST width ``d`` (MLP ``2d``).
        cnn_channels: output channels of the CNN's 3 × 3 convolutions (one 2 × 2 max-pool
            after each but the last).
    """

    patch_size: tuple[PosInt, PosInt] = (8, 8)
    patch_stride: tuple[PosInt, PosInt] = (8, 4)
    num_layers: PosInt = 2
    num_heads: PosInt = 4
    embed_dim: PosInt = 64
    cnn_channels: tuple[PosInt, ...] = (16, 32, 32)


@dataclass(frozen=True)
class Config(TrainOptions, ParallelOptions):
    """The options of ``seqjax train audio`` (an AST and a CNN on log-mel spectrograms).

    Attributes:
        models: classifiers trained: ``ast`` and/or ``cnn``.
        seeds: one run of each model per seed (initialisation, batch order); results are
            mean ± sd over them. The data do not depend on it.
        num_train: training clips (``tone_order_dataset`` seed 0).
        num_test: test clips (a separate draw, seed 1).
        min_gap: least silence between the two tones, in seconds.
        margin: least distance of either tone from the clip's ends, in seconds (more than
            the CNN's receptive field, so no unit sees both a tone and an edge).
        sample_rate: samples per second.
        num_samples: samples per clip (12,416 at 8 kHz = 1.55 s = 96 frames).
        n_fft: FFT (and Hann window) length of the spectrogram.
        hop_length: samples between frames.
        n_mels: mel bins (HTK scale).
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        batch_size: clips per step, over all devices (capped at the training set).
        steps: optimiser steps of each run.
        learning_rate: peak AdamW learning rate (warm-up, then cosine to 0).
        weight_decay: AdamW's decoupled weight decay.
        progress: show a progress bar.
        workdir: each run's logs and checkpoint (``MODEL_seedS/``), ``run.json``,
            ``audio.json`` and ``audio.md``; ``None`` = nothing written.
        results_dir: also write ``audio.md`` here; ``None`` = not.
    """

    models: tuple[Model, ...] = MODELS
    seeds: tuple[int, ...] = (0, 1, 2)
    num_train: PosInt = 3000
    num_test: PosInt = 1200
    min_gap: NonNegFloat = 0.4
    margin: NonNegFloat = 0.3
    sample_rate: PosInt = 8000
    num_samples: PosInt = 12416
    n_fft: PosInt = 256
    hop_length: PosInt = 128
    n_mels: PosInt = 32
    model: ModelOptions = ModelOptions()
    steps: NonNegInt = 1500  # TrainOptions' fields, with this recipe's defaults
    batch_size: PosInt = 64
    learning_rate: PosFloat = 2e-3
    weight_decay: NonNegFloat = 1e-4
    progress: bool = False
    workdir: str | None = "workdirs/audio"
    results_dir: str | None = None

    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)


PRESETS = {
    "smoke": {
        "seeds": (0,),
        "num_train": 192,
        "num_test": 48,
        "model.num_layers": 1,
        "model.num_heads": 2,
        "model.embed_dim": 16,
        "model.cnn_channels": (8, 8),
        "steps": 60,
        "warmup_steps": 5,
        "batch_size": 32,
        "learning_rate": 1e-2,
        "log_every": 5,
    },
}


class SpectrogramCNN(nn.Module):
    r"""The CNN-on-spectrogram baseline (Bishop §12.4.3: "mel spectrograms treated as images
    and used as the input to a convolutional neural network").

    .. math::
        H^{(0)} = S^\top \in \mathbb R^{F\times T\times 1},\quad
        H^{(l)} = \mathrm{MaxPool}_{2\times2}(\mathrm{ReLU}(W^{(l)} \ast H^{(l-1)} + b^{(l)}))
        \ \ (\text{no pool after the last}),\quad
        y = \mathrm{softmax}(\mathrm{mean}_{f,t} H^{(L)}_{f,t}\, W_h + b_h)

    ``3 × 3`` convolutions (``SAME`` padding). Input ``[B, T, F]`` (as
    :func:`seqjax.data.audio.log_mel_spectrogram` returns it); output ``logits_BxK``.
    Parameters: ``conv_{l}/{kernel,bias}``, ``head/{kernel,bias}``.
    """

    num_classes: int
    channels: tuple[int, ...] = (32, 64, 64)

    @nn.compact
    def __call__(self, spectrogram_BxTxF: Array) -> Array:
        x = jnp.swapaxes(spectrogram_BxTxF, 1, 2)[..., None]  # [B, F, T, 1]: frequency rows
        for i, c in enumerate(self.channels):
            x = nn.relu(nn.Conv(c, (3, 3), padding="SAME", name=f"conv_{i}")(x))
            if i < len(self.channels) - 1:
                x = nn.max_pool(x, (2, 2), strides=(2, 2))
        pooled_BxC = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, name="head")(pooled_BxC).astype(jnp.float32)


def receptive_field(num_convs: int, kernel: int = 3, pool: int = 2) -> int:
    """Frames (or bins) one output unit of :class:`SpectrogramCNN` sees: ``kernel``-wide
    convolutions with a ``pool``-wide max-pool between consecutive ones (3 convs → 18).

    Example:
        >>> receptive_field(3), receptive_field(2)
        (18, 8)
    """
    rf, jump = 1, 1
    for i in range(num_convs):
        rf += (kernel - 1) * jump
        if i < num_convs - 1:
            rf += (pool - 1) * jump
            jump *= pool
    return rf


def make_classifier(name: str, cfg: Config, num_frames_: int) -> Any:
    num_classes, m = len(tone_order_classes()), cfg.model
    if name == "ast":
        return AST(
            ASTConfig(
                num_frames=num_frames_,
                num_mel_bins=cfg.n_mels,
                patch_size=tuple(m.patch_size),
                patch_stride=tuple(m.patch_stride),
                num_classes=num_classes,
                num_layers=m.num_layers,
                embed_dim=m.embed_dim,
                block=vit_block(m.num_heads, mlp_dim=2 * m.embed_dim),
            )
        )
    if name == "cnn":
        return SpectrogramCNN(num_classes, tuple(m.cnn_channels))
    raise ValueError(f"`models` must be drawn from {MODELS}; got {name!r}.")


def spectrogram_splits(cfg: Config) -> dict[str, dict[str, np.ndarray]]:
    """``{"train", "test"}``: ``x`` the normalised log-mel spectrograms ``[N, T, n_mels]``
    (training mean and sd), ``y`` the class; two independent draws of the data set."""
    kw = dict(
        sample_rate=cfg.sample_rate,
        num_samples=cfg.num_samples,
        min_gap=cfg.min_gap,
        margin=cfg.margin,
    )
    spec = jax.jit(
        lambda a: log_mel_spectrogram(
            a, cfg.sample_rate, n_fft=cfg.n_fft, hop_length=cfg.hop_length, n_mels=cfg.n_mels
        )
    )
    out = {}
    for split, n, seed in (("train", cfg.num_train, 0), ("test", cfg.num_test, 1)):
        d = _tone_order_dataset(n, seed=seed, **kw)
        x = np.concatenate(
            [np.asarray(spec(jnp.asarray(d["audio"][i : i + 500]))) for i in range(0, n, 500)]
        )
        out[split] = {"x": x, "y": d["label"]}
    mean, sd = float(out["train"]["x"].mean()), float(out["train"]["x"].std())
    for split in out.values():
        split["x"] = ((split["x"] - mean) / sd).astype(np.float32)
    return out


def build(cfg: Config) -> Task:
    """One classifier run per model and seed on the same spectrograms; the report."""
    for m in cfg.models:
        if m not in MODELS:
            raise ValueError(f"`models` must be drawn from {MODELS}; got {m!r}.")
    started = time.perf_counter()
    data = spectrogram_splits(cfg)
    frames = num_frames(cfg.num_samples, cfg.n_fft, cfg.hop_length)
    runs = (classifier_run(make_classifier(name, cfg, frames), data["train"], data["test"], cfg,
                           seed, name=f"{name}_seed{seed}", model_config={"model": name},
                           evaluate=functools.partial(result_row, name, seed))
            for name in cfg.models for seed in cfg.seeds)
    figures = {"frames": frames,
               "cnn_receptive_field": receptive_field(len(cfg.model.cnn_channels)),
               "min_gap_frames": int(cfg.min_gap * cfg.sample_rate / cfg.hop_length),
               "n_train": cfg.num_train, "n_test": cfg.num_test}
    return Task("audio", runs, started=started,
                about=f"{cfg.num_train} training / {cfg.num_test} test clips, log-mel "
                      f"{frames} frames × {cfg.n_mels} bins",
                summarize=lambda trained: {"runs": [t.results for t in trained], **figures},
                report=lambda summary: report(cfg, summary, command_line("audio", cfg)))


def result_row(name: str, seed: int, t: Trained) -> dict:
    """A run's row of the summary (printed): its test accuracy, size, time, first and last
    training loss."""
    acc, n = float(t.eval["eval/accuracy"]), count_params(t.params)
    print(f"{name} seed {seed}: test accuracy {100 * acc:.2f}% ({n:,} parameters, "
          f"{t.seconds:.0f}s)")
    losses = [r["loss"] for r in t.records if "loss" in r]
    return {"model": name, "seed": seed, "params": n, "test_accuracy": acc,
            "train_s": t.seconds, "first_train_loss": losses[0] if losses else None,
            "final_train_loss": losses[-1] if losses else None}


def run(cfg: Config) -> dict:
    """Train the AST and the CNN for every seed on every visible device; the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

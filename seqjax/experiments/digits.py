"""Sequential digits: Elman vs LSTM vs GRU vs bidirectional LSTM vs transformer vs ViT.

Data: scikit-learn's 1,797 handwritten digits (8×8, 16 grey levels, 10 classes;
``seqjax.data.packaged.digits``), read as a sequence of 8 rows of 8 pixels (the row-by-row
RNN classifier), or as an image cut into patches (ViT). A seeded 80/20 split.

Models (all from :mod:`seqjax.models`, trained with :func:`seqjax.train.loop.fit`):

* ``elman``, ``lstm``, ``gru`` — :class:`~seqjax.models.RNNClassifier` on the rows,
  classifying from the last hidden state (MEDL Fig. 7.2(b) many-to-one; J&M Fig. 9.8);
* ``bilstm`` — the same with a bidirectional LSTM, from ``[h^f_n; h^b_1]`` (J&M Fig. 9.12);
* ``transformer`` — a pre-norm transformer encoder over the 8 rows with a ``<class>``
  token: :class:`~seqjax.models.ViT` applied to the ``8×1`` "image" whose 8 channels are a
  row's pixels, so every 1×1 patch is one row (Bishop §12.4.1's construction, one token per row);
* ``vit`` — :class:`~seqjax.models.ViT` on the 8×8 image in 2×2 patches (16 tokens;
  Bishop §12.4.1, Fig. 12.22).

Reference: scikit-learn's gallery example "Recognizing hand-written digits" fits an RBF
SVM (``SVC(gamma=0.001)``) and reports ~0.97 accuracy on a 50/50 split; the script fits
the same SVM on its own split for a like-for-like baseline.

Every visible device (and host) trains each model, data parallel unless ``--mesh`` /
``--strategy`` say otherwise; ``batch_size`` is the global batch.

Run:  python -m seqjax.experiments.digits               (or: seqjax train digits)
      python -m seqjax.experiments.digits --smoke       (seconds, for CI)
"""

from __future__ import annotations

import collections
import functools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import numpy as np

from seqjax.data.batching import split_arrays
from seqjax.experiments._config import Fraction, NonNegFloat, NonNegInt, PosInt, moved_into
from seqjax.experiments._kit import Run, Task, Trained, classifier_run, machine_info, train
from seqjax.experiments.reports.digits import accuracy_table, plot_accuracy
from seqjax.models.rnn import RNNClassifier, RNNClassifierConfig
from seqjax.models.vit import ViT, ViTConfig, vit_block
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import ParallelOptions
from seqjax.utils import count_params

Model = Literal["elman", "lstm", "gru", "bilstm", "transformer", "vit"]
MODELS: tuple[str, ...] = get_args(Model)
LABELS = {
    "elman": "Elman RNN (rows)",
    "lstm": "LSTM (rows)",
    "gru": "GRU (rows)",
    "bilstm": "bidirectional LSTM (rows)",
    "transformer": "transformer encoder (rows as tokens)",
    "vit": "ViT (2×2 patches)",
}


@dataclass(frozen=True)
class ModelOptions:
    """The networks' sizes, ``--model.KEY``: one set shared by every architecture compared
    (``--models``), each taking the ones that apply to it — the row RNNs their width, the
    row transformer and the ViT all four.

    Attributes:
        hidden_size: RNN width (one layer); width ``d`` of the transformer and ViT (MLP ``2d``).
        num_layers: transformer and ViT blocks.
        num_heads: attention heads (transformer and ViT).
        patch_size: the ViT's patch side in pixels (must divide 8).
    """

    hidden_size: PosInt = 64
    num_layers: PosInt = 2  # transformer / ViT blocks
    num_heads: PosInt = 4
    patch_size: PosInt = 2


@dataclass(frozen=True)
class Config(TrainOptions, ParallelOptions):
    """The options of ``seqjax train digits`` (row-by-row RNNs, a transformer and a ViT).

    Attributes:
        models: classifiers trained: ``elman``, ``lstm``, ``gru``, ``bilstm``,
            ``transformer`` and/or ``vit``.
        seeds: one run of each model per seed (initialisation, batch order); results are
            mean ± sd over them.
        test_fraction: fraction of the 1,797 images held out for test (a fixed split).
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        batch_size: images per step, over all devices (capped at the training set).
        steps: optimiser steps of each run.
        learning_rate: peak AdamW learning rate (warm-up, then cosine to 0).
        weight_decay: AdamW's decoupled weight decay (matrices; not vectors, norms or embeddings).
        progress: show a progress bar.
        workdir: each run's logs and checkpoint (``MODEL_seedS/``), ``run.json``,
            ``digits.json`` and ``digits_accuracy.png``; unset = nothing written.
    """

    #: The network's options moved into the group ``--model.*`` (refused on the command line
    #: naming the new spelling; read from a saved ``experiment.json``).
    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)

    models: tuple[Model, ...] = MODELS
    seeds: tuple[int, ...] = (0, 1, 2)
    test_fraction: Fraction = 0.2
    model: ModelOptions = ModelOptions()
    steps: NonNegInt = 1500  # TrainOptions' fields, with this recipe's defaults
    batch_size: PosInt = 64
    weight_decay: NonNegFloat = 1e-4
    progress: bool = True
    workdir: str | None = "workdirs/digits"


PRESETS = {
    "smoke": {"models": "lstm,vit", "seeds": "0", "model.hidden_size": 8, "model.num_layers": 1,
              "model.num_heads": 2, "steps": 3, "warmup_steps": 1, "log_every": 1,
              "batch_size": 16, "progress": False},
}


def make_classifier(name: str, cfg: Config) -> tuple[Any, str]:
    """``(model, layout)``: the model and the input layout it reads (``"rows"``/``"images"``),
    at ``cfg.model``'s sizes."""
    m = cfg.model
    if name in ("elman", "lstm", "gru", "bilstm"):
        cell = "lstm" if name == "bilstm" else name
        return RNNClassifier(RNNClassifierConfig(
            num_classes=10, vocab_size=None, hidden_size=m.hidden_size, cell_type=cell,
            bidirectional=name == "bilstm", pooling="last")), "rows"
    common = dict(num_classes=10, num_layers=m.num_layers, embed_dim=m.hidden_size,
                  block=vit_block(m.num_heads, mlp_dim=2 * m.hidden_size))
    if name == "transformer":
        # An 8×1 image with 8 channels: patch (i, 0) is row i, so the tokens are the rows.
        return ViT(ViTConfig(image_size=(8, 1), patch_size=1, channels=8, **common)), "row_image"
    if name == "vit":
        return ViT(ViTConfig(image_size=8, patch_size=m.patch_size, channels=1,
                             **common)), "images"
    raise ValueError(f"`models` must be drawn from {MODELS}; got {name!r}.")


def _inputs(rows_Nx8x8: np.ndarray, layout: str) -> np.ndarray:
    if layout == "rows":
        return rows_Nx8x8
    if layout == "row_image":
        return rows_Nx8x8[:, :, None, :]  # [N, H=8, W=1, C=8]
    return rows_Nx8x8[..., None]  # [N, 8, 8, 1]


def svm_baseline(train: dict[str, np.ndarray], test: dict[str, np.ndarray]) -> float:
    """Accuracy of scikit-learn's gallery classifier, ``SVC(gamma=0.001)`` on raw 0–16 pixels."""
    from sklearn.svm import SVC

    clf = SVC(gamma=0.001).fit(16.0 * train["x"].reshape(len(train["x"]), -1), train["y"])
    pred = clf.predict(16.0 * test["x"].reshape(len(test["x"]), -1))
    return float(np.mean(pred == test["y"]))


def build(cfg: Config) -> Task:
    """One classifier run per model and seed on a fixed split; the SVM baseline."""
    from seqjax.data.packaged import digits

    for m in cfg.models:
        if m not in MODELS:
            raise ValueError(f"`models` must be drawn from {MODELS}; got {m!r}.")
    started, info = time.perf_counter(), machine_info()
    data = digits("rows")
    train, test = split_arrays({"x": data["inputs"], "y": data["labels"]},
                               cfg.test_fraction, seed=0)
    svm = svm_baseline(train, test)

    def runs() -> Iterator[Run]:
        for name in cfg.models:
            for seed in cfg.seeds:
                model, layout = make_classifier(name, cfg)
                print(f"\n== {LABELS[name]}, seed {seed}")
                yield classifier_run(
                    model, {"x": _inputs(train["x"], layout), "y": train["y"]},
                    {"x": _inputs(test["x"], layout), "y": test["y"]}, cfg, seed,
                    name=f"{name}_seed{seed}",
                    model_config={"model": name, "hidden_size": cfg.model.hidden_size},
                    evaluate=functools.partial(result_row, name, seed))

    def summarize(trained: list[Trained]) -> dict:
        rows = [t.results for t in trained]
        by: dict[str, list[dict]] = collections.defaultdict(list)
        for r in rows:
            by[r["model"]].append(r)
        table = accuracy_table(by, svm, LABELS, cfg.model.patch_size)
        print("\n" + table)
        plot = {"plot": os.path.join(cfg.workdir, "digits_accuracy.png")} if cfg.workdir else {}
        return {"machine": info, "runs": rows, "svm_accuracy": svm, "n_train": len(train["y"]),
                "n_test": len(test["y"]), "table_md": table, **plot}

    about = (f"{len(train['y'])} training / {len(test['y'])} test images; SVC(gamma=0.001) "
             f"baseline {100 * svm:.1f}%; {info['cpu']}, {info['cores']} cores, "
             f"load {info['load_avg']}")
    return Task("digits", runs(), about=about, summarize=summarize, files=draw, started=started)


def result_row(name: str, seed: int, t: Trained) -> dict:
    """A run's row of the summary (printed): its test accuracy, size, time, last loss."""
    acc, n = float(t.eval["eval/accuracy"]), count_params(t.params)
    print(f"{name} seed {seed}: test accuracy {100 * acc:.2f}% ({n:,} parameters, "
          f"{t.seconds:.0f}s)")
    losses = [r["loss"] for r in t.records if "loss" in r]
    return {"model": name, "seed": seed, "params": n, "test_accuracy": acc,
            "train_s": t.seconds, "final_train_loss": losses[-1] if losses else None}


def draw(folder: str, summary: dict) -> None:
    """``digits_accuracy.png``: the accuracy of each model over the seeds."""
    by: dict[str, list[dict]] = collections.defaultdict(list)
    for r in summary["runs"]:
        by[r["model"]].append(r)
    plot_accuracy(by, summary["svm_accuracy"], os.path.join(folder, "digits_accuracy.png"))


def run(cfg: Config) -> dict:
    """Train every model for every seed on every visible device; the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

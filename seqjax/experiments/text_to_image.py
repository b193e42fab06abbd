r"""Text and image tokens in one sequence: digits drawn from a prompt (Bishop §12.4.5).

Bishop §12.4.5 treats text-to-image generation as language modelling over "a dictionary
that is the concatenation of a language token dictionary and the image token codebook":
the text tokens are given first and every image token is decoded conditioned on them. Here
the image GPT of :mod:`seqjax.experiments.image_gpt` (Bishop §12.4.2) reads, before the
raster-order codes ``c_1 … c_L`` of an 8×8 digit, the prompt naming it:

.. math::
    [\text{a}, \text{seven}, \langle\text{sep}\rangle, c_1, …, c_L],\qquad
    p(c_1, …, c_L \mid \text{text}) = \prod_{n=1}^{L} p(c_n \mid \text{text},
    \langle\text{sep}\rangle, c_1, …, c_{n-1})

((12.37) with the text as the sequence's given beginning). One vocabulary: the ``K`` image
codes are ids ``0 … K−1`` (the K-means codebook of (12.38), as image_gpt's), then the
eleven words ``a, zero … nine``, then ``<sep>``. The loss is the causal LM cross-entropy on
the image part only: the prompt is always given, never generated, and its second word is
uniform over the ten digits (a loss on it would learn only the label frequencies); at an
image position every non-code id gets logit −∞, so the test NLL is over the ``K`` codes,
as image_gpt's. Generation feeds ``[a, DIGIT, <sep>]`` and samples the ``L`` codes
(:func:`seqjax.experiments._images.generate`).

Measure: a digit classifier — scikit-learn's gallery ``SVC(gamma=0.001)`` trained on the
real training digits — labels the generated images; its accuracy against the prompt, per
prompt, says whether the text steers the image. Its accuracy on the real test digits (and
on the same digits quantised through the codebook) calibrates it. Also: test bits per image
of the codes given the true prompt, next to the independent-position baselines without and
with the digit (a categorical per position, or per position and digit; add-one counts).

The network is image_gpt's, one group of options, ``--model.KEY`` (the GPT recipe's
:class:`~seqjax.experiments._gpt.TransformerOptions`: ``--model.num_layers``,
``--model.dropout_rate``, …), so every other switch of that transformer (``--model.positions
rope``, ``--model.qk_norm``, ``--model.norm_type rmsnorm``, ``--model.tie_embeddings``, …) is an
option here too.

Run:  python -m seqjax.experiments.text_to_image --results_dir seqjax/experiments/results
      python -m seqjax.experiments.text_to_image --smoke --workdir /tmp/t2i     (seconds)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from seqjax._checks import check_positive_ints
from seqjax.experiments._config import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt
from seqjax.experiments._gpt import TransformerOptions
from seqjax.experiments._images import (
    TOKENISATIONS,
    decode,
    digit_splits,
    encode,
    generate,
    image_bits,
    independent_baseline,
    lm_arrays,
    lm_run,
    tokenizer,
)
from seqjax.experiments._kit import Task, Trained, command_line, train
from seqjax.experiments.reports.text_to_image import plot_samples, report
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import ParallelOptions

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
WORDS = ("a", *DIGIT_WORDS)


@dataclass(frozen=True)
class Config(TrainOptions, ParallelOptions):
    """The options of ``seqjax train text_to_image`` (a digit image GPT prompted by text).

    Attributes:
        tokens: the image tokenisation, as image_gpt's: ``patches`` (a token per
            ``patch_size`` × ``patch_size`` patch) or ``pixels`` (a token per pixel).
        pixel_codes: ``K`` of the ``pixels`` grey palette (K-means).
        patch_codes: ``K`` of the ``patches`` codebook (K-means).
        patch_size: side of a ``patches`` token in pixels (must divide 8).
        model: the network, one group of options
            (:class:`~seqjax.experiments._gpt.TransformerOptions`, ``--model.KEY``): here 2
            blocks, 4 heads, width ``d`` = 64, dropout 0.1 on the embeddings, residual
            branches and attention weights, exact GELU, an untied head.
        steps: AdamW steps (the cosine schedule ends here).
        batch_size: sequences per step, over all devices (the global batch).
        learning_rate: peak AdamW learning rate, after the warm-up (cosine decay to 0).
        weight_decay: AdamW's decoupled weight decay (weight matrices only).
        val_fraction: share of the training images held out for early stopping (the
            parameters with the lowest validation NLL are kept); 0 = the last step's.
        eval_every: steps between validation evaluations (also at the end; 0 = only at
            the end).
        unconditional: also train the same model on ``[<sep>, c_1 … c_L]`` (no text;
            image_gpt's unconditional model in this vocabulary), to measure the bits per
            image the prompt saves.
        samples_per_prompt: images generated for each of the ten prompts "a zero" …
            "a nine" (at most 10 per prompt are plotted).
        temperature: sampling temperature.
        seed: K-means, initialisation, batch order and sampling (the splits are fixed).
        progress: show a progress bar.
        workdir: ``run.json``, ``model/`` and ``unconditional/`` (each: a checkpoint at
            the end, ``metrics.jsonl``),
            ``text_to_image_samples.png``, ``text_to_image.md`` and
            ``text_to_image.json``; ``None`` = nothing written.
        results_dir: also write the plot and ``text_to_image.md`` here; ``None`` = not.
    """

    tokens: Literal["pixels", "patches"] = "patches"
    pixel_codes: PosInt = 4
    patch_codes: PosInt = 32
    patch_size: PosInt = 2
    model: TransformerOptions = TransformerOptions(
        num_layers=2, num_heads=4, embed_dim=64, dropout_rate=0.1, activation="gelu",
        tie_embeddings=False)
    steps: NonNegInt = 1500  # TrainOptions' fields, with this recipe's defaults
    batch_size: PosInt = 64
    log_every: PosInt = 250
    weight_decay: NonNegFloat = 0.01
    val_fraction: Fraction = 0.1
    eval_every: NonNegInt = 100
    unconditional: bool = True
    samples_per_prompt: PosInt = 50
    temperature: PosFloat = 1.0
    seed: int = 0
    progress: bool = False
    workdir: str | None = "workdirs/text_to_image"
    results_dir: str | None = None

    #: Options that moved into the ``model`` group (``--num_layers`` exits 2 naming
    #: ``--model.num_layers``; an old flat ``experiment.json`` loads into the group).
    RENAMED: ClassVar[dict[str, str]] = {
        name: f"model.{name}" for name in ("num_layers", "num_heads", "embed_dim", "dropout_rate")}


PRESETS = {
    "smoke": {
        "model.num_layers": 1,
        "model.num_heads": 2,
        "model.embed_dim": 16,
        "steps": 40,
        "warmup_steps": 5,
        "batch_size": 32,
        "eval_every": 20,
        "samples_per_prompt": 2,
        "log_every": 10,
    }
}


def vocabulary(num_codes: int) -> dict[str, int]:
    """Text ids after the ``K`` codes: ``a`` → ``K``, ``zero … nine`` → ``K+1 … K+10``,
    ``<sep>`` → ``K+11`` (vocabulary size ``K + 12``)."""
    ids = {w: num_codes + i for i, w in enumerate(WORDS)}
    ids["<sep>"] = num_codes + len(WORDS)
    return ids


def prompt_tokens(labels_N: np.ndarray, num_codes: int) -> np.ndarray:
    """``int32[N, 3]``: ``[a, DIGIT, <sep>]`` for each digit label in ``0 … 9``."""
    labels_N = np.asarray(labels_N)
    if (
        labels_N.ndim != 1
        or not np.issubdtype(labels_N.dtype, np.integer)
        or (labels_N.size and (labels_N.min() < 0 or labels_N.max() > 9))
    ):
        raise ValueError(
            f"`labels` must be ints in [0, 9] of shape [N]; got {labels_N.dtype} {labels_N.shape}."
        )
    ids = vocabulary(num_codes)
    out = np.empty((len(labels_N), 3), np.int32)
    out[:, 0] = ids["a"]
    out[:, 1] = ids["zero"] + labels_N
    out[:, 2] = ids["<sep>"]
    return out


def class_independent_baseline(
    train_tok: np.ndarray, train_y: np.ndarray, test_tok: np.ndarray, test_y: np.ndarray, vocab: int
) -> float:
    """Test NLL (bits per image) of a categorical per position *and digit* (add-one counts):
    :func:`~seqjax.experiments._images.independent_baseline` fitted on each digit's
    training images and scored on that digit's test images."""
    total = 0.0
    for d in range(10):
        sel = test_y == d
        if sel.any():
            total += sel.sum() * independent_baseline(train_tok[train_y == d], test_tok[sel], vocab)
    return float(total / len(test_y))


def digit_classifier(train_x: np.ndarray, train_y: np.ndarray) -> Any:
    """scikit-learn's gallery classifier, ``SVC(gamma=0.001)`` on the 0–16 pixel scale, fitted
    on ``[N, 8, 8]`` images in [0, 1]; ``.predict`` takes the same."""
    from sklearn.svm import SVC

    clf = SVC(gamma=0.001).fit(16.0 * train_x.reshape(len(train_x), -1), train_y)

    class _Digits:
        def predict(self, x: np.ndarray) -> np.ndarray:
            return clf.predict(16.0 * np.asarray(x).reshape(len(x), -1))

    return _Digits()


def build(cfg: Config) -> Task:
    """The LM of ``[prompt, <sep>, codes]`` (and, with ``unconditional``, the same without
    the prompt); sampling every prompt, the classifier's verdict and the baselines."""
    if cfg.tokens not in TOKENISATIONS:
        raise ValueError(f"`tokens` must be one of {TOKENISATIONS}; got {cfg.tokens!r}.")
    check_positive_ints(samples_per_prompt=cfg.samples_per_prompt)
    started = time.perf_counter()
    data = digit_splits(cfg.val_fraction)
    codebook, patch = tokenizer(cfg.tokens, data["fit"]["x"], cfg)
    k = len(codebook)
    tok = {name: encode(d["x"], codebook, patch) for name, d in data.items()}
    vocab = k + len(WORDS) + 1
    length = tok["test"].shape[1]
    mc = {"tokens": cfg.tokens, "embed_dim": cfg.model.embed_dim, "vocab": vocab}
    # generation: every prompt "a zero" … "a nine", samples_per_prompt images each
    labels = np.repeat(np.arange(10), cfg.samples_per_prompt)
    drawn: dict[str, np.ndarray] = {}

    def sample_and_score(model: Any, params: Any, info: dict) -> dict:
        gen = generate(model, params, prompt_tokens(labels, k), k, length, cfg.temperature,
                       cfg.seed)
        images = decode(gen, codebook, patch)
        clf = digit_classifier(data["fit"]["x"], data["fit"]["y"])
        predicted = clf.predict(images)
        drawn.update(images=images, predicted=predicted)
        test_y = data["test"]["y"]
        # the prompted model as an unconditional one: p(x) = Σ_y p(y) p(x | y), p(y) the
        # training digits' frequencies, p(x | y) the transformer given "a y <sep>"
        bits_YxN = np.stack([image_bits(model, params, lm_arrays(
            prompt_tokens(np.full(len(test_y), d), k), tok["test"]), k) for d in range(10)])
        log2_prior_Y = np.log2(np.bincount(data["fit"]["y"], minlength=10)
                               / len(data["fit"]["y"]))
        mixture_N = -np.logaddexp2.reduce(log2_prior_Y[:, None] - bits_YxN, axis=0)
        info.update({
            "tokens": cfg.tokens, "codes": k, "vocab": vocab, "sequence_length": int(length),
            "patch": patch,
            "independent_bits_per_image": independent_baseline(tok["fit"], tok["test"], k),
            "class_independent_bits_per_image": class_independent_baseline(
                tok["fit"], data["fit"]["y"], tok["test"], test_y, k),
            "uniform_bits_per_image": float(length * np.log2(k)),
            "mixture_bits_per_image": float(np.mean(mixture_N)),
            "accuracy_per_prompt": [float(np.mean(predicted[labels == d] == d))
                                    for d in range(10)],
            "accuracy": float(np.mean(predicted == labels)),
            "classifier_test_accuracy": float(np.mean(clf.predict(data["test"]["x"]) == test_y)),
            "classifier_quantised_test_accuracy": float(
                np.mean(clf.predict(decode(tok["test"], codebook, patch)) == test_y)),
            "confusion": [np.bincount(predicted[labels == d], minlength=10).tolist()
                          for d in range(10)],
        })
        return info

    def splits(prompt: Callable[[str], np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
        return {name: lm_arrays(prompt(name), t) for name, t in tok.items() if name != "fit"}

    runs = [lm_run(cfg, splits(lambda name: prompt_tokens(data[name]["y"], k)), vocab, k,
                   name="model", model_config=mc, evaluate=sample_and_score)]
    if cfg.unconditional:  # the same model and data without the text: [<sep>, c_1 … c_L]
        sep = vocabulary(k)["<sep>"]
        runs.append(lm_run(cfg, splits(lambda name: np.full((len(tok[name]), 1), sep, np.int32)),
                           vocab, k, name="unconditional", model_config=mc))
    sizes = {"n_fit": len(data["fit"]["x"]), "n_train": len(data["train"]["x"]),
             "n_val": len(data["val"]["x"]) if "val" in data else 0,
             "n_test": len(data["test"]["y"])}
    return Task("text_to_image", runs, started=started,
                summarize=lambda trained: summarize(trained, sizes),
                report=lambda s: report(cfg, s, command_line("text_to_image", cfg),
                                        words=DIGIT_WORDS),
                files=lambda folder, s: plot_samples(drawn["images"], labels, drawn["predicted"],
                                                     folder, words=DIGIT_WORDS))


def summarize(trained: list[Trained], sizes: dict) -> dict:
    """The prompted model's figures (and the unconditional model's bits/image); printed."""
    info = dict(trained[0].results)
    if len(trained) > 1:
        info["unconditional_bits_per_image"] = trained[1].results["test_bits_per_image"]
    print(
        f"text_to_image: {info['codes']} codes × {info['sequence_length']} tokens; test "
        f"{info['test_bits_per_image']:.1f} bits/image given the prompt (independent positions "
        f"{info['independent_bits_per_image']:.1f}, given the digit "
        f"{info['class_independent_bits_per_image']:.1f}); samples classified as their "
        f"prompt {100 * info['accuracy']:.1f}% (classifier on real test digits "
        f"{100 * info['classifier_test_accuracy']:.1f}%)"
    )
    return {**info, **sizes}


def run(cfg: Config) -> dict:
    """Train the prompted LM (and the unconditional one); the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

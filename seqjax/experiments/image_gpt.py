r"""A raster-order image transformer on scikit-learn digits (Bishop §12.4.2, Fig. 12.23).

Bishop §12.4.2 generates images autoregressively: the pixels are read in **raster order**
(row by row, left to right; Fig. 12.23's ``x_1..x_16`` on a 4×4 grid) and

.. math::
    p(x_1, …, x_N) = \prod_{n=1}^{N} p(x_n \mid x_1, …, x_{n-1})\qquad (12.37)

is modelled by a decoder-only transformer with the causal LM loss, exactly as text
(Bishop §12.3.1). Pixels must be **discrete** tokens: each value (or patch) is
replaced by its nearest code vector, ``x_n → \arg\min_{c_k ∈ \mathcal C} \lVert x_n − c_k
\rVert^2`` (12.38), with a codebook fitted by K-means (ImageGPT's colour palette).
Two tokenisations of the 8×8 digits (16 grey levels, scaled to [0, 1]):

* ``pixels``: every pixel is one token, a ``K``-level grey palette (1-D K-means;
  64 tokens per image);
* ``patches``: every 2×2 patch is one token, a codebook of ``K`` patch vectors in ℝ⁴
  (16 tokens per image; vector quantisation proper).

The model is :class:`seqjax.models.TransformerLM` on ``[<start>, t_1 … t_{N−1}]`` with
targets ``[t_1 … t_N]``; samples are drawn by :func:`seqjax.decoding.sample` from
``<start>`` and decoded through the codebook (:func:`seqjax.nn.vq.nearest_code`,
``codebook[k]``). Baseline: independent pixels — a categorical distribution per position
(add-one smoothed counts), the ``p(x) = ∏ p(x_n)`` that ignores the context. Test
negative log-likelihood is reported in bits per image.

1,438 training images are few for a 100k-parameter transformer: without regularisation it
over-fits and, on patches, loses to the baseline (``results/image_gpt_ablation.md``). So
the model trains with dropout, and the parameters of the step with the lowest NLL on a
held-out validation split (early stopping) are the ones tested. The tokenisation, the
training, the bits per image and the sampling are the experiments' image kit,
:mod:`seqjax.experiments._images`, whose ``lm_run``, ``lm_arrays``, ``image_bits`` and
``generate`` take any prompt before the codes (``<start>`` here; text in
:mod:`seqjax.experiments.text_to_image`).

The network is one group of options, ``--model.KEY`` (the GPT recipe's
:class:`~seqjax.experiments._gpt.TransformerOptions`: ``--model.num_layers``,
``--model.dropout_rate``, …), so every other switch of that transformer (``--model.positions
rope``, ``--model.qk_norm``, ``--model.norm_type rmsnorm``, ``--model.tie_embeddings``, …) is an
option here too.

Run:  python -m seqjax.experiments.image_gpt --results_dir seqjax/experiments/results
      python -m seqjax.experiments.image_gpt --smoke --workdir /tmp/igpt     (seconds)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from seqjax.experiments._config import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt
from seqjax.experiments._gpt import TransformerOptions
from seqjax.experiments._images import (
    TOKENISATIONS,
    Tokenisation,
    decode,
    digit_splits,
    encode,
    generate,
    independent_baseline,
    lm_arrays,
    lm_run,
    tokenizer,
)
from seqjax.experiments._kit import Run, Task, command_line, train
from seqjax.experiments.reports.image_gpt import plot_samples, report
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import ParallelOptions


@dataclass(frozen=True)
class Config(TrainOptions, ParallelOptions):
    """The options of ``seqjax train image_gpt`` (a raster-order transformer on 8×8 digits).

    Attributes:
        tokens: tokenisations, one model each: ``pixels`` (a token per pixel) or ``patches``
            (a token per ``patch_size`` × ``patch_size`` patch).
        pixel_codes: ``K``, grey levels of the ``pixels`` palette (K-means).
        patch_codes: ``K``, patch vectors of the ``patches`` codebook (K-means).
        patch_size: side of a ``patches`` token in pixels (must divide 8).
        model: the network, one group of options
            (:class:`~seqjax.experiments._gpt.TransformerOptions`, ``--model.KEY``): here 2
            blocks, 4 heads, width ``d`` = 64, dropout 0.1 on the embeddings, residual
            branches and attention weights, exact GELU, an untied head.
        steps: AdamW steps per tokenisation (the cosine schedule ends here).
        batch_size: images per step, over all devices (the global batch).
        learning_rate: peak AdamW learning rate, after the warm-up (cosine decay to 0).
        weight_decay: AdamW's decoupled weight decay (weight matrices; not biases, norms
            or embeddings).
        val_fraction: share of the training images held out for early stopping (the
            parameters with the lowest validation NLL are kept); 0 = none, the last step's
            parameters. The codebook and the baseline are fitted on all training images.
        eval_every: steps between validation evaluations (also at the end; 0 = only at
            the end).
        num_samples: images sampled per tokenisation (at most 16 are plotted).
        temperature: sampling temperature.
        seed: K-means, initialisation, batch order and sampling (the 80/20 split is fixed).
        progress: show a progress bar.
        workdir: ``run.json``, ``pixels/`` and ``patches/`` (each training run: a checkpoint
            at the end, ``metrics.jsonl``), ``image_gpt_samples.png``, ``image_gpt.md`` and
            ``image_gpt.json``; ``None`` = nothing written.
        results_dir: also write the plot and ``image_gpt.md`` here; ``None`` = not.
    """

    tokens: tuple[Tokenisation, ...] = TOKENISATIONS
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
    num_samples: PosInt = 32
    temperature: PosFloat = 1.0
    seed: int = 0
    progress: bool = False
    workdir: str | None = "workdirs/image_gpt"
    results_dir: str | None = None

    #: Options that moved into the ``model`` group (``--num_layers`` exits 2 naming
    #: ``--model.num_layers``; an old flat ``experiment.json`` loads into the group).
    RENAMED: ClassVar[dict[str, str]] = {
        name: f"model.{name}" for name in ("num_layers", "num_heads", "embed_dim", "dropout_rate")}


# smoke: 2×2 patches, a 1-layer d = 32 model, 200 steps (seconds); at this size the model
# already beats the independent-position baseline by ~5 bits/image on seeds 0–3 (the test).
PRESETS = {
    "smoke": {
        "tokens": ("patches",),
        "model.num_layers": 1,
        "model.num_heads": 2,
        "model.embed_dim": 32,
        "steps": 200,
        "warmup_steps": 20,
        "batch_size": 32,
        "eval_every": 50,
        "num_samples": 8,
        "log_every": 50,
    }
}


def build(cfg: Config) -> Task:
    """One LM run per tokenisation (pixels, patches) of the same digits; the report and the
    sample figure."""
    started = time.perf_counter()
    data = digit_splits(cfg.val_fraction)
    samples: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def one(kind: str) -> Run:  # the codebook, the code sequences and the run of one kind
        codebook, patch = tokenizer(kind, data["fit"]["x"], cfg)
        vocab = len(codebook)
        tok = {name: encode(d["x"], codebook, patch) for name, d in data.items()}
        start_id = vocab  # <start> is the last id
        splits = {name: lm_arrays(np.full((len(t), 1), start_id, np.int32), t)
                  for name, t in tok.items() if name != "fit"}
        length = tok["test"].shape[1]

        def sample_and_score(model: Any, params: Any, info: dict) -> dict:
            gen = generate(model, params, np.full((cfg.num_samples, 1), start_id, np.int32),
                           vocab, length, cfg.temperature, cfg.seed)
            samples[kind] = (decode(gen, codebook, patch),
                             decode(tok["test"][: cfg.num_samples], codebook, patch))
            recon = decode(tok["test"], codebook, patch)
            info.update({
                "tokens": kind, "codes": vocab, "sequence_length": int(length), "patch": patch,
                "reconstruction_rmse": float(np.sqrt(np.mean((recon - data["test"]["x"]) ** 2))),
                "independent_bits_per_image": independent_baseline(tok["fit"], tok["test"], vocab),
                "uniform_bits_per_image": float(length * np.log2(vocab)),
                "codebook": np.round(codebook, 3).tolist(),
            })
            print(f"{kind}: {vocab} codes × {length} tokens; test "
                  f"{info['test_bits_per_image']:.1f} bits/image at step {info['best_step']} "
                  f"(last step {info['last_test_bits_per_image']:.1f}; independent positions "
                  f"{info['independent_bits_per_image']:.1f}, uniform "
                  f"{info['uniform_bits_per_image']:.0f}); {info['train_s']:.0f}s")
            return info

        return lm_run(cfg, splits, vocab + 1, vocab, name=kind, evaluate=sample_and_score,
                      model_config={"tokens": kind, "embed_dim": cfg.model.embed_dim})

    sizes = {"n_train": len(data["train"]["x"]), "n_fit": len(data["fit"]["x"]),
             "n_val": len(data["val"]["x"]) if "val" in data else 0,
             "n_test": len(data["test"]["x"])}
    return Task("image_gpt", (one(kind) for kind in cfg.tokens), started=started,
                summarize=lambda trained: {"runs": [t.results for t in trained], **sizes},
                report=lambda s: report(cfg, s, command_line("image_gpt", cfg)),
                files=lambda folder, s: plot_samples(samples, folder))


def run(cfg: Config) -> dict:
    """Train the LM on each tokenisation of the digits; the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

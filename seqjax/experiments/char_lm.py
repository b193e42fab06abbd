"""Character-level language model on Tiny Shakespeare: the GPT recipe of seqjax train gpt2
with nanoGPT's shakespeare_char data and configs.

``seqjax train char_lm`` is ``seqjax train gpt2`` with this module's defaults and presets: the
same options, model, data path, loop and evaluation; only the defaults differ.

Data: Tiny Shakespeare (``--data_path``: the file or its folder; unset = ``$SEQJAX_DATA_DIR``,
the user cache, a download, ``shared/data``: :func:`seqjax.data.corpora.resolve_corpus`),
tokenised at the start by :func:`seqjax.data.prepare.prepare` into nanoGPT's
``shakespeare_char`` bins — the 65 sorted characters (``--tokenizer char``), the text cut at
``int(0.9 n)``: 1,003,854 / 111,540 characters — in a temporary folder. ``seqjax prepare
--tokenizer char --format nanogpt --split text`` writes the same bins to keep; either folder
is a ``--data_path``. Random ``block_size`` windows per step drawn from ``(seed, step)``
(nanoGPT's ``get_batch``): on the devices inside the jitted step by default (``--input
device``, :class:`~seqjax.data.device.DeviceLMWindows`), or on the host (``--input host``,
:class:`~seqjax.data.shard_windows.ShardWindows`, what the runs in ``results/char_lm.md``
used; the two draw different, equally distributed, windows for one seed).

Models:

* the default: :class:`seqjax.models.gpt.TransformerLM` at nanoGPT's README CPU run (4 layers,
  4 heads, d = 128, block 64, batch 12, 2000 iterations, dropout 0, no biases but
  LayerNorm's; AdamW 1e-3, β₂ = 0.99, weight decay 0.1 on every matrix, 100 warm-up steps,
  cosine to 1e-4, clipping at 1.0), for which nanoGPT reports val loss ≈ 1.88.
  ``--preset gpu`` is nanoGPT's ``train_shakespeare_char`` (6/6/384, block 256, batch 64, 5000
  iterations, dropout 0.2, bf16): val 1.4697 on one A100.
* ``--preset lstm``: :class:`seqjax.models.rnn.RNNLanguageModel`
  (``--model.architecture lstm``), 2 layers of width 224 (≈ 0.83M parameters, the transformer
  has ≈ 0.80M), on the same windows with the same recipe (learning rate 2e-3).

Evaluation: nanoGPT's estimate — the mean over ``eval_batches`` random windows of the
validation split (fixed seed) — every ``eval_every`` steps; at the end the same estimate on
the training split, and the whole validation split in non-overlapping windows
(``--val_tokens 0``; ``val_loss`` in the summary). A sample of ``sample_tokens`` characters
from ``"\\n"`` (temperature 0.8, top-k 200; a transformer keeps its last ``block_size``
characters, nanoGPT's crop).

``--steps_per_call`` (default 10) runs that many steps per jitted call: on XLA:CPU each call
pays a fixed cost (~12 ms of this config's ~30 ms step on the 2-core machine of
``benchmarks/HISTORY.md``, "The loop on the CPU"), which ten steps share. ``--preset gpu`` and
the smoke presets keep 1. ``--model.attention_dropout_rate=0`` keeps a GPU's attention on the
fused cuDNN kernel while ``--model.dropout_rate`` stays on the embeddings and residual branches.

The work dir (default ``workdirs/char_lm``) holds the checkpoints, ``tokenizer.json``,
``metrics.jsonl``, ``samples.txt`` and ``char_lm.json`` (the summary).
:func:`seqjax.experiments._text.load_model` ``(workdir)`` rebuilds ``(model, params, tokenizer,
config)`` from it. ``results/char_lm.md`` is written from finished work dirs by
:func:`seqjax.experiments.reports.char_lm.write_results`.

Run:  seqjax train char_lm                                      (nanoGPT CPU config)
      seqjax train char_lm --preset lstm --workdir workdirs/char_lm_lstm
      seqjax train char_lm --preset gpu --workdir workdirs/char_lm_gpu   (GPU)
      seqjax train char_lm --smoke --workdir /tmp/x                      (seconds, for CI)
      seqjax generate --workdir workdirs/char_lm --prompt "ROMEO:" --max_new_tokens 200
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from seqjax.experiments import _gpt as gpt2
from seqjax.experiments._config import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt
from seqjax.experiments._kit import Task
from seqjax.experiments.reports.char_lm import NANOGPT_CPU_VAL_LOSS, NANOGPT_GPU_VAL_LOSS

evaluate = gpt2.evaluate
generate = gpt2.generate
build_model = gpt2.build_model
optimizer = gpt2.optimizer
load_tokens = gpt2.load_tokens


@dataclass(frozen=True)
class Config(gpt2.Config):
    """The options of ``seqjax train char_lm``: ``seqjax train gpt2``'s
    (:class:`seqjax.experiments.gpt2.Config`), with nanoGPT's README CPU run on Tiny
    Shakespeare's characters as the defaults.

    Attributes:
        data_path: Tiny Shakespeare, the file or its folder (unset: ``$SEQJAX_DATA_DIR``, the
            user cache, a download, ``shared/data``); or another text file; or the shards
            ``seqjax prepare --tokenizer char`` wrote.
        tokenizer: ``char``: the text's sorted characters, no special tokens (nanoGPT's
            ``shakespeare_char``); with shards, the ``tokenizer.json`` beside them.
    """

    RENAMED: ClassVar[dict[str, str]] = {**gpt2.Config.RENAMED,
                                         "sample_chars": "sample_tokens",
                                         "attention_dropout": "model.attention_dropout_rate"}
    NAME: ClassVar[str] = "char_lm"
    CORPUS: ClassVar[str | None] = "tinyshakespeare.txt"

    tokenizer: str = "char"
    vocab_size: PosInt = 65
    block_size: PosInt = 64
    model: gpt2.ModelOptions = gpt2.ModelOptions(
        num_layers=4, num_heads=4, embed_dim=128, use_bias=False, norm_use_bias=True,
        activation="gelu")
    steps: NonNegInt = 2000
    batch_size: PosInt = 12
    learning_rate: PosFloat = 1e-3
    warmup_steps: NonNegInt = 100
    log_every: PosInt = 50
    micro_batch_size: PosInt | None = None
    min_lr_ratio: NonNegFloat = 0.1
    beta2: Fraction = 0.99
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    input: Literal["device", "host"] = "device"
    val_tokens: NonNegInt = 0
    eval_batches: NonNegInt = 20
    sample_tokens: NonNegInt = 500
    sample_prompt: str = "\n"
    sample_temperature: NonNegFloat = 0.8
    sample_top_k: NonNegInt = 200
    checkpoint_every: NonNegInt = 500
    steps_per_call: PosInt = 10
    workdir: str | None = "workdirs/char_lm"


_SMOKE: dict[str, Any] = {"model.num_layers": 1, "model.embed_dim": 16, "block_size": 16,
                          "batch_size": 8, "steps": 4, "warmup_steps": 2, "eval_every": 0,
                          "eval_batches": 2,
                          "sample_tokens": 24, "max_chars": 20000, "log_every": 2,
                          "checkpoint_every": 0, "steps_per_call": 1}
_LSTM: dict[str, Any] = {"model.architecture": "lstm", "model.num_layers": 2,
                         "model.embed_dim": 224, "learning_rate": 2e-3}
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {**_SMOKE, "model.num_heads": 2},
    "gpu": {"model.num_layers": 6, "model.num_heads": 6, "model.embed_dim": 384,
            "block_size": 256, "batch_size": 64, "model.dropout_rate": 0.2, "steps": 5000,
            "eval_batches": 200,
            "compute_dtype": "bfloat16", "log_every": 100, "checkpoint_every": 1000,
            "steps_per_call": 1},
    "lstm": _LSTM,
    "lstm-smoke": {**_LSTM, **_SMOKE},
}


def build(cfg: Config) -> Task:
    """The GPT recipe's run; its summary also gives nanoGPT's validation loss for the config
    (the GPU one for a block of 256 or more); no report beyond it."""
    task = gpt2.build(cfg)
    anchor = NANOGPT_GPU_VAL_LOSS if cfg.block_size >= 256 else NANOGPT_CPU_VAL_LOSS

    def summarize(trained: list) -> dict:
        summary = gpt2.summarize(cfg, trained[0])
        print(f"nanoGPT's val loss for this config: {anchor}")
        return {**summary, "anchor_val_loss": anchor}

    return dataclasses.replace(task, summarize=summarize, report=None)


def run(cfg: Config) -> dict:
    """Train the character LM (resuming from ``cfg.workdir``); the summary."""
    return gpt2.run(cfg, build)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

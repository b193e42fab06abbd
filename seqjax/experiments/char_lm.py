"""Character-level language model on Tiny Shakespeare (nanoGPT's split and configs).

Data: :func:`seqjax.data.corpora.tiny_shakespeare` — the 65 sorted characters, the
contiguous 90/10 split of nanoGPT's ``shakespeare_char`` (1,003,854 / 111,540
characters); random ``block_size`` windows per step (nanoGPT's ``get_batch``, via
:class:`seqjax.data.iterators.LMWindowIterator`).

Models:

* ``model=transformer`` (default): :class:`seqjax.models.gpt.TransformerLM` — the default
  config is nanoGPT's README CPU run (4 layers, 4 heads, d = 128, block 64, batch 12,
  2000 iterations, dropout 0, no biases; AdamW 1e-3, β₂ = 0.99, weight decay 0.1 on
  every matrix, 100 warm-up steps, cosine to 1e-4, clipping at 1.0), for which nanoGPT
  reports val loss ≈ 1.88 (about 3 minutes on a laptop CPU). ``--preset gpu`` is
  nanoGPT's ``train_shakespeare_char`` (6/6/384, block 256, batch 64, 5000 iterations,
  dropout 0.2, bf16): val 1.4697 on one A100.
* ``model=lstm`` (``--preset lstm``): :class:`seqjax.models.rnn.RNNLanguageModel`, a
  2-layer LSTM of width 224 (≈ 0.83M parameters, the transformer has ≈ 0.80M), trained on
  the same windows with the same recipe (learning rate 2e-3).

Validation loss as nanoGPT estimates it — the mean over ``eval_batches`` random
windows of the validation split (fixed seed) — every ``eval_every`` steps, and at the end
over the whole validation split in non-overlapping windows (``full_val``). Samples are
drawn nanoGPT-style (prompt ``"\\n"``, temperature 0.8, top-k 200); a transformer whose
context is full keeps its last ``block_size`` characters (nanoGPT's crop).

Input: by default (``--input=device``) the training ids live on the devices and each
step's windows are drawn inside the jitted step from ``(seed, step)``
(:class:`~seqjax.data.device.DeviceLMWindows`: uploaded and range-checked once; the same
batches on any device count; exact resume). ``--input=host`` draws them on the host
(:class:`~seqjax.data.iterators.LMWindowIterator`, nanoGPT's numpy sampler) — what the
runs in ``results/char_lm.md`` used; the two draw different (equally distributed) windows
for the same seed. ``--steps_per_call=k`` runs ``k`` steps per jitted call
(``FitConfig(steps_per_call=k)``; ``log_every``, ``eval_every`` and ``checkpoint_every``
must be multiples of ``k``). The default is 10: on XLA:CPU each call of the step pays a
fixed cost (~12 ms of the nanoGPT CPU config's ~30 ms step on the 2-core machine of
``benchmarks/HISTORY.md``, "The loop on the CPU"), which ten steps per call share.
``--preset gpu`` and the smoke presets keep 1 (the GPU run measured device-bound; 10 is not
measured on a GPU yet).
``--flat_optimizer`` (default true) keeps AdamW's moments as one vector each
(``OptimizerConfig(flat_optimizer=True)``: 70 state leaves instead of 196 at ``--preset gpu``,
so each jitted call costs the host less); a work dir resumes only with the setting it was
written with.

Attention dropout: ``--attention_dropout_rate`` (default: ``dropout_rate``, as nanoGPT) is
the dropout on the attention weights. On a GPU it keeps attention off the fused cuDNN kernel
(dropout needs the ``[B, H, T, T]`` weights written out); ``--attention_dropout_rate=0``
keeps dropout on the embeddings and residual branches and runs the fused kernel. The
cost, measured on one H200 before the embedding fix: 24.0 vs 20.7–21.3 ms per step
(``benchmarks/HISTORY.md``, "The user path on one GPU"; after it, not yet measured).

The work dir (default ``workdirs/char_lm``) holds the checkpoints (with the model config
and the tokenizer), ``tokenizer.json``, ``metrics.jsonl``, ``loss.png``, ``samples.txt``
and ``char_lm.json`` (the summary). :func:`seqjax.experiments._text.load_model`
``(workdir)`` rebuilds ``(model, params, tokenizer, config)`` from it. The data, the model,
the window decoder and ``load_model`` are the experiments' text kit
(:mod:`seqjax.experiments._text`), shared with ``norm_placement`` and ``sampling``.

``results/char_lm.md`` (the table of both models, the curves, the samples) is written from
finished work dirs by :func:`seqjax.experiments.reports.char_lm.write_results`
``([workdir, ...], results_dir, {workdir: command})``.

Run:  python -m seqjax.experiments.char_lm                      (nanoGPT CPU config)
      python -m seqjax.experiments.char_lm --preset lstm --workdir workdirs/char_lm_lstm
      python -m seqjax.experiments.char_lm --preset gpu --workdir workdirs/char_lm_gpu   (GPU)
      python -m seqjax.experiments.char_lm --smoke --workdir /tmp/x (seconds, for CI)
      seqjax generate --workdir workdirs/char_lm --prompt "ROMEO:" --max_new_tokens 200
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.data.device import DeviceLMWindows
from seqjax.data.iterators import LMWindowIterator
from seqjax.data.shard_windows import ValidationWindows
from seqjax.data.tokenizers import CharTokenizer
from seqjax.decoding import lower_sample
from seqjax.experiments._config import (
    ConfigError,
    Fraction,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
)
from seqjax.experiments._kit import Run, Task, Trained, train
from seqjax.experiments._text import (
    NO_DECAY,
    Model,
    build_model,
    load_data,
    restore,
    sample_ids,
    sampling,
    val_windows,
)
from seqjax.experiments.reports.char_lm import NANOGPT_CPU_VAL_LOSS, NANOGPT_GPU_VAL_LOSS
from seqjax.models.gpt import TransformerLM
from seqjax.train.fit_parts import compile_in_background
from seqjax.train.flops import lm_flops_per_token
from seqjax.train.loop import evaluate as evaluate_batches
from seqjax.train.losses import make_lm_eval, make_lm_loss
from seqjax.train.optim import OptimizerConfig
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import Parallel, ParallelOptions
from seqjax.train.step import flax_apply_fn, make_eval_step
from seqjax.utils import count_params


@dataclass(frozen=True)
class Config(TrainOptions, ParallelOptions):
    """The options of ``seqjax train char_lm`` (defaults: nanoGPT's README CPU run).

    Attributes:
        model: ``transformer`` (a GPT) or ``lstm`` (a stacked-LSTM LM).
        num_layers: transformer blocks or LSTM layers.
        num_heads: attention heads (transformer).
        embed_dim: model width ``d`` (transformer) or LSTM width and embedding size.
        block_size: context length ``T`` of every training window.
        batch_size: windows per step, over all devices (the global batch).
        dropout_rate: on the embeddings and every residual branch (and the LSTM's outputs).
        attention_dropout_rate: on the attention weights; unset = ``dropout_rate``; 0 keeps a
            GPU on the fused cuDNN attention.
        steps: optimiser steps (the cosine schedule ends here).
        learning_rate: peak AdamW learning rate, after the warm-up.
        min_lr_ratio: the schedule's final rate as a fraction of the peak.
        weight_decay: AdamW's decoupled weight decay (every matrix; not vectors).
        beta2: AdamW's second-moment decay (β₁ = 0.9).
        compute_dtype: ``float32`` or ``bfloat16`` (mixed precision; parameters stay float32).
        eval_every: steps between validation estimates (0 = only at the end).
        eval_batches: random validation windows (batches) per estimate, as nanoGPT.
        full_val: also evaluate on the whole validation split at the end.
        sample_tokens: tokens (characters) sampled at the end (prompt: a newline); 0 = no
            sample; gpt2's option of the same name.
        sample_temperature: sampling temperature.
        sample_top_k: sampling keeps the k most likely characters (0: every one).
        max_chars: use only the corpus's first N characters (0 = all; smoke runs).
        data_path: the corpus file or its folder; unset = ``$SEQJAX_DATA_DIR``, the user
            cache, a download, ``shared/data`` (``seqjax.data.corpora``).
        seed: initialisation, dropout and window sampling.
        checkpoint_every: steps between checkpoints (also at every evaluation and the end).
        input: ``device`` (windows drawn on the devices) or ``host`` (numpy sampler).
        steps_per_call: steps per jitted call; the logging, evaluation and checkpoint
            intervals must be multiples of it.
        flat_optimizer: AdamW's moments as one vector each (fewer state leaves).
        progress: show a progress bar.
        workdir: checkpoints, logs, samples and the summary; rerun to resume.
    """

    RENAMED: ClassVar[dict[str, str]] = {"sample_chars": "sample_tokens",
                                         "attention_dropout": "attention_dropout_rate"}

    model: Model = "transformer"
    num_layers: PosInt = 4
    num_heads: PosInt = 4
    embed_dim: PosInt = 128
    block_size: PosInt = 64
    dropout_rate: Fraction = 0.0
    attention_dropout_rate: Fraction | None = None
    steps: NonNegInt = 2000  # TrainOptions' fields, with this recipe's defaults
    batch_size: PosInt = 12
    learning_rate: PosFloat = 1e-3
    log_every: PosInt = 50
    min_lr_ratio: NonNegFloat = 0.1
    weight_decay: NonNegFloat = 0.1
    beta2: Fraction = 0.99
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    eval_every: NonNegInt = 250
    eval_batches: PosInt = 20
    full_val: bool = True
    sample_tokens: NonNegInt = 500
    sample_temperature: NonNegFloat = 0.8
    sample_top_k: NonNegInt = 200
    max_chars: NonNegInt = 0
    data_path: str | None = None
    seed: int = 1337
    checkpoint_every: NonNegInt = 500
    input: Literal["device", "host"] = "device"
    steps_per_call: PosInt = 10
    flat_optimizer: bool = True
    progress: bool = True
    workdir: str | None = "workdirs/char_lm"


PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"num_layers": 1, "num_heads": 2, "embed_dim": 16, "block_size": 16,
              "batch_size": 8, "steps": 4, "warmup_steps": 2, "eval_every": 0,
              "eval_batches": 2, "sample_tokens": 24, "max_chars": 20000, "log_every": 2,
              "checkpoint_every": 0, "steps_per_call": 1},
    "gpu": {"num_layers": 6, "num_heads": 6, "embed_dim": 384, "block_size": 256,
            "batch_size": 64, "dropout_rate": 0.2, "steps": 5000, "eval_batches": 200,
            "compute_dtype": "bfloat16", "log_every": 100, "checkpoint_every": 1000,
            "steps_per_call": 1},
    "lstm": {"model": "lstm", "num_layers": 2, "embed_dim": 224, "learning_rate": 2e-3},
    "lstm-smoke": {"model": "lstm", "num_layers": 1, "embed_dim": 16, "block_size": 16,
                   "batch_size": 8, "steps": 4, "warmup_steps": 2, "eval_every": 0,
                   "eval_batches": 2, "sample_tokens": 24, "max_chars": 20000,
                   "log_every": 2, "checkpoint_every": 0, "steps_per_call": 1},
}


# ----------------------------------------------------------------------------- data


INPUTS = ("device", "host")


def train_windows(ids: np.ndarray, cfg: Config, par: Parallel, vocab: int) -> Any:
    """The training windows: ``input="device"`` keeps the ids on the devices and draws each
    step's windows inside the jitted step (:class:`~seqjax.data.device.DeviceLMWindows`,
    checked once); ``"host"`` draws them on the host (:class:`LMWindowIterator`, this
    process's rows, its ids checked once; what the runs in ``results/char_lm.md`` used)."""
    if cfg.input not in INPUTS:
        raise ConfigError(f"--input must be one of {INPUTS}; got {cfg.input!r}.")
    if cfg.input == "device":
        return DeviceLMWindows(ids, cfg.batch_size, cfg.block_size, seed=cfg.seed,
                               vocab_size=vocab, mesh=par.mesh)
    return LMWindowIterator(ids, par.local_batch_size(cfg.batch_size), cfg.block_size,
                            seed=cfg.seed, vocab_size=vocab, **par.host_rows())


def full_windows(ids: np.ndarray, block: int, batch: int) -> ValidationWindows:
    """Every character of ``ids`` but the first predicted once, in non-overlapping windows
    of ``block`` (the last shorter, ``mask`` False past it), ``batch`` rows a batch
    (:class:`~seqjax.data.shard_windows.ValidationWindows` with ``tail=True``)."""
    return ValidationWindows([ids], batch, block, tail=True)


# ----------------------------------------------------------------------------- model


def model_config(cfg: Config, vocab_size: int) -> dict:
    keys = ("model", "num_layers", "num_heads", "embed_dim", "block_size")
    # "dropout": the checkpoints' name for --dropout_rate (checkpoints of earlier runs resume)
    out = {"vocab_size": vocab_size, **{k: getattr(cfg, k) for k in keys},
           "dropout": cfg.dropout_rate}
    if cfg.attention_dropout_rate is not None:  # absent before the option: old runs match
        out["attention_dropout"] = cfg.attention_dropout_rate  # the checkpoints' name
    return out


def compile_sampler_ahead(model: Any, params: Any, cfg: Config, prompt_ids: list[int]) -> Any:
    """Compile the end-of-run sample's program in a background thread (while training
    runs), for host copies of ``params``' shapes: the sample then starts at once."""
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    decoder, prompt, options = sampling(
        model, cfg.block_size, prompt_ids, max_new_tokens=cfg.sample_tokens,
        temperature=cfg.sample_temperature, top_k=cfg.sample_top_k, seed=cfg.seed)
    return compile_in_background(lambda: lower_sample(decoder, abstract, prompt, **options),
                                 "sample")


# ----------------------------------------------------------------------------- training


def optimizer(cfg: Config) -> OptimizerConfig:
    """nanoGPT's AdamW: warm-up, cosine decay to ``min_lr_ratio``, every matrix decayed."""
    return cfg.optimizer_config("adamw", no_decay=NO_DECAY)


def build(cfg: Config) -> Task:
    """The character LM's one run on Tiny Shakespeare and the figures of its summary."""
    train_ids, val_ids, tok = load_data(cfg)
    model = build_model(cfg, tok.vocab_size)
    x0 = jnp.zeros((1, cfg.block_size), jnp.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(cfg.seed), x0)["params"]
    # MFU in the logs (on devices with a known peak): 6N + 12·L·H·Q·T per token, causal half.
    flops_per_step = None
    if isinstance(model, TransformerLM):
        flops_per_step = (lm_flops_per_token(model.config, params, block_size=cfg.block_size)
                          * cfg.batch_size * cfg.block_size)
    if cfg.sample_tokens and jax.default_backend() != "cpu":  # off the critical path
        compile_sampler_ahead(model, params, cfg, tok.encode("\n"))
    apply_fn = flax_apply_fn(model)

    def evaluate_lm(t: Trained) -> dict:  # nanoGPT's estimates, the full split, a sample
        val, train_est = t.evaluate(), t.evaluate(
            val_windows(train_ids, cfg, cfg.eval_batches, seed=cfg.seed + 3))
        full = {"loss": None, "tokens": None}
        if cfg.full_val:
            full = t.evaluate(full_windows(val_ids, cfg.block_size, cfg.batch_size))
        text = sample_ids(model, t.params, cfg.block_size, tok.encode("\n"), seed=cfg.seed,
                          max_new_tokens=cfg.sample_tokens, temperature=cfg.sample_temperature,
                          top_k=cfg.sample_top_k) if cfg.sample_tokens else []  # 0: none
        return {"val_loss_estimate": val["loss"], "train_loss_estimate": train_est["loss"],
                "val_loss_full": full["loss"], "val_tokens_full": full["tokens"],
                "sample": tok.decode(text)}

    run_ = Run(
        model=model, params=params, loss_fn=make_lm_loss(apply_fn),
        data=lambda par: train_windows(train_ids, cfg, par, tok.vocab_size),
        optimizer=optimizer(cfg),
        fit=cfg.fit_config(print_logs=True, flops_per_step=flops_per_step),
        batch_size=cfg.batch_size, seed=cfg.seed, dropout_seed=cfg.seed + 1,
        eval_fn=make_lm_eval(apply_fn),
        eval_data=val_windows(val_ids, cfg, cfg.eval_batches, seed=cfg.seed + 2),
        compute_dtype=None if cfg.compute_dtype == "float32" else jnp.dtype(cfg.compute_dtype),
        model_config=model_config(cfg, tok.vocab_size), tokenizer=tok, evaluate=evaluate_lm)
    about = (f"{cfg.model}, {count_params(params):,} parameters, {len(train_ids):,} train / "
             f"{len(val_ids):,} val characters, vocabulary {tok.vocab_size}")
    return Task("char_lm", [run_], about=about, summarize=lambda ts: summarize(cfg, ts[0]),
                files=write_sample)


def summarize(cfg: Config, t: Trained) -> dict:
    """The estimates, the sample, the curve and nanoGPT's anchor; printed."""
    s = {**t.results, "curve": [(r["step"], r["loss"], r.get("eval/loss")) for r in t.records],
         "anchor_val_loss": NANOGPT_GPU_VAL_LOSS if cfg.block_size >= 256 else NANOGPT_CPU_VAL_LOSS}
    full = s["val_loss_full"]
    print(f"\nstep {t.steps}: train {s['train_loss_estimate']:.4f}, val "
          f"{s['val_loss_estimate']:.4f}" + (f" (full val {full:.4f})" if full is not None else "")
          + f"; {t.seconds:.0f} s of training; nanoGPT: {s['anchor_val_loss']}")
    print("sample:\n" + s["sample"])
    return s


def write_sample(folder: str, summary: dict) -> None:
    """``samples.txt``: the end-of-run sample."""
    with open(os.path.join(folder, "samples.txt"), "w", encoding="utf-8") as f:
        f.write(summary["sample"])


def run(cfg: Config) -> dict:
    """Train the character LM (resuming from ``cfg.workdir``); the summary."""
    return train(build(cfg), cfg)


# ----------------------------------------------------------------------------- inference


def _restore(cfg: Config) -> tuple[Any, Any, CharTokenizer]:
    if not cfg.workdir:
        raise ValueError("`workdir` is required: the checkpoint to load.")
    model, tok, params = restore(cfg, cfg.workdir)
    return model, params, tok


def evaluate(cfg: Config) -> dict:
    """Validation loss of the checkpoint in ``cfg.workdir`` (``seqjax eval``)."""
    model, params, _ = _restore(cfg)
    _, val_ids, _ = load_data(cfg)
    eval_step = make_eval_step(make_lm_eval(flax_apply_fn(model)))
    est = evaluate_batches(eval_step, params,
                           val_windows(val_ids, cfg, cfg.eval_batches, cfg.seed + 2))
    full = evaluate_batches(eval_step, params,
                            full_windows(val_ids, cfg.block_size, cfg.batch_size))
    return {"val_loss_estimate": est["loss"], "val_loss_full": full["loss"],
            "val_tokens_full": full["tokens"]}


def generate(cfg: Config, prompt: str, *, max_new_tokens: int = 200, temperature: float = 0.8,
             seed: int = 0) -> str:
    """Continue ``prompt`` with the checkpoint in ``cfg.workdir`` (top-k ``sample_top_k``)."""
    model, params, tok = _restore(cfg)
    ids = sample_ids(model, params, cfg.block_size, tok.encode(prompt),
                     max_new_tokens=max_new_tokens, temperature=temperature,
                     top_k=cfg.sample_top_k, seed=seed)
    return prompt + tok.decode(ids)


# ----------------------------------------------------------------------------- results


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

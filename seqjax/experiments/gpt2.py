"""Pretrain a GPT-2 on token shards: from ``seqjax prepare``'s shards (or llm.c's, or
nanoGPT's ``train.bin``/``val.bin``) to a trained model, resumable on any number of hosts.

Data (``--data_path``): a shard folder, a ``manifest.json`` or a nanoGPT ``train.bin``
(:func:`seqjax.data.shards.open_tokens`: memory-mapped, every shard's header and ids checked
once when opened; a manifest whose tokenizer is not the run's is refused). Each step's
global batch is ``batch_size`` random windows of ``block_size + 1`` tokens drawn from
``(seed, step)`` alone over every training shard
(:class:`~seqjax.data.shard_windows.ShardWindows`; ``--align=document`` starts each at a
document); each process reads only its rows, so the step number alone resumes the stream,
on any number of processes.

Model: GPT-2 (:class:`~seqjax.models.gpt.TransformerLM`, learned positions, tied
embeddings, pre-norm blocks with biases and tanh-GELU by default), its residual projections at
``0.02/√(2L)``; the vocabulary padded to ``vocab_size`` (50304 = 50257 rounded up to a
multiple of 128, as nanoGPT and llm.c: the padded rows are never targets).

Presets:

* ``124m`` — GPT-2 124M (12 layers, 12 heads, d = 768, T = 1024) with llm.c's GPT-2
  (124M) schedule on FineWeb 10B: 524,288 tokens per step (512 rows; ``--micro_batch_size``
  rows per device per micro-step sets ``--grad_accum``), 18,865 steps, AdamW lr 6e-4
  (β = 0.9, 0.95; weight decay 0.1 on every matrix), 700 warm-up steps, cosine to 0,
  clipping at 1.0, bfloat16 compute, dropout 0 (as llm.c and nanoGPT pretrain; it also
  keeps attention on the fused cuDNN kernel). llm.c reaches val ≈ 3.27 and HellaSwag
  acc_norm ≈ 29.9% there.
* ``cpu`` — nanoGPT's README CPU shapes and its model's defaults (4 layers, 4 heads,
  d = 128, T = 64, batch 12, dropout 0, no biases, exact GELU; AdamW 1e-3, β₂ = 0.99,
  100 warm-up steps, cosine to 1e-4 over 500 steps) on GPT-2 BPE, a few minutes: what
  ``benchmarks/README.md`` runs side by side with nanoGPT's own ``train.py`` on the Tiny
  Shakespeare bins of its ``data/shakespeare/prepare.py``.
* ``smoke`` — seconds, for CI.
* ``modern`` — the modded-nanogpt optimisation track's model and optimiser at 124M: 12
  layers, d = 768, 6 heads of 128, T = 1024, rotary positions, QK-norm, ReLU², RMSNorm, no
  biases, zero-initialised residual projections, an untied head, logits soft-capped at 30;
  Muon (lr 0.05, momentum 0.95, Nesterov, 5 Newton–Schulz steps) on the hidden matrices,
  AdamW (β = 0.8, 0.95) on the embedding (lr 0.6), the head (0.008) and the vectors (0.04),
  no weight decay; 524,288 tokens per step, 3,250 steps, cosine decay without warm-up (the
  track's tuned Muon entry reaches val 3.28 on FineWeb in 3,250 steps with its own
  schedule; this preset is not measured here).
* ``modern_cpu`` — the same switches and optimiser at the ``cpu`` preset's width, depth,
  context, batch and steps (``benchmarks/README.md`` runs it beside nanoGPT's ``train.py``
  and the ``cpu`` preset, and ablates each switch); ``modern_smoke`` — seconds, for CI.

Every switch of the modern model is an option of its own, so a run can ablate one:
``--positions rope``, ``--qk_norm``, ``--activation relu_squared``, ``--norm_type rmsnorm``,
``--use_bias false``, ``--residual_init_std 0``, ``--tie_embeddings false``,
``--logit_softcap 30``, ``--optimizer muon``.

Evaluation, every ``eval_every`` steps and at the end: the validation loss on the first
``val_tokens`` tokens of the validation shards, in non-overlapping windows (llm.c's fixed
validation tokens); HellaSwag ``acc_norm`` (llm.c's completion scoring) from a local
``hellaswag_val.jsonl`` (``--hellaswag``) and any multiple-choice or cloze task from local
jsonl files (``--tasks arc_easy.jsonl,lambada.jsonl``, :mod:`seqjax.evals`), their items split
over the devices. Every file is read, encoded and checked before the first step. At the end,
a sample with the run's tokenizer, from ``--sample_prompt`` (default: the end-of-text
token). ``seqjax eval`` and ``seqjax generate --prompt ...`` read the work dir.

Run:  seqjax prepare --tokenizer gpt2 --format nanogpt --split text --val_fraction 0.1 \\
          shakespeare.txt --out data/shakespeare
      seqjax train gpt2 --preset cpu --data_path data/shakespeare --workdir workdirs/gpt2_cpu
      seqjax prepare --tokenizer char --format nanogpt --split text shakespeare.txt \\
          --out data/shakespeare_char        # nanoGPT's shakespeare_char, id for id
      seqjax train gpt2 --preset cpu --data_path data/shakespeare_char --vocab_size 65 \\
          --tokenizer seqjax:data/shakespeare_char/tokenizer.json --sample_prompt=$'\\n'
      seqjax train gpt2 --preset 124m --data_path fineweb10B/ --workdir workdirs/gpt2_124m
      seqjax generate --workdir workdirs/gpt2_cpu --prompt "ROMEO:"
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import jax
import jax.numpy as jnp

from seqjax.data.shard_windows import ShardWindows, ValidationWindows
from seqjax.data.shards import ShardError, TokenData, open_tokens
from seqjax.evals import (
    EvalTask,
    TaskBatches,
    TaskFileError,
    load_task,
    make_task_eval,
    task_name,
)
from seqjax.experiments._config import (
    ConfigError,
    Fraction,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
)
from seqjax.experiments._kit import Run, Task, Trained, train
from seqjax.experiments._text import NO_DECAY, sample_ids
from seqjax.experiments.reports.gpt2 import report
from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.train.checkpoint import restore_params
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
    """The options of ``seqjax train gpt2`` (defaults: GPT-2 124M with llm.c's schedule).

    Attributes:
        data_path: the token shards: a folder (``manifest.json``, llm.c's ``*_train_*.bin`` /
            ``*_val_*.bin``, or nanoGPT's ``train.bin`` / ``val.bin``), a manifest, or a
            ``train.bin``.
        tokenizer: the shards' tokenizer (``gpt2``, ``hf:PATH/tokenizer.json``,
            ``seqjax:PATH``): checked against the manifest, used to sample and for HellaSwag.
        rank_file: GPT-2's rank file (``gpt2.tiktoken``); unset = the one the
            ``openai-whisper`` package ships, else tiktoken's own cache (or its download).
        vocab_size: the model's vocabulary (≥ the tokenizer's; padded for speed).
        num_layers, num_heads, embed_dim: ``L``, ``H``, ``D``.
        block_size: context length ``T`` of every window.
        use_bias: biases in the projections, the FFN and the LayerNorms (GPT-2, llm.c);
            ``False``: none (nanoGPT's ``bias=False``).
        activation: the FFN's activation: ``gelu_tanh`` (GPT-2's approximation), ``gelu``
            (exact, nanoGPT's ``nn.GELU()``) or ``relu_squared`` (``relu(x)²``,
            modded-nanogpt).
        positions: ``learned`` absolute positions (GPT-2) or ``rope`` (rotary, no table).
        qk_norm: normalise each head's queries and keys (RMSNorm) before the scores.
        norm_type: ``layernorm`` (GPT-2) or ``rmsnorm`` (no bias).
        residual_init_std: ``σ`` of the two residual projections of each block (attention
            ``out``, the FFN's ``down``); unset = ``0.02/√(2L)`` (GPT-2), 0 = zeros.
        tie_embeddings: the head is the token embedding's transpose (GPT-2); ``False``: a
            head of its own.
        logit_softcap: ``c · tanh(z / c)`` on the logits; 0 = off.
        optimizer: ``adamw`` (every parameter) or ``muon`` (the hidden matrices; AdamW at
            ``learning_rate`` for the embeddings, the head and the vectors,
            :class:`~seqjax.train.optim.OptimizerConfig`).
        muon_learning_rate, momentum, ns_steps: Muon's peak rate, momentum (Nesterov) and
            Newton–Schulz steps (``--optimizer muon``; adamw does not read them).
        embed_learning_rate, head_learning_rate, scalar_learning_rate: Muon's AdamW rates
            for the embeddings, the head and the vectors (norm scales, biases); unset =
            ``learning_rate`` (``--optimizer muon``; adamw does not read them).
        batch_size: rows per step over all devices (``batch_size · T`` tokens per step).
        micro_batch_size: rows per device per micro-step: sets ``--grad_accum`` to
            ``batch_size / (micro_batch_size · data devices)``; unset (``none``) =
            ``--grad_accum``; giving both is an error.
        dropout_rate: on the embeddings, residual branches and attention weights.
        steps: optimiser steps (the cosine schedule ends here).
        learning_rate: peak AdamW learning rate, after the warm-up.
        min_lr_ratio: the schedule's final rate as a fraction of the peak (every group).
        weight_decay: decoupled weight decay of every matrix (not vectors, nor, under Muon,
            the embeddings).
        beta1, beta2: AdamW's moment decays.
        compute_dtype: ``float32`` or ``bfloat16`` (parameters stay float32).
        align: ``random`` windows, or ``document`` (each starts at an end-of-text token).
        val_tokens: validation tokens evaluated (from the start of the validation split).
        eval_batch_size: rows per evaluation batch; unset = ``batch_size / grad_accum``.
        eval_every: steps between evaluations (0 = only at the end).
        hellaswag: a local ``hellaswag_val.jsonl``, scored with the validation loss (unset:
            none).
        tasks: local jsonl files of multiple-choice or cloze tasks, comma-separated (the forms
            of :mod:`seqjax.evals`; each named after its file), scored with the validation
            loss.
        task_items: items scored of HellaSwag and of each task (0 = all).
        sample_tokens: tokens sampled at the end (0 = none).
        sample_prompt: the text the sample continues; empty = the end-of-text token (a
            tokenizer without one, such as ``seqjax prepare --tokenizer char``'s, needs a
            prompt: nanoGPT's character runs start from ``"\n"``).
        sample_temperature, sample_top_k: the sample's temperature and top-k (0: every token).
        seed: initialisation and the windows of every step.
        checkpoint_every: steps between checkpoints (also at the end).
        steps_per_call: steps per jitted call.
        prefetch: batches read and placed ahead by a background thread; unset = ``fit``'s
            default (0 on the CPU, 2 on accelerators).
        flat_optimizer: AdamW's moments as one vector each.
        progress: show a progress bar.
        workdir: checkpoints, logs, the sample and the summary; rerun to resume.
    """

    data_path: str | None = None
    tokenizer: str = "gpt2"
    rank_file: str | None = None
    vocab_size: PosInt = 50304
    num_layers: PosInt = 12
    num_heads: PosInt = 12
    embed_dim: PosInt = 768
    block_size: PosInt = 1024
    use_bias: bool = True
    activation: Literal["gelu_tanh", "gelu", "relu_squared"] = "gelu_tanh"
    positions: Literal["learned", "rope"] = "learned"
    qk_norm: bool = False
    norm_type: Literal["layernorm", "rmsnorm"] = "layernorm"
    residual_init_std: NonNegFloat | None = None
    tie_embeddings: bool = True
    logit_softcap: NonNegFloat = 0.0
    optimizer: Literal["adamw", "muon"] = "adamw"
    muon_learning_rate: PosFloat = 0.02
    momentum: Fraction = 0.95
    ns_steps: PosInt = 5
    embed_learning_rate: PosFloat | None = None
    head_learning_rate: PosFloat | None = None
    scalar_learning_rate: PosFloat | None = None
    steps: NonNegInt = 18865  # TrainOptions' fields, with this recipe's defaults
    batch_size: PosInt = 512
    learning_rate: PosFloat = 6e-4
    warmup_steps: NonNegInt = 700
    log_every: PosInt = 10
    micro_batch_size: PosInt | None = 16
    dropout_rate: Fraction = 0.0
    min_lr_ratio: NonNegFloat = 0.0
    weight_decay: NonNegFloat = 0.1
    beta1: Fraction = 0.9
    beta2: Fraction = 0.95
    compute_dtype: Literal["float32", "bfloat16"] = "bfloat16"
    align: Literal["random", "document"] = "random"
    val_tokens: PosInt = 10_485_760
    eval_batch_size: PosInt | None = None
    eval_every: NonNegInt = 250
    hellaswag: str | None = None
    tasks: str | None = None
    task_items: NonNegInt = 0
    sample_tokens: NonNegInt = 64
    sample_prompt: str = ""
    sample_temperature: NonNegFloat = 1.0
    sample_top_k: NonNegInt = 50
    seed: int = 1337
    checkpoint_every: NonNegInt = 1000
    steps_per_call: PosInt = 1
    prefetch: NonNegInt | None = None
    flat_optimizer: bool = True
    progress: bool = True
    workdir: str | None = "workdirs/gpt2"

    RENAMED: ClassVar[dict[str, str]] = {"hellaswag_items": "task_items", "data": "data_path"}


_CPU: dict[str, Any] = {
    "num_layers": 4, "num_heads": 4, "embed_dim": 128, "block_size": 64, "batch_size": 12,
    "use_bias": False, "activation": "gelu",
    "micro_batch_size": None, "learning_rate": 1e-3, "min_lr_ratio": 0.1, "warmup_steps": 100,
    "beta2": 0.99, "compute_dtype": "float32", "steps": 500, "eval_every": 0,
    "val_tokens": 1_000_000, "log_every": 50, "checkpoint_every": 0, "steps_per_call": 10,
    "sample_tokens": 64,
}
_SMOKE: dict[str, Any] = {
    "num_layers": 1, "num_heads": 2, "embed_dim": 16, "block_size": 16, "batch_size": 8,
    "steps": 4, "warmup_steps": 2, "val_tokens": 256, "log_every": 2, "steps_per_call": 1,
    "sample_tokens": 8, "task_items": 4, "progress": False}
#: The modern GPT's switches and optimiser (the ``modern*`` presets).
MODERN: dict[str, Any] = {
    "positions": "rope", "qk_norm": True, "activation": "relu_squared",
    "norm_type": "rmsnorm", "use_bias": False, "residual_init_std": 0.0,
    "tie_embeddings": False, "logit_softcap": 30.0, "optimizer": "muon",
    "muon_learning_rate": 0.05, "momentum": 0.95, "ns_steps": 5, "learning_rate": 0.04,
    "embed_learning_rate": 0.6, "head_learning_rate": 0.008, "beta1": 0.8, "beta2": 0.95,
    "weight_decay": 0.0}
_MODERN_CPU: dict[str, Any] = {**_CPU, **MODERN}
PRESETS: dict[str, dict[str, Any]] = {
    "124m": {},
    "cpu": _CPU,
    "smoke": {**_CPU, **_SMOKE},
    "modern": {**MODERN, "num_heads": 6, "steps": 3250, "warmup_steps": 0,
               "min_lr_ratio": 0.0},
    "modern_cpu": _MODERN_CPU,
    "modern_smoke": {**_MODERN_CPU, **_SMOKE},
}


# ----------------------------------------------------------------------------- data


def load_tokens(cfg: Config) -> TokenData:
    """The shards of ``cfg.data_path``, opened and checked against the model's vocabulary."""
    if not cfg.data_path:
        raise ConfigError("--data_path is required: a shard folder, a manifest.json or a nanoGPT "
                          "train.bin (make one with `seqjax prepare`).")
    tokens = open_tokens(cfg.data_path, vocab_size=cfg.vocab_size)
    for split in ("train", "val"):
        longest = max(len(s) for s in getattr(tokens, split))
        if longest <= cfg.block_size:
            raise ShardError(
                f"{cfg.data_path}: the {split} split is too short for one window of block_size + 1 "
                f"= {cfg.block_size + 1} tokens (its longest shard holds {longest}).")
    return tokens


def text_tokenizer(cfg: Config) -> Any:
    """The run's tokenizer (:func:`seqjax.data.text_tokenizers.load_text_tokenizer`)."""
    from seqjax.data.text_tokenizers import load_text_tokenizer

    try:
        tok = load_text_tokenizer(cfg.tokenizer, rank_file=cfg.rank_file)
    except (ValueError, ImportError) as err:
        option = "--rank_file" if cfg.rank_file else "--tokenizer"
        raise ConfigError(f"{option}: {err}") from None
    if tok.vocab_size > cfg.vocab_size:
        raise ConfigError(f"--vocab_size ({cfg.vocab_size}) must be at least the tokenizer's "
                          f"{tok.vocab_size}.")
    return tok


def sample_prompt(cfg: Config, tok: Any, prompt: str | None = None) -> list[int]:
    """The ids a sample continues: ``prompt`` (default ``--sample_prompt``) encoded, else the
    end-of-text token; a :class:`ConfigError` before training when there is neither."""
    prompt = cfg.sample_prompt if prompt is None else prompt
    ids = tok.encode_ordinary(prompt) if prompt else []
    if not ids and tok.eot is None:
        raise ConfigError(f"--sample_prompt: the tokenizer {cfg.tokenizer!r} has no "
                          "end-of-text token to start a sample from: give a prompt "
                          "(--sample_prompt TEXT) or --sample_tokens 0.")
    return ids or [tok.eot]


def grad_accum(cfg: Config, devices: int) -> int:
    """Micro-batches per step: ``batch_size / (micro_batch_size · devices)``, or
    ``--grad_accum`` without a micro-batch size. The two options set one number: both given is
    a :class:`ConfigError` (before, ``--grad_accum`` was silently overridden)."""
    if cfg.micro_batch_size is None:
        return cfg.grad_accum
    if cfg.grad_accum != 1:
        raise ConfigError(f"--grad_accum ({cfg.grad_accum}) and --micro_batch_size "
                          f"({cfg.micro_batch_size}) set the same number, the micro-batches "
                          "per step: give one (--micro_batch_size=none to use --grad_accum).")
    per_step = cfg.micro_batch_size * devices
    if cfg.batch_size <= per_step:
        return 1
    if cfg.batch_size % per_step:
        raise ConfigError(f"--batch_size ({cfg.batch_size}) must be a multiple of "
                          f"--micro_batch_size x data devices = {cfg.micro_batch_size} x "
                          f"{devices}.")
    return cfg.batch_size // per_step


# ----------------------------------------------------------------------------- model


def build_model(cfg: Config) -> TransformerLM:
    """GPT-2 at ``cfg``'s shapes and switches (default: learned positions, tied embeddings,
    LayerNorm, biases, tanh-GELU)."""
    dtype = None if cfg.compute_dtype == "float32" else jnp.dtype(cfg.compute_dtype)
    block = gpt_block(cfg.num_heads, dropout_rate=cfg.dropout_rate, use_bias=cfg.use_bias,
                      norm_use_bias=cfg.use_bias, activation=cfg.activation,
                      use_rope=cfg.positions == "rope", qk_norm=cfg.qk_norm,
                      norm_type=cfg.norm_type, residual_init_std=cfg.residual_init_std)
    return TransformerLM(TransformerLMConfig(
        vocab_size=cfg.vocab_size, num_layers=cfg.num_layers, embed_dim=cfg.embed_dim,
        block_size=cfg.block_size, block=block, positions=cfg.positions,
        tie_embeddings=cfg.tie_embeddings, logit_softcap=cfg.logit_softcap), dtype=dtype)


#: The model switches, at GPT-2's values: recorded with the checkpoints only where they differ,
#: so a work dir written before they existed still resumes.
_SWITCHES = {"positions": "learned", "qk_norm": False, "norm_type": "layernorm",
             "residual_init_std": None, "tie_embeddings": True, "logit_softcap": 0.0}


def model_config(cfg: Config) -> dict:
    """What the checkpoints record of the model (a restore with another one is refused)."""
    keys = ("vocab_size", "num_layers", "num_heads", "embed_dim", "block_size", "use_bias",
            "activation", "tokenizer")
    out = {k: getattr(cfg, k) for k in keys}
    out.update({k: getattr(cfg, k) for k, off in _SWITCHES.items() if getattr(cfg, k) != off})
    return out


def optimizer(cfg: Config) -> OptimizerConfig:
    """llm.c's AdamW (every matrix decayed), or Muon on the hidden matrices with AdamW on the
    rest; linear warm-up, cosine decay to ``min_lr_ratio``."""
    if cfg.optimizer == "adamw":
        return cfg.optimizer_config("adamw", no_decay=NO_DECAY)
    rates = (("embed", cfg.embed_learning_rate), ("head", cfg.head_learning_rate),
             ("scalar", cfg.scalar_learning_rate))
    return cfg.optimizer_config(
        "muon", learning_rate=cfg.muon_learning_rate, nesterov=True, group_learning_rates=tuple(
            (g, cfg.learning_rate if r is None else r) for g, r in rates))


def task_files(cfg: Config) -> list[tuple[str, str, str]]:
    """``(option, name, path)`` of ``cfg``'s downstream tasks, HellaSwag first; each named
    after its file (:func:`seqjax.evals.task_name`)."""
    files = [("--hellaswag", "hellaswag", cfg.hellaswag)] if cfg.hellaswag else []
    files += [("--tasks", task_name(p.strip()), p.strip()) for p in (cfg.tasks or "").split(",")
              if p.strip()]
    names = [name for _, name, _ in files]
    if len(set(names)) < len(names):
        raise ConfigError(f"--hellaswag and --tasks name two tasks alike ({names}): each "
                          "task is named after its file.")
    return files


def eval_tasks(cfg: Config) -> list[EvalTask]:
    """The downstream tasks of ``--hellaswag`` and ``--tasks``, read and checked (a bad file
    is a :class:`ConfigError` naming the option, the file and the line)."""
    tasks = []
    for option, name, path in task_files(cfg):
        try:
            tasks.append(load_task(path, limit=cfg.task_items, name=name))
        except TaskFileError as err:
            raise ConfigError(f"{option}: {err}") from None
    return tasks


def task_batches(cfg: Config, tasks: list[EvalTask], tok: Any) -> dict[str, TaskBatches]:
    """Each task's items encoded and checked against the model (one item per batch: see
    :func:`regroup`); an item that does not fit is a :class:`ConfigError`."""
    out = {}
    for (option, _, _), task in zip(task_files(cfg), tasks, strict=True):
        try:
            out[task.name] = TaskBatches(task, tok.encode_ordinary, items_per_batch=1,
                                         block_size=cfg.block_size,
                                         vocab_size=cfg.vocab_size)
        except ValueError as err:
            raise ConfigError(f"{option}: {err}") from None
    return out


def regroup(batches: TaskBatches, rows: int, shards: int = 1) -> TaskBatches:
    """``batches`` in batches of about ``rows`` rows: ``rows / choices`` items, rounded up to
    a multiple of the ``shards`` the items are split over."""
    items = max(1, rows // batches.choices)
    return batches.regrouped(-(-items // shards) * shards)


def task_results(metrics: dict, tasks: list[EvalTask]) -> dict:
    """``<task>_acc``, ``<task>_acc_norm``, ``<task>_items`` from ``<task>/acc``, ... (an
    evaluation's metrics)."""
    out: dict[str, Any] = {}
    for task in tasks:
        for key in ("acc", "acc_norm"):
            if f"{task.name}/{key}" in metrics:
                out[f"{task.name}_{key}"] = metrics[f"{task.name}/{key}"]
        if f"{task.name}/tokens" in metrics:
            out[f"{task.name}_items"] = int(metrics[f"{task.name}/tokens"])
    return out


def build(cfg: Config) -> Task:
    """The one pretraining run and its summary."""
    tokens = load_tokens(cfg)
    tasks = eval_tasks(cfg)
    tok = None
    if cfg.sample_tokens or tasks or cfg.align == "document" or tokens.tokenizer is not None:
        tok = text_tokenizer(cfg)
        tokens.check_tokenizer(tok.describe())
    model = build_model(cfg)
    x0 = jnp.zeros((1, cfg.block_size), jnp.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(cfg.seed), x0)["params"]
    flops_per_step = (lm_flops_per_token(model.config, params, block_size=cfg.block_size)
                      * cfg.batch_size * cfg.block_size)
    apply_fn = flax_apply_fn(model)
    eot = None if tok is None else tok.eot
    prompt = sample_prompt(cfg, tok) if cfg.sample_tokens else []
    if cfg.align == "document" and eot is None:
        raise ConfigError(f"--align=document starts each window at an end-of-text token; the "
                          f"tokenizer {cfg.tokenizer!r} has none: use --align=random.")

    def windows(par: Parallel) -> ShardWindows:
        return ShardWindows(tokens.train, par.local_batch_size(cfg.batch_size), cfg.block_size,
                            seed=cfg.seed, align=cfg.align, eot=eot, source=cfg.data_path,
                            **par.host_rows())

    encoded = task_batches(cfg, tasks, tok)  # every item checked before training

    def val_batches(par: Parallel) -> ValidationWindows:
        rows = cfg.eval_batch_size or cfg.batch_size // max(par.grad_accum, 1)
        par.check_batch_size(rows, "eval_batch_size")
        return ValidationWindows(tokens.val, rows, cfg.block_size, cfg.val_tokens)

    def evals(task: EvalTask) -> tuple[Any, Any]:
        def data(par: Parallel) -> TaskBatches:
            rows = cfg.eval_batch_size or cfg.batch_size // max(par.grad_accum, 1)
            return regroup(encoded[task.name], rows, par.batch_shards)

        return make_task_eval(apply_fn, task.kind), data

    def evaluate_run(t: Trained) -> dict:
        out: dict[str, Any] = {"val_loss": t.eval.get("eval/loss"),
                               "val_tokens": t.eval.get("eval/tokens"),
                               **task_results(t.eval, tasks)}
        if cfg.sample_tokens and tok is not None:
            ids = sample_ids(model, t.params, cfg.block_size, prompt,
                             max_new_tokens=cfg.sample_tokens,
                             temperature=cfg.sample_temperature, top_k=cfg.sample_top_k,
                             seed=cfg.seed)
            out["sample"] = cfg.sample_prompt + tok.decode(ids)
        return out

    run_ = Run(
        model=model, params=params, loss_fn=make_lm_loss(apply_fn), data=windows,
        optimizer=optimizer(cfg),
        fit=cfg.fit_config(print_logs=True, flops_per_step=flops_per_step),
        batch_size=cfg.batch_size, seed=cfg.seed, dropout_seed=cfg.seed + 1,
        eval_fn=make_lm_eval(apply_fn), eval_data=val_batches,
        evals={task.name: evals(task) for task in tasks},
        compute_dtype=None if cfg.compute_dtype == "float32" else jnp.dtype(cfg.compute_dtype),
        model_config=model_config(cfg), evaluate=evaluate_run)
    about = (f"GPT-2 {cfg.num_layers}L/{cfg.num_heads}H/{cfg.embed_dim}, "
             f"{count_params(params):,} parameters, {tokens.num_tokens('train'):,} train / "
             f"{tokens.num_tokens('val'):,} val tokens ({tokens.format}), "
             f"{cfg.batch_size * cfg.block_size:,} tokens per step")
    names = [name for _, name, _ in task_files(cfg)]
    return Task("gpt2", [run_], about=about, summarize=lambda ts: summarize(cfg, ts[0]),
                report=lambda s: report(cfg, s, names), files=write_sample)


def summarize(cfg: Config, t: Trained) -> dict:
    """The final metrics, tokens per second, the curve; printed."""
    s: dict[str, Any] = {**t.results,
                         "curve": [(r["step"], r["loss"], r.get("eval/loss")) for r in t.records]}
    tokens = t.steps * cfg.batch_size * cfg.block_size
    s["tokens_trained"] = tokens
    s["tokens_per_s"] = tokens / t.seconds if t.seconds else None
    line = f"\nstep {t.steps}: val loss {s['val_loss']:.4f}" if s.get("val_loss") else ""
    for _, task, _ in task_files(cfg):
        key = f"{task}_acc_norm" if f"{task}_acc_norm" in s else f"{task}_acc"
        if key in s:
            line += f", {task} {key[len(task) + 1:]} {s[key]:.4f}"
    print(line + f"; {t.seconds:.0f} s of training")
    if s.get("sample"):
        print("sample:\n" + s["sample"])
    return s


def write_sample(folder: str, summary: dict) -> None:
    """``samples.txt``: the end-of-run sample."""
    if summary.get("sample"):
        with open(os.path.join(folder, "samples.txt"), "w", encoding="utf-8") as f:
            f.write(summary["sample"])


def run(cfg: Config) -> dict:
    """Pretrain (resuming from ``cfg.workdir``); the summary. ``--micro_batch_size`` sets
    the gradient accumulation from the devices there are."""
    par = Parallel.from_options(cfg)
    accum = grad_accum(cfg, par.mesh.shape["data"] * par.mesh.shape["fsdp"])
    if accum != par.grad_accum:
        cfg = dataclasses.replace(cfg, grad_accum=accum)
        par = Parallel.from_options(cfg)
    return train(build(cfg), cfg, par)


# ----------------------------------------------------------------------------- inference


def _restore(cfg: Config) -> tuple[TransformerLM, Any]:
    if not cfg.workdir:
        raise ValueError("`workdir` is required: the checkpoint to load.")
    return build_model(cfg), restore_params(os.path.join(cfg.workdir, "checkpoints"))


def evaluate(cfg: Config) -> dict:
    """Validation loss (and the tasks of ``--hellaswag`` and ``--tasks``) of the checkpoint in
    ``cfg.workdir`` (``seqjax eval``)."""
    model, params = _restore(cfg)
    tokens = load_tokens(cfg)
    eval_step = make_eval_step(make_lm_eval(flax_apply_fn(model)))
    # one device here: one micro-batch of rows at a time, as in training
    rows = cfg.eval_batch_size or cfg.micro_batch_size or max(cfg.batch_size // cfg.grad_accum, 1)
    tasks = eval_tasks(cfg)
    encoded = task_batches(cfg, tasks, text_tokenizer(cfg)) if tasks else {}
    val = evaluate_batches(eval_step, params, ValidationWindows(
        tokens.val, rows, cfg.block_size, cfg.val_tokens))
    metrics = {}
    for task in tasks:
        task_step = make_eval_step(make_task_eval(flax_apply_fn(model), task.kind))
        metrics.update({f"{task.name}/{k}": v for k, v in evaluate_batches(
            task_step, params, regroup(encoded[task.name], rows)).items()})
    return {"val_loss": val["loss"], "val_tokens": val["tokens"],
            **task_results(metrics, tasks)}


def generate(cfg: Config, prompt: str, *, max_new_tokens: int = 200, temperature: float = 0.8,
             seed: int = 0) -> str:
    """Continue ``prompt`` with the checkpoint in ``cfg.workdir`` (top-k ``sample_top_k``);
    an empty prompt starts from the end-of-text token."""
    model, params = _restore(cfg)
    tok = text_tokenizer(cfg)
    ids = sample_ids(model, params, cfg.block_size, sample_prompt(cfg, tok, prompt),
                     max_new_tokens=max_new_tokens, temperature=temperature,
                     top_k=cfg.sample_top_k, seed=seed)
    return prompt + tok.decode(ids)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

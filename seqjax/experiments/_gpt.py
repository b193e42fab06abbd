"""The GPT LM recipe that ``gpt2`` and ``char_lm`` are presets of: its options
(:class:`Config`), data (token shards, or a text tokenised at the start), model (GPT-2 with
the modern switches, or a stacked LSTM), optimiser (AdamW or Muon), evaluation (the validation
loss, nanoGPT's estimate, HellaSwag and other tasks) and sample. :mod:`seqjax.experiments.gpt2`
describes it and its presets; :mod:`seqjax.experiments.char_lm` gives it nanoGPT's
``shakespeare_char`` defaults.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.data.corpora import resolve_corpus
from seqjax.data.device import DeviceLMWindows
from seqjax.data.shard_windows import ShardWindows, ValidationWindows
from seqjax.data.shards import ShardError, TokenData, open_tokens
from seqjax.data.tokenizers import CharTokenizer, SpecialTokens, load_tokenizer
from seqjax.decoding import lower_sample
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
    moved_into,
)
from seqjax.experiments._kit import Run, Task, Trained, train
from seqjax.experiments._text import (
    NO_DECAY,
    estimate_windows,
    prepared_text,
    sample_ids,
    sampling,
)
from seqjax.experiments.reports.gpt2 import model_shape, report
from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.models.rnn import RNNLanguageModel, RNNLMConfig
from seqjax.train.checkpoint import restore_params
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
class TransformerOptions:
    """A GPT's network as a recipe's group of options, ``--model.KEY=VALUE`` (defaults: GPT-2
    124M), handed whole to :meth:`build`, which makes the library's config of it
    (:class:`~seqjax.models.gpt.TransformerLMConfig` with its
    :func:`~seqjax.models.gpt.gpt_block`). The vocabulary and the context length are the
    run's (``--vocab_size``, ``--block_size``: the data's too). The GPT LM recipe's
    :class:`ModelOptions` and the image recipes (``image_gpt``, ``text_to_image``) nest it.

    Attributes:
        num_layers: ``L``, transformer blocks.
        num_heads: ``H``, attention heads per block.
        embed_dim: ``D``, the width (a multiple of ``H``).
        use_bias: biases in the projections, the FFN and the LayerNorms (GPT-2, llm.c);
            ``False``: none (nanoGPT's ``bias=False``).
        norm_use_bias: LayerNorm's ``β``; unset = ``use_bias``.
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
        dropout_rate: on the embeddings, the residual branches and (unless
            ``attention_dropout_rate``) the attention weights.
        attention_dropout_rate: on the attention weights; unset = ``dropout_rate``; 0 keeps
            a GPU on the fused cuDNN attention.
    """

    num_layers: PosInt = 12
    num_heads: PosInt = 12
    embed_dim: PosInt = 768
    use_bias: bool = True
    norm_use_bias: bool | None = None
    activation: Literal["gelu_tanh", "gelu", "relu_squared"] = "gelu_tanh"
    positions: Literal["learned", "rope"] = "learned"
    qk_norm: bool = False
    norm_type: Literal["layernorm", "rmsnorm"] = "layernorm"
    residual_init_std: NonNegFloat | None = None
    tie_embeddings: bool = True
    logit_softcap: NonNegFloat = 0.0
    dropout_rate: Fraction = 0.0
    attention_dropout_rate: Fraction | None = None

    def build(self, vocab_size: int, block_size: int, dtype: Any = None) -> TransformerLM:
        """The :class:`~seqjax.models.gpt.TransformerLM` of these options for a vocabulary of
        ``vocab_size`` and windows of ``block_size`` tokens, computing in ``dtype``."""
        norm_bias = self.use_bias if self.norm_use_bias is None else self.norm_use_bias
        block = gpt_block(self.num_heads, dropout_rate=self.dropout_rate,
                          attention_dropout_rate=self.attention_dropout_rate,
                          use_bias=self.use_bias, norm_use_bias=norm_bias,
                          activation=self.activation, use_rope=self.positions == "rope",
                          qk_norm=self.qk_norm, norm_type=self.norm_type,
                          residual_init_std=self.residual_init_std)
        return TransformerLM(TransformerLMConfig(
            vocab_size=vocab_size, num_layers=self.num_layers, embed_dim=self.embed_dim,
            block_size=block_size, block=block, positions=self.positions,
            tie_embeddings=self.tie_embeddings, logit_softcap=self.logit_softcap), dtype=dtype)


@dataclass(frozen=True)
class ModelOptions(TransformerOptions):
    """The GPT LM recipe's network, ``--model.KEY``: a :class:`TransformerOptions`, or with
    ``--model.architecture lstm`` a stacked LSTM (:func:`build_model`).

    Attributes:
        architecture: ``transformer`` (GPT-2) or ``lstm`` (a stacked-LSTM LM of
            ``num_layers`` layers of width ``embed_dim``, dropout ``dropout_rate``; the
            transformer's switches do not apply).
    """

    architecture: Literal["transformer", "lstm"] = "transformer"

    RENAMED: ClassVar[dict[str, str]] = {"model": "architecture"}  # --model.model=lstm


@dataclass(frozen=True)
class Config(TrainOptions, ParallelOptions):
    """The options of ``seqjax train gpt2`` (defaults: GPT-2 124M with llm.c's schedule).

    Attributes:
        data_path: the token shards: a folder (``manifest.json``, llm.c's ``*_train_*.bin`` /
            ``*_val_*.bin``, or nanoGPT's ``train.bin`` / ``val.bin``), a manifest, or a
            ``train.bin``; or a text file, tokenised at the start into nanoGPT's layout (the
            text cut at ``int(0.9 n)``, ``seqjax prepare --split text``) in a temporary
            folder.
        tokenizer: the shards' tokenizer (``gpt2``, ``hf:PATH/tokenizer.json``,
            ``seqjax:PATH``): checked against the manifest, used to sample and for HellaSwag;
            ``char``: a text's sorted characters (``seqjax prepare --tokenizer char``; with
            shards, the ``tokenizer.json`` beside them).
        rank_file: GPT-2's rank file (``gpt2.tiktoken``); unset = the one the
            ``openai-whisper`` package ships, else tiktoken's own cache (or its download).
        vocab_size: the model's vocabulary (≥ the tokenizer's; padded for speed).
        block_size: context length ``T`` of every window (and the learned positions' table).
        model: the network, a group of options (:class:`ModelOptions`: ``--model.num_layers``,
            ``--model.positions``, …).
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
        steps: optimiser steps (the cosine schedule ends here).
        learning_rate: peak AdamW learning rate, after the warm-up.
        min_lr_ratio: the schedule's final rate as a fraction of the peak (every group).
        weight_decay: decoupled weight decay of every matrix (not vectors, nor, under Muon,
            the embeddings).
        beta1, beta2: AdamW's moment decays.
        compute_dtype: ``float32`` or ``bfloat16`` (parameters stay float32).
        align: ``random`` windows, or ``document`` (each starts at an end-of-text token).
        input: ``host`` (each step's windows drawn and read on the host,
            :class:`~seqjax.data.shard_windows.ShardWindows`) or ``device`` (the training
            shard held on the devices and the windows drawn inside the jitted step,
            :class:`~seqjax.data.device.DeviceLMWindows`; one training shard; other windows
            for the same seed).
        val_tokens: validation tokens evaluated (from the start of the validation split, in
            whole windows); 0 = every token of the split, once (its last window shorter).
        eval_batches: 0 = the validation loss of ``val_tokens`` during training; N = nanoGPT's
            estimate instead, the mean over N random batches of windows (a fixed draw), and
            at the end the same estimate on the training split beside the ``val_tokens`` loss.
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
        max_chars: a text ``--data_path``'s first N characters only (0 = all; smoke runs).
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
    block_size: PosInt = 1024
    model: ModelOptions = ModelOptions()
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
    min_lr_ratio: NonNegFloat = 0.0
    weight_decay: NonNegFloat = 0.1
    beta1: Fraction = 0.9
    beta2: Fraction = 0.95
    compute_dtype: Literal["float32", "bfloat16"] = "bfloat16"
    align: Literal["random", "document"] = "random"
    input: Literal["device", "host"] = "host"
    val_tokens: NonNegInt = 10_485_760
    eval_batches: NonNegInt = 0
    eval_batch_size: PosInt | None = None
    eval_every: NonNegInt = 250
    hellaswag: str | None = None
    tasks: str | None = None
    task_items: NonNegInt = 0
    sample_tokens: NonNegInt = 64
    sample_prompt: str = ""
    sample_temperature: NonNegFloat = 1.0
    sample_top_k: NonNegInt = 50
    max_chars: NonNegInt = 0
    seed: int = 1337
    checkpoint_every: NonNegInt = 1000
    steps_per_call: PosInt = 1
    prefetch: NonNegInt | None = None
    flat_optimizer: bool = True
    progress: bool = True
    workdir: str | None = "workdirs/gpt2"

    RENAMED: ClassVar[dict[str, str]] = {
        "hellaswag_items": "task_items", "data": "data_path", "model": "model.architecture",
        **moved_into("model", ModelOptions, but=("architecture",))}
    #: The run's name (``NAME.json``, ``NAME.md``).
    NAME: ClassVar[str] = "gpt2"
    #: The corpus a run without ``--data_path`` reads (a file name of
    #: :func:`seqjax.data.corpora.resolve_corpus`); ``None``: ``--data_path`` is required.
    CORPUS: ClassVar[str | None] = None


# ----------------------------------------------------------------------------- data


def text_source(cfg: Config) -> str | None:
    """The text file the run tokenises at its start, or ``None`` for token shards (a ``.bin``,
    a ``.json`` or a folder): with a recipe's corpus (``CORPUS``), that file, found from
    ``--data_path`` (the file or its folder; unset = the usual places) by
    :func:`~seqjax.data.corpora.resolve_corpus`; else ``--data_path`` itself."""
    path = cfg.data_path
    holds_corpus = cfg.CORPUS is not None and os.path.isfile(os.path.join(path or "", cfg.CORPUS))
    if path and (path.endswith((".bin", ".json")) or os.path.isdir(path) and not holds_corpus):
        return None
    if cfg.CORPUS is not None:
        return str(resolve_corpus(cfg.CORPUS, path))  # names the path that does not exist
    if path and not os.path.exists(path):
        raise ConfigError(f"--data_path {path!r} does not exist.")
    return path or None


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def load_tokens(cfg: Config) -> TokenData:
    """The run's tokens, checked against the model's vocabulary: the shards of
    ``cfg.data_path``, or its text (:func:`text_source`) through ``seqjax prepare``'s nanoGPT
    layout (:func:`seqjax.experiments._text.prepared_text`: the text cut at ``int(0.9 n)``)."""
    source = text_source(cfg)
    if source is None and not cfg.data_path:
        raise ConfigError("--data_path is required: a shard folder, a manifest.json, a nanoGPT "
                          "train.bin (make one with `seqjax prepare`) or a text file.")
    if cfg.max_chars and source is None:
        raise ConfigError(f"--max_chars ({cfg.max_chars}) keeps a text's first characters; "
                          f"--data_path {cfg.data_path!r} holds token shards.")
    tokens = (open_tokens(cfg.data_path, vocab_size=cfg.vocab_size) if source is None
              else prepared_text(source, text_tokenizer(cfg), cfg.max_chars))
    for split in ("train", "val"):
        longest = max(len(s) for s in getattr(tokens, split))
        if longest <= cfg.block_size:
            raise ShardError(
                f"{source or cfg.data_path}: the {split} split is too short for one window of "
                f"block_size + 1 = {cfg.block_size + 1} tokens (its longest shard holds "
                f"{longest}).")
    return tokens


def text_tokenizer(cfg: Config) -> Any:
    """The run's tokenizer (:func:`seqjax.data.text_tokenizers.load_text_tokenizer`); ``char``:
    the text's sorted characters, no special tokens (nanoGPT's ``shakespeare_char``), or the
    ``tokenizer.json`` beside shards that ``seqjax prepare --tokenizer char`` wrote."""
    from seqjax.data.text_tokenizers import load_text_tokenizer

    spec, source = cfg.tokenizer, text_source(cfg) if cfg.tokenizer == "char" else None
    if spec == "char" and source is None:
        folder = cfg.data_path if os.path.isdir(cfg.data_path or "") else os.path.dirname(
            cfg.data_path or "")
        spec = f"seqjax:{os.path.join(folder, 'tokenizer.json')}"
    try:
        if source is not None:
            tok = CharTokenizer.from_text(_read(source), SpecialTokens.none())
        else:
            tok = load_text_tokenizer(spec, rank_file=cfg.rank_file)
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


def build_model(cfg: Config) -> TransformerLM | RNNLanguageModel:
    """GPT-2 at ``cfg.model``'s shapes and switches (:meth:`TransformerOptions.build`; default:
    learned positions, tied embeddings, LayerNorm, biases, tanh-GELU), or with
    ``--model.architecture lstm`` a stacked-LSTM LM
    (:class:`~seqjax.models.rnn.RNNLanguageModel`, forget-gate bias 1)."""
    m = cfg.model
    dtype = None if cfg.compute_dtype == "float32" else jnp.dtype(cfg.compute_dtype)
    if m.architecture == "lstm":
        return RNNLanguageModel(RNNLMConfig(
            vocab_size=cfg.vocab_size, embed_dim=m.embed_dim, num_layers=m.num_layers,
            cell_type="lstm", dropout_rate=m.dropout_rate, cell_kwargs={"forget_bias": 1.0},
        ), dtype=dtype)
    return m.build(cfg.vocab_size, cfg.block_size, dtype)


#: The model switches, at GPT-2's values: recorded with the checkpoints only where they differ,
#: so a work dir written before they existed still resumes.
_SWITCHES = {"positions": "learned", "qk_norm": False, "norm_type": "layernorm",
             "residual_init_std": None, "tie_embeddings": True, "logit_softcap": 0.0,
             "architecture": "transformer", "norm_use_bias": None,
             "attention_dropout_rate": None}


def model_config(cfg: Config) -> dict:
    """What the checkpoints record of the model (a restore with another one is refused), under
    the flat names checkpoints have always used (``num_layers``; ``model``: the
    architecture), so a work dir written before ``--model.*`` still resumes."""
    m = cfg.model
    out = {"vocab_size": cfg.vocab_size, "block_size": cfg.block_size, "tokenizer": cfg.tokenizer}
    out.update({k: getattr(m, k) for k in ("num_layers", "num_heads", "embed_dim", "use_bias",
                                           "activation")})
    out.update({("model" if k == "architecture" else k): getattr(m, k)
                for k, off in _SWITCHES.items() if getattr(m, k) != off})
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
    flops_per_step = None  # MFU in the logs: 6N + 12·L·H·Q·T per token, causal half
    if isinstance(model, TransformerLM):
        flops_per_step = (lm_flops_per_token(model.config, params, block_size=cfg.block_size)
                          * cfg.batch_size * cfg.block_size)
    apply_fn = flax_apply_fn(model)
    prompt = sample_prompt(cfg, tok) if cfg.sample_tokens else []
    windows = train_windows(cfg, tokens, None if tok is None else tok.eot)
    if prompt and jax.default_backend() != "cpu":  # compiled while training runs
        compile_sampler_ahead(model, params, cfg, prompt)

    encoded = task_batches(cfg, tasks, tok)  # every item checked before training

    def val_batches(par: Parallel) -> Any:
        rows = eval_rows(cfg, par)
        par.check_batch_size(rows, "eval_batch_size")
        if cfg.eval_batches:
            return estimates(cfg, tokens.val, rows, seed=cfg.seed + 2)
        return validation_windows(cfg, tokens, rows)

    def evals(task: EvalTask) -> tuple[Any, Any]:
        def data(par: Parallel) -> TaskBatches:
            return regroup(encoded[task.name], eval_rows(cfg, par), par.batch_shards)

        return make_task_eval(apply_fn, task.kind), data

    def evaluate_run(t: Trained) -> dict:
        out: dict[str, Any] = {"val_loss": t.eval.get("eval/loss"),
                               "val_tokens": t.eval.get("eval/tokens"),
                               **task_results(t.eval, tasks)}
        if cfg.eval_batches:  # nanoGPT's estimates, then the validation loss of val_tokens
            rows = eval_rows(cfg, t.par)
            train_est = t.evaluate(estimates(cfg, tokens.train, rows, seed=cfg.seed + 3))
            full = t.evaluate(validation_windows(cfg, tokens, rows))
            out.update(val_loss_estimate=out["val_loss"], train_loss_estimate=train_est["loss"],
                       val_loss=full["loss"], val_tokens=full["tokens"])
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
        model_config=model_config(cfg), evaluate=evaluate_run,
        tokenizer=tok if hasattr(tok, "to_json") else None)  # a seqjax tokenizer: saved
    about = (f"{model_shape(cfg.model)}, {count_params(params):,} parameters, "
             f"{tokens.num_tokens('train'):,} train / {tokens.num_tokens('val'):,} val tokens "
             f"({tokens.format}), "
             f"{cfg.batch_size * cfg.block_size:,} tokens per step")
    names = [name for _, name, _ in task_files(cfg)]
    return Task(cfg.NAME, [run_], about=about, summarize=lambda ts: summarize(cfg, ts[0]),
                report=lambda s: report(cfg, s, names), files=write_sample)


def train_windows(cfg: Config, tokens: TokenData, eot: int | None
                  ) -> Callable[[Parallel], Any]:
    """The training windows, given the mesh: ``--input=host`` draws each step's on the host
    (:class:`ShardWindows`, this process's rows), ``--input=device`` on the devices
    (:class:`DeviceLMWindows`); what neither can do is a :class:`ConfigError` before
    training."""
    if cfg.align == "document" and (eot is None or cfg.input == "device"):
        raise ConfigError("--align=document starts each window at an end-of-text token: it needs "
                          f"a tokenizer that has one ({cfg.tokenizer!r}: "
                          f"{'none' if eot is None else eot}) and --input=host.")
    if cfg.input == "device" and len(tokens.train) != 1:
        raise ConfigError(f"--input=device holds one training shard on the devices; "
                          f"{cfg.data_path!r} has {len(tokens.train)}: use --input=host.")

    def windows(par: Parallel) -> Any:
        if cfg.input == "device":
            return DeviceLMWindows(np.asarray(tokens.train[0]), cfg.batch_size, cfg.block_size,
                                   seed=cfg.seed, mesh=par.mesh)
        return ShardWindows(tokens.train, par.local_batch_size(cfg.batch_size), cfg.block_size,
                            seed=cfg.seed, align=cfg.align, eot=eot, source=cfg.data_path,
                            **par.host_rows())

    return windows


def eval_rows(cfg: Config, par: Parallel) -> int:
    """Rows of every evaluation batch: ``--eval_batch_size``, else one micro-batch's."""
    return cfg.eval_batch_size or cfg.batch_size // max(par.grad_accum, 1)


def estimates(cfg: Config, shards: Any, rows: int, seed: int) -> list[dict]:
    """nanoGPT's estimate batches of ``shards`` at ``cfg``'s block and ``--eval_batches``
    (:func:`seqjax.experiments._text.estimate_windows`)."""
    return estimate_windows(shards, rows, cfg.block_size, cfg.eval_batches, seed)


def validation_windows(cfg: Config, tokens: TokenData, rows: int) -> ValidationWindows:
    """The first ``val_tokens`` of the validation split in whole windows (llm.c's), or with
    ``val_tokens=0`` every token of it once."""
    return ValidationWindows(tokens.val, rows, cfg.block_size, cfg.val_tokens or None,
                             tail=not cfg.val_tokens)


def compile_sampler_ahead(model: Any, params: Any, cfg: Config, prompt_ids: list[int]) -> Any:
    """Compile the end-of-run sample's program in a background thread (while training
    runs), for host copies of ``params``' shapes: the sample then starts at once."""
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    decoder, prompt, options = sampling(
        model, cfg.block_size, prompt_ids, max_new_tokens=cfg.sample_tokens,
        temperature=cfg.sample_temperature, top_k=cfg.sample_top_k, seed=cfg.seed)
    return compile_in_background(lambda: lower_sample(decoder, abstract, prompt, **options),
                                 "sample")


def summarize(cfg: Config, t: Trained) -> dict:
    """The final metrics, tokens per second, the curve; printed."""
    s: dict[str, Any] = {**t.results,
                         "curve": [(r["step"], r["loss"], r.get("eval/loss")) for r in t.records]}
    tokens = t.steps * cfg.batch_size * cfg.block_size
    s["tokens_trained"] = tokens
    s["tokens_per_s"] = tokens / t.seconds if t.seconds else None
    line = f"\nstep {t.steps}: val loss {s['val_loss']:.4f}" if s.get("val_loss") else ""
    if s.get("val_loss_estimate") is not None:
        line += (f" (nanoGPT's estimate: val {s['val_loss_estimate']:.4f}, train "
                 f"{s['train_loss_estimate']:.4f})")
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


def run(cfg: Config, build: Callable[[Any], Task] = build) -> dict:
    """Pretrain (resuming from ``cfg.workdir``); the summary. ``--micro_batch_size`` sets
    the gradient accumulation from the devices there are; ``build`` makes the task (a
    preset's own summary)."""
    par = Parallel.from_options(cfg)
    accum = grad_accum(cfg, par.mesh.shape["data"] * par.mesh.shape["fsdp"])
    if accum != par.grad_accum:
        cfg = dataclasses.replace(cfg, grad_accum=accum)
        par = Parallel.from_options(cfg)
    return train(build(cfg), cfg, par)


# ----------------------------------------------------------------------------- inference


def _restore(cfg: Config) -> tuple[Any, Any]:
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
    val = evaluate_batches(eval_step, params, validation_windows(cfg, tokens, rows))
    metrics = {}
    if cfg.eval_batches:  # nanoGPT's estimate, as in training
        metrics["val_loss_estimate"] = evaluate_batches(eval_step, params, estimates(
            cfg, tokens.val, rows, seed=cfg.seed + 2))["loss"]
    for task in tasks:
        task_step = make_eval_step(make_task_eval(flax_apply_fn(model), task.kind))
        metrics.update({f"{task.name}/{k}": v for k, v in evaluate_batches(
            task_step, params, regroup(encoded[task.name], rows)).items()})
    return {"val_loss": val["loss"], "val_tokens": val["tokens"],
            **{k: v for k, v in metrics.items() if "/" not in k}, **task_results(metrics, tasks)}


def generate(cfg: Config, prompt: str, *, max_new_tokens: int = 200, temperature: float = 0.8,
             seed: int = 0) -> str:
    """Continue ``prompt`` with the checkpoint in ``cfg.workdir`` (top-k ``sample_top_k``);
    an empty prompt starts from the end-of-text token."""
    model, params = _restore(cfg)
    saved = os.path.join(cfg.workdir or "", "tokenizer.json")  # a seqjax tokenizer, kept
    tok = load_tokenizer(saved) if os.path.isfile(saved) else text_tokenizer(cfg)
    ids = sample_ids(model, params, cfg.block_size, sample_prompt(cfg, tok, prompt),
                     max_new_tokens=max_new_tokens, temperature=temperature,
                     top_k=cfg.sample_top_k, seed=seed)
    return prompt + tok.decode(ids)


r"""Selective copying and associative recall (Mamba §3.1/§4.1, Table 1) at reduced scale.

Two synthetic tasks that separate *content-aware* sequence layers from time-invariant
ones (Gu & Dao 2023, §3.1):

* **selective copying** (:func:`seqjax.data.synthetic.selective_copying`): ``K`` content
  tokens at random positions among ``L`` noise tokens, then ``K`` markers; at marker
  ``i`` the model must emit the ``i``-th content token. The spacing varies, so a linear
  time-invariant (LTI) layer — a fixed convolution — cannot solve it; input-dependent
  selection can. Reported: accuracy over the ``K`` emitted tokens.
* **associative recall** (:func:`seqjax.data.synthetic.associative_recall`):
  ``k₁ v₁ … k_P v_P ? k_q`` → ``v_q`` (Ba et al. 2016; H3/Zoology). Reported: accuracy
  of the single answer.

Models (all causal, 2 layers, width ``d``, token embedding + a linear head):

* ``lstm``: :class:`seqjax.nn.StackedRNN` (LSTM);
* ``transformer``: pre-norm :class:`~seqjax.nn.transformer.TransformerBlock` with softmax
  :class:`~seqjax.nn.attention.MultiHeadAttention` and learned positions;
* ``linear``: the same blocks with :class:`~seqjax.nn.linear_attention.LinearAttention`;
* ``mamba``: ``x + MambaBlock(RMSNorm(x))`` per layer (:class:`~seqjax.nn.ssm.MambaBlock`,
  selective S6, no positions), final RMSNorm;
* ``mamba-lti``: the same with ``selective=False`` — the LTI ablation (Δ, B, C fixed
  parameters), i.e. Table 1's "Mamba architecture with an S4 layer" (56.4%).

Reference (Mamba paper, Table 1, selective copying, length 4096, 16 tokens, 2 layers):
S4 without gating 18.3%, H3 57.0%, Mamba architecture with S4 56.4%, Mamba (S6) 99.8%.
Our scale is far smaller (length ``L + K = 40`` by default, ``d = 64``, 1500 steps of 32
sequences), so the ordering, not the numbers, is what is compared.

Each run trains with :func:`seqjax.train.loop.fit` on every visible device (and host), data
parallel unless ``--mesh`` / ``--strategy`` say otherwise; ``batch`` is the global batch
(every process draws the same fresh batch and feeds its own rows). With ``--workdir`` each
run keeps its checkpoint and ``metrics.jsonl`` in ``WORKDIR/TASK_MODEL``.

Run:  python -m seqjax.experiments.selective_copying --out \
          seqjax/experiments/results/selective_copying.md
      python -m seqjax.experiments.selective_copying --smoke    (seconds, for CI)
      (or ``seqjax train selective_copying [--smoke] [--workdir DIR]``); every ``Config``
      field is an option, e.g. ``--tasks=selective_copying --models=mamba,mamba-lti --steps=500``;
      the networks' sizes are the group ``--model.KEY`` (``--model.embed_dim=128``,
      ``--model.d_state=16``; :class:`ModelOptions`).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any, ClassVar, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from seqjax._io import write_atomic
from seqjax.data.synthetic import associative_recall, selective_copying
from seqjax.experiments import _kit
from seqjax.experiments._config import NonNegInt, PosFloat, PosInt, moved_into
from seqjax.experiments._kit import Run, Trained, host_rows, pad_rows, train, write_json
from seqjax.experiments._runner import experiment_main
from seqjax.experiments.reports.selective_copying import report
from seqjax.nn.embedding import Embed
from seqjax.nn.linear_attention import LinearAttention
from seqjax.nn.norms import RMSNorm
from seqjax.nn.recurrent import StackedRNN
from seqjax.nn.ssm import MambaBlock
from seqjax.nn.transformer import BlockConfig, TransformerBlock
from seqjax.train.loop import FitConfig
from seqjax.train.parallel import Parallel, ParallelOptions
from seqjax.utils import count_params

Task = Literal["selective_copying", "associative_recall"]
Model = Literal["lstm", "transformer", "linear", "mamba", "mamba-lti"]
TASKS: tuple[str, ...] = get_args(Task)
MODELS: tuple[str, ...] = get_args(Model)


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """The networks' sizes and the SSM's scan, ``--model.KEY=VALUE``: every model of
    ``--models`` (LSTM, transformer, linear attention, Mamba, Mamba-LTI) is built with them
    (:class:`SequenceClassifier`), so the models compared share one width and depth.

    Attributes:
        embed_dim: model width ``d`` (the embedding and every layer).
        num_layers: LSTM layers, transformer blocks or Mamba blocks.
        num_heads: attention heads (``transformer``, ``linear``).
        d_state: SSM state size ``N`` per channel (``mamba``, ``mamba-lti``).
        scan_impl: the Mamba scan: ``sequential`` (``lax.scan``) or ``associative``
            (``lax.associative_scan``).
    """

    embed_dim: PosInt = 64
    num_layers: PosInt = 2
    num_heads: PosInt = 4
    d_state: PosInt = 8
    # on CPU at this size, "sequential" is ~2x faster than "associative"
    scan_impl: Literal["sequential", "associative"] = "sequential"


@dataclasses.dataclass(frozen=True)
class Config(ParallelOptions):
    """The runs (tasks × models, or an explicit list), their sizes and optimisation.

    Attributes:
        tasks: comma list of ``selective_copying`` and ``associative_recall``.
        models: comma list of ``lstm``, ``transformer``, ``linear``, ``mamba`` and
            ``mamba-lti``; every task is run with every model.
        runs: an explicit comma list of ``task:model`` runs; overrides ``tasks`` ×
            ``models`` when set (``""`` = use them).
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        steps: training steps of every run; ``None`` = ``DEFAULT_STEPS`` of the task (1500).
        batch_size: sequences per step over all devices (the global batch), fresh every step.
        learning_rate: peak AdamW rate (weight decay 0.01, gradient clip 1.0), after the
            warm-up; cosine decay to 0 at the last step.
        warmup_steps: linear warm-up steps.
        eval_examples: held-out examples of the final evaluation.
        seed: initialisation and training batches (the held-out set uses 10,000 + seed).
        seq_len: noise positions ``L`` before the markers (selective copying).
        num_tokens: content tokens ``K`` to copy, then as many markers (at most ``seq_len``).
        num_symbols: distinct content symbols (vocabulary ``num_symbols + 3``).
        num_pairs: key–value pairs per example (associative recall; at most ``num_keys``).
        num_keys: distinct key ids.
        num_values: distinct value ids.
        fast_compile: compile at XLA backend optimisation level 0 (LLVM -O0): faster
            compiles, slower steps (smoke runs).
        out: write the markdown report to this file; ``None`` = print it only.
        json_out: write every run's raw results to this JSON file (after each run);
            ``None`` = none.
        workdir: ``run.json``, and each run's checkpoint and ``metrics.jsonl`` in
            ``WORKDIR/TASK_MODEL``; ``None`` = write nothing.
    """

    tasks: tuple[Task, ...] = TASKS  # comma list on the command line
    models: tuple[Model, ...] = MODELS
    runs: str = ""  # explicit "task:model,..." list; overrides tasks × models when set
    model: ModelOptions = ModelOptions()
    steps: NonNegInt | None = None  # default: DEFAULT_STEPS[task]
    batch_size: PosInt = 32
    learning_rate: PosFloat = 3e-3
    warmup_steps: NonNegInt = 100
    eval_examples: PosInt = 1024
    seed: int = 0
    # selective copying
    seq_len: PosInt = 32
    num_tokens: PosInt = 8
    num_symbols: PosInt = 8
    # associative recall
    num_pairs: PosInt = 8
    num_keys: PosInt = 16
    num_values: PosInt = 16
    # bookkeeping
    fast_compile: bool = False  # LLVM -O0 (smoke runs, where compiling is the whole cost)
    out: str | None = None  # markdown report
    json_out: str | None = None  # raw results
    workdir: str | None = None  # run.json; checkpoints and metrics of each run

    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)

    def __post_init__(self) -> None:
        plan(self)  # --runs is checked at the door, before the work dir is written


DEFAULT_STEPS = {"selective_copying": 1500, "associative_recall": 1500}
PRESETS = {
    # Every model on selective copying and the SSM on associative recall, tiny: seconds.
    "smoke": {
        "runs": ",".join([f"selective_copying:{m}" for m in MODELS]
                         + ["associative_recall:mamba"]),
        "steps": 4, "batch_size": 8, "eval_examples": 8, "model.embed_dim": 16,
        "model.d_state": 4, "seq_len": 12, "num_tokens": 3, "num_pairs": 3, "num_keys": 6,
        "num_values": 6, "warmup_steps": 2, "fast_compile": True,
    },
}


def plan(cfg: Config) -> list[tuple[str, str]]:
    """The ``(task, model)`` runs of ``cfg``, validated."""
    if cfg.runs:
        runs = [tuple(r.split(":", 1)) for r in cfg.runs.split(",") if r]
        if any(len(r) != 2 for r in runs):
            raise ValueError(f"--runs must be a comma list of task:model; got {cfg.runs!r}.")
    else:
        runs = [(t, m) for t in cfg.tasks for m in cfg.models]
    for task, model in runs:
        if task not in TASKS:
            raise ValueError(f"--runs: unknown task {task!r}; choose from {TASKS}.")
        if model not in MODELS:
            raise ValueError(f"--runs: unknown model {model!r}; choose from {MODELS}.")
    return runs


# ----------------------------------------------------------------------------- data


def task_spec(cfg: Config, task: str) -> tuple[int, int]:
    """``(vocab_size, sequence_length)`` of ``task``."""
    if task == "selective_copying":
        return cfg.num_symbols + 3, cfg.seq_len + cfg.num_tokens
    return 2 + cfg.num_keys + cfg.num_values, 2 * cfg.num_pairs + 2


def make_batch(cfg: Config, task: str, num: int, rng: np.random.Generator
               ) -> dict[str, np.ndarray]:
    """``tokens[N, T]``, ``targets[N, T]`` and ``weights[N, T]`` (1 where an answer is due)."""
    if task == "selective_copying":
        d = selective_copying(num, seq_len=cfg.seq_len, num_tokens=cfg.num_tokens,
                              num_symbols=cfg.num_symbols, seed=rng)
        tokens = d["inputs"]
        targets = np.zeros_like(tokens)
        targets[:, cfg.seq_len:] = d["targets"]
        weights = np.zeros(tokens.shape, np.float32)
        weights[:, cfg.seq_len:] = 1.0
    elif task == "associative_recall":
        d = associative_recall(num, num_pairs=cfg.num_pairs, num_keys=cfg.num_keys,
                               num_values=cfg.num_values, seed=rng)
        tokens = d["inputs"]
        targets = np.zeros_like(tokens)
        targets[:, -1] = d["targets"]
        weights = np.zeros(tokens.shape, np.float32)
        weights[:, -1] = 1.0
    else:
        raise ValueError(f"`task` must be one of {TASKS}; got {task!r}.")
    return {"tokens": tokens, "targets": targets, "weights": weights}


# ----------------------------------------------------------------------------- models


class SequenceClassifier(nn.Module):
    """Embedding → 2 causal sequence-mixing layers → linear head over the vocabulary."""

    kind: str
    vocab: int
    block_size: int
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    d_state: int = 16
    scan_impl: str = "associative"

    @nn.compact
    def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
        d = self.d_model
        x_BxTxD = Embed(self.vocab, d, name="embed")(tokens_BxT)
        if self.kind == "lstm":
            x_BxTxD = StackedRNN(features=d, num_layers=self.num_layers, name="lstm")(x_BxTxD)
        elif self.kind in ("transformer", "linear"):
            pos_TxD = self.param("pos_embed", nn.initializers.normal(0.02), (self.block_size, d))
            x_BxTxD = x_BxTxD + pos_TxD[: tokens_BxT.shape[1]]
            attention = None
            if self.kind == "linear":
                attention = functools.partial(LinearAttention, chunk_size=32)
            for i in range(self.num_layers):
                block = BlockConfig.decoder(self.num_heads, mlp_dim=4 * d, cross_attention=False,
                                            attention=attention)
                x_BxTxD = TransformerBlock(block, name=f"block_{i}")(x_BxTxD)
            x_BxTxD = nn.LayerNorm(name="final_norm")(x_BxTxD)
        elif self.kind in ("mamba", "mamba-lti"):
            for i in range(self.num_layers):
                h = RMSNorm(name=f"norm_{i}")(x_BxTxD)
                x_BxTxD = x_BxTxD + MambaBlock(
                    features=d, d_state=self.d_state, selective=self.kind == "mamba",
                    scan_impl=self.scan_impl, name=f"mamba_{i}",
                )(h)
            x_BxTxD = RMSNorm(name="final_norm")(x_BxTxD)
        else:
            raise ValueError(f"`kind` must be one of {MODELS}; got {self.kind!r}.")
        return nn.Dense(self.vocab, name="head")(x_BxTxD).astype(jnp.float32)


# ----------------------------------------------------------------------------- training


def _loss(logits, batch):
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    w = batch["weights"]
    correct = (jnp.argmax(logits, -1) == batch["targets"]) * w
    return (ce * w).sum() / w.sum(), correct.sum() / w.sum()


def task_run(cfg: Config, task: str, model_name: str, results: list[dict]) -> Run:
    """One model on one task, trained on fresh random batches (every process draws the same
    global batch and feeds its own rows) and evaluated on held-out ones; its row joins
    ``results`` (printed; written to ``--json_out`` after every run)."""
    steps = DEFAULT_STEPS[task] if cfg.steps is None else cfg.steps
    vocab, length = task_spec(cfg, task)
    net = cfg.model
    model = SequenceClassifier(model_name, vocab, length, net.embed_dim, net.num_layers,
                               net.num_heads, net.d_state, net.scan_impl)
    data_rng = np.random.default_rng(cfg.seed)
    held_out = make_batch(cfg, task, cfg.eval_examples, np.random.default_rng(10_000 + cfg.seed))
    params = model.init(jax.random.PRNGKey(cfg.seed), jnp.zeros((1, length), jnp.int32))
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, cfg.warmup_steps,
                                                  max(steps, cfg.warmup_steps + 1))
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))

    def loss_fn(p: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
        loss, acc = _loss(model.apply({"params": p}, batch["tokens"]), batch)
        # `tokens` (the answers due) weighs micro-batches under --grad_accum
        return loss, {"accuracy": acc, "tokens": batch["weights"].sum()}

    def eval_fn(p: Any, batch: dict) -> dict:
        logits = model.apply({"params": p}, batch["tokens"])
        loss, acc = _loss(logits, batch)
        hit = (jnp.argmax(logits, -1) == batch["targets"]) | (batch["weights"] == 0)
        exact = jnp.sum(hit.all(axis=1) & batch["row"], dtype=jnp.float32) / jnp.sum(
            batch["row"], dtype=jnp.float32)
        return {"loss": loss, "accuracy": acc, "exact": exact}

    def batches(par: Parallel) -> Callable[[int], dict]:
        return lambda i: host_rows(par, make_batch(cfg, task, cfg.batch_size, data_rng))

    every = max(1, steps // 6)
    curve: list[tuple[int, float, float]] = []

    def record(r: dict) -> None:
        if r["step"] % every == 0 or r["step"] == steps:
            curve.append((r["step"], r["loss"], r["accuracy"]))
            print(f"    {task} {model_name} step {r['step']}: loss {r['loss']:.3f} "
                  f"acc {r['accuracy']:.3f}", file=sys.stderr, flush=True)

    def row(t: Trained) -> dict:
        # One global evaluation batch, padded to split over the devices (`row` False: no weight).
        ev = t.evaluate([pad_rows({**held_out, "row": np.ones(cfg.eval_examples, bool)},
                                  t.par.batch_shards, {"weights": 0.0, "row": False})])
        res = {"task": task, "model": model_name, "params": count_params(params["params"]),
               "eval_loss": ev["loss"], "eval_accuracy": ev["accuracy"],
               "eval_exact_match": ev["exact"], "train_s": t.seconds, "curve": curve,
               "config": {**dataclasses.asdict(cfg), "steps": steps}}
        print(f"{task:20s} {model_name:12s} params {res['params']:>7,}  "
              f"accuracy {100 * res['eval_accuracy']:5.1f}%  "
              f"exact {100 * res['eval_exact_match']:5.1f}%  ({res['train_s']:.0f} s)",
              flush=True)
        results.append(res)
        if cfg.json_out and jax.process_index() == 0:  # an interrupted job keeps what it did
            write_json(cfg.json_out, results)
        return res

    return Run(
        model=model, params=params["params"], loss_fn=loss_fn, data=batches,
        optimizer=(tx, schedule), batch_size=cfg.batch_size, seed=cfg.seed,
        fit=FitConfig(steps=steps, log_every=every, best_metric=None, progress=False,
                      tensorboard=False, plot=False, handle_signals=cfg.workdir is not None),
        eval_fn=eval_fn, on_log=[record], name=f"{task}_{model_name}", evaluate=row,
        compiler_options={"xla_backend_optimization_level": 0} if cfg.fast_compile else None,
        model_config={"task": task, "model": model_name, "d_model": net.embed_dim})


def build(cfg: Config) -> _kit.Task:
    """One run per planned ``(task, model)``; the markdown report (printed, and written to
    ``--out``)."""
    results: list[dict] = []

    def report_md(summary: dict) -> str:
        command = "python -m seqjax.experiments.selective_copying " + " ".join(sys.argv[1:])
        text = report(summary["results"], command.strip(), summary["wall_s"], tasks=TASKS)
        if cfg.out and jax.process_index() == 0:
            write_atomic(cfg.out, text)
        return text

    return _kit.Task("selective_copying", (task_run(cfg, task, model, results)
                                           for task, model in plan(cfg)),
                summarize=lambda trained: {"results": [t.results for t in trained]},
                report=report_md)


def run(cfg: Config) -> dict[str, Any]:
    """Train and evaluate every planned run; print (and write) the markdown report."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> int:
    experiment_main(__file__, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())

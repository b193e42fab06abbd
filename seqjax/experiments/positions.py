r"""Positional encodings: the sinusoid heat maps, and an ablation on reversal and sorting.

**Heat maps.** :func:`seqjax.nn.positional.sinusoidal_positions` (interleaved sin/cos,
``r_{t,2i} = sin(t ω_i)``, ``r_{t,2i+1} = cos(t ω_i)``, ``ω_i = base^{-2i/D}``):

* MEDL Fig. 7.14 ((7.29); ``p_e = 768``, ``T = 4000``, ``M = 10⁴``, ``t = 1..T``):
  (a) ``r_j^{⟨t⟩}`` for ``t ≤ 60``, ``j < 200``; (b) ``r^{⟨51⟩} − r^{⟨50⟩}`` against ``j``
  ("a significant difference … around the first hundred vector positions");
* Bishop Fig. 12.10(b) ((12.25); ``D = 100``, ``L = 30``, the first ``N = 200`` positions).

**Ablation.** A 2-layer causal transformer (:class:`~seqjax.nn.transformer.TransformerDecoder`,
pre-norm) reads ``x_1..x_n <sep>`` and emits the target and ``<eos>``
(:func:`seqjax.data.synthetic.reverse_task`, :func:`~seqjax.data.synthetic.sort_task`; loss on
the target only, teacher forcing), with four kinds of positional information:

* ``none`` — no encoding (a causal mask alone still breaks permutation symmetry: a
  token can count the tokens before it);
* ``sinusoidal`` — :class:`~seqjax.nn.positional.SinusoidalPositionalEmbedding` added to
  ``√d``-scaled embeddings (MEDL (7.30); Bishop (12.24));
* ``learned`` — :class:`~seqjax.nn.positional.LearnedPositionalEmbedding` (J&M §9.7.3;
  its rows past the training length are never trained);
* ``rope`` — rotary embeddings on queries and keys (``use_rope=True``; slides "RoPE").

Trained on source lengths ``1..train_max_length``; evaluated on held-out sequences of each
length up to ``test_max_length``. Exact match is the fraction of sequences whose every
target token is the arg-max under teacher forcing — the same as greedy decoding
reproducing the whole target. The models train on every visible device (and host), data
parallel unless ``--mesh`` / ``--strategy`` say otherwise; ``batch_size`` is the global batch.

Run:  python -m seqjax.experiments.positions --results_dir seqjax/experiments/results     (full)
      python -m seqjax.experiments.positions --smoke --workdir /tmp/p                (seconds)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax.data.synthetic import BOS_ID, FIRST_SYMBOL, PAD_ID, reverse_task, sort_task
from seqjax.experiments._config import (
    NonNegInt,
    PosFloat,
    PosInt,
    config_from_dict,
    moved_into,
    renamed,
    saved_config,
)
from seqjax.experiments._kit import (
    Run,
    Trained,
    command_line,
    host_rows,
    load_average,
    pad_rows,
    train,
)
from seqjax.experiments._kit import Task as KitTask
from seqjax.experiments.reports.positions import plot_positions, report
from seqjax.nn.embedding import Embed
from seqjax.nn.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEmbedding,
    sinusoidal_positions,
)
from seqjax.nn.transformer import BlockConfig, TransformerDecoder
from seqjax.train.loop import FitConfig
from seqjax.train.losses import masked_cross_entropy, token_accuracy
from seqjax.train.optim import OptimizerConfig
from seqjax.train.options import warmup_cosine
from seqjax.train.parallel import Parallel, ParallelOptions
from seqjax.utils import count_params

Position = Literal["none", "sinusoidal", "learned", "rope"]
Task = Literal["reverse", "sort"]
POSITIONS: tuple[str, ...] = get_args(Position)
TASKS = {"reverse": reverse_task, "sort": sort_task}
SEP = BOS_ID  # the separator between source and target (the decoder's <start>)


@dataclass(frozen=True)
class ModelOptions:
    """The ablation's causal transformer (:class:`PositionsLM`), ``--model.KEY``: every
    positional encoding compared (``--positions``) trains this same network.

    Attributes:
        embed_dim: model width ``d`` (the MLP is ``4d``).
        num_heads: attention heads.
        num_layers: transformer blocks.
    """

    embed_dim: PosInt = 64
    num_heads: PosInt = 4
    num_layers: PosInt = 2


@dataclass(frozen=True)
class Config(ParallelOptions):
    """The options of ``seqjax train positions`` (heat maps, then every task × encoding).

    Attributes:
        medl_dim: MEDL Fig. 7.14's encoding size ``p_e``.
        medl_length: MEDL Fig. 7.14's number of positions ``T`` (base ``M = 10⁴``).
        bishop_dim: Bishop Fig. 12.10's encoding size ``D``.
        bishop_base: Bishop Fig. 12.10's base ``L``.
        bishop_length: Bishop Fig. 12.10's number of positions ``N``.
        tasks: the ablation's tasks, from ``reverse`` and ``sort`` (comma-separated).
        positions: the encodings compared, from ``none``, ``sinusoidal``, ``learned`` and
            ``rope`` (comma-separated).
        num_symbols: distinct symbols a source sequence is drawn from.
        train_max_length: training source lengths are ``1 .. train_max_length``.
        test_max_length: test source lengths are ``1 .. test_max_length`` (at least
            ``train_max_length``).
        test_per_length: test sequences per source length.
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        steps: optimiser steps per model (the cosine schedule ends here).
        batch_size: sequences per step, over all devices (the global batch).
        learning_rate: peak AdamW learning rate, after the warm-up (weight decay 0.01,
            clipping at 1.0).
        warmup_steps: linear warm-up steps.
        seed: base of each model's seed (initialisation, training and test sequences; each
            task and encoding adds its own offset).
        keep_previous: report the runs in ``workdir/positions.json`` that this run does not
            redo (their settings must match).
        workdir: the report, plots, summary (``positions.json``) and ``run.json``; unset =
            none written.
        results_dir: also write the report and the plots here; unset = nowhere else.
    """

    # heat maps
    medl_dim: PosInt = 768
    medl_length: PosInt = 4000
    bishop_dim: PosInt = 100
    bishop_base: PosFloat = 30.0
    bishop_length: PosInt = 200
    # ablation
    tasks: tuple[Task, ...] = ("reverse", "sort")
    positions: tuple[Position, ...] = POSITIONS
    num_symbols: PosInt = 8
    train_max_length: PosInt = 10
    test_max_length: PosInt = 16
    test_per_length: PosInt = 128
    model: ModelOptions = ModelOptions()
    steps: NonNegInt = 1000
    batch_size: PosInt = 64
    learning_rate: PosFloat = 3e-3
    warmup_steps: NonNegInt = 100
    seed: int = 0
    keep_previous: bool = False  # keep the work dir's earlier runs of other tasks/encodings
    workdir: str | None = "workdirs/positions"
    results_dir: str | None = None

    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)


PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"medl_length": 64, "bishop_length": 40, "tasks": ("reverse",),
              "positions": ("rope",), "train_max_length": 3, "test_max_length": 4,
              "test_per_length": 4, "model.embed_dim": 16, "model.num_heads": 2,
              "model.num_layers": 1, "steps": 3, "batch_size": 8, "warmup_steps": 1},
}


# ----------------------------------------------------------------------------- heat maps


def medl_fig_7_14(cfg: Config) -> dict:
    """MEDL (7.29) with ``t = 1..T``: the encodings and ``r^{⟨51⟩} − r^{⟨50⟩}``."""
    r_TxD = np.asarray(sinusoidal_positions(cfg.medl_length, cfg.medl_dim, base=1e4, start=1))
    t50, t51 = (min(t, cfg.medl_length) - 1 for t in (50, 51))
    diff = r_TxD[t51] - r_TxD[t50]
    big = np.nonzero(np.abs(diff) > 0.1)[0]
    return {"r": r_TxD, "diff": diff, "last_j_above_0.1": int(big.max()) if big.size else -1,
            "count_above_0.1": int(big.size), "min": float(r_TxD.min()),
            "max": float(r_TxD.max())}


def bishop_fig_12_10(cfg: Config) -> dict:
    """Bishop (12.25) with ``D = 100``, ``L = 30``, positions ``n = 1..N``."""
    r_NxD = np.asarray(sinusoidal_positions(cfg.bishop_length, cfg.bishop_dim,
                                            base=cfg.bishop_base, start=1))
    return {"r": r_NxD, "min": float(r_NxD.min()), "max": float(r_NxD.max())}


# ----------------------------------------------------------------------------- data


def make_examples(task: str, num: int, min_len: int, max_len: int, width: int,
                  num_symbols: int, seed: Any) -> dict[str, np.ndarray]:
    """``src <sep> tgt <eos>`` sequences, right-padded to ``width`` tokens.

    Returns ``inputs``/``targets`` int32[N, width] (targets shifted by one), ``mask`` bool
    (True at the target and ``<eos>`` predictions) and ``length`` int32[N] (source length).
    """
    d = TASKS[task](num, min_length=min_len, max_length=max_len, num_symbols=num_symbols,
                    seed=seed)
    seq = np.full((num, width + 1), PAD_ID, np.int32)
    mask = np.zeros((num, width), bool)
    for i, n in enumerate(d["src_lengths"]):
        row = np.r_[d["src"][i, :n], SEP, d["tgt_out"][i, : n + 1]]  # tgt_out ends in <eos>
        seq[i, : len(row)] = row
        mask[i, n : 2 * n + 1] = True  # predictions made at <sep> .. last target token
    return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "mask": mask,
            "length": d["src_lengths"].astype(np.int32)}


# ----------------------------------------------------------------------------- model


class PositionsLM(nn.Module):
    """Token embedding (+ positions) → causal pre-norm transformer → vocabulary logits."""

    positions: str
    vocab_size: int
    block_size: int
    embed_dim: int = 64
    num_heads: int = 4
    num_layers: int = 2

    @nn.compact
    def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
        if self.positions not in POSITIONS:
            raise ValueError(f"`positions` must be one of {POSITIONS}; got {self.positions!r}.")
        d = self.embed_dim
        x_BxTxD = Embed(self.vocab_size, d, embedding_init=nn.initializers.normal(d ** -0.5),
                           name="embed")(tokens_BxT) * np.sqrt(d)
        if self.positions == "sinusoidal":
            x_BxTxD = SinusoidalPositionalEmbedding()(x_BxTxD)
        elif self.positions == "learned":
            x_BxTxD = LearnedPositionalEmbedding(self.block_size, name="pos_embed")(x_BxTxD)
        block = BlockConfig.decoder(self.num_heads, mlp_dim=4 * d, cross_attention=False,
                                    use_rope=self.positions == "rope")
        h_BxTxD = TransformerDecoder(config=block, num_layers=self.num_layers,
                                     name="decoder")(x_BxTxD)
        return nn.Dense(self.vocab_size, name="head")(h_BxTxD).astype(jnp.float32)


# ----------------------------------------------------------------------------- training


def position_run(cfg: Config, task: str, positions: str) -> Run:
    """One model of ``task`` with ``positions``: trained on fresh batches of source lengths
    ``1..train_max_length`` (every process draws the same global batch and feeds its rows);
    its ``evaluate`` hook is :func:`held_out`. Named ``TASK_POSITIONS``; it writes nothing
    (its row is the result)."""
    vocab = FIRST_SYMBOL + cfg.num_symbols
    test_width = 2 * cfg.test_max_length + 2
    train_width = 2 * cfg.train_max_length + 2
    m = cfg.model
    model = PositionsLM(positions, vocab, test_width, m.embed_dim, m.num_heads, m.num_layers)
    seed = cfg.seed + 100 * POSITIONS.index(positions) + (0 if task == "reverse" else 7)
    params = jax.jit(model.init)(jax.random.PRNGKey(seed),
                                 jnp.zeros((1, test_width), jnp.int32))["params"]

    def loss_fn(p: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
        logits = model.apply({"params": p}, batch["inputs"])
        return masked_cross_entropy(logits, batch["targets"], batch["mask"]), {
            "accuracy": token_accuracy(logits, batch["targets"], batch["mask"])}

    def per_sequence(p: Any, batch: dict) -> dict:
        logits = model.apply({"params": p}, batch["inputs"])
        hit = (jnp.argmax(logits, -1) == batch["targets"]) | ~batch["mask"]
        right = ((jnp.argmax(logits, -1) == batch["targets"]) & batch["mask"]).sum(-1)
        return {"exact": hit.all(-1), "right": right, "total": batch["mask"].sum(-1)}

    def data(par: Parallel) -> Any:
        rng = np.random.default_rng(seed)

        def batches(i: int) -> dict:
            # Every process draws the same global batch and feeds its own rows of it.
            b = make_examples(task, cfg.batch_size, 1, cfg.train_max_length, train_width,
                              cfg.num_symbols, rng)
            return host_rows(par, {k: b[k] for k in ("inputs", "targets", "mask")})

        return batches

    return Run(
        model=model, params=params, loss_fn=loss_fn, data=data,
        optimizer=OptimizerConfig(
            name="adamw", learning_rate=cfg.learning_rate,
            **warmup_cosine(cfg.steps, cfg.warmup_steps), weight_decay=0.01, clip_norm=1.0),
        fit=FitConfig(steps=cfg.steps, log_every=max(1, cfg.steps // 20), eval_every=0,
                      best_metric=None, progress=False, tensorboard=False, plot=False,
                      handle_signals=False),
        batch_size=cfg.batch_size, seed=seed, name=f"{task}_{positions}", writes=False,
        evaluate=lambda t: held_out(cfg, t, task, positions, per_sequence, seed))


def held_out(cfg: Config, t: Trained, task: str, positions: str, per_sequence: Any,
             seed: int) -> dict:
    """Exact match and token accuracy of the trained model on held-out sequences of every
    source length ``1..test_max_length``; the run's row (printed)."""
    # One fixed shape for all lengths: a global batch split over the devices (padded to
    # split evenly; the padding rows' results are dropped), gathered on every process.
    par, params = t.par, t.result.state.params
    per_len = par.eval_step(per_sequence)
    test_width = 2 * cfg.test_max_length + 2
    exact, tok_acc = {}, {}
    for n in range(1, cfg.test_max_length + 1):
        b = make_examples(task, cfg.test_per_length, n, n, test_width, cfg.num_symbols,
                          20_011 + 31 * n + seed)
        b = pad_rows({k: b[k] for k in ("inputs", "targets", "mask")}, par.batch_shards,
                     {"mask": False})
        out = par.gather(per_len(params, par.place_global(b)))
        out = {k: np.asarray(v)[: cfg.test_per_length] for k, v in out.items()}
        exact[n] = float(np.mean(out["exact"].astype(bool)))  # float32 from the eval step
        tok_acc[n] = float(out["right"].astype(np.int64).sum()
                           / out["total"].astype(np.int64).sum())
    seen = range(1, cfg.train_max_length + 1)
    unseen = range(cfg.train_max_length + 1, cfg.test_max_length + 1)
    records = [r for r in t.records if "loss" in r]
    r = {
        "task": task, "positions": positions, "params": count_params(t.params),
        "train_s": t.seconds, "final_train_loss": records[-1]["loss"],
        "exact": exact, "token_accuracy": tok_acc,
        "exact_seen": float(np.mean([exact[n] for n in seen])),
        "exact_unseen": float(np.mean([exact[n] for n in unseen])) if unseen else None,
        "token_unseen": float(np.mean([tok_acc[n] for n in unseen])) if unseen else None,
        "curve": [(r["step"], r["loss"]) for r in records],
    }
    print(f"{task:8s} {positions:11s} exact (seen) {r['exact_seen']:.3f}  exact (longer) "
          f"{r['exact_unseen'] if r['exact_unseen'] is not None else float('nan'):.3f}"
          f"  {r['train_s']:.0f} s", flush=True)
    return r


def build(cfg: Config) -> KitTask:
    """The heat maps, then one run per task × encoding (:func:`position_run`); the runs
    beside the work dir's earlier ones (``keep_previous``), the report and the figures as
    the task's hooks."""
    for t in cfg.tasks:
        if t not in TASKS:
            raise ValueError(f"`tasks` must be drawn from {tuple(TASKS)}; got {t!r}.")
    for p in cfg.positions:
        if p not in POSITIONS:
            raise ValueError(f"`positions` must be drawn from {POSITIONS}; got {p!r}.")
    if cfg.test_max_length < cfg.train_max_length:
        raise ValueError(f"`test_max_length` ({cfg.test_max_length}) must be >= "
                         f"`train_max_length` ({cfg.train_max_length}).")
    previous, sessions = _previous(cfg)
    loads = [load_average()]
    started = time.perf_counter()
    medl, bishop = medl_fig_7_14(cfg), bishop_fig_12_10(cfg)
    print(f"MEDL Fig. 7.14(b): |r51 - r50| > 0.1 at {medl['count_above_0.1']} indices, "
          f"last j = {medl['last_j_above_0.1']}")

    def summarize(trained: list[Trained]) -> dict:
        wall = time.perf_counter() - started
        loads.append(load_average())
        new = [t.results for t in trained]
        done = {(r["task"], r["positions"]) for r in new}
        runs = [r for r in previous if (r["task"], r["positions"]) not in done] + new
        runs.sort(key=lambda r: (list(TASKS).index(r["task"]), POSITIONS.index(r["positions"])))
        sessions.append({"command": command_line("positions", cfg), "wall_s": wall,
                         "load_average": loads})
        return {"wall_s": wall, "load_average": loads, "runs": runs, "sessions": sessions,
                "medl": {k: v for k, v in medl.items() if k not in ("r", "diff")},
                "bishop": {k: v for k, v in bishop.items() if k != "r"}}

    return KitTask(
        "positions", (position_run(cfg, task, pos) for task in cfg.tasks for pos in cfg.positions),
        started=started, summarize=summarize,
        report=lambda s: report(cfg, medl, bishop, s["runs"], s["sessions"]),
        files=lambda folder, s: plot_positions(cfg, medl, bishop, s["runs"], folder,
                                               tasks=tuple(TASKS)))


def run(cfg: Config) -> dict:
    """The heat maps and the ablation on every visible device; the summary."""
    return train(build(cfg), cfg)


# Fields that must agree for earlier runs to be reported beside new ones (a group's dotted).
_RUN_FIELDS = ("num_symbols", "train_max_length", "test_max_length", "test_per_length",
               "model.embed_dim", "model.num_heads", "model.num_layers", "steps", "batch_size",
               "learning_rate", "warmup_steps", "seed")


def _option(config: dict, name: str) -> Any:
    """The value of option ``name`` (dotted for a group's: ``model.embed_dim``) in a config
    as a dict (``dataclasses.asdict``, or a saved one in today's names: ``saved_config``)."""
    value: Any = config
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _previous(cfg: Config) -> tuple[list[dict], list[dict]]:
    """Earlier runs and sessions from ``workdir/positions.json`` (with ``keep_previous``)."""
    path = os.path.join(cfg.workdir or "", "positions.json")
    if not (cfg.keep_previous and cfg.workdir and os.path.exists(path)):
        return [], []
    with open(path) as f:
        prev = json.load(f)
    saved, now = saved_config(Config, prev["config"]), dataclasses.asdict(cfg)
    diff = [k for k in _RUN_FIELDS if _option(saved, k) != _option(now, k)]
    if diff:
        raise ValueError(f"`keep_previous`: the earlier runs in {path} used other settings "
                         f"for {diff}; rerun them or use another work dir.")
    runs = prev["runs"]
    for r in runs:  # JSON object keys are strings
        r["exact"] = {int(k): v for k, v in r["exact"].items()}
        r["token_accuracy"] = {int(k): v for k, v in r["token_accuracy"].items()}
    sessions = prev.get("sessions") or [{
        "command": command_line("positions", config_from_dict(Config, prev["config"])),
        "wall_s": prev["wall_s"], "load_average": prev["load_average"]}]
    old_names = renamed(Config)  # a session's command as it is spelled now (--model.*)
    for s in sessions:
        s["command"] = re.sub(r"--(\w+)=", lambda m: f"--{old_names.get(m[1], m[1])}=",
                              s["command"])
    return runs, sessions


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

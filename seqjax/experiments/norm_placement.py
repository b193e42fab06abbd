r"""Pre-norm vs post-norm transformers, with and without learning-rate warm-up.

Post-norm (Vaswani et al. 2017; MEDL (7.31); J&M (9.40)–(9.41); Bishop (12.20)/(12.22)):
``x ← LN(x + Sublayer(x))``. Pre-norm (GPT-2; Bishop (12.21)/(12.23)):
``x ← x + Sublayer(LN(x))`` with a final norm. The lecture notes claim "pre-LN allows for
faster convergence"; Xiong et al. (2020) show that post-norm needs a warm-up because the
gradients of its last layers are large at initialisation, while pre-norm trains without
one. Here the same character-level causal LM (token + learned position embeddings →
:class:`~seqjax.nn.transformer.TransformerDecoder` with ``norm="pre"`` or ``"post"`` →
linear head) is trained on Tiny Shakespeare (nanoGPT's split, random windows) with AdamW
and a cosine schedule, once with a linear warm-up and once without, and the loss
curves, the validation loss and the gradient norms are compared. Every run trains on every
visible device (and host), data parallel unless ``--mesh`` / ``--strategy`` say otherwise;
``batch_size`` is the global batch.

Run:  python -m seqjax.experiments.norm_placement --results_dir seqjax/experiments/results  (full)
      python -m seqjax.experiments.norm_placement --smoke --workdir /tmp/n            (seconds)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax.data.iterators import LMWindowIterator
from seqjax.experiments._config import NonNegFloat, NonNegInt, PosFloat, PosInt, moved_into
from seqjax.experiments._kit import (
    Run,
    Task,
    Trained,
    command_line,
    load_average,
    train,
)
from seqjax.experiments._text import estimate_windows, load_data
from seqjax.experiments.reports.norm_placement import plot_curves, report
from seqjax.nn.embedding import Embed
from seqjax.nn.positional import LearnedPositionalEmbedding
from seqjax.nn.transformer import BlockConfig, TransformerDecoder
from seqjax.train.loop import FitConfig
from seqjax.train.losses import make_lm_eval, make_lm_loss
from seqjax.train.optim import OptimizerConfig
from seqjax.train.options import warmup_cosine
from seqjax.train.parallel import ParallelOptions
from seqjax.train.step import flax_apply_fn
from seqjax.utils import count_params

Norm = Literal["pre", "post"]
NORMS: tuple[str, ...] = get_args(Norm)


@dataclass(frozen=True)
class ModelOptions:
    """The character LM's transformer (:class:`NormLM`), ``--model.KEY``: every run, pre-norm
    and post-norm alike (``--norms``), has these sizes; only where the norm sits differs.

    Attributes:
        num_layers: transformer blocks.
        num_heads: attention heads.
        embed_dim: model width ``d``.
    """

    num_layers: PosInt = 6
    num_heads: PosInt = 4
    embed_dim: PosInt = 64


@dataclass(frozen=True)
class Config(ParallelOptions):
    """The options of ``seqjax train norm_placement`` (every norm × warm-up pair is one run).

    Attributes:
        norms: the norm placements to train, from ``pre`` and ``post`` (comma-separated).
        warmups: the linear warm-up lengths to train each placement with, in steps (0 = none).
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        block_size: context length ``T`` of every window (and the position table's length).
        batch_size: windows per step, over all devices (the global batch).
        steps: optimiser steps per run (the cosine schedule ends here).
        learning_rate: peak AdamW learning rate, after the warm-up (β₂ = 0.99).
        min_lr_ratio: the schedule's final rate as a fraction of the peak.
        weight_decay: AdamW's decoupled weight decay (matrices; not embeddings or vectors).
        clip_norm: global gradient-norm clip; 0 = none.
        eval_batches: random validation windows (batches) for each run's final validation loss.
        max_chars: use only the corpus's first N characters (0 = all; smoke runs).
        data_path: the corpus file or its folder; unset = ``$SEQJAX_DATA_DIR``, the user
            cache, a download, ``shared/data`` (``seqjax.data.corpora``).
        seed: initialisation and training windows (the same in every run); the validation
            windows use ``seed + 2``.
        tag: suffix of the output files' names (``norm_placement{tag}.md``/``.png``/``.json``);
            letters, digits, ``_``, ``-`` and ``.`` only.
        workdir: the report, plot, summary (``.json``) and ``run.json``; unset = none written.
        results_dir: also write the report and the plot here; unset = nowhere else.
    """

    norms: tuple[Norm, ...] = NORMS
    warmups: tuple[NonNegInt, ...] = (100, 0)
    model: ModelOptions = ModelOptions()
    block_size: PosInt = 64
    batch_size: PosInt = 16
    steps: NonNegInt = 500
    learning_rate: PosFloat = 2e-3
    min_lr_ratio: NonNegFloat = 0.1
    weight_decay: NonNegFloat = 0.1
    clip_norm: NonNegFloat = 0.0
    eval_batches: PosInt = 10
    max_chars: NonNegInt = 0
    data_path: str | None = None
    seed: int = 0
    tag: str = ""  # suffix of the output files (norm_placement{tag}.md/.png/.json)
    workdir: str | None = "workdirs/norm_placement"
    results_dir: str | None = None

    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)

    def __post_init__(self) -> None:  # at the door, before the work dir is written
        if not all(c.isalnum() or c in "_-." for c in self.tag):
            raise ValueError(f"--tag may hold letters, digits, '_', '-' and '.' only; got "
                             f"{self.tag!r}.")


PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"norms": ("post",), "warmups": (0,), "model.num_layers": 1, "model.num_heads": 2,
              "model.embed_dim": 16, "block_size": 16, "batch_size": 8, "steps": 3,
              "eval_batches": 1, "max_chars": 20000},
}


class NormLM(nn.Module):
    """Embeddings → ``num_layers`` causal blocks (pre- or post-norm) → vocabulary logits.

    Every weight, the residual (output) projections included, is drawn from ``N(0, 0.02)``
    in both placements (not GPT-2's ``0.02/√(2L)``): only where the norm sits differs."""

    norm: str
    vocab_size: int
    block_size: int
    embed_dim: int = 64
    num_heads: int = 4
    num_layers: int = 6

    @nn.compact
    def __call__(self, tokens_BxT: jax.Array, *, deterministic: bool = True) -> jax.Array:
        init = nn.initializers.normal(0.02)
        x_BxTxD = Embed(self.vocab_size, self.embed_dim, embedding_init=init,
                           name="token_embed")(tokens_BxT)
        x_BxTxD = LearnedPositionalEmbedding(self.block_size, embedding_init=init,
                                             name="pos_embed")(x_BxTxD)
        block = BlockConfig.decoder(self.num_heads, norm=self.norm, cross_attention=False,
                                    kernel_init=init)
        h_BxTxD = TransformerDecoder(config=block, num_layers=self.num_layers, name="decoder")(
            x_BxTxD, deterministic=deterministic)
        return nn.Dense(self.vocab_size, kernel_init=init, name="head")(h_BxTxD).astype(
            jnp.float32)


def norm_run(cfg: Config, norm: str, warmup: int, train_ids: np.ndarray,
             eval_batches: list[dict], vocab: int) -> Run:
    """One norm placement with one warm-up: the same initial draw, training windows and
    validation windows (global batches) in every run; named ``NORM_warmupW``, it writes
    nothing (its row is the result)."""
    m = cfg.model
    model = NormLM(norm, vocab, cfg.block_size, m.embed_dim, m.num_heads, m.num_layers)
    params = jax.jit(model.init)(jax.random.PRNGKey(cfg.seed),
                                 jnp.zeros((1, cfg.block_size), jnp.int32))["params"]
    apply_fn = flax_apply_fn(model)
    return Run(
        model=model, params=params, loss_fn=make_lm_loss(apply_fn),
        # this process's rows of each global batch of `batch_size` windows
        data=lambda par: LMWindowIterator(train_ids, par.local_batch_size(cfg.batch_size),
                                          cfg.block_size, seed=cfg.seed, **par.host_rows()),
        optimizer=OptimizerConfig(
            name="adamw", learning_rate=cfg.learning_rate, **warmup_cosine(cfg.steps, warmup),
            min_lr_ratio=cfg.min_lr_ratio, beta2=0.99, weight_decay=cfg.weight_decay,
            clip_norm=cfg.clip_norm),
        fit=FitConfig(steps=cfg.steps, log_every=1, best_metric=None, progress=False,
                      tensorboard=False, plot=False, handle_signals=False),
        divergence_is_result=True,  # a run that diverges is a row (``outcome``)
        batch_size=cfg.batch_size, seed=cfg.seed, eval_fn=make_lm_eval(apply_fn),
        eval_data=eval_batches, name=f"{norm}_warmup{warmup}", writes=False,
        evaluate=lambda t: outcome(t, norm, warmup))


def outcome(t: Trained, norm: str, warmup: int) -> dict:
    """A run's row: the validation loss, the training loss (at steps 50, 100, 200 and the
    mean of the last steps), the gradient norms and the curve; a run whose loss or
    gradient norm turned NaN/inf is ``"diverged"`` at that step (its curve ends before it,
    no validation loss)."""
    records = [r for r in t.records if "loss" in r]  # a diverged run's end before it
    diverged_at = t.diverged_at
    bad = diverged_at is not None
    val = None if bad else t.eval["eval/loss"]
    losses = np.asarray([r["loss"] for r in records])
    tail = max(1, min(50, len(losses) // 5))
    row = {
        "norm": norm, "warmup": warmup, "params": count_params(t.params),
        "status": "diverged" if bad else "completed", "diverged_at": diverged_at,
        "val_loss": val,
        "train_loss_tail": float(losses[-tail:].mean()) if len(losses) else None,
        "loss_at": {s: float(losses[s - 1]) for s in (50, 100, 200) if s <= len(losses)},
        "grad_norm_max": float(max(r["grad_norm"] for r in records)) if records else None,
        "grad_norm_first10": float(np.mean([r["grad_norm"] for r in records[:10]]))
        if records else None,
        "curve": [(r["step"], r["loss"], r["grad_norm"], r.get("lr")) for r in records],
        "train_s": t.seconds,
    }
    print(f"{norm:4s}-norm warm-up {warmup:4d}: loss@100 "
          f"{row['loss_at'].get(100, float('nan')):.3f}, final {row['train_loss_tail']}, "
          f"val {row['val_loss']}, {row['train_s']:.0f} s", flush=True)
    return row


def build(cfg: Config) -> Task:
    """One run per norm placement × warm-up (:func:`norm_run`, built when its turn comes);
    the report and the curves as the task's hooks."""
    started, load_before = time.perf_counter(), load_average()
    train_ids, val_ids, tok = load_data(cfg)
    eval_batches = estimate_windows([val_ids], cfg.batch_size, cfg.block_size, cfg.eval_batches,
                                    seed=cfg.seed + 2)
    runs = (norm_run(cfg, norm, warmup, train_ids, eval_batches, tok.vocab_size)
            for norm in cfg.norms for warmup in cfg.warmups)
    return Task(
        f"norm_placement{cfg.tag}", runs, started=started,
        summarize=lambda ts: {"runs": [t.results for t in ts],
                              "load_average": [load_before, load_average()]},
        report=lambda s: report(cfg, s["runs"], s["wall_s"],
                                command_line("norm_placement", cfg), tuple(s["load_average"])),
        files=lambda folder, s: plot_curves(cfg, s["runs"], folder))


def run(cfg: Config) -> dict:
    """Train every norm × warm-up run on every visible device; the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

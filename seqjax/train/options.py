"""The training options a recipe's ``Config`` inherits: one name, type and range for each.

:class:`TrainOptions` declares the options of one optimiser schedule — ``--steps``,
``--batch_size``, ``--learning_rate``, ``--warmup_steps``, ``--clip_norm``, ``--log_every`` —
once; an experiment's ``Config`` inherits them beside
:class:`~seqjax.train.parallel.ParallelOptions`::

    @dataclasses.dataclass(frozen=True)
    class Config(TrainOptions, ParallelOptions):
        steps: NonNegInt = 2000         # this recipe's default; the type is TrainOptions'
        hidden_size: PosInt = 128

and builds the run's optimiser and loop from them in one place,
``cfg.optimizer_config("adamw")`` and ``cfg.fit_config(best_metric=None)``: every field the
config shares by name with :class:`~seqjax.train.optim.OptimizerConfig` or
:class:`~seqjax.train.fit_parts.FitConfig` is handed down, under the recipes' one schedule
(:func:`warmup_cosine`).

A recipe restates a field only to give it its own default, with the same type (a test holds
every recipe to that). A recipe whose training is not one such schedule (several phases,
per-task step counts, no warm-up) declares the options it has, under these names and types.

**Off is 0.** A count, interval or threshold of ``0`` turns its option off: ``clip_norm=0``
= no clipping, ``warmup_steps=0`` = the full rate from the first step, ``eval_every=0`` =
evaluate only at the end, a sample count of 0 = no sample, and a cap of 0 (``max_chars``,
``max_tokens``, ``num_pairs``) = no cap. ``None`` (unset) never means off: it means "derived
from the other options", as each option documents (``--eval_batch_size``, ``--steps`` of a
recipe with per-task step counts); for a path it means "none".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seqjax._ranges import NonNegFloat, NonNegInt, PosFloat, PosInt
from seqjax.train.fit_parts import FitConfig
from seqjax.train.optim import _MUON_ONLY, OptimizerConfig

__all__ = ["TrainOptions", "warmup_cosine"]


def warmup_cosine(steps: int, warmup_steps: int) -> dict[str, Any]:
    """The recipes' one schedule, as :class:`OptimizerConfig` keywords: a linear warm-up of
    ``warmup_steps`` updates, then cosine decay until the run's last step. A run no longer
    than its warm-up stops inside it (the schedule is ``warmup_steps + 1`` long), as
    nanoGPT's ``get_lr`` and llm.c do."""
    return {"schedule": "warmup_cosine", "warmup_steps": warmup_steps,
            "steps": max(steps, warmup_steps + 1)}


def _shared(config: Any, cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``config``'s fields that ``cls`` has under the same name (but ``skip``)."""
    names = {f.name for f in dataclasses.fields(cls)} - set(skip)
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.name in names}


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """The options of one training schedule that the experiments share (``0`` = off).

    An experiment's ``Config`` inherits these fields
    (``class Config(TrainOptions, ParallelOptions)``) and may restate one with its own
    default, never with another type. Each recipe's docstring says which optimiser and
    schedule they drive.

    Attributes:
        steps: optimiser steps (the learning-rate schedule ends here; 0 = no training).
        batch_size: examples (windows, sequences, images) per step over all devices: the
            global batch.
        learning_rate: the peak learning rate, reached after the warm-up.
        warmup_steps: linear warm-up steps from 0 to ``learning_rate``; 0 = none.
        clip_norm: global gradient-norm clip ``g ← clip_norm · g/‖g‖`` when
            ``‖g‖ > clip_norm``; 0 = no clipping.
        log_every: steps between logged records (``metrics.jsonl``, the progress line).
    """

    steps: NonNegInt = 1000
    batch_size: PosInt = 32
    learning_rate: PosFloat = 3e-3
    warmup_steps: NonNegInt = 100
    clip_norm: NonNegFloat = 1.0
    log_every: PosInt = 100

    def optimizer_config(self, name: str = "adamw", **overrides: Any) -> OptimizerConfig:
        """This run's :class:`~seqjax.train.optim.OptimizerConfig` ``name``: the recipes'
        schedule (:func:`warmup_cosine` over ``steps``), and every field of this config that
        ``OptimizerConfig`` has by the same name (``learning_rate``, ``clip_norm``, and where
        a recipe has them ``min_lr_ratio``, ``beta1``, ``beta2``, ``weight_decay``,
        ``momentum``, ``ns_steps``, ``flat_optimizer``, ...); then ``overrides``.

        The one place a recipe's options become its optimiser: a recipe passes only what is
        not an option of its own (``no_decay=...``, a fixed ``min_lr_ratio``). Each optimiser
        gets only the options it reads: Muon's (``ns_steps``, ...) go to ``"muon"`` alone,
        ``momentum`` to ``"muon"`` and ``"sgd"``."""
        skip: tuple[str, ...] = ("name", "schedule", "steps", "warmup_steps")
        skip += () if name == "muon" else _MUON_ONLY
        skip += () if name in ("muon", "sgd") else ("momentum", "nesterov")
        shared = _shared(self, OptimizerConfig, skip)
        schedule = warmup_cosine(self.steps, self.warmup_steps)
        return OptimizerConfig(name=name, **{**shared, **schedule, **overrides})

    def fit_config(self, **overrides: Any) -> FitConfig:
        """This run's :class:`~seqjax.train.fit_parts.FitConfig`: every field of this config
        that ``FitConfig`` has by the same name (``steps``, ``log_every``, and where a recipe
        has them ``eval_every``, ``checkpoint_every``, ``progress``, ``steps_per_call``,
        ``prefetch``, ...); then ``overrides``."""
        return FitConfig(**{**_shared(self, FitConfig), **overrides})

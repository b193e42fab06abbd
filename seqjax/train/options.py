"""The training options a recipe's ``Config`` inherits: one name, type and range for each.

:class:`TrainOptions` declares one optimiser schedule's options (``--steps``,
``--batch_size``, ``--learning_rate``, ``--warmup_steps``, ``--clip_norm``, ``--log_every``)
once; an experiment's ``Config`` inherits them beside
:class:`~seqjax.train.parallel.ParallelOptions`::

    @dataclasses.dataclass(frozen=True)
    class Config(TrainOptions, ParallelOptions):
        steps: NonNegInt = 2000         # this recipe's default; the type is TrainOptions'
        hidden_size: PosInt = 128

and builds its optimiser and loop with ``cfg.optimizer_config("adamw")`` and
``cfg.fit_config(best_metric=None)``, which hand down every field shared by name with
:class:`~seqjax.train.optim.OptimizerConfig` or :class:`~seqjax.train.fit_parts.FitConfig`,
under the recipes' one schedule (:func:`warmup_cosine`). A recipe restates a field only to
change its default, keeping the type (a test checks); one whose training is not such a
schedule declares the options it has, under these names and types.

Off is 0: a count, interval or threshold of ``0`` turns its option off (``clip_norm=0`` no
clipping, ``warmup_steps=0`` full rate from the start, ``eval_every=0`` evaluate only at the
end, a sample count of 0 no sample, a cap of 0 — ``max_chars``, ``max_tokens``, ``num_pairs``
— no cap). ``None`` never means off: it means "derived from the other options", as each
option documents, or "none" for a path.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seqjax._ranges import NonNegFloat, NonNegInt, PosFloat, PosInt
from seqjax.train.fit_parts import FitConfig
from seqjax.train.optim import _MUON_ONLY, OptimizerConfig

__all__ = ["TrainOptions", "warmup_cosine"]


def warmup_cosine(steps: int, warmup_steps: int) -> dict[str, Any]:
    """The recipes' one schedule as :class:`OptimizerConfig` keywords: linear warm-up over
    ``warmup_steps`` updates, then cosine decay to the last step. A run no longer than its
    warm-up stops inside it (the schedule is ``warmup_steps + 1`` long), as nanoGPT's ``get_lr``
    and llm.c do."""
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

    A ``Config`` may restate one with its own default, never another type; each recipe's
    docstring says which optimiser and schedule they drive.

    Attributes:
        steps: optimiser steps (the learning-rate schedule ends here; 0 = no training).
        batch_size: examples (windows, sequences, images) per step over all devices.
        learning_rate: the peak learning rate, reached after the warm-up.
        warmup_steps: linear warm-up steps from 0 to ``learning_rate``; 0 = none.
        clip_norm: gradient-norm clip ``g ← clip_norm · g/‖g‖`` if ``‖g‖ > clip_norm``; 0 = off.
        log_every: steps between logged records (``metrics.jsonl``, the progress line).
    """

    steps: NonNegInt = 1000
    batch_size: PosInt = 32
    learning_rate: PosFloat = 3e-3
    warmup_steps: NonNegInt = 100
    clip_norm: NonNegFloat = 1.0
    log_every: PosInt = 100

    def optimizer_config(self, name: str = "adamw", **overrides: Any) -> OptimizerConfig:
        """This run's :class:`~seqjax.train.optim.OptimizerConfig` ``name``:
        :func:`warmup_cosine` over ``steps``, every field shared by name (``learning_rate``,
        ``clip_norm``, and where a recipe has them ``min_lr_ratio``, ``beta1``,
        ``weight_decay``, ``momentum``, ``ns_steps``, ...), then ``overrides`` (what is not a
        recipe option, e.g. ``no_decay=...``). Muon's options go to ``"muon"`` alone,
        ``momentum``/``nesterov`` to ``"muon"`` and ``"sgd"``."""
        skip: tuple[str, ...] = ("name", "schedule", "steps", "warmup_steps")
        skip += () if name == "muon" else _MUON_ONLY
        skip += () if name in ("muon", "sgd") else ("momentum", "nesterov")
        shared = _shared(self, OptimizerConfig, skip)
        schedule = warmup_cosine(self.steps, self.warmup_steps)
        return OptimizerConfig(name=name, **{**shared, **schedule, **overrides})

    def fit_config(self, **overrides: Any) -> FitConfig:
        """This run's :class:`~seqjax.train.fit_parts.FitConfig`: every field shared by name
        (``steps``, ``log_every``, ``eval_every``, ``steps_per_call``, ...), then ``overrides``."""
        return FitConfig(**{**_shared(self, FitConfig), **overrides})

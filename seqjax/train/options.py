"""The training options a recipe's ``Config`` inherits: one name, type and range for each.

:class:`TrainOptions` declares the options of one optimiser schedule — ``--steps``,
``--batch_size``, ``--learning_rate``, ``--warmup_steps``, ``--clip_norm``, ``--log_every`` —
once; an experiment's ``Config`` inherits them beside
:class:`~seqjax.train.parallel.ParallelOptions`::

    @dataclasses.dataclass(frozen=True)
    class Config(TrainOptions, ParallelOptions):
        steps: NonNegInt = 2000         # this recipe's default; the type is TrainOptions'
        hidden_size: PosInt = 128

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

from seqjax._ranges import NonNegFloat, NonNegInt, PosFloat, PosInt

__all__ = ["TrainOptions"]


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

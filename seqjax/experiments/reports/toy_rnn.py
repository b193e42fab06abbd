"""toy_rnn's report: the next-word table printed after training.

:func:`print_predictions` prints, for each position t of the sentence, the input word, the
target ``y_t = x_{t+1}`` and the model's predicted word ``argmax ŷ_t`` (``x`` marks a
miss), and returns the number of correct positions. ``pred`` comes from
:mod:`seqjax.experiments.toy_rnn` (its model's argmax); ``lexicon`` names the word indices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def print_predictions(
    x: np.ndarray, y: np.ndarray, pred: np.ndarray, lexicon: Sequence[str]
) -> int:
    """Print the table of the first sentence in ``x`` (one-hot, ``1×T×V``), its targets
    ``y`` (``1×T``) and predictions ``pred`` (``T``); return how many are correct."""
    correct = 0
    print(f"{'t':>2}  {'input':<14}{'target':<14}{'predicted':<14}")
    for t, (i, j) in enumerate(zip(x[0].argmax(-1), y[0]), start=1):
        ok = int(pred[t - 1]) == int(j)
        correct += ok
        guess = lexicon[pred[t - 1]]
        print(f"{t:>2}  {lexicon[i]:<14}{lexicon[j]:<14}{guess:<14}{'' if ok else 'x'}")
    return correct

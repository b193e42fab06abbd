"""MEDL §7.2 "Simple Concrete Toy Example": an Elman RNN learns one sentence.

Lexicon (alphabetical, d_V = 8): deep, engineering, learning, machine,
mathematical, of, statistics, the. The sentence "the mathematical engineering
of deep learning" is fed as one-hot vectors x_t = e_{w_t} (p = q = 8) and the
target is the next word, y_t = x_{t+1}. Hidden size m = 20 with a sigmoid
activation and a softmax output (MEDL (7.2)):

    h_t = sig(W_hh h_{t-1} + W_hx x_t + b_h),   ŷ_t = softmax(W_yh h_t + b_y)

which has 20·20 + 20·8 + 20 + 8·20 + 8 = 748 parameters. Trained with
cross-entropy averaged over time (MEDL (7.4)–(7.5)), BPTT (autodiff) and Adam,
through the seqjax.train loop (checkpoints and logs when --workdir is given), on every
visible device: the one sentence is the whole data set, so with ``D`` batch shards
(``data·fsdp`` of the mesh) each holds a copy of it — the token-mean loss and its gradient
are those of the one sentence, and on one device the batch is the sentence alone.

Run:  seqjax train toy_rnn                       (or: python -m seqjax.experiments.toy_rnn)
      seqjax train toy_rnn --smoke               (a few steps, for CI)
      seqjax train toy_rnn --workdir runs/toy    (checkpoints, metrics.jsonl, curves; resumes)
      seqjax eval --workdir runs/toy
      seqjax generate --workdir runs/toy --prompt "the mathematical" --max_new_tokens 4
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax.experiments._config import NonNegInt, PosFloat, PosInt, moved_into
from seqjax.experiments._kit import Run, Task, Trained, host_rows, train
from seqjax.experiments.reports.toy_rnn import print_predictions
from seqjax.nn import RNN, ElmanCell
from seqjax.train.checkpoint import restore_params
from seqjax.train.loop import FitConfig
from seqjax.train.losses import masked_cross_entropy, token_accuracy
from seqjax.train.optim import OptimizerConfig
from seqjax.train.parallel import Parallel, ParallelOptions
from seqjax.utils import count_params

LEXICON = sorted(
    ["deep", "engineering", "learning", "machine", "mathematical", "of", "statistics", "the"]
)
SENTENCE = "the mathematical engineering of deep learning".split()


@dataclass(frozen=True)
class ModelOptions:
    """The network of ``seqjax train toy_rnn``, the sigmoid Elman RNN (:class:`ToyRNN`):
    ``--model.KEY`` (defaults: MEDL §7.2's).

    Attributes:
        hidden_size: hidden units ``m`` of the sigmoid Elman RNN.
    """

    hidden_size: PosInt = 20


@dataclass(frozen=True)
class Config(ParallelOptions):
    """The options of ``seqjax train toy_rnn`` (defaults: MEDL §7.2's network).

    Attributes:
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        steps: Adam steps, each on the whole sentence.
        learning_rate: Adam's learning rate (constant).
        seed: parameter initialisation.
        log_every: steps between logged records (the printed lines, ``metrics.jsonl``).
        checkpoint_every: steps between checkpoints (with a ``workdir``); 0 = only at the end.
        progress: show a progress bar.
        workdir: checkpoints, ``metrics.jsonl``, curves and ``toy_rnn.json``; ``None`` =
            write nothing; rerun to resume.
    """

    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)

    model: ModelOptions = ModelOptions()
    steps: NonNegInt = 2000
    learning_rate: PosFloat = 0.05
    seed: int = 0
    log_every: PosInt = 100
    checkpoint_every: NonNegInt = 500
    progress: bool = True
    workdir: str | None = None


PRESETS = {"smoke": {"steps": 20, "log_every": 5, "checkpoint_every": 10}}


class ToyRNN(nn.Module):
    """Elman RNN with a sigmoid hidden layer and a softmax output layer (MEDL (7.2))."""

    hidden_size: int = 20
    vocab: int = len(LEXICON)

    @nn.compact
    def __call__(self, x_BxTxV: jax.Array) -> jax.Array:
        h_BxTxH = RNN(ElmanCell(self.hidden_size, activation=jax.nn.sigmoid))(x_BxTxV)
        return nn.Dense(self.vocab, name="output")(h_BxTxH)  # logits; softmax in the loss


def one_hot(words: list[str]) -> np.ndarray:
    """``[1, T, 8]`` one-hot rows of ``words`` (each must be in the lexicon)."""
    unknown = [w for w in words if w not in LEXICON]
    if unknown:
        raise ValueError(f"words {unknown} are not in the lexicon {LEXICON}.")
    ids = [LEXICON.index(w) for w in words]
    return np.eye(len(LEXICON), dtype=np.float32)[ids][None]


def make_data() -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([LEXICON.index(w) for w in SENTENCE])
    x_1xTxV = np.eye(len(LEXICON), dtype=np.float32)[ids[:-1]][None]
    y_1xT = ids[1:][None]
    return x_1xTxV, y_1xT


@partial(jax.jit, static_argnums=0)
def _init(model: ToyRNN, key: jax.Array, x: jax.Array) -> dict:
    return model.init(key, x)


@partial(jax.jit, static_argnums=0)
def _apply(model: ToyRNN, params: dict, x: jax.Array) -> jax.Array:
    return model.apply({"params": params}, x)


@partial(jax.jit, static_argnums=0)
def _loss(model: ToyRNN, params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    return masked_cross_entropy(model.apply({"params": params}, x), y)


def _model_config(cfg: Config) -> dict:
    return {"model": "ToyRNN", "hidden_size": cfg.model.hidden_size, "vocab": len(LEXICON)}


def build(cfg: Config) -> Task:
    """The one run: Adam on the one sentence (a copy per batch shard); the predictions."""
    x, y = make_data()
    model = ToyRNN(cfg.model.hidden_size)

    def loss_fn(p: dict, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
        logits = model.apply({"params": p}, batch["x"])
        return masked_cross_entropy(logits, batch["y"]), {
            "accuracy": token_accuracy(logits, batch["y"])
        }

    def sentence(par: Parallel) -> Callable[[int], dict]:
        # The sentence once per batch shard (and micro-batch): this process's copies of it.
        copies = par.batch_shards * par.grad_accum
        batch = host_rows(par, {"x": np.repeat(x, copies, 0), "y": np.repeat(y, copies, 0)})
        return lambda i: batch

    def predictions(t: Trained) -> dict:  # printed: the table and the count
        final_loss = float(_loss(model, t.params, x, y))
        print(f"\nparameters: {count_params(t.params)}")
        pred = np.asarray(jnp.argmax(_apply(model, t.params, x), -1))[0]
        correct = print_predictions(x, y, pred, LEXICON)
        print(f"\n{correct}/{len(y[0])} next words correct; final loss {final_loss:.4f}; "
              f"{t.seconds:.1f}s")
        return {"final_loss": final_loss, "correct": correct, "positions": len(y[0])}

    run_ = Run(
        model=model, params=_init(model, jax.random.PRNGKey(cfg.seed), x)["params"],
        loss_fn=loss_fn, data=sentence, batch_size=None, seed=cfg.seed,
        optimizer=OptimizerConfig(name="adam", learning_rate=cfg.learning_rate),
        fit=FitConfig(steps=cfg.steps, log_every=cfg.log_every, best_metric=None,
                      checkpoint_every=cfg.checkpoint_every, progress=cfg.progress,
                      print_logs=True),
        model_config=_model_config(cfg), evaluate=predictions)
    return Task("toy_rnn", [run_], summarize=lambda trained: {
        **trained[0].results, "curve": [(r["step"], r["loss"]) for r in trained[0].records]})


def run(cfg: Config) -> dict:
    """Train the toy RNN on the sentence (resuming from ``cfg.workdir``); the summary."""
    return train(build(cfg), cfg)


def _restore(cfg: Config) -> tuple[ToyRNN, dict]:
    if not cfg.workdir:
        raise ValueError("`workdir` is required: the checkpoint to load.")
    return ToyRNN(cfg.model.hidden_size), restore_params(os.path.join(cfg.workdir, "checkpoints"))


def evaluate(cfg: Config) -> dict:
    """Loss and next-word accuracy of the checkpoint in ``cfg.workdir`` on the sentence."""
    model, params = _restore(cfg)
    x, y = make_data()
    logits = _apply(model, params, x)
    return {
        "loss": float(_loss(model, params, x, y)),
        "accuracy": float(token_accuracy(logits, y)),
        "positions": int(y.size),
    }


def generate(
    cfg: Config, prompt: str, *, max_new_tokens: int = 5, temperature: float = 0.0, seed: int = 0
) -> str:
    """Continue ``prompt`` (lexicon words) word by word: argmax, or sampling at ``temperature``."""
    model, params = _restore(cfg)
    words = prompt.lower().split()
    if not words:
        raise ValueError("`prompt` must hold at least one lexicon word.")
    key = jax.random.PRNGKey(seed)
    for _ in range(max_new_tokens):
        logits = _apply(model, params, one_hot(words))[0, -1]
        if temperature > 0:
            key, sub = jax.random.split(key)
            nxt = int(jax.random.categorical(sub, logits / temperature))
        else:
            nxt = int(jnp.argmax(logits))
        words.append(LEXICON[nxt])
    return " ".join(words)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

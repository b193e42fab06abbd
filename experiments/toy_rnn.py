"""MEDL §7.2 "Simple Concrete Toy Example": an Elman RNN learns one sentence.

Lexicon (alphabetical, d_V = 8): deep, engineering, learning, machine,
mathematical, of, statistics, the. The sentence "the mathematical engineering
of deep learning" is fed as one-hot vectors x_t = e_{w_t} (p = q = 8) and the
target is the next word, y_t = x_{t+1}. Hidden size m = 20 with a sigmoid
activation and a softmax output (MEDL (7.2)):

    h_t = sig(W_hh h_{t-1} + W_hx x_t + b_h),   ŷ_t = softmax(W_yh h_t + b_y)

which has 20·20 + 20·8 + 20 + 8·20 + 8 = 748 parameters. Trained with
cross-entropy averaged over time (MEDL (7.4)–(7.5)) and BPTT (autodiff).

Run:  python -m experiments.toy_rnn            (or: seqjax train toy_rnn)
      python -m experiments.toy_rnn --smoke    (a few steps, for CI)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from seqjax.nn import RNN, ElmanCell
from seqjax.utils import count_params

LEXICON = sorted(
    ["deep", "engineering", "learning", "machine", "mathematical", "of", "statistics", "the"]
)
SENTENCE = "the mathematical engineering of deep learning".split()


@dataclass(frozen=True)
class Config:
    hidden: int = 20
    steps: int = 2000
    learning_rate: float = 0.05
    seed: int = 0
    log_every: int = 100
    workdir: str | None = None


class ToyRNN(nn.Module):
    """Elman RNN with a sigmoid hidden layer and a softmax output layer (MEDL (7.2))."""

    hidden: int = 20
    vocab: int = len(LEXICON)

    @nn.compact
    def __call__(self, x_BxTxV: jax.Array) -> jax.Array:
        h_BxTxH = RNN(ElmanCell(self.hidden, activation=jax.nn.sigmoid))(x_BxTxV)
        return nn.Dense(self.vocab, name="output")(h_BxTxH)  # logits; softmax in the loss


def make_data() -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([LEXICON.index(w) for w in SENTENCE])
    x_1xTxV = np.eye(len(LEXICON), dtype=np.float32)[ids[:-1]][None]
    y_1xT = ids[1:][None]
    return x_1xTxV, y_1xT


def run(cfg: Config) -> dict:
    x, y = make_data()
    model = ToyRNN(cfg.hidden)
    params = model.init(jax.random.PRNGKey(cfg.seed), x)
    n_params = count_params(params)
    opt = optax.adam(cfg.learning_rate)
    opt_state = opt.init(params)

    def loss_fn(p):
        logits = model.apply(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def step(p, s):
        loss, g = jax.value_and_grad(loss_fn)(p)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss

    start = time.perf_counter()
    curve = []
    for i in range(cfg.steps):
        params, opt_state, loss = step(params, opt_state)
        if i % cfg.log_every == 0 or i == cfg.steps - 1:
            curve.append((i, float(loss)))
            print(f"step {i:5d}  loss {float(loss):.4f}")
    wall = time.perf_counter() - start

    pred = np.asarray(jnp.argmax(model.apply(params, x), -1))[0]
    correct = 0
    print(f"\nparameters: {n_params}")
    print(f"{'t':>2}  {'input':<14}{'target':<14}{'predicted':<14}")
    for t, (i, j) in enumerate(zip(x[0].argmax(-1), y[0]), start=1):
        ok = int(pred[t - 1]) == int(j)
        correct += ok
        print(f"{t:>2}  {LEXICON[i]:<14}{LEXICON[j]:<14}{LEXICON[pred[t - 1]]:<14}{'' if ok else 'x'}")
    result = {
        "config": asdict(cfg),
        "params": n_params,
        "final_loss": curve[-1][1],
        "correct": correct,
        "positions": len(y[0]),
        "wall_s": wall,
        "curve": curve,
    }
    print(f"\n{correct}/{len(y[0])} next words correct; final loss {curve[-1][1]:.4f}; "
          f"{wall:.1f}s")
    if cfg.workdir:
        os.makedirs(cfg.workdir, exist_ok=True)
        with open(os.path.join(cfg.workdir, "toy_rnn.json"), "w") as f:
            json.dump(result, f, indent=1)
        _plot(curve, os.path.join(cfg.workdir, "toy_rnn_loss.png"))
    return result


def _plot(curve: list[tuple[int, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, losses = zip(*curve)
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.semilogy(steps, losses)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title("MEDL §7.2 toy RNN")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="toy_rnn", description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a few steps, for CI")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    steps = args.steps if args.steps is not None else (20 if args.smoke else Config.steps)
    cfg = Config(steps=steps, seed=args.seed, workdir=args.workdir,
                 log_every=5 if args.smoke else Config.log_every)
    return run(cfg)


if __name__ == "__main__":
    main()

r"""BPTT and vanishing/exploding gradients; the adding problem with Elman, LSTM and GRU.

**Part A — ‖∂L/∂h_t‖ against the distance T − t** (MEDL §7.2, (7.11)–(7.13); the slides'
BPTT bound). The adjoint ``ζ_t = ∂L/∂h_t`` obeys ``ζ_t = (∂h_{t+1}/∂h_t)ᵀ ζ_{t+1}`` with
``∂h_{t+1}/∂h_t = diag(σ'(·)) W_hh`` (MEDL (7.11)); with the identity activation and no
input or bias it is ``ζ_t = (W_hhᵀ)^{T−t} ζ_T`` (MEDL (7.12)), so its size is governed by
the spectral radius ``ρ`` of ``W_hh``. The slides bound it by
``‖∂h_T/∂h_t‖ ≤ ∏ ‖Wᵀ‖ ‖diag σ'‖ ≤ (‖W_hh‖₂ · max σ')^{T−t}``. Here ``W_hh = ρ Q`` with
``Q`` orthogonal (so ``‖W_hh‖₂ = ρ`` and, for the linear RNN, ``‖ζ_t‖ = ρ^{T−t}‖ζ_T‖``
exactly) for ``ρ`` below, at and above 1; the loss is a random linear read-out of
``h_T``; ``ζ_t`` is computed by autodiff (BPTT through ``lax.scan``) as the gradient of
the loss with respect to a zero perturbation added to ``h_t``. The same is measured
for LSTM and GRU cells at initialisation, and for the models trained in part B.

**Part B — the adding problem** (Hochreiter & Schmidhuber 1997; Le, Jaitly & Hinton 2015;
:func:`seqjax.data.synthetic.adding_problem`) at ``T ∈ {50, 100, 200, 400}``: Elman (tanh)
vs LSTM vs GRU (:class:`seqjax.models.rnn.RNNClassifier`, one layer, last hidden state →
linear read-out), Adam, fresh random batches every step, with gradient clipping
(global norm 1, the slides' ``g ← η g/‖g‖``) on and off. Test MSE on held-out sequences
against the baseline 0.167 of always predicting 1 (the sum's mean). The models train on
every visible device (and host), data parallel unless ``--mesh`` / ``--strategy`` say
otherwise; ``batch_size`` is the global batch.

Run:  python -m seqjax.experiments.gradients --results_dir seqjax/experiments/results   (full)
      python -m seqjax.experiments.gradients --smoke --workdir /tmp/g             (seconds)
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax.data.synthetic import adding_problem
from seqjax.experiments._kit import (
    command_line,
    host_rows,
    init_state,
    load_average,
    machine,
    pad_rows,
    write_run_info,
)
from seqjax.models.rnn import RNNClassifier
from seqjax.nn.cells import ElmanCell, GRUCell, LSTMCell
from seqjax.train.loop import FitConfig, fit
from seqjax.train.optim import OptimizerConfig
from seqjax.train.parallel import Parallel, ParallelOptions
from seqjax.train.records import NonFiniteLossError
from seqjax.utils import count_params

ADDING_BASELINE_MSE = 1.0 / 6.0  # always predict 1: Var(u_1 + u_2) = 2/12
CELLS = ("elman", "lstm", "gru")


@dataclass(frozen=True)
class Config(ParallelOptions):
    """The options of ``seqjax train gradients`` (part A: gradient norms; B: the adding problem).

    Attributes:
        hidden: hidden units of every cell (parts A and B).
        distance_steps: sequence length ``T`` of the part A profiles.
        radii: spectral radii ``ρ`` of ``W_hh = ρQ`` of the Elman profiles.
        input_size: size of the Gaussian inputs of part A.
        input_scales: standard deviations of those inputs, one tanh profile each (the first
            also feeds the LSTM and GRU profiles).
        profile_batch: sequences averaged per profile (part A and the trained models).
        gated_at_init: also profile an LSTM (forget bias 1) and a GRU at initialisation.
        lengths: adding-problem sequence lengths ``T``.
        cells: the cells trained on the adding problem, each ``elman``, ``lstm`` or ``gru``.
        clipping: the clipping settings run (``True`` = on, ``False`` = off).
        no_clip_lengths: the lengths at which the clipping-off runs happen; ``None`` = all.
        clip_norm: global gradient-norm threshold of the clipping-on runs (and of the
            ``clipped`` fraction reported).
        steps: Adam steps per adding-problem run.
        batch_size: fresh sequences per step, over all devices (the global batch).
        learning_rate: Adam's learning rate (constant).
        test_examples: held-out sequences of the test MSE.
        eval_every: steps between test-MSE evaluations (0 = only at the end).
        profile_length: the ``T`` whose trained clipping-on models are profiled (a length
            not in ``lengths``, such as 0, = none).
        seed: part A's inputs, read-out and initialisation; part B's initialisation and
            batches (offset per length and cell; the test sets do not depend on it).
        workdir: ``run.json``, the plots, ``gradients.md`` and ``gradients.json``; ``None`` =
            nothing written.
        results_dir: also write the plots and ``gradients.md`` here; ``None`` = not.
    """

    hidden: int = 32
    # part A
    distance_steps: int = 300
    radii: tuple[float, ...] = (0.8, 1.0, 1.2, 2.0)
    input_size: int = 8
    input_scales: tuple[float, ...] = (0.1, 1.0)
    profile_batch: int = 32
    gated_at_init: bool = True
    # part B
    lengths: tuple[int, ...] = (50, 100, 200, 400)
    cells: tuple[str, ...] = CELLS
    clipping: tuple[bool, ...] = (True, False)
    no_clip_lengths: tuple[int, ...] | None = None  # clipping-off runs only at these T
    clip_norm: float = 1.0
    steps: int = 1000
    batch_size: int = 32
    learning_rate: float = 3e-3
    test_examples: int = 1000
    eval_every: int = 100
    profile_length: int = 200
    seed: int = 0
    workdir: str | None = "workdirs/gradients"
    results_dir: str | None = None


PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"hidden": 8, "distance_steps": 12, "radii": (1.2,), "input_scales": (1.0,),
              "profile_batch": 2,
              "gated_at_init": False, "lengths": (10,), "cells": ("lstm",),
              "clipping": (True,), "steps": 3, "batch_size": 8, "test_examples": 16,
              "eval_every": 0, "profile_length": 0},
}


# ----------------------------------------------------------------------------- part A


def scaled_orthogonal(radius: float) -> Any:
    """Initialiser ``ρ Q`` (``Q`` orthogonal): spectral radius and spectral norm both ``ρ``."""
    base = nn.initializers.orthogonal()

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return radius * base(key, shape, dtype)

    return init


def _h(carry: Any) -> jax.Array:
    return carry[1] if isinstance(carry, tuple) else carry


def _add_h(carry: Any, d: jax.Array) -> Any:
    return (carry[0], carry[1] + d) if isinstance(carry, tuple) else carry + d


def adjoint_norms(
    cell: nn.Module, cell_params: Any, x_BxTxP: jax.Array,
    readout: Any,
) -> np.ndarray:
    """``‖ζ_t‖ = ‖∂L/∂h_t‖`` for ``t = 1..T`` (mean over the batch), ``L = Σ_b readout(h_T)_b``.

    The rows are independent, so row ``b``'s gradient is that of its own loss ``L_b``.

    ``ζ_t`` is the gradient with respect to a perturbation ``δ_t = 0`` added to the hidden
    state after step ``t`` (for an LSTM, to ``h_t`` of the carry ``(c_t, h_t)``).
    """
    batch, steps, _ = x_BxTxP.shape
    carry0 = cell.initialize_carry(jax.random.PRNGKey(0), x_BxTxP[:, 0].shape)
    hidden = _h(carry0).shape[-1]

    def loss(deltas_TxBxH: jax.Array) -> jax.Array:
        def body(carry: Any, inp: tuple) -> tuple:
            x_BxP, d_BxH = inp
            carry, _ = cell.apply({"params": cell_params}, carry, x_BxP)
            return _add_h(carry, d_BxH), None

        carry, _ = jax.lax.scan(body, carry0, (jnp.swapaxes(x_BxTxP, 0, 1), deltas_TxBxH))
        return jnp.sum(readout(_h(carry)))

    dtype = _h(carry0).dtype
    zeta_TxBxH = jax.jit(jax.grad(loss))(jnp.zeros((steps, batch, hidden), dtype))
    return np.linalg.norm(np.asarray(zeta_TxBxH, np.float64), axis=-1).mean(axis=1)


def part_a(cfg: Config) -> dict:
    """Gradient-norm profiles at initialisation: Elman (linear, tanh) × radii, LSTM, GRU.

    Computed in float64: over 300 steps the norms span more than float32's range
    (e.g. 0.5^300 ≈ 1e-90).
    """
    with jax.enable_x64(True):
        return _part_a(cfg)


def _part_a(cfg: Config) -> dict:
    f64 = jnp.float64
    key = jax.random.PRNGKey(cfg.seed)
    k_x, k_w, k_init = jax.random.split(key, 3)
    x = jax.random.normal(k_x, (cfg.profile_batch, cfg.distance_steps, cfg.input_size), f64)
    w_H = jax.random.normal(k_w, (cfg.hidden,), f64) / np.sqrt(cfg.hidden)
    readout = lambda h_BxH: h_BxH @ w_H  # noqa: E731
    carry_x = x[:, 0]
    profiles: dict[str, list[float]] = {}
    variants = [("linear, x=0 (MEDL 7.12)", lambda z: z, jnp.zeros_like(x))]
    variants += [(f"tanh, x~N(0,{s:g}²)", jnp.tanh, s * x) for s in cfg.input_scales]
    for rho in cfg.radii:
        for act_name, act, inputs in variants:
            cell = ElmanCell(cfg.hidden, activation=act, param_dtype=f64,
                             recurrent_kernel_init=scaled_orthogonal(rho),
                             bias_init=nn.initializers.zeros_init())
            params = cell.init(k_init, cell.initialize_carry(k_init, carry_x.shape), carry_x)
            profiles[f"elman {act_name}, rho={rho:g}"] = adjoint_norms(
                cell, params["params"], inputs, readout).tolist()
    gated = (("lstm (b_f=1), init", LSTMCell(cfg.hidden, forget_bias=1.0, param_dtype=f64)),
             ("gru, init", GRUCell(cfg.hidden, param_dtype=f64)))
    for name, cell in gated if cfg.gated_at_init else ():
        params = cell.init(k_init, cell.initialize_carry(k_init, carry_x.shape), carry_x)
        scale = cfg.input_scales[0]
        profiles[f"{name}, x~N(0,{scale:g}²)"] = adjoint_norms(
            cell, params["params"], scale * x, readout).tolist()
    return profiles


def ratio_at(profile: list[float], d: int) -> float:
    """``‖ζ_{T−d}‖ / ‖ζ_T‖`` (``d = 0`` is the last step)."""
    p = np.asarray(profile)
    return float(p[len(p) - 1 - d] / p[-1])


# ----------------------------------------------------------------------------- part B


def _adding_model(cell: str, hidden: int) -> RNNClassifier:
    kwargs = (("forget_bias", 1.0),) if cell == "lstm" else None
    return RNNClassifier(num_classes=1, vocab_size=None, hidden_size=hidden, cell_type=cell,
                         pooling="last", cell_kwargs=kwargs)


def _mse_fn(model: RNNClassifier) -> Any:
    def mse(params: Any, batch: dict) -> jax.Array:
        pred_B = model.apply({"params": params}, batch["inputs"])[:, 0]
        return jnp.mean((pred_B - batch["targets"]) ** 2)

    return mse


def _masked_mse_fn(model: RNNClassifier) -> Any:
    """Mean squared error over the rows with ``mask`` True (padding rows weigh nothing)."""

    def mse(params: Any, batch: dict) -> dict:
        pred_B = model.apply({"params": params}, batch["inputs"])[:, 0]
        keep_B = batch["mask"]
        n = jnp.sum(keep_B).astype(jnp.float32)
        # A padding row "predicts" its target (zero error); without padding this is the
        # same float32 sum as `jnp.mean` in `_mse_fn`, to the last bit.
        pred_B = jnp.where(keep_B, pred_B, batch["targets"])
        return {"loss": jnp.sum((pred_B - batch["targets"]) ** 2) / jnp.maximum(n, 1.0),
                "tokens": n}

    return mse


def train_adding(cfg: Config, cell: str, length: int, clip: bool,
                 par: Parallel | None = None) -> dict:
    """Train one model on the adding problem on ``par``'s devices (default: every visible
    device); returns curves, test MSE and gradient stats."""
    par = Parallel.create() if par is None else par
    model = _adding_model(cell, cfg.hidden)
    seed = cfg.seed + 1000 * length + 10 * CELLS.index(cell)
    test = adding_problem(cfg.test_examples, length, seed=10_000_019 + length)
    # Global evaluation batches, the last padded to split over the devices.
    test_batches = [pad_rows({"inputs": test["inputs"][i : i + 250],
                              "targets": test["targets"][i : i + 250],
                              "mask": np.ones(len(test["targets"][i : i + 250]), bool)},
                             par.batch_shards, {"mask": False})
                    for i in range(0, cfg.test_examples, 250)]
    params = jax.jit(model.init)(jax.random.PRNGKey(seed), test["inputs"][:1])["params"]
    opt = OptimizerConfig(
        "adam", learning_rate=cfg.learning_rate, clip_norm=cfg.clip_norm if clip else None)
    state, schedule = init_state(par, params, opt, jax.random.PRNGKey(seed))
    mse = _mse_fn(model)
    step = par.train_step(lambda p, b, rng: (mse(p, b), {}), schedule=schedule)
    eval_step = par.eval_step(_masked_mse_fn(model))
    rng = np.random.default_rng(seed)
    par.check_batch_size(cfg.batch_size)

    def batches(i: int) -> dict:
        # Every process draws the same global batch and feeds its own rows of it.
        d = adding_problem(cfg.batch_size, length, seed=rng)
        return host_rows(par, {"inputs": d["inputs"], "targets": d["targets"]})

    grad_norms: list[float] = []
    start = time.perf_counter()
    status, diverged_at = "completed", None
    try:
        result = fit(state, step, batches,
                     FitConfig(num_steps=cfg.steps, log_every=1, eval_every=cfg.eval_every,
                               best_metric=None, progress=False, tensorboard=False, plot=False,
                               handle_signals=False),
                     eval_step=eval_step, eval_data=test_batches,
                     hooks=[lambda r: grad_norms.append(r["grad_norm"])], parallel=par)
        history = result.history
        final_params = par.gather(result.state.params)
    except NonFiniteLossError as err:
        status, diverged_at, history, final_params = "diverged", err.step, [], None
    wall = time.perf_counter() - start
    curve = [(r["step"], r["eval/loss"]) for r in history if "eval/loss" in r]
    train_curve = [(r["step"], r["loss"]) for r in history]
    g = np.asarray(grad_norms) if grad_norms else np.zeros(1)
    out = {
        "cell": cell, "length": length, "clip": clip, "status": status,
        "diverged_at": diverged_at, "params": count_params(params),
        "test_mse": curve[-1][1] if curve else float("nan"), "curve": curve,
        "train_curve": train_curve[:: max(1, len(train_curve) // 100)],
        "grad_norm_median": float(np.median(g)), "grad_norm_max": float(g.max()),
        "clipped_fraction": float((g > cfg.clip_norm).mean()), "wall_s": wall,
    }
    if final_params is not None and length == cfg.profile_length and clip:
        out["profile"] = trained_profile(model, final_params, test, cfg)
    return out


def trained_profile(model: RNNClassifier, params: Any, test: dict, cfg: Config) -> list[float]:
    """``‖∂L/∂h_t‖`` of the trained model's squared error on test sequences (float64)."""
    with jax.enable_x64(True):
        f64 = jnp.float64
        params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, f64), params)
        cell_params = params["encoder"]["rnn"]["layer_0"]["cell"]
        cls = {"elman": ElmanCell, "lstm": LSTMCell, "gru": GRUCell}[model.cell_type]
        x = jnp.asarray(test["inputs"][: cfg.profile_batch], f64)
        y = jnp.asarray(test["targets"][: cfg.profile_batch], f64)
        return _trained_profile(cls(cfg.hidden, param_dtype=f64), cell_params,
                                params["classifier"], x, y)


def _trained_profile(cell_mod: nn.Module, cell_params: Any, head: Any, x: jax.Array,
                     y: jax.Array) -> list[float]:

    def readout(h_BxH: jax.Array) -> jax.Array:
        # Per-row squared errors; rows are independent, so the gradient of their sum with
        # respect to row b's h_t is that of row b's own loss.
        return ((h_BxH @ head["kernel"])[:, 0] + head["bias"][0] - y) ** 2

    return adjoint_norms(cell_mod, cell_params, x, readout).tolist()


# ----------------------------------------------------------------------------- report


def _plots(cfg: Config, profiles: dict, runs: list[dict], outdir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.9, wspace=0.22)
    colors = {r: c for r, c in zip(cfg.radii, ("tab:blue", "tab:green", "tab:red", "tab:purple"))}
    ax = axes[0]
    for name, prof in profiles.items():
        if not name.startswith("elman"):
            continue
        rho = float(name.rsplit("=", 1)[1])
        p = np.asarray(prof)
        d = np.arange(len(p))[::-1]
        style = "--" if "linear" in name else ("-" if f"{cfg.input_scales[0]:g}²" in name
                                               else "-.")
        ax.plot(d, p / p[-1], color=colors.get(rho, "k"), ls=style, lw=1.2,
                label=name.replace("elman ", ""))
    d = np.arange(cfg.distance_steps)
    for rho in cfg.radii:
        ax.plot(d, float(rho) ** d, color=colors.get(rho, "k"), ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_ylim(1e-100, 1e100)
    ax.set_xlabel("distance T − t")
    ax.set_ylabel("‖∂L/∂h_t‖ / ‖∂L/∂h_T‖")
    ax.set_title("Elman, W_hh = ρQ (dotted: ρ^(T−t), the bound)")
    ax.legend(fontsize=6, loc="lower left", ncol=2)
    ax.grid(alpha=0.3)
    ax = axes[1]
    for name, prof in profiles.items():
        if name.startswith("elman"):
            continue
        p = np.asarray(prof)
        ax.plot(np.arange(len(p))[::-1], p / p[-1], label=name)
    for r in runs:
        if "profile" in r:
            p = np.asarray(r["profile"])
            ax.plot(np.arange(len(p))[::-1], p / p[-1], ls="--",
                    label=f"{r['cell']} trained, adding T={r['length']}")
    ax.set_yscale("log")
    ax.set_xlabel("distance T − t")
    ax.set_title("gated cells at init (solid) and trained (dashed)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower left")
    ax.grid(alpha=0.3)
    path = os.path.join(outdir, "gradients_distance.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    paths.append(path)

    lengths = sorted({r["length"] for r in runs})
    fig, axes = plt.subplots(1, len(lengths), figsize=(3.2 * len(lengths) + 1, 3.4),
                             squeeze=False, sharey=True)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.15, top=0.88, wspace=0.25)
    cc = {"elman": "tab:red", "lstm": "tab:blue", "gru": "tab:green"}
    for ax, length in zip(axes[0], lengths):
        for r in runs:
            if r["length"] != length or not r["curve"]:
                continue
            s, m = zip(*r["curve"])
            ax.plot(s, m, color=cc[r["cell"]], ls="-" if r["clip"] else "--",
                    label=f"{r['cell']} {'clip' if r['clip'] else 'no clip'}")
        ax.axhline(ADDING_BASELINE_MSE, color="k", lw=0.8, ls=":", label="baseline 0.167")
        ax.set_yscale("log")
        ax.set_ylim(3e-3, 0.4)
        ax.set_title(f"adding problem, T = {length}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test MSE")
    axes[0][0].legend(fontsize=7, loc="lower left")
    path = os.path.join(outdir, "gradients_adding.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    paths.append(path)
    return paths


def report(cfg: Config, profiles: dict, runs: list[dict], wall: float, command: str,
           loads: tuple[str, str]) -> str:
    dists = [d for d in (1, 10, 50, 100, 200, cfg.distance_steps - 1) if d < cfg.distance_steps]
    lines = [
        "# gradients — BPTT, vanishing/exploding gradients, the adding problem",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}  ",
        f"Wall time: {wall / 60:.1f} min (load average {loads[0]} before, {loads[1]} after; "
        "the 2 cores were shared with other jobs).",
        "",
        "## A. ‖∂L/∂h_t‖ against the distance T − t (MEDL (7.11)–(7.13))",
        "",
        f"Hidden size {cfg.hidden}, T = {cfg.distance_steps} (MEDL's T = 300 example), "
        f"batch {cfg.profile_batch} of Gaussian inputs of size {cfg.input_size} (scaled by "
        f"{', '.join(f'{v:g}' for v in cfg.input_scales)}: small inputs keep tanh near its "
        "linear regime, N(0, 1) inputs saturate it); "
        "W_hh = ρQ with Q orthogonal (‖W_hh‖₂ = ρ); L = wᵀh_T with a random w. "
        "Entries: ‖∂L/∂h_{T−d}‖ / ‖∂L/∂h_T‖ (mean over the batch), computed by autodiff. "
        "For the linear RNN without input MEDL (7.12) predicts exactly ρ^d; the slides' "
        "bound for tanh (max σ' = 1) is the same ρ^d.",
        "",
        "| model | " + " | ".join(f"d={d}" for d in dists) + " |",
        "|---|" + "---:|" * len(dists),
    ]
    for name, prof in profiles.items():
        lines.append(f"| {name} | " + " | ".join(f"{ratio_at(prof, d):.3g}" for d in dists)
                     + " |")
    for rho in cfg.radii:
        lines.append(f"| ρ^d, ρ={rho:g} | " + " | ".join(f"{float(rho) ** d:.3g}" for d in dists)
                     + " |")
    trained = [r for r in runs if "profile" in r]
    if trained:
        lines += ["", f"Trained on the adding problem (T = {cfg.profile_length}, clipping on; "
                  "L = squared error of one test sequence, mean over "
                  f"{cfg.profile_batch} sequences):", "",
                  "| model | " + " | ".join(f"d={d}" for d in dists
                                           if d < cfg.profile_length) + " |",
                  "|---|" + "---:|" * len([d for d in dists if d < cfg.profile_length])]
        for r in trained:
            lines.append(f"| {r['cell']} (test MSE {r['test_mse']:.4f}) | " + " | ".join(
                f"{ratio_at(r['profile'], d):.3g}" for d in dists if d < cfg.profile_length)
                + " |")
    lines += [
        "",
        "![gradient norms](gradients_distance.png)",
        "",
        "## B. The adding problem (baseline: MSE 0.167 by always predicting 1)",
        "",
        f"One recurrent layer of {cfg.hidden} units, last hidden state → linear read-out; Adam "
        f"{cfg.learning_rate:g}, {cfg.steps} steps × batch {cfg.batch_size} of fresh sequences; "
        f"test MSE on {cfg.test_examples} held-out sequences. Clipping: global norm "
        f"{cfg.clip_norm:g}. `clipped` is the fraction of steps whose gradient norm exceeded "
        f"{cfg.clip_norm:g}.",
        "",
        "| T | cell | clipping | params | test MSE | vs 0.167 | median ‖g‖ | max ‖g‖ | clipped "
        "| train s |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(runs, key=lambda r: (r["length"], r["cell"], not r["clip"])):
        mse = r["test_mse"]
        status = (f"diverged at step {r['diverged_at']}" if r["status"] == "diverged"
                  else f"{mse:.4f}")
        rel = "" if r["status"] == "diverged" else f"{mse / ADDING_BASELINE_MSE:.2f}×"
        lines.append(
            f"| {r['length']} | {r['cell']} | {'on' if r['clip'] else 'off'} | {r['params']:,} | "
            f"{status} | {rel} | {r['grad_norm_median']:.3g} | {r['grad_norm_max']:.3g} | "
            f"{r['clipped_fraction']:.0%} | {r['wall_s']:.0f} |")
    lines += ["", "![adding problem](gradients_adding.png)", ""]
    return "\n".join(lines)


def run(cfg: Config) -> dict:
    for c in cfg.cells:
        if c not in CELLS:
            raise ValueError(f"`cells` must be drawn from {CELLS}; got {c!r}.")
    par = Parallel.from_options(cfg)  # every visible device (and host), unless --mesh says
    par.check_batch_size(cfg.batch_size)
    write_run_info(par, cfg.workdir)
    loads = [load_average()]
    start = time.perf_counter()
    profiles = part_a(cfg)
    print("part A (ratio ‖ζ_{T-d}‖/‖ζ_T‖ at d = 1, T-1):")
    for name, prof in profiles.items():
        print(f"  {name:40s} {ratio_at(prof, 1):.3g}  {ratio_at(prof, len(prof) - 1):.3g}")
    runs = []
    for length in cfg.lengths:
        for cell in cfg.cells:
            for clip in cfg.clipping:
                if not clip and cfg.no_clip_lengths is not None and \
                        length not in cfg.no_clip_lengths:
                    continue
                r = train_adding(cfg, cell, length, clip, par)
                print(f"adding T={length:4d} {cell:6s} clip={'on ' if clip else 'off'} "
                      f"test MSE {r['test_mse']:.4f} ({r['status']}), max |g| "
                      f"{r['grad_norm_max']:.3g}, {r['wall_s']:.0f} s", flush=True)
                runs.append(r)
    wall = time.perf_counter() - start
    loads.append(load_average())
    summary = {"config": dataclasses.asdict(cfg), "profiles": profiles, "runs": runs,
               "wall_s": wall, "machine": machine(), "parallel": par.describe(),
               "load_average": loads}
    command = command_line("gradients", cfg)
    write_outputs(cfg, "gradients", summary,
                  lambda outdir: _plots(cfg, profiles, runs, outdir),
                  report(cfg, profiles, runs, wall, command, (loads[0], loads[1])))
    return summary


def write_outputs(cfg: Any, name: str, summary: dict, plot: Any, markdown: str) -> None:
    """``NAME.json``, ``NAME.md`` and the plots into the work dir and/or ``results_dir``
    (process 0 of a multi-process job writes them)."""
    if jax.process_index() != 0:
        return
    for outdir in {d for d in (cfg.workdir, cfg.results_dir) if d}:
        os.makedirs(outdir, exist_ok=True)
        plot(outdir)
        with open(os.path.join(outdir, f"{name}.md"), "w", encoding="utf-8") as f:
            f.write(markdown)
        if outdir == cfg.workdir:
            with open(os.path.join(outdir, f"{name}.json"), "w") as f:
                json.dump(summary, f, indent=1, default=float)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

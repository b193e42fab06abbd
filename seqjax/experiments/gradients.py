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

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax.data.synthetic import adding_problem
from seqjax.experiments._config import NonNegFloat, NonNegInt, PosFloat, PosInt, moved_into
from seqjax.experiments._kit import (
    Run,
    Task,
    Trained,
    command_line,
    host_rows,
    load_average,
    pad_rows,
    train,
)
from seqjax.experiments.reports.gradients import plot_gradients, ratio_at, report
from seqjax.models.rnn import RNNClassifier, RNNClassifierConfig
from seqjax.nn.cells import ElmanCell, GRUCell, LSTMCell
from seqjax.train.loop import FitConfig
from seqjax.train.optim import OptimizerConfig
from seqjax.train.parallel import Parallel, ParallelOptions
from seqjax.utils import count_params

Cell = Literal["elman", "lstm", "gru"]
CELLS: tuple[str, ...] = get_args(Cell)


@dataclass(frozen=True)
class ModelOptions:
    """The recurrent cells' sizes, ``--model.KEY``: every cell compared (Elman, LSTM and
    GRU, in part A's profiles and part B's adding-problem models) has ``hidden_size`` units;
    part A feeds them inputs of ``input_size`` (the adding problem's are its two channels).

    Attributes:
        hidden_size: hidden units of every cell (parts A and B).
        input_size: size of the Gaussian inputs of part A.
    """

    hidden_size: PosInt = 32
    input_size: PosInt = 8


@dataclass(frozen=True)
class Config(ParallelOptions):
    """The options of ``seqjax train gradients`` (part A: gradient norms; B: the adding problem).

    Attributes:
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        distance_steps: sequence length ``T`` of the part A profiles.
        radii: spectral radii ``ρ`` of ``W_hh = ρQ`` of the Elman profiles.
        input_scales: standard deviations of part A's Gaussian inputs (of size
            ``--model.input_size``), one tanh profile each (the first also feeds the LSTM and
            GRU profiles).
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

    model: ModelOptions = ModelOptions()
    # part A
    distance_steps: PosInt = 300
    radii: tuple[PosFloat, ...] = (0.8, 1.0, 1.2, 2.0)
    input_scales: tuple[PosFloat, ...] = (0.1, 1.0)
    profile_batch: PosInt = 32
    gated_at_init: bool = True
    # part B
    lengths: tuple[PosInt, ...] = (50, 100, 200, 400)
    cells: tuple[Cell, ...] = CELLS
    clipping: tuple[bool, ...] = (True, False)
    no_clip_lengths: tuple[PosInt, ...] | None = None  # clipping-off runs only at these T
    clip_norm: NonNegFloat = 1.0
    steps: NonNegInt = 1000
    batch_size: PosInt = 32
    learning_rate: PosFloat = 3e-3
    test_examples: PosInt = 1000
    eval_every: NonNegInt = 100
    profile_length: NonNegInt = 200
    seed: int = 0
    workdir: str | None = "workdirs/gradients"
    results_dir: str | None = None

    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)


PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"model.hidden_size": 8, "distance_steps": 12, "radii": (1.2,), "input_scales": (1.0,),
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
    hidden = cfg.model.hidden_size
    key = jax.random.PRNGKey(cfg.seed)
    k_x, k_w, k_init = jax.random.split(key, 3)
    x = jax.random.normal(k_x, (cfg.profile_batch, cfg.distance_steps, cfg.model.input_size), f64)
    w_H = jax.random.normal(k_w, (hidden,), f64) / np.sqrt(hidden)
    readout = lambda h_BxH: h_BxH @ w_H  # noqa: E731
    carry_x = x[:, 0]
    profiles: dict[str, list[float]] = {}
    variants = [("linear, x=0 (MEDL 7.12)", lambda z: z, jnp.zeros_like(x))]
    variants += [(f"tanh, x~N(0,{s:g}²)", jnp.tanh, s * x) for s in cfg.input_scales]
    for rho in cfg.radii:
        for act_name, act, inputs in variants:
            cell = ElmanCell(hidden, activation=act, param_dtype=f64,
                             recurrent_kernel_init=scaled_orthogonal(rho),
                             bias_init=nn.initializers.zeros_init())
            params = cell.init(k_init, cell.initialize_carry(k_init, carry_x.shape), carry_x)
            profiles[f"elman {act_name}, rho={rho:g}"] = adjoint_norms(
                cell, params["params"], inputs, readout).tolist()
    gated = (("lstm (b_f=1), init", LSTMCell(hidden, forget_bias=1.0, param_dtype=f64)),
             ("gru, init", GRUCell(hidden, param_dtype=f64)))
    for name, cell in gated if cfg.gated_at_init else ():
        params = cell.init(k_init, cell.initialize_carry(k_init, carry_x.shape), carry_x)
        scale = cfg.input_scales[0]
        profiles[f"{name}, x~N(0,{scale:g}²)"] = adjoint_norms(
            cell, params["params"], scale * x, readout).tolist()
    return profiles


# ----------------------------------------------------------------------------- part B


def _adding_model(cell: str, hidden: int) -> RNNClassifier:
    kwargs = (("forget_bias", 1.0),) if cell == "lstm" else None
    return RNNClassifier(RNNClassifierConfig(num_classes=1, vocab_size=None, hidden_size=hidden,
                                             cell_type=cell, pooling="last", cell_kwargs=kwargs))


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


def adding_run(cfg: Config, cell: str, length: int, clip: bool) -> Run:
    """One model of the adding problem: Adam (clipped at ``clip_norm`` when ``clip``) on
    fresh global batches (every process draws the same batch and feeds its rows), the test
    MSE every ``eval_every`` steps; its ``evaluate`` hook is :func:`adding_outcome`. Named
    ``CELL_T{length}_clip{on,off}``; it writes nothing (its row is the result)."""
    model = _adding_model(cell, cfg.model.hidden_size)
    seed = cfg.seed + 1000 * length + 10 * CELLS.index(cell)
    test = adding_problem(cfg.test_examples, length, seed=10_000_019 + length)
    params = jax.jit(model.init)(jax.random.PRNGKey(seed), test["inputs"][:1])["params"]
    mse = _mse_fn(model)

    def test_batches(par: Parallel) -> list[dict]:  # global batches, the last padded
        return [pad_rows({"inputs": test["inputs"][i : i + 250],
                          "targets": test["targets"][i : i + 250],
                          "mask": np.ones(len(test["targets"][i : i + 250]), bool)},
                         par.batch_shards, {"mask": False})
                for i in range(0, cfg.test_examples, 250)]

    def data(par: Parallel) -> Any:
        rng = np.random.default_rng(seed)

        def batches(i: int) -> dict:
            # Every process draws the same global batch and feeds its own rows of it.
            d = adding_problem(cfg.batch_size, length, seed=rng)
            return host_rows(par, {"inputs": d["inputs"], "targets": d["targets"]})

        return batches

    return Run(
        model=model, params=params, loss_fn=lambda p, b, rng: (mse(p, b), {}), data=data,
        optimizer=OptimizerConfig(name="adam", learning_rate=cfg.learning_rate,
                                  clip_norm=cfg.clip_norm if clip else 0.0),
        fit=FitConfig(steps=cfg.steps, log_every=1, eval_every=cfg.eval_every,
                      best_metric=None, progress=False, tensorboard=False, plot=False,
                      handle_signals=False),
        divergence_is_result=True,  # a run that diverges is a row (adding_outcome)
        batch_size=cfg.batch_size, seed=seed, eval_fn=_masked_mse_fn(model),
        eval_data=test_batches, name=f"{cell}_T{length}_clip{'on' if clip else 'off'}",
        writes=False,
        evaluate=lambda t: adding_outcome(cfg, t, cell, length, clip, test))


def adding_outcome(cfg: Config, t: Trained, cell: str, length: int, clip: bool,
                   test: dict) -> dict:
    """A run's row: the test-MSE curve, the gradient-norm statistics and (for the clipped
    run of ``profile_length``) the trained model's adjoint profile. A run whose loss or
    gradient norm turned NaN/inf is ``"diverged"`` at that step: no curves, no test MSE,
    the gradient norms of the steps before it."""
    history = [r for r in t.records if "loss" in r]  # a diverged run's end before it
    diverged_at = t.diverged_at
    bad = diverged_at is not None
    grad_norms = [r["grad_norm"] for r in history]
    if bad:
        history = []
    curve = [(r["step"], r["eval/loss"]) for r in history if "eval/loss" in r]
    train_curve = [(r["step"], r["loss"]) for r in history]
    g = np.asarray(grad_norms) if grad_norms else np.zeros(1)
    out = {
        "cell": cell, "length": length, "clip": clip,
        "status": "diverged" if bad else "completed", "diverged_at": diverged_at,
        "params": count_params(t.params),
        "test_mse": curve[-1][1] if curve else float("nan"), "curve": curve,
        "train_curve": train_curve[:: max(1, len(train_curve) // 100)],
        "grad_norm_median": float(np.median(g)), "grad_norm_max": float(g.max()),
        "clipped_fraction": float((g > cfg.clip_norm).mean()), "wall_s": t.seconds,
    }
    if not bad and length == cfg.profile_length and clip:
        out["profile"] = trained_profile(t.run.model, t.params, test, cfg)
    print(f"adding T={length:4d} {cell:6s} clip={'on ' if clip else 'off'} "
          f"test MSE {out['test_mse']:.4f} ({out['status']}), max |g| "
          f"{out['grad_norm_max']:.3g}, {out['wall_s']:.0f} s", flush=True)
    return out


def trained_profile(model: RNNClassifier, params: Any, test: dict, cfg: Config) -> list[float]:
    """``‖∂L/∂h_t‖`` of the trained model's squared error on test sequences (float64)."""
    with jax.enable_x64(True):
        f64 = jnp.float64
        params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, f64), params)
        cell_params = params["encoder"]["rnn"]["layer_0"]["cell"]
        cls = {"elman": ElmanCell, "lstm": LSTMCell, "gru": GRUCell}[model.config.cell_type]
        x = jnp.asarray(test["inputs"][: cfg.profile_batch], f64)
        y = jnp.asarray(test["targets"][: cfg.profile_batch], f64)
        return _trained_profile(cls(cfg.model.hidden_size, param_dtype=f64), cell_params,
                                params["classifier"], x, y)


def _trained_profile(cell_mod: nn.Module, cell_params: Any, head: Any, x: jax.Array,
                     y: jax.Array) -> list[float]:

    def readout(h_BxH: jax.Array) -> jax.Array:
        # Per-row squared errors; rows are independent, so the gradient of their sum with
        # respect to row b's h_t is that of row b's own loss.
        return ((h_BxH @ head["kernel"])[:, 0] + head["bias"][0] - y) ** 2

    return adjoint_norms(cell_mod, cell_params, x, readout).tolist()


def build(cfg: Config) -> Task:
    """Part A's profiles at initialisation, then one run of the adding problem per length ×
    cell × clipping (:func:`adding_run`); the report and the figures as the task's hooks."""
    for c in cfg.cells:
        if c not in CELLS:
            raise ValueError(f"`cells` must be drawn from {CELLS}; got {c!r}.")
    loads = [load_average()]
    started = time.perf_counter()
    profiles = part_a(cfg)
    print("part A (ratio ‖ζ_{T-d}‖/‖ζ_T‖ at d = 1, T-1):")
    for name, prof in profiles.items():
        print(f"  {name:40s} {ratio_at(prof, 1):.3g}  {ratio_at(prof, len(prof) - 1):.3g}")
    runs = (adding_run(cfg, cell, length, clip)
            for length in cfg.lengths for cell in cfg.cells for clip in cfg.clipping
            if clip or cfg.no_clip_lengths is None or length in cfg.no_clip_lengths)

    def summarize(trained: list[Trained]) -> dict:
        loads.append(load_average())
        return {"profiles": profiles, "runs": [t.results for t in trained],
                "wall_s": time.perf_counter() - started, "load_average": loads}

    return Task(
        "gradients", runs, started=started, summarize=summarize,
        report=lambda s: report(cfg, profiles, s["runs"], s["wall_s"],
                                command_line("gradients", cfg), tuple(loads)),
        files=lambda folder, s: plot_gradients(cfg, profiles, s["runs"], folder))


def run(cfg: Config) -> dict:
    """Part A and the adding problem on every visible device; the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

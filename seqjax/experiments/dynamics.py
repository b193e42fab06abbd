r"""The slides' BPTT section: the logistic map, and the gradient bound checked on the Elman RNN.

**Part A — the logistic map** ``x_{t+1} = f(x_t) = r x_t (1 − x_t)`` (the slides' Fig. 2,
"Iterations of the function f(x) = 3.5x(1−x)", shown next to the BPTT bound). Iterating
one fixed map is what an RNN does to its state; the derivative of the ``n``-fold
composition is the product of the one-step derivatives,

.. math::
    \frac{∂x_T}{∂x_t} = \prod_{j=t}^{T-1} f'(x_j) = \prod_{j=t}^{T-1} r(1 − 2x_j),

the scalar case of the BPTT product below: it shrinks or grows geometrically at the rate
``e^{λ}`` of the Lyapunov exponent ``λ(r) = \lim \frac1n \sum_j \log|r(1 − 2x_j)|``. At
``r = 3.5`` the orbit settles on a 4-cycle (``λ < 0``: derivatives vanish); past
``r ≈ 3.5699`` it is chaotic (``λ > 0``: they explode). The figure shows the orbit and
its cobweb at ``r = 3.5``, and the bifurcation diagram with ``λ(r)``.

**Part B — the BPTT bound** (slides, "Backpropagation through time"): for
``h_t = W σ(h_{t−1}) + W_{xh} x_t`` the slides write

.. math::
    \frac{∂h_t}{∂h_k} = \prod_{j=k+1}^{t} W^⊤ \mathrm{diag}[σ'(h_{j−1})],\qquad
    \Big\lVert\frac{∂h_t}{∂h_k}\Big\rVert ≤ \prod_{j=k+1}^{t}
        \lVert W^⊤\rVert\,\lVert\mathrm{diag}[σ'(h_{j−1})]\rVert ≤ (γ\lVert W\rVert)^{t−k},

with ``γ = \sup|σ'|`` (1 for tanh, 1/4 for the logistic sigmoid); ``W^⊤`` is the
slides' row-vector layout (with column vectors the factor is ``W diag σ'``; the spectral
norm is the same). For the Elman cell of :class:`seqjax.nn.ElmanCell`,
``h_t = σ(W_{hh} h_{t−1} + W_{hx} x_t + b)`` (MEDL (7.2)), the factor is
``diag[σ'(a_j)] W_{hh}`` (MEDL (7.11)) and the same bound holds with ``σ'(a_j)``. Both
recurrences are run with random ``W`` of chosen spectral norms below and above 1; the
exact ``‖∂h_T/∂h_t‖₂`` (``jax.jacrev`` through the unrolled recurrence, in float64: the
sigmoid's norms fall below float32's smallest normal number, 1.2e-38) is compared
with the per-step product and with ``(γ‖W‖)^{T−t}``. The bound is asserted in
``tests/experiments/test_dynamics.py``; the results file tabulates it.

Run:  python -m seqjax.experiments.dynamics --results_dir seqjax/experiments/results
      python -m seqjax.experiments.dynamics --smoke --workdir /tmp/dyn      (seconds)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.experiments._config import NonNegInt, PosFloat, PosInt, Range, moved_into
from seqjax.experiments._kit import Task, command_line, train
from seqjax.experiments.reports.dynamics import plot_dynamics, report
from seqjax.nn.cells import ElmanCell

Array = jax.Array

ACTIVATIONS: dict[str, tuple[Callable[[Array], Array], float]] = {
    # name: (σ, γ = sup |σ'|)
    "tanh": (jnp.tanh, 1.0),
    "sigmoid": (jax.nn.sigmoid, 0.25),
    "identity": (lambda a: a, 1.0),
}
FORMS = ("slides", "elman")
LogisticR = Annotated[float, Range(low=0, high=4, high_closed=True)]  # keeps [0, 1]
Activation = Literal["tanh", "sigmoid", "identity"]  # the keys of ACTIVATIONS
DERIVATIVE_STEPS = 60  # ∂x_T/∂x_0 of the logistic map (float32 autodiff stays finite)


@dataclass(frozen=True)
class ModelOptions:
    """The RNN whose Jacobians part B studies, one group of options ``--model.KEY``: the
    sizes of both recurrences compared (the slides' ``h_t = W σ(h_{t−1}) + W_{xh} x_t`` and
    the Elman cell), whose weights are drawn at random.

    Attributes:
        hidden_size: size ``H`` of the hidden state of the random recurrences.
        input_size: size of the random Gaussian inputs ``x_t``.
    """

    hidden_size: PosInt = 16
    input_size: PosInt = 4


@dataclass(frozen=True)
class Config:
    """The options of ``seqjax train dynamics`` (part A: the logistic map; part B: the BPTT bound).

    Attributes:
        orbit_r: ``r`` of the plotted orbit and cobweb (the slides' 3.5), also of the reported
            ``λ`` and ``∂x_T/∂x_0``; in [0, 4].
        orbit_x0: the starting point ``x_0`` (in [0, 1]) of the orbit, the bifurcation diagram
            and the derivative.
        orbit_steps: steps of the plotted orbit.
        r_min: the smallest ``r`` of the bifurcation diagram.
        r_max: the largest ``r`` of the bifurcation diagram.
        r_points: values of ``r`` in the diagram (evenly spaced from ``r_min`` to ``r_max``).
        transient: steps iterated and discarded before states are kept (diagram and ``λ``).
        keep: states kept per ``r`` after the transient, plotted and averaged for ``λ(r)``
            (at least 1000 for the reported ``λ`` at ``orbit_r`` and 3.9).
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        length: steps ``T`` of each recurrence (the largest distance ``T − t``).
        norms: spectral norms ``‖W‖`` of the random recurrent matrices, one table row each.
        activations: ``σ``, each ``tanh``, ``sigmoid`` or ``identity``.
        trials: random draws (``W``, inputs, ``h_0``) per form, activation and norm.
        seed: the random draws of part B.
        workdir: the plots, ``dynamics.md`` and ``dynamics.json``; ``None`` = none of them.
        results_dir: also write the plots and ``dynamics.md`` here; ``None`` = not.
    """

    # part A: the logistic map
    orbit_r: LogisticR = 3.5
    orbit_x0: Annotated[float, Range(low=0, high=1, high_closed=True)] = 0.2
    orbit_steps: PosInt = 40
    r_min: LogisticR = 2.5
    r_max: LogisticR = 4.0
    r_points: PosInt = 1500
    transient: NonNegInt = 500
    keep: PosInt = 200
    # part B: the BPTT bound
    model: ModelOptions = ModelOptions()
    length: PosInt = 40
    norms: tuple[PosFloat, ...] = (0.5, 0.9, 1.0, 1.1, 2.0)
    activations: tuple[Activation, ...] = ("tanh", "sigmoid", "identity")
    trials: PosInt = 10
    seed: int = 0
    workdir: str | None = "workdirs/dynamics"
    results_dir: str | None = None

    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)


PRESETS = {
    "smoke": {"orbit_steps": 12, "r_points": 60, "transient": 100, "keep": 20,
              "model.hidden_size": 4, "length": 8, "norms": (0.5, 2.0),
              "activations": ("tanh",), "trials": 2},
}


# ----------------------------------------------------------------------------- part A


def logistic_orbit(r: float, x0: float, steps: int) -> np.ndarray:
    """``x_0 … x_steps`` of ``x_{t+1} = r x_t (1 − x_t)`` (float64)."""
    if not 0.0 <= x0 <= 1.0:
        raise ValueError(f"`x0` must lie in [0, 1]; got {x0}.")
    if not 0.0 <= r <= 4.0:
        raise ValueError(f"`r` must lie in [0, 4] (the map keeps [0, 1]); got {r}.")
    x = np.empty(steps + 1)
    x[0] = x0
    for t in range(steps):
        x[t + 1] = r * x[t] * (1.0 - x[t])
    return x


def bifurcation(r_grid: np.ndarray, *, x0: float = 0.2, transient: int = 500,
                keep: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """``(x, λ)``: ``x[i]`` the ``keep`` states after ``transient`` steps at ``r_grid[i]``
    (all ``r`` iterated at once), ``λ[i]`` the Lyapunov exponent ``mean log|r(1 − 2x)|``
    over those states."""
    r = np.asarray(r_grid, np.float64)
    x = np.full_like(r, x0)
    for _ in range(transient):
        x = r * x * (1.0 - x)
    xs = np.empty((len(r), keep))
    logs = np.zeros(len(r))
    for j in range(keep):
        x = r * x * (1.0 - x)
        xs[:, j] = x
        logs += np.log(np.maximum(np.abs(r * (1.0 - 2.0 * x)), 1e-300))
    return xs, logs / keep


def composition_derivative(r: float, x0: float, steps: int) -> tuple[float, float]:
    """``(∂x_steps/∂x_0 by autodiff, ∏_j r(1 − 2x_j))`` — the chain rule the BPTT product
    generalises (float64 via numpy for the product, jax for the derivative)."""
    orbit = logistic_orbit(r, x0, steps)

    def f(x: Array) -> Array:
        for _ in range(steps):
            x = r * x * (1.0 - x)
        return x

    auto = float(jax.grad(f)(jnp.float32(x0)))
    return auto, float(np.prod(r * (1.0 - 2.0 * orbit[:-1])))


# ----------------------------------------------------------------------------- part B


def random_weights(key: Array, hidden: int, input_size: int, norm: float
                   ) -> dict[str, Array]:
    """``W`` (``[H, H]``, column convention, spectral norm exactly ``norm``), ``W_xh``, ``b``
    and inputs are drawn by the caller; here ``W`` = Gaussian / its largest singular value."""
    k1, k2, k3 = jax.random.split(key, 3)
    g = jax.random.normal(k1, (hidden, hidden), jnp.float32)
    w = g / jnp.linalg.norm(g, 2) * norm
    return {"W": w, "W_xh": jax.random.normal(k2, (hidden, input_size)) / np.sqrt(input_size),
            "b": 0.1 * jax.random.normal(k3, (hidden,))}


def _step(form: str, activation: str, weights: dict[str, Array], h: Array, x: Array) -> Array:
    """One step ``h_{t−1} -> h_t`` (single vectors) of the slides' form or seqjax's ElmanCell."""
    sigma, _ = ACTIVATIONS[activation]
    w, w_xh, b = weights["W"], weights["W_xh"], weights["b"]
    if form == "slides":  # h_t = W σ(h_{t−1}) + W_xh x_t
        return w @ sigma(h) + w_xh @ x
    # seqjax.nn.ElmanCell: h_t = σ(W_hh h_{t−1} + W_hx x_t + b); Flax kernels are transposed.
    cell = ElmanCell(features=w.shape[0], activation=sigma)
    params = {"params": {"input": {"kernel": w_xh.T, "bias": b}, "recurrent_kernel": w.T}}
    return cell.apply(params, h[None], x[None])[0][0]


@functools.partial(jax.jit, static_argnames=("form", "activation"))
def _jacobians(form: str, activation: str, weights: dict[str, Array], xs_TxP: Array,
               h0: Array) -> tuple[Array, Array, Array]:
    """``(hs, jac, dsig)``: the states ``h_0..h_T``, ``jac[t] = ∂h_T/∂h_t`` for ``t < T``
    (autodiff: the gradient of ``h_T`` with respect to a zero perturbation added to
    ``h_t``) and the per-step ``σ'`` vectors of the slides' factor ``diag σ'(·)``."""
    sigma, _ = ACTIVATIONS[activation]
    num_steps = xs_TxP.shape[0]

    def final(deltas_TxH: Array) -> tuple[Array, Array]:
        h, hs = h0 + deltas_TxH[0], [h0]
        for j in range(num_steps):
            h = _step(form, activation, weights, h, xs_TxP[j])
            hs.append(h)
            if j + 1 < num_steps:
                h = h + deltas_TxH[j + 1]
        return h, jnp.stack(hs)

    jac_HxTxH, hs = jax.jacrev(final, has_aux=True)(jnp.zeros((num_steps, h0.shape[0])))
    if form == "slides":  # σ'(h_{j−1})
        pre_TxH = hs[:-1]
    else:  # σ'(a_j), a_j = W h_{j−1} + W_xh x_j + b
        pre_TxH = hs[:-1] @ weights["W"].T + xs_TxP @ weights["W_xh"].T + weights["b"]
    dsig_TxH = jax.vmap(jax.vmap(jax.grad(sigma)))(pre_TxH)
    return hs, jnp.moveaxis(jac_HxTxH, 1, 0), dsig_TxH


def bptt_bound(form: str, weights: dict[str, Array], xs_TxP: Array, h0: Array,
               activation: str = "tanh") -> dict[str, Any]:
    """For ``d = T − t = 1..T``: the exact ``‖∂h_T/∂h_t‖₂``, the slides' per-step product
    ``∏ ‖W‖ ‖diag σ'(·)‖`` and the coarse ``(γ‖W‖)^d``; also the largest gap between the
    product of the per-step factors (the slides' formula) and the autodiff Jacobian
    (relative to ``max(1, max |∂h_T/∂h_t|)``). Computed in float64 whatever the dtype of
    ``weights``, ``xs_TxP`` and ``h0``."""
    if form not in FORMS:
        raise ValueError(f"`form` must be one of {FORMS}; got {form!r}.")
    if activation not in ACTIVATIONS:
        raise ValueError(f"`activation` must be one of {sorted(ACTIVATIONS)}; got "
                         f"{activation!r}.")
    _, gamma = ACTIVATIONS[activation]
    # In float64: over T = 40 steps the sigmoid's norms reach 1e-38 and below, where float32
    # goes subnormal (then 0) and the digits depend on the CPU's handling of subnormals.
    with jax.enable_x64(True):
        f64 = functools.partial(jnp.asarray, dtype=jnp.float64)
        _, jac, dsig = (np.asarray(a, np.float64) for a in _jacobians(
            form, activation, {k: f64(v) for k, v in weights.items()}, f64(xs_TxP), f64(h0)))
    w = np.asarray(weights["W"], np.float64)
    w_norm = float(np.linalg.norm(w, 2))
    num_steps = xs_TxP.shape[0]
    exact, product, coarse, gap = [], [], [], 0.0
    prod, bound = np.eye(w.shape[0]), 1.0
    for t in range(num_steps - 1, -1, -1):  # d = T − t = 1..T; factor j = t + 1
        s = dsig[t]  # σ' of step j = t + 1
        factor = w * s[None, :] if form == "slides" else s[:, None] * w
        prod = prod @ factor  # ∂h_T/∂h_t = F_T F_{T−1} ⋯ F_{t+1}
        bound *= w_norm * float(np.max(np.abs(s)))  # ‖W‖ ‖diag σ'‖ (spectral norms)
        scale = max(1.0, float(np.max(np.abs(jac[t]))))
        gap = max(gap, float(np.max(np.abs(jac[t] - prod))) / scale)
        exact.append(float(np.linalg.norm(jac[t], 2)))
        product.append(bound)
        coarse.append((gamma * w_norm) ** (num_steps - t))
    return {"distance": np.arange(1, num_steps + 1), "exact": np.array(exact),
            "product": np.array(product), "coarse": np.array(coarse),
            "formula_gap": gap, "w_norm": w_norm, "gamma": gamma}


def bound_table(cfg: Config) -> list[dict[str, Any]]:
    """Part B over ``trials`` random draws for every form, activation and ``‖W‖``."""
    rows = []
    hidden, inputs = cfg.model.hidden_size, cfg.model.input_size
    key = jax.random.PRNGKey(cfg.seed)
    for form in FORMS:
        for act in cfg.activations:
            for norm in cfg.norms:
                trials = []
                for _ in range(cfg.trials):
                    key, kw, kx, kh = jax.random.split(key, 4)
                    weights = random_weights(kw, hidden, inputs, norm)
                    xs = jax.random.normal(kx, (cfg.length, inputs))
                    h0 = jax.random.normal(kh, (hidden,))
                    trials.append(bptt_bound(form, weights, xs, h0, act))
                exact = np.stack([t["exact"] for t in trials])
                product = np.stack([t["product"] for t in trials])
                coarse = trials[0]["coarse"]
                rows.append({
                    "form": form, "activation": act, "norm": norm,
                    "gamma": trials[0]["gamma"],
                    "exact_median": np.median(exact, 0).tolist(),
                    "product_median": np.median(product, 0).tolist(),
                    "coarse": coarse.tolist(),
                    "max_exact_over_product": float(np.max(exact / product)),
                    "max_product_over_coarse": float(np.max(product / coarse)),
                    "max_formula_gap": max(t["formula_gap"] for t in trials),
                })
    return rows


def build(cfg: Config) -> Task:
    """The dynamics train nothing: a task with no runs whose ``summarize`` hook computes
    part A (the orbit, the bifurcation diagram, Lyapunov exponents, the composition's
    derivative) and part B (:func:`bound_table`); the markdown and the figures as hooks."""
    for a in cfg.activations:
        if a not in ACTIVATIONS:
            raise ValueError(f"`activations` must be drawn from {sorted(ACTIVATIONS)}; got {a!r}.")
    started = time.perf_counter()
    figure: dict[str, Any] = {}  # part A's arrays, for the plots

    def summarize(_: list) -> dict:
        orbit = logistic_orbit(cfg.orbit_r, cfg.orbit_x0, cfg.orbit_steps)
        long = logistic_orbit(cfg.orbit_r, cfg.orbit_x0, 2000)
        cycle = sorted(set(np.round(long[-4:], 6)))
        r_grid = np.linspace(cfg.r_min, cfg.r_max, cfg.r_points)
        xs, lyap = bifurcation(r_grid, x0=cfg.orbit_x0, transient=cfg.transient, keep=cfg.keep)
        _, lyap_r = bifurcation(np.array([cfg.orbit_r, 3.9]), x0=cfg.orbit_x0,
                                transient=cfg.transient, keep=max(cfg.keep, 1000))
        auto, prod = composition_derivative(cfg.orbit_r, cfg.orbit_x0, DERIVATIVE_STEPS)
        chaos, _ = composition_derivative(3.9, cfg.orbit_x0, DERIVATIVE_STEPS)
        rows = bound_table(cfg)
        figure.update(orbit=orbit, r_grid=r_grid, xs=xs, lyap=lyap)
        return {"orbit": orbit.tolist(), "cycle": cycle,
                "lyapunov_orbit_r": float(lyap_r[0]), "lyapunov_3.9": float(lyap_r[1]),
                "derivative_autodiff": auto, "derivative_product": prod,
                "derivative_3.9": chaos, "bound": rows,
                "wall_s": time.perf_counter() - started}

    return Task(
        "dynamics", [], started=started, summarize=summarize,
        report=lambda s: report(cfg, s, command_line("dynamics", cfg),
                                derivative_steps=DERIVATIVE_STEPS),
        files=lambda folder, s: plot_dynamics(cfg, figure["orbit"], figure["r_grid"],
                                              figure["xs"], figure["lyap"], s["bound"], folder,
                                              forms=FORMS))


def run(cfg: Config) -> dict:
    """Parts A and B; the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

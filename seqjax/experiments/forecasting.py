r"""Forecasting the yearly sunspot numbers with an RNN that feeds its predictions back.

MEDL §7.1, Fig. 7.1(a): "lookahead" / autoregressive forecasting — a many-to-many RNN
trained to predict the next value (teacher forcing, MEDL §7.2), then run on the observed
history (warm-up) and continued by feeding its own predictions back as inputs for a
horizon of ``H`` steps (the one-to-many decoder of Fig. 7.2(a); MEDL (7.3)'s output
feedback with ``T = identity``):

.. math::
    h_t = \mathrm{GRU}(h_{t-1}, x_t),\quad \hat x_{t+1} = w^⊤ h_t + b\quad (t ≤ o),\qquad
    h_{o+k} = \mathrm{GRU}(h_{o+k-1}, \hat x_{o+k}),\ \hat x_{o+k+1} = w^⊤ h_{o+k} + b .

Training minimises the one-step squared error ``Σ_t (\hat x_{t+1} − x_{t+1})²`` on windows
of the training years (1700–1920 by default); the test years (1921–2008) are forecast from
every origin ``o`` with the true history up to ``o``. Data: :func:`seqjax.data.packaged.sunspots`
(statsmodels' yearly series, 309 values, the ~11-year solar cycle), standardised with the
training mean and deviation (:func:`~seqjax.data.packaged.forecasting_windows` cuts the
windows).

Baselines, forecast the same way: **persistence** ``\hat x_{o+k} = x_o``; **climatology**
(the training mean); **AR(p)** — ``x_t = c + Σ_{i=1}^p a_i x_{t-i}`` fitted by least squares
on the training years and iterated on its own predictions (the classical model of this
series: Yule 1927 fitted AR(2) to sunspots). Errors are RMSE in sunspot units per horizon.

Run:  python -m seqjax.experiments.forecasting --results_dir seqjax/experiments/results
      python -m seqjax.experiments.forecasting --smoke --workdir /tmp/fc      (seconds)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax.data.packaged import forecasting_windows, sunspots
from seqjax.experiments._config import NonNegInt, PosInt, moved_into
from seqjax.experiments._kit import Run, Task, Trained, command_line, train
from seqjax.experiments.reports.forecasting import plot_forecasts, report
from seqjax.nn import RNN, Dense, GRUCell
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import ParallelOptions
from seqjax.utils import count_params

Array = jax.Array


@dataclass(frozen=True)
class ModelOptions:
    """The compared models of ``seqjax train forecasting``: ``--model.KEY``. The GRU
    forecaster's width (:class:`Forecaster`) and the order of the AR(p) baseline it is
    measured against.

    Attributes:
        hidden_size: GRU width.
        ar_order: ``p`` of the AR(p) baseline (least squares on the training years).
    """

    hidden_size: PosInt = 32
    ar_order: PosInt = 9


@dataclass(frozen=True)
class Config(TrainOptions, ParallelOptions):
    """The options of ``seqjax train forecasting`` (sunspots, a GRU fed its own forecasts).

    Attributes:
        train_until: last training year (the series starts in 1700); the later years are
            the test period.
        window: years per training window (targets: the same years shifted by one).
        horizon: years forecast from each test origin by feeding predictions back.
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        steps: Adam steps per seed.
        batch_size: windows per step, over all devices (capped at the number of windows).
        learning_rate: Adam's learning rate (constant after the warm-up).
        seeds: one GRU trained per seed (initialisation and batch order); the RNN's RMSE is
            the mean ± sd over them.
        progress: show a progress bar.
        workdir: ``run.json``, ``seed<N>/`` (each seed's training run: a checkpoint at the
            end, ``metrics.jsonl``), the plot, ``forecasting.md`` and ``forecasting.json``;
            ``None`` = nothing written.
        results_dir: also write the plot and ``forecasting.md`` here; ``None`` = not.
    """

    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)

    train_until: PosInt = 1920  # last training year; the rest is the test period
    window: PosInt = 40
    horizon: PosInt = 22  # two solar cycles
    model: ModelOptions = ModelOptions()
    steps: NonNegInt = 1500  # TrainOptions' fields, with this recipe's defaults
    warmup_steps: NonNegInt = 0
    log_every: PosInt = 250
    seeds: tuple[int, ...] = (0, 1, 2)
    progress: bool = False
    workdir: str | None = "workdirs/forecasting"
    results_dir: str | None = None


PRESETS = {"smoke": {"model.hidden_size": 4, "steps": 3, "seeds": (0,), "horizon": 4, "window": 10,
                     "log_every": 1, "batch_size": 8}}


class Forecaster(nn.Module):
    """GRU + linear read-out: ``x: [B, T, 1] -> (x̂_next: [B, T], carry)``."""

    hidden: int

    @nn.compact
    def __call__(self, x_BxTx1: Array, carry: Array | None = None) -> tuple[Array, Array]:
        h_BxTxH, carry = RNN(GRUCell(self.hidden), name="rnn").with_state(
            x_BxTx1, initial_carry=carry)
        return Dense(1, name="head")(h_BxTxH)[..., 0], carry


def closed_loop(model: Forecaster, params: Any, history_BxT: Array, horizon: int) -> Array:
    """Warm up on ``history`` (teacher forcing), then feed predictions back ``horizon`` times:
    ``[B, horizon]`` forecasts of the values after the history (MEDL Fig. 7.1(a))."""
    pred_BxT, carry = model.apply(params, history_BxT[..., None])

    def step(state: tuple[Array, Array], _: Any) -> tuple[tuple[Array, Array], Array]:
        x_B, carry = state
        y_Bx1, carry = model.apply(params, x_B[:, None, None], carry)
        return (y_Bx1[:, 0], carry), x_B

    (_, _), out_HxB = jax.lax.scan(step, (pred_BxT[:, -1], carry), None, length=horizon)
    return out_HxB.T


def fit_ar(series: np.ndarray, order: int) -> np.ndarray:
    """Least-squares AR(p) coefficients ``[c, a_1..a_p]`` of ``x_t = c + Σ a_i x_{t-i}``."""
    rows = np.stack([series[order - i - 1:len(series) - i - 1] for i in range(order)], 1)
    design = np.concatenate([np.ones((len(rows), 1)), rows], 1)
    coef, *_ = np.linalg.lstsq(design, series[order:], rcond=None)
    return coef


def ar_forecast(coef: np.ndarray, history: np.ndarray, horizon: int) -> np.ndarray:
    """Iterate the AR model on its own predictions (closed loop)."""
    order = len(coef) - 1
    buf = list(history[-order:])
    out = []
    for _ in range(horizon):
        nxt = coef[0] + float(np.dot(coef[1:], buf[::-1][:order]))
        out.append(nxt)
        buf.append(nxt)
    return np.array(out)


def origins(n_train: int, n_total: int, horizon: int) -> np.ndarray:
    """Forecast origins: every test index ``o`` (the history is ``x[:o]``) with a full horizon."""
    return np.arange(n_train, n_total - horizon + 1)


def rmse_by_horizon(forecasts_OxH: np.ndarray, truth_OxH: np.ndarray) -> np.ndarray:
    return np.sqrt(np.mean((forecasts_OxH - truth_OxH) ** 2, axis=0))


def forecaster_run(cfg: Config, train_z: np.ndarray, seed: int,
                   forecast: Callable[[Trained], dict]) -> Run:
    """One GRU trained by teacher forcing (next value at every step of every training
    window; Adam, constant rate) from ``seed``; its folder ``seed<N>``, its ``evaluate``
    hook ``forecast``."""
    w = forecasting_windows(train_z, cfg.window, 1)
    # inputs x[i:i+L], targets x[i+1:i+L+1]: the next value at every step
    data = {"x": w["inputs"][:, :, 0], "y": np.concatenate(
        [w["inputs"][:, 1:, 0], w["targets"]], axis=1)}
    model = Forecaster(cfg.model.hidden_size)
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, cfg.window, 1)))["params"]

    def loss_fn(p: Any, batch: dict, rng: Array) -> tuple[Array, dict]:
        pred, _ = model.apply({"params": p}, batch["x"][..., None])
        return jnp.mean(jnp.square(pred - batch["y"])), {}

    return Run(
        model=model, params=params, loss_fn=loss_fn, data=data,
        optimizer=cfg.optimizer_config("adam", schedule="constant"),
        fit=cfg.fit_config(best_metric=None, tensorboard=False, plot=False),
        batch_size=min(cfg.batch_size, len(data["x"])), seed=seed, dropout_seed=seed + 1000,
        model_config={"hidden_size": cfg.model.hidden_size}, name=f"seed{seed}", evaluate=forecast)


def build(cfg: Config) -> Task:
    """The standardised series, one :func:`forecaster_run` per seed (each evaluated by its
    closed-loop forecasts from every test origin and its one-step test RMSE), the AR(p),
    persistence and climatology baselines in ``summarize``; the report and the plot as
    hooks."""
    started = time.perf_counter()
    data = sunspots()
    series, years = data["series"].astype(np.float64), data["years"]
    n_train = int(np.sum(years <= cfg.train_until))
    if not cfg.window + 2 <= n_train < len(series) - cfg.horizon:
        raise ValueError(f"`train_until` leaves {n_train} training years; need at least "
                         f"window + 2 = {cfg.window + 2} and a test period longer than the "
                         f"horizon {cfg.horizon}.")
    mu, sd = series[:n_train].mean(), series[:n_train].std()
    z = (series - mu) / sd
    starts = origins(n_train, len(series), cfg.horizon)
    truth = np.stack([series[o:o + cfg.horizon] for o in starts])
    # every origin's history, left-padded by nothing: histories have different lengths, so
    # forecast from the last `n_train` values (>= window), a fixed-length batch
    hist = np.stack([z[o - n_train:o] for o in starts]).astype(np.float32)
    coef = fit_ar(z[:n_train], cfg.model.ar_order)
    ar_fc = np.stack([ar_forecast(coef, z[:o], cfg.horizon) for o in starts]) * sd + mu
    rnn_fc: list[np.ndarray] = []  # each seed's forecasts, for the summary and the plot

    def forecast(t: Trained) -> dict:
        model, params = t.run.model, t.params
        fc = np.asarray(jax.jit(closed_loop, static_argnums=(0, 3))(
            model, {"params": params}, jnp.asarray(hist), cfg.horizon)) * sd + mu
        rnn_fc.append(fc)
        pred, _ = model.apply({"params": params}, jnp.asarray(z[None, :-1, None], jnp.float32))
        one = np.asarray(pred[0]) * sd + mu  # teacher-forced one-step predictions of x[1:]
        one_step = float(np.sqrt(np.mean((one[n_train - 1:] - series[n_train:]) ** 2)))
        print(f"seed {t.run.seed}: {count_params(params):,} parameters, {t.seconds:.0f}s; "
              f"one-step test RMSE {one_step:.2f}")
        return {"one_step": one_step}

    def summarize(trained: list[Trained]) -> dict:
        rnn_rmse = np.stack([rmse_by_horizon(f, truth) for f in rnn_fc])
        persist = np.repeat(series[starts - 1][:, None], cfg.horizon, 1)
        results = {
            "rnn_mean": rnn_rmse.mean(0).tolist(), "rnn_sd": rnn_rmse.std(0).tolist(),
            f"ar{cfg.model.ar_order}": rmse_by_horizon(ar_fc, truth).tolist(),
            "persistence": rmse_by_horizon(persist, truth).tolist(),
            "climatology": rmse_by_horizon(np.full_like(truth, mu), truth).tolist(),
        }
        ar_one = float(np.sqrt(np.mean((np.array([ar_forecast(coef, z[:o], 1)[0] for o in range(
            n_train, len(series))]) * sd + mu - series[n_train:]) ** 2)))
        return {"n_train": n_train, "n_test": len(series) - n_train, "n_origins": len(starts),
                "rmse": results, "one_step_rnn": [t.results["one_step"] for t in trained],
                "one_step_ar": ar_one}

    runs = (forecaster_run(cfg, z[:n_train].astype(np.float32), seed, forecast)
            for seed in cfg.seeds)
    return Task("forecasting", runs, started=started, summarize=summarize,
                report=lambda s: report(cfg, s, years, command_line("forecasting", cfg)),
                files=lambda folder, s: plot_forecasts(cfg, series, years, n_train, starts,
                                                       rnn_fc[0], ar_fc, folder))


def run(cfg: Config) -> dict:
    """Train a GRU per seed on every visible device and forecast the test period; the
    summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

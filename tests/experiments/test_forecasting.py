"""Sunspot forecasting with predictions fed back (MEDL Fig. 7.1(a)): pieces and smoke run."""

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.experiments import forecasting
from tests.experiments._devices import assert_trained_on_all_devices
from tests.experiments._learning import assert_loss_dropped


def test_closed_loop_feeds_predictions_back():
    """Each forecast equals the one-step prediction of the model run on the history
    extended by the previous forecasts (a Python loop of teacher-forced passes)."""
    model = forecasting.Forecaster(5)
    hist = jax.random.normal(jax.random.PRNGKey(0), (2, 7))
    params = model.init(jax.random.PRNGKey(1), hist[..., None])
    got = forecasting.closed_loop(model, params, hist, 4)
    seq = hist
    for k in range(4):
        pred, _ = model.apply(params, seq[..., None])
        np.testing.assert_allclose(got[:, k], pred[:, -1], rtol=1e-5, atol=1e-6)
        seq = jnp.concatenate([seq, pred[:, -1:]], 1)


def test_ar_fit_and_forecast_vs_numpy():
    """AR(2) recovers x_t = 0.5 + 1.2 x_{t-1} − 0.5 x_{t-2} exactly and iterates it."""
    x = [1.0, 2.0]
    for _ in range(30):
        x.append(0.5 + 1.2 * x[-1] - 0.5 * x[-2])
    x = np.array(x)
    coef = forecasting.fit_ar(x[:20] + 0.0, 2)
    np.testing.assert_allclose(coef, [0.5, 1.2, -0.5], atol=1e-8)
    np.testing.assert_allclose(forecasting.ar_forecast(coef, x[:20], 5), x[20:25], atol=1e-8)


def test_forecasting_smoke(tmp_path):
    # 200 steps, not the preset's 3: enough to see the loss fall (the compile is the cost)
    s = forecasting.main(["--smoke", "--steps=200", "--workdir", str(tmp_path)])
    assert_trained_on_all_devices(tmp_path, tmp_path / "seed0")
    # It learned: the one-step MSE (standardised units) falls from 0.65 (step 1) to a mean
    # of 0.20 over steps 191-200; single batches of 8 windows are noisy, hence the mean.
    assert_loss_dropped(tmp_path / "seed0", rel=0.35, tail=10)
    r = s["rmse"]
    assert len(r["rnn_mean"]) == 4 and all(np.isfinite(r["rnn_mean"]))
    # persistence is exact at horizon 0 only; its 1-step error is the mean |Δx| scale
    assert r["persistence"][0] < r["persistence"][-1]
    assert s["n_origins"] == s["n_test"] - 4 + 1
    assert (tmp_path / "forecasting.md").exists() and (tmp_path / "forecasting.png").exists()

"""Smoke run of the baselines experiment (Bishop §12.2.3–12.2.4 vs RNN / transformer)."""

import json
import math

from seqjax.experiments import baselines
from tests.experiments._devices import assert_trained_on_all_devices


def test_baselines_smoke(tmp_path):
    s = baselines.main(["--smoke", "--workdir", str(tmp_path)])
    assert_trained_on_all_devices(tmp_path, tmp_path / "lstm")
    lm = {r["model"]: r for r in s["rows"] if r["task"] == "lm"}
    cl = {r["model"]: r for r in s["rows"] if r["task"] == "classification"}
    assert set(lm) == {"bag of words (12.28)", "2-gram (12.32)", "LSTM LM",
                       "transformer LM (GPT)"}
    assert set(cl) == {"naive Bayes (12.29)-(12.30)", "2-gram Bayes classifier",
                       "GRU classifier", "transformer classifier"}
    # the bi-gram beats the bag of words on Tiny Shakespeare; both beat the uniform ln 65
    assert lm["2-gram (12.32)"]["nats"] < lm["bag of words (12.28)"]["nats"] < math.log(65)
    for r in s["rows"]:
        value = r["nats"] if r["task"] == "lm" else r["accuracy"]
        assert math.isfinite(value)
        if r["task"] == "lm":
            assert math.isclose(r["bpc"], r["nats"] / math.log(2))
    # naive Bayes tells English from French far above chance even on 64 training pairs
    assert cl["naive Bayes (12.29)-(12.30)"]["accuracy"] > 0.7
    saved = json.load(open(tmp_path / "baselines.json"))
    assert saved["lm_table_md"] == s["lm_table_md"]

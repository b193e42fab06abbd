"""Smoke run of the baselines experiment (Bishop §12.2.3–12.2.4 vs RNN / transformer)."""

import json
import math

from seqjax.experiments import baselines
from tests.experiments._devices import assert_trained_on_all_devices
from tests.experiments._learning import assert_loss_dropped

# Each network's fixed-seed drop of its training loss in 120 steps: step 1 against the mean
# of the last `tail` steps (batches of 8: single steps are noisy). Measured: GRU classifier
# 0.687 -> 0.603 (tail 10), LSTM LM 4.18 -> 3.46, transformer LM 4.16 -> 3.28, transformer
# classifier 0.697 -> 0.292 (tail 5).
LEARNED = {
    "gru": (0.06, 10),
    "lstm": (0.08, 5),
    "transformer": (0.1, 5),
    "transformer_cls": (0.2, 5),
}


def test_baselines_smoke(tmp_path):
    # 120 steps, not the preset's 3: enough to see every network learn
    s = baselines.main(["--smoke", "--steps=120", "--workdir", str(tmp_path)])
    assert_trained_on_all_devices(tmp_path, tmp_path / "lstm")
    for name, (rel, tail) in LEARNED.items():
        assert_loss_dropped(tmp_path / name, rel=rel, tail=tail)
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

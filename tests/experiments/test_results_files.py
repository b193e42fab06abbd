"""The committed results files regenerate: the cheap, deterministic recipes (or their
deterministic parts) are rerun at their full configuration and compared with the figures in
``seqjax/experiments/results/*.md``.

Covered here, each in under 10 s on one core:

* ``param_counts`` — the whole file (integer counts) regenerates line for line;
* ``dynamics`` — the whole file, every figure to the 3 significant digits it prints (part B's
  norms are computed in float64: at d = 40 the sigmoid rows reach 1e-38 and below, where
  float32 goes subnormal and its digits depend on the CPU; the "formula gap" column is
  round-off, ~1e-16, which differs from CPU to CPU: there both sides must be below 1e-6, the
  size the slides' product formula is checked to);
* ``complexity`` — the "Every length" rows at T = 64, 128 and 256 (FLOP counts, sequential
  operations and path lengths are integers from XLA and the jaxpr; the full run's 4096 is its
  65 s);
* ``toy_rnn`` — the full 2,000-step run: 748 parameters, the predictions and the training loss
  at steps 1, 100 and 2,000 as the file prints them;
* ``forecasting`` — the AR(9), persistence and climatology rows and the AR(9) one-step RMSE,
  which need no training (the GRU rows are 3 seeds × 1,500 steps: the full run's 17 s);
* ``baselines`` — the count models' rows (n-gram LMs on the whole Tiny Shakespeare training
  split, n-gram Bayes classifiers on the Tatoeba sample), where the full corpora are found;
* ``audio`` — the two classifiers' parameter counts at the full configuration;
* ``gradients`` — part A, the gradient-norm ratios at initialisation (float64, fixed seed);
  one row is chaotic and is checked for its explosion only (see the test);
* ``positions`` — MEDL Fig. 7.14(b)'s count of indices where the encodings of positions 50
  and 51 differ by more than 0.1.

A failure means the recipe no longer reproduces its results file: regenerate the file with
the command it names, or say in the change why the figures moved. The other recipes train
for minutes to hours; their smoke tests assert that they learned, not their published figures.
"""

import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.data.audio import num_frames
from seqjax.experiments import (
    audio,
    baselines,
    complexity,
    dynamics,
    forecasting,
    gradients,
    param_counts,
    positions,
    toy_rnn,
)
from seqjax.experiments.reports.gradients import ratio_at
from seqjax.utils import count_params

RESULTS = Path(__file__).resolve().parents[2] / "seqjax" / "experiments" / "results"
# The lines that describe the run, not its figures.
RUN_LINES = ("Command:", "Machine:", "Wall time:")
NUMBER = re.compile(r"[-−]?\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?")


def committed(name: str) -> str:
    return (RESULTS / name).read_text(encoding="utf-8")


def figures(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if not ln.startswith(RUN_LINES)]


def regenerate(module, name: str, tmp_path: Path, *options: str) -> str:
    """Run ``module`` with ``options`` and its results written to ``tmp_path``; the markdown."""
    module.main([*options, f"--workdir={tmp_path / 'work'}",
                 f"--results_dir={tmp_path / 'results'}"])
    return (tmp_path / "results" / name).read_text(encoding="utf-8")


def as_float(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))


def assert_same_figures(got: str, want: str, rtol: float, where: str) -> None:
    """``got`` and ``want`` are the same text with the same numbers up to ``rtol``."""
    assert NUMBER.sub("#", got) == NUMBER.sub("#", want), f"{where}:\n{got}\n{want}"
    for g, w in zip(NUMBER.findall(got), NUMBER.findall(want)):
        assert math.isclose(as_float(g), as_float(w), rel_tol=rtol), f"{where}: {g} vs {w}"


def test_param_counts_file_regenerates(tmp_path):
    got = regenerate(param_counts, "param_counts.md", tmp_path)
    assert figures(got) == figures(committed("param_counts.md"))


def test_dynamics_file_regenerates(tmp_path):
    got = figures(regenerate(dynamics, "dynamics.md", tmp_path))
    want = figures(committed("dynamics.md"))
    assert len(got) == len(want)
    gap = None
    for g, w in zip(got, want):
        if w.startswith("| form |"):
            gap = [c.strip() for c in w.strip("|").split("|")].index("formula gap")
        if w.startswith("| slides |") or w.startswith("| elman |"):
            gc = [c.strip() for c in g.strip("|").split("|")]
            wc = [c.strip() for c in w.strip("|").split("|")]
            assert max(as_float(gc[gap]), as_float(wc[gap])) < 1e-6, (g, w)
            g = "|".join(gc[:gap] + gc[gap + 1:])
            w = "|".join(wc[:gap] + wc[gap + 1:])
        # three significant digits are printed: 9.09e-13 may print as 9.1e-13
        assert_same_figures(g, w, rtol=0.015, where="dynamics.md")


def test_complexity_counts_regenerate(tmp_path):
    lengths = (64, 128, 256)
    got = regenerate(complexity, "complexity.md", tmp_path,
                     f"--lengths={','.join(map(str, lengths))}")

    row = re.compile(rf"\| ({'|'.join(complexity.MODELS)}) \| ({'|'.join(map(str, lengths))}) \|")

    def rows(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if row.match(ln)]

    want = rows(committed("complexity.md"))
    assert len(want) == len(complexity.MODELS) * len(lengths)
    assert rows(got) == want


def shown_as(value: float, text: str) -> bool:
    """``value`` rounds to ``text`` ("1.985", "1.1e-3") at the precision ``text`` shows."""
    mantissa = text.split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    form = f"{{:.{decimals}{'e' if 'e' in text else 'f'}}}"
    return float(form.format(value)) == float(text)


def test_toy_rnn_file_regenerates(tmp_path):
    s = toy_rnn.main([f"--workdir={tmp_path}", "--progress=false"])
    text = committed("toy_rnn.md")
    assert f"**Parameters: {s['params']}**" in text and s["params"] == 748
    assert f"**{s['correct']}/{s['positions']} next words correct.**" in text
    loss = dict(s["curve"])
    m = re.search(r"Training loss: ([\d.]+) at step 1 .*?,\s+([\d.e-]+) at step 100,\s+"
                  r"([\d.e-]+) at step 2,000", text, re.S)
    assert m, "toy_rnn.md no longer states the losses at steps 1, 100 and 2,000"
    for step, shown in zip((1, 100, 2000), m.groups()):
        assert shown_as(loss[step], shown), (step, loss[step], shown)


def test_forecasting_baselines_regenerate(tmp_path):
    """The rows that need no training, from a run whose GRU does not train (0 steps, 2 units:
    the quickest run of the same code path)."""
    got = regenerate(forecasting, "forecasting.md", tmp_path, "--steps=0", "--seeds=0",
                     "--model.hidden_size=2")
    text = committed("forecasting.md")

    def rows(md: str) -> list[str]:
        keep = ("| horizon", "| AR(", "| persistence", "| climatology")
        return [ln for ln in md.splitlines() if ln.startswith(keep)]

    assert len(rows(text)) == 4 and rows(got) == rows(text)
    one_step = re.compile(r"AR\(9\) ([\d.]+)\.")
    assert one_step.search(got).group(1) == one_step.search(text).group(1)


def test_baselines_count_models_regenerate():
    """The rows of the models that are counted, not trained, computed as the recipe does
    (its lm_task and classification_task) with the default Config."""
    from seqjax.data.corpora import tiny_shakespeare
    from seqjax.models.baselines import NGramClassifier, NGramLM

    cfg = baselines.Config(workdir=None)
    data = tiny_shakespeare(cfg.data_path)
    if len(data.train_ids) != 1_003_854:
        pytest.skip("needs the whole Tiny Shakespeare (the test fixture is a few KB)")
    try:
        lang = baselines.language_id_data(cfg)
    except ValueError:
        pytest.skip("needs the whole fra-eng.txt (the test fixture is a few KB)")
    text = committed("baselines.md")

    def row(name: str) -> list[str]:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {name} |"))
        return [c.strip() for c in line.strip("|").split("|")]

    val = data.val_ids[: cfg.lm_eval_chars]
    for order in cfg.ngram_orders:
        nll = NGramLM(order, data.tokenizer.vocab_size, k=cfg.add_k).fit(data.train_ids).nll(val)
        name = "bag of words (12.28)" if order == 1 else f"{order}-gram (12.32)"
        assert row(name)[2:4] == [f"{nll:.3f}", f"{nll / math.log(2):.3f}"], name
    (train, train_y), (test, test_y) = lang["train"], lang["test"]
    for order in cfg.class_orders:
        clf = NGramClassifier(order, lang["vocab_size"], 2, k=cfg.add_k).fit(train, train_y)
        accuracy = 100 * float(np.mean(clf.predict(test) == test_y))
        name = "naive Bayes (12.29)-(12.30)" if order == 1 else f"{order}-gram Bayes classifier"
        assert row(name)[2] == f"{accuracy:.2f}", name


def test_audio_parameter_counts_regenerate():
    cfg = audio.Config(workdir=None)
    frames = num_frames(cfg.num_samples, cfg.n_fft, cfg.hop_length)
    text = committed("audio.md")
    assert f"log-mel spectrogram in JAX (HTK scale, Hann window n_fft = {cfg.n_fft}, hop " \
        f"{cfg.hop_length}, {cfg.n_mels} bins: {frames} frames × {cfg.n_mels})" in text
    for name, row in (("ast", "Audio Spectrogram Transformer"), ("cnn", "CNN on the spectrogram")):
        model = audio.make_classifier(name, cfg, frames)
        shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                                jnp.zeros((1, frames, cfg.n_mels)))
        assert f"| {row} | {count_params(shapes['params']):,} |" in text, name


# The tanh RNN with ‖W_hh‖ = 2 and small inputs is chaotic: over 300 steps it amplifies the
# last bit of float64 rounding, so its ratios depend on how XLA compiles the step. The file's
# row (1.14 … 3.39e+19 at d = 299) regenerates exactly at XLA's default optimisation level,
# while this suite's level 0 (tests/conftest.py) gives 1.16 … 7.55e+18. Both explode.
CHAOTIC = "elman tanh, x~N(0,0.1²), rho=2"


def test_gradients_part_a_regenerates():
    profiles = gradients.part_a(gradients.Config(workdir=None))
    section = committed("gradients.md").split("## A.")[1].split("Trained on the adding")[0]
    table = [[c.strip() for c in ln.strip("|").split("|")]
             for ln in section.splitlines() if ln.startswith("| ")]
    header, rows = table[0], {r[0]: r[1:] for r in table[1:]}
    distances = [int(h.removeprefix("d=")) for h in header[1:]]
    assert set(profiles) < set(rows) and len(profiles) == 14
    for name, profile in profiles.items():
        got = [f"{ratio_at(profile, d):.3g}" for d in distances]
        if name == CHAOTIC:
            assert float(got[-1]) > 1e15 and float(rows[name][-1]) > 1e15, (got, rows[name])
        else:
            assert got == rows[name], name


def test_positions_medl_fig_7_14_count_regenerates():
    stats = positions.medl_fig_7_14(positions.Config())
    m = re.search(r"> 0\.1 at (\d+) of (\d+) indices, the last at j = (\d+)",
                  committed("positions.md"))
    assert m, "positions.md no longer states the count of Fig. 7.14(b)"
    got = (stats["count_above_0.1"], stats["r"].shape[1], stats["last_j_above_0.1"])
    assert got == tuple(int(g) for g in m.groups())


@pytest.mark.parametrize("text, value, ok", [
    ("1.985", 1.98484, True), ("1.985", 1.9844, False), ("1.1e-3", 0.0011272, True),
    ("2.0e-5", 1.9646e-05, True), ("2.0e-5", 2.06e-05, False),
])
def test_shown_as(text, value, ok):
    assert shown_as(value, text) is ok

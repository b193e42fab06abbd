"""Smoke runs and numerical checks of the experiments gradients, char_lm, positions,
norm_placement and param_counts."""

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.data.corpora import resolve_corpus
from seqjax.data.shards import TokenData
from seqjax.data.synthetic import EOS_ID
from seqjax.experiments import char_lm, gpt2, gradients, norm_placement, param_counts, positions
from seqjax.experiments._config import ConfigError, apply_overrides
from seqjax.experiments._kit import command_line
from seqjax.experiments._runner import build_config
from seqjax.experiments._text import load_model, sample_ids
from seqjax.experiments.reports import char_lm as char_lm_report
from seqjax.experiments.reports.gradients import ratio_at
from seqjax.experiments.reports.param_counts import MEDL_TOTAL
from tests.experiments._devices import assert_trained_on_all_devices
from tests.experiments._learning import assert_curve_learned, assert_loss_dropped

# ----------------------------------------------------------------------------- param_counts


def test_medl_formula_7_32():
    assert param_counts.medl_formula() == {"encoder_block": 3_150_336,
                                           "decoder_block": 4_199_936}


def test_param_counts_smoke_measures_the_base_transformer(tmp_path):
    s = param_counts.main(["--smoke", "--workdir", str(tmp_path)])
    medl, vaswani = s["medl"], s["vaswani"]
    assert medl["encoder block"] == 3_150_336 and medl["decoder block"] == 4_199_936
    # MEDL prints d_V p + p for the output layer; the model has one bias per word.
    assert medl["total"] - MEDL_TOTAL == 37_000 - 512
    assert vaswani["total"] - medl["total"] == 18 * 4 * 512  # attention biases
    assert s["presets"]["nanogpt-cpu"]["total"] == 805_248
    text = (tmp_path / "param_counts.md").read_text()
    assert "63,046,144" in text and "63,082,632" in text


# ----------------------------------------------------------------------------- gradients


def test_gradients_smoke(tmp_path):
    s = gradients.main(["--smoke", "--steps=30", "--workdir", str(tmp_path)])  # 30: it learns
    assert_trained_on_all_devices(tmp_path)
    assert {r["cell"] for r in s["runs"]} == {"lstm"}
    run = s["runs"][0]
    assert math.isfinite(run["test_mse"]) and 0.0 <= run["clipped_fraction"] <= 1.0
    # It learned: the adding problem's training MSE, a mean over steps 1-5 against one over
    # steps 26-30 (batches of 8: single steps are noisy), falls from 1.42 to 0.21; with a
    # learning rate of 1e-9 the same means are 1.51 and 1.32.
    assert_curve_learned(run["train_curve"], rel=0.5, head=5, tail=5, what="adding MSE")
    # MEDL (7.12): identity activation, no input: ‖ζ_{T-d}‖ = ρ^d ‖ζ_T‖ (W_hh = ρQ)
    prof = s["profiles"]["elman linear, x=0 (MEDL 7.12), rho=1.2"]
    np.testing.assert_allclose([ratio_at(prof, d) for d in range(12)],
                               1.2 ** np.arange(12), rtol=1e-9)
    for name in ("gradients.md", "gradients_distance.png", "gradients_adding.png"):
        assert (tmp_path / name).exists()


# ----------------------------------------------------------------------------- positions


def test_medl_fig_7_14_difference_spans_about_180_indices():
    stats = positions.medl_fig_7_14(positions.Config())
    assert stats["r"].shape == (4000, 768)
    assert -1.0 <= stats["min"] and stats["max"] <= 1.0
    assert stats["last_j_above_0.1"] == 180


@pytest.mark.parametrize("task, transform", [("reverse", lambda s: s[::-1]), ("sort", np.sort)])
def test_make_examples_layout(task, transform):
    d = positions.make_examples(task, 3, 1, 4, 10, 5, seed=0)
    for i, n in enumerate(d["length"]):
        src = d["inputs"][i, :n]
        assert d["inputs"][i, n] == positions.SEP
        tgt = d["targets"][i][d["mask"][i]]
        np.testing.assert_array_equal(tgt[:-1], transform(src))
        assert tgt[-1] == EOS_ID
        assert d["mask"][i].sum() == n + 1


def test_positions_smoke(tmp_path):
    s = positions.main(["--smoke", "--steps=40", "--workdir", str(tmp_path)])  # 40: it learns
    assert_trained_on_all_devices(tmp_path)
    (r,) = s["runs"]
    assert r["positions"] == "rope" and set(r["exact"]) == {1, 2, 3, 4}
    # It learned: the reversal's training loss falls from 2.46 (step 1) to 1.66, the mean of
    # the last 5 logged steps (32-40; batches of 8: single steps are noisy). With a learning
    # rate of 1e-9 that mean is 2.81.
    assert_curve_learned(r["curve"], rel=0.15, tail=5, what="reverse-task loss")
    assert all(0.0 <= v <= 1.0 for v in r["token_accuracy"].values())
    for name in ("positions.md", "positions_medl_fig7_14.png", "positions_bishop_fig12_10.png",
                 "positions_ablation.png"):
        assert (tmp_path / name).exists()


def test_positions_keep_previous_reads_nested_and_flat_saved_configs(tmp_path):
    """``--keep_previous`` compares the saved summary's config with this run's, the network's
    options under ``model`` (``model.num_heads``) or flat, as saved before the group."""
    cfg = apply_overrides(positions.Config(), {**positions.PRESETS["smoke"],
                                               "keep_previous": True, "workdir": str(tmp_path)})
    nested = dataclasses.asdict(cfg)
    flat = {k: v for k, v in nested.items() if k != "model"} | nested["model"]
    row = {"task": "reverse", "positions": "none", "exact": {"1": 1.0},
           "token_accuracy": {"1": 0.5}}
    other = apply_overrides(cfg, {"model.num_heads": 4})
    for saved in (nested, flat):
        (tmp_path / "positions.json").write_text(json.dumps(
            {"config": saved, "runs": [dict(row)], "wall_s": 1.0, "load_average": ["0", "0"]}))
        runs, sessions = positions._previous(cfg)
        assert runs == [{**row, "exact": {1: 1.0}, "token_accuracy": {1: 0.5}}]
        assert sessions[0]["command"] == command_line("positions", cfg)  # --model.num_heads=2
        with pytest.raises(ValueError, match=r"other settings for \['model.num_heads'\]"):
            positions._previous(other)
    # a session recorded before the group: its command is shown as it is spelled now
    old = command_line("positions", cfg).replace("--model.", "--")
    (tmp_path / "positions.json").write_text(json.dumps(
        {"config": flat, "runs": [dict(row)], "sessions": [{"command": old, "wall_s": 1.0,
                                                              "load_average": ["0", "0"]}]}))
    assert positions._previous(cfg)[1][0]["command"] == command_line("positions", cfg)


# ----------------------------------------------------------------------------- norm_placement


def test_norm_placement_smoke(tmp_path):
    s = norm_placement.main(["--smoke", "--steps=80", "--workdir", str(tmp_path)])  # 80: learns
    assert_trained_on_all_devices(tmp_path)
    (r,) = s["runs"]
    assert r["norm"] == "post" and r["status"] == "completed" and math.isfinite(r["val_loss"])
    # It learned: the character loss falls from 4.17 (step 1) to 3.27, the mean of steps
    # 76-80. With a learning rate of 1e-9 that mean is 4.17.
    assert_curve_learned(r["curve"], rel=0.08, tail=5, what="post-norm LM loss")
    assert (tmp_path / "norm_placement.png").exists()


# ----------------------------------------------------------------------------- char_lm


def test_full_validation_predicts_every_character_once():
    tokens = TokenData(train=[np.arange(100)], val=[np.arange(100)], format="nanogpt",
                       manifest=None, paths={})
    cfg = char_lm.Config(block_size=8)
    batches = list(gpt2.validation_windows(cfg, tokens, 4))  # --val_tokens 0: all of it
    assert all(b["inputs"].shape == (4, 8) for b in batches)
    x = np.concatenate([b["inputs"][b["mask"]] for b in batches])
    y = np.concatenate([b["targets"][b["mask"]] for b in batches])
    np.testing.assert_array_equal(x, tokens.val[0][:-1])
    np.testing.assert_array_equal(y, tokens.val[0][1:])


def test_window_decoder_matches_nanogpt_cropping():
    """Greedy decoding past the block size = argmax of the model on the last `block` tokens."""
    cfg = char_lm.Config(model=gpt2.ModelOptions(num_layers=1, num_heads=1, embed_dim=8),
                         block_size=4, vocab_size=11)
    model = char_lm.build_model(cfg)
    params = model.init(jax.random.PRNGKey(3), jnp.zeros((1, 4), jnp.int32))["params"]
    got = sample_ids(model, params, cfg.block_size, [1, 2, 3, 4], max_new_tokens=5,
                     temperature=0.0, top_k=0, seed=0)
    apply = jax.jit(model.apply)
    seq = [1, 2, 3, 4]
    for _ in range(5):  # nanoGPT: crop the context to the last block_size tokens
        logits = apply({"params": params}, jnp.asarray([seq[-4:]]))
        seq.append(int(jnp.argmax(logits[0, -1])))
    assert got == seq[4:]


def test_char_lm_smoke_checkpoint_and_load_model(tmp_path):
    workdir = str(tmp_path / "lm")
    # 100 steps, not the preset's 4: enough to see the loss fall
    s = char_lm.main(["--smoke", "--steps=100", "--eval_every=50", "--workdir", workdir,
                      "--progress=false"])
    assert_trained_on_all_devices(workdir)
    assert s["steps"] == 100 and math.isfinite(s["val_loss"])
    n = min(20000, len(resolve_corpus("tinyshakespeare.txt").read_text(encoding="utf-8")))
    assert s["val_tokens"] == n - int(0.9 * n) - 1  # the whole validation split but its first
    # It learned: the training loss falls from ln 65 = 4.18 (step 1) to 3.55, the mean of the
    # last 5 logged steps (92-100). With a learning rate of 1e-9 that mean is 4.18.
    assert_loss_dropped(workdir, rel=0.08, tail=5)
    assert s["val_loss_estimate"] < math.log(65) + 0.2
    assert len(s["sample"]) == 1 + 24 and s["sample"][0] == "\n"  # the prompt, then 24
    saved = json.load(open(os.path.join(workdir, "char_lm.json")))
    assert saved["params"] == s["params"]
    # results/char_lm.md is written from finished work dirs: the table holds this run's figures
    md = char_lm_report.write_results([workdir], str(tmp_path / "results"), {workdir: "CMD"})
    assert "`CMD`" in md and f"{s['val_loss_estimate']:.4f}" in md
    assert os.path.isfile(tmp_path / "results" / "char_lm_loss.png")
    model, params, tok, cfg = load_model(workdir)
    assert tok.vocab_size == 65 and cfg.block_size == 16
    logits = model.apply({"params": params}, jnp.asarray([tok.encode("ROMEO:")]))
    assert logits.shape == (1, 6, 65)
    # eval refuses a network other than the checkpoint's, naming the group's key (the
    # checkpoint records it flat: num_layers, and "model" for the architecture)
    from seqjax.experiments._runner import experiment_from_workdir
    from seqjax.train.checkpoint import CheckpointMismatchError

    for override in ("--model.num_layers=3", "--model.embed_dim=32"):
        with pytest.raises(CheckpointMismatchError, match=f"{override} but the checkpoint has"):
            experiment_from_workdir(None, workdir, [override])
    assert experiment_from_workdir(None, workdir, [])[1].model == cfg.model


def test_char_lm_configs():
    gpu = char_lm.PRESETS["gpu"]
    assert gpu["model.embed_dim"] == 384 and gpu["steps"] == 5000
    lstm = char_lm.build_model(apply_overrides(char_lm.Config(), char_lm.PRESETS["lstm"]))
    n = sum(np.prod(a.shape) for a in jax.tree_util.tree_leaves(jax.eval_shape(
        lambda k: lstm.init(k, jnp.zeros((1, 8), jnp.int32)), jax.random.PRNGKey(0))))
    assert 0.75e6 < n < 0.9e6  # "similar size" to the 0.80M transformer
    with pytest.raises(ConfigError, match="--model.architecture: expected one of"):
        build_config(char_lm, "char_lm", ["--model.architecture=gru"], resume=False)


def test_lstm_generates():
    cfg = char_lm.Config(model=gpt2.ModelOptions(architecture="lstm", num_layers=1, embed_dim=8),
                         vocab_size=11)
    model = char_lm.build_model(cfg)
    hash(model)  # a static argument of the jitted decoding loop
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))["params"]
    out = sample_ids(model, params, cfg.block_size, [1, 2], max_new_tokens=3, temperature=0.8,
                     top_k=5, seed=0)
    assert len(out) == 3 and all(0 <= t < 11 for t in out)


def test_char_lm_sampler_compiled_ahead_is_the_one_the_sample_runs():
    """compile_sampler_ahead (run on accelerators while training runs) compiles the exact
    program of the end-of-run sample: generating afterwards compiles no sampling loop."""
    import logging

    cfg = apply_overrides(char_lm.Config(), {**char_lm.PRESETS["smoke"], "workdir": None,
                                             "sample_tokens": 9})
    model = char_lm.build_model(cfg)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, cfg.block_size), jnp.int32))
    params = params["params"]
    gpt2.compile_sampler_ahead(model, params, cfg, [0]).join()
    compiled = []

    class Compiles(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Compiling "):
                compiled.append(record.getMessage()[:60])

    handler = Compiles()
    logger = logging.getLogger("jax._src.interpreters.pxla")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):  # this thread only: the sample runs here
            out = sample_ids(model, jax.device_get(params), cfg.block_size, [0],
                             max_new_tokens=9, temperature=cfg.sample_temperature,
                             top_k=cfg.sample_top_k, seed=cfg.seed)
    finally:
        logger.removeHandler(handler)
    assert len(out) == 9
    assert not [c for c in compiled if "_sample_loop" in c], compiled


def test_a_work_dir_of_an_older_char_lm_is_refused_by_name(tmp_path, capsys):
    """A work dir whose experiment.json holds an option since removed (char_lm's
    ``full_val`` before it became the GPT recipe's preset): one line naming the work dir."""
    from seqjax import cli

    (tmp_path / "experiment.json").write_text(json.dumps(
        {"experiment": "char_lm", "config": {"full_val": True, "steps": 4}}))
    for argv in (["train", "char_lm", "--smoke"], ["generate", "--prompt", "a"]):
        assert cli.main([*argv, "--workdir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"the work dir {str(tmp_path)!r} holds a config this version cannot read" in err
        assert "--full_val" in err and "new --workdir" in err

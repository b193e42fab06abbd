"""The side-by-side benchmark against nanoGPT's own ``train.py``
(``benchmarks/nanogpt_gpt2.py``): its parsers, commands and report without a nanoGPT
checkout; its ``--smoke`` end to end where one is given (``NANOGPT_DIR=PATH``, a
``git clone https://github.com/karpathy/nanoGPT``), skipped with the reason otherwise."""

from __future__ import annotations

import ast
import json
import os
import re

import numpy as np
import pytest

from benchmarks import nanogpt_gpt2 as bench

NANOGPT_LOG = """\
tokens per iteration will be: 768
Initializing a new model from scratch
defaulting to vocab_size of GPT-2 to 50304 (50257 rounded up for efficiency)
number of parameters: 7.23M
num decayed parameter tensors: 18, with 7,233,536 parameters
num non-decayed parameter tensors: 9, with 1,152 parameters
using fused AdamW: False
step 0: train loss 10.8478, val loss 10.8418
iter 0: loss 10.8498, time 95842.91ms, mfu -100.00%
iter 1: loss 10.8411, time 400.00ms, mfu -100.00%
iter 2: loss 10.8264, time 410.00ms, mfu -100.00%
iter 3: loss 10.8168, time 420.00ms, mfu -100.00%
step 4: train loss 10.2274, val loss 10.2118
saving checkpoint to out
iter 4: loss 10.2114, time 64328.88ms, mfu 0.02%
"""


def test_nanogpt_log_gives_the_last_evaluation_the_iterations_and_the_parameters():
    parsed = bench.parse_nanogpt_log(NANOGPT_LOG, steps=4)
    assert (parsed["train_loss"], parsed["val_loss"]) == (10.2274, 10.2118)
    assert parsed["iter_ms"] == {0: 95842.91, 1: 400.0, 2: 410.0, 3: 420.0, 4: 64328.88}
    assert parsed["params"] == 7_234_688
    # iterations 0 and 4 carry an evaluation each: the step is the mean of 1..3
    assert bench.nanogpt_step_ms(parsed["iter_ms"], 4) == pytest.approx((410.0, 410.0))
    with pytest.raises(ValueError, match="step 5"):
        bench.parse_nanogpt_log(NANOGPT_LOG, steps=5)
    with pytest.raises(ValueError, match="logged 4 of the iterations 1..5"):
        bench.nanogpt_step_ms(parsed["iter_ms"], 6)


def test_seqjax_workdir_gives_val_loss_loop_time_and_the_steady_step(tmp_path):
    (tmp_path / "gpt2.json").write_text(json.dumps(
        {"val_loss": 6.25, "steps": 30, "params": 7_234_688, "train_wall_s": 20.0,
         "wall_s": 21.0}))
    records = [{"step": 10, "loss": 9.0, "time": 5.0, "steps_per_s": 2.0},
               {"step": 20, "loss": 8.0, "time": 8.0, "steps_per_s": 3.3},
               {"step": 30, "loss": 7.0, "time": 11.0, "eval/loss": 6.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    parsed = bench.parse_seqjax_workdir(tmp_path, 30)
    assert parsed["val_loss"] == 6.25 and parsed["params"] == 7_234_688
    assert parsed["loop_s"] == 11.0  # the first call (with its compilation) included
    assert parsed["ms_per_step"] == pytest.approx(1e3 * 6.0 / 20)  # steps 11..30
    assert parsed["ms_median"] == pytest.approx(300.0)
    with pytest.raises(ValueError, match="expected a val loss after 40"):
        bench.parse_seqjax_workdir(tmp_path, 40)


def test_nanogpt_command_is_the_setup_in_configurator_types():
    """Every --key=value reads back (literal_eval, as configurator.py) with the type of
    train.py's default, and the run evaluates only at 0 and at the last step."""
    defaults = {"dataset": "", "device": "", "compile": True, "dtype": "", "block_size": 0,
                "batch_size": 0, "n_layer": 0, "n_head": 0, "n_embd": 0, "dropout": 0.0,
                "bias": False, "max_iters": 0, "lr_decay_iters": 0, "warmup_iters": 0,
                "learning_rate": 0.0, "min_lr": 0.0, "beta2": 0.0, "weight_decay": 0.0,
                "grad_clip": 0.0, "eval_interval": 0, "eval_iters": 0, "log_interval": 0,
                "out_dir": ""}
    cmd = bench.nanogpt_command(bench.DEFAULT, 500, python="python")
    assert cmd[:3] == ["python", "train.py", "config/train_shakespeare_char.py"]
    got = {}
    for arg in cmd[3:]:
        key, val = arg[2:].split("=")
        try:
            value = ast.literal_eval(val)
        except (SyntaxError, ValueError):
            value = val
        assert type(value) is type(defaults[key]), arg
        got[key] = value
    assert set(got) == set(defaults)
    assert got["max_iters"] == got["lr_decay_iters"] == got["eval_interval"] == 500
    assert (got["n_layer"], got["n_head"], got["n_embd"], got["block_size"],
            got["batch_size"]) == (4, 4, 128, 64, 12)
    assert (got["learning_rate"], got["min_lr"], got["warmup_iters"], got["beta2"],
            got["weight_decay"], got["grad_clip"]) == (1e-3, 1e-4, 100, 0.99, 0.1, 1.0)
    assert (got["bias"], got["dropout"], got["compile"], got["dtype"], got["device"],
            got["dataset"], got["eval_iters"], got["log_interval"]) == (
        False, 0.0, False, "float32", "cpu", "shakespeare", 200, 1)
    with pytest.raises(ValueError, match="warm-up"):
        bench.nanogpt_command(bench.DEFAULT, 100)
    with pytest.raises(ValueError, match="exact GELU only"):
        bench.nanogpt_command(bench.Setup(activation="gelu_tanh"), 500)
    biased = bench.nanogpt_command(bench.Setup(use_bias=True), 500)
    assert "--bias=True" in biased


def _recipe_config(cmd):
    """The config ``seqjax train gpt2`` reads from a command of :func:`bench.seqjax_command`."""
    from seqjax.experiments._runner import build_config, load_experiment

    assert cmd[3:5] == ["train", "gpt2"]
    return build_config(load_experiment("gpt2"), "gpt2", cmd[5:], resume=False)


def test_the_default_setup_is_seqjaxs_cpu_preset():
    """``--preset cpu`` alone is the default setup: no option is added to the command."""
    preset = bench.seqjax_cpu_preset()
    # every option the comparison sets or checks is one of the recipe's (``model.KEY``: the
    # network's group), so that none is silently missed
    assert {*bench.SEQJAX_FIXED, *bench.SEQJAX_KEYS.values(), "min_lr_ratio"} <= set(preset)
    assert bench.seqjax_overrides(bench.DEFAULT, preset) == {}
    cmd = bench.seqjax_command(bench.DEFAULT, "D", 500, 1, "W", preset, python="py")
    assert cmd == ["py", "-m", "seqjax.cli", "train", "gpt2", "--preset", "cpu", "--data_path",
                   "D", "--steps", "500", "--seed", "1", "--workdir", "W", "--progress", "false",
                   "--sample_tokens", "0"]
    assert bench.shown(cmd).startswith("seqjax train gpt2 --preset cpu --data_path D")
    smoke = bench.seqjax_overrides(bench.SMOKE, preset)
    assert smoke == {"model.num_layers": 1, "model.num_heads": 2, "model.embed_dim": 16,
                     "block_size": 16, "batch_size": 8, "warmup_steps": 2, "val_tokens": 256,
                     "log_every": 1, "steps_per_call": 1}
    cfg = _recipe_config(bench.seqjax_command(bench.SMOKE, "D", 4, 0, "W", preset))
    assert (cfg.model.num_layers, cfg.model.num_heads, cfg.model.embed_dim, cfg.block_size,
            cfg.batch_size, cfg.val_tokens) == (1, 2, 16, 16, 8, 256)
    assert (cfg.model.use_bias, cfg.model.activation, cfg.model.dropout_rate) == (
        False, "gelu", 0.0)
    assert bench.seqjax_overrides(bench.Setup(min_lr=5e-5), preset) == {"min_lr_ratio": 0.05}
    assert bench.seqjax_overrides(bench.Setup(use_bias=True), preset) == {
        "model.use_bias": True}
    with pytest.raises(ValueError, match="eval_every"):
        bench.seqjax_overrides(bench.DEFAULT, {**preset, "eval_every": 250})


def test_seed_line_is_replaced_once(tmp_path):
    (tmp_path / "train.py").write_text(f"import torch\n{bench.SEED_LINE}\nx = 1\n")
    bench.seeded_train_py(tmp_path, 2)
    text = (tmp_path / "train.py").read_text()
    assert "torch.manual_seed(1337 + seed_offset + 2)\n" in text and bench.SEED_LINE not in text
    bench.seeded_train_py(tmp_path, 0)  # from the kept original, not the seed-2 copy
    assert "torch.manual_seed(1337 + seed_offset + 0)\n" in (tmp_path / "train.py").read_text()
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.py").write_text("torch.manual_seed(0)\n")
    with pytest.raises(RuntimeError, match="expected one"):
        bench.seeded_train_py(other, 1)


def _result(side, seed, val, wall, ms, params=7_234_688):
    return bench.RunResult(side, seed, val, wall, 500 * ms / 1e3, ms, ms - 10, params,
                           "1.00 1.00 1.00", "1.50 1.00 1.00")


def test_report_gives_ratios_the_readme_row_and_the_commands():
    results = [_result("nanoGPT", 0, 6.0, 360.0, 400.0), _result("seqjax", 0, 6.1, 200.0, 350.0),
               _result("nanoGPT", 1, 6.2, 340.0, 410.0), _result("seqjax", 1, 6.1, 180.0, 340.0)]
    s = bench.summarize(results)
    assert s["wall_ratio"] == pytest.approx(350 / 190)
    assert s["step_ratio"] == pytest.approx(405 / 345)
    assert s["median_ratio"] == pytest.approx(395 / 335)
    assert s["val_diff"] == pytest.approx(0.0)
    text = bench.report(results, bench.DEFAULT, 500, "TOKENS", "PREPARE", ["CMD1", "CMD2"],
                        "NANO")
    assert "| seqjax  |    2 |" in text and "6.1000 ± 0.0000" in text
    assert "350.0 ± 14.1" in text  # nanoGPT wall, sample sd
    assert "7,234,688 each side" in text and "    CMD2" in text
    row = [line for line in text.splitlines() if line.startswith("| GPT-2 BPE")]
    assert len(row) == 1 and "**1.84×** wall, 1.17× per step; val +0.000 |" in row[0]
    assert "4L/4H/128, T=64, B=12, 500 steps" in row[0] and "seeds 0,1" in row[0]
    odd = bench.report([_result("nanoGPT", 0, 6, 1, 1, params=7), results[1]], bench.DEFAULT,
                       500, "", "", [], "")
    assert "(DIFFERENT)" in odd
    with pytest.raises(ValueError, match="both sides"):
        bench.summarize(results[:1])


def test_without_a_checkout_smoke_skips_and_a_full_run_refuses(monkeypatch, capsys):
    monkeypatch.delenv("NANOGPT_DIR", raising=False)
    found, why = bench.locate_nanogpt(None, clone_into=None)
    assert found is None and "--nanogpt_dir" in why
    if bench.default_rank_file() is None:
        pytest.skip("no GPT-2 rank file (openai-whisper not installed)")
    assert bench.main(["--smoke", "--no_clone"]) == 0
    assert "nanogpt_gpt2: skipped: no nanoGPT checkout" in capsys.readouterr().out
    assert bench.main(["--no_clone", "--steps", "200", "--data_path", str(bench.FIXTURE)]) == 2
    assert "no nanoGPT checkout" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--smoke", "--steps", "2"])  # not past the warm-up
    found, why = bench.locate_nanogpt(os.devnull, clone_into=None)
    assert found is None and "not a nanoGPT checkout" in why


def _rank_file() -> str:
    path = bench.default_rank_file()
    if path is None:
        pytest.skip("no GPT-2 rank file (openai-whisper not installed)")
    return path


def test_offline_encoding_is_gpt2s_and_the_patch_is_undone():
    tiktoken = pytest.importorskip("tiktoken")
    original = tiktoken.get_encoding
    enc = bench.gpt2_encoding(_rank_file())
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    with bench._offline_tiktoken(_rank_file()):
        assert tiktoken.get_encoding("gpt2").encode_ordinary(" the") == [262]
    assert tiktoken.get_encoding is original


@pytest.mark.slow
def test_seqjax_prepare_matches_nanogpts_bytes_or_is_not_there_yet(tmp_path):
    """nanoGPT's prepare.py's bytes for a small text (its 90/10 split by characters, each part
    encoded, uint16), against ``seqjax prepare``'s, when the CLI has it."""
    rank_file = _rank_file()
    text = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n" * 40
            + "All:\nSpeak, speak.\n")
    corpus = tmp_path / "input.txt"
    corpus.write_text(text, encoding="utf-8")
    ref = tmp_path / "ref"
    ref.mkdir()
    enc = bench.gpt2_encoding(rank_file)
    n = len(text)
    for name, part in (("train.bin", text[: int(n * 0.9)]), ("val.bin", text[int(n * 0.9):])):
        np.array(enc.encode_ordinary(part), dtype=np.uint16).tofile(ref / name)
    status, note = bench.check_seqjax_prepare(corpus, rank_file, ref, tmp_path / "ours")
    assert status in ("identical", "unavailable"), note


@pytest.mark.slow
def test_smoke_runs_both_sides_with_a_nanogpt_checkout(capsys):
    folder = os.environ.get("NANOGPT_DIR")
    if not folder:
        pytest.skip("set NANOGPT_DIR to a nanoGPT checkout (git clone "
                    "https://github.com/karpathy/nanoGPT) to run nanoGPT's train.py")
    _rank_file()
    assert bench.main(["--smoke", "--no_clone", "--nanogpt_dir", folder]) == 0
    out = capsys.readouterr().out
    if "nanogpt_gpt2: skipped:" in out:
        pytest.skip(out.split("nanogpt_gpt2: skipped:")[1].strip())
    assert "| nanoGPT |    0 |" in out and "| seqjax  |    0 |" in out
    assert "808,240 each side" in out  # 1L/2H/16 at |V| = 50304, no biases
    assert re.search(r"^nanogpt_gpt2: wall ratio \d+\.\d\d×; ms/step ratio \d+\.\d\d×; "
                     r"val loss seqjax − nanoGPT [-+]\d\.\d{4}$", out.strip().splitlines()[-1])


def test_the_gpu_setup_is_nanogpts_train_gpt2_and_seqjaxs_124m_preset():
    """``--preset 124m``: nanoGPT's config/train_gpt2.py (compile, bf16, 40 micro-steps of 12
    rows, no wandb) against ``seqjax train gpt2 --preset 124m`` with the same 480 rows."""
    g = bench.GPT2_124M
    cmd = bench.nanogpt_command(g, 100, python="python")
    assert cmd[:3] == ["python", "train.py", "config/train_gpt2.py"]
    for flag in ("--device=cuda", "--compile=True", "--dtype=bfloat16", "--bias=False",
                 "--gradient_accumulation_steps=40", "--wandb_log=False", "--n_layer=12",
                 "--block_size=1024", "--batch_size=12"):
        assert flag in cmd, flag
    ours = bench.seqjax_command(g, "D", 100, 0, "W", bench.seqjax_cpu_preset("124m"),
                                python="python")
    assert ours[ours.index("--preset") + 1] == "124m"
    for flag in ("--batch_size=480", "--micro_batch_size=12", "--eval_every=0",
                 "--model.use_bias=False", "--model.activation=gelu"):
        assert flag in ours, flag
    assert "--compute_dtype=bfloat16" not in ours  # the preset's already
    cfg = _recipe_config(ours)
    assert (cfg.model.num_layers, cfg.model.embed_dim, cfg.model.use_bias,
            cfg.model.activation, cfg.batch_size, cfg.micro_batch_size, cfg.compute_dtype) == (
        12, 768, False, "gelu", 480, 12, "bfloat16")
    assert g.rows * g.block_size == 491_520

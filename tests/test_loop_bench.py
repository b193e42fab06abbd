"""benchmarks.loop and benchmarks.gpu: smoke runs, parsers and the targets table
(speed itself is never asserted)."""

import json
import re

import pytest

from benchmarks import gpu, loop


def test_loop_smoke_prints_every_mode_and_the_summary_line(capsys):
    assert loop.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    for mode in ("compiled step, sync every step", "bare loop, device batches, async",
                 "fit, host windows, steps_per_call=1", "fit, device windows, steps_per_call=2",
                 "null step: fit, device windows, steps_per_call=1"):
        assert mode in out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"fit/step: [0-9.]+; host us/step: [0-9.]+", last)
    parsed = gpu.parse_loop(out)
    assert parsed["rows"]["compiled step, sync every step"] > 0
    assert parsed["host_us"] > 0 and parsed["finished"]
    # a run cut short keeps the rows it printed, and the ratio where both rows are there
    cut = "\n".join(line for line in out.splitlines() if line.startswith("loop: "))
    partial = gpu.parse_loop(cut)
    assert not partial["finished"] and partial["host_us"] is None
    assert partial["fit_over_step"] > 0


def test_loop_null_only_compiles_no_real_step(capsys):
    assert loop.main(["--smoke", "--null-only"]) == 0
    out = capsys.readouterr().out
    assert "loop: compiled step" not in out and "loop: null step: fit" in out
    assert "fit/step: n/a (--null-only)" in out


def test_gpu_smoke_runs_parts_in_processes_and_prints_the_targets(capsys, tmp_path):
    assert gpu.main(["--smoke", "--parts", "char_lm,rnn,kernels", "--out-dir",
                     str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[char_lm]" in out and "ok" in out and "[rnn]" in out and "[kernels]" in out
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["char_lm"]["steps"] == 4 and results["rnn"]["seqjax_lstm_ms"] > 0
    kernels = results["kernels"]
    assert not kernels["errors"]
    groups = {(r["group"], r["peer"]) for r in kernels["rows"]}
    assert {("attention core", "seqjax xla"), ("LSTM layer", "seqjax scan"),
            ("scans", "associative"), ("scans", "chunked")} <= groups
    assert all(r["rate"] > 0 and r["ms"] > 0 for r in kernels["rows"])
    assert "| workload " in (tmp_path / "kernels.log").read_text()  # the table, in the log
    assert "## Targets: measured, missed or unmeasured" in out
    assert "GPT-2 124M" in out and "unmeasured" in out  # gpt2 was not asked for
    assert "associative ÷ sequential" in out


def test_removed_benchmarks_say_where_they_went(capsys):
    """``gpu_check`` (the former name of ``gpu``) and ``accelerator`` run nothing: exit
    status 2 and the command that replaces them."""
    from benchmarks.__main__ import list_benchmarks, main

    assert "gpu" in list_benchmarks() and "gpu_check" not in list_benchmarks()
    with pytest.raises(SystemExit) as exit_:
        main(["gpu", "--help"])
    assert exit_.value.code == 0 and "usage: python -m benchmarks gpu " in capsys.readouterr().out
    assert main(["gpu_check", "--help"]) == 2
    captured = capsys.readouterr()
    assert "usage" not in captured.out
    assert "'gpu_check' was removed" in captured.err and "python -m benchmarks gpu" in captured.err
    assert main(["accelerator"]) == 2
    err = capsys.readouterr().err
    assert "tests/test_gpu_paths.py" in err and "gpu --parts kernels" in err


def test_gpu_parsers_and_table():
    assert gpu.parse_nanogpt("x\nnanogpt_loop: ms/iter 8.500; steps/s 117.647\n") == {
        "ms_per_iter": 8.5, "steps_per_s": 117.647}
    table = ("| row | peer | compile s | tokens/s (median) | IQR tokens/s | ms/call | "
             "CPU ms/call | n |\n| GPT 12L | seqjax | 40.1 | 411k | 400k–420k | 29.86 | 30.0 | "
             "7×1 |\n| GPT 12L | torch-nanogpt | 70.0 | 450k | 440k–460k | 27.29 | 27.0 | 7×1 |")
    assert gpu.parse_gpt2(table) == {"seqjax": 29.86, "torch-nanogpt": 27.29,
                                           "seqjax_compile_s": 40.1}
    big = (table + "\n| GPT 12L B=64 | seqjax | 50.0 | 520k | 510k–530k | 126.0 | 1.0 | 3×1 |"
           "\nLargest batch of [64, 32, 16] that fits: B=64, seqjax 520,000 tokens/s. Model "
           "FLOPs per token: 1.00 M; seqjax achieves 1.00 GFLOP/s, MFU 41.5% of 989 TFLOP/s")
    parsed = gpu.parse_gpt2(big)
    assert parsed["seqjax"] == 29.86  # the B=12 row, not the largest batch's
    assert parsed["largest"] == {"batch": 64, "tokens_per_s": 520000.0, "mfu": 0.415}
    cpu = table + ("\nLargest batch of [4] that fits: B=4, seqjax 15,700 tokens/s. Model FLOPs"
                   " per token: 1.00 M; seqjax achieves 0.01 GFLOP/s (MFU: no peak FLOP/s known"
                   " for 'cpu').")
    assert gpu.parse_gpt2(cpu)["largest"] == {"batch": 4, "tokens_per_s": 15700.0,
                                                    "mfu": None}
    startup = ("| char_lm (defaults, --steps=100) | cold | 9.50 | 7.00 | 5.00 | 12.0 | 20.0 |\n"
               "| char_lm (defaults, --steps=100) | warm | 2.50 | 0.50 | 0.90 | 5.0 | 12.0 |\n"
               "first step: cold 9.5 s, warm 2.5 s")
    su = gpu.parse_startup(startup)
    assert (su["cold_s"], su["warm_s"]) == (9.5, 2.5)
    assert su["rows"]["char_lm (defaults, --steps=100) (warm)"]["outside_steps_s"] == 5.0
    prof = gpu.parse_profile(
        "The compiled step: buffers of the logits' size [12288, 50304] materialised: 2 × bf16; "
        "attention kernels: 24 × `__cudnn$fmhaSoftmax`.\n| attention core | 3.10 | 9% |")
    assert prof == {"logits_buffers": "2 × bf16", "attention_kernels": "24 × `__cudnn$fmhaSoftmax`",
                    "groups_ms": {"attention core": 3.1}}
    text = gpu.targets_table({
        "char_lm": {"steps_per_s": 130.0, "val": 1.46}, "nanogpt": {"steps_per_s": 100.0},
        "loop": {"fit_over_step": 1.25}, "rnn": {"seqjax_lstm_ms": 5.0, "torch_lstm_ms": 10.0},
    })
    assert "130.0 / 100.0 = 1.30 | met" in text
    assert "1.4600 | met" in text
    assert "0.80 | missed" in text  # compiled ÷ fit = 1 / 1.25
    assert "2.00× | met" in text
    assert "GRU" in text and "unmeasured" in text
    assert "time to first step, warm (≤ 3 s) | unmeasured" in text
    assert "cuDNN (≥ 500 TFLOP/s) | unmeasured" in text

    def row(group, row, peer, rate):
        return {"group": group, "row": row, "peer": peer, "rate": rate}

    kernels = {"rows": [
        row("attention core", "B=4 T=4096 H=16 D=128 full bfloat16 fwd", "seqjax cudnn", 423.0),
        row("attention core", "B=4 T=4096 H=16 D=128 full bfloat16 fwd+bwd", "seqjax cudnn", 465.0),
        row("LSTM layer", "LSTM B=64 T=256 H=512 fwd+bwd", "seqjax cudnn", 4e6),
        row("LSTM layer", "LSTM B=64 T=256 H=512 fwd+bwd", "seqjax scan", 1e6),
        row("scans", "selective scan B=2 T=4096 E=1024 N=16 fwd+bwd", "associative", 3e5),
        row("scans", "selective scan B=2 T=4096 E=1024 N=16 fwd+bwd", "sequential", 1e5),
        row("scans", "selective scan B=2 T=4096 E=1024 N=16 fwd", "sequential", 1e9)]}
    assert gpu.kernel_ratios(kernels) == {"attention_tflops": 423.0,
                                          "lstm_cudnn_over_scan": 4.0,
                                          "ssm_associative_over_sequential": 3.0}
    text = gpu.targets_table({"kernels": kernels})
    assert "cuDNN (≥ 500 TFLOP/s) | 423 | missed" in text
    assert "cuDNN ÷ scan (≥ 3×) | 4.00× | met" in text
    assert "associative ÷ sequential (≥ 10×) | 3.00× | missed" in text

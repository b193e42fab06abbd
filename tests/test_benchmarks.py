"""Smoke tests of the benchmark suite: the harness's bookkeeping, and every benchmark's
``main(["--smoke"])`` end to end (tiny shapes; speed itself is never asserted)."""

from __future__ import annotations

import re
import types

import pytest

from benchmarks import harness


def test_run_row_alternates_peers_and_reports_every_sample():
    calls: list[str] = []

    def peer(name: str) -> harness.Peer:
        def build() -> harness.Prepared:
            return harness.Prepared(step=lambda: calls.append(name), compile_s=0.5,
                                    compile_kind="compile")
        return harness.Peer(name, build)

    results = harness.run_row("row", [peer("a"), peer("b"), peer("c")], tokens=10,
                              repeats=3, warmup=2, min_sample_s=0.0)
    assert [r.peer for r in results] == ["a", "b", "c"]
    assert all(len(r.times_s) == 3 and len(r.cpu_times_s) == 3 for r in results)
    assert all(r.compile_s == 0.5 and r.inner == 1 for r in results)
    # 2 warm-up calls each (built in order), then rounds with a rotating first peer.
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"]
    assert calls[6:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_result_statistics():
    r = harness.Result(row="r", peer="p", tokens=100, compile_s=0.0, compile_kind="compile",
                       times_s=(1.0, 2.0, 3.0, 4.0, 100.0), inner=1)
    assert r.median_s == 3.0
    assert r.tokens_per_s == pytest.approx(100 / 3)
    q1, q3 = r.quartiles_s()
    assert (q1, q3) == (2.0, 4.0)  # the outlier does not move the IQR
    lo, hi = r.rate_range()
    assert lo == pytest.approx(25.0) and hi == pytest.approx(50.0)


def test_markdown_table_and_machine_info():
    table = harness.markdown_table(["name", "tok/s"], [["x", "1.5k"], ["longer", "–"]])
    lines = table.splitlines()
    assert lines[0].startswith("| name") and len(lines) == 4
    assert lines[1].endswith(":|")  # numeric column right-aligned
    assert len({len(line) for line in lines}) == 1
    info = harness.machine_info()
    for key in ("cpu", "cores", "jax", "jaxlib", "flax", "torch"):
        assert info[key]
    assert harness.format_rate(123456) == "123.5k"
    assert harness.format_rate(2.5e6) == "2.50M"
    assert harness.format_rate(2.345e11) == "234.5G"


@pytest.mark.parametrize("name", ["rnn", "attention"])
def test_benchmark_smoke_prints_a_table(name, capsys):
    import importlib

    module = importlib.import_module(f"benchmarks.{name}")
    assert module.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "seqjax" in out and "flax" in out
    assert "| row " in out and "tokens/s (median)" in out
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    assert "torch" in out


_has_torch = harness.torch_available


def test_gpt_smoke_prints_the_training_step_row(capsys):
    from benchmarks import gpt

    assert gpt.main(["--smoke", "--peers", "seqjax,torch-nanogpt", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "GPT 1L/2H/16 B=2 T=16 train step" in out and "seqjax ÷ fastest" in out
    assert "| seqjax " in out and "tokens/s (median)" in out
    if _has_torch():
        assert "torch-nanogpt" in out
    else:
        assert "not installed" in out


def test_gpt_peers_have_the_same_parameter_count():
    """seqjax, flax and torch build the same network (same tensors, tied embeddings)."""
    import jax
    import numpy as np

    from benchmarks import gpt

    shape = gpt.SMOKE
    x = jax.numpy.asarray(gpt.batch_tokens(shape)[:, :-1])

    def count(model) -> int:
        shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), x)
        return sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(shapes))

    n_seqjax = count(gpt.seqjax_model(shape))
    d, v, t, layers = shape.embed_dim, shape.vocab_size, shape.block_size, shape.num_layers
    # embeddings + per layer (2 LayerNorm scales, QKV + out, MLP 4d) + final LayerNorm scale;
    # no biases anywhere (nanoGPT's bias=False drops the LayerNorm offsets too).
    assert n_seqjax == v * d + t * d + layers * (2 * d + 4 * d * d + 8 * d * d) + d
    assert count(gpt.flax_model(shape)) == n_seqjax
    if _has_torch():
        assert sum(p.numel() for p in gpt.torch_gpt(shape).parameters()) == n_seqjax


def test_generate_smoke_prints_kv_and_recompute_rows(capsys):
    from benchmarks import generate

    assert generate.main(["--smoke", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "generate B=2 P=4 N=8" in out and "kv ÷ recompute (seqjax)" in out
    assert "| seqjax-kv " in out and "| seqjax-recompute " in out
    if _has_torch():
        assert "| torch-nanogpt " in out and "| torch-kv " in out


def test_generate_rejects_a_context_past_the_block():
    from benchmarks import generate

    with pytest.raises(SystemExit):
        generate.main(["--prompt", "40", "--new-tokens", "40"])


def test_torch_kv_cache_matches_recomputation():
    """The torch-kv peer computes the same logits as the full forward pass."""
    torch = pytest.importorskip("torch")
    from benchmarks import gpt

    model = gpt.torch_gpt(gpt.SMOKE).eval()
    idx = torch.from_numpy(gpt.batch_tokens(gpt.SMOKE)[:, :10].astype("int64"))
    with torch.inference_mode():
        full = model(idx)
        cache: list = []
        steps = [model(idx[:, :6], cache=cache)[:, -1]]
        steps += [model(idx[:, t:t + 1], cache=cache, start=t)[:, -1] for t in range(6, 10)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 5:], rtol=1e-5, atol=1e-5)


def test_scaling_smoke_prints_slopes_and_plot(capsys, tmp_path):
    from benchmarks import scaling

    png = tmp_path / "scaling.png"
    argv = ["--smoke", "--layers", "softmax,lstm", "--d-model", "16", "--heads", "2",
            "--plot", str(png), "--quiet"]
    assert scaling.main(argv) == 0
    out = capsys.readouterr().out
    assert "softmax" in out and "lstm" in out and "~ T^k" in out
    assert png.exists() and png.stat().st_size > 0


def test_primitives_smoke_reports_gflops_and_core_use(capsys):
    from benchmarks import primitives

    assert primitives.main(["--smoke", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    for label in ("gemm 64×32×48", "bmm 8×16×16×8", "2 × bmm 4×16×16×8",
                  "recurrent gemm 4×8×32, 5 steps"):
        assert label in out
    assert "jax CPU÷wall" in out and "GFLOP/s" in out
    assert "jax ÷ numpy speed" in out and re.search(r"\| numpy +\|", out)  # OpenBLAS peer
    assert "BLAS libraries loaded" in out or "numpy's BLAS: unknown" in out
    if _has_torch():
        assert re.search(r"\| torch +\|", out) and "jax ÷ torch speed" in out
    assert primitives.main(["--smoke", "--peers", "jax", "--rows", "bmm"]) == 0
    out = capsys.readouterr().out
    assert "bmm 8×16×16×8" in out and "gemm 64×32×48" not in out
    assert not re.search(r"\| (torch|numpy) +\|", out)  # only jax in the per-peer table
    assert "speed" not in out.split("Per peer")[0]  # no ratio column without a 2nd peer


def test_primitives_rejects_unknown_peers():
    from benchmarks import primitives

    with pytest.raises(SystemExit):
        primitives.main(["--smoke", "--peers", "mkl"])
    with pytest.raises(SystemExit):
        primitives.main(["--smoke", "--rows", "no-such-row"])
    with pytest.raises(ValueError, match="parts"):
        primitives.bmm_case(9, 4, parts=2)


def test_runner_lists_and_dispatches(capsys):
    from benchmarks.__main__ import list_benchmarks, main

    names = set(list_benchmarks())
    assert {"rnn", "attention", "gpt", "generate", "scaling", "primitives"} <= names
    assert "harness" not in list_benchmarks()
    assert main(["no-such-benchmark"]) == 2
    assert main([]) == 0
    assert "rnn" in capsys.readouterr().out


def test_gpt_bf16_smoke_prints_flops_and_mfu_and_gpt2_count(capsys):
    from benchmarks import gpt

    assert gpt.main(["--smoke", "--peers", "seqjax", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16" in out and "Model FLOPs per token" in out and "seqjax achieves" in out
    with pytest.raises(SystemExit):
        gpt.main(["--smoke", "--dtype", "bfloat16", "--peers", "seqjax,flax"])
    # GPT-2 small (|V| = 50304): N = 123.69M without the position table (nanoGPT: 123.65M at
    # |V| = 50257), so C = 6N + 6·12·12·64·1024 per token.
    note = gpt.mfu_note(gpt.GPTShape(12, 12, 768, 1024, 16, 50304, True), [])
    assert "798.76 M" in note


def test_rnn_cudnn_peer_is_refused_off_gpu():
    from benchmarks import rnn

    with pytest.raises(SystemExit):
        rnn.main(["--smoke", "--peers", "seqjax,seqjax-cudnn"])
    with pytest.raises(ValueError, match="GPU backend"):
        rnn.seqjax_cudnn_peer(rnn.Config("lstm", 2, 3, 4, backward=True))


def test_attention_core_smoke_reports_tflops(capsys):
    from benchmarks import attention_core

    assert attention_core.main(["--smoke", "--causal", "--implementations", "xla"]) == 0
    out = capsys.readouterr().out
    assert "xla TFLOP/s" in out and "causal float32 fwd+bwd" in out
    with pytest.raises(SystemExit):
        attention_core.main(["--smoke", "--implementations", "cudnn"])  # no GPU here
    assert attention_core.flops(2, 4, 8, 16, causal=True, backward=True) == \
        4 * 2 * 4 * 8 * 8 * 16 * 0.5 * 3.5


def test_programs_fingerprints_ignore_names_not_operations(capsys):
    import jax
    import jax.numpy as jnp

    from benchmarks import programs

    x = jax.ShapeDtypeStruct((3, 4), jnp.float32)

    def double(v):
        return v * 2

    def twice(v):  # the same computation under another name
        return v * 2

    def add(v):
        return v + 2

    fp = programs.fingerprint
    assert fp(lambda v: jax.jit(double)(v).sum(), x) == fp(lambda v: jax.jit(twice)(v).sum(), x)
    assert fp(lambda v: jax.jit(double)(v).sum(), x) != fp(lambda v: jax.jit(add)(v).sum(), x)
    assert fp(double, x) != fp(double, jax.ShapeDtypeStruct((3, 5), jnp.float32))
    assert programs.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    for row in ("LSTM B=2", "GRU B=2", "mha B=", "block B=", "LM loss"):
        assert row in out


def test_compiled_fingerprints_see_through_a_nested_call_but_not_a_rewiring():
    """``--compiled`` hashes the optimised HLO: a computation staged as a nested jitted call
    (a different jaxpr) is the same program, a different operation or operand order is not."""
    import jax
    import jax.numpy as jnp

    from benchmarks import programs

    x = jax.ShapeDtypeStruct((3, 4), jnp.float32)

    def flat(v):
        return jnp.tanh(v) * 2 - v

    def nested(v):
        return jax.jit(lambda w: jnp.tanh(w) * 2)(v) - v

    def swapped(v):
        return v - jnp.tanh(v) * 2

    fp, cfp = programs.fingerprint, programs.compiled_fingerprint
    assert fp(flat, x) != fp(nested, x)
    assert cfp(flat, x) == cfp(nested, x)
    assert cfp(flat, x) != cfp(swapped, x)
    assert cfp(flat, x) != cfp(flat, jax.ShapeDtypeStruct((3, 5), jnp.float32))


def test_cpu_wakeup_timeline_from_pool_events():
    """gap, matmul and join read off a trace: the second core joins 20 µs, then 1 µs, after
    the task is posted; the gap is the time between one matmul's end and the next's start."""
    from benchmarks.cpu_wakeup import dot_timeline, per_step_dots

    def ev(name, ts, dur, tid):
        return {"name": name, "ts": ts, "dur": dur, "tid": tid}

    events = [
        ev("dot", 0, 50, 1), ev("ThreadpoolListener::Record", 1, 0, 1),
        ev("ThreadpoolListener::StartRegion", 21, 0, 2),
        ev("tanh", 50, 9, 1),
        ev("dot", 60, 30, 1), ev("ThreadpoolListener::Record", 61, 0, 1),
        ev("ThreadpoolListener::StartRegion", 62, 0, 2),
    ]
    assert dot_timeline(events, "dot") == {"matmul": 40.0, "gap": 10, "join": 10.5}
    assert per_step_dots(events, steps=2, calls=1, dots={"dot", "tanh"}) == ["dot"]
    assert dot_timeline(events, "absent") == {"matmul": None, "gap": None, "join": None}


def test_dot_names_finds_the_matmuls_of_a_compiled_program():
    import jax
    import jax.numpy as jnp

    x = jnp.ones((8, 16))
    hlo = jax.jit(lambda a, b: jnp.tanh(a @ b) + 1.0).lower(x, x.T).compile().as_text()
    names = harness.dot_names(hlo)
    assert names, hlo
    tanh_only = jax.jit(lambda a: jnp.tanh(a) + 1.0).lower(x).compile().as_text()
    assert not harness.dot_names(tanh_only)


def test_cpu_wakeup_and_rnn_profile_smoke(capsys):
    from benchmarks import cpu_wakeup, rnn_profile

    assert cpu_wakeup.main(["--smoke", "--threads", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "join µs" in out and "LSTM forward step loop" in out
    assert "fusions split over cores" in out
    assert rnn_profile.main(["--smoke", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    for group in rnn_profile.GROUPS:
        assert group in out
    if harness.torch_available():
        assert "mkldnn_rnn_layer" in out or "aten::" in out


def test_startup_smoke_reports_cold_and_warm_first_step(capsys):
    """Two fresh char_lm --smoke processes on one empty cache folder: the report's rows and
    its last line (the second run loads the programs the first one stored)."""
    from benchmarks import startup

    assert startup.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "| char_lm --smoke | cold " in out and "| char_lm --smoke | warm " in out
    last = out.strip().splitlines()[-1]
    cold, warm = (float(x) for x in re.fullmatch(
        r"first step: cold ([0-9.]+) s, warm ([0-9.]+) s", last).groups())
    assert cold > 0 and warm > 0


def test_startup_reads_fits_first_step_line():
    from benchmarks import startup

    assert startup._first_step("x\nfirst step: 1.50 s in fit, 4.25 s since the process "
                               "started\n") == (1.5, 4.25)
    assert startup._first_step("first step: 2.00 s in fit (compiled ahead)") == (2.0, None)
    with pytest.raises(RuntimeError, match="no 'first step:' line"):
        startup._first_step("nothing")


def test_gpt_profile_smoke_reads_the_program_and_groups_the_time(capsys):
    from benchmarks import gpt_profile

    assert gpt_profile.main(["--smoke", "--peers", "seqjax", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "buffers of the logits' size [32, 65] materialised:" in out
    for group in gpt_profile.GROUPS:
        assert f"| {group} " in out


def test_gpt_profile_counts_materialised_logits_and_groups_instructions():
    from benchmarks import gpt_profile

    hlo = """%fused_computation (p: f32[4,10]) -> f32[4,10] {
  %p = f32[4,10]{1,0} parameter(0)
  ROOT %e = f32[4,10]{1,0} exponential(%p)
}

ENTRY %main (x: bf16[2,2,10]) -> bf16[4,10] {
  %x = bf16[2,2,10]{2,1,0} parameter(0)
  %c = f32[4,10]{1,0} convert(%x), metadata={op_name="jit(step_fn)/jvp()/convert"}
  %f = f32[4,10]{1,0} fusion(%c), kind=kLoop, calls=%fused_computation
  %a = (bf16[2,8,2,64]{3,2,1,0}, u8[0]{0}) custom-call(%x), custom_call_target="__cudnn$fmhaSoftmax"
  ROOT %r = bf16[4,10]{1,0} convert(%f)
}
"""
    assert gpt_profile.logits_buffers(hlo, tokens=4, vocab=10) == {"f32": 2, "bf16": 2}
    assert gpt_profile.attention_kernels(hlo) == {"__cudnn$fmhaSoftmax": 1}
    info = gpt_profile.instructions(hlo)
    assert info["a"][0] == "custom-call:__cudnn$fmhaSoftmax"
    # a GPU trace may name a fused kernel by its computation: it stands for its fusion
    assert info["fused_computation"] == info["f"] == ("fusion", "f32[4,10]{1,0}", "")
    g = gpt_profile.group_of
    stack = "jit(step_fn)/jvp(TransformerLM)/TransformerLM._trunk/decoder/layers_0"
    assert g("custom-call:__cudnn$fmha", "", stack + "/self_attn", 10) == "attention core"
    assert g("dot", "f32[4,32]", stack + "/ffn/up/dot_general", 10) == "other matmuls"
    assert g("fusion", "f32[4,10]", "jit(step_fn)/jvp(TransformerLM)/TransformerLM._head",
             10) == "logits and loss"
    assert g("fusion", "f32[32]", "jit(step_fn)/adamw/mul", 10) == "optimizer update"
    assert g("fusion", "f32[4,32]", stack + "/ffn_norm/sub", 10) == (
        "norms, GELU, residual, embeddings")


def test_gpt_profile_turns_command_buffers_off_only_before_jax_starts(monkeypatch):
    """The flag is added while JAX has not read ``XLA_FLAGS``; a flag the user set is kept;
    in a process where JAX runs (this one) nothing changes and the table must not claim it."""
    import os
    import sys

    from benchmarks import gpt_profile

    off = gpt_profile.NO_COMMAND_BUFFERS
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=FUSION")
    assert gpt_profile._without_command_buffers() is False
    monkeypatch.setenv("XLA_FLAGS", f"--a=1 {off}")
    assert gpt_profile._without_command_buffers() is True
    monkeypatch.setenv("XLA_FLAGS", "--a=1")
    assert gpt_profile._without_command_buffers() is False  # jax is imported here
    assert os.environ["XLA_FLAGS"] == "--a=1"
    monkeypatch.delitem(sys.modules, "jax")
    assert gpt_profile._without_command_buffers() is True
    assert os.environ["XLA_FLAGS"] == f"--a=1 {off}"


def test_muon_parity_smoke_prints_both_torch_runs(capsys):
    from benchmarks import muon_parity

    assert muon_parity.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    if not _has_torch():
        assert "torch is not installed" in out
        return
    assert "10 steps" not in out and "3 steps of Muon" in out
    for label in ("float32 NS", "bfloat16 NS"):
        assert f"torch.optim.Muon, {label}: max relative loss difference" in out


def test_muon_step_smoke_reports_the_step_and_the_optimizer_share(capsys):
    from benchmarks import muon_step

    assert muon_step.main(["--smoke", "--presets", "modern_smoke", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| modern_smoke | muon |" in out
    assert "muon_step: modern_smoke:" in out and "of it" in out


def test_modern_gpt_steps_to_target_and_report():
    from benchmarks import modern_gpt

    curve = [(50, 5.6), (100, 5.3), (150, 5.2)]
    assert modern_gpt.steps_to(curve, 5.3) == 100 and modern_gpt.steps_to(curve, 5.0) is None
    nano = [types.SimpleNamespace(val_loss=v, ms_per_step=400.0) for v in (5.3, 5.28)]
    run = lambda loss, ms, c=curve: {"val_loss": loss, "ms_per_step": ms, "curve": c, "seed": 0}
    text, fig = modern_gpt.report(nano, [run(0, 100.0)], [run(4.9, 0), run(4.8, 0)],
                                  [run(0, 110.0)], [("tied head", run(5.25, 0))], 500, 200,
                                  "note")
    assert fig["target"] == pytest.approx(5.29) and fig["modern_steps"] == [150, 150]
    assert fig["step_fraction"] == pytest.approx(0.3) and fig["cost_ratio"] == pytest.approx(1.1)
    assert "| tied head | 150 | 5.2500 |" in text and "0.30×" in text


def test_modern_gpt_commands_reach_the_recipe():
    """Each ablation's command (and the smoke shapes) is read by ``seqjax train gpt2`` as the
    modern preset with that one switch put back to GPT-2's (the network: ``--model.KEY``)."""
    import dataclasses

    from benchmarks import modern_gpt
    from seqjax.experiments._runner import build_config, load_experiment

    def config(preset: str, extra: dict) -> object:
        cmd = modern_gpt.seqjax_command(preset, "D", 4, 0, "W", extra)
        assert cmd[3:5] == ["train", "gpt2"]
        return build_config(load_experiment("gpt2"), "gpt2", cmd[5:], resume=False)

    small = config("modern_smoke", modern_gpt.SMOKE_SHAPE)
    assert (small.model.num_layers, small.model.num_heads, small.model.embed_dim,
            small.block_size, small.batch_size) == (1, 2, 16, 16, 8)
    modern = config("modern_cpu", {})
    gpt2_model = config("cpu", {}).model  # the cpu preset: the same GPT-2 as nanoGPT
    for name, extra in modern_gpt.ABLATIONS:
        cfg = config("modern_cpu", extra)
        changed = {f.name for f in dataclasses.fields(cfg)
                   if getattr(cfg, f.name) != getattr(modern, f.name)}
        assert changed, name
        if changed == {"model"}:  # one switch of the network, back to GPT-2's
            moved = [f.name for f in dataclasses.fields(cfg.model)
                     if getattr(cfg.model, f.name) != getattr(modern.model, f.name)]
            assert len(moved) == 1, (name, moved)
            assert getattr(cfg.model, moved[0]) == getattr(gpt2_model, moved[0]), name
        else:
            assert "model" not in changed and cfg.optimizer == "adamw", name


def test_size_counts_kinds_and_ignores_layout(capsys):
    from benchmarks import size

    one = 'def f(a, b):\n    """Doc."""\n    # why\n\n    return g(a,\n             b)\n'
    flat = 'def f(a, b):\n    """Doc."""\n    # why\n\n    return g(a, b)\n'
    m = size.measure(one)
    assert (m["lines"], m["code"], m["doc"], m["comment"], m["blank"]) == (6, 3, 1, 1, 1)
    assert m["statements"] == 2
    # Rewrapping a call moves the line count, not the tokens or statements.
    n = size.measure(flat)
    assert n["lines"] == 5 and (n["tokens"], n["statements"]) == (m["tokens"], m["statements"])
    assert size.main(["--smoke"]) == 0
    assert "| working tree |" in capsys.readouterr().out

"""The accelerator proof (``python -m benchmarks accelerator``): its smoke run on the CI
backend, and that its checks can fail (speed itself is never asserted)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import accelerator
from benchmarks.accelerator import FAIL, NO_GPU, PASS, Check


def _rows(report: str, path: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith(f"| {path} ")]


def test_smoke_writes_the_report_and_every_check_passes(tmp_path, capsys):
    out = tmp_path / "accelerator.md"
    assert accelerator.main(["--smoke", "--out", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("## Accelerator proof") and report in capsys.readouterr().out
    assert "Command: `python -m benchmarks accelerator --smoke --out" in report
    assert "| path " in report and "| max abs err " in report and "| tolerance " in report
    assert "| FAIL " not in report and "0 fail" in report
    for path in ("attention xla", "train step bf16", "train step remat", "train step donation",
                 "linear attention parallel", "linear attention chunked", "SSM associative scan"):
        rows = _rows(report, path)
        assert rows and all("PASS" in r for r in rows), path
    # Forward and gradients, in both dtypes, for the attention paths.
    xla = _rows(report, "attention xla")
    assert {"float32", "bfloat16"} <= {r.split("|")[3].strip() for r in xla}
    assert {"fwd", "grad"} <= {r.split("|")[5].strip() for r in xla}
    for heading in ("### Measurements", "### Targets (issue #19) vs measured", "GPT ",
                    "selective scan", "linear attention B=", "LSTM B="):
        assert heading in report
    if jax.default_backend() == "cpu":
        for path in ("attention cudnn", "LSTM cudnn"):
            rows = _rows(report, path)
            assert rows and all(NO_GPU in r for r in rows), path
        assert "n/a (smoke shapes)" in report


def test_compare_flags_a_wrong_result():
    """A deliberately wrong comparison (causal attention against the non-causal
    reference) fails; so do NaN outputs and a shape mismatch."""
    from seqjax.nn.attention import dot_product_attention

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 8, 2, 4), np.float32)) for _ in range(3))
    causal = dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    full = dot_product_attention(q, k, v, implementation="reference")
    ok, err, tol, _ = accelerator.compare(causal, full, "float32")
    assert not ok and err > tol
    ok, *_ = accelerator.compare(full, full, "float32")
    assert ok
    ok, err, _, _ = accelerator.compare(full.at[0, 0, 0, 0].set(jnp.nan), full, "float32")
    assert not ok and err == float("inf")
    ok, *_ = accelerator.compare(full[:, :4], full, "float32")
    assert not ok


def test_a_wrong_fast_path_gives_fail_rows():
    def reference(x):
        return jnp.tanh(x)

    def wrong(x):
        return jnp.tanh(x) * 1.1

    x = (np.linspace(-2.0, 2.0, 16, dtype=np.float32),)
    want = accelerator._reference(reference, x)
    rows = accelerator._pair("toy", "tanh", "float32", "case", wrong, x, want)
    assert [r.status for r in rows] == [FAIL, FAIL]
    assert all(r.err > r.tol for r in rows)
    rows = accelerator._pair("toy", "tanh", "float32", "case", reference, x, want)
    assert [r.status for r in rows] == [PASS, PASS]

    def broken(x):
        raise RuntimeError("kernel unavailable")

    rows = accelerator._pair("toy", "tanh", "float32", "case", broken, x, want)
    assert [r.status for r in rows] == [FAIL, FAIL] and "kernel unavailable" in rows[0].detail


def test_a_failed_check_makes_the_exit_status_nonzero(tmp_path, monkeypatch):
    bad = Check("attention xla", "reference", "float32", "causal", "fwd", FAIL, 1.0, 0.1, "out")
    monkeypatch.setattr(accelerator, "run_checks", lambda smoke, log: [bad])
    out = tmp_path / "r.md"
    assert accelerator.main(["--smoke", "--checks-only", "--out", str(out)]) == 1
    report = out.read_text()
    assert "0 pass, 1 fail" in report and "| FAIL " in report


def test_gpu_only_paths_are_skipped_not_failed_off_gpu():
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU the cuDNN paths run")
    rows = accelerator.check_lstm()
    assert rows and all(r.status == NO_GPU for r in rows)


def test_bf16_parameters_give_a_bf16_model():
    """What ``make_train_step(compute_dtype=bfloat16)`` feeds a model (bf16 copies of float32
    parameters) keeps every layer in bf16: the position embedding and the norms promote with
    the parameters given, not the declared float32 storage (the H100 run found the whole
    GPT in float32, and attention off cuDNN, before this)."""
    from benchmarks import gpt
    from seqjax.train.step import cast_floating

    model = gpt.seqjax_model(gpt.SMOKE)
    x = jnp.zeros((1, gpt.SMOKE.block_size), jnp.int32)
    params = cast_floating(jax.jit(model.init)(jax.random.PRNGKey(0), x)["params"],
                           jnp.bfloat16)
    _, state = model.apply({"params": params}, x, capture_intermediates=True,
                           mutable=["intermediates"])
    leaves = jax.tree_util.tree_flatten_with_path(state["intermediates"]["decoder"])[0]
    assert leaves and {leaf.dtype for _, leaf in leaves} == {jnp.dtype(jnp.bfloat16)}
    pos = state["intermediates"]["pos_embed"]["__call__"][0]
    assert pos.dtype == jnp.bfloat16

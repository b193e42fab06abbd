"""Smoke tests of the benchmark suite: the harness's bookkeeping, and every benchmark's
``main(["--smoke"])`` end to end (tiny shapes; speed itself is never asserted)."""

from __future__ import annotations

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


def test_runner_lists_and_dispatches(capsys):
    from benchmarks.__main__ import list_benchmarks, main

    assert {"rnn", "attention"} <= set(list_benchmarks())
    assert "harness" not in list_benchmarks()
    assert main(["no-such-benchmark"]) == 2
    assert main([]) == 0
    assert "rnn" in capsys.readouterr().out

"""Smoke test of the weak-scaling benchmark (1 and 2 fake CPU devices, one subprocess
each, through `Parallel`); speed is reported, never asserted."""

from benchmarks import devices


def test_devices_benchmark_smoke_reports_every_device_count(tmp_path, capsys):
    out = tmp_path / "devices.md"
    assert devices.main(["--smoke", "--out", str(out)]) == 0
    text = out.read_text()
    assert "Weak scaling of the GPT step" in text and "python -m benchmarks devices" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("|") and ln[1:].strip()[0].isdigit()]
    assert [int(r.split("|")[1]) for r in rows] == [1, 2]
    assert [int(r.split("|")[2]) for r in rows] == [4, 8]  # the global batch grows (weak)
    assert "100%" in rows[0]

"""Cost vs sequence length: softmax attention, linear attention, selective SSM, LSTM (CPU, fp32).

Every cell times one training-style call on ``x: [1, T, d]`` (causal layer, loss = sum of
the outputs, gradients w.r.t. parameters and input) at a small fixed width ``d = 64``,
and reads its peak memory from XLA's compiled memory analysis (``temp + argument``
bytes of the forward+backward executable: what XLA must hold at once, independent of
other processes, unlike the process RSS). Layers, each one causal sequence-mixing layer
with its own projections:

* ``softmax``: :class:`seqjax.nn.attention.MultiHeadAttention` (4 heads of 16,
  ``is_causal=True``): ``O(T²d)`` time, ``O(T²)`` memory for the scores (Bishop §12.1.8);
* ``linear``: :class:`seqjax.nn.linear_attention.LinearAttention` (4 heads of 16, causal,
  chunked form with chunks of 64): ``O(T d²)``;
* ``ssm-assoc`` / ``ssm-seq``: :class:`seqjax.nn.ssm.MambaBlock` (``E = 2d``, ``N = 16``)
  with the ``jax.lax.associative_scan`` or the ``lax.scan`` form: ``O(T E N)`` work,
  ``O(log T)`` vs ``O(T)`` sequential depth;
* ``lstm``: ``seqjax.nn.RNN(LSTMCell(d))``: ``O(T d²)`` work in ``T`` sequential steps.

Caps: a layer is skipped at a length once its compiled memory exceeds ``--max-mem-gb``
(checked after compiling, before running) or once its CPU time per call, extrapolated from
the last two lengths, would exceed ``--max-call-s``; the skips are printed in the table.
Timing uses :mod:`benchmarks.harness` (compile time apart, warm-up, median and IQR of
samples, layers of one length alternated round robin).

Outputs: a markdown table (median ms per call, CPU ms per call, peak MB), the empirical
log-log slopes, the crossover lengths (log-log interpolation between measured lengths),
and a log-log plot (``--plot``, default ``benchmarks/scaling.png``).

Run: ``python -m benchmarks scaling`` (or ``seqjax bench scaling``); ``--smoke`` runs two
tiny lengths in seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import harness

LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
SMOKE_LENGTHS = (16, 32)
LAYERS = ("softmax", "linear", "ssm-assoc", "ssm-seq", "lstm")


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (layer, T) measurement, or the reason it was skipped."""

    layer: str
    length: int
    median_s: float | None = None
    q1_s: float | None = None
    q3_s: float | None = None
    cpu_s: float | None = None
    compile_s: float | None = None
    peak_bytes: int | None = None
    skipped: str | None = None


def make_layer(name: str, d_model: int, num_heads: int) -> Any:
    """A flax module ``x[B, T, d] -> y[B, T, d]``, causal, for layer ``name``."""
    from flax import linen as nn

    from seqjax.nn.attention import MultiHeadAttention
    from seqjax.nn.cells import LSTMCell
    from seqjax.nn.linear_attention import LinearAttention
    from seqjax.nn.recurrent import RNN
    from seqjax.nn.ssm import MambaBlock

    class Causal(nn.Module):
        """Self-attention called with ``is_causal=True``."""

        attn: nn.Module

        def __call__(self, x):
            return self.attn(x, is_causal=True)

    head_dim = d_model // num_heads
    if name == "softmax":
        return Causal(MultiHeadAttention(num_heads=num_heads, head_dim=head_dim))
    if name == "linear":
        return Causal(LinearAttention(num_heads=num_heads, head_dim=head_dim, chunk_size=64))
    if name == "ssm-assoc":
        return MambaBlock(features=d_model, d_state=16, scan_impl="associative")
    if name == "ssm-seq":
        return MambaBlock(features=d_model, d_state=16, scan_impl="sequential")
    if name == "lstm":
        return RNN(LSTMCell(d_model))
    raise ValueError(f"unknown layer {name!r}; choose from {LAYERS}")


def prepare(name: str, length: int, d_model: int, num_heads: int
            ) -> tuple[harness.Prepared, int]:
    """Compile the forward+backward of layer ``name`` at length ``T``; return it and its peak bytes.

    Parameters are initialised on a short sequence (none of the layers has a parameter
    that depends on ``T``), so no ``T²`` array is ever built eagerly.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    module = make_layer(name, d_model, num_heads)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, length, d_model)), jnp.float32)
    params = module.init(jax.random.PRNGKey(0), x[:, :8])

    def loss(p, x_):
        return jnp.sum(module.apply(p, x_))

    t0 = time.perf_counter()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    peak = int(mem.temp_size_in_bytes + mem.argument_size_in_bytes) if mem is not None else -1

    def step() -> Any:
        return jax.block_until_ready(compiled(params, x))

    return harness.Prepared(step=step, compile_s=compile_s, compile_kind="compile"), peak


def run(
    layers: Sequence[str] = LAYERS,
    lengths: Sequence[int] = LENGTHS,
    *,
    d_model: int = 64,
    num_heads: int = 4,
    repeats: int = 5,
    min_sample_s: float = 0.2,
    max_call_s: float = 20.0,
    max_mem_gb: float = 6.0,
    log=None,
) -> list[Cell]:
    """Measure every (layer, T) until the layer hits a cap; lengths ascending."""
    cells: list[Cell] = []
    stopped: dict[str, str] = {}
    last: dict[str, list[tuple[int, float]]] = {name: [] for name in layers}
    for length in sorted(lengths):
        peers, peaks = [], {}
        for name in layers:
            if name in stopped:
                cells.append(Cell(name, length, skipped=stopped[name]))
                continue
            prepared, peak = prepare(name, length, d_model, num_heads)
            if peak > max_mem_gb * 2**30:
                stopped[name] = f"mem>{max_mem_gb:g}GB"
                cells.append(Cell(name, length, compile_s=prepared.compile_s, peak_bytes=peak,
                                  skipped=f"{peak / 2**30:.1f} GB > cap"))
                if log:
                    log(f"  T={length} | {name}: {peak / 2**30:.2f} GB > {max_mem_gb} GB, skipped")
                continue
            peaks[name] = peak
            peers.append(harness.Peer(name, lambda p=prepared: p))
        if not peers:
            continue
        results = harness.run_row(f"T={length}", peers, length, repeats=repeats, warmup=1,
                                  min_sample_s=min_sample_s, log=log)
        for r in results:
            q1, q3 = r.quartiles_s()
            cells.append(Cell(r.peer, length, r.median_s, q1, q3, r.cpu_median_s, r.compile_s,
                              peaks[r.peer]))
            # The cap is on CPU seconds per call: on a shared machine wall time also counts
            # the time the process waited for a core.
            history = last[r.peer]
            history.append((length, r.cpu_median_s))
            # Extrapolate the next length (×2) with the last measured growth (at least ×2).
            growth = 2.0
            if len(history) >= 2 and history[-2][1] > 0:
                growth = max(2.0, history[-1][1] / history[-2][1])
            if r.cpu_median_s * growth > max_call_s:
                stopped[r.peer] = f"CPU>{max_call_s:g}s"
    return cells


# ----------------------------------------------------------------------------- analysis


def _measured(cells: Sequence[Cell], layer: str, attr: str) -> dict[int, float]:
    out = {}
    for c in cells:
        v = getattr(c, attr)
        if c.layer == layer and c.skipped is None and v is not None and v > 0:
            out[c.length] = float(v)
    return out


def crossover(a: dict[int, float], b: dict[int, float]) -> tuple[str, float | None]:
    """Where ``a`` stops being cheaper than ``b`` (or the reverse), interpolated in log-log.

    Returns ``(description, T*)``; ``T*`` is None when the order never changes over the
    lengths both were measured at.
    """
    common = sorted(set(a) & set(b))
    if not common:
        return "no common lengths", None
    r = [math.log(a[t] / b[t]) for t in common]
    for i in range(1, len(common)):
        if (r[i - 1] < 0) != (r[i] < 0):
            t0, t1 = math.log(common[i - 1]), math.log(common[i])
            frac = r[i - 1] / (r[i - 1] - r[i]) if r[i - 1] != r[i] else 0.5
            return "crosses", math.exp(t0 + frac * (t1 - t0))
    cheaper = "first" if r[0] < 0 else "second"
    return f"{cheaper} cheaper at every common T ({common[0]}–{common[-1]})", None


def slope(points: dict[int, float], last: int = 3) -> float | None:
    """Least-squares slope of log(value) vs log(T) over the ``last`` largest lengths."""
    ts = sorted(points)[-last:]
    if len(ts) < 2:
        return None
    xs = [math.log(t) for t in ts]
    ys = [math.log(points[t]) for t in ts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None


PAIRS = (("softmax", "linear"), ("softmax", "ssm-assoc"), ("softmax", "ssm-seq"),
         ("softmax", "lstm"), ("ssm-assoc", "ssm-seq"), ("linear", "ssm-assoc"),
         ("linear", "lstm"), ("ssm-assoc", "lstm"), ("ssm-seq", "lstm"))


def _pairs(layers: Sequence[str]) -> list[tuple[str, str]]:
    return [(a, b) for a, b in PAIRS if a in layers and b in layers]


def _crossover_text(data: dict[str, dict[int, float]], a: str, b: str) -> str:
    desc, t_star = crossover(data[a], data[b])
    if t_star is None:
        return desc.replace("first", a).replace("second", b)
    last = max(set(data[a]) & set(data[b]))
    winner = a if data[a][last] < data[b][last] else b
    return f"{winner} cheaper beyond T* ≈ {t_star:.0f}"


def _fmt_ms(s: float | None) -> str:
    if s is None:
        return "–"
    ms = s * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _fmt_mb(b: int | None) -> str:
    return "–" if b is None or b < 0 else f"{b / 2**20:.1f}"


def tables(cells: Sequence[Cell], layers: Sequence[str]) -> str:
    """Markdown: time table, memory table, slopes, crossovers."""
    lengths = sorted({c.length for c in cells})
    by = {(c.layer, c.length): c for c in cells}

    def cell_time(c: Cell | None) -> str:
        if c is None:
            return "–"
        if c.skipped:
            return f"skip ({c.skipped})"
        return f"{_fmt_ms(c.median_s)} [{_fmt_ms(c.q1_s)}–{_fmt_ms(c.q3_s)}]"

    def cell_cpu(c: Cell | None) -> str:
        return "–" if c is None or c.skipped else _fmt_ms(c.cpu_s)

    def cell_mem(c: Cell | None) -> str:
        if c is None:
            return "–"
        if c.skipped and c.peak_bytes is None:
            return f"skip ({c.skipped})"
        return _fmt_mb(c.peak_bytes)

    out = ["**Wall ms per forward+backward call, median [IQR]** (B = 1, d = 64)", ""]
    out.append(harness.markdown_table(
        ["T"] + list(layers),
        [[str(t)] + [cell_time(by.get((n, t))) for n in layers] for t in lengths]))
    out += ["", "**CPU ms per call (all threads; steadier on a shared machine)**", ""]
    out.append(harness.markdown_table(
        ["T"] + list(layers),
        [[str(t)] + [cell_cpu(by.get((n, t))) for n in layers] for t in lengths]))
    out += ["", "**Peak memory, MB (XLA memory analysis: temp + arguments)**", ""]
    out.append(harness.markdown_table(
        ["T"] + list(layers),
        [[str(t)] + [cell_mem(by.get((n, t))) for n in layers] for t in lengths]))

    times = {n: _measured(cells, n, "median_s") for n in layers}
    mems = {n: _measured(cells, n, "peak_bytes") for n in layers}
    cpus = {n: _measured(cells, n, "cpu_s") for n in layers}
    out += ["", "**Empirical exponents** (log-log slope over the 3 largest measured T)", ""]
    rows = []
    for n in layers:
        ks = [slope(d[n]) for d in (times, cpus, mems)]
        rows.append([n] + ["–" if k is None else f"{k:.2f}" for k in ks])
    out.append(harness.markdown_table(
        ["layer", "wall time ~ T^k", "CPU time ~ T^k", "memory ~ T^k"], rows))

    out += ["", "**Crossovers** (T* interpolated in log-log between measured lengths)", ""]
    rows = []
    for a, b in _pairs(layers):
        row = [f"{a} vs {b}"]
        for data in (times, cpus, mems):
            row.append(_crossover_text(data, a, b))
        rows.append(row)
    out.append(harness.markdown_table(["pair", "wall time", "CPU time", "peak memory"], rows))
    return "\n".join(out)


def plot(cells: Sequence[Cell], layers: Sequence[str], path: str) -> None:
    """Log-log wall time, CPU time and memory vs T; one line per layer (measured points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (("median_s", 1e3, "wall ms per fwd+bwd call"),
              ("cpu_s", 1e3, "CPU ms per call (all threads)"),
              ("peak_bytes", 2.0**-20, "peak MB (temp + args)"))
    for ax, (attr, scale, ylabel) in zip(axes, panels):
        for n in layers:
            pts = _measured(cells, n, attr)
            if pts:
                xs = sorted(pts)
                ax.plot(xs, [pts[x] * scale for x in xs], "o-", label=n)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    fig.suptitle("seqjax layers, d = 64, batch 1, CPU fp32 (forward + backward)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench scaling", description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="T in {16, 32}, 2 repeats: seconds")
    ap.add_argument("--layers", default=",".join(LAYERS), help=f"comma list of {LAYERS}")
    ap.add_argument("--lengths", default=None, help="comma list of T (default 256..16384)")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-call-s", type=float, default=20.0,
                    help="stop a layer once its next call is predicted to exceed this many "
                         "CPU seconds")
    ap.add_argument("--max-mem-gb", type=float, default=6.0,
                    help="skip a layer once its compiled peak memory exceeds this")
    ap.add_argument("--plot", default=None,
                    help="PNG path (default benchmarks/scaling.png; a temp file with --smoke)")
    ap.add_argument("--out", default=None, help="also write the markdown report to this file")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    layers = [n.strip() for n in args.layers.split(",") if n.strip()]
    for n in layers:
        if n not in LAYERS:
            ap.error(f"--layers: unknown layer {n!r}; choose from {LAYERS}")
    if args.lengths:
        lengths = [int(t) for t in args.lengths.split(",")]
    else:
        lengths = list(SMOKE_LENGTHS if args.smoke else LENGTHS)
    repeats = 2 if args.smoke else args.repeats
    log = None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))

    t0 = time.perf_counter()
    cells = run(layers, lengths, d_model=args.d_model, num_heads=args.heads, repeats=repeats,
                min_sample_s=0.01 if args.smoke else 0.2, max_call_s=args.max_call_s,
                max_mem_gb=args.max_mem_gb, log=log)
    wall = time.perf_counter() - t0

    if args.plot:
        plot_path = args.plot
    elif args.smoke:
        plot_path = os.path.join(tempfile.mkdtemp(prefix="seqjax-scaling-"), "scaling.png")
    else:
        plot_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scaling.png")
    plot(cells, layers, plot_path)

    command = "python -m benchmarks scaling " + " ".join(argv if argv is not None
                                                          else sys.argv[1:])
    report = "\n".join([
        f"## Cost vs sequence length (`{command.strip()}`)",
        "",
        harness.machine_markdown(),
        "",
        tables(cells, layers),
        "",
        f"Plot: `{plot_path}`. Wall time of the run: {wall:.0f} s.",
    ])
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

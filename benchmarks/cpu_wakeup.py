"""XLA:CPU's per-step matmul in a loop: how long the other core takes to join it.

The minimal reproducer of why seqjax's LSTM rows trail torch's oneDNN LSTM on a CPU
(``benchmarks/HISTORY.md``, "The LSTM rows: where the time goes"). One ``jax.jit`` of a
``lax.fori_loop`` of ``T`` dependent steps

    g = h W;   h ← φ_k(g[:, :H])        W: [H, 4H] ~ N(0, 1/H),  h: [B, H]

where ``φ_k`` applies ``x ↦ tanh(x) · 1.01`` ``k`` times (XLA fuses them into one
elementwise kernel that runs on one thread), so ``k`` sets the gap between two
consecutive matmuls. The matmul is large enough that XLA:CPU splits it over both cores:
the calling thread posts half to a worker of its thread pool and computes the other
half. A ``jax.profiler`` trace of the loop gives, per step (medians):

* ``gap µs``: from the end of one matmul to the start of the next (the elementwise work);
* ``matmul µs``: the matmul's duration on the calling thread, the wait for its worker
  included;
* ``join µs``: from the calling thread posting the task to the worker starting it
  (XLA's thread pool events ``ThreadpoolListener::Record`` and ``StartRegion``).

With ``k = 0`` the worker is still spinning from the previous matmul when the next one
posts work (``join`` ≈ 1 µs). Once the gap passes the pool's spin time the worker has
gone to sleep and the matmul waits for the operating system to wake it, which is what
an LSTM step (its gate nonlinearities, the state update and three buffer writes, about
20 µs at B = 32, H = 256) always hits. The ``step µs`` column is the loop's wall time
per step without the profiler (10 calls back to back).

Why the LSTM's gap runs on one core: XLA:CPU splits a loop fusion over the cores when its
cost model says it is worth it. A fusion whose flops per byte accessed are ≤ 1 counts as
memory-bound and gets one partition per 256 KiB it touches, and a ``tanh`` counts as a
transcendental, not as flops; the LSTM's gate fusion at B = 32, H = 256 (four
``[32, 1024]`` arrays, 32K ``tanh``) touches ~400 KiB, so it runs on one thread while the
other core's worker goes to sleep. The second table times the LSTM forward's step loop as
XLA compiles it and with four cancelling multiply-adds added to the gate fusion (more
flops per byte: XLA then splits it, and the worker stays awake into the next matmul).

Run: ``python -m benchmarks cpu_wakeup [--batch_size 32 --hidden_size 256 --steps 128]``;
``--smoke``: tiny shapes (CI). Needs the CPU backend.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks import harness

GAPS = (0, 1, 2, 4, 8)


def make_loop(batch: int, hidden: int, steps: int, k: int):
    """The jitted loop and its arguments ``(h0, w)``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((hidden, 4 * hidden)) / np.sqrt(hidden), jnp.float32)
    h0 = jnp.asarray(rng.standard_normal((batch, hidden)), jnp.float32)

    def body(_, h):
        y = (h @ w)[:, :hidden]
        for _ in range(k):
            y = jnp.tanh(y) * 1.01
        return y if k else jnp.tanh(y)

    return jax.jit(lambda h, w: jax.lax.fori_loop(0, steps, body, h)), (h0, w)


def per_step_dots(events: list[dict], steps: int, calls: int, dots: set[str]) -> list[str]:
    """The matmuls (names in ``dots``) that ran ``steps`` times per call, slowest first."""
    totals: dict[str, list[float]] = {}
    for e in events:
        if e["name"] in dots:
            totals.setdefault(e["name"], []).append(e["dur"])
    names = [n for n, d in totals.items() if len(d) == steps * calls]
    return sorted(names, key=lambda n: -sum(totals[n]))


def dot_timeline(events: list[dict], name: str) -> dict[str, float | None]:
    """Median duration of the operation ``name``, the gap before it on its thread, and the
    join latency (µs): each call's first ``ThreadpoolListener::Record`` on its own thread
    paired with the first ``StartRegion`` on another thread after it (``None`` when this
    XLA does not emit those events)."""
    dots = sorted((e for e in events if e["name"] == name), key=lambda e: e["ts"])
    if not dots:
        return {"matmul": None, "gap": None, "join": None}
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(dots, dots[1:])
            if a["tid"] == b["tid"] and b["ts"] - a["ts"] < 10 * max(a["dur"], 1.0)]
    records = sorted((e for e in events if e["name"] == "ThreadpoolListener::Record"),
                     key=lambda e: e["ts"])
    starts = sorted((e for e in events if e["name"] == "ThreadpoolListener::StartRegion"),
                    key=lambda e: e["ts"])
    joins = []
    for d in dots:
        end = d["ts"] + d["dur"]
        rec = next((r for r in records if d["ts"] <= r["ts"] <= end and r["tid"] == d["tid"]),
                   None)
        if rec is None:
            continue
        start = next((s for s in starts if rec["ts"] <= s["ts"] <= end and s["tid"] != d["tid"]),
                     None)
        if start is not None:
            joins.append(start["ts"] - rec["ts"])
    return {"matmul": statistics.median(e["dur"] for e in dots),
            "gap": statistics.median(gaps) if gaps else None,
            "join": statistics.median(joins) if joins else None}


def _us_per_step(fn, args, steps: int, calls: int = 10) -> float:
    """Wall µs per loop step over ``calls`` back-to-back calls."""
    import jax

    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / calls / steps * 1e6


def measure(batch: int, hidden: int, steps: int, k: int, repeats: int,
            trace_calls: int) -> dict[str, float | None]:
    """Wall µs per step (median of ``repeats`` timed calls) and the traced timeline."""
    import jax

    fn, args = make_loop(batch, hidden, steps, k)
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    walls = [_us_per_step(fn, args, steps) for _ in range(repeats)]
    out: dict[str, float | None] = {"step": statistics.median(walls)}
    events = harness.trace_events(fn, args, trace_calls)
    found = per_step_dots(events, steps, trace_calls,
                          harness.dot_names(fn.lower(*args).compile().as_text()))
    out.update(dot_timeline(events, found[0]) if found
               else {"matmul": None, "gap": None, "join": None})
    return out


def make_lstm_loop(batch: int, hidden: int, steps: int, pad: int):
    """The LSTM training forward's step loop (the shape of seqjax's kernel: ``x W_ih`` read
    from its ``[T, B, 4H]`` slot, ``h W_hh``, one tanh for the four gates, the state update,
    three buffer writes). ``pad`` > 0 adds ``pad`` multiply-adds that cancel
    (``u·1.0001 + u·(−0.0001)``) to the gate fusion: real arithmetic that raises the
    fusion's flops per byte past XLA:CPU's compute-bound test, so XLA splits it over the
    cores. A demonstration of what the split is worth, not something seqjax does."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from seqjax.nn.recurrent._layer_kernels import _gate_consts

    lax = jax.lax
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((hidden, 4 * hidden)) / np.sqrt(hidden), jnp.float32)
    xw = jnp.asarray(rng.standard_normal((steps, batch, 4 * hidden)), jnp.float32)
    s4, shift4 = _gate_consts(hidden, jnp.float32)

    def body(t, carry):
        c, h, buf, hs, cs = carry
        u = (lax.dynamic_index_in_dim(buf, t, keepdims=False) + h @ w) * s4
        for _ in range(pad):
            u = u * 1.0001 + u * (-0.0001)
        acts = jnp.tanh(u) * s4 + shift4
        i, f, g, o = jnp.split(acts, 4, axis=-1)
        c = f * c + i * g
        h = o * jnp.tanh(c)
        return (c, h, lax.dynamic_update_index_in_dim(buf, acts, t, 0),
                lax.dynamic_update_index_in_dim(hs, h, t, 0),
                lax.dynamic_update_index_in_dim(cs, c, t, 0))

    def run(xw):
        z = jnp.zeros((batch, hidden))
        buffers = jnp.zeros((steps, batch, hidden)), jnp.full((steps, batch, hidden), -0.0)
        return lax.fori_loop(0, steps, body, (z, z, xw, *buffers))

    return jax.jit(run), (xw,)


def split_fusions(hlo_text: str) -> int:
    """How many loop fusions XLA:CPU split over more than one partition."""
    import re

    return len(re.findall(r'outer_dimension_partitions":\["[2-9]', hlo_text))


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench cpu_wakeup",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, two gaps (CI)")
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--hidden_size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--gaps", default=",".join(map(str, GAPS)),
                    help="comma list of k: tanh applications between two matmuls")
    harness.add_common_args(ap)
    args = ap.parse_args(argv)
    import jax

    if jax.default_backend() != "cpu":
        ap.error(f"needs the CPU backend; the default backend is {jax.default_backend()!r}")
    harness.configure_threads(args.threads)
    if args.smoke:
        batch, hidden, steps, gaps, repeats, calls = 4, 16, 8, (0, 2), 2, 1
    else:
        batch, hidden, steps, repeats, calls = (args.batch_size, args.hidden_size, args.steps,
                                                max(args.repeats, 3), 3)
        try:
            gaps = tuple(int(g) for g in args.gaps.split(","))
        except ValueError:
            ap.error(f"--gaps: expected a comma list of integers; got {args.gaps!r}")
    rows = []
    for k in gaps:
        m = measure(batch, hidden, steps, k, repeats, calls)
        rows.append([str(k), _fmt(m["gap"]), _fmt(m["matmul"]), _fmt(m["join"]),
                     _fmt(m["step"])])
        if not args.quiet:
            print(f"k={k}: {rows[-1][1:]}", file=sys.stderr, flush=True)
    flops = 2 * batch * hidden * 4 * hidden
    title = (f"XLA:CPU loop of [{batch}, {hidden}] @ [{hidden}, {4 * hidden}] matmuls "
             f"({flops / 1e6:.1f} MFLOP each), {steps} steps: µs per step (medians)")
    table = harness.markdown_table(
        ["k (tanh between matmuls)", "gap µs", "matmul µs", "join µs", "step µs"], rows)
    loops = {pad: make_lstm_loop(batch, hidden, steps, pad) for pad in (0, 4)}
    walls = {pad: [] for pad in loops}
    for fn, fargs in loops.values():
        for _ in range(3):
            jax.block_until_ready(fn(*fargs))
    for _ in range(repeats):  # the two loops alternate
        for pad, (fn, fargs) in loops.items():
            walls[pad].append(_us_per_step(fn, fargs, steps))
    lstm_rows = [["XLA's choice" if pad == 0 else f"gate fusion + {pad} multiply-adds",
                  str(split_fusions(fn.lower(*fargs).compile().as_text())),
                  f"{statistics.median(walls[pad]):.1f}"]
                 for pad, (fn, fargs) in loops.items()]
    lstm_table = harness.markdown_table(
        ["LSTM forward step loop", "fusions split over cores", "step µs"], lstm_rows)
    harness.emit_report(title, "cpu_wakeup", argv, "\n\n".join([
        table,
        f"The LSTM forward's step loop at the same shape ({steps} steps; median over "
        f"{repeats} rounds of 10 untraced calls, the two loops alternating):",
        lstm_table,
    ]), [], out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

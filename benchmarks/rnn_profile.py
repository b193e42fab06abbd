"""Where an LSTM layer's fwd+bwd time goes on XLA:CPU, beside torch's oneDNN LSTM.

One row of ``python -m benchmarks rnn`` (``--shape BxTxH``), profiled on each side:

* **seqjax** — ``RNN(LSTMCell(H))`` fwd+bwd (gradients w.r.t. parameters and input, loss =
  sum of the outputs), a ``jax.profiler`` trace of ``--calls`` calls. Every operation of the
  compiled program falls in one group: *per-step matmuls* (ran ``T`` times per call and
  hold a ``dot``: ``h W_hh`` in the forward loop, ``dG W_hhᵀ`` in the backward loop),
  *per-step elementwise* (ran ``T`` times, no ``dot``: the gates, the state update, the
  buffer writes), *whole-sequence matmuls* (once per call: ``x W_ih``, ``dx``, ``dW_ih``,
  ``dW_hh``) and *other once-per-call* work (transposes, buffer fills, the bias gradient).
  Times are the operations' durations on the thread that ran them; the whole-sequence
  matmuls of the backward run concurrently, so a group can exceed its share of the wall
  time. For each per-step matmul the timeline of ``benchmarks cpu_wakeup`` follows: its
  median duration, the gap before it, and how long the second core took to join it.
* **torch** — ``torch.nn.LSTM`` (oneDNN's fused RNN primitive on CPU) fwd+bwd, the same
  inputs, ``torch.profiler`` over ``--calls`` calls: self CPU time per operator.

Wall times per call come from separate untraced runs, alternating the two sides
(:func:`harness.run_row`, the ``rnn`` benchmark's timing).

Run: ``python -m benchmarks rnn_profile [--shape 32x128x256] [--calls 5]``; ``--smoke``:
tiny shapes (CI).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks import cpu_wakeup, harness, rnn

GROUPS = ("per-step matmuls", "per-step elementwise", "whole-sequence matmuls",
          "other once-per-call")
_RUNTIME = ("end:", "$", "Thunk", "Threadpool", "Slinky", "while", "Pjit", "Common",
            "Allocate", "Handle", "Parse", "Python", "Wait", "ExecuteHelper")


def seqjax_groups(cfg: rnn.Config, calls: int) -> tuple[dict[str, float], list[list[str]]]:
    """ms per call in each group of :data:`GROUPS`, and the per-step matmuls' timelines."""
    import jax
    import jax.numpy as jnp

    from seqjax.nn.cells import LSTMCell
    from seqjax.nn.recurrent import RNN

    module = RNN(LSTMCell(cfg.hidden))
    x = jnp.asarray(rnn._inputs(cfg))
    params = jax.jit(module.init)(jax.random.PRNGKey(0), x)
    grad = jax.jit(jax.grad(lambda p, x_: jnp.sum(module.apply(p, x_)), argnums=(0, 1)))
    for _ in range(3):
        jax.block_until_ready(grad(params, x))
    dots = harness.dot_names(grad.lower(params, x).compile().as_text())
    events = harness.trace_events(grad, (params, x), calls)
    per_name: dict[str, list[float]] = {}
    for e in events:
        if not e["name"].startswith(_RUNTIME):
            per_name.setdefault(e["name"], []).append(e["dur"])
    groups = dict.fromkeys(GROUPS, 0.0)
    for name, durs in per_name.items():
        per_step = len(durs) == cfg.steps * calls
        if per_step:
            group = GROUPS[0] if name in dots else GROUPS[1]
        else:
            group = GROUPS[2] if name in dots else GROUPS[3]
        groups[group] += sum(durs) / calls / 1e3
    timelines = []
    for name in cpu_wakeup.per_step_dots(events, cfg.steps, calls, dots):
        t = cpu_wakeup.dot_timeline(events, name)
        timelines.append([name] + [cpu_wakeup._fmt(t[k]) for k in ("gap", "matmul", "join")])
    return groups, timelines


def torch_ops(cfg: rnn.Config, calls: int, top: int) -> list[list[str]]:
    """The ``top`` operators of torch's LSTM fwd+bwd by self CPU ms per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    step = rnn.torch_peer(cfg).step
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
    del torch
    averages = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)
    return [[a.key, f"{a.self_cpu_time_total / calls / 1e3:.2f}", f"{a.count // calls}"]
            for a in averages[:top]]


def wall_results(cfg: rnn.Config, repeats: int, with_torch: bool) -> list[harness.Result]:
    """Both sides untraced, alternating (:func:`harness.run_row`)."""
    names = ["seqjax", "torch"] if with_torch else ["seqjax"]
    peers = [harness.Peer(n, lambda n=n: rnn._BUILDERS[n](cfg)) for n in names]
    return harness.run_row(cfg.label, peers, cfg.tokens, repeats=repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench rnn_profile",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CI)")
    ap.add_argument("--shape", type=rnn._parse_shapes, default=None,
                    help="BxTxH (default 32x128x256)")
    ap.add_argument("--calls", type=int, default=5, help="calls traced on each side")
    ap.add_argument("--top", type=int, default=8, help="torch operators listed")
    harness.add_common_args(ap)
    args = ap.parse_args(argv)
    import jax

    if jax.default_backend() != "cpu":
        ap.error(f"needs the CPU backend; the default backend is {jax.default_backend()!r}")
    harness.configure_threads(args.threads)
    (b, t, h), = (rnn.SMOKE_SHAPES if args.smoke else args.shape or [(32, 128, 256)])[:1]
    cfg = rnn.Config("lstm", b, t, h, backward=True)
    calls = 1 if args.smoke else args.calls
    with_torch = harness.torch_available()

    results = wall_results(cfg, 3 if args.smoke else max(args.repeats, 5), with_torch)
    walls = {r.peer: statistics.median(r.times_s) * 1e3 for r in results}
    groups, timelines = seqjax_groups(cfg, calls)
    parts = [
        "Wall time per call (untraced, alternating, median): "
        + ", ".join(f"{k} {v:.2f} ms" for k, v in walls.items())
        + (f"; seqjax ÷ torch speed {walls['torch'] / walls['seqjax']:.2f}×"
           if "torch" in walls else ""),
        "seqjax (`jax.profiler`, ms per call by group):",
        harness.markdown_table(["group", "ms/call"],
                               [[g, f"{v:.2f}"] for g, v in groups.items()]),
        "seqjax's per-step matmuls (µs, medians; `join`: the second core's start after the "
        "task was posted):",
        harness.markdown_table(["operation", "gap µs", "matmul µs", "join µs"], timelines),
    ]
    if with_torch:
        parts += ["torch (`torch.profiler`, self CPU ms per call):",
                  harness.markdown_table(["operator", "self ms/call", "calls/call"],
                                         torch_ops(cfg, calls, args.top))]
    harness.emit_report(f"LSTM B={b} T={t} H={h} fwd+bwd: where the time goes",
                        "rnn_profile", argv, "\n\n".join(parts), results, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

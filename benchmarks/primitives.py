"""The kernels under the RNN and attention rows: XLA:CPU vs torch vs OpenBLAS (CPU, fp32).

Why seqjax's LSTM and attention rows trail torch on CPU (``benchmarks/HISTORY.md``,
"Why the targets are not met") comes down to a few primitives. This benchmark times
each one alone, in ``jax.jit`` (the XLA:CPU that every JAX program gets), in eager
torch (MKL / oneDNN underneath), and in numpy (the OpenBLAS that numpy's wheels ship:
what a hand-written native kernel built on a freely redistributable BLAS would get),
and reports GFLOP/s and **CPU ÷ wall**: how many of the cores the call kept busy
(≈ 2 when both cores work, ≈ 1 when the call runs on one). torch and OpenBLAS get
``--threads`` threads. Rows:

* ``gemm M×K×N``: one ``[M, K] @ [K, N]`` — the projections of an attention layer
  (``8192×256×768`` is the fused QKV of the ``B·T = 8192``, d = 256 rows; ``8192×256×1024``
  an MLP's first layer; ``16384×512×2048`` the input projection ``x W_ih`` of the
  ``B=64 T=256 H=512`` LSTM row). jax: ``jnp.dot``; torch: ``torch.mm``.
* ``bmm G×T×T×64``: the attention scores ``S_g = Q_g K_gᵀ`` for ``G = B·heads`` batched
  ``[T, 64] @ [64, T]`` products (``G = 256, T = 128`` and ``G = 64, T = 512`` are the
  MHA rows' shapes). jax: ``einsum('gqd,gkd->gqk')`` (a batched ``dot_general``); torch:
  ``torch.bmm`` with ``K`` transposed (a view); numpy: ``np.matmul`` (one BLAS call per
  matrix). ``48×64×64×32`` (and ``gemm 768×128×384``,
  the fused QKV) are the shapes of the nanoGPT CPU config's training step (``gpt``).
* ``2 × bmm``: two independent batched products of half the batch each in one call
  (one jit / two torch calls): does the runtime put the two on different cores?
* ``recurrent gemm B×H×4H, T steps``: ``T`` dependent steps of
  ``h ← tanh(g_0 + g_1 + g_2 + g_3)``, ``[g_0 … g_3] = h W`` with ``W: [H, 4H] ~ N(0, 1/H)``
  — the per-step GEMM of an LSTM layer at ``M = B`` rows (``h`` stays O(1), so no
  denormals slow either side). jax: ``lax.fori_loop`` in one jit; torch and numpy: a
  Python loop of ``torch.mm`` / ``np.dot`` + elementwise ops (per-op dispatch included).
* ``dispatch``: ``x + 1`` on 8 floats — the fixed cost of one call (a jitted
  executable's launch vs one eager torch op), included in every other row's time.

FLOPs count ``2·M·K·N`` per product (the elementwise work of the recurrent row is
not counted). The ``fwd+bwd``/``fwd`` timings of the real layers are in the ``rnn`` and
``attention`` benchmarks; this one explains them.

Run: ``python -m benchmarks primitives`` (or ``seqjax bench primitives``); ``--smoke``
runs tiny shapes in seconds; ``--out FILE`` writes the markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks import harness

PEERS = ("jax", "torch", "numpy")


@dataclasses.dataclass(frozen=True)
class Case:
    """One row: ``make_jax()`` / ``make_torch()`` / ``make_numpy()`` return a
    :class:`harness.Prepared`."""

    label: str
    flops: float
    make_jax: Callable[[], harness.Prepared]
    make_torch: Callable[[], harness.Prepared]
    make_numpy: Callable[[], harness.Prepared]


def _rand(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def gemm_case(m: int, k: int, n: int) -> Case:
    a, b = _rand((m, k), 0), _rand((k, n), 1)

    def make_jax() -> harness.Prepared:
        import jax.numpy as jnp

        return harness.jax_prepared(jnp.dot, jnp.asarray(a), jnp.asarray(b))

    def make_torch() -> harness.Prepared:
        import torch

        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        return harness.eager_prepared(lambda: torch.mm(ta, tb))

    def make_numpy() -> harness.Prepared:
        out = np.empty((m, n), np.float32)
        return harness.eager_prepared(lambda: np.dot(a, b, out=out))

    return Case(f"gemm {m}×{k}×{n}", 2.0 * m * k * n, make_jax, make_torch, make_numpy)


def bmm_case(g: int, t: int, d: int = 64, parts: int = 1) -> Case:
    """``parts`` independent batched products of ``g // parts`` matrices each."""
    if g % parts:
        raise ValueError(f"`g` must be divisible by `parts`; got g={g}, parts={parts}.")
    qs = [_rand((g // parts, t, d), 2 * i) for i in range(parts)]
    ks = [_rand((g // parts, t, d), 2 * i + 1) for i in range(parts)]

    def make_jax() -> harness.Prepared:
        import jax.numpy as jnp

        def scores(qs_: Sequence[Any], ks_: Sequence[Any]) -> list[Any]:
            return [jnp.einsum("gqd,gkd->gqk", q, k) for q, k in zip(qs_, ks_)]

        return harness.jax_prepared(scores, [jnp.asarray(q) for q in qs],
                                    [jnp.asarray(k) for k in ks])

    def make_torch() -> harness.Prepared:
        import torch

        tq = [torch.from_numpy(q) for q in qs]
        tk = [torch.from_numpy(k) for k in ks]
        return harness.eager_prepared(
            lambda: [torch.bmm(q, k.transpose(1, 2)) for q, k in zip(tq, tk)])

    def make_numpy() -> harness.Prepared:
        outs = [np.empty((g // parts, t, t), np.float32) for _ in range(parts)]
        return harness.eager_prepared(
            lambda: [np.matmul(q, k.transpose(0, 2, 1), out=o) for q, k, o in zip(qs, ks, outs)])

    label = f"bmm {g}×{t}×{t}×{d}" if parts == 1 else f"{parts} × bmm {g // parts}×{t}×{t}×{d}"
    return Case(label, 2.0 * g * t * t * d, make_jax, make_torch, make_numpy)


def recurrent_case(batch: int, hidden: int, steps: int) -> Case:
    h0 = _rand((batch, hidden), 3)
    w = _rand((hidden, 4 * hidden), 4) * np.float32(hidden ** -0.5)

    def make_jax() -> harness.Prepared:
        import jax
        import jax.numpy as jnp

        def run(h: Any, w_: Any) -> Any:
            def body(_: Any, h_: Any) -> Any:
                return jnp.tanh((h_ @ w_).reshape(batch, 4, hidden).sum(1))

            return jax.lax.fori_loop(0, steps, body, h)

        return harness.jax_prepared(run, jnp.asarray(h0), jnp.asarray(w))

    def make_torch() -> harness.Prepared:
        import torch

        th, tw = torch.from_numpy(h0), torch.from_numpy(w)

        @torch.inference_mode()
        def run() -> Any:
            h = th
            for _ in range(steps):
                h = torch.tanh(torch.mm(h, tw).view(batch, 4, hidden).sum(1))
            return h

        return harness.eager_prepared(run)

    def make_numpy() -> harness.Prepared:
        g = np.empty((batch, 4 * hidden), np.float32)

        def run() -> Any:
            h = h0
            for _ in range(steps):
                np.dot(h, w, out=g)
                h = np.tanh(g.reshape(batch, 4, hidden).sum(1))
            return h

        return harness.eager_prepared(run)

    return Case(f"recurrent gemm {batch}×{hidden}×{4 * hidden}, {steps} steps",
                2.0 * batch * hidden * 4 * hidden * steps, make_jax, make_torch, make_numpy)


def dispatch_case() -> Case:
    """The fixed cost of one call: ``x + 1`` on 8 floats (a jitted call vs an eager op)."""
    x = _rand((8,), 5)

    def make_jax() -> harness.Prepared:
        import jax.numpy as jnp

        return harness.jax_prepared(lambda v: v + 1, jnp.asarray(x))

    def make_torch() -> harness.Prepared:
        import torch

        tx = torch.from_numpy(x)
        return harness.eager_prepared(lambda: tx + 1)

    def make_numpy() -> harness.Prepared:
        return harness.eager_prepared(lambda: x + 1)

    return Case("dispatch: x + 1 on 8 floats", 0.0, make_jax, make_torch, make_numpy)


def default_cases() -> list[Case]:
    return [
        gemm_case(8192, 256, 768),
        gemm_case(8192, 256, 1024),
        gemm_case(16384, 512, 2048),
        bmm_case(256, 128),
        bmm_case(256, 128, parts=2),
        bmm_case(64, 512),
        recurrent_case(32, 256, 128),
        recurrent_case(64, 512, 256),
        gemm_case(768, 128, 384),
        bmm_case(48, 64, 32),
        dispatch_case(),
    ]


def smoke_cases() -> list[Case]:
    return [gemm_case(64, 32, 48), bmm_case(8, 16, 8), bmm_case(8, 16, 8, parts=2),
            recurrent_case(4, 8, 5), dispatch_case()]


def run(cases: Sequence[Case], peers: Sequence[str], *, repeats: int, warmup: int,
        min_sample_s: float, log: Callable[[str], None] | None) -> list[tuple[Case, list]]:
    has_torch = harness.torch_available()
    out = []
    for case in cases:
        row_peers = []
        if "jax" in peers:
            row_peers.append(harness.Peer("jax", case.make_jax))
        if "torch" in peers and has_torch:
            row_peers.append(harness.Peer("torch", case.make_torch))
        if "numpy" in peers:
            row_peers.append(harness.Peer("numpy", case.make_numpy))
        if not row_peers:
            continue
        # harness "tokens" = FLOPs, so its tokens/s column reads as FLOP/s.
        out.append((case, harness.run_row(case.label, row_peers, int(case.flops),
                                          repeats=repeats, warmup=warmup,
                                          min_sample_s=min_sample_s, log=log)))
    return out


def summary_table(rows: Sequence[tuple[Case, list]]) -> str:
    """ms, GFLOP/s and CPU÷wall per peer, and jax's speed relative to each other peer."""
    present = [p for p in PEERS if any(r.peer == p for _, rs in rows for r in rs)]
    headers = ["row"]
    for peer in present:
        headers += [f"{peer} ms", f"{peer} GFLOP/s", f"{peer} CPU÷wall"]
    others = [p for p in present if p != "jax"]
    headers += [f"jax ÷ {p} speed" for p in others]
    lines = []
    for case, results in rows:
        by = {r.peer: r for r in results}
        cells: list[str] = [case.label]
        for peer in present:
            r = by.get(peer)
            if r is None:
                cells += ["–", "–", "–"]
                continue
            gflops = f"{case.flops / r.median_s / 1e9:.0f}" if case.flops else "–"
            cells += [f"{r.median_s * 1e3:.3f}", gflops, f"{r.cpu_median_s / r.median_s:.2f}"]
        for peer in others:
            ok = "jax" in by and peer in by
            cells.append(f"{by[peer].median_s / by['jax'].median_s:.2f}×" if ok else "–")
        lines.append(cells)
    return harness.markdown_table(headers, lines)


def limit_blas_threads(num_threads: int) -> Any:
    """Cap numpy's BLAS pool at ``num_threads`` (a context manager; a no-op without
    ``threadpoolctl``, when OpenBLAS keeps its default of one thread per core)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=num_threads, user_api="blas")


def blas_description() -> str:
    """numpy's BLAS as threadpoolctl sees it (library, version, threads), for the report."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "numpy's BLAS: unknown (threadpoolctl not installed; default threads)"
    libs = [f"{i.get('internal_api')} {i.get('version')} ({i.get('num_threads')} threads)"
            for i in threadpool_info() if i.get("user_api") == "blas"]
    return "BLAS libraries loaded: " + ("; ".join(libs) if libs else "none found")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench primitives",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 2 repeats, seconds")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma list of " + ",".join(PEERS))
    ap.add_argument("--rows", default=None,
                    help="comma list of substrings; keep the rows whose label contains one "
                         "(e.g. 'bmm,recurrent')")
    harness.add_common_args(ap)
    args = ap.parse_args(argv)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown or not peers:
        ap.error(f"--peers must be a comma list of {', '.join(PEERS)}; got {args.peers!r}")
    harness.configure_threads(args.threads)
    log = None if args.quiet or args.smoke else (lambda s: print(s, file=sys.stderr, flush=True))
    cases = smoke_cases() if args.smoke else default_cases()
    if args.rows:
        wanted = [w.strip() for w in args.rows.split(",") if w.strip()]
        cases = [c for c in cases if any(w in c.label for w in wanted)]
        if not cases:
            ap.error(f"--rows {args.rows!r} matches no row")
    with limit_blas_threads(args.threads):
        blas = blas_description()
        rows = run(cases, peers,
                   repeats=2 if args.smoke else args.repeats, warmup=1 if args.smoke else 2,
                   min_sample_s=0.0 if args.smoke else 0.2, log=log)
    harness.emit_report(
        "Primitives under the RNN and attention rows: XLA:CPU vs torch vs OpenBLAS (fp32)",
        "primitives", argv, summary_table(rows), [r for _, rs in rows for r in rs],
        out=args.out,
        notes=["GFLOP/s = 2·M·K·N per product ÷ median wall time. CPU÷wall = process CPU "
               "time ÷ wall time per call (2.0 = both cores busy). numpy = the OpenBLAS "
               "in numpy's wheel, capped at --threads threads. In the per-peer table "
               "below, \"tokens\" are FLOPs: its tokens/s column is FLOP/s.", blas],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Attention TFLOP/s: ``seqjax.nn.attention.dot_product_attention`` per implementation.

The attention core alone — no projections — on ``q, k, v: [B, T, H, D]``, forward
and forward+backward, for every implementation the backend offers:

* ``xla``: seqjax's XLA path (every backend);
* ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")`` through seqjax
  (GPU, float16/bfloat16) — issue #9 item 4's attention rows;
* ``pallas``: the Pallas TPU flash-attention kernel (TPU);
* ``torch-sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (CPU, when torch
  is installed; its CUDA build is not a dependency).

FLOPs per call follow FlashAttention's convention: the forward pass is
``4·B·H·T²·D`` (``Q Kᵀ`` and ``A V``), halved with the causal mask; forward+backward is
3.5× the forward (the backward's five products, with the recomputed scores).
TFLOP/s = FLOPs ÷ median wall time. The harness's "tokens" are FLOPs here.

Run: ``python -m benchmarks attention_core`` (on a GPU: ``--dtype bfloat16
--lengths 1024,2048,4096,8192``); ``--smoke``: tiny shapes in seconds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks import harness

LENGTHS = (1024, 2048, 4096, 8192)


def available_implementations() -> list[str]:
    import jax

    backend = jax.default_backend()
    impls = ["xla"]
    if backend == "gpu":
        impls.append("cudnn")
    if backend == "tpu":
        impls.append("pallas")
    if backend == "cpu" and harness.torch_available():
        impls.append("torch-sdpa")
    return impls


def flops(batch: int, heads: int, length: int, head_dim: int, *, causal: bool,
          backward: bool) -> float:
    fwd = 4.0 * batch * heads * length * length * head_dim * (0.5 if causal else 1.0)
    return fwd * (3.5 if backward else 1.0)


def _inputs(batch: int, length: int, heads: int, head_dim: int) -> list[Any]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((batch, length, heads, head_dim), dtype=np.float32)
            for _ in range(3)]


def jax_peer(impl: str, arrays: list[Any], dtype: str, causal: bool,
             backward: bool) -> harness.Prepared:
    import jax
    import jax.numpy as jnp

    from seqjax.nn.attention import dot_product_attention

    q, k, v = (jnp.asarray(a, dtype) for a in arrays)

    def attend(q: Any, k: Any, v: Any) -> Any:
        return dot_product_attention(q, k, v, is_causal=causal, implementation=impl)

    if backward:
        def loss(q: Any, k: Any, v: Any) -> Any:
            return jnp.sum(attend(q, k, v).astype(jnp.float32))

        return harness.jax_prepared(jax.grad(loss, argnums=(0, 1, 2)), q, k, v)
    return harness.jax_prepared(attend, q, k, v)


def torch_peer(arrays: list[Any], dtype: str, causal: bool, backward: bool,
               device: str = "cpu") -> harness.Prepared:
    """torch's ``scaled_dot_product_attention`` on ``device`` (a CUDA device synchronised
    after each call)."""
    import torch
    import torch.nn.functional as F

    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    q, k, v = (torch.from_numpy(a).to(device=device, dtype=tdtype).transpose(1, 2).contiguous()
               for a in arrays)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if backward:
        for t in (q, k, v):
            t.requires_grad_(True)

        def step() -> None:
            for t in (q, k, v):
                t.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).float().sum().backward()
            sync()
    else:
        def step() -> None:
            with torch.inference_mode():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            sync()

    return harness.eager_prepared(step)


def run(lengths: Sequence[int], impls: Sequence[str], *, tokens: int, heads: int,
        head_dim: int, dtype: str, causal: bool, forward: bool, repeats: int, warmup: int,
        min_sample_s: float, log: Any = None) -> list[harness.Result]:
    results: list[harness.Result] = []
    for length in lengths:
        batch = max(1, tokens // length)
        arrays = _inputs(batch, length, heads, head_dim)
        for backward in ((True, False) if forward else (True,)):
            mode = "fwd+bwd" if backward else "fwd"
            label = (f"B={batch} T={length} H={heads} D={head_dim} "
                     f"{'causal' if causal else 'full'} {dtype} {mode}")
            peers = []
            for impl in impls:
                if impl == "torch-sdpa":
                    peers.append(harness.Peer(impl, lambda a=arrays, b=backward: torch_peer(
                        a, dtype, causal, b)))
                else:
                    peers.append(harness.Peer(impl, lambda i=impl, a=arrays, b=backward: jax_peer(
                        i, a, dtype, causal, b)))
            n = flops(batch, heads, length, head_dim, causal=causal, backward=backward)
            results += harness.run_row(label, peers, int(n), repeats=repeats, warmup=warmup,
                                       min_sample_s=min_sample_s, log=log)
    return results


def summary_table(results: Sequence[harness.Result]) -> str:
    rows, impls = harness.by_row(results)
    lines = []
    for row, by in rows.items():
        lines.append([row] + [f"{by[i].tokens_per_s / 1e12:.3f}" if i in by else "–"
                              for i in impls])
    return harness.markdown_table(["row"] + [f"{i} TFLOP/s" for i in impls], lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench attention_core",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="T=16,32, tiny batch, seconds")
    ap.add_argument("--lengths", default=None, help="comma list of T (default 1024..8192)")
    ap.add_argument("--tokens", type=int, default=16384, help="B·T per call (B = tokens // T)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--implementations", default=None,
                    help="comma list (default: every one this backend offers)")
    ap.add_argument("--no-forward", action="store_true", help="skip the forward-only rows")
    harness.add_common_args(ap, repeats=5)
    args = ap.parse_args(argv)
    offered = available_implementations()
    impls = ([i.strip() for i in args.implementations.split(",") if i.strip()]
             if args.implementations else offered)
    missing = [i for i in impls if i not in offered]
    if missing or not impls:
        ap.error(f"--implementations: {missing or impls} not available here; this backend "
                 f"offers {offered}")
    if args.smoke:
        lengths, tokens, heads, head_dim = [16, 32], 64, 2, 8
    else:
        lengths = ([int(t) for t in args.lengths.split(",")] if args.lengths else list(LENGTHS))
        tokens, heads, head_dim = args.tokens, args.heads, args.head_dim
    harness.configure_threads(args.threads)
    log = None if args.quiet or args.smoke else (lambda s: print(s, file=sys.stderr, flush=True))
    results = run(lengths, impls, tokens=tokens, heads=heads, head_dim=head_dim,
                  dtype=args.dtype, causal=args.causal, forward=not args.no_forward,
                  repeats=2 if args.smoke else args.repeats, warmup=1 if args.smoke else 2,
                  min_sample_s=0.0 if args.smoke else 0.2, log=log)
    harness.emit_report(
        "Attention core: TFLOP/s per implementation (higher is better)", "attention_core",
        argv, summary_table(results), results, out=args.out,
        notes=["FLOPs: forward 4·B·H·T²·D (half when causal), forward+backward 3.5× that "
               "(FlashAttention's convention). In the per-peer table, \"tokens\" are FLOPs."],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

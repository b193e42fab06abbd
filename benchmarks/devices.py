"""Weak scaling of the GPT training step over 1, 2, 4, 8 devices (data parallel).

Every row is one full optimiser step of the ``gpt`` benchmark's model (nanoGPT's CPU
configuration: 4 layers, 4 heads, d = 128, block 64; :mod:`benchmarks.gpt`) trained
through :class:`seqjax.train.parallel.Parallel` — the path ``fit``, the CLI and the
experiments use — with a fixed per-device batch (``--per-device-batch``, default 4
sequences), so the global batch grows with the device count (weak scaling). The table
reports tokens/s, tokens/s per device and the per-device efficiency against one device.

On CPU the devices are *fake* (``--xla_force_host_platform_device_count=N``, one
subprocess per N): they share the same cores, so the per-device rate falls by about
``1/N`` even with perfect partitioning, and the row measures what partitioning costs
(collectives, per-device dispatch), not a speed-up. On a GPU or TPU host with N real
devices the rows use ``jax.devices()[:N]`` in one process and measure real scaling.

Run: ``python -m benchmarks devices`` (or ``seqjax bench devices``); ``--smoke`` runs a
tiny model on 1 and 2 devices in seconds; ``--out FILE`` writes the markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

from benchmarks import harness
from benchmarks.gpt import SMOKE, GPTShape, batch_tokens, seqjax_model


def measure(shape: GPTShape, devices: int, *, repeats: int, strategy: str) -> dict[str, Any]:
    """Time the step on the first ``devices`` devices of this process (global batch
    ``shape.batch``); returns the row as a dict."""
    import jax

    from seqjax.train.losses import make_lm_loss
    from seqjax.train.optim import OptimizerConfig, make_optimizer
    from seqjax.train.parallel import Parallel
    from seqjax.train.step import flax_apply_fn

    if jax.device_count() < devices:
        raise ValueError(f"{devices} devices asked for; this process sees {jax.device_count()}.")
    par = Parallel.create(f"data={devices}", strategy, devices=jax.devices()[:devices])
    par.check_batch_size(shape.batch)
    model = seqjax_model(shape)
    tokens = batch_tokens(shape)
    host = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    tx, _ = make_optimizer(OptimizerConfig(name="adamw", learning_rate=1e-3, weight_decay=0.1,
                                           clip_norm=1.0))
    holder = {"state": par.create_state(
        lambda r: model.init(r, host["inputs"][:1])["params"], tx, jax.random.PRNGKey(0))}
    step_fn = par.train_step(make_lm_loss(flax_apply_fn(model)))
    batch = par.place_global(host)

    def step() -> Any:
        holder["state"], metrics = step_fn(holder["state"], batch)
        return jax.block_until_ready(metrics["loss"])

    import time

    t0 = time.perf_counter()
    step()
    compile_s = time.perf_counter() - t0
    peer = harness.Peer("seqjax", lambda: harness.Prepared(step, compile_s, "first call"))
    (result,) = harness.run_row(f"{devices} devices", [peer], shape.tokens, repeats=repeats)
    return {"devices": devices, "global_batch": shape.batch, "tokens": shape.tokens,
            "median_s": result.median_s, "tokens_per_s": result.tokens_per_s,
            "iqr_s": list(result.quartiles_s()), "compile_s": compile_s,
            "platform": jax.devices()[0].platform, "device_kind": jax.devices()[0].device_kind}


def _worker(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--shape", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--strategy", default="replicated")
    args = ap.parse_args(argv)
    harness.configure_threads()
    shape = GPTShape(**json.loads(args.shape))
    row = measure(shape, args.devices, repeats=args.repeats, strategy=args.strategy)
    print("ROW " + json.dumps(row), flush=True)
    return 0


def _fake_cpu_row(shape: GPTShape, n: int, repeats: int, strategy: str) -> dict[str, Any]:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if "xla_force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={n}"])
    env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, "-m", "benchmarks.devices", "--worker", "--devices", str(n),
           "--shape", json.dumps(dataclasses.asdict(shape)), "--repeats", str(repeats),
           "--strategy", strategy]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    rows = [ln[4:] for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
    if out.returncode or not rows:
        raise RuntimeError(f"worker for {n} devices failed:\n{out.stdout[-2000:]}"
                           f"\n{out.stderr[-2000:]}")
    return json.loads(rows[-1])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--worker":
        return _worker(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m benchmarks devices", description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="tiny model, 1 and 2 devices")
    ap.add_argument("--devices", default="1,2,4,8", help="device counts (comma-separated)")
    ap.add_argument("--per-device-batch", type=int, default=4)
    ap.add_argument("--strategy", default="replicated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the markdown here")
    args = ap.parse_args(argv)
    counts = [1, 2] if args.smoke else [int(c) for c in args.devices.split(",")]
    base = SMOKE if args.smoke else GPTShape()
    repeats = 2 if args.smoke else args.repeats
    import jax

    real = jax.devices()[0].platform != "cpu"
    rows = []
    for n in counts:
        shape = dataclasses.replace(base, batch=args.per_device_batch * n)
        if real:
            rows.append(measure(shape, n, repeats=repeats, strategy=args.strategy))
        else:
            rows.append(_fake_cpu_row(shape, n, repeats, args.strategy))
    per1 = rows[0]["tokens_per_s"] / rows[0]["devices"]
    table = harness.markdown_table(
        ["devices", "global batch", "tokens/step", "ms/step (median)", "tokens/s",
         "tokens/s per device", "per-device efficiency", "compile s"],
        [[r["devices"], r["global_batch"], r["tokens"], f"{r['median_s'] * 1e3:.1f}",
          harness.format_rate(r["tokens_per_s"]),
          harness.format_rate(r["tokens_per_s"] / r["devices"]),
          f"{r['tokens_per_s'] / r['devices'] / per1:.0%}", f"{r['compile_s']:.1f}"]
         for r in rows])
    kind = ("fake CPU devices sharing the machine's cores (one process per count): the "
            "per-device rate falls ~1/N with perfect partitioning; tokens/s across rows "
            "shows the partitioning overhead") if not real else (
            f"{rows[0]['device_kind']} devices of one host")
    report = "\n\n".join([
        f"## Weak scaling of the GPT step ({base.num_layers}L/{base.num_heads}H/"
        f"{base.embed_dim}, T={base.block_size}, {args.per_device_batch} sequences per device, "
        f"strategy {args.strategy})",
        f"Command: `{' '.join(['python -m benchmarks devices', *argv])}`",
        harness.machine_markdown(),
        f"Devices: {kind}.",
        table,
    ])
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""XLA:CPU's per-call temporaries: page faults and time per step, with and without
:func:`seqjax.train.cpu_memory.keep_freed_memory`: ``python -m benchmarks cpu_memory``.

For ``char_lm``'s default configuration (nanoGPT's CPU config: 4 layers, 4 heads, 128
wide, block 64, batch 12), each mode runs in its own process (glibc's settings are
per process): build the train step as ``char_lm`` does, warm up, then time ``--steps``
calls of the compiled step, synchronised after each, and read the process's minor page
faults and user/system CPU time over them (``getrusage``). Modes alternate ``--rounds``
times (``off`` = ``SEQJAX_KEEP_FREED_MEMORY=0``, glibc's defaults; ``on`` = seqjax's
default on CPU) and the table gives medians. Page faults and CPU seconds do not depend on
what else runs on the machine; wall time does.

Run: ``python -m benchmarks cpu_memory [--steps 40] [--rounds 3] [--data_path P]``;
``--smoke``: a tiny model and a few steps (CI).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence

from benchmarks import harness

MODES = {"off": "0", "on": "1"}


def measure(steps: int, exp_args: Sequence[str]) -> dict[str, float]:
    """In this process: build the step, warm up, time ``steps`` synced calls."""
    import resource
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.loop import build
    from seqjax.train import cpu_memory

    cpu_memory.keep_freed_memory()  # as `seqjax train` does at its start ($SEQJAX_KEEP_...)
    s = build(list(exp_args))
    rng = np.random.default_rng(0)
    ids = np.asarray(s.train_ids)
    t = s.cfg.block_size

    def batch() -> dict:
        starts = rng.integers(0, len(ids) - t - 1, s.cfg.batch_size)
        w = np.stack([ids[a : a + t + 1] for a in starts]).astype(np.int32)
        return {"inputs": jnp.asarray(w[:, :-1]), "targets": jnp.asarray(w[:, 1:])}

    batches = [batch() for _ in range(8)]
    state, step = s.state, s.step
    for i in range(3):
        state, m = step(state, batches[i % 8])
        jax.block_until_ready(m)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for i in range(steps):
        state, m = step(state, batches[i % 8])
        jax.block_until_ready(m)
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    return {"applied": bool(cpu_memory._applied), "wall_ms": 1e3 * (t1 - t0) / steps,
            "faults": (r1.ru_minflt - r0.ru_minflt) / steps,
            "cpu_ms": 1e3 * (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / steps,
            "sys_ms": 1e3 * (r1.ru_stime - r0.ru_stime) / steps}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks cpu_memory", description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args, exp_args = ap.parse_known_args(argv)
    if args.smoke:
        args.steps, args.rounds = 3, 1
        exp_args = ["--smoke", *exp_args]
    if args.child:
        print(json.dumps(measure(args.steps, exp_args)))
        return 0
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode, value in MODES.items():
            env = {**os.environ, "SEQJAX_KEEP_FREED_MEMORY": value}
            cmd = [sys.executable, "-m", "benchmarks", "cpu_memory", "--child",
                   "--steps", str(args.steps), *exp_args]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = []
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("wall_ms", "faults", "cpu_ms", "sys_ms")}
        rows.append([f"{mode} (keep_freed_memory applied: {runs[0]['applied']})",
                     f"{med['faults']:.0f}", f"{med['sys_ms']:.1f}", f"{med['cpu_ms']:.1f}",
                     f"{med['wall_ms']:.2f}"])
        results[mode] = med  # type: ignore[assignment]
    print(f"Command: `python -m benchmarks cpu_memory {' '.join(argv or [])}`\n")
    print(harness.machine_markdown() + "\n")
    print(f"char_lm step ({' '.join(exp_args) or 'default config'}), {args.steps} synced "
          f"calls per process, medians of {args.rounds} alternating rounds:\n")
    print(harness.markdown_table(
        ["mode", "minor faults/step", "system CPU ms/step", "CPU ms/step", "wall ms/step"],
        rows))
    off, on = results["off"], results["on"]
    print(f"\ncpu_memory: CPU ms/step {off['cpu_ms']:.1f} -> {on['cpu_ms']:.1f}; "
          f"wall ms/step {off['wall_ms']:.2f} -> {on['wall_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

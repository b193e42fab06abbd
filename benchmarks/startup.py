"""Time to the first training step, cold and warm, each in a fresh process.

A run's wait before its first step is mostly XLA compiling its programs. ``seqjax train``
keeps compiled programs in JAX's persistent compilation cache
(:func:`seqjax.enable_compile_cache`), so a second run of the same configuration loads them
instead. For every workload this benchmark starts two fresh processes on one empty cache
folder (a temporary directory): the first finds nothing (**cold**, what a first run or
``--compile_cache=false`` costs), the second finds every program (**warm**). It reports

* **first step** — seconds from the process's start to the first call's results, read
  from the line ``fit`` prints (``first step: ... s since the process started``);
* **after imports** — the same less the time a fresh process takes to import the recipe
  (measured alone, once);
* **outside steps** — the process's wall time less the time of the training steps after
  the first call (start-up, compiles, evaluations, the sample, the summary);
* **wall** — the whole process.

Workloads: ``char_lm`` at its defaults (fewer steps: ``--steps``), ``char_lm --preset gpu``
and the GPT-2 124M train step of ``python -m benchmarks gpt --preset gpt2-small`` (bf16,
``--batch``); the last two only on an accelerator unless ``--all``. The last line is
``first step: cold C s, warm W s`` for ``char_lm`` at its defaults.

Run: ``python -m benchmarks startup [--steps N] [--all] [--smoke]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import harness

FIRST_STEP = re.compile(r"first step: ([0-9.]+) s in fit(?:, ([0-9.]+) s since the process)?")


def _first_step(text: str) -> tuple[float, float | None]:
    """``(seconds in fit, seconds since the process started)`` from fit's line."""
    m = FIRST_STEP.search(text)
    if m is None:
        raise RuntimeError("no 'first step:' line in the run's output:\n" + text[-3000:])
    return float(m.group(1)), (float(m.group(2)) if m.group(2) else None)


def import_seconds(module: str) -> float:
    """Wall seconds of a fresh process that imports ``module`` (and JAX's backend) only."""
    code = f"import {module}, jax; jax.devices()"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - t0


def _cache_env(cache: str) -> dict[str, str]:
    """This process's environment with the compile cache on, in the folder ``cache``."""
    return {**os.environ, "SEQJAX_COMPILE_CACHE": "1", "JAX_COMPILATION_CACHE_DIR": cache}


def char_lm_once(args: Sequence[str], cache: str, workdir: str) -> dict[str, float]:
    """One fresh ``char_lm`` process with the compile cache in ``cache``."""
    env = _cache_env(cache)
    cmd = [sys.executable, "-m", "seqjax.experiments.char_lm", *args, f"--workdir={workdir}",
           "--progress=false"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    in_fit, since_start = _first_step(proc.stdout + proc.stderr)
    with open(os.path.join(workdir, "char_lm.json")) as f:
        train_wall = float(json.load(f)["train_wall_s"])
    return {"first_step": since_start if since_start is not None else in_fit,
            "in_fit": in_fit, "outside": wall - max(train_wall - in_fit, 0.0), "wall": wall}


def gpt2_child(batch: int) -> int:
    """In a fresh process: the GPT-2 124M bf16 step of ``benchmarks gpt``, compiled and run
    once under the compile cache the environment names; prints fit's style of line."""
    import jax

    from benchmarks.gpt import GPTShape, seqjax_peer
    from seqjax.compile_cache import enable_compile_cache
    from seqjax.train.fit_parts import process_uptime

    enable_compile_cache()
    t0 = time.perf_counter()
    shape = GPTShape(num_layers=12, num_heads=12, embed_dim=768, block_size=1024, batch=batch,
                     vocab_size=50304, use_bias=True)
    prepared = seqjax_peer(shape, "bfloat16")
    jax.block_until_ready(prepared.step())
    since = process_uptime()
    print(f"first step: {time.perf_counter() - t0:.2f} s in fit"
          + (f", {since:.2f} s since the process started" if since is not None else ""))
    return 0


def gpt2_once(batch: int, cache: str) -> dict[str, float]:
    env = _cache_env(cache)
    cmd = [sys.executable, "-m", "benchmarks", "startup", "--child-gpt2", str(batch)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    in_fit, since_start = _first_step(proc.stdout)
    return {"first_step": since_start if since_start is not None else in_fit,
            "in_fit": in_fit, "outside": wall, "wall": wall}


def cold_and_warm(run: Any) -> tuple[dict[str, float], dict[str, float]]:
    """``run(cache, workdir)`` twice on one fresh cache folder: (cold, warm)."""
    with tempfile.TemporaryDirectory(prefix="seqjax_startup_") as tmp:
        cache = os.path.join(tmp, "cache")
        cold = run(cache, os.path.join(tmp, "run1"))
        warm = run(cache, os.path.join(tmp, "run2"))
    return cold, warm


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks startup",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200,
                    help="char_lm steps per run (its default is 2000; the start-up is the same)")
    ap.add_argument("--batch", type=int, default=12, help="GPT-2 row's batch")
    ap.add_argument("--all", action="store_true",
                    help="also the --preset gpu and GPT-2 rows on the CPU (slow there)")
    ap.add_argument("--skip-gpt2", action="store_true",
                    help="leave out the GPT-2 row (benchmarks gpu times its compile elsewhere)")
    ap.add_argument("--smoke", action="store_true", help="char_lm --smoke only (CI)")
    ap.add_argument("--out", default=None, help="also write the markdown here")
    ap.add_argument("--data_path", default=None,
                    help="Tiny Shakespeare for char_lm (default: its own search)")
    ap.add_argument("--child-gpt2", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_gpt2 is not None:
        return gpt2_child(args.child_gpt2)
    import jax

    accelerator = jax.default_backend() != "cpu"
    steps = [f"--steps={args.steps}"]
    if args.data_path:
        steps.append(f"--data_path={args.data_path}")
    workloads: list[tuple[str, Any]] = []
    if args.smoke:
        workloads.append(("char_lm --smoke", lambda c, w: char_lm_once(["--smoke"], c, w)))
    else:
        workloads.append((f"char_lm (defaults, --steps={args.steps})",
                          lambda c, w: char_lm_once(steps, c, w)))
        if accelerator or args.all:
            workloads.append((f"char_lm --preset gpu --steps={args.steps}",
                              lambda c, w: char_lm_once(["--preset", "gpu", *steps], c, w)))
            if not args.skip_gpt2:
                workloads.append((f"GPT-2 124M step, B={args.batch}, bf16",
                                  lambda c, w: gpt2_once(args.batch, c)))
    imports = import_seconds("seqjax.experiments.char_lm")
    rows, first = [], None
    for label, run in workloads:
        cold, warm = cold_and_warm(run)
        if first is None:
            first = (cold["first_step"], warm["first_step"])
        for kind, r in (("cold", cold), ("warm", warm)):
            rows.append([label, kind, f"{r['first_step']:.2f}",
                         f"{r['first_step'] - imports:.2f}", f"{r['in_fit']:.2f}",
                         f"{r['outside']:.1f}", f"{r['wall']:.1f}"])
    table = harness.markdown_table(
        ["workload", "cache", "first step (s)", "after imports (s)", "first call in fit (s)",
         "outside steps (s)", "wall (s)"], rows)
    harness.emit_report(
        "Time to first step, cold and warm (fresh process each)", "startup", argv, table, [],
        notes=[f"Importing the recipe in a fresh process: {imports:.2f} s. "
               "Cold = an empty compile cache; warm = the same cache after one run."],
        out=args.out)
    print(f"first step: cold {first[0]:.1f} s, warm {first[1]:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``modern`` preset's training step against the ``124m`` preset's on one device, and
Muon's share of it: ``seqjax train gpt2``'s own model, optimizer and step at each preset's
shapes (bf16 compute, the preset's rows per micro-step and gradient accumulation).

Per preset, on random token batches of the preset's global size:

* **step ms** — the median of ``--repeats`` whole steps (forward, backward over every
  micro-batch, the optimizer update), after a compiling call;
* **optimizer ms** — the median of the update alone (``tx.update`` + ``apply_updates`` on the
  model's parameters and a gradient tree, jitted); for
  ``modern`` it is Muon's Newton–Schulz iterations on every hidden matrix plus AdamW on the
  rest, and **Muon's share** = optimizer ms ÷ step ms (target ≤ 5% on an H100/H200);
* **MFU** — ``C · tokens/s ÷ peak`` with ``C = 6N + 6LHQT`` FLOPs per token
  (:mod:`seqjax.train.flops`, nanoGPT's convention: the causal attention term at half) and
  the device's dense bf16 peak (989 TFLOP/s on an H100/H200; target ≥ 50%).

Run: ``python -m benchmarks muon_step`` on a GPU (``--presets 124m,modern``); ``--smoke`` runs
the ``smoke``/``modern_smoke`` shapes on any device in seconds (the figures then mean
nothing). Every figure is printed with the device it was measured on.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Any

from benchmarks import harness


def _median_ms(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure(preset: str, repeats: int, rows: int | None = None) -> dict[str, Any]:
    """The step and optimizer times of ``seqjax train gpt2 --preset preset`` on one device."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from seqjax.experiments import gpt2
    from seqjax.experiments._config import apply_overrides
    from seqjax.train.flops import lm_flops_per_token, peak_flops_per_device
    from seqjax.train.losses import make_lm_loss
    from seqjax.train.optim import TrainState, make_optimizer
    from seqjax.train.step import flax_apply_fn, make_train_step

    cfg = apply_overrides(gpt2.Config(), gpt2.PRESETS[preset])  # dotted keys: model.KEY
    if rows is not None:
        cfg = dataclasses.replace(cfg, batch_size=rows)
    accum = gpt2.grad_accum(cfg, 1)
    model = gpt2.build_model(cfg)
    x0 = jnp.zeros((1, cfg.block_size), jnp.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), x0)["params"]
    tx, schedule = make_optimizer(gpt2.optimizer(cfg))
    dtype = None if cfg.compute_dtype == "float32" else jnp.dtype(cfg.compute_dtype)
    step = make_train_step(make_lm_loss(flax_apply_fn(model)), compute_dtype=dtype,
                           schedule=schedule, grad_accum=accum)
    state = TrainState.create(params, tx, jax.random.PRNGKey(1))
    tokens = np.random.default_rng(0).integers(0, 50257, (cfg.batch_size, cfg.block_size + 1))
    batch = {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
             "targets": jnp.asarray(tokens[:, 1:], jnp.int32)}
    @jax.jit
    def update(p: Any, s: Any, g: Any) -> tuple[Any, Any]:
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    grads = jax.tree_util.tree_map(lambda x: 1e-3 * jnp.ones_like(x), params)
    opt = {"p": jax.tree_util.tree_map(jnp.copy, params), "s": tx.init(params)}

    def one_update() -> None:
        opt["p"], opt["s"] = update(opt["p"], opt["s"], grads)
        jax.block_until_ready(opt["p"])

    one_update()
    update_ms = _median_ms(one_update, repeats)
    box = {"state": state}

    def one_step() -> None:
        box["state"], m = step(box["state"], batch)
        jax.block_until_ready(m["loss"])

    one_step()  # compiles
    step_ms = _median_ms(one_step, repeats)

    flops = lm_flops_per_token(model.config, params, block_size=cfg.block_size)
    tokens_per_s = cfg.batch_size * cfg.block_size / (step_ms / 1e3)
    peak = peak_flops_per_device()
    return {"preset": preset, "optimizer": cfg.optimizer, "rows": cfg.batch_size,
            "grad_accum": accum, "step_ms": step_ms, "update_ms": update_ms,
            "share": update_ms / step_ms, "tokens_per_s": tokens_per_s,
            "mfu": None if peak is None else flops * tokens_per_s / peak,
            "device": jax.devices()[0].device_kind}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench muon_step",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="the smoke presets' shapes")
    ap.add_argument("--presets", default=None, help="default 124m,modern (smoke: "
                                                    "smoke,modern_smoke)")
    ap.add_argument("--repeats", type=int, default=None, help="default 10 (smoke: 2)")
    ap.add_argument("--rows", type=int, default=None,
                    help="rows per step instead of the preset's (e.g. a smaller card)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from seqjax.train.cpu_memory import keep_freed_memory

    keep_freed_memory()  # as `seqjax train` does first thing (a no-op off the CPU)
    presets = (args.presets or ("smoke,modern_smoke" if args.smoke else "124m,modern")).split(",")
    repeats = args.repeats or (2 if args.smoke else 10)
    rows = []
    for p in presets:  # each preset's line as soon as it is measured (a run cut short keeps it)
        r = measure(p, repeats, args.rows)
        rows.append(r)
        print(f"muon_step: {r['preset']}: {r['step_ms']:.1f} ms/step, optimizer "
              f"{100 * r['share']:.1f}% of it", flush=True)
    lines = ["| preset | optimizer | rows × accum | step ms | optimizer ms | optimizer share | "
             "tokens/s | MFU |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        mfu = "—" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(f"| {r['preset']} | {r['optimizer']} | {r['rows']} × {r['grad_accum']} | "
                     f"{r['step_ms']:.1f} | {r['update_ms']:.1f} | {100 * r['share']:.1f}% | "
                     f"{harness.format_rate(r['tokens_per_s'])} | {mfu} |")
    summary = f"Device: {rows[0]['device']}.\n\n" + "\n".join(lines)
    harness.emit_report("muon_step", "muon_step", argv, summary, [], out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

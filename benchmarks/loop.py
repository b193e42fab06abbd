"""The training loop against its own compiled step: what ``fit`` costs beyond the step.

For one ``char_lm`` configuration (default ``--preset gpu``; ``--preset lstm`` for the
recurrent model; ``--preset default`` for the experiment's defaults, nanoGPT's CPU config;
any other ``--key=value`` of the experiment passes through), one
process times, on whatever backend JAX finds:

* **compiled step, sync** — the real jitted train step on one device-resident batch,
  ``block_until_ready`` after every step: the device time of the program (what
  ``python -m benchmarks gpt`` measures);
* **bare loop, device batches** — the same step called back to back on distinct
  pre-placed batches, synchronised once at the end (JAX's async dispatch);
* **bare loop + host input** — the same with nanoGPT-style host windows
  (:class:`~seqjax.data.iterators.LMWindowIterator`) and their placement every step:
  ``fit``'s per-step work without ``fit``;
* **fit** — :func:`seqjax.train.loop.fit` itself (no work dir, no progress bar), with
  host windows and with device-resident windows
  (:class:`~seqjax.data.device.DeviceLMWindows`), at ``steps_per_call`` 1 and ``K``;
  timed between its first and last logged record (setup excluded);
* **null step** (``--null-only``: these rows alone) — a jitted step with the same state
  pytree, shardings, donation and metric keys that does no work (``step + 1``): ``fit``
  then measures the loop's pure host cost per step, for each input and ``steps_per_call``.

The table gives ms per step and the ratio to the compiled step; the last line is
``fit/step: R; host us/step: N`` — ``fit`` with the experiment's own input at
``steps_per_call=1`` over the compiled step, and the null step's host cost there.

Run: ``python -m benchmarks loop [--steps N] [--k K] [--preset gpu|lstm] [--data_path P]``;
``--smoke``: a tiny model and a few steps, in seconds (CI).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import harness


@dataclasses.dataclass
class Setup:
    cfg: Any
    par: Any
    state: Any
    step: Any
    train_ids: Any
    vocab: int
    null_step: Any


def build(argv: Sequence[str]) -> Setup:
    """char_lm's training pieces, built as ``char_lm.run`` builds them."""
    import jax
    import jax.numpy as jnp

    from seqjax.experiments import char_lm
    from seqjax.experiments._runner import build_config, load_experiment
    from seqjax.train.losses import make_lm_loss
    from seqjax.train.optim import TrainState, make_optimizer
    from seqjax.train.parallel import Parallel
    from seqjax.train.step import TrainStep, flax_apply_fn

    cfg = build_config(load_experiment("char_lm"), "char_lm", list(argv), resume=False)
    par = Parallel.from_options(cfg)
    train_ids = char_lm.load_tokens(cfg).train[0].astype("int32")
    model = char_lm.build_model(cfg)
    x0 = jnp.zeros((1, cfg.block_size), jnp.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(cfg.seed), x0)["params"]
    tx, schedule = make_optimizer(char_lm.optimizer(cfg))
    state = par.shard_state(TrainState.create(params, tx, jax.random.PRNGKey(cfg.seed + 1)))
    compute = None if cfg.compute_dtype == "float32" else jnp.dtype(cfg.compute_dtype)
    step = par.train_step(make_lm_loss(flax_apply_fn(model)), schedule=schedule,
                          compute_dtype=compute)

    def null_fn(state: Any, batch: Any) -> tuple[Any, dict]:
        # every metric the real step reports, from a reduction over the batch (no model)
        x = jnp.mean(batch["inputs"].astype(jnp.float32))
        metrics = {k: x for k in ("loss", "grad_norm", "accuracy", "lr")}
        metrics["tokens"] = jnp.float32(batch["inputs"].size)
        return state.replace(step=state.step + 1), metrics

    null = TrainStep(null_fn, state_sharding=step.state_sharding,
                     batch_sharding=step.batch_sharding)
    return Setup(cfg, par, state, step, train_ids, cfg.vocab_size, null)


def _host_windows(s: Setup) -> Any:
    from seqjax.data.iterators import LMWindowIterator

    return LMWindowIterator(s.train_ids, s.par.local_batch_size(s.cfg.batch_size),
                            s.cfg.block_size, seed=s.cfg.seed, **s.par.host_rows())


def _device_windows(s: Setup) -> Any:
    from seqjax.data.device import DeviceLMWindows

    return DeviceLMWindows(s.train_ids, s.cfg.batch_size, s.cfg.block_size, seed=s.cfg.seed,
                           vocab_size=s.vocab, mesh=s.par.mesh)


class _Holder:
    """The state, handed from mode to mode (every step donates it)."""

    def __init__(self, state: Any) -> None:
        self.state = state


def compiled_sync(s: Setup, h: _Holder, n: int) -> float:
    import jax

    batch = s.par.place(next(_host_windows(s)))
    run = s.step
    h.state, m = run(h.state, batch)
    jax.block_until_ready(m)
    t = time.perf_counter()
    for _ in range(n):
        h.state, m = run(h.state, batch)
        jax.block_until_ready(m["loss"])
    return (time.perf_counter() - t) / n * 1e3


def bare_device(s: Setup, h: _Holder, n: int) -> float:
    import jax

    it = _host_windows(s)
    batches = [s.par.place(next(it)) for _ in range(min(n, 64))]
    run = s.step
    h.state, m = run(h.state, batches[0])
    jax.block_until_ready(h.state)
    t = time.perf_counter()
    for i in range(n):
        h.state, m = run(h.state, batches[i % len(batches)])
    jax.block_until_ready(h.state)
    return (time.perf_counter() - t) / n * 1e3


def bare_host(s: Setup, h: _Holder, n: int, step: Any = None) -> float:
    import jax

    step = s.step if step is None else step
    it = _host_windows(s)
    run = step
    h.state, m = run(h.state, s.par.place(next(it)))
    jax.block_until_ready(h.state)
    t = time.perf_counter()
    for _ in range(n):
        h.state, m = run(h.state, s.par.place(next(it)))
    jax.block_until_ready(h.state)
    return (time.perf_counter() - t) / n * 1e3


def fit_ms(s: Setup, h: _Holder, n: int, data: Callable[[], Any], k: int,
           step: Any = None) -> float:
    """ms/step of ``fit`` between its first and last logged record (a warm-up call first,
    so every program it runs is compiled)."""
    from seqjax.train.loop import FitConfig, fit

    step = s.step if step is None else step
    n = max(2 * k, n - n % k)
    stamps: list[tuple[int, float]] = []

    def cfg(steps: int, log_every: int) -> Any:
        return FitConfig(steps=steps, log_every=log_every, progress=False,
                         tensorboard=False, plot=False, handle_signals=False,
                         steps_per_call=k)

    start = int(h.state.step)
    warm = start + 2 * k - start % k
    h.state = fit(h.state, step, _skip(data(), start), cfg(warm, k), parallel=s.par).state
    log_every = max(k, (n // 4) // k * k)
    hook = (lambda r: stamps.append((r["step"], time.perf_counter())),)
    h.state = fit(h.state, step, _skip(data(), warm), cfg(warm + n, log_every),
                  parallel=s.par, hooks=hook).state
    (s0, t0), (s1, t1) = stamps[0], stamps[-1]
    return (t1 - t0) / max(s1 - s0, 1) * 1e3


def _skip(data: Any, start: int) -> Any:
    """Host iterators start at the state's step (``fit`` without a work dir does not
    replay them); device sources need nothing."""
    if hasattr(data, "device_batch"):
        return data
    data.set_state({**data.get_state(), "step": start})
    return data


# Spans of XLA:CPU's runtime and of jax's dispatch in a host trace (not operations).
_HOST_WRAPPERS = ("ThunkExecutor", "PjitFunction", "SlinkyThreadPool", "CommonPjRt",
                  "PythonRefManager", "PjRt", "TfrtCpu")


def kernel_profile(s: Setup, h: _Holder, steps: int = 5, top: int = 15) -> str:
    """The ``top`` device operations of the compiled step by time per step, from a
    ``jax.profiler`` trace of ``steps`` steps (its Perfetto export, read with ``json``);
    on a backend whose trace has no device process, the host's events."""
    import collections
    import glob
    import gzip
    import json
    import os
    import tempfile

    import jax

    batch = s.par.place(next(_host_windows(s)))
    run = s.step
    for _ in range(2):
        h.state, _ = run(h.state, batch)
    jax.block_until_ready(h.state)
    logdir = tempfile.mkdtemp(prefix="seqjax_trace_")
    with jax.profiler.trace(logdir, create_perfetto_trace=True):
        for _ in range(steps):
            h.state, _ = run(h.state, batch)
        jax.block_until_ready(h.state)
    files = glob.glob(os.path.join(logdir, "**", "perfetto_trace.json.gz"), recursive=True)
    if not files:
        return "(no Perfetto trace was written)"
    with gzip.open(files[0]) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    device = [p for p, n in names.items() if "/device:" in n]
    host_only = not device  # XLA:CPU: the operations run on the host's threads
    if host_only:
        device = list(names)
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    executor = 0.0
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in device or "dur" not in e:
            continue
        name = e["name"]
        if host_only and name == "ThunkExecutor::Execute (wait for completion)":
            executor += e["dur"]
        if host_only and (name.startswith("$") or name.startswith(_HOST_WRAPPERS)):
            continue  # Python frames and the runtime's own spans, not operations
        total[name] += e["dur"]
        count[name] += 1
    busy = sum(total.values()) / steps / 1e3
    rows = [[name[:80], f"{us / steps / 1e3:.3f}", f"{count[name] // steps}"]
            for name, us in total.most_common(top)]
    where = ", ".join(sorted({names[p] for p in device}))
    head = (f"Operations of the compiled step ({where}; the sum of their durations is "
            f"{busy:.3f} ms per step over {steps} steps")
    if host_only:
        head += (f"; the executor's wall time per call is {executor / steps / 1e3:.3f} ms — the "
                 "difference is the runtime's own time between operations, or operations "
                 "running side by side on the two threads")
    return head + "):\n\n" + harness.markdown_table(["operation", "ms/step", "calls/step"],
                                                     rows)


def run(argv: Sequence[str], steps: int, k: int, null_only: bool = False,
        profile: bool = False) -> tuple[list[list[Any]], float | None, float, str]:
    s = build(argv)
    h = _Holder(s.state)
    profile_text = kernel_profile(s, h) if profile else ""
    if profile_text:
        print(profile_text, flush=True)
    device_input = s.cfg.input == "device"
    rows: list[list[Any]] = []
    compiled = None if null_only else compiled_sync(s, h, steps)

    def row(name: str, ms: float, ref: float | None = compiled) -> None:
        rows.append([name, f"{ms:.3f}", "–" if ref is None else f"{ms / ref:.2f}×"])
        # as it is measured, so a run cut short by a time limit still reports it
        print(f"loop: {name}: {ms:.3f} ms/step", flush=True)

    ratio = None
    if not null_only:
        row("compiled step, sync every step", compiled)
        row("bare loop, device batches, async", bare_device(s, h, steps))
        row("bare loop + host input (windows, placement)", bare_host(s, h, steps))
        fit_host = fit_ms(s, h, steps, lambda: _host_windows(s), 1)
        row("fit, host windows, steps_per_call=1", fit_host)
        fit_dev = fit_ms(s, h, steps, lambda: _device_windows(s), 1)
        row("fit, device windows, steps_per_call=1", fit_dev)
        row(f"fit, device windows, steps_per_call={k}",
            fit_ms(s, h, steps, lambda: _device_windows(s), k))
        ratio = (fit_dev if device_input else fit_host) / compiled
    null_steps = steps if steps < 50 else max(steps, 200)  # smoke runs stay short
    hn = _Holder(h.state)
    null_host = fit_ms(s, hn, null_steps, lambda: _host_windows(s), 1, s.null_step)
    null_dev = fit_ms(s, hn, null_steps, lambda: _device_windows(s), 1, s.null_step)
    null_dev_k = fit_ms(s, hn, null_steps, lambda: _device_windows(s), k, s.null_step)
    row("null step: bare loop + host input", bare_host(s, hn, null_steps, s.null_step), None)
    row("null step: fit, host windows, steps_per_call=1", null_host, None)
    row("null step: fit, device windows, steps_per_call=1", null_dev, None)
    row(f"null step: fit, device windows, steps_per_call={k}", null_dev_k, None)
    host_us = (null_dev if device_input else null_host) * 1e3
    return rows, ratio, host_us, profile_text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks loop", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny model, few steps (CI)")
    ap.add_argument("--steps", type=int, default=300, help="timed steps per mode")
    ap.add_argument("--k", type=int, default=8, help="steps_per_call of the k rows")
    ap.add_argument("--null-only", action="store_true",
                    help="only the null-step rows (the host cost at the model's state size; "
                         "no real step is compiled)")
    ap.add_argument("--profile", action="store_true",
                    help="also print the compiled step's top device operations (jax.profiler)")
    ap.add_argument("--out", default=None, help="also write the markdown here")
    args, rest = ap.parse_known_args(argv)
    harness.configure_threads()  # the allocator setting of a `seqjax train` process
    exp_args = list(rest)
    if args.smoke:
        exp_args = ["--smoke", *exp_args]
        args.steps = min(args.steps, 8)
        args.k = min(args.k, 2)
    elif not any(a.startswith("--preset") for a in exp_args):
        exp_args = ["--preset=gpu", *exp_args]
    # --preset=default: the experiment's own defaults (char_lm: nanoGPT's CPU config)
    exp_args = [a for a in exp_args if a not in ("--preset=default", "--preset=cpu")]
    if args.steps < 2 * args.k:
        ap.error(f"--steps must be at least 2 * --k = {2 * args.k}; got {args.steps}.")
    rows, ratio, host_us, profile_text = run(exp_args, args.steps, args.k, args.null_only,
                                             args.profile)
    table = harness.markdown_table(["mode", "ms/step", "vs compiled step"], rows)
    if profile_text:
        table += "\n\n" + profile_text  # printed above as well, as soon as it was taken
    report = "\n\n".join([
        "## Training loop vs its compiled step",
        f"Command: `python -m benchmarks loop {' '.join(argv if argv is not None else [])}`"
        .rstrip(),
        harness.machine_markdown(),
        f"Experiment options: `{' '.join(exp_args)}`; {args.steps} timed steps per mode "
        "(null-step rows: at least 200; fewer in a smoke run).",
        table,
    ])
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    shown = "n/a (--null-only)" if ratio is None else f"{ratio:.3f}"
    print(f"fit/step: {shown}; host us/step: {host_us:.1f}")
    return 0

"""Shared timing harness for every seqjax benchmark.

What it guarantees, for every row of every table:

* **compile time apart**: a JAX peer is compiled with ``jax.jit(f).lower(*args).compile()``
  and that wall time is reported in its own column; a torch peer reports the
  time of its first call (allocator and oneDNN primitive set-up). Neither is
  part of the throughput numbers.
* **warm-up** calls before any timed sample, and ``jax.block_until_ready`` (or
  the synchronous return of torch on CPU) inside every timed call.
* **median and spread**: each peer is timed ``repeats`` times; every sample is
  the mean of ``inner`` back-to-back calls, ``inner`` chosen from the warm-up so
  that a sample lasts about ``min_sample_s``. Reported: median and the
  interquartile range (q1–q3) of the per-call time, as tokens/s.
* **peers alternated**: the samples of all peers of one row are taken round
  robin (the order rotates every repeat), so a burst of load from elsewhere on
  the machine hits every peer alike and the ratios stay fair.
* **same threads**: :func:`configure_threads` pins torch to the given number of
  intra-op threads; JAX's CPU client uses one thread per core of the process's
  affinity set, which on the 2-core benchmark machine is the same 2 threads.
* **same allocator**: :func:`configure_threads` also sets the process up as a seqjax
  training process is on the CPU (:func:`seqjax.train.cpu_memory.keep_freed_memory`:
  freed memory stays in glibc's heap); every peer runs in that one process, so all get
  it (``SEQJAX_KEEP_FREED_MEMORY=0`` measures glibc's defaults).
* **CPU time too**: each sample also records the process CPU time per call
  (all threads). On a machine shared with other jobs wall time inflates, and
  torch's OpenMP threads suffer more than XLA's pool when descheduled; CPU
  time is the steadier measure of work, so tables show both.

A benchmark builds :class:`Peer` objects (a name and a factory that returns a
:class:`Prepared`: the callable to time plus its compile time) and hands them to
:func:`run_row`; :func:`markdown_table` renders the results.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "Peer",
    "Prepared",
    "Result",
    "configure_threads",
    "add_common_args",
    "torch_available",
    "jax_prepared",
    "eager_prepared",
    "jax_module_prepared",
    "torch_module_prepared",
    "run_row",
    "by_row",
    "ratio_summary",
    "machine_info",
    "machine_markdown",
    "emit_report",
    "markdown_table",
    "results_table",
    "format_rate",
]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A ready-to-time peer: ``step()`` runs one call to completion (blocking)."""

    step: Callable[[], Any]
    compile_s: float
    compile_kind: str  # "compile" (lower+compile) or "first call"


@dataclasses.dataclass(frozen=True)
class Peer:
    """A contender in one row: ``build()`` sets it up and returns a :class:`Prepared`."""

    name: str
    build: Callable[[], Prepared]


@dataclasses.dataclass(frozen=True)
class Result:
    """Timings of one peer in one row. ``times_s`` are per-call seconds, one per sample."""

    row: str
    peer: str
    tokens: int
    compile_s: float
    compile_kind: str
    times_s: tuple[float, ...]
    inner: int
    cpu_times_s: tuple[float, ...] = ()

    @property
    def cpu_median_s(self) -> float:
        """Median process CPU seconds per call (all threads; ~ cores × wall when busy)."""
        return statistics.median(self.cpu_times_s) if self.cpu_times_s else float("nan")

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    def quartiles_s(self) -> tuple[float, float]:
        """(q1, q3) of the per-call time (inclusive method; min/max when < 4 samples)."""
        ts = sorted(self.times_s)
        if len(ts) < 4:
            return ts[0], ts[-1]
        q = statistics.quantiles(ts, n=4, method="inclusive")
        return q[0], q[2]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.median_s

    def rate_range(self) -> tuple[float, float]:
        """Tokens/s at q3 and q1 of the time: the interquartile range of the rate."""
        q1, q3 = self.quartiles_s()
        return self.tokens / q3, self.tokens / q1


# --------------------------------------------------------------------------- set-up


def add_common_args(ap: Any, *, repeats: int = 7) -> None:
    """The options every benchmark takes: ``--repeats``, ``--threads``, ``--quiet``, ``--out``."""
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--threads", type=int, default=2,
                    help="torch intra-op threads (and the primitives' OpenBLAS peer's)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--out", default=None, help="also write the markdown report to this file")


def torch_available() -> bool:
    """Whether torch can be imported (the torch peers are skipped without it)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def configure_threads(num_threads: int = 2) -> dict[str, Any]:
    """Give torch ``num_threads`` intra-op threads (and one inter-op thread), and keep
    freed memory in the heap as seqjax's train step does on the CPU.

    JAX's CPU client sizes its pool from the process's CPU affinity; the value
    is only recorded here (``XLA_FLAGS`` must be set before jax is imported to
    change it, which a benchmark run through the ``seqjax`` CLI cannot do).
    """
    from seqjax.train.cpu_memory import keep_freed_memory

    info: dict[str, Any] = {"requested_threads": num_threads,
                            "keep_freed_memory": keep_freed_memory()}
    try:
        import torch
    except ImportError:
        return info
    torch.set_num_threads(num_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (torch allows it once per process)
        pass
    info["torch_threads"] = torch.get_num_threads()
    info["torch_interop_threads"] = torch.get_num_interop_threads()
    return info


def jax_prepared(fn: Callable[..., Any], *args: Any) -> Prepared:
    """jit ``fn``, compile it for ``args`` (timed), and return a blocking step.

    ``fn`` must be a pure function of ``args`` (params and inputs are passed as
    arguments, not closed over, so XLA cannot constant-fold them).
    """
    import jax

    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0

    def step() -> Any:
        return jax.block_until_ready(compiled(*args))

    return Prepared(step=step, compile_s=compile_s, compile_kind="compile")


def jax_module_prepared(
    module: Any, x: Any, *, backward: bool, seed: int = 0,
    params_cache: dict | None = None, cache_key: Any = None,
) -> Prepared:
    """A flax module's training-style (or forward-only) call, compiled and ready to time.

    ``backward=True`` times ``jax.grad(lambda p, x: module.apply(p, x).sum(), (0, 1))``:
    the forward pass, loss = sum of the outputs, gradients w.r.t. parameters and input.
    ``backward=False`` times ``module.apply(params, x)``. With ``params_cache`` and
    ``cache_key``, the initialised parameters are reused by the next call with the
    same key (the fwd and fwd+bwd rows of one configuration share them).
    """
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(x)
    if params_cache is not None and cache_key in params_cache:
        params = params_cache[cache_key]
    else:
        # jit: one compilation instead of one per primitive (eager init costs seconds).
        params = jax.jit(module.init)(jax.random.PRNGKey(seed), x)
        if params_cache is not None:
            params_cache[cache_key] = params
    if backward:
        def loss(p: Any, x_: Any) -> Any:
            return jnp.sum(module.apply(p, x_))

        return jax_prepared(jax.grad(loss, argnums=(0, 1)), params, x)
    return jax_prepared(module.apply, params, x)


def torch_module_prepared(
    model: Any, x: Any, *, backward: bool, output: Callable[[Any], Any] | None = None
) -> Prepared:
    """A torch module's training-style (or forward-only) call; mirrors :func:`jax_module_prepared`.

    ``backward=True``: clear grads, forward, ``output(model(x)).sum().backward()``
    (gradients w.r.t. parameters and input). ``backward=False``: forward under
    ``torch.inference_mode()``. ``output`` picks the tensor out of the module's
    return value (e.g. ``lambda r: r[0]`` for ``nn.LSTM``).
    """
    import torch

    pick = output or (lambda r: r)
    x = torch.as_tensor(x)
    if backward:
        model.train()
        x = x.detach().clone().requires_grad_(True)
        params = list(model.parameters())

        def step() -> None:
            for p in params:
                p.grad = None
            x.grad = None
            pick(model(x)).sum().backward()
    else:
        model.eval()

        def step() -> None:
            with torch.inference_mode():
                pick(model(x))

    return eager_prepared(step)


def eager_prepared(step: Callable[[], Any]) -> Prepared:
    """Wrap an eager step (torch, numpy); its first call is timed as the set-up cost."""
    t0 = time.perf_counter()
    step()
    return Prepared(step=step, compile_s=time.perf_counter() - t0, compile_kind="first call")


# --------------------------------------------------------------------------- timing


def _time_calls(step: Callable[[], Any], n: int) -> tuple[float, float]:
    """Per-call (wall, process CPU) seconds over ``n`` back-to-back calls."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    wall = time.perf_counter() - t0
    return wall / n, (time.process_time() - c0) / n


def run_row(
    row: str,
    peers: Sequence[Peer],
    tokens: int,
    *,
    repeats: int = 7,
    warmup: int = 2,
    min_sample_s: float = 0.2,
    max_inner: int = 50,
    log: Callable[[str], None] | None = None,
) -> list[Result]:
    """Build, warm up and time every peer of one row, alternating round robin.

    Args:
        row: label of the row (e.g. ``"LSTM B=32 T=128 H=256 fwd+bwd"``).
        peers: the contenders; built in order (compile times do not overlap).
        tokens: tokens processed per call (``B*T``), for the tokens/s column.
        repeats: samples per peer (median and IQR are taken over these).
        warmup: untimed calls per peer after building it.
        min_sample_s: target duration of one sample; sets ``inner``.
        max_inner: cap on calls per sample.
        log: optional progress printer.

    Returns:
        One :class:`Result` per peer, in the order of ``peers``.
    """
    if repeats < 1:
        raise ValueError(f"`repeats` must be >= 1; got {repeats}.")
    if not peers:
        raise ValueError("`peers` must not be empty.")
    prepared: list[Prepared] = []
    inners: list[int] = []
    for peer in peers:
        p = peer.build()
        for _ in range(max(warmup - 1, 0)):
            p.step()
        one, _ = _time_calls(p.step, 1)  # last warm-up call, timed to size the samples
        inner = int(min(max_inner, max(1, round(min_sample_s / max(one, 1e-9)))))
        prepared.append(p)
        inners.append(inner)
        if log:
            log(f"  {row} | {peer.name}: {p.compile_kind} {p.compile_s:.2f}s, "
                f"~{one * 1e3:.1f} ms/call, {inner} calls/sample")
    samples: list[list[float]] = [[] for _ in peers]
    cpu_samples: list[list[float]] = [[] for _ in peers]
    n = len(peers)
    for rep in range(repeats):
        for k in range(n):
            i = (rep + k) % n  # rotate who goes first
            wall, cpu = _time_calls(prepared[i].step, inners[i])
            samples[i].append(wall)
            cpu_samples[i].append(cpu)
    return [
        Result(
            row=row,
            peer=peer.name,
            tokens=tokens,
            compile_s=p.compile_s,
            compile_kind=p.compile_kind,
            times_s=tuple(s),
            inner=inner,
            cpu_times_s=tuple(c),
        )
        for peer, p, s, c, inner in zip(peers, prepared, samples, cpu_samples, inners)
    ]


# --------------------------------------------------------------------------- reporting


def _version(module: str) -> str:
    try:
        mod = __import__(module)
    except ImportError:
        return "not installed"
    return str(getattr(mod, "__version__", "?"))


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    keep = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
                    return " ".join(k for k in keep if k in flags)
    except OSError:
        pass
    return ""


def machine_info() -> dict[str, str]:
    """CPU model, cores, OS, Python and library versions, thread settings (the CPU model and
    jax version from :func:`seqjax.utils.machine_info`, the library's probe)."""
    from seqjax.utils import machine_info as library_machine_info

    common = library_machine_info()
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 0
    info = {
        "cpu": common["cpu"],
        "cpu_flags": _cpu_flags(),
        "cores": f"{os.cpu_count()} logical, {affinity} usable by this process",
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "jax": common["jax"],
        "jaxlib": _version("jaxlib"),
        "flax": _version("flax"),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
    }
    try:
        import jax

        info["jax_backend"] = f"{jax.default_backend()} ({len(jax.devices())} device(s))"
        info["jax_matmul_precision"] = str(jax.config.jax_default_matmul_precision)
    except ImportError:
        pass
    from seqjax.train import cpu_memory

    info["keep_freed_memory"] = {True: "on (glibc: 1 GiB mmap/trim thresholds, one arena)",
                                 False: "off", None: "not decided"}[cpu_memory._applied]
    if "torch" in sys.modules:
        import torch

        info["torch_threads"] = f"{torch.get_num_threads()} intra-op, " \
                                f"{torch.get_num_interop_threads()} inter-op"
    return info


def machine_markdown(info: dict[str, str] | None = None) -> str:
    """The machine as a markdown bullet list."""
    info = machine_info() if info is None else info
    return "\n".join(f"- **{k}**: {v if v else '(unset)'}" for k, v in info.items())


def emit_report(
    title: str,
    name: str,
    argv: Sequence[str] | None,
    summary: str,
    results: Sequence[Result],
    *,
    notes: Sequence[str] = (),
    out: str | None = None,
) -> str:
    """The markdown report every benchmark prints (and writes to ``out``): title, the
    command that reproduces it, the machine (torch "not installed" when absent: its peers
    are skipped), ``notes``, the summary and, when there are ``results``, the per-peer
    table."""
    args = list(sys.argv[1:] if argv is None else argv)
    per_peer = [
        "Per peer (median and interquartile range over the repeats; compile time apart):",
        results_table(results),
    ] if results else []
    report = "\n\n".join([
        f"## {title}",
        f"Command: `{' '.join(['python -m benchmarks', name, *args])}`",
        machine_markdown(),
        *notes,
        summary,
        *per_peer,
    ])
    print(report)
    if out:
        with open(out, "w") as f:
            f.write(report + "\n")
    return report


def trace_events(fn, args, calls: int) -> list[dict]:
    """Complete events of a ``jax.profiler`` trace of ``calls`` calls of ``fn``: from the
    TensorBoard ``*.trace.json.gz``, else from the Perfetto trace, for a JAX that writes only
    that one (on jax 0.11.2's GPU build ``gpt_profile`` matched no event; whether the file was
    missing was not established)."""
    import glob
    import gzip
    import json
    import os
    import tempfile

    import jax

    with tempfile.TemporaryDirectory() as logdir:
        jax.profiler.start_trace(logdir, create_perfetto_trace=True)
        try:
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
        finally:
            jax.profiler.stop_trace()
        events: list[dict] = []
        for pattern in ("*.trace.json.gz", "perfetto_trace.json.gz"):
            for path in glob.glob(os.path.join(logdir, "plugins", "profile", "*", pattern)):
                with gzip.open(path) as f:
                    trace = json.load(f)
                listed = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
                events = [e for e in listed if e.get("ph") == "X"]
                if events:
                    return events
    return events


def dot_names(hlo_text: str) -> set[str]:
    """Names of the compiled program's instructions that compute a matmul: ``dot``s and
    the fusions (XLA:CPU's YNNPACK/XNNPACK/oneDNN library fusions) whose body holds one."""
    import re

    bodies = dict(re.findall(r"^%(\S+) [^\n]*\{\n(.*?)\n\}", hlo_text, re.S | re.M))
    with_dot = {name for name, body in bodies.items() if " dot(" in body}
    names = set()
    for name, op, rest in re.findall(r"^\s*(?:ROOT )?%(\S+) = \S+ ([a-z-]+)\((.*)$", hlo_text,
                                     re.M):
        callee = re.search(r"calls=%([^,\s]+)", rest)
        if op == "dot" or (op == "fusion" and callee and callee.group(1) in with_dot):
            names.add(name)
    return names


def format_rate(x: float) -> str:
    """Tokens/s with a k/M/G suffix: ``123456 -> '123.5k'``."""
    if x >= 1e9:
        return f"{x / 1e9:.1f}G"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; numbers right-aligned."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [
        bool(cells) and all(_looks_numeric(r[i]) for r in cells) for i in range(len(headers))
    ]
    def fmt(vals: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)]
        return "| " + " | ".join(parts) + " |"
    sep = "|" + "|".join(
        ("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(widths, numeric)
    ) + "|"
    return "\n".join([fmt(headers), sep] + [fmt(r) for r in cells])


def _looks_numeric(s: str) -> bool:
    """Numbers like ``12.5k``, ``0.93×``, ``1.2k–3.4k``; a lone ``–`` (missing) also counts."""
    s = s.strip()
    if s in ("–", "-", ""):
        return True
    for part in s.split("–"):
        part = part.strip().rstrip("kMGx×%s").replace(".", "", 1).lstrip("-")
        if not part.isdigit():
            return False
    return True


def by_row(results: Sequence[Result]) -> tuple[dict[str, dict[str, Result]], list[str]]:
    """``({row: {peer: result}}, peers)``, both in the order the results were run."""
    rows: dict[str, dict[str, Result]] = {}
    for r in results:
        rows.setdefault(r.row, {})[r.peer] = r
    return rows, list(dict.fromkeys(r.peer for r in results))


def ratio_summary(results: Sequence[Result], *, ours: str = "seqjax",
                  best_header: str = "fastest peer") -> str:
    """One line per row: tokens/s of every peer, the fastest other peer, and ``ours`` ÷ it."""
    rows, peers = by_row(results)
    headers = ["row"] + [f"{p} tok/s" for p in peers] + [best_header, f"{ours} ÷ fastest"]
    lines = []
    for row, res in rows.items():
        others = {p: r.tokens_per_s for p, r in res.items() if p != ours}
        best = max(others, key=others.get) if others else None
        ratio = f"{res[ours].tokens_per_s / others[best]:.2f}×" if best and ours in res else "–"
        lines.append([row] + [format_rate(res[p].tokens_per_s) if p in res else "–"
                              for p in peers] + [best or "–", ratio])
    return markdown_table(headers, lines)


def results_table(results: Sequence[Result]) -> str:
    """One line per (row, peer): compile time, median tokens/s and its IQR, ms/call."""
    headers = ["row", "peer", "compile s", "tokens/s (median)", "IQR tokens/s", "ms/call",
               "CPU ms/call", "n"]
    lines = []
    for r in results:
        lo, hi = r.rate_range()
        lines.append([
            r.row, r.peer, f"{r.compile_s:.2f}", format_rate(r.tokens_per_s),
            f"{format_rate(lo)}–{format_rate(hi)}", f"{r.median_s * 1e3:.2f}",
            f"{r.cpu_median_s * 1e3:.2f}",
            f"{len(r.times_s)}×{r.inner}",
        ])
    return markdown_table(headers, lines)

"""GPU benchmarks of the user path and of the kernels underneath, each part in its own process.

Each part runs in a fresh process with a time limit (a part that fails or runs out of time
is reported as unmeasured; the others still run), in order of importance:

1. ``char_lm`` — ``python -m seqjax.experiments.char_lm --preset gpu`` as a user runs
   it (5000 steps, evaluation every 250, bf16, dropout 0.2), through ``fit``: the median
   of the logged ``steps_per_s`` and the final validation loss;
2. ``nanogpt`` — nanoGPT's ``train.py`` loop for the same config in torch
   (``python -m benchmarks nanogpt_loop --preset gpu``: ``torch.compile``, bf16 autocast,
   fused AdamW): ms per iteration after warm-up;
3. ``rnn`` — LSTM and GRU layers, B=64 T=256 H=512, forward + backward: seqjax's
   default (``RNN(implementation="auto")``) against ``torch.nn.LSTM``/``GRU`` on cuDNN;
4. ``attn0`` — the compiled char_lm step with ``--model.attention_dropout_rate=0`` (cuDNN's
   fused attention) against the default (attention dropout 0.2, XLA attention);
5. ``loop`` — ``python -m benchmarks loop --preset=gpu``: ``fit`` against its compiled
   step (and ``steps_per_call``), the null step's host cost, the step's top kernels (rows
   are kept when the part runs out of time: the benchmark prints each as it is measured);
6. ``gpt2`` — GPT-2 124M train step, B=12 T=1024 bf16, seqjax against nanoGPT's model
   with ``torch.compile`` (``python -m benchmarks gpt --preset gpt2-small``), then the
   largest of B=64/32/16 that fits (tokens/s, MFU);
7. ``startup`` — ``benchmarks startup``: cold and warm time to first step of ``char_lm`` at
   its defaults and ``--preset gpu``;
8. ``profile`` — ``benchmarks gpt_profile``: the GPT-2 step by operation group beside
   ``torch.profiler``, the logits-sized buffers, the attention kernels;
9. ``kernels`` — the layers alone on the shared harness (compile apart, warm-up, median
   and IQR, peers alternated): ``dot_product_attention`` TFLOP/s at T=4096, head dim 128,
   per implementation against ``jax.nn.dot_product_attention`` and torch SDPA; one LSTM
   layer fwd+bwd through cuDNN against the scan and Flax's ``OptimizedLSTMCell``; linear
   attention (parallel, chunked, recurrent) and the selective scan (associative,
   sequential) at T=4096.

The default ``--budget`` (300 s) covers parts 1–3 and ``attn0``; the others need a second
run. ``--parts gpt --budget 420`` is the GPT-2-scale run: ``gpt2``, ``startup`` and
``profile``. The last lines are the targets table: each target with what was measured,
met, missed or unmeasured. That the GPU paths compute what their references do is
``tests/test_gpu_paths.py`` (``JAX_PLATFORMS=cuda python -m pytest tests/test_gpu_paths.py``).

Run (on the GPU machine; the corpus path explicit because ``../shared`` may be absent):
``python -m benchmarks gpu --data_path PATH/tinyshakespeare.txt [--budget 300]
[--parts char_lm,nanogpt,rnn,attn0,loop,gpt2,startup,profile,kernels] [--out-dir DIR]``.
``--smoke`` runs every part at toy sizes on any backend (CI).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks import attention_core, harness, rnn

PARTS = ("char_lm", "nanogpt", "rnn", "attn0", "loop", "gpt2", "startup", "profile",
         "kernels")
#: ``--parts gpt``: the GPT-2 scale (about 7 minutes): the step at B=12 against nanoGPT
#: and at the largest batch that fits, cold/warm time to first step, the profile.
GPT_PARTS = ("gpt2", "startup", "profile")
# Seconds each part needs on one H100/H200, compile included (estimates; a part is skipped
# when less than this is left of the budget).
# Measured on one H200 (benchmarks/HISTORY.md, "The user path on one GPU"): char_lm 128 s,
# nanogpt 39 s, rnn 29 s; loop did not finish in 128 s (it compiles the step four times).
# kernels: on one H100 these measurements and a GPT-2 step took 147 s (HISTORY.md, H100).
# gpt2 188 s and profile 98 s on one H200 (HISTORY.md, "The GPT-2 step on one H200 at 22fa32d").
ESTIMATE = {"char_lm": 135, "nanogpt": 45, "rnn": 35, "loop": 200, "attn0": 60, "gpt2": 190,
            "startup": 120, "profile": 100, "kernels": 150}
RNN_SHAPE = (64, 256, 512)
# Targets of the kernels part.
TARGET_ATTENTION_TFLOPS = 500.0
TARGET_LSTM_RATIO = 3.0
TARGET_SSM_RATIO = 10.0


def _run(cmd: Sequence[str], timeout: float, log_path: str | None) -> tuple[int, str]:
    """Run ``cmd``; ``(returncode, output)``; 124 on timeout."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (
            err.stdout or "")
        rc = 124
    if log_path:
        with open(log_path, "w") as f:
            f.write(" ".join(cmd) + "\n\n" + out)
    return rc, out


# ----------------------------------------------------------------------------- parsers


def parse_char_lm(workdir: str) -> dict[str, Any]:
    """Median logged steps/s (records after the first) and the final validation loss."""
    rates = []
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    rates = [r["steps_per_s"] for r in records[1:] if "steps_per_s" in r]
    with open(os.path.join(workdir, "char_lm.json")) as f:
        summary = json.load(f)
    return {"steps_per_s": statistics.median(rates), "val": summary["val_loss_estimate"],
            "val_full": summary["val_loss"], "steps": summary["steps"],
            "train_wall_s": summary["train_wall_s"]}


def parse_nanogpt(out: str) -> dict[str, Any]:
    m = re.search(r"nanogpt_loop: ms/iter ([0-9.]+); steps/s ([0-9.]+)", out)
    if not m:
        raise ValueError("no 'nanogpt_loop:' line in the output")
    return {"ms_per_iter": float(m.group(1)), "steps_per_s": float(m.group(2))}


def parse_loop(out: str) -> dict[str, Any]:
    """The rows of ``benchmarks loop`` (its ``loop: NAME: X ms/step`` lines, printed as each
    is measured, so a run cut short keeps them) and its summary line when it finished."""
    rows = {}
    for line in out.splitlines():
        m = re.fullmatch(r"loop: (.+): ([0-9.]+) ms/step", line.strip())
        if m:
            rows[m.group(1)] = float(m.group(2))
    if not rows:
        raise ValueError("no 'loop:' rows in the output")
    m = re.search(r"fit/step: ([0-9.]+); host us/step: ([0-9.]+)", out)
    compiled = rows.get("compiled step, sync every step")
    fit = rows.get("fit, device windows, steps_per_call=1")
    ratio = float(m.group(1)) if m else (fit / compiled if fit and compiled else None)
    return {"rows": rows, "fit_over_step": ratio,
            "host_us": float(m.group(2)) if m else None, "finished": bool(m)}


def parse_json_line(out: str, tag: str) -> dict[str, Any]:
    for line in reversed(out.splitlines()):
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1:])
    raise ValueError(f"no '{tag}' line in the output")


def parse_gpt2(out: str) -> dict[str, Any]:
    """From ``benchmarks gpt``'s report: ms per step of each peer at the first row's batch
    (per-peer table columns: row, peer, compile s, tokens/s, IQR, ms/call, CPU ms/call, n),
    seqjax's compile seconds, and the ``--largest-batch`` row (batch, tokens/s, MFU)."""
    found: dict[str, Any] = {}
    first_row = None
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[1] in ("seqjax", "torch-nanogpt"):
            first_row = first_row or cells[0]
            if cells[0] != first_row:
                continue
            try:
                found[cells[1]] = float(cells[5])
                if cells[1] == "seqjax":
                    found["seqjax_compile_s"] = float(cells[2])
            except ValueError:
                continue
    if "seqjax" not in found:
        raise ValueError("no seqjax row in the per-peer table")
    big = re.search(r"that fits: B=(\d+), seqjax ([\d,]+) tokens/s\.([^\n]*)", out)
    if big:
        mfu = re.search(r"MFU ([\d.]+)%", big.group(3))  # absent without a known peak
        found["largest"] = {"batch": int(big.group(1)),
                            "tokens_per_s": float(big.group(2).replace(",", "")),
                            "mfu": float(mfu.group(1)) / 100 if mfu else None}
    return found


def parse_startup(out: str) -> dict[str, Any]:
    """``benchmarks startup``: its last line (char_lm's cold and warm first step) and the
    first-step seconds of every (workload, cache) row."""
    last = re.search(r"first step: cold ([\d.]+) s, warm ([\d.]+) s", out)
    if last is None:
        raise ValueError("no 'first step: cold C s, warm W s' line")
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[1] in ("cold", "warm"):
            rows[f"{cells[0]} ({cells[1]})"] = {"first_step_s": float(cells[2]),
                                               "outside_steps_s": float(cells[5]),
                                               "wall_s": float(cells[6])}
    return {"cold_s": float(last.group(1)), "warm_s": float(last.group(2)), "rows": rows}


def parse_profile(out: str) -> dict[str, Any]:
    """``benchmarks gpt_profile``: the compiled step's logits buffers and attention kernels
    (its sentence), and seqjax's ms per group."""
    facts = re.search(r"materialised: (.*?); attention kernels: (.*?)\.\n", out + "\n")
    groups = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[2].endswith("%"):
            groups[cells[0]] = float(cells[1])
    return {"logits_buffers": facts.group(1) if facts else None,
            "attention_kernels": facts.group(2) if facts else None, "groups_ms": groups}


# ----------------------------------------------------------------------------- in-process parts


def rnn_part(smoke: bool) -> dict[str, Any]:
    """seqjax's default LSTM/GRU layer vs torch's (cuDNN on a GPU), fwd+bwd, ms/call."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from seqjax.nn import RNN, GRUCell, LSTMCell

    b, t, h = (4, 16, 32) if smoke else RNN_SHAPE
    x = np.random.default_rng(0).standard_normal((b, t, h)).astype(np.float32)
    out: dict[str, Any] = {"shape": [b, t, h], "backend": jax.default_backend()}

    def timed(fn: Any, n: int) -> float:
        fn()
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best.append((time.perf_counter() - t0) / n * 1e3)
        return sorted(best)[2]

    def seqjax_call(cell: Any) -> Any:
        rnn = RNN(cell)
        xj = jnp.asarray(x)
        params = rnn.init(jax.random.PRNGKey(0), xj)
        grad = jax.jit(jax.grad(lambda p, x: jnp.sum(rnn.apply(p, x)), argnums=(0, 1)))
        return lambda: jax.block_until_ready(grad(params, xj))

    for name, cell in (("lstm", LSTMCell(h)), ("gru", GRUCell(h))):
        out[f"seqjax_{name}_ms"] = timed(seqjax_call(cell), 3 if smoke else 20)
    try:
        import torch
    except ImportError:
        return out
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out["torch_device"] = dev
    for name, cls in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU)):
        mod = cls(h, h, batch_first=True).to(dev)
        xt = torch.tensor(x, device=dev, requires_grad=True)

        def step(mod: Any = mod, xt: Any = xt) -> None:
            y, _ = mod(xt)
            y.sum().backward()
            if dev == "cuda":
                torch.cuda.synchronize()

        out[f"torch_{name}_ms"] = timed(step, 3 if smoke else 20)
    return out


def attn0_part(data_path: str | None, smoke: bool) -> dict[str, Any]:
    """The compiled char_lm step: default vs ``--model.attention_dropout_rate=0``."""
    from benchmarks import loop

    base = ["--smoke"] if smoke else ["--preset=gpu"]
    if data_path:
        base.append(f"--data_path={data_path}")
    out = {}
    for name, extra in (("default", []),
                        ("attention_dropout_0", ["--model.attention_dropout_rate=0"])):
        s = loop.build([*base, *extra])
        out[f"{name}_ms"] = loop.compiled_sync(s, loop._Holder(s.state), 10 if smoke else 100)
    return out


# ----------------------------------------------------------------------------- the kernels part


@dataclasses.dataclass(frozen=True)
class KernelShapes:
    """Sizes of the kernels part (``--smoke`` shrinks them all)."""

    attn_batch: int
    attn_length: int
    attn_heads: int
    attn_head_dim: int
    lstm: tuple[int, int, int]  # B, T, H
    scan_batch: int
    scan_length: int
    lin_heads: int
    lin_head_dim: int
    ssm_features: int
    ssm_state: int


KERNELS_FULL = KernelShapes(attn_batch=4, attn_length=4096, attn_heads=16, attn_head_dim=128,
                            lstm=RNN_SHAPE, scan_batch=2, scan_length=4096, lin_heads=8,
                            lin_head_dim=64, ssm_features=1024, ssm_state=16)
KERNELS_SMOKE = KernelShapes(attn_batch=2, attn_length=32, attn_heads=2, attn_head_dim=8,
                             lstm=(2, 8, 16), scan_batch=1, scan_length=32, lin_heads=2,
                             lin_head_dim=8, ssm_features=8, ssm_state=4)


@dataclasses.dataclass(frozen=True)
class Group:
    """One measured workload: its results, the unit of the harness's "tokens", errors."""

    name: str
    unit: str  # "tok/s" or "TFLOP/s" (the harness's tokens are FLOPs)
    results: list[harness.Result]
    errors: list[str]


def _backend() -> str:
    import jax

    return jax.default_backend()


def _run_group(name: str, unit: str, rows: Sequence[tuple[str, list[harness.Peer], int]],
               timing: dict[str, Any], log: Callable[[str], None]) -> Group:
    """Time every row; a row whose peers fail together is re-run one peer at a time, so
    one broken peer is reported as an error and the others are still measured."""
    results: list[harness.Result] = []
    errors: list[str] = []
    for row, peers, tokens in rows:
        try:
            results += harness.run_row(row, peers, tokens, log=log, **timing)
            continue
        except Exception:
            pass
        for peer in peers:
            try:
                results += harness.run_row(row, [peer], tokens, log=log, **timing)
            except Exception as e:
                msg = str(e).splitlines()[0][:200] if str(e) else ""
                errors.append(f"{row} | {peer.name}: {type(e).__name__}: {msg}")
                log(f"  ERROR {errors[-1]}")
    return Group(name, unit, results, errors)


def _torch_device() -> str | None:
    """``"cuda"`` when torch sees a GPU and JAX runs on one, ``"cpu"`` on the CPU backend."""
    if not harness.torch_available():
        return None
    backend = _backend()
    if backend == "cpu":
        return "cpu"
    import torch

    return "cuda" if backend == "gpu" and torch.cuda.is_available() else None


def _jax_nn_peer(impl: str, arrays: list[np.ndarray], dtype: str, causal: bool,
                 backward: bool) -> harness.Prepared:
    """``jax.nn.dot_product_attention(implementation=impl)`` (no seqjax in between)."""
    import jax
    import jax.numpy as jnp

    q, k, v = (jnp.asarray(a, dtype) for a in arrays)

    def attend(q_: Any, k_: Any, v_: Any) -> Any:
        return jax.nn.dot_product_attention(q_, k_, v_, is_causal=causal, implementation=impl)

    if backward:
        def loss(q_: Any, k_: Any, v_: Any) -> Any:
            return jnp.sum(attend(q_, k_, v_).astype(jnp.float32))

        return harness.jax_prepared(jax.grad(loss, argnums=(0, 1, 2)), q, k, v)
    return harness.jax_prepared(attend, q, k, v)


def measure_attention(shapes: KernelShapes, timing: dict[str, Any],
                      log: Callable[[str], None]) -> Group:
    """Attention core TFLOP/s: seqjax per implementation, jax.nn, torch SDPA."""
    gpu = _backend() == "gpu"
    dtype = "bfloat16" if gpu else "float32"
    b, t, h, d = shapes.attn_batch, shapes.attn_length, shapes.attn_heads, shapes.attn_head_dim
    arrays = attention_core._inputs(b, t, h, d)
    impls = [i for i in attention_core.available_implementations() if i != "torch-sdpa"]
    torch_device = _torch_device()
    rows = []
    for causal in (False, True):
        for backward in (False, True):
            # On a GPU the causal rows compare the fused kernels only: seqjax's XLA path
            # unrolls T/128 query chunks there, and at T = 4096 its compile did not finish
            # within 150 s on an H100.
            row_impls = [i for i in impls if not (gpu and causal and i == "xla")]
            peers = [harness.Peer(f"seqjax {i}", lambda i=i, c=causal, bw=backward:
                                  attention_core.jax_peer(i, arrays, dtype, c, bw))
                     for i in row_impls]
            peers += [harness.Peer(f"jax.nn {i}", lambda i=i, c=causal, bw=backward:
                                   _jax_nn_peer(i, arrays, dtype, c, bw))
                      for i in (["xla", "cudnn"] if gpu and not causal
                                else ["cudnn"] if gpu else ["xla"])]
            if torch_device is not None:
                peers.append(harness.Peer(f"torch-sdpa ({torch_device})",
                                          lambda c=causal, bw=backward: attention_core.torch_peer(
                                              arrays, dtype, c, bw, torch_device)))
            label = (f"B={b} T={t} H={h} D={d} {'causal' if causal else 'full'} {dtype} "
                     f"{'fwd+bwd' if backward else 'fwd'}")
            flops = attention_core.flops(b, h, t, d, causal=causal, backward=backward)
            rows.append((label, peers, int(flops)))
    return _run_group("attention core", "TFLOP/s", rows, timing, log)


def measure_lstm(shapes: KernelShapes, timing: dict[str, Any],
                 log: Callable[[str], None]) -> Group:
    """One LSTM layer fwd+bwd: cuDNN (GPU) vs seqjax's scan vs Flax ``OptimizedLSTMCell``."""
    b, t, h = shapes.lstm
    cfg = rnn.Config("lstm", b, t, h, backward=True)
    peers = [harness.Peer("seqjax scan", lambda: rnn.seqjax_peer(cfg)),
             harness.Peer("flax OptimizedLSTMCell", lambda: rnn.flax_peer(cfg))]
    if _backend() == "gpu":
        peers.insert(0, harness.Peer("seqjax cudnn", lambda: rnn.seqjax_cudnn_peer(cfg)))
    group = _run_group("LSTM layer", "tok/s", [(cfg.label, peers, cfg.tokens)], timing, log)
    rnn._PARAMS.clear()
    return group


def _scan_prepared(fn: Callable[..., Any], args: tuple[Any, ...]) -> harness.Prepared:
    """fwd+bwd of ``sum(fn(*args))`` w.r.t. every argument, compiled."""
    import jax
    import jax.numpy as jnp

    def loss(*a: Any) -> Any:
        return jnp.sum(fn(*a).astype(jnp.float32))

    return harness.jax_prepared(jax.grad(loss, argnums=tuple(range(len(args)))), *args)


def measure_scans(shapes: KernelShapes, timing: dict[str, Any],
                  log: Callable[[str], None]) -> Group:
    """Linear attention (parallel / chunked / recurrent) and the selective scan
    (associative / sequential), fwd+bwd at T = ``scan_length``, float32."""
    import jax
    import jax.numpy as jnp

    from seqjax.nn.linear_attention import linear_attention
    from seqjax.nn.ssm import selective_scan

    b, t = shapes.scan_batch, shapes.scan_length
    rng = np.random.default_rng(4)
    h, d = shapes.lin_heads, shapes.lin_head_dim
    qkv = tuple(jnp.asarray(rng.standard_normal((b, t, h, d), np.float32)) for _ in range(3))

    def lin(impl: str) -> harness.Prepared:
        return _scan_prepared(lambda q, k, v: linear_attention(
            q, k, v, is_causal=True, implementation=impl), qkv)

    e, n = shapes.ssm_features, shapes.ssm_state
    x = jnp.asarray(rng.standard_normal((b, t, e), np.float32))
    dt = jax.nn.softplus(jnp.asarray(rng.standard_normal((b, t, e), np.float32)) - 4.0)
    a = -jnp.exp(jnp.asarray(rng.standard_normal((e, n), np.float32)) * 0.5)
    bc = tuple(jnp.asarray(rng.standard_normal((b, t, n), np.float32)) for _ in range(2))

    def ssm(impl: str, backward: bool) -> harness.Prepared:
        def f(x_: Any, dt_: Any, a_: Any, b_: Any, c_: Any) -> Any:
            return selective_scan(x_, dt_, a_, b_, c_, impl=impl)

        args = (x, dt, a, *bc)
        return _scan_prepared(f, args) if backward else harness.jax_prepared(f, *args)

    rows = [(f"linear attention B={b} T={t} H={h} D={d} causal fwd+bwd",
             [harness.Peer(i, lambda i=i: lin(i)) for i in ("parallel", "chunked", "recurrent")],
             b * t)]
    for backward in (True, False):
        rows.append((f"selective scan B={b} T={t} E={e} N={n} {'fwd+bwd' if backward else 'fwd'}",
                     [harness.Peer(i, lambda i=i, bw=backward: ssm(i, bw))
                      for i in ("associative", "sequential")], b * t))
    return _run_group("scans", "tok/s", rows, timing, log)


def kernels_table(groups: Sequence[Group]) -> str:
    """One line per (workload, peer): compile s, median ms/call, throughput, IQR, n."""
    def rate(x: float, unit: str) -> str:
        return f"{x / 1e12:.3g}" if unit == "TFLOP/s" else harness.format_rate(x)

    lines = []
    for g in groups:
        for r in g.results:
            lo, hi = r.rate_range()
            lines.append([r.row, r.peer, f"{r.compile_s:.1f}", f"{r.median_s * 1e3:.3f}",
                          f"{rate(r.tokens_per_s, g.unit)} {g.unit}",
                          f"{rate(lo, g.unit)}–{rate(hi, g.unit)}", f"{len(r.times_s)}×{r.inner}"])
    return harness.markdown_table(
        ["workload", "peer", "compile s", "ms/call (median)", "throughput", "IQR", "n"], lines)


def kernels_part(smoke: bool, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """The attention core, the LSTM layer and the scans on the harness: the table (to print),
    one record per (workload, peer) with its rate in the group's unit, and the errors."""
    shapes = KERNELS_SMOKE if smoke else KERNELS_FULL
    harness.configure_threads()
    timing = dict(repeats=2 if smoke else 5, warmup=1 if smoke else 2,
                  min_sample_s=0.0 if smoke else 0.1)
    groups = [measure(shapes, timing, log)
              for measure in (measure_attention, measure_lstm, measure_scans)]
    rows = [{"group": g.name, "row": r.row, "peer": r.peer, "unit": g.unit,
             "rate": r.tokens_per_s / (1e12 if g.unit == "TFLOP/s" else 1.0),
             "ms": r.median_s * 1e3, "compile_s": r.compile_s}
            for g in groups for r in g.results]
    return {"backend": _backend(), "rows": rows, "errors": [e for g in groups for e in g.errors],
            "table": kernels_table(groups)}


def kernel_ratios(k: dict[str, Any] | None) -> dict[str, float | None]:
    """From the kernels part's rows: seqjax cuDNN attention TFLOP/s (full, fwd), the LSTM
    layer's cuDNN ÷ scan speed and the selective scan's associative ÷ sequential (fwd+bwd)."""
    rows = (k or {}).get("rows", [])

    def find(group: str, peer: str, test: Callable[[str], bool]) -> float | None:
        return next((r["rate"] for r in rows if r["group"] == group and r["peer"] == peer
                     and test(r["row"])), None)

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a / b

    attn = find("attention core", "seqjax cudnn",
                lambda row: " full " in row and row.endswith(" fwd"))
    lstm = ratio(find("LSTM layer", "seqjax cudnn", lambda row: True),
                 find("LSTM layer", "seqjax scan", lambda row: True))
    fwd_bwd = (lambda row: row.startswith("selective scan") and row.endswith("fwd+bwd"))
    ssm = ratio(find("scans", "associative", fwd_bwd), find("scans", "sequential", fwd_bwd))
    return {"attention_tflops": attn, "lstm_cudnn_over_scan": lstm,
            "ssm_associative_over_sequential": ssm}


# ----------------------------------------------------------------------------- the table


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "unmeasured" if x is None else format(x, spec)


def _times(x: float | None) -> str:
    return _fmt(x) if x is None else f"{x:.2f}×"


def targets_table(r: dict[str, Any]) -> str:
    """The GPU targets against what ``r`` (the parts' results) holds: met, missed or
    unmeasured; "information" rows have no target."""
    rows = []

    def ok(value: float | None, target: float, higher: bool = True) -> str:
        if value is None:
            return "unmeasured"
        return "met" if (value >= target if higher else value <= target) else "missed"

    cl, ng, lp = r.get("char_lm"), r.get("nanogpt"), r.get("loop")
    ratio = None if not (cl and ng) else cl["steps_per_s"] / ng["steps_per_s"]
    rows.append(["char_lm --preset gpu steps/s ÷ nanoGPT train.py loop (≥ 1.0, stretch 1.3)",
                 (f"{_fmt(cl and cl['steps_per_s'], '.1f')} / "
                  f"{_fmt(ng and ng['steps_per_s'], '.1f')} = {_fmt(ratio)}"), ok(ratio, 1.0)])
    val = cl and cl["val"]
    rows.append(["char_lm val loss at 5000 steps (≤ 1.47)", _fmt(val, ".4f"),
                 ok(val, 1.47, higher=False)])
    fit_ratio = None if not (lp and lp["fit_over_step"]) else 1.0 / lp["fit_over_step"]
    rows.append(["compiled step ÷ fit, steps_per_call=1 (≥ 0.9)", _fmt(fit_ratio),
                 ok(fit_ratio, 0.9)])
    rn = r.get("rnn") or {}
    for cell in ("lstm", "gru"):
        s, t = rn.get(f"seqjax_{cell}_ms"), rn.get(f"torch_{cell}_ms")
        sp = None if s is None or t is None else t / s
        rows.append([f"{cell.upper()} B=64 T=256 H=512 fwd+bwd, default ÷ torch cuDNN (≥ 1.6)",
                     f"{_fmt(s, '.3f')} vs {_fmt(t, '.3f')} ms = {_fmt(sp)}×", ok(sp, 1.6)])
    g = r.get("gpt2") or {}
    gs, gt = g.get("seqjax"), g.get("torch-nanogpt")
    gr = None if gs is None or gt is None else gt / gs
    rows.append(["GPT-2 124M step B=12, seqjax ÷ nanoGPT torch.compile (≥ 1.25)",
                 f"{_fmt(gs)} vs {_fmt(gt)} ms = {_fmt(gr)}×", ok(gr, 1.25)])
    big = g.get("largest") or {}
    rows.append([f"GPT-2 124M at the largest batch that fits (B={big.get('batch', '?')}): "
                 "tokens/s (≥ 500k)", _fmt(big.get("tokens_per_s"), ",.0f"),
                 ok(big.get("tokens_per_s"), 500e3)])
    rows.append(["… its MFU (≥ 40%)", _fmt(big.get("mfu"), ".1%"), ok(big.get("mfu"), 0.40)])
    su = r.get("startup") or {}
    rows.append(["char_lm time to first step, cold (≤ 10 s)", _fmt(su.get("cold_s"), ".1f"),
                 ok(su.get("cold_s"), 10.0, higher=False)])
    rows.append(["char_lm time to first step, warm (≤ 3 s)", _fmt(su.get("warm_s"), ".1f"),
                 ok(su.get("warm_s"), 3.0, higher=False)])
    pr = r.get("profile") or {}
    rows.append(["GPT-2 step: logits-sized buffers; attention kernels",
                 f"{pr.get('logits_buffers')}; {pr.get('attention_kernels')}", "information"])
    a0 = r.get("attn0") or {}
    rows.append(["char_lm step: attention dropout 0.2 vs 0 (ms; the fast choice)",
                 f"{_fmt(a0.get('default_ms'), '.3f')} vs "
                 f"{_fmt(a0.get('attention_dropout_0_ms'), '.3f')}", "information"])
    kr = kernel_ratios(r.get("kernels"))
    rows.append([f"attention fwd B=4 T=4096 H=16 D=128 bf16, seqjax cuDNN "
                 f"(≥ {TARGET_ATTENTION_TFLOPS:.0f} TFLOP/s)",
                 _fmt(kr["attention_tflops"], ".0f"),
                 ok(kr["attention_tflops"], TARGET_ATTENTION_TFLOPS)])
    rows.append([f"LSTM layer B=64 T=256 H=512 fwd+bwd, cuDNN ÷ scan (≥ {TARGET_LSTM_RATIO:.0f}×)",
                 _times(kr["lstm_cudnn_over_scan"]),
                 ok(kr["lstm_cudnn_over_scan"], TARGET_LSTM_RATIO)])
    rows.append(["selective scan fwd+bwd at T=4096, associative ÷ sequential "
                 f"(≥ {TARGET_SSM_RATIO:.0f}×)",
                 _times(kr["ssm_associative_over_sequential"]),
                 ok(kr["ssm_associative_over_sequential"], TARGET_SSM_RATIO)])
    lines = ["| target | measured | |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks gpu",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="toy sizes on any backend (CI)")
    ap.add_argument("--data_path", default=None, help="tinyshakespeare.txt")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for all parts")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="comma list of " + ",".join(PARTS) + "; gpt = " + ",".join(GPT_PARTS))
    ap.add_argument("--out-dir", default=None, help="keep every part's output here")
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)  # internal: one part
    args = ap.parse_args(argv)
    if args.part == "rnn":
        print("RNN " + json.dumps(rnn_part(args.smoke)))
        return 0
    if args.part == "attn0":
        print("ATTN0 " + json.dumps(attn0_part(args.data_path, args.smoke)))
        return 0
    if args.part == "kernels":
        kernels = kernels_part(args.smoke, log=lambda s: print(s, file=sys.stderr, flush=True))
        print(kernels.pop("table"), flush=True)
        for error in kernels["errors"]:
            print(f"ERROR {error}", flush=True)
        print("KERNELS " + json.dumps(kernels))
        return 0
    parts = [q for p in args.parts.split(",") if p
             for q in (GPT_PARTS if p == "gpt" else (p,))]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown parts {unknown}; choose from {', '.join(PARTS)}.")
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="gpu_bench_")
    os.makedirs(out_dir, exist_ok=True)
    py = sys.executable
    data = [f"--data_path={args.data_path}"] if args.data_path else []
    smoke = args.smoke
    deadline = time.perf_counter() + args.budget
    results: dict[str, Any] = {}
    for part in parts:
        left = deadline - time.perf_counter()
        need = 20 if smoke else ESTIMATE[part]
        if left < need:
            print(f"[{part}] skipped: {left:.0f} s left of the budget, needs ~{need} s",
                  flush=True)
            continue
        log = os.path.join(out_dir, f"{part}.log")
        left = left if smoke else min(left, 1.6 * need)  # one slow part cannot eat the rest
        t0 = time.perf_counter()
        try:
            if part == "char_lm":
                wd = os.path.join(out_dir, "char_lm_workdir")
                preset = ["--smoke"] if smoke else ["--preset", "gpu"]
                rc, out = _run([py, "-m", "seqjax.experiments.char_lm", *preset, "--workdir", wd,
                                "--progress=false", *data], left, log)
                results[part] = parse_char_lm(wd) if rc == 0 else None
            elif part == "nanogpt":
                opts = ["--smoke"] if smoke else ["--preset", "gpu", "--steps", "600",
                                                  "--device", "cuda"]
                if args.data_path:
                    opts += ["--data_path", args.data_path]
                rc, out = _run([py, "-m", "benchmarks", "nanogpt_loop", *opts, "--quiet"],
                               left, log)
                results[part] = parse_nanogpt(out) if rc == 0 else None
            elif part == "loop":
                opts = ["--smoke"] if smoke else ["--preset=gpu", "--steps", "200", "--k", "10",
                                                  "--profile"]
                rc, out = _run([py, "-m", "benchmarks", "loop", *opts, *data], left, log)
                results[part] = parse_loop(out)  # what was measured, finished or not
            elif part in ("rnn", "attn0", "kernels"):
                rc, out = _run([py, "-m", "benchmarks", "gpu", "--part", part,
                                *(["--smoke"] if smoke else []), *data], left, log)
                results[part] = parse_json_line(out, part.upper()) if rc == 0 else None
            elif part == "startup":
                opts = ["--smoke"] if smoke else ["--steps", "100", "--skip-gpt2", *data]
                rc, out = _run([py, "-m", "benchmarks", "startup", *opts], left, log)
                results[part] = parse_startup(out) if rc == 0 else None
            elif part == "profile":
                opts = (["--smoke", "--peers", "seqjax"] if smoke else
                        ["--preset", "gpt2-small", "--batch", "12", "--calls", "5"])
                rc, out = _run([py, "-m", "benchmarks", "gpt_profile", *opts], left, log)
                results[part] = parse_profile(out) if rc == 0 else None
            else:  # gpt2
                if smoke:
                    opts = ["--smoke", "--peers", "seqjax", "--largest-batch", "4"]
                else:
                    opts = ["--preset", "gpt2-small", "--batch", "12", "--peers",
                            "seqjax,torch-nanogpt", "--dtype", "bfloat16", "--repeats", "3",
                            "--largest-batch", "64,32,16"]
                rc, out = _run([py, "-m", "benchmarks", "gpt", *opts], left, log)
                results[part] = parse_gpt2(out) if rc == 0 else None
        except (OSError, ValueError, KeyError, statistics.StatisticsError) as err:
            rc, results[part] = 1, None
            out = f"{type(err).__name__}: {err}"
        status = "ok" if results.get(part) is not None else f"FAILED (exit {rc}; see {log})"
        print(f"[{part}] {time.perf_counter() - t0:.0f} s, {status}: {results.get(part)}",
              flush=True)
        if results.get(part) is None:
            print("\n".join(out.splitlines()[-15:]), flush=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\n## Targets: measured, missed or unmeasured\n")
    print(targets_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

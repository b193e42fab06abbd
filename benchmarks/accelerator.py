"""Accelerator proof (issue #19): check every GPU path against its reference, then measure it.

One process, on whatever backend JAX finds:

**Checks** — each accelerator path against the plain reference on the same backend,
forward and gradients (a fixed random cotangent), float32 and bfloat16 inputs; the
reference runs in float32 at ``"highest"`` matmul precision on the (rounded) inputs of
the path under test:

* ``seqjax.nn.attention.dot_product_attention``: every implementation the backend
  offers (``xla`` everywhere, ``cudnn`` on a GPU with fp16/bf16, ``pallas`` on a TPU)
  vs ``implementation="reference"``, for causal, GQA, MQA, key padding from
  ``lengths`` and a row with no visible key;
* ``StackedRNN(implementation="cudnn")`` vs the scan path (GPU only), with
  ``lengths``, stacked and bidirectional, and with bf16 parameters and inputs (what
  ``make_train_step(compute_dtype=bfloat16)`` feeds it);
* the train step: ``make_train_step(compute_dtype=bfloat16)`` vs the float32 step
  (losses over three steps, gradient norm), ``remat=True`` vs plain, and donation of the
  input state's buffers;
* linear attention ``"parallel"`` and ``"chunked"`` vs ``"recurrent"`` (key padding);
* ``SelectiveSSM(scan_impl="associative")`` vs ``"sequential"`` (with ``lengths``).

Each check is a row: PASS/FAIL, the largest absolute error and its tolerance
(``rtol · max|ref| + atol`` of the worst leaf; float32 admits TF32 matmuls, which
XLA:GPU uses for float32 by default). GPU-only paths on another backend are
"skipped (no GPU)", never failed. Any FAIL (or a measurement that errors) makes the
exit status 1.

**Measurements** (the shared :mod:`benchmarks.harness`: compile apart, warm-up,
median and IQR, peers alternated): the GPT-2 124M training step (bf16, T = 1024,
tokens/s and MFU from :func:`seqjax.train.flops.lm_flops_per_token` and
:func:`seqjax.train.flops.peak_flops_per_device`); attention TFLOP/s at T = 4096,
head dim 128 per implementation, against ``jax.nn.dot_product_attention`` (xla and
cudnn) and torch SDPA when torch sees the device; an LSTM layer fwd+bwd through cuDNN
vs the scan vs Flax's ``OptimizedLSTMCell`` under ``nn.RNN``; linear attention
(parallel, chunked, recurrent) and the SSM scan (associative vs sequential) at
T = 4096. The report ends with the targets of issue #19 against what was measured.

Run: ``python -m benchmarks accelerator --out accelerator.md`` (on a GPU; under
8 minutes on one H100); ``--smoke``: tiny shapes on any backend in seconds (CI).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks import attention_core, gpt, harness, rnn

PASS, FAIL = "PASS", "FAIL"
NO_GPU = "skipped (no GPU)"
# (rtol of max|ref|, atol) per dtype of the path under test.
TOLERANCES: dict[str, tuple[float, float]] = {"float32": (5e-3, 1e-5),
                                              "bfloat16": (3e-2, 1e-3)}
DTYPES = ("float32", "bfloat16")
# Issue #19's targets.
TARGET_MFU = 0.45
TARGET_ATTENTION_TFLOPS = 500.0
TARGET_LSTM_RATIO = 3.0
TARGET_SSM_RATIO = 10.0


@dataclasses.dataclass(frozen=True)
class Check:
    """One row of the check table."""

    path: str       # e.g. "attention cudnn"
    reference: str  # what it is compared with
    dtype: str
    case: str
    quantity: str   # "fwd", "grad", "loss", ...
    status: str     # PASS, FAIL or "skipped (...)"
    err: float = math.nan
    tol: float = math.nan
    detail: str = ""  # the worst leaf, or the error message


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Sizes of the measured workloads (``--smoke`` shrinks them all)."""

    gpt: gpt.GPTShape
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


FULL = Shapes(
    gpt=gpt.GPTShape(num_layers=12, num_heads=12, embed_dim=768, block_size=1024, batch=16,
                     vocab_size=50304, use_bias=True),
    attn_batch=4, attn_length=4096, attn_heads=16, attn_head_dim=128,
    lstm=(64, 256, 512), scan_batch=2, scan_length=4096, lin_heads=8, lin_head_dim=64,
    ssm_features=1024, ssm_state=16,
)
SMOKE = Shapes(
    gpt=gpt.SMOKE, attn_batch=2, attn_length=32, attn_heads=2, attn_head_dim=8,
    lstm=(2, 8, 16), scan_batch=1, scan_length=32, lin_heads=2, lin_head_dim=8,
    ssm_features=8, ssm_state=4,
)


# =============================================================================== checks


def _backend() -> str:
    import jax

    return jax.default_backend()


def _cast(tree: Any, dtype: str) -> Any:
    """Floating leaves of ``tree`` as jnp arrays of ``dtype``; other leaves as they are."""
    import jax
    import jax.numpy as jnp

    def cast(x: Any) -> Any:
        x = jnp.asarray(x)
        return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree_util.tree_map(cast, tree)


def _out_and_grads(fn: Callable[..., Any], args: tuple[Any, ...], cotangent_seed: int,
                   highest: bool) -> tuple[Any, Any]:
    """``fn(*args)`` and the gradients w.r.t. every argument of
    ``Σ_leaves Σ(out · ct)``, ``ct`` a fixed standard-normal cotangent; one jit."""
    import jax
    import jax.numpy as jnp

    def both(*a: Any) -> tuple[Any, Any]:
        out, vjp = jax.vjp(fn, *a)
        leaves, treedef = jax.tree_util.tree_flatten(out)
        keys = jax.random.split(jax.random.PRNGKey(cotangent_seed), len(leaves))
        # Rounded to bf16 so that every dtype's path sees the very same cotangent.
        cts = [jax.random.normal(k, leaf.shape, jnp.float32).astype(jnp.bfloat16)
               .astype(leaf.dtype) for k, leaf in zip(keys, leaves)]
        return out, vjp(jax.tree_util.tree_unflatten(treedef, cts))

    if highest:
        with jax.default_matmul_precision("highest"):
            return jax.device_get(jax.jit(both)(*args))
    return jax.device_get(jax.jit(both)(*args))


def compare(got: Any, want: Any, dtype: str) -> tuple[bool, float, float, str]:
    """``(passed, err, tol, worst_leaf)``: per leaf ``max|got − want|`` against
    ``rtol · max|want| + atol`` (:data:`TOLERANCES` of ``dtype``); the leaf reported is
    the one with the largest err/tol. A NaN/inf where the reference is finite fails."""
    import jax

    rtol, atol = TOLERANCES[dtype]
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    want_leaves, want_def = jax.tree_util.tree_flatten_with_path(want)
    if len(got_leaves) != len(want_leaves):
        return False, math.inf, math.nan, (f"{len(got_leaves)} outputs, reference has "
                                           f"{len(want_leaves)}")
    worst = (-1.0, math.nan, math.nan, "")
    for (path, g), (_, w) in zip(got_leaves, want_leaves):
        g64 = np.asarray(g, np.float64)
        w64 = np.asarray(w, np.float64)
        name = jax.tree_util.keystr(path) or "out"
        if g64.shape != w64.shape:
            return False, math.inf, math.nan, f"{name}: shape {g64.shape} != {w64.shape}"
        tol = rtol * (float(np.max(np.abs(w64))) if w64.size else 0.0) + atol
        diff = np.abs(g64 - w64)
        err = float(np.max(diff)) if diff.size else 0.0
        if not np.all(np.isfinite(g64[np.isfinite(w64)])):
            err = math.inf
        ratio = err / tol
        if ratio > worst[0]:
            worst = (ratio, err, tol, name)
    ratio, err, tol, name = worst
    return ratio <= 1.0, err, tol, name


def _pair(path: str, reference: str, dtype: str, case: str, fast: Callable[..., Any],
          args_fast: tuple[Any, ...], want: tuple[Any, Any]) -> list[Check]:
    """Forward and gradient rows of ``fast(*args_fast)`` against ``want = (out, grads)``."""
    try:
        got = _out_and_grads(fast, args_fast, cotangent_seed=1, highest=False)
    except Exception as e:  # the path itself broke: a failed check, with the reason
        msg = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        return [Check(path, reference, dtype, case, q, FAIL, detail=msg)
                for q in ("fwd", "grad")]
    rows = []
    for quantity, g, w in (("fwd", got[0], want[0]), ("grad", got[1], want[1])):
        ok, err, tol, leaf = compare(g, w, dtype)
        rows.append(Check(path, reference, dtype, case, quantity, PASS if ok else FAIL,
                          err, tol, leaf))
    return rows


def _skipped(path: str, reference: str, dtype: str, case: str, why: str,
             quantities: Sequence[str] = ("fwd", "grad")) -> list[Check]:
    return [Check(path, reference, dtype, case, q, why) for q in quantities]


def _reference(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, Any]:
    return _out_and_grads(fn, _cast(args, "float32"), cotangent_seed=1, highest=True)


def attention_implementations() -> list[str]:
    """The ``dot_product_attention`` implementations checked: ``xla`` and ``cudnn``
    (a skipped row off GPU) everywhere, ``pallas`` on a TPU."""
    return ["xla", "cudnn"] + (["pallas"] if _backend() == "tpu" else [])


# The cases --smoke keeps (GQA, MQA, padding with causal, an empty row: every branch).
SMOKE_ATTENTION_CASES = ("causal GQA 4:2", "padding+causal MQA 4:1", "empty row (length 0)")


def check_attention(batch: int = 2, length: int = 64, head_dim: int = 64,
                    only: Sequence[str] | None = None) -> list[Check]:
    """Every attention implementation vs ``implementation="reference"`` (``only``: the
    labels of the cases to run; default all)."""
    import jax.numpy as jnp

    from seqjax.nn.attention import dot_product_attention

    cases = [  # label, query heads, kv heads, causal, key lengths
        ("causal", 4, 4, True, None),
        ("causal GQA 4:2", 4, 2, True, None),
        ("padding GQA 4:2", 4, 2, False, [length, length // 2 + 3]),
        ("padding+causal MQA 4:1", 4, 1, True, [length, length // 2 + 3]),
        ("empty row (length 0)", 4, 2, False, [length, 0]),
    ]
    rng = np.random.default_rng(0)
    rows: list[Check] = []
    gpu = _backend() == "gpu"
    for label, heads, kv_heads, causal, lengths in cases:
        if only is not None and label not in only:
            continue
        q = rng.standard_normal((batch, length, heads, head_dim), np.float32)
        k = rng.standard_normal((batch, length, kv_heads, head_dim), np.float32)
        v = rng.standard_normal((batch, length, kv_heads, head_dim), np.float32)
        mask = None
        if lengths is not None:
            mask = (np.arange(length)[None, :] < np.asarray(lengths)[:, None])[:, None, None, :]

        def attend(impl: str, mask: Any = mask, causal: bool = causal) -> Callable[..., Any]:
            def f(q_: Any, k_: Any, v_: Any) -> Any:
                m = None if mask is None else jnp.asarray(mask)
                return dot_product_attention(q_, k_, v_, mask=m, is_causal=causal,
                                             implementation=impl)
            return f

        for dtype in DTYPES:
            args = tuple(_cast((q, k, v), dtype))
            want = _reference(attend("reference"), args)
            for impl in attention_implementations():
                path = f"attention {impl}"
                if impl == "cudnn" and not gpu:
                    rows += _skipped(path, "reference", dtype, label, NO_GPU)
                elif impl == "cudnn" and dtype == "float32":
                    rows += _skipped(path, "reference", dtype, label,
                                     "skipped (cuDNN attention takes fp16/bf16)")
                else:
                    rows += _pair(path, "reference", dtype, label, attend(impl), args, want)
    return rows


def check_lstm() -> list[Check]:
    """``StackedRNN(implementation="cudnn")`` vs the scan path with the same parameters."""
    import jax
    import jax.numpy as jnp

    from seqjax.nn.recurrent import StackedRNN

    cases = [  # label, layers, bidirectional, dtype
        ("2 layers, lengths", 2, False, "float32"),
        ("bidirectional, lengths", 1, True, "float32"),
        ("2 layers, lengths, bf16 params+inputs", 2, False, "bfloat16"),
    ]
    path, reference = "LSTM cudnn", "scan"
    if _backend() != "gpu":
        return [row for label, _, _, dtype in cases
                for row in _skipped(path, reference, dtype, label, NO_GPU)]
    rng = np.random.default_rng(1)
    batch, steps, features, hidden = 3, 12, 16, 32
    x = rng.standard_normal((batch, steps, features), np.float32)
    lengths = jnp.asarray([steps, 7, 1], jnp.int32)
    rows: list[Check] = []
    for label, layers, bidir, dtype in cases:
        def module(impl: str, layers: int = layers, bidir: bool = bidir) -> StackedRNN:
            return StackedRNN(hidden, num_layers=layers, bidirectional=bidir,
                              implementation=impl)

        params = jax.jit(module("scan").init)(jax.random.PRNGKey(0), jnp.asarray(x))["params"]

        def run(impl: str, module: Callable[[str], StackedRNN] = module) -> Callable[..., Any]:
            def f(p: Any, x_: Any) -> Any:
                return module(impl).apply({"params": p}, x_, lengths)
            return f

        want = _reference(run("scan"), (params, x))
        rows += _pair(path, reference, dtype, label, run("cudnn"), tuple(_cast((params, x), dtype)),
                      want)
    return rows


def _small_gpt(smoke: bool) -> gpt.GPTShape:
    if smoke:
        return gpt.SMOKE
    return gpt.GPTShape(num_layers=2, num_heads=4, embed_dim=128, block_size=128, batch=4,
                        vocab_size=512)


def _gpt_step_losses(shape: gpt.GPTShape, steps: int, **step_kwargs: Any
                     ) -> tuple[list[float], float, bool]:
    """Losses of ``steps`` train steps from one fixed init, the first step's grad norm,
    and whether the first step's input state was donated (its buffers deleted)."""
    import jax

    from seqjax.train.losses import make_lm_loss
    from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer
    from seqjax.train.step import flax_apply_fn, make_train_step

    model = gpt.seqjax_model(shape)
    tokens = gpt.batch_tokens(shape)
    batch = {"inputs": jax.numpy.asarray(tokens[:, :-1]),
             "targets": jax.numpy.asarray(tokens[:, 1:])}
    params = jax.jit(model.init)(jax.random.PRNGKey(0), batch["inputs"])["params"]
    tx, _ = make_optimizer(OptimizerConfig(
        "adamw", gpt.LR, b1=gpt.BETA1, b2=gpt.BETA2, eps=gpt.EPS,
        weight_decay=gpt.WEIGHT_DECAY, clip_norm=gpt.CLIP))
    state = TrainState.create(params, tx, jax.random.PRNGKey(1))
    step = make_train_step(make_lm_loss(flax_apply_fn(model)), **step_kwargs)
    losses, grad_norm, donated = [], math.nan, False
    for i in range(steps):
        old_leaf = jax.tree_util.tree_leaves(state.params)[0]
        state, metrics = step(state, batch)
        metrics = jax.device_get(metrics)
        losses.append(float(metrics["loss"]))
        if i == 0:
            grad_norm = float(metrics["grad_norm"])
            donated = old_leaf.is_deleted()
    return losses, grad_norm, donated


def check_train_step(smoke: bool) -> list[Check]:
    """The bf16 step vs the fp32 step, remat vs plain, and donation."""
    import jax.numpy as jnp

    shape = _small_gpt(smoke)
    case = shape.label.replace(" train step", "")
    rows: list[Check] = []
    try:
        ref_losses, ref_norm, donated = _gpt_step_losses(shape, 3)
        runs = {
            ("train step bf16", "fp32 step", "bfloat16"): dict(compute_dtype=jnp.bfloat16),
            ("train step remat", "plain step", "float32"): dict(remat=True),
        }
        for (path, reference, dtype), kwargs in runs.items():
            losses, norm, _ = _gpt_step_losses(shape, 3, **kwargs)
            for quantity, got, want in (("loss, 3 steps", losses, ref_losses),
                                        ("grad norm", norm, ref_norm)):
                ok, err, tol, _ = compare(np.asarray(got), np.asarray(want), dtype)
                rows.append(Check(path, reference, dtype, case, quantity,
                                  PASS if ok else FAIL, err, tol,
                                  f"got {np.round(got, 4).tolist()} want "
                                  f"{np.round(want, 4).tolist()}"))
        rows.append(Check("train step donation", "input state deleted", "float32", case,
                          "buffers", PASS if donated else FAIL, 0.0 if donated else 1.0, 0.0,
                          "the old state's buffers were reused" if donated
                          else "the old state is still alive: donation ignored"))
    except Exception as e:
        rows.append(Check("train step", "fp32 step", "-", case, "run", FAIL,
                          detail=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"))
    return rows


def check_linear_attention(batch: int = 2, length: int = 64, heads: int = 2,
                           head_dim: int = 16) -> list[Check]:
    """Causal linear attention, ``parallel`` and ``chunked`` vs ``recurrent`` (key padding)."""
    import jax.numpy as jnp

    from seqjax.nn.linear_attention import linear_attention

    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((batch, length, heads, head_dim), np.float32)
               for _ in range(3))
    key_mask = jnp.asarray(np.arange(length)[None, :] < np.asarray([length, length // 2 + 1])
                           [:batch, None])
    case = "causal, key padding"

    def attend(impl: str) -> Callable[..., Any]:
        def f(q_: Any, k_: Any, v_: Any) -> Any:
            return linear_attention(q_, k_, v_, key_mask=key_mask, is_causal=True,
                                    implementation=impl, chunk_size=16)
        return f

    rows: list[Check] = []
    for dtype in DTYPES:
        args = tuple(_cast((q, k, v), dtype))
        want = _reference(attend("recurrent"), args)
        for impl in ("parallel", "chunked"):
            rows += _pair(f"linear attention {impl}", "recurrent", dtype, case, attend(impl),
                          args, want)
    return rows


def check_ssm(batch: int = 2, length: int = 64, features: int = 16) -> list[Check]:
    """``SelectiveSSM`` with the associative scan vs the sequential scan, with ``lengths``."""
    import jax
    import jax.numpy as jnp

    from seqjax.nn.ssm import SelectiveSSM

    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch, length, features), np.float32)
    lengths = jnp.asarray([length, length // 2 + 5][:batch], jnp.int32)

    def run(impl: str) -> Callable[..., Any]:
        def f(p: Any, x_: Any) -> Any:
            return SelectiveSSM(features, d_state=8, scan_impl=impl).apply(
                {"params": p}, x_, lengths=lengths, return_state=True)
        return f

    params = jax.jit(SelectiveSSM(features, d_state=8).init)(
        jax.random.PRNGKey(0), jnp.asarray(x))["params"]
    want = _reference(run("sequential"), (params, x))
    return [row for dtype in DTYPES
            for row in _pair("SSM associative scan", "sequential scan", dtype, "lengths",
                             run("associative"), tuple(_cast((params, x), dtype)), want)]


def run_checks(smoke: bool, log: Callable[[str], None]) -> list[Check]:
    rows: list[Check] = []
    attention_cases = SMOKE_ATTENTION_CASES if smoke else None
    for name, fn in (("attention", lambda: check_attention(only=attention_cases)),
                     ("LSTM", check_lstm),
                     ("train step", lambda: check_train_step(smoke)),
                     ("linear attention", check_linear_attention), ("SSM", check_ssm)):
        t0 = time.perf_counter()
        new = fn()
        rows += new
        for r in new:
            if r.status == FAIL:
                log(f"  FAIL {r.path} vs {r.reference} {r.dtype} {r.case} {r.quantity}: "
                    f"err {r.err:.3g} tol {r.tol:.3g} {r.detail}")
        log(f"checks: {name}: {sum(r.status == PASS for r in new)} pass, "
            f"{sum(r.status == FAIL for r in new)} fail, "
            f"{sum(r.status not in (PASS, FAIL) for r in new)} skipped "
            f"({time.perf_counter() - t0:.1f}s)")
    return rows


def check_table(rows: Sequence[Check]) -> str:
    def num(x: float) -> str:
        return "–" if math.isnan(x) else f"{x:.2e}"

    return harness.markdown_table(
        ["path", "vs", "dtype", "case", "quantity", "max abs err", "tolerance", "result",
         "worst leaf / note"],
        [[r.path, r.reference, r.dtype, r.case, r.quantity, num(r.err), num(r.tol), r.status,
          r.detail.replace("|", "/")] for r in rows])


# ========================================================================= measurements


@dataclasses.dataclass(frozen=True)
class Group:
    """One measured workload: its results, the unit of the harness's "tokens", errors."""

    name: str
    unit: str  # "tok/s" or "TFLOP/s" (the harness's tokens are FLOPs)
    results: list[harness.Result]
    errors: list[str]


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


def _torch_sdpa_peer(arrays: list[np.ndarray], dtype: str, causal: bool, backward: bool,
                     device: str) -> harness.Prepared:
    """torch's ``scaled_dot_product_attention`` on ``device`` (synchronised per call)."""
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


def measure_gpt(shapes: Shapes, timing: dict[str, Any], log: Callable[[str], None]) -> Group:
    """The GPT-2 124M (or smoke) training step with bf16 compute."""
    shape = shapes.gpt
    peers = [harness.Peer("seqjax bf16", lambda: gpt.seqjax_peer(shape, "bfloat16"))]
    label = (f"GPT {shape.num_layers}L/{shape.num_heads}H/{shape.embed_dim} V={shape.vocab_size}"
             f" B={shape.batch} T={shape.block_size} bf16 train step")
    return _run_group("GPT train step", "tok/s", [(label, peers, shape.tokens)], timing, log)


def gpt_mfu(shapes: Shapes, group: Group) -> tuple[float, float, float | None]:
    """``(FLOPs per token, achieved FLOP/s, MFU or None without a known peak)``."""
    import jax

    from seqjax.train.flops import lm_flops_per_token, peak_flops_per_device

    shape = shapes.gpt
    model = gpt.seqjax_model(shape)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                            jax.numpy.zeros((1, shape.block_size), jax.numpy.int32))
    per_token = lm_flops_per_token(model.config, params, seq_len=shape.block_size)
    if not group.results:
        return per_token, math.nan, None
    achieved = per_token * group.results[0].tokens_per_s
    peak = peak_flops_per_device()
    return per_token, achieved, None if peak is None else achieved / peak


def measure_attention(shapes: Shapes, timing: dict[str, Any],
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
                                          lambda c=causal, bw=backward: _torch_sdpa_peer(
                                              arrays, dtype, c, bw, torch_device)))
            label = (f"B={b} T={t} H={h} D={d} {'causal' if causal else 'full'} {dtype} "
                     f"{'fwd+bwd' if backward else 'fwd'}")
            flops = attention_core.flops(b, h, t, d, causal=causal, backward=backward)
            rows.append((label, peers, int(flops)))
    return _run_group("attention core", "TFLOP/s", rows, timing, log)


def measure_lstm(shapes: Shapes, timing: dict[str, Any], log: Callable[[str], None]) -> Group:
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


def measure_scans(shapes: Shapes, timing: dict[str, Any], log: Callable[[str], None]) -> Group:
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


def _rate(r: harness.Result, unit: str) -> str:
    return (f"{r.tokens_per_s / 1e12:.3g}" if unit == "TFLOP/s"
            else harness.format_rate(r.tokens_per_s))


def measurement_table(groups: Sequence[Group]) -> str:
    lines = []
    for g in groups:
        for r in g.results:
            lo, hi = r.rate_range()
            iqr = (f"{lo / 1e12:.3g}–{hi / 1e12:.3g}" if g.unit == "TFLOP/s"
                   else f"{harness.format_rate(lo)}–{harness.format_rate(hi)}")
            lines.append([r.row, r.peer, f"{r.compile_s:.1f}", f"{r.median_s * 1e3:.3f}",
                          f"{_rate(r, g.unit)} {g.unit}", iqr, f"{len(r.times_s)}×{r.inner}"])
    return harness.markdown_table(
        ["workload", "peer", "compile s", "ms/call (median)", "throughput", "IQR", "n"], lines)


def _find(groups: Sequence[Group], name: str, row_part: str, peer: str
          ) -> harness.Result | None:
    for g in groups:
        if g.name != name:
            continue
        for r in g.results:
            if row_part in r.row and r.peer == peer:
                return r
    return None


def targets_table(groups: Sequence[Group], mfu: float | None, smoke: bool) -> str:
    """Issue #19's targets against the measured values."""
    gpu = _backend() == "gpu"

    def verdict(value: float | None, target: float, needs_gpu: bool = True) -> str:
        if smoke:
            return "n/a (smoke shapes)"
        if value is None or math.isnan(value):
            return "n/a (no GPU)" if needs_gpu and not gpu else "n/a (not measured)"
        if value >= target:
            return "met"
        return f"missed: {value / target:.0%} of target"

    fwd = next((r for g in groups if g.name == "attention core" for r in g.results
                if r.peer == "seqjax cudnn" and " full " in r.row and r.row.endswith(" fwd")),
               None)
    attn = None if fwd is None else fwd.tokens_per_s / 1e12
    cudnn = _find(groups, "LSTM layer", "LSTM", "seqjax cudnn")
    scan = _find(groups, "LSTM layer", "LSTM", "seqjax scan")
    lstm = None if cudnn is None or scan is None else cudnn.tokens_per_s / scan.tokens_per_s
    assoc = _find(groups, "scans", "selective scan", "associative")
    seq = _find(groups, "scans", "selective scan", "sequential")
    ssm = None if assoc is None or seq is None else assoc.tokens_per_s / seq.tokens_per_s

    def show(x: float | None, fmt: str) -> str:
        return "–" if x is None or math.isnan(x) else fmt.format(x)

    lines = [
        ["GPT-2 124M train step MFU (bf16, T=1024)", f"≥ {TARGET_MFU:.0%}",
         show(mfu, "{:.1%}"), verdict(mfu, TARGET_MFU)],
        ["attention fwd, T=4096, D=128 (seqjax cudnn, full)",
         f"≥ {TARGET_ATTENTION_TFLOPS:.0f} TFLOP/s", show(attn, "{:.0f} TFLOP/s"),
         verdict(attn, TARGET_ATTENTION_TFLOPS)],
        ["LSTM fwd+bwd, cuDNN ÷ scan", f"≥ {TARGET_LSTM_RATIO:.0f}×", show(lstm, "{:.2f}×"),
         verdict(lstm, TARGET_LSTM_RATIO)],
        ["selective scan fwd+bwd at T=4096, associative ÷ sequential",
         f"≥ {TARGET_SSM_RATIO:.0f}×", show(ssm, "{:.2f}×"),
         verdict(ssm, TARGET_SSM_RATIO, needs_gpu=False)],
    ]
    return harness.markdown_table(["target", "goal", "measured", "verdict"], lines)


# ============================================================================== report


def device_info() -> dict[str, str]:
    """The accelerator, its driver (nvidia-smi), cuDNN, the dense peak used for MFU."""
    import jax

    from seqjax.train.flops import peak_flops_per_device

    dev = jax.devices()[0]
    info = {"device": f"{dev.device_kind} (platform {dev.platform}, "
                      f"{jax.device_count()} device(s); the first is used)"}
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
                 "power.limit", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=False).stdout.strip()
            info["nvidia-smi"] = out.splitlines()[0] if out else "(no output)"
        except (OSError, subprocess.SubprocessError) as e:
            info["nvidia-smi"] = f"failed: {e}"
    else:
        info["nvidia-smi"] = "not present"
    # cuDNN's version from the wheel that ships it (public metadata, no private JAX API).
    from importlib import metadata

    for dist in ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12"):
        try:
            info["cuDNN"] = f"{metadata.version(dist)} ({dist})"
            break
        except metadata.PackageNotFoundError:
            continue
    peak = peak_flops_per_device()
    info["dense bf16 peak for MFU"] = ("unknown" if peak is None
                                       else f"{peak / 1e12:.0f} TFLOP/s")
    return info


def render(argv: Sequence[str], checks: Sequence[Check], groups: Sequence[Group],
           shapes: Shapes, mfu_line: str, mfu: float | None, smoke: bool,
           elapsed_s: float) -> str:
    machine = {**device_info(), **harness.machine_info()}
    npass = sum(c.status == PASS for c in checks)
    nfail = sum(c.status == FAIL for c in checks)
    nskip = len(checks) - npass - nfail
    errors = [e for g in groups for e in g.errors]
    parts = [
        "## Accelerator proof: checks and measurements of every GPU path",
        f"Command: `{' '.join(['python -m benchmarks accelerator', *argv])}` "
        f"({elapsed_s:.0f} s wall in all).",
        harness.machine_markdown(machine),
        f"### Checks: {npass} pass, {nfail} fail, {nskip} skipped",
        "Each path against its reference on this backend (forward, and gradients of "
        "Σ out·ct for a fixed random cotangent). Tolerance = rtol·max|ref| + atol of the "
        "worst leaf: float32 rtol 5e-3 (admits TF32), bfloat16 rtol 3e-2; the reference "
        "runs in float32 at \"highest\" matmul precision.",
        check_table(checks),
        "### Measurements",
        f"Median over the repeats, compile apart; attention rows count FLOPs "
        f"(forward 4·B·H·T²·D, halved causal; fwd+bwd 3.5×). {mfu_line}",
        measurement_table(groups),
    ]
    if errors:
        parts += ["Measurement errors:", "\n".join(f"- {e}" for e in errors)]
    parts += ["### Targets (issue #19) vs measured", targets_table(groups, mfu, smoke)]
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench accelerator",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes, 2 repeats: every check and measurement in seconds")
    ap.add_argument("--checks-only", action="store_true", help="skip the measurements")
    ap.add_argument("--gpt-batch", type=int, default=FULL.gpt.batch,
                    help="sequences per GPT-2 step (T = 1024)")
    harness.add_common_args(ap, repeats=5)
    args = ap.parse_args(argv)
    argv_list = list(sys.argv[1:] if argv is None else argv)
    shapes = SMOKE if args.smoke else dataclasses.replace(
        FULL, gpt=dataclasses.replace(FULL.gpt, batch=args.gpt_batch))
    harness.configure_threads(args.threads)
    quiet = args.quiet or args.smoke

    def log(s: str) -> None:
        if not quiet:
            print(s, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    checks = run_checks(args.smoke, log)
    groups: list[Group] = []
    mfu_line, mfu = "", None
    if not args.checks_only:
        timing = dict(repeats=2 if args.smoke else args.repeats, warmup=1 if args.smoke else 2,
                      min_sample_s=0.0 if args.smoke else 0.1)
        for measure in (measure_gpt, measure_attention, measure_lstm, measure_scans):
            t1 = time.perf_counter()
            groups.append(measure(shapes, timing, log))
            log(f"measured {groups[-1].name} ({time.perf_counter() - t1:.1f}s)")
        per_token, achieved, mfu = gpt_mfu(shapes, groups[0])
        mfu_line = (f"GPT FLOPs per token (seqjax.train.flops.lm_flops_per_token, "
                    f"6N + 12·L·H·Q·T causal half): {per_token / 1e6:.1f} M; achieved "
                    f"{achieved / 1e12:.2f} TFLOP/s"
                    + ("; MFU: no dense peak known for this device." if mfu is None
                       else f", MFU {mfu:.1%}."))
    report = render(argv_list, checks, groups, shapes, mfu_line, mfu, args.smoke,
                    time.perf_counter() - t0)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    failed = any(c.status == FAIL for c in checks) or any(g.errors for g in groups)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Each accelerator path of seqjax against its plain reference, on the backend under test.

Forward and gradients (of Σ out·ct for a fixed random cotangent), float32 and bfloat16
inputs. The reference runs in float32 at ``"highest"`` matmul precision on the (rounded)
inputs of the path under test; the path itself runs at the backend's default precision.
Tolerance per leaf: ``rtol · max|ref| + atol`` (:data:`TOLERANCES` of the path's dtype;
float32's rtol admits the TF32 matmuls XLA:GPU uses for float32 by default).

* :func:`seqjax.nn.attention.dot_product_attention`: every implementation the backend
  offers (``xla`` everywhere, ``cudnn`` on a GPU with bf16, ``pallas`` on a TPU) vs
  ``implementation="reference"``: causal, GQA, MQA, key padding, a row with no visible key;
* ``StackedRNN(implementation="cudnn")`` vs the scan (GPU only): ``lengths``, stacked,
  bidirectional, bf16 parameters and inputs (what the bf16 train step feeds it);
* the train step: ``make_train_step(compute_dtype=bfloat16)`` vs the float32 step (losses
  over three steps, the first gradient norm), ``remat=True`` vs plain, donation of the input
  state's buffers;
* linear attention ``"parallel"`` and ``"chunked"`` vs ``"recurrent"`` (key padding);
* ``SelectiveSSM(scan_impl="associative")`` vs ``"sequential"`` (with ``lengths``).

The GPU-only tests carry the ``gpu`` marker and are skipped elsewhere; the train-step
tests (three steps of a GPT each) are in the ``slow`` tier. On the CPU the sizes are tiny
and the attention cases the three that reach every branch; on a GPU the sizes and cases
are those checked on an H100. The suite's
conftest picks the CPU unless told otherwise, so on a GPU machine run
``JAX_PLATFORMS=cuda python -m pytest tests/test_gpu_paths.py`` (``-m gpu``: the GPU-only
tests alone).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import gpt

BACKEND = jax.default_backend()
GPU = BACKEND == "gpu"
gpu_only = pytest.mark.skipif(not GPU, reason="needs a GPU (run with JAX_PLATFORMS=cuda)")

# (rtol of max|ref|, atol) per dtype of the path under test.
TOLERANCES: dict[str, tuple[float, float]] = {"float32": (5e-3, 1e-5),
                                              "bfloat16": (3e-2, 1e-3)}
DTYPES = ("float32", "bfloat16")


# ============================================================================ the checker


def _cast(tree: Any, dtype: str) -> Any:
    """Floating leaves of ``tree`` as jnp arrays of ``dtype``; other leaves as they are."""
    def cast(x: Any) -> Any:
        x = jnp.asarray(x)
        return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree_util.tree_map(cast, tree)


def _out_and_grads(fn: Callable[..., Any], args: tuple[Any, ...], precision: str
                   ) -> tuple[Any, Any]:
    """``fn(*args)`` and the gradients w.r.t. every argument of ``Σ_leaves Σ(out · ct)``,
    ``ct`` a fixed standard-normal cotangent; one jit at matmul ``precision``."""
    def both(*a: Any) -> tuple[Any, Any]:
        out, vjp = jax.vjp(fn, *a)
        leaves, treedef = jax.tree_util.tree_flatten(out)
        keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
        # Rounded to bf16 so that every dtype's path sees the very same cotangent.
        cts = [jax.random.normal(k, leaf.shape, jnp.float32).astype(jnp.bfloat16)
               .astype(leaf.dtype) for k, leaf in zip(keys, leaves)]
        return out, vjp(jax.tree_util.tree_unflatten(treedef, cts))

    with jax.default_matmul_precision(precision):
        return jax.device_get(jax.jit(both)(*args))


def reference(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, Any]:
    """Output and gradients of ``fn`` in float32 at "highest" precision on ``args``."""
    return _out_and_grads(fn, _cast(args, "float32"), "highest")


def compare(got: Any, want: Any, dtype: str) -> tuple[bool, float, float, str]:
    """``(passed, err, tol, worst_leaf)``: per leaf ``max|got − want|`` against
    ``rtol · max|want| + atol`` (:data:`TOLERANCES` of ``dtype``); the leaf reported is
    the one with the largest err/tol. A NaN/inf where the reference is finite fails."""
    rtol, atol = TOLERANCES[dtype]
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    want_leaves = jax.tree_util.tree_flatten_with_path(want)[0]
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


def assert_close(got: Any, want: Any, dtype: str, what: str) -> None:
    ok, err, tol, leaf = compare(got, want, dtype)
    assert ok, f"{what} ({dtype}): max abs err {err:.3g} > tolerance {tol:.3g} at {leaf}"


def assert_matches(fast: Callable[..., Any], args: tuple[Any, ...], want: tuple[Any, Any],
                   dtype: str) -> None:
    """Forward and gradients of ``fast(*args)`` (default precision) against ``want``."""
    got = _out_and_grads(fast, args, "default")
    assert_close(got[0], want[0], dtype, "forward")
    assert_close(got[1], want[1], dtype, "gradients")


def test_compare_flags_a_wrong_result():
    """A deliberately wrong comparison (causal attention against the non-causal
    reference) fails; so do NaN outputs and a shape mismatch."""
    from seqjax.nn.attention import dot_product_attention

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 8, 2, 4), np.float32)) for _ in range(3))
    causal = dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    full = dot_product_attention(q, k, v, implementation="reference")
    ok, err, tol, _ = compare(causal, full, "float32")
    assert not ok and err > tol
    ok, *_ = compare(full, full, "float32")
    assert ok
    ok, err, _, _ = compare(full.at[0, 0, 0, 0].set(jnp.nan), full, "float32")
    assert not ok and err == float("inf")
    ok, *_ = compare(full[:, :4], full, "float32")
    assert not ok


def test_a_wrong_fast_path_fails_the_check():
    x = (np.linspace(-2.0, 2.0, 16, dtype=np.float32),)
    want = reference(jnp.tanh, x)
    assert_matches(jnp.tanh, x, want, "float32")
    with pytest.raises(AssertionError, match="forward"):
        assert_matches(lambda x: jnp.tanh(x) * 1.1, x, want, "float32")


# ============================================================================== attention

# label: (query heads, kv heads, causal, key lengths as fractions: L, L // 2 + 3, 0)
ATTENTION_CASES = {
    "causal": (4, 4, True, None),
    "causal GQA 4:2": (4, 2, True, None),
    "padding GQA 4:2": (4, 2, False, ("full", "half")),
    "padding+causal MQA 4:1": (4, 1, True, ("full", "half")),
    "empty row (length 0)": (4, 2, False, ("full", "none")),
}
# On the CPU, the cases that reach every branch (GQA, MQA, padding with causal, an empty row).
CPU_ATTENTION_CASES = ("causal GQA 4:2", "padding+causal MQA 4:1", "empty row (length 0)")
# batch, length, head dim: tiny on the CPU, the sizes checked on an H100 elsewhere.
ATTENTION_SIZES = (2, 16, 8) if BACKEND == "cpu" else (2, 64, 64)


def _attention_params() -> list[Any]:
    params = []
    for impl in ("xla", "cudnn", "pallas"):
        marks: list[Any] = []
        if impl == "cudnn":
            marks = [pytest.mark.gpu, gpu_only]
        elif impl == "pallas":
            marks = [pytest.mark.skipif(BACKEND != "tpu", reason="Pallas attention: TPU")]
        for dtype in DTYPES:
            if impl == "cudnn" and dtype == "float32":
                continue  # cuDNN attention takes fp16/bf16
            for case in ATTENTION_CASES if BACKEND != "cpu" else CPU_ATTENTION_CASES:
                params.append(pytest.param(impl, dtype, case, marks=marks,
                                           id=f"{impl}-{dtype}-{case}"))
    return params


def _attend(impl: str, case: str) -> Callable[..., Any]:
    from seqjax.nn.attention import dot_product_attention

    _, _, causal, lengths = ATTENTION_CASES[case]
    batch, length, _ = ATTENTION_SIZES
    mask = None
    if lengths is not None:
        n = {"full": length, "half": length // 2 + 3, "none": 0}
        keep = np.arange(length)[None, :] < np.asarray([n[x] for x in lengths])[:, None]
        mask = keep[:batch, None, None, :]

    def f(q: Any, k: Any, v: Any) -> Any:
        m = None if mask is None else jnp.asarray(mask)
        return dot_product_attention(q, k, v, mask=m, is_causal=causal, implementation=impl)
    return f


@functools.cache
def _attention_inputs(case: str, dtype: str) -> tuple[tuple[Any, ...], tuple[Any, Any]]:
    """The case's q, k, v in ``dtype`` and the reference's output and gradients."""
    heads, kv_heads, _, _ = ATTENTION_CASES[case]
    batch, length, head_dim = ATTENTION_SIZES
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, length, heads, head_dim), np.float32)
    k, v = (rng.standard_normal((batch, length, kv_heads, head_dim), np.float32)
            for _ in range(2))
    args = tuple(_cast((q, k, v), dtype))
    return args, reference(_attend("reference", case), args)


@pytest.mark.parametrize("impl, dtype, case", _attention_params())
def test_attention_implementation_matches_the_reference(impl, dtype, case):
    args, want = _attention_inputs(case, dtype)
    assert_matches(_attend(impl, case), args, want, dtype)


# =================================================================================== LSTM

LSTM_CASES = {  # label: (layers, bidirectional, dtype)
    "2 layers, lengths": (2, False, "float32"),
    "bidirectional, lengths": (1, True, "float32"),
    "2 layers, lengths, bf16 params+inputs": (2, False, "bfloat16"),
}


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("case", list(LSTM_CASES))
def test_cudnn_lstm_matches_the_scan(case):
    from seqjax.nn.recurrent import StackedRNN

    layers, bidirectional, dtype = LSTM_CASES[case]
    rng = np.random.default_rng(1)
    batch, steps, features, hidden = 3, 12, 16, 32
    x = rng.standard_normal((batch, steps, features), np.float32)
    lengths = jnp.asarray([steps, 7, 1], jnp.int32)

    def run(impl: str) -> Callable[..., Any]:
        module = StackedRNN(hidden, num_layers=layers, bidirectional=bidirectional,
                            implementation=impl)

        def f(p: Any, x_: Any) -> Any:
            return module.apply({"params": p}, x_, lengths, method="with_state")
        return f

    params = jax.jit(StackedRNN(hidden, num_layers=layers, bidirectional=bidirectional,
                                implementation="scan").init)(
        jax.random.PRNGKey(0), jnp.asarray(x))["params"]
    want = reference(run("scan"), (params, x))
    assert_matches(run("cudnn"), tuple(_cast((params, x), dtype)), want, dtype)


# ============================================================================= train step

# A 2-layer GPT on an accelerator; the smoke GPT on the CPU.
STEP_SHAPE = gpt.SMOKE if BACKEND == "cpu" else gpt.GPTShape(
    num_layers=2, num_heads=4, embed_dim=128, block_size=128, batch=4, vocab_size=512)


@functools.cache
def _gpt_steps(variant: str) -> tuple[list[float], float, bool]:
    """Losses of three train steps from one fixed init (``variant``: "f32", "bf16" or
    "remat"), the first step's gradient norm, and whether the first step's input state
    was donated (its buffers deleted)."""
    from seqjax.train.losses import make_lm_loss
    from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer
    from seqjax.train.step import flax_apply_fn, make_train_step

    kwargs = {"f32": {}, "bf16": {"compute_dtype": jnp.bfloat16}, "remat": {"remat": True}}
    shape = STEP_SHAPE
    with jax.default_matmul_precision("default"):
        model = gpt.seqjax_model(shape)
        tokens = gpt.batch_tokens(shape)
        batch = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:])}
        params = jax.jit(model.init)(jax.random.PRNGKey(0), batch["inputs"])["params"]
        tx, _ = make_optimizer(OptimizerConfig(
            name="adamw", learning_rate=gpt.LR, beta1=gpt.BETA1, beta2=gpt.BETA2, eps=gpt.EPS,
            weight_decay=gpt.WEIGHT_DECAY, clip_norm=gpt.CLIP))
        state = TrainState.create(params, tx, jax.random.PRNGKey(1))
        step = make_train_step(make_lm_loss(flax_apply_fn(model)), **kwargs[variant])
        losses, grad_norm, donated = [], math.nan, False
        for i in range(3):
            old_leaf = jax.tree_util.tree_leaves(state.params)[0]
            state, metrics = step(state, batch)
            metrics = jax.device_get(metrics)
            losses.append(float(metrics["loss"]))
            if i == 0:
                grad_norm = float(metrics["grad_norm"])
                donated = old_leaf.is_deleted()
    return losses, grad_norm, donated


@pytest.mark.slow
@pytest.mark.parametrize("variant, dtype", [("bf16", "bfloat16"), ("remat", "float32")])
def test_train_step_variant_matches_the_f32_step(variant, dtype):
    losses, norm, _ = _gpt_steps(variant)
    ref_losses, ref_norm, _ = _gpt_steps("f32")
    assert_close(np.asarray(losses), np.asarray(ref_losses), dtype,
                 f"losses over 3 steps {np.round(losses, 4).tolist()} vs "
                 f"{np.round(ref_losses, 4).tolist()}")
    assert_close(np.asarray(norm), np.asarray(ref_norm), dtype, "first gradient norm")


@pytest.mark.slow
def test_the_train_step_donates_the_input_state():
    assert _gpt_steps("f32")[2], "the old state is still alive: donation ignored"


@pytest.mark.slow
def test_bf16_parameters_give_a_bf16_model():
    """What ``make_train_step(compute_dtype=bfloat16)`` feeds a model (bf16 copies of float32
    parameters) keeps every layer in bf16: the position embedding and the norms promote with
    the parameters given, not the declared float32 storage."""
    from seqjax.train.step import cast_floating

    model = gpt.seqjax_model(gpt.SMOKE)
    x = jnp.zeros((1, gpt.SMOKE.block_size), jnp.int32)
    params = cast_floating(jax.jit(model.init)(jax.random.PRNGKey(0), x)["params"],
                           jnp.bfloat16)
    _, state = model.apply({"params": params}, x, capture_intermediates=True,
                           mutable=["intermediates"])
    leaves = jax.tree_util.tree_flatten_with_path(state["intermediates"]["decoder"])[0]
    assert leaves and {leaf.dtype for _, leaf in leaves} == {jnp.dtype(jnp.bfloat16)}
    pos = state["intermediates"]["pos_embed"]["__call__"][0]
    assert pos.dtype == jnp.bfloat16


# ============================================================== linear attention and SSM

SCAN_LENGTH = 32 if BACKEND == "cpu" else 64


def _linear_attend(impl: str) -> Callable[..., Any]:
    from seqjax.nn.linear_attention import linear_attention

    key_mask = jnp.asarray(np.arange(SCAN_LENGTH)[None, :]
                           < np.asarray([SCAN_LENGTH, SCAN_LENGTH // 2 + 1])[:, None])

    def f(q: Any, k: Any, v: Any) -> Any:
        return linear_attention(q, k, v, key_mask=key_mask, is_causal=True,
                                implementation=impl, chunk_size=16)
    return f


@functools.cache
def _linear_inputs(dtype: str) -> tuple[tuple[Any, ...], tuple[Any, Any]]:
    rng = np.random.default_rng(2)
    args = tuple(_cast(tuple(rng.standard_normal((2, SCAN_LENGTH, 2, 16), np.float32)
                             for _ in range(3)), dtype))
    return args, reference(_linear_attend("recurrent"), args)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", ["parallel", "chunked"])
def test_linear_attention_mode_matches_the_recurrent_form(impl, dtype):
    args, want = _linear_inputs(dtype)
    assert_matches(_linear_attend(impl), args, want, dtype)


@functools.cache
def _ssm_reference() -> tuple[Any, np.ndarray, tuple[Any, Any]]:
    from seqjax.nn.ssm import SelectiveSSM

    x = np.random.default_rng(3).standard_normal((2, SCAN_LENGTH, 16), np.float32)
    params = jax.jit(SelectiveSSM(16, d_state=8).init)(
        jax.random.PRNGKey(0), jnp.asarray(x))["params"]
    return params, x, reference(_ssm("sequential"), (params, x))


def _ssm(impl: str) -> Callable[..., Any]:
    from seqjax.nn.ssm import SelectiveSSM

    lengths = jnp.asarray([SCAN_LENGTH, SCAN_LENGTH // 2 + 5], jnp.int32)

    def f(p: Any, x: Any) -> Any:
        return SelectiveSSM(16, d_state=8, scan_impl=impl).apply(
            {"params": p}, x, lengths=lengths, method="with_state")
    return f


@pytest.mark.parametrize("dtype", DTYPES)
def test_ssm_associative_scan_matches_the_sequential_scan(dtype):
    params, x, want = _ssm_reference()
    assert_matches(_ssm("associative"), tuple(_cast((params, x), dtype)), want, dtype)

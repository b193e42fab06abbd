"""Which attention kernel the GPT-2 train step runs on a GPU, read off the trace on any
backend: with the backend reported as ``gpu``, every attention call of the GPT-2 124M
shapes (bf16, head dim 64, causal, no attention dropout: nanoGPT's ``bench.py``) goes to
cuDNN flash attention with ``is_causal`` and no dense mask; the calls are recorded and run
by the reference instead of the kernel (no GPU is needed to trace)."""

import jax
import jax.numpy as jnp

from benchmarks.gpt import GPTShape, seqjax_model
from seqjax.nn.attention import _cudnn, dot_product
from seqjax.train.losses import make_lm_loss
from seqjax.train.step import cast_floating, flax_apply_fn


def _trace_calls(monkeypatch, shape, compute_dtype, **model_options):
    calls = []

    def record(c):
        calls.append({"q": (c.q.shape, c.q.dtype), "causal": c.is_causal,
                      "mask": c.mask, "bias": c.bias, "dropout": c.dropout_rate})
        return dot_product._run_reference(c)

    monkeypatch.setattr(_cudnn.jax, "default_backend", lambda: "gpu")
    kernels = dict(dot_product.KERNELS)
    kernels["cudnn"] = dot_product.Kernel(record, _cudnn.cudnn_unsupported)
    monkeypatch.setattr(dot_product, "KERNELS", kernels)
    model = seqjax_model(shape)
    if model_options:
        model = model.clone(config=model.config.replace(**model_options))
    tokens = jnp.zeros((shape.batch, shape.block_size), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), tokens)["params"]
    loss_fn = make_lm_loss(flax_apply_fn(model))
    batch = {"inputs": tokens, "targets": tokens}

    def loss(p):  # the train step's mixed precision: float32 params cast for compute
        return loss_fn(cast_floating(p, compute_dtype), batch, jax.random.PRNGKey(1))[0]

    jax.eval_shape(jax.grad(loss), params)  # traces forward and backward
    return calls


def test_gpt2_bf16_step_runs_cudnn_flash_attention_causal_without_a_mask(monkeypatch):
    shape = GPTShape(num_layers=2, num_heads=12, embed_dim=768, block_size=1024, batch=2,
                     vocab_size=50304, use_bias=True)
    calls = _trace_calls(monkeypatch, shape, jnp.bfloat16)
    assert len(calls) == shape.num_layers  # one per layer, every one on the fused kernel
    for c in calls:
        assert c["q"] == ((2, 1024, 12, 64), jnp.bfloat16)
        assert c["causal"] and c["mask"] is None and c["bias"] is None and not c["dropout"]


def test_float32_step_is_refused_by_cudnn_and_runs_xla(monkeypatch):
    shape = GPTShape(num_layers=1, num_heads=2, embed_dim=128, block_size=64, batch=2)
    assert _trace_calls(monkeypatch, shape, None) == []  # float32: cuDNN says no


def test_attention_dropout_leaves_the_fused_kernel_and_says_why(monkeypatch):
    monkeypatch.setattr(_cudnn.jax, "default_backend", lambda: "gpu")
    q = jnp.zeros((1, 8, 2, 64), jnp.bfloat16)
    assert _cudnn.cudnn_unsupported(q, q, q, True, 0.0, False, False) is None
    assert "dropout" in _cudnn.cudnn_unsupported(q, q, q, True, 0.1, False, False)
    assert "head dim" in _cudnn.cudnn_unsupported(q[..., :60], q[..., :60], q[..., :60],
                                                  True, 0.0, False, False)

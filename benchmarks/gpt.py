"""GPT training step in nanoGPT's configuration: seqjax vs flax.linen vs torch (nanoGPT's model).

One row, one call = one full optimiser step on a fixed batch of token ids:
forward over ``[B, T] = [12, 64]``, mean next-token cross-entropy over all
``B·T`` positions, backward, global-norm clipping at 1.0 and an AdamW update
(lr 1e-3, β = (0.9, 0.99), weight decay 0.1 — nanoGPT's ``train_shakespeare_char``
optimiser). The model is nanoGPT's README CPU variant: 4 layers, 4 heads, d = 128,
block 64, |V| = 65, dropout 0, fp32, pre-norm blocks with a final LayerNorm,
learned absolute positions, exact-GELU MLP of width 4d, tied input/output
embedding, no biases on the linear layers (nanoGPT's ``bias=False`` default).
Tokens per call: ``B·T = 768``. ``--preset gpt2-small`` is the shape of nanoGPT's
``bench.py``: 12 layers, 12 heads, d = 768, T = 1024, |V| = 50304 (GPT-2's 50257
padded), biases on. Peers:

* ``seqjax``: :class:`seqjax.models.gpt.TransformerLM` from the ``nanogpt-cpu``
  preset, trained by the library's own step — :func:`seqjax.train.step.make_train_step`
  (``jax.jit``, the state's buffers donated) over :func:`seqjax.train.losses.make_lm_loss`
  and :func:`seqjax.train.optim.make_optimizer` (``clip → adamw``, decay mask).
* ``flax``: the same network written from ``flax.linen`` parts (``Embed``,
  ``LayerNorm``, ``MultiHeadDotProductAttention`` with a causal mask, ``Dense``),
  ``jax.jit`` of ``value_and_grad`` + ``optax`` clip/adamw, params and optimiser state
  donated — what a user without seqjax would write.
* ``torch-nanogpt``: a torch re-implementation of nanoGPT's ``model.py`` architecture
  (fused QKV ``Linear``, ``F.scaled_dot_product_attention(is_causal=True)``), the
  ``F.cross_entropy`` loss, ``clip_grad_norm_`` and ``torch.optim.AdamW`` with
  nanoGPT's two parameter groups (decay on ≥2-D tensors only). Where it runs:

  - **CPU** (no CUDA device visible to torch): eager mode and fp32, as nanoGPT's CPU
    recipe runs it with ``--compile=False``.
  - **CUDA** (``torch.cuda.is_available()``): what nanoGPT's ``train.py`` does on a GPU —
    the model on ``cuda``, TF32 allowed for fp32 matmuls (``torch.backends.cuda.matmul``
    and ``cudnn.allow_tf32``, set process-wide, as nanoGPT does), ``torch.compile`` of the
    model together with its loss (nanoGPT computes the loss inside ``forward``),
    ``torch.optim.AdamW(fused=True)`` (nanoGPT's ``configure_optimizers``) and, with
    ``--dtype bfloat16``, the forward under ``torch.autocast("cuda", dtype=torch.bfloat16)``
    (fp32 parameters and optimiser, like seqjax's mixed precision). Every call ends in
    ``torch.cuda.synchronize()`` and ``loss.item()``, so a timed call covers all its GPU
    work; the first call (the compilation) is reported as the compile time. JAX then
    gets at most half of the GPU (``XLA_PYTHON_CLIENT_MEM_FRACTION=0.5`` unless already
    set, instead of its default 75 % preallocation) so that both fit on one card.

With ``bias=False`` (nanoGPT's default) no peer has biases anywhere, LayerNorm
included (seqjax: ``norm_use_bias=False``). The difference that remains: seqjax's
default decay mask exempts the embeddings from weight decay (nanoGPT decays them)
— the same arithmetic either way.

Run: ``python -m benchmarks gpt`` (or ``seqjax bench gpt``); ``--smoke`` runs a
1-layer, d = 16, T = 16 model in seconds; ``--out FILE`` writes the markdown.
``python -m benchmarks nanogpt_loop`` times nanoGPT's whole ``train.py`` loop
(data sampling, learning-rate schedule, logging) around the same torch model.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks import harness

PEERS = ("seqjax", "flax", "torch-nanogpt")


@dataclasses.dataclass(frozen=True)
class GPTShape:
    """nanoGPT-style hyper-parameters (the defaults are its README's CPU run)."""

    num_layers: int = 4
    num_heads: int = 4
    embed_dim: int = 128
    block_size: int = 64
    batch: int = 12
    vocab_size: int = 65
    use_bias: bool = False

    @property
    def tokens(self) -> int:
        return self.batch * self.block_size

    @property
    def label(self) -> str:
        return (f"GPT {self.num_layers}L/{self.num_heads}H/{self.embed_dim} "
                f"B={self.batch} T={self.block_size} train step")


SMOKE = GPTShape(num_layers=1, num_heads=2, embed_dim=16, block_size=16, batch=2)

# nanoGPT's train_shakespeare_char optimiser.
LR, BETA1, BETA2, EPS, WEIGHT_DECAY, CLIP = 1e-3, 0.9, 0.99, 1e-8, 0.1, 1.0


def batch_tokens(shape: GPTShape, seed: int = 0) -> np.ndarray:
    """Random token ids ``int32[B, T + 1]`` (inputs are ``[:, :-1]``, targets ``[:, 1:]``)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, shape.vocab_size, (shape.batch, shape.block_size + 1), dtype=np.int32)


# ----------------------------------------------------------------------------- JAX peers


def seqjax_model(shape: GPTShape) -> Any:
    """The seqjax ``TransformerLM`` of ``shape`` (the ``nanogpt-cpu`` preset at full size)."""
    from seqjax.models.gpt import TransformerLM, gpt_block

    block = gpt_block(shape.num_heads, use_bias=shape.use_bias,
                      norm_use_bias=shape.use_bias, dropout_rate=0.0)
    return TransformerLM.from_preset(
        "nanogpt-cpu", vocab_size=shape.vocab_size, num_layers=shape.num_layers,
        embed_dim=shape.embed_dim, block_size=shape.block_size, block=block,
    )


def seqjax_compiled_step(shape: GPTShape, compute_dtype: str = "float32"
                         ) -> tuple[Any, Any, dict, float]:
    """``(compiled step, state, batch, compile seconds)``: the library's train step
    (:func:`~seqjax.train.step.make_train_step` over :func:`~seqjax.train.losses.make_lm_loss`,
    ``clip → adamw``), compiled for one fixed batch; the step donates the state."""
    import time

    import jax

    from seqjax.train.losses import make_lm_loss
    from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer
    from seqjax.train.step import flax_apply_fn, make_train_step

    model = seqjax_model(shape)
    tokens = batch_tokens(shape)
    batch = {"inputs": jax.numpy.asarray(tokens[:, :-1]),
             "targets": jax.numpy.asarray(tokens[:, 1:])}
    params = jax.jit(model.init)(jax.random.PRNGKey(0), batch["inputs"])["params"]
    tx, _ = make_optimizer(OptimizerConfig(
        name="adamw", learning_rate=LR, beta1=BETA1, beta2=BETA2, eps=EPS,
        weight_decay=WEIGHT_DECAY, clip_norm=CLIP))
    state = TrainState.create(params, tx, jax.random.PRNGKey(1))
    compute = None if compute_dtype == "float32" else jax.numpy.dtype(compute_dtype)
    train_step = make_train_step(make_lm_loss(flax_apply_fn(model)), compute_dtype=compute)
    t0 = time.perf_counter()
    compiled = train_step.lower(state, batch).compile()
    return compiled, state, batch, time.perf_counter() - t0


def seqjax_peer(shape: GPTShape, compute_dtype: str = "float32") -> harness.Prepared:
    """The library's train step; ``compute_dtype="bfloat16"``: mixed precision (fp32 params)."""
    import jax

    compiled, state, batch, compile_s = seqjax_compiled_step(shape, compute_dtype)
    holder = {"state": state}

    def step() -> Any:
        holder["state"], metrics = compiled(holder["state"], batch)
        return jax.block_until_ready(metrics["loss"])

    return harness.Prepared(step=step, compile_s=compile_s, compile_kind="compile")


def flax_model(shape: GPTShape) -> Any:
    """The same GPT from plain ``flax.linen`` parts."""
    import flax.linen as nn
    import jax.numpy as jnp

    init = nn.initializers.normal(stddev=0.02)
    d = shape.embed_dim

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, mask):
            h = nn.LayerNorm(epsilon=1e-5, use_bias=shape.use_bias)(x)
            x = x + nn.MultiHeadDotProductAttention(
                num_heads=shape.num_heads, qkv_features=d, use_bias=shape.use_bias,
                kernel_init=init,
            )(h, mask=mask)
            h = nn.LayerNorm(epsilon=1e-5, use_bias=shape.use_bias)(x)
            h = nn.Dense(4 * d, use_bias=shape.use_bias, kernel_init=init)(h)
            h = nn.gelu(h, approximate=False)
            return x + nn.Dense(d, use_bias=shape.use_bias, kernel_init=init)(h)

    class FlaxGPT(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            t = tokens.shape[1]
            wte = nn.Embed(shape.vocab_size, d, embedding_init=init)
            wpe = self.param("wpe", init, (shape.block_size, d))
            x = wte(tokens) + wpe[:t]
            mask = nn.make_causal_mask(tokens)
            for _ in range(shape.num_layers):
                x = Block()(x, mask)
            h = nn.LayerNorm(epsilon=1e-5, use_bias=shape.use_bias)(x)
            return wte.attend(h).astype(jnp.float32)

    return FlaxGPT()


def flax_peer(shape: GPTShape) -> harness.Prepared:
    import time

    import jax
    import jax.numpy as jnp
    import optax

    model = flax_model(shape)
    tokens = jnp.asarray(batch_tokens(shape))
    x, y = tokens[:, :-1], tokens[:, 1:]
    params = jax.jit(model.init)(jax.random.PRNGKey(0), x)["params"]
    decay = jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)
    tx = optax.chain(
        optax.clip_by_global_norm(CLIP),
        optax.adamw(LR, b1=BETA1, b2=BETA2, eps=EPS, weight_decay=WEIGHT_DECAY, mask=decay),
    )

    def loss_fn(p, x_, y_):
        logits = model.apply({"params": p}, x_)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y_).mean()

    def train_step(p, opt_state, x_, y_):
        loss, grads = jax.value_and_grad(loss_fn)(p, x_, y_)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    holder = {"p": params, "o": tx.init(params)}
    t0 = time.perf_counter()
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(
        holder["p"], holder["o"], x, y).compile()
    compile_s = time.perf_counter() - t0

    def step() -> Any:
        holder["p"], holder["o"], loss = compiled(holder["p"], holder["o"], x, y)
        return jax.block_until_ready(loss)

    return harness.Prepared(step=step, compile_s=compile_s, compile_kind="compile")


# ----------------------------------------------------------------------------- torch peer


def torch_device() -> str:
    """Where the torch peers run: ``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_gpt(shape: GPTShape, dropout: float = 0.0) -> Any:
    """nanoGPT's architecture in torch (written from its description; built on the CPU).

    ``forward(idx, cache=None, start=0, last_only=False)`` returns logits ``[B, T, V]``
    (``[B, 1, V]`` with ``last_only``); with ``cache`` (a list filled with one ``(k, v)``
    pair per layer) it also keeps the keys and values so that the next call can feed
    only the new tokens at positions ``start, start + 1, …`` (KV-cache decoding).

    ``dropout`` (in training mode only) is applied where nanoGPT applies it: to the sum
    of the token and position embeddings, to the attention weights (the ``dropout_p`` of
    ``F.scaled_dot_product_attention``) and to the output projection of every residual
    branch (attention and MLP). At ``dropout=0`` (the default) those are identities and
    the model is exactly the dropout-free one (same parameters, same outputs).
    """
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn

    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"`dropout` must be in [0, 1); got {dropout}.")
    d, heads, bias = shape.embed_dim, shape.num_heads, shape.use_bias

    def drop() -> nn.Module:
        return nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d, bias=bias)
            self.proj = nn.Linear(d, d, bias=bias)
            self.proj_drop = drop()

        def forward(self, x, cache=None, layer=0):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            if cache is not None:
                if layer < len(cache):
                    k = torch.cat([cache[layer][0], k], dim=2)
                    v = torch.cat([cache[layer][1], v], dim=2)
                    cache[layer] = (k, v)
                else:
                    cache.append((k, v))
            # A single new query attends to every cached key: no mask needed.
            o = F.scaled_dot_product_attention(
                q, k, v, is_causal=t > 1, dropout_p=dropout if self.training else 0.0)
            return self.proj_drop(self.proj(o.transpose(1, 2).reshape(b, t, d)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(d, eps=1e-5, bias=bias)
            self.attn = SelfAttention()
            self.ln_2 = nn.LayerNorm(d, eps=1e-5, bias=bias)
            self.fc = nn.Linear(d, 4 * d, bias=bias)
            self.out = nn.Linear(4 * d, d, bias=bias)
            self.out_drop = drop()

        def forward(self, x, cache=None, layer=0):
            x = x + self.attn(self.ln_1(x), cache, layer)
            return x + self.out_drop(self.out(F.gelu(self.fc(self.ln_2(x)))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(shape.vocab_size, d)
            self.wpe = nn.Embedding(shape.block_size, d)
            self.drop = drop()
            self.blocks = nn.ModuleList(Block() for _ in range(shape.num_layers))
            self.ln_f = nn.LayerNorm(d, eps=1e-5, bias=bias)
            self.head = nn.Linear(d, shape.vocab_size, bias=False)
            self.head.weight = self.wte.weight  # tied embeddings
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * shape.num_layers) if name.endswith(
                        ("proj.weight", "out.weight")) else 0.02
                    torch.nn.init.normal_(p, 0.0, std)

        def forward(self, idx, cache=None, start=0, last_only=False):
            t = idx.shape[1]
            pos = torch.arange(start, start + t, dtype=torch.long, device=idx.device)
            x = self.drop(self.wte(idx) + self.wpe(pos))
            for i, block in enumerate(self.blocks):
                x = block(x, cache, i)
            if last_only:  # inference: the head on the last position only, as nanoGPT does
                x = x[:, -1:]
            return self.head(self.ln_f(x))

    return GPT()


def torch_lm_loss(model: Any) -> Any:
    """``model`` with its loss: a module whose ``forward(x, y)`` is the mean next-token
    cross-entropy of ``model(x)`` against ``y`` (the logits' ``F.cross_entropy``).

    nanoGPT computes the loss inside its model's ``forward``, so ``torch.compile(model)``
    compiles the loss too; compiling this module does the same. It owns ``model`` (its
    parameters and ``train()``/``eval()`` mode are ``model``'s).
    """
    import torch.nn.functional as F
    from torch import nn

    class LMLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = model

        def forward(self, x, y):
            logits = self.lm(x)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    return LMLoss()


def torch_optimizer(
    model: Any, *, lr: float = LR, betas: tuple[float, float] = (BETA1, BETA2),
    weight_decay: float = WEIGHT_DECAY, fused: bool | None = None,
) -> Any:
    """nanoGPT's AdamW: weight decay on ≥2-D parameters, none on biases and norms.

    ``fused=None``: the fused CUDA kernel when the parameters are on a CUDA device (as
    nanoGPT's ``configure_optimizers`` chooses), torch's default implementation otherwise.
    """
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if fused is None:
        fused = bool(params) and all(p.is_cuda for p in params)
    extra = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=EPS, **extra)


def torch_autocast(device: str, compute_dtype: str = "float32") -> Any:
    """A factory of the forward pass's context: ``torch.autocast("cuda", bfloat16)`` for
    ``compute_dtype="bfloat16"`` on CUDA, a no-op otherwise (fp32)."""
    import contextlib

    import torch

    if compute_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"compute_dtype must be float32 or bfloat16; got {compute_dtype!r}.")
    if compute_dtype == "bfloat16":
        if device != "cuda":
            raise ValueError("the torch-nanogpt peer runs bfloat16 (autocast) on CUDA only; "
                             "on the CPU it is fp32 eager.")
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def torch_cuda_setup() -> None:
    """nanoGPT's CUDA settings: TF32 allowed in fp32 matmuls and cuDNN (process-wide)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def torch_peer(shape: GPTShape, compute_dtype: str = "float32") -> harness.Prepared:
    """nanoGPT's training step in torch: eager fp32 on the CPU; on CUDA compiled, fused
    AdamW, bf16 autocast with ``compute_dtype="bfloat16"`` (the module docstring)."""
    import time

    import torch

    device = torch_device()
    autocast = torch_autocast(device, compute_dtype)  # refuses bfloat16 on the CPU
    torch.manual_seed(0)
    model = torch_gpt(shape).to(device)
    model.train()
    opt = torch_optimizer(model)
    loss_fn = torch_lm_loss(model)
    tokens = torch.from_numpy(batch_tokens(shape).astype(np.int64)).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    if device == "cpu":  # nanoGPT's CPU recipe: eager, fp32
        def step() -> float:
            loss = loss_fn(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.item()

        return harness.eager_prepared(step)

    torch_cuda_setup()
    compiled = torch.compile(loss_fn)

    def cuda_step() -> float:
        with autocast():
            loss = compiled(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()  # the call returns once the GPU has finished it
        return loss.item()

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    cuda_step()  # torch.compile traces and compiles forward and backward here
    return harness.Prepared(step=cuda_step, compile_s=time.perf_counter() - t0,
                            compile_kind="compile")


_BUILDERS = {"seqjax": seqjax_peer, "flax": flax_peer, "torch-nanogpt": torch_peer}


# ----------------------------------------------------------------------------- driver


def run(
    shape: GPTShape,
    peers: Sequence[str] = PEERS,
    *,
    repeats: int = 7,
    warmup: int = 2,
    min_sample_s: float = 0.2,
    log=None,
    compute_dtype: str = "float32",
) -> list[harness.Result]:
    """Time one training step of every peer, alternating round robin."""
    def build(name: str) -> harness.Prepared:
        if name in ("seqjax", "torch-nanogpt"):
            return _BUILDERS[name](shape, compute_dtype)
        return _BUILDERS[name](shape)

    row_peers = [harness.Peer(n, lambda n=n: build(n)) for n in peers]
    return harness.run_row(shape.label, row_peers, shape.tokens, repeats=repeats,
                           warmup=warmup, min_sample_s=min_sample_s, log=log)


def largest_batch(shape: GPTShape, candidates: Sequence[int], *, compute_dtype: str,
                  repeats: int, warmup: int, min_sample_s: float,
                  log=None) -> tuple[GPTShape, list[harness.Result]] | None:
    """seqjax's step at the largest batch of ``candidates`` (tried largest first) that fits
    in the device's memory; ``None`` when none does."""
    import gc

    import jax

    for batch in sorted(candidates, reverse=True):
        bigger = dataclasses.replace(shape, batch=batch)
        try:
            return bigger, run(bigger, ["seqjax"], repeats=repeats, warmup=warmup,
                               min_sample_s=min_sample_s, log=log,
                               compute_dtype=compute_dtype)
        except Exception as err:  # XLA's out-of-memory error: try the next batch
            if "RESOURCE_EXHAUSTED" not in str(err) and "out of memory" not in str(err).lower():
                raise
            if log is not None:
                log(f"B={batch} does not fit: {str(err).splitlines()[0][:120]}")
            gc.collect()
            jax.clear_caches()
    return None


def summary_table(results: Sequence[harness.Result]) -> str:
    """One line per row: tokens/s of every peer, and seqjax ÷ the fastest other peer."""
    return harness.ratio_summary(results, best_header="fastest other peer")


def mfu_note(shape: GPTShape, results: Sequence[harness.Result]) -> str:
    """seqjax's model FLOPs utilisation: ``C · tokens/s ÷ (devices · peak)``, with ``C`` =
    :func:`seqjax.train.flops.lm_flops_per_token` (6N + 12·L·H·Q·T, causal half) and the
    device's dense peak (:func:`seqjax.train.flops.peak_flops_per_device`)."""
    import jax

    from seqjax.train.flops import lm_flops_per_token, peak_flops_per_device

    model = seqjax_model(shape)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                            jax.numpy.zeros((1, shape.block_size), jax.numpy.int32))
    per_token = lm_flops_per_token(model.config, params, block_size=shape.block_size)
    peak = peak_flops_per_device()
    ours = [r for r in results if r.peer == "seqjax"]
    text = f"Model FLOPs per token (6N + 12·L·H·Q·T, causal half): {per_token / 1e6:.2f} M"
    if not ours:
        return text + "."
    achieved = per_token * ours[0].tokens_per_s
    text += f"; seqjax achieves {achieved / 1e9:.2f} GFLOP/s"
    if peak is None:
        return text + f" (MFU: no peak FLOP/s known for {jax.devices()[0].device_kind!r})."
    mfu = achieved / (peak * jax.device_count())
    return text + f", MFU {mfu:.1%} of {peak / 1e12:.0f} TFLOP/s per device."


def torch_note(compute_dtype: str) -> str:
    """Where and how the torch-nanogpt peer ran (a line of the report)."""
    import torch

    if torch_device() == "cpu":
        return "torch-nanogpt: CPU, eager, fp32 (nanoGPT's CPU recipe, --compile=False)."
    precision = ("bf16 autocast" if compute_dtype == "bfloat16"
                 else "fp32 (TF32 matmuls)")
    return (f"torch-nanogpt: CUDA ({torch.cuda.get_device_name()}), torch.compile, "
            f"{precision}, fused AdamW (nanoGPT's train.py on a GPU); compile = first call.")


def parse_peers(ap: argparse.ArgumentParser, text: str, allowed: Sequence[str]) -> list[str]:
    """The ``--peers`` comma list, checked; torch peers dropped (with a note) without torch."""
    peers = [p.strip() for p in text.split(",") if p.strip()]
    for p in peers:
        if p not in allowed:
            ap.error(f"--peers: unknown peer {p!r}; choose from {tuple(allowed)}")
    if any(p.startswith("torch") for p in peers) and not harness.torch_available():
        print("torch not installed: skipping the torch peers", file=sys.stderr)
        peers = [p for p in peers if not p.startswith("torch")]
    if not peers:
        ap.error("--peers: no peer left to run")
    return peers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench gpt", description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="a 1-layer d=16 T=16 B=2 model, 2 repeats: every peer in seconds")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma list of " + ",".join(PEERS))
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--block", type=int, default=64, help="block size T")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=65, help="vocabulary size (GPT-2: 50304)")
    ap.add_argument("--preset", choices=("nanogpt-cpu", "gpt2-small"), default=None,
                    help="gpt2-small: 12L/12H/768, T=1024, |V|=50304, biases (issue #9 item 4; "
                         "--batch still applies)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="compute dtype (bfloat16: seqjax's mixed precision, and torch-nanogpt's "
                         "bf16 autocast on CUDA; the flax peer is fp32 only)")
    ap.add_argument("--largest-batch", default="",
                    help="also time seqjax at the largest of these batches that fits, e.g. "
                         "64,32,16 (tokens/s and MFU at the batch a user would train with)")
    harness.add_common_args(ap)
    args = ap.parse_args(argv)
    try:
        candidates = [int(b) for b in args.largest_batch.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--largest-batch: a comma list of ints; got {args.largest_batch!r}")
    if any(b < 1 for b in candidates):
        ap.error(f"--largest-batch: batches must be >= 1; got {args.largest_batch!r}")

    peers = parse_peers(ap, args.peers, PEERS)
    if "torch-nanogpt" in peers and torch_device() == "cuda":
        # JAX grabs 75 % of the GPU at its first use (the seqjax and flax peers, the MFU
        # note); cap it at half so that torch has room on the same card. Set before JAX
        # starts its GPU client; an explicit setting in the environment wins.
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    if args.dtype != "float32":
        fp32_only = [p for p in peers if p not in ("seqjax", "torch-nanogpt")]
        if fp32_only:
            ap.error(f"--dtype {args.dtype} times the seqjax and torch-nanogpt peers only "
                     f"(not {','.join(fp32_only)}): add --peers seqjax,torch-nanogpt")
        if "torch-nanogpt" in peers and torch_device() != "cuda":
            ap.error(f"--dtype {args.dtype}: torch-nanogpt runs bf16 autocast on CUDA only "
                     "(on the CPU it is fp32 eager): add --peers seqjax")
    if args.smoke:
        shape = SMOKE
    elif args.preset == "gpt2-small":
        shape = GPTShape(num_layers=12, num_heads=12, embed_dim=768, block_size=1024,
                         batch=args.batch, vocab_size=50304, use_bias=True)
    else:
        shape = GPTShape(num_layers=args.layers, num_heads=args.heads, embed_dim=args.d_model,
                         block_size=args.block, batch=args.batch, vocab_size=args.vocab)
    harness.configure_threads(args.threads)
    log = None if args.quiet or args.smoke else (lambda s: print(s, file=sys.stderr, flush=True))
    results = run(shape, peers, repeats=2 if args.smoke else args.repeats,
                  warmup=1 if args.smoke else 2, min_sample_s=0.0 if args.smoke else 0.2,
                  log=log, compute_dtype=args.dtype)
    notes = [f"Tokens per step: B·T = {shape.batch}·{shape.block_size} = {shape.tokens}.",
             mfu_note(shape, results),
             *([torch_note(args.dtype)] if "torch-nanogpt" in peers else [])]
    if candidates:
        found = largest_batch(shape, candidates, compute_dtype=args.dtype,
                              repeats=2 if args.smoke else args.repeats,
                              warmup=1 if args.smoke else 2,
                              min_sample_s=0.0 if args.smoke else 0.2, log=log)
        if found is None:
            notes.append(f"Largest batch: none of {candidates} fits.")
        else:
            big, big_results = found
            results = [*results, *big_results]
            notes.append(f"Largest batch of {candidates} that fits: B={big.batch}, seqjax "
                         f"{big_results[0].tokens_per_s:,.0f} tokens/s. "
                         + mfu_note(big, big_results))
    harness.emit_report(
        f"GPT training step ({shape.label}, {args.dtype}): tokens/s (higher is better)", "gpt",
        argv, summary_table(results), results, out=args.out, notes=notes,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

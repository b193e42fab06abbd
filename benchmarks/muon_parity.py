r"""Muon against ``torch.optim.Muon``, step for step: ``python -m benchmarks muon_parity``.

The same "modern" GPT on both sides, trained 10 steps from the same weights on the same
batches: seqjax's :class:`~seqjax.models.gpt.TransformerLM` (RoPE, QK-norm, RMSNorm, squared
ReLU, untied head, logit soft-cap) under ``OptimizerConfig(name="muon", ...)`` through
``make_train_step``, and :func:`torch_modern_gpt` (``ModernGPT``, written here from that
description) under ``torch.optim.Muon`` on the hidden matrices and ``torch.optim.AdamW``
on the rest, one AdamW parameter group per seqjax group (embedding, head, vectors), each
with its own learning rate and weight decay. The report prints both sides' loss at every
step, the largest relative loss difference and the largest parameter difference after the
last step. This is a proof of correctness, not a speed benchmark; it takes seconds.

**Which Muon.** Two conventions are in use, and they differ from the second step on:

* ``torch.optim.Muon`` (Keller Jordan's ``Muon``, the optimiser of modded-nanogpt's
  speed-run record): momentum without bias correction ``B_t = μB_{t-1} + G_t`` (torch keeps
  ``(1 - μ)B_t``, a ``lerp``: the same direction), Nesterov as ``G_t + μB_t``, the
  quintic Newton–Schulz iteration ``X ← aX + (bA + cA²)X``, ``A = XXᵀ``, with
  ``(a, b, c) = (3.4445, -4.7750, 2.0315)`` and 5 steps after dividing by the Frobenius
  norm, the rate scaled by ``sqrt(max(1, out/in))`` of torch's ``(out, in)`` weight
  (``adjust_lr_fn=None``, "original") and decoupled decay ``W ← (1 - ηλ)W``;
* ``optax.contrib.muon``: bias-corrected momentum (an average ``M_t = μM_{t-1} + (1-μ)G_t``
  divided by ``1 - μ^{t+1}`` in the Nesterov term and ``G_t`` by ``1 - μ^t``: the same
  direction as torch's at the first step, another from the second) and Nesterov-Adam
  (``adamw(nesterov=True)``) for the parameters that are not hidden matrices.

seqjax follows torch's (``seqjax.train.optim``): the modded-nanogpt optimisation-track
results are obtained with it, and ``torch.optim.Muon`` is the reference the peers compare
against. The other parameters follow ``torch.optim.AdamW`` (bias-corrected, ``eps`` outside
the square root, decoupled decay ``ηλW``), as in modded-nanogpt.

**Float32 against bfloat16 Newton–Schulz.** ``torch.optim.Muon`` runs the iteration in
bfloat16 (``torch/optim/_muon.py``, ``_zeropower_via_newtonschulz`` casts the update with
``.bfloat16()``); seqjax runs it in float32. bfloat16's rounding (unit roundoff
``2^-8 ≈ 4·10^-3`` per operation) alone is larger than the 1e-4 this check asks for. So the tight
comparison runs torch's Muon with that one function replaced by the same iteration in
float32 (:func:`float32_newton_schulz`, a context manager that swaps
``torch.optim._muon._zeropower_via_newtonschulz`` and restores it); everything else — the
momentum ``lerp``, Nesterov, the rate adjustment, the weight decay, ``AdamW`` — is torch's
own code. A second run with torch's unmodified bfloat16 Muon measures what bfloat16 costs,
and is checked only loosely (``tests/test_muon_parity.py``).

Conventions checked on the way (``seqjax.nn``): pre-norm blocks, RMSNorm
``g ⊙ x / sqrt(mean(x²) + ε)`` with ``ε = 1e-6`` everywhere (the blocks', the final norm's
and QK-norm's), QK-norm over each head's ``K`` features before RoPE, RoPE on the
"halves" pairing ``(i, i + K/2)`` with ``ω_i = 10000^{-2i/K}``, scores scaled by
``1/sqrt(K)``, MLP ``down(relu(up(x))²)`` of width ``4D``, no biases, logits
``c·tanh(z/c)``, the mean token cross-entropy. seqjax's ``[D, H, K]`` query/key/value
kernels are ``nn.Linear(D, HK).weight`` transposed, its ``[H, K, D]`` output kernel
``nn.Linear(HK, D).weight`` transposed (:func:`seqjax_to_torch`, :func:`torch_to_seqjax`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from benchmarks import harness

#: seqjax path (under ``decoder/layers_{i}/``) → the torch block's parameter, and the layout.
_BLOCK_PARAMS = (
    ("self_attn_norm/scale", "attn_norm.weight", "vector"),
    ("self_attn/query/kernel", "q.weight", "heads_in"),
    ("self_attn/key/kernel", "k.weight", "heads_in"),
    ("self_attn/value/kernel", "v.weight", "heads_in"),
    ("self_attn/query_norm/scale", "q_norm.weight", "vector"),
    ("self_attn/key_norm/scale", "k_norm.weight", "vector"),
    ("self_attn/out/kernel", "out.weight", "heads_out"),
    ("ffn_norm/scale", "ffn_norm.weight", "vector"),
    ("ffn/up/kernel", "up.weight", "dense"),
    ("ffn/down/kernel", "down.weight", "dense"),
)


@dataclasses.dataclass(frozen=True)
class Setup:
    """The tiny model, its data and its optimiser, shared by both sides.

    Muon's groups: the hidden matrices at ``lr_matrix`` (decay ``weight_decay``), the
    embedding at ``lr_embed`` (decay ``embed_weight_decay``), the head at ``lr_head``
    (decay ``head_weight_decay``), the norm scales at ``lr_scalar`` (no decay).
    """

    vocab_size: int = 61
    num_layers: int = 2
    embed_dim: int = 32
    num_heads: int = 2
    block_size: int = 16
    batch: int = 4
    steps: int = 10
    logit_softcap: float = 15.0
    lr_matrix: float = 0.02
    lr_embed: float = 0.05
    lr_head: float = 0.008
    lr_scalar: float = 0.04
    weight_decay: float = 0.1
    head_weight_decay: float = 0.2
    embed_weight_decay: float = 0.05
    momentum: float = 0.95
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    ns_steps: int = 5
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def norm_epsilon(self) -> float:
        """RMSNorm's ``ε``: seqjax's default for the blocks, the final norm and QK-norm."""
        return 1e-6

    @property
    def rope_base(self) -> float:
        return 10000.0

    def model_config(self) -> Any:
        from seqjax.models.gpt import TransformerLMConfig, gpt_block

        block = gpt_block(self.num_heads, qk_norm=True, norm_type="rmsnorm",
                          activation="relu_squared", use_bias=False, norm_use_bias=False,
                          use_rope=True, rope_base=self.rope_base)
        return TransformerLMConfig(vocab_size=self.vocab_size, num_layers=self.num_layers,
                                   embed_dim=self.embed_dim, block_size=self.block_size,
                                   block=block, positions="rope", tie_embeddings=False,
                                   logit_softcap=self.logit_softcap)

    def optimizer_config(self) -> Any:
        from seqjax.train.optim import OptimizerConfig

        return OptimizerConfig(
            name="muon", learning_rate=self.lr_matrix, momentum=self.momentum, nesterov=True,
            ns_steps=self.ns_steps, weight_decay=self.weight_decay, beta1=self.b1, beta2=self.b2,
            eps=self.eps, schedule="constant",
            group_learning_rates=(("embed", self.lr_embed), ("head", self.lr_head),
                                  ("scalar", self.lr_scalar)),
            group_weight_decays=(("head", self.head_weight_decay),
                                 ("embed", self.embed_weight_decay)))


SETUP = Setup()


# ----------------------------------------------------------------------------- data, weights


def make_batches(setup: Setup) -> list[dict[str, np.ndarray]]:
    """``setup.steps`` batches ``{"inputs", "targets", "mask"}`` (int32 ``[B, T]``, bool).

    Each row counts modulo ``V`` from a random start by a stride drawn from ``{1, 2, 3}``, a
    pattern the model starts learning within 10 steps, so the check follows a falling loss.
    The mask keeps every position (the mean over all tokens, as ``F.cross_entropy``).
    """
    rng = np.random.default_rng(setup.seed + 1)
    out = []
    for _ in range(setup.steps):
        start = rng.integers(0, setup.vocab_size, size=(setup.batch, 1))
        stride = rng.integers(1, 4, size=(setup.batch, 1))
        tokens = (start + stride * np.arange(setup.block_size + 1)[None]) % setup.vocab_size
        tokens = tokens.astype(np.int32)
        out.append({"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
                    "mask": np.ones((setup.batch, setup.block_size), bool)})
    return out


def initial_params(setup: Setup) -> Any:
    """seqjax's parameters (numpy float32): the model's own random init, every kernel
    nonzero, with the norm scales drawn around 1 (``1 + 0.1·N(0, 1)``) instead of exactly 1,
    so that a scale copied to the wrong place already shows at the first step."""
    import jax
    import jax.numpy as jnp

    from seqjax.models.gpt import TransformerLM

    model = TransformerLM(setup.model_config())
    tokens = jnp.zeros((1, setup.block_size), jnp.int32)
    params = model.init(jax.random.PRNGKey(setup.seed), tokens)["params"]
    rng = np.random.default_rng(setup.seed)

    def draw(path: Any, leaf: Any) -> np.ndarray:
        leaf = np.asarray(leaf, np.float32)
        if jax.tree_util.keystr(path).endswith("['scale']"):
            return (1.0 + 0.1 * rng.standard_normal(leaf.shape)).astype(np.float32)
        return leaf

    return jax.tree_util.tree_map_with_path(draw, params)


# ----------------------------------------------------------------------------- seqjax side


def train_seqjax(params: Any, batches: Sequence[dict[str, np.ndarray]], setup: Setup
                 ) -> tuple[list[float], Any]:
    """``setup.steps`` steps of seqjax's Muon through ``make_train_step``: ``(loss before
    each update, final parameters as numpy)``."""
    import jax
    import jax.numpy as jnp

    from seqjax.models.gpt import TransformerLM
    from seqjax.train.losses import make_lm_loss
    from seqjax.train.optim import TrainState, make_optimizer
    from seqjax.train.step import flax_apply_fn, make_train_step

    model = TransformerLM(setup.model_config())
    tx, schedule = make_optimizer(setup.optimizer_config())
    state = TrainState.create(jax.tree_util.tree_map(jnp.asarray, params), tx,
                              jax.random.PRNGKey(setup.seed))
    step = make_train_step(make_lm_loss(flax_apply_fn(model)), schedule=schedule)
    losses = []
    for batch in batches:
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, jax.tree_util.tree_map(np.asarray, state.params)


# ----------------------------------------------------------------------------- torch side


def torch_modern_gpt(setup: Setup) -> Any:
    """``ModernGPT``, the same network in torch (built on the CPU, float32).

    Token embedding; ``L`` pre-norm blocks ``x += out(attn(RMSNorm(x)))``,
    ``x += down(relu(up(RMSNorm(x)))²)``; attention with separate ``q``, ``k``, ``v``
    ``nn.Linear(D, HK, bias=False)``, per-head RMSNorm of ``q`` and ``k`` over ``K``
    features (learned weight) then RoPE ("halves" pairing), causal
    ``F.scaled_dot_product_attention`` (scale ``1/sqrt(K)``), ``out`` ``nn.Linear(HK, D)``;
    a final RMSNorm, an untied ``nn.Linear(D, V)`` head and the soft-cap ``c·tanh(z/c)``.
    ``forward(tokens [B, T]) -> logits [B, T, V]``. Parameters are written over by
    :func:`seqjax_to_torch`.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    d, h, k, eps = setup.embed_dim, setup.num_heads, setup.head_dim, setup.norm_epsilon

    def rope(x_BxTxHxK: torch.Tensor, cos_TxF: torch.Tensor, sin_TxF: torch.Tensor
             ) -> torch.Tensor:
        x1, x2 = x_BxTxHxK[..., : k // 2], x_BxTxHxK[..., k // 2:]
        cos, sin = cos_TxF[:, None, :], sin_TxF[:, None, :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn_norm = nn.RMSNorm(d, eps=eps)
            self.q = nn.Linear(d, h * k, bias=False)
            self.k = nn.Linear(d, h * k, bias=False)
            self.v = nn.Linear(d, h * k, bias=False)
            self.q_norm = nn.RMSNorm(k, eps=eps)
            self.k_norm = nn.RMSNorm(k, eps=eps)
            self.out = nn.Linear(h * k, d, bias=False)
            self.ffn_norm = nn.RMSNorm(d, eps=eps)
            self.up = nn.Linear(d, 4 * d, bias=False)
            self.down = nn.Linear(4 * d, d, bias=False)

        def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> torch.Tensor:
            b, t, _ = x.shape
            a = self.attn_norm(x)
            q = rope(self.q_norm(self.q(a).view(b, t, h, k)), cos, sin)
            kk = rope(self.k_norm(self.k(a).view(b, t, h, k)), cos, sin)
            v = self.v(a).view(b, t, h, k)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), kk.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + self.out(y.transpose(1, 2).reshape(b, t, h * k))
            return x + self.down(F.relu(self.up(self.ffn_norm(x))).square())

    class ModernGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(setup.vocab_size, d)
            self.blocks = nn.ModuleList(Block() for _ in range(setup.num_layers))
            self.final_norm = nn.RMSNorm(d, eps=eps)
            self.head = nn.Linear(d, setup.vocab_size, bias=False)
            # ω_i = base^{-2i/K} in float64 then float32, angles t·ω_i in float32 (as seqjax)
            inv = torch.pow(setup.rope_base, -torch.arange(0, k, 2, dtype=torch.float64) / k)
            angles = (torch.arange(setup.block_size, dtype=torch.float32)[:, None]
                      * inv.float()[None, :])
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            t = tokens.shape[1]
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x, self.cos[:t], self.sin[:t])
            z = self.head(self.final_norm(x))
            c = setup.logit_softcap
            return c * torch.tanh(z / c)

    return ModernGPT()


def _torch_layout(kind: str, a: np.ndarray) -> np.ndarray:
    """A seqjax array → the torch parameter's layout."""
    if kind == "heads_in":  # [D, H, K] → nn.Linear(D, HK).weight [HK, D]
        return a.reshape(a.shape[0], -1).T
    if kind == "heads_out":  # [H, K, D] → nn.Linear(HK, D).weight [D, HK]
        return a.reshape(-1, a.shape[-1]).T
    if kind == "dense":  # [in, out] → [out, in]
        return a.T
    return a


def _seqjax_layout(kind: str, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A torch parameter → seqjax's array of ``shape`` (the inverse of :func:`_torch_layout`)."""
    if kind in ("heads_in", "heads_out", "dense"):
        return a.T.reshape(shape)
    return a.reshape(shape)


def _pairs(setup: Setup) -> Iterator[tuple[tuple[str, ...], str, str]]:
    """``(seqjax path, torch parameter name, layout)`` for every parameter."""
    yield ("token_embed", "embedding"), "embed.weight", "vector"
    for i in range(setup.num_layers):
        for path, name, kind in _BLOCK_PARAMS:
            yield ("decoder", f"layers_{i}", *path.split("/")), f"blocks.{i}.{name}", kind
    yield ("decoder", "final_norm", "scale"), "final_norm.weight", "vector"
    yield ("lm_head", "kernel"), "head.weight", "dense"


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def seqjax_to_torch(params: Any, model: Any, setup: Setup) -> None:
    """Copy seqjax's parameter tree into ``model`` (:func:`torch_modern_gpt`) in place."""
    import torch

    named = dict(model.named_parameters())
    if len(named) != sum(1 for _ in _pairs(setup)):
        raise ValueError(f"the torch model has {len(named)} parameters, the mapping "
                         f"{sum(1 for _ in _pairs(setup))}.")
    with torch.no_grad():
        for path, name, kind in _pairs(setup):
            value = torch.from_numpy(  # a writable copy: jax's arrays are read-only
                np.array(_torch_layout(kind, np.asarray(_get(params, path), np.float32))))
            if tuple(value.shape) != tuple(named[name].shape):
                raise ValueError(f"{'/'.join(path)} maps to {name} of shape "
                                 f"{tuple(named[name].shape)}; got {tuple(value.shape)}.")
            named[name].copy_(value)


def torch_to_seqjax(model: Any, like: Any, setup: Setup) -> Any:
    """``model``'s parameters as a numpy tree in seqjax's layout (the structure of ``like``)."""
    import jax

    named = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
    out = jax.tree_util.tree_map(lambda _: None, like)
    for path, name, kind in _pairs(setup):
        shape = np.shape(_get(like, path))
        _get(out, path[:-1])[path[-1]] = _seqjax_layout(kind, named[name], shape)
    return out


def _newton_schulz_float32(grad: Any, ns_coefficients: tuple[float, float, float],
                           ns_steps: int, eps: float) -> Any:
    """The quintic Newton–Schulz iteration of ``torch.optim.Muon`` in float32 (written here):
    a wide matrix (a tall one transposed), divided by ``max(‖X‖_F, eps)``, then ``ns_steps``
    times ``X ← aX + (bA + cA²)X`` with ``A = XXᵀ``."""
    a, b, c = ns_coefficients
    x = grad.float()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if tall else x


@contextlib.contextmanager
def float32_newton_schulz() -> Iterator[None]:
    """Inside: ``torch.optim.Muon`` orthogonalises in float32 instead of bfloat16.

    Swaps ``torch.optim._muon._zeropower_via_newtonschulz`` (which casts the update to
    bfloat16) for :func:`_newton_schulz_float32`, the same iteration in float32, and restores
    it on exit. Muon's step looks the function up in its module at every call, so nothing
    else changes: the momentum, Nesterov, the rate adjustment and the decay stay torch's.
    """
    from torch.optim import _muon

    original = _muon._zeropower_via_newtonschulz
    _muon._zeropower_via_newtonschulz = _newton_schulz_float32
    try:
        yield
    finally:
        _muon._zeropower_via_newtonschulz = original


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread inside, restored on exit: the matrices are 32 × 128 at
    most, and on a busy 2-core machine OpenMP's barriers stalled two threads for seconds."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_torch(params: Any, batches: Sequence[dict[str, np.ndarray]], setup: Setup, *,
                newton_schulz: str = "float32") -> tuple[list[float], Any]:
    """``setup.steps`` steps of ``ModernGPT`` from seqjax's ``params``: ``torch.optim.Muon``
    on the six hidden matrices of each block, ``torch.optim.AdamW`` on the embedding, the
    head and the norm scales (three parameter groups, each with its rate and decay; betas
    and eps as seqjax's). ``newton_schulz``: ``"float32"`` (:func:`float32_newton_schulz`)
    or ``"bfloat16"`` (torch's own). Returns ``(loss before each update, final parameters
    in seqjax's layout)``.
    """
    import torch
    import torch.nn.functional as F

    if newton_schulz not in ("float32", "bfloat16"):
        raise ValueError(f"`newton_schulz` must be 'float32' or 'bfloat16'; got "
                         f"{newton_schulz!r}.")
    model = torch_modern_gpt(setup)
    seqjax_to_torch(params, model, setup)
    matrices, embed, head, scalars = [], [], [], []
    for name, p in model.named_parameters():
        if name == "embed.weight":
            embed.append(p)
        elif name == "head.weight":
            head.append(p)
        elif p.ndim == 2:
            matrices.append(p)
        else:
            scalars.append(p)
    muon = torch.optim.Muon(matrices, lr=setup.lr_matrix, weight_decay=setup.weight_decay,
                            momentum=setup.momentum, nesterov=True, ns_steps=setup.ns_steps)
    adamw = torch.optim.AdamW(
        [{"params": embed, "lr": setup.lr_embed, "weight_decay": setup.embed_weight_decay},
         {"params": head, "lr": setup.lr_head, "weight_decay": setup.head_weight_decay},
         {"params": scalars, "lr": setup.lr_scalar, "weight_decay": 0.0}],
        betas=(setup.b1, setup.b2), eps=setup.eps)
    swap = float32_newton_schulz() if newton_schulz == "float32" else contextlib.nullcontext()
    losses = []
    with swap, _one_torch_thread():
        for batch in batches:
            tokens = torch.from_numpy(batch["inputs"].astype(np.int64))
            targets = torch.from_numpy(batch["targets"].astype(np.int64))
            mask = torch.from_numpy(batch["mask"])
            logits = model(tokens)
            loss = F.cross_entropy(logits[mask], targets[mask])
            muon.zero_grad()
            adamw.zero_grad()
            loss.backward()
            muon.step()
            adamw.step()
            losses.append(loss.item())
    return losses, torch_to_seqjax(model, params, setup)


# ----------------------------------------------------------------------------- comparison


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One torch run against seqjax's: per-step losses and the largest differences."""

    label: str
    losses: list[float]
    max_rel_loss_diff: float
    max_param_diff: float
    worst_param: str
    max_rel_norm_diff: float


def compare(label: str, jax_losses: Sequence[float], jax_params: Any,
            torch_losses: Sequence[float], torch_params: Any) -> Comparison:
    """The largest ``|Δloss|/|loss|`` over the steps; after the last step, the largest
    ``|Δθ|`` (absolute, elementwise) over every parameter, with the parameter's path, and the
    largest ``‖Δθ‖/‖θ‖`` (Frobenius, per tensor)."""
    import jax

    rel = max(abs(t - j) / abs(j) for j, t in zip(jax_losses, torch_losses, strict=True))
    diffs, norms = {}, []
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(jax_params)[0],
                            jax.tree_util.tree_leaves(torch_params), strict=True):
        delta = np.asarray(a, np.float64) - np.asarray(b, np.float64)
        diffs[jax.tree_util.keystr(path)] = float(np.max(np.abs(delta)))
        norms.append(float(np.linalg.norm(delta) / np.linalg.norm(np.asarray(a, np.float64))))
    worst = max(diffs, key=diffs.__getitem__)
    return Comparison(label, list(torch_losses), rel, diffs[worst], worst, max(norms))


def run(setup: Setup = SETUP) -> tuple[list[float], list[Comparison]]:
    """seqjax's losses, and its comparison with torch's Muon in float32 and bfloat16 NS."""
    params = initial_params(setup)
    batches = make_batches(setup)
    jax_losses, jax_params = train_seqjax(params, batches, setup)
    out = []
    for ns in ("float32", "bfloat16"):
        losses, final = train_torch(params, batches, setup, newton_schulz=ns)
        out.append(compare(f"torch.optim.Muon, {ns} NS", jax_losses, jax_params, losses, final))
    return jax_losses, out


def report(setup: Setup, jax_losses: Sequence[float], comparisons: Sequence[Comparison]) -> str:
    """The per-step table and the summary lines."""
    headers = ["step", "seqjax loss"]
    for c in comparisons:
        headers += [c.label, "rel. diff"]
    rows = []
    for i, loss in enumerate(jax_losses):
        row = [str(i + 1), f"{loss:.6f}"]
        for c in comparisons:
            row += [f"{c.losses[i]:.6f}", f"{abs(c.losses[i] - loss) / abs(loss):.1e}"]
        rows.append(row)
    lines = [
        f"GPT {setup.num_layers}L/{setup.num_heads}H/{setup.embed_dim}, V={setup.vocab_size}, "
        f"B={setup.batch} T={setup.block_size}, {setup.steps} steps of Muon "
        f"(lr {setup.lr_matrix}, wd {setup.weight_decay}) + AdamW (embed {setup.lr_embed}, "
        f"head {setup.lr_head}, scalars {setup.lr_scalar}), float32",
        "",
        harness.markdown_table(headers, rows),
        "",
    ]
    for c in comparisons:
        lines.append(f"{c.label}: max relative loss difference {c.max_rel_loss_diff:.2e}, "
                     f"max parameter difference {c.max_param_diff:.2e} ({c.worst_param}), "
                     f"max ‖Δθ‖/‖θ‖ {c.max_rel_norm_diff:.2e}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks muon_parity",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="3 steps instead of 10")
    parser.add_argument("--steps", type=int, default=SETUP.steps, help="training steps")
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args(argv)
    if not harness.torch_available():
        print("muon_parity: torch is not installed; nothing to compare against.")
        return 0
    setup = dataclasses.replace(SETUP, steps=3 if args.smoke else args.steps)
    text = report(setup, *run(setup))
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0

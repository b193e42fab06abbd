"""Multi-head attention and a pre-norm transformer block: seqjax vs flax.linen vs torch (CPU, fp32).

Every row times one training-style call on ``x: [B, T, d]`` (loss = sum of the
outputs, gradients w.r.t. parameters and input), and a forward-only column.
``d = 256``, 4 heads of 64, no mask (encoder self-attention), no dropout;
``B·T`` is held constant (8192 tokens by default) so the rows differ only in
how much of the work is the ``T²`` attention. Peers:

* ``mha`` rows — ``seqjax``: :class:`seqjax.nn.attention.MultiHeadAttention`;
  ``flax``: ``flax.linen.MultiHeadDotProductAttention``; ``torch-sdpa``: a
  hand-written MHA (fused ``in_proj`` Linear, ``F.scaled_dot_product_attention``,
  ``out_proj``); ``torch-mha``: ``torch.nn.MultiheadAttention(batch_first=True)``.
* ``block`` rows (pre-norm: ``x + MHA(LN(x))``, then ``+ MLP(LN(·))``, MLP
  ``d → 4d → d`` with exact GELU, LayerNorm ε = 1e-5) — ``seqjax``:
  :class:`seqjax.nn.transformer.TransformerBlock` ``(norm="pre")``; ``flax``: the
  same block built from ``MultiHeadDotProductAttention``, ``LayerNorm`` and
  ``Dense``; ``torch``: ``nn.TransformerEncoderLayer(norm_first=True,
  batch_first=True, activation="gelu", dropout=0)``.

Run: ``python -m benchmarks attention`` (or ``seqjax bench attention``);
``--smoke`` runs tiny shapes in a few seconds; ``--out FILE`` writes the markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks import harness

LENGTHS = (128, 512, 2048)
SMOKE_LENGTHS = (8,)
KINDS = ("mha", "block")
PEERS = {"mha": ("seqjax", "flax", "torch-sdpa", "torch-mha"), "block": ("seqjax", "flax", "torch")}


@dataclasses.dataclass(frozen=True)
class Config:
    kind: str  # "mha" or "block"
    batch: int
    steps: int
    d_model: int
    num_heads: int
    backward: bool

    @property
    def mlp_dim(self) -> int:
        return 4 * self.d_model

    @property
    def tokens(self) -> int:
        return self.batch * self.steps

    @property
    def label(self) -> str:
        mode = "fwd+bwd" if self.backward else "fwd"
        return (f"{self.kind} B={self.batch} T={self.steps} d={self.d_model} "
                f"h={self.num_heads} {mode}")


def _inputs(cfg: Config) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.standard_normal((cfg.batch, cfg.steps, cfg.d_model)).astype(np.float32)


# ----------------------------------------------------------------------------- JAX peers


def seqjax_module(cfg: Config) -> Any:
    """The seqjax layer a row times (also traced by ``benchmarks programs``)."""
    if cfg.kind == "mha":
        from seqjax.nn.attention import MultiHeadAttention

        return MultiHeadAttention(num_heads=cfg.num_heads)
    from seqjax.nn.transformer import BlockConfig, TransformerBlock

    return TransformerBlock(BlockConfig(
        num_heads=cfg.num_heads, mlp_dim=cfg.mlp_dim, norm="pre", norm_type="layernorm",
        mlp="mlp", activation="gelu",
    ))


def seqjax_peer(cfg: Config) -> harness.Prepared:
    return harness.jax_module_prepared(seqjax_module(cfg), _inputs(cfg), backward=cfg.backward)


def _flax_block(cfg: Config):
    import flax.linen as nn

    class FlaxPreNormBlock(nn.Module):
        """``x + MHA(LN(x))`` then ``+ Dense(gelu(Dense(LN(·))))``, from flax.linen parts."""

        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm(epsilon=1e-5)(x)
            x = x + nn.MultiHeadDotProductAttention(
                num_heads=cfg.num_heads, qkv_features=cfg.d_model
            )(h)
            h = nn.LayerNorm(epsilon=1e-5)(x)
            h = nn.Dense(cfg.mlp_dim)(h)
            h = nn.gelu(h, approximate=False)
            return x + nn.Dense(cfg.d_model)(h)

    return FlaxPreNormBlock()


def flax_peer(cfg: Config) -> harness.Prepared:
    import flax.linen as nn

    if cfg.kind == "mha":
        module = nn.MultiHeadDotProductAttention(num_heads=cfg.num_heads,
                                                 qkv_features=cfg.d_model)
    else:
        module = _flax_block(cfg)
    return harness.jax_module_prepared(module, _inputs(cfg), backward=cfg.backward)


# ----------------------------------------------------------------------------- torch peers


def _torch_sdpa_mha(cfg: Config):
    import torch
    import torch.nn.functional as F

    class SDPAttention(torch.nn.Module):
        """Hand-written MHA: fused QKV projection, ``F.scaled_dot_product_attention``, out proj."""

        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.in_proj = torch.nn.Linear(d, 3 * d)
            self.out_proj = torch.nn.Linear(d, d)

        def forward(self, x):
            b, t, d = x.shape
            qkv = self.in_proj(x).view(b, t, 3, self.heads, d // self.heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, h, T, d/h]
            o = F.scaled_dot_product_attention(q, k, v)
            return self.out_proj(o.transpose(1, 2).reshape(b, t, d))

    return SDPAttention(cfg.d_model, cfg.num_heads)


def torch_peer(name: str, cfg: Config) -> harness.Prepared:
    import torch

    torch.manual_seed(0)
    output = None
    if name == "torch-sdpa":
        model = _torch_sdpa_mha(cfg)
    elif name == "torch-mha":
        mha = torch.nn.MultiheadAttention(cfg.d_model, cfg.num_heads, batch_first=True)

        class SelfAttention(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.mha = mha

            def forward(self, x):
                return self.mha(x, x, x, need_weights=False)[0]

        model = SelfAttention()
    else:
        model = torch.nn.TransformerEncoderLayer(
            cfg.d_model, cfg.num_heads, dim_feedforward=cfg.mlp_dim, dropout=0.0,
            activation="gelu", layer_norm_eps=1e-5, batch_first=True, norm_first=True,
        )
    return harness.torch_module_prepared(model, _inputs(cfg), backward=cfg.backward,
                                         output=output)


def _builder(name: str, cfg: Config):
    if name == "seqjax":
        return lambda: seqjax_peer(cfg)
    if name == "flax":
        return lambda: flax_peer(cfg)
    return lambda: torch_peer(name, cfg)


# ----------------------------------------------------------------------------- driver


def run(
    kinds: Sequence[str] = KINDS,
    lengths: Sequence[int] = LENGTHS,
    *,
    tokens: int = 8192,
    d_model: int = 256,
    num_heads: int = 4,
    modes: Sequence[bool] = (True, False),
    use_torch: bool = True,
    repeats: int = 7,
    warmup: int = 2,
    min_sample_s: float = 0.2,
    log=None,
) -> list[harness.Result]:
    """Time every (kind, T, mode) row; peers alternate within each row.

    ``modes``: ``True`` = forward+backward, ``False`` = forward only.
    """
    results: list[harness.Result] = []
    for kind in kinds:
        for t in lengths:
            batch = max(1, tokens // t)
            for backward in modes:
                cfg = Config(kind, batch, t, d_model, num_heads, backward)
                names = [p for p in PEERS[kind] if use_torch or not p.startswith("torch")]
                peers = [harness.Peer(n, _builder(n, cfg)) for n in names]
                results += harness.run_row(
                    cfg.label, peers, cfg.tokens, repeats=repeats, warmup=warmup,
                    min_sample_s=min_sample_s, log=log,
                )
    return results


def summary_table(results: Sequence[harness.Result]) -> str:
    """One line per row: tokens/s of every peer, and seqjax ÷ the fastest other peer."""
    return harness.ratio_summary(results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench attention",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes, 2 repeats, mha fwd+bwd and block fwd only: every peer "
                         "in seconds")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma list of mha,block")
    ap.add_argument("--lengths", default=None, help="comma list of T (default 128,512,2048)")
    ap.add_argument("--tokens", type=int, default=8192, help="B*T per call (B = tokens // T)")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-forward", action="store_true", help="skip the forward-only rows")
    harness.add_common_args(ap)
    args = ap.parse_args(argv)

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for k in kinds:
        if k not in KINDS:
            ap.error(f"--kinds: unknown kind {k!r}; choose from {KINDS}")
    if args.lengths:
        lengths = [int(t) for t in args.lengths.split(",")]
    else:
        lengths = list(SMOKE_LENGTHS if args.smoke else LENGTHS)
    tokens = 4 * max(lengths) if args.smoke and args.tokens == 8192 else args.tokens
    d_model, heads = (16, 2) if args.smoke else (args.d_model, args.heads)
    use_torch = not args.no_torch
    if use_torch and not harness.torch_available():
        print("torch not installed: skipping the torch peers", file=sys.stderr)
        use_torch = False
    harness.configure_threads(args.threads)
    log = None if args.quiet or args.smoke else (lambda s: print(s, file=sys.stderr, flush=True))

    timing = dict(repeats=2 if args.smoke else args.repeats, warmup=1 if args.smoke else 2,
                  min_sample_s=0.0 if args.smoke else 0.2, log=log)
    common = dict(tokens=tokens, d_model=d_model, num_heads=heads, use_torch=use_torch)
    if args.smoke and args.kinds == ",".join(KINDS):
        # Every peer and both modes, with the fewest compilations.
        results = run(["mha"], lengths, modes=(True,), **common, **timing)
        results += run(["block"], lengths, modes=(False,), **common, **timing)
    else:
        modes = (True,) if args.no_forward else (True, False)
        results = run(kinds, lengths, modes=modes, **common, **timing)
    harness.emit_report("Attention and pre-norm block: tokens/s (higher is better)",
                        "attention", argv, summary_table(results), results, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

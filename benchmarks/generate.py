"""GPT generation tokens/s: KV-cache decoding vs recomputation, seqjax vs torch (CPU, fp32).

The model is the GPT of :mod:`benchmarks.gpt` (nanoGPT's CPU config: 4 layers, 4
heads, d = 128, block 64, |V| = 65; random initialisation, fixed seeds). One call
generates ``N`` new tokens (default 48) after a prompt of ``P`` random tokens
(default 16; ``P + N ≤ 64``) for a batch of ``B`` rows, by ancestral sampling at
temperature 1 (nanoGPT's ``generate``: softmax of the last logits, one draw per
row; no top-k, no end token, so every row makes all ``N`` tokens). Counted: the
``B·N`` generated tokens; the prompt's processing is part of every call. Peers:

* ``seqjax-kv``: :func:`seqjax.decoding.sample` on :class:`seqjax.models.gpt.TransformerLM`
  — prefill of the prompt into per-layer KV caches of ``P + N`` slots, then one
  token per step (``lax.while_loop``), the whole call one ``jax.jit``.
* ``seqjax-recompute``: the same :func:`~seqjax.decoding.sample` loop over
  :func:`seqjax.decoding.recompute_decoder` — every step runs the full causal
  forward pass over a fixed ``[B, P + N]`` token buffer (the prefix so far, padded
  on the right; causality keeps the padding invisible) and reads the logits at the
  current position: one compiled shape, ``P + N`` positions per step.
* ``torch-nanogpt``: nanoGPT's ``generate`` loop in eager torch — each step crops
  the context to the block size, runs the model over the whole growing prefix
  (``P + n`` positions at step ``n``), applies the head to the last position only,
  and draws with ``torch.multinomial``.
* ``torch-kv``: the same torch model with a KV cache (keys and values concatenated
  per layer; one prompt pass, then one position per step).

Run: ``python -m benchmarks generate`` (or ``seqjax bench generate``); ``--smoke``
runs a tiny model in seconds; ``--out FILE`` writes the markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.gpt import SMOKE, GPTShape, parse_peers, seqjax_model, torch_gpt

PEERS = ("seqjax-kv", "seqjax-recompute", "torch-nanogpt", "torch-kv")
BATCHES = (1, 12)


@dataclasses.dataclass(frozen=True)
class GenConfig:
    shape: GPTShape
    batch: int
    prompt: int
    new_tokens: int

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens

    @property
    def label(self) -> str:
        s = self.shape
        return (f"GPT {s.num_layers}L/{s.num_heads}H/{s.embed_dim} generate B={self.batch} "
                f"P={self.prompt} N={self.new_tokens}")


def prompt_tokens(cfg: GenConfig, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.shape.vocab_size, (cfg.batch, cfg.prompt), dtype=np.int32)


# ----------------------------------------------------------------------------- seqjax peers


_MODELS: dict[GPTShape, tuple[Any, Any]] = {}


def _model_and_params(shape: GPTShape) -> tuple[Any, Any]:
    """The seqjax model and its parameters (initialised once per shape)."""
    import jax
    import jax.numpy as jnp

    if shape not in _MODELS:
        model = seqjax_model(shape)
        x = jnp.zeros((1, shape.block_size), jnp.int32)
        _MODELS[shape] = (model, jax.jit(model.init)(jax.random.PRNGKey(0), x))
    return _MODELS[shape]


def _logits(model: Any, params: Any, tokens_BxL: Any) -> Any:
    return model.apply(params, tokens_BxL)


@functools.cache
def _recompute(model: Any) -> Any:
    """One hashable ``logits_fn`` (hence one compiled loop) per model."""
    from seqjax.decoding import recompute_decoder

    return recompute_decoder(functools.partial(_logits, model))


def seqjax_peer(cfg: GenConfig, recompute: bool) -> harness.Prepared:
    import jax

    from seqjax.decoding import sample

    model, params = _model_and_params(cfg.shape)
    decoder = _recompute(model) if recompute else model

    def generate(params: Any, prompt_BxP: Any, key: Any) -> Any:
        return sample(decoder, params, prompt_BxP, key=key, max_new_tokens=cfg.new_tokens,
                      temperature=1.0).tokens

    prompt = jax.numpy.asarray(prompt_tokens(cfg))
    return harness.jax_prepared(generate, params, prompt, jax.random.PRNGKey(1))


# ----------------------------------------------------------------------------- torch peers


_TORCH_MODELS: dict[GPTShape, Any] = {}


def _torch_model(shape: GPTShape) -> Any:
    import torch

    if shape not in _TORCH_MODELS:
        torch.manual_seed(0)
        _TORCH_MODELS[shape] = torch_gpt(shape).eval()
    return _TORCH_MODELS[shape]


def torch_peer(cfg: GenConfig, kv_cache: bool) -> harness.Prepared:
    import torch

    model = _torch_model(cfg.shape)
    block = cfg.shape.block_size
    prompt = torch.from_numpy(prompt_tokens(cfg).astype(np.int64))
    gen = torch.Generator().manual_seed(1)

    def draw(logits_Bx1xV: Any) -> Any:
        probs = torch.softmax(logits_Bx1xV[:, -1, :], dim=-1)  # temperature 1
        return torch.multinomial(probs, num_samples=1, generator=gen)

    @torch.inference_mode()
    def recompute() -> Any:
        idx = prompt
        for _ in range(cfg.new_tokens):
            idx_cond = idx if idx.shape[1] <= block else idx[:, -block:]
            idx = torch.cat([idx, draw(model(idx_cond, last_only=True))], dim=1)
        return idx

    @torch.inference_mode()
    def cached() -> Any:
        cache: list = []
        nxt = draw(model(prompt, cache=cache, last_only=True))
        out = [nxt]
        for n in range(1, cfg.new_tokens):
            nxt = draw(model(nxt, cache=cache, start=cfg.prompt + n - 1))
            out.append(nxt)
        return torch.cat([prompt] + out, dim=1)

    return harness.eager_prepared(cached if kv_cache else recompute)


def _builder(name: str, cfg: GenConfig):
    if name.startswith("seqjax"):
        return lambda: seqjax_peer(cfg, recompute=name == "seqjax-recompute")
    return lambda: torch_peer(cfg, kv_cache=name == "torch-kv")


# ----------------------------------------------------------------------------- driver


def run(
    shape: GPTShape,
    batches: Sequence[int] = BATCHES,
    peers: Sequence[str] = PEERS,
    *,
    prompt: int = 16,
    new_tokens: int = 48,
    repeats: int = 7,
    warmup: int = 2,
    min_sample_s: float = 0.2,
    log=None,
) -> list[harness.Result]:
    """One row per batch size; peers alternate within each row."""
    if prompt + new_tokens > shape.block_size:
        raise ValueError(f"prompt + new_tokens = {prompt + new_tokens} exceeds the block size "
                         f"{shape.block_size}.")
    results: list[harness.Result] = []
    for b in batches:
        cfg = GenConfig(shape, b, prompt, new_tokens)
        row_peers = [harness.Peer(n, _builder(n, cfg)) for n in peers]
        results += harness.run_row(cfg.label, row_peers, cfg.tokens, repeats=repeats,
                                   warmup=warmup, min_sample_s=min_sample_s, log=log)
    _MODELS.clear()
    _TORCH_MODELS.clear()
    return results


def summary_table(results: Sequence[harness.Result]) -> str:
    """Per row: tokens/s of every peer; seqjax-kv ÷ the fastest non-seqjax peer and ÷ recompute."""
    rows, peers = harness.by_row(results)
    headers = (["row"] + [f"{p} tok/s" for p in peers]
               + ["fastest torch peer", "seqjax-kv ÷ fastest", "kv ÷ recompute (seqjax)"])
    lines = []
    for row, res in rows.items():
        rate = {p: r.tokens_per_s for p, r in res.items()}
        others = {p: v for p, v in rate.items() if not p.startswith("seqjax")}
        best = max(others, key=others.get) if others else None
        kv = rate.get("seqjax-kv")
        ratio = f"{kv / others[best]:.2f}×" if best and kv else "–"
        speedup = (f"{kv / rate['seqjax-recompute']:.2f}×"
                   if kv and "seqjax-recompute" in rate else "–")
        lines.append([row] + [harness.format_rate(rate[p]) if p in rate else "–" for p in peers]
                     + [best or "–", ratio, speedup])
    return harness.markdown_table(headers, lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench generate",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="a 2-layer d=32 model, B=2, P=4, N=8, 2 repeats: every peer in seconds")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma list of " + ",".join(PEERS))
    ap.add_argument("--batches", default=None, help="comma list of B (default 1,12)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt length P")
    ap.add_argument("--new-tokens", type=int, default=48, help="generated tokens N")
    harness.add_common_args(ap)
    args = ap.parse_args(argv)

    peers = parse_peers(ap, args.peers, PEERS)
    if args.smoke:
        shape, batches, prompt, new_tokens = SMOKE, [2], 4, 8
    else:
        shape, prompt, new_tokens = GPTShape(), args.prompt, args.new_tokens
        batches = [int(b) for b in args.batches.split(",")] if args.batches else list(BATCHES)
    if prompt < 1 or new_tokens < 1 or prompt + new_tokens > shape.block_size:
        ap.error(f"need P >= 1, N >= 1 and P + N <= {shape.block_size}; "
                 f"got P={prompt}, N={new_tokens}")
    harness.configure_threads(args.threads)
    log = None if args.quiet or args.smoke else (lambda s: print(s, file=sys.stderr, flush=True))
    results = run(shape, batches, peers, prompt=prompt, new_tokens=new_tokens,
                  repeats=2 if args.smoke else args.repeats, warmup=1 if args.smoke else 2,
                  min_sample_s=0.0 if args.smoke else 0.2, log=log)
    harness.emit_report(
        "GPT generation (nanoGPT CPU config): generated tokens/s (higher is better)",
        "generate", argv, summary_table(results), results, out=args.out,
        notes=[f"Prompt P = {prompt} tokens, N = {new_tokens} new tokens per row, sampling at "
               "temperature 1; tokens/s counts the B·N generated tokens (prompt processing "
               "included in the time)."],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

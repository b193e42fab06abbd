"""nanoGPT's ``train.py`` training loop for the char-level Shakespeare model, in torch, timed.

Where ``python -m benchmarks gpt`` times one optimiser step on a fixed batch, this runs the
whole loop of nanoGPT's ``train.py`` end to end around the same torch model
(:func:`benchmarks.gpt.torch_gpt`, with dropout) and reports its speed. Per iteration,
as ``train.py`` does with ``gradient_accumulation_steps = 1``:

1. the learning rate of every parameter group is set from the schedule (:func:`get_lr`:
   linear warm-up, then cosine decay to ``min_lr`` at ``lr_decay_iters``);
2. forward and mean next-token cross-entropy, under ``torch.autocast("cuda",
   dtype=torch.bfloat16)`` on CUDA (fp32 on the CPU);
3. the next batch is sampled right after the forward (the prefetch of ``train.py``):
   ``batch_size`` random windows of ``block_size + 1`` tokens of the training split,
   ``torch.from_numpy`` of ``int64`` copies and, on CUDA, ``pin_memory().to(device,
   non_blocking=True)`` so the copy overlaps the backward pass;
4. backward, ``clip_grad_norm_(1.0)``, ``optimizer.step()`` (nanoGPT's AdamW: decay on
   ≥2-D tensors, ``fused=True`` on CUDA), ``zero_grad(set_to_none=True)``;
5. every ``log_interval`` iterations the loss is read with ``.item()`` (the only
   host–device synchronisation of the loop, as in ``train.py``).

Not included: ``train.py``'s evaluation (``estimate_loss`` every 250 iterations) and its
checkpoints. bf16 needs no gradient scaler (``train.py``'s ``GradScaler`` is disabled for
bf16). Seed: ``torch.manual_seed(1337)``, as ``train.py``.

Presets (``--preset``):

* ``gpu``: ``config/train_shakespeare_char.py`` — 6 layers, 6 heads, d = 384, block 256,
  batch 64, dropout 0.2, no biases, lr 1e-3 → 1e-4 (warm-up 100, decay over 5000),
  β₂ = 0.99, weight decay 0.1, log every 10 iterations, ``torch.compile`` on CUDA (not on
  the CPU).
* ``cpu``: the README's CPU command — the same config with 4 layers, 4 heads, d = 128,
  block 64, batch 12, dropout 0, lr decay over 2000, ``--log_interval=1``, no compile.
* ``smoke`` (``--smoke``): 1 layer, d = 16, block 16, batch 4, 5 iterations on the CPU.

Data: tiny Shakespeare (``--data_path``; default ``shared/data/tinyshakespeare.txt`` next to or
inside the checkout), encoded with its sorted character set (65 characters) and split
90/10 as nanoGPT's ``data/shakespeare_char/prepare.py`` does; the loop samples the 90 %
training split. Without a data file (and no ``--data_path``) the tokens are uniformly random
(said in the output; the loss then stays near ln 65).

Timing: the first ``--warmup`` iterations (10; they include ``torch.compile``) are not
timed; ms/iter is the wall time of the remaining iterations divided by their number, with
``torch.cuda.synchronize()`` at both ends. The total wall time (set-up, data, compile, all
iterations) is reported too. The last line printed is
``nanogpt_loop: ms/iter M; steps/s S``.

Run: ``python -m benchmarks nanogpt_loop [--smoke] [--steps N] [--device cpu|cuda]
[--data_path PATH] [--preset gpu|cpu] [--profile]`` (``--profile``: the top operators of a
``torch.profiler`` trace of the whole run); :func:`run_loop` does the same from Python.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import gpt, harness

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_NAME = Path("shared") / "data" / "tinyshakespeare.txt"
RANDOM_VOCAB = 65  # tiny Shakespeare's character count, for the random-token fallback


@dataclasses.dataclass(frozen=True)
class LoopPreset:
    """The model and the optimisation of one nanoGPT configuration (|V| comes from the data)."""

    num_layers: int
    num_heads: int
    embed_dim: int
    block_size: int
    batch: int
    dropout: float
    learning_rate: float
    min_lr: float
    warmup_iters: int
    lr_decay_iters: int
    log_interval: int
    compile: bool  # torch.compile on CUDA (never on the CPU)
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    bias: bool = False

    def shape(self, vocab_size: int) -> gpt.GPTShape:
        return gpt.GPTShape(num_layers=self.num_layers, num_heads=self.num_heads,
                            embed_dim=self.embed_dim, block_size=self.block_size,
                            batch=self.batch, vocab_size=vocab_size, use_bias=self.bias)


PRESETS = {
    # config/train_shakespeare_char.py
    "gpu": LoopPreset(num_layers=6, num_heads=6, embed_dim=384, block_size=256, batch=64,
                      dropout=0.2, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100,
                      lr_decay_iters=5000, log_interval=10, compile=True),
    # README: train_shakespeare_char.py --device=cpu --compile=False --log_interval=1
    # --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
    # --lr_decay_iters=2000 --dropout=0.0
    "cpu": LoopPreset(num_layers=4, num_heads=4, embed_dim=128, block_size=64, batch=12,
                      dropout=0.0, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100,
                      lr_decay_iters=2000, log_interval=1, compile=False),
    # seconds on a CPU; a short warm-up and a higher rate so that a few steps learn
    "smoke": LoopPreset(num_layers=1, num_heads=2, embed_dim=16, block_size=16, batch=4,
                        dropout=0.0, learning_rate=1e-2, min_lr=1e-3, warmup_iters=2,
                        lr_decay_iters=100, log_interval=1, compile=False),
}


def get_lr(it: int, p: LoopPreset) -> float:
    """nanoGPT's schedule at iteration ``it``: linear warm-up over ``warmup_iters``, cosine
    decay from ``learning_rate`` to ``min_lr`` until ``lr_decay_iters``, ``min_lr`` after."""
    if it < p.warmup_iters:
        return p.learning_rate * (it + 1) / (p.warmup_iters + 1)
    if it > p.lr_decay_iters:
        return p.min_lr
    progress = (it - p.warmup_iters) / max(p.lr_decay_iters - p.warmup_iters, 1)
    return p.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (p.learning_rate - p.min_lr)


# ----------------------------------------------------------------------------- data


def default_data_path() -> Path | None:
    """``shared/data/tinyshakespeare.txt`` inside the checkout or beside it, if present."""
    for base in (REPO_ROOT, REPO_ROOT.parent):
        if (base / DATA_NAME).is_file():
            return base / DATA_NAME
    return None


def encode_text(text: str) -> tuple[np.ndarray, int]:
    """Character-level ids ``uint16[len(text)]`` over the sorted character set, and its size."""
    chars = sorted(set(text))
    if not chars or len(chars) > np.iinfo(np.uint16).max:
        raise ValueError(f"need 1 to 65535 distinct characters; got {len(chars)}.")
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    table = np.array([ord(c) for c in chars], dtype=np.uint32)  # sorted by code point
    return np.searchsorted(table, codes).astype(np.uint16), len(chars)


def load_train_tokens(data: str | None, block_size: int) -> tuple[np.ndarray, int, str]:
    """The training split (first 90 %), its vocabulary size, and a description.

    ``data=None``: the default file if it exists, else random tokens (|V| = 65).
    """
    path = Path(data) if data is not None else default_data_path()
    if path is None:
        n = max(100_000, 4 * (block_size + 1))
        tokens = np.random.default_rng(0).integers(0, RANDOM_VOCAB, n, dtype=np.uint16)
        return tokens, RANDOM_VOCAB, (f"random tokens (no data file found at {DATA_NAME}): "
                                      f"{n} ids, |V| = {RANDOM_VOCAB}")
    ids, vocab = encode_text(path.read_text(encoding="utf-8"))
    train = ids[: int(len(ids) * 0.9)]
    if len(train) <= block_size + 1:
        raise ValueError(f"{path}: {len(train)} training tokens, need more than the block "
                         f"size + 1 = {block_size + 1}.")
    return train, vocab, f"{path}: {len(train)} training characters, |V| = {vocab}"


# ----------------------------------------------------------------------------- the loop


def run_loop(
    preset: str,
    steps: int,
    device: str,
    data: str | None,
    warmup: int = 10,
    *,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``steps`` iterations of nanoGPT's training loop; time those after ``warmup``.

    Args:
        preset: ``"gpu"``, ``"cpu"`` or ``"smoke"`` (:data:`PRESETS`).
        steps: iterations in all (warm-up included).
        device: ``"cpu"`` or ``"cuda"``.
        data: a text file (tiny Shakespeare), or ``None`` for the default file or, without
            one, random tokens.
        warmup: untimed first iterations (compilation happens there); at most
            ``steps - 1``, so that at least one iteration is timed.
        log: optional printer of progress lines (the loss every ``log_interval`` steps).

    Returns:
        ``ms_per_iter`` and ``steps_per_s`` (the timed iterations), ``wall_s`` (the whole
        run: set-up, data, compilation, every iteration), ``device``, ``final_loss`` (the
        last iteration's), and ``first_loss``, ``losses`` (``(iteration, loss)`` as logged),
        ``timed_iters``, ``warmup``, ``tokens_per_s``, ``compiled``, ``data``, ``preset``.
    """
    import torch

    t_start = time.perf_counter()
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {tuple(PRESETS)}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda'; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    if steps < 1:
        raise ValueError(f"`steps` must be >= 1; got {steps}")
    warmup = min(max(warmup, 0), steps - 1)
    cfg = PRESETS[preset]
    cuda = device == "cuda"
    say = log or (lambda _s: None)

    train, vocab, data_note = load_train_tokens(data, cfg.block_size)
    shape = cfg.shape(vocab)
    torch.manual_seed(1337)
    if cuda:
        gpt.torch_cuda_setup()  # TF32, as train.py
    model = gpt.torch_gpt(shape, dropout=cfg.dropout).to(device)
    model.train()
    optimizer = gpt.torch_optimizer(model, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                                    weight_decay=cfg.weight_decay)  # fused on CUDA
    loss_fn = gpt.torch_lm_loss(model)
    compiled = cfg.compile and cuda
    if compiled:
        loss_fn = torch.compile(loss_fn)
    autocast = gpt.torch_autocast(device, "bfloat16" if cuda else "float32")
    params = list(model.parameters())
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    say(f"nanogpt_loop: preset {preset} ({shape.num_layers}L/{shape.num_heads}H/"
        f"{shape.embed_dim}, B={shape.batch}, T={shape.block_size}, dropout {cfg.dropout}), "
        f"device {device}, {'bf16 autocast' if cuda else 'fp32'}, "
        f"{'torch.compile' if compiled else 'eager'}, "
        f"{harness.format_rate(sum(p.numel() for p in params))} parameters")
    say(f"nanogpt_loop: data {data_note}")

    offsets = np.arange(cfg.block_size)

    def get_batch() -> tuple[Any, Any]:
        starts = torch.randint(len(train) - cfg.block_size, (cfg.batch,)).numpy()
        rows = starts[:, None] + offsets
        x = torch.from_numpy(train[rows].astype(np.int64))
        y = torch.from_numpy(train[rows + 1].astype(np.int64))
        if cuda:
            return (x.pin_memory().to(device, non_blocking=True),
                    y.pin_memory().to(device, non_blocking=True))
        return x, y

    losses: list[tuple[int, float]] = []
    x, y = get_batch()
    sync()
    t_timed = time.perf_counter()
    loss = None
    for it in range(steps):
        if it == warmup:
            sync()
            t_timed = time.perf_counter()
        lr = get_lr(it, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with autocast():  # bf16 on CUDA, a no-op (fp32) on the CPU
            loss = loss_fn(x, y)
        x, y = get_batch()  # prefetch while the GPU runs the forward
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it % cfg.log_interval == 0:
            lossf = loss.item()
            losses.append((it, lossf))
            say(f"iter {it}: loss {lossf:.4f}, lr {lr:.2e}")
    sync()
    t_end = time.perf_counter()
    final_loss = float(loss.item())
    timed = steps - warmup
    seconds_per_iter = (t_end - t_timed) / timed
    return {
        "ms_per_iter": seconds_per_iter * 1e3,
        "steps_per_s": 1.0 / seconds_per_iter,
        "wall_s": time.perf_counter() - t_start,
        "device": device,
        "final_loss": final_loss,
        "first_loss": losses[0][1] if losses else final_loss,
        "losses": losses,
        "timed_iters": timed,
        "warmup": warmup,
        "tokens_per_s": shape.tokens / seconds_per_iter,
        "compiled": compiled,
        "data": data_note,
        "preset": preset,
    }


# ----------------------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench nanogpt_loop",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="the tiny 'smoke' preset, 5 iterations (2 untimed), CPU: seconds")
    ap.add_argument("--preset", choices=("gpu", "cpu"), default=None,
                    help="gpu: train_shakespeare_char; cpu: the README's CPU run "
                         "(default: gpu on CUDA, cpu otherwise)")
    ap.add_argument("--steps", type=int, default=None,
                    help="iterations in all (default 200; 5 with --smoke)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed first iterations (default 10; 2 with --smoke)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="default: cuda when torch sees one (cpu with --smoke)")
    ap.add_argument("--data_path", default=None,
                    help=f"tiny Shakespeare text (default: {DATA_NAME} in or beside the "
                         "checkout; random tokens without one)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU)")
    ap.add_argument("--quiet", action="store_true", help="no per-iteration loss lines")
    ap.add_argument("--profile", action="store_true",
                    help="run under torch.profiler and print the top operators by self time "
                         "(the timings then include the profiler's overhead)")
    args = ap.parse_args(argv)

    if not harness.torch_available():
        print("nanogpt_loop: torch is not installed", file=sys.stderr)
        return 2
    import torch

    device = args.device or ("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    if args.smoke:
        preset = "smoke"
    else:
        preset = args.preset or ("gpu" if device == "cuda" else "cpu")
    steps = args.steps if args.steps is not None else (5 if args.smoke else 200)
    warmup = args.warmup if args.warmup is not None else (2 if args.smoke else 10)
    if steps < 1:
        ap.error("--steps must be >= 1")
    if args.data_path is not None and not Path(args.data_path).is_file():
        ap.error(f"--data_path: no file {args.data_path}")
    harness.configure_threads(args.threads)

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            res = run_loop(preset, steps, device, args.data_path, warmup,
                           log=None if args.quiet else print)
        sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
        print(f"nanogpt_loop: torch.profiler over all {steps} iterations, by {sort}:")
        print(prof.key_averages().table(sort_by=sort, row_limit=20))
    else:
        res = run_loop(preset, steps, device, args.data_path, warmup,
                       log=None if args.quiet else print)
    if args.quiet:
        print(f"nanogpt_loop: data {res['data']}")
    print(f"nanogpt_loop: preset {preset}, device {res['device']}, {steps} iterations, "
          f"{res['timed_iters']} timed after {res['warmup']} warm-up"
          f"{' (incl. torch.compile)' if res['compiled'] else ''}; wall {res['wall_s']:.3f} s "
          f"(set-up included); final loss {res['final_loss']:.4f}; "
          f"{harness.format_rate(res['tokens_per_s'])} tokens/s")
    print(f"nanogpt_loop: ms/iter {res['ms_per_iter']:.3f}; steps/s {res['steps_per_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tokens per second per host of the shard loader (:class:`seqjax.data.shard_windows.
ShardWindows`), with the page cache warm.

Writes ``--shards`` llm.c shards of ``--tokens`` random GPT-2 ids in all into a temporary
folder (or reads ``--data_path``), opens them (:func:`seqjax.data.shards.open_tokens`: headers
and every id checked once; the time is reported), reads every shard once so the page cache
is warm, then times ``--steps`` global batches of ``--batch`` windows of ``--block + 1``
tokens for each row:

* **read** — this host's rows drawn from ``(seed, step)`` and copied out of the memmaps
  into ``int32`` arrays (what ``fit``'s batch thread does per step);
* **read + place** — the same, then placed on the first local device
  (``jax.device_put``, waited for): the host-to-device copy included;
* **document-aligned** — read with ``align="document"`` (starts at an end-of-text id).

Tokens/s counts the ``batch · block`` training tokens of each batch. The target the
loader is held to: at least 10M tokens/s on a 2-core CPU, twenty times the ~470k tokens/s
one H100 consumes training GPT-2 124M (llm.c). The last line is
``loader: read R tokens/s; read+place P tokens/s``.

Run: ``python -m benchmarks loader [--tokens N] [--shards K] [--batch B] [--block T]
[--steps S] [--data_path DIR] [--smoke]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np

EOT = 50256


def write_random_shards(folder: str, tokens: int, shards: int, seed: int = 0) -> None:
    """``shards`` llm.c shards (and a small validation shard) of random ids below 50257,
    every ~1000th an end-of-text (documents)."""
    from seqjax.data.shards import write_shard

    rng = np.random.default_rng(seed)
    write_shard(os.path.join(folder, "bench_val_000000.bin"),
                rng.integers(0, EOT, 10_000, dtype=np.uint16))
    per = tokens // shards
    for i in range(1, shards + 1):
        ids = rng.integers(0, EOT, per, dtype=np.uint16)
        ids[::1000] = EOT
        write_shard(os.path.join(folder, f"bench_train_{i:06d}.bin"), ids)


def timed(fn: Callable[[int], object], steps: int) -> float:
    """Seconds per call of ``fn(step)`` over ``steps`` calls (after one untimed)."""
    fn(0)
    start = time.perf_counter()
    for s in range(1, steps + 1):
        fn(s)
    return (time.perf_counter() - start) / steps


def measure(data_dir: str, batch: int, block: int, steps: int) -> dict[str, float]:
    import jax

    from seqjax.data.shard_windows import ShardWindows
    from seqjax.data.shards import open_tokens

    start = time.perf_counter()
    data = open_tokens(data_dir, vocab_size=50304)
    opened = time.perf_counter() - start
    for shard in data.train:  # warm the page cache
        int(np.asarray(shard[:: 4096]).sum())
        np.asarray(shard).sum()
    tokens = batch * block
    rows = ShardWindows(data.train, batch, block, seed=0)
    docs = ShardWindows(data.train, batch, block, seed=0, align="document", eot=EOT)
    device = jax.local_devices()[0]

    def place(step: int) -> None:
        b = rows.batch(step)
        jax.block_until_ready(jax.device_put(b, device))

    out = {"open_s": opened, "train_tokens": data.num_tokens("train"),
           "read": tokens / timed(rows.batch, steps),
           "read_place": tokens / timed(place, steps),
           "document": tokens / timed(docs.batch, steps)}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks loader",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=400_000_000,
                    help="training tokens written in all (default 400M: 800 MB)")
    ap.add_argument("--shards", type=int, default=4, help="training shards written")
    ap.add_argument("--batch", type=int, default=64, help="rows per batch (one host's)")
    ap.add_argument("--block", type=int, default=1024, help="tokens per row (T)")
    ap.add_argument("--steps", type=int, default=200, help="batches timed per row")
    ap.add_argument("--data_path", default=None, help="read these shards instead of writing some")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.tokens, args.shards, args.batch, args.block, args.steps = 200_000, 2, 4, 64, 5
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.data_path
        if folder is None:
            folder = tmp
            start = time.perf_counter()
            write_random_shards(folder, args.tokens, args.shards)
            print(f"wrote {args.shards} shards of {args.tokens // args.shards:,} tokens in "
                  f"{time.perf_counter() - start:.1f} s")
        r = measure(folder, args.batch, args.block, args.steps)
    print(f"opened and checked {r['train_tokens']:,} training tokens in {r['open_s']:.2f} s")
    print(f"batch {args.batch} x {args.block} tokens, {args.steps} steps, one host:\n")
    print("| row | tokens/s |\n|---|---:|")
    for key, name in (("read", "read"), ("read_place", "read + place on the device"),
                      ("document", "document-aligned read")):
        print(f"| {name} | {r[key] / 1e6:.1f}M |")
    print(f"\nloader: read {r['read']:.3g} tokens/s; read+place {r['read_place']:.3g} tokens/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

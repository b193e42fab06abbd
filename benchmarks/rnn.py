"""LSTM and GRU throughput: seqjax vs flax.linen vs torch, on CPU, fp32.

Each row times one training-style call: the forward pass over ``[B, T, H]``
inputs (input size = hidden size = ``H``), loss = sum of all outputs, and the
gradients with respect to the parameters *and* the inputs. A forward-only
column times the same layer without gradients (``torch.inference_mode`` for
torch). Peers, all single-layer, unidirectional, batch-first:

* ``seqjax``: ``seqjax.nn.RNN(LSTMCell(H) | GRUCell(H))``;
* ``flax``: ``flax.linen.RNN(OptimizedLSTMCell(H) | GRUCell(H))``;
* ``torch``: ``torch.nn.LSTM | GRU(H, H, batch_first=True)`` with
  ``torch.set_num_threads(2)``;
* ``seqjax-cudnn`` (GPU only, LSTM rows, not in the default ``--peers``):
  ``seqjax.nn.StackedRNN(H, implementation="cudnn")`` — the scan vs cuDNN row of
  issue #9 (``--peers seqjax,seqjax-cudnn``).

Run: ``python -m benchmarks rnn`` (or ``seqjax bench rnn``); ``--smoke`` runs
tiny shapes in a few seconds; ``--out FILE`` also writes the markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

import numpy as np

from benchmarks import harness

SHAPES: tuple[tuple[int, int, int], ...] = ((32, 128, 256), (64, 256, 512))
SMOKE_SHAPES: tuple[tuple[int, int, int], ...] = ((4, 8, 16),)
CELLS = ("lstm", "gru")
PEERS = ("seqjax", "flax", "torch")


@dataclasses.dataclass(frozen=True)
class Config:
    cell: str
    batch: int
    steps: int
    hidden: int
    backward: bool
    unroll: int | None = None

    @property
    def tokens(self) -> int:
        return self.batch * self.steps

    @property
    def label(self) -> str:
        mode = "fwd+bwd" if self.backward else "fwd"
        return f"{self.cell.upper()} B={self.batch} T={self.steps} H={self.hidden} {mode}"


def _inputs(cfg: Config) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.standard_normal((cfg.batch, cfg.steps, cfg.hidden)).astype(np.float32)


# Parameters shared by the fwd and fwd+bwd rows of one (peer, cell, shape).
_PARAMS: dict = {}


def _key(peer: str, cfg: Config) -> tuple:
    return (peer, cfg.cell, cfg.batch, cfg.steps, cfg.hidden)


def seqjax_peer(cfg: Config) -> harness.Prepared:
    from seqjax.nn.cells import GRUCell, LSTMCell
    from seqjax.nn.recurrent import RNN

    cell = LSTMCell(cfg.hidden) if cfg.cell == "lstm" else GRUCell(cfg.hidden)
    module = RNN(cell, unroll=cfg.unroll)
    return harness.jax_module_prepared(module, _inputs(cfg), backward=cfg.backward,
                                       params_cache=_PARAMS, cache_key=_key("seqjax", cfg))


def flax_peer(cfg: Config) -> harness.Prepared:
    import flax.linen as nn

    cell = nn.OptimizedLSTMCell(cfg.hidden) if cfg.cell == "lstm" else nn.GRUCell(cfg.hidden)
    return harness.jax_module_prepared(nn.RNN(cell), _inputs(cfg), backward=cfg.backward,
                                       params_cache=_PARAMS, cache_key=_key("flax", cfg))


def torch_peer(cfg: Config) -> harness.Prepared:
    import torch

    torch.manual_seed(0)
    cls = torch.nn.LSTM if cfg.cell == "lstm" else torch.nn.GRU
    model = cls(cfg.hidden, cfg.hidden, batch_first=True)
    return harness.torch_module_prepared(
        model, _inputs(cfg), backward=cfg.backward, output=lambda r: r[0]
    )


def seqjax_cudnn_peer(cfg: Config) -> harness.Prepared:
    """``StackedRNN(implementation="cudnn")``: one cuDNN call (GPU, LSTM only)."""
    import jax

    from seqjax.nn.recurrent import StackedRNN

    if cfg.cell != "lstm" or jax.default_backend() != "gpu":
        raise ValueError("the seqjax-cudnn peer needs an LSTM row and a GPU backend; got "
                         f"cell {cfg.cell!r} on {jax.default_backend()!r}")
    stack = StackedRNN(cfg.hidden, cell_type="lstm", implementation="cudnn")
    return harness.jax_module_prepared(stack, _inputs(cfg), backward=cfg.backward,
                                       params_cache=_PARAMS, cache_key=_key("cudnn", cfg))


_BUILDERS = {"seqjax": seqjax_peer, "flax": flax_peer, "torch": torch_peer,
             "seqjax-cudnn": seqjax_cudnn_peer}
# Not in the default peers: the LSTM through cuDNN (issue #9 item 4: scan vs cuDNN), GPU only.
OPTIONAL_PEERS = ("seqjax-cudnn",)


def run(
    cells: Sequence[str] = CELLS,
    shapes: Sequence[tuple[int, int, int]] = SHAPES,
    peers: Sequence[str] = PEERS,
    *,
    forward: bool = True,
    unroll: int | None = None,
    repeats: int = 7,
    warmup: int = 2,
    min_sample_s: float = 0.2,
    log=None,
) -> list[harness.Result]:
    """Time every (cell, shape, mode) row; peers alternate within each row."""
    results: list[harness.Result] = []
    modes = (True, False) if forward else (True,)
    for cell in cells:
        for b, t, h in shapes:
            for backward in modes:
                cfg = Config(cell, b, t, h, backward, unroll)
                row_peers = [
                    harness.Peer(name, lambda n=name, c=cfg: _BUILDERS[n](c)) for name in peers
                    if name != "seqjax-cudnn" or cell == "lstm"
                ]
                results += harness.run_row(
                    cfg.label, row_peers, cfg.tokens, repeats=repeats, warmup=warmup,
                    min_sample_s=min_sample_s, log=log,
                )
    _PARAMS.clear()
    return results


def summary_table(results: Sequence[harness.Result]) -> str:
    """One line per (cell, shape): tokens/s of every peer and seqjax ÷ fastest peer.

    The ratio compares seqjax with the fastest *other* peer of the same row.
    """
    by_row, peers = harness.by_row(results)
    keys = list(dict.fromkeys(r.row.rsplit(" ", 1)[0] for r in results))
    headers = ["cell, shape"]
    for mode in ("fwd+bwd", "fwd"):
        if not any(f"{k} {mode}" in by_row for k in keys):
            continue
        headers += [f"{p} {mode} tok/s" for p in peers]
        headers += [f"ratio {mode}"]
    lines = []
    for key in keys:
        line = [key]
        for mode in ("fwd+bwd", "fwd"):
            row = by_row.get(f"{key} {mode}")
            if row is None:
                if any(f"{k} {mode}" in by_row for k in keys):
                    line += ["–"] * (len(peers) + 1)
                continue
            line += [harness.format_rate(row[p].tokens_per_s) if p in row else "–" for p in peers]
            others = [row[p].tokens_per_s for p in peers if p != "seqjax" and p in row]
            if "seqjax" in row and others:
                line.append(f"{row['seqjax'].tokens_per_s / max(others):.2f}×")
            else:
                line.append("–")
        lines.append(line)
    return harness.markdown_table(headers, lines)


def _parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for part in text.split(","):
        dims = part.lower().split("x")
        if len(dims) != 3:
            raise argparse.ArgumentTypeError(f"shape must be BxTxH, got {part!r}")
        shapes.append(tuple(int(d) for d in dims))
    return shapes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench rnn", description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes, LSTM only, 2 repeats: checks every peer in seconds")
    ap.add_argument("--cells", default=None, help="comma list of lstm,gru (default both)")
    ap.add_argument("--shapes", type=_parse_shapes, default=None,
                    help="comma list of BxTxH (default 32x128x256,64x256x512)")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help="comma list of seqjax,flax,torch (and seqjax-cudnn on a GPU)")
    ap.add_argument("--no-forward", action="store_true", help="skip the forward-only rows")
    ap.add_argument("--unroll", type=int, default=None,
                    help="seqjax RNN(unroll=...); default: the layer's own "
                         "(8 for the scan on a GPU, else 1)")
    harness.add_common_args(ap)
    args = ap.parse_args(argv)

    cells_arg = args.cells or ("lstm" if args.smoke else ",".join(CELLS))
    cells = [c.strip() for c in cells_arg.split(",") if c.strip()]
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for c in cells:
        if c not in CELLS:
            ap.error(f"--cells: unknown cell {c!r}; choose from {CELLS}")
    for p in peers:
        if p not in PEERS + OPTIONAL_PEERS:
            ap.error(f"--peers: unknown peer {p!r}; choose from {PEERS + OPTIONAL_PEERS}")
    if "seqjax-cudnn" in peers:
        import jax

        if jax.default_backend() != "gpu":
            ap.error("--peers seqjax-cudnn needs a GPU backend; the default backend is "
                     f"{jax.default_backend()!r}")
    if "torch" in peers and not harness.torch_available():
        print("torch not installed: skipping the torch peer", file=sys.stderr)
        peers.remove("torch")
    shapes = args.shapes or (SMOKE_SHAPES if args.smoke else SHAPES)
    repeats = 2 if args.smoke else args.repeats
    harness.configure_threads(args.threads)
    log = None if args.quiet or args.smoke else (lambda s: print(s, file=sys.stderr, flush=True))

    results = run(
        cells, shapes, peers, forward=not args.no_forward, unroll=args.unroll,
        repeats=repeats, warmup=1 if args.smoke else 2,
        min_sample_s=0.0 if args.smoke else 0.2, log=log,
    )
    harness.emit_report("RNN: forward+backward and forward tokens/s (higher is better)",
                        "rnn", argv, summary_table(results), results, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

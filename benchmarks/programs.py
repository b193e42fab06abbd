"""Fingerprints of the programs the speed benchmarks time: ``python -m benchmarks programs``.

A refactor that leaves every traced program (jaxpr) unchanged cannot change the speed of
what XLA compiles from it. This prints one short hash per benchmarked layer and shape, for
the forward pass and for the gradient, over exactly the modules and shapes of
``benchmarks rnn`` (``seqjax`` peer, LSTM and GRU), ``benchmarks attention`` (MHA and the
pre-norm block, causal, T = 128/512/2048) and ``benchmarks gpt`` (the nanoGPT CPU preset's
loss). Run it in two checkouts and compare the columns: equal hashes mean the same program.

Tracing is abstract (``jax.eval_shape`` parameters, ``jax.make_jaxpr``): nothing runs, so
it takes seconds at any shape. ``--smoke`` traces tiny shapes.

``--compiled`` hashes what XLA compiles instead (the optimised HLO of this machine's
backend, with source locations, the module's name and the instructions' names left out, the
wiring kept): a change that restructures the jaxpr but not the computation (a check staged
as a nested ``jit`` call that XLA inlines and removes) changes the first hashes and leaves
these. It compiles every program: about 20 s on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import re
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from benchmarks import harness


def fingerprint(fn: Callable, *args) -> str:
    """A 12-hex-digit hash of ``fn``'s jaxpr at ``args`` (arrays or ShapeDtypeStructs).

    Object addresses and the names of nested jitted functions (``name=``, ``jaxpr=``,
    ``let NAME =``: a renamed Python function, not a different computation) are removed
    first, so the hash depends only on the operations and their shapes.
    """
    text = str(jax.make_jaxpr(fn)(*args))
    text = re.sub(r"0x[0-9a-f]+|\b(name|jaxpr)=[A-Za-z_]\w*|^let \w+ =", "", text, flags=re.M)
    text = " ".join(text.split())  # the printer wraps lines by the names' lengths
    return hashlib.sha256(text.encode()).hexdigest()[:12]


_SOURCE_TABLES = re.compile(r"^(FileNames|FunctionNames|FileLocations|StackFrames)\n.*?\n\n",
                            re.S | re.M)


def compiled_fingerprint(fn: Callable, *args) -> str:
    """A 12-hex-digit hash of the optimised HLO XLA compiles from ``fn`` at ``args``.

    Metadata (source locations), the module's name and the numbers XLA appends to names are
    dropped, and every ``%name`` becomes its order of first appearance, so two programs hash
    alike exactly when they hold the same instructions wired the same way.
    """
    text = jax.jit(fn).lower(*args).compile().as_text()
    text = _SOURCE_TABLES.sub("", re.sub(r", metadata=\{[^}]*\}", "", text))
    text = re.sub(r"^HloModule .*$", "", text, flags=re.M)
    names: dict[str, str] = {}
    text = re.sub(r"%([A-Za-z_][\w.\-]*)",
                  lambda m: "%v" + names.setdefault(m.group(1), str(len(names))), text)
    text = re.sub(r"\b([A-Za-z_]\w*)\.\d+:", r"\1:", text)  # computations' parameters
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _layer_rows(name: str, module, x, hash_fn: Callable) -> list[list[str]]:
    params = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)

    def fwd(p, x):
        return module.apply(p, x)

    def loss(p, x):
        return jnp.sum(module.apply(p, x).astype(jnp.float32) ** 2)

    return [[name, hash_fn(fwd, params, x), hash_fn(jax.grad(loss), params, x)]]


def rows(smoke: bool, compiled: bool = False) -> list[list[str]]:
    """``[program, forward hash, gradient hash]`` for every benchmarked layer and shape: of
    the jaxpr (:func:`fingerprint`), or with ``compiled`` of the optimised HLO
    (:func:`compiled_fingerprint`)."""
    hash_fn = compiled_fingerprint if compiled else fingerprint
    from benchmarks import attention, gpt
    from seqjax.nn import RNN, GRUCell, LSTMCell
    from seqjax.train.losses import make_lm_loss
    from seqjax.train.step import flax_apply_fn

    out: list[list[str]] = []
    rnn_shapes = [(2, 5, 8)] if smoke else [(32, 128, 256), (64, 256, 512)]
    for cell_name, cell in (("LSTM", LSTMCell), ("GRU", GRUCell)):
        for b, t, h in rnn_shapes:
            x = jax.ShapeDtypeStruct((b, t, h), jnp.float32)
            out += _layer_rows(f"{cell_name} B={b} T={t} H={h}", RNN(cell(h)), x, hash_fn)
    d_model, heads, tokens = (16, 2, 32) if smoke else (256, 4, 8192)
    for kind in ("mha", "block"):
        for t in [8] if smoke else [128, 512, 2048]:
            cfg = attention.Config(kind, tokens // t, t, d_model, heads, backward=False)
            x = jax.ShapeDtypeStruct((cfg.batch, t, d_model), jnp.float32)
            out += _layer_rows(cfg.label.rsplit(" ", 1)[0], attention.seqjax_module(cfg), x,
                               hash_fn)
    shape = gpt.SMOKE if smoke else gpt.GPTShape()
    loss = make_lm_loss(flax_apply_fn(gpt.seqjax_model(shape)))
    tokens_BxT = jax.ShapeDtypeStruct((shape.batch, shape.block_size), jnp.int32)
    batch = {"inputs": tokens_BxT, "targets": tokens_BxT}
    params = jax.eval_shape(gpt.seqjax_model(shape).init, jax.random.PRNGKey(0),
                            tokens_BxT)["params"]
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
    out.append([shape.label.replace("train step", "LM loss"),
                hash_fn(lambda p, b, r: loss(p, b, r)[0], params, batch, rng),
                hash_fn(jax.grad(lambda p, b, r: loss(p, b, r)[0]), params, batch, rng)])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks programs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes")
    parser.add_argument("--compiled", action="store_true",
                        help="hash the optimised HLO XLA compiles, not the jaxpr")
    parser.add_argument("--out", help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    table = harness.markdown_table(["program", "forward", "gradient"],
                                   rows(args.smoke, args.compiled))
    print(table)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(table + "\n")
    return 0

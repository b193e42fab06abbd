"""Where a GPT train step's time goes: seqjax's compiled step by operation group, beside
nanoGPT's step under ``torch.profiler``, and what the compiled program holds.

The step is the one of ``python -m benchmarks gpt`` (forward, mean next-token
cross-entropy, backward, clipping and AdamW; ``--preset gpt2-small``: GPT-2 124M, |V| =
50304, bf16 compute with float32 parameters). Three readings:

* **the program** — from the compiled HLO: the attention kernels it calls (cuDNN flash
  attention is a ``custom-call`` to ``__cudnn$fmha…``), and how many buffers of the logits'
  size ``[B·T, V]`` it materialises, by dtype (a float32 one is 4 bytes per logit: 2.5 GB
  per copy at B = 12, T = 1024);
* **seqjax by group** — a ``jax.profiler`` trace of ``--calls`` steps (on a GPU with XLA's
  command buffers off, :data:`NO_COMMAND_BUFFERS`, so that each kernel names its
  instruction); each device event is mapped to its HLO instruction (or its fusion's
  computation) and that instruction's ``op_name`` (the JAX name stack:
  the Flax module path, ``jvp``/``transpose`` for forward/backward) puts it in one group:
  the attention core, the logits and their loss, the other matmuls, the optimizer update
  (everything outside the gradient), and the rest (norms, GELU, residuals, embeddings);
* **torch by operator** — ``torch.profiler`` over the same number of nanoGPT steps (the
  CUDA peer of ``benchmarks gpt``: ``torch.compile``, fused AdamW, bf16 autocast), device
  time per operator/kernel (self CPU time on the CPU).

Run: ``python -m benchmarks gpt_profile [--preset gpt2-small] [--batch 12] [--calls 5]``;
``--smoke`` runs a 1-layer model on any backend.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from benchmarks import gpt, harness

GROUPS = ("attention core", "logits and loss", "other matmuls", "optimizer update",
          "norms, GELU, residual, embeddings")


def _computations(hlo: str) -> dict[str, str]:
    return dict(re.findall(r"^(?:ENTRY )?%(\S+) [^\n]*\{\n(.*?)\n\}", hlo, re.S | re.M))


def instructions(hlo: str) -> dict[str, tuple[str, str, str]]:
    """HLO instruction name → ``(opcode, result shape, op_name)`` for every instruction, and
    each fusion's computation name (``calls=%fused_…``) → its fusion's: a GPU trace may name
    a kernel by either (jax-ml/jax#31995 shows the computation's)."""
    out = {}
    for name, shape, op, rest in re.findall(
            r"^\s*(?:ROOT )?%(\S+) = (\(.*?\)|\S+) ([a-z-]+)\((.*)$", hlo, re.M):
        op_name = re.search(r'op_name="([^"]*)"', rest)
        target = re.search(r'custom_call_target="([^"]*)"', rest)
        out[name] = (op if target is None else f"custom-call:{target.group(1)}", shape,
                     op_name.group(1) if op_name else "")
        callee = re.search(r"calls=%([^,\s}]+)", rest)
        if op == "fusion" and callee:
            out.setdefault(callee.group(1), out[name])
    return out


#: XLA's GPU command buffers run a stretch of kernels as one graph, and the trace then loses
#: which HLO instruction each kernel is (openxla/xprof#3070): the profile's process turns
#: them off, so its step by group is of a run without them (the other readings are not).
NO_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer="


def _without_command_buffers() -> bool:
    """Add :data:`NO_COMMAND_BUFFERS` to ``XLA_FLAGS`` if JAX has not started (it reads the
    flags once); True when the flag is in effect."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_enable_command_buffer" in flags:
        return NO_COMMAND_BUFFERS in flags.split()
    if "jax" in sys.modules:
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {NO_COMMAND_BUFFERS}".strip()
    return True


def logits_buffers(hlo: str, tokens: int, vocab: int) -> dict[str, int]:
    """dtype → how many instructions outside fused computations (each a buffer XLA
    materialises) produce an array of ``tokens × vocab`` elements ending in ``vocab``."""
    comps = _computations(hlo)
    fused = set(re.findall(r"calls=%([^,\s}]+)", hlo)) | set(
        re.findall(r"to_apply=%([^,\s}]+)", hlo))
    counts: dict[str, int] = {}
    for name, body in comps.items():
        if name in fused:
            continue
        for shape in re.findall(r"^\s*(?:ROOT )?%\S+ = (\(.*?\)|\S+) ", body, re.M):
            for dtype, dims in re.findall(r"(\w+)\[([\d,]+)\]", shape):
                d = [int(x) for x in dims.split(",")]
                n = 1
                for x in d:
                    n *= x
                if d[-1] == vocab and n == tokens * vocab:
                    counts[dtype] = counts.get(dtype, 0) + 1
    return counts


def attention_kernels(hlo: str) -> dict[str, int]:
    """Custom-call target → count, for the attention kernels (cuDNN fmha, Pallas/Triton)."""
    counts: dict[str, int] = {}
    for target in re.findall(r'custom_call_target="([^"]*)"', hlo):
        if re.search(r"fmha|flash|attention|triton|mosaic", target, re.I):
            counts[target] = counts.get(target, 0) + 1
    return counts


def group_of(opcode: str, shape: str, op_name: str, vocab: int) -> str:
    """One of :data:`GROUPS` for an instruction (see the module docstring)."""
    if "jvp(" not in op_name and "transpose(" not in op_name:
        return GROUPS[3]  # outside value_and_grad: clipping and AdamW
    if "fmha" in opcode or re.search(r"_attention\)|_attend/jit\(|cudnn_attention", op_name):
        return GROUPS[0]
    if "_head" in op_name or "cross_entropy" in op_name or "take_along_axis" in op_name or (
            "TransformerLM" not in op_name) or re.search(rf"\b{vocab}\]", shape):
        return GROUPS[1]
    if "dot" in opcode or "gemm" in opcode or "matmul" in opcode or "dot_general" in op_name:
        return GROUPS[2]
    return GROUPS[4]


def program_facts(hlo: str, shape: gpt.GPTShape) -> dict[str, Any]:
    return {"logits": logits_buffers(hlo, shape.tokens, shape.vocab_size),
            "attention": attention_kernels(hlo)}


def seqjax_profile(shape: gpt.GPTShape, compute_dtype: str, calls: int,
                   hlo_only: bool = False) -> dict[str, Any]:
    import jax

    compiled, state, batch, _ = gpt.seqjax_compiled_step(shape, compute_dtype)
    hlo = compiled.as_text()
    if hlo_only:
        return {"hlo": hlo, "groups": {}, **program_facts(hlo, shape)}
    holder = {"state": state}

    def step() -> Any:
        holder["state"], metrics = compiled(holder["state"], batch)
        return metrics["loss"]

    for _ in range(3):
        jax.block_until_ready(step())
    info = instructions(hlo)
    events = harness.trace_events(lambda: step(), (), calls)
    groups = dict.fromkeys(GROUPS, 0.0)
    unmatched: dict[str, float] = {}
    for e in events:
        args = e.get("args", {})
        name = args.get("hlo_op") or e["name"]
        if name not in info:
            if args.get("hlo_op"):
                unmatched[name] = unmatched.get(name, 0.0) + e["dur"]
            continue
        groups[group_of(*info[name], shape.vocab_size)] += e["dur"] / calls / 1e3
    # The longest unmatched ops beside a few of the program's names: what to compare when a
    # JAX release names its trace events differently (jax 0.11.2's GPU trace matched none).
    longest = sorted(unmatched, key=unmatched.__getitem__, reverse=True)[:8]
    return {"hlo": hlo, "groups": groups, "unmatched_ms": sum(unmatched.values()) / calls / 1e3,
            "unmatched_ops": longest, "program_ops": sorted(info)[:8],
            "events": len(events), **program_facts(hlo, shape)}


def torch_profile(shape: gpt.GPTShape, compute_dtype: str, calls: int,
                  top: int) -> list[list[str]]:
    """nanoGPT's step (the torch peer of ``benchmarks gpt``) under ``torch.profiler``: the
    ``top`` operators by device time per call (self CPU time without CUDA)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    step = gpt.torch_peer(shape, compute_dtype).step
    for _ in range(3):
        step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(calls):
            step()

    def self_time(a: Any) -> float:
        return (getattr(a, "self_device_time_total", None) or getattr(
            a, "self_cuda_time_total", 0.0)) if cuda else a.self_cpu_time_total

    averages = sorted(prof.key_averages(), key=lambda a: -self_time(a))
    return [[a.key[:80], f"{self_time(a) / calls / 1e3:.2f}", f"{a.count // calls}"]
            for a in averages[:top] if self_time(a) > 0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks gpt_profile",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=("gpt2-small", "nanogpt-cpu"), default=None,
                    help="default: gpt2-small on an accelerator, nanogpt-cpu on the CPU")
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                    help="default: bfloat16 on an accelerator, float32 on the CPU")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--top", type=int, default=15, help="torch operators listed")
    ap.add_argument("--peers", default="seqjax,torch-nanogpt")
    ap.add_argument("--hlo-only", action="store_true",
                    help="only compile the seqjax step and read its program (no profile)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    no_command_buffers = _without_command_buffers()
    import jax

    accelerator = jax.default_backend() != "cpu"
    preset = args.preset or ("gpt2-small" if accelerator else "nanogpt-cpu")
    dtype = args.dtype or ("bfloat16" if accelerator else "float32")
    if args.smoke:
        shape = gpt.SMOKE
    elif preset == "gpt2-small":
        shape = gpt.GPTShape(num_layers=12, num_heads=12, embed_dim=768, block_size=1024,
                             batch=args.batch, vocab_size=50304, use_bias=True)
    else:
        shape = gpt.GPTShape(batch=args.batch)
    peers = [p for p in args.peers.split(",") if p]
    parts = [f"Shape: {shape.label}, |V| = {shape.vocab_size}, {dtype} compute, "
             f"{args.calls} profiled steps."]
    if args.hlo_only:
        peers = ["seqjax"]
    if "seqjax" in peers:
        prof = seqjax_profile(shape, dtype, args.calls, hlo_only=args.hlo_only)
        total = sum(prof["groups"].values())
        rows = [[g, f"{ms:.2f}", f"{ms / total:.0%}" if total else "-"]
                for g, ms in prof["groups"].items()]
        rows.append(["total (device events)", f"{total:.2f}", ""])
        logits = ", ".join(f"{n} × {d}" for d, n in sorted(prof["logits"].items())) or "none"
        attention = ", ".join(f"{n} × `{t}`" for t, n in prof["attention"].items()) or (
            "none (no fused attention kernel: XLA's own)")
        parts += [
            f"The compiled step: buffers of the logits' size [{shape.tokens}, "
            f"{shape.vocab_size}] materialised: {logits}; attention kernels: {attention}."]
        if not args.hlo_only and not total:
            parts += [f"seqjax (`jax.profiler`): no trace event matched an instruction of the "
                      f"program ({prof['events']} events read; unmatched "
                      f"{prof['unmatched_ms']:.2f} ms per step): unmeasured. The longest "
                      f"unmatched `hlo_op`s: {prof['unmatched_ops']}; some of the program's "
                      f"instructions: {prof['program_ops']}."]
        elif not args.hlo_only:
            buffers = ("" if jax.default_backend() != "gpu" else
                       "; XLA's command buffers off" if no_command_buffers else
                       "; XLA's command buffers as XLA_FLAGS set them")
            parts += [f"seqjax (`jax.profiler`, ms per step by group{buffers}):",
                      harness.markdown_table(["group", "ms / step", "share"], rows)]
    if "torch-nanogpt" in peers and harness.torch_available():
        rows = torch_profile(shape, dtype, args.calls, args.top)
        parts += ["nanoGPT's step (`torch.profiler`, self device ms per step; CPU ms on the "
                  "CPU):", harness.markdown_table(["operator / kernel", "ms / step", "calls"],
                                                   rows)]
    harness.emit_report("GPT train step: where the time goes", "gpt_profile", argv,
                        "\n\n".join(parts), [], out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

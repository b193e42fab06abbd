"""Token efficiency of the modern GPT (``seqjax train gpt2 --preset modern_cpu``: Muon, rotary
positions, QK-norm, ReLU², RMSNorm, zero-initialised residual projections, an untied head, a
logit soft-cap) beside nanoGPT's own ``train.py`` (AdamW GPT-2) and seqjax's ``cpu`` preset
(the same GPT-2 as nanoGPT), on the same GPT-2-BPE Tiny Shakespeare bins, 3 seeds a side, every
figure from one run.

The bins, nanoGPT's checkout and its runs are :mod:`benchmarks.nanogpt_gpt2`'s (its
``data/shakespeare/prepare.py`` on the corpus, its unmodified ``train.py`` at the ``cpu``
preset's shape, 500 steps, seeds through a copy whose seed line adds the seed). Runs are
sequential, one at a time, the sides alternating per seed.

Figures:

* **target** — nanoGPT's mean final validation loss (its ``step 500`` evaluation: the mean
  of ``eval_iters`` random val batches).
* **steps to target** — the first evaluation step of a seqjax run whose validation loss (every
  val window in order, the recipe's evaluation) is at or below the target; ``modern_cpu``
  evaluates every ``--eval_every`` steps (50). A run that never reaches it is ``> 500``. The
  target: ``modern_cpu`` within 0.6 × nanoGPT's 500 steps.
* **final val** — each side's validation loss after 500 steps.
* **ms/step** — the steady step of the ``cpu`` and ``modern_cpu`` presets in short runs
  (``--timing_steps``, 60) that do not evaluate on the way, one pair per seed:
  :func:`benchmarks.nanogpt_gpt2.parse_seqjax_workdir`'s time from the first record (step
  10, after the compiling call) to the last over the steps between. The ratio
  ``modern_cpu ÷ cpu`` is Muon's Newton–Schulz iterations, the untied head and its AdamW
  and the soft-cap on this CPU (target ≤ 1.15).
* **ablation** — ``modern_cpu`` and ``modern_cpu`` with one switch put back to GPT-2's
  (:data:`ABLATIONS`), one seed, in shorter runs (``--ablation_steps`` 200, warm-up 40,
  evaluated every 50): steps to the target and the val loss at the end, so a reader sees
  what each part buys here.

Run: ``python -m benchmarks modern_gpt --nanogpt_dir DIR [--seeds 0,1,2] [--ablation_seeds 0]
[--keep FOLDER] [--out FILE]``; ``--smoke``: tiny shapes, 4 steps, 1 seed, no ablation (a
skip line without nanoGPT or a rank file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, nanogpt_gpt2, nanogpt_loop

#: ``modern_cpu`` with one switch put back to GPT-2's: (name, overrides; the network's options
#: are the group ``--model.KEY``).
ABLATIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("AdamW, not Muon (lr 1e-3, β₁ 0.9, as the cpu preset)",
     {"optimizer": "adamw", "learning_rate": 1e-3, "beta1": 0.9, "weight_decay": 0.1}),
    ("learned positions, not RoPE", {"model.positions": "learned"}),
    ("no QK-norm", {"model.qk_norm": False}),
    ("GELU, not ReLU²", {"model.activation": "gelu"}),
    ("LayerNorm, not RMSNorm", {"model.norm_type": "layernorm"}),
    ("residual projections at 0.02/√(2L), not 0", {"model.residual_init_std": "none"}),
    ("tied head", {"model.tie_embeddings": True}),
    ("no logit soft-cap", {"model.logit_softcap": 0.0}),
)
STEPS = 500
#: ``--smoke``'s shapes on the seqjax side (nanoGPT's are :data:`benchmarks.nanogpt_gpt2.SMOKE`).
SMOKE_SHAPE: dict[str, Any] = {"model.num_layers": 1, "model.num_heads": 2,
                               "model.embed_dim": 16, "block_size": 16, "batch_size": 8}


def seqjax_command(preset: str, data: str, steps: int, seed: int, workdir: str,
                   extra: dict[str, Any]) -> list[str]:
    """``seqjax train gpt2 --preset P`` as this benchmark runs it (``python -m seqjax.cli``)."""
    return [sys.executable, "-m", "seqjax.cli", "train", "gpt2", "--preset", preset,
            "--data_path", data, "--steps", str(steps), "--seed", str(seed), "--workdir", workdir,
            "--progress", "false", "--sample_tokens", "0",
            *(f"--{k}={v}" for k, v in extra.items())]


def eval_curve(workdir: str | Path) -> list[tuple[int, float]]:
    """``[(step, validation loss)]`` from a work dir's ``metrics.jsonl``."""
    lines = (Path(workdir) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [(r["step"], float(r["eval/loss"])) for r in records if "eval/loss" in r]


def steps_to(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first evaluated step at or below ``target`` (``None``: never)."""
    return next((step for step, loss in curve if loss <= target), None)


def run_seqjax(folder: Path, data: Path, preset: str, steps: int, seed: int, tag: str,
               extra: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """One process; its final val loss, eval curve and (when it did not evaluate on the way)
    its steady ms/step."""
    workdir = folder / f"{tag}_seed{seed}"
    shutil.rmtree(workdir, ignore_errors=True)
    cmd = seqjax_command(preset, str(data), steps, seed, str(workdir), extra)
    wall, _ = nanogpt_gpt2._run_logged(cmd, folder, nanogpt_gpt2.seqjax_env(),
                                       folder / f"{tag}_seed{seed}.log", timeout)
    parsed = nanogpt_gpt2.parse_seqjax_workdir(workdir, steps)
    return {"tag": tag, "seed": seed, "val_loss": parsed["val_loss"], "wall_s": wall,
            "ms_per_step": parsed["ms_per_step"], "curve": eval_curve(workdir),
            "command": nanogpt_gpt2.shown(cmd)}


def read_seqjax(folder: Path, tag: str, seed: int, steps: int) -> dict[str, Any]:
    """A finished seqjax run of a kept folder (``--keep``), as :func:`run_seqjax` returns it."""
    workdir = folder / f"{tag}_seed{seed}"
    parsed = nanogpt_gpt2.parse_seqjax_workdir(workdir, steps)
    return {"tag": tag, "seed": seed, "val_loss": parsed["val_loss"], "wall_s": parsed["wall_s"],
            "ms_per_step": parsed["ms_per_step"], "curve": eval_curve(workdir), "command": ""}


def read_folder(folder: Path, seeds: Sequence[int], ablation_seeds: Sequence[int],
                timing_steps: int, short: int) -> tuple[list, list, list, list, list]:
    """The runs of a kept folder (``--report_only``): the report of a run that was stopped
    after its last complete run, or rendered again. Ablation runs not finished are left out."""
    nano = []
    for seed in seeds:
        text = (folder / "nanogpt_run" / f"nanogpt_seed{seed}.log").read_text()
        parsed = nanogpt_gpt2.parse_nanogpt_log(text, STEPS)
        ms, median = nanogpt_gpt2.nanogpt_step_ms(parsed["iter_ms"], STEPS)
        nano.append(nanogpt_gpt2.RunResult("nanoGPT", seed, parsed["val_loss"], 0.0,
                                           STEPS * ms / 1e3, ms, median, parsed["params"], "", ""))
    curves = [read_seqjax(folder, "modern", s, STEPS) for s in seeds]
    cpu = [read_seqjax(folder, "cpu_timing", s, timing_steps) for s in seeds]
    timing = [read_seqjax(folder, "modern_cpu_timing", s, timing_steps) for s in seeds]
    ablations = []
    for seed in ablation_seeds:
        for i, (name, _) in enumerate((("modern_cpu (all switches)", {}), *ABLATIONS)):
            try:
                ablations.append((name, read_seqjax(folder, f"ablation{i}", seed, short)))
            except (OSError, ValueError):
                continue
    return nano, cpu, curves, timing, ablations


def _mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs)


def report(nano: Sequence[Any], cpu: Sequence[dict], curves: Sequence[dict],
           timing: Sequence[dict], ablations: Sequence[tuple[str, dict]], steps: int,
           short: int, note: str) -> tuple[str, dict[str, Any]]:
    """The markdown summary and its figures."""
    target = _mean([r.val_loss for r in nano])
    reach = [steps_to(r["curve"], target) for r in curves]
    reached = [s for s in reach if s is not None]
    fig = {
        "target": target,
        "modern_steps": reach,
        "modern_steps_mean": _mean(reached) if len(reached) == len(reach) else None,
        "modern_val": _mean([r["val_loss"] for r in curves]),
        "cpu_val": _mean([r["val_loss"] for r in cpu]),
        "cpu_ms": _mean([r["ms_per_step"] for r in cpu]),
        "modern_ms": _mean([r["ms_per_step"] for r in timing]),
    }
    fig["step_fraction"] = (None if fig["modern_steps_mean"] is None
                            else fig["modern_steps_mean"] / steps)
    fig["cost_ratio"] = fig["modern_ms"] / fig["cpu_ms"]

    def vals(rows: Sequence[Any], key: str) -> str:
        xs = [getattr(r, key) if not isinstance(r, dict) else r[key] for r in rows]
        d = 1 if key == "ms_per_step" else 4
        return nanogpt_gpt2.mean_sd(xs, d) + " (" + ", ".join(f"{x:.{d}f}" for x in xs) + ")"

    shown = ", ".join("> " + str(steps) if s is None else str(s) for s in reach)
    lines = [
        note, "",
        "| side | final val loss (mean ± sd; per seed) | steps to nanoGPT's final val | "
        "steady ms/step (per seed) |", "|---|---|---|---|",
        f"| nanoGPT `train.py` (AdamW GPT-2) | {vals(nano, 'val_loss')} | {steps} (its own) | "
        f"{vals(nano, 'ms_per_step')} |",
        f"| seqjax `--preset cpu` (the same GPT-2) | — | — | {vals(cpu, 'ms_per_step')} |",
        f"| seqjax `--preset modern_cpu` | {vals(curves, 'val_loss')} | {shown} | "
        f"{vals(timing, 'ms_per_step')} |", "",
        f"Target {target:.4f} (nanoGPT's mean). modern_cpu reaches it in "
        + ("—" if fig["step_fraction"] is None else f"{fig['step_fraction']:.2f}×")
        + f" nanoGPT's steps (target ≤ 0.6×); its final val is "
        f"{fig['modern_val'] - target:+.4f} from nanoGPT's; its step costs "
        f"{fig['cost_ratio']:.3f}× the cpu preset's (target ≤ 1.15×).",
    ]
    if ablations:
        lines += ["", f"Ablation ({short}-step runs, warm-up {max(1, short // 5)}, seed "
                  f"{ablations[0][1]['seed']}; steps to {target:.4f}, evaluated every "
                  f"{_every(ablations[0][1]['curve'])} steps):", "",
                  f"| run | steps to target | val loss at step {short} |", "|---|---:|---:|"]
        for name, r in ablations:
            lines.append(f"| {name} | {_fmt_steps(steps_to(r['curve'], target), short)} | "
                         f"{r['val_loss']:.4f} |")
    return "\n".join(lines), fig


def _every(curve: Sequence[tuple[int, float]]) -> int:
    return curve[1][0] - curve[0][0] if len(curve) > 1 else curve[0][0]


def _fmt_steps(s: int | None, steps: int) -> str:
    return f"> {steps}" if s is None else str(s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="seqjax bench modern_gpt",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 4 steps, 1 seed")
    ap.add_argument("--nanogpt_dir", default=None, help="a nanoGPT checkout (else $NANOGPT_DIR)")
    ap.add_argument("--data_path", default=None, help="the Tiny Shakespeare text")
    ap.add_argument("--rank_file", default=None, help="GPT-2's gpt2.tiktoken")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--ablation_seeds", default="0", help="'' = no ablation")
    ap.add_argument("--eval_every", type=int, default=50)
    ap.add_argument("--timing_steps", type=int, default=60)
    ap.add_argument("--ablation_steps", type=int, default=200)
    ap.add_argument("--eval_iters", type=int, default=200, help="nanoGPT's, per split")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--keep", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--report_only", default=None,
                    help="no runs: the report of the runs kept in this folder (--keep)")
    args = ap.parse_args(argv)
    import os

    if args.report_only:
        seeds = [int(s) for s in args.seeds.split(",")]
        ab = [int(s) for s in args.ablation_seeds.split(",")] if args.ablation_seeds else []
        runs = read_folder(Path(args.report_only), seeds, ab, args.timing_steps,
                           args.ablation_steps)
        summary, fig = report(*runs, STEPS, args.ablation_steps,
                              f"runs read from {args.report_only}")
        harness.emit_report("modern_gpt", "modern_gpt", argv, summary, [], out=args.out)
        return 0

    threads = args.threads or os.cpu_count() or 1
    setup = nanogpt_gpt2.SMOKE if args.smoke else nanogpt_gpt2.DEFAULT
    setup = nanogpt_gpt2.dataclasses.replace(setup, eval_iters=2 if args.smoke
                                             else args.eval_iters)
    steps = nanogpt_gpt2.SMOKE_STEPS if args.smoke else STEPS
    seeds = [0] if args.smoke else [int(s) for s in args.seeds.split(",")]
    ablation_seeds = [] if args.smoke or not args.ablation_seeds else [
        int(s) for s in args.ablation_seeds.split(",")]
    every = 2 if args.smoke else args.eval_every
    presets = ("smoke", "modern_smoke") if args.smoke else ("cpu", "modern_cpu")
    skip = nanogpt_gpt2._skip if args.smoke else nanogpt_gpt2._fail
    if not harness.torch_available():
        return skip("torch is not installed")
    corpus = Path(args.data_path) if args.data_path else nanogpt_loop.default_data_path()
    if corpus is None and args.smoke:
        corpus = nanogpt_gpt2.FIXTURE
    rank_file = args.rank_file or nanogpt_gpt2.default_rank_file()
    if corpus is None or not corpus.is_file() or rank_file is None:
        return skip(f"need the corpus ({corpus}) and GPT-2's ranks ({rank_file})")
    with contextlib.ExitStack() as stack:
        folder = (Path(args.keep).resolve() if args.keep else
                  Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="modern_gpt_"))))
        folder.mkdir(parents=True, exist_ok=True)
        nanogpt, found = nanogpt_gpt2.locate_nanogpt(args.nanogpt_dir, clone_into=None)
        if nanogpt is None:
            return skip(found)
        run_dir = folder / "nanogpt_run"
        data = nanogpt_gpt2.prepare_run_folder(nanogpt, corpus, rank_file, run_dir)
        note = (f"nanoGPT {nanogpt_gpt2.describe_nanogpt(nanogpt)}; bins: "
                f"{nanogpt_gpt2.sha256(data / 'train.bin')[:16]} / "
                f"{nanogpt_gpt2.sha256(data / 'val.bin')[:16]}; {steps} steps; seqjax "
                f"evaluates modern_cpu every {every} steps; nanoGPT eval_iters "
                f"{setup.eval_iters}")
        nano, cpu, curves, timing = [], [], [], []
        small = SMOKE_SHAPE if args.smoke else {}
        timing_steps = steps if args.smoke else args.timing_steps
        quick = {"eval_every": 0, "log_every": 1 if args.smoke else 10, "val_tokens": 768}
        short = steps if args.smoke else args.ablation_steps
        short_opts = {"eval_every": every, "warmup_steps": max(1, short // 5)}
        for seed in seeds:
            nano.append(nanogpt_gpt2.run_nanogpt(run_dir, setup, steps, seed, threads,
                                                 args.timeout))
            curves.append(run_seqjax(folder, data, presets[1], steps, seed, "modern",
                                     {**small, "eval_every": every}, args.timeout))
            for preset, out in zip(presets, (cpu, timing)):
                out.append(run_seqjax(folder, data, preset, timing_steps, seed,
                                      f"{preset}_timing", {**small, **quick}, args.timeout))
            print(f"modern_gpt: seed {seed}: nanoGPT {nano[-1].val_loss:.4f}, modern "
                  f"{curves[-1]['val_loss']:.4f} (curve {curves[-1]['curve']}); ms/step cpu "
                  f"{cpu[-1]['ms_per_step']:.1f}, modern {timing[-1]['ms_per_step']:.1f}",
                  flush=True)
        ablations = []
        for seed in ablation_seeds:
            for i, (name, extra) in enumerate((("modern_cpu (all switches)", {}),
                                               *ABLATIONS)):
                r = run_seqjax(folder, data, presets[1], short, seed, f"ablation{i}",
                               {**small, **extra, **short_opts}, args.timeout)
                ablations.append((name, r))
                print(f"modern_gpt: ablation {name}: {r['val_loss']:.4f} {r['curve']}",
                      flush=True)
        summary, fig = report(nano, cpu, curves, timing, ablations, steps, short, note)
        commands = ["nanoGPT: " + nanogpt_gpt2.shown(nanogpt_gpt2.nanogpt_command(setup, steps)),
                    "seqjax: " + curves[0]["command"]]
        summary += "\n\nCommands (seed 0):\n\n" + "\n".join(f"    {c}" for c in commands)
    harness.emit_report("modern_gpt", "modern_gpt", argv, summary, [], out=args.out)
    frac = fig["step_fraction"]
    print(f"modern_gpt: steps to nanoGPT's val {'—' if frac is None else f'{frac:.2f}'}×; "
          f"val modern − nanoGPT {fig['modern_val'] - fig['target']:+.4f}; step cost "
          f"{fig['cost_ratio']:.3f}× cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())

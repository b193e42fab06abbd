"""The ``seqjax`` command: argument parsing and exit statuses only.

Commands::

    seqjax train EXPERIMENT [--preset P | --smoke] [--workdir DIR] [--steps N] [--restart]
                 [--key=value ...]
    seqjax eval [EXPERIMENT] --workdir DIR [--key=value ...]
    seqjax generate [EXPERIMENT] --workdir DIR --prompt TEXT [--max_new_tokens N]
                    [--temperature T] [--seed S]
    seqjax export --workdir DIR OUT [--step N] [--force]
    seqjax prepare INPUT... --out DIR [--tokenizer gpt2|hf:PATH|seqjax:PATH]
                   [--format llmc|nanogpt] [--split documents|text] [--val_* N] [--workers N]
                   [--hf_dataset NAME ...]
    seqjax list | bench [BENCHMARK] [...] | --version

``export``: :mod:`seqjax.interop.hf_export` (a folder transformers' ``AutoModelForCausalLM``
and ``AutoTokenizer`` load); ``prepare``: :mod:`seqjax.data.prepare`. The experiment protocol
(configs layered from the work dir's ``experiment.json``, a preset and ``--key=value``
overrides; resuming; ``--restart``; work dirs never poisoned by a refused run) is
:mod:`seqjax.experiments._runner` (its names are re-exported here).

**Every device, every host.** Experiments whose ``Config`` inherits
:class:`seqjax.train.parallel.ParallelOptions` train data parallel on all visible devices and
take ``--mesh data=4,fsdp=2,model=1``, ``--strategy replicated|fsdp|tensor|fsdp+tensor|auto``
and ``--grad_accum K``; ``batch_size`` is the *global* batch. When the environment describes a
multi-process job (``JAX_COORDINATOR_ADDRESS``/``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID``, a TPU
pod slice, SLURM, Open MPI), ``train`` first calls ``jax.distributed.initialize``; process 0
writes the shared files, and ``DIR/run.json`` records the devices, processes and mesh.

**Exit statuses.** 0: done. 1: a NaN/inf loss, or a value check failed under ``--checked``.
2: refused: an unknown key, a value of the wrong type or out of range (``--steps=-5``), an
unknown experiment or preset, a checkpoint that does not fit the model, a work dir whose
checkpoints are all unreadable (``--restart``), a corpus found nowhere (the message says where
:func:`seqjax.data.corpora.resolve_corpus` looked), a missing optional package (the message names
the extra, e.g. ``pip install "seqjax[experiments]"``), or a work dir another run is using (its
host, PID, start time and command named; nothing is written). 3: a write failed (no space, no
permission, an I/O error) for a checkpoint, ``metrics.jsonl``, the summary or another file of the
run: one line names the file, the step, the bytes needed and free, the newest intact checkpoint
and the command that resumes from it once the cause is gone (the failed checkpoint's temporary
folder is removed). 4: the training data failed (the iterator raised, or ran out before the last
step): its traceback, then one line naming the error, the batch's step, the newest intact
checkpoint (the last completed step, saved before stopping) and the command that resumes.
75 (``EX_TEMPFAIL`` of ``sysexits.h``; :data:`seqjax.train.preemption.EXIT_STOPPED`): stopped by
SIGTERM/SIGINT at any point (while opening data, restoring or compiling too) after saving its
checkpoint; the same command resumes it (non-zero so that a shell loop or requeue-on-failure
reruns it; not 128 + N, which means killed without saving). A run killed outright (SIGKILL, a
crash) resumes from its newest finished checkpoint (an unfinished one and records past it are
dropped). ``seqjax export``: 2 when refused (a model GPT-2 cannot hold, a tokenizer without a
Hugging Face class, no such work dir, checkpoint or step, a non-empty ``OUT`` without
``--force``), 3 when a write failed; either way ``OUT`` is left as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import traceback
from collections.abc import Sequence

from jax.experimental.checkify import JaxRuntimeError

import seqjax
from seqjax._optional import extra_for
from seqjax.data.corpora import CorpusNotFoundError
from seqjax.data.shards import ShardError
from seqjax.experiments._config import ConfigError
from seqjax.experiments._runner import (
    EXPERIMENT_FILE,
    build_config,
    check_ranges,
    describe_experiments,
    experiment_from_workdir,
    experiment_help,
    experiment_main,
    list_experiments,
    load_experiment,
    train_experiment,
)
from seqjax.train.checkpoint import CheckpointMismatchError, CheckpointUnreadableError
from seqjax.train.loop import DataIteratorError, ResumeError
from seqjax.train.parallel import LayoutError
from seqjax.train.preemption import EXIT_STOPPED, RunStopped
from seqjax.train.workdir_lock import WorkdirBusyError
from seqjax.train.write_errors import WriteError

__all__ = ["main", "list_experiments", "load_experiment", "build_config", "check_ranges",
           "experiment_main", "EXPERIMENT_FILE", "ConfigError"]


def _checkpoint_step(workdir: str) -> str:
    """Which checkpoint ``seqjax eval`` read (the newest in ``workdir/checkpoints``)."""
    from seqjax.train.checkpoint import Checkpointer

    directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    if not os.path.isdir(directory):
        return f"{workdir} (no checkpoints folder)"
    with Checkpointer(directory, keep=None, async_save=False, read_only=True) as ckpt:
        return f"the checkpoint of step {ckpt.latest_step()} in {directory}"


def _error(message: object, status: int = 2, prefix: str = "error: ") -> int:
    print(f"seqjax: {prefix}{message}", file=sys.stderr)
    return status


def _run(args: argparse.Namespace, rest: list[str]) -> int:
    if args.command == "list":
        for name, summary, presets in describe_experiments():
            print(f"{name:<20} {summary}")
            if presets:
                print(f"{'':<20} presets: {presets}")
        return 0
    if args.command == "train":
        if args.experiment in (None, "-h", "--help"):
            print("usage: seqjax train NAME [--preset P | --smoke] [--workdir DIR] [--restart] "
                  "[--key=value ...]\n`seqjax list`: the experiments; `seqjax train NAME "
                  "--help`: the options of one.")
        elif any(a in ("-h", "--help") for a in rest):
            print(experiment_help(args.experiment))
        else:
            train_experiment(args.experiment, rest)
        return 0
    if args.command == "generate":
        if args.retired_max_new_tokens is not None:
            raise ConfigError("--max-new-tokens is spelled --max_new_tokens (every option of "
                              "seqjax uses underscores).")
        if args.max_new_tokens < 1:
            raise ConfigError(f"--max_new_tokens must be >= 1; got {args.max_new_tokens}.")
        if not args.temperature >= 0:
            raise ConfigError(f"--temperature must be >= 0 (0 = greedy); got {args.temperature}.")
    if args.command == "export":
        return _export(args, rest)
    module, cfg = experiment_from_workdir(args.experiment, args.workdir, rest)
    if args.command == "eval":
        if not callable(getattr(module, "evaluate", None)):
            raise ConfigError(f"experiment {module.__name__} has no `evaluate(cfg)`.")
        print(json.dumps(module.evaluate(cfg), indent=1, default=str))
        print(f"seqjax: evaluated {_checkpoint_step(args.workdir)}", file=sys.stderr)
        return 0
    if not callable(getattr(module, "generate", None)):
        raise ConfigError(f"experiment {module.__name__} has no `generate(cfg, prompt, ...)`.")
    print(module.generate(cfg, args.prompt, max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, seed=args.seed))
    return 0


def _export(args: argparse.Namespace, rest: list[str]) -> int:
    """``seqjax export``: :func:`seqjax.interop.hf_export.export_gpt2`; the folder's path on
    stdout, the step exported on stderr."""
    from seqjax.interop.hf_export import ExportWriteError, export_gpt2

    if rest:
        raise ConfigError(f"seqjax export takes --workdir DIR OUT [--step N] [--force]; got "
                          f"the unknown argument(s) {' '.join(rest)}.")
    try:
        out = export_gpt2(args.workdir, args.out, step=args.step, force=args.force)
    except ExportWriteError as err:  # no space, no permission: OUT is left as it was
        return _error(err, 3)
    which = (f"the checkpoint of step {args.step} in {args.workdir}" if args.step is not None
             else _checkpoint_step(args.workdir))
    print(out)
    print(f"seqjax: exported {which} to {out}", file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    """The ``seqjax`` command's parser (every subcommand but ``prepare``'s own options)."""
    ap = argparse.ArgumentParser(
        prog="seqjax", description="seqjax: sequence models in JAX.",
        epilog="Run `seqjax list` for the experiments; see `python -c \"import "
        "seqjax.experiments._runner as r; help(r)\"` for the experiment protocol.")
    ap.add_argument("--version", action="version", version=f"seqjax {seqjax.__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train an experiment (resumes in the same --workdir; "
                        "exit status 75: stopped by SIGTERM/SIGINT after saving, rerun to "
                        "resume); `seqjax train NAME --help`: its options", add_help=False)
    tr.add_argument("experiment", nargs="?")
    ev = sub.add_parser("eval", help="evaluate the checkpoint in --workdir")
    ev.add_argument("experiment", nargs="?")
    ev.add_argument("--workdir", required=True)
    gen = sub.add_parser("generate", help="generate text from the checkpoint in --workdir")
    gen.add_argument("experiment", nargs="?")
    gen.add_argument("--workdir", required=True)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max_new_tokens", type=int, default=20)
    gen.add_argument("--max-new-tokens", dest="retired_max_new_tokens", type=int,
                     help=argparse.SUPPRESS)  # the old spelling: refused, naming the new one
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=0)
    exp = sub.add_parser("export", help="write the checkpoint in --workdir (a gpt2 run) as a "
                         "Hugging Face folder: config.json, model.safetensors, the tokenizer")
    exp.add_argument("out", help="the folder to write (refused if it exists and is not empty)")
    exp.add_argument("--workdir", required=True)
    exp.add_argument("--step", type=int, default=None,
                     help="the checkpoint's step (default: the newest)")
    exp.add_argument("--force", action="store_true", help="replace an existing OUT")
    sub.add_parser("prepare", add_help=False, help="tokenise text into token shards (llm.c's "
                   "format or nanoGPT's bins); `seqjax prepare --help`: its options")
    sub.add_parser("list", help="list experiments and presets")
    bench = sub.add_parser("bench", add_help=False,
                           help="run a benchmark of the seqjax checkout you are in (`python -m "
                           "benchmarks` in its root; --smoke: seconds; `seqjax bench`: the list)")
    bench.add_argument("benchmark", nargs="?")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "prepare":  # its own parser (seqjax prepare --help)
        from seqjax.data.prepare import main as prepare_main

        return prepare_main(argv[1:])
    ap = _parser()
    args, rest = ap.parse_known_args(argv)
    if args.command == "bench":
        return _bench(([args.benchmark] if args.benchmark else []) + rest)
    if args.command == "list" and rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return _run(args, rest)
    except BrokenPipeError:  # `seqjax list | head`: the reader left; nothing to report
        # Python's exit flush must not fail either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except FloatingPointError as err:  # NonFiniteLossError
        return _error(err, 1, prefix="")
    except JaxRuntimeError as err:  # a value check that failed under --checked
        notes = " ".join(getattr(err, "__notes__", []))
        return _error(f"{str(err).splitlines()[0]} {notes}".rstrip(), 1, prefix="")
    except (ConfigError, LayoutError, CheckpointMismatchError, ResumeError,
            CorpusNotFoundError, ShardError, WorkdirBusyError) as err:
        return _error(err)
    except RunStopped as err:  # SIGTERM/SIGINT: saved and stopped, not finished
        return _error(err, EXIT_STOPPED, prefix="")
    except WriteError as err:  # no space, no permission, an I/O error
        return _error(err, 3)
    except DataIteratorError as err:  # where in the loader: its traceback, then one line
        traceback.print_exception(err.error, file=sys.stderr)
        return _error(err, 4)
    except CheckpointUnreadableError as err:
        return _error(f"{err} Nothing to resume from: rerun with --restart to start over (the "
                      "old metrics are kept), or use a new --workdir.")
    except ModuleNotFoundError as err:
        found = extra_for(err.name or "")
        if found is None:
            raise
        if "seqjax[" in str(err):  # seqjax._optional.require: it names the extra already
            return _error(err)
        return _error(f"{err}: an optional package of seqjax (`{found[0]}`); "
                      'pip install "seqjax[experiments]" installs every one the experiments use.')

def _checkout_root(start: str) -> str | None:
    """The seqjax checkout that holds ``start``: the nearest folder at or above it with
    ``benchmarks/__main__.py`` beside a ``pyproject.toml`` of the project ``seqjax``."""
    here = pathlib.Path(os.path.abspath(start))
    for path in (here, *here.parents):
        pyproject = path / "pyproject.toml"
        if (os.path.isfile(path / "benchmarks" / "__main__.py") and os.path.isfile(pyproject)
                and re.search(r"""(?m)^name\s*=\s*["']seqjax["']""",
                              pyproject.read_text(encoding="utf-8"))):
            return str(path)
    return None


def _bench(argv: list[str]) -> int:
    """``python -m benchmarks ARGV`` as a child process in the checkout's root (the benchmarks
    are not installed; ``sys.path`` is left alone); relative paths are taken from the root."""
    cwd = os.getcwd()
    root = _checkout_root(cwd)
    if root is None:
        return _error(f"`seqjax bench` runs the benchmarks of a seqjax checkout (they are not "
                      f"installed with the package), and no folder from {cwd} up holds "
                      "benchmarks/__main__.py beside the pyproject.toml of seqjax: run it "
                      "inside a clone of the repository.")
    if os.path.realpath(root) != os.path.realpath(cwd):
        print(f"seqjax bench: running `python -m benchmarks` in {root} (relative paths are "
              "taken from there)", file=sys.stderr, flush=True)
    try:
        rc = subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=root,
                            check=False).returncode
    except KeyboardInterrupt:  # the child got the same SIGINT and has been stopped
        return 130
    return rc if rc >= 0 else 128 - rc  # killed by signal N: 128 + N, as a shell says


if __name__ == "__main__":
    sys.exit(main())

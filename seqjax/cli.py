"""The ``seqjax`` command.

    seqjax train EXPERIMENT [args...]   run experiments/EXPERIMENT.py (its own flags, e.g. --smoke)
    seqjax list                         list the experiments
    seqjax --version
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import seqjax


def list_experiments() -> list[str]:
    import experiments

    return sorted(
        m.name for m in pkgutil.iter_modules(experiments.__path__)
        if not m.name.startswith("_") and m.name != "results"
    )


def _run_experiment(name: str, argv: list[str]) -> int:
    names = list_experiments()
    if name not in names:
        print(f"seqjax: unknown experiment {name!r}; choose one of: {', '.join(names)}",
              file=sys.stderr)
        return 2
    module = importlib.import_module(f"experiments.{name}")
    module.main(argv)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="seqjax", description="seqjax: sequence models in JAX.")
    ap.add_argument("--version", action="version", version=f"seqjax {seqjax.__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="run an experiment (see `seqjax list`)")
    tr.add_argument("experiment")
    sub.add_parser("list", help="list experiments")
    args, rest = ap.parse_known_args(argv)
    if args.command == "list":
        for name in list_experiments():
            print(name)
        return 0
    if args.command == "train":
        return _run_experiment(args.experiment, rest)
    ap.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

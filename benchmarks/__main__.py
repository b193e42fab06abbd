"""Run a benchmark: ``python -m benchmarks NAME [args...]`` (same as ``seqjax bench NAME``).

``python -m benchmarks`` with no name lists the benchmarks; every benchmark
module exposes ``main(argv) -> int`` and takes ``--smoke``. A removed benchmark's name
(:data:`MOVED`) is exit status 2 with where its content went.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import benchmarks

#: Benchmarks that were removed or renamed (older commands in HISTORY.md use the names),
#: and where their content went.
MOVED = {"accelerator": "its checks are the tests in tests/test_gpu_paths.py (JAX_PLATFORMS=cuda "
                        "python -m pytest tests/test_gpu_paths.py), its measurements "
                        "`python -m benchmarks gpu --parts kernels`",
         "gpu_check": "it is renamed `gpu`; run `python -m benchmarks gpu` with the same "
                      "arguments"}


def list_benchmarks() -> list[str]:
    """Names of the benchmark modules (every public module but the harness)."""
    return sorted(
        m.name for m in pkgutil.iter_modules(benchmarks.__path__)
        if not m.name.startswith("_") and m.name != "harness"
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = list_benchmarks()
    if not argv or argv[0] in ("-h", "--help", "list"):
        print("usage: python -m benchmarks NAME [--smoke] [args...]\nbenchmarks: "
              + ", ".join(names))
        return 0
    name, rest = argv[0], argv[1:]
    if name in MOVED:
        print(f"benchmark {name!r} was removed: {MOVED[name]}.", file=sys.stderr)
        return 2
    if name not in names:
        print(f"unknown benchmark {name!r}; choose one of: {', '.join(names)}", file=sys.stderr)
        return 2
    return int(importlib.import_module(f"benchmarks.{name}").main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())

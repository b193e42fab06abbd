"""The library's size: ``python -m benchmarks size [REV ...]``.

Counts the Python files of ``seqjax/`` without ``seqjax/experiments/`` (the library; the
recipes are left out) in the working tree and at each git revision ``REV``: lines, split
into code, docstring, comment and blank lines, and two measures that a reformatting does not
move — the code's tokens (docstrings, comments and layout left out) and its statements (AST
``stmt`` nodes, docstrings left out). A refactor that only rewraps lines changes the first
columns and not these.

``--smoke`` counts the working tree only.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
           tokenize.ENDMARKER}


def _docstring_lines(tree: ast.Module) -> set[int]:
    """1-based line numbers of the module's, classes' and functions' docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def measure(source: str) -> Counter:
    """``{lines, code, doc, comment, blank, tokens, statements}`` of one file's text."""
    tree = ast.parse(source)
    doc = _docstring_lines(tree)
    out: Counter = Counter()
    for i, line in enumerate(source.splitlines(), start=1):
        kind = ("doc" if i in doc else "blank" if not line.strip()
                else "comment" if line.lstrip().startswith("#") else "code")
        out[kind] += 1
        out["lines"] += 1
    out["tokens"] = sum(tok.type not in _LAYOUT and not (tok.type == tokenize.STRING
                                                         and tok.start[0] in doc)
                        for tok in tokenize.generate_tokens(io.StringIO(source).readline))
    out["statements"] = sum(isinstance(node, ast.stmt)
                            and not (isinstance(node, ast.Expr) and node.lineno in doc)
                            for node in ast.walk(tree))
    return out


def _library(paths: Sequence[str]) -> list[str]:
    return sorted(p for p in paths if p.startswith("seqjax/") and p.endswith(".py")
                  and not p.startswith("seqjax/experiments/"))


def count(rev: str | None) -> tuple[int, Counter]:
    """``(files, totals)`` of the library in the working tree (``None``) or at ``rev``."""
    if rev is None:
        files = _library([p.relative_to(ROOT).as_posix() for p in (ROOT / "seqjax").rglob("*.py")])
        texts = [(ROOT / f).read_text(encoding="utf-8") for f in files]
    else:
        git = ["git", "-C", str(ROOT)]
        listed = subprocess.run([*git, "ls-tree", "-r", "--name-only", rev, "seqjax"],
                                check=True, capture_output=True, text=True).stdout.split()
        files = _library(listed)
        texts = [subprocess.run([*git, "show", f"{rev}:{f}"], check=True, capture_output=True,
                                text=True).stdout for f in files]
    return len(files), sum((measure(t) for t in texts), Counter())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks size", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revs", nargs="*", help="git revisions to count beside the working tree")
    parser.add_argument("--smoke", action="store_true", help="the working tree only")
    args = parser.parse_args(argv)
    revs: list[str | None] = [None] + ([] if args.smoke else list(args.revs))
    cols = ("lines", "code", "doc", "comment", "blank", "tokens", "statements")
    print("| tree | files | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for rev in revs:
        files, c = count(rev)
        print(f"| {rev or 'working tree'} | {files} | "
              + " | ".join(f"{c[k]:,}" for k in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""House rules that a reader of the library relies on, checked over the source tree."""

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "seqjax"
ISSUE_REF = re.compile(r"\b[Ii]ssues? #?\d+|\(#\d+\)")


def test_no_issue_numbers_in_the_library():
    """Docstrings and comments say what the code does; the history (issue numbers,
    measurements by date) lives in benchmarks/HISTORY.md and the changelog."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{i}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if ISSUE_REF.search(line)]
    assert not found, "\n".join(found)


MAX_FUNCTION_LINES = 80


def _body_lines(node) -> int:
    """Lines of a function from its first statement after the docstring to its end."""
    body = node.body
    first = body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        if len(body) == 1:
            return 0
        first = body[1]
    return node.end_lineno - first.lineno + 1


def test_no_function_longer_than_80_lines_without_its_docstring():
    """A function reads on one screen: longer ones are split into parts named for what
    they compute (the house's stand-in for ruff's PLR0915)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _body_lines(node)
                if n > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                                 f"{node.name}: {n} lines")
    assert not found, "\n".join(found)


def test_the_length_rule_counts_what_it_says():
    src = "def f():\n    '''doc\n    more'''\n" + "    x = 1\n" * 81
    node = ast.parse(src).body[0]
    assert _body_lines(node) == 81
    node = ast.parse("def g():\n    '''only a docstring'''\n").body[0]
    assert _body_lines(node) == 0

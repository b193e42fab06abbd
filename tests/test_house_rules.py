"""House rules that a reader of the library relies on, checked over the source tree."""

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

"""Write ``colab/NAME.ipynb`` from its source ``colab/src/NAME.py``: ``python colab/build.py``.

Each source is a notebook in jupytext's percent format, linted by ruff like the rest of
the repository:

* ``# %%`` starts a code cell; its lines are the cell's source. A commented IPython magic
  (``# %matplotlib inline``) is un-commented, as jupytext does, so the source stays Python.
* ``# %% [markdown]`` starts a Markdown cell; every line is a comment, ``# `` (or a bare
  ``#`` for an empty line) is removed.
* Blank lines that open or close a cell only separate cells and are dropped.

Every notebook opens the same way on Colab: its title cell, then the cells of
``colab/src/_preamble.py`` (install seqjax when it is not importable; what the runtime
and ``SMOKE`` mean), written in here so that each ``.ipynb`` stands alone while the source
holds them once. ``REQUIREMENTS`` names the extras a notebook's install cell asks for.

The conversion needs only the standard library (jupytext reads the same files but is not
needed) and is deterministic: cell ids are ``NN-II`` (the notebook's number, the cell's
index), the notebook metadata are the constant ``METADATA`` (the Colab TPU accelerator,
the Python 3 kernel), and the notebook is written without outputs, keys sorted.
``tests/test_notebooks.py`` checks that each committed ``.ipynb`` equals what this script
writes, and executes it in SMOKE mode. ``--check`` only compares (exit status 1 on a
difference), for CI.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
METADATA = {
    "accelerator": "TPU",
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}
PREAMBLE = SRC / "_preamble.py"
REPOSITORY = "git+https://github.com/seqjax/seqjax"
# Notebooks whose install cell needs extras beyond the core (seqjax[data]: the packaged tasks).
REQUIREMENTS = {"02_seq2seq_attention": "seqjax[data]", "04_bert_and_vit": "seqjax[data]"}
_MARKER = re.compile(r"# %%(?P<rest>.*)")
_MAGIC = re.compile(r"(?P<indent>\s*)# (?P<magic>%{1,2}[A-Za-z]\w*\b.*)")


def names() -> list[str]:
    """The notebooks, one per source ``colab/src/NAME.py``, in order."""
    return sorted(p.stem for p in SRC.glob("[0-9][0-9]_*.py"))


def _cell(kind: str, lines: list[str], where: str) -> tuple[str, str]:
    while lines and not lines[-1].strip():
        lines.pop()
    while lines and not lines[0].strip():
        lines.pop(0)
    if kind == "code":
        return kind, "\n".join(_MAGIC.sub(r"\g<indent>\g<magic>", line) for line in lines)
    text = []
    for line in lines:
        if line.startswith("# ") or line == "#":
            text.append(line[2:])
        elif not line.strip():
            text.append("")
        else:
            raise ValueError(
                f"{where}: a Markdown cell line must be a comment ('# ' or '#'), got {line!r}"
            )
    return kind, "\n".join(text)


def parse(text: str, where: str = "<source>") -> list[tuple[str, str]]:
    """The cells ``(kind, source)`` of a percent-format notebook source; ``kind`` is
    ``"code"`` or ``"markdown"``."""
    cells: list[tuple[str, str]] = []
    kind, lines, start = None, [], 1
    for number, line in enumerate(text.split("\n"), start=1):
        marker = _MARKER.fullmatch(line)
        if marker is None:
            if kind is None and line.strip():
                raise ValueError(
                    f"{where}:{number}: expected a '# %%' cell marker before any content, "
                    f"got {line!r}"
                )
            lines.append(line)
            continue
        if kind is not None:
            cells.append(_cell(kind, lines, f"{where}:{start}"))
        rest = marker["rest"].strip()
        if rest not in ("", "[markdown]", "[md]"):
            raise ValueError(
                f"{where}:{number}: expected '# %%' or '# %% [markdown]', got {line!r}"
            )
        kind, lines, start = ("code" if rest == "" else "markdown"), [], number
    if kind is not None:
        cells.append(_cell(kind, lines, f"{where}:{start}"))
    if not cells:
        raise ValueError(f"{where}: no cells (no '# %%' marker)")
    return cells


def build(name: str) -> dict:
    """The notebook ``name`` as nbformat 4.5 JSON data (no outputs, deterministic ids)."""
    path = SRC / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"name: no notebook source {path} (known: {names()})")
    own = parse(path.read_text(encoding="utf-8"), str(path))
    if own[0][0] != "markdown":
        raise ValueError(f"{path}: the first cell must be the Markdown title")
    requirement = f"{REQUIREMENTS.get(name, 'seqjax')} @ {REPOSITORY}"
    preamble = parse(PREAMBLE.read_text(encoding="utf-8").split("\n\n", 1)[1], str(PREAMBLE))
    preamble = [(kind, source.replace("{requirement}", requirement)) for kind, source in preamble]
    cells = []
    for index, (kind, source) in enumerate([own[0], *preamble, *own[1:]]):
        cell = {"cell_type": kind, "id": f"{name[:2]}-{index:02d}", "metadata": {},
                "source": source}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    metadata = {**METADATA, "colab": {"provenance": [], "name": f"{name}.ipynb"}}
    return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}


def render(name: str) -> str:
    """The file contents of ``colab/name.ipynb``."""
    return json.dumps(build(name), indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write colab/NAME.ipynb from colab/src/NAME.py.")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"notebooks to write (default: all of {', '.join(names())})")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit status 1 when a committed notebook is stale")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in names()]
    if unknown:
        parser.error(f"NAME must be one of {names()}, got {unknown}")
    stale = []
    for name in args.names or names():
        path, text = HERE / f"{name}.ipynb", render(name)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print("wrote", path)
    for name in stale:
        print(f"colab/{name}.ipynb differs from colab/src/{name}.py: run python colab/build.py")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

"""``seqjax/experiments/README.md``, the results index users open first: one row per recipe,
with a command that still parses, a wall time, a headline and a results file that exists."""

import re
import shlex
from pathlib import Path

from seqjax.experiments._runner import build_config, list_experiments, load_experiment

FOLDER = Path(__file__).resolve().parents[2] / "seqjax" / "experiments"
COLUMNS = ["experiment", "command (as run)", "wall time (machine)", "headline result", "anchor",
           "results"]
PREFIXES = ("python -m seqjax.experiments.", "seqjax train ")


def index_rows() -> dict[str, list[str]]:
    lines = (FOLDER / "README.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| experiment |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    assert header == COLUMNS
    rows = {}
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", ln.strip().strip("|"))]
        assert len(cells) == len(COLUMNS), ln
        name = re.match(r"`(\w+)`", cells[0]).group(1)
        assert name not in rows, f"{name} is listed twice"
        rows[name] = cells
    return rows


def commands(cell: str) -> list[list[str]]:
    """The command lines of a cell: its code spans that start a command, and for a span of
    options alone ("the same `--x=1`") the command before it with those options added."""
    out: list[list[str]] = []
    for span in re.findall(r"`([^`]+)`", cell):
        if span.startswith(PREFIXES):
            out.append(shlex.split(span))
        elif span.startswith("--") and out:
            out.append(out[-1] + shlex.split(span))
    return out


def test_every_recipe_has_one_row():
    assert sorted(index_rows()) == list_experiments()


def test_each_row_has_a_time_a_headline_and_its_results_file():
    for name, cells in index_rows().items():
        time, headline, results = cells[2], cells[3], cells[5]
        assert re.search(r"\d+(\.\d+)? (s|min)\b", time), (name, time)
        assert re.search(r"\d", headline), (name, headline)
        links = re.findall(r"\]\((results/[^)]+\.md)\)", results)
        assert links, (name, results)
        for link in links:
            assert (FOLDER / link).exists(), (name, link)


def test_each_command_parses(tmp_path):
    """Every option of every command is one the recipe still takes, with a valid value
    (``build_config``, as ``seqjax train`` reads it; nothing runs). ``ptb_lm``'s ``S`` and
    ``DIR`` stand for each seed and its work dir."""
    for name, cells in index_rows().items():
        lines = commands(cells[1])
        assert lines, f"{name}: no command in {cells[1]!r}"
        module = load_experiment(name)
        for argv in lines:
            want = ["-m", f"seqjax.experiments.{name}"] if argv[0] == "python" else [
                "train", name]
            assert argv[1:3] == want, argv
            options = argv[3:]
            options = [{"S": "0", "DIR": str(tmp_path)}.get(o, o) for o in options]
            build_config(module, name, options, resume=False)

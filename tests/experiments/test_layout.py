"""The experiments' layout: a recipe imports the kit and the library, never another recipe.

What two recipes share lives in the kit (``seqjax/experiments/_*.py``, ``reports/``) or in
the library (``seqjax.data``, ``seqjax.decoding``, ``seqjax.models``, ...). The check reads
every module's imports (``ast``), so an import inside a function counts too.
"""

import ast
import pathlib

import pytest

from seqjax.experiments._runner import list_experiments

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[2] / "seqjax" / "experiments"
PACKAGE = "seqjax.experiments"


def imported_modules(source: str) -> set[str]:
    """Every module named by an import in ``source``; ``from P import a, b`` gives ``P`` and
    ``P.a``, ``P.b`` (the names may be modules)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x, from .x import y
                base = ".".join([PACKAGE, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def peer_recipes(name: str, recipes: set[str]) -> set[str]:
    """The recipes other than ``name`` that recipe ``name`` imports."""
    source = (EXPERIMENTS / f"{name}.py").read_text(encoding="utf-8")
    hits = set()
    for module in imported_modules(source):
        parts = module.split(".")
        if parts[:2] == ["seqjax", "experiments"] and len(parts) > 2:
            if parts[2] in recipes and parts[2] != name:
                hits.add(parts[2])
    return hits


def test_the_recipes_are_found():
    recipes = list_experiments()
    assert {"char_lm", "translation", "image_gpt", "sampling"} <= set(recipes)
    assert not any(r.startswith("_") for r in recipes)  # the kit is not a recipe


@pytest.mark.parametrize("name", list_experiments())
def test_no_recipe_imports_another(name):
    peers = peer_recipes(name, set(list_experiments()))
    assert not peers, (
        f"seqjax/experiments/{name}.py imports the recipe(s) {sorted(peers)}: move what they "
        "share to the kit (seqjax/experiments/_*.py) or the library")


def test_the_check_sees_every_import_form():
    recipes = {"char_lm", "sampling", "translation"}
    src = (
        "from seqjax.experiments import char_lm\n"
        "import seqjax.experiments.translation as t\n"
        "def f():\n"
        "    from .char_lm import load_data\n"
        "from seqjax.experiments._kit import write_json\n"
        "from seqjax.experiments import _text, reports\n"
    )
    mods = imported_modules(src)
    found = {m.split(".")[2] for m in mods
             if m.startswith("seqjax.experiments.") and m.split(".")[2] in recipes}
    assert found == {"char_lm", "translation"}

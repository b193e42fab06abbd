"""A user's install (issue #29): the wheel built from this checkout, installed on its own,
runs `seqjax train char_lm --smoke` from an empty folder outside the repository — the
corpus from $SEQJAX_DATA_DIR, and a one-line exit-2 message when no place has it.

The wheel goes into its own folder (`pip install --target`, no dependencies: they come
from the test environment) that is put first on `sys.path`, so `import seqjax` is the
wheel's, not this checkout's — the test checks that.
"""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The corpora's folder tests/conftest.py chose: ../shared/data, else the few-KB fixtures.
DATA_DIR = os.path.abspath(os.environ["SEQJAX_DATA_DIR"])


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel of this checkout, installed into a fresh folder."""
    build = tmp_path_factory.mktemp("wheel")
    src = build / "src"  # a clean copy: no build/ or egg-info of the checkout leaks in
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "workdirs", "runs"))
    # pip's isolated build (setuptools from the package index, as a user's pip does)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                          "-w", str(build / "dist"), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    wheels = list((build / "dist").glob("seqjax-*.whl"))
    assert len(wheels) == 1, wheels
    target = build / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                          "--target", str(target), str(wheels[0])],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return target


def _run(target, cwd, env_extra, *args):
    env = {k: v for k, v in os.environ.items()
           if k not in ("SEQJAX_DATA_DIR", "SEQJAX_CACHE_DIR", "PYTHONPATH")}
    env.update(PYTHONPATH=str(target), **env_extra)
    return subprocess.run([sys.executable, "-m", "seqjax.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_wheel_is_what_runs(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(installed)
    out = subprocess.run([sys.executable, "-c", "import seqjax; print(seqjax.__file__)"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().startswith(str(installed)), out.stdout + out.stderr


def test_char_lm_smoke_from_an_empty_folder_with_the_data_dir(installed, tmp_path):
    work = tmp_path / "empty"
    work.mkdir()
    out = _run(installed, work, {"SEQJAX_DATA_DIR": DATA_DIR,
                                 "SEQJAX_CACHE_DIR": str(tmp_path / "cache")},
               "train", "char_lm", "--smoke", "--progress=false", "--workdir", "run")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (work / "run" / "char_lm.json").is_file()


def test_no_corpus_anywhere_is_one_line_and_exit_2(installed, tmp_path):
    work = tmp_path / "empty"
    work.mkdir()
    out = _run(installed, work, {"SEQJAX_DATA_DIR": str(tmp_path / "nothing"),
                                 "SEQJAX_CACHE_DIR": str(tmp_path / "cache"),
                                 "SEQJAX_OFFLINE": "1"},
               "train", "char_lm", "--smoke", "--progress=false", "--workdir", "run")
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "tinyshakespeare.txt" in lines[0], out.stderr
    for place in ("SEQJAX_DATA_DIR", "the cache", "--data_path=FILE"):
        assert place in lines[0]
    assert not (work / "run" / "experiment.json").exists()

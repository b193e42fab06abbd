"""Test set-up, before JAX initialises:

* 8 fake CPU devices for the sharding tests;
* XLA's backend optimisation level 0: the suite is dominated by compile time
  (hundreds of tiny programs), which this roughly halves, while matmuls still go
  to the same optimised library kernels;
* float32 matmuls at full precision, so numpy references compare tightly;
* ``SEQJAX_DATA_DIR`` = ``../shared/data`` when it exists, else ``tests/fixtures`` (a few KB
  of Tiny Shakespeare and English–French pairs in the corpora's formats; no test downloads);
* tests marked ``corpus`` need the full corpora in ``$SEQJAX_DATA_DIR`` and skip, with the
  reason, when it holds only the fixtures (``SEQJAX_REQUIRE_CORPUS=1`` makes that an error);
* ``SEQJAX_COMPILE_CACHE=0``: the command line's compile cache off unless a test turns it on;
  instead one persistent JAX compile cache for the run, in a new temporary folder that both
  workers and every process a test starts share (``$JAX_COMPILATION_CACHE_DIR``), removed at
  the end: a program compiled once (the same small model in another file, a recipe run again
  to resume it, the second process of a two-process run) is read back, not compiled again.
"""

import os
import shutil
import tempfile

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The corpora come from ../shared/data when that folder exists, else from the few-KB
# fixtures in tests/fixtures (a fresh clone: no shared folder, no network; tests never
# download): SEQJAX_DATA_DIR is the resolver's second place, before the user cache and the
# network. Tests that need a full corpus are marked `corpus` and skip when it is not the one
# found (pytest_collection_modifyitems below).
FIXTURES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
_shared = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "shared", "data")
if "SEQJAX_DATA_DIR" not in os.environ:
    os.environ["SEQJAX_DATA_DIR"] = _shared if os.path.isdir(_shared) else FIXTURES_DIR

# `seqjax train` keeps compiled programs in a per-user cache by default; the suite's runs
# leave the user's cache alone (tests of the cache give it a temporary folder).
os.environ.setdefault("SEQJAX_COMPILE_CACHE", "0")
# The run's own compile cache (above): made by the first process that reads this file (the
# controller, or the only process without xdist); the workers inherit the variable.
_RUN_CACHE = "SEQJAX_TEST_COMPILE_CACHE"
_made_run_cache = _RUN_CACHE not in os.environ
if _made_run_cache:
    os.environ[_RUN_CACHE] = tempfile.mkdtemp(prefix="seqjax-tests-jax-")
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_RUN_CACHE]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

import gc  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


# The quick tier (`pytest -m "not slow"`, README): everything but the end-to-end runs below,
# which train experiments, start processes, build a wheel or run benchmarks in smoke mode.
# Every module of seqjax still has tests in the quick tier (the experiments through the CLI
# test of toy_rnn and the bad-option rows of char_lm).
_SLOW_FILES = (
    "tests/experiments/",
    "tests/train/test_multiprocess.py",
    "tests/test_notebooks.py",
    "tests/test_devices_bench.py",
    "tests/test_loop_bench.py",
    "tests/test_wheel_install.py",
    "tests/test_benchmarks.py",
    "tests/test_nanogpt_loop_bench.py",
    "tests/test_readme.py",
)


# The full corpora (../shared/data/README.md): a folder holds them when each file is at
# least this big; tests/fixtures holds a few KB of each.
FULL_CORPORA = {"tinyshakespeare.txt": 1_000_000, "fra-eng.txt": 500_000}


def full_corpora_dir() -> str | None:
    """``$SEQJAX_DATA_DIR`` when it holds the full corpora (:data:`FULL_CORPORA`), else None."""
    folder = os.environ.get("SEQJAX_DATA_DIR", "")
    for name, size in FULL_CORPORA.items():
        path = os.path.join(folder, name)
        if not folder or not os.path.isfile(path) or os.path.getsize(path) < size:
            return None
    return folder


def pytest_unconfigure(config):
    if _made_run_cache and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ[_RUN_CACHE], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    for item in items:
        path = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        if path.startswith(_SLOW_FILES):
            item.add_marker(pytest.mark.slow)

    # `corpus` tests (CI runs them apart: `SEQJAX_DATA_DIR=../shared/data pytest -m corpus`)
    # skip without the full corpora, or stop the run when SEQJAX_REQUIRE_CORPUS=1.
    needing = [item for item in items if item.get_closest_marker("corpus")]
    if not needing or full_corpora_dir() is not None:
        return
    reason = (
        f"needs the full corpora ({', '.join(FULL_CORPORA)}) in $SEQJAX_DATA_DIR; "
        f"{os.environ.get('SEQJAX_DATA_DIR', '')!r} does not hold them (tests/fixtures has "
        "a few KB of each; point SEQJAX_DATA_DIR at ../shared/data or put shared/ beside the "
        "checkout)"
    )
    if os.environ.get("SEQJAX_REQUIRE_CORPUS") == "1":
        raise pytest.UsageError(
            f"SEQJAX_REQUIRE_CORPUS=1; {len(needing)} `corpus` test(s): {reason}"
        )
    for item in needing:
        item.add_marker(pytest.mark.skip(reason=reason))



@pytest.fixture
def corpus_dir() -> Path:
    """The folder holding the full corpora; a test that uses it is marked ``corpus``."""
    folder = full_corpora_dir()
    if folder is None:  # only reached by a test without the marker
        pytest.skip("needs the full corpora in $SEQJAX_DATA_DIR (mark the test `corpus`)")
    return Path(folder)


@pytest.fixture(autouse=True, scope="module")
def _fresh_caches_for_each_file():
    """After each test file: JAX's caches cleared and Python's garbage collected.

    Each of the suite's two workers runs about half of its 114 files in one process, and
    the executables, jaxprs and tracers its jit caches kept from every earlier file made
    later in-process tests slower:
    `benchmarks loop --smoke` took 11 s alone, 20 s after tests/models in the same process,
    48 s late in the whole suite. With this, 13 s after tests/models, 21-23 s in the suite;
    the whole suite took 854 s before (one run) and 710-790 s after (four runs the same day
    on the 2-core VM, whose run-to-run spread is that wide: README.md, under the test
    command).
    """
    yield
    jax.clear_caches()
    gc.collect()

"""The persistent compilation cache: where it goes, how the command line turns it off, and
that a program compiled under it is stored (in a fresh process: the cache is process-wide)."""

import os
import subprocess
import sys

import pytest

from seqjax.compile_cache import COMPILE_CACHE_ENV, compile_cache_switch, enable_compile_cache
from seqjax.experiments._config import ConfigError
from seqjax.experiments._runner import Switches, _pop_switches


@pytest.mark.parametrize("env, want", [
    (None, True), ("", True), ("0", False), ("off", False), ("No", False), ("1", True),
    (" yes ", True),
])
def test_the_environment_switch(monkeypatch, env, want):
    if env is None:
        monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    else:
        monkeypatch.setenv(COMPILE_CACHE_ENV, env)
    assert compile_cache_switch() is want


def test_a_folder_in_the_switch_is_refused_naming_the_variable_that_moves_the_cache(
        monkeypatch):
    """SEQJAX_COMPILE_CACHE's retired meaning (a folder): the command line refuses it, also
    beside --compile_cache, and says which variable holds the folder now."""
    monkeypatch.setenv(COMPILE_CACHE_ENV, "/some/where")
    with pytest.raises(ValueError, match="JAX_COMPILATION_CACHE_DIR=/some/where"):
        compile_cache_switch()
    for argv in ([], ["--compile_cache=true"]):
        with pytest.raises(ConfigError, match=r"\$SEQJAX_COMPILE_CACHE is a switch"):
            _pop_switches(argv)


def test_command_line_flag_is_taken_out_of_the_options_and_wins_over_the_environment(
        monkeypatch):
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    monkeypatch.delenv("SEQJAX_CHECKED", raising=False)
    assert _pop_switches(["--steps=3"]) == (["--steps=3"], Switches())  # unset = on
    assert _pop_switches(["--steps=3", "--compile_cache=false"]) == (
        ["--steps=3"], Switches(compile_cache=False))
    assert _pop_switches(["--compile_cache"]) == ([], Switches(compile_cache=True))
    assert _pop_switches(["--compile_cache=1", "--x=2"]) == (["--x=2"], Switches())
    monkeypatch.setenv(COMPILE_CACHE_ENV, "0")
    assert _pop_switches([])[1].compile_cache is False
    assert _pop_switches(["--compile_cache=yes"])[1].compile_cache is True
    with pytest.raises(ConfigError, match="--compile_cache must be true or false; got 'maybe'"):
        _pop_switches(["--compile_cache=maybe"])


def test_the_library_call_warns_about_a_folder_in_the_switch(monkeypatch, tmp_path):
    """enable_compile_cache() no longer reads a folder from SEQJAX_COMPILE_CACHE: it warns,
    naming JAX_COMPILATION_CACHE_DIR, and uses that variable (here a folder it cannot make,
    so nothing is turned on in this process)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "old"))
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(UserWarning, match="JAX_COMPILATION_CACHE_DIR="), \
            pytest.raises(ValueError, match="cannot create the compile cache folder"):
        enable_compile_cache()
    assert not (tmp_path / "old").exists()


def test_bad_arguments_name_themselves(tmp_path):
    with pytest.raises(ValueError, match="min_compile_time_s"):
        enable_compile_cache(tmp_path, min_compile_time_s=-1)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="`path`: cannot create"):
        enable_compile_cache(blocker / "cache")


def test_a_compiled_program_is_stored_and_found_again(tmp_path):
    code = ("import seqjax, jax, jax.numpy as jnp; "
            f"seqjax.enable_compile_cache({str(tmp_path)!r}); "
            "print(float(jax.jit(lambda x: jnp.sin(x) * 7 + 1)(2.0)))")
    env = {k: v for k, v in os.environ.items() if k != COMPILE_CACHE_ENV}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True)
    stored = sorted(os.listdir(tmp_path))
    assert any(name.startswith("jit__lambda") for name in stored), stored
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=True)
    assert first.stdout == second.stdout
    assert sorted(os.listdir(tmp_path)) == stored  # found, not stored again

"""The persistent compilation cache: where it goes, how the command line turns it off, and
that a program compiled under it is stored (in a fresh process: the cache is process-wide)."""

import os
import subprocess
import sys

import pytest

from seqjax.compile_cache import COMPILE_CACHE_ENV, compile_cache_setting, enable_compile_cache
from seqjax.experiments._config import ConfigError
from seqjax.experiments._runner import _pop_compile_cache


@pytest.mark.parametrize("env, flag, want", [
    (None, None, (True, None)),
    ("0", None, (False, None)),
    ("off", None, (False, None)),
    ("/some/where", None, (True, "/some/where")),
    ("1", None, (True, None)),
    ("0", True, (True, None)),            # the flag wins over the environment
    (None, False, (False, None)),
    ("/some/where", True, (True, "/some/where")),
])
def test_setting_from_flag_and_environment(monkeypatch, env, flag, want):
    if env is None:
        monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    else:
        monkeypatch.setenv(COMPILE_CACHE_ENV, env)
    assert compile_cache_setting(flag) == want


def test_command_line_flag_is_taken_out_of_the_options():
    assert _pop_compile_cache(["--steps=3", "--compile_cache=false"]) == (["--steps=3"], False)
    assert _pop_compile_cache(["--compile_cache"]) == ([], True)
    assert _pop_compile_cache(["--compile_cache=1", "--x=2"]) == (["--x=2"], True)
    assert _pop_compile_cache(["--steps=3"]) == (["--steps=3"], None)
    with pytest.raises(ConfigError, match="--compile_cache must be true or false; got 'maybe'"):
        _pop_compile_cache(["--compile_cache=maybe"])


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

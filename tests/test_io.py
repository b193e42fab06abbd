"""The one atomic writer (seqjax._io) and the one machine probe (seqjax.utils.machine_info)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from seqjax._io import write_atomic, write_json


def test_write_json_creates_the_folder_and_writes_numpy_values_as_numbers(tmp_path):
    path = tmp_path / "a" / "b" / "r.json"
    write_json(path, {"loss": np.float32(1.5), "steps": np.int64(3), "ids": np.arange(3),
                      "x": jnp.ones(2), "name": "naïve", "other": object})
    text = path.read_text(encoding="utf-8")
    assert "naïve" in text  # UTF-8, not \u escapes
    assert json.loads(text) == {"loss": 1.5, "steps": 3, "ids": [0, 1, 2], "x": [1.0, 1.0],
                                "name": "naïve", "other": "<class 'object'>"}
    assert os.listdir(path.parent) == ["r.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"v": 1})

    class Bad:
        def __str__(self):
            raise RuntimeError("cannot serialise")

    with pytest.raises(RuntimeError):
        write_json(path, {"v": Bad()})
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["r.json"]


def test_a_crash_before_the_rename_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    write_json(path, {"v": 1})

    def crash(src, dst):
        assert os.path.dirname(src) == str(tmp_path)  # written beside the destination
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["r.json"]


def test_write_atomic_replaces_text_and_bytes_with_the_usual_file_mode(tmp_path):
    path = tmp_path / "notes.md"
    write_atomic(path, "first")
    write_atomic(str(path), b"second")
    assert path.read_bytes() == b"second"
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


def test_machine_info_is_the_probe_the_experiments_and_benchmarks_share():
    import jax

    from benchmarks import harness
    from seqjax.experiments import _kit
    from seqjax.utils import machine_info

    info = machine_info()
    assert sorted(info) == ["cores", "cpu", "device_kind", "jax", "jax_backend", "load_avg"]
    assert info["cpu"] and info["jax"] == jax.__version__
    assert info["jax_backend"] == jax.devices()[0].platform
    assert _kit.machine_info is machine_info
    assert harness.machine_info()["cpu"] == info["cpu"]

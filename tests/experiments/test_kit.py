"""seqjax.experiments._kit: the results files every experiment writes, and its JSON."""

import dataclasses
import json

import numpy as np

from seqjax.experiments import _kit


@dataclasses.dataclass(frozen=True)
class _Cfg:
    workdir: str | None = None
    results_dir: str | None = None


def test_write_results_puts_the_markdown_and_figures_in_both_folders_and_json_in_the_work_dir(
        tmp_path):
    work, results = str(tmp_path / "work"), str(tmp_path / "results")
    drawn = []
    summary = {"loss": np.float32(0.5), "curve": np.arange(3), "steps": np.int64(7)}
    folders = _kit.write_results("toy", _Cfg(work, results), "# toy\n", summary,
                                 plot=drawn.append)
    assert folders == [work, results] and drawn == [work, results]
    for folder in (work, results):
        assert open(f"{folder}/toy.md", encoding="utf-8").read() == "# toy\n"
    assert json.load(open(f"{work}/toy.json")) == {"loss": 0.5, "curve": [0, 1, 2], "steps": 7}
    assert not (tmp_path / "results" / "toy.json").exists()
    assert _kit.write_results("toy", _Cfg(), "# toy\n", summary) == []  # nowhere to write
    same = str(tmp_path / "same")
    assert _kit.write_results("toy", _Cfg(same, same), "x", {}) == [same]  # once

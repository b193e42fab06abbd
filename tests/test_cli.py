"""The `seqjax` command: parsing errors, presets, train → resume → eval → generate on toy_rnn."""

import dataclasses
import json
import os

import pytest

from seqjax import cli
from seqjax.experiments import _runner
from tests.experiments._learning import assert_loss_dropped


def test_list_shows_experiments_and_presets(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "toy_rnn" in out and "MEDL §7.2" in out and "smoke" in out


@pytest.mark.parametrize("argv, message", [
    (["train", "toy_rnn", "--model.hiden_size=3"],
     "unknown config key --model.hiden_size .*Did you mean --model.hidden_size?"),
    (["train", "toy_rnn", "--hiden_size=3"],  # a typo of the name before the group
     "unknown config key --hiden_size .*Did you mean --model.hidden_size?"),
    (["train", "toy_rnn", "--model.hidden_size", "abc"],
     "--model.hidden_size: expected int; got 'abc'"),
    (["train", "toy_rnn", "--hidden=3"],
     r"--hidden is now --model.hidden_size .*--model.hidden_size=VALUE"),
    (["train", "gpt2", "--clip_norm=none"], r"--clip_norm: .*\(0 turns this option off\)"),
    (["train", "toy_rnn", "--steps"], "--steps needs a value"),
    (["train", "toy_rnn", "--preset", "huge"], "unknown preset 'huge'.*presets: smoke"),
    (["train", "no_such_experiment"], "unknown experiment 'no_such_experiment'"),
    (["eval", "--workdir", "/nonexistent/dir"], "no experiment.json in '/nonexistent/dir'"),
])
def test_bad_command_lines_exit_2_with_a_clear_message(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqjax: error:")
    import re

    assert re.search(message, err), err


def test_build_config_layers_saved_config_preset_and_overrides(tmp_path):
    module = cli.load_experiment("toy_rnn")
    cfg = cli.build_config(module, "toy_rnn", ["--smoke", "--model.hidden_size=7",
                                               f"--workdir={tmp_path}"])
    assert (cfg.steps, cfg.log_every, cfg.model.hidden_size, cfg.workdir) == \
        (20, 5, 7, str(tmp_path))
    (tmp_path / "experiment.json").write_text(json.dumps(
        {"experiment": "toy_rnn", "config": {**dataclasses.asdict(cfg), "learning_rate": 0.01}}))
    again = cli.build_config(module, "toy_rnn", [f"--workdir={tmp_path}", "--steps", "40"])
    assert (again.model.hidden_size, again.learning_rate, again.steps) == (7, 0.01, 40)
    (tmp_path / "experiment.json").write_text(json.dumps({"experiment": "other", "config": {}}))
    with pytest.raises(cli.ConfigError, match="belongs to experiment 'other'"):
        cli.build_config(module, "toy_rnn", [f"--workdir={tmp_path}"])


def test_experiment_main_reports_bad_keys(capsys):
    from seqjax.experiments import toy_rnn

    with pytest.raises(SystemExit) as exit_info:
        toy_rnn.main(["--no_such_key=1"])
    assert exit_info.value.code == 2
    assert "unknown config key --no_such_key" in capsys.readouterr().err


def test_train_resume_eval_generate(tmp_path, capsys):
    workdir = str(tmp_path / "toy")
    assert cli.main(["train", "toy_rnn", "--smoke", "--workdir", workdir, "--progress=false"]) == 0
    summary = json.load(open(os.path.join(workdir, "toy_rnn.json")))
    assert summary["params"] == 748 and summary["correct"] == 5 and summary["resumed_from"] == 0
    records = [json.loads(x) for x in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["step"] for r in records] == [1, 5, 10, 15, 20] and all("loss" in r for r in records)
    # It learned: the loss falls from 1.98 (step 1) to 0.06 (step 20) on the fixed seed.
    assert_loss_dropped(workdir, rel=0.5)

    # The same work dir resumes (saved config + new overrides): 20 more steps.
    assert cli.main(["train", "toy_rnn", "--workdir", workdir, "--steps", "40"]) == 0
    summary = json.load(open(os.path.join(workdir, "toy_rnn.json")))
    assert summary["resumed_from"] == 20 and summary["config"]["steps"] == 40
    assert summary["config"]["log_every"] == 5 and summary["config"]["progress"] is False
    capsys.readouterr()

    assert cli.main(["eval", "--workdir", workdir]) == 0
    out = capsys.readouterr()
    metrics = json.loads(out.out)
    assert metrics["accuracy"] == 1.0 and metrics["loss"] < 0.1
    assert "evaluated the checkpoint of step 40 in" in out.err
    assert cli.main(["generate", "--workdir", workdir, "--prompt", "the mathematical",
                     "--max_new_tokens", "4"]) == 0
    assert capsys.readouterr().out.strip() == "the mathematical engineering of deep learning"


def test_a_module_without_config_and_run_is_refused(monkeypatch, capsys):
    import sys
    import types

    legacy = types.ModuleType("seqjax.experiments.legacy")
    legacy.main = lambda argv: None  # parses its own flags: no longer an experiment
    monkeypatch.setitem(sys.modules, "seqjax.experiments.legacy", legacy)
    monkeypatch.setattr(_runner, "list_experiments", lambda: ["legacy"])
    assert cli.main(["train", "legacy", "--smoke"]) == 2
    assert "must define a dataclass `Config` and `run(cfg)`" in capsys.readouterr().err


def test_cli_only_parses_arguments_the_runner_does_the_work():
    for name in ("build_config", "check_ranges", "experiment_main", "list_experiments",
                 "load_experiment", "EXPERIMENT_FILE"):
        assert getattr(cli, name) is getattr(_runner, name)


@pytest.mark.parametrize("error, words", [
    (ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"),
     ["matplotlib", 'pip install "seqjax[experiments]"']),
    (ModuleNotFoundError('plotting needs `matplotlib`: pip install "seqjax[plot]"',
                         name="matplotlib"), ['pip install "seqjax[plot]"']),
])
def test_a_missing_optional_package_exits_2_naming_the_extra(monkeypatch, capsys, error, words):
    import dataclasses
    import types

    def run(cfg):
        raise error

    module = types.ModuleType("seqjax.experiments.needs_plots")
    module.Config = dataclasses.make_dataclass("Config", [], frozen=True)
    module.run = run
    monkeypatch.setattr(_runner, "load_experiment", lambda name: module)
    assert cli.main(["train", "needs_plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqjax: error:") and all(w in err for w in words), err
    monkeypatch.setattr(module, "run", lambda cfg: __import__("no_such_package_xyz"))
    with pytest.raises(ModuleNotFoundError):  # not an optional dependency of seqjax: a bug
        cli.main(["train", "needs_plots"])


def test_train_help_lists_every_option_with_its_type_default_and_meaning(capsys):
    """`seqjax train NAME --help` (issue #29 item 2): every Config field with its type,
    default and meaning (every experiment's Config documents each field), and the presets."""

    from seqjax.experiments._runner import describe_experiments, load_experiment

    assert cli.main(["train", "char_lm", "--help"]) == 0
    out = capsys.readouterr().out
    assert "  --steps (int >= 0, default 2000): optimiser steps" in out  # the declared range
    assert "  --compute_dtype ('float32' | 'bfloat16', default 'float32'): " in out  # choices
    assert "  --mesh (str, default ''): " in out  # inherited from ParallelOptions
    assert "gpu: model.num_layers=6" in out and "``" not in out
    assert "  --model.KEY (ModelOptions, the options below): the network" in out
    for name, _, _ in describe_experiments():
        module = load_experiment(name)
        assert cli.main(["train", name, "-h"]) == 0
        out = capsys.readouterr().out
        for option in _option_names(module.Config):
            line = next((ln for ln in out.splitlines() if ln.startswith(f"  --{option} (")),
                        None)
            assert line is not None, (name, option)
            assert "): " in line and len(line.split("): ", 1)[1]) > 3, (name, line)  # a meaning
    assert cli.main(["train", "--help"]) == 0
    assert cli.main(["train", "nosuch", "--help"]) == 2


def _option_names(cls: type, prefix: str = "") -> list[str]:
    """Every option of a recipe's config; a group's as ``model.KEY`` and ``model.NAME``."""
    import dataclasses

    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default):
            out += [f"{prefix}{f.name}.KEY", *_option_names(type(f.default), f"{prefix}{f.name}.")]
        else:
            out.append(f"{prefix}{f.name}")
    return out


def test_bench_from_a_checkout_and_from_elsewhere(tmp_path):
    """``seqjax bench`` runs ``python -m benchmarks`` in the root of the checkout that holds
    the working directory (from the root or below it), leaves its own ``sys.path`` alone,
    and outside a checkout exits 2 naming what it looked for. (``python -I`` reproduces the
    console script's ``sys.path``: no working directory on it.)"""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys; from seqjax.cli import main; path = list(sys.path); "
            "rc = main(['bench']); assert sys.path == path and 'benchmarks' not in sys.modules; "
            "sys.exit(rc)")
    for cwd in (root, os.path.join(root, "tests")):
        listed = subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd,
                                capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0, listed.stderr
        assert "rnn_profile" in listed.stdout and "gpu" in listed.stdout
        assert ("relative paths are taken from there" in listed.stderr) == (cwd != root)
    # A folder with benchmarks/ but another project's pyproject.toml is not a checkout.
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__main__.py").write_text("raise SystemExit(0)\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n')
    elsewhere = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path,
                               capture_output=True, text=True, timeout=120)
    assert elsewhere.returncode == 2
    assert "benchmarks/__main__.py beside the pyproject.toml of seqjax" in elsewhere.stderr
    assert str(tmp_path) in elsewhere.stderr


def test_bench_finds_the_checkout_root_from_below(tmp_path):
    from seqjax.cli import _checkout_root

    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__main__.py").write_text("")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    assert _checkout_root(str(tmp_path / "deep" / "er")) is None  # no pyproject.toml
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "seqjax"\n')
    assert _checkout_root(str(tmp_path / "deep" / "er")) == str(tmp_path)
    assert _checkout_root(str(tmp_path)) == str(tmp_path)


def test_checked_switch_from_the_flag_or_the_environment_without_writing_it(monkeypatch):
    """--checked, else $SEQJAX_CHECKED: read once by the command line (never written to
    os.environ); a value that is not a boolean is refused naming the option or variable."""
    from seqjax.experiments._config import ConfigError
    from seqjax.experiments._runner import _pop_switches
    from seqjax.train.loop import CHECKED_ENV

    monkeypatch.delenv(CHECKED_ENV, raising=False)
    before = dict(os.environ)
    argv, switches = _pop_switches(["--steps=2", "--checked"])
    assert argv == ["--steps=2"] and switches.checked and dict(os.environ) == before
    assert not _pop_switches(["--checked=false"])[1].checked
    assert not _pop_switches([])[1].checked  # unset = off
    monkeypatch.setenv(CHECKED_ENV, "1")
    assert _pop_switches([])[1].checked and not _pop_switches(["--checked=no"])[1].checked
    monkeypatch.setenv(CHECKED_ENV, "sometimes")
    with pytest.raises(ConfigError, match=r"\$SEQJAX_CHECKED must be true or false; got "
                                          "'sometimes'"):
        _pop_switches([])
    monkeypatch.delenv(CHECKED_ENV)
    with pytest.raises(ConfigError, match="--restart must be true or false; got 'maybe'"):
        _pop_switches(["--restart=maybe"])
    argv, switches = _pop_switches(["--restart=yes", "--x=1"])
    assert argv == ["--x=1"] and switches.restart


@pytest.mark.parametrize("argv, env, want", [
    ([], None, False), (["--checked"], None, True), ([], "1", True), (["--checked=0"], "1", False),
])
def test_the_checked_switch_reaches_the_fit_configs_of_the_recipe(monkeypatch, argv, env, want):
    """The recipe's FitConfig(checked=None) is checked when the command line says so: fit
    reads FitConfig alone, and FitConfig does not read the environment."""
    import dataclasses
    import types

    from seqjax.train.loop import CHECKED_ENV, FitConfig

    if env is None:
        monkeypatch.delenv(CHECKED_ENV, raising=False)
    else:
        monkeypatch.setenv(CHECKED_ENV, env)
    module = types.ModuleType("seqjax.experiments.makes_a_fit_config")
    module.Config = dataclasses.make_dataclass("Config", [], frozen=True)
    module.run = lambda cfg: {"checked": FitConfig(steps=1).checked}
    monkeypatch.setattr(_runner, "load_experiment", lambda name: module)
    assert _runner.train_experiment("makes_a_fit_config", argv) == {"checked": want}
    assert FitConfig(steps=1).checked is False  # outside the run: off, whatever the env

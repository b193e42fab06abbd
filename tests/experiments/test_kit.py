"""seqjax.experiments._kit: the results files, their JSON, and the one training path (train)."""

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


# ----------------------------------------------------------------------------- train(task, cfg)
@dataclasses.dataclass(frozen=True)
class _TrainCfg:
    steps: int = 6
    workdir: str | None = None
    results_dir: str | None = None


def _regression_run(cfg, seed=0, name="", evaluate=None):
    """A linear regression of y = x·w on 64 rows: the smallest Run."""
    import jax.numpy as jnp

    from seqjax.train.loop import FitConfig
    from seqjax.train.optim import OptimizerConfig

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    data = {"x": x, "y": x @ np.array([1.0, -2.0, 0.5], np.float32)}

    def loss_fn(p, batch, rng):
        return jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2), {}

    def eval_fn(p, batch):
        return {"loss": jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2)}

    return _kit.Run(
        model=None, params={"w": np.zeros(3, np.float32)}, loss_fn=loss_fn, data=data,
        optimizer=OptimizerConfig(name="adam", learning_rate=0.1),
        fit=FitConfig(steps=cfg.steps, log_every=1, progress=False, best_metric=None,
                      tensorboard=False, plot=False),
        batch_size=8, seed=seed, eval_fn=eval_fn, eval_data=[data], name=name,
        evaluate=evaluate)


def test_train_is_fit_over_the_runs_data_with_the_same_losses_as_fit_by_hand(tmp_path):
    """train(Task) draws the same batches, from the same state, as fit wired by hand."""
    import jax

    from seqjax.data.iterators import ArrayIterator
    from seqjax.train.loop import fit
    from seqjax.train.parallel import Parallel

    cfg = _TrainCfg(workdir=str(tmp_path / "work"), results_dir=str(tmp_path / "results"))
    seen = {}

    def summarize(trained):
        seen["trained"] = trained
        return {"final_loss": trained[0].records[-1]["loss"]}

    task = _kit.Task("toy", [_regression_run(cfg, evaluate=lambda t: {"again": t.evaluate()})],
                     summarize=summarize, report=lambda s: f"# toy {s['steps']}\n",
                     files=lambda folder, s: open(f"{folder}/extra.txt", "w").write("x"))
    summary = _kit.train(task, cfg)
    (t,) = seen["trained"]
    assert summary["steps"] == 6 and summary["status"] == "completed"
    assert summary["resumed_from"] == 0 and summary["params"] == 3
    assert {"config", "parallel", "machine", "wall_s", "train_wall_s"} <= set(summary)
    assert t.results["again"]["loss"] == t.eval["eval/loss"]
    assert isinstance(t.params["w"], np.ndarray) and t.folder == cfg.workdir
    saved = json.load(open(f"{cfg.workdir}/toy.json"))
    assert saved["final_loss"] == summary["final_loss"] and saved["config"]["steps"] == 6
    for folder in (cfg.workdir, cfg.results_dir):
        assert open(f"{folder}/toy.md").read() == "# toy 6\n"
        assert open(f"{folder}/extra.txt").read() == "x"

    run = _regression_run(cfg)
    par = Parallel.from_options(cfg)
    state, schedule = _kit.init_state(par, run.params, run.optimizer, jax.random.PRNGKey(0))
    batches = ArrayIterator(dict(run.data), par.local_batch_size(8), seed=0,
                            **par.host_rows())
    by_hand = fit(state, par.train_step(run.loss_fn, schedule=schedule), batches, run.fit,
                  parallel=par)
    assert [r["loss"] for r in by_hand.history] == [r["loss"] for r in t.records]


def test_train_puts_named_runs_in_sub_folders_and_writes_no_markdown_without_a_report(tmp_path):
    cfg = _TrainCfg(steps=2, workdir=str(tmp_path))
    runs = (_regression_run(cfg, seed=s, name=f"seed{s}",
                            evaluate=lambda t: {"loss": t.eval["eval/loss"]}) for s in (0, 1))
    summary = _kit.train(_kit.Task("two", runs, summarize=lambda ts: {
        "runs": [t.results for t in ts]}), cfg)
    assert len(summary["runs"]) == 2 and "steps" not in summary  # per run, not one
    for s in (0, 1):
        assert (tmp_path / f"seed{s}" / "metrics.jsonl").exists()
    assert (tmp_path / "run.json").exists() and (tmp_path / "two.json").exists()
    assert not (tmp_path / "two.md").exists()
    quiet = dataclasses.replace(_regression_run(cfg, name="quiet"), writes=False)
    assert _kit.train(_kit.Task("three", [quiet]), cfg)["config"]["steps"] == 2
    assert not (tmp_path / "quiet").exists()  # a run that writes nothing
    nothing = _kit.train(_kit.Task("two", [_regression_run(_TrainCfg(steps=2))]),
                         _TrainCfg(steps=2))
    assert nothing["steps"] == 2


def test_a_runs_batch_check_reaches_fit_and_logged_seconds_sum_the_calls():
    import pytest

    def refuse(batch):
        raise ValueError("refused by the run's check")

    run = dataclasses.replace(_regression_run(_TrainCfg(steps=2)), check_batch=refuse)
    with pytest.raises(ValueError, match="refused by the run's check"):
        _kit.train(_kit.Task("checked", [run]), _TrainCfg(steps=2))
    # each call of fit counts its records' time from 0
    assert _kit.logged_seconds([{"time": 2.0}, {"time": 1.0}, {"step": 3}, {"time": 4.0}]) == 6.0
    assert _kit.logged_seconds([]) == 0.0


def test_a_run_may_bring_its_optimizer_evaluation_step_and_log_hook():
    import optax

    seen, cfg = [], _TrainCfg(steps=3)
    run = dataclasses.replace(
        _regression_run(cfg), eval_fn=None, eval_data=[{"value": 2.0}],
        make_eval_step=lambda par: (lambda params, batch: {"loss": batch["value"]}),
        optimizer=(optax.sgd(0.1), optax.constant_schedule(0.1)), on_log=[seen.append],
        evaluate=lambda t: {"again": t.evaluate()["loss"]})
    trained = []
    _kit.train(_kit.Task("own", [run], summarize=lambda ts: trained.extend(ts) or {}), cfg)
    (t,) = trained
    assert t.eval["eval/loss"] == 2.0 and t.results == {"again": 2.0}  # batches unplaced
    assert [r["step"] for r in seen] == [1, 2, 3] and abs(seen[-1]["lr"] - 0.1) < 1e-6


def test_a_run_that_diverges_is_a_result_only_when_it_says_so(tmp_path):
    import pytest

    from seqjax.train.optim import OptimizerConfig
    from seqjax.train.records import NonFiniteLossError, read_metrics

    cfg = _TrainCfg(steps=6)
    run = dataclasses.replace(_regression_run(cfg),
                              optimizer=OptimizerConfig(name="sgd", learning_rate=1e30))
    with pytest.raises(NonFiniteLossError):  # by default a NaN ends the task
        _kit.train(_kit.Task("nan", [run]), cfg)
    seen = {}
    work = str(tmp_path / "work")
    summary = _kit.train(_kit.Task("nan", [dataclasses.replace(
        run, divergence_is_result=True, name="blowup")], summarize=lambda ts: seen.update(t=ts[0])
        or {"diverged_at": ts[0].diverged_at}), _TrainCfg(steps=6, workdir=work))
    t = seen["t"]
    assert t.status == "diverged" and t.result is None and t.eval == {}
    assert summary["diverged_at"] == t.diverged_at and 1 < t.diverged_at <= 6
    assert [r["step"] for r in t.records] == list(range(1, t.diverged_at))  # the finite steps
    assert t.steps == t.diverged_at - 1
    assert read_metrics(f"{work}/blowup/metrics.jsonl") == t.records
    np.testing.assert_array_equal(t.params["w"], run.params["w"])  # no trained parameters
    with pytest.raises(ValueError, match="diverged at step"):
        t.evaluate()


def test_a_stopped_run_ends_the_recipe_and_the_same_command_finishes_as_uninterrupted(
        tmp_path, capsys):
    """SIGTERM in the first of two runs: the second never starts, nothing is summarised or
    written from a part-trained run; the same call then finishes with the uninterrupted
    results, and once more on the finished work dir (each run resumed at its end evaluates
    again) gives them too."""
    import signal
    import threading

    import pytest

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("fit handles signals only in the main thread")

    def stop_at_step_2(record):
        if record["step"] == 2:
            signal.raise_signal(signal.SIGTERM)

    def task(cfg, stop=False):
        def runs():
            for s in (0, 1):
                run = _regression_run(cfg, seed=s, name=f"seed{s}",
                                      evaluate=lambda t: {"loss": t.eval["eval/loss"]})
                yield dataclasses.replace(run, on_log=[stop_at_step_2]) if stop and s == 0 else run
        return _kit.Task("two", runs(), summarize=lambda ts: {
            "runs": [t.results for t in ts], "w": [t.params["w"].tolist() for t in ts]})

    whole = _TrainCfg(steps=6, workdir=str(tmp_path / "whole"))
    expected = _kit.train(task(whole), whole)
    cfg = _TrainCfg(steps=6, workdir=str(tmp_path / "stopped"))
    stopped = _kit.train(task(cfg, stop=True), cfg)
    assert stopped["status"] == "interrupted" and stopped["run"] == "seed0"
    assert 2 <= stopped["steps"] < 6 and stopped["runs_trained"] == 1
    assert "two: run 'seed0' was stopped at step" in capsys.readouterr().err
    assert not (tmp_path / "stopped" / "seed1").exists()
    assert not (tmp_path / "stopped" / "two.json").exists()
    for _ in range(2):  # resumes; then every run is resumed at its end
        finished = _kit.train(task(cfg), cfg)
        assert finished["runs"] == expected["runs"] and finished["w"] == expected["w"]

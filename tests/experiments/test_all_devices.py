"""Every experiment that trains lays its training out over *all* visible devices.

The suite runs with 8 fake CPU devices (tests/conftest.py), so each experiment's in-process
smoke test checks its own ``run.json`` files (:func:`tests.experiments._devices.
assert_trained_on_all_devices`). This test covers the rest through the command line, in a
fresh process as a user runs it: one subprocess (JAX starts once) fakes 8 CPU devices and
trains each remaining experiment's smoke config with ``seqjax train NAME --smoke``; each work
dir's ``run.json`` (and the one ``fit`` writes beside a run's checkpoints) must say 8 devices,
1 process, and the smoke batches split over ``data=8``; and, these runs having no other smoke
test, each run's training loss must have fallen (``LEARNED``). ``COVERED`` lists the experiments
whose smoke tests check it in-process, and the test asserts that the two lists together are
every training experiment.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.experiments._learning import assert_loss_dropped

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# experiment -> (extra options that keep the run short and quiet, the work dir's sub-folder
# where `fit` writes its own run.json, or None where the runs keep no work dir)
EXPERIMENTS = {
    "toy_rnn": (["--progress=false"], ""),
    # 40 steps, not the preset's 4: enough to see the loss fall (LEARNED below)
    "selective_copying": (["--runs=selective_copying:mamba", "--steps=40"],
                          "selective_copying_mamba"),
}
# The smoke test of these experiments is this one: the fixed-seed drop of the training loss
# it asserts in the metrics.jsonl of the run's sub-folder, (fraction, tail): the first logged
# step against the mean of the last `tail` logged steps. Measured: toy_rnn 1.98 -> 0.06
# (step 20); selective_copying (mamba) 2.72 -> 2.17 (mean of steps 18-40, logged every 6).
LEARNED = {"toy_rnn": (0.5, 1), "selective_copying": (0.1, 5)}
# Checked by their smoke tests in-process (tests/experiments/test_*.py).
COVERED = {"digits", "bert_mlm", "translation", "numbers", "gradients", "positions",
           "norm_placement", "baselines", "ptb_lm", "forecasting", "image_gpt", "char_lm",
           "text_to_image", "audio", "gpt2"}
# Experiments that train nothing (tables, figures, counts, sampling a saved model).
NO_TRAINING = {"param_counts", "complexity", "dynamics", "sampling"}

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import jax
    from seqjax import cli

    root, plan = sys.argv[1], json.loads(sys.argv[2])
    out = {"devices": jax.device_count(), "seconds": {}}
    for name, extra in plan.items():
        start = time.perf_counter()
        rc = cli.main(["train", name, "--smoke", "--workdir", os.path.join(root, name), *extra])
        out["seconds"][name] = round(time.perf_counter() - start, 1)
        if rc != 0:
            raise SystemExit(f"seqjax train {name} --smoke exited with {rc}")
    print("RESULT " + json.dumps(out))
""")


def test_every_experiment_is_covered():
    from seqjax.experiments._runner import list_experiments

    assert set(list_experiments()) == set(EXPERIMENTS) | COVERED | NO_TRAINING


@pytest.mark.slow
def test_every_experiment_trains_on_all_8_devices(tmp_path):
    env = dict(os.environ)
    env["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "
                        "--xla_backend_optimization_level=0")
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    plan = {name: extra for name, (extra, _) in EXPERIMENTS.items()}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), json.dumps(plan)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["devices"] == 8
    print("seconds per experiment:", result["seconds"])
    for name, (_, sub) in EXPERIMENTS.items():
        dirs = [tmp_path / name] + ([tmp_path / name / sub] if sub else [])
        for d in dirs:
            info = json.loads((d / "run.json").read_text())
            assert info["devices"] == 8 and info["processes"] == 1, (name, d, info)
            assert info["mesh"] == {"data": 8, "fsdp": 1, "model": 1}, (name, info)
        rel, tail = LEARNED[name]
        assert_loss_dropped(tmp_path / name / sub, rel=rel, tail=tail)

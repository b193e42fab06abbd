"""The check that an experiment trained on every visible device (the suite fakes 8)."""

import json
from pathlib import Path

import jax


def assert_trained_on_all_devices(*workdirs) -> None:
    """Each work dir's ``run.json`` (the experiment's, and the one ``fit`` writes beside a
    run's checkpoints) says: every visible device, one process, the batch split over
    ``data``."""
    n = jax.device_count()
    assert n == 8, "tests/conftest.py fakes 8 CPU devices"
    for d in workdirs:
        info = json.loads((Path(d) / "run.json").read_text())
        assert info["devices"] == n and info["processes"] == 1, (d, info)
        assert info["mesh"] == {"data": n, "fsdp": 1, "model": 1}, (d, info)

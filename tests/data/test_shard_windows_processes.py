"""The shard loader across real processes: 2 processes x 2 CPU devices (gloo on 127.0.0.1)
against 1 process x 4 devices. Each process reads only its rows; the global batches placed
on the devices are the same bit for bit, and a stream saved by one process count resumes
on the other from the step alone. Then ``seqjax train gpt2`` trained 2 steps on two
processes and resumed on one matches one uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from seqjax.data.shards import write_shard

from ..train.test_multiprocess import _env, _free_port, _records

TIMEOUT_S = 240

SCRIPT = textwrap.dedent("""
    import hashlib, json, sys
    from seqjax.train.parallel import Parallel  # joins the peers (JAX_COORDINATOR_ADDRESS)
    par = Parallel.create()
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from seqjax.data.shard_windows import ShardWindows
    from seqjax.data.shards import open_tokens

    folder, start, end, state = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    data = open_tokens(folder, vocab_size=1000)
    it = ShardWindows(data.train, par.local_batch_size(8), 16, seed=3, **par.host_rows())
    if state != "-":
        it.set_state(json.loads(state))
    assert it.step == start
    rows, digests = it.batch_size, []
    for _ in range(start, end):
        placed = par.place(next(it))["inputs"]
        whole = np.asarray(multihost_utils.process_allgather(placed, tiled=True))
        digests.append(hashlib.sha256(whole.tobytes()).hexdigest())
    if jax.process_index() == 0:
        print("RESULT " + json.dumps({"digests": digests, "state": it.get_state(),
                                      "rows": rows, "processes": jax.process_count()}))
""")


def _shards(folder) -> None:
    rng = np.random.default_rng(0)
    write_shard(os.path.join(folder, "s_val_000000.bin"), rng.integers(0, 1000, 500))
    for i in (1, 2):
        write_shard(os.path.join(folder, f"s_train_{i:06d}.bin"), rng.integers(0, 1000, 4000))


def _run(processes: int, args: list[str]) -> list[str]:
    port, procs = _free_port(), []
    for i in range(processes):
        extra = {} if processes == 1 else dict(
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(processes),
            JAX_PROCESS_ID=str(i))
        procs.append(subprocess.Popen(args, env=_env(4 // processes, **extra),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    return outs


def _loader(tmp_path, processes: int, start: int, end: int, state: str = "-") -> dict:
    script = tmp_path / "loader.py"
    script.write_text(SCRIPT)
    outs = _run(processes, [sys.executable, str(script), str(tmp_path / "data"), str(start),
                            str(end), state])
    line = next(ln for out in outs for ln in out.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow
def test_two_processes_place_the_same_batches_and_resume_on_one(tmp_path):
    os.makedirs(tmp_path / "data")
    _shards(tmp_path / "data")
    one = _loader(tmp_path, 1, 0, 6)
    assert one["rows"] == 8 and one["processes"] == 1
    two = _loader(tmp_path, 2, 0, 3)
    assert two["rows"] == 4 and two["processes"] == 2  # each process reads half the rows
    assert two["digests"] == one["digests"][:3]
    # saved by two processes, resumed by one; and the other way round
    rest = _loader(tmp_path, 1, 3, 6, json.dumps(two["state"]))
    assert rest["digests"] == one["digests"][3:]
    half = _loader(tmp_path, 1, 0, 2)
    back = _loader(tmp_path, 2, 2, 6, json.dumps(half["state"]))
    assert back["digests"] == one["digests"][2:]


@pytest.mark.slow
def test_gpt2_recipe_resumed_on_another_process_count_matches_one_run(tmp_path):
    os.makedirs(tmp_path / "data")
    _shards(tmp_path / "data")

    def cmd(workdir, steps):
        return [sys.executable, "-m", "seqjax.cli", "train", "gpt2", "--smoke",
                f"--data_path={tmp_path / 'data'}", "--vocab_size=1000", "--sample_tokens=0",
                f"--steps={steps}", "--checkpoint_every=2", "--log_every=1",
                f"--workdir={workdir}"]

    one, split = str(tmp_path / "one"), str(tmp_path / "split")
    _run(1, cmd(one, 4))
    _run(2, cmd(split, 2))
    out = _run(1, cmd(split, 4))[0]
    assert "resum" in out.lower(), out[-2000:]
    a, b = _records(one), _records(split)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], abs=1e-5), (ra, rb)

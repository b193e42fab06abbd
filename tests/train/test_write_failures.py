"""Write failures (no space, no permission, an I/O error) are one clear error: recognised in
OSErrors and orbax's wrapped ones, raised by the checkpoint, metrics and summary writers with
the step, the space and the newest checkpoint; the temporary folder of a failed checkpoint is
removed and the same run resumes; ``seqjax train`` exits 3 with one line. A real full file
system (a 16 MB tmpfs) where the test can mount one."""

import errno
import inspect
import logging
import os
import shutil
import subprocess
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from seqjax import cli
from seqjax.data.iterators import ArrayIterator
from seqjax.train import fit_parts
from seqjax.train.loop import FitConfig, fit
from seqjax.train.records import read_metrics
from seqjax.train.step import create_train_state, make_train_step
from seqjax.train.write_errors import (
    WriteError,
    newest_checkpoint,
    space_warning,
    write_failure,
    writing,
)

# What tensorstore, under orbax, raises for a full disk (a ValueError, not an OSError).
ORBAX_ENOSPC = ('RESOURCE_EXHAUSTED: Error writing "w/0.0" in OCDBT database at local file '
                '"{tmp}/params.orbax-checkpoint-tmp/ocdbt.process_0/": Failed to write 3077881 '
                "bytes to file 7: No space left on device [os_error_code='28']")


def test_write_failures_are_recognised_in_oserrors_orbax_errors_and_chains():
    assert write_failure(OSError(errno.ENOSPC, "No space left on device")) == errno.ENOSPC
    assert write_failure(PermissionError(errno.EACCES, "Permission denied")) == errno.EACCES
    assert write_failure(OSError(errno.EIO, "Input/output error")) == errno.EIO
    assert write_failure(ValueError(ORBAX_ENOSPC.format(tmp="/w/2"))) == errno.ENOSPC
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as outer:
        assert write_failure(outer) == errno.EROFS
    assert write_failure(FileNotFoundError(errno.ENOENT, "gone")) is None
    assert write_failure(ValueError("bad shape")) is None
    assert write_failure(OSError("no errno")) is None


def test_the_message_is_one_line_naming_what_where_step_space_checkpoint_and_resume(tmp_path):
    ckpts = tmp_path / "checkpoints"
    (ckpts / "100").mkdir(parents=True)
    (ckpts / "200.orbax-checkpoint-tmp").mkdir()  # unfinished: not a checkpoint
    assert newest_checkpoint(str(ckpts)) == (100, str(ckpts / "100"))
    with pytest.raises(WriteError) as info:
        with writing("the checkpoint", str(ckpts / "200"), step=200, needed=9_700_000,
                     checkpoints=str(ckpts)):
            raise ValueError(ORBAX_ENOSPC.format(tmp=ckpts / "200"))
    err = info.value
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC and err.step == 200
    text = str(err)
    assert "\n" not in text
    assert text.startswith(f"could not write the checkpoint of step 200 to {ckpts / '200'}: "
                           "No space left on device [ENOSPC] (about 9.7 MB needed, ")
    assert f"the newest intact checkpoint is step 100 ({ckpts / '100'})" in text
    assert "rerunning the same call (same work dir) resumes from it" in text
    err.resume = "`seqjax train char_lm --workdir w`"
    assert str(err).endswith("once the cause is gone, `seqjax train char_lm --workdir w` "
                             "resumes from it.")
    with pytest.raises(ValueError, match="bad shape"):  # other errors pass unchanged
        with writing("x", str(tmp_path / "x")):
            raise ValueError("bad shape")


def test_space_warning_compares_free_space_with_the_kept_checkpoints(tmp_path, monkeypatch):
    free = shutil.disk_usage(tmp_path).free
    assert space_warning(str(tmp_path), free // 100, keep=3) is None
    line = space_warning(str(tmp_path / "checkpoints"), free // 2, keep=3)
    assert line is not None and "\n" not in line and "3 kept + 1 being written" in line


def _loss(params, batch, rng):
    return jnp.mean((jnp.mean(params["w"]) * batch["x"] - 1.0) ** 2), {}


def _run(workdir, *, steps=6, every=2, async_save=True, size=1, keep=3, seed=0):
    w = np.random.default_rng(seed).normal(size=size).astype(np.float32)  # incompressible
    state, _ = create_train_state(lambda r: {"w": jnp.asarray(w)}, optax.sgd(0.1),
                                  jax.random.PRNGKey(0))
    return fit(state, make_train_step(_loss), ArrayIterator({"x": np.ones((4,), np.float32)}, 2),
               FitConfig(steps=steps, log_every=1, checkpoint_every=every,
                         keep_checkpoints=keep, async_checkpointing=async_save,
                         progress=False, tensorboard=False, plot=False, handle_signals=False),
               workdir=workdir)


def _steps(workdir):
    return [r["step"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))]


def _leftovers(workdir):
    return [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in n]


def _fail_checkpoint(monkeypatch, step, how):
    """Make orbax's save of ``step`` fail as a full disk does: ``"save"`` raises an OSError
    from the save call; ``"background"`` leaves a temporary folder and raises orbax's
    wrapped error (logged with its traceback, as orbax does) when the write is waited for."""
    save, wait = ocp.CheckpointManager.save, ocp.CheckpointManager.wait_until_finished
    failed: dict = {}

    def failing_save(self, s, *args, **kwargs):
        if s != step:
            return save(self, s, *args, **kwargs)
        tmp = os.path.join(str(self.directory), f"{s}.orbax-checkpoint-tmp")
        os.makedirs(os.path.join(tmp, "params.orbax-checkpoint-tmp"))
        if how == "save":
            raise OSError(errno.ENOSPC, "No space left on device", tmp)
        failed["err"] = ValueError(ORBAX_ENOSPC.format(tmp=tmp))
        return True

    def failing_wait(self):
        err = failed.pop("err", None)
        if err is not None:  # logged by orbax's CheckpointManager, with the traceback
            logger = logging.getLogger("absl")
            logger.handle(logger.makeRecord(
                "absl", logging.ERROR, inspect.getfile(ocp.CheckpointManager), 0,
                "[wait_until_finished] Save Finalize thread (save_finalize) failed.", (),
                (type(err), err, None)))
            raise err
        return wait(self)

    monkeypatch.setattr(ocp.CheckpointManager, "save", failing_save)
    monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", failing_wait)


@pytest.mark.parametrize("how", ["save", "background"])
def test_a_failed_checkpoint_is_one_error_leaves_no_temporary_folder_and_resumes(
        tmp_path, monkeypatch, capfd, caplog, how):
    workdir = str(tmp_path / "w")
    _fail_checkpoint(monkeypatch, 4, how)
    with pytest.raises(WriteError) as info:
        _run(workdir)
    err = info.value
    assert err.step == 4 and err.errno == errno.ENOSPC and err.what == "the checkpoint"
    assert err.checkpoint == (2, os.path.join(workdir, "checkpoints", "2"))
    assert err.needed is not None and err.needed > 0
    # the failure stops the run at once (a background write: at the next logged step,
    # before its record is written)
    assert _steps(workdir)[-1] == 4
    assert _leftovers(workdir) == []
    assert "Traceback" not in capfd.readouterr().err  # orbax's log of it is dropped
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    monkeypatch.undo()
    result = _run(workdir)  # the cause is gone: the same call resumes
    assert result.status == "completed" and result.start_step == 2
    assert _steps(workdir) == [1, 2, 3, 4, 5, 6]


def test_a_failed_metrics_write_is_one_error_and_the_run_resumes(tmp_path, monkeypatch):
    workdir = str(tmp_path / "w")
    appended = []

    def full_disk_open(path, mode="r", *args, **kwargs):
        if "a" in mode:
            appended.append(path)
            if len(appended) == 3:
                raise OSError(errno.ENOSPC, "No space left on device")
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(fit_parts, "open", full_disk_open, raising=False)
    with pytest.raises(WriteError, match=r"could not write the metrics record of step 3 to "
                       r".*metrics.jsonl: No space left on device \[ENOSPC\] \(about \d+ bytes "
                       r"needed, .* free\); the newest intact checkpoint is step 2"):
        _run(workdir, async_save=False)
    monkeypatch.undo()
    assert _run(workdir).start_step == 2
    assert _steps(workdir) == [1, 2, 3, 4, 5, 6]


def test_seqjax_train_exits_3_with_one_line_and_the_same_command_resumes(
        tmp_path, monkeypatch, capfd):
    workdir = str(tmp_path / "toy")
    argv = ["train", "toy_rnn", "--smoke", "--workdir", workdir, "--progress=false"]
    _fail_checkpoint(monkeypatch, 20, "background")  # the last one: raised when it closes
    assert cli.main([*argv, "--restart"]) == 3
    out = capfd.readouterr().err
    assert "Traceback" not in out and "RESOURCE_EXHAUSTED" not in out, out
    err = [line for line in out.splitlines() if line.startswith("seqjax:")]
    assert len(err) == 1, out
    assert err[0].startswith("seqjax: error: could not write the checkpoint of step 20 ")
    assert (f"the newest intact checkpoint is step 10 ({workdir}/checkpoints/10); once the cause "
            f"is gone, `seqjax train toy_rnn --smoke --workdir {workdir} --progress=false` "
            "resumes from it.") in err[0]  # --restart dropped: refused once a checkpoint exists
    assert _leftovers(workdir) == []
    monkeypatch.undo()
    assert cli.main(argv) == 0
    assert "resumed from step 10" in capfd.readouterr().err
    assert os.path.exists(os.path.join(workdir, "toy_rnn.json"))


def test_a_failed_summary_write_exits_3_naming_the_file(tmp_path, monkeypatch, capsys):
    from seqjax.experiments import _kit

    workdir = str(tmp_path / "toy")

    def full_disk(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(_kit, "write_json", full_disk)
    argv = ["train", "toy_rnn", "--smoke", "--workdir", workdir, "--progress=false"]
    assert cli.main(argv) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"seqjax: error: could not write toy_rnn.json to {workdir}/toy_rnn.json: "
                          "No space left on device [ENOSPC]"), err
    assert "newest intact checkpoint is step 20" in err and "\n" not in err
    from seqjax.experiments import toy_rnn

    with pytest.raises(SystemExit) as exit_info:  # python -m seqjax.experiments.toy_rnn
        toy_rnn.main(argv[2:])
    assert exit_info.value.code == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("toy_rnn: error: could not write toy_rnn.json") and (
        f"`python -m seqjax.experiments.toy_rnn --smoke --workdir {workdir} --progress=false` "
        "resumes from it." in err), err
    monkeypatch.undo()
    assert cli.main(argv) == 0
    assert os.path.exists(os.path.join(workdir, "toy_rnn.json"))


@pytest.fixture
def small_file_system(tmp_path):
    """A 16 MB tmpfs mounted for the test (root only), unmounted after it."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and `mount`")
    where = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("async_save", [True, False])
def test_a_full_file_system_stops_the_run_in_one_error_and_resumes_after(
        small_file_system, capfd, caplog, async_save):
    workdir = str(small_file_system / "w")
    size = 1_000_000  # 4 MB of float32 per checkpoint: the fourth does not fit in 16 MB
    with pytest.raises(WriteError) as info:
        _run(workdir, steps=10, every=1, async_save=async_save, size=size, keep=10)
    err = info.value
    assert err.errno == errno.ENOSPC and err.what == "the checkpoint"
    assert err.checkpoint is not None and err.checkpoint[0] == err.step - 1
    assert err.needed >= 4_000_000 and err.free is not None and err.free < err.needed
    assert _leftovers(workdir) == []
    out = capfd.readouterr().err
    warning = [line for line in out.splitlines() if "a checkpoint write may fail" in line]
    assert len(warning) == 1 and "10 kept + 1 being written" in warning[0]
    assert "Traceback" not in out and "RESOURCE_EXHAUSTED" not in out, out[-3000:]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # orbax's, dropped
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_file_system)], check=True)
    result = _run(workdir, steps=10, every=1, async_save=async_save, size=size, keep=10)
    assert result.status == "completed" and result.start_step == err.step - 1
    assert _steps(workdir) == list(range(1, 11))

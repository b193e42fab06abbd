"""Checkpoints with orbax: periodic, async, atomic, keep-last-K plus best, crash-tolerant restore.

Step ``s`` is ``<directory>/<s>/`` with items ``params``, ``opt_state``, ``train``
(``step``, ``rng``, TBPTT ``carry``), ``meta`` (JSON: step, data-iterator state, model config,
metrics, seqjax version) and optionally ``tokenizer`` (JSON). Orbax writes a temporary
directory and renames it when complete (atomic on POSIX). Retention keeps the ``keep``
newest plus the ``keep_best`` best by ``best_metric``.

:meth:`Checkpointer.restore` takes the newest checkpoint that reads back, moving unreadable
ones to ``<directory>.corrupted/`` with a warning; one that reads but does not fit (model
config, parameter names or shapes) is a :class:`CheckpointMismatchError`, never skipped. A
failed write (surfacing, with ``async_save``, at the next ``save``/``check``/``wait``/``close``)
is a :class:`~seqjax.train.write_errors.WriteError` naming step, bytes needed and free and the
newest intact checkpoint; its temporary folder is removed and orbax's tracebacks of it are
dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

import seqjax
from seqjax._io import json_value
from seqjax.train.optim import TrainState, path_to_str
from seqjax.train.write_errors import (
    WriteError,
    free_bytes,
    newest_checkpoint,
    space_warning,
    tree_bytes,
    write_failure,
)

__all__ = ["Checkpointer", "CheckpointMismatchError", "CheckpointUnreadableError",
           "CheckpointWarning", "Restored", "restore_params", "load_meta", "load_tokenizer_json"]


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
    """Silence orbax's absl INFO/WARNING chatter."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        logger.setLevel(level)


def _silence_closed_loop_noise() -> None:
    """Drop the ``RuntimeError('Event loop is closed')`` unraisables of a failed orbax read.

    Tensorstore futures of the failed read call back into orbax's finished event loop, printing
    noise over the :class:`CheckpointWarning`; wraps ``sys.unraisablehook`` once per process,
    passing every other error to the previous hook.
    """
    previous = sys.unraisablehook
    if getattr(previous, "_seqjax_closed_loop_filter", False):
        return

    def hook(unraisable: Any) -> None:
        err = unraisable.exc_value
        if not (isinstance(err, RuntimeError) and str(err) == "Event loop is closed"):
            previous(unraisable)

    hook._seqjax_closed_loop_filter = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


class _DropWriteFailureLogs(logging.Filter):
    """Drops orbax's write-failure log records (raised instead as one ``WriteError``)."""

    _ORBAX = f"{os.sep}orbax{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        if self._ORBAX not in record.pathname:
            return True
        err = record.exc_info[1] if record.exc_info else RuntimeError(record.getMessage())
        return write_failure(err) is None


_ARRAY_ITEMS = ("params", "opt_state", "train")


class CheckpointMismatchError(ValueError):
    """A checkpoint was read but does not fit the model (config, names or shapes)."""


class CheckpointUnreadableError(RuntimeError):
    """Every checkpoint of a directory failed to read (they were moved aside)."""


class CheckpointWarning(UserWarning):
    """A checkpoint could not be read and was skipped."""


@dataclass(frozen=True)
class Restored:
    """What :meth:`Checkpointer.restore` returns."""

    state: TrainState
    step: int
    data_state: Any
    meta: dict


def _jsonable(x: Any) -> Any:
    """A JSON round trip (tuples → lists), so saved and current configs compare equal."""
    return json.loads(json.dumps(x, default=json_value))


def _abstract(tree: Any, sharding: Any = None) -> Any:
    """ShapeDtypeStructs of ``tree``'s leaves, keeping each leaf's sharding."""
    default = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def leaf(x: Any) -> jax.ShapeDtypeStruct:
        s = getattr(x, "sharding", None)
        if not isinstance(s, jax.sharding.Sharding):
            s = default
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s)

    return jax.tree_util.tree_map(leaf, tree)


def _flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {path_to_str(p): tuple(np.shape(x)) for p, x in leaves}


def _config_diff(saved: Any, current: Any) -> list[str]:
    saved, current = _jsonable(saved), _jsonable(current)
    if not isinstance(saved, dict) or not isinstance(current, dict):
        return [] if saved == current else [f"saved {saved!r}, now {current!r}"]
    pairs = {k: (saved.get(k, "<missing>"), current.get(k, "<missing>"))
             for k in sorted(set(saved) | set(current))}
    return [f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in pairs.items() if a != b]


class Checkpointer:
    """Save and restore ``TrainState`` checkpoints in ``directory`` (orbax ``CheckpointManager``).

    Args:
        directory: where the step directories live (created if needed).
        keep: the most recent checkpoints kept (``None`` = all).
        best_metric: a metric name (e.g. ``"eval/loss"``); its ``keep_best`` best checkpoints
            are kept too, whatever their age.
        best_mode: ``"min"`` or ``"max"``.
        keep_best: how many best checkpoints to keep.
        async_save: write in a background thread (call :meth:`wait` or :meth:`close`).
        model_config: a JSON-able dict saved with each checkpoint and compared on restore.
        tokenizer: a JSON-able dict (or JSON string) saved with each checkpoint.
        read_only: nothing created, cleaned up, deleted or moved.

    Example:
        >>> import tempfile, jax, jax.numpy as jnp, optax
        >>> state = TrainState.create({"w": jnp.ones(3)}, optax.sgd(0.1), jax.random.PRNGKey(0))
        >>> with Checkpointer(tempfile.mkdtemp(), async_save=False) as ckpt:
        ...     _ = ckpt.save(state, data_state={"position": 7})
        ...     r = ckpt.restore(state)
        >>> r.step, r.data_state
        (0, {'position': 7})
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int | None = 3,
                 best_metric: str | None = None, best_mode: str = "min", keep_best: int = 1,
                 async_save: bool = True, model_config: Mapping[str, Any] | None = None,
                 tokenizer: Mapping[str, Any] | str | None = None,
                 read_only: bool = False) -> None:
        if best_mode not in ("min", "max"):
            raise ValueError(f"`best_mode` must be 'min' or 'max'; got {best_mode!r}.")
        if keep is not None and keep < 1:
            raise ValueError(f"`keep` must be >= 1 or None; got {keep}.")
        self.directory = os.path.abspath(os.fspath(directory))
        self.best_metric = best_metric
        self.best_mode = best_mode
        self.model_config = None if model_config is None else _jsonable(dict(model_config))
        if isinstance(tokenizer, str):
            tokenizer = json.loads(tokenizer)
        self.tokenizer = None if tokenizer is None else _jsonable(tokenizer)
        policies: list[Any] = [ocm.LatestN(n=keep)]
        if best_metric is not None:  # BestN keeps the tail of the sorted list: reverse for min
            policies.append(ocm.BestN(
                get_metric_fn=lambda m: float(m[best_metric]), reverse=best_mode == "min",
                n=keep_best, keep_checkpoints_without_metrics=False))
        self.read_only, self.keep = read_only, keep
        self._pending: tuple[int, int] | None = None  # (step, bytes) of an unfinished save
        self._log_filter: logging.Filter | None = None
        if not read_only:
            self._log_filter = _DropWriteFailureLogs()
            logging.getLogger("absl").addFilter(self._log_filter)
            if jax.process_index() == 0:
                _remove_partial_writes(self.directory)
        handlers = {**{k: ocp.StandardCheckpointHandler() for k in _ARRAY_ITEMS},
                    "meta": ocp.JsonCheckpointHandler(), "tokenizer": ocp.JsonCheckpointHandler()}
        with _quiet_orbax():
            options = ocp.CheckpointManagerOptions(
                preservation_policy=ocm.AnyPreservationPolicy(policies),
                enable_async_checkpointing=async_save, create=not read_only, read_only=read_only,
                cleanup_tmp_directories=False)  # done synchronously above
            self._mngr = ocp.CheckpointManager(self.directory, options=options,
                                               item_handlers=handlers)

    # -- context manager ---------------------------------------------------------------
    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- queries -----------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        """Steps with a complete checkpoint, ascending."""
        return sorted(int(s) for s in self._mngr.all_steps())

    def latest_step(self) -> int | None:
        """The newest complete checkpoint (not checked for readability), or ``None``."""
        return max(self.all_steps(), default=None)

    def best_step(self) -> int | None:
        """The kept checkpoint with the best ``best_metric`` (``None`` if none has it)."""
        if self.best_metric is None:
            return None
        scored = []
        for s in self.all_steps():
            try:
                m = self.meta(s).get("metrics") or {}
            except Exception:  # noqa: BLE001 — unreadable meta: not a candidate
                continue
            if self.best_metric in m:
                scored.append((float(m[self.best_metric]), s))
        return (min if self.best_mode == "min" else max)(scored)[1] if scored else None

    def meta(self, step: int) -> dict:
        """The JSON ``meta`` item of ``step``."""
        out = self._orbax_restore(step, ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def _orbax_restore(self, step: int, args: Any) -> Any:
        with _quiet_orbax():
            return self._mngr.restore(step, args=args)

    def _item_md(self, step: int, item: str) -> Any:
        """The saved array metadata tree of ``item`` (raises if unreadable)."""
        with _quiet_orbax():
            md = self._mngr.item_metadata(step)[item]
        tree = getattr(md, "tree", md)
        if tree is None or not _flat_shapes_md(tree):
            raise RuntimeError(f"metadata of `{item}` at step {step} is missing or unreadable.")
        return tree

    def _saved_shapes(self, step: int, item: str) -> dict[str, tuple[int, ...]]:
        """``{path: shape}`` of ``item``'s saved arrays (raises if unreadable)."""
        return {k: tuple(v.shape) for k, v in _flat_shapes_md(self._item_md(step, item)).items()}

    # -- save --------------------------------------------------------------------------
    def save(self, state: TrainState, *, data_state: Any = None,
             metrics: Mapping[str, Any] | None = None, step: int | None = None) -> bool:
        """Checkpoint ``state`` at ``step`` (default ``state.step``); False if it exists.

        ``metrics`` (floats) go into ``meta``; their ``best_metric`` ranks the checkpoint."""
        step = int(jax.device_get(state.step)) if step is None else int(step)
        if step in self.all_steps():
            return False
        metrics = {k: float(v) for k, v in dict(metrics or {}).items()}
        meta = {"step": step, "data_state": _jsonable(data_state),
                "model_config": self.model_config, "metrics": metrics,
                "seqjax_version": seqjax.__version__, "time": time.time()}
        items: dict[str, Any] = {k: ocp.args.StandardSave(v)
                                 for k, v in zip(_ARRAY_ITEMS, _array_items(state))}
        items["meta"] = ocp.args.JsonSave(meta)
        if self.tokenizer is not None:
            items["tokenizer"] = ocp.args.JsonSave(self.tokenizer)
        ranked = None
        if self.best_metric is not None and self.best_metric in metrics:
            ranked = {self.best_metric: metrics[self.best_metric]}
        self._finish_pending()  # a failure of the previous save is reported under its step
        needed = _state_bytes(state)
        try:
            with _quiet_orbax():
                saved = bool(self._mngr.save(
                    step, args=ocp.args.Composite(**items), metrics=ranked, force=True))
        except Exception as err:  # noqa: BLE001 - a write failure is reported, others re-raised
            self._write_failed(step, needed, err)
        self._pending = (step, needed) if saved else None
        return saved

    def space_warning(self, state: TrainState) -> str | None:
        """One line if free space is less than ``keep`` + 1 checkpoints of ``state``
        (:func:`~seqjax.train.write_errors.space_warning`), else ``None``."""
        return space_warning(self.directory, _state_bytes(state), self.keep or 1)

    def _finish_pending(self) -> None:
        """Wait for the unfinished save, if any; its failure raises."""
        if self._pending is None:
            return
        step, needed = self._pending
        self._pending = None
        try:
            self._mngr.wait_until_finished()
        except Exception as err:  # noqa: BLE001 - a write failure is reported, others re-raised
            self._write_failed(step, needed, err)

    def _write_failed(self, step: int, needed: int, err: Exception) -> NoReturn:
        """Clean up the failed write of ``step``; raise it as a ``WriteError`` (others as is)."""
        code = write_failure(err)
        if code is None:
            raise err
        with contextlib.suppress(Exception):  # its threads end before its folder goes
            self._mngr.wait_until_finished()
        _join_orbax_threads()
        if jax.process_index() == 0:
            _remove_partial_writes(self.directory)
        with contextlib.suppress(Exception), _quiet_orbax():
            self._mngr.reload()
        raise WriteError("the checkpoint", os.path.join(self.directory, str(step)), code=code,
                         step=step, needed=needed, free=free_bytes(self.directory),
                         checkpoint=newest_checkpoint(self.directory)) from err

    def check(self) -> None:
        """Raise the failure of an ended background write (not waiting for a running one)."""
        if self._pending is not None and not self._mngr.is_saving_in_progress():
            self._finish_pending()

    def wait(self) -> None:
        """Block until background writes have finished (a failed one raises)."""
        self._finish_pending()
        self._mngr.wait_until_finished()

    def close(self) -> None:
        """Finish pending writes and release the manager; a failed write raises after that."""
        try:
            self._finish_pending()
        finally:
            self._mngr.wait_until_finished()
            self._mngr.close()
            if self._log_filter is not None:
                logging.getLogger("absl").removeFilter(self._log_filter)
                self._log_filter = None

    # -- restore -----------------------------------------------------------------------
    def _check_fits(self, step: int, meta: dict, target: TrainState) -> None:
        where = f"checkpoint {os.path.join(self.directory, str(step))}"
        if self.model_config is not None and meta.get("model_config") is not None:
            if diff := _config_diff(meta["model_config"], self.model_config):
                raise CheckpointMismatchError(
                    f"{where} was written for a different model config: " + "; ".join(diff)
                    + ". Use a new work dir, or the saved config.")
        for item, tree in (("params", target.params), ("opt_state", target.opt_state)):
            want = _flat_shapes(tree)
            if not want:  # e.g. plain SGD: nothing to compare
                continue
            saved = self._saved_shapes(step, item)
            missing, extra = sorted(set(want) - set(saved)), sorted(set(saved) - set(want))
            if missing or extra:
                raise CheckpointMismatchError(
                    f"{where}: `{item}` has other entries than the model expects "
                    f"(missing from checkpoint: {missing[:5]}; unexpected: {extra[:5]})."
                    + (" Did the optimizer change?" if item == "opt_state" else ""))
            if bad := [f"{k}: saved {saved[k]}, model {want[k]}"
                       for k in want if saved[k] != want[k]]:
                raise CheckpointMismatchError(
                    f"{where}: `{item}` shapes differ from the model: " + "; ".join(bad[:5]))

    def _restore_step(self, step: int, target: TrainState) -> Restored:
        meta = self.meta(step)
        self._check_fits(step, meta, target)
        out = self._orbax_restore(step, ocp.args.Composite(**{
            k: ocp.args.StandardRestore(_abstract(v))
            for k, v in zip(_ARRAY_ITEMS, _array_items(target))}))
        train = out["train"]
        state = target.replace(step=train["step"], params=out["params"],
                               opt_state=out["opt_state"], rng=train["rng"],
                               carry=train.get("carry"))
        return Restored(state=state, step=step, data_state=meta.get("data_state"), meta=meta)

    def _quarantine(self, step: int, err: BaseException, fallback: int | None) -> None:
        src = os.path.join(self.directory, str(step))
        dst_root = self.directory.rstrip("/") + ".corrupted"
        dst = os.path.join(dst_root, f"{step}-{int(time.time())}")
        nxt = f"falling back to step {fallback}" if fallback is not None else "no older checkpoint"
        warnings.warn(f"checkpoint step {step} in {self.directory} is unreadable "
                      f"({type(err).__name__}: {str(err)[:300]}); moved to {dst}; {nxt}.",
                      CheckpointWarning, stacklevel=3)
        if not self.read_only and jax.process_index() == 0 and os.path.isdir(src):
            os.makedirs(dst_root, exist_ok=True)
            shutil.move(src, dst)
        with _quiet_orbax():
            self._mngr.reload()

    def restore(self, target: TrainState, step: int | None = None) -> Restored | None:
        """Restore into the structure, dtypes and shardings of ``target``.

        ``step=None``: the newest readable checkpoint (unreadable ones skipped with a
        :class:`CheckpointWarning`; all unreadable: :class:`CheckpointUnreadableError`), ``None`` if
        there is none; an explicit ``step`` is restored or raises. A checkpoint that does not fit
        raises :class:`CheckpointMismatchError`.
        """
        self.wait()
        _silence_closed_loop_noise()  # before any read: a failed one's callbacks come early
        if step is not None:
            return self._restore_step(int(step), target)
        steps = self.all_steps()
        for i in range(len(steps) - 1, -1, -1):
            try:
                return self._restore_step(steps[i], target)
            except CheckpointMismatchError:
                raise
            except Exception as err:  # noqa: BLE001 — any read failure means "corrupted"
                self._quarantine(steps[i], err, steps[i - 1] if i > 0 else None)
        if steps:
            raise CheckpointUnreadableError(
                f"no readable checkpoint in {self.directory} (steps {steps} all failed; "
                f"moved to {self.directory}.corrupted).")
        return None

    def restore_params(self, step: int | None = None, target: Any = None,
                       sharding: Any = None) -> Any:
        """The parameters alone (for inference); see :func:`restore_params`."""
        self.wait()
        _silence_closed_loop_noise()
        steps = [step] if step is not None else self.all_steps()[::-1]
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}.")
        where = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        to_abstract = lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=where)
        last_err: BaseException | None = None
        for s in steps:
            try:
                if target is None:
                    abstract = jax.tree_util.tree_map(to_abstract, self._item_md(s, "params"),
                                                      is_leaf=_is_array_md)
                else:
                    want, have = _flat_shapes(target), self._saved_shapes(s, "params")
                    if want != have:
                        diff = sorted(set(want.items()) ^ set(have.items()))[:4]
                        raise CheckpointMismatchError(
                            f"checkpoint {s} in {self.directory}: parameter names/shapes differ "
                            f"from `target` (e.g. {diff}).")
                    abstract = _abstract(target, sharding)
                out = self._orbax_restore(
                    s, ocp.args.Composite(params=ocp.args.StandardRestore(abstract)))
                return out["params"]
            except CheckpointMismatchError:
                raise
            except Exception as err:  # noqa: BLE001 — unreadable: try an older one
                if step is not None:
                    raise
                last_err = err
                warnings.warn(f"checkpoint step {s} in {self.directory} is unreadable "
                              f"({err!r:.300}); trying an older one.", CheckpointWarning,
                              stacklevel=2)
        raise CheckpointUnreadableError(
            f"no readable checkpoint in {self.directory}") from last_err


def _array_items(state: TrainState) -> tuple[Any, Any, Any]:
    """``state``'s :data:`_ARRAY_ITEMS`: ``params``, ``opt_state``, ``train``."""
    return state.params, state.opt_state, {"step": state.step, "rng": state.rng,
                                           "carry": state.carry}


def _state_bytes(state: TrainState) -> int:
    return tree_bytes((state.params, state.opt_state, state.rng, state.carry))


def _join_orbax_threads(timeout: float = 30.0) -> None:
    """Wait (``timeout`` s in all) for orbax's threads of a failed write, which may still write into
    the temporary folder about to be removed."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and type(thread).__module__.startswith(
                "orbax."):
            # the base class's join: orbax's re-raises the thread's error
            threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))


def _remove_partial_writes(directory: str) -> None:
    """Delete ``<step>.orbax-checkpoint-tmp*`` leftovers of a crash, synchronously (orbax's
    background clean-up can race a second manager)."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if ".orbax-checkpoint-tmp" in name:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _is_array_md(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _flat_shapes_md(tree: Any) -> dict[str, Any]:
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_array_md)[0]
    return {path_to_str(p): x for p, x in leaves if _is_array_md(x)}


def _open(directory: str | os.PathLike) -> Checkpointer:
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"no checkpoint directory {directory!r}.")
    return Checkpointer(directory, keep=None, async_save=False, read_only=True)


def _pick_step(ckpt: Checkpointer, step: int | str | None, best_metric: str | None,
               best_mode: str) -> int | None:
    if step == "best":
        ckpt.best_metric, ckpt.best_mode = best_metric, best_mode
        best = ckpt.best_step()
        if best is None:
            raise ValueError(f"no checkpoint in {ckpt.directory} has metric {best_metric!r}.")
        return best
    if step in (None, "latest"):
        return None
    return int(step)


def restore_params(directory: str | os.PathLike, step: int | str | None = None, *,
                   target: Any = None, sharding: Any = None, best_metric: str = "eval/loss",
                   best_mode: str = "min") -> Any:
    """Restore only the parameters of a checkpoint (no optimiser, for inference).

    Args:
        directory: the checkpoint directory (``<workdir>/checkpoints``).
        step: an int, ``"latest"``/``None`` (newest readable), or ``"best"`` (by
            ``best_metric``/``best_mode`` over each checkpoint's stored metrics).
        target: optional params tree whose names and shapes must match (else
            :class:`CheckpointMismatchError`) and whose shardings are used.
        sharding: every leaf's sharding without ``target`` (default: first device).
    """
    with _open(directory) as ckpt:
        return ckpt.restore_params(_pick_step(ckpt, step, best_metric, best_mode), target, sharding)


def load_meta(directory: str | os.PathLike, step: int | None = None) -> dict:
    """The ``meta`` JSON (``step``, ``data_state``, ``model_config``, ``metrics``) of ``step``
    (default: the newest)."""
    with _open(directory) as ckpt:
        step = ckpt.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {directory}.")
        return ckpt.meta(step)


def load_tokenizer_json(directory: str | os.PathLike, step: int | None = None) -> dict | None:
    """The tokenizer JSON dict saved with a checkpoint (default: the newest), or ``None``.

    The dict given to ``Checkpointer(tokenizer=...)``/``fit(tokenizer=...)``; rebuild a tokenizer
    from a ``tokenizer.json`` with :func:`seqjax.data.tokenizers.load_tokenizer`.
    """
    with _open(directory) as ckpt:
        step = ckpt.latest_step() if step is None else step
        if step is None or not os.path.isdir(os.path.join(ckpt.directory, str(step), "tokenizer")):
            return None
        out = ckpt._orbax_restore(step, ocp.args.Composite(tokenizer=ocp.args.JsonRestore()))
        return dict(out["tokenizer"])

"""Running experiments: discovery, the experiment protocol, configs, work dirs.

``seqjax train|eval|generate|list`` (:mod:`seqjax.cli`, which only parses arguments and
maps errors to exit statuses) and ``python -m seqjax.experiments.NAME``
(:func:`experiment_main`) both go through this module.

Experiment protocol — ``seqjax/experiments/NAME.py`` is an experiment when it defines:

* ``Config``: a frozen dataclass; every field is a ``--key=value`` option (nested
  dataclass fields as ``--outer.inner=value``). Conventional fields, used when present:
  ``workdir: str | None`` (where to checkpoint and resume; ``None`` = write nothing),
  ``steps: int``, ``seed: int``.
* ``run(cfg: Config) -> dict``: train (resuming from ``cfg.workdir`` if it holds
  checkpoints; :func:`seqjax.train.loop.fit` with ``workdir=cfg.workdir`` does this)
  and return a JSON-able summary.

and optionally:

* ``PRESETS: dict[str, dict[str, Any]]``: named overrides for ``--preset NAME``; a
  ``"smoke"`` preset (``--smoke``) runs in seconds and is what CI runs;
* ``evaluate(cfg: Config) -> dict``: metrics of the checkpoint in ``cfg.workdir``
  (``seqjax eval``);
* ``generate(cfg: Config, prompt: str, *, max_new_tokens: int, temperature: float,
  seed: int) -> str`` (``seqjax generate``);
* ``main(argv)``: for ``python -m seqjax.experiments.NAME``; usually
  ``return experiment_main(__file__, argv)``, which accepts the same options as
  ``seqjax train NAME``.

A module without ``Config`` and ``run`` is refused (:class:`ConfigError`).

**Configs and work dirs.** ``train`` with a ``--workdir`` writes ``DIR/experiment.json``
(the experiment's name and full config) and checkpoints, ``metrics.jsonl``, TensorBoard
events and curves there. Rerunning ``seqjax train`` with the same ``--workdir`` resumes from
the newest checkpoint: the saved config is the base, then the preset, then the new
``--key=value`` overrides (so ``--steps 4000`` extends a finished run). ``eval`` and
``generate`` read the experiment and config from ``DIR/experiment.json`` and refuse
overrides (or a saved config) that differ from the newest checkpoint's model config.
Unknown keys, values of the wrong type, a choice not among those its field declares
(``Literal[...]``: ``--compute_dtype``, ``--strategy``, ``--model.architecture``, ...), and
numbers out of their declared range (``PosInt``, ``NonNegInt``, ``PosFloat``, ``Fraction``:
``--steps`` < 0, ``--batch_size`` < 1, ``--learning_rate`` <= 0, ... see
:func:`check_ranges`) are :class:`ConfigError` naming the key — before anything is written
to the work dir — as is a checkpoint in the work dir that does not fit the model
(:class:`CheckpointMismatchError`). An option spelled as before the shared vocabulary
(``--layers``, ``--heads``, ``--dim``, ``--dropout``, ``--batch``, ``--d_model``) is refused
with its newest name (``--model.num_layers``, ``--model.num_heads``, ``--model.embed_dim``,
``--model.dropout_rate``, ``--batch_size``). A group of options (a nested dataclass field:
every recipe's network is ``--model.*``) is set key by key, listed key by key by ``--help``,
and saved nested in ``experiment.json``.

**A work dir is never poisoned.** A run that is refused (a checkpoint that does not fit,
a bad option, nothing to resume) or ends in a NaN leaves ``experiment.json`` as it was, so
the next ``train``/``eval`` starts from the last accepted config. A work dir whose
checkpoints are all unreadable (moved to ``DIR/checkpoints.corrupted``) still holds that
run's ``metrics.jsonl``: ``train`` refuses to start it over at step 0 unless given
``--restart``, which keeps the old history as ``metrics.jsonl.<time>.old``. A run killed
before its first checkpoint finished has nothing to lose (it is deterministic from its
seed): rerunning the same command starts it over, keeps the partial history the same way
and says so in one line.

**One run per work dir.** ``train`` holds the work dir's lock
(:func:`seqjax.train.workdir_lock.hold_workdir`) from before it writes anything
(``experiment.json``, ``--restart``'s set-aside) to the end of the run: a second run on the
same work dir is refused (:class:`~seqjax.train.workdir_lock.WorkdirBusyError`, naming the
holder). **A write that fails** (no space, no permission, an I/O error) — a checkpoint,
``metrics.jsonl``, the summary, ``experiment.json`` — is a
:class:`~seqjax.train.write_errors.WriteError` whose message ends with the command that
resumes the run (the same one, less ``--restart``). **The data iterator failing** (it
raised, or ran out of batches) is a :class:`~seqjax.train.fit_parts.DataIteratorError`
with the same ending, after the last completed step was checkpointed (``seqjax train``
prints the iterator's traceback, then that line, and exits 4).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import pkgutil
import re
import shlex
import sys
import traceback
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

from seqjax._env import env_bool, is_bool, parse_bool
from seqjax._io import write_atomic, write_json
from seqjax.data.corpora import CorpusNotFoundError
from seqjax.data.shards import ShardError
from seqjax.experiments._config import (
    ConfigError,
    _hints,
    apply_overrides,
    check_field_ranges,
    config_from_dict,
    describe_type,
    parse_overrides,
    renamed,
)
from seqjax.train.checkpoint import CheckpointMismatchError, CheckpointUnreadableError
from seqjax.train.loop import CHECKED_ENV, DataIteratorError, ResumeError, checked_by_default
from seqjax.train.parallel import LayoutError
from seqjax.train.preemption import EXIT_STOPPED, RunStopped, pending_stop, stop_requests
from seqjax.train.workdir_lock import WorkdirBusyError, hold_workdir
from seqjax.train.write_errors import WriteError, resumed_by

__all__ = [
    "EXPERIMENT_FILE",
    "list_experiments",
    "follows_protocol",
    "load_experiment",
    "describe_experiments",
    "build_config",
    "check_ranges",
    "train_experiment",
    "experiment_main",
    "experiment_from_workdir",
]

EXPERIMENT_FILE = "experiment.json"


def list_experiments() -> list[str]:
    """The names of the experiment modules in the ``experiments`` package.

    Only public plain modules count: private ones (``_kit``, ``_runner``) and packages
    (``reports``, the experiments' markdown and figure writers) are not experiments.
    """
    from seqjax import experiments

    return sorted(
        m.name for m in pkgutil.iter_modules(experiments.__path__)
        if not m.name.startswith("_") and not m.ispkg and m.name != "results"
    )


def follows_protocol(module: ModuleType) -> bool:
    """True when ``module`` defines a dataclass ``Config`` and a callable ``run``."""
    cfg_cls = getattr(module, "Config", None)
    return (isinstance(cfg_cls, type) and dataclasses.is_dataclass(cfg_cls)
            and callable(getattr(module, "run", None)))


def load_experiment(name: str) -> ModuleType:
    """Import ``seqjax.experiments.NAME`` and check that it follows the protocol."""
    names = list_experiments()
    if name not in names:
        raise ConfigError(f"unknown experiment {name!r}; choose one of: {', '.join(names)}.")
    module = importlib.import_module(f"seqjax.experiments.{name}")
    if follows_protocol(module):
        return module
    raise ConfigError(
        f"seqjax/experiments/{name}.py must define a dataclass `Config` and `run(cfg)` "
        "(see the docstring of seqjax.experiments._runner)."
    )


def _read_saved(workdir: str | None) -> dict | None:
    if not workdir:
        return None
    path = os.path.join(workdir, EXPERIMENT_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _saved_config(cfg_cls: type, saved: dict, workdir: str) -> Any:
    """The config a work dir's ``experiment.json`` holds; one the recipe no longer reads (an
    option since removed) is a :class:`ConfigError` that names the work dir."""
    try:
        return config_from_dict(cfg_cls, saved["config"])
    except ConfigError as err:
        raise ConfigError(f"the work dir {workdir!r} holds a config this version cannot read "
                          f"({err}): it was written by an older seqjax; train in a new "
                          "--workdir.") from None


def build_config(
    module: ModuleType, name: str, argv: Sequence[str], *, resume: bool = True
) -> Any:
    """``Config`` from (saved workdir config) + preset + ``--key=value`` overrides."""
    overrides = parse_overrides(argv)
    cfg_cls = module.Config
    fields = {f.name for f in dataclasses.fields(cfg_cls)}
    presets: dict[str, dict] = dict(getattr(module, "PRESETS", {}) or {})
    preset = None
    if "smoke" not in fields and overrides.get("smoke") is not None:
        smoke = overrides.pop("smoke")
        if smoke is not True and not (isinstance(smoke, str) and is_bool(smoke)
                                      and parse_bool(smoke, "--smoke")):
            raise ConfigError("--smoke takes no value.")
        preset = "smoke"
    if "preset" not in fields and "preset" in overrides:
        preset = overrides.pop("preset")
    if preset is not None and preset not in presets:
        raise ConfigError(
            f"unknown preset {preset!r} for experiment {name}; "
            f"presets: {', '.join(presets) or '(none)'}."
        )
    cfg = cfg_cls()
    saved = _read_saved(overrides.get("workdir")) if resume else None
    if saved is not None:
        if saved.get("experiment") != name:
            raise ConfigError(
                f"work dir {overrides['workdir']!r} belongs to experiment "
                f"{saved.get('experiment')!r}, not {name!r}; use another --workdir."
            )
        cfg = _saved_config(cfg_cls, saved, overrides["workdir"])
    if preset is not None:
        cfg = apply_overrides(cfg, presets[preset])
    cfg = apply_overrides(cfg, overrides)
    check_ranges(cfg)
    return cfg


def check_ranges(cfg: Any, prefix: str = "") -> None:
    """Refuse options out of range before anything is written: each numeric field's range
    from its declaration (``PosInt``, ``NonNegInt``, ``PosFloat``, ``Fraction``, ... of
    :mod:`seqjax.experiments._config`; :func:`~seqjax.experiments._config.check_field_ranges`),
    ``--mesh`` well formed, and the checks that relate two options: the ``*_every``
    intervals multiples of ``steps_per_call``, ``embed_dim`` a multiple of ``num_heads``
    (attention models). A :class:`ConfigError` naming the option (exit status 2), not a
    traceback from deep inside the run."""
    check_field_ranges(cfg, prefix)
    mesh = getattr(cfg, "mesh", None)
    if isinstance(mesh, str):
        from seqjax.train.parallel import parse_mesh

        try:
            parse_mesh(mesh)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"--{prefix}mesh: {err}") from None
    k = getattr(cfg, "steps_per_call", None)
    if isinstance(k, int) and not isinstance(k, bool) and k >= 1:
        for name in ("log_every", "eval_every", "checkpoint_every"):
            v = getattr(cfg, name, None)
            if isinstance(v, int) and v % k:
                raise ConfigError(f"--{prefix}{name} must be a multiple of "
                                  f"--{prefix}steps_per_call={k}; got {v}.")
    _check_heads(cfg, prefix)


def _check_heads(cfg: Any, prefix: str) -> None:
    """``embed_dim`` a multiple of ``num_heads`` in ``cfg`` and its groups of options
    (``--model.*``), unless the model is recurrent."""
    heads, width = getattr(cfg, "num_heads", None), getattr(cfg, "embed_dim", None)
    model = getattr(cfg, "architecture", getattr(cfg, "model", "transformer"))
    if (isinstance(heads, int) and isinstance(width, int) and heads >= 1 and width % heads
            and model not in ("lstm", "gru", "rnn", "elman")):
        raise ConfigError(f"--{prefix}embed_dim must be a multiple of --{prefix}num_heads = "
                          f"{heads} (each head gets embed_dim / num_heads features); got "
                          f"{width}.")
    for f in dataclasses.fields(cfg):
        group = getattr(cfg, f.name)
        if dataclasses.is_dataclass(group) and not isinstance(group, type):
            _check_heads(group, f"{prefix}{f.name}.")


@dataclasses.dataclass(frozen=True)
class Switches:
    """The command line's switches: options that are not config keys, each ``--name`` or
    ``--name=BOOL`` (:func:`seqjax._env.parse_bool`), else its environment variable. These
    variables are read here, once per run (:func:`_pop_switches`), not by the library:
    ``fit`` takes ``checked`` from its :class:`~seqjax.train.loop.FitConfig`, which the
    runner fills by running the recipe inside :func:`~seqjax.train.loop.checked_by_default`.

    Attributes:
        checked: ``--checked``, else ``$SEQJAX_CHECKED`` (unset = off): every ``fit`` of the
            run under :func:`seqjax.checked`.
        compile_cache: ``--compile_cache``, else ``$SEQJAX_COMPILE_CACHE`` (unset = on;
            :func:`seqjax.compile_cache.compile_cache_switch`): JAX's persistent compilation
            cache.
        restart: ``--restart`` (no variable): start over a work dir with nothing to resume.
    """

    checked: bool = False
    compile_cache: bool = True
    restart: bool = False


def _pop_switches(argv: Sequence[str]) -> tuple[list[str], Switches]:
    """Take the :class:`Switches` out of ``argv``: ``(the other options, the switches)``.
    A value that is not a boolean, in an option or in a variable (read even when its option
    is given, so a stale one is never silently ignored), is a :class:`ConfigError`."""
    from seqjax.compile_cache import compile_cache_switch

    try:
        found: dict[str, bool] = {"checked": env_bool(CHECKED_ENV, False),
                                  "compile_cache": compile_cache_switch(), "restart": False}
        out = []
        for arg in argv:
            key, eq, value = arg.partition("=")
            name = key[2:] if key.startswith("--") else None
            if name not in found:
                out.append(arg)
            else:
                found[name] = parse_bool(value, key) if eq else True
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return out, Switches(**found)


def _restart(cfg: Any) -> None:
    """``--restart``: start a work dir over whose run has no checkpoint left to resume —
    its ``metrics.jsonl`` is kept as ``metrics.jsonl.<time>.old``. Refused while
    checkpoints exist (they would be resumed, not restarted)."""
    from seqjax.train.records import set_aside_history

    workdir = getattr(cfg, "workdir", None)
    if not workdir:
        raise ConfigError("--restart needs a --workdir to start over in.")
    ckpt_dir = os.path.join(workdir, "checkpoints")
    steps = sorted(int(n) for n in os.listdir(ckpt_dir) if n.isdigit()) \
        if os.path.isdir(ckpt_dir) else []
    if steps:
        raise ConfigError(
            f"--restart: {workdir!r} holds checkpoints (steps {steps}) that a rerun resumes "
            f"from; remove {ckpt_dir!r} to discard them, or use a new --workdir."
        )
    set_aside_history(workdir)


@contextlib.contextmanager
def _config_saved(name: str, cfg: Any) -> Iterator[None]:
    """Save ``cfg`` as the work dir's ``experiment.json`` for the run, and put the previous
    file back (or remove it) when the run is refused — a config the checkpoint does not
    fit, a bad option, a work dir that cannot be resumed — or ends in a NaN: a refused or
    diverged override never becomes the base config of the next run."""
    workdir = getattr(cfg, "workdir", None)
    path = os.path.join(workdir, EXPERIMENT_FILE) if workdir else None
    before = None
    if path is not None and _primary() and os.path.exists(path):
        with open(path, "rb") as f:
            before = f.read()
    _save_config(name, cfg)
    try:
        yield
    except (CheckpointMismatchError, CheckpointUnreadableError, ConfigError, LayoutError,
            ResumeError, CorpusNotFoundError, ShardError, FloatingPointError):
        if path is not None and _primary():
            if before is None:
                if os.path.exists(path):
                    os.remove(path)
            else:
                write_atomic(path, before)
        raise


@contextlib.contextmanager
def _in_workdir(cfg: Any, command: str) -> Iterator[None]:
    """Hold the work dir's lock for the block, and name ``command`` as the way to resume
    in a :class:`~seqjax.train.write_errors.WriteError` or
    :class:`~seqjax.train.fit_parts.DataIteratorError` that ends it."""
    workdir = getattr(cfg, "workdir", None)
    with hold_workdir(workdir), resumed_by(command, workdir, (DataIteratorError,)):
        yield


def _resume_command(prefix: str, argv: Sequence[str]) -> str:
    """The command line that resumes a run: ``prefix`` and ``argv`` less ``--restart``
    (a rerun with it would be refused once a checkpoint exists)."""
    kept = [a for a in argv if a.partition("=")[0] != "--restart"]
    return shlex.join([*prefix.split(), *kept])


def _save_config(name: str, cfg: Any) -> None:
    workdir = getattr(cfg, "workdir", None)
    if not workdir or not _primary():
        return
    write_json(os.path.join(workdir, EXPERIMENT_FILE),
               {"experiment": name, "config": dataclasses.asdict(cfg)})


def _primary() -> bool:
    """Process 0 of a multi-process job (or the only process) writes shared files."""
    import jax

    return jax.process_index() == 0


def _start_process(compile_cache: bool = True) -> None:
    """Join the multi-process job the environment describes, before any other JAX call;
    then, on the CPU, keep freed memory in the heap before any operation has run, so that
    every XLA thread allocates from the one main heap
    (:func:`seqjax.train.cpu_memory.keep_freed_memory`); then turn on JAX's persistent
    compilation cache (:func:`seqjax.enable_compile_cache`) when ``compile_cache``
    (:attr:`Switches.compile_cache`). A ``$SEQJAX_KEEP_FREED_MEMORY`` that is not a boolean
    is a :class:`ConfigError`."""
    from seqjax.compile_cache import enable_compile_cache
    from seqjax.train.cpu_memory import keep_freed_memory
    from seqjax.train.sharding import maybe_initialize_distributed

    maybe_initialize_distributed()
    try:
        keep_freed_memory()
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if compile_cache:
        try:
            enable_compile_cache()
        except ValueError as err:  # an unwritable folder: run without the cache, say so
            print(f"seqjax: compile cache off: {err}", file=sys.stderr)


def _field_meanings(cfg_cls: type) -> dict[str, str]:
    """``{field: one line}`` from the ``Attributes:`` section of ``cfg_cls``'s docstring
    (``name: text`` lines; continuation lines are joined)."""
    meanings: dict[str, str] = {}
    for klass in reversed(cfg_cls.__mro__):  # a subclass's text wins over its base's
        if dataclasses.is_dataclass(klass):
            meanings.update(_attributes_section(klass))
    return meanings


def _attributes_section(klass: type) -> dict[str, str]:
    doc = klass.__dict__.get("__doc__") or ""
    doc = inspect.cleandoc(doc)
    meanings: dict[str, str] = {}
    names = {f.name for f in dataclasses.fields(klass)}
    current = None
    in_attributes = False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped == "Attributes:":
            in_attributes = True
            continue
        if not in_attributes:
            continue
        head, sep, text = stripped.partition(":")
        keys = [k.strip() for k in head.split(",")]
        if sep and keys and all(k in names for k in keys):
            current = keys
            for k in keys:
                meanings[k] = text.strip()
        elif stripped and current is not None:
            for k in current:
                meanings[k] = f"{meanings[k]} {stripped}".strip()
        elif not stripped:
            current = None
    return meanings


def _option_lines(cfg: Any, prefix: str) -> list[str]:
    """``--key (type, default value): meaning`` of each option of ``cfg``; a group of options
    (``--model``) as its own lines, ``--model.KEY``, at the recipe's defaults."""
    meanings, hints, lines = _field_meanings(type(cfg)), _hints(type(cfg)), []
    for f in dataclasses.fields(cfg):
        default = getattr(cfg, f.name)
        group = dataclasses.is_dataclass(default) and not isinstance(default, type)
        line = (f"  --{prefix}{f.name}.KEY ({type(default).__name__}, the options below)"
                if group else f"  --{prefix}{f.name} ({describe_type(hints.get(f.name, f.type))},"
                f" default {default!r})")
        if f.name in meanings:  # docstring markup dropped for the terminal
            text = re.sub(r":\w+:`~?([^`]+)`", r"\1", meanings[f.name]).replace("``", "")
            line += f": {text}"
        lines.append(line)
        lines += _option_lines(default, f"{prefix}{f.name}.") if group else []
    return lines


def experiment_help(name: str) -> str:
    """``seqjax train NAME --help``: what the experiment does, every option of its
    ``Config`` with its type, default and meaning (where its docstring gives one), and its
    presets."""
    module = load_experiment(name)
    cfg_cls = module.Config
    summary = (module.__doc__ or "").strip().split("\n\n")[0]
    lines = [f"usage: seqjax train {name} [--preset P | --smoke] [--restart] "
             "[--compile_cache=false] [--key=value ...]",
             "", summary, "",
             "--compile_cache=false: run without JAX's persistent compilation cache (on by "
             "default, in ~/.cache/seqjax/jax; $SEQJAX_COMPILE_CACHE=0 also turns it off, "
             "$JAX_COMPILATION_CACHE_DIR moves it). --checked: run training under "
             "seqjax.checked (an invalid id, length or cache overflow inside a step is an "
             "error naming it, not a NaN; $SEQJAX_CHECKED=1 also turns it on).",
             "", f"Exit status {EXIT_STOPPED}: stopped by SIGTERM/SIGINT (at any point of the "
             "run) after saving its checkpoint; not finished: rerun the same command to resume.",
             "", "options (--key=value; type, default):"]
    lines += _option_lines(cfg_cls(), "")
    presets = getattr(module, "PRESETS", {}) or {}
    if presets:
        lines += ["", "presets (--preset NAME; --smoke is --preset smoke):"]
        for p, values in presets.items():
            shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
            lines.append(f"  {p}: {shown}")
    lines += ["", f"Module: python -m seqjax.experiments.{name} takes the same options."]
    return "\n".join(lines)


def train_experiment(name: str, argv: Sequence[str], *, command: str | None = None) -> Any:
    """``seqjax train NAME [options]``: build the config (saved work-dir config, preset,
    ``--key=value``; ``--restart``), save it as the work dir's ``experiment.json`` and run
    it. Returns what ``run(cfg)`` returns. Refusals raise (:class:`ConfigError`,
    :class:`CheckpointMismatchError`, :class:`ResumeError`, :class:`CheckpointUnreadableError`,
    a ``FloatingPointError`` for a NaN) and leave ``experiment.json`` as it was; a work dir
    another run holds is a :class:`~seqjax.train.workdir_lock.WorkdirBusyError` (nothing
    written), a failed write a :class:`~seqjax.train.write_errors.WriteError`; a run stopped by
    a signal a :class:`~seqjax.train.preemption.RunStopped`. ``command``: how the errors say to
    resume (default ``seqjax train NAME ARGV``)."""
    command = command or _resume_command(f"seqjax train {name}", argv)
    with stop_requests():  # a signal from here on stops the run at a step boundary
        argv, switches = _pop_switches(argv)
        _start_process(switches.compile_cache)
        module = load_experiment(name)
        cfg = build_config(module, name, argv)
        with _in_workdir(cfg, command):
            if switches.restart:
                _restart(cfg)
            with _config_saved(name, cfg), checked_by_default(switches.checked):
                return _check_stopped(module.run(cfg))


def _check_stopped(result: Any) -> Any:
    """``result`` of a run that was not stopped; else :class:`RunStopped` (``run`` returned a
    stopped summary, or a signal came after training, while results were written)."""
    late = pending_stop(take=True)
    if isinstance(result, dict) and result.get("status") == "interrupted":
        steps = result.get("steps")
        raise RunStopped(result.get("signal") or late or "a signal",
                         "" if steps is None else f" at step {steps}")
    if late is not None:
        raise RunStopped(late, " after training (its results written)")
    return result


def experiment_main(experiment: str, argv: Sequence[str] | None = None) -> dict:
    """``python -m seqjax.experiments.NAME [options]``: the same options as ``seqjax train NAME``.

    ``experiment`` is the experiment's name, module name or ``__file__``.
    """
    name = os.path.splitext(os.path.basename(experiment))[0].rsplit(".", 1)[-1]
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _resume_command(f"python -m seqjax.experiments.{name}", argv)
    if any(a in ("-h", "--help") for a in argv):
        print(experiment_help(name))
        return {}
    try:
        return train_experiment(name, argv, command=command)
    except RunStopped as err:
        print(f"{name}: {err}", file=sys.stderr)
        raise SystemExit(EXIT_STOPPED) from None
    except (WorkdirBusyError, ConfigError, ShardError) as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except WriteError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        raise SystemExit(3) from None
    except DataIteratorError as err:
        traceback.print_exception(err.error, file=sys.stderr)
        print(f"{name}: error: {err}", file=sys.stderr)
        raise SystemExit(4) from None


def experiment_from_workdir(
    name: str | None, workdir: str, argv: Sequence[str]
) -> tuple[ModuleType, Any]:
    """``(module, cfg)`` of the experiment trained in ``workdir`` (``eval``/``generate``): its
    saved config plus the ``--key=value`` overrides in ``argv``, checked against the newest
    checkpoint's model config."""
    saved = _read_saved(workdir)
    if saved is None:
        raise ConfigError(f"no {EXPERIMENT_FILE} in {workdir!r}; train there with "
                          "`seqjax train EXPERIMENT --workdir DIR` first.")
    name = name or saved["experiment"]
    if name != saved.get("experiment"):
        raise ConfigError(f"work dir {workdir!r} belongs to experiment "
                          f"{saved.get('experiment')!r}, not {name!r}.")
    module = load_experiment(name)
    cfg = _saved_config(module.Config, saved, workdir)
    cfg = apply_overrides(cfg, {**parse_overrides(argv), "workdir": workdir})
    check_ranges(cfg)
    _check_model_config(cfg, workdir)
    return module, cfg


def _flat_config(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """``cfg``'s options by their command-line names; a group's (``--model``) only key by key
    (``model.num_layers``), so a checkpoint's ``"model": "lstm"`` is never read as it."""
    out: dict[str, Any] = {}
    for key, value in dataclasses.asdict(cfg).items():
        if isinstance(value, dict):
            out.update({f"{prefix}{key}.{k}": v for k, v in _flat_dict(value).items()})
        if not dataclasses.is_dataclass(getattr(cfg, key)):
            out[f"{prefix}{key}"] = value
    return out


def _flat_dict(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat_dict(v, f"{prefix}{k}."))
        out[f"{prefix}{k}"] = v
    return out


def _check_model_config(cfg: Any, workdir: str) -> None:
    """``eval``/``generate``: the config (saved + overrides) must describe the model the
    newest checkpoint was trained with — every config key that also appears in the
    checkpoint's ``model_config`` must have the same value there — else a
    :class:`CheckpointMismatchError` naming the keys (a model of another size would fail
    deep inside, or silently load into the wrong shapes)."""
    from seqjax.train.checkpoint import _jsonable, load_meta

    ckpt_dir = os.path.join(workdir, "checkpoints")
    try:
        model_config = load_meta(ckpt_dir).get("model_config") or {}
    except Exception:  # noqa: BLE001 — no (readable) checkpoint: the experiment reports it
        return
    ours = _jsonable(_flat_config(cfg))
    saved = _jsonable(_flat_dict(model_config)) if isinstance(model_config, dict) else {}
    old_names = renamed(type(cfg))
    saved = {old_names.get(k, k): v for k, v in saved.items()}  # a checkpoint's older names
    diff = [f"--{k}={ours[k]!r} but the checkpoint has {saved[k]!r}"
            for k in sorted(set(ours) & set(saved)) if ours[k] != saved[k]]
    if diff:
        raise CheckpointMismatchError(
            f"the checkpoint in {ckpt_dir!r} was trained with another model config: "
            + "; ".join(diff) + ". Drop the override(s), or train this config in a new --workdir."
        )


def describe_experiments() -> list[tuple[str, str, str]]:
    """``(name, first line of its docstring, presets)`` of every experiment (``seqjax list``);
    one that cannot be imported says why in place of its description."""
    out = []
    for name in list_experiments():
        try:
            module = load_experiment(name)
        except (ConfigError, ImportError) as err:
            out.append((name, f"(not loadable: {err})", ""))
            continue
        doc = (module.__doc__ or "").strip().splitlines()
        presets = ", ".join(getattr(module, "PRESETS", {}) or {}) or "-"
        out.append((name, doc[0] if doc else "", presets))
    return out

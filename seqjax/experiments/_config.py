"""Frozen-dataclass configs from ``--key=value`` command-line overrides.

``parse_overrides(["--hidden=32", "--lr", "0.1", "--model.layers=2", "--shuffle"])``
gives ``{"hidden": "32", "lr": "0.1", "model.layers": "2", "shuffle": True}``;
:func:`apply_overrides` checks every key against the dataclass fields (dotted keys reach
nested dataclasses) and converts each value to its field's type — ``int``, ``float``,
``bool``, ``str``, ``X | None``, ``tuple[int, ...]`` (comma separated) and ``Literal``
(the allowed values of a choice: dtypes, strategies, models, inputs).
Unknown keys and values that do not convert are a :class:`ConfigError` that names the
key, the expected type and the value (with a "did you mean" for near-misses); a key
spelled as before a rename (:data:`RENAMED`) names its new spelling.

**Ranges come from the declaration.** A numeric field declared ``Annotated[int, Range(...)]``
(the aliases :data:`PosInt`, :data:`NonNegInt`, :data:`PosFloat`, :data:`NonNegFloat`,
:data:`Fraction`; also as the items of a tuple) is checked by :func:`check_field_ranges`, so no
option can forget its range.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from seqjax._env import is_bool, parse_bool
from seqjax._ranges import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt, Range

__all__ = [
    "ConfigError",
    "Range",
    "PosInt",
    "NonNegInt",
    "PosFloat",
    "NonNegFloat",
    "Fraction",
    "RENAMED",
    "moved_into",
    "renamed",
    "field_range",
    "check_field_ranges",
    "describe_type",
    "parse_overrides",
    "apply_overrides",
    "config_from_dict",
    "saved_config",
]

_NONE = {"none", "null"}


class ConfigError(ValueError):
    """A bad ``--key=value`` override (unknown key or a value of the wrong type)."""


#: Options renamed to the one spelling shared by the library and every recipe: ``{old: new}``.
#: For one release the old spelling is refused with the new name (a saved ``experiment.json``
#: is read with the new names). A rename that holds for one recipe only is the ``RENAMED``
#: class attribute of its ``Config`` (:func:`renamed`).
RENAMED: dict[str, str] = {
    "layers": "num_layers",
    "heads": "num_heads",
    "dim": "embed_dim",
    "d_model": "embed_dim",
    "dropout": "dropout_rate",
    "batch": "batch_size",
    "hidden": "hidden_size",
    "warmup": "warmup_steps",
    "transformer_layers": "num_layers",
}


def moved_into(group: str, cls: type, *, but: tuple[str, ...] = ()) -> dict[str, str]:
    """The renames of options that moved into the group ``--GROUP.*``: ``{name:
    "GROUP.name"}`` for each field of the group's class ``cls`` (``but`` those that are new),
    for a recipe's ``RENAMED``.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class ModelOptions:
        ...     num_layers: int = 2
        ...     qk_norm: bool = False
        >>> moved_into("model", ModelOptions, but=("qk_norm",))
        {'num_layers': 'model.num_layers'}
    """
    return {f.name: f"{group}.{f.name}" for f in dataclasses.fields(cls) if f.name not in but}


def renamed(cls: type) -> dict[str, str]:
    """The retired spellings of ``cls``'s options: :data:`RENAMED` and the class's own
    ``RENAMED`` (a ``ClassVar``, for a rename that holds in one recipe only), whose entries
    win; an option renamed twice (``layers`` -> ``num_layers`` -> ``model.num_layers``) names
    its newest spelling."""
    names = {**RENAMED, **getattr(cls, "RENAMED", {})}
    newest = {}
    for old, new in names.items():
        seen = {old}
        while new in names and new not in seen:
            seen.add(new)
            new = names[new]
        newest[old] = new
    return newest


def field_range(tp: Any) -> tuple[Any, Range | None, bool]:
    """``(base type, Range or None, is_tuple)`` of a field's declared type (through
    ``X | None`` and ``tuple[X, ...]``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        subs = [a for a in args if a is not type(None)]
        if len(subs) == 1:
            return field_range(subs[0])
        return tp, None, False
    if origin in (tuple, list) and args:
        base, rng, _ = field_range(args[0])
        return base, rng, True
    if origin is Annotated:
        rng = next((m for m in tp.__metadata__ if isinstance(m, Range)), None)
        return args[0], rng, False
    return tp, None, False


def describe_type(tp: Any) -> str:
    """A field's type as ``--help`` shows it: ``int >= 1``, ``float in [0, 1)``,
    ``'float32' | 'bfloat16'``, ``tuple of (int >= 1)``, ``str | None``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(describe_type(a) for a in args)
    if origin in (tuple, list) and args:
        return f"tuple of ({describe_type(args[0])})"
    base, rng, _ = field_range(tp)
    if rng is None or origin is not Annotated:
        return _type_name(tp)
    what = rng.describe(base)
    return what.replace("an int", "int").replace("a finite number", _type_name(base)) if \
        not what.startswith("lie") else f"{_type_name(base)} {what[4:]}"


def check_field_ranges(cfg: Any, prefix: str = "") -> None:
    """Refuse a value outside its field's declared :class:`Range` (nested configs too): a
    :class:`ConfigError` naming the option, the range and the value."""
    hints = _hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value, key = getattr(cfg, f.name), f"--{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_field_ranges(value, f"{prefix}{f.name}.")
            continue
        base, rng, _ = field_range(hints[f.name])
        if rng is None or value is None:
            continue
        for x in value if isinstance(value, tuple | list) else (value,):
            if isinstance(x, int | float) and not isinstance(x, bool) and not rng.admits(x):
                what = rng.describe(base)
                verb = "" if what.startswith("lie") else "be "
                got = value if isinstance(value, int | float) else f"{x} in {value}"
                raise ConfigError(f"{key} must {verb}{what}; got {got}.")


def parse_overrides(argv: Sequence[str]) -> dict[str, Any]:
    """``["--a=1", "--b", "2", "--flag"]`` → ``{"a": "1", "b": "2", "flag": True}``.

    Dashes inside keys become underscores (``--learning-rate`` = ``--learning_rate``);
    a key given twice keeps the last value.

    Example:
        >>> parse_overrides(["--hidden=32", "--learning-rate", "0.1", "--smoke"])
        {'hidden': '32', 'learning_rate': '0.1', 'smoke': True}
    """
    out: dict[str, Any] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"expected --key=value, got {arg!r}.")
        body = arg[2:]
        if "=" in body:
            key, value = body.split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            key, value = body, args[i + 1]
            i += 1
        else:
            key, value = body, True
        if not key:
            raise ConfigError(f"empty key in {arg!r}.")
        out[key.replace("-", "_")] = value
        i += 1
    return out


def _hints(cls: type) -> dict[str, Any]:
    try:  # each class of the MRO in its own module's names (an inherited field too)
        return typing.get_type_hints(cls, include_extras=True)
    except NameError:
        module = sys.modules.get(cls.__module__)
        return typing.get_type_hints(cls, vars(module) if module else None, include_extras=True)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if typing.get_origin(tp) is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    name = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
    return re.sub(r"Annotated\[(\w+), Range\([^)]*\)\]", r"\1", name)


def _convert(key: str, value: Any, tp: Any) -> Any:
    """Convert a command-line string (or an already-typed value) to ``tp``."""
    if typing.get_origin(tp) is Annotated:  # the range is checked on the whole config
        base, rng, _ = field_range(tp)
        if (value is None or (isinstance(value, str) and value.lower() in _NONE)) and \
                rng is not None and rng.admits(0):  # one meaning of off: 0, never None
            raise ConfigError(f"--{key}: expected {_type_name(base)}; got {value!r} "
                              f"(0 turns this option off).")
        tp = typing.get_args(tp)[0]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    bad = ConfigError(f"--{key}: expected {_type_name(tp)}; got {value!r}.")
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.lower() in _NONE)
        if type(None) in args and is_none:
            return None
        for sub in (a for a in args if a is not type(None)):
            try:
                return _convert(key, value, sub)
            except ConfigError:
                continue
        raise bad
    if origin is typing.Literal:
        for a in args:
            try:
                if _convert(key, value, type(a)) == a:
                    return a
            except ConfigError:
                continue
        raise ConfigError(f"--{key}: expected one of {list(args)}; got {value!r}.")
    if origin in (tuple, list) or tp in (tuple, list):
        item = args[0] if args else str
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",") if p.strip()]
        elif isinstance(value, list | tuple):
            parts = list(value)
        else:
            raise bad
        conv = [_convert(key, p, item) for p in parts]
        return tuple(conv) if (origin or tp) is tuple else conv
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and is_bool(value):
            return parse_bool(value, f"--{key}")
        raise bad
    if value is True:  # a bare --flag for a non-bool field
        raise ConfigError(f"--{key} needs a value of type {_type_name(tp)}.")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return int(str(value).replace("_", ""))
        except ValueError:
            raise bad from None
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise bad from None
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad
    if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        return _from_dict(tp, value, f"{key}.")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(
        f"--{key}: cannot set a field of type {_type_name(tp)} from the command line."
    )


def _unknown(key: str, cls: type, prefix: str) -> ConfigError:
    names = [f.name for f in dataclasses.fields(cls)]
    new = renamed(cls).get(key)
    if new is not None and new.partition(".")[0] in names:  # "model.num_layers": nested now
        why = (f"the options of --{prefix}{new.partition('.')[0]} are one group" if "." in new
               else "one spelling across the recipes")
        return ConfigError(f"--{prefix}{key} is now --{prefix}{new} ({why}); use "
                           f"--{prefix}{new}=VALUE.")
    moved = {old: n for old, n in renamed(cls).items() if n.partition(".")[0] in names}
    close = difflib.get_close_matches(key, [*names, *moved], n=1)  # a typo of a moved name too
    hint = f" Did you mean --{prefix}{moved.get(close[0], close[0])}?" if close else ""
    return ConfigError(
        f"unknown config key --{prefix}{key} for {cls.__name__}.{hint} "
        f"Valid keys: {', '.join(names)}."
    )


def apply_overrides(cfg: Any, overrides: Mapping[str, Any]) -> Any:
    """A copy of the dataclass ``cfg`` with typed ``overrides`` (dotted keys for nesting).

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class C:
        ...     hidden: int = 8
        ...     rate: float | None = None
        >>> apply_overrides(C(), {"hidden": "32", "rate": "0.5"})
        C(hidden=32, rate=0.5)
    """
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"`cfg` must be a dataclass instance; got {type(cfg).__name__}.")
    return _apply(cfg, dict(overrides), "")


def _apply(cfg: Any, overrides: dict[str, Any], prefix: str) -> Any:
    cls = type(cfg)
    hints = _hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        head, dot, rest = key.partition(".")
        if head not in fields:
            raise _unknown(head, cls, prefix)
        if dot and not rest:
            raise ConfigError(f"--{prefix}{key}: no option named after the '.' (a group's "
                              f"options are --{prefix}{head}.KEY=VALUE).")
        if rest:
            nested.setdefault(head, {})[rest] = value
        elif _is_group(hints[head]) and isinstance(value, Mapping):
            nested.setdefault(head, {}).update(value)  # over the group as it is
        elif _is_group(hints[head]):
            raise _group_value(head, value, cls, prefix)
        else:
            direct[head] = _convert(prefix + head, value, hints[head])
    for head, sub in nested.items():
        current = direct.get(head, getattr(cfg, head))
        if not dataclasses.is_dataclass(current):
            raise ConfigError(f"--{prefix}{head} is not a nested config; cannot set {list(sub)}.")
        direct[head] = _apply(current, sub, f"{prefix}{head}.")
    try:
        return dataclasses.replace(cfg, **direct)
    except (TypeError, ValueError) as err:
        raise ConfigError(_invalid(cls, err)) from err


def _is_group(tp: Any) -> bool:
    """Whether a field is a nested config (a group of options ``--NAME.KEY=VALUE``)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _group_value(key: str, value: Any, cls: type, prefix: str) -> ConfigError:
    """``--model=lstm`` where ``model`` is a group: its options are ``--model.KEY``, and a
    value that a renamed option took names the new key (``--model.architecture=lstm``)."""
    new = renamed(cls).get(key, "")
    shown = value if isinstance(value, str) else "VALUE"
    if new.startswith(f"{key}."):
        return ConfigError(f"--{prefix}{key} is now --{prefix}{new} (the options of "
                           f"--{prefix}{key} are one group); use --{prefix}{new}={shown}.")
    names = ", ".join(f.name for f in dataclasses.fields(_hints(cls)[key]))
    return ConfigError(f"--{prefix}{key} is a group of options; set one as "
                       f"--{prefix}{key}.KEY=VALUE (keys: {names}).")


def saved_config(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """A config as a run saved it (``experiment.json``, a summary's ``config``) in today's
    names, neither checked nor completed (:func:`config_from_dict` builds it): an option saved
    before a rename under its new name, one that has since moved into a group in the group
    (``{"num_layers": 4}`` -> ``{"model": {"num_layers": 4}}``; gpt2's ``"model": "lstm"`` ->
    ``{"model": {"architecture": "lstm"}}``); keys saved under the new names win.

    Example:
        >>> from seqjax.experiments import ptb_lm
        >>> saved_config(ptb_lm.Config, {"hidden_size": 16, "num_steps": 35, "seed": 1})
        {'seed': 1, 'model': {'hidden_size': 16}, 'block_size': 35}
    """
    hints, old_names = _hints(cls), renamed(cls)
    out: dict[str, Any] = {}
    retired = []
    for key, value in data.items():
        new = old_names.get(key, "")
        if new.partition(".")[0] in hints and (key not in hints or (  # "model": "lstm" of old
                _is_group(hints[key]) and not isinstance(value, Mapping))):
            retired.append((new, value))
        else:
            out[key] = value
    for new, value in retired:
        head, _, rest = new.partition(".")
        if rest:
            group = out.get(head)
            out[head] = {rest: value, **(group if isinstance(group, Mapping) else {})}
        else:
            out.setdefault(new, value)
    return out


def _invalid(cls: type, err: Exception) -> str:
    """A refusal of ``cls.__post_init__``: as it is when it names the option (``--key ...``)."""
    text = str(err)
    return text if text.startswith("--") else f"invalid {cls.__name__}: {text}"


def config_from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """Build ``cls`` from a (JSON) dict, checking keys and types like :func:`apply_overrides`.

    A config saved before a rename is read with the new names (:func:`renamed`; options moved
    into a group, ``num_layers`` -> ``model.num_layers``, go there, the group's other options
    at the recipe's defaults for it), and a saved
    ``null`` for a number whose off is 0 (``clip_norm``, once ``None`` = no clipping in one
    recipe) is read as 0."""
    return _from_dict(cls, data, "")


def _from_dict(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    """:func:`config_from_dict` of a group saved under ``prefix`` (``model.``)."""
    data = saved_config(cls, data)
    for f in dataclasses.fields(cls):  # a group saved in part (its flat options of before)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else f.default
        if dataclasses.is_dataclass(default) and isinstance(data.get(f.name), Mapping):
            data[f.name] = {**dataclasses.asdict(default), **data[f.name]}  # the recipe's rest
    defaults = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = defaults - set(data)
    if missing:
        raise ConfigError(f"{cls.__name__} needs {sorted(missing)}.")
    hints = _hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in hints:
            raise _unknown(key, cls, prefix)
        if _is_group(hints[key]) and not isinstance(value, Mapping):
            raise _group_value(key, value, cls, prefix)
        if value is None and typing.get_origin(hints[key]) is Annotated:
            rng = field_range(hints[key])[1]
            value = 0 if rng is not None and rng.admits(0) else value  # off, saved as None
        kwargs[key] = _convert(prefix + key, value, hints[key])
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(_invalid(cls, err)) from err

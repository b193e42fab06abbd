"""Frozen-dataclass configs from ``--key=value`` command-line overrides.

``parse_overrides(["--hidden=32", "--lr", "0.1", "--model.layers=2", "--shuffle"])``
gives ``{"hidden": "32", "lr": "0.1", "model.layers": "2", "shuffle": True}``;
:func:`apply_overrides` checks every key against the dataclass fields (dotted keys reach
nested dataclasses) and converts each value to its field's type — ``int``, ``float``,
``bool``, ``str``, ``X | None``, ``tuple[int, ...]`` (comma separated) and ``Literal``.
Unknown keys and values that do not convert are a :class:`ConfigError` that names the
key, the expected type and the value (with a "did you mean" for near-misses).
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ConfigError",
    "parse_overrides",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
]

_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}
_NONE = {"none", "null"}


class ConfigError(ValueError):
    """A bad ``--key=value`` override (unknown key or a value of the wrong type)."""


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
    module = sys.modules.get(cls.__module__)
    return typing.get_type_hints(cls, vars(module) if module else None)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(key: str, value: Any, tp: Any) -> Any:
    """Convert a command-line string (or an already-typed value) to ``tp``."""
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
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
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
        return config_from_dict(tp, value)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(
        f"--{key}: cannot set a field of type {_type_name(tp)} from the command line."
    )


def _unknown(key: str, cls: type, prefix: str) -> ConfigError:
    names = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" Did you mean --{prefix}{close[0]}?" if close else ""
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
        head, _, rest = key.partition(".")
        if head not in fields:
            raise _unknown(head, cls, prefix)
        if rest:
            nested.setdefault(head, {})[rest] = value
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
        raise ConfigError(f"invalid {cls.__name__}: {err}") from err


def config_from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """Build ``cls`` from a (JSON) dict, checking keys and types like :func:`apply_overrides`."""
    defaults = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = defaults - set(data)
    if missing:
        raise ConfigError(f"{cls.__name__} needs {sorted(missing)}.")
    hints = _hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in hints:
            raise _unknown(key, cls, "")
        kwargs[key] = _convert(key, value, hints[key])
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"invalid {cls.__name__}: {err}") from err


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """``dataclasses.asdict`` (nested dataclasses become dicts)."""
    return dataclasses.asdict(cfg)

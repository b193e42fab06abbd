"""Input validation shared by every seqjax module.

Each check runs at trace time on static shapes/dtypes, so a bad call fails before any
compilation, and each error names the argument, what was expected and what was received
(docs/design.md, "Errors")."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._traced_checks import record_range, record_vocab_ids

T = TypeVar("T")
N = TypeVar("N", bound="NamedFields")
F = TypeVar("F", bound=Callable[..., Any])


def check_rank(x: Any, name: str, ranks: int | Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``x.ndim`` is one of ``ranks``."""
    allowed = (ranks,) if isinstance(ranks, int) else tuple(ranks)
    ndim = np.ndim(x)
    if ndim not in allowed:
        want = " or ".join(str(r) for r in allowed)
        raise ValueError(
            f"`{name}` must have rank {want}; got rank {ndim} with shape {tuple(np.shape(x))}.")


def check_integer(x: Any, name: str) -> None:
    """Raise ``TypeError`` unless ``x`` has an integer dtype."""
    dtype = jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"`{name}` must have an integer dtype; got {dtype}.")


def check_bool(x: Any, name: str) -> None:
    """Raise ``TypeError`` unless ``x`` is a boolean array."""
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    if dtype != jnp.bool_:
        raise TypeError(f"`{name}` must be a boolean array (True = keep); got dtype {dtype}.")


def is_concrete(x: Any) -> bool:
    """True when ``x`` holds values known at trace time (not a tracer)."""
    return not isinstance(x, jax.core.Tracer)


def check_range(x: Any, name: str, low: int, high: int) -> None:
    """Raise ``ValueError`` if a concrete ``x`` has values outside ``[low, high]``. A traced
    ``x`` is recorded instead (:func:`seqjax._traced_checks.record_range`: an error under
    ``seqjax.checked``) and the caller makes the affected outputs NaN."""
    if not is_concrete(x):
        record_range(x, name, low, high)
        return
    arr = np.asarray(x)
    if arr.size == 0:
        return
    lo, hi = arr.min(), arr.max()
    if lo < low or hi > high:
        raise ValueError(f"`{name}` must lie in [{low}, {high}]; got values in [{lo}, {hi}].")


@functools.partial(jax.tree_util.register_dataclass, data_fields=["value"],
                   meta_fields=["max_len", "low"])
@dataclasses.dataclass(frozen=True, eq=False)
class ValidLengths:
    """Per-row lengths that passed :func:`check_lengths` (made only there): ``value`` is
    ``int32[B]`` with every entry in ``[low, max_len]``. Every layer accepts it in place of
    ``lengths`` and checks only its shape, with no second host read. A pytree (``value`` the one
    leaf, the bounds static), so it crosses ``jit``, ``nn.scan`` and ``nn.remat``.
    """

    value: jax.Array
    max_len: int
    low: int = 0


def lengths_array(lengths: Any) -> Any:
    """The array of a :class:`ValidLengths` (anything else, ``None`` included, as is)."""
    return lengths.value if isinstance(lengths, ValidLengths) else lengths


def check_lengths(lengths: Any, name: str, batch: int, max_len: int, low: int = 0) -> ValidLengths:
    """The one check of per-row lengths, ``int[batch]`` in ``[low, max_len]``, as a
    :class:`ValidLengths` (``int32``); a model runs it once at its door and hands that down.

    Shape and dtype are checked at trace time, values when concrete (else recorded,
    :func:`check_range`). A :class:`ValidLengths` with bounds within ``[low, max_len]`` has only
    its shape checked.
    """
    if isinstance(lengths, ValidLengths):
        _check_lengths_shape(lengths.value, name, batch)
        if lengths.low >= low and lengths.max_len <= max_len:
            return lengths
        lengths = lengths.value
    _check_lengths_shape(lengths, name, batch)
    check_range(lengths, name, low, max_len)
    return ValidLengths(jnp.asarray(lengths).astype(jnp.int32), max_len, low)


def _check_lengths_shape(lengths: Any, name: str, batch: int) -> None:
    check_rank(lengths, name, 1)
    check_integer(lengths, name)
    if np.shape(lengths)[0] != batch:
        raise ValueError(
            f"`{name}` must have shape (batch,) = ({batch},); got {tuple(np.shape(lengths))}.")


#: Option names spelled one way across the library: an old spelling -> the field it became.
RENAMED_FIELDS: dict[str, str] = {
    "tie_output": "tie_embeddings",
    "tie_weights": "tie_embeddings",
    "use_output_bias": "output_bias",
    "mlp_hidden": "mlp_dim",
    "hidden_dim": "mlp_dim",
    "num_steps": "steps",
    "total_steps": "steps",
    "end_lr_ratio": "min_lr_ratio",
    "b1": "beta1",
    "b2": "beta2",
    "flat_state": "flat_optimizer",
    "max_len": "block_size",
}


def _unknown_fields(cls: type, keys: Any, where: str) -> None:
    """A ``TypeError`` for keys not init fields of ``cls`` (see :func:`replace_fields`)."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [key for key in keys if key not in names]
    if not unknown:
        return
    said = []
    for key in unknown:
        renamed = RENAMED_FIELDS.get(key)
        if renamed in names:
            said.append(f"`{key}` (renamed `{renamed}`)")
            continue
        close = difflib.get_close_matches(key, names, n=1)
        said.append(f"`{key}`" + (f" (did you mean `{close[0]}`?)" if close else ""))
    what = "is not a field" if len(said) == 1 else "are not fields"
    name = cls.__name__
    raise TypeError(
        f"{name}{where}: {', '.join(said)} {what} of {name}; its fields are {', '.join(names)}.")


def replace_fields(config: T, changes: dict[str, Any]) -> T:
    """``dataclasses.replace(config, **changes)`` (re-validated by ``__post_init__``). A key that
    is not a field is a ``TypeError`` naming it, its new name if it is an old spelling
    (:data:`RENAMED_FIELDS`) or else the closest field, and every field."""
    _unknown_fields(type(config), changes, ".replace")
    return dataclasses.replace(config, **changes)  # type: ignore[type-var]


class NamedFields:
    """Base of a config dataclass whose constructor refuses an unknown keyword as
    :func:`replace_fields` does (``TransformerConfig(tie_output=True)``: "renamed
    `tie_embeddings`")."""

    def __new__(cls: type[N], *args: Any, **kwargs: Any) -> N:
        _unknown_fields(cls, kwargs, "()")
        return super().__new__(cls)


C = TypeVar("C", bound="ConfigBase")


class ConfigBase(NamedFields):
    """Base of every config class: a ``@dataclasses.dataclass(frozen=True, kw_only=True)``
    whose ``__post_init__`` checks each field's range. Its constructor and :meth:`replace`
    refuse an unknown keyword (:class:`NamedFields`); a positional argument is a ``TypeError``
    naming the fields."""

    def __new__(cls: type[C], *args: Any, **kwargs: Any) -> C:
        if args:
            names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
            raise TypeError(
                f"{cls.__name__}() takes keyword arguments only; got {len(args)} positional "
                f"({', '.join(map(repr, args))}). Its fields are {', '.join(names)}.")
        return super().__new__(cls, **kwargs)

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` (:func:`replace_fields`)."""
        return replace_fields(self, changes)


def refuse_retired(where: str, kwargs: Any, replacements: dict[str, str]) -> None:
    """A ``TypeError`` if ``kwargs`` holds a retired return-type flag of ``where``, naming the
    callable that returns the pair instead (``replacements``: flag -> its name)."""
    for flag, instead in replacements.items():
        if flag in kwargs:
            raise TypeError(
                f"{where}: `{flag}` is retired; the call returns the array and `{instead}` "
                f"the pair (array, {flag.removeprefix('return_')}).")


def _refusing(check: Callable[[str, Any], None]) -> Callable[[F], F]:
    """A decorator that runs ``check(qualname, kwargs)`` before each call of the function."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            check(fn.__qualname__, kwargs)
            return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


def retired_flags(**replacements: str) -> Callable[[F], F]:
    """Decorator: a retired return-type flag (``return_carry=``, ``return_weights=``, ...) is a
    ``TypeError`` naming its replacement (:func:`refuse_retired`)."""
    return _refusing(lambda where, kwargs: refuse_retired(where, kwargs, replacements))


def renamed_keywords(notes: dict[str, str] | None = None, /, **renames: str) -> Callable[[F], F]:
    """Decorator: a keyword's old spelling is a ``TypeError`` naming the new one (``renames``:
    old -> new); ``notes`` (old -> text) adds what else changed, e.g. the value's meaning."""

    def check(where: str, kwargs: Any) -> None:
        for old, new in renames.items():
            if old in kwargs:
                note = (notes or {}).get(old)
                raise TypeError(f"{where}: `{old}` is renamed `{new}`" + (
                    f" ({note})." if note else "."))

    return _refusing(check)


def check_tree_shapes(actual: Any, expected: Any, name: str) -> None:
    """Raise ``ValueError`` unless two pytrees have the same structure and leaf shapes."""
    a_leaves, a_def = jax.tree_util.tree_flatten(actual)
    e_leaves, e_def = jax.tree_util.tree_flatten(expected)
    if a_def != e_def:  # type: ignore[operator]  # jaxlib ships PyTreeDef without a stub
        raise ValueError(f"`{name}` must have structure {e_def}; got {a_def}.")
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if np.shape(a) != np.shape(e):
            raise ValueError(
                f"`{name}` leaf {i} must have shape {tuple(np.shape(e))}; got {tuple(np.shape(a))}."
            )


def bound_param_shape(module: Any, *path: str) -> tuple[int, ...] | None:
    """Shape of the parameter ``path`` below a bound Flax ``module``; ``None`` (check skipped)
    when the module is unbound, initialising or has no such parameter."""
    if getattr(module, "scope", None) is None or module.is_initializing():
        return None
    tree: Any = module.variables.get("params", {})
    for key in path:
        if not hasattr(tree, "keys") or key not in tree:
            return None
        tree = tree[key]
    return tuple(np.shape(tree))


def check_features(x: Any, name: str, expected: int | None, what: str = "") -> None:
    """Raise ``ValueError`` unless ``x``'s last axis has ``expected`` features (read off the
    bound parameters, :func:`bound_param_shape`; ``None`` skips), naming the argument, the
    parameters' input size and the shape, instead of an error deep inside ``dot_general``."""
    if expected is None:
        return
    shape = tuple(np.shape(x))
    got = shape[-1] if shape else None
    if got != expected:
        extra = f" ({what})" if what else " (the input size its parameters were created with)"
        raise ValueError(
            f"`{name}` must have {expected} features on its last axis{extra}; got shape {shape}.")


def check_vocab_ids(x: Any, name: str, vocab_size: int, mask: Any = None) -> None:
    """``ValueError`` unless every id of a concrete ``x`` held by this process (where ``mask``
    is True, if given) lies in ``[0, vocab_size)``; the step wrappers and ``decode_step`` run it
    before a jitted call. Traced ids are recorded instead
    (:func:`seqjax._traced_checks.record_vocab_ids`) and their embedding rows are NaN."""
    if not is_concrete(x) or (mask is not None and not is_concrete(mask)):
        record_vocab_ids(x, name, vocab_size, mask)
        return
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.integer):
        return
    if mask is not None:
        m = np.asarray(mask).astype(bool)
        try:
            m = np.broadcast_to(m, arr.shape)
        except ValueError:
            raise ValueError(
                f"the mask of `{name}` must have the shape of `{name}` {arr.shape}; got {m.shape}."
            ) from None
        arr = arr[m]
    if arr.size == 0:
        return
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        where = " where the mask is True" if mask is not None else ""
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"`{name}` must hold token ids in [0, {vocab_size - 1}] (vocab_size={vocab_size})"
            f"{where}; got values in [{lo}, {hi}] (e.g. {bad}).")


def _not_positive_int(value: Any, name: str) -> ValueError:
    """The one message of the positive-int checks."""
    return ValueError(f"`{name}` must be a positive int; got {value!r}.")


def check_positive_int(value: Any, name: str) -> int:
    """A positive Python int (a size or threshold), else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _not_positive_int(value, name)
    return value


def check_positive_ints(**values: Any) -> None:
    """Each value a positive int, a Python or a numpy integer (a data size read off an array),
    else a ``ValueError`` naming the first that is not (:func:`check_positive_int`'s message)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
            raise _not_positive_int(value, name)


def check_optional_positive_int(value: Any, name: str) -> None:
    """``None`` or a positive Python int, else a ``ValueError`` naming ``name``."""
    if value is not None:
        check_positive_int(value, name)


def check_rate(value: Any, name: str) -> None:
    """A rate or fraction, a real number in ``[0, 1)``, else a ``ValueError`` naming ``name``."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)  # numpy reals too
    if not (real and 0.0 <= float(value) < 1.0):
        raise ValueError(f"`{name}` must lie in [0, 1); got {value!r}.")


def check_count_or_off(value: Any, name: str, owner: str, what: str) -> int:
    """A Python int >= 0 (0: ``what`` off); ``None`` (the old off) is a ``TypeError`` naming 0,
    anything else a ``ValueError`` naming ``name`` and ``owner``."""
    if value is None:
        raise TypeError(f"`{name}=None` of {owner} is spelled `{name}=0` (0: {what}).")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`{name}` of {owner} must be an int >= 0 (0: {what}); got {value!r}.")
    return value

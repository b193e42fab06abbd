r"""Value checks in traced code: NaN in the affected outputs, and the same condition as a
``checkify`` check that :func:`checked` turns into an error.

Outside ``jax.jit`` a bad value is a ``ValueError`` at the door that receives it
(:mod:`seqjax._checks`: a token id outside ``[0, V)``, a length outside ``[0, T]``, a KV-cache
write past ``max_len``), naming the argument, the range and the values found. Inside ``jit``
values are tracers and cannot be read, so every layer and model follows one policy:

1. **NaN, never a plausible number**, in the outputs that depend on the bad value:

   * a token id outside ``[0, V)`` (negative ids never wrap around) reads a row of NaN in
     :class:`seqjax.nn.Embed` / :func:`seqjax.nn.embedding_lookup`, and the models (LMs,
     classifiers, taggers, BERT, encoder–decoders) poison the whole row right after their
     embedding (:func:`poison_bad_ids`): a sequence with an invalid id has only NaN outputs
     whatever its pooling, direction or padding. Other rows are unaffected; a batch loss is NaN.
     ``decode_step`` gives NaN logits for the row and leaves its state as it was.
   * ``lengths`` outside ``[0, T]``: the row's outputs and final carry are NaN
     (:class:`seqjax.nn.RNN`, so also ``Bidirectional``, ``StackedRNN`` and the RNN models); in
     the transformers every layer that reads the lengths (attention, block, encoder/decoder
     stack) and the models (GPT, BERT, encoder–decoder) after their stack, where a negative
     length would leave zeros, poison the row (:func:`poison_bad_lengths`).
   * a KV-cache write past ``max_len`` (:meth:`seqjax.nn.attention.KVCache.update`): the row's
     last slot is set to NaN, so the query that overflowed and every later one of that row read
     NaN (the dropped tokens still count in ``KVCache.overflow``).

2. **The same condition, written with checkify.** Each host check of :mod:`seqjax._checks` has a
   traced twin here that records its condition with ``checkify.debug_check`` and the host
   check's message, values included; :func:`checked` (``seqjax.checked``) raises the first
   failed one.

The checks are staged only while :func:`checked` traces: a staged check is an effect, which
takes a program off ``jit``'s C++ fast path (slower dispatch on every call). :func:`checked` turns
on ``seqjax_traced_checks``, a JAX configuration state in the trace context, so ``jit`` keys its
cache on it and a function traced before without checks is traced again with them. A plain
``jit`` stages no check (no effect, no host callback). ``SEQJAX_TRACED_CHECKS=1`` in the
environment stages them in every program (``seqjax train --checked`` is the switch to use). On a
JAX without such states the checks are always staged: correct, slower to dispatch.

Happy-path cost: the NaN rows come from the gather's fill mode or a ``where`` fused into
neighbouring elementwise work; outside :func:`checked` predicates and messages are not traced.

Limitation (JAX's): a ``checkify`` check inside a differentiated ``lax.scan`` body is dropped by
the scan's partial evaluation. The checks here are recorded outside time loops (the embedding
before the layers, the lengths before the scan), so they survive ``grad``; the NaN never depends
on checkify.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import checkify

Array = jax.Array

__all__ = [
    "checked", "poison", "poison_bad_ids", "poison_bad_lengths", "record", "record_range",
    "record_vocab_ids", "valid_ids",
]


def _define_switch() -> Any:
    """The ``seqjax_traced_checks`` state (module docstring), defined once even across
    ``importlib.reload``; ``None`` where JAX has no trace-context states (all checks staged)."""
    try:
        from jax._src import config as jax_config

        defined = getattr(jax_config.config, "_value_holders", {}).get("seqjax_traced_checks")
        return defined if defined is not None else jax_config.bool_state(
            "seqjax_traced_checks", False,
            help="Stage seqjax's traced value checks (seqjax.checked turns it on).",
            include_in_trace_context=True)
    except (ImportError, AttributeError, TypeError):
        return None


_SWITCH = _define_switch()


def _staging() -> bool:
    return _SWITCH is None or bool(_SWITCH.value)


def _checks_on() -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext() if _SWITCH is None else _SWITCH(True)


def _traced(*xs: Any) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in xs)


def _escape(text: str) -> str:
    """``text`` as a literal part of a ``str.format`` message."""
    return text.replace("{", "{{").replace("}", "}}")


def record(ok: Any, msg: str, **values: Array) -> None:
    """Record ``all(ok)`` as a checkify check with ``msg`` (a ``str.format`` template over
    ``values``, read at run time). Staged only while :func:`checked` traces; a no-op for a
    concrete ``ok`` (the host check already ran)."""
    if _traced(ok) and _staging():
        _debug_check(jnp.all(ok), values, msg=msg)


@functools.partial(jax.jit, static_argnames="msg")
def _debug_check(pred: Array, values: dict[str, Array], msg: str) -> None:
    """``checkify.debug_check`` (a plain ``checkify.check`` cannot be staged under an enclosing
    ``jit``) as its own jitted call, traced once per message and shapes: a check's number (a
    program constant, from a process-wide counter) then stays the same, so a checked model traced
    again is the same program to the persistent compilation cache."""
    checkify.debug_check(pred, msg, **values)


def record_range(x: Array, name: str, low: int, high: int) -> None:
    """The traced twin of :func:`seqjax._checks.check_range`: every value in ``[low, high]``."""
    if _traced(x) and x.size and _staging():
        record((x >= low) & (x <= high),
               f"`{_escape(name)}` must lie in [{low}, {high}]; got values in [{{lo}}, {{hi}}].",
               lo=jnp.min(x), hi=jnp.max(x))


def valid_ids(ids: Array, vocab_size: int) -> Array:
    """``bool[...]``: True where ``ids`` lie in ``[0, vocab_size)``."""
    return (ids >= 0) & (ids < vocab_size)


def record_vocab_ids(ids: Array, name: str, vocab_size: int, mask: Any = None) -> None:
    """The traced twin of :func:`seqjax._checks.check_vocab_ids`: ids in ``[0, vocab_size)``
    (where ``mask`` is True, if given)."""
    if (not _traced(ids, mask) or ids.size == 0 or not jnp.issubdtype(ids.dtype, jnp.integer)
            or not _staging()):
        return
    ok = valid_ids(ids, vocab_size)
    where = ""
    if mask is not None:
        ok = ok | ~jnp.broadcast_to(jnp.asarray(mask, bool), ids.shape)
        where = " where the mask is True"
    record(ok, f"`{_escape(name)}` must hold token ids in [0, {vocab_size - 1}] "
           f"(vocab_size={vocab_size}){where}; got values in [{{lo}}, {{hi}}]",
           lo=jnp.min(ids), hi=jnp.max(ids))


def poison(x: Array, ok: Array) -> Array:
    """``x`` with NaN where ``ok`` (broadcast over ``x``'s trailing axes) is False; an
    ``x`` that cannot hold NaN (integers, booleans) is returned as it is."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    ok = jnp.reshape(ok, ok.shape + (1,) * (x.ndim - ok.ndim))
    # Added, not selected: a [B, 1, ...] constant (0 or NaN) that XLA fuses into the next
    # elementwise op and whose backward is the identity (no select over x's cotangent).
    return x + jax.lax.stop_gradient(jnp.where(ok, 0.0, jnp.nan).astype(x.dtype))


def poison_bad_ids(x: Array, ids: Array, vocab_size: int) -> Array:
    """``x`` (``[B, ...]``, e.g. a model's embedded ``[B, T, D]``) with NaN in every row whose
    traced ``ids`` (``int[B, ...]``) hold one outside ``[0, vocab_size)``; unchanged for concrete
    ids (host-checked). Models apply it right after their embedding."""
    if not _traced(ids) or ids.size == 0:
        return x
    ok_B = jnp.all(valid_ids(ids, vocab_size), axis=tuple(range(1, ids.ndim)))
    return poison(x, ok_B)


def poison_bad_lengths(x: Array, lengths: Array | None, low: int, high: int,
                       axis: int = 0) -> Array:
    """``x`` with NaN in the rows (``axis``: ``x``'s batch axis) whose traced length lies
    outside ``[low, high]``; unchanged for ``lengths=None`` or concrete (host-checked) lengths."""
    if lengths is None or not _traced(lengths):
        return x
    ok_B = (lengths >= low) & (lengths <= high)
    return poison(x, jnp.reshape(ok_B, (1,) * axis + ok_B.shape))


def checked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its traced value checks turned into errors (module docstring).

    Runs ``checkify.checkify(fn, errors=checkify.user_checks)`` and raises the first failed
    check as ``jax.experimental.checkify.JaxRuntimeError`` with the host check's message
    (argument, expected range, values found); otherwise returns ``fn``'s output. Without it the
    same conditions only make the affected outputs NaN.

    Call it outside ``jit`` on a jitted or plain function: ``seqjax.checked(jax.jit(step))``
    compiles once (a program of its own) and keeps ``step``'s donation; each call still traces
    the small checkify wrapper in Python, a price for a debugging run. Inside a traced function
    it hands its checks to an enclosing ``checked``/``checkify`` (under a bare ``jax.jit`` that
    fails to lower: put ``checked`` outside the ``jit``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from seqjax.nn import embedding_lookup
        >>> f = jax.jit(lambda ids: embedding_lookup(jnp.ones((3, 2)), ids))
        >>> f(jnp.array([0, 3])).tolist()  # id 3 is outside [0, 3): NaN
        [[1.0, 1.0], [nan, nan]]
        >>> try:
        ...     checked(f)(jnp.array([0, 3]))
        ... except Exception as e:
        ...     print(str(e).splitlines()[0])
        `ids` must hold token ids in [0, 2] (vocab_size=3); got values in [0, 3] (`check` failed)
    """
    checkified = checkify.checkify(fn, errors=checkify.user_checks)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _checks_on():  # traced here with the checks staged (a separate jit cache key)
            err, out = checkified(*args, **kwargs)
        checkify.check_error(err)  # raises here; traced: re-raised by the enclosing checkify
        return out

    return run

r"""Value checks in traced code: NaN in the affected outputs, and the same condition as a
``checkify`` check that :func:`checked` turns into an error.

Outside ``jax.jit`` a bad value is a ``ValueError`` at the door that receives it
(:mod:`seqjax._checks`: a token id outside ``[0, V)``, a length outside ``[0, T]``, a
KV-cache write past ``max_len``), naming the argument, the range and the values found.
Inside ``jit`` values are tracers and cannot be read, so every layer and model follows one
policy:

1. **NaN, never a plausible number.** The outputs that depend on the bad value are NaN:

   * a token id outside ``[0, V)`` (negative ones included: ids never wrap around) reads a
     row of NaN in :class:`seqjax.nn.Embed` / :func:`seqjax.nn.embedding_lookup`, and the
     models (language models, classifiers, taggers, BERT, encoder–decoders) poison the
     whole row right after their embedding (:func:`poison_bad_ids`), so a sequence with an
     invalid id has only NaN outputs whatever its pooling, direction or padding. Other rows
     are unaffected; a loss over the batch is NaN. A model's ``decode_step`` gives NaN
     logits for the row and leaves its state as it was.
   * ``lengths`` outside ``[0, T]``: the row's outputs and final carry are NaN
     (:class:`seqjax.nn.RNN`, so also ``Bidirectional``, ``StackedRNN`` and the RNN models);
     in the transformers the layer that reads the lengths poisons the row's output
     (:func:`poison_bad_lengths`): ``MultiHeadAttention``, ``TransformerBlock``, the
     encoder/decoder stacks, and the models (GPT, BERT, the encoder–decoder) after their
     stack, where a negative length would otherwise leave zeros.
   * a KV-cache write past ``max_len`` (:meth:`seqjax.nn.attention.KVCache.update`): the
     row's last slot is set to NaN, so the query that overflowed and every later query of
     that row read NaN (the dropped tokens are still counted in ``KVCache.overflow``).

2. **The same condition, written with checkify.** Each host check of :mod:`seqjax._checks`
   has a traced twin here that records its condition with ``checkify.debug_check`` and
   the message the host check would give, values included. :func:`checked` (re-exported
   as ``seqjax.checked``) runs a function under ``checkify.checkify(fn,
   errors=checkify.user_checks)`` and raises the first failed check as a
   ``JaxRuntimeError``; it works on jitted functions (``seqjax.checked(jax.jit(step))``).

Why a switch in JAX's trace context: a check staged into a program is an effect
(checkify's ``ErrorEffect``), and a program with an effect leaves ``jit``'s C++ fast path
and runs with runtime tokens. A 12-layer model's train step on a CPU then took 5.7 ms a call
instead of 3.7; on an H200 GPT-2's step took 37 ms with the checks, 30 before them and
30 after this switch (``benchmarks/HISTORY.md``, "The GPU rows at 4e92799, after the traced
checks' switch"). So the checks are staged only while :func:`checked`
traces: it turns on ``seqjax_traced_checks``, a JAX configuration state in the trace
context, so ``jit`` keys its cache on it and a function traced before without checks is
traced again with them (``checked(jax.jit(step))`` after ``jax.jit(step)`` ran). A plain
``jit`` stages no check: its program has no effect and no host callback. Being a JAX
option, the state also reads ``SEQJAX_TRACED_CHECKS=1`` from the environment, which stages
the checks in every program as before (``seqjax train --checked`` is the switch to use).
Should a JAX release lack such states, the checks are always staged: correct, and slower
to dispatch.

Each check goes through ``checkify.debug_check`` (a plain ``checkify.check`` cannot be
staged under an enclosing ``jit``: "Cannot abstractly evaluate a checkify.check which was
not functionalized") and a jitted helper, so a checked model traced twice in one process is
the same program (checkify's check numbers are constants of it) and the persistent
compilation cache finds it the second time.

Cost on the happy path: the NaN rows come from the gather's fill mode (the same gather as
before) or a ``where`` XLA fuses into the neighbouring elementwise work. Outside
:func:`checked` the predicates and messages are not traced at all.

Limitation (JAX's, not ours): a ``checkify`` check inside a ``lax.scan`` body that is
differentiated (``jax.grad`` of a function containing the scan) is dropped by the scan's
partial evaluation. The checks here are recorded outside time loops (the embedding before
the layers, the lengths before the scan), so they survive ``grad``; the NaN never depends
on checkify.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from seqjax.nn import embedding_lookup
    >>> E = jnp.ones((3, 2))
    >>> f = jax.jit(lambda ids: embedding_lookup(E, ids))
    >>> f(jnp.array([0, 3])).tolist()  # id 3 is outside [0, 3): NaN
    [[1.0, 1.0], [nan, nan]]
    >>> try:
    ...     checked(f)(jnp.array([0, 3]))
    ... except Exception as e:
    ...     print(str(e).splitlines()[0])
    `ids` must hold token ids in [0, 2] (vocab_size=3); got values in [0, 3] (`check` failed)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
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
    """The ``seqjax_traced_checks`` state (see the module docstring); ``None`` where this
    JAX has no trace-context states (then every traced check is staged). A module imported
    again (``importlib.reload``) gets the state defined the first time."""
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


@contextlib.contextmanager
def _checks_on() -> Iterator[None]:
    if _SWITCH is None:
        yield
        return
    with _SWITCH(True):
        yield


def _traced(*xs: Any) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in xs)


def _escape(text: str) -> str:
    """``text`` as a literal part of a ``str.format`` message."""
    return text.replace("{", "{{").replace("}", "}}")


def record(ok: Any, msg: str, **values: Array) -> None:
    """Record ``all(ok)`` as a checkify check with ``msg`` (a ``str.format`` template over
    ``values``, arrays read at run time).

    Staged only while :func:`checked` traces (nothing in a plain ``jit``); a no-op when
    ``ok`` is concrete (the host check already ran and raised).
    """
    if not _traced(ok) or not _staging():
        return
    _debug_check(jnp.all(ok), values, msg=msg)


@functools.partial(jax.jit, static_argnames="msg")
def _debug_check(pred: Array, values: dict[str, Array], msg: str) -> None:
    """``checkify.debug_check`` staged as its own jitted call, traced once per message and
    shapes: checkify numbers each check it traces from a process-wide counter, and that
    number is a constant of the program, so a check traced anew in every program made each
    program unique to JAX's persistent compilation cache (the same model trained twice in
    one process compiled twice). Through ``jit``'s trace cache a check keeps its number."""
    checkify.debug_check(pred, msg, **values)


def record_range(x: Array, name: str, low: int, high: int) -> None:
    """The traced twin of :func:`seqjax._checks.check_range`: every value in ``[low, high]``."""
    if not _traced(x) or x.size == 0 or not _staging():
        return
    record(
        (x >= low) & (x <= high),
        f"`{_escape(name)}` must lie in [{low}, {high}]; got values in [{{lo}}, {{hi}}].",
        lo=jnp.min(x), hi=jnp.max(x),
    )


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
    record(
        ok,
        f"`{_escape(name)}` must hold token ids in [0, {vocab_size - 1}] "
        f"(vocab_size={vocab_size}){where}; got values in [{{lo}}, {{hi}}]",
        lo=jnp.min(ids), hi=jnp.max(ids),
    )


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
    """``x`` (``[B, ...]``, e.g. a model's embedded ``[B, T, D]``) with NaN in every row
    whose traced ``ids`` (``int[B, ...]``) hold one outside ``[0, vocab_size)``; unchanged
    for concrete ids (those went through the host check).

    A model applies it right after its embedding, so a sequence with an invalid id has
    only NaN outputs, whatever its pooling, direction or padding.
    """
    if not _traced(ids) or ids.size == 0:
        return x
    ok_B = jnp.all(valid_ids(ids, vocab_size), axis=tuple(range(1, ids.ndim)))
    return poison(x, ok_B)


def poison_bad_lengths(x: Array, lengths: Array | None, low: int, high: int,
                       axis: int = 0) -> Array:
    """``x`` with NaN in the rows (``axis`` = the batch axis of ``x``) whose traced length
    lies outside ``[low, high]``; ``x`` unchanged for ``lengths=None`` or concrete lengths
    (those went through the host check)."""
    if lengths is None or not _traced(lengths):
        return x
    ok_B = (lengths >= low) & (lengths <= high)
    return poison(x, jnp.reshape(ok_B, (1,) * axis + ok_B.shape))


def checked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its traced value checks turned into errors.

    Runs ``fn`` under ``checkify.checkify(fn, errors=checkify.user_checks)`` and raises
    the first failed check (``jax.experimental.checkify.JaxRuntimeError``, with the message
    the host check would give: argument, expected range, values found); otherwise returns
    ``fn``'s output. Without it the same conditions only make the affected outputs NaN
    (see the module docstring).

    Call it outside ``jit`` on a jitted (or plain) function: ``seqjax.checked(jax.jit(step))``
    compiles once (a program of its own: a plain call of ``step`` stages no check) and keeps
    ``step``'s donation; each call still traces the small
    checkify wrapper in Python (about 3 ms on a CPU), a price for a debugging run. Called
    inside a traced function it hands its checks on to an enclosing ``checked``/``checkify``
    (under a bare ``jax.jit`` that fails to lower: put ``checked`` outside the ``jit``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from seqjax.nn import RNN, LSTMCell
        >>> rnn = RNN(LSTMCell(4))
        >>> x = jnp.ones((2, 3, 2))
        >>> params = rnn.init(jax.random.PRNGKey(0), x)
        >>> step = jax.jit(rnn.apply)
        >>> bool(jnp.isnan(step(params, x, jnp.array([3, 5]))[1]).all())  # 5 > T = 3
        True
        >>> try:
        ...     checked(step)(params, x, jnp.array([3, 5]))
        ... except Exception as e:
        ...     print(str(e).splitlines()[0])
        `lengths` must lie in [0, 3]; got values in [3, 5]. (`check` failed)
    """
    checkified = checkify.checkify(fn, errors=checkify.user_checks)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _checks_on():  # traced here with the checks staged (a separate jit cache key)
            err, out = checkified(*args, **kwargs)
        checkify.check_error(err)  # raises here; traced: re-raised by the enclosing checkify
        return out

    return run

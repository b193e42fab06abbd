r"""Recurrent layers: ``RNN`` (a cell scanned over time), ``Bidirectional``, ``StackedRNN``.

A layer runs its cell's recurrence ``(carry_t, y_t) = cell(carry_{t-1}, x_t)``, ``t = 1..T``
(MEDL (7.1)–(7.2); J&M Fig. 9.2); the equation is the cell's (:mod:`seqjax.nn.cells`), the
layer chooses the loop (``implementation``: see :class:`RNN`). Patch the backend probe
``_on_gpu`` and ``GPU_SCAN_UNROLL`` in this module.

Shapes: ``x_BxTxP`` in, ``y_BxTxH`` out (``time_major=True``: ``[T, B, ...]``). ``lengths:
int32[B]`` (right padding): outputs at ``t >= lengths[b]`` are exactly zero and the returned
carry is the one after step ``lengths[b] - 1`` (the initial carry for length 0).
``reverse=True`` runs each sequence from its own last real step back to its first (MEDL
(7.14)'s ``h_r``), not from the padded end.

``lengths`` are checked once per call (a host read when concrete): :class:`StackedRNN`,
:class:`Bidirectional` and the models of :mod:`seqjax.models` check them and pass a
:class:`~seqjax._checks.ValidLengths`, of which a layer checks the shape only. Under ``jit``,
a row whose length lies outside ``[0, T]`` gets NaN outputs and final carry (lengths are never
clipped), and :func:`~seqjax._checks.check_lengths` records a checkify check, an error under
``seqjax.checked`` (:mod:`seqjax._traced_checks`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import (
    ValidLengths,
    bound_param_shape,
    check_features,
    check_lengths,
    check_positive_ints,
    check_rank,
    check_rate,
    check_tree_shapes,
    lengths_array,
    refuse_retired,
    retired_flags,
)
from seqjax._traced_checks import poison_bad_lengths
from seqjax.nn import _sharding
from seqjax.nn.cells import ElmanCell, GRUCell, LayerWeights, LSTMCell, RecurrentCell
from seqjax.nn.masks import padding_mask
from seqjax.nn.recurrent import _cudnn
from seqjax.nn.recurrent._layer_kernels import layer_scan

Array = jax.Array
Carry = Any

__all__ = ["RNN", "Bidirectional", "StackedRNN", "CELL_TYPES", "GPU_SCAN_UNROLL", "IMPLEMENTATIONS"]

CELL_TYPES: dict[str, type[RecurrentCell]] = {
    "elman": ElmanCell,
    "rnn": ElmanCell,
    "lstm": LSTMCell,
    "gru": GRUCell,
}


def select_rows(pred_B: Array, on_true: Any, on_false: Any) -> Any:
    """Per-batch-row ``where`` over matching pytrees of ``[B, ...]`` arrays."""
    return jax.tree_util.tree_map(
        lambda a, b: jnp.where(pred_B.reshape(pred_B.shape + (1,) * (a.ndim - 1)), a, b),
        on_true, on_false)


def _poison_bad_lengths(
    carry: Carry, y: Array, lengths: Array | None, num_steps: int, time_major: bool
) -> tuple[Carry, Array]:
    """NaN outputs and carry for rows whose traced length is outside ``[0, T]``."""
    carry = jax.tree_util.tree_map(lambda a: poison_bad_lengths(a, lengths, 0, num_steps), carry)
    return carry, poison_bad_lengths(y, lengths, 0, num_steps, axis=int(time_major))


IMPLEMENTATIONS = ("auto", "scan", "fused", "cudnn")


def _check_implementation(implementation: str) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {IMPLEMENTATIONS}; got {implementation!r}."
        )


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _check_cudnn_backend() -> None:
    if not _on_gpu():
        raise ValueError(
            "`implementation='cudnn'` needs a GPU backend; got "
            f"{jax.default_backend()!r}. Use 'auto', 'fused' or 'scan'."
        )


# Steps unrolled per scan iteration on a GPU when `unroll` is None (measured fastest there).
GPU_SCAN_UNROLL = 8


class RNN(nn.Module):
    r"""Scan a recurrent cell over time: the module's recurrence, MEDL (7.1)–(7.2).

    ``implementation`` chooses the loop (same values and gradients up to rounding):

    * ``"scan"``: ``cell.input_projection`` for all steps, then autodiff of ``nn.scan`` over
      ``cell.step``: any cell, and ``resets``;
    * ``"fused"``: the cell's whole-layer kernel with a hand-written backward
      (:mod:`seqjax.nn.recurrent._layer_kernels`, via ``cell.layer_weights()``): ``ElmanCell``,
      ``LSTMCell``, ``GRUCell(reset_after=True)`` and subclasses keeping their equation; no
      ``resets``;
    * ``"cudnn"``: ``jax.experimental.rnn.lstm`` (:mod:`seqjax.nn.recurrent._cudnn`; GPU only,
      float32) for ``"lstm"`` weights, forward direction, no ``resets``;
    * ``"auto"`` (default): on a GPU ``"scan"`` unrolled ``GPU_SCAN_UNROLL`` steps (measured
      fastest there); elsewhere ``"fused"`` when the cell has a kernel and no ``resets`` are
      given, else ``"scan"``.

    Other requests raise ValueError. Call ``rnn(x, lengths=None, initial_carry=None,
    resets=None)``: ``x: [B, T, P]``; ``lengths``: ``int32[B]`` in ``[0, T]``;
    ``initial_carry``: default ``cell.initialize_carry`` (zeros); ``resets: bool[B, T]``, True
    resets the carry to the initial carry *before* that step (packing with segment ids).
    Returns ``y: [B, T, H]``; :meth:`with_state` (same arguments) returns ``(y, final_carry)``
    (the carry protocol of :class:`StackedRNN`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from seqjax.nn import RNN, LSTMCell
        >>> rnn = RNN(LSTMCell(8))
        >>> x = jnp.ones((2, 5, 3)); params = rnn.init(jax.random.PRNGKey(0), x)
        >>> y, (c, h) = rnn.apply(params, x, lengths=jnp.array([5, 2]), method="with_state")
        >>> y.shape, bool((y[1, 2:] == 0).all())
        ((2, 5, 8), True)

    Attributes:
        cell: a :class:`~seqjax.nn.RecurrentCell`.
        reverse: run each sequence from its last real step to its first (outputs stay in
            time order).
        unroll: steps per loop iteration; ``None``: ``GPU_SCAN_UNROLL`` for a GPU scan, else 1.
        time_major: inputs and outputs are ``[T, B, ...]``.
        implementation: ``"auto"``, ``"scan"``, ``"fused"`` or ``"cudnn"`` (above).
    """

    cell: RecurrentCell
    reverse: bool = False
    unroll: int | None = None
    time_major: bool = False
    implementation: str = "auto"

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        refuse_retired(f"{cls.__name__}()", kwargs, {"return_carry": "with_state"})
        return super().__new__(cls)

    def _implementation(
        self, weights: LayerWeights | None, x: Array, resets: Array | None, reverse: bool
    ) -> str:
        """The path that runs (see the class docstring); errors for impossible requests."""
        impl = self.implementation
        _check_implementation(impl)
        if impl == "auto":
            return "fused" if weights is not None and resets is None and not _on_gpu() else "scan"
        name, given = type(self.cell).__name__, "given" if resets is not None else None
        if impl == "fused" and (weights is None or resets is not None):
            raise ValueError(
                "`implementation='fused'` needs a cell with a layer kernel "
                "(cell.layer_weights() is not None: ElmanCell, LSTMCell, "
                f"GRUCell(reset_after=True)) and no `resets`; got {name} with resets={given}. "
                "Use 'scan' or 'auto'."
            )
        if impl == "cudnn":
            if getattr(weights, "equation", None) != "lstm" or reverse or resets is not None:
                raise ValueError(
                    "`implementation='cudnn'` needs an LSTM cell (layer_weights() equation "
                    f"'lstm'), reverse=False and no `resets`; got {name}, reverse={reverse}, "
                    f"resets={given}."
                )
            _check_cudnn_backend()
            if self.is_initializing():  # parameters are created by the fused kernel's path
                return "fused"
        return impl

    @retired_flags(return_carry="RNN.with_state")
    def __call__(
        self,
        x: Array,
        lengths: Array | ValidLengths | None = None,
        initial_carry: Carry | None = None,
        resets: Array | None = None,
        *,
        reverse: bool | None = None,
    ) -> Array:
        return self.with_state(x, lengths, initial_carry, resets, reverse=reverse)[0]

    @nn.compact
    def with_state(
        self,
        x: Array,
        lengths: Array | ValidLengths | None = None,
        initial_carry: Carry | None = None,
        resets: Array | None = None,
        *,
        reverse: bool | None = None,
    ) -> tuple[Array, Carry]:
        """``(y, final_carry)``, the carry after each row's last real step."""
        reverse = self.reverse if reverse is None else reverse
        check_rank(x, "x", 3)
        kernel = bound_param_shape(self, "cell", "input", "kernel")
        check_features(x, "x", None if kernel is None else kernel[0])
        x_BxTxP = jnp.swapaxes(x, 0, 1) if self.time_major else x
        batch, num_steps, _ = x_BxTxP.shape
        checked = None if lengths is None else check_lengths(lengths, "lengths", batch, num_steps)
        lengths_B: Array | None = lengths_array(checked)
        _check_resets(resets, batch, num_steps)
        carry = self.cell.initialize_carry(jax.random.PRNGKey(0), (batch, x.shape[-1]))
        if initial_carry is not None:
            check_tree_shapes(initial_carry, carry, "initial_carry")
            carry = initial_carry

        if self.is_initializing():  # create input/{kernel,bias} without a full projection
            self.cell.input_projection(x_BxTxP[:1, :1])
        weights = self.cell.layer_weights()
        impl = self._implementation(weights, x, resets, reverse)
        valid_TxB = None if checked is None else padding_mask(checked, num_steps).T
        if impl == "cudnn":
            assert weights is not None  # _implementation picks it only for a layer kernel
            carry, y = _cudnn.lstm_layer(weights, x_BxTxP, carry, lengths_B)
            y = jnp.swapaxes(y, 0, 1) if self.time_major else y
        else:
            if impl == "fused":
                assert weights is not None  # as for "cudnn"
                carry, y = self._fused(weights, x, carry, valid_TxB, reverse)
            else:
                carry, y = self._scan(x_BxTxP, carry, valid_TxB, resets, reverse)
            y = y if self.time_major else jnp.swapaxes(y, 0, 1)
        carry, y = _poison_bad_lengths(carry, y, lengths_B, num_steps, self.time_major)
        return y, carry

    def _scan(self, x_BxTxP: Array, initial: Carry, valid_TxB: Array | None,
              resets: Array | None, reverse: bool) -> tuple[Carry, Array]:
        """Hoisted input projection, then ``nn.scan`` of ``cell.step``, time-major (no strided
        slices per step); ``resets`` return to the ``initial`` carry."""
        xp_TxBxG = jnp.swapaxes(self.cell.input_projection(x_BxTxP), 0, 1)
        resets_TxB = None if resets is None else jnp.swapaxes(resets, 0, 1)

        def body(cell: RecurrentCell, carry: Carry, inputs: tuple) -> tuple[Carry, Array]:
            xp_BxG, valid_B, reset_B = inputs
            if reset_B is not None:
                carry = select_rows(reset_B, initial, carry)
            new_carry, y_BxH = cell.step(carry, xp_BxG)
            # Keep the carry's dtype stable across steps (bf16 compute, fp32 carry).
            new_carry = jax.tree_util.tree_map(lambda n, o: n.astype(o.dtype), new_carry, carry)
            if valid_B is not None:
                new_carry = select_rows(valid_B, new_carry, carry)
                y_BxH = jnp.where(valid_B[:, None], y_BxH, jnp.zeros_like(y_BxH))
            return new_carry, y_BxH

        scan = nn.scan(body, variable_broadcast="params", split_rngs={"params": False},
                       unroll=self._unroll("scan"), reverse=reverse)
        return scan(self.cell, initial, (xp_TxBxG, valid_TxB, resets_TxB))

    def _fused(self, weights: LayerWeights, x: Array, carry: Carry, valid_TxB: Array | None,
               reverse: bool) -> tuple[Carry, Array]:
        """The cell's layer kernel (:func:`._layer_kernels.layer_scan`), time-major."""
        x_TxBxP = x if self.time_major else jnp.swapaxes(x, 0, 1)
        compute = jnp.dtype(
            self.cell.dtype or jnp.result_type(x, weights.input_kernel, weights.recurrent_kernel)
        )
        # Sharded: weights gathered once before the loop, batch split on inputs and carry, so
        # the loop body has no collectives (seqjax.nn._sharding).
        arrays = ("input_kernel", "bias", "recurrent_kernel", "recurrent_bias")
        weights = weights._replace(**_sharding.replicate({a: getattr(weights, a) for a in arrays}))
        x_TxBxP = _sharding.constrain(x_TxBxP, None, _sharding.BATCH)
        valid_TxB = _sharding.constrain(valid_TxB, None, _sharding.BATCH)
        carry = jax.tree_util.tree_map(lambda a: _sharding.constrain(a, _sharding.BATCH), carry)
        return layer_scan(weights, x_TxBxP, carry, valid_TxB, reverse, compute,
                          self._unroll("fused"))

    def _unroll(self, impl: str) -> int:
        """``unroll`` as given, or the default for ``impl`` on this backend."""
        if self.unroll is not None:
            return self.unroll
        return GPU_SCAN_UNROLL if impl == "scan" and _on_gpu() else 1


def _check_resets(resets: Array | None, batch: int, num_steps: int) -> None:
    """``resets``, when given, is ``bool[batch, time]``."""
    if resets is None:
        return
    if tuple(resets.shape) != (batch, num_steps):
        raise ValueError(
            f"`resets` must have shape (batch, time) = ({batch}, {num_steps}); "
            f"got {tuple(resets.shape)}."
        )
    if resets.dtype != jnp.bool_:
        raise TypeError(f"`resets` must be boolean; got dtype {resets.dtype}.")


_MERGES: dict[str, Callable[[Array, Array], Array]] = {
    "concat": lambda a, b: jnp.concatenate([a, b], axis=-1),
    "sum": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
}


def _lookup(value: Any, table: dict[str, Any], name: str, other: str) -> Any:
    """``value`` itself if callable, else ``table[value]`` (a ValueError naming ``name``)."""
    if callable(value):
        return value
    if value not in table:
        raise ValueError(f"`{name}` must be one of {sorted(table)} or {other}; got {value!r}.")
    return table[value]


class Bidirectional(nn.Module):
    r"""Run one RNN forward and one in reverse, and merge their outputs.

    .. math::
        h^f_t = f(h^f_{t-1}, x_t),\quad h^r_t = f'(h^r_{t+1}, x_t),\quad
        y_t = \mathrm{merge}(h^f_t, h^r_t)

    MEDL (7.14); J&M (9.18)–(9.20) (``concat``). The backward RNN starts at each sequence's own
    last real step (``lengths``): padding never leaks into it. ``merge``: ``"concat"``
    (default), ``"sum"``, ``"mul"`` or a callable. :meth:`with_state`: ``(y, (carry_f, carry_b))``.
    """

    forward: RNN
    backward: RNN
    merge: str | Callable[[Array, Array], Array] = "concat"

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        refuse_retired(f"{cls.__name__}()", kwargs, {"return_carry": "with_state"})
        return super().__new__(cls)

    def __call__(
        self,
        x: Array,
        lengths: Array | ValidLengths | None = None,
        initial_carry: tuple[Carry, Carry] | None = None,
        resets: Array | None = None,
    ) -> Array:
        return self.with_state(x, lengths, initial_carry, resets)[0]

    @nn.compact
    def with_state(
        self,
        x: Array,
        lengths: Array | ValidLengths | None = None,
        initial_carry: tuple[Carry, Carry] | None = None,
        resets: Array | None = None,
    ) -> tuple[Array, tuple[Carry, Carry]]:
        """``(y, (carry_f, carry_b))``: merged outputs, each direction's final carry."""
        merge = _lookup(self.merge, _MERGES, "merge", "a callable")
        check_rank(x, "x", 3)
        lengths = None if lengths is None else check_lengths(lengths, "lengths", *x.shape[:2])
        init_f, init_b = (None, None) if initial_carry is None else initial_carry
        y_f, carry_f = self.forward.with_state(x, lengths, init_f, resets, reverse=False)
        # Resets mark segment starts; in reverse a segment starts at its last token.
        resets_b = None if resets is None else jnp.concatenate(
            [resets[:, 1:], jnp.ones_like(resets[:, :1])], axis=1)
        y_b, carry_b = self.backward.with_state(x, lengths, init_b, resets_b, reverse=True)
        return merge(y_f, y_b), (carry_f, carry_b)


class StackedRNN(nn.Module):
    r"""A stack of (optionally bidirectional) recurrent layers, like ``torch.nn.LSTM``.

    .. math::
        h^{[\ell]}_t = f^{[\ell]}(h^{[\ell]}_{t-1}, \tilde h^{[\ell-1]}_t), \qquad
        h^{[0]}_t \equiv x_t

    MEDL (7.15) (only ``h`` goes up; each layer's full carry goes forward in time); J&M §9.5.
    ``tilde h`` is ``h`` after dropout (between layers only, as PyTorch), plus the layer's
    input with ``residual=True`` where the widths match (every layer after the first).

    ``stack(x, lengths=None, initial_carry=None, deterministic=True, resets=None) -> y``;
    :meth:`with_state` (same arguments) -> ``(y, carry)``, ``carry`` a tuple of one cell carry
    per layer (``(fwd, bwd)`` if bidirectional), the layout of ``initial_carry`` (zeros:
    :meth:`zero_carry`). This is the **carry protocol** of every stateful layer of
    :mod:`seqjax.nn`, every recurrent model in :mod:`seqjax.models` and
    :mod:`seqjax.train.tbptt` (the cells' ``step`` keeps Flax's ``(carry, y)``).

    Attributes:
        features, num_layers: hidden size ``H`` of every layer (per direction); ``L``.
        cell_type: ``"lstm"``, ``"gru"``, ``"elman"`` or a cell class.
        bidirectional: concatenate a reversed layer at every level (output ``2H``).
        dropout_rate: dropout on the outputs of every layer but the last.
        residual: add each layer's input to its output where the widths match.
        cell_kwargs: extra arguments for every cell (e.g. ``{"reset_after": False}``).
        implementation: ``"scan"``, ``"fused"`` or ``"auto"`` (every layer an :class:`RNN`
            with it), or ``"cudnn"``: one ``jax.experimental.rnn.lstm`` call for the stack (GPU,
            float32 LSTM with at most ``forget_bias``/``use_bias`` in ``cell_kwargs``; no
            residual, resets or active dropout; weights: :func:`~seqjax.nn.cudnn_lstm_weights`).
            Same parameters and outputs either way.
    """

    features: int
    num_layers: int = 1
    cell_type: str | type[RecurrentCell] = "lstm"
    bidirectional: bool = False
    dropout_rate: float = 0.0
    residual: bool = False
    unroll: int | None = None
    cell_kwargs: Sequence[tuple[str, Any]] | dict | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32
    implementation: str = "auto"

    def _cudnn_eligible(self, deterministic: bool, resets: Array | None) -> bool:
        return (
            self.cell_type in ("lstm", LSTMCell)
            and set(dict(self.cell_kwargs or {})) <= {"forget_bias", "use_bias"}
            and not self.residual
            and (self.dropout_rate == 0.0 or deterministic)
            and resets is None
            and self.dtype in (None, jnp.float32)
            and self.param_dtype == jnp.float32
        )

    def _cell(self) -> RecurrentCell:
        cls = _lookup(self.cell_type, CELL_TYPES, "cell_type", "a cell class")
        # parent=None: the cell is adopted by the RNN that holds it (param path .../cell/...).
        return cls(self.features, dtype=self.dtype, param_dtype=self.param_dtype, parent=None,
                   **dict(self.cell_kwargs or {}))

    def zero_carry(self, batch_size: int, in_features: int = 1) -> tuple[Carry, ...]:
        """The all-zero ``initial_carry``; ``in_features`` matters only to cells whose carry
        depends on the input width."""

        def one(layer: int) -> Carry:
            p = in_features if layer == 0 else self.features * (2 if self.bidirectional else 1)
            return self._cell().initialize_carry(jax.random.PRNGKey(0), (batch_size, p))

        return tuple((one(layer), one(layer)) if self.bidirectional else one(layer)
                     for layer in range(self.num_layers))

    def __call__(
        self,
        x: Array,
        lengths: Array | ValidLengths | None = None,
        initial_carry: Sequence[Carry] | None = None,
        deterministic: bool = True,
        resets: Array | None = None,
    ) -> Array:
        return self.with_state(x, lengths, initial_carry, deterministic, resets)[0]

    @nn.compact
    def with_state(
        self,
        x: Array,
        lengths: Array | ValidLengths | None = None,
        initial_carry: Sequence[Carry] | None = None,
        deterministic: bool = True,
        resets: Array | None = None,
    ) -> tuple[Array, tuple[Carry, ...]]:
        """``(y, carry)``: the top layer's outputs, every layer's final carry."""
        check_positive_ints(num_layers=self.num_layers)
        check_rate(self.dropout_rate, "dropout_rate")
        if initial_carry is not None and len(initial_carry) != self.num_layers:
            raise ValueError(
                f"`initial_carry` must have one entry per layer ({self.num_layers}); "
                f"got {len(initial_carry)}."
            )
        check_rank(x, "x", 3)
        # Once, for every layer.
        lengths = None if lengths is None else check_lengths(lengths, "lengths", *x.shape[:2])
        first = ("layer_0", "forward") if self.bidirectional else ("layer_0",)
        kernel = bound_param_shape(self, *first, "cell", "input", "kernel")
        check_features(x, "x", None if kernel is None else kernel[0])
        _check_implementation(self.implementation)
        use_cudnn = self.implementation == "cudnn"
        if use_cudnn and not self.is_initializing():
            if not self._cudnn_eligible(deterministic, resets):
                raise ValueError(
                    "`implementation='cudnn'` needs a plain LSTM stack (cell_type='lstm', "
                    "float32, no residual, no resets, dropout 0 or deterministic)."
                )
            _check_cudnn_backend()
            lengths_B = lengths_array(lengths)
            y, carries = _cudnn.lstm_stack(
                self.variables["params"], x, lengths_B, initial_carry, features=self.features,
                num_layers=self.num_layers, bidirectional=self.bidirectional,
            )
            carries, y = _poison_bad_lengths(carries, y, lengths_B, x.shape[1], time_major=False)
            return y, carries
        # A whole-stack cuDNN request (here only at init) builds the layers with "auto".
        layer_impl = "auto" if use_cudnn else self.implementation

        def rnn(**kwargs: Any) -> RNN:
            return RNN(self._cell(), unroll=self.unroll, implementation=layer_impl, **kwargs)

        h = x
        finals = []
        for layer in range(self.num_layers):
            init = None if initial_carry is None else initial_carry[layer]
            module = (Bidirectional(rnn(parent=None), rnn(parent=None), name=f"layer_{layer}")
                      if self.bidirectional else rnn(name=f"layer_{layer}"))
            out, carry = module.with_state(h, lengths, init, resets)
            finals.append(carry)
            if self.residual and layer > 0 and out.shape[-1] == h.shape[-1]:
                out = out + h
            if layer < self.num_layers - 1 and self.dropout_rate > 0.0:
                # Padded outputs are zero and stay zero under dropout.
                out = nn.Dropout(self.dropout_rate)(out, deterministic=deterministic)
            h = out
        return h, tuple(finals)

r"""Recurrent cells: Elman, LSTM, GRU (both reset conventions), output feedback, simple gate.

Each cell holds its equation; a layer (:class:`seqjax.nn.RNN`) scans it over time, hoisting
the part that does not depend on the carry:

* ``input_projection(x_BxTxP) -> xp_BxTxGH``: ``x W_x + b`` for all gates (any leading dims);
* ``step(carry, xp_BxGH) -> (carry, y_BxH)``: the recurrent part;
* ``__call__(carry, x_BxP) -> (carry, y_BxH)``: both, for one time step.

:class:`OutputFeedbackCell` and :class:`SimpleGatedCell` need the raw ``x_t`` in ``step``:
their ``input_projection`` returns ``x`` and ``step`` applies ``W_x``.

``cell.layer_weights()``, a layer's only access to a cell's parameters, returns a
:class:`LayerWeights` naming the equation (``"elman"``, ``"lstm"``, ``"gru"``) of a whole-layer
kernel (:mod:`seqjax.nn.recurrent._layer_kernels`), or ``None`` and the layer scans ``step``:
the feedback and gated cells, ``GRUCell(reset_after=False)``, and every subclass redefining
``step``, ``recurrent`` or ``input_projection`` (the kernel would compute the parent's
equation; one whose equation *is* a kernel's may override ``layer_weights`` to opt back in).

``use_bias=True`` (default, as PyTorch and Flax) adds MEDL's biases; ``use_bias=False`` computes
the bias-free J&M, lecture notes' (1)–(2) and slides' equations exactly (each cell cites them).
Conventions (docs/design.md): row vectors, so kernels are the textbooks' ``Wᵀ``; parameters in
``param_dtype``, computed in ``dtype``; gate blocks in PyTorch's order (weight import is a
reshape).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import check_positive_ints
from seqjax.nn.dense import Dense

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = [
    "RecurrentCell", "ElmanCell", "LSTMCell", "GRUCell", "OutputFeedbackCell",
    "SimpleGatedCell", "LayerWeights",
]


def _zeros_carry(input_shape: tuple[int, ...], features: int, dtype: Dtype) -> Array:
    return jnp.zeros((*input_shape[:-1], features), dtype)


class LayerWeights(NamedTuple):
    """A cell's parameters for a kernel of :mod:`seqjax.nn.recurrent._layer_kernels`.

    From :meth:`RecurrentCell.layer_weights`; ``G`` gate blocks of width ``H``:

    * ``equation``: the kernel computing the cell's ``step``: ``"elman"`` (MEDL (7.2)),
      ``"lstm"`` (MEDL (7.16)–(7.17)) or ``"gru"`` (reset after the matmul, PyTorch/cuDNN);
    * ``input_kernel: [P, G*H]``, ``bias: [G*H]`` (zeros when ``use_bias=False``),
      ``recurrent_kernel: [H, G*H]``: the stacked ``W_{·x}ᵀ``, ``b_·``, ``W_{·h}ᵀ``;
    * ``recurrent_bias``: the GRU's ``b_hn: [H]`` (zeros without biases), else ``None``;
    * ``activation``: the Elman cell's ``σ``, else ``None``.
    """

    equation: str
    input_kernel: Array
    bias: Array
    recurrent_kernel: Array
    recurrent_bias: Array | None = None
    activation: Callable[[Array], Array] | None = None


def _keeps_equation(cell: RecurrentCell, owner: type) -> bool:
    """Whether ``cell`` computes ``owner``'s equation: none of the methods that define it
    redefined below ``owner`` (else it no longer computes what ``owner``'s kernel computes)."""
    methods = ("step", "recurrent", "input_projection")
    return all(getattr(type(cell), m) is getattr(owner, m) for m in methods)


class RecurrentCell(nn.Module):
    """Base class: the split into ``input_projection`` and ``step``.

    Subclasses set ``num_gates`` (G) and implement ``step``; ``initialize_carry`` gives zeros
    ``h: [..., H]`` (in ``param_dtype``) unless a subclass redefines it. Every
    cell has ``input/kernel: [P, G*H]`` (stacked ``W_{·x}ᵀ``), ``input/bias: [G*H]`` (stacked
    ``b_·``; absent with ``use_bias=False``) and ``recurrent_kernel: [H, G*H]`` (``W_{·h}ᵀ``).
    """

    features: int
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    recurrent_kernel_init: Initializer = nn.initializers.orthogonal()
    bias_init: Initializer = nn.initializers.zeros_init()
    use_bias: bool = True

    num_gates: int = 1  # overridden per cell; not a constructor argument in practice

    def _bias_init(self, key: Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> Array:
        return self.bias_init(key, shape, dtype)

    def setup(self) -> None:
        check_positive_ints(features=self.features)
        gh = self.num_gates * self.features
        self.input = Dense(gh, use_bias=self.use_bias, dtype=self.dtype,
                           param_dtype=self.param_dtype, kernel_init=self.kernel_init,
                           bias_init=self._bias_init, name="input")
        self.recurrent_kernel = self.param(
            "recurrent_kernel", self.recurrent_kernel_init, (self.features, gh), self.param_dtype
        )

    def recurrent(self, h: Array, cols: slice = slice(None)) -> Array:
        """``h W_hᵀ`` restricted to the gate columns ``cols``, in the compute dtype."""
        h, kernel = nn.dtypes.promote_dtype(h, self.recurrent_kernel[:, cols], dtype=self.dtype)
        return h @ kernel

    def input_projection(self, x: Array) -> Array:
        """``x W_xᵀ + b`` for every gate: ``[..., P] -> [..., G*H]``."""
        if x.ndim < 1:
            raise ValueError(f"`x` must have a feature axis; got shape {x.shape}.")
        return self.input(x)

    def layer_weights(self) -> LayerWeights | None:
        """:class:`LayerWeights` or ``None``; call on a bound cell whose ``input`` exists."""
        return None

    def _kernel_weights(self, owner: type, equation: str, **extra: Any) -> LayerWeights | None:
        """:class:`LayerWeights` for ``owner``'s kernel ``equation`` (the bias zeros when
        ``use_bias=False``), or ``None`` if a subclass changed ``owner``'s equation."""
        if not _keeps_equation(self, owner):
            return None
        dense = self.input.variables["params"]
        kernel = dense["kernel"]
        bias = dense["bias"] if self.use_bias else jnp.zeros(kernel.shape[-1:], kernel.dtype)
        return LayerWeights(equation, kernel, bias, self.recurrent_kernel, **extra)

    def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> Any:
        del rng
        return _zeros_carry(input_shape, self.features, self.param_dtype)

    def __call__(self, carry: Any, x: Array) -> tuple[Any, Array]:
        """One time step on ``x: [..., P]``; returns ``(new_carry, y: [..., H])``."""
        self._check_carry(carry, x.shape)
        return self.step(carry, self.input_projection(x))

    def _check_carry(self, carry: Any, input_shape: tuple[int, ...]) -> None:
        zeros = jax.eval_shape(lambda: self.initialize_carry(jax.random.PRNGKey(0), input_shape))
        expected = [tuple(e.shape) for e in jax.tree_util.tree_leaves(zeros)]
        got = [tuple(a.shape) for a in jax.tree_util.tree_leaves(carry)]
        if got != expected:
            raise ValueError(
                f"`carry` for {type(self).__name__}(features={self.features}) must have leaf "
                f"shapes {expected}; got {got}."
            )


class ElmanCell(RecurrentCell):
    r"""Elman (simple) recurrent cell.

    .. math::
        h_t = \sigma(W_{hh} h_{t-1} + W_{hx} x_t + b_h)

    MEDL (7.2), with its single bias ``b_h`` (PyTorch's ``b_ih + b_hh`` import as their sum).
    J&M (9.3)–(9.5) (``h_t = g(U h_{t-1} + W x_t)``), the lecture notes' (1) and the slides'
    vanilla RNN have no bias: ``use_bias=False``. ``y_t = h_t``; the output layer
    ``S_y(W_{yh} h_t + b_y)`` (J&M's ``f(V h_t)``) is a separate Dense. Carry ``h: [..., H]``;
    ``H² + HP + H`` parameters (``H² + HP`` without bias); layer kernel ``"elman"``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cell = ElmanCell(features=4)
        >>> x = jnp.ones((2, 3)); h = cell.initialize_carry(jax.random.PRNGKey(0), x.shape)
        >>> params = cell.init(jax.random.PRNGKey(1), h, x)
        >>> cell.apply(params, h, x)[1].shape
        (2, 4)

    Attributes:
        features: hidden size ``H`` (MEDL's ``m``).
        activation: ``σ``; ``tanh`` by default (MEDL's toy example uses sigmoid).
    """

    activation: Callable[[Array], Array] = jnp.tanh
    num_gates: int = 1

    def step(self, carry: Array, xp: Array) -> tuple[Array, Array]:
        h_BxH = self.activation(xp + self.recurrent(carry))
        return h_BxH, h_BxH

    def layer_weights(self) -> LayerWeights | None:
        return self._kernel_weights(ElmanCell, "elman", activation=self.activation)


class LSTMCell(RecurrentCell):
    r"""Long short-term memory cell (no peepholes).

    .. math::
        i_t &= \mathrm{sig}(W_{ih} h_{t-1} + W_{ix} x_t + b_i) \\
        f_t &= \mathrm{sig}(W_{fh} h_{t-1} + W_{fx} x_t + b_f) \\
        \tilde c_t &= \tanh(W_{\tilde c h} h_{t-1} + W_{\tilde c x} x_t + b_{\tilde c}) \\
        o_t &= \mathrm{sig}(W_{oh} h_{t-1} + W_{ox} x_t + b_o) \\
        c_t &= f_t \odot c_{t-1} + i_t \odot \tilde c_t, \qquad h_t = o_t \odot \tanh(c_t)

    MEDL (7.16)–(7.17), one bias per gate: ``4H² + 4HP + 4H`` parameters. J&M (9.22)–(9.29)
    have no biases: ``use_bias=False`` (``4H² + 4HP``). Gate order ``i, f, c̃(g), o``
    (PyTorch's). Carry ``(c, h)``, each ``[..., H]`` (Flax's layout); layer kernel ``"lstm"``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cell = LSTMCell(features=4)
        >>> x = jnp.ones((2, 3)); carry = cell.initialize_carry(jax.random.PRNGKey(0), x.shape)
        >>> params = cell.init(jax.random.PRNGKey(1), carry, x)
        >>> cell.apply(params, carry, x)[0][0].shape
        (2, 4)

    Attributes:
        features: hidden size ``H`` (MEDL's ``m̃``).
        forget_bias: initial value of ``b_f`` (Jozefowicz et al. 2015 recommend 1.0); an
            initialisation only, the equation is unchanged.
        recurrent_bias: split ``b = b_{·x} + b_{·h}``, the second (``recurrent_bias: [4H]``)
            on the recurrent product, as PyTorch/cuDNN: the same function with ``4H`` more
            parameters, so a different initialisation and SGD trajectory. Needs ``use_bias``.
    """

    forget_bias: float = 0.0
    recurrent_bias: bool = False
    num_gates: int = 4

    def setup(self) -> None:
        super().setup()
        if self.recurrent_bias:
            if not self.use_bias:
                raise ValueError("`recurrent_bias=True` needs `use_bias=True`; got use_bias=False.")
            self.recurrent_bias_hh = self.param(
                "recurrent_bias", self.bias_init, (4 * self.features,), self.param_dtype
            )

    def recurrent(self, h: Array, cols: slice = slice(None)) -> Array:
        """As the base's, plus ``b_h`` with ``recurrent_bias``."""
        out = super().recurrent(h, cols)
        if self.recurrent_bias:
            out = out + jnp.asarray(self.recurrent_bias_hh[cols], out.dtype)
        return out

    def _bias_init(self, key: Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> Array:
        b = self.bias_init(key, shape, dtype)
        h = self.features
        return b.at[h : 2 * h].add(jnp.asarray(self.forget_bias, dtype))

    def step(self, carry: tuple[Array, Array], xp: Array) -> tuple[tuple[Array, Array], Array]:
        c_BxH, h_BxH = carry
        i, f, g, o = jnp.split(xp + self.recurrent(h_BxH), 4, axis=-1)
        c_BxH = jax.nn.sigmoid(f) * c_BxH + jax.nn.sigmoid(i) * jnp.tanh(g)
        h_BxH = jax.nn.sigmoid(o) * jnp.tanh(c_BxH)
        return (c_BxH, h_BxH), h_BxH

    def layer_weights(self) -> LayerWeights | None:
        weights = self._kernel_weights(LSTMCell, "lstm")
        if weights is None or not self.recurrent_bias:
            return weights
        return weights._replace(bias=weights.bias + self.recurrent_bias_hh)  # one bias: b_x + b_h

    def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> tuple[Array, Array]:
        zeros = super().initialize_carry  # (c, h)
        return zeros(rng, input_shape), zeros(rng, input_shape)


class GRUCell(RecurrentCell):
    r"""Gated recurrent unit, with either placement of the reset gate.

    ``reset_after=True`` (default; PyTorch, cuDNN, Flax, the slides): the reset gate multiplies
    the recurrent product **after** the matmul:

    .. math::
        r_t &= \mathrm{sig}(W_{rx} x_t + b_r + W_{rh} h_{t-1}) \\
        z_t &= \mathrm{sig}(W_{zx} x_t + b_z + W_{zh} h_{t-1}) \\
        n_t &= \tanh(W_{nx} x_t + b_n + r_t \odot (W_{nh} h_{t-1} + b_{hn})) \\
        h_t &= (1 - z_t) \odot n_t + z_t \odot h_{t-1}

    ``reset_after=False`` (MEDL (7.18)–(7.19); Cho et al. 2014): it multiplies the state
    **before** the matmul:

    .. math::
        n_t = \tanh(W_{nx} x_t + b_n + W_{nh}(r_t \odot h_{t-1}))

    ``z_t`` is the *keep* gate (PyTorch, Flax, the slides: ``z_t = 1`` copies ``h_{t-1}``);
    MEDL's update gate is ``g_u = 1 - z_t`` (``W_u = -W_z``, ``b_u = -b_z``); ``n_t`` is MEDL's
    ``h̃``. MEDL has one bias per block (``b_r, b_u, b_h̃``); ``reset_after=True`` adds
    PyTorch's ``b_hn`` (param ``recurrent_bias_n``); ``use_bias=False`` drops all, and with
    ``reset_after=True`` is exactly the slides' GRU. Only ``reset_after=True`` has a layer
    kernel (``"gru"``); for ``False`` :class:`~seqjax.nn.RNN` scans ``step``.

    Gate order ``r, z, n`` (PyTorch's). Parameters ``3H² + 3HP + 3H``, plus ``H`` for ``b_hn``
    when ``reset_after=True``. Carry ``h: [..., H]``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cell = GRUCell(features=4, reset_after=False)
        >>> x = jnp.ones((2, 3)); h = cell.initialize_carry(jax.random.PRNGKey(0), x.shape)
        >>> params = cell.init(jax.random.PRNGKey(1), h, x)
        >>> sorted(params["params"])
        ['input', 'recurrent_kernel']
    """

    reset_after: bool = True
    num_gates: int = 3

    def setup(self) -> None:
        super().setup()
        if self.reset_after and self.use_bias:
            self.recurrent_bias_n = self.param(
                "recurrent_bias_n", self.bias_init, (self.features,), self.param_dtype
            )

    def step(self, carry: Array, xp: Array) -> tuple[Array, Array]:
        h_BxH = carry
        hsz = self.features
        xr, xz, xn = jnp.split(xp, 3, axis=-1)
        if self.reset_after:
            hr, hz, hn = jnp.split(self.recurrent(h_BxH), 3, axis=-1)
            if self.use_bias:
                hn = hn + jnp.asarray(self.recurrent_bias_n, hn.dtype)
            r = jax.nn.sigmoid(xr + hr)
            z = jax.nn.sigmoid(xz + hz)
            n = jnp.tanh(xn + r * hn)
        else:
            # r multiplies h before the candidate's matmul: that block is applied on its own.
            hrz = self.recurrent(h_BxH, slice(0, 2 * hsz))
            r = jax.nn.sigmoid(xr + hrz[..., :hsz])
            z = jax.nn.sigmoid(xz + hrz[..., hsz:])
            n = jnp.tanh(xn + self.recurrent(r * h_BxH, slice(2 * hsz, None)))
        h_new = (1.0 - z) * n + z * h_BxH
        return h_new, h_new

    def layer_weights(self) -> LayerWeights | None:
        if not self.reset_after:
            return None
        b_hn = (self.recurrent_bias_n if self.use_bias
                else jnp.zeros((self.features,), self.recurrent_kernel.dtype))
        return self._kernel_weights(GRUCell, "gru", recurrent_bias=b_hn)


_FEEDBACKS = ("identity", "linear")


class OutputFeedbackCell(RecurrentCell):
    r"""Elman cell fed back its own previous output (MEDL (7.3)).

    .. math::
        h_t = S_h\big(W_{hh} h_{t-1} + W_{hx}(x_t + \mathcal T(\hat y_{t-1})) + b_h\big),
        \qquad \hat y_t = S_y(W_{yh} h_t + b_y)

    The feedback is *added* to the input before ``W_{hx}`` (``\mathcal T: \mathbb R^q \to
    \mathbb R^p``); ``\hat y_0 = 0`` (MEDL leaves it open). The output ``\hat y_t: [..., Q]``,
    so the output layer is part of the cell. Teacher forcing (MEDL §7.2) feeds the true
    ``y_{t-1}`` through ``x_t`` to an :class:`ElmanCell` instead. ``use_bias=False`` drops
    ``b_h`` and ``b_y`` (the bias-free J&M (9.3)–(9.4)).

    Carry ``(h: [..., H], ŷ: [..., Q])``. Parameters: ``input/{kernel [P, H], bias [H]}``,
    ``recurrent_kernel [H, H]``, ``output/{kernel [H, Q], bias [Q]}`` (+ ``feedback/kernel
    [Q, P]``). No layer kernel: :class:`~seqjax.nn.RNN` scans ``step``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cell = OutputFeedbackCell(features=4)
        >>> x = jnp.ones((2, 3)); carry = cell.initialize_carry(jax.random.PRNGKey(0), x.shape)
        >>> params = cell.init(jax.random.PRNGKey(1), carry, x)
        >>> (h, y_prev), y = cell.apply(params, carry, x)
        >>> h.shape, y.shape, bool(jnp.allclose(y.sum(-1), 1.0))
        ((2, 4), (2, 3), True)

    Attributes:
        features: hidden size ``H`` (MEDL's ``m``).
        out_features: ``Q``; ``None`` means ``Q = P`` (the input width).
        activation, output_activation: ``S_h`` (``tanh``); ``S_y`` (``softmax``: probabilities).
        feedback: ``\mathcal T``: ``"identity"`` (default; needs ``Q = P``, as MEDL's one-hot toy
            example), ``"linear"`` (learned ``[Q, P]``, ``feedback/kernel``) or a callable
            ``[..., Q] -> [..., P]`` (e.g. MEDL's footnote 6: argmax → token → embedding).
    """

    out_features: int | None = None
    activation: Callable[[Array], Array] = jnp.tanh
    output_activation: Callable[[Array], Array] = jax.nn.softmax
    feedback: str | Callable[[Array], Array] = "identity"
    num_gates: int = 1

    def setup(self) -> None:
        super().setup()
        if isinstance(self.feedback, str) and self.feedback not in _FEEDBACKS:
            raise ValueError(
                f"`feedback` must be one of {_FEEDBACKS} or a callable; got {self.feedback!r}."
            )
        if self.out_features is not None:
            check_positive_ints(out_features=self.out_features)

    def input_projection(self, x: Array) -> Array:
        """``x`` itself: ``W_{hx}`` multiplies ``x_t + T(ŷ_{t-1})`` inside ``step``."""
        if x.ndim < 1:
            raise ValueError(f"`x` must have a feature axis; got shape {x.shape}.")
        return x

    def _feedback(self, y_BxQ: Array, p: int) -> Array:
        if callable(self.feedback):
            fb = self.feedback(y_BxQ)
        elif self.feedback == "linear":
            fb = Dense(p, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
                       kernel_init=self.kernel_init, name="feedback")(y_BxQ)
        else:
            if y_BxQ.shape[-1] != p:
                raise ValueError(
                    "`feedback='identity'` needs out_features == the input width "
                    f"({p}); got out_features={y_BxQ.shape[-1]}. Use feedback='linear' or a "
                    "callable."
                )
            fb = y_BxQ
        if fb.shape[-1] != p:
            raise ValueError(
                f"`feedback` must map [..., {y_BxQ.shape[-1]}] to [..., {p}] (the input "
                f"width); got shape {tuple(fb.shape)}."
            )
        return fb

    @nn.compact
    def step(self, carry: tuple[Array, Array], x: Array) -> tuple[tuple[Array, Array], Array]:
        h_BxH, y_BxQ = carry
        p = x.shape[-1]
        u_BxP = x + self._feedback(y_BxQ, p).astype(x.dtype)
        h_BxH = self.activation(self.input(u_BxP) + self.recurrent(h_BxH))
        # Without out_features Q = P: the output layer's width is known only from the input.
        output = Dense(p if self.out_features is None else self.out_features,
                       use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
                       kernel_init=self.kernel_init, bias_init=self.bias_init, name="output")
        y_BxQ = self.output_activation(output(h_BxH))
        return (h_BxH, y_BxQ), y_BxQ

    def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> tuple[Array, Array]:
        q = input_shape[-1] if self.out_features is None else self.out_features
        return (super().initialize_carry(rng, input_shape),
                _zeros_carry(input_shape, q, self.param_dtype))


class SimpleGatedCell(RecurrentCell):
    r"""The slides' "simple gate": one learned gate between the old memory and the input.

    .. math::
        g_t = \sigma(W_{hh} h_{t-1} + W_{xh} x_t + b_g), \qquad
        c_t = g_t \odot c_{t-1} + (1 - g_t) \odot x_t, \qquad h_t = \tanh(c_t)

    Lecture slides, "Gating mechanism — Simple Gate" (output ``y_t = W_{hy} h_t``: a separate
    Dense). ``g_t = 1`` keeps the state, ``g_t = 0`` takes the input; as ``c`` mixes the raw
    input, the input width must equal ``features`` (ValueError otherwise). The slides have no
    bias: ``use_bias=False`` drops ``b_g``. Carry ``(c, h)``, each ``[..., H]``. Parameters:
    ``input/{kernel [H, H], bias [H]}``, ``recurrent_kernel [H, H]``. No layer kernel.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cell = SimpleGatedCell(features=3)
        >>> x = jnp.ones((2, 3)); carry = cell.initialize_carry(jax.random.PRNGKey(0), x.shape)
        >>> params = cell.init(jax.random.PRNGKey(1), carry, x)
        >>> (c, h), y = cell.apply(params, carry, x)
        >>> c.shape, bool(jnp.allclose(h, jnp.tanh(c)))
        ((2, 3), True)
    """

    num_gates: int = 1

    def input_projection(self, x: Array) -> Array:
        """``x`` itself: the memory update needs ``x_t`` as well as ``W_{xh} x_t``."""
        if x.ndim < 1:
            raise ValueError(f"`x` must have a feature axis; got shape {x.shape}.")
        if x.shape[-1] != self.features:
            raise ValueError(
                f"`x` must have features == {self.features} on its last axis (the simple "
                f"gate mixes x_t into the memory c_t); got shape {tuple(x.shape)}."
            )
        return x

    def step(self, carry: tuple[Array, Array], x: Array) -> tuple[tuple[Array, Array], Array]:
        c_BxH, h_BxH = carry
        g_BxH = jax.nn.sigmoid(self.input(x) + self.recurrent(h_BxH))
        c_BxH = g_BxH * c_BxH + (1.0 - g_BxH) * x
        h_BxH = jnp.tanh(c_BxH)
        return (c_BxH, h_BxH), h_BxH

    def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> tuple[Array, Array]:
        zeros = super().initialize_carry  # (c, h)
        return zeros(rng, input_shape), zeros(rng, input_shape)

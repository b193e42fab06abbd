r"""Recurrent cells: Elman, LSTM, GRU (both reset conventions), output feedback, simple gate.

Each cell holds its equation in ``step``; a layer (:class:`seqjax.nn.RNN`) scans it over
time. The work of one step is split in two so that the layer can hoist what does not
depend on the carry:

* ``input_projection(x_BxTxP) -> xp_BxTxGH`` — ``x W_x + b`` for all gates
  (any leading batch/time dims);
* ``step(carry, xp_BxGH) -> (carry, y_BxH)`` — the recurrent part;
* ``__call__(carry, x_BxP) -> (carry, y_BxH)`` — both, for one time step.

Cells whose step needs the raw input ``x_t`` itself (:class:`OutputFeedbackCell`,
:class:`SimpleGatedCell`) return ``x`` unchanged from ``input_projection`` and apply
``W_x`` inside ``step``.

**Fast layer kernels.** ``cell.layer_weights()`` is the one door through which a layer
reaches a cell's parameters: it returns a :class:`LayerWeights` naming the equation
(``"elman"``, ``"lstm"``, ``"gru"``) and the arrays a whole-layer kernel of
:mod:`seqjax.nn.recurrent._layer_kernels` needs, or ``None`` when the cell has no such
kernel — the output-feedback and gated cells, ``GRUCell(reset_after=False)``, and every
subclass that redefines ``step``, ``recurrent`` or ``input_projection`` (the kernel would
compute the parent's equation, not theirs): those run their own ``step`` in a scan. A subclass whose
equation *is* one of the kernels' may override ``layer_weights`` to opt back in.

**Biases.** ``use_bias=True`` (default, as PyTorch and Flax) adds the biases of MEDL
(7.2), (7.16)–(7.19). J&M (9.3)–(9.5), (9.22)–(9.29), the lecture notes' (1)–(2) and the
slides' recurrences have no biases: ``use_bias=False`` computes those equations exactly.

Conventions (docs/design.md): row vectors, so kernels are the transposes of the textbooks'
``W`` (``x @ w`` here is ``W x`` there); parameters are stored in ``param_dtype`` and
computed in ``dtype``. Gate blocks are laid out in PyTorch's order (LSTM ``i, f, c̃, o``;
GRU ``r, z, n``), which makes weight import a reshape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax.nn.dense import Dense

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = [
    "RecurrentCell", "ElmanCell", "LSTMCell", "GRUCell", "OutputFeedbackCell",
    "SimpleGatedCell", "LayerWeights",
]


def _zeros_carry(batch_shape: tuple[int, ...], features: int, dtype: Dtype) -> Array:
    return jnp.zeros((*batch_shape, features), dtype)


class LayerWeights(NamedTuple):
    """A cell's parameters as the layer kernels of :mod:`seqjax.nn.recurrent._layer_kernels` read.

    Returned by :meth:`RecurrentCell.layer_weights`. With ``G`` gate blocks of width ``H``:

    * ``equation``: ``"elman"`` (MEDL (7.2)), ``"lstm"`` (MEDL (7.16)–(7.17)) or ``"gru"``
      (reset gate after the matmul, PyTorch/cuDNN) — the kernel that computes the cell's
      ``step``;
    * ``input_kernel``: ``[P, G*H]``, the stacked ``W_{·x}ᵀ``;
    * ``bias``: ``[G*H]``, the stacked ``b_·`` (zeros when ``use_bias=False``);
    * ``recurrent_kernel``: ``[H, G*H]``, the stacked ``W_{·h}ᵀ``;
    * ``recurrent_bias``: the GRU's ``b_hn: [H]`` (zeros without biases), else ``None``;
    * ``activation``: the Elman cell's ``σ``, else ``None``.
    """

    equation: str
    input_kernel: Array
    bias: Array
    recurrent_kernel: Array
    recurrent_bias: Array | None = None
    activation: Callable[[Array], Array] | None = None


# The methods that define a cell's equation: a subclass that overrides any of them no
# longer computes what its parent's layer kernel computes.
_EQUATION_METHODS = ("step", "recurrent", "input_projection")


def _keeps_equation(cell: RecurrentCell, owner: type) -> bool:
    """Whether ``cell`` computes ``owner``'s equation (no equation method redefined below it)."""
    cls = type(cell)
    return all(getattr(cls, m) is getattr(owner, m) for m in _EQUATION_METHODS)


class RecurrentCell(nn.Module):
    """Base class: the split into ``input_projection`` and ``step``.

    Subclasses set ``num_gates`` (G) and implement ``step`` and
    ``initialize_carry``. Parameters (shared by every cell):

    * ``input/kernel``: ``[P, G*H]`` — the stacked input matrices ``W_{·x}ᵀ``;
    * ``input/bias``:   ``[G*H]``   — the stacked biases ``b_·`` (absent with
      ``use_bias=False``);
    * ``recurrent_kernel``: ``[H, G*H]`` — the stacked recurrent matrices ``W_{·h}ᵀ``.
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
        if self.features <= 0:
            raise ValueError(f"`features` must be a positive int; got {self.features}.")
        gh = self.num_gates * self.features
        self.input = Dense(
            gh,
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            bias_init=self._bias_init,
            name="input",
        )
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
        """The parameters for a whole-layer kernel (:class:`LayerWeights`), or ``None``.

        ``None`` (this base class, and any cell without a kernel): the layer runs
        ``step`` in a scan. Call on a bound cell whose input projection has been created
        (:class:`seqjax.nn.RNN` does both).
        """
        return None

    def _dense_weights(self) -> tuple[Array, Array]:
        """``(input/kernel, input/bias)``; the bias is zeros when ``use_bias=False``."""
        dense = self.input.variables["params"]
        kernel = dense["kernel"]
        bias = dense["bias"] if self.use_bias else jnp.zeros(kernel.shape[-1:], kernel.dtype)
        return kernel, bias

    def __call__(self, carry: Any, x: Array) -> tuple[Any, Array]:
        """One time step on ``x: [..., P]``; returns ``(new_carry, y: [..., H])``."""
        self._check_carry(carry, x.shape)
        return self.step(carry, self.input_projection(x))

    def _check_carry(self, carry: Any, input_shape: tuple[int, ...]) -> None:
        expected = jax.tree_util.tree_leaves(
            jax.eval_shape(lambda: self.initialize_carry(jax.random.PRNGKey(0), input_shape))
        )
        leaves = jax.tree_util.tree_leaves(carry)
        if len(leaves) != len(expected) or any(
            tuple(a.shape) != tuple(e.shape) for a, e in zip(leaves, expected)
        ):
            raise ValueError(
                f"`carry` for {type(self).__name__}(features={self.features}) must have leaf "
                f"shapes {[tuple(e.shape) for e in expected]}; got "
                f"{[tuple(a.shape) for a in leaves]}."
            )


class ElmanCell(RecurrentCell):
    r"""Elman (simple) recurrent cell.

    .. math::
        h_t = \sigma(W_{hh} h_{t-1} + W_{hx} x_t + b_h)

    MEDL (7.2), with its single bias ``b_h`` (PyTorch's ``b_ih + b_hh`` import as their
    sum). J&M (9.3)–(9.5) (``h_t = g(U h_{t-1} + W x_t)``), the lecture notes' (1) and
    the slides' vanilla RNN have **no bias**: the default departs from them by ``b_h``;
    ``use_bias=False`` computes them exactly. The output ``y_t`` is ``h_t``; the output
    layer ``S_y(W_{yh} h_t + b_y)`` (J&M's ``f(V h_t)``) is a separate Dense.

    Carry: ``h: [..., H]``. Parameters: ``H² + HP + H`` (``H² + HP`` without bias).
    Layer kernel: ``"elman"`` (:meth:`layer_weights`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cell = ElmanCell(features=4)
        >>> x = jnp.ones((2, 3))
        >>> h = cell.initialize_carry(jax.random.PRNGKey(0), x.shape)
        >>> params = cell.init(jax.random.PRNGKey(1), h, x)
        >>> h, y = cell.apply(params, h, x)
        >>> y.shape
        (2, 4)

    Attributes:
        features: hidden size ``H`` (MEDL's ``m``).
        activation: ``σ``; ``tanh`` by default (MEDL's toy example uses sigmoid).
        use_bias: add ``b_h`` (MEDL (7.2)); ``False`` for J&M (9.3).
    """

    activation: Callable[[Array], Array] = jnp.tanh
    num_gates: int = 1

    def step(self, carry: Array, xp: Array) -> tuple[Array, Array]:
        h_BxH = self.activation(xp + self.recurrent(carry))
        return h_BxH, h_BxH

    def layer_weights(self) -> LayerWeights | None:
        if not _keeps_equation(self, ElmanCell):
            return None
        kernel, bias = self._dense_weights()
        return LayerWeights("elman", kernel, bias, self.recurrent_kernel,
                            activation=self.activation)

    def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> Array:
        del rng
        return _zeros_carry(tuple(input_shape[:-1]), self.features, self.param_dtype)


class LSTMCell(RecurrentCell):
    r"""Long short-term memory cell (no peepholes).

    .. math::
        i_t &= \mathrm{sig}(W_{ih} h_{t-1} + W_{ix} x_t + b_i) \\
        f_t &= \mathrm{sig}(W_{fh} h_{t-1} + W_{fx} x_t + b_f) \\
        \tilde c_t &= \tanh(W_{\tilde c h} h_{t-1} + W_{\tilde c x} x_t + b_{\tilde c}) \\
        o_t &= \mathrm{sig}(W_{oh} h_{t-1} + W_{ox} x_t + b_o) \\
        c_t &= f_t \odot c_{t-1} + i_t \odot \tilde c_t, \qquad h_t = o_t \odot \tanh(c_t)

    MEDL (7.16)–(7.17), one bias per gate as MEDL counts: parameters ``4H² + 4HP + 4H``.
    J&M (9.22)–(9.29) have **no biases**: ``use_bias=False`` computes them exactly
    (``4H² + 4HP``). Gate blocks are ordered ``i, f, c̃(g), o`` (PyTorch's order).

    Carry: ``(c, h)``, each ``[..., H]`` (Flax's layout). Layer kernel: ``"lstm"``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cell = LSTMCell(features=4)
        >>> x = jnp.ones((2, 3))
        >>> carry = cell.initialize_carry(jax.random.PRNGKey(0), x.shape)
        >>> params = cell.init(jax.random.PRNGKey(1), carry, x)
        >>> (c, h), y = cell.apply(params, carry, x)
        >>> c.shape, h.shape
        ((2, 4), (2, 4))

    Attributes:
        features: hidden size ``H`` (MEDL's ``m̃``).
        forget_bias: initial value of the forget-gate bias ``b_f`` (Jozefowicz
            et al. 2015 recommend 1.0). It is an initialisation only: the
            equation above is computed exactly.
        use_bias: the biases ``b_·`` (MEDL); ``False`` for J&M (9.22)–(9.29).
        recurrent_bias: keep the bias as two vectors, ``b = b_{·x} + b_{·h}``, the second
            (``recurrent_bias: [4H]``) on the recurrent product, as PyTorch, cuDNN and
            Torch7's ``nn.Linear`` pairs (Zaremba et al.'s ``i2h + h2h``) do. The same
            function (the equation above with ``b`` their sum) with ``4H`` more parameters,
            so a different initialisation and SGD trajectory (each half gets the gradient
            of ``b``). Needs ``use_bias``.
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
        """``h W_hᵀ (+ b_h)`` restricted to the gate columns ``cols``, in the compute dtype."""
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
        if not _keeps_equation(self, LSTMCell):
            return None
        kernel, bias = self._dense_weights()
        if self.recurrent_bias:
            bias = bias + self.recurrent_bias_hh  # the kernel adds one bias: b_x + b_h
        return LayerWeights("lstm", kernel, bias, self.recurrent_kernel)

    def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> tuple[Array, Array]:
        del rng
        batch = tuple(input_shape[:-1])
        return (
            _zeros_carry(batch, self.features, self.param_dtype),
            _zeros_carry(batch, self.features, self.param_dtype),
        )


class GRUCell(RecurrentCell):
    r"""Gated recurrent unit, with either placement of the reset gate.

    With ``reset_after=True`` (default; PyTorch, cuDNN, Flax, the slides) the reset gate
    multiplies the recurrent product **after** the matmul:

    .. math::
        r_t &= \mathrm{sig}(W_{rx} x_t + b_r + W_{rh} h_{t-1}) \\
        z_t &= \mathrm{sig}(W_{zx} x_t + b_z + W_{zh} h_{t-1}) \\
        n_t &= \tanh(W_{nx} x_t + b_n + r_t \odot (W_{nh} h_{t-1} + b_{hn})) \\
        h_t &= (1 - z_t) \odot n_t + z_t \odot h_{t-1}

    With ``reset_after=False`` (MEDL (7.18)–(7.19); Cho et al. 2014) it multiplies the
    state **before** the matmul:

    .. math::
        n_t = \tanh(W_{nx} x_t + b_n + W_{nh}(r_t \odot h_{t-1}))

    **Update-gate convention.** ``z_t`` is the *keep* gate, as in PyTorch, Flax and the
    slides: ``z_t = 1`` copies ``h_{t-1}``. MEDL's update gate is its complement,
    ``g_u = 1 - z_t`` (so ``W_u = -W_z``, ``b_u = -b_z``); either way ``h_t`` is a
    convex combination of ``h_{t-1}`` and ``n_t`` (MEDL's ``h̃``).

    **Biases.** MEDL's form has one bias per block (``b_r, b_u, b_h̃``); the default
    ``reset_after=True`` adds PyTorch's ``b_hn`` inside the reset product (param
    ``recurrent_bias_n``). The slides' GRU has no biases at all: ``use_bias=False`` with
    ``reset_after=True`` is exactly the slides' equation (and drops ``b_hn`` too).

    **Which path runs which form.** ``reset_after=True`` has a whole-layer kernel
    (:meth:`layer_weights` → ``"gru"``; also the PyTorch/cuDNN form); ``reset_after=False``
    has none, so :class:`~seqjax.nn.RNN` scans its ``step``.

    Gate blocks are ordered ``r, z, n`` (PyTorch's order). Parameters:
    ``3H² + 3HP + 3H``, plus ``H`` for ``b_hn`` when ``reset_after=True``.
    Carry: ``h: [..., H]``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cell = GRUCell(features=4, reset_after=False)
        >>> x = jnp.ones((2, 3))
        >>> h = cell.initialize_carry(jax.random.PRNGKey(0), x.shape)
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
        xr, xz, xn = xp[..., :hsz], xp[..., hsz : 2 * hsz], xp[..., 2 * hsz :]
        if self.reset_after:
            rec = self.recurrent(h_BxH)
            hr, hz, hn = rec[..., :hsz], rec[..., hsz : 2 * hsz], rec[..., 2 * hsz :]
            if self.use_bias:
                hn = hn + jnp.asarray(self.recurrent_bias_n, hn.dtype)
            r = jax.nn.sigmoid(xr + hr)
            z = jax.nn.sigmoid(xz + hz)
            n = jnp.tanh(xn + r * hn)
        else:
            # The reset gate multiplies h before the candidate's matmul, so the
            # candidate's recurrent block is applied on its own.
            hrz = self.recurrent(h_BxH, slice(0, 2 * hsz))
            r = jax.nn.sigmoid(xr + hrz[..., :hsz])
            z = jax.nn.sigmoid(xz + hrz[..., hsz:])
            n = jnp.tanh(xn + self.recurrent(r * h_BxH, slice(2 * hsz, None)))
        h_new = (1.0 - z) * n + z * h_BxH
        return h_new, h_new

    def layer_weights(self) -> LayerWeights | None:
        if not self.reset_after or not _keeps_equation(self, GRUCell):
            return None
        kernel, bias = self._dense_weights()
        b_hn = (self.recurrent_bias_n if self.use_bias
                else jnp.zeros((self.features,), self.recurrent_kernel.dtype))
        return LayerWeights("gru", kernel, bias, self.recurrent_kernel, recurrent_bias=b_hn)

    def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> Array:
        del rng
        return _zeros_carry(tuple(input_shape[:-1]), self.features, self.param_dtype)


_FEEDBACKS = ("identity", "linear")


class OutputFeedbackCell(RecurrentCell):
    r"""Elman cell fed back its own previous output (MEDL (7.3)).

    .. math::
        h_t = S_h\big(W_{hh} h_{t-1} + W_{hx}(x_t + \mathcal T(\hat y_{t-1})) + b_h\big),
        \qquad \hat y_t = S_y(W_{yh} h_t + b_y)

    MEDL (7.3): the feedback is *added* to the input before ``W_{hx}``, so
    ``\mathcal T: \mathbb R^q \to \mathbb R^p``. ``\hat y_0 = 0`` (no feedback at the
    first step; MEDL leaves it open). The cell's output is ``\hat y_t`` (``[..., Q]``), so
    the output layer is part of the cell. With teacher forcing (MEDL §7.2) one feeds the
    true ``y_{t-1}`` through ``x_t`` instead and uses :class:`ElmanCell`.

    ``feedback`` chooses ``\mathcal T``: ``"identity"`` (default; needs ``Q = P``, as in
    MEDL's toy example where inputs and outputs are both one-hot over the lexicon),
    ``"linear"`` (a learned ``[Q, P]`` matrix, param ``feedback/kernel``) or any function
    ``[..., Q] -> [..., P]`` (e.g. MEDL's footnote 6: argmax → token → embedding).
    ``use_bias=False`` drops ``b_h`` and ``b_y`` (the bias-free forms of J&M (9.3)–(9.4)).

    Carry: ``(h, ŷ)`` with ``h: [..., H]`` and ``ŷ: [..., Q]``. Parameters:
    ``input/{kernel [P, H], bias [H]}``, ``recurrent_kernel [H, H]``,
    ``output/{kernel [H, Q], bias [Q]}`` (+ ``feedback/kernel [Q, P]``). No layer
    kernel: :class:`~seqjax.nn.RNN` scans ``step``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cell = OutputFeedbackCell(features=4)
        >>> x = jnp.ones((2, 3))
        >>> carry = cell.initialize_carry(jax.random.PRNGKey(0), x.shape)
        >>> params = cell.init(jax.random.PRNGKey(1), carry, x)
        >>> (h, y_prev), y = cell.apply(params, carry, x)
        >>> h.shape, y.shape, bool(jnp.allclose(y.sum(-1), 1.0))
        ((2, 4), (2, 3), True)

    Attributes:
        features: hidden size ``H`` (MEDL's ``m``).
        out_features: ``Q``; ``None`` means ``Q = P`` (the input width).
        activation: ``S_h`` (``tanh``).
        output_activation: ``S_y`` (``softmax``: outputs are probability vectors).
        feedback: ``\mathcal T`` — ``"identity"``, ``"linear"`` or a callable.
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
        if self.out_features is not None and self.out_features <= 0:
            raise ValueError(f"`out_features` must be a positive int; got {self.out_features}.")
        self.output = Dense(
            self.out_features, use_bias=self.use_bias, dtype=self.dtype,
            param_dtype=self.param_dtype, kernel_init=self.kernel_init,
            bias_init=self.bias_init, name="output",
        ) if self.out_features is not None else None

    def input_projection(self, x: Array) -> Array:
        """``x`` itself: ``W_{hx}`` multiplies ``x_t + T(ŷ_{t-1})`` inside ``step``."""
        if x.ndim < 1:
            raise ValueError(f"`x` must have a feature axis; got shape {x.shape}.")
        return x

    def _output_layer(self, p: int) -> nn.Module:
        if self.output is not None:
            return self.output
        # Q = P: the output layer's width is known only from the input.
        return Dense(p, use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
                     kernel_init=self.kernel_init, bias_init=self.bias_init, name="output")

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
        y_BxQ = self.output_activation(self._output_layer(p)(h_BxH))
        return (h_BxH, y_BxQ), y_BxQ

    def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> tuple[Array, Array]:
        del rng
        batch = tuple(input_shape[:-1])
        q = input_shape[-1] if self.out_features is None else self.out_features
        return (_zeros_carry(batch, self.features, self.param_dtype),
                _zeros_carry(batch, q, self.param_dtype))


class SimpleGatedCell(RecurrentCell):
    r"""The slides' "simple gate": one learned gate between the old memory and the input.

    .. math::
        g_t = \sigma(W_{hh} h_{t-1} + W_{xh} x_t + b_g), \qquad
        c_t = g_t \odot c_{t-1} + (1 - g_t) \odot x_t, \qquad h_t = \tanh(c_t)

    Lecture slides, "Gating mechanism — Simple Gate" (the output ``y_t = W_{hy} h_t`` is a
    separate Dense, as for :class:`ElmanCell`). ``g_t = 1`` keeps the state and discards
    the input; ``g_t = 0`` discards the state and takes the input. The memory mixes the
    raw input, so the input width must equal ``features`` (``dim x = dim c``). The slides
    have **no bias**: the default adds ``b_g``; ``use_bias=False`` computes the slide's
    equation exactly.

    Carry: ``(c, h)``, each ``[..., H]``. Parameters: ``input/{kernel [H, H], bias [H]}``,
    ``recurrent_kernel [H, H]``. No layer kernel: :class:`~seqjax.nn.RNN` scans ``step``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cell = SimpleGatedCell(features=3)
        >>> x = jnp.ones((2, 3))
        >>> carry = cell.initialize_carry(jax.random.PRNGKey(0), x.shape)
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
        del rng
        batch = tuple(input_shape[:-1])
        return (_zeros_carry(batch, self.features, self.param_dtype),
                _zeros_carry(batch, self.features, self.param_dtype))

"""Recurrent cells: Elman, LSTM and GRU (both reset conventions).

Every cell splits its work in two so that a layer can hoist the input
projection of all time steps into one matmul outside the time loop:

* ``input_projection(x_BxTxP) -> xp_BxTxGH`` — ``x W_x + b`` for all gates
  (any leading batch/time dims);
* ``step(carry, xp_BxGH) -> (carry, y_BxH)`` — the recurrent part;
* ``__call__(carry, x_BxP) -> (carry, y_BxH)`` — both, for one time step.

Conventions (DESIGN.md): row vectors, so kernels are the transposes of the
textbooks' ``W`` (``x @ w`` here is ``W x`` there); parameters are stored in
``param_dtype`` and computed in ``dtype``. Gate blocks inside the fused kernels
are laid out in PyTorch's order, which makes weight import a reshape.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax.nn.dense import Dense

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = ["RecurrentCell", "ElmanCell", "LSTMCell", "GRUCell"]


def _zeros_carry(batch_shape: tuple[int, ...], features: int, dtype: Dtype) -> Array:
    return jnp.zeros((*batch_shape, features), dtype)


class FusedSpec(NamedTuple):
    """What :func:`seqjax.nn._fused_scan.fused_scan` needs from a cell whose recurrence is
    the single matmul ``rec = h_{t-1} @ recurrent_kernel``."""

    step: Callable  # step(aux, carry, xp, rec) -> (carry, y), pure
    aux: Any  # small extra parameters of the step (differentiated)
    get_h: Callable  # carry -> the matmul input h
    add_h: Callable  # (d_carry, dh) -> d_carry with dh added to h's slot


def _get_self(carry: Array) -> Array:
    return carry


def _add_self(d_carry: Array, dh: Array) -> Array:
    return d_carry + dh


def _elman_step(activation: Callable, aux: None, h: Array, xp: Array, rec: Array):
    """MEDL (7.2) given ``rec = h_{t-1} W_hhᵀ``."""
    h_BxH = activation(xp + rec)
    return h_BxH, h_BxH


def _lstm_step(aux: None, carry: tuple[Array, Array], xp: Array, rec: Array):
    """MEDL (7.16)–(7.17) given ``rec = h_{t-1} W_hᵀ`` (gate order i, f, g, o)."""
    c_BxH, _ = carry
    i, f, g, o = jnp.split(xp + rec, 4, axis=-1)
    c_BxH = jax.nn.sigmoid(f) * c_BxH + jax.nn.sigmoid(i) * jnp.tanh(g)
    h_BxH = jax.nn.sigmoid(o) * jnp.tanh(c_BxH)
    return (c_BxH, h_BxH), h_BxH


def _gru_after_step(features: int, b_hn: Array, h: Array, xp: Array, rec: Array):
    """GRU with the reset gate after the matmul, given ``rec = h_{t-1} W_hᵀ`` (order r, z, n)."""
    xr, xz, xn = xp[..., :features], xp[..., features : 2 * features], xp[..., 2 * features :]
    hr, hz, hn = rec[..., :features], rec[..., features : 2 * features], rec[..., 2 * features :]
    r = jax.nn.sigmoid(xr + hr)
    z = jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * (hn + jnp.asarray(b_hn, hn.dtype)))
    h_new = (1.0 - z) * n + z * h
    return h_new, h_new


class RecurrentCell(nn.Module):
    """Base class: the split into ``input_projection`` and ``step``.

    Subclasses set ``num_gates`` (G) and implement ``step`` and
    ``initialize_carry``. Parameters (shared by every cell):

    * ``input/kernel``: ``[P, G*H]`` — the stacked input matrices ``W_{·x}ᵀ``;
    * ``input/bias``:   ``[G*H]``   — the stacked biases ``b_·``;
    * ``recurrent_kernel``: ``[H, G*H]`` — the stacked recurrent matrices ``W_{·h}ᵀ``.
    """

    features: int
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    recurrent_kernel_init: Initializer = nn.initializers.orthogonal()
    bias_init: Initializer = nn.initializers.zeros_init()

    num_gates: int = 1  # overridden per cell; not a constructor argument in practice

    def _bias_init(self, key: Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> Array:
        return self.bias_init(key, shape, dtype)

    def setup(self) -> None:
        if self.features <= 0:
            raise ValueError(f"`features` must be a positive int; got {self.features}.")
        gh = self.num_gates * self.features
        self.input = Dense(
            gh,
            use_bias=True,
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

    def fused_spec(self) -> FusedSpec | None:
        """How to run this cell through the fused custom-VJP scan; ``None``: not supported."""
        return None

    def __call__(self, carry: Any, x: Array) -> tuple[Any, Array]:
        """One time step on ``x: [..., P]``; returns ``(new_carry, y: [..., H])``."""
        self._check_carry(carry, x.shape[:-1])
        return self.step(carry, self.input_projection(x))

    def _check_carry(self, carry: Any, batch_shape: tuple[int, ...]) -> None:
        expected = jax.tree_util.tree_leaves(
            jax.eval_shape(lambda: self.initialize_carry(jax.random.PRNGKey(0), (*batch_shape, 1)))
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

    MEDL (7.2); J&M (9.3) (``h_t = g(U h_{t-1} + W x_t)``). One bias, as in
    MEDL (PyTorch's ``b_ih + b_hh`` import as their sum). The output ``y_t``
    is ``h_t``; the output layer ``S_y(W_{yh} h_t + b_y)`` is a separate Dense.

    Carry: ``h: [..., H]``. Parameters: ``H² + HP + H``.

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
    """

    activation: Callable[[Array], Array] = jnp.tanh
    num_gates: int = 1

    def step(self, carry: Array, xp: Array) -> tuple[Array, Array]:
        return _elman_step(self.activation, None, carry, xp, self.recurrent(carry))

    def fused_spec(self) -> FusedSpec | None:
        # A subclass that redefines the step (or the recurrent product) runs its own
        # code through the plain scan: the fused spec only knows the Elman equation.
        cls = type(self)
        if cls.step is not ElmanCell.step or cls.recurrent is not RecurrentCell.recurrent:
            return None
        return FusedSpec(partial(_elman_step, self.activation), None, _get_self, _add_self)

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

    MEDL (7.16)–(7.17); J&M (9.22)–(9.29). Gate blocks in the fused kernels
    are ordered ``i, f, c̃(g), o`` (PyTorch's order). One bias per gate, as
    MEDL counts: parameters ``4H² + 4HP + 4H``.

    Carry: ``(c, h)``, each ``[..., H]`` (Flax's layout).

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
    """

    forget_bias: float = 0.0
    num_gates: int = 4

    def _bias_init(self, key: Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> Array:
        b = self.bias_init(key, shape, dtype)
        h = self.features
        return b.at[h : 2 * h].add(jnp.asarray(self.forget_bias, dtype))

    def step(self, carry: tuple[Array, Array], xp: Array) -> tuple[tuple[Array, Array], Array]:
        return _lstm_step(None, carry, xp, self.recurrent(carry[1]))

    def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> tuple[Array, Array]:
        del rng
        batch = tuple(input_shape[:-1])
        return (
            _zeros_carry(batch, self.features, self.param_dtype),
            _zeros_carry(batch, self.features, self.param_dtype),
        )


class GRUCell(RecurrentCell):
    r"""Gated recurrent unit, with either placement of the reset gate.

    With ``reset_after=True`` (default; PyTorch, cuDNN, Flax, the slides):

    .. math::
        r_t &= \mathrm{sig}(W_{rx} x_t + b_r + W_{rh} h_{t-1}) \\
        z_t &= \mathrm{sig}(W_{zx} x_t + b_z + W_{zh} h_{t-1}) \\
        n_t &= \tanh(W_{nx} x_t + b_n + r_t \odot (W_{nh} h_{t-1} + b_{hn})) \\
        h_t &= (1 - z_t) \odot n_t + z_t \odot h_{t-1}

    With ``reset_after=False`` (MEDL (7.18)–(7.19); Cho et al. 2014):

    .. math::
        n_t = \tanh(W_{nx} x_t + b_n + W_{nh}(r_t \odot h_{t-1}))

    **Update-gate convention.** ``z_t`` is the *keep* gate, as in PyTorch and
    Flax: ``z_t = 1`` copies ``h_{t-1}``. MEDL's update gate is its complement,
    ``g_u = 1 - z_t`` (so ``W_u = -W_z``, ``b_u = -b_z``); either way ``h_t`` is a
    convex combination of ``h_{t-1}`` and ``n_t`` (MEDL's ``h̃``).

    Gate blocks are ordered ``r, z, n`` (PyTorch's order). Parameters:
    ``3H² + 3HP + 3H``, plus ``H`` for ``b_hn`` (param ``recurrent_bias_n``)
    when ``reset_after=True``. Carry: ``h: [..., H]``.

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
        if self.reset_after:
            self.recurrent_bias_n = self.param(
                "recurrent_bias_n", self.bias_init, (self.features,), self.param_dtype
            )

    def step(self, carry: Array, xp: Array) -> tuple[Array, Array]:
        if self.reset_after:
            return _gru_after_step(self.features, self.recurrent_bias_n, carry, xp,
                                   self.recurrent(carry))
        h_BxH = carry
        hsz = self.features
        xr, xz, xn = xp[..., :hsz], xp[..., hsz : 2 * hsz], xp[..., 2 * hsz :]
        # The reset gate multiplies h before the candidate's matmul, so the
        # candidate's recurrent block is applied on its own.
        hrz = self.recurrent(h_BxH, slice(0, 2 * hsz))
        r = jax.nn.sigmoid(xr + hrz[..., :hsz])
        z = jax.nn.sigmoid(xz + hrz[..., hsz:])
        n = jnp.tanh(xn + self.recurrent(r * h_BxH, slice(2 * hsz, None)))
        h_new = (1.0 - z) * n + z * h_BxH
        return h_new, h_new

    def initialize_carry(self, rng: Array, input_shape: tuple[int, ...]) -> Array:
        del rng
        return _zeros_carry(tuple(input_shape[:-1]), self.features, self.param_dtype)

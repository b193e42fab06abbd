r"""Selective state-space layers (Mamba's S6, Gu & Dao 2023) and a minimal parallel-scan RNN.

A diagonal SSM maps each input channel ``x_t ∈ ℝ`` through an ``N``-dimensional state ``h_t``:

.. math::
    h'(t) = A h(t) + B x(t),\quad y(t) = C h(t) + D x(t)
    \;\xrightarrow{\text{ZOH, step } Δ}\;
    h_t = \bar A h_{t-1} + \bar B x_t,\quad y_t = C h_t + D x_t

with ``Ā = exp(ΔA)``, ``B̄ = (ΔA)^{-1}(exp(ΔA) − I)·ΔB`` (Gu & Dao 2023, eq. 4). Mamba's
*selection* (Algorithm 2; equations at :class:`SelectiveSSM`) makes ``Δ``, ``B``, ``C``
functions of the input; ``A = −exp(A_log)`` is a learned negative diagonal, initialised
"S4D-real": ``A_{e,n} = −(n+1)``. ``discretization="mamba"`` (default, as Mamba's reference
code) takes the Euler term ``B̄ ≈ ΔB``, ``"zoh"`` the exact ``B̄ = (exp(ΔA) − 1)/A · B``; they
agree to ``O((ΔA)²)`` (``Ā`` is exact in both).

Three equal forms (``scan_impl``): ``"associative"`` (``jax.lax.associative_scan`` with
``(a₁, b₁) ∘ (a₂, b₂) = (a₁a₂, a₂b₁ + b₂)``: ``O(log T)`` depth, ``O(T·E·N)`` memory),
``"sequential"`` (``lax.scan``), and one step (:func:`selective_step`,
:meth:`SelectiveSSM.step`) for generation. Every scan runs in float32. The slides' "RNN-like
architecture without non-linearities": parallel in training, constant memory in generation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import flax
import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import (
    check_features,
    check_lengths,
    check_positive_ints,
    check_rank,
    retired_flags,
)
from seqjax.nn.dense import Dense
from seqjax.nn.masks import padding_mask

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

__all__ = [
    "CausalDepthwiseConv1d",
    "MambaBlock",
    "MambaCache",
    "MinGRU",
    "SelectiveSSM",
    "discretize",
    "linear_recurrence",
    "selective_scan",
    "selective_scan_with_state",
    "selective_step",
]

SCAN_IMPLS = ("associative", "sequential")
DISCRETIZATIONS = ("mamba", "zoh")


def _check_choice(value: str, name: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"`{name}` must be one of {allowed}; got {value!r}.")


def _check_shape(x: Array, name: str, layout: str, want: tuple[int, ...]) -> None:
    if tuple(x.shape) != want:
        raise ValueError(f"`{name}` must have shape {layout} = {want}; got {tuple(x.shape)}.")


def _combine(left: tuple[Array, Array], right: tuple[Array, Array]) -> tuple[Array, Array]:
    """Compose ``h ↦ a₁h + b₁`` then ``h ↦ a₂h + b₂``: ``(a₁a₂, a₂b₁ + b₂)``."""
    (a1, b1), (a2, b2) = left, right
    return a1 * a2, a2 * b1 + b2


def linear_recurrence(
    a_BxTxS: Array, b_BxTxS: Array, initial_state: Array | None = None, *, impl: str = "associative"
) -> Array:
    r"""All states of ``h_t = a_t ⊙ h_{t−1} + b_t`` (``h_0`` = ``initial_state`` or 0).

    ``a``, ``b``: ``[B, T, ...]`` (same shape); ``initial_state``: ``[B, ...]``. ``impl``:
    ``"associative"`` (``jax.lax.associative_scan``, Blelloch 1990) or ``"sequential"``
    (``lax.scan``). Returns ``h: [B, T, ...]`` in the dtype of ``a * b``.

    Example:
        >>> import jax.numpy as jnp
        >>> a = jnp.full((1, 4, 1), 0.5); b = jnp.ones((1, 4, 1))
        >>> linear_recurrence(a, b)[0, :, 0].tolist()
        [1.0, 1.5, 1.75, 1.875]
    """
    _check_choice(impl, "impl", SCAN_IMPLS)
    _check_shape(b_BxTxS, "b", "a's", tuple(a_BxTxS.shape))
    if a_BxTxS.ndim < 2:
        raise ValueError(f"`a` must be [B, T, ...]; got shape {tuple(a_BxTxS.shape)}.")
    if initial_state is not None:
        _check_shape(initial_state, "initial_state", "[B, ...]",
                     (a_BxTxS.shape[0], *a_BxTxS.shape[2:]))
    if impl == "associative":
        if initial_state is not None:
            # Fold h_0 into the first element: h_1 = a_1 h_0 + b_1.
            b_BxTxS = b_BxTxS.at[:, 0].add(a_BxTxS[:, 0] * initial_state)
        _, h_BxTxS = jax.lax.associative_scan(_combine, (a_BxTxS, b_BxTxS), axis=1)
        return h_BxTxS

    h0 = jnp.zeros_like(b_BxTxS[:, 0]) if initial_state is None else initial_state

    def body(h, ab):
        a, b = ab
        h = a * h + b
        return h, h

    _, h_TxBxS = jax.lax.scan(body, h0.astype(b_BxTxS.dtype),
                              (jnp.swapaxes(a_BxTxS, 0, 1), jnp.swapaxes(b_BxTxS, 0, 1)))
    return jnp.swapaxes(h_TxBxS, 0, 1)


def discretize(
    delta_xE: Array, a_ExN: Array, b_xN: Array, method: str = "mamba"
) -> tuple[Array, Array]:
    r"""Zero-order hold for a diagonal ``A``: ``(Ā, B̄)`` of shape ``[..., E, N]``.

    ``Ā = exp(ΔA)``; ``B̄ = ΔB`` (``"mamba"``) or ``B̄ = (exp(ΔA) − 1)/A · B`` (``"zoh"``, Gu &
    Dao 2023 eq. 4). ``delta: [..., E]``, ``a: [E, N]`` (negative), ``b: [..., N]`` (same ``...``).

    Example:
        >>> import jax.numpy as jnp
        >>> a_bar, b_bar = discretize(jnp.array([0.5]), -jnp.ones((1, 1)), jnp.ones((1,)), "zoh")
        >>> round(float(a_bar[0, 0]), 4), round(float(b_bar[0, 0]), 4)
        (0.6065, 0.3935)
    """
    _check_choice(method, "method", DISCRETIZATIONS)
    da_xExN = delta_xE[..., :, None] * a_ExN
    scale_xExN = delta_xE[..., :, None] if method == "mamba" else jnp.expm1(da_xExN) / a_ExN
    return jnp.exp(da_xExN), scale_xExN * b_xN[..., None, :]


def _step(h_BxExN, x_BxE, delta_BxE, b_BxN, c_BxN, *, a_ExN, discretization):
    """``h ← Ā ⊙ h + B̄ x``, ``y = C h`` in float32: ``(h, y)``."""
    a_bar, b_bar = discretize(delta_BxE, a_ExN, b_BxN, discretization)
    h_BxExN = a_bar * h_BxExN + b_bar * x_BxE[..., None]
    return h_BxExN, jnp.einsum("ben,bn->be", h_BxExN, c_BxN)


def _check_ssm_inputs(x, delta, a, b, c, d) -> None:
    check_rank(x, "x", 3)
    _check_shape(delta, "delta", "x's", tuple(x.shape))
    check_rank(a, "a", 2)
    _check_shape(a, "a", "[E, N]", (x.shape[-1], a.shape[1]))
    n = a.shape[1]
    for name, arr in (("b", b), ("c", c)):
        _check_shape(arr, name, "[B, T, N]", (*x.shape[:2], n))
    if d is not None:
        _check_shape(d, "d", "[E]", (x.shape[-1],))


@retired_flags(return_state="selective_scan_with_state")
def selective_scan(
    x_BxTxE: Array,
    delta_BxTxE: Array,
    a_ExN: Array,
    b_BxTxN: Array,
    c_BxTxN: Array,
    d_E: Array | None = None,
    *,
    initial_state: Array | None = None,
    impl: str = "associative",
    discretization: str = "mamba",
) -> Array:
    r"""The selective scan: ``h_t = Ā_t ⊙ h_{t−1} + B̄_t x_t``, ``y_t = C_t h_t + D ⊙ x_t``.

    Per channel ``e``, state ``n``: ``Ā_{t,e,n} = exp(Δ_{t,e}A_{e,n})``, ``y_{t,e} = Σ_n C_{t,n}
    h_{t,e,n} + D_e x_{t,e}`` (Gu & Dao 2023, Algorithm 2; :func:`discretize`), in float32.

    Args:
        x_BxTxE, delta_BxTxE, a_ExN: inputs, step sizes ``Δ > 0``, ``A`` (negative).
        b_BxTxN, c_BxTxN, d_E: input-dependent ``B``, ``C``; optional skip ``D``.
        initial_state: ``h_0: [B, E, N]`` (zeros by default).
        impl, discretization: ``"associative"``/``"sequential"``; ``"mamba"``/``"zoh"``.

    Returns:
        ``y: [B, T, E]`` in ``x``'s dtype (:func:`selective_scan_with_state` adds ``h_T``).

    Example:
        >>> import jax.numpy as jnp
        >>> x = jnp.ones((1, 3, 2)); dt = jnp.full((1, 3, 2), 0.1)
        >>> a = -jnp.ones((2, 4)); bc = jnp.ones((1, 3, 4))
        >>> selective_scan(x, dt, a, bc, bc).shape
        (1, 3, 2)
    """
    return selective_scan_with_state(
        x_BxTxE, delta_BxTxE, a_ExN, b_BxTxN, c_BxTxN, d_E, initial_state=initial_state,
        impl=impl, discretization=discretization,
    )[0]


def selective_scan_with_state(
    x_BxTxE: Array,
    delta_BxTxE: Array,
    a_ExN: Array,
    b_BxTxN: Array,
    c_BxTxN: Array,
    d_E: Array | None = None,
    *,
    initial_state: Array | None = None,
    impl: str = "associative",
    discretization: str = "mamba",
) -> tuple[Array, Array]:
    r""":func:`selective_scan` (same arguments) and its last state; ``h_T`` passed back as
    ``initial_state`` continues the sequence (by chunks, or :func:`selective_step` by steps).

    Returns:
        ``(y, h_T)``: :func:`selective_scan`'s ``y`` and ``h_T: f32[B, E, N]``.

    Example:
        >>> import jax.numpy as jnp
        >>> x = jnp.ones((1, 3, 2)); dt = jnp.full((1, 3, 2), 0.1)
        >>> a = -jnp.ones((2, 4)); bc = jnp.ones((1, 3, 4))
        >>> y, h = selective_scan_with_state(x[:, :2], dt[:, :2], a, bc[:, :2], bc[:, :2])
        >>> y3 = selective_scan(x[:, 2:], dt[:, 2:], a, bc[:, 2:], bc[:, 2:], initial_state=h)
        >>> bool(jnp.allclose(y3, selective_scan(x, dt, a, bc, bc)[:, 2:])), h.shape
        (True, (1, 2, 4))
    """
    _check_ssm_inputs(x_BxTxE, delta_BxTxE, a_ExN, b_BxTxN, c_BxTxN, d_E)
    _check_choice(impl, "impl", SCAN_IMPLS)
    _check_choice(discretization, "discretization", DISCRETIZATIONS)
    batch, _, e = x_BxTxE.shape
    n = a_ExN.shape[1]
    if initial_state is not None:
        _check_shape(initial_state, "initial_state", "[B, E, N]", (batch, e, n))
    f32 = jnp.float32
    x, dt = x_BxTxE.astype(f32), delta_BxTxE.astype(f32)
    a, b, c = a_ExN.astype(f32), b_BxTxN.astype(f32), c_BxTxN.astype(f32)
    h0_BxExN = jnp.zeros((batch, e, n), f32) if initial_state is None else initial_state.astype(f32)

    if impl == "associative":
        a_bar_BxTxExN, b_bar_BxTxExN = discretize(dt, a, b, discretization)
        h_BxTxExN = linear_recurrence(a_bar_BxTxExN, b_bar_BxTxExN * x[..., None], h0_BxExN)
        y_BxTxE = jnp.einsum("bten,btn->bte", h_BxTxExN, c)
        h_last = h_BxTxExN[:, -1]
    else:
        xs = tuple(jnp.swapaxes(t, 0, 1) for t in (x, dt, b, c))
        h_last, y_TxBxE = jax.lax.scan(
            lambda h, x_t: _step(h, *x_t, a_ExN=a, discretization=discretization), h0_BxExN, xs)
        y_BxTxE = jnp.swapaxes(y_TxBxE, 0, 1)
    if d_E is not None:
        y_BxTxE = y_BxTxE + d_E.astype(f32) * x
    return y_BxTxE.astype(x_BxTxE.dtype), h_last


def selective_step(
    h_BxExN: Array,
    x_BxE: Array,
    delta_BxE: Array,
    a_ExN: Array,
    b_BxN: Array,
    c_BxN: Array,
    d_E: Array | None = None,
    *,
    discretization: str = "mamba",
) -> tuple[Array, Array]:
    r"""One step of :func:`selective_scan`: ``h ← Ā ⊙ h + B̄ x``, ``y = C h + D x``.

    Returns ``(h: f32[B, E, N], y: [B, E])``, ``y`` in ``x``'s dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> h, y = selective_step(jnp.zeros((1, 2, 4)), jnp.ones((1, 2)), jnp.ones((1, 2)),
        ...                       -jnp.ones((2, 4)), jnp.ones((1, 4)), jnp.ones((1, 4)))
        >>> h.shape, y.shape
        ((1, 2, 4), (1, 2))
    """
    check_rank(x_BxE, "x", 2)
    _check_shape(h_BxExN, "h", "[B, E, N]", (*x_BxE.shape, a_ExN.shape[-1]))
    f32 = jnp.float32
    x = x_BxE.astype(f32)
    h, y = _step(h_BxExN.astype(f32), x, delta_BxE.astype(f32), b_BxN.astype(f32),
                 c_BxN.astype(f32), a_ExN=a_ExN.astype(f32), discretization=discretization)
    if d_E is not None:
        y = y + d_E.astype(f32) * x
    return h, y.astype(x_BxE.dtype)


def _s4d_real_init(key: Array, shape: tuple[int, int], dtype: Dtype = jnp.float32) -> Array:
    """``A_log[e, n] = log(n + 1)``: ``A = −exp(A_log) = −(n + 1)`` (S4D-real, Gu et al. 2022)."""
    del key
    e, n = shape
    return jnp.broadcast_to(jnp.log(jnp.arange(1, n + 1, dtype=jnp.float32)), (e, n)).astype(dtype)


def _dt_bias_init(dt_min: float, dt_max: float, floor: float) -> Initializer:
    """``b_Δ = softplus⁻¹(Δ₀)`` with ``Δ₀ ~ logUniform[dt_min, dt_max]`` (Mamba's init)."""

    def init(key: Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> Array:
        u = jax.random.uniform(key, shape, jnp.float32)
        dt = jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = jnp.maximum(dt, floor)
        return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)  # inverse softplus

    return init


def _valid_mask(lengths: Array | None, batch: int, steps: int) -> Array | None:
    return None if lengths is None else padding_mask(
        check_lengths(lengths, "lengths", batch, steps), steps)


def _symmetric_uniform(scale: float) -> Initializer:
    def init(key: Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> Array:
        return jax.random.uniform(key, shape, dtype, -scale, scale)

    return init


class SelectiveSSM(nn.Module):
    r"""Mamba's selective SSM (S6) on ``E`` channels, with input-dependent ``Δ``, ``B``, ``C``.

    .. math::
        [\tilde Δ_t; B_t; C_t] = W_x x_t,\quad
        Δ_t = \mathrm{softplus}(W_Δ \tilde Δ_t + b_Δ),\quad A = −\exp(A_{\log}),\\
        h_t = \exp(Δ_t A) ⊙ h_{t−1} + Δ_t B_t x_t,\quad y_t = C_t h_t + D ⊙ x_t

    (Gu & Dao 2023, Algorithm 2; ZOH simplification: the module docstring). ``x: [B, T, E] ->
    y: [B, T, E]``; state ``h: f32[B, E, N]``. Parameters: ``x_proj/kernel: [E, R + 2N]`` (no
    bias; columns ``Δ̃, B, C``), ``dt_proj/{kernel: [R, E], bias: [E]}``, ``A_log: [E, N]``,
    ``D: [E]``: ``E·(2R + 3N + 2)`` (``R`` = ``dt_rank``, ``N`` = ``d_state``).

    ``selective=False`` (LTI ablation): ``Δ = softplus(b_Δ)``, ``B``, ``C`` are parameters
    (``dt_bias: [E]``, ``B: [N]``, ``C: [N]``; ``E·(N + 2) + 2N`` in all), an S4D-style
    time-invariant SSM: a causal convolution with kernel ``K_k = Σ_n C_n Ā_n^k B̄_n`` per
    channel, which cannot select (Gu & Dao 2023, §3.1, Table 1).

    Call -> ``y``; :meth:`with_state` (same arguments) -> ``(y, h_T)``; :meth:`step` ``(h,
    x_BxE) -> (h, y_BxE)``, one generation step. With ``lengths: int32[B]`` steps ``t ≥
    lengths[b]`` have ``Δ = 0`` (state unchanged, so ``h_T`` is the state at the last real
    step) and output 0.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> ssm = SelectiveSSM(features=4, d_state=3)
        >>> x = jnp.ones((1, 5, 4)); params = ssm.init(jax.random.PRNGKey(0), x)
        >>> y, h = ssm.apply(params, x, method="with_state")
        >>> y.shape, h.shape, bool(jnp.array_equal(y, ssm.apply(params, x)))
        ((1, 5, 4), (1, 4, 3), True)

    Attributes:
        features, d_state: ``E`` (Mamba's ``d_inner``), ``N``.
        dt_rank: ``R``; default ``ceil(E / 16)``.
        dt_min, dt_max, dt_init_floor, dt_scale: initialisation of ``Δ`` (Mamba's defaults).
        scan_impl, discretization: ``"associative"``/``"sequential"``; ``"mamba"``/``"zoh"``.
        selective: input-dependent ``Δ, B, C`` (S6, default) or the LTI ablation.
    """

    features: int
    d_state: int = 16
    dt_rank: int | None = None
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    dt_scale: float = 1.0
    scan_impl: str = "associative"
    discretization: str = "mamba"
    selective: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()

    @property
    def rank(self) -> int:
        return self.dt_rank if self.dt_rank is not None else math.ceil(self.features / 16)

    def setup(self) -> None:
        check_positive_ints(features=self.features, d_state=self.d_state, dt_rank=self.rank)
        _check_choice(self.scan_impl, "scan_impl", SCAN_IMPLS)
        _check_choice(self.discretization, "discretization", DISCRETIZATIONS)
        r, n, e = self.rank, self.d_state, self.features
        self.A_log = self.param("A_log", _s4d_real_init, (e, n), self.param_dtype)
        self.D = self.param("D", nn.initializers.ones_init(), (e,), self.param_dtype)
        dt_init = _dt_bias_init(self.dt_min, self.dt_max, self.dt_init_floor)
        if not self.selective:
            self.dt_bias = self.param("dt_bias", dt_init, (e,), self.param_dtype)
            self.B = self.param("B", nn.initializers.normal(1.0), (n,), self.param_dtype)
            self.C = self.param("C", nn.initializers.normal(1.0), (n,), self.param_dtype)
            return
        dense = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        self.x_proj = Dense(r + 2 * n, use_bias=False, kernel_init=self.kernel_init,
                            name="x_proj", **dense)
        self.dt_proj = Dense(e, kernel_init=_symmetric_uniform(r**-0.5 * self.dt_scale),
                             bias_init=dt_init, name="dt_proj", **dense)

    def _selection(self, x_xE: Array) -> tuple[Array, Array, Array, Array]:
        """``(Δ, B, C, A)`` for inputs ``[..., E]``; ``Δ`` in float32."""
        r, n = self.rank, self.d_state
        if not self.selective:
            delta_xE = jnp.broadcast_to(jax.nn.softplus(self.dt_bias.astype(jnp.float32)),
                                        x_xE.shape)
            b_xN, c_xN = (jnp.broadcast_to(p, (*x_xE.shape[:-1], n)) for p in (self.B, self.C))
        else:
            proj = self.x_proj(x_xE)
            dt_low, b_xN, c_xN = proj[..., :r], proj[..., r : r + n], proj[..., r + n :]
            delta_xE = jax.nn.softplus(self.dt_proj(dt_low).astype(jnp.float32))
        return delta_xE, b_xN, c_xN, -jnp.exp(self.A_log.astype(jnp.float32))

    @retired_flags(return_state="SelectiveSSM.with_state")
    def __call__(
        self, x: Array, *, lengths: Array | None = None, initial_state: Array | None = None
    ) -> Array:
        """``y: [B, T, E]`` (the class docstring)."""
        return self.with_state(x, lengths=lengths, initial_state=initial_state)[0]

    def with_state(
        self, x: Array, *, lengths: Array | None = None, initial_state: Array | None = None
    ) -> tuple[Array, Array]:
        """``(y: [B, T, E], h_T: f32[B, E, N])``, ``h_T`` after each row's last real step."""
        check_rank(x, "x", 3)
        check_features(x, "x", self.features, "`features`")
        x_BxTxE = x.astype(self.dtype) if self.dtype is not None else x
        valid_BxT = _valid_mask(lengths, x.shape[0], x.shape[1])
        delta_BxTxE, b_BxTxN, c_BxTxN, a_ExN = self._selection(x_BxTxE)
        if valid_BxT is not None:
            delta_BxTxE = jnp.where(valid_BxT[..., None], delta_BxTxE, 0.0)
        y_BxTxE, h_BxExN = selective_scan_with_state(
            x_BxTxE, delta_BxTxE, a_ExN, b_BxTxN, c_BxTxN, self.D,
            initial_state=initial_state, impl=self.scan_impl,
            discretization=self.discretization,
        )
        if valid_BxT is not None:
            y_BxTxE = jnp.where(valid_BxT[..., None], y_BxTxE, 0.0)
        return y_BxTxE, h_BxExN

    def step(self, h_BxExN: Array, x_BxE: Array) -> tuple[Array, Array]:
        """One generation step: ``(h_{t−1}, x_t) -> (h_t, y_t)``, no scan."""
        x_BxE = x_BxE.astype(self.dtype) if self.dtype is not None else x_BxE
        delta_BxE, b_BxN, c_BxN, a_ExN = self._selection(x_BxE)
        return selective_step(h_BxExN, x_BxE, delta_BxE, a_ExN, b_BxN, c_BxN, self.D,
                              discretization=self.discretization)


class CausalDepthwiseConv1d(nn.Module):
    r"""Causal depthwise 1-D convolution: ``y_{t,e} = b_e + Σ_{j=0}^{K−1} w_{j,e} x_{t−K+1+j,e}``.

    Inputs before the start are zeros, or a previous call's last ``K − 1`` inputs (``state: [B,
    K−1, E]``, for decoding). Returns ``(y: [B, T, E], new_state)``, ``new_state`` the last
    ``K − 1`` inputs (of each row's real steps with ``lengths``). Parameters: ``kernel: [K, E]``
    (PyTorch's ``weight[e, 0, j]`` is ``kernel[j, e]``), ``bias: [E]``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> conv = CausalDepthwiseConv1d(features=2, kernel_size=3)
        >>> x = jnp.ones((1, 4, 2)); params = conv.init(jax.random.PRNGKey(0), x)
        >>> y, state = conv.apply(params, x)
        >>> y.shape, state.shape
        ((1, 4, 2), (1, 2, 2))
    """

    features: int
    kernel_size: int = 4
    use_bias: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(
        self, x: Array, state: Array | None = None, lengths: Array | None = None
    ) -> tuple[Array, Array]:
        check_rank(x, "x", 3)
        k, e = self.kernel_size, self.features
        check_positive_ints(kernel_size=k)
        check_features(x, "x", e, "`features`")
        batch, steps, _ = x.shape
        # PyTorch's Conv1d default U(±1/√fan_in); fan_in = kernel size for a depthwise conv.
        init = _symmetric_uniform(1.0 / math.sqrt(k))
        kernel_KxE = self.param("kernel", init, (k, e), self.param_dtype)
        bias_E = self.param("bias", init, (e,), self.param_dtype) if self.use_bias else None
        if state is None:
            state = jnp.zeros((batch, k - 1, e), x.dtype)
        _check_shape(state, "state", "[B, K-1, E]", (batch, k - 1, e))
        x, kernel_KxE, bias_E = nn.dtypes.promote_dtype(x, kernel_KxE, bias_E, dtype=self.dtype)
        xp_BxLxE = jnp.concatenate([state.astype(x.dtype), x], axis=1)  # L = K - 1 + T
        y_BxTxE = sum(xp_BxLxE[:, j : j + steps] * kernel_KxE[j] for j in range(k))
        if bias_E is not None:
            y_BxTxE = y_BxTxE + bias_E
        if lengths is None:
            new_state = xp_BxLxE[:, steps:]
        else:
            # Real step t sits at index t + K - 1; the last K - 1 real inputs are at L_b + j.
            idx_BxKm1 = jnp.asarray(lengths)[:, None] + jnp.arange(k - 1)[None, :]
            new_state = jnp.take_along_axis(xp_BxLxE, idx_BxKm1[..., None], axis=1)
        return y_BxTxE, new_state


@flax.struct.dataclass
class MambaCache:
    """Decoding state of :class:`MambaBlock` (constant size in the sequence length).

    * ``conv_BxKm1xE``: the last ``K − 1`` inputs of the causal convolution;
    * ``ssm_BxExN``: the SSM state ``h`` (float32);
    * ``lengths_B``: int32, tokens already consumed per row.
    """

    conv_BxKm1xE: Array
    ssm_BxExN: Array
    lengths_B: Array

    if TYPE_CHECKING:
        # flax.struct.dataclass adds it at runtime: dataclasses.replace(self, **changes).
        def replace(self, **changes: Any) -> MambaCache: ...

    @classmethod
    def create(
        cls, batch: int, inner: int, d_state: int, kernel_size: int, dtype: Dtype = jnp.float32
    ) -> MambaCache:
        """Zeros: the sequence start."""
        return cls(
            conv_BxKm1xE=jnp.zeros((batch, kernel_size - 1, inner), dtype),
            ssm_BxExN=jnp.zeros((batch, inner, d_state), jnp.float32),
            lengths_B=jnp.zeros((batch,), jnp.int32),
        )


class MambaBlock(nn.Module):
    r"""The Mamba block (Gu & Dao 2023, Fig. 3): gated selective SSM with a causal conv.

    .. math::
        [u_t; g_t] = W_{in} x_t,\quad
        c = \mathrm{SiLU}(\mathrm{conv1d}_K(u)),\quad
        y_t = \mathrm{SSM}(c)_t ⊙ \mathrm{SiLU}(g_t),\quad \mathrm{out}_t = W_{out} y_t

    ``u, g ∈ ℝ^E``, ``E = expand · D``; ``conv1d_K`` is :class:`CausalDepthwiseConv1d` (``K =
    d_conv``), SSM :class:`SelectiveSSM`. No norm or residual: use ``x + MambaBlock(Norm(x))``,
    as Mamba's ``Block``. ``block(x, *, lengths=None)``: ``[B, T, D] -> [B, T, D]``.
    :meth:`decode` ``(x, cache, *, lengths=None) -> (out, new_cache)`` continues the sequence of
    ``cache`` (from :meth:`init_cache`) by ``T`` tokens (one token: the SSM's step form; more:
    the scan from the cached state). With ``lengths`` (right padding) outputs past each row's
    end are 0 and the new cache holds each row's state at its last real step.

    Parameters (``R = dt_rank``, ``N = d_state``): ``in_proj/kernel: [D, 2E]``,
    ``conv1d/{kernel: [K, E], bias: [E]}``, ``ssm/...``, ``out_proj/kernel: [E, D]``:
    ``3·D·E + K·E + E + E·(2R + 3N + 2)`` (``+ 2E + D`` with ``use_bias``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> block = MambaBlock(features=8, d_state=4)
        >>> x = jnp.ones((2, 5, 8)); params = block.init(jax.random.PRNGKey(0), x)
        >>> y, cache = block.apply(params, x), block.init_cache(2)
        >>> y1, cache = block.apply(params, x[:, :1], cache, method="decode")
        >>> bool(jnp.allclose(y1, y[:, :1], atol=1e-5)), y.shape
        (True, (2, 5, 8))

    Attributes:
        features, expand: model width ``D``; ``E / D``.
        d_state, d_conv: ``N``, ``K``.
        dt_rank: ``R``; default ``ceil(D / 16)``.
        use_bias, conv_bias: biases on ``in_proj``/``out_proj`` (Mamba: False); on the conv
            (Mamba: True).
        scan_impl, discretization, selective: passed to :class:`SelectiveSSM`
            (``selective=False``: the LTI ablation, "Mamba architecture with an S4 layer").
    """

    features: int
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int | None = None
    use_bias: bool = False
    conv_bias: bool = True
    scan_impl: str = "associative"
    discretization: str = "mamba"
    selective: bool = True
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()

    @property
    def inner(self) -> int:
        return self.expand * self.features

    def setup(self) -> None:
        check_positive_ints(features=self.features, expand=self.expand)
        dtypes = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        dense = dict(use_bias=self.use_bias, kernel_init=self.kernel_init, **dtypes)
        self.in_proj = Dense(2 * self.inner, name="in_proj", **dense)
        self.conv1d = CausalDepthwiseConv1d(self.inner, self.d_conv, use_bias=self.conv_bias,
                                            name="conv1d", **dtypes)
        self.ssm = SelectiveSSM(
            self.inner, d_state=self.d_state,
            dt_rank=self.dt_rank if self.dt_rank is not None else math.ceil(self.features / 16),
            scan_impl=self.scan_impl, discretization=self.discretization,
            selective=self.selective, kernel_init=self.kernel_init, name="ssm", **dtypes,
        )
        self.out_proj = Dense(self.features, name="out_proj", **dense)

    @retired_flags(cache="MambaBlock.decode")
    def __call__(self, x: Array, *, lengths: Array | None = None) -> Array:
        return self._run(x, lengths, None)[0]

    def decode(
        self, x: Array, cache: MambaCache, *, lengths: Array | None = None
    ) -> tuple[Array, MambaCache]:
        """``(out, new_cache)``: the ``T`` tokens of ``x`` after the cached sequence."""
        if not isinstance(cache, MambaCache):
            raise TypeError(f"`cache` must be a MambaCache; got {type(cache).__name__}.")
        out, new_cache = self._run(x, lengths, cache)
        assert new_cache is not None  # _run returns one with a cache
        return out, new_cache

    def _run(
        self, x: Array, lengths: Array | None, cache: MambaCache | None
    ) -> tuple[Array, MambaCache | None]:
        check_rank(x, "x", 3)
        check_features(x, "x", self.features, "`features`")
        batch, steps, _ = x.shape
        valid_BxT = _valid_mask(lengths, batch, steps)
        u_BxTxE, g_BxTxE = jnp.split(self.in_proj(x), 2, axis=-1)
        conv_state = None if cache is None else cache.conv_BxKm1xE
        c_BxTxE, new_conv = self.conv1d(u_BxTxE, conv_state, lengths)
        c_BxTxE = jax.nn.silu(c_BxTxE)
        if cache is not None and steps == 1 and lengths is None:
            h_BxExN, y_BxE = self.ssm.step(cache.ssm_BxExN, c_BxTxE[:, 0])
            y_BxTxE = y_BxE[:, None]
        else:
            h0 = None if cache is None else cache.ssm_BxExN
            y_BxTxE, h_BxExN = self.ssm.with_state(c_BxTxE, lengths=lengths, initial_state=h0)
        y_BxTxE = y_BxTxE * jax.nn.silu(g_BxTxE)
        out_BxTxD = self.out_proj(y_BxTxE)
        if valid_BxT is not None:
            out_BxTxD = jnp.where(valid_BxT[..., None], out_BxTxD, 0.0)
        if cache is None:
            return out_BxTxD, None
        added = jnp.full((batch,), steps, jnp.int32) if lengths is None else lengths
        return out_BxTxD, MambaCache(
            conv_BxKm1xE=new_conv.astype(cache.conv_BxKm1xE.dtype),
            ssm_BxExN=h_BxExN.astype(cache.ssm_BxExN.dtype),
            lengths_B=cache.lengths_B + added.astype(jnp.int32),
        )

    def init_cache(
        self, batch: int, max_len: int | None = None, dtype: Dtype = jnp.float32
    ) -> MambaCache:
        """An empty :class:`MambaCache`; ``max_len`` (shared decoding interface) is unused."""
        del max_len
        return MambaCache.create(batch, self.inner, self.d_state, self.d_conv, dtype)


class MinGRU(nn.Module):
    r"""minGRU (Feng et al. 2024, "Were RNNs all we needed?"): a GRU whose gates see only ``x_t``.

    .. math::
        z_t = σ(W_z x_t + b_z),\quad \tilde h_t = W_h x_t + b_h,\quad
        h_t = (1 − z_t) ⊙ h_{t−1} + z_t ⊙ \tilde h_t

    Without ``h_{t−1}`` in the gates (cf. the GRU, MEDL (7.18)–(7.19)) the recurrence is linear
    in ``h``: :func:`linear_recurrence` with ``a = 1 − z``, ``b = z ⊙ h̃`` (parallel scan in
    training, step by step in generation). ``rnn(x, *, initial_state=None) -> h``: ``[B, T, P]
    -> [B, T, H]``; :meth:`with_state` (same arguments) -> ``(h, h_T: f32[B, H])``.
    Parameters: ``gates/{kernel: [P, 2H], bias: [2H]}`` (columns ``z``, ``h̃``): ``2PH + 2H``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> rnn = MinGRU(features=3)
        >>> x = jnp.ones((2, 4, 5)); params = rnn.init(jax.random.PRNGKey(0), x)
        >>> h, h_T = rnn.apply(params, x, method="with_state")
        >>> h.shape, bool(jnp.array_equal(h[:, -1], h_T))
        ((2, 4, 3), True)
    """

    features: int
    scan_impl: str = "associative"
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()

    def setup(self) -> None:
        _check_choice(self.scan_impl, "scan_impl", SCAN_IMPLS)
        self.gates = Dense(2 * self.features, dtype=self.dtype, param_dtype=self.param_dtype,
                              kernel_init=self.kernel_init, name="gates")

    def _coefficients(self, x: Array) -> tuple[Array, Array]:
        zr, hr = jnp.split(self.gates(x).astype(jnp.float32), 2, axis=-1)
        z = jax.nn.sigmoid(zr)
        return 1.0 - z, z * hr

    @retired_flags(return_state="MinGRU.with_state")
    def __call__(self, x: Array, *, initial_state: Array | None = None) -> Array:
        """``h: [B, T, H]`` in ``dtype`` (default ``x``'s; the class docstring)."""
        return self._states(x, initial_state).astype(self.dtype or x.dtype)

    def with_state(
        self, x: Array, *, initial_state: Array | None = None
    ) -> tuple[Array, Array]:
        """As :meth:`__call__`, and the last state: ``(h: [B, T, H], h_T: f32[B, H])``."""
        h_BxTxH = self._states(x, initial_state)
        return h_BxTxH.astype(self.dtype or x.dtype), h_BxTxH[:, -1]

    def _states(self, x: Array, initial_state: Array | None) -> Array:
        """``h_1 … h_T: f32[B, T, H]`` from ``initial_state`` (zeros by default)."""
        check_rank(x, "x", 3)
        a_BxTxH, b_BxTxH = self._coefficients(x)
        h0 = None if initial_state is None else initial_state.astype(jnp.float32)
        return linear_recurrence(a_BxTxH, b_BxTxH, h0, impl=self.scan_impl)

    def step(self, h_BxH: Array, x_BxP: Array) -> tuple[Array, Array]:
        """``h_t = (1 − z_t) ⊙ h_{t−1} + z_t ⊙ h̃_t`` for one step; returns ``(h, h)``."""
        a, b = self._coefficients(x_BxP)
        h = a * h_BxH.astype(jnp.float32) + b
        return h, h.astype(self.dtype or x_BxP.dtype)

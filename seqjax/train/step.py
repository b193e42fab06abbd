r"""The training step: one ``jax.jit`` over a device mesh, and a ``jax.pmap`` variant.

A step computes, for the loss ``C(θ)`` of one batch,

.. math::  (C, g) = (C(θ), \nabla_θ C(θ)),\qquad θ \leftarrow θ + \mathrm{tx}(g)

(BPTT is autodiff through the scanned recurrence, MEDL §7.2; J&M §9.2.2) and returns the
new :class:`~seqjax.train.optim.TrainState` and float32 metrics ``loss``,
``grad_norm`` (``‖g‖₂`` before clipping), ``lr`` (if a schedule is given) and whatever
the loss function reports (e.g. ``accuracy``, ``tokens``).

**Loss functions** have the signature ``loss_fn(params, batch, rng) -> (loss, metrics)``
(see :func:`seqjax.train.losses.make_lm_loss`), or, with ``with_carry=True`` (truncated
BPTT, :mod:`seqjax.train.tbptt`), ``loss_fn(params, batch, rng, carry) -> (loss,
(metrics, new_carry))``; the incoming carry is wrapped in ``stop_gradient``.

**Sharding.** Given ``state_sharding`` (e.g. :func:`seqjax.train.sharding.tree_shardings`)
and ``batch_sharding``, the step is ``jax.jit(..., in_shardings, out_shardings)``: the same
code runs on one device, on ``N`` devices (data parallel, FSDP, tensor parallel) and on
several hosts; XLA inserts the collectives. Random numbers are drawn with the
partitionable threefry, so dropout masks do not depend on the device count.

**Mixed precision.** ``compute_dtype=jnp.bfloat16`` casts floating parameters and batch
leaves to bf16 inside the differentiated function; parameters, gradients and optimiser
state stay float32 (the cast's transpose casts gradients back), and the losses promote
logits to float32.

**Remat.** ``remat=True`` (or a ``jax.checkpoint_policies`` name such as
``"dots_saveable"``) rematerialises the forward pass during the backward pass; models
can instead wrap individual blocks in ``flax.linen.remat``.

**pmap.** :func:`make_pmap_train_step` is the same step for code that still uses
``jax.pmap``: per-device batches, gradients combined with ``psum`` weighted by each
shard's ``tokens`` (so the result is the gradient of the global token-mean loss).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from seqjax.train.optim import TrainState

Array = jax.Array
Batch = Mapping[str, Any]
LossFn = Callable[..., tuple[Array, Any]]
StepFn = Callable[[TrainState, Batch], tuple[TrainState, dict[str, Array]]]

__all__ = [
    "cast_floating",
    "flax_apply_fn",
    "make_train_step",
    "make_eval_step",
    "create_train_state",
    "make_pmap_train_step",
    "pmap_replicate",
    "pmap_unreplicate",
    "split_for_pmap",
]


def cast_floating(tree: Any, dtype: Any | None) -> Any:
    """Cast the floating-point leaves of ``tree`` to ``dtype`` (no-op for ``None``)."""
    if dtype is None:
        return tree

    def cast(x: Any) -> Any:
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x

    return jax.tree_util.tree_map(cast, tree)


def flax_apply_fn(model: Any, *, mutable: bool = False) -> Callable[..., Any]:
    """Adapt a Flax module to ``apply_fn(params, inputs, rng, train, [carry])``.

    ``train`` is passed as ``deterministic=not train`` or ``train=train`` when the
    module's ``__call__`` takes one of them; ``rng`` feeds the ``dropout`` stream
    during training. With a ``carry`` argument the module is called as
    ``model(inputs, initial_carry=carry)`` and must return ``(logits, new_carry)``.

    Example:
        >>> import flax.linen as nn, jax, jax.numpy as jnp
        >>> model = nn.Dense(3)
        >>> params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 2)))["params"]
        >>> flax_apply_fn(model)(params, jnp.ones((1, 2)), jax.random.PRNGKey(1), True).shape
        (1, 3)
    """
    params_of_call = inspect.signature(type(model).__call__).parameters

    def apply_fn(params: Any, inputs: Any, rng: Array, train: bool, *carry: Any) -> Any:
        kwargs: dict[str, Any] = {}
        if "deterministic" in params_of_call:
            kwargs["deterministic"] = not train
        elif "train" in params_of_call:
            kwargs["train"] = train
        if carry:
            kwargs["initial_carry"] = carry[0]
        rngs = {"dropout": rng} if train else {}
        return model.apply({"params": params}, inputs, rngs=rngs, **kwargs)

    return apply_fn


def _remat(fn: Callable, remat: bool | str) -> Callable:
    if remat is False or remat is None:
        return fn
    if remat is True:
        return jax.checkpoint(fn)
    policy = getattr(jax.checkpoint_policies, remat, None)
    if policy is None:
        names = sorted(n for n in dir(jax.checkpoint_policies) if not n.startswith("_"))
        raise ValueError(f"`remat` must be a bool or one of {names}; got {remat!r}.")
    return jax.checkpoint(fn, policy=policy)


def _check_state(state: Any) -> None:
    if not isinstance(state, TrainState):
        raise TypeError(f"`state` must be a seqjax.train.TrainState; got {type(state).__name__}.")
    if state.tx is None:
        raise ValueError(
            "`state.tx` is None; build the state with TrainState.create(params, tx, rng)."
        )


def _loss_and_grad(
    loss_fn: LossFn,
    params: Any,
    batch: Batch,
    rng: Array,
    carry: Any,
    *,
    compute_dtype: Any,
    remat: bool | str,
    with_carry: bool,
) -> tuple[Array, dict[str, Array], Any, Any]:
    """``(loss, metrics, new_carry, grads)`` of one (micro-)batch, metrics float32."""
    batch_c = cast_floating(batch, compute_dtype)

    def compute(params: Any) -> tuple[Array, Any]:
        p = cast_floating(params, compute_dtype)
        if with_carry:
            return loss_fn(p, batch_c, rng, carry)
        return loss_fn(p, batch_c, rng)

    (loss, aux), grads = jax.value_and_grad(_remat(compute, remat), has_aux=True)(params)
    metrics, new_carry = aux if with_carry else (aux, None)
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in dict(metrics or {}).items()}
    return jnp.asarray(loss, jnp.float32), metrics, new_carry, grads


def _split_micro(batch: Batch, k: int) -> Any:
    """Every ``[B, ...]`` leaf → ``[k, B/k, ...]``; micro-batch ``i`` holds rows ``i::k``.

    Strided rows keep each device's micro-batch rows inside its own block of the batch
    sharding (row ``r`` goes to micro-batch ``r mod k``), so the split moves no data
    between devices.
    """

    def split(x: Any) -> Any:
        x = jnp.asarray(x)
        if x.ndim == 0 or x.shape[0] % k:
            raise ValueError(
                f"every batch leaf needs a leading axis divisible by grad_accum={k}; got shape "
                f"{x.shape}."
            )
        return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)

    return jax.tree_util.tree_map(split, batch)


def _accumulated_loss_and_grad(
    loss_fn: LossFn, params: Any, batch: Batch, rng: Array, k: int, **kw: Any
) -> tuple[Array, dict[str, Array], Any]:
    """Token-weighted gradient accumulation over ``k`` micro-batches (``lax.scan``).

    With ``w_i`` the ``tokens`` metric of micro-batch ``i`` (1 without it) and ``C_i`` its
    token-mean loss, the step uses ``g = Σ_i w_i ∇C_i / Σ_i w_i`` and reports
    ``C = Σ_i w_i C_i / Σ_i w_i`` — the gradient and loss of the token-mean loss over the
    whole batch, as if it had been one batch. Other metrics are ``w``-weighted means;
    ``tokens`` is summed.
    """
    micro = _split_micro(batch, k)

    def one(i: Array, mb: Batch) -> tuple[Array, dict[str, Array], Any]:
        loss, metrics, _, grads = _loss_and_grad(
            loss_fn, params, mb, jax.random.fold_in(rng, i), None, with_carry=False, **kw)
        return loss, metrics, grads

    first = jax.tree_util.tree_map(lambda x: x[0], micro)
    shapes = jax.eval_shape(one, jnp.zeros((), jnp.int32), first)
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)

    def body(acc: Any, xs: tuple[Array, Batch]) -> tuple[Any, None]:
        loss, metrics, grads = one(*xs)
        w = metrics.get("tokens", jnp.ones((), jnp.float32))
        a_loss, a_metrics, a_grads = acc
        a_grads = jax.tree_util.tree_map(lambda a, g: a + w * g.astype(jnp.float32),
                                         a_grads, grads)
        a_metrics = {n: a_metrics[n] + (v if n == "tokens" else w * v)
                     for n, v in metrics.items()}
        a_metrics["__w"] = acc[1]["__w"] + w
        return (a_loss + w * loss, a_metrics, a_grads), None

    init = (zeros[0], {**zeros[1], "__w": jnp.zeros((), jnp.float32)}, zeros[2])
    (loss, metrics, grads), _ = jax.lax.scan(body, init, (jnp.arange(k), micro))
    total = metrics.pop("__w")
    total = jnp.maximum(total, jnp.finfo(jnp.float32).tiny)
    grads = jax.tree_util.tree_map(lambda g, p: (g / total).astype(p.dtype), grads, params)
    metrics = {n: v if n == "tokens" else v / total for n, v in metrics.items()}
    return loss / total, metrics, grads


def _grad_and_update(
    loss_fn: LossFn,
    state: TrainState,
    batch: Batch,
    rng: Array,
    *,
    compute_dtype: Any,
    remat: bool | str,
    with_carry: bool,
    grad_accum: int = 1,
    combine: Callable[[Any, Array, dict], tuple[Any, Array, dict]] | None = None,
) -> tuple[TrainState, dict[str, Array]]:
    kw = {"compute_dtype": compute_dtype, "remat": remat}
    if grad_accum > 1:
        loss, metrics, grads = _accumulated_loss_and_grad(
            loss_fn, state.params, batch, rng, grad_accum, **kw)
        new_carry = None
    else:
        carry = jax.lax.stop_gradient(state.carry) if with_carry else None
        loss, metrics, new_carry, grads = _loss_and_grad(
            loss_fn, state.params, batch, rng, carry, with_carry=with_carry, **kw)
    if combine is not None:
        grads, loss, metrics = combine(grads, loss, metrics)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    if with_carry:
        new_state = new_state.replace(carry=new_carry)
    out = {"loss": loss, "grad_norm": optax.global_norm(grads).astype(jnp.float32), **metrics}
    return new_state, out


def make_train_step(
    loss_fn: LossFn,
    *,
    state_sharding: Any = None,
    batch_sharding: NamedSharding | None = None,
    compute_dtype: Any = None,
    remat: bool | str = False,
    schedule: optax.Schedule | None = None,
    with_carry: bool = False,
    donate: bool = True,
    grad_accum: int = 1,
) -> StepFn:
    """A jitted ``step(state, batch) -> (state, metrics)``.

    Args:
        loss_fn: ``(params, batch, rng) -> (loss, metrics)`` (see the module docstring).
        state_sharding: shardings of the ``TrainState`` (a matching pytree, e.g.
            ``tree_shardings(state, mesh, "fsdp")``); ``None`` = let ``jit`` follow its
            inputs (one device).
        batch_sharding: sharding of every batch leaf (e.g. ``batch_sharding(mesh)``).
        compute_dtype: e.g. ``jnp.bfloat16`` for mixed precision; ``None`` = as stored.
        remat: ``True`` or a ``jax.checkpoint_policies`` name.
        schedule: the learning-rate schedule, to report ``lr`` (of the update just made).
        with_carry: the loss function threads a recurrent carry (truncated BPTT).
        donate: donate the input state's buffers (the old state must not be reused).
        grad_accum: split each batch into this many micro-batches inside the jitted step
            (``lax.scan``; rows ``i::grad_accum`` form micro-batch ``i``) and accumulate
            their gradients weighted by the ``tokens`` metric — the update equals the
            one-batch update while activations are held for one micro-batch at a time.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> loss_fn = lambda p, b, rng: (jnp.mean((b["x"] * p["w"] - b["y"]) ** 2), {})
        >>> state = TrainState.create({"w": jnp.zeros(())}, optax.sgd(0.1), jax.random.PRNGKey(0))
        >>> step = make_train_step(loss_fn)
        >>> state, m = step(state, {"x": jnp.ones(4), "y": jnp.ones(4)})
        >>> float(m["loss"]), round(float(state.params["w"]), 3)
        (1.0, 0.2)
    """

    if not isinstance(grad_accum, int) or grad_accum < 1:
        raise ValueError(f"`grad_accum` must be an int >= 1; got {grad_accum!r}.")
    if grad_accum > 1 and with_carry:
        raise ValueError("`grad_accum` > 1 cannot thread a TBPTT carry (`with_carry=True`): "
                         "the carry belongs to whole rows; use grad_accum=1.")

    def step_fn(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, Array]]:
        _check_state(state)
        rng, step_rng = jax.random.split(state.rng)
        new_state, metrics = _grad_and_update(
            loss_fn, state, batch, step_rng,
            compute_dtype=compute_dtype, remat=remat, with_carry=with_carry,
            grad_accum=grad_accum,
        )
        if schedule is not None:
            metrics["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        return new_state.replace(rng=rng), metrics

    kwargs: dict[str, Any] = {"donate_argnums": (0,) if donate else ()}
    if state_sharding is not None or batch_sharding is not None:
        if state_sharding is None or batch_sharding is None:
            raise ValueError("give both `state_sharding` and `batch_sharding`, or neither.")
        mesh = batch_sharding.mesh
        kwargs["in_shardings"] = (state_sharding, batch_sharding)
        kwargs["out_shardings"] = (state_sharding, NamedSharding(mesh, PartitionSpec()))
        return jax.jit(_under_mesh(step_fn, mesh), **kwargs)
    return jax.jit(step_fn, **kwargs)


def _under_mesh(fn: Callable, mesh: Any) -> Callable:
    """Trace ``fn`` with ``mesh``'s abstract mesh in scope, so the layers' sharding hints
    (:mod:`seqjax.nn._sharding`, e.g. the RNN's collective-free time loop) apply."""

    def wrapped(*args: Any) -> Any:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)

    return wrapped


def make_eval_step(
    eval_fn: Callable[[Any, Batch], dict[str, Array]],
    *,
    params_sharding: Any = None,
    batch_sharding: NamedSharding | None = None,
    compute_dtype: Any = None,
) -> Callable[[Any, Batch], dict[str, Array]]:
    """Jit ``eval_fn(params, batch) -> metrics`` (e.g. from ``losses.make_lm_eval``)."""

    def fn(params: Any, batch: Batch) -> dict[str, Array]:
        out = eval_fn(cast_floating(params, compute_dtype), cast_floating(batch, compute_dtype))
        return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}

    if params_sharding is None and batch_sharding is None:
        return jax.jit(fn)
    if params_sharding is None or batch_sharding is None:
        raise ValueError("give both `params_sharding` and `batch_sharding`, or neither.")
    rep = NamedSharding(batch_sharding.mesh, PartitionSpec())
    return jax.jit(_under_mesh(fn, batch_sharding.mesh),
                   in_shardings=(params_sharding, batch_sharding), out_shardings=rep)


def create_train_state(
    init_params: Callable[[Array], Any],
    tx: optax.GradientTransformation,
    rng: Array,
    *,
    state_sharding_fn: Callable[[Any], Any] | None = None,
    carry: Any = None,
) -> tuple[TrainState, Any]:
    """Initialise a ``TrainState`` directly in its sharded layout.

    ``init_params(rng) -> params`` is traced once with ``jax.eval_shape``;
    ``state_sharding_fn(abstract_state) -> shardings`` (e.g.
    ``lambda s: tree_shardings(s, mesh, "fsdp")``) picks the layout, and the state is
    created by a jitted initialiser with those ``out_shardings`` — no device ever holds
    the full unsharded parameters. Returns ``(state, shardings)`` (``shardings`` is
    ``None`` without ``state_sharding_fn``).

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> state, _ = create_train_state(lambda r: {"w": jnp.ones(3)}, optax.sgd(0.1),
        ...                               jax.random.PRNGKey(0))
        >>> int(state.step), state.params["w"].shape
        (0, (3,))
    """

    def make(key: Array) -> TrainState:
        p_key, s_key = jax.random.split(key)
        return TrainState.create(init_params(p_key), tx, s_key, carry=carry)

    rng = jnp.asarray(rng)
    if state_sharding_fn is None:
        return jax.jit(make)(rng), None
    shardings = state_sharding_fn(jax.eval_shape(make, rng))
    return jax.jit(make, out_shardings=shardings)(rng), shardings


# ----------------------------------------------------------------------------- pmap


def make_pmap_train_step(
    loss_fn: LossFn,
    *,
    axis_name: str = "data",
    compute_dtype: Any = None,
    remat: bool | str = False,
    schedule: optax.Schedule | None = None,
    with_carry: bool = False,
    donate: bool = True,
    devices: list[Any] | None = None,
) -> StepFn:
    """The data-parallel step with ``jax.pmap``: state replicated, batch ``[n_dev, b, ...]``.

    Each device computes its shard's loss ``C_d`` (mean over its ``w_d`` tokens, ``w_d`` =
    ``metrics["tokens"]`` or 1) and gradient; the update uses
    ``g = Σ_d w_d g_d / Σ_d w_d`` — the gradient of the global token-mean loss, equal to
    the single-device step on the concatenated batch. Dropout keys differ per device
    (``fold_in(rng, axis_index)``). Use :func:`pmap_replicate`, :func:`split_for_pmap`
    and :func:`pmap_unreplicate` around it.
    """

    def combine(grads: Any, loss: Array, metrics: dict) -> tuple[Any, Array, dict]:
        w = metrics.get("tokens", jnp.ones((), jnp.float32))
        total = jax.lax.psum(w, axis_name)
        mean = lambda x: jax.lax.psum(x * w, axis_name) / total
        grads = jax.tree_util.tree_map(mean, grads)
        out = {k: mean(v) for k, v in metrics.items() if k != "tokens"}
        if "tokens" in metrics:
            out["tokens"] = total
        return grads, mean(loss), out

    def step_fn(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, Array]]:
        _check_state(state)
        rng, step_rng = jax.random.split(state.rng)
        step_rng = jax.random.fold_in(step_rng, jax.lax.axis_index(axis_name))
        new_state, metrics = _grad_and_update(
            loss_fn, state, batch, step_rng,
            compute_dtype=compute_dtype, remat=remat, with_carry=with_carry, combine=combine,
        )
        if schedule is not None:
            metrics["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        return new_state.replace(rng=rng), metrics

    return jax.pmap(
        step_fn, axis_name=axis_name, donate_argnums=(0,) if donate else (), devices=devices
    )


def pmap_replicate(tree: Any, num_devices: int | None = None) -> Any:
    """Stack ``num_devices`` copies of every leaf (the layout ``jax.pmap`` expects)."""
    n = jax.local_device_count() if num_devices is None else num_devices
    return jax.tree_util.tree_map(lambda x: np.broadcast_to(np.asarray(x), (n, *np.shape(x))), tree)


def pmap_unreplicate(tree: Any) -> Any:
    """The first device's copy of every leaf."""
    return jax.tree_util.tree_map(lambda x: x[0], tree)


def split_for_pmap(batch: Any, num_devices: int | None = None) -> Any:
    """Reshape every ``[B, ...]`` leaf to ``[n_dev, B / n_dev, ...]``."""
    n = jax.local_device_count() if num_devices is None else num_devices

    def split(x: Any) -> Any:
        x = np.asarray(x)
        if x.shape[0] % n:
            raise ValueError(f"batch size {x.shape[0]} must be divisible by {n} devices.")
        return x.reshape(n, x.shape[0] // n, *x.shape[1:])

    return jax.tree_util.tree_map(split, batch)

r"""The training step: one ``jax.jit`` over a device mesh.

For the loss ``C(θ)`` of one batch a step computes

.. math::  (C, g) = (C(θ), \nabla_θ C(θ)),\qquad θ \leftarrow θ + \mathrm{tx}(g)

(BPTT is autodiff through the scanned recurrence, MEDL §7.2; J&M §9.2.2) and returns the new
:class:`~seqjax.train.optim.TrainState` and float32 metrics ``loss``, ``grad_norm`` (``‖g‖₂``
before clipping), ``lr`` (if a schedule is given) and the loss function's own (e.g.
``accuracy``, ``tokens``).

* Loss functions: ``loss_fn(params, batch, rng) -> (loss, metrics)``
  (:func:`seqjax.train.losses.make_lm_loss`), or with ``with_carry=True`` (truncated BPTT,
  :mod:`seqjax.train.tbptt`) ``loss_fn(params, batch, rng, carry) -> (loss, (metrics,
  new_carry))``, the incoming carry under ``stop_gradient``.
* Sharding: with ``state_sharding`` (e.g. :func:`seqjax.train.sharding.tree_shardings`) and
  ``batch_sharding`` the step is ``jax.jit(..., in_shardings, out_shardings)``: one code for
  one device, ``N`` devices (data parallel, FSDP, tensor parallel) or several hosts. The
  partitionable threefry makes dropout masks independent of the device count.
* Mixed precision: ``compute_dtype=jnp.bfloat16`` casts floating parameters and batch leaves
  inside the differentiated function; parameters, gradients and optimiser state stay float32,
  and the losses promote logits to float32.
* Remat: ``remat=True`` or a :mod:`seqjax.nn.remat` policy (a name such as
  ``"dots_saveable"`` or a callable) rematerialises the forward pass in the backward pass.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from seqjax._checks import check_positive_int, check_vocab_ids
from seqjax.nn.remat import remat_policy
from seqjax.train.optim import TrainState

Array = jax.Array
Batch = Mapping[str, Any]
LossFn = Callable[..., tuple[Array, Any]]
StepFn = Callable[[TrainState, Batch], tuple[TrainState, dict[str, Array]]]

__all__ = ["BatchCheck", "ModelApply", "cast_floating", "flax_apply_fn", "make_batch_check",
           "make_train_step", "make_eval_step", "TrainStep", "create_train_state"]


def _host_array(x: Any) -> np.ndarray | None:
    """``x`` as numpy if reading it needs no device round trip (numpy, Python data, a CPU
    ``jax.Array`` of this process), else ``None`` (tracers, accelerator arrays)."""
    if isinstance(x, np.ndarray | np.generic | list | tuple | int):
        return np.asarray(x)
    if isinstance(x, jax.core.Tracer) or not isinstance(x, jax.Array):
        return None
    if not x.is_fully_addressable or any(d.platform != "cpu" for d in x.devices()):
        return None
    return np.asarray(x)


def make_batch_check(vocab_size: int | Mapping[str, int], *, inputs_key: str = "inputs",
                     targets_key: str = "targets", mask_key: str = "mask",
                     masks: Mapping[str, str] | None = None) -> BatchCheck:
    """A host-side check of a batch's token ids, for ``fit(..., check_batch=check)``.

    Inside ``jit`` ids cannot be range-checked (an invalid one turns its row NaN,
    :mod:`seqjax._traced_checks`); ``check(batch)`` raises ``ValueError`` naming the key, the
    vocabulary and the values found. Missing keys, non-integer leaves and accelerator-resident
    arrays (reading them back would stall each step) are skipped.

    Args:
        vocab_size: ``V`` for ``batch[inputs_key]`` and ``batch[targets_key]``, or ``{key: V}``
            (e.g. ``{"src": 8000, "tgt_in": 6000, "tgt_out": 6000}``).
        inputs_key, targets_key, mask_key: the keys of :func:`~seqjax.train.losses.make_lm_loss`.
        masks: ``{key: mask key}``: only positions where the mask is True are checked (padding
            labels such as -100 are allowed elsewhere). Default ``{targets_key: mask_key}``.

    Example:
        >>> check = make_batch_check(5)
        >>> try:
        ...     check({"inputs": np.array([[1, 2]]), "targets": np.array([[2, 5]])})
        ... except ValueError as err:
        ...     print(str(err)[:48])
        `batch["targets"]` must hold token ids in [0, 4]
    """
    sizes = (dict(vocab_size) if isinstance(vocab_size, Mapping)
             else {inputs_key: vocab_size, targets_key: vocab_size})
    for key, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"`vocab_size` for batch key {key!r} must be a positive int; "
                             f"got {v!r}.")
    mask_of = {targets_key: mask_key} if masks is None else dict(masks)
    return BatchCheck(sizes, mask_of)


@dataclasses.dataclass(frozen=True)
class BatchCheck:
    """:func:`make_batch_check`'s check, ``check(batch)``.

    Attributes:
        vocab_sizes: ``{batch key: V}``; ids of ``batch[key]`` must lie in ``[0, V)``.
        masks: ``{batch key: mask key}``; only positions where the mask is True are checked.
    """

    vocab_sizes: Mapping[str, int]
    masks: Mapping[str, str]

    def __call__(self, batch: Batch) -> None:
        if not isinstance(batch, Mapping):
            return
        for key, v in self.vocab_sizes.items():
            ids = _host_array(batch[key]) if key in batch else None
            if ids is None:  # absent, or not readable on this host: the mask is not read
                continue
            masked = self.masks.get(key) in batch
            mask = _host_array(batch[self.masks[key]]) if masked else None
            if mask is not None or not masked:
                check_vocab_ids(ids, f'batch["{key}"]', int(v), mask)


def cast_floating(tree: Any, dtype: Any | None) -> Any:
    """Cast the floating-point leaves of ``tree`` to ``dtype`` (no-op for ``None``)."""
    if dtype is None:
        return tree
    floating = lambda x: hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)
    return jax.tree_util.tree_map(lambda x: x.astype(dtype) if floating(x) else x, tree)


@dataclasses.dataclass(frozen=True)
class ModelApply:
    """A Flax module as ``apply_fn(params, inputs, rng, train, [carry])``; :func:`flax_apply_fn`."""

    model: Any

    def __call__(self, params: Any, inputs: Any, rng: Array, train: bool, *carry: Any) -> Any:
        params_of_call = inspect.signature(type(self.model).__call__).parameters  # at trace time
        kwargs: dict[str, Any] = {}
        if "deterministic" in params_of_call:
            kwargs["deterministic"] = not train
        elif "train" in params_of_call:
            kwargs["train"] = train
        if carry:  # the carry protocol (seqjax.nn.StackedRNN): with_state -> (y, carry)
            kwargs["initial_carry"] = carry[0]
            kwargs["method"] = "with_state" if hasattr(self.model, "with_state") else None
        rngs = {"dropout": rng} if train else {}
        return self.model.apply({"params": params}, inputs, rngs=rngs, **kwargs)


def flax_apply_fn(model: Any) -> ModelApply:
    """Adapt a Flax module to ``apply_fn(params, inputs, rng, train, [carry])``.

    ``train`` is passed as ``deterministic=not train`` or ``train=train`` if ``__call__`` takes
    one; ``rng`` feeds the ``dropout`` stream in training. With a ``carry`` the module is called
    as ``model.with_state(inputs, initial_carry=carry)`` (or ``model(...)`` without
    ``with_state``) and must return ``(logits, new_carry)``.

    Example:
        >>> import flax.linen as nn, jax, jax.numpy as jnp
        >>> model = nn.Dense(3)
        >>> params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 2)))["params"]
        >>> flax_apply_fn(model)(params, jnp.ones((1, 2)), jax.random.PRNGKey(1), True).shape
        (1, 3)
    """
    return ModelApply(model)


def _remat(fn: Callable, remat: bool | str | Callable) -> Callable:
    if remat is False or remat is None:
        return fn
    return jax.checkpoint(fn, policy=None if remat is True else remat_policy(remat, "remat"))


def _check_state(state: Any) -> None:
    if not isinstance(state, TrainState):
        raise TypeError(f"`state` must be a seqjax.train.TrainState; got {type(state).__name__}.")
    if state.tx is None:
        raise ValueError("`state.tx` is None; build the state with "
                         "TrainState.create(params, tx, rng).")


def _loss_and_grad(loss_fn: LossFn, params: Any, batch: Batch, rng: Array, carry: Any, *,
                   compute_dtype: Any, remat: bool | str | Callable, with_carry: bool
                   ) -> tuple[Array, dict[str, Array], Any, Any]:
    """``(loss, metrics, new_carry, grads)`` of one (micro-)batch, metrics float32."""
    batch_c, extra = cast_floating(batch, compute_dtype), (carry,) if with_carry else ()

    def compute(params: Any) -> tuple[Array, Any]:
        return loss_fn(cast_floating(params, compute_dtype), batch_c, rng, *extra)

    (loss, aux), grads = jax.value_and_grad(_remat(compute, remat), has_aux=True)(params)
    metrics, new_carry = aux if with_carry else (aux, None)
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in dict(metrics or {}).items()}
    return jnp.asarray(loss, jnp.float32), metrics, new_carry, grads


def _split_micro(batch: Batch, k: int) -> Any:
    """Every ``[B, ...]`` leaf → ``[k, B/k, ...]``, micro-batch ``i`` holding rows ``i::k``.

    Strided rows keep each device's micro-batch rows in its own block of the batch sharding, so
    the split moves no data between devices.
    """

    def split(x: Any) -> Any:
        x = jnp.asarray(x)
        if x.ndim == 0 or x.shape[0] % k:
            raise ValueError(f"every batch leaf needs a leading axis divisible by "
                             f"grad_accum={k}; got shape {x.shape}.")
        return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)

    return jax.tree_util.tree_map(split, batch)


def _accumulated_loss_and_grad(loss_fn: LossFn, params: Any, batch: Batch, rng: Array, k: int,
                               **kw: Any) -> tuple[Array, dict[str, Array], Any]:
    """Token-weighted gradient accumulation over ``k`` micro-batches (``lax.scan``).

    With ``w_i`` micro-batch ``i``'s ``tokens`` (1 without it) and ``C_i`` its token-mean loss:
    ``g = Σ_i w_i ∇C_i / Σ_i w_i``, ``C = Σ_i w_i C_i / Σ_i w_i`` — the whole batch's token-mean
    loss and gradient. Other metrics are ``w``-weighted means; ``tokens`` is summed.
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
        a_loss, a_metrics, a_grads, a_w = acc
        loss, metrics, grads = one(*xs)
        w = metrics.get("tokens", jnp.ones((), jnp.float32))
        a_grads = jax.tree_util.tree_map(lambda a, g: a + w * g.astype(jnp.float32),
                                         a_grads, grads)
        a_metrics = {n: a_metrics[n] + (v if n == "tokens" else w * v)
                     for n, v in metrics.items()}
        return (a_loss + w * loss, a_metrics, a_grads, a_w + w), None

    init = (*zeros, jnp.zeros((), jnp.float32))  # and the weight sum
    (loss, metrics, grads, total), _ = jax.lax.scan(body, init, (jnp.arange(k), micro))
    total = jnp.maximum(total, jnp.finfo(jnp.float32).tiny)
    grads = jax.tree_util.tree_map(lambda g, p: (g / total).astype(p.dtype), grads, params)
    metrics = {n: v if n == "tokens" else v / total for n, v in metrics.items()}
    return loss / total, metrics, grads


def _grad_and_update(loss_fn: LossFn, state: TrainState, batch: Batch, rng: Array, *,
                     compute_dtype: Any, remat: bool | str | Callable, with_carry: bool,
                     grad_accum: int = 1) -> tuple[TrainState, dict[str, Array]]:
    kw = {"compute_dtype": compute_dtype, "remat": remat}
    if grad_accum > 1:
        loss, metrics, grads = _accumulated_loss_and_grad(
            loss_fn, state.params, batch, rng, grad_accum, **kw)
    else:
        carry = jax.lax.stop_gradient(state.carry) if with_carry else None
        loss, metrics, new_carry, grads = _loss_and_grad(
            loss_fn, state.params, batch, rng, carry, with_carry=with_carry, **kw)
    new_state = state.apply_gradients(grads, **({"carry": new_carry} if with_carry else {}))
    out = {"loss": loss, "grad_norm": optax.tree.norm(grads).astype(jnp.float32), **metrics}
    return new_state, out


def make_train_step(loss_fn: LossFn, *, state_sharding: Any = None,
                    batch_sharding: NamedSharding | None = None, compute_dtype: Any = None,
                    remat: bool | str | Callable = False, schedule: optax.Schedule | None = None,
                    with_carry: bool = False, donate: bool = True,
                    grad_accum: int = 1) -> TrainStep:
    """A jitted ``step(state, batch) -> (state, metrics)`` (a :class:`TrainStep`).

    The step reads no host value (check token ids with :func:`make_batch_check`) and leaves the
    process-wide allocator alone (on the CPU call :func:`~seqjax.train.cpu_memory.keep_freed_memory`
    first, as ``seqjax train`` does).

    Args:
        loss_fn: ``(params, batch, rng) -> (loss, metrics)`` (the module docstring).
        state_sharding: shardings of the ``TrainState`` (e.g.
            ``tree_shardings(state, mesh, "fsdp")``); ``None`` = ``jit`` follows its inputs.
        batch_sharding: sharding of every batch leaf (e.g. ``batch_sharding(mesh)``).
        compute_dtype: e.g. ``jnp.bfloat16`` for mixed precision; ``None`` = as stored.
        remat: ``True`` (save nothing) or a :mod:`seqjax.nn.remat` policy (a name in
            ``REMAT_POLICIES`` or a ``jax.checkpoint_policies`` callable).
        schedule: the learning-rate schedule, to report ``lr`` (of the update just made).
        with_carry: the loss function threads a recurrent carry (truncated BPTT).
        donate: donate the input state's buffers (the old state must not be reused).
        grad_accum: micro-batches per batch (rows ``i::grad_accum``), gradients accumulated
            weighted by ``tokens`` in a ``lax.scan``: the one-batch update, holding one
            micro-batch's activations at a time.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> loss_fn = lambda p, b, rng: (jnp.mean((b["x"] * p["w"] - b["y"]) ** 2), {})
        >>> state = TrainState.create({"w": jnp.zeros(())}, optax.sgd(0.1), jax.random.PRNGKey(0))
        >>> state, m = make_train_step(loss_fn)(state, {"x": jnp.ones(4), "y": jnp.ones(4)})
        >>> float(m["loss"]), round(float(state.params["w"]), 3)
        (1.0, 0.2)
    """
    check_positive_int(grad_accum, "grad_accum")
    if grad_accum > 1 and with_carry:
        raise ValueError("`grad_accum` > 1 cannot thread a TBPTT carry (`with_carry=True`): "
                         "the carry belongs to whole rows; use grad_accum=1.")

    def step_fn(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, Array]]:
        _check_state(state)
        rng, step_rng = jax.random.split(state.rng)
        new_state, metrics = _grad_and_update(
            loss_fn, state, batch, step_rng, compute_dtype=compute_dtype, remat=remat,
            with_carry=with_carry, grad_accum=grad_accum)
        if schedule is not None:
            metrics["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
        return new_state.replace(rng=rng), metrics

    _both_or_neither(state_sharding, batch_sharding, "`state_sharding` and `batch_sharding`")
    return TrainStep(step_fn, state_sharding=state_sharding,
                     batch_sharding=batch_sharding, donate=donate)


class TrainStep:
    """:func:`make_train_step`'s jitted ``step(state, batch) -> (state, metrics)``, one update per
    call, and the multi-step runs :func:`~seqjax.train.loop.fit` uses: :meth:`steps` (``k`` host
    batches in one call) and :meth:`steps_from` (``k`` batches drawn on the devices). Both are a
    ``lax.scan`` of the same step, metrics stacked on a leading ``[k]`` axis. Other attributes
    (``lower``, ``eval_shape``, ...) are the jitted step's.
    """

    def __init__(self, step_fn: StepFn, *, state_sharding: Any = None,
                 batch_sharding: NamedSharding | None = None, donate: bool = True) -> None:
        self.step_fn = step_fn
        self.state_sharding = state_sharding
        self.batch_sharding = batch_sharding
        self.donate = donate
        self.mesh = None if batch_sharding is None else batch_sharding.mesh
        self._compiled: dict[Any, Any] = {}  # jitted runs (with the source they read)
        self.jitted = self._jit(step_fn, self.batch_sharding)
        self.__wrapped__ = self.jitted

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, Array]]:
        return self.jitted(state, batch)

    def __getattr__(self, name: str) -> Any:  # lower, trace, eval_shape, ...
        jitted = self.__dict__.get("jitted")
        if jitted is None:  # not built yet (e.g. while copying)
            raise AttributeError(name)
        return getattr(jitted, name)

    def _jit(self, fn: Callable[..., Any], second_sharding: Any) -> Callable[..., Any]:
        return _jit(fn, self.mesh, (self.state_sharding, second_sharding),
                    lambda rep: (self.state_sharding, rep), (0,) if self.donate else ())

    def steps(self, k: int) -> Any:
        """Jitted ``(state, batches) -> (state, metrics[k])``, ``batches`` ``k`` placed ones."""
        check_positive_int(k, "steps_per_call")
        key = ("steps", k)
        if key not in self._compiled:
            step_fn = self.step_fn

            def run(state: TrainState, batches: tuple) -> tuple[TrainState, dict]:
                if len(batches) != k:
                    raise ValueError(f"expected {k} batches; got {len(batches)}.")
                stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *batches)
                return jax.lax.scan(step_fn, state, stacked)

            sharding = None if self.batch_sharding is None else (self.batch_sharding,) * k
            self._compiled[key] = self._jit(run, sharding)
        return self._compiled[key]

    def steps_from(self, source: Any, k: int = 1) -> Any:
        """Jitted ``(state, source.arrays) -> (state, metrics[k])``, step ``s``'s batch (0-based,
        ``state.step`` before it) drawn on the devices by ``source.device_batch(arrays, s)``."""
        check_positive_int(k, "steps_per_call")
        key = ("source", id(source), k)
        if key not in self._compiled:
            step_fn, batch_sharding = self.step_fn, self.batch_sharding

            def run(state: TrainState, arrays: Any) -> tuple[TrainState, dict]:
                def one(state: TrainState, _: Any) -> tuple[TrainState, dict]:
                    batch = source.device_batch(arrays, state.step)
                    if batch_sharding is not None:
                        batch = jax.lax.with_sharding_constraint(batch, batch_sharding)
                    return step_fn(state, batch)

                return jax.lax.scan(one, state, None, length=k)

            # the source's arrays stay where it placed them (replicated, or split by rows)
            sharding = None if self.mesh is None else jax.tree_util.tree_map(
                lambda a: a.sharding, source.arrays)
            self._compiled[key] = (self._jit(run, sharding), source)  # keeps `source` alive
        return self._compiled[key][0]


def _jit(fn: Callable, mesh: Any, in_shardings: Any, out_shardings: Callable[[Any], Any],
         donate: tuple[int, ...] = ()) -> Callable:
    """``jax.jit(fn)``; with a ``mesh``, on ``in_shardings`` and ``out_shardings(replicated)``,
    traced under ``mesh``'s abstract mesh, so layers' sharding hints (:mod:`seqjax.nn._sharding`)
    apply."""
    if mesh is None:
        return jax.jit(fn, donate_argnums=donate)

    def wrapped(*args: Any) -> Any:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)

    return jax.jit(wrapped, in_shardings=in_shardings, donate_argnums=donate,
                   out_shardings=out_shardings(NamedSharding(mesh, PartitionSpec())))


def _both_or_neither(a: Any, b: Any, names: str) -> None:
    if (a is None) != (b is None):
        raise ValueError(f"give both {names}, or neither.")


def make_eval_step(eval_fn: Callable[[Any, Batch], dict[str, Array]], *,
                   params_sharding: Any = None, batch_sharding: NamedSharding | None = None,
                   compute_dtype: Any = None) -> Callable[[Any, Batch], dict[str, Array]]:
    """Jit ``eval_fn(params, batch) -> metrics`` (e.g. ``losses.make_lm_eval``), metrics float32."""

    def fn(params: Any, batch: Batch) -> dict[str, Array]:
        out = eval_fn(cast_floating(params, compute_dtype), cast_floating(batch, compute_dtype))
        return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}

    _both_or_neither(params_sharding, batch_sharding, "`params_sharding` and `batch_sharding`")
    mesh = None if batch_sharding is None else batch_sharding.mesh
    return _jit(fn, mesh, (params_sharding, batch_sharding), lambda rep: rep)


def create_train_state(init_params: Callable[[Array], Any], tx: optax.GradientTransformation,
                       rng: Array, *, state_sharding_fn: Callable[[Any], Any] | None = None,
                       carry: Any = None) -> tuple[TrainState, Any]:
    """Initialise a ``TrainState`` directly in its sharded layout; returns ``(state, shardings)``.

    ``state_sharding_fn(abstract_state) -> shardings`` (e.g.
    ``lambda s: tree_shardings(s, mesh, "fsdp")``) gives a jitted initialiser's
    ``out_shardings``, so no device holds all unsharded parameters; without it ``shardings`` is
    ``None``.

    Example:
        >>> import jax, jax.numpy as jnp, optax
        >>> state, _ = create_train_state(lambda r: {"w": jnp.ones(3)}, optax.sgd(0.1),
        ...                               jax.random.PRNGKey(0))
        >>> state.params["w"].shape
        (3,)
    """

    def make(key: Array) -> TrainState:
        p_key, s_key = jax.random.split(key)
        return TrainState.create(init_params(p_key), tx, s_key, carry=carry)

    rng = jnp.asarray(rng)
    if state_sharding_fn is None:
        return jax.jit(make)(rng), None
    shardings = state_sharding_fn(jax.eval_shape(make, rng))
    return jax.jit(make, out_shardings=shardings)(rng), shardings


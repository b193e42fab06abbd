"""Every device, every host: one object that lays a training run out over a device mesh.

:class:`Parallel` is how ``fit``, the ``seqjax`` command, the experiments and the notebooks
train on all the given accelerators, this process's and, under ``jax.distributed``, every
other process's::

    par = Parallel.create(mesh="data=4,fsdp=2", strategy="fsdp")    # default: all on `data`
    state = par.create_state(lambda r: model.init(r, x0)["params"], tx, rng)
    train_step = par.train_step(loss_fn, schedule=schedule)
    it = LMWindowIterator(ids, par.local_batch_size(64), T, **par.host_rows())
    fit(state, train_step, it, FitConfig(...), parallel=par, eval_step=par.eval_step(ev))

Mesh: axes ``("data", "fsdp", "model")`` (:func:`seqjax.train.sharding.make_mesh`), spec
``"data=4,fsdp=2,model=1"`` (one size may be ``-1``: the rest) or a mapping; empty = all on
``data``. Strategy (:func:`seqjax.train.sharding.tree_shardings`): ``replicated``, ``fsdp``
(ZeRO-3), ``tensor`` (Megatron column/row split over ``model``), ``fsdp+tensor``; ``auto``
follows the mesh (``fsdp`` if that axis is > 1, ``tensor`` if ``model`` is, both if both).

Which rows a process feeds: the batch is sharded over ``("data", "fsdp")`` and replicated
over ``model``, so device ``(d, f, ·)`` holds shard ``d · |fsdp| + f`` of ``|data|·|fsdp|``.
:meth:`Parallel.host_rows` derives a process's rows from the mesh, not from
``jax.process_index()``: processes sharing shards (``model`` spanning processes) must feed
the same rows, or the loss is silently corrupted. A layout whose per-process shards are not
one aligned contiguous block of equal size is refused with a ``ValueError``;
:meth:`Parallel.place_global` (every process holds the whole batch) feeds any layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from seqjax._checks import check_positive_int
from seqjax._ranges import NonNegInt, PosInt
from seqjax.train.optim import TrainState
from seqjax.train.sharding import (
    AXES,
    STRATEGIES,
    BatchPlacer,
    host_value,
    make_mesh,
    maybe_initialize_distributed,
    shard_global_batch,
    tree_shardings,
)
from seqjax.train.step import create_train_state, make_eval_step, make_train_step

__all__ = ["Parallel", "ParallelOptions", "LayoutError", "describe_state", "parse_mesh",
           "resolve_strategy"]


@dataclasses.dataclass(frozen=True)
class ParallelOptions:
    """The ``--mesh`` / ``--strategy`` / ``--grad_accum`` options every experiment's ``Config``
    inherits.

    Attributes:
        mesh: ``"data=4,fsdp=2,model=1"``; ``""`` = every visible device on ``data``.
        strategy: one of :data:`seqjax.train.sharding.STRATEGIES` or ``"auto"``.
        grad_accum: micro-batches per step (token-weighted, inside the jitted step).
        fsdp_min_size: parameters with fewer elements stay replicated under FSDP.
    """

    mesh: str = ""
    strategy: Literal["auto", "replicated", "fsdp", "tensor", "fsdp+tensor"] = "auto"
    grad_accum: PosInt = 1
    fsdp_min_size: NonNegInt = 2**12


def parse_mesh(spec: str | Mapping[str, int] | None) -> dict[str, int]:
    """``"data=4,fsdp=2"`` → ``{"data": 4, "fsdp": 2, "model": 1}`` (unnamed axes 1; ``data=-1``
    when none is named).

    Example:
        >>> parse_mesh("fsdp=2, data=-1")
        {'data': -1, 'fsdp': 2, 'model': 1}
    """
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return {"data": -1, "fsdp": 1, "model": 1}
    if isinstance(spec, Mapping):
        items: list[tuple[str, Any]] = [(str(k), v) for k, v in spec.items()]
    elif isinstance(spec, str):
        parts = [part.strip().partition("=") for part in spec.split(",") if part.strip()]
        for name, eq, _ in parts:
            if not eq:
                raise ValueError(f"`mesh` must look like 'data=4,fsdp=2,model=1'; got {spec!r} "
                                 f"(the part {name!r} has no '=').")
        items = [(name.strip(), value.strip()) for name, _, value in parts]
    else:
        raise TypeError(f"`mesh` must be a str or a mapping; got {type(spec).__name__}.")
    out: dict[str, int] = {}
    for name, value in items:
        if name not in AXES:
            raise ValueError(f"`mesh` axis must be one of {AXES}; got {name!r} in {spec!r}.")
        if name in out:
            raise ValueError(f"`mesh` names the axis {name!r} twice in {spec!r}.")
        try:
            size = int(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"`mesh` axis {name!r} must have an integer size; got {value!r}.") from None
        if size == 0 or size < -1:
            raise ValueError(f"`mesh` axis {name!r} must be >= 1 or -1; got {size}.")
        out[name] = size
    return {"data": 1, "fsdp": 1, "model": 1} | out


def resolve_strategy(strategy: str, mesh: Mesh) -> str:
    """``"auto"`` → the strategy the mesh implies; other names are checked and returned."""
    if strategy == "auto":
        split = [name for name, axis in (("fsdp", "fsdp"), ("tensor", "model"))
                 if mesh.shape[axis] > 1]
        return "+".join(split) or "replicated"
    if strategy not in STRATEGIES:
        raise ValueError(f"`strategy` must be 'auto' or one of {STRATEGIES}; got {strategy!r}.")
    return strategy


class LayoutError(ValueError):
    """A mesh, strategy, ``grad_accum`` or global batch that does not fit the devices; the CLI
    reports it as a bad option (exit status 2)."""


class Parallel:
    """A device mesh and a parameter layout, with the pieces a training run needs.

    Build it with :meth:`create`. Attributes: ``mesh``, ``strategy`` (resolved), ``grad_accum``,
    ``state_sharding`` (after :meth:`create_state`).
    """

    def __init__(self, mesh: Mesh, strategy: str = "auto", *, grad_accum: int = 1,
                 min_fsdp_size: int = 2**12) -> None:
        if not isinstance(mesh, Mesh):
            raise TypeError(f"`mesh` must be a jax.sharding.Mesh; got {type(mesh).__name__}.")
        if tuple(mesh.axis_names) != AXES:
            raise ValueError(f"`mesh` must have the axes {AXES}; got {mesh.axis_names}.")
        check_positive_int(grad_accum, "grad_accum")
        self.mesh = mesh
        self.strategy = resolve_strategy(strategy, mesh)
        self.grad_accum = grad_accum
        self.min_fsdp_size = min_fsdp_size
        self.state_sharding: Any = None
        self._placer = BatchPlacer(mesh)  # the batch sharding and this process's rows, built once
        self.host_index, self.host_count = self._placer.index, self._placer.count

    @classmethod
    def create(cls, mesh: str | Mapping[str, int] | Mesh | None = None, strategy: str = "auto", *,
               grad_accum: int = 1, devices: Any = None, min_fsdp_size: int = 2**12) -> Parallel:
        """A ``Parallel`` over ``devices`` (default: every device of every process).

        First calls :func:`~seqjax.train.sharding.maybe_initialize_distributed`, so a multi-host
        job joins its peers before any device is looked at.
        """
        if not isinstance(mesh, Mesh):
            maybe_initialize_distributed()
            devs = list(jax.devices() if devices is None else devices)
            try:
                mesh = make_mesh(**parse_mesh(mesh), devices=devs)
            except ValueError as err:
                raise ValueError(f"`mesh` {mesh!r} does not fit the {len(devs)} visible devices "
                                 f"({jax.process_count()} process(es)): {err}") from None
        return cls(mesh, strategy, grad_accum=grad_accum, min_fsdp_size=min_fsdp_size)

    @classmethod
    def from_options(cls, opts: Any, **kwargs: Any) -> Parallel:
        """``create`` from an object with ``mesh``/``strategy``/``grad_accum`` (a ``Config``)."""
        kwargs.setdefault("min_fsdp_size", getattr(opts, "fsdp_min_size", 2**12))
        try:
            return cls.create(getattr(opts, "mesh", ""), getattr(opts, "strategy", "auto"),
                              grad_accum=getattr(opts, "grad_accum", 1), **kwargs)
        except LayoutError:
            raise
        except ValueError as err:  # a bad --mesh / --strategy / --grad_accum
            raise LayoutError(f"--mesh/--strategy/--grad_accum: {err}") from None

    # ------------------------------------------------------------------ sizes
    @property
    def num_devices(self) -> int:
        return int(self.mesh.devices.size)

    @property
    def batch_shards(self) -> int:
        """``|data| · |fsdp|``: the global batch must be a multiple of this."""
        return self.mesh.shape["data"] * self.mesh.shape["fsdp"]

    def check_batch_size(self, global_batch_size: int, name: str = "batch_size") -> None:
        """Raise :class:`LayoutError` unless ``data*fsdp*grad_accum`` divides the global batch."""
        need = self.batch_shards * self.grad_accum
        if global_batch_size < 1 or global_batch_size % need:
            raise LayoutError(
                f"`{name}` (the global batch) must be a positive multiple of "
                f"data*fsdp*grad_accum = {self.mesh.shape['data']}*{self.mesh.shape['fsdp']}*"
                f"{self.grad_accum} = {need}; got {global_batch_size}.")

    def round_batch_size(self, batch_size: int) -> int:
        """The smallest accepted global batch ``>= batch_size`` (e.g. 12 → 16 on 8 data devices)."""
        if batch_size < 1:
            raise LayoutError(f"`batch_size` must be >= 1; got {batch_size}.")
        need = self.batch_shards * self.grad_accum
        return -(-batch_size // need) * need

    def local_batch_size(self, global_batch_size: int, name: str = "batch_size") -> int:
        """Rows of each global batch (the option ``name``) this process feeds."""
        self.check_batch_size(global_batch_size, name)
        return global_batch_size // self.host_count

    def host_rows(self) -> dict[str, int]:
        """``{"host_index", "host_count"}`` for the :mod:`seqjax.data.iterators` iterators."""
        return {"host_index": self.host_index, "host_count": self.host_count}

    def __getattr__(self, name: str) -> Any:
        renamed = {"iterator_shard": "host_rows", "shard_index": "host_index",
                   "shard_count": "host_count"}.get(name)
        if renamed is not None:
            raise AttributeError(f"Parallel.{name} is renamed Parallel.{renamed}.")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ shardings
    def batch_sharding(self) -> NamedSharding:
        return self._placer.sharding

    def shardings(self, tree: Any) -> Any:
        """The strategy's ``NamedSharding`` for every leaf of ``tree`` (state or params)."""
        return tree_shardings(tree, self.mesh, self.strategy, min_fsdp_size=self.min_fsdp_size)

    def create_state(self, init_params: Callable[[jax.Array], Any],
                     tx: optax.GradientTransformation, rng: jax.Array, *,
                     carry: Any = None) -> TrainState:
        """A ``TrainState`` created directly in its sharded layout; remembers ``state_sharding``."""
        state, self.state_sharding = create_train_state(
            init_params, tx, rng, state_sharding_fn=self.shardings, carry=carry)
        return state

    def shard_state(self, state: TrainState) -> TrainState:
        """Lay out a state that is the same on every process; each device takes its piece."""
        self.state_sharding = self.shardings(state)
        host = host_value(state)  # also a state already sharded over other processes

        def put(x: Any, sharding: NamedSharding) -> Any:
            if not isinstance(x, np.ndarray | np.generic):
                return x
            x = np.asarray(x)
            return jax.make_array_from_callback(x.shape, sharding, lambda i: x[i])

        return jax.tree_util.tree_map(put, host, self.state_sharding)

    def gather(self, tree: Any) -> Any:
        """Numpy copies on every process (:func:`~seqjax.train.sharding.host_value`)."""
        return host_value(tree)

    def _state_sharding(self, state: Any) -> Any:
        if state is not None:
            return jax.tree_util.tree_map(lambda x: x.sharding, state)
        if self.state_sharding is None:
            raise ValueError("call `create_state` (or `shard_state`) first, or pass `state=`.")
        return self.state_sharding

    def train_step(self, loss_fn: Callable[..., Any], *, state: Any = None,
                   **kwargs: Any) -> Callable[..., Any]:
        """:func:`~seqjax.train.step.make_train_step` over this mesh for ``state``'s shardings
        (default: the last ``create_state``/``shard_state``'s)."""
        kwargs.setdefault("grad_accum", self.grad_accum)
        return make_train_step(loss_fn, state_sharding=self._state_sharding(state),
                               batch_sharding=self.batch_sharding(), **kwargs)

    def eval_step(self, eval_fn: Callable[..., Any], *, state: Any = None,
                  **kwargs: Any) -> Callable[..., Any]:
        """:func:`~seqjax.train.step.make_eval_step` over this mesh, laid out as ``state``'s."""
        return make_eval_step(eval_fn, params_sharding=self._state_sharding(state).params,
                              batch_sharding=self.batch_sharding(), **kwargs)

    # ------------------------------------------------------------------ input placement
    def place(self, batch: Any) -> Any:
        """This process's rows (block ``host_index`` of ``host_count``, an iterator built with
        :meth:`host_rows`) → global ``[global_batch, ...]`` arrays sharded over ``("data", "fsdp")``
        (:func:`~seqjax.train.sharding.shard_batch`). Use :meth:`place_global` when every process
        holds the whole batch."""
        return self._placer(batch)

    def place_global(self, batch: Any) -> Any:
        """A batch every process holds in full → global arrays (any mesh layout)."""
        return shard_global_batch(batch, self.mesh)

    # ------------------------------------------------------------------ record
    def describe(self) -> dict[str, Any]:
        """What ``fit`` writes to ``run.json``: devices, processes, mesh, strategy, device, jax."""
        return _layout(list(self.mesh.devices.flat), self.mesh.shape, self.strategy,
                       grad_accum=self.grad_accum)

    def __repr__(self) -> str:
        shape = ",".join(f"{k}={v}" for k, v in self.mesh.shape.items())
        dev = self.mesh.devices.flat[0]
        return (f"Parallel(mesh='{shape}', strategy={self.strategy!r}, "
                f"grad_accum={self.grad_accum}, devices={self.num_devices}x{dev.device_kind!r})")


def describe_state(state: Any) -> dict[str, Any]:
    """``run.json`` fields for a state built without :class:`Parallel` (its shardings)."""
    leaves = [x for x in jax.tree_util.tree_leaves(getattr(state, "params", state))
              if isinstance(x, jax.Array)]
    devices = list(set().union(*(x.sharding.device_set for x in leaves)) if leaves
                   else jax.devices()[:1])
    mesh = next((dict(x.sharding.mesh.shape) for x in leaves
                 if isinstance(x.sharding, NamedSharding)), {"data": len(devices)})
    return _layout(devices, mesh, None)


def _layout(devices: list[Any], mesh: Mapping[str, int], strategy: str | None,
            **extra: Any) -> dict[str, Any]:
    """The ``run.json`` fields of a layout over ``devices``."""
    return {"devices": len(devices), "processes": len({d.process_index for d in devices}),
            "mesh": {k: int(v) for k, v in mesh.items()}, "strategy": strategy, **extra,
            "device_kind": devices[0].device_kind, "platform": devices[0].platform,
            "jax": jax.__version__}

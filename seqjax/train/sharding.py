"""Device meshes, parameter-sharding rules, batch placement and multi-host start-up.

One mesh with three named axes serves every layout (docs/design.md, "The training path"):

* ``data`` — data parallelism: the batch is split, parameters replicated;
* ``fsdp`` — fully-sharded data parallelism (ZeRO-3): the batch is split *and* each
  parameter (and its optimiser state) along its largest axis divisible by the axis size;
* ``model`` — tensor parallelism (Megatron-LM, Shoeybi et al. 2019): q/k/v and MLP up/gate
  kernels split on their output axis, attention-out and MLP down on their input axis (one
  all-reduce per block), embeddings and output heads on the vocabulary axis; recurrent cells
  stay replicated (a split hidden state would need an all-gather every time step).

Parameters get logical axis names (:func:`logical_axes`, :data:`LOGICAL_AXIS_RULES`: regexes
over the path, first match wins), left-aligned after a scanned-layer axis, which is never
split. A strategy (``"replicated"``, ``"fsdp"``, ``"tensor"``, ``"fsdp+tensor"``) maps names
to mesh axes; an axis the mesh axis does not divide is replicated; optimiser state follows
its parameter's path. The batch is sharded over ``("data", "fsdp")`` on its leading axis.

On several hosts each process feeds the rows its devices hold (:func:`process_data_shard`;
processes sharing shards, ``model`` spanning processes, feed the same rows) and
:func:`shard_batch` assembles the global array (one host: a ``device_put``);
:func:`shard_global_batch` places a batch every process holds in full.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from seqjax.train.optim import path_to_str

__all__ = [
    "host_value", "AXES", "STRATEGIES", "LOGICAL_AXIS_RULES", "TENSOR_AXES", "logical_axes",
    "make_mesh", "partition_spec", "tree_shardings", "batch_sharding", "replicated",
    "shard_batch", "shard_global_batch", "host_batch_slice", "process_data_shard",
    "distributed_requested", "maybe_initialize_distributed",
]

AXES = ("data", "fsdp", "model")
STRATEGIES = ("replicated", "fsdp", "tensor", "fsdp+tensor")

# (regex over the lower-cased parameter path, logical names of the leaf's axes after any
# scanned-layer axis). Column-parallel layers name their output axis, row-parallel ones
# their input axis.
_COL = r"(query|key|value|q_proj|k_proj|v_proj|qkv|c_attn|wq|wk|wv|q|k|v)"
_ROW = r"(out|o_proj|out_proj|attn_out|c_proj|wo)"
_UP = r"(up|gate|up_proj|gate_proj|fc1|fc_in|wi|wi_0|wi_1|w1|w3|c_fc|dense_in|intermediate)"
_DOWN = r"(down|down_proj|fc2|fc_out|w2|dense_out)"
_MLP = r"(^|/)(mlp|ffn|feed_?forward|swiglu|geglu)[^/]*/"
LOGICAL_AXIS_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (rf"{_MLP}{_UP}/kernel$", ("embed", "mlp")),
    (rf"{_MLP}{_UP}/bias$", ("mlp",)),
    (rf"{_MLP}({_DOWN}|{_ROW})/kernel$", ("mlp", "embed")),
    (rf"(^|/){_COL}/kernel$", ("embed", "heads", "head_dim")),
    (rf"(^|/){_COL}/bias$", ("heads", "head_dim")),
    (rf"(^|/){_ROW}/kernel$", ("heads", "head_dim", "embed")),
    (r"(^|/)(token_embed|tok_embed|embed|wte|word_embeddings|embeddings?)/embedding$",
     ("vocab", "embed")),
    (r"(^|/)(output|lm_head|head|mlm_head|logits)/kernel$", ("embed", "vocab")),
    (r"(^|/)(output|lm_head|head|mlm_head|logits)/bias$", ("vocab",)),
    (r"(^|/)cell/(input|x_proj|w_ih)/kernel$", ("embed", "rnn")),
    (r"(^|/)cell/(recurrent_kernel|w_hh)$", ("rnn_in", "rnn")),
)
# What the "tensor" strategies' `model` axis splits; `rnn` stays replicated (see above).
TENSOR_AXES = ("heads", "mlp", "vocab")
# Paths with one leading, never split, layer axis (nn.scan, e.g. scan_layers=True).
SCANNED_LAYERS = (r"(^|/)layers/",)


def logical_axes(path: str, ndim: int, *,
                 rules: Sequence[tuple[str, tuple[str, ...]]] = LOGICAL_AXIS_RULES,
                 scanned: Sequence[str] = SCANNED_LAYERS) -> tuple[str | None, ...]:
    """The logical name of every axis of the parameter at ``path`` (``None`` = unnamed).

    Example:
        >>> logical_axes("decoder/layers/self_attn/query/kernel", 4)
        ('layers', 'embed', 'heads', 'head_dim')
    """
    name = path.lower()
    lead = min(sum(1 for pat in scanned if re.search(pat, name)), ndim)
    names = next((n for pattern, n in rules if re.search(pattern, name)), ())[: ndim - lead]
    return ("layers",) * lead + tuple(names) + (None,) * (ndim - lead - len(names))


def make_mesh(data: int = -1, fsdp: int = 1, model: int = 1, *,
              devices: Sequence[Any] | None = None) -> Mesh:
    """A ``Mesh`` with axes ``("data", "fsdp", "model")``; one size may be ``-1`` (the rest).

    ``jax.make_mesh`` (topology-aware on TPU) with ``Auto`` axis types, so shardings propagate
    through ``jax.jit``.

    Example:
        >>> mesh = make_mesh(devices=jax.devices()[:1])
        >>> dict(mesh.shape)
        {'data': 1, 'fsdp': 1, 'model': 1}
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, model]
    if sum(s == -1 for s in sizes) > 1:
        raise ValueError(f"at most one of data/fsdp/model may be -1; got {sizes}.")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh axis sizes must be positive or -1; got {sizes}.")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(
                f"{len(devices)} devices do not split into data/fsdp/model = {sizes}.")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"mesh data*fsdp*model = {sizes} = {math.prod(sizes)} must equal the number of "
            f"devices ({len(devices)}).")
    return jax.make_mesh(tuple(sizes), AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3,
                         devices=devices)


def replicated(mesh: Mesh) -> NamedSharding:
    """``NamedSharding(mesh, P())``: a full copy on every device."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over ``("data", "fsdp")``; other axes replicated."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))


def partition_spec(path: str, shape: Sequence[int], mesh: Mesh, strategy: str = "replicated", *,
                   rules: Sequence[tuple[str, tuple[str, ...]]] = LOGICAL_AXIS_RULES,
                   min_fsdp_size: int = 2**12) -> PartitionSpec:
    """The ``PartitionSpec`` of one parameter (or optimiser-state leaf) of ``shape`` at ``path``.

    From its :func:`logical_axes`: tensor parallel splits the first ``heads``/``mlp``/``vocab``
    axis over ``model`` if its size divides; FSDP splits the largest remaining, non-``layers``
    axis divisible by the ``fsdp`` size (leaves under ``min_fsdp_size`` stay replicated).

    Example:
        >>> mesh = make_mesh(devices=jax.devices()[:1])   # 8 devices: make_mesh(model=8)
        >>> tuple(partition_spec("attn/query/kernel", (8, 8), mesh, "tensor"))  # model size 1
        ()
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {STRATEGIES}; got {strategy!r}.")
    names = logical_axes(path, len(shape), rules=rules)
    spec: list[Any] = [None] * len(shape)
    if "tensor" in strategy and mesh.shape["model"] > 1:
        i = next((i for i, n in enumerate(names) if n in TENSOR_AXES), None)
        if i is not None and shape[i] % mesh.shape["model"] == 0:
            spec[i] = "model"
    if "fsdp" in strategy and mesh.shape["fsdp"] > 1 and math.prod(shape) >= min_fsdp_size:
        free = [i for i in range(len(shape)) if spec[i] is None and names[i] != "layers"
                and shape[i] % mesh.shape["fsdp"] == 0]
        if free:
            spec[max(free, key=lambda i: (shape[i], -i))] = "fsdp"
    while spec and spec[-1] is None:  # canonical form: P() for replicated
        spec.pop()
    return PartitionSpec(*spec)


def tree_shardings(tree: Any, mesh: Mesh, strategy: str = "replicated", *,
                   rules: Sequence[tuple[str, tuple[str, ...]]] = LOGICAL_AXIS_RULES,
                   min_fsdp_size: int = 2**12) -> Any:
    """``NamedSharding`` for every leaf of ``tree`` (params, optimiser state or a ``TrainState``,
    concrete or abstract); only floating leaves with ``ndim >= 1`` are sharded.

    Example:
        >>> import jax.numpy as jnp
        >>> mesh = make_mesh(devices=jax.devices()[:1])
        >>> tree_shardings({"w": jnp.ones((4, 4))}, mesh, "fsdp")["w"].is_fully_replicated
        True
    """

    def leaf_sharding(path: Sequence[Any], leaf: Any) -> NamedSharding:
        shape = tuple(np.shape(leaf))
        dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
        if not shape or not jnp.issubdtype(dtype, jnp.floating):
            return replicated(mesh)
        return NamedSharding(mesh, partition_spec(path_to_str(path), shape, mesh, strategy,
                                                  rules=rules, min_fsdp_size=min_fsdp_size))

    return jax.tree_util.tree_map_with_path(leaf_sharding, tree)


def process_data_shard(mesh: Mesh, process_index: int | None = None) -> tuple[int, int]:
    """``(index, count)``: this process feeds block ``index`` of ``count`` equal contiguous blocks
    of the global batch, per the batch sharding ``P(("data", "fsdp"))``.

    Device ``(i, j, k)`` holds batch shard ``i·|fsdp| + j`` of ``|data|·|fsdp|`` (``model``
    replicates the batch). Raises ``ValueError`` if a process's shards are not one aligned
    contiguous block or blocks are unequal.

    Example:
        >>> process_data_shard(make_mesh(devices=jax.devices()[:1]))
        (0, 1)
    """
    me = jax.process_index() if process_index is None else process_index
    fsdp = mesh.shape["fsdp"]
    num_shards = mesh.shape["data"] * fsdp
    held: dict[int, set[int]] = {}
    for (i, j, _k), dev in np.ndenumerate(mesh.devices):
        held.setdefault(dev.process_index, set()).add(i * fsdp + j)
    if me not in held:
        raise ValueError(f"process {me} has no device in the mesh {dict(mesh.shape)}.")
    blocks = {}
    for p, shards in sorted(held.items()):
        lo, m = min(shards), len(shards)
        if sorted(shards) != list(range(lo, lo + m)) or lo % m or num_shards % m:
            raise ValueError(
                f"mesh {dict(mesh.shape)}: process {p} holds batch shards {sorted(shards)} of "
                f"{num_shards}, not one aligned contiguous block, so a per-process data loader "
                "cannot feed it. Order the devices so each process's devices are adjacent on "
                "('data', 'fsdp') (jax.make_mesh does), or give every process the global batch "
                "(shard_global_batch).")
        blocks[p] = (lo // m, num_shards // m)
    if len({c for _, c in blocks.values()}) != 1:
        raise ValueError(
            f"mesh {dict(mesh.shape)}: processes hold unequal numbers of batch shards "
            f"{ {p: num_shards // c for p, (_, c) in blocks.items()} }; every process must "
            "feed the same number of rows.")
    return blocks[me]


def host_batch_slice(global_batch_size: int, mesh: Mesh | None = None) -> slice:
    """The rows of the global batch this process feeds (contiguous, equal per process).

    From ``mesh`` (:func:`process_data_shard`; right when ``model`` spans processes), else block
    ``i`` of ``n`` for process ``i`` of ``n``.

    Example:
        >>> host_batch_slice(8)   # one process: everything
        slice(0, 8, None)
    """
    i, n = (jax.process_index(), jax.process_count()) if mesh is None else process_data_shard(mesh)
    if global_batch_size % n:
        raise ValueError(
            f"global batch size {global_batch_size} must be divisible by the number of "
            f"row blocks ({n}: processes feeding different rows).")
    per = global_batch_size // n
    return slice(i * per, (i + 1) * per)


def _from_rows(x: Any, mesh: Mesh, sharding: NamedSharding, count: int = 1,
               index: int = 0) -> jax.Array:
    """The global ``[count * len(x), ...]`` array of which this process holds block ``index``
    of ``count`` (``x``)."""
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("batch leaves must have a leading batch axis; got a scalar.")
    rows, lo = x.shape[0] * count, x.shape[0] * index
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if rows % shards:
        raise ValueError(f"global batch size {rows} must be divisible by data*fsdp = {shards}.")
    if jax.process_count() == 1:  # every row is here
        return jax.device_put(x, sharding)

    def piece(index: tuple[slice, ...] | None) -> np.ndarray:
        assert index is not None  # jax passes every shard's index (typed Optional)
        start, stop, _ = index[0].indices(rows)
        if start < lo or stop > lo + x.shape[0]:
            raise ValueError(
                f"a device of this process needs rows [{start}, {stop}) of the global batch, "
                f"but this process holds rows [{lo}, {lo + x.shape[0]}).")
        return x[(slice(start - lo, stop - lo),) + index[1:]]

    return jax.make_array_from_callback((rows, *x.shape[1:]), sharding, piece)


class BatchPlacer:
    """:func:`shard_batch` for one mesh, sharding and block worked out once (``Parallel.place``)."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.index, self.count = process_data_shard(mesh)
        self.sharding = batch_sharding(mesh)

    def __call__(self, batch: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda x: _from_rows(x, self.mesh, self.sharding, self.count, self.index), batch)


def shard_batch(batch: Any, mesh: Mesh) -> Any:
    """Place this process's rows (a pytree of ``[b, ...]`` numpy arrays) of the global batch
    as global ``[b * count, ...]`` arrays (module docstring); for many batches build a
    :class:`BatchPlacer` once."""
    return BatchPlacer(mesh)(batch)


def shard_global_batch(batch: Any, mesh: Mesh) -> Any:
    """Place a global batch that *every* process holds in full; nothing crosses hosts."""
    sharding = batch_sharding(mesh)
    return jax.tree_util.tree_map(lambda x: _from_rows(x, mesh, sharding), batch)


_MULTIHOST_ENV = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")


def distributed_requested() -> bool:
    """Whether the environment says multi-process (:func:`maybe_initialize_distributed`)."""
    env = os.environ
    return (any(env.get(k) for k in (*_MULTIHOST_ENV, "MEGASCALE_COORDINATOR_ADDRESS"))
            or len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1
            or any(int(env.get(k) or 1) > 1 for k in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")))


def maybe_initialize_distributed() -> bool:
    """Call ``jax.distributed.initialize()`` when the environment says multi-host.

    Recognised: ``JAX_COORDINATOR_ADDRESS`` (with ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), a
    Cloud TPU pod slice (``TPU_WORKER_HOSTNAMES`` of several hosts, or
    ``MEGASCALE_COORDINATOR_ADDRESS``), SLURM (``SLURM_NTASKS > 1``) and Open MPI
    (``OMPI_COMM_WORLD_SIZE > 1``), the last three auto-detected by JAX. Must run before any
    other JAX call. True if initialised (now or before).
    """
    if jax.distributed.is_initialized():
        return True
    if not distributed_requested():
        return False
    env = os.environ
    kwargs: dict[str, Any] = {}
    addr = next((env[k] for k in _MULTIHOST_ENV if env.get(k)), None)
    if addr:  # explicit; otherwise JAX auto-detects the TPU pod / SLURM / MPI cluster
        kwargs["coordinator_address"] = addr
        for var, arg in (("JAX_NUM_PROCESSES", "num_processes"), ("JAX_PROCESS_ID", "process_id")):
            if env.get(var):
                kwargs[arg] = int(env[var])
    jax.distributed.initialize(**kwargs)
    return True


def host_value(tree: Any) -> Any:
    """Numpy copies of every array of ``tree``, on every process: seqjax's one host fetch.

    Addressable arrays are copied; a global array spanning processes is read from the first
    local shard if fully replicated, else all-gathered (a collective: every process must call).
    All transfers start before the first wait; ``np.asarray`` per array (cheaper than
    ``jax.device_get``).
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = []
    for x in leaves:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:
                x = x.addressable_data(0)
            else:
                from jax.experimental import multihost_utils

                x = np.asarray(multihost_utils.process_allgather(x, tiled=True))
        if isinstance(x, jax.Array):
            x.copy_to_host_async()
        arrays.append(x)
    return jax.tree_util.tree_unflatten(
        treedef, [np.asarray(x) if isinstance(x, jax.Array) else x for x in arrays])

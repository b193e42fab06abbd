"""Token corpora that live on the devices: training windows drawn inside the jitted step.

For a corpus that fits in device memory (Tiny Shakespeare, PTB: ~4 MB as int32),
:class:`DeviceLMWindows` uploads and checks the ids once, and
:meth:`~DeviceLMWindows.device_batch` draws step ``s``'s windows on the devices from
``(seed, s)`` alone: nanoGPT's ``get_batch`` (random ``block_size`` windows, targets shifted by
one) as a pure function of the step. So the batch of step ``s`` is the same on any number of
devices and hosts (the global batch is drawn; each device computes its rows under the step's
sharding), resuming is exact with the step as the position, and :func:`seqjax.train.loop.fit`
runs it through :meth:`seqjax.train.step.TrainStep.steps_from` (``FitConfig(steps_per_call=k)``)
with nothing crossing from the host.

The windows use JAX's random numbers, so the batches differ from
:class:`~seqjax.data.iterators.LMWindowIterator`'s for the same seed (same distribution: start
offsets uniform on ``[0, N − T − 1]``). :class:`DeviceStreamChunks` does the same for truncated
BPTT.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from seqjax._checks import check_positive_ints, check_vocab_ids
from seqjax.data.iterators import TBPTTIterator

__all__ = ["DeviceLMWindows", "DeviceStreamChunks"]


def _checked_ids(tokens_N: Any, vocab_size: int | None) -> np.ndarray:
    """``tokens_N`` as a 1-D integer array, its ids checked once against ``vocab_size``."""
    tokens = np.asarray(tokens_N)
    if tokens.ndim != 1:
        raise ValueError(f"`tokens_N` must be 1-D; got shape {tokens.shape}.")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"`tokens_N` must hold integer ids; got {tokens.dtype}.")
    if vocab_size is not None:
        check_vocab_ids(tokens, "tokens_N", int(vocab_size))
    return tokens


def _place(arrays: dict[str, np.ndarray], mesh: Mesh | None, spec: PartitionSpec) -> dict:
    """``arrays`` on the first local device, or laid out as ``spec`` over ``mesh``."""
    if mesh is None:
        return {k: jax.device_put(v, jax.local_devices()[0]) for k, v in arrays.items()}
    sharding = NamedSharding(mesh, spec)
    return {k: jax.make_array_from_callback(v.shape, sharding, v.__getitem__)
            for k, v in arrays.items()}


def _check_state(expect: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """``ValueError`` naming every key where ``state`` differs from ``expect``."""
    diff = {k: (v, state.get(k)) for k, v in expect.items() if state.get(k) != v}
    if diff:
        detail = ", ".join(f"{k}: expected {v!r}, got {g!r}" for k, (v, g) in diff.items())
        raise ValueError(f"`state` does not belong to this source ({detail}).")


class DeviceLMWindows:
    """Random ``block_size`` windows of a token stream held on the devices (see the module).

    Args:
        tokens_N: 1-D integer ids, longer than ``block_size`` (fewer than ``2**31``).
        batch_size: the *global* batch (rows drawn per step, over all devices and hosts).
        block_size: ``T``; each row is ``T + 1`` consecutive ids (inputs and targets).
        seed: the windows of step ``s`` depend on ``(seed, s)`` only.
        vocab_size: when given, every id is checked once, here, to lie in ``[0, vocab_size)``.
        mesh: replicate the ids on every device of ``mesh`` (every process passes the same
            ids); default: the first local device.

    Attributes:
        arrays: ``{"tokens": int32[N]}`` on the devices — what the jitted step receives.

    Example:
        >>> import numpy as np
        >>> src = DeviceLMWindows(np.arange(100), batch_size=2, block_size=8, seed=0)
        >>> b = src.device_batch(src.arrays, 3)
        >>> b["inputs"].shape, bool((b["targets"][:, :-1] == b["inputs"][:, 1:]).all())
        ((2, 8), True)
    """

    kind = "device_lm_windows"

    def __init__(self, tokens_N: Any, batch_size: int, block_size: int, *, seed: int = 0,
                 vocab_size: int | None = None, mesh: Mesh | None = None) -> None:
        check_positive_ints(batch_size=batch_size, block_size=block_size)
        tokens = _checked_ids(tokens_N, vocab_size)
        if len(tokens) <= block_size:
            raise ValueError(f"`tokens_N` must be longer than block_size={block_size}; "
                             f"got shape {tokens.shape}.")
        if len(tokens) >= 2**31:
            raise ValueError(f"`tokens_N` holds {len(tokens)} ids; at most 2**31 - 1 fit the "
                             "int32 offsets drawn on the device.")
        self.batch_size, self.block_size, self.seed = int(batch_size), int(block_size), seed
        self.num_tokens = len(tokens)
        self.arrays = _place({"tokens": tokens.astype(np.int32)}, mesh, PartitionSpec())

    def device_batch(self, arrays: Mapping[str, jax.Array], step: Any) -> dict[str, jax.Array]:
        """``{"inputs", "targets"}: int32[batch_size, block_size]`` of step ``step`` (traceable)."""
        key = jax.random.fold_in(jax.random.PRNGKey(self.seed), jnp.asarray(step, jnp.uint32))
        starts_B = jax.random.randint(key, (self.batch_size,), 0,
                                      self.num_tokens - self.block_size, dtype=jnp.int32)
        index_BxW = starts_B[:, None] + jnp.arange(self.block_size + 1, dtype=jnp.int32)
        window_BxW = jnp.take(arrays["tokens"], index_BxW, axis=0)
        return {"inputs": window_BxW[:, :-1], "targets": window_BxW[:, 1:]}

    def get_state(self) -> dict[str, Any]:
        """What a checkpoint records: the configuration (the position is the step)."""
        return {"kind": self.kind, "seed": int(self.seed), "global_batch_size": self.batch_size,
                "block_size": self.block_size, "num_tokens": self.num_tokens}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """``ValueError`` naming every difference unless ``state`` has this seed, batch, block
        and corpus size."""
        _check_state(self.get_state(), state)


class DeviceStreamChunks:
    """:class:`~seqjax.data.iterators.TBPTTIterator` on the devices: the same chunks in the same
    order (for a run started at step 0), read inside the jitted step.

    The ``N`` tokens are cut into ``B`` streams of ``L = (N − 1) // B`` tokens, targets shifted
    by one; step ``s`` reads chunk ``s mod C`` of every stream, ``C = L // seq_len``.
    ``device_batch`` returns ``{"inputs", "targets": int32[B, seq_len], "reset": bool[B]}``,
    ``reset`` True at each epoch's first chunk (the TBPTT loss zeroes the carry there).

    Args:
        tokens_N: 1-D integer ids.
        batch_size: ``B``, the global batch (number of streams).
        seq_len: the chunk length, ``1 ≤ seq_len ≤ L``.
        vocab_size: when given, every id is checked once, here.
        mesh: split the streams by rows over ``("data", "fsdp")`` of ``mesh`` (``B`` must divide;
            every process passes all the tokens); default: the first local device.

    Example:
        >>> import numpy as np
        >>> src = DeviceStreamChunks(np.arange(15), batch_size=2, seq_len=3)
        >>> b = src.device_batch(src.arrays, 1)
        >>> b["inputs"].tolist(), b["targets"].tolist(), b["reset"].tolist()
        ([[3, 4, 5], [10, 11, 12]], [[4, 5, 6], [11, 12, 13]], [False, False])
    """

    kind = "device_stream_chunks"

    def __init__(self, tokens_N: Any, batch_size: int, seq_len: int, *,
                 vocab_size: int | None = None, mesh: Mesh | None = None) -> None:
        host = TBPTTIterator(_checked_ids(tokens_N, vocab_size), batch_size, seq_len)  # its rows
        self.batch_size, self.seq_len, self.length = int(batch_size), int(seq_len), host.x.shape[1]
        self.num_tokens, self.chunks_per_epoch = host.num_tokens, host.steps_per_epoch
        g = self.batch_size
        shards = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
        if g % shards:
            raise ValueError(f"`batch_size` ({g} streams) must divide over data*fsdp = "
                             f"{shards} devices.")
        self.arrays = _place({"inputs": host.x, "targets": host.y}, mesh,
                             PartitionSpec(("data", "fsdp"), None))

    def device_batch(self, arrays: Mapping[str, jax.Array], step: Any) -> dict[str, jax.Array]:
        """The chunk of step ``step`` (traceable)."""
        k = self.seq_len
        chunk = jnp.asarray(step, jnp.int32) % self.chunks_per_epoch
        out = {key: jax.lax.dynamic_slice_in_dim(arrays[key], chunk * k, k, axis=1)
               for key in ("inputs", "targets")}
        out["reset"] = jnp.broadcast_to(chunk == 0, (self.batch_size,))
        return out

    def get_state(self) -> dict[str, Any]:
        """The configuration (the position is the step)."""
        return {"kind": self.kind, "global_batch_size": self.batch_size,
                "seq_len": self.seq_len, "num_tokens": int(self.num_tokens)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """``ValueError`` naming every difference unless ``state`` was written for this source."""
        _check_state(self.get_state(), state)

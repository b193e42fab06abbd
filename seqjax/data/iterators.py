r"""Resumable, host-sharded batch iterators: one family, one ``get_state``/``set_state``.

Each iterator yields dicts of numpy arrays and is a :class:`ResumableIterator`: ``get_state()``
is a small JSON-able dict (kind, configuration, position in the *global* stream) that
:func:`seqjax.train.fit` saves with every checkpoint and gives back to ``set_state`` on resume,
with no replay of consumed batches.

* :class:`LMWindowIterator`: random windows of a token stream (nanoGPT's ``get_batch``), targets
  shifted by one (J&M (9.9), teacher forcing §9.3: ``inputs_t = w_{i+t}``,
  ``targets_t = w_{i+t+1}``);
* :class:`TBPTTIterator`: ``G`` contiguous streams cut into consecutive chunks of ``T`` tokens, so
  an RNN carries its state across batches while gradients stop at the chunk boundary (truncated
  BPTT, MEDL §7.2 and (7.13); J&M §9.2.2): chunk ``s`` of row ``g`` is
  ``w_{gL + sT : gL + (s+1)T}``, ``L = \lfloor (N-1)/G \rfloor``;
* :class:`ArrayIterator` (shuffled fixed-shape arrays), :class:`BatchIterator` (variable-length
  sequences right-padded per batch, :func:`seqjax.data.batching.pad_batch`).

**Hosts.** With ``host_index``/``host_count`` each host gets its own rows of the same global
batch (``count`` hosts see what one host with a ``count``-times larger batch would); without them
an iterator yields the whole global batch. The rows a process feeds depend on the device mesh,
not ``jax.process_index()``: take them from :meth:`seqjax.train.parallel.Parallel.host_rows`.
The state records the global batch size, so a run resumes on another number of hosts; older
states (``batch_size`` + ``shard_count``, or the former ``seqjax.train.ArrayIterator``'s
``{"epoch", "index"}``) are accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from seqjax._checks import check_positive_ints, renamed_keywords
from seqjax.data.batching import _leading_dim, _prefix, bucket_batches, pad_batch

__all__ = [
    "host_index_and_count",
    "ResumableIterator",
    "TBPTTIterator",
    "ArrayIterator",
    "BatchIterator",
]


#: The keywords of a host's rows before "shard" kept one meaning (token files).
HOST_RENAMES = {"shard_index": "host_index", "shard_count": "host_count"}
_RETIRED = {"host_shard": "host_index_and_count"}


# ----------------------------------------------------------------------------- hosts
def host_index_and_count(index: int | None = None, count: int | None = None) -> tuple[int, int]:
    """``(index, count)`` of this host: the arguments, else ``jax.process_index/count()``."""
    if index is None or count is None:
        import jax

        index = jax.process_index() if index is None else index
        count = jax.process_count() if count is None else count
    if count < 1 or not 0 <= index < count:
        raise ValueError(
            f"`host_index` must lie in [0, host_count) and `host_count` >= 1; "
            f"got host_index={index}, host_count={count}."
        )
    return int(index), int(count)


def _iterator_host(index: int | None, count: int | None) -> tuple[int, int]:
    """``(host_index, host_count)``: ``(0, 1)`` (the whole global batch) unless both are given."""
    if index is None and count is None:
        return 0, 1
    if index is None or count is None:
        raise ValueError(
            f"give both `host_index` and `host_count`, or neither; got host_index={index}, "
            f"host_count={count}."
        )
    return host_index_and_count(index, count)


# ----------------------------------------------------------------------------- the family
class ResumableIterator(Iterator[dict[str, np.ndarray]]):
    """An iterator of batches whose position is a small JSON-able dict.

    ``get_state()`` returns ``{"kind", <configuration>, <position>}``; ``set_state(state)`` checks
    that ``state`` has the same kind and configuration (a ``ValueError`` naming every difference)
    and continues exactly there. Subclasses set ``kind`` and define ``_config`` (what must
    match), ``_position``/``_set_position`` (where the stream is; default: none) and ``__next__``.
    """

    kind = ""

    def _config(self) -> dict[str, Any]:
        return {}

    def _position(self) -> dict[str, int]:
        return {}

    def _set_position(self, position: dict[str, int]) -> None:
        del position

    def _upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A state written by an older version, in today's keys."""
        if "global_batch_size" not in state and "batch_size" in state:
            state["global_batch_size"] = int(state["batch_size"]) * int(
                state.get("shard_count", 1))
        return state

    def get_state(self) -> dict[str, Any]:
        """JSON-able dict that :meth:`set_state` accepts; save it with each checkpoint."""
        state = {"kind": self.kind, **self._config(), **self._position()}
        # numpy scalars (e.g. a seed given as np.int64) become plain Python values
        return {k: v.item() if isinstance(v, np.generic) else v for k, v in state.items()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where the iterator that produced ``state`` was (on any number of
        processes, as long as the global batch is the same)."""
        state = self.check_state(state)
        self._set_position({k: int(state[k]) for k in self._position()})

    def check_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` in today's keys if :meth:`set_state` would accept it, else ``ValueError``
        naming what differs (``TypeError``: not a dict)."""
        if not isinstance(state, Mapping):
            raise TypeError(
                f"`state` must be a dict from get_state(); got {type(state).__name__}."
            )
        state = self._upgrade_state(dict(state))
        expect = {"kind": self.kind, **self._config()}
        missing = [k for k in (*expect, *self._position()) if k not in state]
        if missing:
            raise ValueError(f"`state` lacks the keys {missing}; got {sorted(state)}.")
        diff = {k: (v, state[k]) for k, v in expect.items() if state[k] != v}
        if diff:
            detail = ", ".join(f"{k}: expected {v!r}, got {g!r}" for k, (v, g) in diff.items())
            raise ValueError(f"`state` does not belong to this iterator ({detail}).")
        return state

    def __iter__(self) -> ResumableIterator:
        return self


class _EpochStep(ResumableIterator):
    """A stream whose position is the pair ``(epoch, step)`` of its attributes."""

    epoch: int
    step: int

    def _position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def _set_position(self, position: dict[str, int]) -> None:
        self.epoch, self.step = position["epoch"], position["step"]


class TBPTTIterator(_EpochStep):
    """Contiguous streams for truncated back-propagation through time.

    The stream is cut into ``G = batch_size * host_count`` rows
    (``tokens[:G*L].reshape(G, L)``, ``L = (N - 1) // G``); step ``s`` of an epoch yields
    columns ``[s*T, (s+1)*T)`` of this host's rows, so one batch's final carry is the next
    one's initial carry. An epoch has ``L // T`` steps; a tail short of a chunk is dropped.
    Yields ``{"inputs": int32[B, T], "targets": int32[B, T], "reset": bool[B]}``, ``reset``
    True on an epoch's first step (start from a zero carry).

    Example:
        >>> it = TBPTTIterator(np.arange(21), batch_size=2, seq_len=4)
        >>> [next(it)["inputs"].tolist() for _ in range(2)]
        [[[0, 1, 2, 3], [10, 11, 12, 13]], [[4, 5, 6, 7], [14, 15, 16, 17]]]
    """

    kind = "tbptt"

    @renamed_keywords(**HOST_RENAMES)
    def __init__(self, tokens_N: np.ndarray, batch_size: int, seq_len: int, *,
                 num_epochs: int | None = None, host_index: int | None = None,
                 host_count: int | None = None):
        check_positive_ints(batch_size=batch_size, seq_len=seq_len)
        tokens = np.asarray(tokens_N)
        self.host_index, self.host_count = _iterator_host(host_index, host_count)
        g = batch_size * self.host_count
        if tokens.ndim != 1:
            raise ValueError(f"`tokens_N` must be 1-D; got shape {tokens.shape}.")
        stream = (len(tokens) - 1) // g
        if stream < seq_len:
            raise ValueError(
                f"`tokens_N` has {len(tokens)} tokens: too few for {g} streams of at least "
                f"seq_len={seq_len} (+1 for the targets)."
            )
        rows = slice(self.host_index * batch_size, (self.host_index + 1) * batch_size)
        self.x = tokens[: g * stream].reshape(g, stream)[rows].astype(np.int32)
        self.y = tokens[1 : g * stream + 1].reshape(g, stream)[rows].astype(np.int32)
        self.batch_size, self.seq_len, self.num_epochs = batch_size, seq_len, num_epochs
        self.steps_per_epoch = stream // seq_len
        self.num_tokens = len(tokens)
        self.epoch = self.step = 0

    def _config(self) -> dict[str, Any]:
        return {"global_batch_size": self.batch_size * self.host_count,
                "seq_len": self.seq_len, "num_tokens": self.num_tokens}

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_epochs is not None and self.epoch >= self.num_epochs:
            raise StopIteration
        cols = slice(self.step * self.seq_len, (self.step + 1) * self.seq_len)
        out = {
            "inputs": self.x[:, cols],
            "targets": self.y[:, cols],
            "reset": np.full((self.batch_size,), self.step == 0),
        }
        self.step += 1
        if self.step == self.steps_per_epoch:
            self.epoch, self.step = self.epoch + 1, 0
        return out


class _EpochIterator(_EpochStep):
    """Epochs of global batches; batch order a pure function of ``(seed, epoch)``."""

    def __init__(self, num_examples: int, batch_size: int, *, shuffle: bool, seed: int,
                 drop_remainder: bool, num_epochs: int | None, host_index: int | None,
                 host_count: int | None):
        check_positive_ints(batch_size=batch_size)
        self.host_index, self.host_count = _iterator_host(host_index, host_count)
        if self.host_count > 1 and not drop_remainder:
            raise ValueError(
                "`drop_remainder` must be True with several hosts (host_count="
                f"{self.host_count}): every host needs a full batch at every step."
            )
        self.num_examples, self.batch_size = num_examples, batch_size
        self.global_batch = batch_size * self.host_count
        if drop_remainder and num_examples < self.global_batch:
            raise ValueError(
                f"{num_examples} examples cannot fill one global batch of {self.global_batch} "
                f"(batch_size={batch_size} x host_count={self.host_count})."
            )
        self.shuffle, self.seed, self.drop_remainder = shuffle, seed, drop_remainder
        self.num_epochs = num_epochs
        self.epoch = self.step = 0
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def _epoch_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        order = (rng.permutation if self.shuffle else np.arange)(self.num_examples)
        g = self.global_batch
        stop = (len(order) // g) * g if self.drop_remainder else len(order)
        return [order[s : s + g] for s in range(0, stop, g)]

    def batches(self, epoch: int) -> list[np.ndarray]:
        """The global batches (index arrays) of ``epoch``."""
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self._epoch_batches(np.random.default_rng([self.seed, epoch])))
        return self._cache[1]

    @property
    def steps_per_epoch(self) -> int:
        return len(self.batches(self.epoch))

    def _config(self) -> dict[str, Any]:
        return {"seed": self.seed, "global_batch_size": self.global_batch,
                "shuffle": self.shuffle, "num_examples": self.num_examples}

    def _set_position(self, position: dict[str, int]) -> None:
        super()._set_position(position)
        if self.step >= len(self.batches(self.epoch)):  # saved right after an epoch's last batch
            self.epoch, self.step = self.epoch + 1, 0

    def _next_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """``(global_indices, host_indices)`` of the next batch; advances the position."""
        if self.num_epochs is not None and self.epoch >= self.num_epochs:
            raise StopIteration
        batches = self.batches(self.epoch)
        glob = batches[self.step]
        lo = self.host_index * self.batch_size
        self.step += 1
        if self.step >= len(batches):
            self.epoch, self.step = self.epoch + 1, 0
        return glob, glob[lo : lo + self.batch_size]


class ArrayIterator(_EpochIterator):
    """Shuffled batches of fixed-shape arrays (packed rows, synthetic tasks), resumable.

    ``arrays`` share their leading dimension ``N``; each step yields the same keys with leading
    dimension ``batch_size`` (this host's rows). Epoch ``e``'s order is
    ``default_rng([seed, e]).permutation(N)``.

    Example:
        >>> it = ArrayIterator({"x": np.arange(10)}, batch_size=4, shuffle=False)
        >>> [next(it)["x"].tolist() for _ in range(3)]
        [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    """

    kind = "arrays"

    @renamed_keywords(**HOST_RENAMES)
    def __init__(self, arrays: Mapping[str, np.ndarray], batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, drop_remainder: bool = True, num_epochs: int | None = None,
                 host_index: int | None = None, host_count: int | None = None):
        self.arrays = {k: np.asarray(v) for k, v in arrays.items()}
        super().__init__(
            _leading_dim(self.arrays), batch_size, shuffle=shuffle, seed=seed,
            drop_remainder=drop_remainder, num_epochs=num_epochs,
            host_index=host_index, host_count=host_count,
        )

    def _upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        # ``{"epoch", "index"}`` of the former seqjax.train.ArrayIterator: the same batches in
        # the same order (it took the global batch size), but no configuration to check.
        if "kind" not in state and "step" not in state and {"epoch", "index"} <= set(state):
            return {**self.get_state(), "epoch": int(state["epoch"]), "step": int(state["index"])}
        return super()._upgrade_state(state)

    def __next__(self) -> dict[str, np.ndarray]:
        _, idx = self._next_indices()
        return {k: v[idx] for k, v in self.arrays.items()}


class BatchIterator(_EpochIterator):
    """Padded batches of variable-length token sequences, optionally length-bucketed.

    ``data`` is a ``datasets.Dataset`` (columns ``columns``, e.g. ``("ids",)`` or
    ``("src_ids", "tgt_ids")``), a mapping ``{column: list of sequences}``, or a list of
    sequences (one column ``"ids"``). Each column ``c`` yields ``c: int32[B, T_c]``,
    ``<p>lengths: int32[B]`` and ``<p>mask: bool[B, T_c]`` (``<p>`` = ``""`` for ``"ids"``,
    ``"src_"`` for ``"src_ids"``). ``T_c`` is ``pad_to_length`` if given (a longer example
    raises), else the longest ``c`` in the *global* batch rounded up to ``pad_to_multiple``, so
    all hosts get the same shapes. ``bucket=True`` groups similar lengths
    (:func:`bucket_batches`, per epoch from ``(seed, epoch)``).

    Example:
        >>> it = BatchIterator([[1], [2, 3], [4, 5, 6], [7]], batch_size=2, shuffle=False)
        >>> b = next(it)
        >>> b["ids"].tolist(), b["lengths"].tolist(), b["mask"].tolist()
        ([[1, 0], [2, 3]], [1, 2], [[True, False], [True, True]])
    """

    kind = "padded"

    @renamed_keywords(**HOST_RENAMES)
    def __init__(self, data: Any, batch_size: int, *, columns: Sequence[str] = ("ids",),
                 pad_id: int = 0, pad_to_multiple: int = 1, pad_to_length: int | None = None,
                 bucket: bool = False, bucket_window: int = 50, shuffle: bool = True, seed: int = 0,
                 drop_remainder: bool = True, num_epochs: int | None = None,
                 host_index: int | None = None, host_count: int | None = None):
        self.columns = tuple(columns)
        self._get: Callable[[np.ndarray], dict[str, list[Any]]]
        is_dataset = hasattr(data, "column_names") and hasattr(data, "select")  # datasets.Dataset
        if not is_dataset and not isinstance(data, Mapping):
            data, self.columns = {"ids": list(data)}, ("ids",)
        names = list(data.column_names if is_dataset else data)
        missing = [c for c in self.columns if c not in names]
        if missing:
            where = "in the dataset; columns:" if is_dataset else "keys of `data`:"
            raise ValueError(f"`columns` {missing} are not {where} {names}.")
        if is_dataset:
            ds = data.select_columns(list(self.columns))
            self._get = lambda idx: ds[idx.tolist()]
            table = {c: ds[c][:] for c in self.columns}
        else:
            table = dict(data)
            self._get = lambda idx: {c: [table[c][i] for i in idx] for c in self.columns}
        self.lengths = {c: np.array([len(s) for s in table[c]]) for c in self.columns}
        n = {c: len(v) for c, v in self.lengths.items()}
        if len(set(n.values())) != 1:
            raise ValueError(f"`columns` must have equally many examples; got {n}.")
        for c, ls in self.lengths.items():
            if pad_to_length is not None and len(ls) and ls.max() > pad_to_length:
                i = int(ls.argmax())
                raise ValueError(
                    f"example {i} of column {c!r} has length {int(ls[i])}, longer than "
                    f"`pad_to_length`={pad_to_length}; truncate when tokenising.")
        self.pad_id, self.pad_to_multiple, self.pad_to_length = pad_id, pad_to_multiple, \
            pad_to_length
        self.bucket, self.bucket_window = bucket, bucket_window
        super().__init__(
            next(iter(n.values())), batch_size, shuffle=shuffle, seed=seed,
            drop_remainder=drop_remainder, num_epochs=num_epochs,
            host_index=host_index, host_count=host_count,
        )

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "bucket": self.bucket}

    def _epoch_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        if not self.bucket:
            return super()._epoch_batches(rng)
        longest = np.max(np.stack(list(self.lengths.values())), axis=0)
        return bucket_batches(longest, self.global_batch, rng=rng, window=self.bucket_window,
                              drop_remainder=self.drop_remainder)

    def __next__(self) -> dict[str, np.ndarray]:
        glob, idx = self._next_indices()
        rows = self._get(idx)
        out: dict[str, np.ndarray] = {}
        for c in self.columns:
            length = self.pad_to_length
            if length is None:  # the global batch's longest: every host gets the same shape
                m = max(1, self.pad_to_multiple)
                length = -(-int(self.lengths[c][glob].max(initial=0)) // m) * m
            b = pad_batch(rows[c], pad_id=self.pad_id, length=length)
            p = _prefix(c)
            out[c], out[p + "lengths"], out[p + "mask"] = b["ids"], b["lengths"], b["mask"]
        return out


def __getattr__(name: str) -> Any:
    # LMWindowIterator is ShardWindows over one array (seqjax.data.shard_windows, which
    # imports this module): read from there on first use.
    if name == "LMWindowIterator":
        from seqjax.data.shard_windows import LMWindowIterator

        return LMWindowIterator
    if name in _RETIRED:
        raise ImportError(f"seqjax.data.iterators.{name} was renamed {_RETIRED[name]}.")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

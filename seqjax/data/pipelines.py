"""Text in, batches out: Hugging Face ``datasets`` loading, tokenisation, batching, packing.

The stages, each usable alone:

1. **Load** — :func:`load_text` / :func:`load_parallel` read a local file (or
   pair of files) or a hub dataset into a ``datasets.Dataset`` with a ``text``
   column, or ``src``/``tgt`` columns for translation pairs.
2. **Tokenise** — :func:`tokenize_dataset` runs a seqjax tokenizer through
   ``Dataset.map(batched=True)``, adding ``ids``, ``length`` and ``num_unk``.
3. **Split** — :func:`split_dataset` (seeded, shuffled), :func:`split_text`
   (contiguous, nanoGPT's 90/10) and :func:`split_arrays`.
4. **Batch** — resumable iterators whose ``state()`` is a small JSON-able dict
   saved with each checkpoint and given back to ``restore``:

   * :class:`LMWindowIterator` — random windows of a token stream (nanoGPT's
     ``get_batch``), targets shifted by one (J&M (9.15)–(9.16) teacher forcing);
   * :class:`TBPTTIterator` — ``B`` contiguous streams cut into consecutive
     chunks, so an RNN carries its state across batches (truncated BPTT,
     MEDL §7.2; J&M §9.2.2);
   * :class:`BatchIterator` — variable-length sequences padded per batch, with
     optional length bucketing to waste less padding;
   * :class:`ArrayIterator` — fixed-shape arrays (packed rows, synthetic tasks).

   Every iterator can shard by host: with ``shard_index``/``shard_count`` each host
   gets its own rows of the same global batch, so ``count`` hosts together see
   exactly what one host with a ``count``-times larger batch would. Without them an
   iterator yields the whole global batch. Which rows a process must feed depends on
   the device mesh, not on ``jax.process_index()`` (processes that share batch shards
   feed the same rows): take them from
   :meth:`seqjax.train.parallel.Parallel.iterator_shard`. The saved state describes
   the global stream, so a run resumes on another number of hosts.
5. **Pack** — :func:`pack_sequences` puts several short sequences in one row
   with segment ids; :func:`packed_attention_mask` keeps attention inside a
   segment and the ``resets`` flags tell an RNN where to zero its carry.

Conventions (DESIGN.md): arrays are numpy, batch-major, ids ``int32``, masks
``bool`` with ``True`` = real token / keep, lengths ``int32`` with right padding.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import datasets

    from seqjax.data.tokenizers import Tokenizer

__all__ = [
    "host_shard",
    "load_text",
    "load_parallel",
    "tokenize_dataset",
    "split_dataset",
    "split_text",
    "split_arrays",
    "shard_dataset",
    "random_windows",
    "pad_batch",
    "bucket_batches",
    "pack_sequences",
    "packed_lm_targets",
    "packed_attention_mask",
    "LMWindowIterator",
    "TBPTTIterator",
    "BatchIterator",
    "ArrayIterator",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
SampleBy = Literal["line", "paragraph", "document"]


# ----------------------------------------------------------------------------- hosts
def host_shard(index: int | None = None, count: int | None = None) -> tuple[int, int]:
    """``(index, count)`` of this host: the arguments, else ``jax.process_index/count()``."""
    if index is None or count is None:
        import jax

        index = jax.process_index() if index is None else index
        count = jax.process_count() if count is None else count
    if count < 1 or not 0 <= index < count:
        raise ValueError(
            f"`shard_index` must lie in [0, shard_count) and `shard_count` >= 1; "
            f"got shard_index={index}, shard_count={count}."
        )
    return int(index), int(count)


def _iterator_shard(index: int | None, count: int | None) -> tuple[int, int]:
    """An iterator's ``(shard_index, shard_count)``: ``(0, 1)`` (the whole global batch)
    unless given; multi-process runs pass the mesh's (``Parallel.iterator_shard()``)."""
    if index is None and count is None:
        return 0, 1
    if index is None or count is None:
        raise ValueError(
            f"give both `shard_index` and `shard_count`, or neither; got shard_index={index}, "
            f"shard_count={count}."
        )
    return host_shard(index, count)


def shard_dataset(
    ds: datasets.Dataset, index: int | None = None, count: int | None = None
) -> datasets.Dataset:
    """This host's contiguous ``1/count`` of ``ds`` (``Dataset.shard``; defaults from jax)."""
    index, count = host_shard(index, count)
    return ds.shard(num_shards=count, index=index, contiguous=True)


# ----------------------------------------------------------------------------- loading
def _datasets():
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - a core dependency
        raise ImportError("Hugging Face `datasets` is required: pip install datasets") from e
    return datasets


def _looks_local(path_or_name: PathLike) -> bool:
    s = str(path_or_name)
    return (
        Path(s).exists()
        or s.startswith((".", "/", "~"))
        or Path(s).suffix in (".txt", ".tsv", ".csv", ".json", ".jsonl")
    )


def _read_local(path: Path) -> str:
    if not path.exists():
        raise FileNotFoundError(
            f"`path_or_name` {str(path)!r} does not exist; give an existing file/folder or a "
            "Hugging Face hub dataset name."
        )
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".txt")
        if not files:
            raise FileNotFoundError(f"folder {str(path)!r} contains no .txt files.")
        return "\n".join(p.read_text(encoding="utf-8") for p in files)
    return path.read_text(encoding="utf-8")


def _samples(text: str, sample_by: SampleBy) -> list[str]:
    if sample_by == "line":
        return text.splitlines()
    if sample_by == "paragraph":
        return re.split(r"\n\s*\n", text)
    if sample_by == "document":
        return [text]
    raise ValueError(f"`sample_by` must be 'line', 'paragraph' or 'document'; got {sample_by!r}.")


def _drop_empty(texts: list[str], what: str) -> list[str]:
    kept = [t for t in texts if t.strip()]
    if len(kept) != len(texts):
        logger.info("%s: dropped %d empty examples", what, len(texts) - len(kept))
    return kept


def load_text(
    path_or_name: PathLike,
    *,
    sample_by: SampleBy | None = None,
    skip_empty: bool = True,
    split: str = "train",
    name: str | None = None,
    text_field: str = "text",
    **load_kwargs: Any,
) -> datasets.Dataset:
    """A ``Dataset`` with one ``text`` column, from a local file/folder or a hub dataset.

    Local files are read as UTF-8 (a folder: its ``*.txt`` files, sorted) and
    cut by ``sample_by``: ``"line"`` (default), ``"paragraph"`` (blank-line
    separated) or ``"document"`` (the whole text, one example — what a character
    LM wants). A hub dataset (``datasets.load_dataset(path_or_name, name,
    split=split)``, needs a network) keeps its rows unless ``sample_by`` is
    given; its ``text_field`` column becomes ``text``.

    ``skip_empty`` drops empty and white-space-only examples (logged); with
    ``skip_empty=False`` they stay and tokenise to length 0.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "t.txt")
        >>> _ = open(p, "w").write("to be\\n\\nor not\\n")
        >>> list(load_text(p)["text"])
        ['to be', 'or not']
    """
    ds_lib = _datasets()
    where = str(path_or_name)
    if _looks_local(path_or_name):
        texts = _samples(_read_local(Path(path_or_name).expanduser()), sample_by or "line")
        if skip_empty:
            texts = _drop_empty(texts, where)
        return ds_lib.Dataset.from_dict({"text": texts})
    ds = ds_lib.load_dataset(where, name, split=split, **load_kwargs)
    if text_field not in ds.column_names:
        raise ValueError(
            f"hub dataset {where!r} has no column `text_field`={text_field!r}; "
            f"columns: {ds.column_names}."
        )
    ds = ds.select_columns([text_field])
    if text_field != "text":
        ds = ds.rename_column(text_field, "text")
    if sample_by == "document":
        ds = ds_lib.Dataset.from_dict({"text": ["\n".join(ds["text"][:])]})
    elif sample_by is not None:
        ds = ds.map(
            lambda b: {"text": [s for t in b["text"] for s in _samples(t, sample_by)]},
            batched=True,
            remove_columns=["text"],
        )
    if skip_empty:
        ds = ds.filter(lambda b: [bool(t.strip()) for t in b["text"]], batched=True)
    return ds


def load_parallel(
    path_or_name: PathLike | tuple[PathLike, PathLike],
    *,
    sep: str = "\t",
    columns: tuple[int, int] = (0, 1),
    skip_empty: bool = True,
    on_bad_line: Literal["error", "skip"] = "error",
    split: str = "train",
    name: str | None = None,
    src_lang: str = "en",
    tgt_lang: str = "fr",
    src_field: str = "src",
    tgt_field: str = "tgt",
    **load_kwargs: Any,
) -> datasets.Dataset:
    """A ``Dataset`` of sentence pairs with columns ``src`` and ``tgt``.

    Sources:

    * one local file of ``sep``-separated lines (Tatoeba/Anki ``fra.txt``:
      ``English<TAB>French[<TAB>attribution]``); ``columns`` picks the fields.
      A line with too few fields raises ``ValueError`` naming file and line,
      or is skipped with ``on_bad_line="skip"``;
    * a pair of line-aligned local files ``(src_path, tgt_path)``; files with
      different numbers of lines raise ``ValueError`` naming both counts;
    * a hub dataset: a ``translation`` column of ``{lang: text}`` dicts (e.g.
      ``opus_books``, ``name="en-fr"``; picks ``src_lang``/``tgt_lang``) or
      the columns ``src_field`` and ``tgt_field``.

    ``skip_empty`` drops pairs where either side is empty.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "p.txt")
        >>> _ = open(p, "w").write("Go.\\tVa !\\nHi.\\tSalut !\\n")
        >>> load_parallel(p)[1]
        {'src': 'Hi.', 'tgt': 'Salut !'}
    """
    ds_lib = _datasets()
    if isinstance(path_or_name, tuple | list):
        if len(path_or_name) != 2:
            raise ValueError(
                f"`path_or_name` as files must be (src_path, tgt_path); got {len(path_or_name)}."
            )
        a, b = (Path(p).expanduser() for p in path_or_name)
        src, tgt = _read_local(a).splitlines(), _read_local(b).splitlines()
        if len(src) != len(tgt):
            raise ValueError(
                f"pair files must have the same number of lines: {str(a)!r} has {len(src)}, "
                f"{str(b)!r} has {len(tgt)}."
            )
        pairs = list(zip(src, tgt))
    elif _looks_local(path_or_name):
        path = Path(path_or_name).expanduser()
        need = max(columns) + 1
        pairs = []
        for n, line in enumerate(_read_local(path).splitlines(), start=1):
            if not line.strip() and skip_empty:
                continue
            parts = line.split(sep)
            if len(parts) < need:
                if on_bad_line == "skip":
                    logger.info("%s:%d: skipped line with %d fields", path, n, len(parts))
                    continue
                raise ValueError(
                    f"{str(path)!r} line {n} has {len(parts)} field(s) separated by {sep!r}, "
                    f"need at least {need}: {line[:60]!r} (pass on_bad_line='skip' to skip)."
                )
            pairs.append((parts[columns[0]], parts[columns[1]]))
    else:
        ds = ds_lib.load_dataset(str(path_or_name), name, split=split, **load_kwargs)
        if "translation" in ds.column_names:
            ds = ds.map(
                lambda b: {
                    "src": [t[src_lang] for t in b["translation"]],
                    "tgt": [t[tgt_lang] for t in b["translation"]],
                },
                batched=True,
                remove_columns=ds.column_names,
            )
        else:
            missing = [f for f in (src_field, tgt_field) if f not in ds.column_names]
            if missing:
                raise ValueError(
                    f"hub dataset {str(path_or_name)!r} lacks columns {missing}; columns: "
                    f"{ds.column_names} (set src_field/tgt_field)."
                )
            ds = ds.select_columns([src_field, tgt_field])
            ds = ds.rename_columns({src_field: "src", tgt_field: "tgt"})
        if skip_empty:
            ds = ds.filter(
                lambda b: [bool(s.strip() and t.strip()) for s, t in zip(b["src"], b["tgt"])],
                batched=True,
            )
        return ds
    if skip_empty:
        kept = [(s, t) for s, t in pairs if s.strip() and t.strip()]
        if len(kept) != len(pairs):
            logger.info("dropped %d pairs with an empty side", len(pairs) - len(kept))
        pairs = kept
    return ds_lib.Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})


# ----------------------------------------------------------------------------- tokenising
def _prefix(column: str) -> str:
    """``"ids" -> ""``, ``"src_ids" -> "src_"``, ``"x" -> "x_"``: names of companion columns."""
    return column[:-3] if column.endswith("ids") else column + "_"


def tokenize_dataset(
    ds: datasets.Dataset,
    tokenizer: Tokenizer,
    *,
    column: str = "text",
    output: str = "ids",
    add_bos: bool = False,
    add_eos: bool = False,
    max_length: int | None = None,
    truncation: bool = False,
    batch_size: int = 1000,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """Tokenise column ``column`` with ``Dataset.map(batched=True)``.

    Adds ``output`` (list of int ids), ``<p>length`` (int) and ``<p>num_unk``
    (symbols mapped to ``<unk>``) where ``<p>`` is ``""`` for ``output="ids"``
    and ``"src_"`` for ``"src_ids"``. ``max_length``/``truncation`` are as in
    :meth:`Tokenizer.encode`: an over-long example raises ``ValueError`` unless
    ``truncation=True``.

    Example:
        >>> import datasets
        >>> from seqjax.data.tokenizers import CharTokenizer
        >>> ds = datasets.Dataset.from_dict({"text": ["ab", "ba!"]})
        >>> tok = CharTokenizer.from_text("ab")
        >>> out = tokenize_dataset(ds, tok)
        >>> list(out["length"]), list(out["num_unk"])
        ([2, 3], [0, 1])
    """
    if column not in ds.column_names:
        raise ValueError(f"`column` {column!r} is not in the dataset; columns: {ds.column_names}.")
    p = _prefix(output)
    kwargs = dict(add_bos=add_bos, add_eos=add_eos, max_length=max_length, truncation=truncation)

    def encode(batch: dict[str, list[str]]) -> dict[str, list[Any]]:
        encoded = [tokenizer.encode_with_unknowns(t, **kwargs) for t in batch[column]]
        return {
            output: [ids for ids, _ in encoded],
            p + "length": [len(ids) for ids, _ in encoded],
            p + "num_unk": [sum(unk.values()) for _, unk in encoded],
        }

    return ds.map(encode, batched=True, batch_size=batch_size, num_proc=num_proc)


# ----------------------------------------------------------------------------- splits
def split_dataset(
    ds: datasets.Dataset, val_fraction: float = 0.1, *, seed: int = 0, shuffle: bool = True
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """``(train, val)``: a seeded random split (``Dataset.train_test_split``)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"`val_fraction` must lie in (0, 1); got {val_fraction}.")
    parts = ds.train_test_split(test_size=val_fraction, seed=seed, shuffle=shuffle)
    return parts["train"], parts["test"]


def split_text(data: Any, train_fraction: float = 0.9) -> tuple[Any, Any]:
    """Contiguous ``(data[:n], data[n:])`` with ``n = int(len(data) * train_fraction)``.

    nanoGPT's split of a token stream or string: on Tiny Shakespeare it gives
    1,003,854 training and 111,540 validation characters.

    Example:
        >>> split_text("abcdefghij")
        ('abcdefghi', 'j')
    """
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"`train_fraction` must lie in (0, 1); got {train_fraction}.")
    n = int(len(data) * train_fraction)
    return data[:n], data[n:]


def split_arrays(
    arrays: Mapping[str, np.ndarray], test_fraction: float = 0.2, *, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Seeded shuffled ``(train, test)`` split of arrays sharing their leading dimension."""
    n = _leading_dim(arrays)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"`test_fraction` must lie in (0, 1); got {test_fraction}.")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(round(n * test_fraction)))
    test, train = perm[:n_test], perm[n_test:]
    return ({k: np.asarray(v)[train] for k, v in arrays.items()},
            {k: np.asarray(v)[test] for k, v in arrays.items()})


def _leading_dim(arrays: Mapping[str, Any]) -> int:
    if not arrays:
        raise ValueError("`arrays` must not be empty.")
    sizes = {k: len(v) for k, v in arrays.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"`arrays` must share their leading dimension; got {sizes}.")
    return next(iter(sizes.values()))


# ----------------------------------------------------------------------------- padding
def pad_batch(
    seqs: Sequence[Sequence[int]],
    *,
    pad_id: int = 0,
    length: int | None = None,
    pad_to_multiple: int = 1,
) -> dict[str, np.ndarray]:
    """Right-pad variable-length sequences into one array.

    Returns ``{"ids": int32[B, T], "lengths": int32[B], "mask": bool[B, T]}`` with
    ``T = length`` if given, else the longest sequence rounded up to a multiple of
    ``pad_to_multiple`` (fewer distinct shapes, fewer recompilations);
    ``mask[b, t] = t < lengths[b]``. Empty sequences give an all-``False`` row.

    Example:
        >>> b = pad_batch([[5, 6, 7], [8]], pad_id=0)
        >>> b["ids"].tolist(), b["lengths"].tolist()
        ([[5, 6, 7], [8, 0, 0]], [3, 1])
    """
    _check_positive(pad_to_multiple=pad_to_multiple)
    if length is not None and (not isinstance(length, int | np.integer) or length < 0):
        raise ValueError(f"`length` must be an int >= 0 or None; got {length!r}.")
    lengths = np.array([len(s) for s in seqs], np.int32)
    longest = int(lengths.max()) if len(lengths) else 0
    if length is None:
        m = max(1, pad_to_multiple)
        length = -(-longest // m) * m
    elif longest > length:
        i = int(lengths.argmax())
        raise ValueError(
            f"`seqs[{i}]` has length {longest}, longer than `length`={length}; truncate when "
            "tokenising (truncation=True) or raise `length`."
        )
    ids = np.full((len(seqs), length), pad_id, np.int32)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = np.asarray(s, np.int32)
    mask = np.arange(length)[None, :] < lengths[:, None]
    return {"ids": ids, "lengths": lengths, "mask": mask}


def bucket_batches(
    lengths: Sequence[int] | np.ndarray,
    batch_size: int,
    *,
    rng: np.random.Generator,
    window: int = 50,
    drop_remainder: bool = True,
) -> list[np.ndarray]:
    """Batches of indices grouping similar lengths ("sortish" bucketing).

    Shuffle all indices, sort each window of ``window * batch_size`` of them by
    length, cut the windows into batches and shuffle the batch order. Batches
    hold sequences of similar length (little padding) yet stay random.

    Example:
        >>> bs = bucket_batches([1, 9, 2, 8, 1, 9], 2, rng=np.random.default_rng(0))
        >>> sorted(sorted([1, 9, 2, 8, 1, 9][i] for i in b) for b in bs)
        [[1, 1], [2, 8], [9, 9]]
    """
    lengths = np.asarray(lengths)
    perm = rng.permutation(len(lengths))
    chunk = max(1, window) * batch_size
    order = np.concatenate(
        [perm[s : s + chunk][np.argsort(lengths[perm[s : s + chunk]], kind="stable")]
         for s in range(0, len(perm), chunk)]
    ) if len(perm) else perm
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    if drop_remainder and batches and len(batches[-1]) < batch_size:
        batches = batches[:-1]
    return [batches[i] for i in rng.permutation(len(batches))]


# ----------------------------------------------------------------------------- packing
def pack_sequences(
    seqs: Sequence[Sequence[int]],
    seq_len: int,
    *,
    pad_id: int = 0,
    overflow: Literal["error", "truncate", "split"] = "error",
    lookback: int = 64,
) -> dict[str, np.ndarray]:
    """Pack sequences end to end into rows of ``seq_len`` tokens (greedy first fit).

    Each sequence, in order, goes into the first of the last ``lookback`` rows
    with room for it, else starts a new row (first fit with a bounded search:
    ``O(N * lookback)``; ``lookback=1`` is next fit).
    Sequences longer than ``seq_len`` raise ``ValueError`` (``overflow="error"``),
    are cut (``"truncate"``) or continue in fresh rows as separate segments
    (``"split"``). Empty sequences are skipped.

    Returns, each ``[R, seq_len]``:

    * ``ids`` int32 — tokens, ``pad_id`` after the last segment;
    * ``segment_ids`` int32 — ``1, 2, …`` per sequence within a row, ``0`` on padding
      (the convention of :func:`seqjax.nn.masks.segment_mask`);
    * ``positions`` int32 — position inside the segment (for positional encodings);
    * ``mask`` bool — ``True`` on real tokens;
    * ``resets`` bool — ``True`` on the first token of each segment: an RNN zeroes
      its carry before that token, so segments never see each other.

    Example:
        >>> p = pack_sequences([[1, 2], [3, 4, 5], [6]], 4)
        >>> p["ids"].tolist(), p["segment_ids"].tolist()
        ([[1, 2, 6, 0], [3, 4, 5, 0]], [[1, 1, 2, 0], [1, 1, 1, 0]])
    """
    if seq_len < 1 or lookback < 1:
        raise ValueError(f"`seq_len` and `lookback` must be >= 1; got {seq_len}, {lookback}.")
    pieces: list[np.ndarray] = []
    for i, s in enumerate(seqs):
        s = np.asarray(s, np.int32).reshape(-1)
        if len(s) > seq_len:
            if overflow == "error":
                raise ValueError(
                    f"`seqs[{i}]` has length {len(s)}, longer than `seq_len`={seq_len}; pass "
                    "overflow='truncate' or 'split'."
                )
            if overflow == "truncate":
                s = s[:seq_len]
            elif overflow == "split":
                pieces.extend(s[j : j + seq_len] for j in range(0, len(s), seq_len))
                continue
            else:
                raise ValueError(
                    f"`overflow` must be 'error', 'truncate' or 'split'; got {overflow!r}."
                )
        if len(s):
            pieces.append(s)
    rows: list[list[np.ndarray]] = []
    free: list[int] = []
    open_rows: list[int] = []  # the last `lookback` rows that still have room
    for s in pieces:
        target = next((r for r in open_rows if free[r] >= len(s)), None)
        if target is None:
            rows.append([])
            free.append(seq_len)
            target = len(rows) - 1
            open_rows.append(target)
            if len(open_rows) > lookback:
                open_rows.pop(0)
        rows[target].append(s)
        free[target] -= len(s)
        if free[target] == 0:
            open_rows.remove(target)
    n = len(rows)
    ids = np.full((n, seq_len), pad_id, np.int32)
    seg = np.zeros((n, seq_len), np.int32)
    pos = np.zeros((n, seq_len), np.int32)
    resets = np.zeros((n, seq_len), bool)
    for r, row in enumerate(rows):
        t = 0
        for k, s in enumerate(row, start=1):
            ids[r, t : t + len(s)] = s
            seg[r, t : t + len(s)] = k
            pos[r, t : t + len(s)] = np.arange(len(s))
            resets[r, t] = True
            t += len(s)
    return {"ids": ids, "segment_ids": seg, "positions": pos, "mask": seg > 0, "resets": resets}


def packed_lm_targets(
    packed: Mapping[str, np.ndarray], *, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """Next-token targets for packed rows, never crossing a segment boundary.

    ``targets[r, t] = ids[r, t+1]`` and ``loss_mask[r, t] = True`` when tokens
    ``t`` and ``t+1`` are in the same segment; else ``pad_id`` / ``False``.
    Both ``[R, T]``.
    """
    ids, seg = np.asarray(packed["ids"]), np.asarray(packed["segment_ids"])
    same = np.zeros_like(seg, dtype=bool)
    same[:, :-1] = (seg[:, :-1] == seg[:, 1:]) & (seg[:, :-1] > 0)
    targets = np.full_like(ids, pad_id)
    targets[:, :-1] = np.where(same[:, :-1], ids[:, 1:], pad_id)
    return {"targets": targets, "loss_mask": same}


def packed_attention_mask(segment_ids_BxT: np.ndarray, *, causal: bool = True) -> np.ndarray:
    """``bool[B, 1, T, T]``: query ``i`` attends key ``j`` iff both are in the same segment
    (ids ``> 0``) and, when ``causal``, ``j <= i``.

    Equal to ``segment_mask(s, s) & padding & causal_mask`` of :mod:`seqjax.nn.masks`,
    in numpy for the input pipeline. Padding queries attend to nothing.

    Example:
        >>> packed_attention_mask(np.array([[1, 1, 2]]))[0, 0].astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    seg = np.asarray(segment_ids_BxT)
    if seg.ndim != 2:
        raise ValueError(f"`segment_ids_BxT` must have rank 2; got shape {seg.shape}.")
    m = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
    if causal:
        t = seg.shape[1]
        m &= np.tril(np.ones((t, t), bool))[None]
    return m[:, None]


# ----------------------------------------------------------------------------- windows
def random_windows(
    tokens_N: np.ndarray, batch_size: int, block_size: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """nanoGPT's ``get_batch``: ``batch_size`` random windows and their next-token targets.

    ``i ~ U{0, …, N - block_size - 1}``; ``inputs = tokens[i : i+T]``,
    ``targets = tokens[i+1 : i+1+T]``, both ``int32[B, T]``.

    Example:
        >>> b = random_windows(np.arange(100), 2, 4, np.random.default_rng(0))
        >>> (b["targets"] - b["inputs"]).tolist()
        [[1, 1, 1, 1], [1, 1, 1, 1]]
    """
    _check_positive(batch_size=batch_size, block_size=block_size)
    tokens_N = np.asarray(tokens_N)
    if tokens_N.ndim != 1 or len(tokens_N) <= block_size:
        raise ValueError(
            f"`tokens_N` must be 1-D and longer than block_size={block_size}; got shape "
            f"{tokens_N.shape}."
        )
    ix = rng.integers(0, len(tokens_N) - block_size, size=batch_size)
    return _windows_at(tokens_N, ix, block_size)


def _check_positive(**values: Any) -> None:
    """``ValueError`` unless every value is an int >= 1 (a window, batch or chunk size)."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"`{name}` must be an int >= 1; got {v!r}.")


def _windows_at(tokens: np.ndarray, ix: np.ndarray, block_size: int) -> dict[str, np.ndarray]:
    offs = ix[:, None] + np.arange(block_size)[None, :]
    return {
        "inputs": tokens[offs].astype(np.int32),
        "targets": tokens[offs + 1].astype(np.int32),
    }


# ----------------------------------------------------------------------------- iterators
class _Resumable:
    """Shared state handling: ``state()`` is a flat dict of ints/strs, ``restore`` checks it."""

    kind = ""

    def _config(self) -> dict[str, Any]:
        return {}

    def _position(self) -> dict[str, int]:
        return {}

    def _set_position(self, position: dict[str, int]) -> None:
        del position

    def state(self) -> dict[str, Any]:
        """JSON-able dict that :meth:`restore` accepts; save it with each checkpoint."""
        state = {"kind": self.kind, **self._config(), **self._position()}
        # numpy scalars (e.g. a seed given as np.int64) become plain Python values
        return {k: v.item() if isinstance(v, np.generic) else v for k, v in state.items()}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue exactly where the iterator that produced ``state`` was.

        The state describes the *global* stream (its global batch size and position), not
        this host's share of it, so a run saved by ``N`` processes resumes on ``M`` (a
        different topology) as long as the global batch is the same.
        """
        state = dict(state)
        if "global_batch_size" not in state and "batch_size" in state:  # older states
            state["global_batch_size"] = int(state["batch_size"]) * int(
                state.get("shard_count", 1))
        expect = {"kind": self.kind, **self._config()}
        missing = [k for k in (*expect, *self._position()) if k not in state]
        if missing:
            raise ValueError(f"`state` lacks the keys {missing}; got {sorted(state)}.")
        diff = {k: (v, state[k]) for k, v in expect.items() if state[k] != v}
        if diff:
            detail = ", ".join(f"{k}: expected {v!r}, got {g!r}" for k, (v, g) in diff.items())
            raise ValueError(f"`state` does not belong to this iterator ({detail}).")
        self._set_position({k: int(state[k]) for k in self._position()})

    # The iterator protocol of ``seqjax.train.fit``: it saves ``get_state()`` with every
    # checkpoint and calls ``set_state`` on resume (no replay of the consumed batches).
    def get_state(self) -> dict[str, Any]:
        """Same as :meth:`state` (the name :func:`seqjax.train.fit` looks for)."""
        return self.state()

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Same as :meth:`restore` (the name :func:`seqjax.train.fit` looks for)."""
        self.restore(state)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self


class LMWindowIterator(_Resumable):
    """Endless random windows of a token stream (nanoGPT's sampler), resumable and host-sharded.

    Step ``k`` draws a global batch of ``batch_size * shard_count`` start
    offsets from ``np.random.default_rng([seed, k])``; this host keeps rows
    ``[shard_index * batch_size, (shard_index + 1) * batch_size)``. So the
    state is just ``step`` and every host agrees without communication.

    Yields ``{"inputs": int32[B, T], "targets": int32[B, T]}`` (targets shifted by one).

    Example:
        >>> it = LMWindowIterator(np.arange(50), batch_size=2, block_size=8, seed=0)
        >>> _ = next(it); s = it.state(); a = next(it)
        >>> it2 = LMWindowIterator(np.arange(50), 2, 8, seed=0); it2.restore(s)
        >>> bool((next(it2)["inputs"] == a["inputs"]).all())
        True
    """

    kind = "lm_windows"

    def __init__(
        self,
        tokens_N: np.ndarray,
        batch_size: int,
        block_size: int,
        *,
        seed: int = 0,
        num_steps: int | None = None,
        shard_index: int | None = None,
        shard_count: int | None = None,
    ):
        _check_positive(batch_size=batch_size, block_size=block_size)
        self.tokens = np.asarray(tokens_N)
        if self.tokens.ndim != 1 or len(self.tokens) <= block_size:
            raise ValueError(
                f"`tokens_N` must be 1-D and longer than block_size={block_size}; got shape "
                f"{self.tokens.shape}."
            )
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1; got {batch_size}.")
        self.batch_size, self.block_size, self.seed = batch_size, block_size, seed
        self.num_steps = num_steps
        self.shard_index, self.shard_count = _iterator_shard(shard_index, shard_count)
        self.step = 0

    def _config(self) -> dict[str, Any]:
        return {"seed": self.seed, "global_batch_size": self.batch_size * self.shard_count,
                "block_size": self.block_size, "num_tokens": len(self.tokens)}

    def _position(self) -> dict[str, int]:
        return {"step": self.step}

    def _set_position(self, position: dict[str, int]) -> None:
        self.step = position["step"]

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_steps is not None and self.step >= self.num_steps:
            raise StopIteration
        rng = np.random.default_rng([self.seed, self.step])
        ix = rng.integers(0, len(self.tokens) - self.block_size,
                          size=self.batch_size * self.shard_count)
        lo = self.shard_index * self.batch_size
        self.step += 1
        return _windows_at(self.tokens, ix[lo : lo + self.batch_size], self.block_size)


class TBPTTIterator(_Resumable):
    """Contiguous streams for truncated back-propagation through time.

    The token stream is cut into ``G = batch_size * shard_count`` equal streams
    laid out as rows (``tokens[:G*L].reshape(G, L)``, ``L = (N - 1) // G``);
    step ``s`` of an epoch yields columns ``[s*T, (s+1)*T)`` of the rows of this
    host. Row ``b`` of step ``s+1`` continues row ``b`` of step ``s``, so the
    RNN's final carry of one batch is the right initial carry of the next
    (gradients are truncated at the batch boundary). An epoch has ``L // T``
    steps; the tail that does not fill a chunk is dropped.

    Yields ``{"inputs": int32[B, T], "targets": int32[B, T], "reset": bool[B]}``;
    ``reset`` is ``True`` on an epoch's first step (start from a zero carry).

    Example:
        >>> it = TBPTTIterator(np.arange(21), batch_size=2, seq_len=4)
        >>> [next(it)["inputs"].tolist() for _ in range(2)]
        [[[0, 1, 2, 3], [10, 11, 12, 13]], [[4, 5, 6, 7], [14, 15, 16, 17]]]
    """

    kind = "tbptt"

    def __init__(
        self,
        tokens_N: np.ndarray,
        batch_size: int,
        seq_len: int,
        *,
        num_epochs: int | None = None,
        shard_index: int | None = None,
        shard_count: int | None = None,
    ):
        _check_positive(batch_size=batch_size, seq_len=seq_len)
        tokens = np.asarray(tokens_N)
        self.shard_index, self.shard_count = _iterator_shard(shard_index, shard_count)
        g = batch_size * self.shard_count
        if batch_size < 1 or tokens.ndim != 1:
            raise ValueError(
                f"need `batch_size` >= 1 and 1-D `tokens_N`; got {batch_size}, {tokens.shape}."
            )
        stream = (len(tokens) - 1) // g
        if stream < seq_len:
            raise ValueError(
                f"`tokens_N` has {len(tokens)} tokens: too few for {g} streams of at least "
                f"seq_len={seq_len} (+1 for the targets)."
            )
        rows = slice(self.shard_index * batch_size, (self.shard_index + 1) * batch_size)
        self.x = tokens[: g * stream].reshape(g, stream)[rows].astype(np.int32)
        self.y = tokens[1 : g * stream + 1].reshape(g, stream)[rows].astype(np.int32)
        self.batch_size, self.seq_len, self.num_epochs = batch_size, seq_len, num_epochs
        self.steps_per_epoch = stream // seq_len
        self.num_tokens = len(tokens)
        self.epoch = 0
        self.step = 0

    def _config(self) -> dict[str, Any]:
        return {"global_batch_size": self.batch_size * self.shard_count,
                "seq_len": self.seq_len, "num_tokens": self.num_tokens}

    def _position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def _set_position(self, position: dict[str, int]) -> None:
        self.epoch, self.step = position["epoch"], position["step"]

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


class _EpochIterator(_Resumable):
    """Epochs of global batches; batch order a pure function of ``(seed, epoch)``."""

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        drop_remainder: bool,
        num_epochs: int | None,
        shard_index: int | None,
        shard_count: int | None,
    ):
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1; got {batch_size}.")
        self.shard_index, self.shard_count = _iterator_shard(shard_index, shard_count)
        if self.shard_count > 1 and not drop_remainder:
            raise ValueError(
                "`drop_remainder` must be True with several hosts (shard_count="
                f"{self.shard_count}): every host needs a full batch at every step."
            )
        self.num_examples, self.batch_size = num_examples, batch_size
        self.global_batch = batch_size * self.shard_count
        if drop_remainder and num_examples < self.global_batch:
            raise ValueError(
                f"{num_examples} examples cannot fill one global batch of {self.global_batch} "
                f"(batch_size={batch_size} x shard_count={self.shard_count})."
            )
        self.shuffle, self.seed, self.drop_remainder = shuffle, seed, drop_remainder
        self.num_epochs = num_epochs
        self.epoch = 0
        self.step = 0
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def _epoch_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        order = rng.permutation(self.num_examples) if self.shuffle else np.arange(
            self.num_examples)
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

    def _position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def _set_position(self, position: dict[str, int]) -> None:
        self.epoch, self.step = position["epoch"], position["step"]

    def _next_indices(self) -> tuple[np.ndarray, np.ndarray]:
        """``(global_indices, host_indices)`` of the next batch; advances the position."""
        if self.num_epochs is not None and self.epoch >= self.num_epochs:
            raise StopIteration
        batches = self.batches(self.epoch)
        glob = batches[self.step]
        lo = self.shard_index * self.batch_size
        self.step += 1
        if self.step >= len(batches):
            self.epoch, self.step = self.epoch + 1, 0
        return glob, glob[lo : lo + self.batch_size]


class ArrayIterator(_EpochIterator):
    """Shuffled batches of fixed-shape arrays (packed rows, synthetic tasks), resumable.

    ``arrays`` share their leading dimension ``N``; each step yields the same
    keys with leading dimension ``batch_size`` (this host's rows of the global
    batch). The order of epoch ``e`` is ``default_rng([seed, e]).permutation(N)``.

    Example:
        >>> it = ArrayIterator({"x": np.arange(10)}, batch_size=4, shuffle=False)
        >>> [next(it)["x"].tolist() for _ in range(3)]
        [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    """

    kind = "arrays"

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_remainder: bool = True,
        num_epochs: int | None = None,
        shard_index: int | None = None,
        shard_count: int | None = None,
    ):
        self.arrays = {k: np.asarray(v) for k, v in arrays.items()}
        super().__init__(
            _leading_dim(self.arrays), batch_size, shuffle=shuffle, seed=seed,
            drop_remainder=drop_remainder, num_epochs=num_epochs,
            shard_index=shard_index, shard_count=shard_count,
        )

    def __next__(self) -> dict[str, np.ndarray]:
        _, idx = self._next_indices()
        return {k: v[idx] for k, v in self.arrays.items()}


class BatchIterator(_EpochIterator):
    """Padded batches of variable-length token sequences, optionally length-bucketed.

    ``data`` is a ``datasets.Dataset`` (columns ``columns``, e.g. ``("ids",)`` or
    ``("src_ids", "tgt_ids")``), a mapping ``{column: list of sequences}``, or a
    plain list of sequences (one column ``"ids"``).

    Each column ``c`` yields ``c: int32[B, T_c]``, ``<p>lengths: int32[B]`` and
    ``<p>mask: bool[B, T_c]`` with ``<p>`` = ``""`` for ``"ids"``, ``"src_"``
    for ``"src_ids"``. ``T_c`` is ``pad_to_length`` if given, else the longest
    ``c`` in the *global* batch rounded up to ``pad_to_multiple``, so all hosts
    get the same shapes. ``bucket=True`` groups similar lengths
    (:func:`bucket_batches`, per epoch from ``(seed, epoch)``).

    Example:
        >>> it = BatchIterator([[1], [2, 3], [4, 5, 6], [7]], batch_size=2, shuffle=False)
        >>> b = next(it)
        >>> b["ids"].tolist(), b["lengths"].tolist(), b["mask"].tolist()
        ([[1, 0], [2, 3]], [1, 2], [[True, False], [True, True]])
    """

    kind = "padded"

    def __init__(
        self,
        data: Any,
        batch_size: int,
        *,
        columns: Sequence[str] = ("ids",),
        pad_id: int = 0,
        pad_to_multiple: int = 1,
        pad_to_length: int | None = None,
        bucket: bool = False,
        bucket_window: int = 50,
        shuffle: bool = True,
        seed: int = 0,
        drop_remainder: bool = True,
        num_epochs: int | None = None,
        shard_index: int | None = None,
        shard_count: int | None = None,
    ):
        self.columns = tuple(columns)
        self._get: Callable[[np.ndarray], dict[str, list[Any]]]
        if hasattr(data, "column_names") and hasattr(data, "select"):  # datasets.Dataset
            missing = [c for c in self.columns if c not in data.column_names]
            if missing:
                raise ValueError(
                    f"`columns` {missing} are not in the dataset; columns: {data.column_names}."
                )
            ds = data.select_columns(list(self.columns))
            self._get = lambda idx: ds[idx.tolist()]
            lengths = {c: np.array([len(s) for s in ds[c][:]]) for c in self.columns}
        else:
            table = dict(data) if isinstance(data, Mapping) else {"ids": list(data)}
            if isinstance(data, Mapping):
                missing = [c for c in self.columns if c not in table]
                if missing:
                    raise ValueError(f"`columns` {missing} are not keys of `data`: {list(table)}.")
            else:
                self.columns = ("ids",)
            self._get = lambda idx: {c: [table[c][i] for i in idx] for c in self.columns}
            lengths = {c: np.array([len(s) for s in table[c]]) for c in self.columns}
        self.lengths = lengths
        n = {c: len(v) for c, v in lengths.items()}
        if len(set(n.values())) != 1:
            raise ValueError(f"`columns` must have equally many examples; got {n}.")
        if pad_to_length is not None:
            for c, ls in lengths.items():
                if len(ls) and ls.max() > pad_to_length:
                    i = int(ls.argmax())
                    raise ValueError(
                        f"example {i} of column {c!r} has length {int(ls[i])}, longer than "
                        f"`pad_to_length`={pad_to_length}; truncate when tokenising."
                    )
        self.pad_id, self.pad_to_multiple, self.pad_to_length = pad_id, pad_to_multiple, \
            pad_to_length
        self.bucket, self.bucket_window = bucket, bucket_window
        super().__init__(
            next(iter(n.values())), batch_size, shuffle=shuffle, seed=seed,
            drop_remainder=drop_remainder, num_epochs=num_epochs,
            shard_index=shard_index, shard_count=shard_count,
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
            if self.pad_to_length is not None:
                length = self.pad_to_length
            else:
                m = max(1, self.pad_to_multiple)
                length = -(-int(self.lengths[c][glob].max(initial=0)) // m) * m
            b = pad_batch(rows[c], pad_id=self.pad_id, length=length)
            p = _prefix(c)
            out[c], out[p + "lengths"], out[p + "mask"] = b["ids"], b["lengths"], b["mask"]
        return out

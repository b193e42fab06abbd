"""Token shards on disk: llm.c's shard format, nanoGPT's ``.bin`` files, and the manifest.

Data is tokenised once (``seqjax prepare``, :mod:`seqjax.data.prepare`) and read many times,
memory-mapped. Two layouts:

* **llm.c shards** (llm.c's ``dev/data/data_common.py``, ``llmc/dataloader.h``): a header of 256
  little-endian ``int32`` (``[0]`` magic ``20240520``, ``[1]`` version ``1``, ``[2]`` token count
  ``N``), then ``N`` little-endian ``uint16`` tokens; exactly ``1024 + 2N`` bytes. Every document
  starts with the end-of-text token (EOT); files are named ``NAME_val_000000.bin`` (shard 0,
  validation), ``NAME_train_000001.bin``, ...
* **nanoGPT's bins**: ``train.bin`` / ``val.bin``, headerless ``uint16`` (EOT after each
  document; one text cut 90/10 for Shakespeare).

A ``seqjax prepare`` folder also holds ``manifest.json``: the format, the tokenizer (kind, name,
vocabulary size, EOT id), and per shard its file, split, token and document counts and SHA-256.
:func:`open_tokens` opens a folder, a manifest or a nanoGPT ``train.bin`` as :class:`TokenData`:
read-only ``np.memmap`` shards checked once when opened (header, size, and with ``vocab_size``
every id, one vectorised pass per shard, never per batch); each error names the file and what
was expected.

Example:
    >>> import tempfile, os, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> write_shard(os.path.join(d, "x_val_000000.bin"), np.arange(10))
    >>> write_shard(os.path.join(d, "x_train_000001.bin"), np.arange(100))
    >>> data = open_tokens(d, vocab_size=100)
    >>> data.num_tokens("train"), data.num_tokens("val"), data.format
    (100, 10, 'llmc')
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from seqjax._io import write_atomic

__all__ = ["HEADER_INTS", "MAGIC", "MANIFEST", "VERSION", "ShardError", "TokenData", "open_tokens",
           "read_shard", "sha256_file", "write_shard"]

#: llm.c's shard header: 256 int32, magic, version, token count.
MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
HEADER_BYTES = HEADER_INTS * 4
#: The manifest ``seqjax prepare`` writes beside the shards.
MANIFEST = "manifest.json"
_TOKEN_DTYPE = np.dtype("<u2")
_LLMC_NAME = re.compile(r"_(train|val)_\d+\.bin$")


class ShardError(ValueError):
    """A token file that is not what it claims to be (names the file and what was expected)."""


def write_shard(path: str | os.PathLike, tokens: Any, *, header: bool = True) -> None:
    """Write ``tokens`` (ids in ``[0, 65535]``) as llm.c's header then ``uint16``
    (``header=False``: nanoGPT's ``.bin``), atomically: a crash leaves the old file or none."""
    arr = np.asarray(tokens)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"`tokens` must be 1-D integer ids; got {arr.dtype} {arr.shape}.")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 65535):
        raise ValueError(f"`tokens` must lie in [0, 65535] to be stored as uint16; got ids in "
                         f"[{int(arr.min())}, {int(arr.max())}] ({os.fspath(path)}).")
    if header and arr.size >= 2**31:
        raise ValueError(f"a shard holds at most 2**31 - 1 tokens (its header's int32); got "
                         f"{arr.size}.")
    write_atomic(path, (_llmc_header(arr.size) if header else b"")
                 + arr.astype(_TOKEN_DTYPE).tobytes())


def _llmc_header(count: int) -> bytes:
    """llm.c's header of a shard of ``count`` tokens."""
    head = np.zeros(HEADER_INTS, "<i4")
    head[:3] = (MAGIC, VERSION, count)
    return head.tobytes()


def read_shard(path: str | os.PathLike, *, header: bool = True,
               vocab_size: int | None = None) -> np.ndarray:
    """One shard as a read-only ``uint16[N]`` memmap, checked: magic, version and count against
    the size (``header=False``: nanoGPT's ``.bin``, an even size), with ``vocab_size`` every id."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
    except OSError as err:
        raise ShardError(f"cannot read the token file {path}: {err.strerror}.") from None
    offset = 0
    if header:
        if size < HEADER_BYTES:
            raise ShardError(f"{path}: {size} bytes, shorter than llm.c's {HEADER_BYTES}-byte "
                             "header; expected a shard written by `seqjax prepare` or llm.c.")
        head = np.fromfile(path, "<i4", count=3)
        if int(head[0]) != MAGIC:
            raise ShardError(f"{path}: magic {int(head[0])}, expected {MAGIC} (llm.c's shard "
                             "header); a headerless nanoGPT file must be named train.bin/val.bin.")
        if int(head[1]) != VERSION:
            raise ShardError(f"{path}: version {int(head[1])}, expected {VERSION}.")
        count, offset = int(head[2]), HEADER_BYTES
        if size != HEADER_BYTES + 2 * count:
            raise ShardError(
                f"{path}: the header says {count} tokens ({HEADER_BYTES + 2 * count} bytes) "
                f"but the file has {size} bytes (truncated or not a shard).")
    elif size % 2:
        raise ShardError(f"{path}: {size} bytes, an odd size; expected uint16 tokens.")
    n = (size - offset) // 2
    tokens = (np.memmap(path, _TOKEN_DTYPE, mode="r", offset=offset, shape=(n,)) if n
              else np.zeros((0,), _TOKEN_DTYPE))
    if vocab_size is not None and n and (top := int(tokens.max())) >= vocab_size:
        raise ShardError(f"{path}: token id {top} is outside the model's vocabulary "
                         f"[0, {vocab_size}); was it prepared with another tokenizer?")
    return tokens


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class TokenData:
    """Opened token shards (:func:`open_tokens`).

    Attributes:
        train, val: the shards of each split, ``uint16`` memmaps, checked.
        format: ``"llmc"`` (headers) or ``"nanogpt"`` (headerless ``.bin``).
        manifest: ``manifest.json``'s content (``None`` without one).
        paths: the files of each split, in order.
    """

    train: Sequence[np.ndarray]
    val: Sequence[np.ndarray]
    format: str
    manifest: Mapping[str, Any] | None
    paths: Mapping[str, Sequence[str]]

    def num_tokens(self, split: str = "train") -> int:
        """Tokens in every shard of ``split`` (``"train"`` or ``"val"``)."""
        if split not in ("train", "val"):
            raise ValueError(f"`split` must be 'train' or 'val'; got {split!r}.")
        return int(sum(len(s) for s in (self.train if split == "train" else self.val)))

    @property
    def tokenizer(self) -> Mapping[str, Any] | None:
        """The manifest's tokenizer description (``None`` without a manifest)."""
        return None if self.manifest is None else self.manifest.get("tokenizer")

    def check_tokenizer(self, expected: Mapping[str, Any]) -> None:
        """``ShardError`` unless the manifest's tokenizer agrees with ``expected`` on every key
        both state (``kind``, ``name``, ``vocab_size``, ``eot``); no manifest: no check."""
        have = self.tokenizer or {}
        diff = {k: (v, have[k]) for k, v in expected.items() if k in have and have[k] != v}
        if diff:
            where = self.paths.get("manifest", ["the manifest"])[0]
            detail = ", ".join(f"{k}: the run's {v!r}, the shards' {g!r}"
                               for k, (v, g) in diff.items())
            raise ShardError(f"{where}: the shards were tokenised with another tokenizer "
                             f"({detail}).")


def _read_manifest(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ShardError(f"cannot read the manifest {path}: {err}.") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise ShardError(f"{path}: expected a seqjax manifest with a list of `shards`.")
    return manifest


def open_tokens(path: str | os.PathLike, *, vocab_size: int | None = None,
                verify: bool = False) -> TokenData:
    """Open token shards for training (see the module docstring).

    Args:
        path: a folder (``manifest.json``, llm.c's ``*_train_*.bin`` / ``*_val_*.bin``, or
            nanoGPT's ``train.bin`` / ``val.bin``), a manifest, or a nanoGPT ``train.bin``.
        vocab_size: check every id of every shard against it, once, here.
        verify: also check each shard's SHA-256 against the manifest (reads every byte).

    Raises:
        ShardError: a missing or empty split, a bad header, a token count that differs from the
            manifest, a SHA-256 mismatch (``verify``), or an out-of-vocabulary id; names the file.
    """
    path = os.path.abspath(os.fspath(path))
    manifest = None
    if os.path.isdir(path) and os.path.exists(os.path.join(path, MANIFEST)):
        path = os.path.join(path, MANIFEST)
    if os.path.isfile(path) and path.endswith(".json"):
        manifest = _read_manifest(path)
        folder = os.path.dirname(path)
        fmt = manifest.get("format", "llmc")
        if fmt not in ("llmc", "nanogpt"):
            raise ShardError(f"{path}: `format` must be 'llmc' or 'nanogpt'; got {fmt!r}.")
        files: dict[str, list[str]] = {"train": [], "val": []}
        for entry in manifest["shards"]:
            split = entry.get("split")
            if split not in files:
                raise ShardError(f"{path}: a shard's `split` must be 'train' or 'val'; got "
                                 f"{split!r}.")
            files[split].append(os.path.join(folder, entry["file"]))
    elif os.path.isdir(path) or os.path.basename(path) in ("train.bin", "val.bin"):
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        nano = [os.path.join(folder, f"{s}.bin") for s in ("train", "val")]
        llmc = [f for f in sorted(glob.glob(os.path.join(folder, "*.bin")))
                if _LLMC_NAME.search(os.path.basename(f))]
        if os.path.exists(nano[0]) and not llmc:
            fmt, files = "nanogpt", {"train": [nano[0]], "val": [nano[1]]}
        elif llmc:
            fmt, files = "llmc", {s: [f for f in llmc if f"_{s}_" in os.path.basename(f)]
                                  for s in ("train", "val")}
        else:
            unfinished = os.path.isdir(os.path.join(folder, ".prepare-partial"))
            raise ShardError(
                f"{path}: no token shards (expected manifest.json, llm.c's *_train_*.bin / "
                "*_val_*.bin, or nanoGPT's train.bin / val.bin)"
                + ("; it holds an unfinished `seqjax prepare`: rerun it to finish."
                   if unfinished else "."))
    else:
        raise ShardError(f"{path}: expected a shard folder, a manifest (.json) or a nanoGPT "
                         "train.bin.")
    for split in ("train", "val"):
        if not files[split]:
            raise ShardError(f"{path}: no {split} shard.")
        missing = [f for f in files[split] if not os.path.exists(f)]
        if missing:
            raise ShardError(f"{path}: the {split} shard {missing[0]} does not exist (an "
                             "unfinished `seqjax prepare`? rerun it to finish).")
    header = fmt == "llmc"
    shards = {s: [read_shard(f, header=header, vocab_size=vocab_size) for f in files[s]]
              for s in ("train", "val")}
    entries = {} if manifest is None else {os.path.join(folder, e["file"]): e
                                           for e in manifest["shards"]}
    for split in ("train", "val"):
        for f, arr in zip(files[split], shards[split], strict=True):
            entry = entries.get(f, {})
            if entry.get("tokens") is not None and int(entry["tokens"]) != len(arr):
                raise ShardError(f"{f}: {len(arr)} tokens, the manifest says {entry['tokens']}.")
            if verify and entry.get("sha256") and sha256_file(f) != entry["sha256"]:
                raise ShardError(f"{f}: its SHA-256 differs from the manifest's.")
        if not sum(len(s) for s in shards[split]):
            raise ShardError(f"{path}: the {split} split holds no tokens.")
    paths: dict[str, list[str]] = {**files, **({} if manifest is None else {"manifest": [path]})}
    return TokenData(train=shards["train"], val=shards["val"], format=fmt, manifest=manifest,
                     paths=paths)

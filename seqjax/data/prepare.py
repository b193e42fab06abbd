"""``seqjax prepare``: tokenise text once into token shards that training memory-maps.

:func:`prepare` reads documents, tokenises them in ``workers`` processes and writes one of
the two layouts :func:`seqjax.data.shards.open_tokens` reads, plus ``manifest.json``.

**Inputs.** ``.txt`` files (``docs="file"``: one document per file; ``"lines"``: one per
line, the break dropped; ``"paragraphs"``: cut at each ``"\\n\\n"``, which stays at the end of
its paragraph, llm.c's ``tinyshakespeare.py``), ``.jsonl`` (the ``text_field`` of each line's
object), ``.parquet`` (the ``text_field`` column, via ``pyarrow``) — as files, folders (every
such file below, sorted) or globs; or a Hugging Face dataset (``hf_dataset``: a hub name, a
builder such as ``"json"`` with ``hf_data_files``, or a ``save_to_disk`` folder; ``streaming``).
Empty documents are skipped and counted in the manifest.

**Tokenisation.** Documents are encoded as ordinary text (special tokens' spellings are not
special), in chunks sent to ``workers`` processes (at most ``2 * workers`` chunks ahead) and
collected in order, so the output is the same for every ``workers`` (1 runs in-process).
Workers fork on Linux, or start from ``forkserver`` once JAX's runtime is up; under ``spawn``
(macOS, Windows) a script needs the ``if __name__ == "__main__":`` guard. Ids must fit
``uint16``.

**llm.c's format** (``"llmc"``, the default; its ``fineweb.py``): EOT before every document;
validation then training, cut into shards of ``shard_size`` tokens (a document may continue
into the next shard of its split): ``NAME_val_000000.bin``, ``NAME_train_000001.bin``, ...
**nanoGPT's format** (``"nanogpt"``; its ``openwebtext/prepare.py``): headerless ``val.bin``
and ``train.bin``, EOT *after* each document; ``shard_size`` unused.

**The validation split** (``split="documents"``) is the corpus's first documents, by at most
one of ``val_documents=N`` (the first ``N``); ``val_fraction=f`` (the first ``max(1, int(f·D))``
of ``D`` documents, counted in a first pass, so not for a streamed dataset); ``val_tokens=T``
(exactly the first ``T`` tokens, llm.c's rule: the document crossing the cut is counted in
validation and its remaining tokens begin training); none: ``val_fraction=0.01``, or
``val_tokens=shard_size`` when streaming. Both splits must hold a document.
``split="text"`` treats the inputs as one text (``.txt`` read whole, documents joined with
``"\\n\\n"``) cut by characters as nanoGPT's ``shakespeare/prepare.py``: train
``text[:int(n·(1 - val_fraction))]``, val the rest (default 0.1), each encoded in one call,
no EOT, either format; held in memory (on Tiny Shakespeare with GPT-2's BPE: nanoGPT's 301,966
and 36,059 tokens). ``tokenizer="char"`` (text split only) is the
:class:`~seqjax.data.tokenizers.CharTokenizer` of the text's sorted characters, no specials,
saved as ``OUT/tokenizer.json`` (load it as ``seqjax:OUT/tokenizer.json``); with
``format="nanogpt"`` that is nanoGPT's ``shakespeare_char`` bins, id for id.

**Atomic and restartable.** Shards are written (each atomically) into ``OUT/.prepare-partial/``
and moved beside it only when all are complete — the old manifest and this name's stale shards
removed first — then ``manifest.json`` is written last, atomically. A killed run leaves no
manifest and no new shard (a previous complete output stays readable); rerunning starts over
and, being deterministic, writes the same. Two runs must not write one folder at once.

**Progress**: documents, tokens, tokens/s and, where the size is known (documents counted,
a dataset's length, or ``.txt`` bytes), fraction done and time left — a ``tqdm`` bar with
``progress=True`` (a terminal), else a ``log`` line every 30 s; then a summary line.
**The manifest** holds the format, the tokenizer's ``describe()``, each shard (file, split,
tokens, documents starting in it, SHA-256), per-split totals, inputs, options, skipped empty
documents, seqjax's version and the time.

Example:
    >>> import os, tempfile, json
    >>> from seqjax.data.tokenizers import CharTokenizer
    >>> from seqjax.data.shards import open_tokens
    >>> d = tempfile.mkdtemp()
    >>> tok = os.path.join(d, "chars.json")
    >>> CharTokenizer.from_text("abc ").save(tok)
    >>> with open(os.path.join(d, "docs.jsonl"), "w") as f:
    ...     f.writelines(json.dumps({"text": t}) + "\\n" for t in ["ab", "c a", "bb", "a"])
    >>> manifest = prepare(os.path.join(d, "docs.jsonl"), os.path.join(d, "out"),
    ...                    tokenizer=f"seqjax:{tok}", val_documents=1, workers=1)
    >>> [(s["file"], s["tokens"], s["documents"]) for s in manifest["shards"]]
    [('docs_val_000000.bin', 3, 1), ('docs_train_000001.bin', 9, 3)]
    >>> open_tokens(os.path.join(d, "out")).num_tokens("train")
    9
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import inspect
import itertools
import json
import multiprocessing
import os
import re
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from seqjax._checks import check_optional_positive_int, check_positive_int
from seqjax._io import write_json
from seqjax._optional import require
from seqjax.data.shards import MANIFEST, sha256_file, write_shard
from seqjax.data.text_tokenizers import load_text_tokenizer
from seqjax.data.tokenizers import CharTokenizer, SpecialTokens, Tokenizer

__all__ = ["DOCS", "FORMATS", "OPTIONS", "PARTIAL_DIR", "SPLITS", "SUFFIXES", "main", "prepare"]

FORMATS = ("llmc", "nanogpt")
SPLITS = ("documents", "text")
DOCS = ("file", "lines", "paragraphs")
#: The local files ``prepare`` reads.
SUFFIXES = (".txt", ".jsonl", ".parquet")
#: Where a run writes its shards until every one is complete (inside ``out_dir``).
PARTIAL_DIR = ".prepare-partial"
#: Where ``tokenizer="char"`` saves its tokenizer, beside the shards.
CHAR_TOKENIZER = "tokenizer.json"
#: ``val_fraction`` when no validation option is given.
DEFAULT_VAL_FRACTION = {"documents": 0.01, "text": 0.1}
_MAX_ID = 65535
# A chunk of documents sent to a worker: at most this many characters or documents.
_CHUNK_CHARS, _CHUNK_DOCS = 1 << 20, 1024
_GLOB_CHARS = re.compile(r"[*?\[]")

Log = Callable[[str], None]
#: Seconds between ``prepare``'s progress lines (without a bar).
PROGRESS_EVERY_S = 30.0


# --------------------------------------------------------------------------- inputs


def _find_files(inputs: Sequence[str]) -> list[str]:
    """The input files, in the order given (folders and globs sorted), each once."""
    found: list[str] = []
    for item in inputs:
        if _GLOB_CHARS.search(item):
            matches = [p for p in sorted(glob.glob(item, recursive=True))
                       if os.path.isfile(p) and p.endswith(SUFFIXES)]
            if not matches:
                raise ValueError(f"no input files found: the glob {item!r} matches no "
                                 f"{'/'.join(SUFFIXES)} file.")
            found += matches
        elif os.path.isdir(item):
            matches = sorted(
                os.path.join(root, f)
                for root, dirs, files in os.walk(item)
                if not any(part.startswith(".") for part in
                           os.path.relpath(root, item).split(os.sep) if part != ".")
                for f in files if f.endswith(SUFFIXES) and not f.startswith("."))
            if not matches:
                raise ValueError(f"no input files found: the folder {item!r} holds no "
                                 f"{'/'.join(SUFFIXES)} file.")
            found += matches
        elif os.path.isfile(item):
            if not item.endswith(SUFFIXES):
                raise ValueError(f"the input {item!r} is not a {'/'.join(SUFFIXES)} file "
                                 "(the suffix says how to read it).")
            found.append(item)
        else:
            raise ValueError(f"no input files found: {item!r} does not exist.")
    return list(dict.fromkeys(os.path.abspath(f) for f in found))


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}).") from None


def _txt_documents(path: str, docs: str) -> Iterator[str]:
    if docs == "lines":
        with open(path, encoding="utf-8") as f:
            try:
                for line in f:
                    yield line[:-1] if line.endswith("\n") else line
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}: not UTF-8 text ({err.reason}).") from None
        return
    text = _read_text(path)
    if docs == "file":
        yield text
        return
    sections = text.split("\n\n")  # llm.c's tinyshakespeare.py: "\n\n" ends each paragraph
    for i, s in enumerate(sections):
        yield s + "\n\n" if i != len(sections) - 1 else s


def _jsonl_documents(path: str, field: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not a JSON object ({err.msg}).") from None
            yield _field(row, field, f"{path}:{lineno}")


def _field(row: Any, field: str, where: str) -> str:
    if not isinstance(row, dict) or field not in row:
        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise ValueError(f"{where}: no text field {field!r} (--text_field); it has {keys}.")
    text = row[field]
    if text is None:
        return ""
    if not isinstance(text, str):
        raise ValueError(f"{where}: the field {field!r} must be a string; got "
                         f"{type(text).__name__}.")
    return text


def _parquet_documents(path: str, field: str) -> Iterator[str]:
    pq = require("pyarrow.parquet", "reading .parquet inputs (pyarrow)")
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if field not in names:
        raise ValueError(f"{path}: no column {field!r} (--text_field); it has {names}.")
    for batch in pf.iter_batches(columns=[field], batch_size=1024):
        for text in batch.column(0).to_pylist():
            if text is not None and not isinstance(text, str):
                raise ValueError(f"{path}: the column {field!r} must hold strings; got "
                                 f"{type(text).__name__}.")
            yield text or ""


def _file_documents(files: Sequence[str], docs: str, field: str) -> Iterator[str]:
    for path in files:
        if path.endswith(".txt"):
            yield from _txt_documents(path, docs)
        elif path.endswith(".jsonl"):
            yield from _jsonl_documents(path, field)
        else:
            yield from _parquet_documents(path, field)


def _load_hf(name: str, config: str | None, split: str, data_files: Any,
             streaming: bool) -> Any:
    """A dataset split: a ``save_to_disk`` folder (``load_from_disk``) or ``load_dataset``."""
    datasets = require("datasets", "--hf_dataset (Hugging Face `datasets`)")
    saved = os.path.isdir(name) and any(
        os.path.exists(os.path.join(name, f))
        for f in ("dataset_info.json", "state.json", "dataset_dict.json"))
    try:
        if saved:
            ds = datasets.load_from_disk(name)
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise ValueError(f"the dataset {name!r} has no split {split!r} "
                                     f"(--hf_split); it has {sorted(ds)}.")
                ds = ds[split]
            return ds.to_iterable_dataset() if streaming else ds
        return datasets.load_dataset(name, config, split=split, data_files=data_files,
                                     streaming=streaming)
    except ValueError:
        raise
    except Exception as err:  # not found, no network, a bad config: one clear line
        raise ValueError(f"cannot load the dataset {name!r} (config {config!r}, split "
                         f"{split!r}): {type(err).__name__}: {err}") from None


def _hf_documents(ds: Any, field: str, name: str) -> Iterator[str]:
    columns = getattr(ds, "column_names", None)
    if columns is not None and field not in columns:
        raise ValueError(f"the dataset {name!r} has no column {field!r} (--text_field); it "
                         f"has {columns}.")
    for i, row in enumerate(ds):
        yield _field(row, field, f"the dataset {name!r}, row {i}")


class _Documents:
    """The non-empty documents of the inputs, re-iterable; counts the empty ones skipped."""

    def __init__(self, make: Callable[[], Iterator[str]], known_count: bool):
        self._make = make
        self.known_count = known_count
        self.skipped = 0

    def __iter__(self) -> Iterator[str]:
        self.skipped = 0
        for text in self._make():
            if text:
                yield text
            else:
                self.skipped += 1

    def count(self) -> int:
        return sum(1 for _ in self)


# --------------------------------------------------------------------------- progress


class _Progress:
    """Documents, tokens, tokens/s and (``total`` known) the time left: a tqdm bar, or a
    line through ``log`` every :data:`PROGRESS_EVERY_S` seconds; :meth:`close` logs the
    summary. ``total`` counts documents (``unit="documents"``) or input bytes
    (``unit="bytes"``, advanced by :meth:`read`)."""

    def __init__(self, log: Log, total: int | None, unit: str, bar: bool) -> None:
        self.log, self.total, self.unit = log, total, unit
        self.docs = self.tokens = self.bytes = 0
        self.start = self.last = time.perf_counter()
        self.bar = None
        if bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=" docs" if unit == "documents" else "B",
                            unit_scale=unit == "bytes", desc="tokenising", file=sys.stderr,
                            dynamic_ncols=True)

    def read(self, docs: Iterable[str]) -> Iterator[str]:
        """``docs``, counting their UTF-8 bytes (the unit ``"bytes"``)."""
        for text in docs:
            self.bytes += len(text.encode("utf-8", "surrogatepass"))
            yield text

    def add(self, docs: int, tokens: int) -> None:
        self.docs += docs
        self.tokens += tokens
        now = time.perf_counter()
        rate = self.tokens / max(now - self.start, 1e-9)
        if self.bar is not None:
            self.bar.update((docs if self.unit == "documents" else self.bytes) - (
                0 if self.unit == "documents" else self.bar.n))
            self.bar.set_postfix_str(f"{self.tokens:,} tokens, {rate:,.0f} tokens/s")
        elif now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            line = f"prepare: {self.docs:,} documents, {self.tokens:,} tokens, {rate:,.0f} tokens/s"
            done = self.docs if self.unit == "documents" else self.bytes
            if self.total and 0 < done:
                fraction = min(done / self.total, 1.0)
                left = (now - self.start) * (1 - fraction) / fraction
                line += f", {fraction:.0%} (about {_duration(left)} left)"
            self.log(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        seconds = time.perf_counter() - self.start
        self.log(f"prepare: tokenised {self.docs:,} documents, {self.tokens:,} tokens in "
                 f"{seconds:.1f} s ({self.tokens / max(seconds, 1e-9):,.0f} tokens/s)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _progress_total(documents: _Documents, resolved: dict[str, Any], source: dict[str, Any],
                    ds: Any) -> tuple[int | None, str]:
    """``(total, unit)`` of the progress: the documents when counted (the validation rule)
    or a dataset's length, else the bytes of ``.txt`` inputs, else unknown."""
    if "documents" in resolved:
        return int(resolved["documents"]), "documents"
    if ds is not None and documents.known_count:
        return len(ds), "documents"
    files = source.get("files") or []
    if files and all(f.endswith(".txt") for f in files):
        return sum(os.path.getsize(f) for f in files), "bytes"
    return None, "documents"


# --------------------------------------------------------------------------- tokenising

_WORKER_TOKENIZER: Tokenizer | None = None  # set in each worker process only


def _init_worker(tokenizer: Tokenizer) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def _encode_in_worker(texts: list[str], eot: int | None, eot_first: bool
                      ) -> tuple[np.ndarray, np.ndarray]:
    assert _WORKER_TOKENIZER is not None
    return _encode_chunk(_WORKER_TOKENIZER, texts, eot, eot_first)


def _check_ids(ids: np.ndarray, tokenizer: Tokenizer) -> np.ndarray:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) > _MAX_ID):
        bad = int(ids.max()) if int(ids.max()) > _MAX_ID else int(ids.min())
        raise ValueError(f"the tokenizer {tokenizer.describe()['name']!r} gave the id {bad}; "
                         f"uint16 shards hold ids in [0, {_MAX_ID}] (a tokenizer too large "
                         "for llm.c's and nanoGPT's formats).")
    return ids.astype(np.uint16)


def _encode_chunk(tokenizer: Tokenizer, texts: list[str], eot: int | None,
                  eot_first: bool) -> tuple[np.ndarray, np.ndarray]:
    """The documents' tokens, concatenated (``uint16``), with EOT before (llm.c) or after
    (nanoGPT) each one (``eot=None``: none), and each document's length."""
    encoded = [tokenizer.encode_ordinary(t) for t in texts]
    extra = 0 if eot is None else 1
    lengths = np.fromiter((len(x) + extra for x in encoded), np.int64, len(encoded))
    if eot is None:
        flat: Iterable[int] = itertools.chain.from_iterable(encoded)
    elif eot_first:
        flat = itertools.chain.from_iterable(itertools.chain((eot,), x) for x in encoded)
    else:
        flat = itertools.chain.from_iterable(itertools.chain(x, (eot,)) for x in encoded)
    ids = np.fromiter(flat, np.int64, int(lengths.sum()))
    return _check_ids(ids, tokenizer), lengths


def _chunks(docs: Iterable[str]) -> Iterator[list[str]]:
    chunk: list[str] = []
    chars = 0
    for text in docs:
        chunk.append(text)
        chars += len(text)
        if chars >= _CHUNK_CHARS or len(chunk) >= _CHUNK_DOCS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def _pool_context() -> Any:
    """The platform's default start method (``multiprocessing.set_start_method`` changes it),
    except that a process where JAX has started its (multithreaded) runtime is not forked:
    ``forkserver`` starts the workers from a fresh process instead."""
    ctx: Any = multiprocessing.get_context()
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = getattr(bridge, "backends_are_initialized", None)
    if ctx.get_start_method() == "fork" and started is not None and started():
        ctx = multiprocessing.get_context("forkserver")
    if ctx.get_start_method() == "forkserver":
        # The server imports this module once (before it starts), not each worker.
        ctx.set_forkserver_preload(["__main__", __name__])
    return ctx


def _encoded(tokenizer: Tokenizer, docs: Iterable[str], eot_first: bool, workers: int
             ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(tokens, lengths)`` per chunk of documents, in order; ``workers > 1``: a process
    pool, at most ``2 * workers`` chunks in flight (memory stays bounded on any corpus)."""
    if workers == 1:
        for chunk in _chunks(docs):
            yield _encode_chunk(tokenizer, chunk, tokenizer.eot, eot_first)
        return
    with _pool_context().Pool(workers, _init_worker, (tokenizer,)) as pool:
        pending: collections.deque = collections.deque()
        for chunk in _chunks(docs):
            pending.append(pool.apply_async(_encode_in_worker, (chunk, tokenizer.eot, eot_first)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# --------------------------------------------------------------------------- writing


class _ShardSink:
    """Writes the token stream, split by split (validation first), into ``folder``: llm.c
    shards of ``shard_size`` tokens, or one nanoGPT ``.bin`` per split; records the
    manifest's entries."""

    def __init__(self, folder: str, fmt: str, name: str, shard_size: int, log: Log):
        self.folder, self.fmt, self.name = folder, fmt, name
        self.shard_size, self.log = shard_size, log
        self.entries: list[dict[str, Any]] = []
        self._split: str | None = None
        self._parts: list[np.ndarray] = []
        self._fill = self._docs = 0
        self._file: Any = None

    def add(self, split: str, tokens: np.ndarray, starts: np.ndarray) -> None:
        """Append ``tokens`` (``uint16``) to ``split``; ``starts``: where documents begin."""
        if split != self._split:  # validation first (_route), then training
            self._close()
            self._split = split
        if self.fmt == "nanogpt":
            if self._file is None:
                self._file = open(os.path.join(self.folder, f"{split}.bin"), "wb")
            self._file.write(tokens.astype("<u2", copy=False).tobytes())
            self._fill += len(tokens)
            self._docs += len(starts)
            return
        pos = 0
        while pos < len(tokens):
            take = min(self.shard_size - self._fill, len(tokens) - pos)
            self._parts.append(tokens[pos:pos + take])
            self._docs += int(np.count_nonzero((starts >= pos) & (starts < pos + take)))
            self._fill += take
            pos += take
            if self._fill == self.shard_size:
                self._write_shard()

    def _write_shard(self) -> None:
        tokens = np.concatenate(self._parts) if self._parts else np.zeros(0, np.uint16)
        file = f"{self.name}_{self._split}_{len(self.entries):06d}.bin"
        write_shard(os.path.join(self.folder, file), tokens)
        self._record(file)
        self._parts = []

    def _record(self, file: str) -> None:
        path = os.path.join(self.folder, file)
        self.entries.append({"file": file, "split": self._split, "tokens": self._fill,
                             "documents": self._docs, "sha256": sha256_file(path)})
        self.log(f"wrote {file}: {self._fill:,} tokens; documents starting in it: {self._docs:,}")
        self._fill = self._docs = 0

    def _close(self) -> None:
        if self._split is None:
            return
        if self.fmt == "nanogpt":
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None
                self._record(f"{self._split}.bin")
        elif self._fill:
            self._write_shard()

    def abort(self) -> None:
        """Close an open ``.bin`` without recording it (the run failed)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> list[dict[str, Any]]:
        self._close()
        self._split = None
        return self.entries


def _route(tokens: np.ndarray, lengths: np.ndarray, state: dict[str, int]
           ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Split one chunk into its validation and training parts, each with the offsets where
    its documents begin: ``state`` holds the validation documents or tokens still to take
    (``"documents"`` / ``"tokens"``)."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    if "documents" in state:
        k = min(state["documents"], len(lengths))
        state["documents"] -= k
        cut = int(ends[k - 1]) if k else 0
    else:
        cut = min(state["tokens"], len(tokens))
        state["tokens"] -= cut
    if cut:
        yield "val", tokens[:cut], starts[starts < cut]
    if cut < len(tokens):
        rest = starts[starts >= cut] - cut
        yield "train", tokens[cut:], rest


# --------------------------------------------------------------------------- prepare


def _default_name(inputs: Sequence[str], hf_dataset: str | None) -> str:
    if hf_dataset is not None:
        raw = os.path.basename(os.path.normpath(hf_dataset))
    elif inputs:
        first = inputs[0]
        raw = (os.path.basename(os.path.normpath(first)) if os.path.isdir(first)
               else os.path.basename(first).split(".")[0])
    else:
        raw = ""
    name = re.sub(r"[^A-Za-z0-9.-]+", "_", raw).strip("._")
    return name or "data"


def _check_options(fmt: str, split: str, docs: str, shard_size: int, workers: int,
                   val: dict[str, Any], text_field: str, name: str) -> None:
    for arg, value, allowed in (("format", fmt, FORMATS), ("split", split, SPLITS),
                                ("docs", docs, DOCS)):
        if value not in allowed:
            raise ValueError(f"`{arg}` must be one of {', '.join(map(repr, allowed))}; got "
                             f"{value!r}.")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or not (
            0 < shard_size < 2**31):
        raise ValueError(f"`shard_size` must be an int in [1, 2**31 - 1] (llm.c's int32 "
                         f"header); got {shard_size!r}.")
    check_positive_int(workers, "workers")
    given = {k: v for k, v in val.items() if v is not None}
    if len(given) > 1:
        raise ValueError(f"give at most one of `val_documents`, `val_tokens`, "
                         f"`val_fraction`; got {given}.")
    for key in ("val_documents", "val_tokens"):
        check_optional_positive_int(val[key], key)
    f = val["val_fraction"]
    if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float))
                          or not 0 < f < 1):
        raise ValueError(f"`val_fraction` must be a number in (0, 1); got {f!r}.")
    if split == "text" and (val["val_documents"] is not None or val["val_tokens"] is not None):
        raise ValueError("split='text' cuts the text by characters: give `val_fraction`, not "
                         "`val_documents` or `val_tokens`.")
    if not text_field:
        raise ValueError("`text_field` must name the field or column holding the text; got ''.")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ValueError(f"`name` must be letters, digits, '_', '.' or '-' (it starts the "
                         f"shards' file names); got {name!r}.")


def _commit(out_dir: str, partial: str, entries: list[dict[str, Any]], name: str,
            manifest: dict[str, Any]) -> None:
    """Move the finished shards beside the manifest, drop this name's stale shards, write
    the manifest last."""
    manifest_path = os.path.join(out_dir, MANIFEST)
    if os.path.exists(manifest_path):
        os.remove(manifest_path)
    new = {e["file"] for e in entries}
    stale = re.compile(rf"{re.escape(name)}_(train|val)_\d{{6}}\.bin")
    for f in os.listdir(out_dir):
        if stale.fullmatch(f) and f not in new:
            os.remove(os.path.join(out_dir, f))
    for e in entries:
        os.replace(os.path.join(partial, e["file"]), os.path.join(out_dir, e["file"]))
    write_json(manifest_path, manifest)
    shutil.rmtree(partial, ignore_errors=True)


def _totals(entries: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    return {s: {"tokens": sum(e["tokens"] for e in entries if e["split"] == s),
                "documents": sum(e["documents"] for e in entries if e["split"] == s),
                "shards": sum(1 for e in entries if e["split"] == s)}
            for s in ("val", "train")}


def prepare(
    inputs: str | os.PathLike | Sequence[str | os.PathLike] | None,
    out_dir: str | os.PathLike,
    *,
    tokenizer: str | Tokenizer = "gpt2",
    rank_file: str | os.PathLike | None = None,
    eot: int | str | None = None,
    format: str = "llmc",
    shard_size: int = 100_000_000,
    split: str = "documents",
    val_documents: int | None = None,
    val_tokens: int | None = None,
    val_fraction: float | None = None,
    docs: str = "file",
    text_field: str = "text",
    hf_dataset: str | None = None,
    hf_config: str | None = None,
    hf_split: str = "train",
    hf_data_files: str | Sequence[str] | None = None,
    streaming: bool = False,
    workers: int | None = None,
    name: str | None = None,
    log: Log | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Tokenise ``inputs`` (or ``hf_dataset``) into token shards in ``out_dir`` (see the
    module docstring for the layouts, the validation split and restarts).

    Args:
        (each option as ``seqjax prepare --help`` says it: :data:`OPTIONS`, one description
        of each; ``prepare.__doc__`` lists them)
        log: called with a line per shard written, the progress lines and the summary
            (default: silent).
        progress: a tqdm bar on stderr instead of progress lines (the summary still goes to
            ``log``).

    Returns: the manifest written to ``out_dir/manifest.json``.

    Raises: ``ValueError`` naming the problem: no input files, an empty corpus, an empty
    split, a field or column that is missing, an id above 65535, an unknown option.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    input_list = [os.fspath(p) for p in (inputs or [])]
    workers = (os.cpu_count() or 1) if workers is None else workers
    val = {"val_documents": val_documents, "val_tokens": val_tokens,
           "val_fraction": val_fraction}
    name = _default_name(input_list, hf_dataset) if name is None else name
    _check_options(format, split, docs, shard_size, workers, val, text_field, name)
    if bool(input_list) == (hf_dataset is not None):
        raise ValueError("give input files or `hf_dataset` (--hf_dataset), not "
                         f"{'both' if input_list else 'neither'}.")
    log = log or (lambda message: None)

    documents, source, ds = _source(input_list, "file" if split == "text" else docs,
                                    text_field, hf_dataset, hf_config, hf_split, hf_data_files,
                                    streaming)

    char = tokenizer == "char"
    if char and (split != "text" or rank_file is not None or eot is not None):
        raise ValueError("tokenizer='char' (the text's characters, no end-of-text token) needs "
                         f"split='text' and no `rank_file` or `eot`; got split={split!r}, "
                         f"rank_file={rank_file!r}, eot={eot!r}.")
    spec, tok = ("char", None) if char else _tokenizer(tokenizer, rank_file, eot, split)

    out_dir = os.path.abspath(os.fspath(out_dir))
    partial = os.path.join(out_dir, PARTIAL_DIR)
    shutil.rmtree(partial, ignore_errors=True)  # a killed run's leftovers: start over
    os.makedirs(partial)
    sink = _ShardSink(partial, format, name, shard_size, log)
    resolved: dict[str, Any] = {}
    try:
        if split == "text":
            tok = _text_split(documents, tok, val_fraction, sink, source, resolved)
        else:
            assert tok is not None
            state = _validation_rule(documents, val_documents, val_tokens, val_fraction,
                                     shard_size, source, resolved)
            meter = _Progress(log, *_progress_total(documents, resolved, source, ds), progress)
            stream = meter.read(documents) if meter.unit == "bytes" else documents
            for tokens, lengths in _encoded(tok, stream, format == "llmc", workers):
                meter.add(len(lengths), len(tokens))
                for s, part, starts in _route(tokens, lengths, state):
                    sink.add(s, part, starts)
            meter.close()
        entries = sink.close()
        totals = _totals(entries)
        _check_totals(totals, source, resolved)
    except BaseException:
        sink.abort()
        shutil.rmtree(partial, ignore_errors=True)
        raise

    from seqjax import __version__

    manifest = {
        "format": format,
        "tokenizer": tok.describe(),
        "shards": entries,
        "splits": totals,
        "tokens": totals["val"]["tokens"] + totals["train"]["tokens"],
        "documents": totals["val"]["documents"] + totals["train"]["documents"],
        "empty_documents_skipped": documents.skipped,
        "name": name,
        "inputs": source,
        "options": {
            "tokenizer": spec, "rank_file": None if rank_file is None else os.fspath(rank_file),
            "eot": eot, "format": format, "shard_size": shard_size, "split": split,
            "val_documents": val_documents, "val_tokens": val_tokens,
            "val_fraction": val_fraction, "validation": resolved, "docs": docs,
            "text_field": text_field, "workers": workers},
        "seqjax_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    _commit(out_dir, partial, entries + ([{"file": CHAR_TOKENIZER}] if char else []), name,
            manifest)
    return manifest


def _source(input_list: list[str], docs: str, text_field: str, hf_dataset: str | None,
            hf_config: str | None, hf_split: str, hf_data_files: Any, streaming: bool
            ) -> tuple[_Documents, dict[str, Any], Any]:
    """``(documents, source, dataset)``: the documents of the files or of the Hugging Face
    dataset (``None`` for files), and what the manifest records of where they came from."""
    if hf_dataset is None:
        files = _find_files(input_list)
        return (_Documents(lambda: _file_documents(files, docs, text_field), known_count=True),
                {"files": files}, None)
    ds = _load_hf(hf_dataset, hf_config, hf_split, hf_data_files, streaming)
    source = {"hf_dataset": hf_dataset, "hf_config": hf_config, "hf_split": hf_split,
              "hf_data_files": hf_data_files if hf_data_files is None or isinstance(
                  hf_data_files, str) else list(hf_data_files),
              "streaming": streaming}
    return (_Documents(lambda: _hf_documents(ds, text_field, hf_dataset),
                       known_count=not streaming), source, ds)


def _tokenizer(tokenizer: str | Tokenizer, rank_file: str | os.PathLike | None,
               eot: int | str | None, split: str) -> tuple[Any, Tokenizer]:
    """``(spec, tokenizer)``: a spec loaded (:func:`load_text_tokenizer`) or a tokenizer as it
    is; its ids must fit uint16, and ``split="documents"`` needs its end-of-text id."""
    if isinstance(tokenizer, str):
        spec: Any = tokenizer
        tok = load_text_tokenizer(tokenizer, rank_file=rank_file, eot=eot)
    else:
        if rank_file is not None or eot is not None:
            raise ValueError("`rank_file` and `eot` apply to a tokenizer spec (str), not to a "
                             f"{type(tokenizer).__name__}.")
        spec, tok = tokenizer.describe(), tokenizer
    if tok.eot is None and split == "documents":
        how = ("give it with `eot` (--eot ID_OR_TOKEN)" if isinstance(tokenizer, str) else
               "load it with load_text_tokenizer(..., eot=ID_OR_TOKEN)")
        raise ValueError(f"the tokenizer {spec!r} has no end-of-text id, which "
                         f"split='documents' writes between documents: {how}, or use "
                         "split='text' (no end-of-text token).")
    if tok.vocab_size > _MAX_ID + 1:
        raise ValueError(f"the tokenizer {spec!r} has {tok.vocab_size:,} ids; uint16 shards "
                         f"hold ids in [0, {_MAX_ID}] (at most {_MAX_ID + 1:,} ids).")
    return spec, tok


def _text_split(documents: _Documents, tok: Tokenizer | None, val_fraction: float | None,
                sink: _ShardSink, source: dict[str, Any], resolved: dict[str, Any]
                ) -> Tokenizer:
    """``split="text"``: the documents joined, cut by characters (nanoGPT's
    ``shakespeare/prepare.py``: ``int(n * 0.9)``), each part encoded in one call. ``tok``
    ``None``: the text's characters (``tokenizer="char"``), saved in the sink's folder.
    Returns the tokenizer."""
    fraction = DEFAULT_VAL_FRACTION["text"] if val_fraction is None else val_fraction
    resolved["val_fraction"] = fraction
    text = "\n\n".join(documents)
    if not text:
        raise ValueError(f"empty corpus: the inputs {_describe_source(source)} hold no text.")
    if tok is None:
        path = os.path.join(sink.folder, CHAR_TOKENIZER)
        CharTokenizer.from_text(text, SpecialTokens.none()).save(path)
        tok = load_text_tokenizer(f"seqjax:{path}")
    n = len(text)
    cut = int(n * (1 - fraction))
    parts = {"val": text[cut:], "train": text[:cut]}
    for s in ("val", "train"):
        if not parts[s]:
            raise ValueError(f"the {s} split is empty: the text has {n} characters and "
                             f"`val_fraction` is {fraction}.")
        ids = _check_ids(np.asarray(tok.encode_ordinary(parts[s]), np.int64), tok)
        sink.add(s, ids, np.zeros(1, np.int64))
    return tok


def _check_totals(totals: dict[str, dict[str, int]], source: dict[str, Any],
                  resolved: dict[str, Any]) -> None:
    """Both splits must hold tokens (the corpus a document)."""
    if not totals["val"]["documents"] and not totals["train"]["documents"]:
        raise ValueError(f"empty corpus: the inputs {_describe_source(source)} hold no "
                         "non-empty document.")
    for s, what in (("val", "validation"), ("train", "training")):
        if not totals[s]["tokens"]:
            raise ValueError(
                f"the {what} split is empty: the corpus has "
                f"{totals['val']['documents'] + totals['train']['documents']} documents "
                f"({totals['val']['tokens'] + totals['train']['tokens']} tokens) and the "
                f"validation split takes {_describe_rule(resolved)}; give a smaller "
                "`val_*` (or split='text' for one document).")


def _validation_rule(documents: _Documents, val_documents: int | None,
                     val_tokens: int | None, val_fraction: float | None, shard_size: int,
                     source: dict[str, Any], resolved: dict[str, Any]) -> dict[str, int]:
    """The validation documents or tokens to take (the module docstring's rules); what was
    chosen goes into ``resolved``."""
    if val_documents is not None:
        resolved["val_documents"] = val_documents
        return {"documents": val_documents}
    if val_tokens is not None:
        resolved["val_tokens"] = val_tokens
        return {"tokens": val_tokens}
    if not documents.known_count:
        if val_fraction is None:  # a streamed dataset: llm.c's first shard
            resolved["val_tokens"] = shard_size
            return {"tokens": shard_size}
        raise ValueError("`val_fraction` needs the number of documents, unknown for a "
                         "streamed dataset; give `val_documents` or `val_tokens`.")
    fraction = DEFAULT_VAL_FRACTION["documents"] if val_fraction is None else val_fraction
    count = documents.count()
    if count == 0:
        raise ValueError(f"empty corpus: the inputs {_describe_source(source)} hold no "
                         "non-empty document.")
    k = max(1, int(fraction * count))
    resolved.update(val_fraction=fraction, documents=count, val_documents=k)
    return {"documents": k}


def _describe_rule(resolved: dict[str, Any]) -> str:
    if "val_fraction" in resolved and "documents" in resolved:
        return (f"{resolved['val_documents']} documents (val_fraction {resolved['val_fraction']} "
                f"of {resolved['documents']})")
    if "val_documents" in resolved:
        return f"{resolved['val_documents']} documents (val_documents)"
    if "val_tokens" in resolved:
        return f"the first {resolved['val_tokens']} tokens (val_tokens)"
    return f"the last {resolved['val_fraction']} of the text (val_fraction)"


def _describe_source(source: dict[str, Any]) -> str:
    if "files" in source:
        files = source["files"]
        return f"({len(files)} file{'s' if len(files) != 1 else ''}: {files[0]}" + (
            ", ...)" if len(files) > 1 else ")")
    return f"(the dataset {source['hf_dataset']!r}, split {source['hf_split']!r})"


# --------------------------------------------------------------------------- command line


def _id_or_token(value: str) -> int | str:
    return int(value) if value.isdigit() else value


#: Every option of :func:`prepare` and of ``seqjax prepare``, described once: its name (the
#: argument and, with ``--``, the flag), its ``argparse`` settings (the default is
#: ``prepare``'s), and what it does. ``prepare``'s docstring and ``--help`` read it.
OPTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "inputs": ({"nargs": "*", "metavar": "INPUT"},
               "local .txt, .jsonl or .parquet files, folders (every such file below, "
               "sorted) or globs (default: none; then --hf_dataset)"),
    "out_dir": ({"required": True, "metavar": "DIR"},
                "the folder to write (required; created if missing; flag --out or --out_dir)"),
    "tokenizer": ({}, "gpt2 (tiktoken), hf:PATH or a path ending in tokenizer.json (Hugging "
                      "Face), seqjax:PATH (a tokenizer saved by seqjax), char (with --split "
                      "text: the text's sorted characters, nanoGPT's shakespeare_char, saved "
                      "as OUT/tokenizer.json); in Python also a seqjax Tokenizer"),
    "rank_file": ({"metavar": "FILE"},
                  "GPT-2's ranks as a .tiktoken file (default: openai-whisper's "
                  "whisper/assets/gpt2.tiktoken when installed, else tiktoken's cache or "
                  "download)"),
    "eot": ({"type": _id_or_token, "metavar": "ID_OR_TOKEN"},
            "the end-of-text id or token, for hf: and seqjax: tokenizers (default: "
            "<|endoftext|>, </s>, [SEP] or <eos> for hf:, the eos token for seqjax:)"),
    "format": ({"choices": FORMATS},
               "llmc: headers, EOT before each document, shards of --shard_size; nanogpt: "
               "headerless train.bin/val.bin, EOT after each document"),
    "shard_size": ({"type": int, "metavar": "N"}, "tokens per llm.c shard"),
    "split": ({"choices": SPLITS},
              "documents: validation = the first documents; text: the inputs as one text, "
              "cut by characters as nanoGPT's shakespeare/prepare.py, no EOT"),
    "val_documents": ({"type": int, "metavar": "N"},
                      "validation = the first N documents (default: unset)"),
    "val_tokens": ({"type": int, "metavar": "N"},
                   "validation = exactly the first N tokens, llm.c's rule (default: unset; "
                   "with --streaming and no other --val_* option: --shard_size)"),
    "val_fraction": ({"type": float, "metavar": "F"},
                     "validation = the first max(1, int(F*D)) of D documents, or with --split "
                     "text the last F of the characters (default: 0.01 of the documents; 0.1 "
                     "with --split text); at most one --val_* option"),
    "docs": ({"choices": DOCS},
             "how a .txt file is cut into documents: file, lines, or paragraphs (at blank "
             "lines)"),
    "text_field": ({"metavar": "FIELD"},
                   "the .jsonl field, .parquet column or dataset column holding the text"),
    "hf_dataset": ({"metavar": "NAME"},
                   "a Hugging Face dataset instead of INPUTs: a hub name, a builder (json, "
                   "parquet, text) with --hf_data_files, or a save_to_disk folder (default: "
                   "unset)"),
    "hf_config": ({"metavar": "CONFIG"}, "the dataset's configuration (default: unset)"),
    "hf_split": ({"metavar": "SPLIT"}, "the dataset split to read"),
    "hf_data_files": ({"action": "append", "metavar": "FILE"},
                      "a data file for a builder such as json; repeat for several (default: "
                      "unset)"),
    "streaming": ({"action": "store_true"},
                  "stream the dataset instead of downloading it whole (default: off)"),
    "workers": ({"type": int, "metavar": "N"},
                "tokenising processes; 1 tokenises in this process (default: the number of "
                "CPUs)"),
    "name": ({}, "the shards' file-name prefix (default: the first input's file or folder "
                 "name, or the dataset's name)"),
}


def _describe_options() -> str:
    """``prepare``'s ``Args`` section: each option of :data:`OPTIONS` with its default."""
    defaults = {k: v.default for k, v in inspect.signature(prepare).parameters.items()}
    lines = []
    for name, (_, text) in OPTIONS.items():
        if "default" not in text and defaults.get(name) not in (None, inspect.Parameter.empty):
            text += f" (default: {defaults[name]!r})"
        lines.append(textwrap.fill(f"{name}: {text}", 88, initial_indent=" " * 8,
                                   subsequent_indent=" " * 12))
    return "\n".join(lines)


if prepare.__doc__ is not None:  # python -OO strips docstrings
    prepare.__doc__ = prepare.__doc__.replace(
        "        (each option as ``seqjax prepare --help`` says it: :data:`OPTIONS`, one "
        "description\n        of each; ``prepare.__doc__`` lists them)\n",
        _describe_options() + "\n")


def _parser() -> argparse.ArgumentParser:
    defaults = {k: v.default for k, v in inspect.signature(prepare).parameters.items()}
    defaults["workers"] = os.cpu_count() or 1
    p = argparse.ArgumentParser(
        prog="seqjax prepare",
        description="Tokenise text into token shards: llm.c's format (a 1024-byte header + "
                    "uint16 tokens, EOT before each document; NAME_val_000000.bin, "
                    "NAME_train_000001.bin, ...) or nanoGPT's headerless train.bin/val.bin, "
                    "plus manifest.json, written last. A killed run leaves no manifest; "
                    "rerun the same command to redo it.",
        epilog="Examples: seqjax prepare shakespeare.txt --out data/shakespeare --format "
               "nanogpt --split text --val_fraction 0.1  |  seqjax prepare --hf_dataset "
               "HuggingFaceFW/fineweb-edu --hf_config sample-10BT --streaming --out "
               "data/edu_fineweb10B --val_tokens 100000000")
    for name, (settings, text) in OPTIONS.items():
        kwargs = dict(settings)
        if name == "inputs":
            p.add_argument(name, help=text, **kwargs)
            continue
        if "action" not in kwargs and not kwargs.get("required"):
            kwargs["default"] = defaults[name]
            if "default" not in text:
                text += f" (default: {defaults[name]})"
        flags = ["--out", "--out_dir"] if name == "out_dir" else [f"--{name}"]
        p.add_argument(*flags, dest=name, help=text, **kwargs)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``seqjax prepare``: 0 when done; 2 with one line on stderr for bad input."""
    args = vars(_parser().parse_args(argv))
    files = args["hf_data_files"]
    if files and len(files) == 1:
        args["hf_data_files"] = files[0]
    try:
        manifest = prepare(
            log=lambda message: print(message, file=sys.stderr, flush=True),
            progress=sys.stderr.isatty(), **args)
    except (ValueError, TypeError, OSError, ImportError) as err:
        message = " ".join(str(err).split())
        print(f"seqjax prepare: error: {message}", file=sys.stderr)
        return 2
    s = manifest["splits"]
    print(f"{args['out_dir']}: {len(manifest['shards'])} {manifest['format']} shard(s); train "
          f"{s['train']['tokens']:,} tokens ({s['train']['documents']:,} documents), val "
          f"{s['val']['tokens']:,} tokens ({s['val']['documents']:,} documents); "
          f"tokenizer {manifest['tokenizer']['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``seqjax prepare``: tokenise text once into token shards that training memory-maps.

:func:`prepare` reads documents, tokenises them in ``workers`` processes and writes one of
the two layouts :func:`seqjax.data.shards.open_tokens` reads (``format``: llm.c's shards or
nanoGPT's ``.bin``), plus ``manifest.json``. Each option — the inputs one reader reads, the
formats, the validation rules — is described once, in :data:`OPTIONS` (``prepare.__doc__``
and ``--help`` show it). Empty documents are skipped and counted in the manifest.

**Tokenisation.** Documents are encoded as ordinary text (special tokens' spellings are not
special), in chunks sent to ``workers`` processes (at most ``2 * workers`` chunks ahead) and
collected in order, so every ``workers`` gives the same output (1 runs in-process). Workers
fork on Linux, or start from ``forkserver`` once JAX's runtime is up; under ``spawn`` (macOS,
Windows) a script needs the ``if __name__ == "__main__":`` guard. Ids must fit ``uint16``.

**Splits.** ``split="documents"``: validation is the corpus's first documents, then training
(a document may continue into the next llm.c shard of its split); both splits must hold a
document. ``split="text"``: the inputs as one text (``.txt`` read whole, documents joined
with ``"\\n\\n"``) cut by characters, each part encoded in one call, no EOT, held in memory
(nanoGPT's ``shakespeare/prepare.py``: on Tiny Shakespeare with GPT-2's BPE its 301,966 and
36,059 tokens; with ``tokenizer="char"`` and ``format="nanogpt"`` its ``shakespeare_char``
bins, id for id).

**Atomic and restartable.** Shards are written into ``OUT/.prepare-partial/``
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
from tqdm import tqdm

from seqjax._checks import check_optional_positive_int, check_positive_int
from seqjax._io import write_json
from seqjax._optional import require
from seqjax.data.shards import MANIFEST, _llmc_header, sha256_file
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
    """The input files, in the order given (folders and globs sorted, hidden names skipped),
    each once."""
    found: list[str] = []
    kinds = "/".join(SUFFIXES)
    for item in inputs:
        if _GLOB_CHARS.search(item):
            matches = [p for p in sorted(glob.glob(item, recursive=True))
                       if os.path.isfile(p) and p.endswith(SUFFIXES)]
            missing = f"the glob {item!r} matches no {kinds} file"
        elif os.path.isdir(item):  # os.walk: symlinked folders are not followed
            matches = sorted(os.path.join(root, f) for root, dirs, files in os.walk(item)
                             if not any(part.startswith(".") for part in
                                        os.path.relpath(root, item).split(os.sep) if part != ".")
                             for f in files if f.endswith(SUFFIXES) and not f.startswith("."))
            missing = f"the folder {item!r} holds no {kinds} file"
        elif os.path.isfile(item):
            if not item.endswith(SUFFIXES):
                raise ValueError(f"the input {item!r} is not a {kinds} file (the suffix says "
                                 "how to read it).")
            matches = [item]
        else:
            matches, missing = [], f"{item!r} does not exist"
        if not matches:
            raise ValueError(f"no input files found: {missing}.")
        found += matches
    return list(dict.fromkeys(os.path.abspath(f) for f in found))


def _field(row: Any, field: str, where: str) -> str:
    """``row[field]``, a string (``None``: ``""``), else a ``ValueError`` naming ``where``."""
    if not isinstance(row, dict) or field not in row:
        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise ValueError(f"{where}: no text field {field!r} (--text_field); it has {keys}.")
    text = row[field]
    if text is not None and not isinstance(text, str):
        raise ValueError(f"{where}: the field {field!r} must be a string; got "
                         f"{type(text).__name__}.")
    return text or ""


def _check_column(columns: list[str] | None, field: str, where: str) -> None:
    if columns is not None and field not in columns:
        raise ValueError(f"{where}: no column {field!r} (--text_field); it has {columns}.")


class _Reader:
    """The one reader of every input: the documents of the local files (``docs`` cuts a
    ``.txt``) or of a Hugging Face dataset split, re-iterable, the non-empty ones
    (``skipped`` counts the others); ``source`` is what the manifest records of them."""

    def __init__(self, inputs: list[str], docs: str, field: str, hf_dataset: str | None,
                 config: str | None, split: str, data_files: Any, streaming: bool):
        self.docs, self.field, self.name, self.skipped = docs, field, hf_dataset, 0
        self.files: list[str] = []
        self.ds: Any = None
        #: Whether the documents can be counted before tokenising (not a streamed dataset).
        self.countable = hf_dataset is None or not streaming
        if hf_dataset is None:
            self.files = _find_files(inputs)
            self.source: dict[str, Any] = {"files": self.files}
        else:
            self.ds = _load_hf(hf_dataset, config, split, data_files, streaming)
            self.source = {"hf_dataset": hf_dataset, "hf_config": config, "hf_split": split,
                           "hf_data_files": data_files if data_files is None or isinstance(
                               data_files, str) else list(data_files),
                           "streaming": streaming}

    def __iter__(self) -> Iterator[str]:
        self.skipped = 0
        for text in self._read():
            if text:
                yield text
            else:
                self.skipped += 1

    def _read(self) -> Iterator[str]:
        field = self.field
        if self.ds is not None:
            where = f"the dataset {self.name!r}"
            _check_column(getattr(self.ds, "column_names", None), field, where)
            for i, row in enumerate(self.ds):
                yield _field(row, field, f"{where}, row {i}")
            return
        for path in self.files:
            if path.endswith(".parquet"):
                pq = require("pyarrow.parquet", "reading .parquet inputs (pyarrow)")
                pf = pq.ParquetFile(path)
                _check_column(pf.schema_arrow.names, field, path)
                for batch in pf.iter_batches(columns=[field], batch_size=1024):
                    yield from (_field(row, field, path) for row in batch.to_pylist())
                continue
            where = path
            try:
                with open(path, encoding="utf-8") as f:
                    if path.endswith(".jsonl"):
                        for lineno, line in enumerate(f, 1):
                            where = f"{path}:{lineno}"
                            if line.strip():
                                yield _field(json.loads(line), field, where)
                    elif self.docs == "lines":
                        yield from (line.removesuffix("\n") for line in f)
                    elif self.docs == "file":
                        yield f.read()
                    else:  # llm.c's tinyshakespeare.py: "\n\n" ends each paragraph
                        *paragraphs, last = f.read().split("\n\n")
                        yield from (p + "\n\n" for p in paragraphs)
                        yield last
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not a JSON object ({err.msg}).") from None
            except UnicodeDecodeError as err:  # decoded in chunks: the line is unknown
                raise ValueError(f"{path}: not UTF-8 text ({err.reason}).") from None

    def size(self, counted: int | None) -> tuple[int | None, str]:
        """``(total, unit)`` of the progress: the ``counted`` documents, else a dataset's
        length, else the bytes of ``.txt`` inputs, else unknown."""
        if counted is not None or (self.ds is not None and self.countable):
            return len(self.ds) if counted is None else counted, "documents"
        if self.files and all(f.endswith(".txt") for f in self.files):
            return sum(os.path.getsize(f) for f in self.files), "bytes"
        return None, "documents"

    def empty(self, what: str = "non-empty document") -> ValueError:
        if self.ds is None:
            n = len(self.files)
            where = f"{n} file{'s' if n != 1 else ''}: {self.files[0]}{', ...' if n > 1 else ''}"
        else:
            where = f"the dataset {self.name!r}, split {self.source['hf_split']!r}"
        return ValueError(f"empty corpus: the inputs ({where}) hold no {what}.")


def _load_hf(name: str, config: str | None, split: str, data_files: Any, streaming: bool
             ) -> Any:
    """A dataset split: a ``save_to_disk`` folder's (``load_from_disk``), else
    ``load_dataset``'s."""
    datasets = require("datasets", "--hf_dataset (Hugging Face `datasets`)")
    saved = os.path.isdir(name) and any(
        os.path.exists(os.path.join(name, f))
        for f in ("dataset_info.json", "state.json", "dataset_dict.json"))
    try:
        if not saved:
            return datasets.load_dataset(name, config, split=split, data_files=data_files,
                                         streaming=streaming)
        ds = datasets.load_from_disk(name)
    except Exception as err:  # not found, no network, a bad config: one clear line
        raise ValueError(f"cannot load the dataset {name!r} (config {config!r}, split "
                         f"{split!r}): {type(err).__name__}: {err}") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"the dataset {name!r} has no split {split!r} (--hf_split); it "
                             f"has {sorted(ds)}.")
        ds = ds[split]
    return ds.to_iterable_dataset() if streaming else ds


# --------------------------------------------------------------------------- progress


class _Progress:
    """The module docstring's progress (a line every :data:`PROGRESS_EVERY_S` s): ``total``
    counts documents (``unit="documents"``) or input bytes (``"bytes"``, from :meth:`read`)."""

    def __init__(self, log: Log, total: int | None, unit: str, bar: bool) -> None:
        self.log, self.total, self.unit = log, total, unit
        self.docs = self.tokens = self.bytes = 0
        self.start = self.last = time.perf_counter()
        self.bar = tqdm(total=total, unit=" docs" if unit == "documents" else "B",
                        unit_scale=unit == "bytes", desc="tokenising", file=sys.stderr,
                        dynamic_ncols=True) if bar else None

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
        done = self.docs if self.unit == "documents" else self.bytes
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
            self.bar.set_postfix_str(f"{self.tokens:,} tokens, {rate:,.0f} tokens/s")
        elif now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            line = f"prepare: {self.docs:,} documents, {self.tokens:,} tokens, {rate:,.0f} tokens/s"
            if self.total and done:
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
    return (f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400
            else f"{seconds / 3600:.1f} h")


# --------------------------------------------------------------------------- tokenising

_WORKER_TOKENIZER: Tokenizer | None = None  # set in each worker process only


def _init_worker(tokenizer: Tokenizer) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def _check_ids(ids: np.ndarray, tokenizer: Tokenizer) -> np.ndarray:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) > _MAX_ID):
        bad = int(ids.max()) if int(ids.max()) > _MAX_ID else int(ids.min())
        raise ValueError(f"the tokenizer {tokenizer.describe()['name']!r} gave the id {bad}; "
                         f"uint16 shards hold ids in [0, {_MAX_ID}] (a tokenizer too large "
                         "for llm.c's and nanoGPT's formats).")
    return ids.astype(np.uint16)


def _encode_chunk(tokenizer: Tokenizer | None, texts: list[str], eot: int | None,
                  eot_first: bool) -> tuple[np.ndarray, np.ndarray]:
    """The documents' tokens, concatenated (``uint16``), with EOT before (llm.c) or after
    (nanoGPT) each one (``eot=None``: none), and each document's length. ``tokenizer``
    ``None``: the worker process's."""
    tokenizer = _WORKER_TOKENIZER if tokenizer is None else tokenizer
    assert tokenizer is not None
    encoded = [tokenizer.encode_ordinary(t) for t in texts]
    if eot is not None:
        encoded = [[eot, *x] if eot_first else [*x, eot] for x in encoded]
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    ids = np.fromiter(itertools.chain.from_iterable(encoded), np.int64, int(lengths.sum()))
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
        yield from (_encode_chunk(tokenizer, c, tokenizer.eot, eot_first) for c in _chunks(docs))
        return
    with _pool_context().Pool(workers, _init_worker, (tokenizer,)) as pool:
        pending: collections.deque = collections.deque()
        for chunk in _chunks(docs):
            pending.append(pool.apply_async(_encode_chunk, (None, chunk, tokenizer.eot, eot_first)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# --------------------------------------------------------------------------- writing


class _ShardSink:
    """Writes the token stream, split by split (validation first), into ``folder``: llm.c
    shards of ``shard_size`` tokens (the header written when a shard is complete), or one
    nanoGPT ``.bin`` per split; records the manifest's entries."""

    def __init__(self, folder: str, fmt: str, name: str, shard_size: int, log: Log):
        self.folder, self.name, self.log = folder, name, log
        self.header = fmt == "llmc"
        self.limit = shard_size if self.header else sys.maxsize
        self.entries: list[dict[str, Any]] = []
        self._split: str | None = None
        self._file: Any = None
        self._fill = self._docs = 0

    def add(self, split: str, tokens: np.ndarray, starts: np.ndarray) -> None:
        """Append ``tokens`` (``uint16``) to ``split``; ``starts``: where documents begin."""
        if split != self._split:  # validation first (_route), then training
            self.close()
            self._split = split
        pos = 0
        while pos < len(tokens):
            if self._file is None:
                file = (f"{self.name}_{split}_{len(self.entries):06d}.bin" if self.header
                        else f"{split}.bin")
                self._file = open(os.path.join(self.folder, file), "wb")
                if self.header:  # rewritten with the count when the shard is complete
                    self._file.write(_llmc_header(0))
            take = min(self.limit - self._fill, len(tokens) - pos)
            self._file.write(tokens[pos:pos + take].astype("<u2", copy=False).tobytes())
            self._docs += int(np.count_nonzero((starts >= pos) & (starts < pos + take)))
            self._fill += take
            pos += take
            if self._fill == self.limit:
                self.close()

    def close(self) -> list[dict[str, Any]]:
        """Finish the open file, record it; returns the entries."""
        if self._file is not None:
            if self.header:
                self._file.seek(0)
                self._file.write(_llmc_header(self._fill))
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            path, self._file = self._file.name, None
            file = os.path.basename(path)
            self.entries.append({"file": file, "split": self._split, "tokens": self._fill,
                                 "documents": self._docs, "sha256": sha256_file(path)})
            self.log(f"wrote {file}: {self._fill:,} tokens; documents starting in it: "
                     f"{self._docs:,}")
            self._fill = self._docs = 0
        return self.entries

    def abort(self) -> None:
        """Close an open file without recording it (the run failed)."""
        if self._file is not None:
            self._file.close()
            self._file = None


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
        yield "train", tokens[cut:], starts[starts >= cut] - cut


# --------------------------------------------------------------------------- prepare


def _default_name(inputs: Sequence[str], hf_dataset: str | None) -> str:
    raw = os.path.basename(os.path.normpath(hf_dataset or (inputs[0] if inputs else ".")))
    if hf_dataset is None and inputs and not os.path.isdir(inputs[0]):
        raw = raw.split(".")[0]
    return re.sub(r"[^A-Za-z0-9.-]+", "_", raw).strip("._") or "data"


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
    if split == "text" and given.keys() - {"val_fraction"}:
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
        (the options of :data:`OPTIONS`)
        log: called with a line per shard written, the progress lines and the summary
            (default: silent).
        progress: a tqdm bar on stderr instead of progress lines (the summary still goes to
            ``log``).

    Returns: the manifest written to ``out_dir/manifest.json``.

    Raises: ``ValueError`` naming the problem: no input files, an empty corpus, an empty
    split, a field or column that is missing, an id above 65535, an unknown option.
    """
    input_list = [os.fspath(p) for p in (
        [inputs] if isinstance(inputs, (str, os.PathLike)) else inputs or [])]
    workers = (os.cpu_count() or 1) if workers is None else workers
    val = {"val_documents": val_documents, "val_tokens": val_tokens,
           "val_fraction": val_fraction}
    name = _default_name(input_list, hf_dataset) if name is None else name
    _check_options(format, split, docs, shard_size, workers, val, text_field, name)
    if bool(input_list) == (hf_dataset is not None):
        raise ValueError("give input files or `hf_dataset` (--hf_dataset), not "
                         f"{'both' if input_list else 'neither'}.")
    log = log or (lambda message: None)

    documents = _Reader(input_list, "file" if split == "text" else docs, text_field, hf_dataset,
                        hf_config, hf_split, hf_data_files, streaming)

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
            tok = _text_split(documents, tok, val_fraction, sink, resolved)
        else:
            assert tok is not None
            state = _validation_rule(documents, val_documents, val_tokens, val_fraction,
                                     shard_size, resolved)
            meter = _Progress(log, *documents.size(resolved.get("documents")), progress)
            stream = meter.read(documents) if meter.unit == "bytes" else documents
            for tokens, lengths in _encoded(tok, stream, format == "llmc", workers):
                meter.add(len(lengths), len(tokens))
                for s, part, starts in _route(tokens, lengths, state):
                    sink.add(s, part, starts)
            meter.close()
        entries = sink.close()
        totals = _totals(entries, documents, resolved)
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
        "inputs": documents.source,
        "options": {
            "tokenizer": spec, "rank_file": None if rank_file is None else os.fspath(rank_file),
            "eot": eot, "format": format, "shard_size": shard_size, "split": split,
            **val, "validation": resolved, "docs": docs, "text_field": text_field,
            "workers": workers},
        "seqjax_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    _commit(out_dir, partial, entries + ([{"file": CHAR_TOKENIZER}] if char else []), name,
            manifest)
    return manifest


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


def _text_split(documents: _Reader, tok: Tokenizer | None, val_fraction: float | None,
                sink: _ShardSink, resolved: dict[str, Any]) -> Tokenizer:
    """``split="text"``: the documents joined, cut by characters (nanoGPT's
    ``shakespeare/prepare.py``: ``int(n * 0.9)``), each part encoded in one call. ``tok``
    ``None``: the text's characters (``tokenizer="char"``), saved in the sink's folder.
    Returns the tokenizer."""
    fraction = resolved["val_fraction"] = (DEFAULT_VAL_FRACTION["text"] if val_fraction is None
                                           else val_fraction)
    text = "\n\n".join(documents)
    if not text:
        raise documents.empty("text")
    if tok is None:
        path = os.path.join(sink.folder, CHAR_TOKENIZER)
        CharTokenizer.from_text(text, SpecialTokens.none()).save(path)
        tok = load_text_tokenizer(f"seqjax:{path}")
    cut = int(len(text) * (1 - fraction))
    for s, part in (("val", text[cut:]), ("train", text[:cut])):
        if not part:
            raise ValueError(f"the {s} split is empty: the text has {len(text)} characters and "
                             f"`val_fraction` is {fraction}.")
        sink.add(s, _check_ids(np.asarray(tok.encode_ordinary(part), np.int64), tok),
                 np.zeros(1, np.int64))
    return tok


def _validation_rule(documents: _Reader, val_documents: int | None, val_tokens: int | None,
                     val_fraction: float | None, shard_size: int, resolved: dict[str, Any]
                     ) -> dict[str, int]:
    """The validation documents or tokens to take (the rules of :data:`OPTIONS`); what was
    chosen goes into ``resolved``."""
    for key, value in (("documents", val_documents), ("tokens", val_tokens)):
        if value is not None:
            resolved[f"val_{key}"] = value
            return {key: value}
    if not documents.countable:
        if val_fraction is not None:
            raise ValueError("`val_fraction` needs the number of documents, unknown for a "
                             "streamed dataset; give `val_documents` or `val_tokens`.")
        resolved["val_tokens"] = shard_size  # a streamed dataset: llm.c's first shard
        return {"tokens": shard_size}
    fraction = DEFAULT_VAL_FRACTION["documents"] if val_fraction is None else val_fraction
    count = sum(1 for _ in documents)
    if count == 0:
        raise documents.empty()
    k = max(1, int(fraction * count))
    resolved.update(val_fraction=fraction, documents=count, val_documents=k)
    return {"documents": k}


def _totals(entries: list[dict[str, Any]], documents: _Reader, resolved: dict[str, Any]
            ) -> dict[str, dict[str, int]]:
    """Per split: tokens, documents, shards; both splits must hold tokens (the corpus a
    document)."""
    totals = {s: {"tokens": sum(e["tokens"] for e in entries if e["split"] == s),
                  "documents": sum(e["documents"] for e in entries if e["split"] == s),
                  "shards": sum(1 for e in entries if e["split"] == s)}
              for s in ("val", "train")}
    count = totals["val"]["documents"] + totals["train"]["documents"]
    if not count:
        raise documents.empty()
    for s, what in (("val", "validation"), ("train", "training")):
        if not totals[s]["tokens"]:
            raise ValueError(
                f"the {what} split is empty: the corpus has {count} documents "
                f"({totals['val']['tokens'] + totals['train']['tokens']} tokens) and the "
                f"validation rule is {resolved}; give a smaller `val_*` (or split='text' for "
                "one document).")
    return totals


# --------------------------------------------------------------------------- command line


def _id_or_token(value: str) -> int | str:
    return int(value) if value.isdigit() else value


#: Every option of :func:`prepare` and of ``seqjax prepare``, described once: its name (the
#: argument and, with ``--``, the flag), its ``argparse`` settings (the default is
#: ``prepare``'s), and what it does. ``prepare``'s docstring and ``--help`` read it.
OPTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "inputs": ({"nargs": "*", "metavar": "INPUT"},
               "local .txt files, .jsonl files (each line's --text_field) or .parquet files "
               "(its --text_field column, via pyarrow): files, folders (every such file "
               "below, sorted) or globs (default: none; then --hf_dataset)"),
    "out_dir": ({"required": True, "metavar": "DIR"},
                "the folder to write (required; created if missing; flag --out or --out_dir)"),
    "tokenizer": ({}, "gpt2 (tiktoken), hf:PATH or a path ending in tokenizer.json (Hugging "
                      "Face), seqjax:PATH (a tokenizer saved by seqjax), char (with --split "
                      "text: the text's sorted characters, no specials, nanoGPT's "
                      "shakespeare_char, saved as OUT/tokenizer.json: load it as "
                      "seqjax:OUT/tokenizer.json); in Python also a seqjax Tokenizer"),
    "rank_file": ({"metavar": "FILE"},
                  "GPT-2's ranks as a .tiktoken file (default: openai-whisper's "
                  "whisper/assets/gpt2.tiktoken when installed, else tiktoken's cache or "
                  "download)"),
    "eot": ({"type": _id_or_token, "metavar": "ID_OR_TOKEN"},
            "the end-of-text id or token, for hf: and seqjax: tokenizers (default: "
            "<|endoftext|>, </s>, [SEP] or <eos> for hf:, the eos token for seqjax:)"),
    "format": ({"choices": FORMATS},
               "llmc (llm.c's fineweb.py): a 1024-byte header, EOT before each document, "
               "shards of --shard_size tokens NAME_val_000000.bin, NAME_train_000001.bin, "
               "...; nanogpt (its openwebtext/prepare.py): headerless val.bin/train.bin, EOT "
               "after each document"),
    "shard_size": ({"type": int, "metavar": "N"}, "tokens per llm.c shard"),
    "split": ({"choices": SPLITS},
              "documents: validation = the first documents; text: the inputs as one text, "
              "cut by characters as nanoGPT's shakespeare/prepare.py, no EOT"),
    "val_documents": ({"type": int, "metavar": "N"}, "validation = the first N documents"),
    "val_tokens": ({"type": int, "metavar": "N"},
                   "validation = exactly the first N tokens, llm.c's rule: the document "
                   "crossing the cut counts in validation and its remaining tokens begin "
                   "training (default: unset; with --streaming and no other --val_* option: "
                   "--shard_size)"),
    "val_fraction": ({"type": float, "metavar": "F"},
                     "validation = the first max(1, int(F*D)) of D documents (counted in a "
                     "first pass, so not with --streaming), or with --split text the last F "
                     "of the n characters, text[int(n*(1-F)):] (default: 0.01 of the "
                     "documents; 0.1 with --split text); at most one --val_* option"),
    "docs": ({"choices": DOCS},
             "how a .txt file is cut into documents: file, lines (the break dropped), or "
             "paragraphs (at each blank line, the \\n\\n ending its paragraph, llm.c's "
             "tinyshakespeare.py)"),
    "text_field": ({"metavar": "FIELD"},
                   "the .jsonl field, .parquet column or dataset column holding the text"),
    "hf_dataset": ({"metavar": "NAME"},
                   "a Hugging Face dataset instead of INPUTs: a hub name, a builder (json, "
                   "parquet, text) with --hf_data_files, or a save_to_disk folder"),
    "hf_config": ({"metavar": "CONFIG"}, "the dataset's configuration"),
    "hf_split": ({"metavar": "SPLIT"}, "the dataset split to read"),
    "hf_data_files": ({"action": "append", "metavar": "FILE"},
                      "a data file for a builder such as json; repeat for several"),
    "streaming": ({"action": "store_true"},
                  "stream the dataset instead of downloading it whole (default: off)"),
    "workers": ({"type": int, "metavar": "N"},
                "tokenising processes; 1 tokenises in this process (default: the number of "
                "CPUs)"),
    "name": ({}, "the shards' file-name prefix (default: the first input's file or folder "
                 "name, or the dataset's name)"),
}




def _described() -> dict[str, str]:
    """Each option's description, with ``prepare``'s default where the text names none
    (``None``: unset)."""
    defaults = {k: v.default for k, v in inspect.signature(prepare).parameters.items()}
    return {name: text if "default" in text or defaults[name] is inspect.Parameter.empty else
            f"{text} (default: {'unset' if defaults[name] is None else repr(defaults[name])})"
            for name, (_, text) in OPTIONS.items()}


if prepare.__doc__ is not None:  # python -OO strips docstrings
    prepare.__doc__ = prepare.__doc__.replace("        (the options of :data:`OPTIONS`)\n", "".join(
        textwrap.fill(f"{name}: {text}", 88, initial_indent=" " * 8, subsequent_indent=" " * 12)
        + "\n" for name, text in _described().items()))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="seqjax prepare",
        description="Tokenise text into token shards: llm.c's format (a 1024-byte header + "
                    "uint16 tokens) or nanoGPT's headerless train.bin/val.bin, plus "
                    "manifest.json, written last. A killed run leaves no manifest; rerun the "
                    "same command to redo it.",
        epilog="Examples: seqjax prepare shakespeare.txt --out data/shakespeare --format "
               "nanogpt --split text --val_fraction 0.1  |  seqjax prepare --hf_dataset "
               "HuggingFaceFW/fineweb-edu --hf_config sample-10BT --streaming --out "
               "data/edu_fineweb10B --val_tokens 100000000")
    for name, text in _described().items():
        if name == "inputs":
            p.add_argument(name, help=text, **OPTIONS[name][0])
        else:
            flags = ["--out"] if name == "out_dir" else []
            p.add_argument(*flags, f"--{name}", dest=name, help=text, **OPTIONS[name][0])
    p.set_defaults(**{k: v.default for k, v in inspect.signature(prepare).parameters.items()
                      if k in OPTIONS and v.default is not inspect.Parameter.empty})
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``seqjax prepare``: 0 when done; 2 with one line on stderr for bad input."""
    args = vars(_parser().parse_args(argv))
    if len(args["hf_data_files"] or []) == 1:  # one file: as a string, as in Python
        args["hf_data_files"] = args["hf_data_files"][0]
    try:
        manifest = prepare(
            log=lambda message: print(message, file=sys.stderr, flush=True),
            progress=sys.stderr.isatty(), **args)
    except (ValueError, TypeError, OSError, ImportError) as err:
        print(f"seqjax prepare: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    s = manifest["splits"]
    print(f"{args['out_dir']}: {len(manifest['shards'])} {manifest['format']} shard(s); train "
          f"{s['train']['tokens']:,} tokens ({s['train']['documents']:,} documents), val "
          f"{s['val']['tokens']:,} tokens ({s['val']['documents']:,} documents); "
          f"tokenizer {manifest['tokenizer']['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

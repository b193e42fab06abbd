"""Pairs of texts in: translation pairs from local files or a Hugging Face dataset, and a
dataset column tokenised.

:func:`load_parallel` reads a local file (or pair of files) or a hub dataset into a
``datasets.Dataset`` with ``src``/``tgt`` columns; :func:`tokenize_dataset` maps each text
``w_{1:n}`` to its ids ``x_{1:n}`` (the tokenisation step of Bishop §12.2.2 / J&M §9.2) with a
seqjax tokenizer. Language-modelling text goes through :func:`seqjax.data.prepare.prepare`
instead. Everything here needs Hugging Face ``datasets`` (``pip install "seqjax[hf]"``; imported
on first use, with an error naming the extra).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from seqjax._optional import require
from seqjax.data.batching import _prefix

if TYPE_CHECKING:  # pragma: no cover
    import datasets

    from seqjax.data.tokenizers import Tokenizer

__all__ = ["load_parallel", "tokenize_dataset"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


def _looks_local(path_or_name: PathLike) -> bool:
    s = str(path_or_name)
    return (Path(s).exists() or s.startswith((".", "/", "~"))
            or Path(s).suffix in (".txt", ".tsv", ".csv", ".json", ".jsonl"))


def _read_local(path: Path) -> str:
    if not path.exists():
        raise FileNotFoundError(f"`path_or_name` {str(path)!r} does not exist; give an existing "
                                "file/folder or a Hugging Face hub dataset name.")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".txt")
        if not files:
            raise FileNotFoundError(f"folder {str(path)!r} contains no .txt files.")
        return "\n".join(p.read_text(encoding="utf-8") for p in files)
    return path.read_text(encoding="utf-8")


def load_parallel(path_or_name: PathLike | tuple[PathLike, PathLike], *, sep: str = "\t",
                  columns: tuple[int, int] = (0, 1), skip_empty: bool = True,
                  on_bad_line: Literal["error", "skip"] = "error", split: str = "train",
                  name: str | None = None, src_lang: str = "en", tgt_lang: str = "fr",
                  src_field: str = "src", tgt_field: str = "tgt", **load_kwargs: Any
                  ) -> datasets.Dataset:
    """A ``Dataset`` of sentence pairs with columns ``src`` and ``tgt``.

    Sources: one local file of ``sep``-separated lines (Tatoeba/Anki ``fra.txt``:
    ``English<TAB>French[<TAB>attribution]``; ``columns`` picks the fields; a line with too few
    fields raises ``ValueError`` naming file and line, or is skipped with
    ``on_bad_line="skip"``); a pair of line-aligned files ``(src_path, tgt_path)`` (different line
    counts raise ``ValueError``); or a hub dataset with a ``translation`` column of
    ``{lang: text}`` dicts (e.g. ``opus_books``, ``name="en-fr"``; picks ``src_lang``/``tgt_lang``)
    or columns ``src_field`` and ``tgt_field``. ``skip_empty`` drops pairs with an empty side.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "p.txt")
        >>> _ = open(p, "w").write("Go.\\tVa !\\nHi.\\tSalut !\\n")
        >>> load_parallel(p)[1]
        {'src': 'Hi.', 'tgt': 'Salut !'}
    """
    ds_lib = require("datasets", "loading text with seqjax.data.loading")
    if isinstance(path_or_name, tuple | list):
        if len(path_or_name) != 2:
            raise ValueError(f"`path_or_name` as files must be (src_path, tgt_path); got "
                             f"{len(path_or_name)}.")
        a, b = (Path(p).expanduser() for p in path_or_name)
        src, tgt = _read_local(a).splitlines(), _read_local(b).splitlines()
        if len(src) != len(tgt):
            raise ValueError(f"pair files must have the same number of lines: {str(a)!r} has "
                             f"{len(src)}, {str(b)!r} has {len(tgt)}.")
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
                raise ValueError(f"{str(path)!r} line {n} has {len(parts)} field(s) separated by "
                                 f"{sep!r}, need at least {need}: {line[:60]!r} (pass "
                                 "on_bad_line='skip' to skip).")
            pairs.append((parts[columns[0]], parts[columns[1]]))
    else:
        ds = ds_lib.load_dataset(str(path_or_name), name, split=split, **load_kwargs)
        if "translation" in ds.column_names:
            ds = ds.map(lambda b: {"src": [t[src_lang] for t in b["translation"]],
                                   "tgt": [t[tgt_lang] for t in b["translation"]]},
                        batched=True, remove_columns=ds.column_names)
        else:
            missing = [f for f in (src_field, tgt_field) if f not in ds.column_names]
            if missing:
                raise ValueError(f"hub dataset {str(path_or_name)!r} lacks columns {missing}; "
                                 f"columns: {ds.column_names} (set src_field/tgt_field).")
            ds = ds.select_columns([src_field, tgt_field]).rename_columns(
                {src_field: "src", tgt_field: "tgt"})
        if skip_empty:
            ds = ds.filter(lambda b: [bool(s.strip() and t.strip())
                                      for s, t in zip(b["src"], b["tgt"])], batched=True)
        return ds
    if skip_empty:
        kept = [(s, t) for s, t in pairs if s.strip() and t.strip()]
        if len(kept) != len(pairs):
            logger.info("dropped %d pairs with an empty side", len(pairs) - len(kept))
        pairs = kept
    return ds_lib.Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})


# ----------------------------------------------------------------------------- tokenising
def tokenize_dataset(ds: datasets.Dataset, tokenizer: Tokenizer, *, column: str = "text",
                     output: str = "ids", add_bos: bool = False, add_eos: bool = False,
                     max_length: int | None = None, truncation: bool = False,
                     batch_size: int = 1000, num_proc: int | None = None) -> datasets.Dataset:
    """Tokenise column ``column`` with ``Dataset.map(batched=True)``.

    Adds ``output`` (list of int ids), ``<p>length`` and ``<p>num_unk`` (symbols mapped to
    ``<unk>``), ``<p>`` being ``""`` for ``output="ids"``, ``"src_"`` for ``"src_ids"``.
    ``max_length``/``truncation`` as in :meth:`Tokenizer.encode` (over-long raises unless
    ``truncation=True``).

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
    kwargs: dict[str, Any] = dict(add_bos=add_bos, add_eos=add_eos, max_length=max_length,
                                  truncation=truncation)

    def encode(batch: dict[str, list[str]]) -> dict[str, list[Any]]:
        encoded = [tokenizer.encode_with_unknowns(t, **kwargs) for t in batch[column]]
        return {output: [ids for ids, _ in encoded],
                p + "length": [len(ids) for ids, _ in encoded],
                p + "num_unk": [sum(unk.values()) for _, unk in encoded]}

    return ds.map(encode, batched=True, batch_size=batch_size, num_proc=num_proc)

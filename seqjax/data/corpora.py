"""Where the corpora come from: one resolver for every corpus file an experiment reads.

:func:`resolve_corpus` looks, in order, at

1. ``path`` (``--data_path``): the file, or a folder holding it — given explicitly, it must
   exist (no silent fallback);
2. ``$SEQJAX_DATA_DIR/<file>``;
3. the per-user cache, :func:`cache_dir` (``$SEQJAX_CACHE_DIR``, else
   ``$XDG_CACHE_HOME/seqjax`` or ``~/.cache/seqjax``; ``~/Library/Caches/seqjax`` on macOS,
   ``%LOCALAPPDATA%\\seqjax`` on Windows) — a cached file whose checksum is wrong (a cut
   download, a corrupted disk) is moved aside to ``<file>.corrupt`` and not used;
4. a download from the corpus's canonical source (:data:`CORPORA`), with a progress bar,
   checked against its SHA-256, written to the cache through a temporary file and a rename
   (an interrupted download never leaves a partial file under the real name); skipped
   when ``$SEQJAX_OFFLINE`` is ``1``;
5. the ``shared/data`` folder beside a development checkout of the repository.

When none of them has the file, :class:`CorpusNotFoundError` names every place tried and
the option that fixes it (``seqjax train`` turns it into exit status 2).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CORPORA", "CorpusNotFoundError", "CorpusSource", "cache_dir", "resolve_corpus"]

DATA_DIR_ENV = "SEQJAX_DATA_DIR"
CACHE_DIR_ENV = "SEQJAX_CACHE_DIR"
OFFLINE_ENV = "SEQJAX_OFFLINE"  # 1/true: never download (step 4 is skipped)


@dataclasses.dataclass(frozen=True)
class CorpusSource:
    """A corpus file: where it can be downloaded (``None``: nowhere canonical) and its
    SHA-256 (``None``: not checked)."""

    filename: str
    url: str | None
    sha256: str | None
    note: str = ""


CORPORA: dict[str, CorpusSource] = {
    "tinyshakespeare.txt": CorpusSource(
        "tinyshakespeare.txt",
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
        "input.txt",
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        "Tiny Shakespeare (char-rnn's input.txt, 1,115,394 bytes; what nanoGPT downloads)",
    ),
    "fra-eng.txt": CorpusSource(
        "fra-eng.txt", None, None,
        "the 18,065 shortest English-French pairs of the Tatoeba/Anki fra-eng file (one "
        "pair per line: English TAB French); no canonical download of this cut — build it "
        "from https://www.manythings.org/anki/fra-eng.zip, or load a hub dataset instead "
        "(e.g. english_french(hub_name='opus_books', hub_config='en-fr'))",
    ),
}


class CorpusNotFoundError(FileNotFoundError):
    """No copy of a corpus was found or could be downloaded; the message says where it
    looked and how to provide one."""


def cache_dir() -> Path:
    """The per-user cache folder of seqjax (see the module docstring)."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "seqjax"
    if sys.platform.startswith("win"):
        base = os.environ.get("LOCALAPPDATA")
        return (Path(base) if base else Path.home() / "AppData" / "Local") / "seqjax"
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "seqjax"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shared_data_dirs() -> list[Path]:
    """``shared/data`` beside the checkout holding this package, then beside the current
    folder (a development setup)."""
    repo = Path(__file__).resolve().parents[2]
    return [repo.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]


def _download(source: CorpusSource, dest: Path, opener: Callable[..., Any],
              timeout: float) -> Path:
    """``source.url`` → ``dest``, checked, atomically (temporary file + rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out, opener(source.url, timeout=timeout) as response:
            total = getattr(response, "length", None) or None
            from tqdm.auto import tqdm

            with tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr,
                      desc=f"downloading {source.filename}") as bar:
                for block in iter(lambda: response.read(1 << 16), b""):
                    out.write(block)
                    bar.update(len(block))
        if source.sha256 is not None and _sha256(Path(tmp)) != source.sha256:
            raise ValueError(f"the download of {source.url} does not have the expected "
                             f"SHA-256 {source.sha256} (a changed or truncated file)")
        os.replace(tmp, dest)
        return dest
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def resolve_corpus(filename: str, path: str | os.PathLike | None = None, *,
                   download: bool = True, opener: Callable[..., Any] | None = None,
                   timeout: float = 30.0) -> Path:
    """The local file of corpus ``filename`` (see the module docstring for the order).

    Args:
        filename: e.g. ``"tinyshakespeare.txt"`` (a key of :data:`CORPORA`, or any file
            name for the local places only).
        path: an explicit file or folder (``--data_path``); must exist.
        download: allow step 4 (a download into the cache).
        opener: ``opener(url, timeout=...)`` → a readable binary response (default
            ``urllib.request.urlopen``; tests pass a fake one).
        timeout: seconds for the download's connection.

    Raises:
        CorpusNotFoundError: with every place tried and how to provide the file.
    """
    if path is not None:
        p = Path(path).expanduser()
        p = p / filename if p.is_dir() else p
        if p.is_file():
            return p
        raise CorpusNotFoundError(
            f"{str(p)!r} does not exist (given as the data path). Pass the file, or its "
            f"folder, with --data_path / `path=`; or drop it to let seqjax look in "
            f"${DATA_DIR_ENV}, the cache {cache_dir()} and the canonical download.")
    source = CORPORA.get(filename)
    tried = []
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        p = Path(env).expanduser() / filename
        if p.is_file():
            return p
        tried.append(f"${DATA_DIR_ENV} ({p})")
    else:
        tried.append(f"${DATA_DIR_ENV} (not set)")
    cached = cache_dir() / filename
    if cached.is_file():
        if source is None or source.sha256 is None or _sha256(cached) == source.sha256:
            return cached
        aside = cached.with_name(cached.name + ".corrupt")
        os.replace(cached, aside)
        tried.append(f"the cache ({cached}: wrong SHA-256, moved to {aside.name})")
    else:
        tried.append(f"the cache ({cached})")
    offline = os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes")
    if source is not None and source.url is not None and download and offline:
        tried.append(f"a download (${OFFLINE_ENV} is set)")
    elif source is not None and source.url is not None and download:
        if opener is None:
            import urllib.request

            opener = urllib.request.urlopen
        try:
            return _download(source, cached, opener, timeout)
        except (OSError, ValueError) as err:
            tried.append(f"the download from {source.url} ({type(err).__name__}: {err})")
    elif source is not None and source.url is None:
        tried.append("a download (this file has no canonical source)")
    for folder in shared_data_dirs():
        p = folder / filename
        if p.is_file():
            return p
    tried.append("shared/data beside the checkout")
    what = f" — {source.note}" if source is not None and source.note else ""
    raise CorpusNotFoundError(
        f"corpus {filename!r}{what} was not found. Tried: {'; '.join(tried)}. Fix: pass "
        f"--data_path=FILE (or `path=`), set {DATA_DIR_ENV} to a folder holding {filename}, "
        f"or put the file at {cached}.")

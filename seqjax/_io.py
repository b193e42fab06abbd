"""The one way seqjax writes a file that a crash must not leave half written
(:func:`write_atomic`), and :func:`write_json`, the writer of every JSON record seqjax leaves
(``run.json``, ``experiment.json``, results summaries, tokenizers)."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import numpy as np

__all__ = ["json_value", "write_atomic", "write_json"]


def json_value(x: Any) -> Any:
    """What :func:`write_json` writes for a value JSON cannot hold: numpy and jax scalars
    and arrays as Python numbers and lists, anything else as ``str``.

    Example:
        >>> json_value(np.float32(0.5)), json_value(np.arange(3)), json_value(object)
        (0.5, [0, 1, 2], "<class 'object'>")
    """
    if isinstance(x, np.generic):
        return x.item()
    if hasattr(x, "__array__") and hasattr(x, "shape"):
        return np.asarray(x).tolist()
    return str(x)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` atomically: a temporary file in the
    same folder (created if missing), flushed, fsynced and renamed over ``path`` (``os.replace``),
    so a reader sees the old file or the new one, never a mix. On an error the temporary file is
    removed and ``path`` left as it was; an ``OSError`` names ``path``, not the temporary file."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    name = f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp = os.path.join(folder, name)
    try:
        # O_EXCL: a fresh file, created with the usual mode (0666 less the umask).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
    except OSError as err:
        if err.errno is None or err.filename == path:
            raise
        raise OSError(err.errno, err.strerror, path) from err


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented UTF-8 JSON to ``path`` atomically (:func:`write_atomic`),
    values JSON cannot hold as :func:`json_value` says.

    Example:
        >>> import tempfile, json
        >>> p = os.path.join(tempfile.mkdtemp(), "out", "r.json")
        >>> write_json(p, {"loss": np.float32(1.5), "name": "é"})
        >>> json.load(open(p, encoding="utf-8"))
        {'loss': 1.5, 'name': 'é'}
    """
    write_atomic(path, json.dumps(obj, indent=1, ensure_ascii=False, default=json_value))

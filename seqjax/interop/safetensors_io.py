"""Read Hugging Face checkpoints as plain numpy arrays, without pickle.

A checkpoint is a directory with ``model.safetensors`` (or the shards listed in
``model.safetensors.index.json``) next to ``config.json`` and ``tokenizer.json``, or a single
weights file. Tensors are read with ``safetensors`` (``framework="np"``); ``bfloat16``, which
numpy cannot name, from the file's byte ranges as ``ml_dtypes.bfloat16``. A PyTorch
``.bin``/``.pt`` file is read only when its path is passed explicitly, with
``torch.load(..., weights_only=True)`` (tensors only, no arbitrary objects unpickled).

:class:`Checkpoint` is the loaders' bookkeeping: every tensor is claimed exactly once
(:meth:`Checkpoint.take`, shape-checked), known buffers are dropped explicitly
(:meth:`Checkpoint.ignore`), and :meth:`Checkpoint.finish` rejects the rest, so a checkpoint
of the wrong architecture fails loudly instead of loading half its weights.

Example:
    >>> import os, tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> d = tempfile.mkdtemp()
    >>> save_file({"w": np.ones((2, 3), np.float32)}, os.path.join(d, "model.safetensors"))
    >>> ckpt = Checkpoint.open(d)
    >>> ckpt.take("w", (2, 3)).shape
    (2, 3)
    >>> ckpt.finish()
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from seqjax._optional import require

__all__ = ["Checkpoint", "check_params_like", "load_tensors", "read_config", "resolve_checkpoint"]

PathLike = str | os.PathLike

SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_TORCH_SUFFIXES = (".bin", ".pt", ".pth")


def resolve_checkpoint(path: PathLike) -> tuple[Path, list[Path]]:
    """``(directory, weight_files)`` of a checkpoint directory or weights file (module
    docstring); ``FileNotFoundError`` names what is missing."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"`path` {str(p)!r} does not exist.")
    if p.is_file():
        if p.suffix != ".safetensors" and p.suffix not in _TORCH_SUFFIXES:
            raise ValueError(f"`path` {str(p)!r} must be a checkpoint directory, a .safetensors "
                             f"file or a PyTorch {'/'.join(_TORCH_SUFFIXES)} state dict; got "
                             f"suffix {p.suffix!r}.")
        return p.parent, [p]
    single = p / SAFETENSORS_NAME
    if single.is_file():
        return p, [single]
    index = p / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{str(index)!r} has no 'weight_map' of tensor names to shards.")
        shards = [p / name for name in sorted(set(weight_map.values()))]
        missing = [str(s) for s in shards if not s.is_file()]
        if missing:
            raise FileNotFoundError(f"shards listed in {str(index)!r} are missing: {missing}.")
        return p, shards
    found = sorted(f.name for f in p.iterdir())
    bins = [f for f in found if f.endswith(_TORCH_SUFFIXES)]
    hint = (f" It holds {bins}: pass that file's path explicitly to read it with "
            "torch.load(weights_only=True)." if bins else "")
    raise FileNotFoundError(f"no {SAFETENSORS_NAME} or {SAFETENSORS_INDEX} in {str(p)!r} "
                            f"(files: {found}).{hint}")


def _read_bf16(path: Path, names: Iterable[str]) -> dict[str, np.ndarray]:
    """``bfloat16`` tensors straight from the safetensors byte layout (8-byte header size,
    JSON header with ``data_offsets`` relative to the end of the header, raw data)."""
    import ml_dtypes

    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        out = {}
        for name in names:
            start, end = header[name]["data_offsets"]
            f.seek(8 + header_len + start)
            buf = f.read(end - start)
            out[name] = np.frombuffer(buf, ml_dtypes.bfloat16).reshape(header[name]["shape"]).copy()
    return out


def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
    st = require("safetensors", "reading Hugging Face checkpoints")
    try:
        with st.safe_open(str(path), framework="np") as f:
            bf16 = [name for name in f.keys() if f.get_slice(name).get_dtype() == "BF16"]
            out = {name: f.get_tensor(name) for name in f.keys() if name not in bf16}
        if bf16:
            out.update(_read_bf16(path, bf16))
    except (OSError, ValueError, KeyError, struct.error, st.SafetensorError) as err:
        size = path.stat().st_size if path.exists() else 0
        raise ValueError(f"cannot read the safetensors file {str(path)!r} ({size} bytes): {err}. "
                         "Is it truncated (an interrupted download) or not a safetensors file?"
                         ) from err
    return out


def _load_torch(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"reading the PyTorch file {str(path)!r} needs torch; convert it to "
                          "safetensors or pip install torch") from e
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{str(path)!r} must hold a state dict; got {type(state).__name__}.")
    out = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{str(path)!r}: entry {name!r} is a {type(t).__name__}, not a "
                             "tensor.")
        t = t.detach().cpu()
        out[name] = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
    return out


def load_tensors(path: PathLike) -> dict[str, np.ndarray]:
    """All tensors ``{name: np.ndarray}`` of a checkpoint (:func:`resolve_checkpoint`) in its
    own dtypes (``bfloat16`` as ``ml_dtypes.bfloat16``; a PyTorch ``bfloat16`` as float32).
    Shards are merged; a name in two shards is an error."""
    _, files = resolve_checkpoint(path)
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        part = _load_torch(f) if f.suffix in _TORCH_SUFFIXES else _load_safetensors(f)
        dup = sorted(set(part) & set(tensors))
        if dup:
            raise ValueError(f"tensors {dup[:5]} appear in more than one shard ({str(f)!r}).")
        tensors.update(part)
    return tensors


def read_config(directory: PathLike, name: str = "config.json") -> dict | None:
    """The parsed ``config.json`` of a checkpoint directory, or ``None`` if it has none."""
    p = Path(directory) / name
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{str(p)!r} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{str(p)!r} must hold a JSON object; got {type(data).__name__}.")
    return data


class Checkpoint:
    """Tensors of one checkpoint, claimed by name with shape checks (see module docstring).

    Attributes:
        directory: the checkpoint directory (where ``config.json`` / ``tokenizer.json`` live).
        files: the weight files read.
        tensors: ``{name: array}`` not yet claimed.
    """

    def __init__(self, tensors: dict[str, np.ndarray], directory: Path, files: list[Path]):
        self.tensors = dict(tensors)
        self.directory = directory
        self.files = files
        self.prefix = ""
        self._original: dict[str, str] = {}
        self._inside: set[str] = set()

    @classmethod
    def open(cls, path: PathLike) -> Checkpoint:
        """Read a checkpoint directory or weights file (:func:`load_tensors`)."""
        directory, files = resolve_checkpoint(path)
        return cls(load_tensors(path), directory, files)

    @property
    def source(self) -> str:
        return ", ".join(str(f) for f in self.files)

    def strip_prefix(self, prefixes: Iterable[str], marker: str) -> str:
        """Drop a wrapper prefix (e.g. ``"bert."`` of ``BertForMaskedLM``) from the names and
        return it: the first of ``""`` and ``prefixes`` under which ``marker`` (a tensor every
        checkpoint of the family has) is found. Names outside the prefix (task heads) stay."""
        for prefix in ("", *prefixes):
            if prefix + marker in self.tensors:
                break
        else:
            some = sorted(self.tensors)[:8]
            raise ValueError(f"checkpoint {self.source} has no tensor {marker!r} under any of the "
                             f"prefixes {['', *prefixes]}: is it the right architecture? First "
                             f"names: {some}.")
        if prefix:
            self._original = {(k[len(prefix):] if k.startswith(prefix) else k): k
                              for k in self.tensors}
            self._inside = {k[len(prefix):].split(".")[0] for k in self.tensors
                            if k.startswith(prefix)}
            self.tensors = {stripped: self.tensors[k] for stripped, k in self._original.items()}
        self.prefix = prefix
        return prefix

    def _display(self, name: str) -> str:
        """The name as the checkpoint spells it (with the stripped prefix where it had one)."""
        inside = name.split(".")[0] in self._inside
        return self._original.get(name, self.prefix + name if inside else name)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Remove and return tensor ``name`` as float32; ``ValueError`` if it is missing or
        its shape differs from ``shape`` (the message names the tensor, expected and actual)."""
        if name not in self.tensors:
            expected = f" (expected shape {tuple(shape)})" if shape is not None else ""
            raise ValueError(f"checkpoint {self.source} is missing tensor {self._display(name)!r}"
                             f"{expected}; it has {len(self.tensors)} unclaimed tensors, e.g. "
                             f"{sorted(self.tensors)[:6]}.")
        arr = self.tensors.pop(name)
        if shape is not None and tuple(arr.shape) != tuple(shape):
            raise ValueError(f"tensor {self._display(name)!r} in {self.source} must have shape "
                             f"{tuple(shape)} (from the model config); got {tuple(arr.shape)}.")
        if not np.issubdtype(arr.dtype, np.floating) and arr.dtype.name != "bfloat16":
            raise ValueError(f"tensor {self._display(name)!r} must be floating point; got dtype "
                             f"{arr.dtype}.")
        return np.asarray(arr, np.float32)

    def ignore(self, predicate: Callable[[str], bool]) -> list[str]:
        """Drop (and return the names of) tensors the model does not use, e.g. buffers."""
        dropped = sorted(k for k in self.tensors if predicate(k))
        for k in dropped:
            del self.tensors[k]
        return dropped

    def finish(self) -> None:
        """``ValueError`` listing every tensor that no parameter claimed."""
        if self.tensors:
            names = sorted(self.tensors)
            shown = ", ".join(f"{self._display(n)!r} {tuple(self.tensors[n].shape)}"
                              for n in names[:10])
            more = f" and {len(names) - 10} more" if len(names) > 10 else ""
            raise ValueError(f"checkpoint {self.source} has {len(names)} unexpected tensors that "
                             f"the seqjax model has no parameter for: {shown}{more}.")


def _flat(tree: Any) -> dict[str, Any]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): leaf for path, leaf in leaves}


def check_params_like(params: Any, expected: Any, what: str) -> None:
    """``ValueError`` unless ``params`` has exactly the parameter names and shapes of
    ``expected`` (e.g. ``jax.eval_shape(model.init, ...)["params"]``): the loaders build their
    trees by hand, and this catches a model whose layout changed under them."""
    got, want = _flat(params), _flat(expected)
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        raise ValueError(f"converted {what} parameters do not match the seqjax model: missing "
                         f"{missing[:8]}, unexpected {extra[:8]}.")
    for name, leaf in want.items():
        if tuple(np.shape(got[name])) != tuple(leaf.shape):
            raise ValueError(f"converted {what} parameter {name!r} must have shape "
                             f"{tuple(leaf.shape)}; got {tuple(np.shape(got[name]))}.")

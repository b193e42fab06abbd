"""Write a ``seqjax train gpt2`` work dir as a Hugging Face folder (``seqjax export``).

:func:`export_gpt2` reads the run's config (``WORKDIR/experiment.json``, as ``seqjax eval``
does) and one checkpoint (the newest, or ``step``), and writes a folder that
``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` and
``AutoTokenizer.from_pretrained(OUT)`` load offline:

* ``config.json`` (:func:`~seqjax.interop.hf_gpt2.gpt2_config_to_hf`) with the model's
  ``vocab_size``: a vocabulary padded past the tokenizer's (50304 for GPT-2's 50257) stays
  padded, the tokenizer never producing the extra rows;
* ``model.safetensors``: float32 tensors under ``save_pretrained``'s names
  (:func:`~seqjax.interop.hf_gpt2.gpt2_params_to_hf`); a run without biases gets zero biases;
* the tokenizer's files. ``--tokenizer gpt2``: ``vocab.json`` and ``merges.txt`` derived from
  tiktoken's ranks, ``tokenizer.json``, ``tokenizer_config.json`` (``GPT2Tokenizer``,
  ``<|endoftext|>`` = 50256 as BOS, EOS and UNK), ``special_tokens_map.json``.
  ``--tokenizer hf:PATH`` (or a ``seqjax:PATH`` that is a ``tokenizer.json``): that file,
  copied, with a ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast`` and the run's
  end-of-text token as EOS. Ordinary text gets the run's ids, but Hugging Face reads a special
  token's spelling in the text (``"<|endoftext|>"``) as that token, the run's tokenizer as text.

Refused in one line (a ``ValueError``: ``ConfigError`` for a bad work dir, option or
destination; ``CheckpointMismatchError`` for a checkpoint that does not fit the config): a
model GPT-2 cannot hold (:func:`check_exportable`), a seqjax character or word tokenizer (no
``transformers`` class holds one), a work dir without ``experiment.json`` or checkpoints or of
another experiment, a ``step`` with no checkpoint, and an ``out`` that is a file, is (or holds)
the work dir, or exists and is not empty (unless ``force``).

Nothing is half written: after every check the files go to a sibling ``OUT.tmp-<pid>``, are
flushed and renamed to ``OUT``; a failure or interruption removes it and leaves no ``OUT`` (a
process killed outright can leave ``OUT.tmp-<pid>``, never a partial ``OUT``). ``force`` moves
the old ``OUT`` aside, the new one in, then deletes the old. A failed write (no space, no
permission) is an :class:`ExportWriteError`.

Example::

    seqjax train gpt2 --preset cpu --data_path data/shakespeare --workdir workdirs/gpt2_cpu
    seqjax export --workdir workdirs/gpt2_cpu exported/gpt2_cpu
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from seqjax.experiments._config import ConfigError
from seqjax.interop.hf_gpt2 import gpt2_config_to_hf, gpt2_params_to_hf

__all__ = ["ExportWriteError", "check_exportable", "export_gpt2"]

PathLike = str | os.PathLike

#: Options ``GPT2LMHeadModel`` cannot hold (see :func:`check_exportable`): option -> (the
#: value it needs, why).
_NOT_GPT2: dict[str, tuple[Any, str]] = {
    "architecture": ("transformer", "GPT2LMHeadModel is a transformer, not an LSTM"),
    "positions": ("learned", "its positions are a learned table (wpe), not rotary"),
    "qk_norm": (False, "its attention has no query/key norm"),
    "norm_type": ("layernorm", "its norms are LayerNorms"),
    "logit_softcap": (0.0, "its head has no soft-cap"),
}

#: GPT-2's byte-level BPE: the end-of-text token (also BOS and UNK in transformers' files).
_GPT2_EOT_TOKEN = "<|endoftext|>"


class ExportWriteError(OSError):
    """Writing the export failed (no space, no permission, an I/O error); ``OUT`` was left as
    it was. ``str()`` is one line naming the folder, the file and the cause."""

    def __str__(self) -> str:
        return str(self.strerror)


def check_exportable(cfg: Any) -> None:
    """``ConfigError`` (one line) naming every option of the gpt2 recipe's ``cfg`` that
    ``GPT2LMHeadModel`` cannot hold (an LSTM; rotary positions, QK-norm, RMSNorm, a logit
    soft-cap: the ``modern`` presets' switches), the value it needs and why. The other switches
    export: ``--model.use_bias false`` (zero biases), ``--model.tie_embeddings false`` (its own
    ``lm_head.weight``), ``--model.activation`` (``gelu_new``, ``gelu``, ``relu2``);
    ``--model.residual_init_std`` and the dropout rates act only in training.

    Example:
        >>> from seqjax.experiments.gpt2 import Config, ModelOptions
        >>> check_exportable(Config())
        >>> check_exportable(Config(model=ModelOptions(positions="rope")))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        seqjax.experiments._config.ConfigError: cannot export ... --model.positions=rope (GPT-2 ...
    """
    bad = [f"--model.{option}={_show(getattr(cfg.model, option))} (GPT-2 needs "
           f"--model.{option}={_show(want)}: {why})"
           for option, (want, why) in _NOT_GPT2.items() if getattr(cfg.model, option) != want]
    if bad:
        raise ConfigError("cannot export this run as Hugging Face GPT-2 (transformers' "
                          f"GPT2LMHeadModel has no such switch): {'; '.join(bad)}.")


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def export_gpt2(workdir: PathLike, out: PathLike, *, step: int | None = None,
                force: bool = False) -> Path:
    """Write the checkpoint of the gpt2 run in ``workdir`` as a Hugging Face GPT-2 folder
    (files and refusals: module docstring).

    Args:
        workdir: a work dir of ``seqjax train gpt2`` (``experiment.json``, ``checkpoints/``).
        out: the folder to write; it must not exist, or be empty, unless ``force``.
        step: the checkpoint's step (``--step``); ``None``: the newest.
        force: replace an existing ``out`` (``--force``).

    Returns:
        ``out`` as an absolute :class:`~pathlib.Path`.
    """
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ConfigError(f"--step must be a checkpoint's step, an int >= 0; got {step!r}.")
    from seqjax.experiments import gpt2
    from seqjax.experiments._runner import experiment_from_workdir
    from seqjax.train.checkpoint import CheckpointMismatchError

    workdir = os.fspath(workdir)
    _, cfg = experiment_from_workdir("gpt2", workdir, [])
    check_exportable(cfg)
    target = _destination(Path(out), workdir, force)
    try:
        files, eot = _tokenizer_files(cfg, gpt2.text_tokenizer(cfg))
    except ConfigError:
        raise
    except ValueError as err:  # a missing file, ranks that are not GPT-2's, no end-of-text
        raise ConfigError(f"--tokenizer {cfg.tokenizer}: {err}") from None
    model_cfg = gpt2.build_model(cfg).config
    step, params = _restore(os.path.join(workdir, "checkpoints"), step)
    try:
        tensors = gpt2_params_to_hf(params, model_cfg)
    except ValueError as err:
        raise CheckpointMismatchError(
            f"the checkpoint of step {step} in {workdir!r} does not fit the model of the work "
            f"dir's experiment.json: {err}") from None
    files["config.json"] = _json({**gpt2_config_to_hf(model_cfg), "bos_token_id": eot,
                                  "eos_token_id": eot, "dtype": "float32"})
    _write_folder(target, files, tensors, force)
    return target


def _destination(out: Path, workdir: str, force: bool) -> Path:
    """``out`` made absolute, after the checks that keep an export from destroying anything."""
    out = Path(os.path.abspath(out))
    home = Path(os.path.realpath(workdir))
    real = Path(os.path.realpath(out))
    if real == home or real in home.parents:
        raise ConfigError(f"the export folder {str(out)!r} is or holds the work dir "
                          f"{workdir!r}: replacing it would delete the run; choose another "
                          "path.")
    _check_free(out, force)
    return out


def _check_free(out: Path, force: bool) -> None:
    """``ConfigError`` unless ``out`` is missing, an empty folder, or (``force``) a folder."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"the export folder {str(out)!r} exists and is not a folder (a file "
                          "or a link); choose another path.")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"the export folder {str(out)!r} exists and is not empty; pass "
                          "--force to replace it, or choose another path.")


def _restore(directory: str, step: int | None) -> tuple[int, Any]:
    """``(step, params)`` of the checkpoint of ``step`` (``None``: newest) in ``directory``."""
    from seqjax.train.checkpoint import Checkpointer

    if not os.path.isdir(directory):
        raise ConfigError(f"no checkpoints in {directory!r}: train the run first.")
    with Checkpointer(directory, keep=None, async_save=False, read_only=True) as ckpt:
        steps = ckpt.all_steps()
        if not steps:
            raise ConfigError(f"no finished checkpoint in {directory!r}: train the run first.")
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise ConfigError(f"--step {step}: no checkpoint of that step in {directory!r}; it "
                              f"has steps {steps}.")
        try:
            return step, ckpt.restore_params(step)
        except Exception as err:  # noqa: BLE001 — orbax's errors: one line naming the step
            first = (str(err).splitlines() or [""])[0][:300]
            raise ConfigError(f"the checkpoint of step {step} in {directory!r} cannot be read "
                              f"({type(err).__name__}: {first}); its steps: {steps} (--step)."
                              ) from None


def _tokenizer_files(cfg: Any, tok: Any) -> tuple[dict[str, bytes], int]:
    """The run's tokenizer files ``{name: bytes}`` and its end-of-text id (BOS/EOS)."""
    from seqjax.data.text_tokenizers import TiktokenTokenizer
    from seqjax.data.tokenizers import HFTokenizer

    if isinstance(tok, TiktokenTokenizer):
        return _gpt2_tokenizer_files(tok, cfg.block_size)
    if not isinstance(tok, HFTokenizer):
        raise ConfigError(
            f"--tokenizer {cfg.tokenizer}: a seqjax {type(tok).__name__} has no Hugging Face "
            "tokenizer class; only gpt2 and tokenizer.json tokenizers export.")
    # hf:PATH, a tokenizer.json, or seqjax:PATH of a BPE: the file copied as it is, for
    # PreTrainedTokenizerFast
    path = cfg.tokenizer
    if path.startswith(("hf:", "seqjax:")):
        path = path.split(":", 1)[1]
    eot_token = tok.tokenizer.id_to_token(tok.eot)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eot_token,
              "model_max_length": cfg.block_size, "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": Path(path).read_bytes(), "tokenizer_config.json": _json(config),
            "special_tokens_map.json": _json({"eos_token": eot_token})}, tok.eot


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table (``encoder.py``'s ``bytes_to_unicode``): printable
    bytes stand for themselves, the others for the characters from U+0100 on, in order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def _bpe_split(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two tokens whose merge makes ``token``: tiktoken's BPE run on ``token``'s own
    bytes (repeatedly merge the adjacent pair whose concatenation ranks lowest), stopped
    before the merges of rank ``rank`` and above."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, at = r, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2:
        raise ValueError(f"GPT-2's token {token!r} (rank {rank}) is not the merge of two "
                         "lower-ranked tokens: are these GPT-2's ranks?")
    return parts[0], parts[1]


def _gpt2_tokenizer_files(tok: Any, block_size: int) -> tuple[dict[str, bytes], int]:
    """GPT-2's five tokenizer files from the tiktoken encoding of ``tok``."""
    from seqjax._optional import require
    from seqjax.data.text_tokenizers import GPT2_EOT

    ranks = {tok.encoding.decode_single_token_bytes(i): i for i in range(GPT2_EOT)}
    char = _bytes_to_unicode()

    def spell(b: bytes) -> str:
        return "".join(char[x] for x in b)

    vocab = {**{spell(b): i for b, i in ranks.items()}, _GPT2_EOT_TOKEN: GPT2_EOT}
    merges = [tuple(spell(p) for p in _bpe_split(b, i, ranks))
              for b, i in sorted(ranks.items(), key=lambda kv: kv[1]) if len(b) > 1]
    tk = require("tokenizers", "writing GPT-2's tokenizer.json (Hugging Face `tokenizers`)")
    fast = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    fast.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    fast.decoder = tk.decoders.ByteLevel()
    fast.post_processor = tk.processors.ByteLevel(trim_offsets=False)
    fast.add_special_tokens([tk.AddedToken(_GPT2_EOT_TOKEN, special=True)])
    special = dict.fromkeys(("bos_token", "eos_token", "unk_token"), _GPT2_EOT_TOKEN)
    config = {
        "tokenizer_class": "GPT2Tokenizer", **special, "model_max_length": block_size,
        "add_prefix_space": False, "add_bos_token": False, "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(GPT2_EOT): {
            "content": _GPT2_EOT_TOKEN, "lstrip": False, "normalized": True, "rstrip": False,
            "single_word": False, "special": True}},
    }
    merges_txt = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    return {
        "vocab.json": json.dumps(vocab, ensure_ascii=False).encode("utf-8"),
        "merges.txt": merges_txt.encode("utf-8"),
        "tokenizer.json": fast.to_str().encode("utf-8"),
        "tokenizer_config.json": _json(config),
        "special_tokens_map.json": _json(special),
    }, GPT2_EOT


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _write_weights(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """``model.safetensors`` (``format: pt``, the metadata transformers reads)."""
    from safetensors.numpy import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_folder(out: Path, files: dict[str, bytes], tensors: dict[str, np.ndarray],
                  force: bool) -> None:
    """``files`` and ``model.safetensors`` written as the module docstring says (an existing
    ``out`` is checked again before it is moved aside)."""
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    try:
        if tmp.exists():  # this process's own leftover
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        _write_weights(tmp / "model.safetensors", tensors)
        for f in tmp.iterdir():
            _fsync(f)
        _check_free(out, force)
        if out.exists():
            old = out.with_name(f"{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old, out)
                raise
        else:
            os.replace(tmp, out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError):
            raise ExportWriteError(err.errno, f"could not write the export {str(out)!r}: "
                                   f"{err.strerror or err} ({err.filename or tmp}); it was left "
                                   "as it was.") from err
        raise
    # done: OUT is the new folder; the rest only tidies (best effort)
    shutil.rmtree(out.with_name(f"{out.name}.old-{os.getpid()}"), ignore_errors=True)
    try:
        _fsync(out.parent)  # the rename itself on disk
    except OSError:
        pass

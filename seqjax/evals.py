r"""Downstream evaluations of a language model from local files: multiple-choice tasks
(HellaSwag, ARC, PIQA, Winogrande, ...) and cloze tasks (LAMBADA), scored as llm.c's
``dev/data/hellaswag.py`` and nanochat's CORE score them.

**Files** (:func:`load_task`): one JSON object per line (blank lines skipped, other keys
ignored), every line of a file of one kind, choice or cloze:

* ``{"context": C, "choices": [A, B, ...], "label": i}`` (ARC, PIQA, ...) or HellaSwag's own
  ``{"ctx": C, "endings": [A, B, C, D], "label": i}``: multiple choice; row ``k`` is ``C`` then
  ``" " + A_k``, the choice scored;
* ``{"choices": [C1, C2], "continuation": X, "label": i}``: schema (Winogrande); row ``k`` is
  ``C_k`` then ``" " + X``, ``X`` scored;
* ``{"context": C, "continuation": X}``: cloze, ``C`` then ``" " + X``;
* ``{"text": T}``: LAMBADA; the last word of ``T`` is the continuation, the rest the context.

Context and continuation are encoded apart, ``encode(C)`` then ``encode(" " + X)``: the space
belongs to the continuation, as GPT-2's BPE writes a word after a space (llm.c, nanochat).

**Scores.** A row is its context tokens then its continuation tokens ``e``; the logits at
position ``t`` predict token ``t + 1`` (J&M (9.12)–(9.13)), so the loss of the continuation is

.. math::  S_k = -\sum_{t \in e_k} \log p(x_t \mid x_{<t}),\qquad \bar S_k = S_k / |e_k| .

A multiple-choice item is right when ``argmin_k S_k`` is its label (``acc``) and when
``argmin_k \bar S_k`` is (``acc_norm``, the mean loss per continuation token, which does not
favour short choices: llm.c's and nanochat's metric); ties go to the lower index. A cloze item
is right when the greedy ``argmax p(x_t | x_{<t})`` is the continuation's token at every one of
its positions (``acc``: LAMBADA's last-word accuracy, nanochat's language-modelling tasks).

**Batches** (:class:`TaskBatches`): every item is rendered once to ``[items, choices,
block_size + 1]`` arrays, each row right-padded (a causal model's logits on the real tokens are
unchanged) or cut to its last ``block_size + 1`` tokens (the whole continuation and as much
context as fits); items with fewer choices get empty rows that never win. A batch is *global*:
on a mesh its items are split over the data shards and the metrics (means weighted by
``tokens``, the items counted) reduced there. :func:`make_task_eval` is an ``eval_fn`` for
:func:`seqjax.train.loop.evaluate`, ``fit`` and :meth:`~seqjax.train.parallel.Parallel.eval_step`,
on one device or many processes.

Example:
    >>> import jax.numpy as jnp
    >>> task = EvalTask("toy", "choice", [(("ab", "ab"), ("c", "de"), 1)])
    >>> encode = lambda s: [ord(ch) % 8 for ch in s]
    >>> uniform = lambda params, x, rng, train: jnp.zeros(x.shape + (8,))  # log 8 a token
    >>> score_task(uniform, None, task, encode, block_size=8)  # acc: the shorter; acc_norm: a tie
    {'acc': 0.0, 'acc_norm': 0.0, 'items': 1}
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import check_positive_int, check_positive_ints, renamed_keywords
from seqjax.train.losses import token_cross_entropy

Array = jax.Array
Encode = Callable[[str], Sequence[int]]
ApplyFn = Callable[[Any, Array, Array, bool], Array]
Kind = Literal["choice", "cloze"]

__all__ = [
    "HELLASWAG_VAL_URL",
    "EvalTask",
    "TaskFileError",
    "TaskBatches",
    "load_task",
    "task_name",
    "make_task_eval",
    "score_task",
]

#: Where llm.c's ``dev/data/hellaswag.py`` gets HellaSwag's validation set (10,042 items).
HELLASWAG_VAL_URL = (
    "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
)
#: One item: ``(contexts, continuations, label)``, one context and continuation per row.
Item = tuple[tuple[str, ...], tuple[str, ...], int]


class TaskFileError(ValueError):
    """An evaluation file that cannot be read: the message names the file and the line."""


@dataclasses.dataclass(frozen=True)
class EvalTask:
    """An evaluation read from a file (:func:`load_task`).

    Attributes:
        name: its metrics' prefix (``<name>/acc``, ...).
        kind: ``"choice"`` (the lowest loss picks a row) or ``"cloze"`` (one row, right when
            greedy decoding gives its continuation).
        items: ``(contexts, continuations, label)``: row ``k`` is ``contexts[k]`` then
            ``" " + continuations[k]``; ``label`` is the right row (0 for cloze).
    """

    name: str
    kind: Kind
    items: list[Item]

    def __post_init__(self) -> None:
        if self.kind not in ("choice", "cloze"):
            raise ValueError(f"`kind` must be 'choice' or 'cloze'; got {self.kind!r}.")

    @property
    def max_choices(self) -> int:
        """The most rows of an item."""
        return max((len(c) for c, _, _ in self.items), default=1)


def _parse(obj: Any) -> tuple[Kind, Item] | str:
    """One line's item and kind, or what is wrong with it."""
    if not isinstance(obj, Mapping):
        return f"expected a JSON object; got {type(obj).__name__}"
    forms = ("expected one of the forms {'context', 'choices', 'label'}, {'ctx', 'endings', "
             "'label'} (HellaSwag), {'choices', 'continuation', 'label'} (Winogrande), "
             "{'context', 'continuation'} (cloze) or {'text'} (LAMBADA)")
    if "endings" in obj or "choices" in obj:
        schema = "endings" not in obj and "continuation" in obj  # Winogrande: choices are contexts
        ctx_key, choice_key = ("ctx", "endings") if "endings" in obj else ("context", "choices")
        text_key = "continuation" if schema else ctx_key
        choices, text, label = obj.get(choice_key), obj.get(text_key), obj.get("label")
        if isinstance(label, str) and label.strip().isdigit():  # PIQA/Winogrande write "0"
            label = int(label)
        if (not isinstance(choices, list) or len(choices) < 2
                or not all(isinstance(v, str) for v in choices)):
            return f"{choice_key!r} must be a list of at least 2 strings; got {choices!r}"
        if not isinstance(text, str):
            return f"{text_key!r} must be a string; got {text!r}"
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(choices):
            return f"'label' must be an int in [0, {len(choices) - 1}]; got {label!r}"
        rows, texts = tuple(choices), (text,) * len(choices)
        return "choice", (rows, texts, label) if schema else (texts, rows, label)
    if "continuation" in obj and "context" in obj:
        if not isinstance(obj["context"], str) or not isinstance(obj["continuation"], str):
            return "'context' and 'continuation' must be strings"
        return "cloze", ((obj["context"],), (obj["continuation"],), 0)
    if "text" in obj:
        text = obj["text"]
        if not isinstance(text, str) or " " not in text.strip():
            return f"'text' must be a string of at least two words; got {text!r}"
        context, word = text.strip().rsplit(" ", 1)
        return "cloze", ((context,), (word,), 0)
    return f"{forms}; got keys {sorted(obj)}"


def task_name(path: str | os.PathLike) -> str:
    """A task's name from its file: ``arc_easy.jsonl`` → ``arc_easy``; llm.c's
    ``hellaswag_val.jsonl`` → ``hellaswag``."""
    name = os.path.basename(os.fspath(path)).split(".")[0]
    return name[: -len("_val")] if name.endswith("_val") else name


def load_task(path: str | os.PathLike, *, limit: int = 0, name: str | None = None) -> EvalTask:
    """The task of a local jsonl file (the forms of the module docstring), in file order.

    Args:
        path: the file; nothing is downloaded (HellaSwag: :data:`HELLASWAG_VAL_URL`).
        limit: read only the first ``limit`` items (0: all).
        name: default :func:`task_name` of ``path``.

    Raises:
        TaskFileError: ``path`` is missing, empty, not UTF-8, a line is not JSON or not one of
            the forms, or the file mixes choice and cloze items (the file and line named).
        ValueError: ``limit`` is not an int >= 0.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"`limit` must be an int >= 0 (0: all); got {limit!r}.")
    path = os.fspath(path)
    if not os.path.isfile(path):
        hint = (f" Download hellaswag_val.jsonl from {HELLASWAG_VAL_URL} and pass its path."
                if "hellaswag" in os.path.basename(path).lower() else "")
        raise TaskFileError(f"evaluation file {path!r} not found.{hint}")
    kind: Kind | None = None
    items: list[Item] = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if limit and len(items) >= limit:
                    break
                if not line.strip():
                    continue
                try:
                    parsed = _parse(json.loads(line))
                except json.JSONDecodeError as e:
                    parsed = f"not valid JSON ({e.msg})"
                if isinstance(parsed, str):
                    raise TaskFileError(f"{path}, line {lineno}: {parsed}.")
                if kind is not None and parsed[0] != kind:
                    raise TaskFileError(f"{path}, line {lineno}: a {parsed[0]} item in a file "
                                        f"of {kind} items (one kind per file).")
                kind = parsed[0]
                items.append(parsed[1])
    except UnicodeDecodeError as e:
        raise TaskFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}).") from None
    if kind is None:
        raise TaskFileError(f"{path}: no items (expected one JSON object per line).")
    return EvalTask(name or task_name(path), kind, items)


def _render(item: Item, encode: Encode) -> list[tuple[list[int], int]]:
    """Each row's tokens and the index of its first continuation token."""
    rows = []
    for context, continuation in zip(item[0], item[1], strict=True):
        ctx, cont = list(encode(context)), list(encode(" " + continuation))
        if not ctx or not cont:
            what = "context" if not ctx else "continuation"
            raise ValueError(f"an item's {what} encodes to no tokens (context={context!r}, "
                             f"continuation={continuation!r}): a scored token needs a token "
                             "before it.")
        rows.append((ctx + cont, len(ctx)))
    return rows


class TaskBatches(Sequence[dict[str, np.ndarray]]):
    """An :class:`EvalTask` as global batches of ``items_per_batch`` items:
    ``{"tokens": [N, C, block_size + 1] int32, "mask": [N, C, block_size + 1] bool (True on the
    continuation), "label": [N] int32, "valid": [N] bool}``; ``C`` is the task's most choices,
    ``len(...)`` the batch count. The last batch is padded with invalid items (one shape, one
    compilation). Items are encoded and checked here: an empty context or continuation, a
    continuation longer than ``block_size`` or an id outside ``[0, vocab_size)`` is a
    ``ValueError`` naming the task and the item.
    """

    @renamed_keywords(seq_len="block_size")
    def __init__(self, task: EvalTask, encode: Encode, *, items_per_batch: int,
                 block_size: int, vocab_size: int | None = None) -> None:
        check_positive_ints(items_per_batch=items_per_batch, block_size=block_size)
        if not task.items:
            raise ValueError(f"task {task.name!r} has no items.")
        self.task, self.items_per_batch, self.block_size = task, items_per_batch, block_size
        self.choices = task.max_choices
        self._rows = []
        for n, item in enumerate(task.items):
            try:
                rows = _render(item, encode)
            except ValueError as e:
                raise ValueError(f"task {task.name!r}, item {n}: {e}") from None
            for tokens, start in rows:
                if len(tokens) - start > block_size:
                    raise ValueError(
                        f"task {task.name!r}, item {n}: a continuation of "
                        f"{len(tokens) - start} tokens does not fit a window of "
                        f"block_size={block_size} (one context token must precede it).")
                if vocab_size is not None and not all(0 <= t < vocab_size for t in tokens):
                    raise ValueError(f"task {task.name!r}, item {n}: token ids outside the "
                                     f"model's vocabulary [0, {vocab_size}) (another tokenizer?).")
            self._rows.append(rows)

    def regrouped(self, items_per_batch: int) -> TaskBatches:
        """The same items (encoded once) in batches of ``items_per_batch``."""
        check_positive_int(items_per_batch, "items_per_batch")
        out = copy.copy(self)
        out.items_per_batch = items_per_batch
        return out

    def __len__(self) -> int:
        return -(-len(self._rows) // self.items_per_batch)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        n, c, w = self.items_per_batch, self.choices, self.block_size + 1
        tokens = np.zeros((n, c, w), np.int32)
        mask = np.zeros((n, c, w), bool)
        label = np.zeros((n,), np.int32)
        valid = np.zeros((n,), bool)
        first = i * n
        for r, rows in enumerate(self._rows[first: first + n]):
            for k, (row, start) in enumerate(rows):
                cut = max(0, len(row) - w)  # keep the last w tokens
                tokens[r, k, : len(row) - cut] = row[cut:]
                mask[r, k, start - cut: len(row) - cut] = True
            label[r], valid[r] = self.task.items[first + r][2], True
        return {"tokens": tokens, "mask": mask, "label": label, "valid": valid}

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return (self[i] for i in range(len(self)))


def make_task_eval(apply_fn: ApplyFn, kind: Kind) -> Callable[[Any, Mapping[str, Array]],
                                                              dict[str, Array]]:
    """An ``eval_fn(params, batch)`` of a :class:`TaskBatches` batch: ``{"acc", "acc_norm",
    "tokens"}`` (choice) or ``{"acc", "tokens"}`` (cloze), the module docstring's scores as means
    over the batch's valid items; ``tokens`` is their count, the weight
    :func:`seqjax.train.loop.evaluate` averages batches with.

    Args:
        apply_fn: ``(params, tokens_BxT, rng, train) -> logits_BxTxV``
            (:func:`seqjax.train.step.flax_apply_fn`).
        kind: the task's kind.
    """
    if kind not in ("choice", "cloze"):
        raise ValueError(f"`kind` must be 'choice' or 'cloze'; got {kind!r}.")

    def eval_fn(params: Any, batch: Mapping[str, Array]) -> dict[str, Array]:
        tokens_NxCxW, mask_NxCxW = batch["tokens"], batch["mask"]
        n, c, w = tokens_NxCxW.shape
        rows = tokens_NxCxW.reshape(n * c, w)
        logits_RxTxV = apply_fn(params, rows[:, :-1], jax.random.PRNGKey(0), False)
        targets_RxT, scored_RxT = rows[:, 1:], mask_NxCxW.reshape(n * c, w)[:, 1:]
        loss_RxT = token_cross_entropy(logits_RxTxV, targets_RxT, scored_RxT)
        valid_N = batch["valid"].astype(jnp.float32)
        items = jnp.sum(valid_N)
        label_N = batch["label"]

        def mean(hit_N: Array) -> Array:
            return jnp.sum(hit_N.astype(jnp.float32) * valid_N) / jnp.maximum(items, 1.0)

        if kind == "cloze":
            greedy_RxT = jnp.argmax(logits_RxTxV, axis=-1) == targets_RxT
            exact_R = jnp.all(greedy_RxT | ~scored_RxT, axis=-1)
            return {"acc": mean(exact_R.reshape(n, c)[:, 0]), "tokens": items}
        s_NxC = jnp.sum(loss_RxT, axis=-1).reshape(n, c)
        count_NxC = jnp.sum(scored_RxT, axis=-1, dtype=jnp.float32).reshape(n, c)
        s_NxC = jnp.where(count_NxC == 0, jnp.inf, s_NxC)  # a padding row never wins
        norm_NxC = s_NxC / jnp.maximum(count_NxC, 1.0)
        return {"acc": mean(jnp.argmin(s_NxC, axis=-1) == label_N),
                "acc_norm": mean(jnp.argmin(norm_NxC, axis=-1) == label_N), "tokens": items}

    return eval_fn


@renamed_keywords(seq_len="block_size")
def score_task(apply_fn: ApplyFn, params: Any, task: EvalTask, encode: Encode, *,
               block_size: int, items_per_batch: int = 4) -> dict[str, float | int]:
    """A task's scores on one device: ``{"acc", "acc_norm" (choice), "items"}``.

    ``apply_fn`` as for :func:`make_task_eval` (jitted here: the same function object reuses the
    compilation); the rest as for :class:`TaskBatches`. On a mesh, give :class:`TaskBatches` and
    :func:`make_task_eval` to ``fit`` or :func:`seqjax.train.loop.evaluate` instead.
    """
    from seqjax.train.loop import evaluate

    batches = TaskBatches(task, encode, items_per_batch=items_per_batch, block_size=block_size)
    metrics = evaluate(_jitted_eval(apply_fn, task.kind), params, batches)
    return {**{k: v for k, v in metrics.items() if k != "tokens"}, "items": int(metrics["tokens"])}


@functools.lru_cache(maxsize=8)
def _jitted_eval(apply_fn: ApplyFn, kind: Kind) -> Any:
    """One compiled evaluation per ``(apply_fn, kind)`` (and batch shape)."""
    return jax.jit(make_task_eval(apply_fn, kind))

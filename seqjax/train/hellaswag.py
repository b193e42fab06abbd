r"""HellaSwag: completion scoring of a language model (llm.c's ``dev/data/hellaswag.py``).

Each item of ``hellaswag_val.jsonl`` is a context ``ctx``, four candidate ``endings`` and
the index ``label`` of the right one. A language model scores an ending by the
cross-entropy of its tokens given the context, as llm.c and Karpathy's build-nanogpt do:

* context tokens ``c = encode(ctx)``; ending tokens ``e_i = encode(" " + ending_i)`` (the
  leading space belongs to the ending, as GPT-2's BPE writes a word after a space);
* row ``i`` is ``c ‖ e_i``; its mask is True on the ending's positions;
* the loss of ending ``i`` is the cross-entropy of each ending token given the tokens
  before it (J&M (9.12)–(9.13): the logits at position ``t`` predict token ``t + 1``, so
  the mask is shifted by one), summed over the ending:

.. math::  S_i = -\sum_{t \in e_i} \log p(x_t \mid x_{<t}),\qquad
           \bar S_i = S_i / |e_i| .

``acc`` is the fraction of items whose ``argmin_i S_i`` is the label; ``acc_norm`` the
fraction whose ``argmin_i \bar S_i`` (the mean loss per ending token, which does not
favour short endings) is. Ties go to the lower index.

For speed on an accelerator, :func:`hellaswag_losses` pads every row to one length
``max_len`` (the model's context) and stacks ``batch_items`` items (``4 · batch_items``
rows) per call, so one jitted scoring function serves every item. Right padding leaves a
causal model's logits on the real tokens unchanged; a row longer than ``max_len`` keeps
its last ``max_len`` tokens (the whole ending and as much context as fits). The
log-softmax runs in float32 whatever the logits' dtype
(:func:`seqjax.train.losses.token_cross_entropy`).

The data file is not downloaded here: llm.c fetches
``https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl``
(10,042 items); pass the path of a local copy to :func:`load_hellaswag`.

Example:
    >>> import jax.numpy as jnp
    >>> items = [{"ctx": "ab", "endings": ["a", "bc", "d", "e"], "label": 0}]
    >>> encode = lambda s: [ord(ch) % 8 for ch in s]
    >>> uniform = lambda params, x: jnp.zeros(x.shape + (8,))   # log 8 per token
    >>> hellaswag_scores(uniform, None, items, encode, max_len=8)   # ties: the first wins
    {'acc': 1.0, 'acc_norm': 1.0, 'items': 1}
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.train.losses import token_cross_entropy

Array = jax.Array
LogitsFn = Callable[[Any, Array], Array]
Encode = Callable[[str], Sequence[int]]

__all__ = [
    "HELLASWAG_VAL_URL",
    "load_hellaswag",
    "render_item",
    "hellaswag_losses",
    "hellaswag_scores",
]

HELLASWAG_VAL_URL = (
    "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
)
NUM_ENDINGS = 4


def _item_error(item: Any) -> str | None:
    """What is wrong with a HellaSwag item (``None`` if nothing): the keys and their types."""
    if not isinstance(item, Mapping):
        return (f"expected a JSON object with keys 'ctx', 'endings', 'label'; "
                f"got {type(item).__name__}")
    for key in ("ctx", "endings", "label"):
        if key not in item:
            return f"missing key {key!r} (expected keys 'ctx', 'endings', 'label')"
    if not isinstance(item["ctx"], str):
        return f"'ctx' must be a string; got {type(item['ctx']).__name__}"
    endings = item["endings"]
    if (not isinstance(endings, list) or len(endings) != NUM_ENDINGS
            or not all(isinstance(e, str) for e in endings)):
        return f"'endings' must be a list of {NUM_ENDINGS} strings; got {endings!r}"
    label = item["label"]
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < NUM_ENDINGS:
        return f"'label' must be an int in [0, {NUM_ENDINGS - 1}]; got {label!r}"
    return None


def load_hellaswag(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """The items of a local HellaSwag jsonl file (e.g. ``hellaswag_val.jsonl``), in file order.

    Each line is one JSON object with at least ``ctx`` (str), ``endings`` (4 str) and
    ``label`` (int in ``[0, 3]``); other keys (``ind``, ``activity_label``, ``ctx_a``,
    ``ctx_b``, ``split``, ...) are kept as they are. Blank lines are skipped.

    Args:
        path: the jsonl file. Nothing is downloaded: get it from :data:`HELLASWAG_VAL_URL`.
        limit: read only the first ``limit`` items (``None``: all).

    Raises:
        FileNotFoundError: ``path`` does not exist (the message says where to get it).
        ValueError: a line that is not JSON or lacks a key / has a wrong type (the message
            names the file and the line number).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"`limit` must be None or an int >= 0; got {limit!r}.")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"HellaSwag file {path!r} not found. Download hellaswag_val.jsonl from "
            f"{HELLASWAG_VAL_URL} (as llm.c's dev/data/hellaswag.py does) and pass its path."
        )
    items: list[dict] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(items) >= limit:
                break
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {lineno}: not valid JSON ({e.msg}).") from None
            problem = _item_error(item)
            if problem is not None:
                raise ValueError(f"{path}, line {lineno}: {problem}.")
            items.append(item)
    return items


def render_item(item: Mapping[str, Any], encode: Encode) -> tuple[np.ndarray, np.ndarray, int]:
    """llm.c's rendering of one item: ``(tokens_4xT int32, mask_4xT bool, label)``.

    Row ``i`` is ``encode(ctx) + encode(" " + endings[i])``, right-padded with 0 to the
    longest of the four rows (``T``); ``mask`` is True on row ``i``'s ending tokens.

    Args:
        item: a mapping with ``ctx``, ``endings`` (4 strings) and ``label`` (see
            :func:`load_hellaswag`).
        encode: text → token ids (e.g. ``tiktoken.get_encoding("gpt2").encode`` or a
            :class:`seqjax.data.tokenizers.Tokenizer`'s ``encode``).

    Raises:
        ValueError: a malformed item, an empty context or an empty ending (a token that
            nothing precedes has no prediction to score).

    Example:
        >>> tokens, mask, label = render_item(
        ...     {"ctx": "ab", "endings": ["c", "de", "f", "g"], "label": 1},
        ...     lambda s: [ord(ch) - ord("a") for ch in s.replace(" ", "")])
        >>> tokens.tolist()[1], mask.tolist()[1], label
        ([0, 1, 3, 4], [False, False, True, True], 1)
    """
    problem = _item_error(item)
    if problem is not None:
        raise ValueError(f"`item`: {problem}.")
    ctx_tokens = list(encode(item["ctx"]))
    if not ctx_tokens:
        raise ValueError(f"`encode(item['ctx'])` must give at least one token; got none "
                         f"(ctx={item['ctx']!r}).")
    end_tokens = [list(encode(" " + ending)) for ending in item["endings"]]
    for i, toks in enumerate(end_tokens):
        if not toks:
            raise ValueError(f"`encode(' ' + item['endings'][{i}])` must give at least one "
                             f"token; got none (ending={item['endings'][i]!r}).")
    width = len(ctx_tokens) + max(len(toks) for toks in end_tokens)
    tokens_4xT = np.zeros((NUM_ENDINGS, width), np.int32)
    mask_4xT = np.zeros((NUM_ENDINGS, width), bool)
    c = len(ctx_tokens)
    for i, toks in enumerate(end_tokens):
        tokens_4xT[i, : c + len(toks)] = ctx_tokens + toks
        mask_4xT[i, c: c + len(toks)] = True
    return tokens_4xT, mask_4xT, int(item["label"])


def _fit_rows(tokens_RxT: np.ndarray, mask_RxT: np.ndarray, max_len: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """Rows padded with 0 (mask False) or cropped to their last ``max_len`` tokens."""
    rows = tokens_RxT.shape[0]
    out_tokens = np.zeros((rows, max_len), np.int32)
    out_mask = np.zeros((rows, max_len), bool)
    for r in range(rows):
        length = int(np.flatnonzero(mask_RxT[r])[-1]) + 1  # the row ends with its ending
        start = max(0, length - max_len)
        out_tokens[r, : length - start] = tokens_RxT[r, start:length]
        out_mask[r, : length - start] = mask_RxT[r, start:length]
    return out_tokens, out_mask


def _row_losses(logits_fn: LogitsFn, params: Any, tokens_RxT: Array, mask_RxT: Array
                ) -> tuple[Array, Array]:
    """``(S_R, n_R)``: each row's summed loss of its masked tokens and their count (float32)."""
    logits_RxTxV = logits_fn(params, tokens_RxT)  # shape checked by hellaswag_losses
    # The logits at t predict token t + 1: the loss of each ending token is read one step back.
    target_mask = mask_RxT[:, 1:]
    loss_RxT1 = token_cross_entropy(logits_RxTxV[:, :-1], tokens_RxT[:, 1:], target_mask)
    return jnp.sum(loss_RxT1, axis=1), jnp.sum(target_mask, axis=1, dtype=jnp.float32)


# One compiled program per (logits_fn, params structure, rows, max_len): pass the same
# logits_fn object on every call to reuse it.
_row_losses_jit = jax.jit(_row_losses, static_argnums=0)


def hellaswag_losses(
    logits_fn: LogitsFn,
    params: Any,
    items: Iterable[Mapping[str, Any]],
    encode: Encode,
    *,
    max_len: int,
    batch_items: int = 4,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each ending's summed loss ``S_i`` and token count ``|e_i|``, and the labels.

    Rows (:func:`render_item`) are padded or cropped to ``max_len`` and scored
    ``batch_items`` items (``4 · batch_items`` rows of ``max_len``) per call of one jitted
    function; the last batch is filled with copies of its last item, whose results are
    dropped. The logits of a call are ``[4 · batch_items, max_len, V]``: size
    ``batch_items`` to fit them in memory.

    Args:
        logits_fn: ``(params, tokens_BxT int32) -> logits_BxTxV`` of a causal language model,
            e.g. ``lambda p, x: model.apply({"params": p}, x)``. Jitted here with
            ``logits_fn`` static: pass the same function object to reuse the compilation.
        params: the model's parameters, passed to ``logits_fn``.
        items: HellaSwag items (:func:`load_hellaswag`).
        encode: text → token ids, as for :func:`render_item`.
        max_len: the row length, at least 2: the model's context length.
        batch_items: items per call.

    Returns:
        ``(loss_sum_Nx4 float32, num_tokens_Nx4 int32, labels_N int32)``.

    Raises:
        ValueError: no items; bad ``max_len``/``batch_items``; an ending of ``max_len``
            tokens or more (the first ending token needs a token before it); a token id
            outside the logits' ``[0, V)``; ``logits_fn`` output of the wrong shape.
    """
    for name, value, low in (("max_len", max_len, 2), ("batch_items", batch_items, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"`{name}` must be an int >= {low}; got {value!r}.")
    rendered = [render_item(item, encode) for item in items]
    if not rendered:
        raise ValueError("`items` must hold at least one HellaSwag item; got none.")
    for n, (_, mask_4xT, _) in enumerate(rendered):
        longest = int(mask_4xT.sum(axis=1).max())
        if longest >= max_len:
            raise ValueError(f"item {n} has an ending of {longest} tokens; with max_len={max_len} "
                             f"an ending can have at most {max_len - 1} (one context token "
                             f"must precede it).")
    num_items = len(rendered)

    rows = NUM_ENDINGS * batch_items
    spec = jax.ShapeDtypeStruct((rows, max_len), jnp.int32)
    logits_shape = tuple(jax.eval_shape(logits_fn, params, spec).shape)
    if len(logits_shape) != 3 or logits_shape[:2] != (rows, max_len):
        raise ValueError(f"`logits_fn(params, tokens)` must return [R, T, V] logits with "
                         f"[R, T] = {(rows, max_len)}; got {logits_shape}.")
    vocab = logits_shape[2]
    for n, (tokens_4xT, _, _) in enumerate(rendered):
        lo, hi = int(tokens_4xT.min()), int(tokens_4xT.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"`encode` must give token ids in [0, {vocab - 1}] (the vocabulary "
                             f"of `logits_fn`); item {n} has ids in [{lo}, {hi}].")

    # Rows are fitted to max_len one batch at a time (the whole set at max_len would be
    # large); the device results are read back after the loop so the calls run ahead.
    results = []
    for start in range(0, num_items, batch_items):
        take = [min(n, num_items - 1) for n in range(start, start + batch_items)]
        fitted = [_fit_rows(rendered[n][0], rendered[n][1], max_len) for n in take]
        tokens_RxT = np.concatenate([t for t, _ in fitted])
        mask_RxT = np.concatenate([m for _, m in fitted])
        results.append(_row_losses_jit(logits_fn, params, jnp.asarray(tokens_RxT),
                                       jnp.asarray(mask_RxT)))
    real = num_items * NUM_ENDINGS  # the last batch's copies are dropped
    loss_sum_Nx4 = np.concatenate([np.asarray(s_R, np.float32) for s_R, _ in results])[
        :real].reshape(num_items, NUM_ENDINGS)
    num_tokens_Nx4 = np.concatenate([np.asarray(n_R) for _, n_R in results])[
        :real].reshape(num_items, NUM_ENDINGS).astype(np.int32)
    labels_N = np.asarray([label for _, _, label in rendered], np.int32)
    return loss_sum_Nx4, num_tokens_Nx4, labels_N


def hellaswag_scores(
    logits_fn: LogitsFn,
    params: Any,
    items: Iterable[Mapping[str, Any]],
    encode: Encode,
    *,
    max_len: int,
    batch_items: int = 4,
) -> dict[str, float | int]:
    """HellaSwag accuracy: ``{"acc", "acc_norm", "items"}`` (llm.c's scoring).

    ``acc`` picks the ending of lowest summed loss ``S_i``, ``acc_norm`` the lowest mean
    loss ``S_i / |e_i|``; ``items`` is the number of items scored. Arguments as for
    :func:`hellaswag_losses`.
    """
    loss_sum_Nx4, num_tokens_Nx4, labels_N = hellaswag_losses(
        logits_fn, params, items, encode, max_len=max_len, batch_items=batch_items
    )
    pred = np.argmin(loss_sum_Nx4, axis=1)
    pred_norm = np.argmin(loss_sum_Nx4 / num_tokens_Nx4, axis=1)
    return {
        "acc": float(np.mean(pred == labels_N)),
        "acc_norm": float(np.mean(pred_norm == labels_N)),
        "items": int(labels_N.shape[0]),
    }

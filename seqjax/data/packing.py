r"""Source–delimiter–target packing for a causal LM (J&M §9.9, summarization).

J&M §9.9 turn each article–summary pair :math:`(x_1, \dots, x_m;\ y_1, \dots, y_n)` into

.. math::
    s = (x_1, \dots, x_m, \delta, y_1, \dots, y_n), \qquad |s| = m + n + 1,

with :math:`\delta` a unique marker, and train an ordinary autoregressive LM on these strings
with teacher forcing (J&M Figs. 9.21, 9.23–9.24), the loss over the whole string,

.. math::
    L = \frac{1}{\sum_t m_t} \sum_{t=1}^{|s|-1} m_t \big(-\log p(s_{t+1} \mid s_{\le t})\big),
    \qquad m_t = 1\ (\texttt{loss\_on="all"}),

the average cross-entropy of J&M (9.12)–(9.13) / MEDL (7.4)–(7.5). ``loss_on="target"`` keeps
only the summary's predictions (:math:`m_t = 1` iff :math:`s_{t+1}` is a :math:`y_j` or the
end-of-sequence token, so :math:`\delta \to y_1` is included): the fine-tuning loss of later
instruction-tuned models, *not* J&M's. At inference the prompt is
:math:`(x_1, \dots, x_m, \delta)` (J&M Fig. 9.24); ``prompt_lengths`` gives its length.

Optional ``bos_id`` goes before :math:`x_1` and ``eos_id`` after :math:`y_n` (:math:`|s|` grows
by one each); the delimiter must occur in neither part. Padding is on the right; ``loss_mask``
is ``False`` past ``lengths`` (the real input positions).

Example:
    >>> b = pack_pairs([[5, 6, 7]], [[8, 9]], delimiter_id=3, loss_on="target")
    >>> b["inputs"].tolist(), b["targets"].tolist()
    ([[5, 6, 7, 3, 8]], [[6, 7, 3, 8, 9]])
    >>> b["loss_mask"].astype(int).tolist(), b["prompt_lengths"].tolist()
    ([[0, 0, 0, 1, 1]], [4])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seqjax._checks import renamed_keywords
from seqjax.data.batching import pad_batch

__all__ = ["LOSS_ON", "pack_pair", "pack_pairs"]

LOSS_ON = ("all", "target")


def _ids(seq: Sequence[int], name: str, index: int) -> list[int]:
    try:
        out = [int(t) for t in seq]
    except (TypeError, ValueError) as e:
        raise TypeError(f"`{name}[{index}]` must be a sequence of token ids; got "
                        f"{type(seq).__name__}.") from e
    if any(t < 0 for t in out):
        raise ValueError(f"`{name}[{index}]` holds a negative token id: {min(out)}.")
    return out


def pack_pair(src: Sequence[int], tgt: Sequence[int], delimiter_id: int, *,
              bos_id: int | None = None, eos_id: int | None = None) -> list[int]:
    """``[bos] + src + [δ] + tgt + [eos]`` (J&M §9.9), checking that ``δ`` is unique.

    Example:
        >>> pack_pair([5, 6], [7], 3, eos_id=2)
        [5, 6, 3, 7, 2]
    """
    src_ids, tgt_ids = _ids(src, "src", 0), _ids(tgt, "tgt", 0)
    for name, part in (("src", src_ids), ("tgt", tgt_ids)):
        if delimiter_id in part:
            raise ValueError(f"`delimiter_id` {delimiter_id} occurs in `{name}` at position "
                             f"{part.index(delimiter_id)}: J&M's δ must be a unique marker.")
    return ([] if bos_id is None else [int(bos_id)]) + [*src_ids, int(delimiter_id), *tgt_ids] + (
        [] if eos_id is None else [int(eos_id)])


@renamed_keywords({"max_len": "the inputs' width, one less than the string's length max_len"},
                  max_len="block_size")
def pack_pairs(srcs: Sequence[Sequence[int]], tgts: Sequence[Sequence[int]], delimiter_id: int, *,
               loss_on: str = "all", bos_id: int | None = None, eos_id: int | None = None,
               pad_id: int = 0, block_size: int | None = None) -> dict[str, np.ndarray]:
    """Pack pairs into a causal-LM batch (see the module docstring).

    Args:
        srcs, tgts: the token ids of each source ``x`` and target ``y`` (equal counts).
        delimiter_id: ``δ``.
        loss_on: ``"all"`` (J&M: the whole string) or ``"target"`` (only the summary).
        bos_id, eos_id: optional tokens before ``x`` and after ``y``.
        pad_id: fills the rows on the right.
        block_size: width of ``inputs``/``targets`` (the context length): strings are padded to
            ``block_size + 1`` tokens, a longer one raises. Default: the longest string less one.

    Returns:
        ``inputs``, ``targets`` (int32 ``[N, L-1]``: the string without its last / first token),
        ``loss_mask`` (bool ``[N, L-1]``), ``lengths`` (int32 ``[N]``: ``|s| - 1``),
        ``prompt_lengths`` (int32 ``[N]``: ``[bos] x δ``, the prompt for generating ``y``).
    """
    if loss_on not in LOSS_ON:
        raise ValueError(f"`loss_on` must be one of {LOSS_ON}; got {loss_on!r}.")
    if len(srcs) != len(tgts):
        raise ValueError(f"`srcs` and `tgts` must have the same length; got {len(srcs)} and "
                         f"{len(tgts)}.")
    if len(srcs) == 0:
        raise ValueError("`srcs` is empty: nothing to pack.")
    strings, prompts = [], []
    for i, (x, y) in enumerate(zip(srcs, tgts)):
        x, y = _ids(x, "srcs", i), _ids(y, "tgts", i)
        try:
            strings.append(pack_pair(x, y, delimiter_id, bos_id=bos_id, eos_id=eos_id))
        except ValueError as e:
            raise ValueError(f"pair {i}: {e}") from None
        prompts.append(len(x) + 1 + (bos_id is not None))
    if block_size is not None and not block_size >= 1:
        raise ValueError(f"`block_size` must be >= 1; got {block_size}.")
    longest = max(len(s) for s in strings)
    width = longest if block_size is None else int(block_size) + 1
    if width < longest:
        i = int(np.argmax([len(s) for s in strings]))
        raise ValueError(f"`block_size` is {width - 1} but pair {i} packs to {longest} tokens "
                         f"(block_size + 1 = {width} at most).")
    if width < 2:
        raise ValueError(f"a packed string needs at least 2 tokens to predict one; got {width}.")
    padded = pad_batch(strings, pad_id=pad_id, length=width)
    seq, mask, prompt_lengths = padded["ids"], padded["mask"][:, 1:], np.array(prompts, np.int32)
    if loss_on == "target":  # predictions of y_1..y_n (and eos): target index >= the prompt length
        mask = mask & (np.arange(1, width)[None] >= prompt_lengths[:, None])
    return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "loss_mask": mask,
            "lengths": padded["lengths"] - 1, "prompt_lengths": prompt_lengths}

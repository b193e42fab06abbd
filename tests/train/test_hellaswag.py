"""HellaSwag scoring vs a numpy transcription of llm.c's ``dev/data/hellaswag.py``."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.models import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.train.hellaswag import (
    HELLASWAG_VAL_URL,
    hellaswag_losses,
    hellaswag_scores,
    load_hellaswag,
    render_item,
)

V = 37
MAX_LEN = 32

ITEMS = [
    {"ind": 0, "activity_label": "Cooking", "ctx": "She cracks two eggs", "split": "val",
     "endings": ["into a bowl.", "at the moon", "and sings", "."], "label": 0},
    {"ind": 1, "ctx": "A man rides a bike", "endings": ["downhill.", "up", "fast", "x y z"],
     "label": 2},
    {"ind": 2, "ctx": "Kids play", "endings": ["tag", "in the park all day", "ball", "chess."],
     "label": 1},
    {"ind": 3, "ctx": "The dog", "endings": ["barks.", "sleeps", "eats a bone", "runs"],
     "label": 3},
    {"ind": 4, "ctx": "Rain falls on the roof", "endings": ["loudly", "and", "all night", "."],
     "label": 0},
    {"ind": 5, "ctx": "He opens the door", "endings": ["slowly.", "to the cat", "wide", "and"],
     "label": 2},
]


def byte_encode(text):
    """A stand-in tokenizer: each UTF-8 byte mod V."""
    return [b % V for b in text.encode("utf-8")]


def write_jsonl(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def np_log_softmax(z):
    z = np.asarray(z, np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def np_llmc_render(item, encode):
    """llm.c's render_example: rows ctx + ending, padded with 0 to the longest, mask on endings."""
    ctx = encode(item["ctx"])
    ends = [encode(" " + e) for e in item["endings"]]
    width = max(len(ctx) + len(e) for e in ends)
    tokens = np.zeros((4, width), np.int64)
    mask = np.zeros((4, width), np.int64)
    for i, e in enumerate(ends):
        tokens[i, : len(ctx) + len(e)] = ctx + e
        mask[i, len(ctx): len(ctx) + len(e)] = 1
    return tokens, mask


def np_llmc_losses(logits_4xTxV, tokens_4xT, mask_4xT):
    """llm.c's scoring: shift, per-token cross-entropy, masked sum and mean per row."""
    shift_logits = logits_4xTxV[:, :-1]
    shift_tokens = tokens_4xT[:, 1:]
    logp = np_log_softmax(shift_logits)
    losses = -np.take_along_axis(logp, shift_tokens[..., None], -1)[..., 0]
    shift_mask = mask_4xT[:, 1:]
    sum_loss = (losses * shift_mask).sum(1)
    return sum_loss, sum_loss / shift_mask.sum(1)


def np_llmc_scores(logits_fn, params, items, encode, crop=None):
    """acc, acc_norm and per-ending summed losses, one item at a time, rows unpadded beyond
    the longest of the four (``crop``: score each row alone on its last ``crop`` tokens)."""
    sums, hits, hits_norm = [], 0, 0
    for item in items:
        tokens, mask = np_llmc_render(item, encode)
        if crop is None:
            logits = np.asarray(logits_fn(params, jnp.asarray(tokens, jnp.int32)))
            sum_loss, mean_loss = np_llmc_losses(logits, tokens, mask)
        else:
            sum_loss, mean_loss = np.zeros(4), np.zeros(4)
            for i in range(4):
                end = int(np.flatnonzero(mask[i])[-1]) + 1
                row, row_mask = tokens[i:i + 1, max(0, end - crop):end], mask[i:i + 1,
                                                                            max(0, end - crop):end]
                logits = np.asarray(logits_fn(params, jnp.asarray(row, jnp.int32)))
                s, m = np_llmc_losses(logits, row, row_mask)
                sum_loss[i], mean_loss[i] = s[0], m[0]
        sums.append(sum_loss)
        hits += int(sum_loss.argmin() == item["label"])
        hits_norm += int(mean_loss.argmin() == item["label"])
    return hits / len(items), hits_norm / len(items), np.stack(sums)


@pytest.fixture(scope="module")
def gpt():
    model = TransformerLM(TransformerLMConfig(vocab_size=V, num_layers=1, embed_dim=16,
                                              max_len=MAX_LEN, block=gpt_block(2)))
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, MAX_LEN), jnp.int32))["params"]
    return (lambda p, x: model.apply({"params": p}, x)), params


def test_load_keeps_every_key_and_limit(tmp_path):
    path = write_jsonl(tmp_path / "hellaswag_val.jsonl", ITEMS)
    assert load_hellaswag(path) == ITEMS
    assert load_hellaswag(str(path), limit=2) == ITEMS[:2]
    assert load_hellaswag(path, limit=0) == []


def test_render_item_is_llmc_rendering():
    tokens, mask, label = render_item(ITEMS[0], byte_encode)
    want_tokens, want_mask = np_llmc_render(ITEMS[0], byte_encode)
    assert tokens.dtype == np.int32 and mask.dtype == bool and label == 0
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_array_equal(mask, want_mask.astype(bool))


@pytest.mark.parametrize("batch_items", [1, 4])
def test_gpt_scores_match_llmc_reference(tmp_path, gpt, batch_items):
    """Padding every row to max_len and stacking items (6 items: the last batch of 4 is
    padded with copies) gives llm.c's per-item scores on the unpadded rows."""
    logits_fn, params = gpt
    items = load_hellaswag(write_jsonl(tmp_path / "h.jsonl", ITEMS))
    acc, acc_norm, want_sums = np_llmc_scores(logits_fn, params, items, byte_encode)
    got = hellaswag_scores(logits_fn, params, items, byte_encode, max_len=MAX_LEN,
                           batch_items=batch_items)
    assert got == {"acc": acc, "acc_norm": acc_norm, "items": len(ITEMS)}
    sums, counts, labels = hellaswag_losses(logits_fn, params, items, byte_encode,
                                            max_len=MAX_LEN, batch_items=batch_items)
    np.testing.assert_allclose(sums, want_sums, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(
        counts, [[len(byte_encode(" " + e)) for e in item["endings"]] for item in ITEMS])
    np.testing.assert_array_equal(labels, [item["label"] for item in ITEMS])


def test_batching_does_not_change_losses(gpt):
    logits_fn, params = gpt
    one = hellaswag_losses(logits_fn, params, ITEMS, byte_encode, max_len=MAX_LEN, batch_items=1)
    four = hellaswag_losses(logits_fn, params, ITEMS, byte_encode, max_len=MAX_LEN,
                            batch_items=4)
    np.testing.assert_allclose(one[0], four[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(one[1], four[1])


# A model that always predicts token K = 0: logits α·e_K at every position, so each token
# costs a = log(e^α + V' - 1) - α if it is K and b = log(e^α + V' - 1) otherwise (a < b).
V_SMALL, ALPHA = 4, 2.0
A_LOSS = math.log(math.exp(ALPHA) + V_SMALL - 1) - ALPHA
B_LOSS = math.log(math.exp(ALPHA) + V_SMALL - 1)


def predicts_zero(params, tokens_BxT):
    return jnp.broadcast_to(ALPHA * jax.nn.one_hot(0, V_SMALL), tokens_BxT.shape + (V_SMALL,))


def small_encode(text):
    """' ' and 'k' are token 0 (the predicted one), 'x' is 1, anything else 2."""
    return [0 if ch in " k" else 1 if ch == "x" else 2 for ch in text]


def test_acc_uses_the_sum_and_acc_norm_the_mean():
    # " x": a + b (lowest sum); " kkx": 3a + b over 4 tokens (lowest mean); the others are
    # costlier both ways. So acc picks ending 0 and acc_norm ending 1.
    endings = ["x", "kkx", "xx", "xxx"]
    items = [{"ctx": "ab", "endings": endings, "label": label} for label in (0, 1, 1)]
    sums, counts, _ = hellaswag_losses(predicts_zero, None, items, small_encode, max_len=8)
    want = [A_LOSS + B_LOSS, 3 * A_LOSS + B_LOSS, A_LOSS + 2 * B_LOSS, A_LOSS + 3 * B_LOSS]
    np.testing.assert_allclose(sums, [want] * 3, rtol=1e-6)
    np.testing.assert_array_equal(counts, [[2, 4, 3, 4]] * 3)
    got = hellaswag_scores(predicts_zero, None, items, small_encode, max_len=8, batch_items=2)
    assert got == {"acc": 1 / 3, "acc_norm": 2 / 3, "items": 3}
    acc, acc_norm, _ = np_llmc_scores(predicts_zero, None, items, small_encode)
    assert (got["acc"], got["acc_norm"]) == (acc, acc_norm)


def test_cropping_keeps_the_ending_whole(gpt):
    """A row longer than max_len keeps its last max_len tokens: every ending token is
    still scored, with the context cut from the left."""
    long_ctx = "An unusually long context that runs well past the window"
    item = {"ctx": long_ctx, "endings": ["ends here.", "no", "and then stops", "x"], "label": 2}
    sums, counts, _ = hellaswag_losses(predicts_zero, None, [item], small_encode, max_len=16)
    full, full_counts, _ = hellaswag_losses(predicts_zero, None, [item], small_encode,
                                            max_len=128)
    np.testing.assert_array_equal(counts, full_counts)
    np.testing.assert_allclose(sums, full, rtol=1e-6)  # position-free logits: same losses

    logits_fn, params = gpt
    assert len(byte_encode(long_ctx)) > MAX_LEN
    got = hellaswag_scores(logits_fn, params, [item], byte_encode, max_len=MAX_LEN)
    sums, counts, _ = hellaswag_losses(logits_fn, params, [item], byte_encode, max_len=MAX_LEN)
    acc, acc_norm, want = np_llmc_scores(logits_fn, params, [item], byte_encode, crop=MAX_LEN)
    np.testing.assert_allclose(sums, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(counts[0], [len(byte_encode(" " + e)) for e in item["endings"]])
    assert (got["acc"], got["acc_norm"]) == (acc, acc_norm)


def test_an_ending_as_long_as_the_window_is_refused():
    item = {"ctx": "ab", "endings": ["xxxxx", "x", "x", "x"], "label": 0}  # 6 ending tokens
    with pytest.raises(ValueError, match=r"item 0 has an ending of 6 tokens; with max_len=6"):
        hellaswag_losses(predicts_zero, None, [item], small_encode, max_len=6)
    hellaswag_losses(predicts_zero, None, [item], small_encode, max_len=7)


def test_missing_file_names_the_path_and_the_source(tmp_path):
    path = tmp_path / "nowhere" / "hellaswag_val.jsonl"
    with pytest.raises(FileNotFoundError) as e:
        load_hellaswag(path)
    assert str(path) in str(e.value) and HELLASWAG_VAL_URL in str(e.value)


@pytest.mark.parametrize("line, message", [
    ("{not json", r"line 3: not valid JSON"),
    (json.dumps({"ctx": "a", "label": 0}), r"line 3: missing key 'endings'"),
    (json.dumps({"endings": ["a"] * 4, "label": 0}), r"line 3: missing key 'ctx'"),
    (json.dumps({"ctx": "a", "endings": ["a"] * 3, "label": 0}),
     r"line 3: 'endings' must be a list of 4 strings"),
    (json.dumps({"ctx": "a", "endings": ["a"] * 4, "label": 4}),
     r"line 3: 'label' must be an int in \[0, 3\]; got 4"),
    (json.dumps({"ctx": "a", "endings": ["a"] * 4, "label": "1"}), r"line 3: 'label'"),
    (json.dumps([1, 2]), r"line 3: expected a JSON object"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ITEMS[0]) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message) as e:
        load_hellaswag(path)
    assert str(path) in str(e.value)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"`item`: missing key 'label'"):
        render_item({"ctx": "a", "endings": ["a"] * 4}, small_encode)
    with pytest.raises(ValueError, match=r"encode\(item\['ctx'\]\)"):
        render_item({"ctx": "", "endings": ["a"] * 4, "label": 0}, small_encode)
    with pytest.raises(ValueError, match=r"endings'\]\[0\]"):
        render_item({"ctx": "a", "endings": ["a"] * 4, "label": 0}, lambda s: [1] * (s != " a"))
    item = {"ctx": "ab", "endings": ["x"] * 4, "label": 0}
    with pytest.raises(ValueError, match=r"`items` must hold at least one"):
        hellaswag_scores(predicts_zero, None, [], small_encode, max_len=8)
    with pytest.raises(ValueError, match=r"`max_len` must be an int >= 2; got 1"):
        hellaswag_scores(predicts_zero, None, [item], small_encode, max_len=1)
    with pytest.raises(ValueError, match=r"`batch_items` must be an int >= 1; got 0"):
        hellaswag_scores(predicts_zero, None, [item], small_encode, max_len=8, batch_items=0)
    with pytest.raises(ValueError, match=r"token ids in \[0, 3\].*item 1 has ids in \[0, 9\]"):
        hellaswag_scores(predicts_zero, None, [item, item | {"ctx": "9"}],
                         lambda s: [int(ch) if ch.isdigit() else 0 for ch in s], max_len=8)
    with pytest.raises(ValueError, match=r"must return \[R, T, V\] logits"):
        hellaswag_scores(lambda p, x: jnp.zeros((1, 4)), None, [item], small_encode, max_len=8)
    with pytest.raises(ValueError, match=r"`limit` must be None or an int >= 0; got -1"):
        load_hellaswag("unused.jsonl", limit=-1)

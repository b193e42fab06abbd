"""Downstream evaluations (seqjax.evals): HellaSwag vs a numpy transcription of llm.c's
``dev/data/hellaswag.py``; the other forms, cloze accuracy and a sharded evaluation vs numpy."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.evals import (
    HELLASWAG_VAL_URL,
    EvalTask,
    TaskBatches,
    TaskFileError,
    load_task,
    make_task_eval,
    score_task,
)
from seqjax.models import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.train.loop import evaluate
from seqjax.train.parallel import Parallel
from seqjax.train.step import make_eval_step

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


def np_logits(logits_fn, params, tokens):
    """The logits of every position but the last (whose prediction is never scored), with a
    zero row in its place: a window of the model's length holds block_size + 1 tokens."""
    logits = np.asarray(logits_fn(params, jnp.asarray(tokens[:, :-1], jnp.int32)))
    return np.concatenate([logits, np.zeros_like(logits[:, :1])], axis=1)


def np_llmc_scores(logits_fn, params, items, encode, crop=None):
    """acc, acc_norm and per-ending summed losses, one item at a time, rows unpadded beyond
    the longest of the four (``crop``: score each row alone on its last ``crop`` tokens)."""
    sums, hits, hits_norm = [], 0, 0
    for item in items:
        tokens, mask = np_llmc_render(item, encode)
        if crop is None:
            logits = np_logits(logits_fn, params, tokens)
            sum_loss, mean_loss = np_llmc_losses(logits, tokens, mask)
        else:
            sum_loss, mean_loss = np.zeros(4), np.zeros(4)
            for i in range(4):
                end = int(np.flatnonzero(mask[i])[-1]) + 1
                row, row_mask = tokens[i:i + 1, max(0, end - crop):end], mask[i:i + 1,
                                                                            max(0, end - crop):end]
                logits = np_logits(logits_fn, params, row)
                s, m = np_llmc_losses(logits, row, row_mask)
                sum_loss[i], mean_loss[i] = s[0], m[0]
        sums.append(sum_loss)
        hits += int(sum_loss.argmin() == item["label"])
        hits_norm += int(mean_loss.argmin() == item["label"])
    return hits / len(items), hits_norm / len(items), np.stack(sums)



@pytest.fixture(scope="module")
def gpt():
    model = TransformerLM(TransformerLMConfig(vocab_size=V, num_layers=1, embed_dim=16,
                                              block_size=MAX_LEN, block=gpt_block(2)))
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, MAX_LEN), jnp.int32))["params"]
    return (lambda p, x, rng=None, train=False: model.apply({"params": p}, x)), params


def test_hellaswag_file_is_read_as_choice_items(tmp_path):
    path = write_jsonl(tmp_path / "hellaswag_val.jsonl", ITEMS)
    task = load_task(path)
    assert (task.name, task.kind, len(task.items)) == ("hellaswag", "choice", len(ITEMS))
    assert task.items[0] == (("She cracks two eggs",) * 4, tuple(ITEMS[0]["endings"]), 0)
    assert load_task(str(path), limit=2, name="hs").items == task.items[:2]


def test_rows_are_llmc_rendering(tmp_path):
    task = load_task(write_jsonl(tmp_path / "h.jsonl", ITEMS[:1]))
    batch = TaskBatches(task, byte_encode, items_per_batch=1, block_size=MAX_LEN)[0]
    want_tokens, want_mask = np_llmc_render(ITEMS[0], byte_encode)
    width = want_tokens.shape[1]
    assert batch["tokens"].shape == (1, 4, MAX_LEN + 1) and batch["mask"].dtype == bool
    np.testing.assert_array_equal(batch["tokens"][0, :, :width], want_tokens)
    np.testing.assert_array_equal(batch["mask"][0, :, :width], want_mask.astype(bool))
    assert not batch["tokens"][0, :, width:].any() and not batch["mask"][0, :, width:].any()


@pytest.mark.parametrize("items_per_batch", [1, 4])
def test_gpt_scores_match_llmc_reference(tmp_path, gpt, items_per_batch):
    """Rows padded to the window, items stacked (6 items: the last batch of 4 padded with
    invalid items) give llm.c's per-item scores on the unpadded rows."""
    logits_fn, params = gpt
    task = load_task(write_jsonl(tmp_path / "h.jsonl", ITEMS))
    acc, acc_norm, _ = np_llmc_scores(logits_fn, params, ITEMS, byte_encode)
    got = score_task(logits_fn, params, task, byte_encode, block_size=MAX_LEN,
                     items_per_batch=items_per_batch)
    assert got == pytest.approx({"acc": acc, "acc_norm": acc_norm, "items": len(ITEMS)})


# A model that always predicts token K = 0: logits α·e_K at every position, so each token
# costs a = log(e^α + V' - 1) - α if it is K and b = log(e^α + V' - 1) otherwise (a < b).
V_SMALL, ALPHA = 4, 2.0
A_LOSS = math.log(math.exp(ALPHA) + V_SMALL - 1) - ALPHA
B_LOSS = math.log(math.exp(ALPHA) + V_SMALL - 1)


def predicts_zero(params, tokens_BxT, rng=None, train=False):
    return jnp.broadcast_to(ALPHA * jax.nn.one_hot(0, V_SMALL), tokens_BxT.shape + (V_SMALL,))


def small_encode(text):
    """' ' and 'k' are token 0 (the predicted one), 'x' is 1, anything else 2."""
    return [0 if ch in " k" else 1 if ch == "x" else 2 for ch in text]


def test_acc_uses_the_sum_and_acc_norm_the_mean():
    # " x": a + b (lowest sum); " kkx": 3a + b over 4 tokens (lowest mean); the others are
    # costlier both ways. So acc picks choice 0 and acc_norm choice 1.
    choices = ("x", "kkx", "xx", "xxx")
    task = EvalTask("t", "choice", [(("ab",) * 4, choices, label) for label in (0, 1, 1)])
    got = score_task(predicts_zero, None, task, small_encode, block_size=8, items_per_batch=2)
    assert got == pytest.approx({"acc": 1 / 3, "acc_norm": 2 / 3, "items": 3})
    items = [{"ctx": "ab", "endings": list(choices), "label": label} for label in (0, 1, 1)]
    acc, acc_norm, _ = np_llmc_scores(predicts_zero, None, items, small_encode)
    assert (got["acc"], got["acc_norm"]) == pytest.approx((acc, acc_norm))


def test_other_forms_and_a_padding_choice_never_wins(tmp_path):
    """The multiple-choice form with 2 and 3 choices in one file (the 2-choice item gets an
    empty third row), Winogrande's schema form (the contexts differ, the continuation is
    scored) and string labels."""
    choice = write_jsonl(tmp_path / "arc.jsonl", [
        {"context": "ab", "choices": ["xx", "kx"], "label": "1"},  # kx: a+a+b < a+b+b
        {"context": "ab", "choices": ["xxx", "xx", "kkkx"], "label": 2},
    ])
    task = load_task(choice)
    assert task.kind == "choice" and task.max_choices == 3
    got = score_task(predicts_zero, None, task, small_encode, block_size=8)
    # item 1: sums 1a+3b, 1a+2b, 4a+b → acc picks 2; means (a+3b)/4, (a+2b)/3, (4a+b)/5 → 2
    assert got == pytest.approx({"acc": 1.0, "acc_norm": 1.0, "items": 2})
    schema = load_task(write_jsonl(tmp_path / "winogrande.jsonl", [
        {"choices": ["x", "k"], "continuation": "x", "label": 0}]))
    assert schema.items == [(("x", "k"), ("x", "x"), 0)]
    # the continuation " x" costs a + b after either context: a tie, the first wins
    assert score_task(predicts_zero, None, schema, small_encode, block_size=8)["acc"] == 1.0


def np_cloze_acc(logits_fn, params, items, encode):
    hits = 0
    for context, continuation in items:
        ctx, cont = encode(context), encode(" " + continuation)
        row = np.asarray([ctx + cont], np.int32)
        logits = np.asarray(logits_fn(params, jnp.asarray(row[:, :-1])))[0]
        hits += int((logits.argmax(-1)[len(ctx) - 1:] == cont).all())
    return hits / len(items)


def test_cloze_is_greedy_exact_match(tmp_path, gpt):
    path = write_jsonl(tmp_path / "lambada.jsonl", [
        {"text": "the cat sat on the mat"}, {"text": "a b  c"}, {"text": "kk kk"}])
    task = load_task(path)
    assert task.kind == "cloze" and task.items[0] == (("the cat sat on the",), ("mat",), 0)
    # predicts token 0 (' ' and 'k'): only " kk" is predicted whole
    assert score_task(predicts_zero, None, task, small_encode, block_size=8) == pytest.approx(
        {"acc": 1 / 3, "items": 3})
    logits_fn, params = gpt
    pairs = [("ab", "c"), ("hello", "world"), ("x", "y"), ("long context " * 5, "end")]
    task = EvalTask("c", "cloze", [((c,), (x,), 0) for c, x in pairs])
    got = score_task(logits_fn, params, task, byte_encode, block_size=MAX_LEN, items_per_batch=3)
    crop = [(c[-(MAX_LEN - 3):], x) for c, x in pairs]  # the rows the window keeps
    assert got["acc"] == pytest.approx(np_cloze_acc(logits_fn, params, crop, byte_encode))


def test_cropping_keeps_the_continuation_whole(gpt):
    """A row longer than the window keeps its last block_size + 1 tokens: every continuation
    token is still scored, the context cut from the left."""
    long_ctx = "An unusually long context that runs well past the window"
    item = {"ctx": long_ctx, "endings": ["ends here.", "no", "and then stops", "x"], "label": 2}
    logits_fn, params = gpt
    assert len(byte_encode(long_ctx)) > MAX_LEN
    task = EvalTask("h", "choice", [((long_ctx,) * 4, tuple(item["endings"]), 2)])
    got = score_task(logits_fn, params, task, byte_encode, block_size=MAX_LEN)
    acc, acc_norm, _ = np_llmc_scores(logits_fn, params, [item], byte_encode, crop=MAX_LEN + 1)
    assert (got["acc"], got["acc_norm"]) == (acc, acc_norm)


def test_sharded_evaluation_equals_one_device(tmp_path, gpt):
    """Items split over 8 data shards, the metrics reduced on the mesh: one device's figures."""
    logits_fn, params = gpt
    task = load_task(write_jsonl(tmp_path / "h.jsonl", ITEMS * 3))
    want = score_task(logits_fn, params, task, byte_encode, block_size=MAX_LEN)
    par = Parallel.create(mesh="data=8")
    replicated = jax.sharding.NamedSharding(par.mesh, jax.sharding.PartitionSpec())
    step = make_eval_step(make_task_eval(logits_fn, "choice"),
                          params_sharding=jax.tree.map(lambda _: replicated, params),
                          batch_sharding=par.batch_sharding())
    batches = TaskBatches(task, byte_encode, items_per_batch=8, block_size=MAX_LEN)
    got = evaluate(step, params, batches, place_batch=par.place_global)
    assert got["tokens"] == len(ITEMS) * 3
    assert (got["acc"], got["acc_norm"]) == pytest.approx((want["acc"], want["acc_norm"]))


def test_a_continuation_as_long_as_the_window_is_refused():
    task = EvalTask("t", "choice", [(("ab",) * 2, ("xxxxx", "x"), 0)])  # 6 scored tokens
    with pytest.raises(ValueError, match=r"task 't', item 0: a continuation of 6 tokens"):
        TaskBatches(task, small_encode, items_per_batch=1, block_size=5)
    TaskBatches(task, small_encode, items_per_batch=1, block_size=6)


def test_missing_file_names_the_path_and_the_source(tmp_path):
    path = tmp_path / "nowhere" / "hellaswag_val.jsonl"
    with pytest.raises(TaskFileError) as e:
        load_task(path)
    assert str(path) in str(e.value) and HELLASWAG_VAL_URL in str(e.value)


@pytest.mark.parametrize("line, message", [
    ("{not json", r"line 3: not valid JSON"),
    (json.dumps({"ctx": "a", "label": 0}), r"line 3: expected one of the forms"),
    (json.dumps({"endings": ["a"] * 4, "label": 0}), r"line 3: 'ctx' must be a string"),
    (json.dumps({"ctx": "a", "endings": ["a"], "label": 0}),
     r"line 3: 'endings' must be a list of at least 2 strings"),
    (json.dumps({"ctx": "a", "endings": ["a"] * 4, "label": 4}),
     r"line 3: 'label' must be an int in \[0, 3\]; got 4"),
    (json.dumps({"ctx": "a", "endings": ["a"] * 4, "label": "one"}), r"line 3: 'label'"),
    (json.dumps([1, 2]), r"line 3: expected a JSON object"),
    (json.dumps({"text": "word"}), r"line 3: 'text' must be a string of at least two words"),
    (json.dumps({"context": "a", "continuation": "b"}),
     r"line 3: a cloze item in a file of choice items"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ITEMS[0]) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=message) as e:
        load_task(path)
    assert str(path) in str(e.value)


def test_bad_arguments_are_refused(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"empty.jsonl: no items"):
        load_task(empty)
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe{}")
    with pytest.raises(TaskFileError, match=r"bin.jsonl: not UTF-8"):
        load_task(tmp_path / "bin.jsonl")
    with pytest.raises(ValueError, match=r"`limit` must be an int >= 0 \(0: all\); got -1"):
        load_task("unused.jsonl", limit=-1)
    item = (("ab", "ab"), ("x", "x"), 0)
    with pytest.raises(ValueError, match=r"item 0: an item's context encodes to no tokens"):
        TaskBatches(EvalTask("t", "choice", [(("", ""), ("x", "x"), 0)]), small_encode,
                    items_per_batch=1, block_size=8)
    with pytest.raises(ValueError, match=r"`items_per_batch` must be a positive int; got 0"):
        TaskBatches(EvalTask("t", "choice", [item]), small_encode, items_per_batch=0, block_size=8)
    with pytest.raises(ValueError, match=r"item 1: token ids outside the model's vocabulary"):
        TaskBatches(EvalTask("t", "choice", [item, (("9", "9"), ("x", "x"), 0)]),
                    lambda s: [int(ch) if ch.isdigit() else 0 for ch in s],
                    items_per_batch=1, block_size=8, vocab_size=4)
    for retired in (lambda: TaskBatches(EvalTask("t", "choice", [item]), small_encode,
                                        items_per_batch=1, seq_len=8),
                    lambda: score_task(predicts_zero, None, EvalTask("t", "choice", [item]),
                                       small_encode, seq_len=8)):
        with pytest.raises(TypeError, match="`seq_len` is renamed `block_size`"):
            retired()
    with pytest.raises(ValueError, match=r"`kind` must be 'choice' or 'cloze'; got 'mc'"):
        make_task_eval(predicts_zero, "mc")

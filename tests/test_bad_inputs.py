"""Bad inputs get clear errors (DESIGN.md, "Errors"): a table, one row per guard.

Each row is ``(id, call, exception type, words)``: ``call()`` must raise the exception and
its message must contain every word — usually the argument's name, what was expected and
what was got. The table grows with every guard (issue #17). Below it, the behaviours that
are not errors: empty inputs handled, out-of-vocabulary tokens under ``jit`` flagged
without poisoning the decoding state, the batch check in ``fit``, the NaN hint, and the
command line never poisoning a work dir.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seqjax import decoding
from seqjax import nn as snn
from seqjax.data import batching, iterators, tokenizers
from seqjax.models import (
    Bert,
    BertConfig,
    RNNConfig,
    RNNLanguageModel,
    RNNLMConfig,
    Seq2Seq,
    Seq2SeqConfig,
    Transformer,
    TransformerConfig,
    TransformerLM,
    TransformerLMConfig,
    bert_block,
    gpt_block,
    vaswani_block,
)
from seqjax.train import FitConfig, TrainState, evaluate, fit
from seqjax.train.losses import make_lm_eval, make_lm_loss
from seqjax.train.step import flax_apply_fn, make_batch_check, make_eval_step, make_train_step

KEY = jax.random.PRNGKey(0)
X8 = np.ones((2, 5, 8), np.float32)
X7 = np.ones((2, 5, 7), np.float32)
V = 11  # every language model's vocabulary below


def i32(*shape: int, fill: int = 1) -> np.ndarray:
    return np.full(shape, fill, np.int32)


# ------------------------------------------------------------------ models, built once


@functools.cache
def bound(kind: str) -> tuple:
    """``(module, variables)`` of a small module, initialised once per test session."""
    if kind.startswith("rnn-"):
        cell = {"rnn-lstm": snn.LSTMCell, "rnn-gru": snn.GRUCell, "rnn-elman": snn.ElmanCell}
        m = snn.RNN(cell[kind](6))
        return m, m.init(KEY, X8)
    if kind == "bi":
        m = snn.Bidirectional(snn.RNN(snn.LSTMCell(4)), snn.RNN(snn.LSTMCell(4)))
        return m, m.init(KEY, X8)
    if kind in ("stacked", "stacked-bi"):
        m = snn.StackedRNN(features=4, num_layers=2, bidirectional=kind == "stacked-bi")
        return m, m.init(KEY, X8)
    if kind.startswith("attn-"):
        m = snn.Attention(score=kind[5:])
        return m, m.init(KEY, np.ones((2, 8), np.float32), X8)
    if kind == "mha":
        m = snn.MultiHeadAttention(num_heads=2, head_dim=4)
        return m, m.init(KEY, X8)
    if kind == "mha-cross":
        m = snn.MultiHeadAttention(num_heads=2, head_dim=4)
        return m, m.init(KEY, X8, np.ones((2, 4, 6), np.float32))
    if kind == "block":
        m = snn.TransformerBlock(snn.BlockConfig(num_heads=2))
        return m, m.init(KEY, X8)
    if kind == "block-cross":
        m = snn.TransformerBlock(snn.BlockConfig.decoder(num_heads=2))
        return m, m.init(KEY, X8, encoder_out=np.ones((2, 4, 6), np.float32))
    if kind == "encoder":
        m = snn.TransformerEncoder(config=snn.BlockConfig(num_heads=2), num_layers=2)
        return m, m.init(KEY, X8)
    if kind == "rnnlm":
        m = RNNLanguageModel(RNNLMConfig(vocab_size=V, embed_dim=8))
        return m, m.init(KEY, i32(2, 3))
    if kind == "gpt":
        m = TransformerLM(TransformerLMConfig(vocab_size=V, num_layers=1, embed_dim=8,
                                              block_size=16, block=gpt_block(2)))
        return m, m.init(KEY, i32(2, 5))
    if kind == "bert":
        m = Bert(BertConfig(vocab_size=V, num_layers=1, embed_dim=8, block_size=16,
                            block=bert_block(2, mlp_dim=16)))
        return m, m.init(KEY, i32(2, 5))
    if kind == "transformer":
        m = Transformer(TransformerConfig(src_vocab_size=V, tgt_vocab_size=V, num_layers=1,
                                          embed_dim=8, block_size=16,
                                          block=vaswani_block(2, mlp_dim=16)))
        return m, m.init(KEY, i32(2, 5), i32(2, 3))
    if kind == "seq2seq":
        m = Seq2Seq(Seq2SeqConfig(encoder=RNNConfig(vocab_size=V, embed_dim=8, hidden_size=8,
                                                    cell_type="gru"), tgt_vocab_size=V))
        return m, m.init(KEY, i32(2, 5), i32(2, 3))
    raise KeyError(kind)


def apply(kind: str, *args, **kwargs):
    m, v = bound(kind)
    return m.apply(v, *args, **kwargs)


SRC = {"transformer": {"src": i32(2, 5)}, "seq2seq": {"src": i32(2, 5)}}


def decode_state(kind: str):
    m, v = bound(kind)
    return m.init_decode_state(v, np.array([[1, 2, 3], [4, 5, 6]]), None, 10,
                               **SRC.get(kind, {}))


def decode_step(kind: str, tokens):
    m, v = bound(kind)
    return m.decode_step(v, decode_state(kind), tokens)


def toy_config(argv: list[str]):
    from seqjax import cli

    return cli.build_config(cli.load_experiment("toy_rnn"), "toy_rnn", argv)


def truncated_safetensors(tmp: str):
    from safetensors.numpy import save_file

    from seqjax.interop.safetensors_io import Checkpoint

    path = os.path.join(tmp, "model.safetensors")
    save_file({"w": np.ones((64, 3), np.float32)}, path)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    return Checkpoint.open(tmp)


def lm_step(**kw):
    m, v = bound("gpt")
    state = TrainState.create(jax.device_get(v["params"]), optax.sgd(0.1), jax.random.PRNGKey(1))
    return state, make_train_step(make_lm_loss(flax_apply_fn(m)), **kw)


def fit_on(batch: dict):
    state, step = lm_step()
    return fit(state, step, lambda i: batch,
               FitConfig(steps=2, progress=False, plot=False, tensorboard=False),
               check_batch=make_batch_check(V))


def eval_on(batch: dict):
    m, v = bound("gpt")
    return evaluate(make_eval_step(make_lm_eval(flax_apply_fn(m))), v["params"], [batch],
                    check_batch=make_batch_check(V))


GOOD_INPUTS = i32(2, 5)
CASES = [
    # ----------------------------------------------------------- 2. input feature size
    ("rnn-lstm-features", lambda: apply("rnn-lstm", X7), ValueError,
     ["`x`", "8 features", "(2, 5, 7)"]),
    ("rnn-gru-features", lambda: apply("rnn-gru", X7), ValueError, ["`x`", "8 features"]),
    ("rnn-elman-features", lambda: apply("rnn-elman", X7), ValueError, ["`x`", "8 features"]),
    ("bidirectional-features", lambda: apply("bi", X7), ValueError, ["`x`", "8 features"]),
    ("stacked-features", lambda: apply("stacked", X7), ValueError, ["`x`", "8", "(2, 5, 7)"]),
    ("stacked-bi-features", lambda: apply("stacked-bi", X7), ValueError, ["`x`", "8 features"]),
    ("attention-general-query", lambda: apply("attn-general", np.ones((2, 7)), X8), ValueError,
     ["`query`", "8 features", "(2, 7)"]),
    ("attention-general-keys", lambda: apply("attn-general", np.ones((2, 8)), X7), ValueError,
     ["`keys`", "8 features", "(2, 5, 7)"]),
    ("attention-additive-query", lambda: apply("attn-additive", np.ones((2, 7)), X8),
     ValueError, ["`query`", "8 features"]),
    ("attention-additive-keys", lambda: apply("attn-additive", np.ones((2, 8)), X7),
     ValueError, ["`keys`", "8 features"]),
    ("attention-concat-sizes", lambda: apply("attn-concat", np.ones((2, 7)), X8), ValueError,
     ["`query`", "`keys`", "16 features", "7 + 8"]),
    ("attention-dot-sizes", lambda: apply("attn-dot", np.ones((2, 7)), X8), ValueError,
     ["`query`", "m_q = m_k = 8", "(2, 7)"]),
    ("mha-inputs_q-features", lambda: apply("mha", X7), ValueError,
     ["`inputs_q`", "8 features", "(2, 5, 7)"]),
    ("mha-inputs_kv-features", lambda: apply("mha-cross", X8, np.ones((2, 4, 5))), ValueError,
     ["`inputs_kv`", "6 features", "(2, 4, 5)"]),
    ("block-x-features", lambda: apply("block", X7), ValueError, ["`x`", "8 features"]),
    ("block-encoder_out-features",
     lambda: apply("block-cross", X8, encoder_out=np.ones((2, 4, 5))), ValueError,
     ["`encoder_out`", "6 features", "(2, 4, 5)"]),
    ("block-encoder_out-batch",
     lambda: apply("block-cross", X8, encoder_out=np.ones((3, 4, 6))), ValueError,
     ["`encoder_out`", "batch size 2", "(3, 4, 6)"]),
    ("encoder-features", lambda: apply("encoder", X7), ValueError, ["`x`", "8 features"]),
    # ----------------------------------------------------------- 3. empty inputs rejected
    ("transformer-empty-src", lambda: apply("transformer", i32(2, 0), i32(2, 3)), ValueError,
     ["`src`", "at least one token", "(2, 0)"]),
    ("seq2seq-empty-src", lambda: apply("seq2seq", i32(2, 0), i32(2, 3)), ValueError,
     ["`src`", "at least one token", "(2, 0)"]),
    ("gpt-empty-prompt", lambda: bound("gpt")[0].init_decode_state(bound("gpt")[1], i32(2, 0)),
     ValueError, ["`prompt`", "at least one token", "(2, 0)"]),
    ("rnnlm-empty-prompt",
     lambda: bound("rnnlm")[0].init_decode_state(bound("rnnlm")[1], i32(2, 0)), ValueError,
     ["`prompt`", "at least one token"]),
    # ----------------------------------------------------------- 4. argument names
    ("mha-lengths-batch", lambda: apply("mha", X8, lengths=np.array([5, 5, 5])), ValueError,
     ["`lengths`", "(2,)", "(3,)"]),
    ("mha-lengths-range", lambda: apply("mha", X8, lengths=np.array([5, 6])), ValueError,
     ["`lengths`", "[0, 5]", "6"]),
    ("mha-lengths-dtype", lambda: apply("mha", X8, lengths=np.array([5.0, 5.0])), TypeError,
     ["`lengths`", "integer", "float"]),
    ("mha-lengths-rank", lambda: apply("mha", X8, lengths=i32(2, 5)), ValueError,
     ["`lengths`", "rank 1", "(2, 5)"]),
    ("mha-kv_lengths-self", lambda: apply("mha", X8, kv_lengths=np.array([5, 5])), ValueError,
     ["`kv_lengths`", "cross-attention"]),
    ("mha-kv_lengths-batch",
     lambda: apply("mha-cross", X8, np.ones((2, 4, 6)), kv_lengths=np.array([4, 4, 4])),
     ValueError, ["`kv_lengths`", "(2,)", "(3,)"]),
    ("mha-kv_lengths-range",
     lambda: apply("mha-cross", X8, np.ones((2, 4, 6)), kv_lengths=np.array([4, 5])),
     ValueError, ["`kv_lengths`", "[0, 4]", "5"]),
    ("mha-kv_lengths-negative",
     lambda: apply("mha-cross", X8, np.ones((2, 4, 6)), kv_lengths=np.array([-1, 4])),
     ValueError, ["`kv_lengths`", "-1"]),
    ("mha-kv_lengths-dtype",
     lambda: apply("mha-cross", X8, np.ones((2, 4, 6)), kv_lengths=np.array([4.0, 4.0])),
     TypeError, ["`kv_lengths`", "integer"]),
    ("mha-mask-with-cache",
     lambda: apply("mha", X8, snn.KVCache.create(2, 16, 2, 4),
                   mask=np.ones((2, 1, 5, 5), bool), method="decode"), ValueError,
     ["`mask`", "[2, 2, 5, 16]", "(2, 1, 5, 5)"]),
    ("mha-mask-with-lengths",
     lambda: apply("mha", X8, lengths=np.array([5, 3]), mask=np.ones((2, 1, 5, 4), bool)),
     ValueError, ["`mask`", "[2, 2, 5, 5]", "(2, 1, 5, 4)"]),
    ("mha-mask-with-kv_lengths",
     lambda: apply("mha-cross", X8, np.ones((2, 4, 6)), kv_lengths=np.array([4, 3]),
                   mask=np.ones((2, 1, 5, 5), bool)), ValueError,
     ["`mask`", "[2, 2, 5, 4]", "(2, 1, 5, 5)"]),
    ("mha-mask-dtype", lambda: apply("mha", X8, mask=np.ones((2, 1, 5, 5), np.int32)),
     TypeError, ["`mask`", "boolean", "int32"]),
    ("mha-cache-batch",
     lambda: apply("mha", X8, snn.KVCache.create(3, 16, 2, 4), method="decode"),
     ValueError, ["`cache`", "batch size 2", "(3, 16, 2, 4)"]),
    ("mha-cache-overflow",
     lambda: apply("mha", X8, snn.KVCache.create(2, 4, 2, 4), method="decode"),
     ValueError, ["overflow", "5", "max_len=4"]),
    ("kvcache-update-overflow",
     lambda: snn.KVCache.create(1, 2, 1, 2).update(np.ones((1, 3, 1, 2)), np.ones((1, 3, 1, 2))),
     ValueError, ["overflow", "max_len=2"]),
    ("attention-lengths-batch",
     lambda: apply("attn-additive", np.ones((2, 8)), X8, lengths=np.array([1, 2, 3])),
     ValueError, ["`lengths`", "(2,)", "(3,)"]),
    ("attention-mask-rows",
     lambda: apply("attn-additive", np.ones((2, 3, 8)), X8, mask=np.ones((2, 4, 5), bool)),
     ValueError, ["`mask`", "3 query rows", "(2, 4, 5)"]),
    ("seq2seq-batch-mismatch", lambda: apply("seq2seq", i32(3, 5), i32(2, 4)), ValueError,
     ["`tgt_in`", "`src`", "(3)", "(2, 4)"]),
    ("transformer-batch-mismatch", lambda: apply("transformer", i32(3, 5), i32(2, 4)),
     ValueError, ["`tgt_in`", "`src`", "(2, 4)"]),
    ("seq2seq-decode-src-batch",
     lambda: bound("seq2seq")[0].init_decode_state(bound("seq2seq")[1], i32(2, 1), src=i32(3, 5)),
     ValueError, ["`src`", "`prompt`", "(3, 5)"]),
    ("transformer-decode-src-batch",
     lambda: bound("transformer")[0].init_decode_state(bound("transformer")[1], i32(2, 1),
                                                       src=i32(3, 5)),
     ValueError, ["`src`", "`prompt`", "(3, 5)"]),
    ("greedy-eos_id-too-large",
     lambda: decoding.greedy_search(*bound("rnnlm"), i32(2, 3), max_new_tokens=2, eos_id=V),
     ValueError, ["`eos_id`", "[0, 10]", "11"]),
    ("greedy-eos_id-negative",
     lambda: decoding.greedy_search(*bound("rnnlm"), i32(2, 3), max_new_tokens=2, eos_id=-1),
     ValueError, ["`eos_id`", "[0, 10]", "-1"]),
    ("greedy-eos_id-type",
     lambda: decoding.greedy_search(*bound("rnnlm"), i32(2, 3), max_new_tokens=2, eos_id=1.5),
     TypeError, ["`eos_id`", "int", "1.5"]),
    ("sample-pad_id-too-large",
     lambda: decoding.sample(*bound("rnnlm"), i32(2, 3), key=KEY, max_new_tokens=2, pad_id=V),
     ValueError, ["`pad_id`", "[0, 10]", "11"]),
    ("greedy-pad_id-negative",
     lambda: decoding.greedy_search(*bound("rnnlm"), i32(2, 3), max_new_tokens=2, pad_id=-1),
     ValueError, ["`pad_id`", "[0, 10]", "-1"]),
    ("beam-eos_id-too-large",
     lambda: decoding.beam_search(*bound("gpt"), i32(2, 3), beam_size=2, max_new_tokens=2,
                                  eos_id=99), ValueError, ["`eos_id`", "99"]),
    ("greedy-max_new_tokens",
     lambda: decoding.greedy_search(*bound("rnnlm"), i32(2, 3), max_new_tokens=0), ValueError,
     ["`max_new_tokens`", "positive", "0"]),
    # ----------------------------------------------------------- 1. decode_step token ids
    ("rnnlm-decode_step-oov", lambda: decode_step("rnnlm", np.array([1, V])), ValueError,
     ["`tokens`", "[0, 10]", "11"]),
    ("gpt-decode_step-oov", lambda: decode_step("gpt", np.array([1, V])), ValueError,
     ["`tokens`", "[0, 10]", "11"]),
    ("gpt-decode_step-negative", lambda: decode_step("gpt", np.array([-1, 1])), ValueError,
     ["`tokens`", "-1"]),
    ("transformer-decode_step-oov", lambda: decode_step("transformer", np.array([1, V])),
     ValueError, ["`tokens`", "vocab_size=11"]),
    ("seq2seq-decode_step-oov", lambda: decode_step("seq2seq", np.array([1, V])), ValueError,
     ["`tokens`", "vocab_size=11"]),
    ("gpt-decode_step-batch", lambda: decode_step("gpt", np.array([1, 2, 3])), ValueError,
     ["`tokens`", "(2,)", "(3,)"]),
    ("gpt-decode_step-dtype", lambda: decode_step("gpt", np.array([1.0, 2.0])), TypeError,
     ["`tokens`", "integer"]),
    # ----------------------------------------------------------- 1. training batches
    ("batch-check-inputs", lambda: make_batch_check(V)({"inputs": i32(1, 2, fill=V)}),
     ValueError, ['`batch["inputs"]`', "[0, 10]", "11"]),
    ("batch-check-targets-negative",
     lambda: make_batch_check(V)({"inputs": GOOD_INPUTS, "targets": i32(2, 5, fill=-1)}),
     ValueError, ['`batch["targets"]`', "-1"]),
    ("batch-check-targets-masked",
     lambda: make_batch_check(V)({"targets": np.array([[-100, V]]),
                                  "mask": np.array([[False, True]])}),
     ValueError, ['`batch["targets"]`', "where the mask is True", "11"]),
    ("batch-check-mask-shape",
     lambda: make_batch_check(V)({"targets": i32(2, 5), "mask": np.ones((2, 4), bool)}),
     ValueError, ['`batch["targets"]`', "mask", "(2, 4)"]),
    ("batch-check-mapping",
     lambda: make_batch_check({"src": 5, "tgt": 7})({"src": i32(1, 3), "tgt": i32(1, 3, fill=7)}),
     ValueError, ['`batch["tgt"]`', "vocab_size=7"]),
    ("batch-check-vocab", lambda: make_batch_check(0), ValueError, ["`vocab_size`", "0"]),
    ("fit-batch-inputs",
     lambda: fit_on({"inputs": i32(2, 5, fill=12), "targets": GOOD_INPUTS}),
     ValueError, ['`batch["inputs"]`', "vocab_size=11", "12"]),
    ("fit-batch-targets",
     lambda: fit_on({"inputs": GOOD_INPUTS, "targets": i32(2, 5, fill=V)}), ValueError,
     ['`batch["targets"]`', "vocab_size=11"]),
    ("lm-windows-vocab",
     lambda: iterators.LMWindowIterator(np.array([0, 1, V, 2, 3]), 1, 2, vocab_size=V),
     ValueError, ["`tokens_N`", "vocab_size=11", "11"]),
    ("fit-batch-step", lambda: fit_on({"inputs": i32(2, 5, fill=V), "targets": GOOD_INPUTS}),
     ValueError, ['`batch["inputs"]`', "step 1", "nothing was trained"]),
    ("evaluate-batch", lambda: eval_on({"inputs": i32(2, 5, fill=-3), "targets": GOOD_INPUTS}),
     ValueError, ['`batch["inputs"]`', "-3"]),
    # ----------------------------------------------------------- 4. data settings
    ("tbptt-seq_len", lambda: iterators.TBPTTIterator(np.arange(50), 2, 0), ValueError,
     ["`seq_len`", "positive int", "0"]),
    ("tbptt-batch_size", lambda: iterators.TBPTTIterator(np.arange(50), 0, 4), ValueError,
     ["`batch_size`", "positive int", "0"]),
    ("lm-windows-block_size", lambda: iterators.LMWindowIterator(np.arange(50), 2, 0),
     ValueError, ["`block_size`", "positive int", "0"]),
    ("lm-windows-batch_size", lambda: iterators.LMWindowIterator(np.arange(50), 0, 4),
     ValueError, ["`batch_size`", "0"]),
    ("pad-batch-multiple", lambda: batching.pad_batch([[1, 2]], pad_to_multiple=0),
     ValueError, ["`pad_to_multiple`", "positive int", "0"]),
    ("pad-batch-length", lambda: batching.pad_batch([[1, 2]], length=-1), ValueError,
     ["`length`", "-1"]),
    ("char-tokenizer-empty", lambda: tokenizers.CharTokenizer.from_text(""), ValueError,
     ["`text`", "empty"]),
    ("word-tokenizer-empty", lambda: tokenizers.WordTokenizer.from_texts(["", " "]), ValueError,
     ["`texts`", "no words"]),
    ("bpe-empty-corpus", lambda: tokenizers.train_bpe([], vocab_size=300), ValueError,
     ["`texts`", "empty"]),
    # ----------------------------------------------------------- 4. command line options
    ("cli-steps", lambda: toy_config(["--steps=-5"]), ValueError, ["--steps", ">= 0", "-5"]),
    ("cli-log_every", lambda: toy_config(["--log_every=0"]), ValueError,
     ["--log_every", ">= 1", "0"]),
    ("cli-checkpoint_every", lambda: toy_config(["--checkpoint_every=-1"]), ValueError,
     ["--checkpoint_every", ">= 0", "-1"]),
    ("cli-grad_accum", lambda: toy_config(["--grad_accum=0"]), ValueError,
     ["--grad_accum", ">= 1", "0"]),
    ("cli-learning_rate", lambda: toy_config(["--learning_rate=0"]), ValueError,
     ["--learning_rate", "> 0", "0.0"]),
    ("cli-learning_rate-nan", lambda: toy_config(["--learning_rate=nan"]), ValueError,
     ["--learning_rate", "finite", "nan"]),
    # ----------------------------------------------------------- 6. files
    ("safetensors-truncated", lambda: truncated_safetensors(tmp_dir()), ValueError,
     ["model.safetensors", "truncated", "bytes"]),
]


@functools.cache
def tmp_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="seqjax-bad-inputs-")


def test_the_table_is_large_and_ids_are_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 60


@pytest.mark.parametrize("call, exc, words", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_bad_input_is_a_clear_error(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"{missing} not in: {message}"


# ------------------------------------------------------------------ empty inputs: handled


@pytest.mark.parametrize("kind, x, shape", [
    ("mha", np.ones((2, 0, 8), np.float32), (2, 0, 8)),
    ("mha", np.ones((0, 5, 8), np.float32), (0, 5, 8)),
    ("block", np.ones((2, 0, 8), np.float32), (2, 0, 8)),
    ("encoder", np.ones((0, 5, 8), np.float32), (0, 5, 8)),
    ("gpt", i32(2, 0), (2, 0, V)),
    ("gpt", i32(0, 5), (0, 5, V)),
    ("rnnlm", i32(2, 0), (2, 0, V)),
])
def test_empty_batch_or_time_gives_empty_outputs(kind, x, shape):
    assert apply(kind, x).shape == shape


def test_empty_inputs_of_bert_and_encoder_decoders():
    with pytest.raises(ValueError, match=r"`tokens` must hold at least one token.*\[CLS\]"):
        apply("bert", i32(2, 0))  # the pooler reads a [CLS] token that is not there
    assert apply("bert", i32(0, 5))["mlm_logits"].shape == (0, 5, V)
    assert apply("transformer", i32(2, 5), i32(2, 0)).shape == (2, 0, V)
    assert apply("seq2seq", i32(0, 5), i32(0, 3)).shape == (0, 3, V)
    ctx, w = apply("attn-additive", np.ones((2, 8)), np.ones((2, 0, 8)))
    assert ctx.shape == (2, 8) and w.shape == (2, 0) and not np.asarray(ctx).any()
    out, w = snn.dot_product_attention_with_weights(
        np.ones((2, 3, 2, 4)), np.ones((2, 0, 2, 4)), np.ones((2, 0, 2, 4)))
    assert out.shape == (2, 3, 2, 4) and not np.asarray(out).any() and w.shape == (2, 2, 3, 0)


# ------------------------------------------------------------------ jit: flags, no poison


@pytest.mark.parametrize("kind", ["rnnlm", "gpt", "transformer", "seq2seq"])
def test_traced_decode_step_flags_an_oov_row_and_keeps_its_state(kind):
    m, v = bound(kind)
    state = decode_state(kind)
    step = jax.jit(m.decode_step)
    bad_logits, after_bad = step(v, state, jnp.array([7, V]))
    assert np.isnan(bad_logits[1]).all() and np.isfinite(bad_logits[0]).all()
    # Row 1's state was left as it was: the next token gives what it gives without the bad one.
    logits, _ = step(v, after_bad, jnp.array([7, 8]))
    direct, _ = step(v, state, jnp.array([7, 8]))
    assert np.isfinite(logits).all()
    np.testing.assert_allclose(logits[1], direct[1], atol=1e-5)


def test_kv_cache_overflow_is_counted_under_jit():
    cache = snn.KVCache.create(2, 3, 1, 2)
    write = jax.jit(lambda c, k, n: c.update(k, k, n))
    cache = write(cache, jnp.ones((2, 2, 1, 2)), jnp.array([2, 1]))
    cache = write(cache, jnp.ones((2, 2, 1, 2)), jnp.array([2, 2]))
    assert cache.lengths.tolist() == [3, 3] and cache.overflow.tolist() == [1, 0]
    assert cache.overflowed.tolist() == [True, False]


# ------------------------------------------------------------------ training


def test_masked_targets_may_hold_any_id_and_the_check_is_explicit():
    batch = {"inputs": GOOD_INPUTS, "targets": i32(2, 5, fill=-100),
             "mask": np.zeros((2, 5), bool)}
    make_batch_check(V)(batch)  # masked positions are not checked
    assert float(fit_on(batch).history[-1]["tokens"]) == 0.0
    # Without a check nothing reads the batches on the host: the step itself makes the
    # loss NaN for an invalid target, and fit names the likely causes.
    state, step = lm_step()
    _, metrics = step(state, {"inputs": GOOD_INPUTS, "targets": i32(2, 5, fill=V)})
    assert not np.isfinite(float(metrics["loss"]))
    # Arrays on an accelerator are not read back (they would stall every step); CPU ones are.
    on_cpu = jax.device_put(np.full((1, 2), V, np.int32), jax.devices("cpu")[0])
    with pytest.raises(ValueError, match="batch"):
        make_batch_check(V)({"inputs": on_cpu})


def test_non_finite_loss_names_the_likely_causes(tmp_path):
    m, v = bound("gpt")
    apply_fn = lambda p, x, rng, train: m.apply({"params": p}, x)  # noqa: E731 — no vocab
    state = TrainState.create(jax.device_get(v["params"]), optax.sgd(1e38), jax.random.PRNGKey(1))
    step = make_train_step(make_lm_loss(apply_fn), schedule=optax.constant_schedule(1e38))
    batch = {"inputs": GOOD_INPUTS, "targets": GOOD_INPUTS}
    with pytest.raises(FloatingPointError) as info:
        fit(state, step, lambda i: batch, FitConfig(steps=6, log_every=1, progress=False,
                                                    plot=False, tensorboard=False))
    message = str(info.value)
    for words in ("non-finite", "lr = 1e+38", "grad_norm", "not range-checked",
                  "check_batch=make_batch_check(vocab_size)"):
        assert words in message, message


def test_fit_refuses_to_overwrite_a_history_it_cannot_resume(tmp_path):
    from seqjax.train.loop import ResumeError
    from seqjax.train.records import read_metrics

    workdir = str(tmp_path)
    os.makedirs(os.path.join(workdir, "checkpoints.corrupted"))  # every checkpoint unreadable
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 7, "loss": 1.0}) + "\n")
    state, step = lm_step()
    batch = {"inputs": GOOD_INPUTS, "targets": GOOD_INPUTS}
    config = FitConfig(steps=2, progress=False, plot=False, tensorboard=False)
    with pytest.raises(ResumeError, match="up to step 7.*restart=True"):
        fit(state, step, lambda i: batch, config, workdir=workdir)
    assert read_metrics(os.path.join(workdir, "metrics.jsonl"))[0]["step"] == 7  # untouched
    state, step = lm_step()
    result = fit(state, step, lambda i: batch, config, workdir=workdir, restart=True)
    assert result.start_step == 0
    assert [r["step"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))] == [1, 2]
    assert [n for n in os.listdir(workdir) if n.startswith("metrics.jsonl.")]  # kept


# ------------------------------------------------------------------ command line, work dir


def test_cli_refusals_exit_2_and_never_poison_the_work_dir(tmp_path, capsys):
    from seqjax import cli

    workdir = str(tmp_path / "toy")
    saved = os.path.join(workdir, "experiment.json")
    assert cli.main(["train", "toy_rnn", "--smoke", "--workdir", workdir,
                     "--progress=false"]) == 0
    before = open(saved).read()
    capsys.readouterr()

    assert cli.main(["train", "toy_rnn", "--workdir", workdir, "--model.hidden_size=16"]) == 2
    assert "hidden_size: saved 20, now 16" in capsys.readouterr().err  # refused
    assert open(saved).read() == before
    assert cli.main(["train", "toy_rnn", "--workdir", workdir, "--steps=30",
                     "--learning_rate=1e38"]) == 1  # NaN: not the base of the next run
    assert "Likely causes" in capsys.readouterr().err
    assert open(saved).read() == before
    assert cli.main(["train", "toy_rnn", "--workdir", workdir, "--steps=-5"]) == 2
    assert "--steps must be an int >= 0; got -5" in capsys.readouterr().err

    assert cli.main(["eval", "--workdir", workdir, "--model.hidden_size=16"]) == 2
    assert "--model.hidden_size=16 but the checkpoint has 20" in capsys.readouterr().err
    assert cli.main(["generate", "--workdir", workdir, "--prompt", "the",
                     "--max_new_tokens", "-3"]) == 2
    assert "--max_new_tokens must be >= 1; got -3" in capsys.readouterr().err
    assert cli.main(["generate", "--workdir", workdir, "--prompt", "the",
                     "--max-new-tokens", "3"]) == 2
    assert "--max-new-tokens is spelled --max_new_tokens" in capsys.readouterr().err
    assert cli.main(["eval", "--workdir", workdir]) == 0  # the saved config still works


@pytest.fixture(scope="module")
def _earlier_char_lm_run(tmp_path_factory):
    """A finished two-step char_lm run, trained once for the bad-value rows below."""
    from seqjax import cli

    workdir = str(tmp_path_factory.mktemp("earlier") / "run")
    assert cli.main(["train", "char_lm", "--smoke", "--workdir", workdir, "--steps=2",
                     "--progress=false"]) == 0
    return workdir


@pytest.mark.parametrize("option, message", [
    ("--model.embed_dim=15", "--model.embed_dim must be a multiple of --model.num_heads = 2"),
    ("--model.embed_dim=0", "--model.embed_dim must be an int >= 1; got 0"),
    ("--model.num_layers=-1", "--model.num_layers must be an int >= 1; got -1"),
    ("--data_path=/nonexistent/tiny.txt", "'/nonexistent/tiny.txt' does not exist"),
    ("--mesh=data=3", "--mesh/--strategy/--grad_accum: `mesh` 'data=3' does not fit"),
    ("--input=disk", "--input: expected one of ['device', 'host']; got 'disk'"),
    ("--model.architecture=cnn",
     "--model.architecture: expected one of ['transformer', 'lstm']; got 'cnn'"),
    ("--steps_per_call=3", "--log_every must be a multiple of --steps_per_call=3; got 2"),
    ("--compute_dtype=float8", "--compute_dtype: expected one of ['float32', 'bfloat16']"),
])
@pytest.mark.slow
def test_bad_option_values_exit_2_with_one_line_and_leave_the_work_dir(
        tmp_path, capsys, option, message, _earlier_char_lm_run):
    """A bad value is exit 2, one line naming it, no traceback, and the saved
    experiment.json of an earlier run (a copy of one trained run per row) is left as it was."""
    import shutil

    from seqjax import cli

    workdir = str(tmp_path / "run")
    shutil.copytree(_earlier_char_lm_run, workdir)
    saved = os.path.join(workdir, "experiment.json")
    before = open(saved).read()
    capsys.readouterr()
    assert cli.main(["train", "char_lm", "--workdir", workdir, option]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert open(saved).read() == before


def test_cli_restart_is_explicit(tmp_path, capsys):

    from seqjax import cli

    workdir = str(tmp_path / "toy")
    argv = ["train", "toy_rnn", "--smoke", "--workdir", workdir, "--progress=false"]
    assert cli.main(argv) == 0
    assert cli.main(argv + ["--restart"]) == 2  # checkpoints: resume, not restart
    assert "holds checkpoints" in capsys.readouterr().err
    os.replace(os.path.join(workdir, "checkpoints"),  # all moved aside as unreadable
               os.path.join(workdir, "checkpoints.corrupted"))
    saved = open(os.path.join(workdir, "experiment.json")).read()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "history of a run up to step 20" in err and "--restart" in err
    assert open(os.path.join(workdir, "experiment.json")).read() == saved
    assert cli.main(argv + ["--restart"]) == 0
    assert any(n.startswith("metrics.jsonl.") for n in os.listdir(workdir))


# ------------------------------------------------------------------ every option of every recipe

# Options that are free text by nature: paths, names the recipe parses (`--mesh` is parsed at
# the door; `--runs`, `--strategies`, `--presets` and `--tag` by the Config's own check).
FREE_TEXT = {"mesh", "workdir", "results_dir", "data_path", "lm_workdir", "out", "json_out",
             "tag", "heatmap_sentence", "runs", "strategies", "presets", "data", "tokenizer",
             "rank_file", "hellaswag", "tasks", "sample_prompt"}
UNBOUNDED = {"seed", "seeds"}  # any int seeds a PRNG
# The free-text options that still have a form, with a value that breaks it.
CHECKED_TEXT = {"mesh": "data=x", "tag": "a/b", "strategies": "beam0", "presets": "nosuch",
                "runs": "selective_copying:cnn"}


def _recipes() -> list[str]:
    from seqjax.experiments._runner import list_experiments

    return list_experiments()


def _options(name: str) -> list[tuple[str, object]]:
    import dataclasses

    from seqjax.experiments._config import _hints
    from seqjax.experiments._runner import load_experiment

    def flat(cls: type, prefix: str) -> list[tuple[str, object]]:  # a group: --model.KEY
        hints = _hints(cls)
        return [pair for f in dataclasses.fields(cls) for pair in (
            flat(hints[f.name], f"{prefix}{f.name}.") if dataclasses.is_dataclass(hints[f.name])
            else [(f"{prefix}{f.name}", hints[f.name])])]

    return flat(load_experiment(name).Config, "")


def _kind(tp: object) -> tuple[object, object, bool]:
    """``(base type, Range | None, is_tuple)``; a ``Literal`` base stays a ``Literal``."""
    from seqjax.experiments._config import field_range

    return field_range(tp)


def _work_dir(tmp_path, name: str) -> tuple[str, dict[str, bytes]]:
    """A work dir of ``name`` as an earlier run left it: its config and some history."""
    import dataclasses

    from seqjax.experiments._runner import load_experiment

    workdir = tmp_path / name
    workdir.mkdir()
    cfg = load_experiment(name).Config()
    (workdir / "experiment.json").write_text(json.dumps(
        {"experiment": name, "config": dataclasses.asdict(cfg)}, indent=1))
    (workdir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    return str(workdir), _snapshot(str(workdir))


def _snapshot(workdir: str) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(workdir):
        for f in files:
            path = os.path.join(root, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, workdir)] = fh.read()
    return out


def _refused(monkeypatch, capsys, name: str, workdir: str, before: dict, option: str,
             value: str, must_name: str) -> None:
    from seqjax import cli
    from seqjax.experiments._runner import load_experiment

    def run(cfg):
        raise AssertionError(f"{name} --{option}={value} was not refused at the door")

    monkeypatch.setattr(load_experiment(name), "run", run)
    code = cli.main(["train", name, "--workdir", workdir, f"--{option}={value}"])
    err = capsys.readouterr().err
    assert code == 2, (name, option, value, err)
    assert must_name in err and "Traceback" not in err, (name, option, value, err)
    assert len(err.strip().splitlines()) == 1, err
    assert _snapshot(workdir) == before, (name, option, value)


def test_every_option_declares_its_type_choices_and_range():
    """Choices are ``Literal`` (dtypes, strategies, models, inputs) and every number has a
    declared range, so no recipe can forget a check."""
    import typing

    missing = []
    for name in _recipes():
        for option, tp in _options(name):
            base, rng, _ = _kind(tp)
            if base is str and option not in FREE_TEXT:
                missing.append(f"{name} --{option}: a str, not a Literal of its choices")
            if base in (int, float) and rng is None and option not in UNBOUNDED:
                missing.append(f"{name} --{option}: a number without a declared range")
            if typing.get_origin(base) is typing.Literal:
                assert all(isinstance(a, str) for a in typing.get_args(base))
    assert not missing, "\n".join(missing)


def test_strategy_choices_are_the_sharding_strategies():
    import typing

    from seqjax.train.parallel import ParallelOptions
    from seqjax.train.sharding import STRATEGIES

    hint = typing.get_type_hints(ParallelOptions)["strategy"]
    assert set(typing.get_args(hint)) == {"auto", *STRATEGIES}


@pytest.mark.parametrize("name", _recipes())
def test_one_bad_value_per_option_exits_2_naming_it_and_leaves_the_work_dir(
        name, tmp_path, monkeypatch, capsys):
    """Every option of every recipe, one value of the wrong type or not among its choices:
    exit 2, one line naming the option (and the allowed values), the work dir byte for byte
    as it was — before anything runs."""
    import typing

    workdir, before = _work_dir(tmp_path, name)
    for option, tp in _options(name):
        base, _, _ = _kind(tp)
        if typing.get_origin(base) is typing.Literal:
            value, words = "bogus", f"--{option}: expected one of"
        elif base is bool:
            value, words = "maybe", f"--{option}: expected bool"
        elif base in (int, float):
            value, words = "x1", f"--{option}: expected"
        elif option in CHECKED_TEXT:
            value, words = CHECKED_TEXT[option], f"--{option}"
        else:
            continue
        _refused(monkeypatch, capsys, name, workdir, before, option, value, words)


def test_compute_dtype_float8_names_the_allowed_dtypes(tmp_path, monkeypatch, capsys):
    workdir, before = _work_dir(tmp_path, "char_lm")
    _refused(monkeypatch, capsys, "char_lm", workdir, before, "compute_dtype", "float8",
             "--compute_dtype: expected one of ['float32', 'bfloat16']; got 'float8'")


@pytest.mark.parametrize("name", _recipes())
def test_zero_or_negative_for_each_bounded_option_exits_2_naming_it(
        name, tmp_path, monkeypatch, capsys):
    """Ranges come from the declarations (``PosInt``, ``NonNegInt``, ``PosFloat``,
    ``Fraction``...): the first value below each one (0 or -1), and 1 for a fraction."""
    workdir, before = _work_dir(tmp_path, name)
    bounded = 0
    for option, tp in _options(name):
        base, rng, is_tuple = _kind(tp)
        if rng is None or rng.low is None:
            continue
        low = rng.low if rng.low_open else rng.low - 1
        values = [low] + ([rng.high] if rng.high is not None and not rng.high_closed else [])
        for v in values:
            v = int(v) if base is int else float(v)
            _refused(monkeypatch, capsys, name, workdir, before, option, str(v),
                     f"--{option} must ")
        bounded += 1
    assert bounded  # every recipe has a size, a count or a step


@pytest.mark.parametrize("old, new", [("layers", "num_layers"), ("heads", "num_heads"),
                                      ("dim", "embed_dim"), ("dropout", "dropout_rate"),
                                      ("batch", "batch_size"), ("d_model", "embed_dim"),
                                      ("hidden", "hidden_size"), ("warmup", "warmup_steps"),
                                      ("transformer_layers", "num_layers")])
def test_old_option_spellings_name_the_new_one(old, new, capsys):
    from seqjax import cli

    checked = 0
    for name in _recipes():  # the option, or the same name in the recipe's group (--model.X)
        option = next((o for o, _ in _options(name) if o.rpartition(".")[2] == new), None)
        if option is None:
            continue
        assert cli.main(["train", name, f"--{old}=2"]) == 2
        err = capsys.readouterr().err
        assert f"--{old} is now --{option}" in err and len(err.strip().splitlines()) == 1, err
        checked += 1
    assert checked


def test_every_retired_spelling_of_every_recipe_names_the_new_one(capsys):
    """The global table and each recipe's own (``Config.RENAMED``): every retired spelling
    that maps to one of the recipe's options is refused (exit 2) naming the new option, and
    no option of a recipe is itself a retired spelling."""
    from seqjax import cli
    from seqjax.experiments._config import renamed
    from seqjax.experiments._runner import load_experiment

    checked = 0
    for name in _recipes():
        options = dict(_options(name))
        for old, new in renamed(load_experiment(name).Config).items():
            assert old not in options, f"{name} still has the retired --{old}"
            if new not in options:
                continue
            assert cli.main(["train", name, f"--{old}=2"]) == 2
            err = capsys.readouterr().err
            assert f"--{old} is now --{new}" in err, (name, err)
            checked += 1
    assert checked >= 40


def test_a_config_saved_with_the_old_spellings_still_loads():
    from seqjax.experiments import bert_mlm
    from seqjax.experiments._config import config_from_dict

    cfg = config_from_dict(bert_mlm.Config, {"layers": 3, "heads": 2, "dim": 32,
                                             "dropout": 0.2, "pretrain_lr": 0.5})
    m = cfg.model
    assert (m.num_layers, m.num_heads, m.embed_dim, m.dropout_rate) == (3, 2, 32, 0.2)
    assert cfg.pretrain_learning_rate == 0.5


@pytest.mark.parametrize("name", _recipes())
def test_a_work_dir_saved_before_the_model_group_loads_as_it_was(name, tmp_path, capsys):
    """Every recipe: an ``experiment.json`` with the network's options flat, as saved before
    they became the group ``--model.*`` (those the recipe had: its renames into the group; the
    GPT recipe's architecture as ``"model"``), reads as the config it was — the group's new
    options at the recipe's defaults — and its ``--help`` lists the group key by key."""
    import dataclasses

    from seqjax.experiments._config import config_from_dict, renamed
    from seqjax.experiments._runner import load_experiment

    cls = load_experiment(name).Config
    cfg = cls()
    saved = dataclasses.asdict(cfg)
    group = saved.pop("model", None)
    if not isinstance(group, dict):
        assert name in ("param_counts", "sampling"), name  # no network of their own
        return
    moved = {old: new.split(".", 1)[1] for old, new in renamed(cls).items()
             if new.startswith("model.") and old == new.split(".", 1)[1]}
    assert moved, name
    flat = {**saved, **{k: group[k] for k in moved}}
    if "architecture" in group:
        flat["model"] = group["architecture"]
    assert config_from_dict(cls, flat) == cfg
    from seqjax import cli

    assert cli.main(["train", name, "--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  --model.{k} (" in out for k in group), name


def test_a_recipes_own_rename_holds_in_that_recipe_only(capsys):
    """ptb_lm's ``--num_steps`` (its window) is ``--block_size``; in gpt2, which has a
    ``block_size`` too, ``--num_steps`` is just unknown (a count of steps there)."""
    from seqjax import cli
    from seqjax.experiments import ptb_lm
    from seqjax.experiments._config import config_from_dict

    cfg = config_from_dict(ptb_lm.Config, {"num_steps": 35, "hidden": 8})
    assert (cfg.block_size, cfg.model.hidden_size) == (35, 8)
    assert cli.main(["train", "gpt2", "--num_steps=35"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key --num_steps" in err and "block_size (one" not in err



def _kill_before_the_first_checkpoint(workdir: str) -> None:
    """The state a SIGKILL during the first checkpoint write leaves: metrics.jsonl with the
    steps run, orbax's temporary directory of the unfinished checkpoint, no finished one."""
    import shutil

    ckpt = os.path.join(workdir, "checkpoints")
    steps = sorted(int(n) for n in os.listdir(ckpt) if n.isdigit())
    first = steps[0]
    os.replace(os.path.join(ckpt, str(first)),
               os.path.join(ckpt, f"{first}.orbax-checkpoint-tmp-1700000000000000"))
    for s in steps[1:]:
        shutil.rmtree(os.path.join(ckpt, str(s)))


def test_a_run_killed_before_its_first_checkpoint_resumes_by_starting_over(tmp_path, capsys):
    from seqjax import cli
    from seqjax.train.records import read_metrics

    workdir = str(tmp_path / "toy")
    argv = ["train", "toy_rnn", "--smoke", "--workdir", workdir, "--progress=false"]
    assert cli.main(argv) == 0
    first = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    _kill_before_the_first_checkpoint(workdir)
    saved = open(os.path.join(workdir, "experiment.json")).read()
    capsys.readouterr()
    assert cli.main(argv) == 0  # the same command: starts over, no --restart
    err = capsys.readouterr().err
    notice = [line for line in err.splitlines() if "killed before its first checkpoint" in line]
    assert len(notice) == 1 and "starting over" in notice[0] and "steps 1-20" in notice[0], err
    kept = [n for n in os.listdir(workdir) if n.startswith("metrics.jsonl.")]
    assert len(kept) == 1 and kept[0] in notice[0]
    assert read_metrics(os.path.join(workdir, kept[0])) == first  # the partial history
    again = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    assert [r["step"] for r in again] == [r["step"] for r in first]
    assert again[-1]["loss"] == pytest.approx(first[-1]["loss"])  # deterministic from the seed
    ckpt = os.path.join(workdir, "checkpoints")
    assert not [n for n in os.listdir(ckpt) if "tmp" in n]
    assert open(os.path.join(workdir, "experiment.json")).read() == saved


# The first checkpoint's write starts (orbax's temporary directory, a partial file) and the
# process is killed before it finishes: always, not by a race with the asynchronous write.
_KILL_IN_FIRST_SAVE = """
import os, signal, sys
from seqjax.train import checkpoint
def die_while_saving(self, *args, **kwargs):
    tmp = os.path.join(self.directory, "10.orbax-checkpoint-tmp-1700000000000000", "params")
    os.makedirs(tmp)
    with open(os.path.join(tmp, "partial"), "wb") as f:
        f.write(b"half a checkpoint")
    os.kill(os.getpid(), signal.SIGKILL)
checkpoint.Checkpointer.save = die_while_saving
from seqjax import cli
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_sigkill_during_the_first_checkpoint_write_then_the_same_command_finishes(tmp_path):
    import subprocess

    from seqjax.train.records import read_metrics

    workdir = str(tmp_path / "toy")
    args = ["train", "toy_rnn", "--smoke", "--workdir", workdir, "--progress=false"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    killed = subprocess.run([sys.executable, "-c", _KILL_IN_FIRST_SAVE, *args], env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    ckpt = os.path.join(workdir, "checkpoints")
    assert not [n for n in os.listdir(ckpt) if n.isdigit()]  # no finished checkpoint
    assert read_metrics(os.path.join(workdir, "metrics.jsonl"))  # but some history
    again = subprocess.run([sys.executable, "-m", "seqjax.cli", *args], env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "starting over" in again.stderr
    assert [r["step"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))][-1] == 20
    assert sorted(int(n) for n in os.listdir(ckpt) if n.isdigit())[-1] == 20



# ------------------------------------------------------------------ noise


def test_closed_event_loop_noise_is_filtered(monkeypatch):
    from types import SimpleNamespace

    from seqjax.train.checkpoint import _silence_closed_loop_noise

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(str(u.exc_value)))
    _silence_closed_loop_noise()
    _silence_closed_loop_noise()  # once only
    sys.unraisablehook(SimpleNamespace(exc_value=RuntimeError("Event loop is closed")))
    sys.unraisablehook(SimpleNamespace(exc_value=RuntimeError("something else")))
    assert seen == ["something else"]

"""Golden parameter trees: names and shapes of every preset (checkpoint compatibility).

Regenerate after an intended change with
``SEQJAX_UPDATE_GOLDEN=1 pytest tests/models/test_golden.py`` and review the diff.
Shapes come from ``jax.eval_shape``: nothing is allocated or compiled.
"""

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from seqjax.models.bert import BERT_PRESETS, Bert
from seqjax.models.encoder_decoder import TRANSFORMER_PRESETS, Transformer
from seqjax.models.gpt import TRANSFORMER_LM_PRESETS, TransformerLM
from seqjax.models.rnn import (
    RNNClassifier,
    RNNClassifierConfig,
    RNNConfig,
    RNNLanguageModel,
    RNNLMConfig,
    RNNTagger,
    RNNTaggerConfig,
)
from seqjax.models.seq2seq import Seq2Seq, Seq2SeqConfig
from seqjax.models.vit import VIT_PRESETS, ViT
from seqjax.utils import count_params
from tests.models.helpers import shape_tree

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
TOK = jnp.zeros((1, 4), jnp.int32)


def _image(model):
    cfg = model.config
    size = (cfg.image_size,) * 2 if isinstance(cfg.image_size, int) else cfg.image_size
    return (jnp.zeros((1, *size, cfg.channels)),)


MODELS = {
    **{name: (lambda n=name: TransformerLM.from_preset(n), lambda m: (TOK,))
       for name in TRANSFORMER_LM_PRESETS},
    **{name: (lambda n=name: Bert.from_preset(n), lambda m: (TOK,))
       for name in BERT_PRESETS if name != "bert-large"},
    **{name: (lambda n=name: Transformer.from_preset(n), lambda m: (TOK, TOK))
       for name in TRANSFORMER_PRESETS},
    **{name: (lambda n=name: ViT.from_preset(n), _image) for name in VIT_PRESETS},
    "rnn-lm-2x-lstm-tied": (
        lambda: RNNLanguageModel(RNNLMConfig(vocab_size=10000, embed_dim=200, num_layers=2,
                                             tie_embeddings=True)), lambda m: (TOK,)),
    "rnn-classifier-bigru": (
        lambda: RNNClassifier(RNNClassifierConfig(
            num_classes=2, vocab_size=20000, embed_dim=100, hidden_size=128, cell_type="gru",
            bidirectional=True, mlp_dim=64)),
        lambda m: (TOK,)),
    "rnn-tagger-bilstm": (
        lambda: RNNTagger(RNNTaggerConfig(num_tags=17, vocab_size=20000, embed_dim=100,
                                          hidden_size=128, bidirectional=True)),
        lambda m: (TOK,)),
    "seq2seq-bahdanau": (
        lambda: Seq2Seq(Seq2SeqConfig(
            encoder=RNNConfig(vocab_size=8000, embed_dim=256, hidden_size=512, cell_type="gru",
                              bidirectional=True),
            tgt_vocab_size=6000, context="attention", attention="bahdanau")),
        lambda m: (TOK, TOK)),
    "seq2seq-sutskever": (
        lambda: Seq2Seq(Seq2SeqConfig(
            encoder=RNNConfig(vocab_size=8000, embed_dim=256, hidden_size=512, cell_type="lstm",
                              num_layers=4),
            tgt_vocab_size=6000, decoder_layers=4, context="initial_state",
            reverse_source=True)),
        lambda m: (TOK, TOK)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_golden_parameter_tree(name):
    make, example = MODELS[name]
    model = make()
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), *example(model))["params"]
    got = {"num_params": count_params(params), "params": shape_tree(params)}
    path = GOLDEN / f"{name}.json"
    if os.environ.get("SEQJAX_UPDATE_GOLDEN"):
        lines = [f'  {json.dumps(k)}: {json.dumps(v)}' for k, v in got["params"].items()]
        body = ",\n".join(lines)
        n = got["num_params"]
        path.write_text(f'{{\n "num_params": {n},\n "params": {{\n{body}\n }}\n}}\n')
    want = json.loads(path.read_text())
    assert got["params"] == want["params"]
    assert got["num_params"] == want["num_params"]

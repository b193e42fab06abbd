"""The RNN family's configs: checked when built, ``replace`` checked, frozen, round-trip,
one spelling per option across the library, and the models built from them."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.models import (
    BertConfig,
    ImageCaptioner,
    ImageCaptionerConfig,
    RNNClassifier,
    RNNClassifierConfig,
    RNNConfig,
    RNNLanguageModel,
    RNNLMConfig,
    RNNTagger,
    RNNTaggerConfig,
    Seq2Seq,
    Seq2SeqConfig,
    TransformerConfig,
    TransformerLMConfig,
    ViTConfig,
)
from seqjax.nn import BlockConfig, Dense, Embed, StackedRNN
from seqjax.nn.cells import RecurrentCell

KEY = jax.random.PRNGKey(0)
TOK = jnp.asarray(np.random.default_rng(0).integers(0, 11, (2, 5)), jnp.int32)

LM = dict(vocab_size=11, embed_dim=8)
CLF = dict(vocab_size=11, embed_dim=8, num_classes=3)
TAG = dict(vocab_size=11, embed_dim=8, num_tags=4)
ENC = RNNConfig(vocab_size=11, embed_dim=8)

# (config class, its good keywords, the bad keyword(s), exception, words the message must hold)
BAD = {
    "vocab_size=0": (RNNConfig, {}, dict(vocab_size=0), ValueError, ["`vocab_size`", "0"]),
    "embed_dim=2.0": (RNNConfig, {}, dict(embed_dim=2.0), ValueError, ["`embed_dim`", "2.0"]),
    "hidden_size=-1": (RNNConfig, {}, dict(hidden_size=-1), ValueError, ["`hidden_size`", "-1"]),
    "num_layers=True": (RNNConfig, {}, dict(num_layers=True), ValueError,
                        ["`num_layers`", "True"]),
    "cell_type=name": (RNNConfig, {}, dict(cell_type="lsmt"), ValueError,
                       ["`cell_type`", "'lstm'", "'lsmt'"]),
    "cell_type=class": (RNNConfig, {}, dict(cell_type=Dense), TypeError,
                        ["`cell_type`", "RecurrentCell", "Dense"]),
    "bidirectional=1": (RNNConfig, {}, dict(bidirectional=1), TypeError,
                        ["`bidirectional`", "bool", "1"]),
    "dropout_rate=1": (RNNConfig, {}, dict(dropout_rate=1.0), ValueError,
                       ["`dropout_rate`", "[0, 1)", "1.0"]),
    "unroll=0": (RNNConfig, {}, dict(unroll=0), ValueError, ["`unroll`", "0"]),
    "cell_kwargs=unknown": (RNNConfig, {}, dict(cell_kwargs={"forget_bais": 1.0}), ValueError,
                            ["`cell_kwargs`", "LSTMCell", "forget_bias", "'forget_bais'"]),
    "cell_kwargs=stack's": (RNNConfig, {}, dict(cell_kwargs={"features": 3}), ValueError,
                            ["`cell_kwargs`", "'features'"]),
    "cell_kwargs=not pairs": (RNNConfig, {}, dict(cell_kwargs=3), TypeError,
                              ["`cell_kwargs`", "3"]),
    "lm vocab_size=None": (RNNLMConfig, {}, dict(vocab_size=None), ValueError,
                           ["`vocab_size`", "RNNLMConfig", "None"]),
    "lm bidirectional": (RNNLMConfig, LM, dict(bidirectional=True), ValueError,
                         ["`bidirectional`", "RNNLMConfig", "True"]),
    "lm tie_embeddings": (RNNLMConfig, LM, dict(hidden_size=16, tie_embeddings=True),
                          ValueError, ["`tie_embeddings=True`", "hidden_size=16", "embed_dim=8"]),
    "lm output_bias": (RNNLMConfig, LM, dict(output_bias="yes"), TypeError,
                       ["`output_bias`", "'yes'"]),
    "classifier num_classes": (RNNClassifierConfig, CLF, dict(num_classes=0), ValueError,
                               ["`num_classes`", "0"]),
    "classifier pooling": (RNNClassifierConfig, CLF, dict(pooling="median"), ValueError,
                           ["`pooling`", "'last'", "'median'"]),
    "classifier mlp_dim": (RNNClassifierConfig, CLF, dict(mlp_dim=-1), ValueError,
                           ["`mlp_dim`", ">= 0 (0: no hidden layer)", "-1"]),
    "classifier mlp_dim None": (RNNClassifierConfig, CLF, dict(mlp_dim=None), TypeError,
                                ["`mlp_dim=None`", "`mlp_dim=0`"]),
    "bert num_classes None": (BertConfig, {}, dict(num_classes=None), TypeError,
                              ["`num_classes=None` of BertConfig", "`num_classes=0`"]),
    "vit num_classes": (ViTConfig, dict(image_size=8, patch_size=4), dict(num_classes=-1),
                        ValueError, ["`num_classes` of ViTConfig", "-1"]),
    "tagger num_tags": (RNNTaggerConfig, TAG, dict(num_tags=-2), ValueError,
                        ["`num_tags`", "-2"]),
    "seq2seq encoder": (Seq2SeqConfig, dict(tgt_vocab_size=7), dict(encoder=dict(LM)),
                        TypeError, ["`encoder`", "RNNConfig", "dict"]),
    "seq2seq source vocabulary": (Seq2SeqConfig, dict(tgt_vocab_size=7),
                                  dict(encoder=RNNConfig()), ValueError,
                                  ["`encoder.vocab_size`", "None"]),
    "seq2seq tgt_vocab_size": (Seq2SeqConfig, dict(encoder=ENC), dict(tgt_vocab_size=0),
                               ValueError, ["`tgt_vocab_size`", "0"]),
    "seq2seq context": (Seq2SeqConfig, dict(encoder=ENC, tgt_vocab_size=7),
                        dict(context="late"), ValueError, ["`context`", "'attention'", "'late'"]),
    "seq2seq attention": (Seq2SeqConfig, dict(encoder=ENC, tgt_vocab_size=7),
                          dict(attention="luong"), ValueError,
                          ["`attention`", "'bahdanau'", "'luong'"]),
    "seq2seq bridge": (Seq2SeqConfig, dict(encoder=ENC.replace(bidirectional=True),
                                           tgt_vocab_size=7), dict(bridge="copy"), ValueError,
                       ["`bridge='copy'`", "encoder.bidirectional=True"]),
    "seq2seq output_context": (Seq2SeqConfig, dict(encoder=ENC, tgt_vocab_size=7),
                               dict(attention="luong_dot", output_context=False), ValueError,
                               ["`output_context=False`", "'luong_dot'"]),
    "captioner condition": (ImageCaptionerConfig, LM, dict(condition="late"), ValueError,
                            ["`condition`", "'init'", "'late'"]),
    "captioner layers": (ImageCaptionerConfig, LM, dict(num_layers=2), ValueError,
                         ["`num_layers`", "ImageCaptionerConfig", "2"]),
    "captioner cell class": (ImageCaptionerConfig, LM, dict(cell_type=RecurrentCell), ValueError,
                             ["`cell_type`", "ImageCaptionerConfig"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_value_is_refused_when_built_naming_the_field(case):
    cls, good, bad, exc, words = BAD[case]
    with pytest.raises(exc) as info:
        cls(**{**good, **bad})
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("case", ["dropout_rate=1", "lm tie_embeddings", "classifier pooling",
                                  "seq2seq context", "captioner condition"])
def test_replace_validates_again(case):
    cls, good, bad, exc, words = BAD[case]
    cfg = cls(**good)  # valid
    with pytest.raises(exc) as info:
        cfg.replace(**bad)
    assert words[0] in str(info.value)


@pytest.mark.parametrize("cfg", [RNNConfig(**LM), RNNLMConfig(**LM), RNNClassifierConfig(**CLF),
                                 RNNTaggerConfig(**TAG),
                                 Seq2SeqConfig(encoder=ENC, tgt_vocab_size=7),
                                 ImageCaptionerConfig(**LM)], ids=lambda c: type(c).__name__)
def test_replace_keeps_the_class_and_refuses_an_unknown_field(cfg):
    assert type(cfg.replace()) is type(cfg) and cfg.replace() == cfg
    with pytest.raises(TypeError, match=r"`tie_weights` .*is not a field of"):
        cfg.replace(tie_weights=True)


def test_replace_names_the_closest_field():
    with pytest.raises(TypeError, match=r"`tie_embedding` \(did you mean `tie_embeddings`\?\)"):
        RNNLMConfig(**LM).replace(tie_embedding=True)
    with pytest.raises(TypeError, match=r"did you mean `mlp_dim`"):
        RNNClassifierConfig(**CLF).replace(mlp_dims=8)


def test_configs_are_frozen_keyword_only_and_hashable():
    cfg = RNNLMConfig(**LM)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.embed_dim = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        RNNConfig(11, 8)  # type: ignore[misc]
    # cell_kwargs is kept as sorted pairs: a dict and the same pairs give equal, hashable configs
    a = RNNConfig(cell_kwargs={"use_bias": False, "forget_bias": 1.0})
    b = RNNConfig(cell_kwargs=[("forget_bias", 1.0), ("use_bias", False)])
    assert a == b and hash(a) == hash(b)
    assert a.cell_kwargs == (("forget_bias", 1.0), ("use_bias", False))
    assert hash(RNNLanguageModel(cfg)) == hash(RNNLanguageModel(cfg.replace()))


@pytest.mark.parametrize("cfg", [
    RNNLMConfig(vocab_size=11, embed_dim=8, hidden_size=8, num_layers=2, cell_type="gru",
                dropout_rate=0.1, cell_kwargs={"use_bias": False}, unroll=2,
                tie_embeddings=True, output_bias=False),
    RNNClassifierConfig(num_classes=3, vocab_size=None, hidden_size=5, bidirectional=True,
                        pooling="max", mlp_dim=7),
    RNNTaggerConfig(num_tags=4, vocab_size=11, embed_dim=6, cell_type="elman"),
    Seq2SeqConfig(encoder=RNNConfig(vocab_size=11, embed_dim=8, num_layers=2),
                  tgt_vocab_size=7, decoder_layers=2, context="initial_state", bridge="copy"),
    ImageCaptionerConfig(vocab_size=11, embed_dim=8, condition="both", image_hidden=6),
], ids=lambda c: type(c).__name__)
def test_a_config_round_trips(cfg):
    shallow = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    assert type(cfg)(**shallow) == cfg
    assert cfg.replace(**shallow) == cfg


def test_properties():
    assert RNNConfig(embed_dim=8).features == 8
    assert RNNConfig(embed_dim=8, hidden_size=5, bidirectional=True).output_features == 10
    cfg = Seq2SeqConfig(encoder=ENC, tgt_vocab_size=7)
    assert cfg.src_vocab_size == 11 and cfg.bridge_mode == "copy"
    assert cfg.replace(decoder_layers=2).bridge_mode == "dense"


def test_one_spelling_per_option_across_the_library():
    """The RNN family's option names are the transformer side's."""
    names = {cls: {f.name for f in dataclasses.fields(cls)}
             for cls in (RNNLMConfig, RNNClassifierConfig, TransformerLMConfig,
                         TransformerConfig, BlockConfig, Seq2SeqConfig)}
    assert "tie_embeddings" in names[RNNLMConfig] & names[TransformerLMConfig]
    assert "output_bias" in names[RNNLMConfig] & names[TransformerConfig] & names[Seq2SeqConfig]
    assert "mlp_dim" in names[RNNClassifierConfig] & names[BlockConfig]
    for old in ("tie_weights", "use_output_bias", "mlp_hidden"):
        assert not any(old in n for n in names.values())


@pytest.mark.parametrize("model, wanted", [
    (lambda: RNNLanguageModel(RNNConfig(**LM)), "RNNLMConfig"),
    (lambda: RNNClassifier(RNNTaggerConfig(**TAG)), "RNNClassifierConfig"),
    (lambda: RNNTagger(RNNClassifierConfig(**CLF)), "RNNTaggerConfig"),
    (lambda: Seq2Seq(ENC), "Seq2SeqConfig"),
    (lambda: ImageCaptioner(RNNLMConfig(**LM)), "ImageCaptionerConfig"),
])
def test_a_model_refuses_another_config_when_built(model, wanted):
    with pytest.raises(TypeError, match=f"`config` of .* must be an? {wanted}"):
        model()


@pytest.mark.parametrize("tie", [False, True])
def test_lm_is_embedding_stack_and_output_layer(tie):
    """The model built from the config is exactly Embed → StackedRNN → output, the same
    parameters at the same paths (the golden trees pin the names and shapes)."""
    cfg = RNNLMConfig(vocab_size=11, embed_dim=6, num_layers=2, cell_type="lstm",
                      cell_kwargs={"forget_bias": 1.0}, tie_embeddings=tie)
    lm = RNNLanguageModel(cfg)
    params = lm.init(KEY, TOK)["params"]
    e = Embed(11, 6).apply({"params": params["embed"]}, TOK)
    h = StackedRNN(6, num_layers=2, cell_type="lstm", cell_kwargs={"forget_bias": 1.0}).apply(
        {"params": params["rnn"]}, e)
    if tie:
        want = h @ params["embed"]["embedding"].T + params["output_bias"]
    else:
        want = Dense(11).apply({"params": params["output"]}, h)
    np.testing.assert_allclose(lm.apply({"params": params}, TOK), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls, old, new", [
    (RNNLMConfig, "tie_weights", "tie_embeddings"),
    (RNNLMConfig, "use_output_bias", "output_bias"),
    (RNNClassifierConfig, "mlp_hidden", "mlp_dim"),
])
def test_a_retired_spelling_in_a_constructor_names_the_new_one(cls, old, new):
    """As in ``replace``: the constructor refuses the old name and says the new one."""
    with pytest.raises(TypeError, match=rf"`{old}` \(renamed `{new}`\)"):
        cls(vocab_size=5, **{old: True})


def test_seq2seq_config_refuses_an_unknown_field_by_name():
    with pytest.raises(TypeError, match=r"`src_vocab_size` .*is not a field of Seq2SeqConfig"):
        Seq2SeqConfig(encoder=ENC, tgt_vocab_size=5, src_vocab_size=5)


def test_image_captioner_computes_in_its_dtype():
    """bfloat16 compute: float32 parameters and logits, within bfloat16's rounding of the
    float32 model."""
    import jax
    import jax.numpy as jnp

    cfg = ImageCaptionerConfig(vocab_size=12, hidden_size=16, embed_dim=8, condition="both")
    tokens, images = jnp.zeros((2, 5), jnp.int32), jnp.ones((2, 64))
    half = ImageCaptioner(cfg, dtype=jnp.bfloat16)
    params = half.init(jax.random.PRNGKey(0), tokens, images)
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.float32)}
    out = half.apply(params, tokens, images)
    ref = ImageCaptioner(cfg).apply(params, tokens, images)
    assert out.dtype == jnp.float32
    assert 0 < float(jnp.abs(out - ref).max()) < 0.05

"""One BlockConfig per stack: every stack built both ways a user would (the named
constructor and an explicit BlockConfig) and through each model config is causal exactly
when it should be and has (and uses) cross-attention exactly when it should; a config
that disagrees with its stack is an error naming the field. And GPT-2's residual init."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.experiments import char_lm
from seqjax.models import (
    TRANSFORMER_LM_PRESETS,
    Bert,
    BertConfig,
    Transformer,
    TransformerConfig,
    TransformerLM,
    TransformerLMConfig,
    ViTConfig,
    bert_block,
    gpt_block,
    vaswani_block,
)
from seqjax.nn import (
    GLU,
    MLP,
    BlockConfig,
    TransformerBlock,
    TransformerDecoder,
    TransformerEncoder,
)

D, H, T, S, V = 16, 2, 6, 5, 13
KEY = jax.random.PRNGKey(0)


def _x(*shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _changed_at(x, t, seed=9):
    """``x`` with position ``t`` (axis 1) replaced: a float vector or a token id."""
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x.at[:, t].set((x[:, t] + 1) % V)
    return x.at[:, t].set(_x(x.shape[0], *x.shape[2:], seed=seed))


def _assert_causal(f, x, t=3):
    """Changing position ``t`` changes no output before ``t``, and does change ``t``."""
    y, y2 = np.asarray(f(x)), np.asarray(f(_changed_at(x, t)))
    np.testing.assert_allclose(y2[:, :t], y[:, :t], atol=1e-6)
    assert not np.allclose(y2[:, t], y[:, t], atol=1e-4)


def _assert_bidirectional(f, x):
    """Changing the last position changes the first output."""
    y, y2 = np.asarray(f(x)), np.asarray(f(_changed_at(x, x.shape[1] - 1)))
    assert not np.allclose(y2[:, 0], y[:, 0], atol=1e-4)


def _assert_cross_attention_used(f, enc):
    """Changing the encoder output changes every decoder position."""
    y, y2 = np.asarray(f(enc)), np.asarray(f(enc + _x(*enc.shape, seed=5)))
    assert np.all(np.abs(y2 - y).max(-1) > 1e-4)


def _layers(params):
    return [v for k, v in params["params"].items() if k.startswith("layers")]


# ------------------------------------------------------------------ stacks, both ways


DECODER_ONLY = {
    "named": BlockConfig.decoder(H, mlp_dim=32, cross_attention=False),
    "explicit": BlockConfig(num_heads=H, mlp_dim=32, causal=True),
}
ENCODER_DECODER = {
    "named": BlockConfig.decoder(H, mlp_dim=32),
    "explicit": BlockConfig(num_heads=H, mlp_dim=32, causal=True, cross_attention=True),
}
ENCODER = {
    "named": BlockConfig.encoder(H, mlp_dim=32),
    "explicit": BlockConfig(num_heads=H, mlp_dim=32),
}


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("way", ["named", "explicit"])
def test_decoder_only_stack_is_causal_without_cross_attention(way, scan):
    dec = TransformerDecoder(config=DECODER_ONLY[way], num_layers=2, scan_layers=scan)
    x = _x(2, T, D)
    params = dec.init(KEY, x)
    assert all("cross_attn" not in layer for layer in _layers(params))
    _assert_causal(jax.jit(lambda x: dec.apply(params, x)), x)


@pytest.mark.parametrize("way", ["named", "explicit"])
def test_encoder_decoder_stack_is_causal_and_uses_cross_attention(way):
    dec = TransformerDecoder(config=ENCODER_DECODER[way], num_layers=2)
    x, enc = _x(2, T, D), _x(2, S, D, seed=1)
    params = dec.init(KEY, x, encoder_out=enc)
    assert all("cross_attn" in layer for layer in _layers(params))
    apply = jax.jit(lambda x, e: dec.apply(params, x, encoder_out=e))
    _assert_causal(lambda x: apply(x, enc), x)
    _assert_cross_attention_used(lambda e: apply(x, e), enc)


@pytest.mark.parametrize("way", ["named", "explicit"])
def test_encoder_stack_is_bidirectional(way):
    enc = TransformerEncoder(config=ENCODER[way], num_layers=2)
    x = _x(2, T, D)
    params = enc.init(KEY, x)
    assert all("cross_attn" not in layer for layer in _layers(params))
    _assert_bidirectional(jax.jit(lambda x: enc.apply(params, x)), x)


def test_named_constructors_equal_the_explicit_configs():
    for configs in (DECODER_ONLY, ENCODER_DECODER, ENCODER):
        assert configs["named"] == configs["explicit"]


def test_a_stack_rejects_a_config_that_disagrees():
    """The decoder given a bidirectional config (once a silent non-causal "decoder"), the
    encoder given a causal one or one with cross-attention: a ValueError naming the field."""
    with pytest.raises(ValueError, match=r"`config.causal` of TransformerDecoder must be True"):
        TransformerDecoder(config=BlockConfig(num_heads=H), num_layers=1)
    with pytest.raises(ValueError, match=r"`config.causal` of TransformerEncoder must be False"):
        TransformerEncoder(config=BlockConfig.decoder(H, cross_attention=False), num_layers=1)
    with pytest.raises(ValueError, match=r"`config.cross_attention` of TransformerEncoder"):
        TransformerEncoder(config=BlockConfig(num_heads=H, cross_attention=True), num_layers=1)
    with pytest.raises(TypeError, match="`config` of TransformerDecoder must be a BlockConfig"):
        TransformerDecoder(config={"num_heads": H}, num_layers=1)
    with pytest.raises(TypeError):
        TransformerDecoder(num_heads=H, num_layers=1)  # no keyword form


# ------------------------------------------------------------------ through the model configs


def _lm(block):
    return TransformerLM(TransformerLMConfig(vocab_size=V, num_layers=2, embed_dim=D, block_size=T,
                                             block=block))


@pytest.mark.parametrize("block", [
    gpt_block(H),
    BlockConfig.decoder(H, cross_attention=False),
    BlockConfig(num_heads=H, causal=True),
], ids=["gpt_block", "named", "explicit"])
def test_language_model_is_causal(block):
    lm = _lm(block)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, T)), jnp.int32)
    params = lm.init(KEY, tokens)
    assert all("cross_attn" not in layer for layer in _layers({"params": params["params"]
                                                                ["decoder"]}))
    _assert_causal(jax.jit(lambda t: lm.apply(params, t)), tokens)


def test_bert_is_bidirectional():
    cfg = BertConfig(vocab_size=V, num_layers=1, embed_dim=D, block_size=T, pooler=False,
                     block=bert_block(H, mlp_dim=32, dropout_rate=0.0))
    assert cfg == BertConfig(vocab_size=V, num_layers=1, embed_dim=D, block_size=T, pooler=False,
                             block=bert_block(H, mlp_dim=32, dropout_rate=0.0))
    model = Bert(cfg)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, T)), jnp.int32)
    params = model.init(KEY, tokens)
    _assert_bidirectional(jax.jit(lambda t: model.apply(params, t)["hidden"]), tokens)


def test_encoder_decoder_model_decoder_is_causal_and_reads_the_source():
    cfg = TransformerConfig(src_vocab_size=V, num_layers=1, embed_dim=D,
                            block=vaswani_block(H, mlp_dim=32, dropout_rate=0.0))
    assert cfg.decoder_block.causal and cfg.decoder_block.cross_attention
    assert not cfg.block.causal and not cfg.block.cross_attention
    model = Transformer(cfg)
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(0, V, (2, S)), jnp.int32)
    tgt = jnp.asarray(rng.integers(0, V, (2, T)), jnp.int32)
    params = model.init(KEY, src, tgt)
    assert "cross_attn" in params["params"]["decoder"]["layers_0"]
    assert "cross_attn" not in params["params"]["encoder"]["layers_0"]
    apply = jax.jit(lambda s, t: model.apply(params, s, t))
    _assert_causal(lambda t: apply(src, t), tgt)
    y, y2 = np.asarray(apply(src, tgt)), np.asarray(apply(_changed_at(src, S - 1), tgt))
    assert np.all(np.abs(y2 - y).max(-1) > 1e-5)  # every target position reads the source


def test_model_configs_reject_a_block_that_disagrees():
    with pytest.raises(ValueError, match=r"`block.causal` of TransformerLMConfig must be True"):
        TransformerLMConfig(vocab_size=V, block=BlockConfig(num_heads=H))
    with pytest.raises(ValueError, match=r"`block.cross_attention` of TransformerLMConfig"):
        TransformerLMConfig(vocab_size=V, block=BlockConfig.decoder(H))
    with pytest.raises(ValueError, match="`block.use_rope`"):
        TransformerLMConfig(vocab_size=V, block=gpt_block(H), positions="rope")
    for config in (BertConfig, ViTConfig):
        with pytest.raises(ValueError, match=r"`block.causal`"):
            config(block=BlockConfig.decoder(H, cross_attention=False))
    with pytest.raises(ValueError, match=r"`block.causal` of TransformerConfig"):
        TransformerConfig(src_vocab_size=V, block=BlockConfig.decoder(H))
    with pytest.raises(TypeError, match="`block` of BertConfig must be a BlockConfig"):
        BertConfig(block={"num_heads": H})


# ------------------------------------------------------------------ replace, typed like __init__


def test_block_replace_names_an_unknown_field_and_validates_again():
    cfg = gpt_block(H)
    with pytest.raises(TypeError, match=r"`num_headz` \(did you mean `num_heads`\?\) is not a "
                                        r"field of BlockConfig; its fields are num_heads, "):
        cfg.replace(num_headz=4)
    with pytest.raises(TypeError, match=r"`num_headz` \(did you mean `num_heads`\?\), `zzz` are"):
        cfg.replace(num_headz=4, zzz=1)
    with pytest.raises(ValueError, match=r"`norm` must be one of \('pre', 'post'\); got 'middle'"):
        cfg.replace(norm="middle")
    with pytest.raises(ValueError, match="`num_kv_heads` must be a positive divisor"):
        cfg.replace(num_kv_heads=3)
    with pytest.raises(ValueError, match="`norm_epsilon` must be a number > 0 or None; got 'x'"):
        cfg.replace(norm_epsilon="x")
    assert cfg.replace(num_heads=4, norm="post") == gpt_block(4, norm="post")


def test_block_replace_keywords_are_the_fields_with_their_types():
    """``BlockOptions`` (the static type of ``replace``'s keywords) lists every field of
    BlockConfig with the field's annotation, so mypy checks ``replace`` as it checks
    ``BlockConfig(...)``."""
    import dataclasses

    from seqjax.nn._block_config import BlockOptions

    def text(annotation):
        return getattr(annotation, "__forward_arg__", annotation)

    fields = {f.name: f.type for f in dataclasses.fields(BlockConfig)}
    options = {k: text(v) for k, v in BlockOptions.__annotations__.items()}
    assert options == fields
    assert not BlockOptions.__required_keys__


@pytest.mark.parametrize("config", [
    TRANSFORMER_LM_PRESETS["nanogpt-cpu"], BertConfig(), TransformerConfig(src_vocab_size=V),
    ViTConfig()], ids=lambda c: type(c).__name__)
def test_model_config_replace_names_an_unknown_field(config):
    name = type(config).__name__
    with pytest.raises(TypeError, match=rf"{name}.replace: `num_layerz` \(did you mean "
                                        rf"`num_layers`\?\) is not a field of {name}"):
        config.replace(num_layerz=3)
    assert config.replace(num_layers=3).num_layers == 3


# ------------------------------------------------------------------ GPT-2's residual init


def _std(a):
    return float(np.std(np.asarray(a)))


def _gpt_configs():
    """Every GPT config the library builds: the presets (seqjax's and GPT-2's family of the
    Hugging Face loader, one of them re-sized) and each recipe's GPT."""
    from seqjax.experiments import bert_mlm, gpt2
    from seqjax.interop.hf_gpt2 import HF_GPT2_PRESETS

    yield from TRANSFORMER_LM_PRESETS.items()
    yield from HF_GPT2_PRESETS.items()
    yield "gpt2-small at 24 layers", TRANSFORMER_LM_PRESETS["gpt2-small"].replace(num_layers=24)
    yield "char_lm L=3", char_lm.build_model(
        char_lm.Config(model=gpt2.ModelOptions(num_layers=3))).config
    yield "bert_mlm's GPT", bert_mlm._lm_config(
        bert_mlm.Config(model=bert_mlm.ModelOptions(num_layers=5)), 40, 16)


def test_every_gpt_derives_its_residual_scale_from_its_own_depth():
    """Each GPT's residual projections start at 0.02/√(2L) for its own L: depth is stated
    once (``TransformerLMConfig.num_layers``); ``gpt_block`` refuses a second one."""
    names = []
    for name, cfg in _gpt_configs():
        want = cfg.init_std / math.sqrt(2 * cfg.num_layers)
        assert cfg.decoder_block.residual_init_std == pytest.approx(want, rel=1e-12), name
        names.append(name)
    assert len(names) >= 8
    with pytest.raises(TypeError, match="`num_layers`.*TransformerLMConfig.num_layers"):
        gpt_block(H, num_layers=2)


def test_residual_projections_start_at_gpt2_std():
    """nanoGPT / GPT-2: the attention output and the MLP output projections ~ N(0, σ²) with
    σ = 0.02/√(2L); every other kernel and the embeddings keep σ = 0.02. Also through the
    classifier, which shares the trunk, and for a depth set by ``replace``."""
    from seqjax.models import TransformerLMClassifier

    cfg = TRANSFORMER_LM_PRESETS["nanogpt-cpu"].replace(num_layers=3)  # D = 128
    want = 0.02 / math.sqrt(2 * 3)
    tokens = jnp.zeros((1, 8), jnp.int32)
    for model in (TransformerLM(cfg), TransformerLMClassifier(cfg, num_classes=2)):
        params = jax.jit(model.init)(KEY, tokens)["params"]
        for i in range(cfg.num_layers):
            layer = params["decoder"][f"layers_{i}"]
            assert _std(layer["self_attn"]["out"]["kernel"]) == pytest.approx(want, rel=0.05)
            assert _std(layer["ffn"]["down"]["kernel"]) == pytest.approx(want, rel=0.05)
            for kernel in (layer["self_attn"]["query"], layer["self_attn"]["value"],
                           layer["ffn"]["up"]):
                assert _std(kernel["kernel"]) == pytest.approx(0.02, rel=0.05)
        assert _std(params["token_embed"]["embedding"]) == pytest.approx(0.02, rel=0.05)
    # a block that states its own scale keeps it
    own = cfg.replace(block=cfg.block.replace(residual_init_std=0.001))
    assert own.decoder_block.residual_init_std == 0.001


def test_residual_init_is_opt_in_for_a_bare_block():
    """``residual_init_std=None`` (the default) in a block used outside a GPT: every kernel
    keeps the block's ``kernel_init``; a GLU's ``down`` follows the field too."""
    assert BlockConfig(num_heads=H).residual_init_std is None
    assert gpt_block(H).residual_init_std is None
    block = TransformerBlock(gpt_block(H))
    x = _x(1, 4, 64)
    p = jax.jit(block.init)(KEY, x)["params"]
    assert _std(p["self_attn"]["out"]["kernel"]) == pytest.approx(0.02, rel=0.1)
    assert _std(p["ffn"]["down"]["kernel"]) == pytest.approx(0.02, rel=0.1)
    glu = GLU(mlp_dim=256, kernel_init=jax.nn.initializers.normal(0.02),
              out_kernel_init=jax.nn.initializers.normal(0.001))
    p = glu.init(KEY, x)["params"]
    assert _std(p["down"]["kernel"]) == pytest.approx(0.001, rel=0.1)
    assert _std(p["gate"]["kernel"]) == pytest.approx(0.02, rel=0.1)
    for bad in (-0.01, float("nan"), float("inf"), "0.02"):
        with pytest.raises(ValueError, match="`residual_init_std` must be a finite number >= 0"):
            BlockConfig(num_heads=H, residual_init_std=bad)


def test_zero_residual_init_starts_every_block_as_the_identity():
    """``residual_init_std=0.0`` (modded-nanogpt): the attention ``out`` (self and cross) and
    FFN ``down`` kernels start at exactly zero, no other kernel does, and a GPT's trunk at init
    is its embedding: the logits are the head on RMSNorm(E[x]), in numpy (soft-capped here)."""
    block = gpt_block(H, use_rope=True, qk_norm=True, norm_type="rmsnorm",
                      activation="relu_squared", use_bias=False, residual_init_std=0.0)
    cfg = TransformerLMConfig(vocab_size=V, num_layers=2, embed_dim=D, block_size=T,
                              positions="rope", tie_embeddings=False, logit_softcap=15.0,
                              block=block)
    assert cfg.decoder_block.residual_init_std == 0.0  # 0.0 is kept, not taken for "unset"
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, T)), jnp.int32)
    model = TransformerLM(cfg)
    p = jax.jit(model.init)(KEY, tokens)["params"]
    cross = TransformerBlock(BlockConfig.decoder(H, residual_init_std=0.0))
    p_cross = jax.jit(cross.init)(KEY, _x(1, 3, D), encoder_out=_x(1, 4, D))["params"]
    for tree in (p, p_cross):
        kernels = {"/".join(k.key for k in path): np.asarray(a)
                   for path, a in jax.tree_util.tree_flatten_with_path(tree)[0]
                   if path[-1].key == "kernel"}
        for name, a in kernels.items():
            assert (a == 0).all() == name.endswith(("out/kernel", "down/kernel")), name
    assert "cross_attn/out/kernel" in kernels
    e = np.asarray(p["token_embed"]["embedding"], np.float64)[np.asarray(tokens)]
    h = e / np.sqrt(np.mean(e**2, -1, keepdims=True) + 1e-6) * p["decoder"]["final_norm"]["scale"]
    z = h @ np.asarray(p["lm_head"]["kernel"], np.float64)
    np.testing.assert_allclose(model.apply({"params": p}, tokens), 15.0 * np.tanh(z / 15.0),
                               rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ one spelling per option


def test_old_option_spellings_are_refused_naming_the_new_one():
    cfg = TransformerConfig(src_vocab_size=V, tie_embeddings=False, output_bias=False)
    assert not cfg.tie_embeddings and not cfg.output_bias
    with pytest.raises(TypeError, match=r"TransformerConfig\(\): `tie_output` \(renamed "
                                        r"`tie_embeddings`\)"):
        TransformerConfig(src_vocab_size=V, tie_output=False)
    with pytest.raises(TypeError, match=r"`tie_output` \(renamed `tie_embeddings`\)"):
        cfg.replace(tie_output=True)
    with pytest.raises(TypeError, match=r"`hidden_dim` \(renamed `mlp_dim`\)"):
        BlockConfig(num_heads=H).replace(hidden_dim=8)  # type: ignore[call-arg]
    for ffn in (MLP, GLU):
        with pytest.raises(TypeError, match=r"`hidden_dim` \(renamed `mlp_dim`\)"):
            ffn(hidden_dim=8)  # type: ignore[call-arg]
        assert ffn(mlp_dim=8).mlp_dim == 8
    with pytest.raises(TypeError, match=r"`num_headz` \(did you mean `num_heads`\?\)"):
        BlockConfig(num_heads=H).replace(num_headz=4)  # type: ignore[call-arg]


def test_the_context_length_is_block_size_in_every_model_config():
    """The position table's length is ``block_size`` as in the recipes; ``max_len`` (the
    decoding cache's capacity) is refused by each config, naming the field."""
    for cfg in (TransformerLMConfig(vocab_size=V, block_size=12),
                BertConfig(vocab_size=V, block_size=12),
                TransformerConfig(src_vocab_size=V, block_size=12)):
        assert cfg.block_size == 12
        with pytest.raises(TypeError, match=r"`max_len` \(renamed `block_size`\)"):
            type(cfg)(**{f: getattr(cfg, f) for f in ("vocab_size", "src_vocab_size")
                         if hasattr(cfg, f)}, max_len=12)
        with pytest.raises(TypeError, match=r"\.replace: `max_len` \(renamed `block_size`\)"):
            cfg.replace(max_len=8)


def test_every_config_names_the_new_spelling_of_an_old_one():
    """The constructor of every config class of the library, not only ``replace``."""
    from seqjax.models import ASTConfig, RNNLMConfig, ViTConfig
    from seqjax.train.optim import OptimizerConfig
    from seqjax.train.word2vec import Word2VecConfig

    with pytest.raises(TypeError, match=r"TransformerLMConfig\(\): `tie_output` \(renamed "
                                        r"`tie_embeddings`\)"):
        TransformerLMConfig(vocab_size=V, tie_output=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"BlockConfig\(\): `hidden_dim` \(renamed `mlp_dim`\)"):
        BlockConfig(num_heads=H, hidden_dim=8)  # type: ignore[call-arg]
    for cls in (BertConfig, ViTConfig, ASTConfig, RNNLMConfig, OptimizerConfig, Word2VecConfig):
        with pytest.raises(TypeError, match=rf"{cls.__name__}\(\): `tie_weights` .*is not a "
                                            rf"field of {cls.__name__}"):
            cls(tie_weights=True)  # type: ignore[call-arg]


def test_every_config_class_has_one_base():
    """Each config class of the library is a frozen, keyword-only dataclass on
    ``ConfigBase``: ``replace`` validates again, a positional argument is refused naming the
    fields, a bad value is refused by ``__post_init__`` in both."""
    import dataclasses
    import inspect

    import seqjax.models
    import seqjax.nn
    import seqjax.train
    from seqjax._checks import ConfigBase
    from seqjax.train.optim import OptimizerConfig
    from seqjax.train.word2vec import Word2VecConfig

    found = {obj for module in (seqjax.nn, seqjax.models, seqjax.train)
             for _, obj in inspect.getmembers(module, inspect.isclass)
             if obj.__name__.endswith("Config")} | {Word2VecConfig}
    assert len(found) == 15, sorted(c.__name__ for c in found)
    for cls in found:
        assert issubclass(cls, ConfigBase), cls
        params = dataclasses.fields(cls)
        assert all(f.kw_only for f in params), cls
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"OptimizerConfig\(\) takes keyword arguments only; "
                                        r"got 2 positional \('adamw', 0.001\)\. Its fields "
                                        r"are name, learning_rate, "):
        OptimizerConfig("adamw", 1e-3)  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"TransformerLMConfig\(\) takes keyword arguments"):
        TransformerLMConfig(V)  # type: ignore[misc]
    cfg = OptimizerConfig(name="sgd", learning_rate=0.5)
    assert cfg.replace(learning_rate=0.25) == OptimizerConfig(name="sgd", learning_rate=0.25)
    with pytest.raises(ValueError, match="learning_rate"):
        cfg.replace(learning_rate=-1.0)
    with pytest.raises(ValueError, match="learning_rate"):
        OptimizerConfig(learning_rate=-1.0)


@pytest.mark.parametrize("build", [
    lambda block, **dt: TransformerLM(TransformerLMConfig(
        vocab_size=V, num_layers=1, embed_dim=D, block_size=8, block=block(gpt_block(H))), **dt),
    lambda block, **dt: Bert(BertConfig(
        vocab_size=V, num_layers=1, embed_dim=D, block_size=8, block=block(bert_block(H))), **dt),
    lambda block, **dt: Transformer(TransformerConfig(
        src_vocab_size=V, num_layers=1, embed_dim=D, block=block(vaswani_block(H))), **dt),
], ids=["gpt", "bert", "transformer"])
def test_a_block_dtype_that_disagrees_with_the_model_is_refused(build):
    tokens = jnp.ones((1, 4), jnp.int32)

    def init(block, **dtypes):
        model = build(block, **dtypes)
        args = (tokens, tokens) if isinstance(model, Transformer) else (tokens,)
        return jax.eval_shape(model.init, KEY, *args)

    # the block's defaults or the model's own dtypes: built in the model's
    init(lambda b: b, dtype=jnp.bfloat16)
    init(lambda b: b.replace(dtype=jnp.bfloat16), dtype=jnp.bfloat16)
    v = init(lambda b: b.replace(param_dtype=jnp.bfloat16), param_dtype=jnp.bfloat16)
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(v)} == {jnp.dtype(jnp.bfloat16)}
    with pytest.raises(ValueError, match=r"`block.dtype` of \w+Config is float16 but the "
                                         r"model computes in bfloat16"):
        init(lambda b: b.replace(dtype=jnp.float16), dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match=r"`block.dtype` .* is float16 .* computes in None"):
        init(lambda b: b.replace(dtype=jnp.float16))
    with pytest.raises(ValueError, match=r"`block.param_dtype` .* is bfloat16 .* float32 .*"
                                         r"param_dtype=bfloat16"):
        init(lambda b: b.replace(param_dtype=jnp.bfloat16))

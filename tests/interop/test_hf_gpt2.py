"""GPT-2 checkpoints: numpy reference, transformers parity (logits, greedy decoding), errors."""

import copy
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # never touch the network

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402

from seqjax.decoding import greedy_search  # noqa: E402
from seqjax.interop.hf_gpt2 import gpt2_config_from_hf, load_hf_gpt2  # noqa: E402
from seqjax.models.gpt import TransformerLMConfig, gpt_block  # noqa: E402

L, H, D, V, P = 2, 4, 64, 100, 32
# One compiled forward per model config, shared by every test (the module is hashable).
_logits = jax.jit(lambda model, variables, tokens: model.apply(variables, tokens),
                  static_argnums=0)
HF_CONFIG = dict(model_type="gpt2", n_layer=L, n_head=H, n_embd=D, vocab_size=V, n_positions=P,
                 activation_function="gelu_new", layer_norm_epsilon=1e-5, initializer_range=0.3)
TOKENS = np.random.default_rng(0).integers(0, V, (3, 11))  # one shape: one compiled forward


def _np_checkpoint(seed=0, prefix="transformer."):
    """Random tensors under GPT-2's names (Conv1D weights are [in, out])."""
    rng = np.random.default_rng(seed)
    t = lambda *s, std=0.3: (rng.normal(size=s) * std).astype(np.float32)  # noqa: E731
    out = {"wte.weight": t(V, D), "wpe.weight": t(P, D),
           "ln_f.weight": 1 + t(D, std=0.1), "ln_f.bias": t(D, std=0.1)}
    for i in range(L):
        p = f"h.{i}."
        out.update({
            p + "ln_1.weight": 1 + t(D, std=0.1), p + "ln_1.bias": t(D, std=0.1),
            p + "attn.c_attn.weight": t(D, 3 * D), p + "attn.c_attn.bias": t(3 * D, std=0.1),
            p + "attn.c_proj.weight": t(D, D), p + "attn.c_proj.bias": t(D, std=0.1),
            p + "ln_2.weight": 1 + t(D, std=0.1), p + "ln_2.bias": t(D, std=0.1),
            p + "mlp.c_fc.weight": t(D, 4 * D), p + "mlp.c_fc.bias": t(4 * D, std=0.1),
            p + "mlp.c_proj.weight": t(4 * D, D), p + "mlp.c_proj.bias": t(D, std=0.1),
        })
    return {prefix + k: v for k, v in out.items()}


def _write(directory, tensors, config=HF_CONFIG):
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    return directory


def _np_gpt2_logits(w, tokens, eps=1e-5):
    """GPT-2 forward in float64 numpy, straight from the checkpoint's tensors."""
    w = {k.removeprefix("transformer."): np.asarray(v, np.float64) for k, v in w.items()}

    def ln(x, name):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    def gelu_tanh(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    b, t = tokens.shape
    x = w["wte.weight"][tokens] + w["wpe.weight"][np.arange(t)]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(L):
        p = f"h.{i}."
        qkv = ln(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (a.reshape(b, t, H, D // H) for a in np.split(qkv, 3, axis=-1))
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H)
        s = np.where(causal, s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        ctx = np.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, D)
        x = x + ctx @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        hdn = gelu_tanh(ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + hdn @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ w["wte.weight"].T


def test_matches_numpy_reference_and_drops_mask_buffers(tmp_path):
    tensors = _np_checkpoint()
    # Older checkpoints also store the causal-mask buffers; they are not parameters.
    tensors["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, P, P), np.float32))
    tensors["transformer.h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
    model, variables = load_hf_gpt2(_write(tmp_path, tensors))
    assert model.config.block.activation == "gelu_tanh" and model.config.tie_embeddings
    logits = _logits(model, variables, jnp.asarray(TOKENS))
    np.testing.assert_allclose(np.asarray(logits), _np_gpt2_logits(tensors, TOKENS),
                               atol=1e-4, rtol=1e-4)


def test_config_from_hf():
    cfg = gpt2_config_from_hf({**HF_CONFIG, "n_inner": 96, "tie_word_embeddings": False})
    assert (cfg.num_layers, cfg.block.num_heads, cfg.embed_dim, cfg.block.mlp_dim,
            cfg.block_size) == (L, H, D, 96, P)
    assert not cfg.tie_embeddings and cfg.positions == "learned" and cfg.block.use_bias


# --------------------------------------------------------------------------- errors


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="explicitly"):
        load_hf_gpt2(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf_gpt2(tmp_path / "nowhere")


def test_preset_when_no_config(tmp_path):
    d = _write(tmp_path, _np_checkpoint(prefix=""), config=None)  # GPT2Model names, no prefix
    with pytest.raises(FileNotFoundError, match="preset"):
        load_hf_gpt2(d)
    preset = TransformerLMConfig(vocab_size=V, num_layers=L, embed_dim=D, block_size=P,
                                 block=gpt_block(H, activation="gelu_tanh"))
    model, variables = load_hf_gpt2(d, preset=preset)
    assert variables["params"]["pos_embed"]["embedding"].shape == (P, D)
    with pytest.raises(ValueError, match="gpt2-medium"):
        load_hf_gpt2(d, preset="gpt-17")
    with pytest.raises(ValueError, match="(wte.weight|wpe.weight).*(50257|1024)"):
        load_hf_gpt2(d, preset="gpt2")  # the real gpt2's shapes do not fit this checkpoint


def test_missing_tensor(tmp_path):
    tensors = _np_checkpoint()
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(ValueError, match=r"missing tensor 'transformer\.h\.1\.mlp\.c_fc\.bias'"):
        load_hf_gpt2(_write(tmp_path, tensors))


def test_unexpected_tensor(tmp_path):
    tensors = _np_checkpoint()
    tensors["transformer.h.0.attn.rotary.weight"] = np.zeros((4,), np.float32)
    with pytest.raises(ValueError, match=r"unexpected.*h\.0\.attn\.rotary\.weight"):
        load_hf_gpt2(_write(tmp_path, tensors))


def test_shape_mismatch(tmp_path):
    tensors = _np_checkpoint()
    tensors["transformer.wpe.weight"] = tensors["transformer.wpe.weight"][:16]
    with pytest.raises(ValueError, match=r"'transformer\.wpe\.weight'.*\(32, 64\).*\(16, 64\)"):
        load_hf_gpt2(_write(tmp_path, tensors))


def test_unsupported_config(tmp_path):
    for change, field in (({"scale_attn_by_inverse_layer_idx": True},
                           "scale_attn_by_inverse_layer_idx"),
                          ({"layer_norm_epsilon": 0.0}, "layer_norm_epsilon"),
                          ({"activation_function": "mish"}, "activation_function"),
                          ({"model_type": "llama"}, "model_type")):
        with pytest.raises(ValueError, match=field):
            gpt2_config_from_hf({**HF_CONFIG, **change})


def test_layer_norm_epsilon_is_the_blocks_norm_epsilon(tmp_path):
    assert gpt2_config_from_hf(HF_CONFIG).block.norm_epsilon is None  # LayerNorm's 1e-5
    tensors = _np_checkpoint()
    d = _write(tmp_path, tensors, {**HF_CONFIG, "layer_norm_epsilon": 0.5})
    model, variables = load_hf_gpt2(d)
    assert model.config.block.norm_epsilon == 0.5
    got = np.asarray(_logits(model, variables, jnp.asarray(TOKENS)))
    np.testing.assert_allclose(got, _np_gpt2_logits(tensors, TOKENS, eps=0.5), atol=1e-4,
                               rtol=1e-4)
    assert not np.allclose(got, _np_gpt2_logits(tensors, TOKENS), atol=1e-2)  # ε matters


def test_untied_head(tmp_path):
    tensors = _np_checkpoint()
    head = np.random.default_rng(3).normal(size=(V, D)).astype(np.float32)
    tensors["lm_head.weight"] = head
    with pytest.raises(ValueError, match="tie_embeddings=False"):
        load_hf_gpt2(_write(tmp_path / "tied", tensors))
    d = _write(tmp_path / "untied", tensors, {**HF_CONFIG, "tie_word_embeddings": False})
    model, variables = load_hf_gpt2(d)
    assert not model.config.tie_embeddings
    np.testing.assert_array_equal(np.asarray(variables["params"]["lm_head"]["kernel"]), head.T)
    del tensors["lm_head.weight"]
    with pytest.raises(ValueError, match="lm_head.weight"):
        load_hf_gpt2(_write(tmp_path / "nohead", tensors,
                            {**HF_CONFIG, "tie_word_embeddings": False}))


# --------------------------------------------------------------------------- transformers parity


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=L, n_head=H, n_embd=D, vocab_size=V, n_positions=P,
        initializer_range=HF_CONFIG["initializer_range"], bos_token_id=None, eos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    directory = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(directory, safe_serialization=True)
    return torch, model, directory


def test_logits_match_transformers(hf_gpt2):
    torch, ref, directory = hf_gpt2
    model, variables = load_hf_gpt2(directory)
    with torch.no_grad():
        want = ref(torch.from_numpy(TOKENS)).logits.numpy()
    got = _logits(model, variables, jnp.asarray(TOKENS))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=0)


def test_greedy_matches_transformers(hf_gpt2):
    torch, ref, directory = hf_gpt2
    model, variables = load_hf_gpt2(directory)
    prompt = np.random.default_rng(1).integers(0, V, (3, 9))
    lengths = np.array([9, 4, 6])
    new = 12
    got = np.asarray(greedy_search(model, variables, jnp.asarray(prompt), jnp.asarray(lengths),
                                   max_new_tokens=new).tokens)
    for b, n in enumerate(lengths):
        ids = torch.from_numpy(prompt[b:b + 1, :n])
        with torch.no_grad():
            want = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                do_sample=False, pad_token_id=0)[0, n:].numpy()
        np.testing.assert_array_equal(got[b], want, err_msg=f"row {b} (prompt length {n})")
    assert len(set(got.ravel().tolist())) > 3  # a real continuation, not one repeated token


def _flat(variables):
    leaves = jax.tree_util.tree_flatten_with_path(variables)[0]
    return {jax.tree_util.keystr(k): np.asarray(a) for k, a in leaves}


def test_bin_shards_bf16_and_scan_layers(hf_gpt2, tmp_path):
    torch, ref, directory = hf_gpt2
    _, base = load_hf_gpt2(directory)
    want = _flat(base)
    # A PyTorch state dict, read with torch.load(weights_only=True) when handed explicitly.
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    _, from_bin = load_hf_gpt2(tmp_path / "pytorch_model.bin")
    # Sharded safetensors with an index file.
    sharded = tmp_path / "sharded"
    ref.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    _, from_shards = load_hf_gpt2(sharded)
    for other in (from_bin, from_shards):
        got = _flat(other)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # bfloat16 tensors (numpy has no bf16 dtype): read exactly, stored as float32.
    half = tmp_path / "bf16"
    copy.deepcopy(ref).to(torch.bfloat16).save_pretrained(half)
    _, from_bf16 = load_hf_gpt2(half)
    wte = from_bf16["params"]["token_embed"]["embedding"]
    assert wte.dtype == jnp.float32
    np.testing.assert_array_equal(
        np.asarray(wte), ref.transformer.wte.weight.detach().to(torch.bfloat16).float().numpy())
    # scan_layers stacks the per-layer parameters; the model computes the same logits.
    scanned, sv = load_hf_gpt2(directory, scan_layers=True)
    assert sv["params"]["decoder"]["layers"]["ffn"]["up"]["kernel"].shape == (L, D, 4 * D)
    model, _ = load_hf_gpt2(directory)
    np.testing.assert_allclose(np.asarray(_logits(scanned, sv, jnp.asarray(TOKENS))),
                               np.asarray(_logits(model, base, jnp.asarray(TOKENS))), atol=1e-5)

r"""Load Hugging Face GPT-2 checkpoints into :class:`~seqjax.models.gpt.TransformerLM`.

GPT-2 (Radford et al. 2019) is the pre-norm decoder-only transformer of Bishop §12.3.1
and J&M §9.8: learned absolute positions, tanh-approximated GELU (``gelu_new``),
LayerNorm ``ε = 10⁻⁵``, biases everywhere and the output matrix tied to the token
embedding, :math:`p(x_{n+1}\mid x_{\le n}) = \mathrm{softmax}(\mathrm{LN}(X^{(L)}_n) E^\top)`.

Weight mapping. GPT-2's ``Conv1D`` stores ``W: [in, out]`` (already Flax's layout, no
transpose); the fused ``c_attn`` computes ``[Q | K | V] = X W + b`` with
``W: [D, 3D]``, split into three ``[D, D]`` blocks, each reshaped per head
``[D, H, d]`` (``D = H·d``, head ``h`` = columns ``h·d … (h+1)·d - 1``):

=============================================  ============================================
Hugging Face (``transformer.`` prefix optional)  seqjax ``TransformerLM`` parameter
=============================================  ============================================
``wte.weight [V, D]``                          ``token_embed/embedding``
``wpe.weight [P, D]``                          ``pos_embed/embedding``
``h.i.ln_1``                                   ``decoder/layers_i/self_attn_norm``
``h.i.attn.c_attn [D, 3D]``                    ``…/self_attn/{query,key,value}`` ``[D, H, d]``
``h.i.attn.c_proj [D, D]``                     ``…/self_attn/out``: ``W.reshape(H, d, D)``
``h.i.ln_2``                                   ``…/ffn_norm``
``h.i.mlp.c_fc [D, F]`` / ``h.i.mlp.c_proj``   ``…/ffn/up`` / ``…/ffn/down``
``ln_f``                                       ``decoder/final_norm``
``lm_head.weight [V, D]`` (only if untied)     ``lm_head/kernel = Wᵀ``
=============================================  ============================================

The causal-mask buffers ``h.i.attn.bias`` / ``h.i.attn.masked_bias`` of older
checkpoints are dropped; any other unused tensor is an error. Decoding goes through
:mod:`seqjax.decoding` with the model's KV cache, e.g.
``greedy_search(model, variables, prompt, max_new_tokens=20)``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.interop.safetensors_io import Checkpoint, check_params_like, read_config
from seqjax.models.gpt import TRANSFORMER_LM_PRESETS, TransformerLM, TransformerLMConfig, gpt_block

Dtype = Any
PathLike = Any

__all__ = ["HF_GPT2_PRESETS", "gpt2_config_from_hf", "load_hf_gpt2"]

_GPT2 = dict(vocab_size=50257, max_len=1024, tie_embeddings=True, positions="learned")


def _gpt2(num_layers: int, num_heads: int, embed_dim: int) -> TransformerLMConfig:
    block = gpt_block(num_heads, activation="gelu_tanh", use_bias=True, dropout_rate=0.1)
    return TransformerLMConfig(num_layers=num_layers, embed_dim=embed_dim, block=block, **_GPT2)


#: GPT-2 family shapes, for directories without a ``config.json`` (``openai-community/``
#: prefixes are ignored). The seqjax presets of
#: :data:`~seqjax.models.gpt.TRANSFORMER_LM_PRESETS` are accepted too.
HF_GPT2_PRESETS: dict[str, TransformerLMConfig] = {
    "gpt2": _gpt2(12, 12, 768),
    "gpt2-medium": _gpt2(24, 16, 1024),
    "gpt2-large": _gpt2(36, 20, 1280),
    "gpt2-xl": _gpt2(48, 25, 1600),
    "distilgpt2": _gpt2(6, 12, 768),
}

_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
}

#: LayerNorm ε that seqjax's TransformerLM uses (its config has no ε field).
_SEQJAX_LN_EPS = 1e-5


def gpt2_config_from_hf(hf: dict) -> TransformerLMConfig:
    """A :class:`~seqjax.models.gpt.TransformerLMConfig` from a GPT-2 ``config.json`` dict.

    Options that seqjax's TransformerLM cannot express are a ``ValueError`` naming the
    field: ``scale_attn_by_inverse_layer_idx``, ``scale_attn_weights=false``,
    ``add_cross_attention``, a ``layer_norm_epsilon`` other than ``1e-5``.

    Example:
        >>> cfg = gpt2_config_from_hf({"n_embd": 64, "n_layer": 2, "n_head": 4,
        ...                            "vocab_size": 100, "n_positions": 32})
        >>> cfg.block.activation, cfg.block.mlp_dim, cfg.tie_embeddings
        ('gelu_tanh', 256, True)
    """
    model_type = hf.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise ValueError(f"config `model_type` must be 'gpt2'; got {model_type!r}.")
    for field, ok in (("scale_attn_by_inverse_layer_idx", False), ("add_cross_attention", False),
                      ("scale_attn_weights", True)):
        if bool(hf.get(field, ok)) != ok:
            raise ValueError(
                f"config `{field}` must be {str(ok).lower()} for seqjax's TransformerLM; "
                f"got {hf[field]!r}."
            )
    eps = float(hf.get("layer_norm_epsilon", _SEQJAX_LN_EPS))
    if not np.isclose(eps, _SEQJAX_LN_EPS, rtol=1e-6, atol=0.0):
        raise ValueError(
            f"config `layer_norm_epsilon` must be {_SEQJAX_LN_EPS} (TransformerLM has no "
            f"epsilon option); got {eps}."
        )
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise ValueError(
            f"config `activation_function` must be one of {sorted(_ACTIVATIONS)}; got {act!r}."
        )
    try:
        d, heads = int(hf["n_embd"]), int(hf["n_head"])
        layers, std = int(hf["n_layer"]), float(hf.get("initializer_range", 0.02))
        vocab, max_len = int(hf["vocab_size"]), int(hf.get("n_positions", hf.get("n_ctx", 1024)))
    except KeyError as e:
        raise ValueError(f"GPT-2 config.json is missing the field {e.args[0]!r}.") from None
    if d % heads:
        raise ValueError(f"config `n_embd` {d} must be divisible by `n_head` {heads}.")
    block = gpt_block(
        heads,
        init_std=std,
        mlp_dim=int(hf.get("n_inner") or 4 * d),
        use_bias=True,
        dropout_rate=float(hf.get("resid_pdrop", 0.1)),
        attention_dropout_rate=float(hf.get("attn_pdrop", 0.1)),
        activation=_ACTIVATIONS[act],
    )
    return TransformerLMConfig(
        vocab_size=vocab,
        num_layers=layers,
        embed_dim=d,
        max_len=max_len,
        block=block,
        positions="learned",
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        init_std=std,
    )


def _preset(name: Any) -> TransformerLMConfig:
    if isinstance(name, TransformerLMConfig):
        return name
    presets = {**TRANSFORMER_LM_PRESETS, **HF_GPT2_PRESETS}
    key = name if name in presets else str(name).rsplit("/", 1)[-1]
    if key not in presets:
        raise ValueError(f"`preset` must be a TransformerLMConfig or one of {sorted(presets)}; "
                         f"got {name!r}.")
    return presets[key]


def _check_supported(cfg: TransformerLMConfig) -> None:
    """The GPT-2 layout needs learned positions, biases, a plain MLP, LayerNorm and MHA."""
    for field, want in (("positions", "learned"), ("block.use_bias", True), ("block.mlp", "mlp"),
                        ("block.norm_type", "layernorm"), ("block.num_kv_heads", None)):
        owner, _, name = field.rpartition(".")
        got = getattr(cfg.block if owner else cfg, name)
        if got != want:
            raise ValueError(
                f"GPT-2 checkpoints need TransformerLMConfig.{field}={want!r}; got {got!r}."
            )


def _norm(ckpt: Checkpoint, prefix: str, d: int) -> dict:
    return {"scale": ckpt.take(prefix + ".weight", (d,)), "bias": ckpt.take(prefix + ".bias", (d,))}


def _conv1d(ckpt: Checkpoint, prefix: str, d_in: int, d_out: int) -> dict:
    return {"kernel": ckpt.take(prefix + ".weight", (d_in, d_out)),
            "bias": ckpt.take(prefix + ".bias", (d_out,))}


def _layer(ckpt: Checkpoint, i: int, cfg: TransformerLMConfig) -> dict:
    d, h = cfg.embed_dim, cfg.block.num_heads
    f, hd = cfg.block.mlp_dim or 4 * d, d // h
    pre = f"h.{i}."
    w_qkv = ckpt.take(pre + "attn.c_attn.weight", (d, 3 * d))
    b_qkv = ckpt.take(pre + "attn.c_attn.bias", (3 * d,))
    attn = {
        name: {"kernel": w_qkv[:, j * d:(j + 1) * d].reshape(d, h, hd),
               "bias": b_qkv[j * d:(j + 1) * d].reshape(h, hd)}
        for j, name in enumerate(("query", "key", "value"))
    }
    proj = _conv1d(ckpt, pre + "attn.c_proj", d, d)
    attn["out"] = {"kernel": proj["kernel"].reshape(h, hd, d), "bias": proj["bias"]}
    return {
        "self_attn": attn,
        "self_attn_norm": _norm(ckpt, pre + "ln_1", d),
        "ffn": {"up": _conv1d(ckpt, pre + "mlp.c_fc", d, f),
                "down": _conv1d(ckpt, pre + "mlp.c_proj", f, d)},
        "ffn_norm": _norm(ckpt, pre + "ln_2", d),
    }


def _gpt2_params(ckpt: Checkpoint, cfg: TransformerLMConfig) -> tuple[dict, TransformerLMConfig]:
    ckpt.strip_prefix(("transformer.",), "wte.weight")
    ckpt.ignore(lambda k: k.startswith("h.") and k.endswith((".attn.bias", ".attn.masked_bias")))
    v, d = cfg.vocab_size, cfg.embed_dim
    wte = ckpt.take("wte.weight", (v, d))
    layers = {f"layers_{i}": _layer(ckpt, i, cfg) for i in range(cfg.num_layers)}
    if cfg.scan_layers:
        layers = {"layers": jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers.values())}
    params: dict[str, Any] = {
        "token_embed": {"embedding": wte},
        "pos_embed": {"embedding": ckpt.take("wpe.weight", (cfg.max_len, d))},
        "decoder": {**layers, "final_norm": _norm(ckpt, "ln_f", d)},
    }
    if ckpt.has("lm_head.weight"):
        head = ckpt.take("lm_head.weight", (v, d))
        tied = np.array_equal(head, wte)
        if cfg.tie_embeddings and not tied:
            raise ValueError(
                "tensor 'lm_head.weight' differs from 'wte.weight' but the config ties them "
                "(tie_word_embeddings); pass tie_embeddings=False to load it untied."
            )
        if not tied or not cfg.tie_embeddings:
            params["lm_head"] = {"kernel": head.T}
            cfg = cfg.replace(tie_embeddings=False)
    elif not cfg.tie_embeddings:
        ckpt.take("lm_head.weight", (v, d))  # raises: an untied head must be in the file
    ckpt.finish()
    return params, cfg


def load_hf_gpt2(
    path: PathLike,
    preset: str | TransformerLMConfig | None = None,
    *,
    dtype: Dtype | None = None,
    param_dtype: Dtype = jnp.float32,
    **overrides: Any,
) -> tuple[TransformerLM, dict]:
    """Load a Hugging Face GPT-2 checkpoint as ``(TransformerLM, variables)``.

    Args:
        path: a checkpoint directory (``model.safetensors`` or sharded safetensors, and
            ``config.json``), or a weights file (``.safetensors``, or a PyTorch ``.bin``
            read with ``torch.load(weights_only=True)``).
        preset: a name in :data:`HF_GPT2_PRESETS` (``"gpt2"``, ``"distilgpt2"``, …) or
            :data:`~seqjax.models.gpt.TRANSFORMER_LM_PRESETS`, or a
            :class:`~seqjax.models.gpt.TransformerLMConfig`; used instead of
            ``config.json`` (needed when the directory has none).
        dtype, param_dtype: compute and storage dtypes.
        overrides: config fields to change (``scan_layers=True``, ``implementation``, …).

    Returns:
        ``(model, {"params": ...})``; ``model.apply(variables, tokens)`` gives the logits
        ``[B, T, V]`` of ``GPT2LMHeadModel``, and :mod:`seqjax.decoding` generates with the
        KV cache. The BPE tokenizer is not part of the model: load ``tokenizer.json`` with
        :func:`seqjax.data.tokenizers.load_tokenizer` if the directory has one.

    Raises:
        FileNotFoundError: no weights, or no ``config.json`` and no ``preset``.
        ValueError: a missing, unexpected or wrongly shaped tensor (named, expected vs
            actual shape), or a configuration TransformerLM cannot express.

    Example:
        >>> model, variables = load_hf_gpt2("path/to/gpt2")  # doctest: +SKIP
        >>> from seqjax.decoding import greedy_search  # doctest: +SKIP
        >>> greedy_search(model, variables, prompt_BxT, max_new_tokens=20).tokens  # doctest: +SKIP
    """
    ckpt = Checkpoint.open(path)
    if preset is not None:
        cfg = _preset(preset)
    else:
        hf = read_config(ckpt.directory)
        if hf is None:
            raise FileNotFoundError(
                f"no config.json in {str(ckpt.directory)!r}; pass `preset` (one of "
                f"{sorted({**TRANSFORMER_LM_PRESETS, **HF_GPT2_PRESETS})} or a "
                "TransformerLMConfig)."
            )
        cfg = gpt2_config_from_hf(hf)
    if overrides:
        cfg = cfg.replace(**overrides)
    _check_supported(cfg)
    params, cfg = _gpt2_params(ckpt, cfg)
    model = TransformerLM(cfg, dtype=dtype, param_dtype=param_dtype)
    expected = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))
    check_params_like(params, expected["params"], "GPT-2")
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, param_dtype), params)
    return model, {"params": params}

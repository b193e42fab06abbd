r"""Hugging Face GPT-2 checkpoints to and from :class:`~seqjax.models.gpt.TransformerLM`.

GPT-2 (Radford et al. 2019) is the pre-norm decoder-only transformer of Bishop §12.3.1 and
J&M §9.8: learned absolute positions, tanh-approximated GELU (``gelu_new``), LayerNorm
``ε = 10⁻⁵`` (another ``layer_norm_epsilon`` is ``block.norm_epsilon``), biases everywhere and
the output matrix tied to the token embedding,
:math:`p(x_{n+1}\mid x_{\le n}) = \mathrm{softmax}(\mathrm{LN}(X^{(L)}_n) E^\top)`.

Weight mapping. GPT-2's ``Conv1D`` stores ``W: [in, out]`` (Flax's layout, no transpose); the
fused ``c_attn`` computes ``[Q | K | V] = X W + b`` with ``W: [D, 3D]``, split into three
``[D, D]`` blocks, each reshaped to ``[D, H, d]`` (``D = H·d``, head ``h`` = columns
``h·d … (h+1)·d - 1``):

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

The causal-mask buffers ``h.i.attn.bias``/``h.i.attn.masked_bias`` of older checkpoints are
dropped; any other unused tensor is an error. The same table read backwards writes a
TransformerLM as GPT-2 (:func:`gpt2_params_to_hf`, :func:`gpt2_config_to_hf`; the folder:
:func:`seqjax.interop.hf_export.export_gpt2`, ``seqjax export``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.interop import _hf_common as common
from seqjax.interop.safetensors_io import Checkpoint, PathLike, check_params_like
from seqjax.models.gpt import TRANSFORMER_LM_PRESETS, TransformerLM, TransformerLMConfig, gpt_block

Dtype = Any

__all__ = ["HF_GPT2_PRESETS", "gpt2_config_from_hf", "gpt2_config_to_hf", "gpt2_params_to_hf",
           "load_hf_gpt2"]

def _gpt2(num_layers: int, num_heads: int, embed_dim: int) -> TransformerLMConfig:
    block = gpt_block(num_heads, activation="gelu_tanh", use_bias=True, dropout_rate=0.1)
    return TransformerLMConfig(vocab_size=50257, num_layers=num_layers, embed_dim=embed_dim,
                               block_size=1024, block=block, tie_embeddings=True,
                               positions="learned")


#: GPT-2 family shapes, for directories without ``config.json`` (``openai-community/``
#: prefixes ignored); :data:`~seqjax.models.gpt.TRANSFORMER_LM_PRESETS` work too.
HF_GPT2_PRESETS: dict[str, TransformerLMConfig] = {
    "gpt2": _gpt2(12, 12, 768), "gpt2-medium": _gpt2(24, 16, 1024),
    "gpt2-large": _gpt2(36, 20, 1280), "gpt2-xl": _gpt2(48, 25, 1600),
    "distilgpt2": _gpt2(6, 12, 768),
}

#: seqjax activation -> its name in transformers' ``ACT2FN`` (``activation_function``): the
#: first of the names :data:`~seqjax.interop._hf_common.ACTIVATIONS` reads as it.
_HF_ACTIVATION = {ours: hf for hf, ours in reversed(common.ACTIVATIONS.items())}

#: LayerNorm ε of GPT-2 and of seqjax's LayerNorm (``BlockConfig.norm_epsilon=None``).
_LN_EPS = 1e-5


def gpt2_config_from_hf(hf: dict) -> TransformerLMConfig:
    """A :class:`~seqjax.models.gpt.TransformerLMConfig` from a GPT-2 ``config.json`` dict.

    ``layer_norm_epsilon`` becomes ``block.norm_epsilon`` (``None`` when it is ``1e-5``). A
    ``ValueError`` names any option TransformerLM cannot express:
    ``scale_attn_by_inverse_layer_idx``, ``scale_attn_weights=false``, ``add_cross_attention``,
    an ``activation_function`` without a seqjax activation.

    Example:
        >>> cfg = gpt2_config_from_hf({"n_embd": 64, "n_layer": 2, "n_head": 4,
        ...                            "vocab_size": 100, "n_positions": 32})
        >>> cfg.block.activation, cfg.block.mlp_dim, cfg.tie_embeddings, cfg.block.norm_epsilon
        ('gelu_tanh', 256, True, None)
    """
    d, heads, layers, vocab = common.int_fields(hf, "gpt2", "GPT-2", "n_embd", "n_head",
                                                "n_layer", "vocab_size")
    for field, ok in (("scale_attn_by_inverse_layer_idx", False), ("add_cross_attention", False),
                      ("scale_attn_weights", True)):
        if bool(hf.get(field, ok)) != ok:
            raise ValueError(f"config `{field}` must be {str(ok).lower()} for seqjax's "
                             f"TransformerLM; got {hf[field]!r}.")
    eps = hf.get("layer_norm_epsilon", _LN_EPS)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"config `layer_norm_epsilon` must be a number > 0; got {eps!r}.")
    act = common.activation(hf, "activation_function", "gelu_new")
    std = float(hf.get("initializer_range", 0.02))
    block = gpt_block(heads, init_std=std, mlp_dim=int(hf.get("n_inner") or 4 * d), use_bias=True,
                      norm_epsilon=None if float(eps) == _LN_EPS else float(eps),
                      dropout_rate=float(hf.get("resid_pdrop", 0.1)),
                      attention_dropout_rate=float(hf.get("attn_pdrop", 0.1)), activation=act)
    return TransformerLMConfig(vocab_size=vocab, num_layers=layers, embed_dim=d,
                               block_size=int(hf.get("n_positions", hf.get("n_ctx", 1024))),
                               block=block, positions="learned",
                               tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
                               init_std=std)


def _check_layout(cfg: TransformerLMConfig, *, biases: bool) -> None:
    """``ValueError`` naming the first field of ``cfg`` GPT-2's layout cannot hold (below); with
    ``biases`` (loading: GPT-2's biases need somewhere to go) it needs every bias too."""
    block, heads = cfg.block, cfg.block.num_heads
    wants: list[tuple[str, Any, Any]] = [
        ("positions", cfg.positions, "learned"),
        ("logit_softcap", cfg.logit_softcap, 0.0),
        ("block.norm_type", block.norm_type, "layernorm"),
        ("block.norm", block.norm, "pre"),
        ("block.mlp", block.mlp, "mlp"),
        ("block.num_kv_heads", block.num_kv_heads, (None, heads)),
        ("block.head_dim", block.head_dim, (None, cfg.embed_dim // heads)),
        ("block.qk_norm", block.qk_norm, False),
        ("block.window", block.window, 0),
        ("block.attention", block.attention, None),
        ("block.activation", block.activation, tuple(_HF_ACTIVATION)),
    ]
    if biases:
        wants += [("block.use_bias", block.use_bias, True),
                  ("block.norm_use_bias", block.norm_use_bias, True),
                  ("block.attention_use_bias", block.attention_use_bias, (None, True))]
    for field, got, want in wants:
        allowed = want if isinstance(want, tuple) else (want,)
        if not any(got == w and isinstance(got, bool) == isinstance(w, bool) for w in allowed):
            shown = " or ".join(repr(w) for w in allowed)
            raise ValueError(f"a GPT-2 checkpoint needs TransformerLMConfig.{field}={shown}; "
                             f"got {got!r}.")


#: Tensors that keep their layout (``Conv1D`` is ``[in, out]``, as Flax): GPT-2 name ->
#: (parameter path, shape in ``V`` vocab_size, ``P`` block_size, ``D`` embed_dim, ``F``
#: mlp_dim). Block ``i``'s are under ``h.{i}.`` and ``decoder/layers_{i}``.
_MODEL_TENSORS: dict[str, tuple[tuple[str, ...], str]] = {
    "wte.weight": (("token_embed", "embedding"), "VD"),
    "wpe.weight": (("pos_embed", "embedding"), "PD"),
    "ln_f.weight": (("decoder", "final_norm", "scale"), "D"),
    "ln_f.bias": (("decoder", "final_norm", "bias"), "D"),
}
_BLOCK_TENSORS: dict[str, tuple[tuple[str, ...], str]] = {
    "ln_1.weight": (("self_attn_norm", "scale"), "D"),
    "ln_1.bias": (("self_attn_norm", "bias"), "D"),
    "attn.c_proj.bias": (("self_attn", "out", "bias"), "D"),
    "ln_2.weight": (("ffn_norm", "scale"), "D"),
    "ln_2.bias": (("ffn_norm", "bias"), "D"),
    "mlp.c_fc.weight": (("ffn", "up", "kernel"), "DF"),
    "mlp.c_fc.bias": (("ffn", "up", "bias"), "F"),
    "mlp.c_proj.weight": (("ffn", "down", "kernel"), "FD"),
    "mlp.c_proj.bias": (("ffn", "down", "bias"), "D"),
}
#: The fused ``c_attn`` holds ``[Q | K | V]`` in this order.
_QKV = ("query", "key", "value")


def _sizes(cfg: TransformerLMConfig) -> dict[str, int]:
    d = cfg.embed_dim
    return {"V": cfg.vocab_size, "P": cfg.block_size, "D": d, "F": cfg.block.mlp_dim or 4 * d}


def _get(tree: Any, path: tuple[str, ...], shape: list[int]) -> Any:
    """The leaf at ``path``, or zeros of ``shape`` where the model has none (a bias it does not
    use: zeros are the same function)."""
    for key in path:
        if not isinstance(tree, Mapping) or key not in tree:
            return np.zeros(shape, np.float32)
        tree = tree[key]
    return tree


def _take_table(ckpt: Checkpoint, table: dict, prefix: str, sizes: dict[str, int]) -> dict:
    out: dict = {}
    for name, (path, dims) in table.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = ckpt.take(prefix + name, tuple(sizes[c] for c in dims))
    return out


def _layer(ckpt: Checkpoint, i: int, cfg: TransformerLMConfig) -> dict:
    d, h, pre = cfg.embed_dim, cfg.block.num_heads, f"h.{i}."
    layer = _take_table(ckpt, _BLOCK_TENSORS, pre, _sizes(cfg))
    w_qkv = ckpt.take(pre + "attn.c_attn.weight", (d, 3 * d))
    b_qkv = ckpt.take(pre + "attn.c_attn.bias", (3 * d,))
    attn = layer["self_attn"]
    for j, name in enumerate(_QKV):  # [D, D] columns h·d … (h+1)·d - 1 are head h
        attn[name] = {"kernel": w_qkv[:, j * d:(j + 1) * d].reshape(d, h, d // h),
                      "bias": b_qkv[j * d:(j + 1) * d].reshape(h, d // h)}
    attn["out"]["kernel"] = ckpt.take(pre + "attn.c_proj.weight", (d, d)).reshape(h, d // h, d)
    return layer


def _gpt2_params(ckpt: Checkpoint, cfg: TransformerLMConfig) -> tuple[dict, TransformerLMConfig]:
    _check_layout(cfg, biases=True)
    ckpt.strip_prefix(("transformer.",), "wte.weight")
    ckpt.ignore(lambda k: k.startswith("h.") and k.endswith((".attn.bias", ".attn.masked_bias")))
    v, d = cfg.vocab_size, cfg.embed_dim
    params: dict[str, Any] = _take_table(ckpt, _MODEL_TENSORS, "", _sizes(cfg))
    layers = {f"layers_{i}": _layer(ckpt, i, cfg) for i in range(cfg.num_layers)}
    params["decoder"].update(common.stack_layers(layers, cfg.scan_layers))
    wte = params["token_embed"]["embedding"]
    if not cfg.tie_embeddings:  # the head must be in the file
        params["lm_head"] = {"kernel": ckpt.take("lm_head.weight", (v, d)).T}
    elif ckpt.has("lm_head.weight"):  # a tied copy, as some files hold
        if not np.array_equal(ckpt.take("lm_head.weight", (v, d)), wte):
            raise ValueError("tensor 'lm_head.weight' differs from 'wte.weight' but the config "
                             "ties them (tie_word_embeddings); pass tie_embeddings=False to load "
                             "it untied.")
    ckpt.finish()
    return params, cfg


def gpt2_config_to_hf(cfg: TransformerLMConfig) -> dict[str, Any]:
    """The ``config.json`` of ``transformers.GPT2LMHeadModel`` for a TransformerLM of ``cfg``
    (inverse of :func:`gpt2_config_from_hf`).

    ``vocab_size`` is the model's (a padded vocabulary stays padded), ``layer_norm_epsilon``
    ``block.norm_epsilon`` (``1e-5`` when unset), ``activation_function`` the ``ACT2FN`` name
    (``gelu_tanh`` → ``gelu_new``, ``relu_squared`` → ``relu2``); the dropout rates and
    ``init_std`` go to ``resid_pdrop``/``embd_pdrop``/``attn_pdrop`` and ``initializer_range``.
    A config GPT-2 cannot hold (rotary positions, RMSNorm, QK-norm, a soft-cap, GQA, a GLU, a
    window, ...) is a ``ValueError`` naming the field; ``use_bias=False`` is not (zero biases).

    Example:
        >>> from seqjax.models.gpt import TRANSFORMER_LM_PRESETS
        >>> hf = gpt2_config_to_hf(TRANSFORMER_LM_PRESETS["nanogpt-cpu"])
        >>> hf["n_layer"], hf["n_embd"], hf["activation_function"], hf["vocab_size"]
        (4, 128, 'gelu', 65)
    """
    _check_layout(cfg, biases=False)
    block = cfg.block
    eps = _LN_EPS if block.norm_epsilon is None else float(block.norm_epsilon)
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size, "n_embd": cfg.embed_dim,
        "n_layer": cfg.num_layers, "n_head": block.num_heads, "n_inner": block.mlp_dim,
        "activation_function": _HF_ACTIVATION[cast(str, block.activation)],  # checked
        "resid_pdrop": block.dropout_rate, "embd_pdrop": block.dropout_rate,
        "attn_pdrop": block.attention_dropout_rate, "layer_norm_epsilon": eps,
        "initializer_range": cfg.init_std, "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "add_cross_attention": False, "tie_word_embeddings": cfg.tie_embeddings, "use_cache": True,
    }


def gpt2_params_to_hf(params: Any, cfg: TransformerLMConfig) -> dict[str, np.ndarray]:
    """``GPT2LMHeadModel``'s tensors (``state_dict`` names, float32, contiguous) from the
    parameters of a TransformerLM of ``cfg`` (inverse of :func:`load_hf_gpt2`).

    The module's table read backwards: ``c_attn`` is ``[Q | K | V]`` concatenated, a bias the
    model lacks (``use_bias=False``, ``norm_use_bias=False``) is zeros (the same function),
    ``lm_head.weight`` the untied head transposed (absent when tied, as ``save_pretrained``
    writes it); stacked ``scan_layers`` parameters are split per layer. A config GPT-2 cannot
    hold, or parameters of the wrong names or shapes
    (:func:`~seqjax.interop.safetensors_io.check_params_like`), are a ``ValueError``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from seqjax.models.gpt import TransformerLM, TRANSFORMER_LM_PRESETS
        >>> cfg = TRANSFORMER_LM_PRESETS["nanogpt-cpu"]
        >>> p = TransformerLM(cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))
        >>> gpt2_params_to_hf(p["params"], cfg)["transformer.h.0.attn.c_attn.weight"].shape
        (128, 384)
    """
    _check_layout(cfg, biases=False)
    check_params_like(params, common.param_shapes(TransformerLM(cfg)), "TransformerLM")
    params = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32), params)
    decoder = params["decoder"]
    if "layers" in decoder:  # scan_layers: every leaf is [L, ...]
        decoder = {**decoder, **{
            f"layers_{i}": jax.tree_util.tree_map(lambda a, i=i: a[i], decoder["layers"])
            for i in range(cfg.num_layers)}}
    sizes, d, h = _sizes(cfg), cfg.embed_dim, cfg.block.num_heads

    def read(tree: Any, table: dict, prefix: str) -> dict[str, np.ndarray]:
        return {"transformer." + prefix + name: _get(tree, path, [sizes[c] for c in dims])
                for name, (path, dims) in table.items()}

    tensors = read({**params, "decoder": decoder}, _MODEL_TENSORS, "")
    for i in range(cfg.num_layers):
        layer = decoder[f"layers_{i}"]
        tensors.update(read(layer, _BLOCK_TENSORS, f"h.{i}."))
        attn, pre = layer["self_attn"], f"transformer.h.{i}.attn."
        zeros = np.zeros((h, d // h), np.float32)
        tensors[pre + "c_attn.weight"] = np.concatenate(
            [attn[n]["kernel"].reshape(d, d) for n in _QKV], axis=1)
        tensors[pre + "c_attn.bias"] = np.concatenate(
            [attn[n].get("bias", zeros).reshape(d) for n in _QKV])
        tensors[pre + "c_proj.weight"] = attn["out"]["kernel"].reshape(d, d)
    if not cfg.tie_embeddings:
        tensors["lm_head.weight"] = params["lm_head"]["kernel"].T
    return {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}


def load_hf_gpt2(path: PathLike, preset: str | TransformerLMConfig | None = None, *,
                 dtype: Dtype | None = None, param_dtype: Dtype = jnp.float32,
                 **overrides: Any) -> tuple[TransformerLM, dict]:
    """Load a Hugging Face GPT-2 checkpoint as ``(TransformerLM, variables)``.

    Args:
        path: a checkpoint directory (``model.safetensors`` or shards, and ``config.json``),
            or a weights file (``.safetensors``, or a PyTorch ``.bin`` read with
            ``torch.load(weights_only=True)``).
        preset: a name in :data:`HF_GPT2_PRESETS` (``"gpt2"``, ``"distilgpt2"``, …) or
            :data:`~seqjax.models.gpt.TRANSFORMER_LM_PRESETS`, or a ``TransformerLMConfig``,
            used instead of ``config.json`` (needed when there is none).
        dtype, param_dtype: compute and storage dtypes.
        overrides: config fields to change (``scan_layers=True``, ``implementation``, …).

    Returns:
        ``(model, {"params": ...})``; ``model.apply(variables, tokens)`` gives the logits
        ``[B, T, V]`` of ``GPT2LMHeadModel``; :mod:`seqjax.decoding` generates with the KV
        cache. The tokenizer is separate: load ``tokenizer.json`` with
        :func:`seqjax.data.tokenizers.load_tokenizer` if the directory has one.

    Raises:
        FileNotFoundError: no weights, or no ``config.json`` and no ``preset``.
        ValueError: a missing, unexpected or wrongly shaped tensor (named, with both shapes),
            or a configuration TransformerLM cannot express.

    Example:
        >>> model, variables = load_hf_gpt2("path/to/gpt2")  # doctest: +SKIP
        >>> from seqjax.decoding import greedy_search  # doctest: +SKIP
        >>> greedy_search(model, variables, prompt_BxT, max_new_tokens=20).tokens  # doctest: +SKIP
    """
    model, variables, _ = common.load(
        path, preset, overrides, _gpt2_params,
        presets={**TRANSFORMER_LM_PRESETS, **HF_GPT2_PRESETS}, config_cls=TransformerLMConfig,
        from_hf=gpt2_config_from_hf, model_cls=TransformerLM, what="GPT-2", dtype=dtype,
        param_dtype=param_dtype)
    return model, variables

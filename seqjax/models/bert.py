r"""BERT: a bidirectional transformer encoder with MLM, classification and tagging heads.

.. math::
    X^{(0)} = \mathrm{LN}(E[x_{1:N}] + P_{1:N} + S[s_{1:N}]),\qquad
    Z = \mathrm{Encoder}(X^{(0)})\ (\text{no causal mask})

Heads (Bishop §12.3.3, Fig. 12.18; J&M §9.7 for the encoder):

* masked LM, output matrix tied to ``E`` (Devlin et al. 2018), gelu = ``block.activation``:
  :math:`p(x_n \mid x_{\setminus\text{masked}}) = \mathrm{softmax}(\mathrm{LN}(\mathrm{gelu}(Z_n
  W_t + b_t)) E^\top + b)`;
* classification from the first (``<class>``) position: :math:`\mathrm{softmax}(W_c
  \tanh(W_p Z_1 + b_p) + b_c)` (``pooler=False``: Bishop's ``D×K`` matrix on :math:`Z_1`);
* token tagging: a shared linear-softmax on every position.

:func:`mlm_mask` draws the 15% / 80-10-10 corruption. Parameters: ``token_embed/embedding``,
``pos_embed/embedding``, ``type_embed/embedding``, ``embed_norm/{scale,bias}``,
``encoder/layers_{i}/...``, ``mlm_dense``, ``mlm_norm``, ``mlm_bias``, ``pooler``,
``classifier``, ``tagger``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax._checks import (
    ConfigBase,
    check_bool,
    check_count_or_off,
    check_integer,
    check_positive_ints,
    check_rank,
    lengths_array,
)
from seqjax._traced_checks import poison_bad_ids, poison_bad_lengths
from seqjax.models._common import check_lengths, check_nonempty, check_tokens, preset_constructor
from seqjax.nn._block_config import check_block, model_block, normal_init
from seqjax.nn.dense import Dense, flat_attend
from seqjax.nn.embedding import Embed
from seqjax.nn.ffn import get_activation
from seqjax.nn.norms import LayerNorm
from seqjax.nn.positional import LearnedPositionalEmbedding
from seqjax.nn.transformer import BlockConfig, TransformerEncoder

Array = jax.Array
Dtype = Any

__all__ = ["BERT_PRESETS", "Bert", "BertConfig", "bert_block", "mlm_mask"]


def bert_block(num_heads: int, *, init_std: float = 0.02, **options: Any) -> BlockConfig:
    """BERT's encoder block (Devlin et al. 2018): bidirectional, post-norm, exact GELU,
    LayerNorm ``ε = 1e-12``, dropout 0.1 on residual branches and (unless given) attention
    weights, ``N(0, init_std²)`` kernels; ``options``: other :class:`~seqjax.nn.BlockConfig` fields.

    Example:
        >>> bert_block(12).norm, bert_block(12).norm_epsilon, bert_block(12).causal
        ('post', 1e-12, False)
    """
    options = {"norm": "post", "activation": "gelu", "norm_epsilon": 1e-12, "dropout_rate": 0.1,
               **options}
    if options.get("attention_dropout_rate") is None:
        options["attention_dropout_rate"] = options["dropout_rate"]
    return BlockConfig.encoder(num_heads, kernel_init=normal_init(init_std), **options)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BertConfig(ConfigBase):
    """Hyper-parameters of :class:`Bert`.

    Attributes:
        vocab_size, num_layers, embed_dim: sizes.
        block_size: context length, the position table's size (HF ``max_position_embeddings``).
        block: every encoder block's :class:`~seqjax.nn.BlockConfig` (default ``bert_block(12,
            mlp_dim=3072)``): bidirectional, no cross-attention, ``norm_epsilon`` not ``None``.
            Its ``activation`` also serves the MLM transform, ``norm_epsilon`` the embedding
            and MLM LayerNorms, ``dropout_rate`` the embeddings and heads; a
            ``dtype``/``param_dtype`` other than the default or the model's is a ``ValueError``.
        type_vocab_size: segment ids (sentence A/B); 0 disables segment embeddings.
        mlm_head: build the tied MLM head.
        pooler: ``tanh`` dense on the first position before the classifier.
        num_classes: sequence classes (0: no classifier).
        num_tags: token tags (0: no tagger).
        init_std: standard deviation of the embeddings' and heads' normal initialiser.
        scan_layers, remat: see :class:`~seqjax.nn.transformer.TransformerEncoder`.
    """

    vocab_size: int = 30522
    num_layers: int = 12
    embed_dim: int = 768
    block_size: int = 512
    block: BlockConfig = dataclasses.field(default_factory=lambda: bert_block(12, mlp_dim=3072))
    type_vocab_size: int = 2
    mlm_head: bool = True
    pooler: bool = True
    num_classes: int = 0
    num_tags: int = 0
    init_std: float = 0.02
    scan_layers: bool = False
    remat: bool = False

    def __post_init__(self) -> None:
        check_block(self.block, causal=False, cross_attention=False, owner="BertConfig")
        check_count_or_off(self.num_classes, "num_classes", "BertConfig", "no classifier")
        check_count_or_off(self.num_tags, "num_tags", "BertConfig", "no tagger")
        if self.block.norm_epsilon is None:
            # the embedding and MLM-head LayerNorms take it from the block: no default here
            raise ValueError(
                "`block.norm_epsilon` of BertConfig must be a number > 0, the ε of every "
                "LayerNorm (bert_block sets BERT's 1e-12); got None."
            )


#: ``bert-base`` / ``bert-large`` (Devlin et al. 2018; Bishop Ex. 12.16: BERT-Large has
#: ≈340M parameters) and ``bert-tiny`` (Turc et al. 2019: 2 layers, 128 wide).
BERT_PRESETS: dict[str, BertConfig] = {
    "bert-base": BertConfig(),
    "bert-large": BertConfig(num_layers=24, embed_dim=1024, block=bert_block(16, mlp_dim=4096)),
    "bert-tiny": BertConfig(num_layers=2, embed_dim=128, block=bert_block(2, mlp_dim=512)),
}


def mlm_mask(key: Array, tokens_BxT: Array, *, vocab_size: int, mask_id: int,
             maskable_BxT: Array | None = None, select_rate: float = 0.15, mask_rate: float = 0.8,
             random_rate: float = 0.1,
             special_ids: Sequence[int] | None = None) -> tuple[Array, Array]:
    r"""BERT's masked-language-model corruption (Bishop §12.3.3; Devlin et al. 2018).

    Each maskable token is selected with probability ``select_rate``; a selected token becomes
    ``mask_id`` with probability ``mask_rate``, a uniform random id with probability
    ``random_rate``, and stays otherwise. The loss is taken at every selected position.

    By default the random id is drawn from the whole vocabulary, specials included, as BERT's
    reference code and Hugging Face do. With a small vocabulary that often puts a special at a
    word's place, so ``special_ids`` draws from the other ids instead (as fairseq), e.g.
    ``(pad, cls, mask)``; with ``mask_id`` among them the ``<mask>`` share is exactly
    ``mask_rate``.

    Args:
        key: PRNG key (the result is a deterministic function of it).
        tokens_BxT: integer token ids.
        vocab_size: range ``[0, vocab_size)`` of the random replacements.
        mask_id: the ``<mask>`` id.
        maskable_BxT: ``bool[B, T]``; False for padding and special tokens (``<class>``).
        select_rate, mask_rate, random_rate: default 15% / 80% / 10%.
        special_ids: ids in ``[0, vocab_size)`` never drawn as random replacements.

    Returns:
        ``(inputs_BxT, selected_BxT)``: corrupted tokens and the boolean loss positions
        (targets are ``tokens_BxT``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> x = jnp.arange(10)[None] % 7
        >>> inputs, selected = mlm_mask(jax.random.PRNGKey(0), x, vocab_size=7, mask_id=7)
        >>> inputs.shape, selected.dtype
        ((1, 10), dtype('bool'))
    """
    check_rank(tokens_BxT, "tokens", 2)
    check_integer(tokens_BxT, "tokens")
    for name, rate in dict(
        select_rate=select_rate, mask_rate=mask_rate, random_rate=random_rate
    ).items():
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"`{name}` must be in [0, 1]; got {rate}.")
    if mask_rate + random_rate > 1.0:
        raise ValueError(
            f"`mask_rate + random_rate` must be <= 1; got {mask_rate} + {random_rate}."
        )
    check_positive_ints(vocab_size=vocab_size)
    allowed = None
    if special_ids is not None:
        specials = np.asarray(list(special_ids))
        if specials.size and not np.issubdtype(specials.dtype, np.integer):
            raise TypeError(f"`special_ids` must be integer token ids; got {list(special_ids)!r}.")
        if specials.size and (specials.min() < 0 or specials.max() >= vocab_size):
            raise ValueError(
                f"`special_ids` must lie in [0, vocab_size = {vocab_size}); got "
                f"{sorted(specials.tolist())}."
            )
        allowed = np.setdiff1d(np.arange(vocab_size), specials)
        if allowed.size == 0:
            raise ValueError(
                f"`special_ids` exclude every id of the vocabulary of {vocab_size}; "
                "no token is left to draw as a random replacement."
            )
    tokens_BxT = jnp.asarray(tokens_BxT)
    k_select, k_kind, k_random = jax.random.split(key, 3)
    selected_BxT = jax.random.bernoulli(k_select, select_rate, tokens_BxT.shape)
    if maskable_BxT is not None:
        check_bool(maskable_BxT, "maskable")
        selected_BxT = selected_BxT & maskable_BxT
    u_BxT = jax.random.uniform(k_kind, tokens_BxT.shape)
    if allowed is None:
        random_tokens = jax.random.randint(
            k_random, tokens_BxT.shape, 0, vocab_size, dtype=tokens_BxT.dtype
        )
    else:  # uniform over the non-special ids
        pick = jax.random.randint(k_random, tokens_BxT.shape, 0, allowed.size)
        random_tokens = jnp.asarray(allowed, tokens_BxT.dtype)[pick]
    replaced = jnp.where(
        u_BxT < mask_rate,
        jnp.asarray(mask_id, tokens_BxT.dtype),
        jnp.where(u_BxT < mask_rate + random_rate, random_tokens, tokens_BxT),
    )
    return jnp.where(selected_BxT, replaced, tokens_BxT), selected_BxT


class Bert(nn.Module):
    r"""BERT encoder with optional MLM / classification / tagging heads (see module docstring).

    ``model(tokens_BxT, lengths=None, token_types_BxT=None, *, deterministic=True)`` returns a
    dict with ``"hidden"`` ``[B, T, D]`` and, as configured, ``"mlm_logits"`` ``[B, T, V]``,
    ``"pooled"`` ``[B, D]``, ``"class_logits"`` ``[B, C]``, ``"tag_logits"`` ``[B, T, K]``
    (logits float32). Padding (``lengths``) is masked out of every attention; a pooler or
    classifier needs ``T >= 1``. Under ``jit`` a row with an id outside ``[0, V)`` or a length
    outside ``[0, T]`` gives NaN outputs (:mod:`seqjax._traced_checks`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cfg = BertConfig(vocab_size=30, num_layers=2, embed_dim=16, block_size=12,
        ...                  block=bert_block(2, mlp_dim=32), num_classes=3, num_tags=4)
        >>> bert = Bert(cfg)
        >>> x = jnp.ones((2, 7), jnp.int32)
        >>> v = bert.init(jax.random.PRNGKey(0), x)
        >>> out = bert.apply(v, x, jnp.array([7, 4]))
        >>> out["mlm_logits"].shape, out["class_logits"].shape, out["tag_logits"].shape
        ((2, 7, 30), (2, 3), (2, 7, 4))
    """

    config: BertConfig
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    from_preset = preset_constructor(BERT_PRESETS)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @nn.compact
    def __call__(self, tokens_BxT: Array, lengths: Array | None = None,
                 token_types_BxT: Array | None = None, *,
                 deterministic: bool = True) -> dict[str, Array]:
        cfg = self.config
        tokens_BxT = check_tokens(tokens_BxT, "tokens", cfg.vocab_size)
        batch, num_steps = tokens_BxT.shape
        if num_steps > cfg.block_size:
            raise ValueError(f"`tokens` has {num_steps} positions but block_size={cfg.block_size}.")
        needs_first = cfg.pooler or cfg.num_classes > 0
        if needs_first:
            check_nonempty(tokens_BxT, "tokens", "the pooler and the classifier read its first "
                           "([CLS]) token")
        checked = None if lengths is None else check_lengths(lengths, "lengths", batch, num_steps)
        init = nn.initializers.normal(stddev=cfg.init_std)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        dense = lambda n, name: Dense(n, kernel_init=init, name=name, **kw)  # noqa: E731

        token_embed = Embed(
            cfg.vocab_size, cfg.embed_dim, embedding_init=init, name="token_embed", **kw
        )
        # Under jit, a row with an invalid id is NaN (seqjax._traced_checks).
        x_BxTxD = poison_bad_ids(token_embed(tokens_BxT), tokens_BxT, cfg.vocab_size)
        x_BxTxD = LearnedPositionalEmbedding(
            cfg.block_size, embedding_init=init, name="pos_embed", **kw
        )(x_BxTxD)
        if cfg.type_vocab_size > 0:
            if token_types_BxT is None:
                token_types_BxT = jnp.zeros((batch, num_steps), jnp.int32)
            token_types_BxT = check_tokens(token_types_BxT, "token_types", cfg.type_vocab_size)
            x_BxTxD = x_BxTxD + Embed(
                cfg.type_vocab_size, cfg.embed_dim, embedding_init=init, name="type_embed", **kw
            )(token_types_BxT)
        elif token_types_BxT is not None:
            raise ValueError("`token_types` given but the config has type_vocab_size=0.")
        block = model_block(cfg.block, self.dtype, self.param_dtype, owner="BertConfig")
        norm_eps = cast(float, block.norm_epsilon)  # never None: BertConfig checks it
        x_BxTxD = LayerNorm(norm_eps, name="embed_norm", **kw)(x_BxTxD)
        x_BxTxD = nn.Dropout(block.dropout_rate)(x_BxTxD, deterministic=deterministic)
        encoder = TransformerEncoder(config=block, num_layers=cfg.num_layers, name="encoder",
                                     scan_layers=cfg.scan_layers, remat=cfg.remat)
        z_BxTxD = encoder(x_BxTxD, lengths=checked, deterministic=deterministic)
        # A length outside [0, T] under jit: the row's outputs are NaN. After the encoder,
        # whose padding mask would zero every position of a negative length.
        z_BxTxD = poison_bad_lengths(z_BxTxD, lengths_array(checked), 0, num_steps)

        out: dict[str, Array] = {"hidden": z_BxTxD}
        if cfg.mlm_head:
            h_BxTxD = get_activation(block.activation)(dense(cfg.embed_dim, "mlm_dense")(z_BxTxD))
            h_BxTxD = LayerNorm(norm_eps, name="mlm_norm", **kw)(h_BxTxD)
            mlm_bias = self.param(
                "mlm_bias", nn.initializers.zeros_init(), (cfg.vocab_size,), self.param_dtype
            )
            out["mlm_logits"] = (flat_attend(token_embed, h_BxTxD) + mlm_bias).astype(jnp.float32)
        first_BxD = z_BxTxD[:, 0] if needs_first else None  # the first ([CLS]) position
        if cfg.pooler:
            first_BxD = jnp.tanh(dense(cfg.embed_dim, "pooler")(first_BxD))
            out["pooled"] = first_BxD
        drop = nn.Dropout(block.dropout_rate)
        if cfg.num_classes:
            out["class_logits"] = dense(cfg.num_classes, "classifier")(
                drop(first_BxD, deterministic=deterministic)
            ).astype(jnp.float32)
        if cfg.num_tags:
            out["tag_logits"] = dense(cfg.num_tags, "tagger")(
                drop(z_BxTxD, deterministic=deterministic)
            ).astype(jnp.float32)
        return out

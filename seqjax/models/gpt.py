r"""GPT: a decoder-only transformer language model (``TransformerLM``).

.. math::
    X^{(0)} = E[x_{1:N}] + P_{1:N},\qquad X^{(l)} = \mathrm{Block}_l(X^{(l-1)})\ (\text{causal}),
    \qquad p(x_{n+1} \mid x_{\le n}) = \mathrm{softmax}(\mathrm{LN}(X^{(L)}_n) E^\top)

and, with ``logit_softcap = c > 0``, :math:`\mathrm{softmax}(c\tanh(z/c))` for those logits
:math:`z` (Gemma 2; modded-nanogpt), keeping every logit in ``(-c, c)``.

Bishop §12.3.1 (Fig. 12.15, (12.33): the linear-softmax output shared across positions);
J&M §9.8 (Fig. 9.22, tied ``Eᵀ``); MEDL §7.5 (masked self-attention (7.27)). Pre-norm blocks
(Bishop (12.21), (12.23); GPT-2, nanoGPT) with a final norm; learned absolute positions (J&M
§9.7.3) or rotary (``positions="rope"``). Teacher-forced training runs all positions at once
under the causal mask (MEDL §7.5). modded-nanogpt's choices are switches: ``positions="rope"``,
``tie_embeddings=False``, ``logit_softcap``; the block's ``qk_norm``, ``norm_type="rmsnorm"``,
``activation="relu_squared"``, ``residual_init_std=0.0``.

Parameter names (golden trees in ``tests/golden/``): ``token_embed/embedding [V, D]``,
``pos_embed/embedding [block_size, D]`` (learned positions), ``decoder/layers_{i}/...``
(``decoder/layers/...`` with ``scan_layers``), ``decoder/final_norm``, ``lm_head/kernel``
(untied only). :class:`TransformerLMClassifier` adds a classifier on the last token.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import (
    ConfigBase,
    ValidLengths,
    check_bool,
    check_positive_int,
    is_concrete,
    lengths_array,
)
from seqjax._traced_checks import poison_bad_ids, poison_bad_lengths
from seqjax.models._common import (
    DecodingModel,
    block_stack,
    cached_step,
    check_block_size,
    check_decode_len,
    check_lengths,
    check_nonempty,
    check_tokens,
    masked_pool,
    preset_constructor,
    swap_layers_batch,
)
from seqjax.nn._block_config import check_block, normal_init
from seqjax.nn.dense import Dense, flat_attend
from seqjax.nn.embedding import Embed
from seqjax.nn.positional import LearnedPositionalEmbedding
from seqjax.nn.transformer import BlockConfig, TransformerDecoder

Array = jax.Array
Dtype = Any

__all__ = [
    "TRANSFORMER_LM_PRESETS", "gpt_block", "TransformerLM", "TransformerLMClassifier",
    "TransformerLMConfig",
]


def gpt_block(num_heads: int, *, init_std: float = 0.02, **options: Any) -> BlockConfig:
    r"""GPT-2's decoder block: causal, pre-norm, no cross-attention, ``N(0, init_std²)``
    kernels, attention dropout ``dropout_rate`` unless given (nanoGPT); ``options``: other
    :class:`~seqjax.nn.BlockConfig` fields. ``num_layers`` is a ``TypeError``: the
    :class:`TransformerLM` scales the residual projections for its own depth
    (:attr:`TransformerLMConfig.decoder_block`).

    Example:
        >>> cfg = gpt_block(12)
        >>> cfg.causal, cfg.cross_attention, cfg.residual_init_std
        (True, False, None)
    """
    if "num_layers" in options:
        raise TypeError(
            "gpt_block() takes no `num_layers`: a TransformerLM derives its residual "
            "projections' scale init_std/√(2L) from its own TransformerLMConfig.num_layers; "
            f"got num_layers={options['num_layers']!r}."
        )
    if options.get("attention_dropout_rate") is None:
        options["attention_dropout_rate"] = options.get("dropout_rate", 0.0)
    return BlockConfig.decoder(num_heads, cross_attention=False, kernel_init=normal_init(init_std),
                               **options)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerLMConfig(ConfigBase):
    """Hyper-parameters of :class:`TransformerLM`.

    Attributes:
        vocab_size: ``|V|``.
        num_layers, embed_dim: ``L``, ``D``.
        block_size: context length, the learned position table's size (HF ``n_positions``);
            a decoding cache's capacity is ``init_decode_state``'s ``max_len``.
        block: every decoder block's :class:`~seqjax.nn.BlockConfig` (default
            ``gpt_block(6)``): causal without cross-attention, ``use_rope`` exactly when
            ``positions="rope"``. Its ``dropout_rate`` also drops the embeddings; a
            ``dtype``/``param_dtype`` other than the default or the model's is a ``ValueError``.
        positions: ``"learned"`` (GPT-2) or ``"rope"`` (no position parameters).
        tie_embeddings: output matrix ``Eᵀ`` (J&M §9.8; Press & Wolf 2017).
        init_std: ``σ`` of the embeddings' (and an untied head's) normal initialiser (the
            blocks': ``block.kernel_init``). The residual projections (attention ``out``, FFN
            ``down``) start at ``N(0, (σ/√(2L))²)``, ``L = num_layers`` (GPT-2 §2.3; nanoGPT),
            unless the block sets its own ``residual_init_std`` (``0.0``: zeros).
        scan_layers, remat: compile the stack as one scanned block; rematerialise.
        logit_softcap: ``c > 0``: logits ``z`` become ``c·tanh(z/c)`` (in float32, returned in
            the compute dtype); ``0`` (default) is off.
    """

    vocab_size: int
    num_layers: int = 6
    embed_dim: int = 384
    block_size: int = 256
    block: BlockConfig = dataclasses.field(default_factory=lambda: gpt_block(6))
    positions: str = "learned"
    tie_embeddings: bool = True
    init_std: float = 0.02
    scan_layers: bool = False
    remat: bool = False
    logit_softcap: float = 0.0

    def __post_init__(self) -> None:
        check_block(
            self.block, causal=True, cross_attention=False, owner="TransformerLMConfig"
        )
        if self.positions not in ("learned", "rope"):
            raise ValueError(f"`positions` must be 'learned' or 'rope'; got {self.positions!r}.")
        if self.block.use_rope != (self.positions == "rope"):
            raise ValueError(
                f"`block.use_rope` must be {self.positions == 'rope'} with "
                f"positions={self.positions!r}; got {self.block.use_rope}."
            )
        c = self.logit_softcap
        if isinstance(c, bool) or not isinstance(c, numbers.Real) or not 0 <= c < math.inf:
            raise ValueError(f"`logit_softcap` must be a finite number >= 0 (0: off); got {c!r}.")

    @property
    def residual_init_std(self) -> float:
        """``σ/√(2L)`` (GPT-2), unless the block states its own ``residual_init_std``."""
        if self.block.residual_init_std is not None:
            return self.block.residual_init_std
        return self.init_std / math.sqrt(2 * self.num_layers)

    @property
    def decoder_block(self) -> BlockConfig:
        """The block every layer is built with: :attr:`block` with the residual projections'
        initial scale derived from this config's depth (:attr:`residual_init_std`)."""
        return self.block.replace(residual_init_std=self.residual_init_std)


#: ``nanogpt-*``: nanoGPT's ``train_shakespeare_char`` (6L/6H/384, block 256, dropout 0.2, no
#: biases) and its README's CPU variant (4L/4H/128, block 64); ``gpt2-small``: GPT-2 124M
#: (12L/12H/768, block 1024, |V| = 50257).
TRANSFORMER_LM_PRESETS: dict[str, TransformerLMConfig] = {
    "nanogpt-shakespeare-char": TransformerLMConfig(
        vocab_size=65, num_layers=6, embed_dim=384, block_size=256,
        block=gpt_block(6, dropout_rate=0.2, use_bias=False, activation="gelu"),
    ),
    "nanogpt-cpu": TransformerLMConfig(
        vocab_size=65, num_layers=4, embed_dim=128, block_size=64,
        block=gpt_block(4, dropout_rate=0.0, use_bias=False, activation="gelu"),
    ),
    "gpt2-small": TransformerLMConfig(
        vocab_size=50257, num_layers=12, embed_dim=768, block_size=1024,
        block=gpt_block(12, dropout_rate=0.1, use_bias=True, activation="gelu_tanh"),
    ),
}


class TransformerLM(DecodingModel):
    r"""GPT-style language model (equations in the module docstring).

    ``model(tokens_BxT, lengths=None, *, deterministic=True) -> logits_BxTxV`` in the compute
    dtype (float32 by default); ``T ≤ block_size`` with learned positions. ``lengths`` (right
    padding) zeroes the padded hidden states (causal: real positions never see them). Under
    ``jit`` a row with an id outside ``[0, V)`` (``-1`` included) or a bad length is all NaN
    (:mod:`seqjax._traced_checks`; errors under ``seqjax.checked``). Decoding
    (:mod:`seqjax.decoding`) keeps one :class:`~seqjax.nn.attention.KVCache` per layer.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cfg = TransformerLMConfig(vocab_size=17, num_layers=2, embed_dim=16, block_size=32,
        ...                           block=gpt_block(2))
        >>> lm = TransformerLM(cfg)
        >>> tokens = jnp.zeros((2, 8), jnp.int32)
        >>> params = lm.init(jax.random.PRNGKey(0), tokens)
        >>> lm.apply(params, tokens).shape
        (2, 8, 17)
    """

    config: TransformerLMConfig
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    from_preset = preset_constructor(TRANSFORMER_LM_PRESETS)

    def setup(self) -> None:
        cfg, kw = self.config, dict(dtype=self.dtype, param_dtype=self.param_dtype)
        init = nn.initializers.normal(stddev=cfg.init_std)
        self.token_embed = Embed(cfg.vocab_size, cfg.embed_dim, embedding_init=init, **kw)
        if cfg.positions == "learned":
            self.pos_embed = LearnedPositionalEmbedding(cfg.block_size, embedding_init=init, **kw)
        self.decoder = block_stack(self, TransformerDecoder, cfg.decoder_block, cfg.num_layers)
        self.drop = nn.Dropout(cfg.block.dropout_rate)
        if not cfg.tie_embeddings:
            self.lm_head = Dense(cfg.vocab_size, use_bias=False, kernel_init=init, **kw)

    def _embed(self, tokens_BxT: Array, positions_BxT: Array | None, deterministic: bool) -> Array:
        # Under jit a row holding an id outside [0, V) is NaN (seqjax._traced_checks).
        x_BxTxD = poison_bad_ids(self.token_embed(tokens_BxT), tokens_BxT, self.config.vocab_size)
        if self.config.positions == "learned":
            x_BxTxD = self.pos_embed(x_BxTxD, positions_BxT)
        return self.drop(x_BxTxD, deterministic=deterministic)

    def _head(self, h_BxTxD: Array) -> Array:
        if self.config.tie_embeddings:
            logits_BxTxV = flat_attend(self.token_embed, h_BxTxD)
        else:
            logits_BxTxV = self.lm_head(h_BxTxD)
        # Compute dtype, not float32 (a float32 [B, T, V] is a GPT-2 step's largest buffer);
        # the losses and samplers take the log-sum-exp in float32 themselves.
        c = self.config.logit_softcap
        if c:  # c·tanh(z/c) in float32 (an elementwise op XLA fuses), not tanh in bfloat16
            z_BxTxV = logits_BxTxV.astype(jnp.float32)
            logits_BxTxV = (c * jnp.tanh(z_BxTxV / c)).astype(logits_BxTxV.dtype)
        return logits_BxTxV

    def _trunk(self, tokens_BxT: Array, lengths: Array | None, deterministic: bool,
               min_length: int = 0) -> tuple[Array, ValidLengths | None]:
        """``(LN(X^{(L)}) [B, T, D], checked lengths)``: everything but the head."""
        tokens_BxT = check_tokens(tokens_BxT, "tokens", self.config.vocab_size)
        batch, num_steps = tokens_BxT.shape
        check_block_size(num_steps, "tokens", self.config)
        checked = (
            None if lengths is None
            else check_lengths(lengths, "lengths", batch, num_steps, min_length)
        )
        x_BxTxD = self._embed(tokens_BxT, None, deterministic)
        h_BxTxD = self.decoder(x_BxTxD, lengths=checked, deterministic=deterministic)
        # Under jit a bad length makes the row NaN; after the decoder, whose padding mask
        # would zero every position of a negative length.
        h_BxTxD = poison_bad_lengths(h_BxTxD, lengths_array(checked), min_length, num_steps)
        return h_BxTxD, checked

    def __call__(self, tokens_BxT: Array, lengths: Array | None = None, *,
                 deterministic: bool = True) -> Array:
        h_BxTxD, _ = self._trunk(tokens_BxT, lengths, deterministic)
        return self._head(h_BxTxD)

    # ----------------------------------------------------------------- decoding interface

    def _prefill(self, prompt_BxT: Array, lengths_B: Array, max_len: int | None) -> dict:
        batch, num_steps = prompt_BxT.shape
        cache = self.decoder.init_cache(batch, check_decode_len(max_len, num_steps, self.config))
        if num_steps > 1:
            # Every prompt token but the last (that one is fed by the first decode step).
            x_BxTxD = self._embed(prompt_BxT[:, :-1], None, True)
            # in [0, T - 1]: the prompt lengths were checked at the door
            lengths = check_lengths(lengths_B, "lengths", batch, num_steps - 1)
            _, cache = self.decoder.decode(x_BxTxD, cache, lengths=lengths)
        return {"cache": swap_layers_batch(cache, self.config.scan_layers), "positions": lengths_B}

    def _step(self, state: dict, tokens_B: Array) -> tuple[Array, dict]:
        return cached_step(self, state, tokens_B, lambda x, pos: self._embed(x, pos, True))

    def init_decode_state(self, params: Any, prompt_BxT: Array,
                          prompt_lengths_B: Array | None = None,
                          max_len: int | None = None) -> dict:
        """KV caches of ``max_len`` slots (:func:`~seqjax.models._common.check_decode_len`)
        prefilled with ``prompt[b, :len_b - 1]``: state ``{"cache": [KVCache per layer],
        "positions": int32[B]}`` (batch-leading). A full cache under ``jit`` drops the tokens
        :meth:`decode_step` appends past ``max_len``, counted in each layer's
        ``KVCache.overflow``."""
        return self._init_state(params, prompt_BxT, prompt_lengths_B, max_len)


class TransformerLMClassifier(TransformerLM):
    r"""Decoder-form sequence classifier: a causal LM with a linear head on the last token.

    .. math::
        H = \mathrm{LN}(X^{(L)}) \ (\text{the causal trunk of } \mathrm{TransformerLM}),\qquad
        p(c \mid x_{1:n}) = \mathrm{softmax}(W_c\, H_n + b_c)

    with ``n`` the last *real* token of the row: J&M §9.4.2 (Fig. 9.8, :math:`h_n` represents the
    text) and §9.9.1 (pre-train the LM, then add a layer and fine-tune); GPT-1 (Radford et al.
    2018, eq. (3)), which appends an extract token where this reads the text's last token.
    Under the causal mask only :math:`H_n` has seen every token (BERT reads the first).

    Right padding: ``lengths`` (``int32[B]`` in ``[1, T]``; default ``T``; length 0 is an
    error when concrete) or ``mask`` (``bool[B, T]``, ``True`` for real tokens, a prefix of
    each row; not both) give :math:`n_b`; a padded batch classifies like each row alone.

    The parameter tree is :class:`TransformerLM`'s (``lm_head`` included when untied, though
    unused) plus ``class_head/{kernel,bias}`` (``[D, C]``, ``[C]``), so an LM's parameters drop
    in as ``{**clf_params, **lm_params}``; :meth:`lm_logits` and the decoding interface run the
    LM on the same parameters (e.g. GPT-1's auxiliary LM loss).

    ``model(tokens_BxT, lengths=None, *, mask=None, deterministic=True) -> class_logits_BxC``
    (float32, ``C = num_classes``, default 2); ``block.dropout_rate`` drops :math:`H_n` before
    the head when training.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cfg = TransformerLMConfig(vocab_size=17, num_layers=1, embed_dim=8, block_size=16,
        ...                           block=gpt_block(2))
        >>> clf = TransformerLMClassifier(cfg, num_classes=3)
        >>> tokens = jnp.ones((2, 5), jnp.int32)
        >>> v = clf.init(jax.random.PRNGKey(0), tokens)
        >>> clf.apply(v, tokens, jnp.array([5, 2])).shape
        (2, 3)
    """

    num_classes: int = 2

    def setup(self) -> None:
        super().setup()
        self.class_head = Dense(
            check_positive_int(self.num_classes, "num_classes"),
            kernel_init=nn.initializers.normal(stddev=self.config.init_std),
            dtype=self.dtype,
            param_dtype=self.param_dtype,
        )

    def _lengths_from_mask(self, mask: Array, shape: tuple[int, ...]) -> Array:
        check_bool(mask, "mask")
        if tuple(mask.shape) != tuple(shape):
            raise ValueError(
                f"`mask` must have the shape of `tokens` {tuple(shape)}; got {tuple(mask.shape)}."
            )
        lengths_B = jnp.sum(mask, axis=-1, dtype=jnp.int32)
        if is_concrete(mask):
            prefix = jnp.arange(shape[1])[None, :] < lengths_B[:, None]
            if not bool(jnp.all(prefix == mask)):
                raise ValueError(
                    "`mask` must be right padding (each row True then False: the real tokens "
                    "first); got a row with a False before a True."
                )
        return lengths_B

    def __call__(self, tokens_BxT: Array, lengths: Array | None = None, *,
                 mask: Array | None = None, deterministic: bool = True) -> Array:
        if mask is not None:
            if lengths is not None:
                raise ValueError("give `lengths` or `mask`, not both.")
            lengths = self._lengths_from_mask(mask, jnp.shape(tokens_BxT))
        check_nonempty(tokens_BxT, "tokens", "the classifier reads its last token")
        h_BxTxD, checked = self._trunk(tokens_BxT, lengths, deterministic, min_length=1)
        if self.is_initializing() and not self.config.tie_embeddings:
            self._head(h_BxTxD[:, :1])  # create lm_head: the tree stays the LM's
        # H[b, lengths[b] - 1]; lengths checked by the trunk
        last_BxD = masked_pool(h_BxTxD, checked, "last")
        last_BxD = self.drop(last_BxD, deterministic=deterministic)
        return self.class_head(last_BxD).astype(jnp.float32)

    def lm_logits(self, tokens_BxT: Array, lengths: Array | None = None, *,
                  deterministic: bool = True) -> Array:
        """The language model's ``logits_BxTxV`` on the same parameters."""
        return TransformerLM.__call__(self, tokens_BxT, lengths, deterministic=deterministic)

r"""The encoder–decoder transformer of Vaswani et al. (2017).

.. math::
    Z^\star = \mathrm{Encoder}(\sqrt{d}\,E[x_{1:S}] + R_{1:S}),\qquad
    p(y_t \mid y_{<t}, x) = \mathrm{softmax}\big(
        \mathrm{Decoder}(\sqrt{d}\,E[y_{<t}] + R, Z^\star)_t W_{out} + b\big)

MEDL §7.5 (Fig. 7.15: post-norm blocks, (7.31)–(7.33); (7.34) for inference); Bishop
§12.3.4 (Figs. 12.19–12.20, cross-attention); lecture notes §3. ``R`` is the sinusoidal
encoding (MEDL (7.29)–(7.30)) or a learned table. With a shared vocabulary
(``tgt_vocab_size=None``) one matrix ``E`` embeds source and target and, transposed, is the
output layer (Vaswani §3.4; Press & Wolf 2017).

**Departures from MEDL (7.29)–(7.30)**, following Vaswani et al. (and PyTorch/tensor2tensor):

* *Positions count from 0*: index ``t = 0, 1, …`` gets :math:`r^{⟨t⟩}_{2i} = \sin(t /
  M^{2i/p})`, :math:`r^{⟨t⟩}_{2i+1} = \cos(t / M^{2i/p})` (interleaved, ``M = 10,000``; the
  first token's is ``[0, 1, 0, 1, …]``), so ``R[t]`` is MEDL's :math:`r^{⟨t+1⟩}`. Relative
  offsets behave the same (Bishop Ex. 12.10) but weights do not transfer between the two.
  Fixed here (MEDL's numbering: ``start=1`` of :class:`~seqjax.nn.SinusoidalPositionalEmbedding`).
* *Embeddings are scaled by* :math:`\sqrt{d}` before the positions are added (Vaswani §3.4):
  :math:`\sqrt{d}\,E[x_t] + r^{⟨t⟩}`; with the :math:`\mathcal N(0, 1/d)` initialisation they
  start at unit variance, like the encoding. ``scale_embeddings=False`` gives MEDL's (7.30).

**Parameter count** (``vaswani-base`` with MEDL's ``attention_use_bias=False``): blocks of
``3,150,336`` (encoder) and ``4,199,936`` (decoder) as MEDL (7.32), ``63,082,632`` in all, the
output layer having one bias per word (``d_V × p + d_V``, ``d_V = 37,000``); MEDL's
``d_V × p + p`` (63,046,144) is a slip. Vaswani's attention biases give 63,119,496 (≈65M).

Parameter names: ``shared_embed/embedding`` (or ``src_embed`` and ``tgt_embed``),
``encoder/layers_{i}``, ``decoder/layers_{i}`` (``…/final_norm`` when pre-norm),
``output_bias`` (tied) or ``output/{kernel,bias}``, ``src_pos_embed`` / ``tgt_pos_embed``
(learned positions only).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import ConfigBase, ValidLengths
from seqjax._traced_checks import poison_bad_ids, poison_bad_lengths
from seqjax.models._common import (
    DecodingModel,
    block_stack,
    cached_step,
    check_block_size,
    check_decode_len,
    check_filled,
    check_lengths,
    check_same_batch,
    check_tokens,
    preset_constructor,
    swap_layers_batch,
)
from seqjax.nn._block_config import check_block
from seqjax.nn.dense import Dense, flat_attend
from seqjax.nn.embedding import Embed
from seqjax.nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding
from seqjax.nn.transformer import BlockConfig, TransformerDecoder, TransformerEncoder

Array = jax.Array
Dtype = Any

__all__ = ["TRANSFORMER_PRESETS", "Transformer", "TransformerConfig", "vaswani_block"]


#: Vaswani et al.'s weight initialiser (one object, so equal configs compare equal).
_XAVIER = nn.initializers.xavier_uniform()


def vaswani_block(num_heads: int = 8, **options: Any) -> BlockConfig:
    """Vaswani et al. 2017's encoder block (MEDL §7.5): bidirectional, post-norm, ReLU FFN
    ``d_ff = 2048``, residual dropout 0.1, none on attention weights, attention biases,
    Glorot-uniform weights; ``options``: other :class:`~seqjax.nn.BlockConfig` fields. The
    decoder adds causal self- and cross-attention (:attr:`TransformerConfig.decoder_block`).

    Example:
        >>> cfg = vaswani_block(8)
        >>> cfg.norm, cfg.activation, cfg.mlp_dim, cfg.causal
        ('post', 'relu', 2048, False)
    """
    defaults = dict(mlp_dim=2048, norm="post", activation="relu", dropout_rate=0.1,
                    attention_dropout_rate=0.0, attention_use_bias=True, kernel_init=_XAVIER)
    return BlockConfig.encoder(num_heads, **{**defaults, **options})


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig(ConfigBase):
    """Hyper-parameters of :class:`Transformer`.

    Attributes:
        src_vocab_size: source vocabulary (the shared one when ``tgt_vocab_size`` is None).
        tgt_vocab_size: target vocabulary; ``None`` = shared with the source.
        num_layers: ``N`` encoder and ``N`` decoder blocks; ``encoder_layers``,
            ``decoder_layers`` override it per side.
        embed_dim: ``d_model = p``.
        block_size: context length of source and target (each learned position table's size).
        block: the encoder blocks' :class:`~seqjax.nn.BlockConfig` (``h``, ``d_ff = N₁``, ...;
            default ``vaswani_block(8)``), bidirectional without cross-attention; the decoder's
            is :attr:`decoder_block`. Its ``dropout_rate`` also drops the embeddings; a
            ``dtype``/``param_dtype`` other than the default or the model's is a ``ValueError``.
        positions: ``"sinusoidal"`` (MEDL (7.29)–(7.30); Vaswani) or ``"learned"``.
        tie_embeddings: the output matrix is the target embedding transposed.
        output_bias: a bias per output word.
        scale_embeddings: multiply embeddings by ``√d`` (Vaswani); ``False``: MEDL (7.30).
        scan_layers, remat: see :class:`~seqjax.nn.transformer.TransformerDecoder`.
    """

    src_vocab_size: int
    tgt_vocab_size: int | None = None
    num_layers: int = 6
    encoder_layers: int | None = None
    decoder_layers: int | None = None
    embed_dim: int = 512
    block_size: int = 512
    block: BlockConfig = dataclasses.field(default_factory=vaswani_block)
    positions: str = "sinusoidal"
    tie_embeddings: bool = True
    output_bias: bool = True
    scale_embeddings: bool = True
    scan_layers: bool = False
    remat: bool = False

    def __post_init__(self) -> None:
        check_block(self.block, causal=False, cross_attention=False, owner="TransformerConfig")
        if self.positions not in ("sinusoidal", "learned"):
            raise ValueError(
                f"`positions` must be 'sinusoidal' or 'learned'; got {self.positions!r}."
            )

    @property
    def decoder_block(self) -> BlockConfig:
        """``block`` with causal self-attention and cross-attention (MEDL Fig. 7.15b)."""
        return self.block.replace(causal=True, cross_attention=True)

    @property
    def shared_vocab(self) -> bool:
        return self.tgt_vocab_size is None

    @property
    def target_vocab_size(self) -> int:
        return self.src_vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size


#: ``vaswani-base`` (Vaswani et al. 2017 Table 3; MEDL §7.5): N=6, d=512, d_ff=2048, h=8,
#: post-norm, sinusoidal, shared 37,000 vocabulary. ``vaswani-big``: d=1024, d_ff=4096, h=16,
#: dropout 0.3.
TRANSFORMER_PRESETS: dict[str, TransformerConfig] = {
    "vaswani-base": TransformerConfig(src_vocab_size=37000),
    "vaswani-big": TransformerConfig(
        src_vocab_size=37000,
        embed_dim=1024,
        block=vaswani_block(16, mlp_dim=4096, dropout_rate=0.3),
    ),
}


class Transformer(DecodingModel):
    r"""Encoder–decoder transformer (see the module docstring).

    Teacher forcing (all target positions at once, causal mask): ``model(src_BxS, tgt_in_BxT,
    src_lengths=None, tgt_lengths=None, *, deterministic=True) -> logits_BxTxV`` (float32),
    ``tgt_in = [<start>, y_1, …]``. Decoding (:mod:`seqjax.decoding`) encodes the source once
    (MEDL (7.34)); pass it with ``inputs={"src": ..., "src_lengths": ...}``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cfg = TransformerConfig(src_vocab_size=20, num_layers=2, embed_dim=16,
        ...                         block=vaswani_block(2, mlp_dim=32))
        >>> model = Transformer(cfg)
        >>> src, tgt = jnp.ones((2, 6), jnp.int32), jnp.ones((2, 5), jnp.int32)
        >>> v = model.init(jax.random.PRNGKey(0), src, tgt)
        >>> model.apply(v, src, tgt, jnp.array([6, 3])).shape
        (2, 5, 20)
    """

    config: TransformerConfig
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    from_preset = preset_constructor(TRANSFORMER_PRESETS)

    @property
    def vocab_size(self) -> int:
        """The target vocabulary (what the decoder emits)."""
        return self.config.target_vocab_size

    def setup(self) -> None:
        cfg = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        emb_init = nn.initializers.normal(stddev=cfg.embed_dim**-0.5)
        table = lambda vocab: Embed(vocab, cfg.embed_dim, embedding_init=emb_init, **kw)
        if cfg.shared_vocab:
            self.shared_embed = table(cfg.src_vocab_size)
        else:
            self.src_embed, self.tgt_embed = table(cfg.src_vocab_size), table(cfg.tgt_vocab_size)
        if cfg.positions == "learned":
            self.src_pos_embed = LearnedPositionalEmbedding(cfg.block_size, **kw)
            self.tgt_pos_embed = LearnedPositionalEmbedding(cfg.block_size, **kw)
        else:
            self.sinusoid = SinusoidalPositionalEmbedding()
        self.encoder = block_stack(
            self, TransformerEncoder, cfg.block, cfg.encoder_layers or cfg.num_layers
        )
        self.decoder = block_stack(
            self, TransformerDecoder, cfg.decoder_block, cfg.decoder_layers or cfg.num_layers
        )
        self.drop = nn.Dropout(cfg.block.dropout_rate)
        if cfg.tie_embeddings:
            if cfg.output_bias:
                self.output_bias = self.param("output_bias", nn.initializers.zeros,
                                              (self.vocab_size,), self.param_dtype)
        else:
            self.output = Dense(cfg.target_vocab_size, use_bias=cfg.output_bias, **kw)

    def _table(self, source: bool) -> nn.Embed:
        if self.config.shared_vocab:
            return self.shared_embed
        return self.src_embed if source else self.tgt_embed

    def _embed(self, tokens_BxT: Array, source: bool, positions_BxT: Array | None,
               deterministic: bool) -> Array:
        cfg, table = self.config, self._table(source)
        # Under jit a row holding an id outside [0, V) is NaN (seqjax._traced_checks).
        x_BxTxD = poison_bad_ids(table(tokens_BxT), tokens_BxT, table.num_embeddings)
        if cfg.scale_embeddings:
            x_BxTxD = x_BxTxD * math.sqrt(cfg.embed_dim)
        if cfg.positions == "learned":
            pos = self.src_pos_embed if source else self.tgt_pos_embed
            x_BxTxD = pos(x_BxTxD, positions_BxT)
        else:
            x_BxTxD = self.sinusoid(x_BxTxD, positions_BxT)
        return self.drop(x_BxTxD, deterministic=deterministic)

    def _head(self, h_BxTxD: Array) -> Array:
        cfg = self.config
        if cfg.tie_embeddings:
            logits = flat_attend(self._table(False), h_BxTxD)
            if cfg.output_bias:
                logits = logits + self.output_bias
        else:
            logits = self.output(h_BxTxD)
        return logits.astype(jnp.float32)

    def encode(self, src_BxS: Array, src_lengths: Array | None = None, *,
               deterministic: bool = True) -> tuple[Array, ValidLengths]:
        """``(z_BxSxD, src_lengths_B)``: the encoder output ``Z*`` (zeros at padding) and the
        checked source lengths (a :class:`~seqjax._checks.ValidLengths`)."""
        src_BxS, checked = check_filled(src_BxS, src_lengths, self.config.src_vocab_size, "src",
                                        "the decoder's cross-attention needs a key")
        src_len = src_BxS.shape[1]
        check_block_size(src_len, "src", self.config)
        x_BxSxD = self._embed(src_BxS, True, None, deterministic)
        z_BxSxD = self.encoder(x_BxSxD, lengths=checked, deterministic=deterministic)
        # Under jit a source length outside [1, S] makes its row NaN (seqjax._traced_checks).
        return poison_bad_lengths(z_BxSxD, src_lengths, 1, src_len), checked

    def __call__(self, src_BxS: Array, tgt_in_BxT: Array, src_lengths: Array | None = None,
                 tgt_lengths: Array | None = None, *, deterministic: bool = True) -> Array:
        tgt_in_BxT = check_tokens(tgt_in_BxT, "tgt_in", self.config.target_vocab_size)
        check_same_batch(tgt_in_BxT, "tgt_in", src_BxS, "src")
        z_BxSxD, src_checked = self.encode(src_BxS, src_lengths, deterministic=deterministic)
        batch, tgt_len = tgt_in_BxT.shape
        check_block_size(tgt_len, "tgt_in", self.config)
        tgt_checked = (
            None if tgt_lengths is None
            else check_lengths(tgt_lengths, "tgt_lengths", batch, tgt_len)
        )
        y_BxTxD = self._embed(tgt_in_BxT, False, None, deterministic)
        h_BxTxD = self.decoder(y_BxTxD, lengths=tgt_checked, encoder_out=z_BxSxD,
                               encoder_lengths=src_checked, deterministic=deterministic)
        # Under jit a length outside [1, S] / [0, T] makes its row NaN (the source's too: the
        # cross-attention may not read its NaN encoder output, the keys being fully masked).
        h_BxTxD = poison_bad_lengths(h_BxTxD, src_lengths, 1, z_BxSxD.shape[1])
        h_BxTxD = poison_bad_lengths(h_BxTxD, tgt_lengths, 0, tgt_len)
        return self._head(h_BxTxD)

    # ----------------------------------------------------------------- decoding interface

    def _prefill(self, prompt_BxT: Array, lengths_B: Array, max_len: int | None, src_BxS: Array,
                 src_lengths: Array | None) -> dict:
        batch, num_steps = prompt_BxT.shape
        max_len = check_decode_len(max_len, num_steps, self.config)
        z_BxSxD, src_checked = self.encode(src_BxS, src_lengths)
        cache = self.decoder.init_cache(batch, max_len)
        # Always one decoder pass (all lengths 0 for 1-token prompts): it projects the encoder
        # output into each layer's cross-attention keys/values once, for every later step.
        y_BxTxD = self._embed(prompt_BxT[:, : max(num_steps - 1, 1)], False, None, True)
        # in [0, T - 1]: the prompt lengths were checked at the door
        lengths = check_lengths(lengths_B, "lengths", batch, y_BxTxD.shape[1])
        _, cache = self.decoder.decode(
            y_BxTxD, cache, lengths=lengths, encoder_out=z_BxSxD, encoder_lengths=src_checked
        )
        cache = swap_layers_batch(cache, self.config.scan_layers)
        return {"cache": cache, "enc": z_BxSxD, "src_lengths": src_checked.value,
                "positions": lengths_B}

    def _step(self, state: dict, tokens_B: Array) -> tuple[Array, dict]:
        batch, src_len = state["enc"].shape[:2]
        # the source lengths of the state, checked when it was made
        src_lengths = check_lengths(state["src_lengths"], "encoder_lengths", batch, src_len)
        return cached_step(
            self, state, tokens_B, lambda y, pos: self._embed(y, False, pos, True),
            encoder_out=state["enc"], encoder_lengths=src_lengths,
        )

    def init_decode_state(self, params: Any, prompt_BxT: Array,
                          prompt_lengths_B: Array | None = None, max_len: int | None = None, *,
                          src: Array, src_lengths: Array | None = None) -> dict:
        """Encode ``src``, prefill the caches with ``prompt[b, :len_b - 1]``: state ``{"cache",
        "enc", "src_lengths", "positions"}``, batch-leading; each layer's cache also holds the
        source's cross-attention keys/values, computed once here (``max_len``:
        :func:`~seqjax.models._common.check_decode_len`)."""
        return self._init_state(
            params, prompt_BxT, prompt_lengths_B, max_len, src, src_lengths, src=src
        )

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
    as_variables,
    check_lengths,
    check_nonempty,
    check_preset,
    check_prompt,
    check_same_batch,
    check_step_tokens,
    check_tokens,
    flag_oov_rows,
    layers_from_batch_major,
    layers_to_batch_major,
    split_oov,
)
from seqjax.nn._block_config import check_block, model_block
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
    options.setdefault("mlp_dim", 2048)
    options.setdefault("norm", "post")
    options.setdefault("activation", "relu")
    options.setdefault("dropout_rate", 0.1)
    options.setdefault("attention_dropout_rate", 0.0)
    options.setdefault("attention_use_bias", True)
    options.setdefault("kernel_init", _XAVIER)
    return BlockConfig.encoder(num_heads, **options)


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


class Transformer(nn.Module):
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

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> Transformer:
        """A model from :data:`TRANSFORMER_PRESETS`, with config fields overridden."""
        return cls(check_preset(name, TRANSFORMER_PRESETS).replace(**overrides))

    @property
    def vocab_size(self) -> int:
        """The target vocabulary (what the decoder emits)."""
        return self.config.target_vocab_size

    def setup(self) -> None:
        cfg = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        emb_init = nn.initializers.normal(stddev=cfg.embed_dim**-0.5)
        if cfg.shared_vocab:
            self.shared_embed = Embed(
                cfg.src_vocab_size, cfg.embed_dim, embedding_init=emb_init, **kw
            )
        else:
            self.src_embed = Embed(cfg.src_vocab_size, cfg.embed_dim, embedding_init=emb_init, **kw)
            self.tgt_embed = Embed(
                cfg.target_vocab_size, cfg.embed_dim, embedding_init=emb_init, **kw
            )
        if cfg.positions == "learned":
            self.src_pos_embed = LearnedPositionalEmbedding(cfg.block_size, **kw)
            self.tgt_pos_embed = LearnedPositionalEmbedding(cfg.block_size, **kw)
        else:
            self.sinusoid = SinusoidalPositionalEmbedding()
        owner = "TransformerConfig"
        stack: dict[str, Any] = dict(scan_layers=cfg.scan_layers, remat=cfg.remat)
        self.encoder = TransformerEncoder(
            config=model_block(cfg.block, self.dtype, self.param_dtype, owner=owner),
            num_layers=cfg.encoder_layers or cfg.num_layers,
            **stack,
        )
        self.decoder = TransformerDecoder(
            config=model_block(cfg.decoder_block, self.dtype, self.param_dtype, owner=owner),
            num_layers=cfg.decoder_layers or cfg.num_layers,
            **stack,
        )
        self.drop = nn.Dropout(cfg.block.dropout_rate)
        if cfg.tie_embeddings:
            if cfg.output_bias:
                self.output_bias = self.param(
                    "output_bias",
                    nn.initializers.zeros_init(),
                    (cfg.target_vocab_size,),
                    self.param_dtype,
                )
        else:
            self.output = Dense(cfg.target_vocab_size, use_bias=cfg.output_bias, **kw)

    def _target_table(self) -> nn.Embed:
        return self.shared_embed if self.config.shared_vocab else self.tgt_embed

    def _embed(
        self, tokens_BxT: Array, source: bool, positions_BxT: Array | None, deterministic: bool
    ) -> Array:
        cfg = self.config
        table = (
            self.shared_embed if cfg.shared_vocab else self.src_embed if source else self.tgt_embed
        )
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
            logits = flat_attend(self._target_table(), h_BxTxD)
            if cfg.output_bias:
                logits = logits + self.output_bias
        else:
            logits = self.output(h_BxTxD)
        return logits.astype(jnp.float32)

    def _check_len(self, num_steps: int, name: str) -> None:
        if self.config.positions == "learned" and num_steps > self.config.block_size:
            raise ValueError(
                f"`{name}` has {num_steps} positions but block_size={self.config.block_size}."
            )

    def encode(
        self, src_BxS: Array, src_lengths: Array | None = None, *, deterministic: bool = True
    ) -> tuple[Array, ValidLengths]:
        """``(z_BxSxD, src_lengths_B)``: the encoder output ``Z*`` (zeros at padding) and the
        checked source lengths (a :class:`~seqjax._checks.ValidLengths`)."""
        src_BxS = check_tokens(src_BxS, "src", self.config.src_vocab_size)
        check_nonempty(src_BxS, "src", "the decoder's cross-attention needs a key")
        batch, src_len = src_BxS.shape
        self._check_len(src_len, "src")
        given = src_lengths
        if src_lengths is None:
            src_lengths = jnp.full((batch,), src_len, jnp.int32)
        checked = check_lengths(src_lengths, "src_lengths", batch, src_len, 1)
        x_BxSxD = self._embed(src_BxS, True, None, deterministic)
        z_BxSxD = self.encoder(x_BxSxD, lengths=checked, deterministic=deterministic)
        # Under jit a source length outside [1, S] makes its row NaN (seqjax._traced_checks).
        return poison_bad_lengths(z_BxSxD, given, 1, src_len), checked

    def __call__(
        self,
        src_BxS: Array,
        tgt_in_BxT: Array,
        src_lengths: Array | None = None,
        tgt_lengths: Array | None = None,
        *,
        deterministic: bool = True,
    ) -> Array:
        tgt_in_BxT = check_tokens(tgt_in_BxT, "tgt_in", self.config.target_vocab_size)
        check_same_batch(tgt_in_BxT, "tgt_in", src_BxS, "src")
        z_BxSxD, src_checked = self.encode(src_BxS, src_lengths, deterministic=deterministic)
        batch, tgt_len = tgt_in_BxT.shape
        self._check_len(tgt_len, "tgt_in")
        tgt_checked = (
            None if tgt_lengths is None
            else check_lengths(tgt_lengths, "tgt_lengths", batch, tgt_len)
        )
        y_BxTxD = self._embed(tgt_in_BxT, False, None, deterministic)
        h_BxTxD = self.decoder(
            y_BxTxD,
            lengths=tgt_checked,
            encoder_out=z_BxSxD,
            encoder_lengths=src_checked,
            deterministic=deterministic,
        )
        # Under jit a length outside [1, S] / [0, T] makes its row NaN (the source's too: the
        # cross-attention may not read its NaN encoder output, the keys being fully masked).
        h_BxTxD = poison_bad_lengths(h_BxTxD, src_lengths, 1, z_BxSxD.shape[1])
        h_BxTxD = poison_bad_lengths(h_BxTxD, tgt_lengths, 0, tgt_len)
        return self._head(h_BxTxD)

    # ----------------------------------------------------------------- decoding interface

    def _prefill(
        self,
        prompt_BxT: Array,
        lengths_B: Array,
        max_len: int,
        src_BxS: Array,
        src_lengths: Array | None,
    ) -> dict:
        z_BxSxD, src_checked = self.encode(src_BxS, src_lengths)
        batch, num_steps = prompt_BxT.shape
        cache = self.decoder.init_cache(batch, max_len)
        # Always one decoder pass (all lengths 0 for 1-token prompts): it projects the encoder
        # output into each layer's cross-attention keys/values once, for every later step.
        y_BxTxD = self._embed(prompt_BxT[:, : max(num_steps - 1, 1)], False, None, True)
        # in [0, T - 1]: the prompt lengths were checked at the door
        lengths = check_lengths(lengths_B, "lengths", batch, y_BxTxD.shape[1])
        _, cache = self.decoder.decode(
            y_BxTxD,
            cache,
            lengths=lengths,
            encoder_out=z_BxSxD,
            encoder_lengths=src_checked,
        )
        return {
            "cache": layers_to_batch_major(cache, self.config.scan_layers),
            "enc": z_BxSxD,
            "src_lengths": src_checked.value,
            "positions": lengths_B,
        }

    def _step(self, state: dict, tokens_B: Array) -> tuple[Array, dict]:
        # Out-of-vocabulary ids (seen only here under jit): NaN logits, cache not advanced.
        tokens_B, valid_B = split_oov(tokens_B, self.config.target_vocab_size)
        y_Bx1xD = self._embed(tokens_B[:, None], False, state["positions"][:, None], True)
        cache = layers_from_batch_major(state["cache"], self.config.scan_layers)
        batch, src_len = state["enc"].shape[:2]
        valid = check_lengths(valid_B.astype(jnp.int32), "lengths", batch, 1)
        # the source lengths of the state, checked when it was made
        src_lengths = check_lengths(state["src_lengths"], "encoder_lengths", batch, src_len)
        h_Bx1xD, cache = self.decoder.decode(
            y_Bx1xD,
            cache,
            lengths=valid,
            encoder_out=state["enc"],
            encoder_lengths=src_lengths,
        )
        new_state = {
            **state,
            "cache": layers_to_batch_major(cache, self.config.scan_layers),
            "positions": state["positions"] + valid_B,
        }
        return flag_oov_rows(self._head(h_Bx1xD)[:, 0], valid_B), new_state

    def init_decode_state(
        self,
        params: Any,
        prompt_BxT: Array,
        prompt_lengths_B: Array | None = None,
        max_len: int | None = None,
        *,
        src: Array,
        src_lengths: Array | None = None,
    ) -> dict:
        """Encode ``src``, prefill the caches with ``prompt[b, :len_b - 1]``: state ``{"cache",
        "enc", "src_lengths", "positions"}``, batch-leading; each layer's cache also holds the
        source's cross-attention keys/values, computed once here."""
        prompt_BxT, prompt_lengths_B = check_prompt(
            prompt_BxT, prompt_lengths_B, self.config.target_vocab_size
        )
        check_same_batch(src, "src", prompt_BxT, "prompt")
        num_steps = prompt_BxT.shape[1]
        max_len = num_steps if max_len is None else int(max_len)
        if max_len < num_steps:
            raise ValueError(f"`max_len` must be >= the prompt length {num_steps}; got {max_len}.")
        if self.config.positions == "learned" and max_len - 1 > self.config.block_size:
            raise ValueError(
                f"decoding needs {max_len - 1} positions but block_size={self.config.block_size}."
            )
        return self.apply(  # type: ignore[return-value]
            as_variables(params),
            prompt_BxT,
            prompt_lengths_B - 1,
            max_len,
            src,
            src_lengths,
            method=type(self)._prefill,
        )

    def decode_step(self, params: Any, state: dict, tokens_B: Array) -> tuple[Array, dict]:
        """Append one target token per row: ``(logits_BxV, new_state)``. An id outside the
        target vocabulary is a ``ValueError`` (under ``jit``: NaN logits, cache kept)."""
        tokens_B = check_step_tokens(tokens_B, self.config.target_vocab_size, state)
        return self.apply(as_variables(params), state, tokens_B, method=type(self)._step)  # type: ignore[return-value]

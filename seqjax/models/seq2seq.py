r"""RNN encoder–decoder (sequence-to-sequence), with or without attention.

The encoder reads the source ``x^{⟨1..T_in⟩}`` (``reverse_source``: reversed within its
length, in training and use, MEDL §7.4; optionally bidirectional) into outputs ``v^{⟨τ⟩}`` and
a context vector ``z*`` (its last hidden state); the decoder is a conditional LM over the
target, trained with teacher forcing (MEDL §7.4). Variants (``context``):

* ``"initial_state"`` — ``z*`` only initialises the decoder (Sutskever et al. 2014;
  MEDL Fig. 7.9(a)): :math:`s^{⟨t⟩} = f(s^{⟨t-1⟩}, y^{⟨t-1⟩})`, :math:`s^{⟨0⟩} = z^*`.
* ``"every_step"`` — ``z*`` is also fed at every step and to the output layer
  (Cho et al. 2014; MEDL Fig. 7.9(b); lecture notes eq. (4)):
  :math:`s^{⟨t⟩} = f(s^{⟨t-1⟩}, [y^{⟨t-1⟩}; z^*])`, :math:`\hat y^{⟨t⟩} = g([s^{⟨t⟩}; z^*])`.
* ``"attention"`` — a dynamic context :math:`u^{⟨t⟩} = \sum_\tau \alpha^{⟨t⟩}_\tau v^{⟨\tau⟩}`
  (MEDL (7.20)–(7.22); lecture notes (3)–(7)), with ``attention``:

  - ``"bahdanau"``: additive score with the *previous* state as query,
    :math:`\alpha^{⟨t⟩} = \mathrm{softmax}_\tau\, w^\top\tanh(W_a s^{⟨t-1⟩} + W_b v^{⟨\tau⟩})`,
    :math:`s^{⟨t⟩} = f(s^{⟨t-1⟩}, [y^{⟨t-1⟩}; u^{⟨t⟩}])`,
    :math:`\hat y^{⟨t⟩} = g([s^{⟨t⟩}; u^{⟨t⟩}])` (MEDL (7.22), Fig. 7.10; Bahdanau et al.
    2015, App. A);
  - ``"luong_dot"`` / ``"luong_general"`` / ``"luong_concat"``: the *current* state is the
    query, :math:`s^{⟨t⟩} = f(s^{⟨t-1⟩}, y^{⟨t-1⟩})`,
    :math:`\alpha^{⟨t⟩} = \mathrm{softmax}_\tau\, s(s^{⟨t⟩}, v^{⟨\tau⟩})`,
    :math:`\tilde h^{⟨t⟩} = \tanh(W_c [u^{⟨t⟩}; s^{⟨t⟩}])`, :math:`\hat y^{⟨t⟩} = g(\tilde h^{⟨t⟩})`
    (Luong et al. 2015; scores of MEDL (7.21)).

    Luong's input feeding (§3.3, :math:`\tilde h^{⟨t-1⟩}` fed into the next step) is left
    out: the decoder's input is :math:`y^{⟨t-1⟩}` alone, so later steps do not see past
    alignments (their Table 1 without "feed input").

**Output layer**: ``output_context=False`` computes the output of ``"every_step"`` and
``"bahdanau"`` on the state alone, as ``"initial_state"`` always does, :math:`\hat y^{⟨t⟩} =
\mathrm{softmax}(W_y s^{⟨t⟩} + b)` (lecture notes eq. (5), exactly with ``output_bias=False``;
MEDL (7.22)); Luong refuses it.
With ``context="every_step"``, ``cell_type="elman"``, ``bridge="zeros"`` and
``output_context=output_bias=False`` the model is the notes' eqs. (3)–(5) with
:math:`\sigma(\mathbf y_{t-1}, \mathbf h'_{t-1}, \mathbf c) = \tanh(W[\mathbf y_{t-1};
\mathbf c] + U\mathbf h'_{t-1} + b)` and :math:`\mathbf h'_0 = 0`.

**Initial decoder state** (``bridge``): ``"copy"`` the encoder's final carries layer by layer
(a unidirectional encoder as deep as the decoder); ``"dense"`` every carry part of every
decoder layer ``tanh(W z* + b)`` (Cho et al.; Bahdanau et al. use the backward half of
``z*``); ``"zeros"``; ``"auto"``: ``"copy"`` when possible, else ``"dense"``.

**Scheduled sampling** (Bengio et al. 2015; exposure bias, Bishop §12.3.1):
:func:`scheduled_sampling_inputs` and :func:`scheduled_sampling_epsilon`.

Parameter names: ``src_embed/embedding``, ``encoder/layer_{l}/...``,
``bridge_layers_{i}/{kernel,bias}`` (one per carry part of every decoder layer, in order),
``tgt_embed/embedding``, ``decoder/layer_{l}/...`` (cells), ``decoder/attention/...``
(:class:`~seqjax.nn.attention.Attention`), ``decoder/combine/kernel`` (Luong's ``W_c``),
``output/{kernel,bias}``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import (
    ConfigBase,
    check_optional_positive_int,
    check_positive_int,
    is_concrete,
    retired_flags,
)
from seqjax._traced_checks import poison_bad_ids, poison_bad_lengths
from seqjax.models._common import (
    DecodingModel,
    as_variables,
    check_filled,
    check_nonempty,
    check_same_batch,
    check_tokens,
    flag_oov_rows,
    split_oov,
)
from seqjax.models.rnn import RNNConfig, check_flag, require_vocab, token_embed
from seqjax.nn.attention import Attention
from seqjax.nn.dense import Dense
from seqjax.nn.masks import padding_mask
from seqjax.nn.recurrent.layers import select_rows

Array = jax.Array
Dtype = Any
Carry = Any

__all__ = [
    "SCHEDULES", "Seq2Seq", "Seq2SeqConfig", "reverse_sequences", "scheduled_sampling_epsilon",
    "scheduled_sampling_inputs",
]

CONTEXTS = ("initial_state", "every_step", "attention")
ATTENTIONS = {
    "bahdanau": "additive",
    "luong_dot": "dot",
    "luong_general": "general",
    "luong_concat": "concat",
}
BRIDGES = ("auto", "copy", "dense", "zeros")


def reverse_sequences(x_BxT: Array, lengths_B: Array | None) -> Array:
    """Reverse each row within its length, padding staying at the end (MEDL §7.4):
    ``[B, T, ...] -> [B, T, ...]``, ``y[b, t] = x[b, len_b - 1 - t]`` for ``t < len_b``.

    Example:
        >>> reverse_sequences(jnp.array([[1, 2, 3, 0]]), jnp.array([3])).tolist()
        [[3, 2, 1, 0]]
    """
    if lengths_B is None:
        return x_BxT[:, ::-1]
    t_T, n_Bx1 = jnp.arange(x_BxT.shape[1], dtype=jnp.int32), lengths_B[:, None]
    idx_BxT = jnp.where(t_T < n_Bx1, n_Bx1 - 1 - t_T, t_T)
    idx = idx_BxT.reshape(idx_BxT.shape + (1,) * (x_BxT.ndim - 2))
    return jnp.take_along_axis(x_BxT, idx, axis=1)


def _carry_h(carry: Carry) -> Array:
    """The hidden state ``h`` of a cell carry (LSTM ``(c, h)`` -> ``h``)."""
    return carry[-1] if isinstance(carry, tuple) else carry


class _DecoderStep(nn.Module):
    """One decoder step; scanned over time for teacher forcing, called alone when decoding."""

    config: Seq2SeqConfig
    dtype: Dtype | None
    param_dtype: Dtype

    @nn.compact
    def __call__(self, carries: tuple[Carry, ...], inputs: tuple[Array, Array],
                 enc_BxSxV: Array | None, src_valid_BxS: Array,
                 z_BxC: Array) -> tuple[tuple[Carry, ...], tuple[Array, Array | None]]:
        cfg, kw = self.config, dict(dtype=self.dtype, param_dtype=self.param_dtype)
        y_prev_BxE, valid_B = inputs
        weights_BxS = None
        if cfg.context == "attention":
            attn = Attention(score=ATTENTIONS[cfg.attention], hidden=cfg.attention_hidden,
                             name="attention", **kw)
        ctx_BxC = None  # what the input and the output see besides y^{t-1} / s^{t}
        if cfg.context == "every_step":
            ctx_BxC = z_BxC
        elif cfg.context == "attention" and cfg.attention == "bahdanau":
            # Bahdanau timing: the query is the previous state s^{t-1} (MEDL (7.22)).
            assert enc_BxSxV is not None
            ctx_BxC, weights_BxS = attn(_carry_h(carries[-1]), enc_BxSxV, mask=src_valid_BxS)
        h_BxH = y_prev_BxE
        if ctx_BxC is not None:
            h_BxH = jnp.concatenate([y_prev_BxE, ctx_BxC.astype(y_prev_BxE.dtype)], axis=-1)
        new_carries = []
        for layer, carry in enumerate(carries):
            cell = cfg.encoder.cell(self.dtype, self.param_dtype, name=f"layer_{layer}")
            carry, h_BxH = cell(carry, h_BxH)
            new_carries.append(carry)
        old = tuple(carries)
        cast = jax.tree_util.tree_map(lambda n, o: n.astype(o.dtype), tuple(new_carries), old)
        new_carries = select_rows(valid_B, cast, old)
        if cfg.context == "attention" and cfg.attention != "bahdanau":
            # Luong timing: the query is the current state s^{t}.
            assert enc_BxSxV is not None
            u_BxV, weights_BxS = attn(h_BxH, enc_BxSxV, mask=src_valid_BxS)
            combine = Dense(cfg.encoder.features, use_bias=False, name="combine", **kw)
            out_BxO = jnp.tanh(combine(jnp.concatenate([u_BxV.astype(h_BxH.dtype), h_BxH], -1)))
        elif ctx_BxC is None or not cfg.output_context:
            out_BxO = h_BxH  # notes eq. (5) / MEDL (7.22): the output sees s^{t} alone
        else:
            out_BxO = jnp.concatenate([h_BxH, ctx_BxC.astype(h_BxH.dtype)], axis=-1)
        return new_carries, (out_BxO, weights_BxS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Seq2SeqConfig(ConfigBase):
    r"""Options of :class:`Seq2Seq`, each checked when built (``ValueError``/``TypeError``).

    Example:
        >>> cfg = Seq2SeqConfig(encoder=RNNConfig(vocab_size=12, embed_dim=8, hidden_size=16),
        ...                     tgt_vocab_size=10, context="every_step")
        >>> cfg.bridge_mode, cfg.replace(decoder_layers=2).bridge_mode
        ('copy', 'dense')

    Attributes:
        encoder: an :class:`~seqjax.models.RNNConfig`: ``vocab_size`` (the source's,
            required), ``num_layers``, ``bidirectional`` (``v^{⟨τ⟩} = [h_f^{⟨τ⟩};
            h_r^{⟨τ⟩}]``, MEDL Fig. 7.10) and ``unroll`` are the encoder's; ``embed_dim``,
            ``hidden_size``, ``cell_type``, ``cell_kwargs`` and ``dropout_rate`` (embeddings
            and decoder outputs) both sides'.
        tgt_vocab_size: the target vocabulary (MEDL: ``p`` and ``q`` differ).
        decoder_layers: stacked decoder layers.
        context, attention, reverse_source (Sutskever et al.), bridge (:attr:`bridge_mode`),
            output_context: as in the module docstring.
        attention_hidden: ``m̃`` of additive/concat scores (default: the key size).
        output_bias: the output layer's bias ``b`` (the notes' eq. (5) has none).
    """

    encoder: RNNConfig
    tgt_vocab_size: int
    decoder_layers: int = 1
    context: str = "attention"
    attention: str = "bahdanau"
    attention_hidden: int | None = None
    reverse_source: bool = False
    bridge: str = "auto"
    output_context: bool = True
    output_bias: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.encoder, RNNConfig):
            raise TypeError(
                "`encoder` of Seq2SeqConfig must be an RNNConfig; "
                f"got {type(self.encoder).__name__}."
            )
        require_vocab(self.encoder, "Seq2SeqConfig", "encoder.vocab_size")
        check_positive_int(self.tgt_vocab_size, "tgt_vocab_size")
        check_positive_int(self.decoder_layers, "decoder_layers")
        check_optional_positive_int(self.attention_hidden, "attention_hidden")
        for name in ("reverse_source", "output_context", "output_bias"):
            check_flag(getattr(self, name), name)
        if self.context not in CONTEXTS:
            raise ValueError(f"`context` must be one of {CONTEXTS}; got {self.context!r}.")
        if self.context == "attention" and self.attention not in ATTENTIONS:
            raise ValueError(
                f"`attention` must be one of {sorted(ATTENTIONS)}; got {self.attention!r}."
            )
        if not self.output_context and self.context == "attention" and self.attention != "bahdanau":
            raise ValueError(
                "`output_context=False` (output on s alone, notes eq. (5)) applies to "
                "context='every_step' or attention='bahdanau'; Luong's output is "
                f"g(tanh(W_c[u; s])) by construction; got attention={self.attention!r}."
            )
        if self.bridge not in BRIDGES:
            raise ValueError(f"`bridge` must be one of {BRIDGES}; got {self.bridge!r}.")
        if self.bridge == "copy" and not self._copyable:
            raise ValueError(
                "`bridge='copy'` needs a unidirectional encoder with as many layers as the "
                f"decoder; got encoder.bidirectional={self.encoder.bidirectional}, "
                f"encoder.num_layers={self.encoder.num_layers}, "
                f"decoder_layers={self.decoder_layers}."
            )

    @property
    def _copyable(self) -> bool:
        enc = self.encoder
        return not enc.bidirectional and enc.num_layers == self.decoder_layers

    @property
    def src_vocab_size(self) -> int:
        """The source vocabulary, ``encoder.vocab_size``."""
        return self.encoder.vocab_size  # type: ignore[return-value]  # required above

    @property
    def bridge_mode(self) -> str:
        """``bridge`` with ``"auto"`` resolved: ``"copy"`` when possible, else ``"dense"``."""
        if self.bridge == "auto":
            return "copy" if self._copyable else "dense"
        return self.bridge


class Seq2Seq(DecodingModel):
    r"""RNN encoder–decoder with the context variants of MEDL §7.4 (see the module docstring).

    Teacher forcing: ``model(src_BxS, tgt_in_BxT, src_lengths=None, *, deterministic=True)
    -> logits_BxTxV`` (float32), ``tgt_in = [<start>, y_1, …, y_{T-1}]``; mask padded targets
    in the loss. :meth:`with_weights` also returns the attention weights. Decoding
    (:mod:`seqjax.decoding`): prompt usually ``<start>`` (``[B, 1]``), source passed as
    ``inputs={"src": ..., "src_lengths": ...}``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> enc = RNNConfig(vocab_size=12, embed_dim=8, hidden_size=16, cell_type="gru",
        ...                 bidirectional=True)
        >>> m = Seq2Seq(Seq2SeqConfig(encoder=enc, tgt_vocab_size=10, context="attention",
        ...                           attention="bahdanau"))
        >>> src, tgt = jnp.ones((2, 5), jnp.int32), jnp.ones((2, 4), jnp.int32)
        >>> v = m.init(jax.random.PRNGKey(0), src, tgt)
        >>> logits, alpha = m.apply(v, src, tgt, jnp.array([5, 3]), method="with_weights")
        >>> logits.shape, alpha.shape
        ((2, 4, 10), (2, 4, 5))
    """

    config: Seq2SeqConfig
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    config_type = Seq2SeqConfig

    @property
    def vocab_size(self) -> int:
        """The target vocabulary (what the decoder emits)."""
        return self.config.tgt_vocab_size

    def setup(self) -> None:
        cfg, enc = self.config, self.config.encoder
        kw: dict[str, Any] = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        self.src_embed = token_embed(cfg.src_vocab_size, enc.embed_dim, **kw)
        self.encoder = enc.stack(self.dtype, self.param_dtype)
        self.tgt_embed = token_embed(cfg.tgt_vocab_size, enc.embed_dim, **kw)
        # Scanned over T (teacher forcing) or one step (decoding): one "decoder/..." tree.
        self.decoder = nn.scan(
            _DecoderStep, variable_broadcast="params", split_rngs={"params": False},
            in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast), out_axes=0,
        )(cfg, **kw)
        self.output = Dense(cfg.tgt_vocab_size, use_bias=cfg.output_bias, **kw)
        self.drop = nn.Dropout(enc.dropout_rate)
        if cfg.bridge_mode == "dense":
            n_parts = len(jax.tree_util.tree_leaves(self._zero_carries(1)))
            self.bridge_layers = [Dense(enc.features, **kw) for _ in range(n_parts)]

    def encode(self, src_BxS: Array, src_lengths: Array | None = None, *,
               deterministic: bool = True) -> tuple[Array, Array, Array, tuple[Carry, ...]]:
        """``(v_BxSxV, src_valid_BxS, z_BxC, decoder_init_carries)``: ``v`` the encoder outputs
        (attention keys = values, in source order as fed: reversed when ``reverse_source``);
        ``z*`` the last hidden state, ``[h_f^{⟨n⟩}; h_r^{⟨1⟩}]`` when bidirectional."""
        src_BxS, checked = check_filled(src_BxS, src_lengths, self.config.src_vocab_size, "src",
                                        "the encoder needs a last state to pass on")
        batch, src_len = src_BxS.shape
        if self.config.reverse_source:
            src_BxS = reverse_sequences(src_BxS, checked.value)
        # Under jit a row holding an id outside [0, V) is NaN (seqjax._traced_checks).
        e_BxSxE = poison_bad_ids(self.src_embed(src_BxS), src_BxS, self.config.src_vocab_size)
        e_BxSxE = self.drop(e_BxSxE, deterministic=deterministic)
        v_BxSxV, finals = self.encoder.with_state(e_BxSxE, checked, deterministic=deterministic)
        # Under jit a row whose length lies outside [1, S] is NaN (seqjax._traced_checks).
        v_BxSxV, finals = jax.tree_util.tree_map(
            lambda a: poison_bad_lengths(a, checked.value, 1, src_len), (v_BxSxV, finals)
        )
        top = finals[-1]
        if self.config.encoder.bidirectional:
            z_BxC = jnp.concatenate([_carry_h(top[0]), _carry_h(top[1])], axis=-1)
        else:
            z_BxC = _carry_h(top)
        mode = self.config.bridge_mode
        if mode == "copy":
            init = tuple(finals)
        else:
            init = self._zero_carries(batch)
            if mode == "dense":
                bridges = iter(self.bridge_layers)  # one per carry part, in order
                init = jax.tree_util.tree_map(
                    lambda leaf: jnp.tanh(next(bridges)(z_BxC)).astype(leaf.dtype), init)
        return v_BxSxV, padding_mask(checked, src_len), z_BxC, init

    def _zero_carries(self, batch: int) -> tuple[Carry, ...]:
        cell = self.config.encoder.cell(None, self.param_dtype, parent=None)
        zero = cell.initialize_carry(jax.random.PRNGKey(0), (batch, 1))
        return (zero,) * self.config.decoder_layers

    def _decode(self, carries: tuple[Carry, ...], tgt_in_BxT: Array, valid_BxT: Array,
                v_BxSxV: Array, src_valid_BxS: Array, z_BxC: Array,
                deterministic: bool) -> tuple[tuple[Carry, ...], Array, Array | None]:
        y_BxTxE = poison_bad_ids(self.tgt_embed(tgt_in_BxT), tgt_in_BxT, self.config.tgt_vocab_size)
        y_BxTxE = self.drop(y_BxTxE, deterministic=deterministic)
        enc = v_BxSxV if self.config.context == "attention" else None
        xs_T = (jnp.swapaxes(y_BxTxE, 0, 1), jnp.swapaxes(valid_BxT, 0, 1))
        carries, (out_TxBxO, w_TxBxS) = self.decoder(carries, xs_T, enc, src_valid_BxS, z_BxC)
        out_BxTxO = self.drop(jnp.swapaxes(out_TxBxO, 0, 1), deterministic=deterministic)
        w_BxTxS = None if w_TxBxS is None else jnp.swapaxes(w_TxBxS, 0, 1)
        return carries, self.output(out_BxTxO).astype(jnp.float32), w_BxTxS

    @retired_flags(return_attention="Seq2Seq.with_weights")
    def __call__(self, src_BxS: Array, tgt_in_BxT: Array, src_lengths: Array | None = None, *,
                 deterministic: bool = True) -> Array:
        """Teacher-forced ``logits_BxTxV`` (float32; the class docstring)."""
        return self.with_weights(src_BxS, tgt_in_BxT, src_lengths, deterministic=deterministic)[0]

    def with_weights(self, src_BxS: Array, tgt_in_BxT: Array, src_lengths: Array | None = None, *,
                     deterministic: bool = True) -> tuple[Array, Array]:
        """As :meth:`__call__`, and the attention weights: ``(logits_BxTxV, alpha_BxTxS)``,
        row ``t`` of ``alpha`` over the source positions as given (also when
        ``reverse_source``); all zeros when ``context`` is not ``"attention"``."""
        tgt_in_BxT = check_tokens(tgt_in_BxT, "tgt_in", self.config.tgt_vocab_size)
        check_same_batch(tgt_in_BxT, "tgt_in", src_BxS, "src")
        v, src_valid, z, init = self.encode(src_BxS, src_lengths, deterministic=deterministic)
        valid_BxT = jnp.ones(tgt_in_BxT.shape, bool)
        _, logits_BxTxV, w_BxTxS = self._decode(init, tgt_in_BxT, valid_BxT, v, src_valid, z,
                                                deterministic)
        if w_BxTxS is None:
            return logits_BxTxV, jnp.zeros(tgt_in_BxT.shape + src_valid.shape[1:], jnp.float32)
        if self.config.reverse_source:
            # Report the weights against the source as given, not as fed (reversed).
            src_len_B = jnp.sum(src_valid, axis=1).astype(jnp.int32)
            w_BxSxT = reverse_sequences(jnp.swapaxes(w_BxTxS, 1, 2), src_len_B)
            w_BxTxS = jnp.swapaxes(w_BxSxT, 1, 2)
        return logits_BxTxV, w_BxTxS

    # ----------------------------------------------------------------- decoding interface

    def _prefill(self, prompt_BxT: Array, lengths_B: Array, src_BxS: Array,
                 src_lengths: Array | None) -> dict:
        v, src_valid, z, carries = self.encode(src_BxS, src_lengths)
        valid_BxT = padding_mask(lengths_B, prompt_BxT.shape[1])
        carries, _, _ = self._decode(carries, prompt_BxT, valid_BxT, v, src_valid, z, True)
        enc = v if self.config.context == "attention" else None
        return {"carries": carries, "enc": enc, "src_valid": src_valid, "z": z}

    def _step(self, state: dict, tokens_B: Array) -> tuple[Array, dict]:
        # Out-of-vocabulary ids (seen only here under jit): NaN logits, carries kept.
        tokens_B, valid_B = split_oov(tokens_B, self.config.tgt_vocab_size)
        carries, logits_Bx1xV, _ = self._decode(
            state["carries"], tokens_B[:, None], valid_B[:, None], state["enc"],
            state["src_valid"], state["z"], True,
        )
        return flag_oov_rows(logits_Bx1xV[:, 0], valid_B), {**state, "carries": carries}

    def init_decode_state(self, params: Any, prompt_BxT: Array,
                          prompt_lengths_B: Array | None = None, max_len: int | None = None, *,
                          src: Array, src_lengths: Array | None = None) -> dict:
        """Encode ``src`` once and run the decoder over ``prompt[b, :len_b - 1]``; state
        ``{"carries", "enc", "src_valid", "z"}``, every leaf batch-leading (``max_len`` is
        unused)."""
        return self._init_state(params, prompt_BxT, prompt_lengths_B, src, src_lengths, src=src)


# --------------------------------------------------------------------- scheduled sampling

#: Decay schedules of Bengio et al. (2015, §2.4) for the teacher-forcing probability.
SCHEDULES = ("linear", "exponential", "inverse_sigmoid", "constant")


def scheduled_sampling_epsilon(step: Any, schedule: str = "inverse_sigmoid", *,
                               k: float | None = None, c: float | None = None,
                               minimum: float = 0.0) -> Array:
    r"""The probability :math:`\epsilon_i` of feeding the true token at training iteration ``i``
    (Bengio et al. 2015, §2.4), float32 shaped like ``step`` (an int, traced under ``jit``):

    * ``"linear"``: :math:`\epsilon_i = \max(\epsilon, k - c\,i)`, floor :math:`\epsilon` =
      ``minimum`` in ``[0, 1)``, ``k`` default 1, slope ``c > 0``;
    * ``"exponential"``: :math:`\epsilon_i = k^i`, ``0 < k < 1``;
    * ``"inverse_sigmoid"``: :math:`\epsilon_i = k / (k + \exp(i / k))`, ``k >= 1``;
    * ``"constant"``: :math:`\epsilon_i = k` in ``[0, 1]`` (default 1: teacher forcing).

    Example:
        >>> round(float(scheduled_sampling_epsilon(1000, "inverse_sigmoid", k=200.0)), 3)
        0.574
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"`schedule` must be one of {SCHEDULES}; got {schedule!r}.")
    i = jnp.asarray(step, jnp.float32)
    if schedule == "constant":
        k = 1.0 if k is None else k
        if not 0.0 <= k <= 1.0:
            raise ValueError(f"`k` (the constant epsilon) must be in [0, 1]; got {k}.")
        return jnp.full(i.shape, k, jnp.float32)
    if schedule == "linear":
        k = 1.0 if k is None else k
        if c is None or not c > 0:
            raise ValueError(f"`c` (the slope of the linear decay) must be > 0; got {c}.")
        if not 0.0 <= minimum < 1.0:
            raise ValueError(f"`minimum` (the floor epsilon) must be in [0, 1); got {minimum}.")
        return jnp.clip(jnp.maximum(minimum, k - c * i), 0.0, 1.0)
    if schedule == "exponential":
        if k is None or not 0.0 < k < 1.0:
            raise ValueError(f"`k` of the exponential decay k**i must be in (0, 1); got {k}.")
        return jnp.exp(i * jnp.float32(math.log(k)))  # k**i without float32 rounding of k
    if k is None or not k >= 1.0:
        raise ValueError(f"`k` of the inverse sigmoid decay k/(k+exp(i/k)) must be >= 1; got {k}.")
    return jnp.float32(k) / (jnp.float32(k) + jnp.exp(i / jnp.float32(k)))


def scheduled_sampling_inputs(model: Seq2Seq, params: Any, src_BxS: Array, tgt_in_BxT: Array,
                              src_lengths: Array | None = None, *, epsilon: Any, rng: Array,
                              sample: bool = False,
                              temperature: float = 1.0) -> tuple[Array, Array]:
    r"""Decoder inputs for one scheduled-sampling training step (Bengio et al. 2015).

    ``tgt_in = [<start>, y_1, …, y_{T-1}]`` becomes ``[<start>, ỹ_1, …, ỹ_{T-1}]``,
    independently per row and step ``t >= 1``:

    .. math::
        \tilde y_t = \begin{cases} y_t & \text{with probability } \epsilon_i
        \quad\text{(teacher forcing, MEDL §7.4)} \\
        \hat y_t = \arg\max_k p(y_t = k \mid \tilde y_{<t}, x) & \text{otherwise}\end{cases}

    :math:`\hat y_t`, the prediction given the *mixed* prefix, comes step by step from
    :meth:`Seq2Seq.decode_step` with dropout off (``sample=True``: drawn from
    ``softmax(logits / temperature)``, as in the paper). Train on ``model.apply(params, src,
    mixed, src_lengths)`` against the true targets: its logits are those the loop saw, and no
    gradient flows through the choice (integer inputs). ``epsilon = 1`` returns ``tgt_in``;
    ``epsilon = 0`` makes ``mixed[:, 1:]`` greedy decoding from ``<start>``.

    Args:
        model, params: the :class:`Seq2Seq` and its parameters (or variables).
        src_BxS, tgt_in_BxT, src_lengths: as for ``model(...)``.
        epsilon: in [0, 1], scalar or ``[B]`` (e.g. :func:`scheduled_sampling_epsilon`).
        rng: PRNG key for the coin flips (and the draws when ``sample``).
        sample, temperature: sample the fed-back prediction instead of taking the argmax.

    Returns:
        ``(mixed_BxT, from_truth_BxT)``: the inputs (int32) and where the true token was
        kept (``True`` at ``t = 0``).

    Example (in a loss function; ``eps`` from the host's schedule)::

        mixed, _ = scheduled_sampling_inputs(model, p, src, tgt_in, src_lengths, epsilon=eps,
                                             rng=coin_key)
        logits = model.apply({"params": p}, src, mixed, src_lengths, deterministic=False,
                             rngs={"dropout": drop_key})
        loss = masked_cross_entropy(logits, tgt_out, tgt_mask)
    """
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"`model` must be a Seq2Seq; got {type(model).__name__}.")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0; got {temperature}.")
    tgt_in_BxT = check_tokens(tgt_in_BxT, "tgt_in", model.config.tgt_vocab_size)
    check_nonempty(tgt_in_BxT, "tgt_in", "its first token (<start>) is always fed")
    check_same_batch(tgt_in_BxT, "tgt_in", src_BxS, "src")
    batch, num_steps = tgt_in_BxT.shape
    eps = jnp.asarray(epsilon, jnp.float32)
    if eps.ndim > 1 or (eps.ndim == 1 and eps.shape[0] != batch):
        raise ValueError(
            f"`epsilon` must be a scalar or one value per row ([{batch}]); "
            f"got shape {tuple(eps.shape)}."
        )
    if is_concrete(eps) and not bool(jnp.all((eps >= 0) & (eps <= 1))):
        raise ValueError(f"`epsilon` must lie in [0, 1]; got {eps}.")
    eps_B = jnp.broadcast_to(eps, (batch,))
    variables = jax.lax.stop_gradient(as_variables(params))
    coin_key, draw_key = jax.random.split(rng)
    # uniform in [0, 1): epsilon = 1 always keeps the truth, epsilon = 0 never does.
    truth_BxT = jax.random.uniform(coin_key, (batch, num_steps)) < eps_B[:, None]
    truth_BxT = truth_BxT.at[:, 0].set(True)
    state = model.init_decode_state(
        variables, tgt_in_BxT[:, :1], None, num_steps, src=src_BxS, src_lengths=src_lengths
    )

    def body(carry: tuple, xs: tuple) -> tuple[tuple, Array]:
        state, tok_B = carry
        t, true_B, keep_B = xs
        logits_BxV, state = model.decode_step(variables, state, tok_B)
        if sample:
            pred_B = jax.random.categorical(
                jax.random.fold_in(draw_key, t), logits_BxV / temperature, axis=-1
            )
        else:
            pred_B = jnp.argmax(logits_BxV, axis=-1)
        nxt_B = jnp.where(keep_B, true_B, pred_B.astype(jnp.int32))
        return (state, nxt_B), nxt_B

    xs = (jnp.arange(1, num_steps), tgt_in_BxT[:, 1:].T.astype(jnp.int32), truth_BxT[:, 1:].T)
    _, rest_TxB = jax.lax.scan(body, (state, tgt_in_BxT[:, 0].astype(jnp.int32)), xs)
    mixed_BxT = jnp.concatenate([tgt_in_BxT[:, :1].astype(jnp.int32), rest_TxB.T], axis=1)
    return mixed_BxT, truth_BxT

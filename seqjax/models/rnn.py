"""Recurrent models: a language model, a sequence classifier and a sequence tagger.

Each is an embedding, a :class:`~seqjax.nn.StackedRNN` and an output layer (J&M §9.3–9.4;
MEDL §7.2), on token ids ``int32[B, T]`` right-padded per ``lengths: int32[B]`` (classifier
and tagger: float features ``[B, T, P]`` when ``vocab_size`` is ``None``). Each takes one
frozen config, validated when built (a ``ValueError``/``TypeError`` naming the field):
:class:`RNNConfig`, the stack's options, extended by :class:`RNNLMConfig`,
:class:`RNNClassifierConfig` and :class:`RNNTaggerConfig`.

Parameter names (golden trees in ``tests/golden/``): ``embed/embedding`` ``[V, E]`` (J&M's
``E`` as rows, ``e_t = E[x_t]``); ``rnn/layer_{l}/cell/...`` (or
``rnn/layer_{l}/forward|backward/cell/...``); ``output/{kernel,bias}``, or with
``tie_embeddings`` only ``output_bias`` (the kernel is ``Eᵀ``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import (
    ConfigBase,
    ValidLengths,
    check_count_or_off,
    check_optional_positive_int,
    check_positive_int,
    check_rank,
    check_rate,
    retired_flags,
)
from seqjax._traced_checks import poison_bad_ids
from seqjax.models._common import (
    POOLINGS,
    ConfiguredModel,
    DecodingModel,
    check_lengths,
    check_nonempty,
    check_tokens,
    flag_oov_rows,
    masked_pool,
    split_oov,
)
from seqjax.nn.cells import RecurrentCell
from seqjax.nn.dense import Dense, flat_attend
from seqjax.nn.embedding import Embed
from seqjax.nn.recurrent import CELL_TYPES, StackedRNN
from seqjax.nn.recurrent.layers import select_rows

Array = jax.Array
Dtype = Any
Carry = Any

__all__ = [
    "RNNConfig", "RNNLMConfig", "RNNClassifierConfig", "RNNTaggerConfig", "RNNLanguageModel",
    "RNNClassifier", "RNNTagger",
]

#: Cell options the stack sets itself (``cell_kwargs`` may not name them).
_STACK_SET = ("features", "dtype", "param_dtype", "parent", "name")


def check_flag(value: Any, name: str) -> None:
    """A Python ``bool`` (a config's on/off option), else a ``TypeError`` naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool; got {value!r}.")


def cell_class(cell_type: Any) -> type[RecurrentCell]:
    """The cell class of a ``cell_type`` (a name in ``CELL_TYPES`` or a cell class)."""
    if isinstance(cell_type, str):
        if cell_type not in CELL_TYPES:
            raise ValueError(
                f"`cell_type` must be one of {sorted(CELL_TYPES)} or a cell class; "
                f"got {cell_type!r}."
            )
        return CELL_TYPES[cell_type]
    if not (isinstance(cell_type, type) and issubclass(cell_type, RecurrentCell)):
        raise TypeError(
            f"`cell_type` must be one of {sorted(CELL_TYPES)} or a RecurrentCell subclass; "
            f"got {cell_type!r}."
        )
    return cell_type


def _cell_kwargs(value: Any, cls: type[RecurrentCell]) -> tuple[tuple[str, Any], ...] | None:
    """``cell_kwargs`` as sorted ``(name, value)`` pairs (hashable: equal configs hash equal),
    every name an option of the cell class that the stack does not set itself."""
    if value is None:
        return None
    try:
        pairs = dict(value.items() if isinstance(value, Mapping) else value)
    except (TypeError, ValueError):
        raise TypeError(
            f"`cell_kwargs` must be a dict or (name, value) pairs, or None; got {value!r}."
        ) from None
    allowed = sorted(
        f.name for f in dataclasses.fields(cls) if f.init and f.name not in _STACK_SET
    )
    unknown = [k for k in pairs if k not in allowed]
    if unknown:
        raise ValueError(
            f"`cell_kwargs` must name options of {cls.__name__} ({', '.join(allowed)}); "
            f"got {', '.join(repr(k) for k in unknown)}."
        )
    return tuple(sorted(pairs.items()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RNNConfig(ConfigBase):
    """The recurrent stack of every RNN model (also :class:`~seqjax.models.Seq2SeqConfig`'s
    source side and :class:`~seqjax.models.ImageCaptionerConfig`).

    Example:
        >>> cfg = RNNConfig(vocab_size=100, embed_dim=16, cell_type="gru")
        >>> cfg.features, cfg.replace(hidden_size=32).features
        (16, 32)

    Attributes:
        vocab_size: ``|V|``; ``None`` (classifier, tagger): float features, no embedding.
        embed_dim, hidden_size: embedding width ``d``; RNN width ``H`` (default ``d``).
        num_layers: stacked RNN layers (MEDL (7.15)).
        cell_type: ``"lstm"``, ``"gru"``, ``"elman"`` (alias ``"rnn"``) or a
            :class:`~seqjax.nn.RecurrentCell` subclass.
        bidirectional: concatenate a reverse RNN at every layer (J&M (9.18)–(9.20)).
        dropout_rate: in ``[0, 1)``, on the embeddings, between layers and on the top outputs.
        cell_kwargs: extra cell options (fields of the cell class), e.g.
            ``{"forget_bias": 1.0}``; stored as sorted ``(name, value)`` pairs.
        unroll: time steps per ``scan`` iteration (``None``: the backend's default).
    """

    vocab_size: int | None = None
    embed_dim: int = 128
    hidden_size: int | None = None
    num_layers: int = 1
    cell_type: str | type[RecurrentCell] = "lstm"
    bidirectional: bool = False
    dropout_rate: float = 0.0
    cell_kwargs: dict[str, Any] | Sequence[tuple[str, Any]] | None = None
    unroll: int | None = None

    def __post_init__(self) -> None:
        check_optional_positive_int(self.vocab_size, "vocab_size")
        check_positive_int(self.embed_dim, "embed_dim")
        check_optional_positive_int(self.hidden_size, "hidden_size")
        check_positive_int(self.num_layers, "num_layers")
        cls = cell_class(self.cell_type)
        check_flag(self.bidirectional, "bidirectional")
        check_rate(self.dropout_rate, "dropout_rate")
        check_optional_positive_int(self.unroll, "unroll")
        object.__setattr__(self, "cell_kwargs", _cell_kwargs(self.cell_kwargs, cls))

    @property
    def features(self) -> int:
        """The RNN width ``H``: ``hidden_size``, else ``embed_dim``."""
        return self.embed_dim if self.hidden_size is None else self.hidden_size

    @property
    def output_features(self) -> int:
        """Width of the top layer's outputs: ``2H`` when bidirectional, else ``H``."""
        return 2 * self.features if self.bidirectional else self.features

    def cell(self, dtype: Dtype | None, param_dtype: Dtype, **kw: Any) -> RecurrentCell:
        """One cell of width ``H`` (``kw``: ``name``, ``parent``)."""
        return cell_class(self.cell_type)(
            self.features, dtype=dtype, param_dtype=param_dtype, **dict(self.cell_kwargs or {}),
            **kw,
        )

    def stack(self, dtype: Dtype | None, param_dtype: Dtype, **kw: Any) -> StackedRNN:
        """The :class:`~seqjax.nn.StackedRNN` described (``kw``: ``name``, ``parent``)."""
        same = ("num_layers", "cell_type", "bidirectional", "dropout_rate", "unroll", "cell_kwargs")
        return StackedRNN(features=self.features, dtype=dtype, param_dtype=param_dtype,
                          **{name: getattr(self, name) for name in same}, **kw)


def token_embed(vocab_size: int, embed_dim: int, dtype: Dtype | None, param_dtype: Dtype,
                **kw: Any) -> Embed:
    """Every RNN model's embedding ``E [V, d]``, initialised ``N(0, 0.1²)``."""
    return Embed(vocab_size, embed_dim, dtype=dtype, param_dtype=param_dtype,
                 embedding_init=nn.initializers.normal(stddev=0.1), **kw)


def require_vocab(config: RNNConfig, owner: str, name: str = "vocab_size") -> None:
    """``config.vocab_size`` is set: ``owner`` embeds token ids."""
    if config.vocab_size is None:
        raise ValueError(f"`{name}` of {owner} must be a positive int (it embeds token ids); "
                         "got None.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RNNLMConfig(RNNConfig):
    """Options of :class:`RNNLanguageModel`: :class:`RNNConfig` (``vocab_size`` required,
    unidirectional) and the output layer's.

    Example:
        >>> RNNLMConfig(vocab_size=11, embed_dim=8, hidden_size=16,
        ...             tie_embeddings=True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: `tie_embeddings=True` needs hidden_size == embed_dim ...

    Attributes:
        tie_embeddings: use ``Eᵀ`` as the output matrix (Press & Wolf 2017; Inan et al.
            2017; J&M (9.16)); needs ``hidden_size == embed_dim``.
        output_bias: the output bias ``b`` (kept when tied; see :class:`RNNLanguageModel`).
    """

    tie_embeddings: bool = False
    output_bias: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        require_vocab(self, "RNNLMConfig")
        if self.bidirectional:
            raise ValueError(
                "`bidirectional` of RNNLMConfig must be False (a language model reads left to "
                "right); got True."
            )
        check_flag(self.tie_embeddings, "tie_embeddings")
        check_flag(self.output_bias, "output_bias")
        if self.tie_embeddings and self.features != self.embed_dim:
            raise ValueError(
                "`tie_embeddings=True` needs hidden_size == embed_dim (the output matrix is Eᵀ); "
                f"got hidden_size={self.features}, embed_dim={self.embed_dim}."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RNNClassifierConfig(RNNConfig):
    """Options of :class:`RNNClassifier`: :class:`RNNConfig` and the head's.

    Attributes:
        num_classes: ``C``. pooling: ``"last"``, ``"mean"``, ``"max"`` or ``"first"``.
        mlp_dim: width of an optional ``tanh`` hidden layer before the classifier (0: none).
    """

    num_classes: int
    pooling: str = "last"
    mlp_dim: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(self.num_classes, "num_classes")
        if self.pooling not in POOLINGS:
            raise ValueError(f"`pooling` must be one of {POOLINGS}; got {self.pooling!r}.")
        check_count_or_off(self.mlp_dim, "mlp_dim", type(self).__name__, "no hidden layer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RNNTaggerConfig(RNNConfig):
    """Options of :class:`RNNTagger`: :class:`RNNConfig` and ``num_tags`` (``K``)."""

    num_tags: int

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(self.num_tags, "num_tags")


class RNNLanguageModel(DecodingModel):
    r"""RNN language model with optional weight tying.

    .. math::
        e_t = E x_t, \qquad h_t = g(U h_{t-1} + W e_t), \qquad
        y_t = \mathrm{softmax}(V h_t + b)

    J&M (9.14)–(9.16) (``tie_embeddings=True``: ``V = E^\top``, saving ``|V|·d`` parameters);
    MEDL (7.2) with ``S_y`` = softmax; ``g`` is any cell, possibly stacked (MEDL (7.15)).
    Teacher-forced: the targets are the inputs shifted by one.

    **Departure from J&M (9.16)**, whose tied output ``softmax(E^\top h_t)`` has no bias: the
    tied model keeps a bias ``b`` (``[V]``, zero-initialised; ``output_bias=True``, the default),
    as PyTorch's word-language-model and Press & Wolf (2017), to learn unigram frequencies.
    ``output_bias=False`` is (9.16) exactly; ``cell_kwargs={"use_bias": False}`` gives J&M's
    bias-free recurrence (9.3)/(9.15).

    ``model(tokens_BxT, lengths=None, *, deterministic=True, initial_carry=None)`` returns
    ``logits_BxTxV`` (float32); :meth:`with_state` also returns the carry, one per layer, at
    each row's last real step (the carry protocol of :class:`~seqjax.nn.StackedRNN` and
    truncated BPTT, :mod:`seqjax.train.tbptt`); :meth:`zero_carry` starts a stream. The
    decoding state (:mod:`seqjax.decoding`; J&M Fig. 9.9) is the tuple of per-layer carries,
    batch-leading.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> lm = RNNLanguageModel(RNNLMConfig(vocab_size=11, embed_dim=8, tie_embeddings=True))
        >>> tokens = jnp.zeros((2, 5), jnp.int32)
        >>> variables = lm.init(jax.random.PRNGKey(0), tokens)
        >>> logits, carry = lm.apply(variables, tokens, method="with_state")
        >>> logits.shape, [leaf.shape for leaf in jax.tree_util.tree_leaves(carry)]  # LSTM (c, h)
        ((2, 5, 11), [(2, 8), (2, 8)])
    """

    config: RNNLMConfig
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    config_type = RNNLMConfig

    def setup(self) -> None:
        cfg = self.config
        self.embed = token_embed(self.vocab_size, cfg.embed_dim, self.dtype, self.param_dtype)
        self.rnn = cfg.stack(self.dtype, self.param_dtype)
        if cfg.tie_embeddings:
            if cfg.output_bias:
                self.output_bias = self.param("output_bias", nn.initializers.zeros,
                                              (self.vocab_size,), self.param_dtype)
        else:
            self.output = Dense(self.vocab_size, use_bias=cfg.output_bias, dtype=self.dtype,
                                param_dtype=self.param_dtype)
        self.drop = nn.Dropout(cfg.dropout_rate)

    def zero_carry(self, batch_size: int) -> tuple[Carry, ...]:
        """The all-zero carry for ``batch_size`` rows (one cell carry per layer)."""
        stack = self.config.stack(self.dtype, self.param_dtype, parent=None)
        return stack.zero_carry(batch_size, self.config.embed_dim)

    def hidden_states(self, tokens_BxT: Array, lengths: Array | None = None, *,
                      deterministic: bool = True, initial_carry: Sequence[Carry] | None = None
                      ) -> tuple[Array, tuple[Carry, ...]]:
        """``(h_BxTxH, carry)``: the top layer's outputs and every layer's final carry."""
        tokens_BxT = check_tokens(tokens_BxT, "tokens", self.vocab_size)
        batch, num_steps = tokens_BxT.shape
        checked = None if lengths is None else check_lengths(lengths, "lengths", batch, num_steps)
        # Under jit a row holding an id outside [0, V) is NaN (seqjax._traced_checks).
        e_BxTxE = poison_bad_ids(self.embed(tokens_BxT), tokens_BxT, self.vocab_size)
        e_BxTxE = self.drop(e_BxTxE, deterministic=deterministic)
        h_BxTxH, carries = self.rnn.with_state(
            e_BxTxE, checked, initial_carry=initial_carry, deterministic=deterministic
        )
        return self.drop(h_BxTxH, deterministic=deterministic), carries

    def logits(self, h_BxTxH: Array) -> Array:
        """Output layer: ``h W_out + b`` or, tied, ``h Eᵀ + b`` (J&M (9.16)); float32."""
        if self.config.tie_embeddings:
            logits_BxTxV = flat_attend(self.embed, h_BxTxH.astype(self.embed.embedding.dtype))
            if self.config.output_bias:
                logits_BxTxV = logits_BxTxV + self.output_bias
        else:
            logits_BxTxV = self.output(h_BxTxH)
        return logits_BxTxV.astype(jnp.float32)

    @retired_flags(return_carry="RNNLanguageModel.with_state")
    def __call__(self, tokens_BxT: Array, lengths: Array | None = None, *,
                 deterministic: bool = True, initial_carry: Sequence[Carry] | None = None) -> Array:
        return self.with_state(
            tokens_BxT, lengths, deterministic=deterministic, initial_carry=initial_carry
        )[0]

    def with_state(self, tokens_BxT: Array, lengths: Array | None = None, *,
                   deterministic: bool = True,
                   initial_carry: Sequence[Carry] | None = None) -> tuple[Array, tuple[Carry, ...]]:
        """``(logits_BxTxV, carry)``: the call's logits and every layer's final carry."""
        h_BxTxH, carry = self.hidden_states(
            tokens_BxT, lengths, deterministic=deterministic, initial_carry=initial_carry
        )
        return self.logits(h_BxTxH), carry

    # --- decoding interface (seqjax.decoding) -------------------------------------------

    def _prefill(self, prompt_BxT: Array, lengths_B: Array) -> tuple[Carry, ...]:
        return self.hidden_states(prompt_BxT, lengths_B)[1]

    def _step(self, state: tuple[Carry, ...], tokens_B: Array) -> tuple[Array, tuple[Carry, ...]]:
        tokens_B, valid_B = split_oov(tokens_B, self.vocab_size)
        logits_Bx1xV, carries = self.with_state(tokens_B[:, None], initial_carry=state)
        # an out-of-vocabulary row keeps its carry
        return flag_oov_rows(logits_Bx1xV[:, 0], valid_B), select_rows(valid_B, carries, state)

    def init_decode_state(self, params: Any, prompt_BxT: Array,
                          prompt_lengths_B: Array | None = None,
                          max_len: int | None = None) -> tuple[Carry, ...]:
        """The per-layer carries after ``prompt[b, :len_b - 1]`` (``max_len`` is unused)."""
        return self._init_state(params, prompt_BxT, prompt_lengths_B)


class _Encoder(nn.Module):
    """Embedding (or identity on float features) + StackedRNN, shared by classifier and tagger."""

    config: RNNConfig
    dtype: Dtype | None
    param_dtype: Dtype

    @nn.compact
    def __call__(self, inputs: Array, lengths: Array | None,
                 deterministic: bool) -> tuple[Array, ValidLengths | None]:
        cfg = self.config
        if cfg.vocab_size is not None:
            tokens = check_tokens(inputs, "inputs", cfg.vocab_size)
            embed = token_embed(cfg.vocab_size, cfg.embed_dim, self.dtype, self.param_dtype,
                                name="embed")
            x_BxTxE = poison_bad_ids(embed(tokens), tokens, cfg.vocab_size)
        else:
            check_rank(inputs, "inputs", 3)
            x_BxTxE = jnp.asarray(inputs)
        batch, num_steps = x_BxTxE.shape[:2]
        checked = None if lengths is None else check_lengths(lengths, "lengths", batch, num_steps)
        x_BxTxE = nn.Dropout(cfg.dropout_rate)(x_BxTxE, deterministic=deterministic)
        rnn = cfg.stack(self.dtype, self.param_dtype, name="rnn")
        h_BxTxH = rnn(x_BxTxE, checked, deterministic=deterministic)
        return nn.Dropout(cfg.dropout_rate)(h_BxTxH, deterministic=deterministic), checked


class RNNClassifier(ConfiguredModel):
    r"""Sequence classification with an RNN: pool the hidden states, then a classifier.

    .. math::
        h_{1:n} = \mathrm{RNN}(E x_{1:n}), \qquad
        y = \mathrm{softmax}(\mathrm{FFN}(\mathrm{pool}(h_{1:n})))

    J&M §9.4.2 (Fig. 9.8, (9.17), Fig. 9.12); MEDL Fig. 7.2(b) (many-to-one). Pooling is
    masked by ``lengths`` (:func:`~seqjax.models.masked_pool`): a padded batch gives each row's
    own result. ``model(inputs, lengths=None, *, deterministic=True) -> logits_BxC`` (float32),
    ``inputs`` token ids ``[B, T]`` or, when ``vocab_size`` is ``None``, features ``[B, T, P]``.
    Parameters: ``encoder/embed``, ``encoder/rnn/...``, ``hidden/{kernel,bias}`` (when
    ``mlp_dim``), ``classifier/{kernel,bias}``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> cfg = RNNClassifierConfig(num_classes=3, vocab_size=20, embed_dim=8, hidden_size=8,
        ...                           bidirectional=True, pooling="max")
        >>> clf = RNNClassifier(cfg)
        >>> x = jnp.ones((2, 6), jnp.int32)
        >>> v = clf.init(jax.random.PRNGKey(0), x)
        >>> clf.apply(v, x, jnp.array([6, 3])).shape
        (2, 3)
    """

    config: RNNClassifierConfig
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    config_type = RNNClassifierConfig

    @nn.compact
    def __call__(self, inputs: Array, lengths: Array | None = None, *,
                 deterministic: bool = True) -> Array:
        cfg = self.config
        encoder = _Encoder(cfg, self.dtype, self.param_dtype, name="encoder")
        h_BxTxH, checked = encoder(inputs, lengths, deterministic)
        check_nonempty(inputs, "inputs", f"the classifier pools them, pooling={cfg.pooling!r}")
        pooled_BxH = masked_pool(h_BxTxH, checked, cfg.pooling, bidirectional=cfg.bidirectional)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        if cfg.mlp_dim:
            pooled_BxH = jnp.tanh(Dense(cfg.mlp_dim, name="hidden", **kw)(pooled_BxH))
        return Dense(cfg.num_classes, name="classifier", **kw)(pooled_BxH).astype(jnp.float32)


class RNNTagger(ConfiguredModel):
    r"""Sequence labelling: one tag distribution per token.

    .. math::
        h_{1:n} = \mathrm{RNN}(E x_{1:n}), \qquad y_t = \mathrm{softmax}(W_o h_t + b_o)

    J&M §9.4.1 (Fig. 9.7); bidirectional: ``h_t = [h^f_t; h^b_t]`` (J&M (9.18)–(9.20); MEDL
    (7.14)). Padded steps get a zero hidden state's logits; mask them in the loss.
    ``model(inputs, lengths=None, *, deterministic=True) -> logits_BxTxK`` (float32).
    Parameters: ``encoder/embed``, ``encoder/rnn/...``, ``output/{kernel,bias}``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> tagger = RNNTagger(RNNTaggerConfig(num_tags=5, vocab_size=20, embed_dim=8,
        ...                                    hidden_size=8, bidirectional=True))
        >>> x = jnp.ones((2, 6), jnp.int32)
        >>> v = tagger.init(jax.random.PRNGKey(0), x)
        >>> tagger.apply(v, x).shape
        (2, 6, 5)
    """

    config: RNNTaggerConfig
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    config_type = RNNTaggerConfig

    @nn.compact
    def __call__(self, inputs: Array, lengths: Array | None = None, *,
                 deterministic: bool = True) -> Array:
        encoder = _Encoder(self.config, self.dtype, self.param_dtype, name="encoder")
        h_BxTxH, _ = encoder(inputs, lengths, deterministic)
        logits_BxTxK = Dense(self.config.num_tags, dtype=self.dtype, param_dtype=self.param_dtype,
                             name="output")(h_BxTxH)
        return logits_BxTxK.astype(jnp.float32)

"""Recurrent models: a language model, a sequence classifier and a sequence tagger.

All three are an embedding, a :class:`~seqjax.nn.StackedRNN` and an output layer
(J&M §9.3–9.4; MEDL §7.2). Inputs are token ids ``int32[B, T]`` with right
padding given by ``lengths: int32[B]``; the classifier and tagger also accept
float features ``[B, T, P]`` when ``vocab_size`` is ``None``.

Parameter names (stable; golden trees in ``tests/golden/``):

* ``embed/embedding``: ``[V, E]`` — J&M's ``E`` (as rows, so ``e_t = E[x_t]``);
* ``rnn/layer_{l}/cell/...`` (or ``rnn/layer_{l}/forward|backward/cell/...``):
  the recurrent layers, as in :class:`~seqjax.nn.StackedRNN`;
* ``output/{kernel,bias}`` — the output layer; with ``tie_weights`` only
  ``output_bias`` (the kernel is ``Eᵀ``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from seqjax._checks import ValidLengths, check_rank
from seqjax._traced_checks import poison_bad_ids
from seqjax.models._common import (
    POOLINGS,
    as_variables,
    check_lengths,
    check_nonempty,
    check_prompt,
    check_step_tokens,
    check_tokens,
    flag_oov_rows,
    masked_pool,
    split_oov,
)
from seqjax.nn.dense import Dense, flat_attend
from seqjax.nn.embedding import Embed
from seqjax.nn.recurrent import StackedRNN

Array = jax.Array
Dtype = Any
Carry = Any

__all__ = ["RNNLanguageModel", "RNNClassifier", "RNNTagger"]


def _check_rate(rate: float, name: str) -> None:
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1); got {rate}.")


class RNNLanguageModel(nn.Module):
    r"""RNN language model with optional weight tying.

    .. math::
        e_t = E x_t, \qquad h_t = g(U h_{t-1} + W e_t), \qquad
        y_t = \mathrm{softmax}(V h_t + b)

    J&M (9.14)–(9.16) (with ``tie_weights=True``, ``V = E^\top``: the input
    embedding is reused as the output layer, which removes exactly ``|V|·d``
    parameters); MEDL (7.2) with ``S_y`` = softmax; ``g`` is any cell (Elman,
    LSTM, GRU) and the network may be stacked (MEDL (7.15)). Trained with
    teacher forcing: the targets are the inputs shifted by one.

    **Departure from J&M (9.16).** J&M's tied output is ``y_t = softmax(E^\top h_t)``
    with no bias. Here the tied model keeps an output bias ``b`` (param ``output_bias``,
    ``|V|`` numbers, initialised to zero) by default, as PyTorch's word-language-model
    and Press & Wolf (2017) do: it lets the model learn unigram frequencies without
    spending embedding directions on them. ``use_output_bias=False`` computes (9.16)
    exactly. (The recurrence's own biases are the cell's: ``cell_kwargs={"use_bias":
    False}`` gives J&M's bias-free (9.3)/(9.15).)

    Call: ``model(tokens_BxT, lengths=None, *, deterministic=True,
    initial_carry=None, return_carry=False)`` returns ``logits_BxTxV``
    (float32), or ``(logits, carry)`` — ``carry`` is one cell carry per layer, each the
    carry at that row's last real step. This is the carry protocol of
    :class:`~seqjax.nn.StackedRNN` and of truncated BPTT
    (:mod:`seqjax.train.tbptt` through :func:`~seqjax.train.step.flax_apply_fn`):
    ``initial_carry`` in, ``(outputs, carry)`` out; :meth:`zero_carry` gives the
    start of every stream.

    Decoding interface (see :mod:`seqjax.decoding`): ``init_decode_state`` and
    ``decode_step`` (state: the tuple of per-layer carries, batch-leading).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> lm = RNNLanguageModel(vocab_size=11, embed_dim=8, tie_weights=True)
        >>> tokens = jnp.zeros((2, 5), jnp.int32)
        >>> variables = lm.init(jax.random.PRNGKey(0), tokens)
        >>> lm.apply(variables, tokens).shape
        (2, 5, 11)
        >>> logits, carry = lm.apply(variables, tokens, initial_carry=lm.zero_carry(2),
        ...                          return_carry=True)
        >>> [leaf.shape for leaf in jax.tree_util.tree_leaves(carry)]
        [(2, 8), (2, 8)]

    Attributes:
        vocab_size: ``|V|``.
        embed_dim: ``d``, the embedding width.
        hidden_size: RNN width; defaults to ``embed_dim`` (required equal when tied).
        num_layers: stacked RNN layers.
        cell_type: ``"lstm"``, ``"gru"`` or ``"elman"`` (or a cell class).
        dropout_rate: rate on the embeddings, between layers and before the output layer.
        tie_weights: use ``Eᵀ`` as the output matrix (Press & Wolf 2017; Inan et al. 2017).
        use_output_bias: the output bias ``b`` (kept when tied; see the departure above).
        cell_kwargs: extra cell arguments, e.g. ``{"forget_bias": 1.0}``.
    """

    vocab_size: int
    embed_dim: int = 128
    hidden_size: int | None = None
    num_layers: int = 1
    cell_type: Any = "lstm"
    dropout_rate: float = 0.0
    tie_weights: bool = False
    use_output_bias: bool = True
    cell_kwargs: dict | Sequence[tuple[str, Any]] | None = None
    unroll: int | None = None
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    @property
    def hidden(self) -> int:
        return self.embed_dim if self.hidden_size is None else self.hidden_size

    def setup(self) -> None:
        if self.vocab_size < 1:
            raise ValueError(f"`vocab_size` must be >= 1; got {self.vocab_size}.")
        _check_rate(self.dropout_rate, "dropout_rate")
        if self.tie_weights and self.hidden != self.embed_dim:
            raise ValueError(
                "`tie_weights=True` needs hidden_size == embed_dim (the output matrix is Eᵀ); "
                f"got hidden_size={self.hidden}, embed_dim={self.embed_dim}."
            )
        self.embed = Embed(
            self.vocab_size,
            self.embed_dim,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            embedding_init=nn.initializers.normal(stddev=0.1),
        )
        self.rnn = StackedRNN(
            features=self.hidden,
            num_layers=self.num_layers,
            cell_type=self.cell_type,
            dropout_rate=self.dropout_rate,
            unroll=self.unroll,
            cell_kwargs=self.cell_kwargs,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
        )
        if self.tie_weights:
            if self.use_output_bias:
                self.output_bias = self.param(
                    "output_bias",
                    nn.initializers.zeros_init(),
                    (self.vocab_size,),
                    self.param_dtype,
                )
        else:
            self.output = Dense(
                self.vocab_size,
                use_bias=self.use_output_bias,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
            )
        self.drop = nn.Dropout(self.dropout_rate)

    def _stack(self) -> StackedRNN:
        return StackedRNN(
            features=self.hidden,
            num_layers=self.num_layers,
            cell_type=self.cell_type,
            dropout_rate=self.dropout_rate,
            unroll=self.unroll,
            cell_kwargs=self.cell_kwargs,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            parent=None,
        )

    def zero_carry(self, batch_size: int) -> tuple[Carry, ...]:
        """The all-zero carry for ``batch_size`` rows (one cell carry per layer)."""
        return self._stack().zero_carry(batch_size, self.embed_dim)

    def hidden_states(
        self,
        tokens_BxT: Array,
        lengths: Array | None = None,
        *,
        deterministic: bool = True,
        initial_carry: Sequence[Carry] | None = None,
    ) -> tuple[Array, tuple[Carry, ...]]:
        """``(h_BxTxH, carry)``: the top layer's outputs and every layer's final carry."""
        tokens_BxT = check_tokens(tokens_BxT, "tokens", self.vocab_size)
        batch, num_steps = tokens_BxT.shape
        checked = None if lengths is None else check_lengths(lengths, "lengths", batch, num_steps)
        # Under jit a row holding an id outside [0, V) is NaN (seqjax._traced_checks).
        e_BxTxE = poison_bad_ids(self.embed(tokens_BxT), tokens_BxT, self.vocab_size)
        e_BxTxE = self.drop(e_BxTxE, deterministic=deterministic)
        h_BxTxH, carries = self.rnn(
            e_BxTxE, checked, initial_carry=initial_carry, deterministic=deterministic
        )
        return self.drop(h_BxTxH, deterministic=deterministic), carries

    def logits(self, h_BxTxH: Array) -> Array:
        """Output layer: ``h W_out + b`` or, tied, ``h Eᵀ + b`` (J&M (9.16)); float32."""
        if self.tie_weights:
            logits_BxTxV = flat_attend(self.embed, h_BxTxH.astype(self.embed.embedding.dtype))
            if self.use_output_bias:
                logits_BxTxV = logits_BxTxV + self.output_bias
        else:
            logits_BxTxV = self.output(h_BxTxH)
        return logits_BxTxV.astype(jnp.float32)

    def __call__(
        self,
        tokens_BxT: Array,
        lengths: Array | None = None,
        *,
        deterministic: bool = True,
        initial_carry: Sequence[Carry] | None = None,
        return_carry: bool = False,
    ) -> Array | tuple[Array, tuple[Carry, ...]]:
        h_BxTxH, carry = self.hidden_states(
            tokens_BxT, lengths, deterministic=deterministic, initial_carry=initial_carry
        )
        logits_BxTxV = self.logits(h_BxTxH)
        return (logits_BxTxV, carry) if return_carry else logits_BxTxV

    # --- decoding interface (seqjax.decoding) -------------------------------------------

    def _prefill(self, prompt_BxT: Array, lengths_B: Array) -> tuple[Carry, ...]:
        return self.hidden_states(prompt_BxT, lengths_B)[1]

    def _step(self, state: tuple[Carry, ...], tokens_B: Array) -> tuple[Array, tuple[Carry, ...]]:
        tokens_B, valid_B = split_oov(tokens_B, self.vocab_size)
        logits_Bx1xV, carries = self(tokens_B[:, None], initial_carry=state, return_carry=True)
        carries = jax.tree_util.tree_map(  # an out-of-vocabulary row keeps its carry
            lambda n, o: jnp.where(valid_B.reshape((-1,) + (1,) * (n.ndim - 1)), n, o),
            carries,
            state,
        )
        return flag_oov_rows(logits_Bx1xV[:, 0], valid_B), carries

    def init_decode_state(
        self,
        params: Any,
        prompt_BxT: Array,
        prompt_lengths_B: Array | None = None,
        max_len: int | None = None,
    ) -> tuple[Carry, ...]:
        """Run the RNN over ``prompt[b, :len_b - 1]``; the decoder feeds ``prompt[b, len_b - 1]``.

        Returns the per-layer carries (constant size: ``max_len`` is not needed).
        """
        del max_len
        prompt_BxT, prompt_lengths_B = check_prompt(prompt_BxT, prompt_lengths_B, self.vocab_size)
        return self.apply(
            as_variables(params), prompt_BxT, prompt_lengths_B - 1, method=type(self)._prefill
        )

    def decode_step(
        self, params: Any, state: tuple[Carry, ...], tokens_B: Array
    ) -> tuple[Array, tuple[Carry, ...]]:
        """Feed one token per row: ``tokens_B -> (logits_BxV, new_state)`` (J&M Fig. 9.9).

        An id outside the vocabulary is a ``ValueError``; under ``jit`` (where it cannot be
        seen) its row gets NaN logits and keeps its carry.
        """
        tokens_B = check_step_tokens(tokens_B, self.vocab_size, state)
        return self.apply(as_variables(params), state, tokens_B, method=type(self)._step)  # type: ignore[return-value]


class _Encoder(nn.Module):
    """Embedding (or identity on float features) + StackedRNN, shared by classifier and tagger."""

    vocab_size: int | None
    embed_dim: int
    hidden_size: int
    num_layers: int
    cell_type: Any
    bidirectional: bool
    dropout_rate: float
    cell_kwargs: Any
    unroll: int | None
    dtype: Dtype | None
    param_dtype: Dtype

    @nn.compact
    def __call__(
        self, inputs: Array, lengths: Array | None, deterministic: bool
    ) -> tuple[Array, ValidLengths | None]:
        if self.vocab_size is not None:
            tokens = check_tokens(inputs, "inputs", self.vocab_size)
            x_BxTxE = Embed(
                self.vocab_size,
                self.embed_dim,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                embedding_init=nn.initializers.normal(stddev=0.1),
                name="embed",
            )(tokens)
            x_BxTxE = poison_bad_ids(x_BxTxE, tokens, self.vocab_size)
        else:
            check_rank(inputs, "inputs", 3)
            x_BxTxE = jnp.asarray(inputs)
        batch, num_steps = x_BxTxE.shape[:2]
        checked = None if lengths is None else check_lengths(lengths, "lengths", batch, num_steps)
        x_BxTxE = nn.Dropout(self.dropout_rate)(x_BxTxE, deterministic=deterministic)
        h_BxTxH, _ = StackedRNN(
            features=self.hidden_size,
            num_layers=self.num_layers,
            cell_type=self.cell_type,
            bidirectional=self.bidirectional,
            dropout_rate=self.dropout_rate,
            unroll=self.unroll,
            cell_kwargs=self.cell_kwargs,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="rnn",
        )(x_BxTxE, checked, deterministic=deterministic)
        return nn.Dropout(self.dropout_rate)(h_BxTxH, deterministic=deterministic), checked


class RNNClassifier(nn.Module):
    r"""Sequence classification with an RNN: pool the hidden states, then a classifier.

    .. math::
        h_{1:n} = \mathrm{RNN}(E x_{1:n}), \qquad
        y = \mathrm{softmax}(\mathrm{FFN}(\mathrm{pool}(h_{1:n})))

    J&M §9.4.2 (Fig. 9.8: the last hidden state; (9.17): the mean; max pooling;
    Fig. 9.12: a bidirectional RNN classifies from ``[h^f_n; h^b_1]``). MEDL
    Fig. 7.2(b) (many-to-one). Pooling is masked by ``lengths``: a padded batch
    gives exactly the result of each row alone (see :func:`masked_pool`).

    Call: ``model(inputs, lengths=None, *, deterministic=True) -> logits_BxC``
    (float32), with ``inputs`` token ids ``[B, T]`` or, when ``vocab_size`` is
    ``None``, features ``[B, T, P]``.

    Parameters: ``encoder/embed``, ``encoder/rnn/...``, optional
    ``hidden/{kernel,bias}`` (the FFN's hidden layer, when ``mlp_hidden``),
    ``classifier/{kernel,bias}``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> clf = RNNClassifier(num_classes=3, vocab_size=20, embed_dim=8, hidden_size=8,
        ...                     bidirectional=True, pooling="max")
        >>> x = jnp.ones((2, 6), jnp.int32)
        >>> v = clf.init(jax.random.PRNGKey(0), x)
        >>> clf.apply(v, x, jnp.array([6, 3])).shape
        (2, 3)

    Attributes:
        num_classes: ``C``.
        vocab_size: token vocabulary, or ``None`` for float feature inputs.
        pooling: ``"last"`` (default), ``"mean"``, ``"max"`` or ``"first"``.
        bidirectional: concatenate a reverse RNN at every layer (J&M (9.18)–(9.20)).
        mlp_hidden: width of an optional tanh hidden layer before the classifier.
    """

    num_classes: int
    vocab_size: int | None = None
    embed_dim: int = 64
    hidden_size: int = 64
    num_layers: int = 1
    cell_type: Any = "lstm"
    bidirectional: bool = False
    pooling: str = "last"
    mlp_hidden: int | None = None
    dropout_rate: float = 0.0
    cell_kwargs: dict | Sequence[tuple[str, Any]] | None = None
    unroll: int | None = None
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(
        self, inputs: Array, lengths: Array | None = None, *, deterministic: bool = True
    ) -> Array:
        if self.pooling not in POOLINGS:
            raise ValueError(f"`pooling` must be one of {POOLINGS}; got {self.pooling!r}.")
        _check_rate(self.dropout_rate, "dropout_rate")
        h_BxTxH, checked = _Encoder(
            self.vocab_size,
            self.embed_dim,
            self.hidden_size,
            self.num_layers,
            self.cell_type,
            self.bidirectional,
            self.dropout_rate,
            self.cell_kwargs,
            self.unroll,
            self.dtype,
            self.param_dtype,
            name="encoder",
        )(inputs, lengths, deterministic)
        check_nonempty(inputs, "inputs", f"the classifier pools them, pooling={self.pooling!r}")
        pooled_BxH = masked_pool(h_BxTxH, checked, self.pooling, bidirectional=self.bidirectional)
        if self.mlp_hidden is not None:
            pooled_BxH = jnp.tanh(
                Dense(
                    self.mlp_hidden, dtype=self.dtype, param_dtype=self.param_dtype, name="hidden"
                )(pooled_BxH)
            )
        logits_BxC = Dense(
            self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype, name="classifier"
        )(pooled_BxH)
        return logits_BxC.astype(jnp.float32)


class RNNTagger(nn.Module):
    r"""Sequence labelling: one tag distribution per token.

    .. math::
        h_{1:n} = \mathrm{RNN}(E x_{1:n}), \qquad y_t = \mathrm{softmax}(W_o h_t + b_o)

    J&M §9.4.1 (Fig. 9.7, part-of-speech tagging); with ``bidirectional=True``
    ``h_t = [h^f_t; h^b_t]`` (J&M (9.18)–(9.20); MEDL (7.14)). Logits at padded
    steps are those of a zero hidden state; mask them in the loss.

    Call: ``model(inputs, lengths=None, *, deterministic=True) -> logits_BxTxK``.
    Parameters: ``encoder/embed``, ``encoder/rnn/...``, ``output/{kernel,bias}``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> tagger = RNNTagger(num_tags=5, vocab_size=20, embed_dim=8, hidden_size=8)
        >>> x = jnp.ones((2, 6), jnp.int32)
        >>> v = tagger.init(jax.random.PRNGKey(0), x)
        >>> tagger.apply(v, x).shape
        (2, 6, 5)
    """

    num_tags: int
    vocab_size: int | None = None
    embed_dim: int = 64
    hidden_size: int = 64
    num_layers: int = 1
    cell_type: Any = "lstm"
    bidirectional: bool = True
    dropout_rate: float = 0.0
    cell_kwargs: dict | Sequence[tuple[str, Any]] | None = None
    unroll: int | None = None
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(
        self, inputs: Array, lengths: Array | None = None, *, deterministic: bool = True
    ) -> Array:
        _check_rate(self.dropout_rate, "dropout_rate")
        h_BxTxH, _ = _Encoder(
            self.vocab_size,
            self.embed_dim,
            self.hidden_size,
            self.num_layers,
            self.cell_type,
            self.bidirectional,
            self.dropout_rate,
            self.cell_kwargs,
            self.unroll,
            self.dtype,
            self.param_dtype,
            name="encoder",
        )(inputs, lengths, deterministic)
        logits_BxTxK = Dense(
            self.num_tags, dtype=self.dtype, param_dtype=self.param_dtype, name="output"
        )(h_BxTxH)
        return logits_BxTxK.astype(jnp.float32)

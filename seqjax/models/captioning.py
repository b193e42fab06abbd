r"""An RNN language model conditioned on an image feature vector (image captioning).

MEDL Fig. 7.1(d) (an image encoder's context vector, a one-to-many RNN decoder, Fig. 7.2(a));
the slides' ``h_0`` from image features and multi-modal recurrence ``h_t = σ(W_hh h_{t−1} +
W_xh x_t + W_ah a_t)``. With image features ``f ∈ ℝ^F`` (CNN features or raw pixels), caption
tokens ``y_0 = <start>, y_1, …`` and embeddings ``e_t = E y_t``:

.. math::
    a = \mathrm{enc}(f),\qquad
    h_0 = \begin{cases}\tanh(W_I a + b_I) & \text{condition ∈ \{init, both\}}\\
                       0 & \text{condition = input}\end{cases}

    h_t = \mathrm{cell}\big(h_{t-1},\ x_t\big),\quad
    x_t = \begin{cases} e_{t-1} & \text{condition = init}\\
                        [e_{t-1};\ W_A a] & \text{condition ∈ \{input, both\}}\end{cases},\qquad
    p(y_t \mid y_{<t}, f) = \mathrm{softmax}(W_{yh} h_t + b_y)

``"init"``: the image as initial state (MEDL Fig. 7.9(a); Vinyals et al. 2015); ``"input"``:
at every step, the slides' ``W_ah a_t`` (a linear map of ``[e; W_A a]`` is ``W_xh e + W_ah a``;
MEDL Fig. 7.9(b)); ``"both"``. An LSTM's carry is ``(c_0, h_0) = (0, tanh(W_I a + b_I))``.
``enc`` is the identity or one ``tanh`` layer of width ``image_hidden`` (a stand-in CNN).

Parameters: ``image_encoder`` (optional), ``init_proj`` (``W_I, b_I``), ``image_proj``
(``W_A``, no bias), ``embed`` (``E``), ``rnn/cell/...``, ``head`` (``W_yh, b_y``). Training is
teacher-forced (MEDL §7.2): inputs ``[<start>, y_1..y_{n-1}]``, targets ``[y_1..y_n]``.
Generation: :mod:`seqjax.decoding` with ``inputs={"images": f}``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from seqjax._checks import ValidLengths, check_optional_positive_int, check_rank
from seqjax._traced_checks import poison_bad_ids
from seqjax.models._common import (
    DecodingModel,
    check_lengths,
    check_tokens,
    flag_oov_rows,
    split_oov,
)
from seqjax.models.rnn import RNNConfig, require_vocab
from seqjax.nn.dense import Dense
from seqjax.nn.embedding import Embed
from seqjax.nn.recurrent import RNN
from seqjax.nn.recurrent.layers import select_rows

Array = jax.Array

__all__ = ["CONDITIONS", "ImageCaptioner", "ImageCaptionerConfig"]

CONDITIONS = ("init", "input", "both")
_CELLS = ("elman", "lstm", "gru")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageCaptionerConfig(RNNConfig):
    """Options of :class:`ImageCaptioner`: the decoder's :class:`~seqjax.models.RNNConfig`
    (``vocab_size`` required; one unidirectional layer, no dropout; ``cell_type`` ``"elman"``,
    ``"lstm"`` or ``"gru"``) and the image conditioning's.

    Example:
        >>> ImageCaptionerConfig(vocab_size=12, condition="late")
        Traceback (most recent call last):
        ...
        ValueError: `condition` must be one of ('init', 'input', 'both'); got 'late'.

    Attributes:
        condition: ``"init"`` (``h_0`` from the image), ``"input"`` (image at every step)
            or ``"both"``.
        image_hidden: width of the ``tanh`` image encoder; ``None`` = the identity.
        image_embed_dim: width of ``W_A a`` (default ``embed_dim``).
    """

    condition: str = "init"
    image_hidden: int | None = None
    image_embed_dim: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require_vocab(self, "ImageCaptionerConfig")
        if self.cell_type not in _CELLS:
            raise ValueError(f"`cell_type` of ImageCaptionerConfig must be one of {_CELLS}; "
                             f"got {self.cell_type!r}.")
        for name, only in (("num_layers", 1), ("bidirectional", False), ("dropout_rate", 0.0)):
            if getattr(self, name) != only:
                raise ValueError(f"`{name}` of ImageCaptionerConfig must be {only!r} (one "
                                 f"left-to-right layer, no dropout); got {getattr(self, name)!r}.")
        if self.condition not in CONDITIONS:
            raise ValueError(f"`condition` must be one of {CONDITIONS}; got {self.condition!r}.")
        check_optional_positive_int(self.image_hidden, "image_hidden")
        check_optional_positive_int(self.image_embed_dim, "image_embed_dim")


class ImageCaptioner(DecodingModel):
    r"""RNN caption decoder conditioned on image features (see the module docstring).

    ``model(tokens_BxT, images_BxF, lengths=None) -> logits_BxTxV`` (float32; ``V`` includes
    ``<start>``/``<stop>``/padding); ``lengths`` (right padding) zeroes the padded outputs.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> m = ImageCaptioner(ImageCaptionerConfig(vocab_size=12, hidden_size=16, embed_dim=8,
        ...                                         condition="both"))
        >>> tokens, images = jnp.zeros((2, 5), jnp.int32), jnp.ones((2, 64))
        >>> params = m.init(jax.random.PRNGKey(0), tokens, images)
        >>> m.apply(params, tokens, images).shape
        (2, 5, 12)
    """

    config: ImageCaptionerConfig
    dtype: Any = None
    param_dtype: Any = jnp.float32
    config_type = ImageCaptionerConfig

    def setup(self) -> None:
        cfg = self.config
        dt = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        if cfg.image_hidden is not None:
            self.image_encoder = Dense(cfg.image_hidden, name="image_encoder", **dt)
        if cfg.condition in ("init", "both"):
            self.init_proj = Dense(cfg.features, name="init_proj", **dt)
        if cfg.condition in ("input", "both"):
            self.image_proj = Dense(cfg.image_embed_dim or cfg.embed_dim, use_bias=False,
                                    name="image_proj", **dt)
        self.embed = Embed(self.vocab_size, cfg.embed_dim, name="embed", **dt)
        self.rnn = RNN(cfg.cell(self.dtype, self.param_dtype, parent=None), unroll=cfg.unroll,
                       implementation="scan", name="rnn")
        self.head = Dense(self.vocab_size, name="head", **dt)

    def _context(self, images_BxF: Array) -> Array:
        check_rank(images_BxF, "images", 2)
        a_BxA = images_BxF.astype(jnp.float32)
        if self.config.image_hidden is not None:
            a_BxA = jnp.tanh(self.image_encoder(a_BxA))
        return a_BxA

    def _initial_carry(self, a_BxA: Array) -> Any:
        batch = a_BxA.shape[0]
        if self.config.condition == "input":
            h_BxH = jnp.zeros((batch, self.config.features), jnp.float32)
        else:
            h_BxH = jnp.tanh(self.init_proj(a_BxA))
        if self.config.cell_type == "lstm":
            return (jnp.zeros_like(h_BxH), h_BxH)
        return h_BxH

    def _inputs(self, tokens_BxT: Array, a_BxA: Array) -> Array:
        # Under jit a row holding an id outside [0, V) is NaN (seqjax._traced_checks).
        e_BxTxE = poison_bad_ids(self.embed(tokens_BxT), tokens_BxT, self.vocab_size)
        if self.config.condition == "init":
            return e_BxTxE
        img_BxI = self.image_proj(a_BxA)
        img_BxTxI = jnp.broadcast_to(img_BxI[:, None], (*tokens_BxT.shape, img_BxI.shape[-1]))
        return jnp.concatenate([e_BxTxE, img_BxTxI], axis=-1)

    def _run(self, tokens_BxT: Array, a_BxA: Array, carry: Any,
             lengths: Array | ValidLengths | None) -> tuple[Array, Any]:
        h_BxTxH, carry = self.rnn.with_state(self._inputs(tokens_BxT, a_BxA), lengths=lengths,
                                             initial_carry=carry)
        return self.head(h_BxTxH).astype(jnp.float32), carry

    def __call__(self, tokens_BxT: Array, images_BxF: Array,
                 lengths: Array | None = None) -> Array:
        tokens_BxT = check_tokens(tokens_BxT, "tokens", self.vocab_size)
        batch, num_steps = tokens_BxT.shape
        if images_BxF.shape[0] != batch:
            raise ValueError(f"`images` must have the tokens' batch size {batch} as its first "
                             f"axis; got shape {tuple(images_BxF.shape)}.")
        checked = None if lengths is None else check_lengths(lengths, "lengths", batch, num_steps)
        a_BxA = self._context(images_BxF)
        return self._run(tokens_BxT, a_BxA, self._initial_carry(a_BxA), checked)[0]

    # ------------------------------------------------------------------ decoding interface

    def _prefill(self, prompt_BxT: Array, lengths_B: Array, images_BxF: Array) -> dict:
        a_BxA = self._context(images_BxF)
        carry = self._initial_carry(a_BxA)
        if prompt_BxT.shape[1] > 1:  # every prompt token but the last
            _, carry = self._run(prompt_BxT[:, :-1], a_BxA, carry, lengths_B)
        return {"carry": carry, "context": a_BxA}

    def _step(self, state: dict, tokens_B: Array) -> tuple[Array, dict]:
        tokens_B, valid_B = split_oov(tokens_B, self.vocab_size)
        logits_Bx1xV, carry = self._run(tokens_B[:, None], state["context"], state["carry"],
                                        None)
        carry = select_rows(valid_B, carry, state["carry"])  # an out-of-vocabulary row keeps it
        return flag_oov_rows(logits_Bx1xV[:, 0], valid_B), {**state, "carry": carry}

    def init_decode_state(self, params: Any, prompt_BxT: Array,
                          prompt_lengths_B: Array | None = None, max_len: int | None = None,
                          *, images: Array) -> dict:
        """Condition on ``images: [B, F]`` and run over ``prompt[b, :len_b - 1]`` (the first
        step feeds ``prompt[b, len_b - 1]``, usually ``<start>``)."""
        return self._init_state(params, prompt_BxT, prompt_lengths_B, jnp.asarray(images))

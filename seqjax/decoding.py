r"""Decoding for every autoregressive model: greedy search, sampling, beam search.

**One interface** (:class:`Decodable`), implemented by every text-generating model of
:mod:`seqjax.models`, by plain functions wrapped in :class:`FunctionalDecoder`, and by
:func:`recompute_decoder` for any causal ``logits_fn`` (the cache-free reference):

* ``init_decode_state(params, prompt_BxT, prompt_lengths_B, max_len, **inputs) -> state``:
  consume ``prompt[b, :len_b - 1]`` and return the decoding state (an RNN carry, a KV cache, an
  encoder output, ...) for up to ``max_len`` positions; ``inputs`` are model-specific (e.g. the
  source sentence of a :class:`~seqjax.models.Seq2Seq`);
* ``decode_step(params, state, tokens_B) -> (logits_BxV, state)``: feed one token per row and
  return the next-token logits.

Every leaf of ``state`` has the batch as its leading axis (beam search tiles and reorders it).
The loop starts by feeding ``prompt[b, len_b - 1]``, so right-padded prompts of different
lengths share a batch (``prompt_lengths`` ≥ 1; a seq2seq decoder's prompt is ``<start>``).

**Strategies** (Bishop §12.3.2; MEDL (7.34); J&M §9.3.3 / §10.2):

* greedy: :math:`y_n = \arg\max_k p(y_n = k \mid y_{<n})`;
* sampling with temperature (Bishop (12.35)) :math:`p_k \propto \exp(a_k / T)`, optionally
  restricted to the ``top_k`` most probable tokens and/or to the nucleus (``top_p``: the
  smallest set whose mass reaches ``p``), renormalised; ``temperature=0`` is greedy;
* beam search of width ``K``: keep the ``K`` best hypotheses by the log-probability
  :math:`\sum_n \log p(y_n \mid y_{<n})` (Bishop (12.34)); unfinished and finished hypotheses
  (ending in ``eos_id``; they keep their slot) are ranked together by the length-normalised
  score :math:`\log p(y) / |y|^{\alpha}` (``length_penalty`` :math:`\alpha`; 1 divides by the
  length, as Bishop suggests; 0 is the raw log-probability).

The loops are ``lax.while_loop`` in ``jax.jit`` (compiled once per model and static options),
stop early when every row has emitted ``eos_id``, and are deterministic for a PRNG key (step
``n`` uses ``fold_in(key, n)``). Outputs hold the *generated* tokens only (``[B, N]``,
``N = max_new_tokens``), ``pad_id`` after ``eos_id``; ``lengths`` counts them, ``eos_id``
included. ``eos_id`` and ``pad_id`` must be ids of the model's vocabulary (``model.vocab_size``
when it has one): an ``eos_id`` the model never emits would silently never stop a row, and the
outputs must decode (a marker such as -1 is refused: ``lengths`` gives each row's end).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from seqjax.models.rnn import RNNLanguageModel, RNNLMConfig
    >>> lm = RNNLanguageModel(RNNLMConfig(vocab_size=10, embed_dim=8))
    >>> prompt = jnp.array([[1, 2, 3], [4, 5, 0]])
    >>> params = lm.init(jax.random.PRNGKey(0), prompt)
    >>> out = greedy_search(lm, params, prompt, jnp.array([3, 2]), max_new_tokens=4)
    >>> out.tokens.shape
    (2, 4)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import check_count_or_off, check_positive_ints
from seqjax.models._common import check_prompt

Array = jax.Array
State = Any

__all__ = [
    "BeamSearchOutput",
    "DecodeOutput",
    "Decodable",
    "FunctionalDecoder",
    "beam_search",
    "generate",
    "greedy_search",
    "lower_sample",
    "process_logits",
    "recompute_decoder",
    "sample",
]

_NEG = -1.0e9  # "minus infinity" for scores: finite, so sums and differences stay finite


class Decodable(Protocol):
    """What :mod:`seqjax.decoding` needs from a model (see the module docstring)."""

    def init_decode_state(
        self, params: Any, prompt_BxT: Array, prompt_lengths_B: Array, max_len: int, **inputs: Any
    ) -> State: ...

    def decode_step(self, params: Any, state: State, tokens_B: Array) -> tuple[Array, State]: ...


class FunctionalDecoder(NamedTuple):
    """Wrap two plain functions as a :class:`Decodable` (hashable, so usable under ``jit``).

    Example:
        >>> import jax.numpy as jnp
        >>> dec = FunctionalDecoder(
        ...     init_decode_state=lambda p, prompt, lengths, max_len: jnp.zeros(prompt.shape[:1]),
        ...     decode_step=lambda p, s, tok: (jnp.eye(3)[tok], s))
        >>> greedy_search(dec, None, jnp.array([[1]]), max_new_tokens=3).tokens.tolist()
        [[1, 1, 1]]
    """

    init_decode_state: Callable[..., State]
    decode_step: Callable[[Any, State, Array], tuple[Array, State]]


class DecodeOutput(NamedTuple):
    """Greedy or sampled continuations.

    Attributes:
        tokens: ``int32[B, N]`` generated tokens, ``pad_id`` after ``eos_id``.
        lengths: ``int32[B]`` generated tokens per row, ``eos_id`` included.
        log_probs: ``float32[B]`` :math:`\\sum_n \\log p(y_n \\mid y_{<n})` under the
            untempered, unfiltered model distribution.
    """

    tokens: Array
    lengths: Array
    log_probs: Array


class BeamSearchOutput(NamedTuple):
    """The ``K`` best hypotheses per row, best first.

    Attributes:
        tokens: ``int32[B, K, N]``, ``pad_id`` after ``eos_id``.
        lengths: ``int32[B, K]`` (``eos_id`` included).
        log_probs: ``float32[B, K]`` total log-probability of each hypothesis.
        scores: ``float32[B, K]`` the ranking score ``log_probs / lengths**length_penalty``.

    With fewer than ``K`` distinct hypotheses (e.g. ``K > |V|`` after one step) the extra slots
    have length 0, ``pad_id`` tokens and scores of about ``-1e9``.
    """

    tokens: Array
    lengths: Array
    log_probs: Array
    scores: Array


# --------------------------------------------------------------------------- logits processing


def process_logits(logits_BxV: Array, *, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0) -> Array:
    r"""Temperature, top-k and top-p (nucleus) filtering: ``logits_BxV -> logits_BxV`` (float32)
    whose softmax is the sampling distribution.

    ``a / T`` (Bishop (12.35)), then ``-inf`` for tokens outside the ``top_k`` largest (ties with
    the k-th kept; 0: off), then for those outside the nucleus, the smallest set of most probable
    tokens whose probability reaches ``top_p`` (Holtzman et al. 2019; 1: off).

    Example:
        >>> import jax.numpy as jnp
        >>> process_logits(jnp.log(jnp.array([[0.5, 0.3, 0.2]])), top_p=0.7)
        Array([[-0.6931472, -1.2039728,       -inf]], dtype=float32)
    """
    if temperature <= 0:
        raise ValueError(f"`temperature` must be > 0 here (0 means greedy); got {temperature}.")
    top_k, top_p = _filters(top_k, top_p, "process_logits")
    logits_BxV = logits_BxV.astype(jnp.float32) / temperature
    vocab = logits_BxV.shape[-1]
    if top_k:
        kth_Bx1 = jax.lax.top_k(logits_BxV, min(top_k, vocab))[0][..., -1:]
        logits_BxV = jnp.where(logits_BxV < kth_Bx1, -jnp.inf, logits_BxV)
    if top_p < 1.0:
        sorted_BxV = jnp.sort(logits_BxV, axis=-1)[..., ::-1]
        probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
        mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
        keep_BxV = mass_before_BxV < top_p  # the first token is always kept
        cutoff_Bx1 = jnp.min(jnp.where(keep_BxV, sorted_BxV, jnp.inf), axis=-1, keepdims=True)
        logits_BxV = jnp.where(logits_BxV < cutoff_Bx1, -jnp.inf, logits_BxV)
    return logits_BxV


def _filters(top_k: Any, top_p: Any, owner: str) -> tuple[int, float]:
    """``(top_k, top_p)`` checked: an int >= 0 (0: off) and a float in (0, 1] (1: off); ``None``
    (the old off) is a ``TypeError`` naming 0 and 1."""
    top_k = check_count_or_off(int(top_k) if isinstance(top_k, np.integer) else top_k, "top_k",
                               owner, "every token, no top-k")
    if top_p is None:
        raise TypeError(f"`top_p=None` of {owner} is spelled `top_p=1.0` (1: every token, "
                        "no nucleus).")
    if (isinstance(top_p, bool) or not isinstance(top_p, (int, float, np.floating))
            or not 0.0 < top_p <= 1.0):
        raise ValueError(f"`top_p` of {owner} must be in (0, 1] (1: no nucleus); got {top_p!r}.")
    return top_k, float(top_p)


# --------------------------------------------------------------------------- shared set-up


def _check_prompt(model: Any, prompt_BxT: Any, prompt_lengths_B: Any, max_new_tokens: int,
                  eos_id: Any, pad_id: Any) -> tuple[Array, Array]:
    """The checked prompt and lengths; ``eos_id`` (or ``None``) and ``pad_id`` must be token ids
    of the model's vocabulary (module docstring)."""
    vocab = getattr(model, "vocab_size", None)
    vocab = vocab if isinstance(vocab, int) else None
    prompt_BxT, prompt_lengths_B = check_prompt(prompt_BxT, prompt_lengths_B, vocab)
    check_positive_ints(max_new_tokens=max_new_tokens)
    span = ">= 0" if vocab is None else f"[0, {vocab - 1}] (vocab_size={vocab})"
    for name, value in (("eos_id", eos_id), ("pad_id", pad_id)):
        if value is None and name == "eos_id":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"`{name}` must be an int token id; got {value!r}.")
        if value < 0 or (vocab is not None and value >= vocab):
            raise ValueError(f"`{name}` must be a token id in {span}; got {value}.")
    return prompt_BxT, prompt_lengths_B


def _init(model: Any, params: Any, prompt_BxT: Array, lengths_B: Array, max_new_tokens: int,
          inputs: dict) -> tuple[State, Array]:
    """The decoding state and each row's first token to feed, ``prompt[b, len_b - 1]``."""
    max_len = prompt_BxT.shape[1] + max_new_tokens
    state = model.init_decode_state(params, prompt_BxT, lengths_B, max_len, **inputs)
    first_B = jnp.take_along_axis(prompt_BxT, (lengths_B - 1)[:, None], axis=1)[:, 0]
    return state, first_B


# --------------------------------------------------------------------------- greedy / sampling


@functools.partial(jax.jit, static_argnames=(
    "model", "max_new_tokens", "eos_id", "pad_id", "temperature", "top_k", "top_p"))
def _sample_loop(model: Any, params: Any, prompt_BxT: Array, lengths_B: Array, key: Array | None,
                 inputs: dict, *, max_new_tokens: int, eos_id: int | None, pad_id: int,
                 temperature: float, top_k: int, top_p: float) -> DecodeOutput:
    batch = prompt_BxT.shape[0]
    state, first_B = _init(model, params, prompt_BxT, lengths_B, max_new_tokens, inputs)
    greedy = temperature == 0.0

    def cond(carry: tuple) -> Array:
        step, _, _, _, done_B, _, _ = carry
        return (step < max_new_tokens) & ~jnp.all(done_B)

    def body(carry: tuple) -> tuple:
        step, state, cur_B, out_BxN, done_B, logp_B, gen_len_B = carry
        logits_BxV, state = model.decode_step(params, state, cur_B)
        logits_BxV = logits_BxV.astype(jnp.float32)
        if greedy:
            nxt_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
        else:
            filtered = process_logits(logits_BxV, temperature=temperature, top_k=top_k, top_p=top_p)
            assert key is not None  # _run_sample passes a key whenever temperature > 0
            step_key = jax.random.fold_in(key, step)
            nxt_B = jax.random.categorical(step_key, filtered, axis=-1).astype(jnp.int32)
        token_logp_B = jnp.take_along_axis(
            jax.nn.log_softmax(logits_BxV, axis=-1), nxt_B[:, None], axis=-1
        )[:, 0]
        nxt_B = jnp.where(done_B, pad_id, nxt_B)
        out_BxN = jax.lax.dynamic_update_slice(out_BxN, nxt_B[:, None], (0, step))
        logp_B = logp_B + jnp.where(done_B, 0.0, token_logp_B)
        gen_len_B = gen_len_B + (~done_B).astype(jnp.int32)
        if eos_id is not None:
            done_B = done_B | (nxt_B == eos_id)
        return step + 1, state, nxt_B, out_BxN, done_B, logp_B, gen_len_B

    carry = (jnp.asarray(0, jnp.int32), state, first_B,
             jnp.full((batch, max_new_tokens), pad_id, jnp.int32), jnp.zeros((batch,), bool),
             jnp.zeros((batch,), jnp.float32), jnp.zeros((batch,), jnp.int32))
    _, _, _, out_BxN, _, logp_B, gen_len_B = jax.lax.while_loop(cond, body, carry)
    return DecodeOutput(out_BxN, gen_len_B, logp_B)


def greedy_search(model: Decodable, params: Any, prompt_BxT: Array,
                  prompt_lengths_B: Array | None = None, *, max_new_tokens: int,
                  eos_id: int | None = None, pad_id: int = 0,
                  inputs: dict | None = None) -> DecodeOutput:
    r"""Greedy decoding: :math:`y_n = \arg\max_k p(y_n = k \mid y_{<n})` (Bishop §12.3.2).

    ``prompt_BxT`` (int), ``prompt_lengths_B`` (int in ``[1, T]``; default ``T``) ->
    :class:`DecodeOutput`, ``tokens: [B, max_new_tokens]``. ``inputs``: extra keyword inputs
    of the model's ``init_decode_state``.
    """
    return _run_sample(_sample_loop, model, params, prompt_BxT, prompt_lengths_B, key=None,
                       max_new_tokens=max_new_tokens, temperature=0.0, eos_id=eos_id,
                       pad_id=pad_id, inputs=inputs)


def _run_sample(loop: Callable[..., Any], model: Decodable, params: Any, prompt_BxT: Array,
                prompt_lengths_B: Array | None = None, *, key: Array | None, max_new_tokens: int,
                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                eos_id: int | None = None, pad_id: int = 0, inputs: dict | None = None) -> Any:
    """``loop`` (:func:`_sample_loop` or its ``.lower``) on :func:`sample`'s arguments, checked
    (:func:`greedy_search`: ``temperature=0``, no key)."""
    if temperature < 0:
        raise ValueError(f"`temperature` must be >= 0; got {temperature}.")
    top_k, top_p = _filters(top_k, top_p, "sample")
    prompt_BxT, lengths_B = _check_prompt(
        model, prompt_BxT, prompt_lengths_B, max_new_tokens, eos_id, pad_id
    )
    loop_key = jnp.asarray(key) if temperature > 0 else None
    return loop(model, params, prompt_BxT, lengths_B, loop_key, dict(inputs or {}),
                max_new_tokens=int(max_new_tokens), eos_id=eos_id, pad_id=pad_id,
                temperature=float(temperature), top_k=top_k, top_p=top_p)


def sample(model: Decodable, params: Any, prompt_BxT: Array, prompt_lengths_B: Array | None = None,
           *, key: Array, max_new_tokens: int, temperature: float = 1.0, top_k: int = 0,
           top_p: float = 1.0, eos_id: int | None = None, pad_id: int = 0,
           inputs: dict | None = None) -> DecodeOutput:
    r"""Ancestral sampling with temperature, top-k and top-p (Bishop §12.3.2, (12.35)): step
    ``n`` draws :math:`y_n \sim \mathrm{softmax}(\mathrm{filter}(a_n / T))`
    (:func:`process_logits`) with key ``fold_in(key, n)``. ``temperature=0`` is greedy search.
    """
    return _run_sample(_sample_loop, model, params, prompt_BxT, prompt_lengths_B, key=key,
                       max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                       top_p=top_p, eos_id=eos_id, pad_id=pad_id, inputs=inputs)


def lower_sample(model: Decodable, params: Any, prompt_BxT: Array,
                 prompt_lengths_B: Array | None = None, **options: Any) -> Any:
    """The program :func:`sample` runs for the same arguments, lowered, not run
    (``jax.stages.Lowered``): ``.compile()`` it ahead of time (e.g. in a background thread) and a
    later :func:`sample` with the same shapes, dtypes and options finds it compiled."""
    return _run_sample(_sample_loop.lower, model, params, prompt_BxT, prompt_lengths_B,
                       **options)


# --------------------------------------------------------------------------- beam search


@functools.partial(
    jax.jit,
    static_argnames=("model", "beam_size", "max_new_tokens", "eos_id", "pad_id", "length_penalty"),
)
def _beam_loop(model: Any, params: Any, prompt_BxT: Array, lengths_B: Array, inputs: dict, *,
               beam_size: int, max_new_tokens: int, eos_id: int | None, pad_id: int,
               length_penalty: float) -> BeamSearchOutput:
    batch = prompt_BxT.shape[0]
    K, N = beam_size, max_new_tokens
    state, first_B = _init(model, params, prompt_BxT, lengths_B, max_new_tokens, inputs)
    # [B*K, ...], each row repeated K times: the model runs once per hypothesis
    state = jax.tree_util.tree_map(lambda x: jnp.repeat(x, K, axis=0), state)
    batch_base_Bx1 = (jnp.arange(batch, dtype=jnp.int32) * K)[:, None]

    def score(logp: Array, length: Array) -> Array:  # length-normalised; empty slots stay _NEG
        penalty = jnp.maximum(jnp.asarray(length, jnp.float32), 1.0) ** length_penalty
        return jnp.where(logp > _NEG / 2, logp / penalty, _NEG)

    def cond(carry: tuple) -> Array:
        step, _, _, beams = carry
        logp_BxK, done_BxK = beams[1], beams[3]
        alive = (~done_BxK) & (logp_BxK > _NEG / 2)
        return (step < N) & jnp.any(alive)

    def body(carry: tuple) -> tuple:
        step, state, cur_BK, (seq_BxKxN, logp_BxK, len_BxK, done_BxK) = carry
        alive_BxK = (~done_BxK) & (logp_BxK > _NEG / 2)
        logits_BKxV, state = model.decode_step(params, state, cur_BK)
        vocab = logits_BKxV.shape[-1]
        step_logp = jax.nn.log_softmax(logits_BKxV.astype(jnp.float32), axis=-1)
        step_logp = jnp.maximum(step_logp, _NEG).reshape(batch, K, vocab)  # finite
        ext_logp_BxKV = jnp.where(
            alive_BxK[:, :, None], logp_BxK[:, :, None] + step_logp, _NEG
        ).reshape(batch, K * vocab)
        # Candidates: every extension of an alive hypothesis, and every finished one as is.
        cand_scores = jnp.concatenate(
            [score(ext_logp_BxKV, step + 1), jnp.where(done_BxK, score(logp_BxK, len_BxK), _NEG)],
            axis=1,
        )
        top_BxK, idx_BxK = jax.lax.top_k(cand_scores, K)
        is_ext = idx_BxK < K * vocab
        parent_BxK = jnp.where(is_ext, idx_BxK // vocab, idx_BxK - K * vocab)
        token_BxK = jnp.where(is_ext, idx_BxK % vocab, pad_id).astype(jnp.int32)
        seq_BxKxN = jnp.take_along_axis(seq_BxKxN, parent_BxK[:, :, None], axis=1)
        column = jnp.where(
            is_ext, token_BxK, jax.lax.dynamic_index_in_dim(seq_BxKxN, step, axis=2, keepdims=False)
        )
        seq_BxKxN = jax.lax.dynamic_update_slice(seq_BxKxN, column[:, :, None], (0, 0, step))
        ext_logp = jnp.take_along_axis(ext_logp_BxKV, jnp.minimum(idx_BxK, K * vocab - 1), axis=1)
        logp_BxK = jnp.where(is_ext, ext_logp, jnp.take_along_axis(logp_BxK, parent_BxK, 1))
        len_BxK = jnp.where(is_ext, step + 1, jnp.take_along_axis(len_BxK, parent_BxK, 1))
        ends = (token_BxK == eos_id) if eos_id is not None else jnp.zeros_like(is_ext)
        done_BxK = jnp.where(is_ext, ends, True)
        dead = top_BxK <= _NEG / 2  # fewer real hypotheses than slots
        logp_BxK = jnp.where(dead, _NEG, logp_BxK)
        done_BxK = done_BxK & ~dead
        rows = (batch_base_Bx1 + parent_BxK).reshape(-1)
        state = jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=0), state)
        return step + 1, state, token_BxK.reshape(-1), (seq_BxKxN, logp_BxK, len_BxK, done_BxK)

    # (seq, logp, len, done) before the first step: one live hypothesis per row
    # (log-probability 0), the other K - 1 slots empty.
    logp_BxK = jnp.full((batch, K), _NEG, jnp.float32).at[:, 0].set(0.0)
    beams = (jnp.full((batch, K, N), pad_id, jnp.int32), logp_BxK, jnp.zeros((batch, K), jnp.int32),
             jnp.zeros((batch, K), bool))
    carry = (jnp.asarray(0, jnp.int32), state, jnp.repeat(first_B, K), beams)
    _, _, _, (seq_BxKxN, logp_BxK, len_BxK, _) = jax.lax.while_loop(cond, body, carry)
    final_BxK = score(logp_BxK, len_BxK)
    final_BxK, order = jax.lax.top_k(final_BxK, K)  # best first
    return BeamSearchOutput(
        jnp.take_along_axis(seq_BxKxN, order[:, :, None], axis=1),
        jnp.take_along_axis(len_BxK, order, axis=1),
        jnp.take_along_axis(logp_BxK, order, axis=1),
        final_BxK,
    )


def beam_search(model: Decodable, params: Any, prompt_BxT: Array,
                prompt_lengths_B: Array | None = None, *, beam_size: int, max_new_tokens: int,
                length_penalty: float = 1.0, eos_id: int | None = None, pad_id: int = 0,
                inputs: dict | None = None) -> BeamSearchOutput:
    r"""Beam search (Bishop §12.3.2): the ``K = beam_size`` best continuations, best first.

    Each step extends every unfinished hypothesis by every token, keeps the ``K`` best of these
    ``K·|V|`` extensions and the finished ones (carried unchanged) by the module docstring's
    score, and reorders the model state with the survivors. Stops when all ``K`` are finished or
    after ``max_new_tokens`` (unfinished ones then count as complete; with ``eos_id=None`` all
    have that length). ``beam_size=1`` with ``length_penalty=0`` is exactly greedy; a beam as
    wide as the hypothesis space is exhaustive search (Bishop (12.34)).
    """
    check_positive_ints(beam_size=beam_size)
    if length_penalty < 0:
        raise ValueError(f"`length_penalty` must be >= 0; got {length_penalty}.")
    prompt_BxT, lengths_B = _check_prompt(
        model, prompt_BxT, prompt_lengths_B, max_new_tokens, eos_id, pad_id
    )
    return _beam_loop(model, params, prompt_BxT, lengths_B, dict(inputs or {}),
                      beam_size=int(beam_size), max_new_tokens=int(max_new_tokens),
                      eos_id=eos_id, pad_id=pad_id, length_penalty=float(length_penalty))


def generate(model: Decodable, params: Any, prompt_BxT: Array,
             prompt_lengths_B: Array | None = None, *, max_new_tokens: int, method: str = "greedy",
             key: Array | None = None, **kwargs: Any) -> DecodeOutput | BeamSearchOutput:
    """:func:`greedy_search`, :func:`sample` (``key`` required) or :func:`beam_search` as
    ``method`` is ``"greedy"``, ``"sample"`` or ``"beam"``; ``kwargs`` go to that function."""
    methods: dict[str, Callable[..., Any]] = {
        "greedy": greedy_search, "sample": sample, "beam": beam_search}
    if method not in methods:
        raise ValueError(f"`method` must be 'greedy', 'sample' or 'beam'; got {method!r}.")
    if method == "sample":
        if key is None:
            raise ValueError("`key` (a PRNG key) is required for method='sample'.")
        kwargs["key"] = key
    return methods[method](model, params, prompt_BxT, prompt_lengths_B,
                           max_new_tokens=max_new_tokens, **kwargs)


# --------------------------------------------------------------------------- no-cache reference


class _RecomputeState(NamedTuple):
    tokens_BxL: Array
    lengths_B: Array


@functools.cache
def recompute_decoder(logits_fn: Callable[[Any, Array], Array], *, window: int = 0
                      ) -> FunctionalDecoder:
    r"""A :class:`Decodable` that recomputes the full causal forward pass at every step: the
    reference cached decoding must reproduce (:math:`O(n^2)` per token instead of a cache's
    :math:`O(n)`, Bishop §12.3.1).

    ``logits_fn(params, tokens_BxL) -> logits_BxLxV`` must be causal (position ``t`` sees tokens
    ``≤ t``) and hashable for ``jit`` caching (a module-level function or a ``functools.partial``
    of one). The state is the token buffer and per-row length; each step writes the token at
    ``lengths[b]`` and reads the logits there. ``window`` > 0 keeps only the last ``window``
    tokens (as nanoGPT's ``generate`` crops to the block size): a full buffer slides left one
    token a step, so a model with ``window`` learned positions generates past them; prompts then
    hold at most ``window + 1`` tokens. 0: the whole sequence (``max_len``).

    Example:
        >>> import jax.numpy as jnp
        >>> last = lambda params, x: jax.nn.one_hot(x, 5)  # predicts its input token
        >>> dec = recompute_decoder(last, window=2)
        >>> greedy_search(dec, None, jnp.asarray([[1, 3]]), max_new_tokens=3).tokens.tolist()  # new
        [[3, 3, 3]]
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"`window` must be an int >= 0 (0: the whole sequence); got {window!r}.")

    def init_decode_state(params: Any, prompt_BxT: Array, prompt_lengths_B: Array,
                          max_len: int) -> _RecomputeState:
        del params
        batch, num_steps = prompt_BxT.shape
        width = window or max_len
        keep = min(num_steps, width)
        buffer_BxL = jnp.zeros((batch, width), jnp.int32).at[:, :keep].set(prompt_BxT[:, :keep])
        return _RecomputeState(buffer_BxL, jnp.asarray(prompt_lengths_B, jnp.int32) - 1)

    def decode_step(params: Any, state: _RecomputeState, tokens_B: Array
                    ) -> tuple[Array, _RecomputeState]:
        rows = jnp.arange(tokens_B.shape[0])
        buffer_BxL, at_B = state.tokens_BxL, state.lengths_B
        if window:  # full rows slide left by one; the new token goes in the last slot
            full_B = at_B >= window
            buffer_BxL = jnp.where(full_B[:, None], jnp.roll(buffer_BxL, -1, axis=1),
                                   buffer_BxL)
            at_B = jnp.minimum(at_B, window - 1)
        buffer_BxL = buffer_BxL.at[rows, at_B].set(tokens_B.astype(jnp.int32))
        logits_BxV = logits_fn(params, buffer_BxL)[rows, at_B]
        grown = state.lengths_B + 1
        return logits_BxV, _RecomputeState(buffer_BxL, jnp.minimum(grown, window) if window
                                           else grown)

    return FunctionalDecoder(init_decode_state, decode_step)

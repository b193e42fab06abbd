"""The experiments' sequence-to-sequence kit: sentence pairs, four models, training, decoding.

What ``experiments.translation`` and ``experiments.numbers`` share (and ``experiments.bert_mlm``
reads the English side of the pairs through :func:`load_pairs`):

* **Text** — :func:`load_pairs` (the Tatoeba/Anki English–French pairs of
  :func:`seqjax.data.corpora.english_french`, normalised by :func:`preprocess` as in d2l),
  :func:`build_tokenizer` (word vocabularies with the specials ``<pad> <unk> <bos> <eos>`` =
  :data:`PAD`, :data:`UNK`, :data:`BOS`, :data:`EOS`), :func:`encode_pairs` (fixed-shape
  teacher-forcing arrays) and :func:`encode_sources`.
* **Models** — :func:`make_model`: one of :data:`ARCHS` from :mod:`seqjax.models` — ``gru``
  (bidirectional GRU encoder, decoder fed the fixed context at every step; MEDL Fig. 7.9(b)),
  ``bahdanau`` (additive attention; MEDL (7.22)), ``luong`` (Luong's "general" score and
  attentional layer) and ``transformer`` (post-norm encoder–decoder; MEDL §7.5).
* **Training** — :func:`seq2seq_run` (from the recipe's ``TrainOptions``): the kit's
  :class:`~seqjax.experiments._kit.Run` of masked token cross-entropy with teacher forcing,
  AdamW with warm-up and cosine decay, trained by :func:`~seqjax.experiments._kit.train`;
  resumable.
* **Decoding** — :func:`translate` (greedy or beam search, :mod:`seqjax.decoding`) and
  :func:`attention_map` (the attention weights of a Seq2Seq with attention, for heatmaps).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.data.tokenizers import SpecialTokens, WordTokenizer
from seqjax.decoding import beam_search, greedy_search
from seqjax.experiments._config import Fraction, PosInt
from seqjax.experiments._kit import Run, Trained, pad_rows
from seqjax.models.encoder_decoder import Transformer, TransformerConfig, vaswani_block
from seqjax.models.rnn import RNNConfig
from seqjax.models.seq2seq import Seq2Seq, Seq2SeqConfig
from seqjax.train.losses import masked_cross_entropy, token_accuracy
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import Parallel

Arch = Literal["gru", "bahdanau", "luong", "transformer"]
ARCHS: tuple[str, ...] = get_args(Arch)
ARCH_LABELS = {
    "gru": "GRU enc–dec, no attention",
    "bahdanau": "GRU + Bahdanau (additive)",
    "luong": "GRU + Luong (general)",
    "transformer": "Transformer (2+2 layers)",
}
#: Vocabulary layout of every tokenizer here: <pad>=0, <unk>=1, <bos>=2, <eos>=3.
SPECIALS = SpecialTokens(mask=None, sep=None, cls=None)
PAD, UNK, BOS, EOS = 0, 1, 2, 3


@dataclass(frozen=True)
class ModelOptions:
    """The networks' sizes, ``--model.KEY`` of ``translation`` and ``numbers``: one set shared
    by every architecture they compare (``--archs``, :func:`make_model`), each taking the ones
    that apply to it — the GRU models their embedding, hidden size and dropout, the
    transformer its width, depth, heads and dropout.

    Attributes:
        embed_dim: word-embedding size of the GRU models (the transformer's is ``hidden_size``).
        hidden_size: GRU hidden size; the transformer's width ``d`` (its MLP ``2·d``).
        num_layers: the transformer's encoder blocks and decoder blocks, each (the GRU
            models have one layer).
        num_heads: attention heads (``transformer``).
        dropout_rate: dropout rate in training (the GRU models: on the embeddings and the
            decoder outputs; the transformer: in its blocks).
    """

    embed_dim: PosInt = 64
    hidden_size: PosInt = 64
    num_layers: PosInt = 2
    num_heads: PosInt = 4
    dropout_rate: Fraction = 0.1


# ----------------------------------------------------------------------------- text


def preprocess(text: str) -> str:
    """d2l's normalisation: lower case, no-break spaces to spaces, a space before ``,.!?``.

    Example:
        >>> preprocess("He's calm.")
        "he's calm ."
    """
    text = text.replace("\u202f", " ").replace("\xa0", " ").lower()
    return re.sub(r"(?<=\S)([,.!?])", r" \1", text).strip()


def build_tokenizer(texts: Sequence[str], *, min_freq: int = 1,
                    pattern: str = r"\S+") -> WordTokenizer:
    """Words of ``texts`` seen ``min_freq`` times, after the specials <pad> <unk> <bos> <eos>."""
    return WordTokenizer.from_texts(texts, min_freq=min_freq, pattern=pattern,
                                    special_tokens=SPECIALS)


def encode_pairs(
    src: Sequence[str], tgt: Sequence[str], src_tok: WordTokenizer, tgt_tok: WordTokenizer,
    *, src_len: int, tgt_len: int,
) -> dict[str, np.ndarray]:
    """Fixed-shape arrays for teacher forcing (one compiled shape for every batch).

    ``src`` int32[N, src_len] (+ ``src_lengths``), ``tgt_in`` = ``<bos> y`` and
    ``tgt_out`` = ``y <eos>``, int32[N, tgt_len + 1], with ``tgt_mask`` (True on
    real target tokens and on ``<eos>``).
    """
    n = len(src)
    out = {
        "src": np.full((n, src_len), PAD, np.int32),
        "src_lengths": np.zeros(n, np.int32),
        "tgt_in": np.full((n, tgt_len + 1), PAD, np.int32),
        "tgt_out": np.full((n, tgt_len + 1), PAD, np.int32),
        "tgt_mask": np.zeros((n, tgt_len + 1), bool),
    }
    for i, (s, t) in enumerate(zip(src, tgt)):
        s_ids = src_tok.encode(s, max_length=src_len, truncation=True)
        t_ids = tgt_tok.encode(t, max_length=tgt_len, truncation=True)
        out["src"][i, : len(s_ids)] = s_ids
        out["src_lengths"][i] = max(len(s_ids), 1)
        out["tgt_in"][i, : len(t_ids) + 1] = [BOS, *t_ids]
        out["tgt_out"][i, : len(t_ids) + 1] = [*t_ids, EOS]
        out["tgt_mask"][i, : len(t_ids) + 1] = True
    return out


def encode_sources(sentences: Sequence[str], tok: WordTokenizer,
                   src_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(src int32[N, src_len], src_lengths int32[N])`` of source sentences."""
    src = np.full((len(sentences), src_len), PAD, np.int32)
    lengths = np.ones(len(sentences), np.int32)
    for i, s in enumerate(sentences):
        ids = tok.encode(s, max_length=src_len, truncation=True)
        src[i, : len(ids)] = ids
        lengths[i] = max(len(ids), 1)
    return src, lengths


# ----------------------------------------------------------------------------- models


def make_model(
    arch: str, src_vocab: int, tgt_vocab: int, *, embed_dim: int, hidden_size: int,
    dropout_rate: float = 0.0, num_layers: int = 2, num_heads: int = 4, block_size: int = 64,
) -> Seq2Seq | Transformer:
    """One of :data:`ARCHS` from :mod:`seqjax.models` (see the module docstring), at the
    sizes the recipes give as their group ``--model.*`` (the same names)."""
    rnn = Seq2SeqConfig(
        encoder=RNNConfig(vocab_size=src_vocab, embed_dim=embed_dim, hidden_size=hidden_size,
                          cell_type="gru", bidirectional=True, dropout_rate=dropout_rate),
        tgt_vocab_size=tgt_vocab,
    )
    if arch == "gru":
        return Seq2Seq(rnn.replace(context="every_step"))
    if arch == "bahdanau":
        return Seq2Seq(rnn.replace(context="attention", attention="bahdanau"))
    if arch == "luong":
        return Seq2Seq(rnn.replace(context="attention", attention="luong_general"))
    if arch == "transformer":
        return Transformer(TransformerConfig(
            src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, num_layers=num_layers,
            embed_dim=hidden_size, block_size=block_size, tie_embeddings=True,
            block=vaswani_block(num_heads, mlp_dim=2 * hidden_size, dropout_rate=dropout_rate),
        ))
    raise ValueError(f"`arch` must be one of {ARCHS}; got {arch!r}.")


# ----------------------------------------------------------------------------- training


def _apply(model: Any, params: Any, batch: dict, *, train: bool, rng: jax.Array | None = None,
           ) -> jax.Array:
    rngs = {"dropout": rng} if train else {}
    return model.apply({"params": params}, batch["src"], batch["tgt_in"], batch["src_lengths"],
                       deterministic=not train, rngs=rngs)


def _metrics(logits: jax.Array, batch: dict) -> tuple[jax.Array, dict]:
    loss = masked_cross_entropy(logits, batch["tgt_out"], batch["tgt_mask"])
    return loss, {"accuracy": token_accuracy(logits, batch["tgt_out"], batch["tgt_mask"]),
                  "tokens": jnp.sum(batch["tgt_mask"]).astype(jnp.float32)}


def seq2seq_run(
    model: Any, train: dict[str, np.ndarray], val: dict[str, np.ndarray] | None,
    cfg: TrainOptions, *, seed: int, name: str = "", model_config: dict,
    evaluate: Callable[[Trained], dict] | None = None, print_logs: bool = False,
    plot: bool = True,
) -> Run:
    """The :class:`~seqjax.experiments._kit.Run` that trains ``model`` with teacher forcing.

    Loss: masked token cross-entropy (MEDL (7.4)–(7.5), no loss on padding); AdamW with
    linear warm-up and cosine decay to 0.05 of the peak, global-norm clipping, from the
    recipe's training options ``cfg``; ``cfg.batch_size`` is the global batch (capped at the
    training set). With ``val``, ``val`` is evaluated every ``cfg.eval_every`` steps (0 =
    only at the end), in global batches of 256 rows; ``plot`` draws ``loss.png`` in the run's
    folder. The parameters are drawn from ``seed``, the state's dropout key from
    ``seed + 1000``. Trained by :func:`~seqjax.experiments._kit.train`, it resumes from its
    folder (a finished run is restored, not retrained).
    """
    first = {k: v[:1] for k, v in train.items()}
    params = jax.jit(lambda k: model.init(k, first["src"], first["tgt_in"],
                                          first["src_lengths"])["params"])(
        jax.random.PRNGKey(seed))

    def loss_fn(p: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
        return _metrics(_apply(model, p, batch, train=True, rng=rng), batch)

    def eval_fn(p: Any, batch: dict) -> dict:
        loss, m = _metrics(_apply(model, p, batch, train=False), batch)
        return {"loss": loss, **m}

    def val_batches(par: Parallel) -> list[dict]:
        # Global batches; the last is padded to split over the devices (no target tokens,
        # so no weight in the token-weighted mean).
        size = 256
        return [pad_rows({k: v[i : i + size] for k, v in val.items()}, par.batch_shards,
                         {"tgt_mask": False}) for i in range(0, len(val["src"]), size)]

    evaluated = val is not None and len(val["src"]) > 0
    return Run(
        model=model, params=params, loss_fn=loss_fn, data=train,
        optimizer=cfg.optimizer_config("adamw", min_lr_ratio=0.05),
        fit=cfg.fit_config(best_metric=None, print_logs=print_logs, tensorboard=False,
                           plot=plot),
        batch_size=min(cfg.batch_size, len(train["src"])), seed=seed, dropout_seed=seed + 1000,
        eval_fn=eval_fn if evaluated else None, eval_data=val_batches if evaluated else None,
        model_config=model_config, name=name, evaluate=evaluate)


# ----------------------------------------------------------------------------- decoding


def translate(
    model: Any, params: Any, src: np.ndarray, src_lengths: np.ndarray, *,
    max_new_tokens: int, beam_size: int = 1, batch_size: int = 256,
) -> list[list[int]]:
    """Decode every source row (greedy, or beam search with length normalisation).

    Every batch has ``batch_size`` rows (rows are repeated to fill it), so the decoding
    loop compiles once per model. Returns the token ids of each translation, ``<eos>`` excluded.
    """
    n = len(src)
    out: list[list[int]] = []
    for i in range(0, n, batch_size):
        idx = np.arange(i, i + batch_size) % n
        inputs = {"src": jnp.asarray(src[idx]), "src_lengths": jnp.asarray(src_lengths[idx])}
        prompt = jnp.full((batch_size, 1), BOS, jnp.int32)
        if beam_size > 1:
            res = beam_search(model, params, prompt, beam_size=beam_size,
                              max_new_tokens=max_new_tokens, eos_id=EOS, pad_id=PAD,
                              inputs=inputs)
            tokens = np.asarray(res.tokens[:, 0])
        else:
            res = greedy_search(model, params, prompt, max_new_tokens=max_new_tokens,
                                eos_id=EOS, pad_id=PAD, inputs=inputs)
            tokens = np.asarray(res.tokens)
        for row in tokens[: min(batch_size, n - i)]:
            row = row.tolist()
            out.append(row[: row.index(EOS)] if EOS in row else row)
    return out


def attention_map(model: Seq2Seq, params: Any, src_ids: Sequence[int],
                  out_ids: Sequence[int]) -> np.ndarray:
    """Attention weights ``[len(out_ids) + 1, len(src_ids)]`` of a Seq2Seq with attention.

    Row ``t`` is :math:`\\alpha^{⟨t⟩}`, the weights used to emit output token ``t`` (the
    last row emits ``<eos>``): the decoder is teacher-forced on its own translation.
    """
    src = jnp.asarray([list(src_ids)], jnp.int32)
    tgt_in = jnp.asarray([[BOS, *out_ids]], jnp.int32)
    _, alpha = _attention_fn(model)(params, src, tgt_in, jnp.asarray([len(src_ids)], jnp.int32))
    return np.asarray(alpha[0])


@functools.cache
def _attention_fn(model: Seq2Seq) -> Callable:
    return jax.jit(lambda p, s, t, n: model.apply({"params": p}, s, t, n, method="with_weights"))


def load_pairs(num_pairs: int = 0) -> tuple[list[str], list[str]]:
    """The preprocessed (English, French) pairs of the offline file (first ``num_pairs``)."""
    from seqjax.data.corpora import english_french

    ds = english_french()
    n = len(ds) if num_pairs <= 0 else min(num_pairs, len(ds))
    rows = ds.select(range(n))
    return [preprocess(s) for s in rows["src"]], [preprocess(t) for t in rows["tgt"]]

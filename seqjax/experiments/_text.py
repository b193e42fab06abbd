"""The experiments' character-level text kit: Tiny Shakespeare, the char LM, its decoder.

What ``experiments.char_lm`` shares with ``experiments.norm_placement`` (the data) and
``experiments.sampling`` (a trained LM and its decoder):

* **Data** — :func:`load_data` (the 65 characters of Tiny Shakespeare in nanoGPT's 90/10
  split, or a prefix for smoke runs, through ``seqjax prepare``'s shards) and
  :func:`val_windows` (random ``[batch, block]`` windows, nanoGPT's ``estimate_loss``).
* **Model** — :func:`build_model`: a GPT (:class:`~seqjax.models.gpt.TransformerLM`,
  nanoGPT's block) or a stacked-LSTM LM (:class:`~seqjax.models.rnn.RNNLanguageModel`).
* **Decoding** — :func:`window_decoder` (a transformer fed its last ``block`` tokens,
  nanoGPT's crop) and :func:`lm_decoder` (the decoder of either model).
* **A trained LM** — :func:`load_model` (model, parameters, tokenizer and config from a
  ``char_lm`` work dir) on :func:`restore`.

The functions take a config ``cfg`` and read the fields they name (char_lm's ``Config`` has
them all; norm_placement's has the data and window fields).
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.data.corpora import tiny_shakespeare_text
from seqjax.data.iterators import LMWindowIterator
from seqjax.data.prepare import prepare
from seqjax.data.shards import open_tokens
from seqjax.data.tokenizers import CharTokenizer, SpecialTokens, load_tokenizer
from seqjax.decoding import FunctionalDecoder, recompute_decoder, sample
from seqjax.experiments._config import ConfigError
from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.models.rnn import RNNLanguageModel, RNNLMConfig
from seqjax.train.checkpoint import restore_params

Model = Literal["transformer", "lstm"]
MODELS: tuple[str, ...] = get_args(Model)
#: nanoGPT's and llm.c's weight decay: every 2-D parameter (embeddings included); never the
#: biases and the norms' vectors (``OptimizerConfig.no_decay``).
NO_DECAY = (r"(^|/)bias$", r"(^|/)(scale|gamma|beta)$", r"norm")


# ----------------------------------------------------------------------------- data


def load_data(cfg: Any) -> tuple[np.ndarray, np.ndarray, CharTokenizer]:
    """``(train_ids, val_ids, tokenizer)`` of Tiny Shakespeare read from ``cfg.data_path``
    (``cfg.max_chars > 0`` keeps a prefix, for smoke runs) through the token path: written by
    :func:`seqjax.data.prepare.prepare` as nanoGPT's ``shakespeare_char`` bins (its 65 sorted
    characters, no special tokens; the text cut at ``int(0.9 n)``) in a temporary folder and
    read back by :func:`seqjax.data.shards.open_tokens`."""
    text = tiny_shakespeare_text(cfg.data_path)
    tok = CharTokenizer.from_text(text, SpecialTokens.none())  # the full 65-char vocabulary
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "tinyshakespeare.txt")
        with open(source, "w", encoding="utf-8", newline="") as f:
            f.write(text[: cfg.max_chars] if cfg.max_chars > 0 else text)
        out = os.path.join(folder, "shakespeare_char")
        prepare(source, out, tokenizer=tok, format="nanogpt", split="text", val_fraction=0.1,
                workers=1)
        data = open_tokens(out, vocab_size=tok.vocab_size)
        return (np.array(data.train[0], np.int32), np.array(data.val[0], np.int32), tok)


def val_windows(ids: np.ndarray, cfg: Any, num: int, seed: int) -> list[dict]:
    """``num`` random ``[cfg.batch_size, cfg.block_size]`` windows (nanoGPT's
    ``estimate_loss``)."""
    it = LMWindowIterator(ids, cfg.batch_size, cfg.block_size, seed=seed)
    out = []
    for _ in range(num):
        b = next(it)
        out.append({**b, "mask": np.ones(b["targets"].shape, bool)})
    return out


# ----------------------------------------------------------------------------- model


def build_model(cfg: Any, vocab_size: int) -> Any:
    """The :class:`TransformerLM` or :class:`RNNLanguageModel` that ``cfg`` describes (its
    ``model``, ``num_layers``, ``num_heads``, ``embed_dim``, ``block_size``, ``dropout_rate``,
    ``attention_dropout_rate`` and ``compute_dtype``, as char_lm's ``Config``)."""
    if cfg.model not in MODELS:
        raise ConfigError(f"--model must be one of {MODELS}; got {cfg.model!r}.")
    dtype = None if cfg.compute_dtype == "float32" else jnp.dtype(cfg.compute_dtype)
    if cfg.model == "transformer":
        # nanoGPT's block (the model starts its residual projections at 0.02/√(2L))
        block = gpt_block(cfg.num_heads, dropout_rate=cfg.dropout_rate,
                          attention_dropout_rate=cfg.attention_dropout_rate, use_bias=False,
                          activation="gelu")
        return TransformerLM(TransformerLMConfig(
            vocab_size=vocab_size, num_layers=cfg.num_layers, embed_dim=cfg.embed_dim,
            block_size=cfg.block_size, block=block,
        ), dtype=dtype)
    return RNNLanguageModel(RNNLMConfig(
        vocab_size=vocab_size, embed_dim=cfg.embed_dim, num_layers=cfg.num_layers,
        cell_type="lstm", dropout_rate=cfg.dropout_rate, cell_kwargs={"forget_bias": 1.0},
    ), dtype=dtype)


# ----------------------------------------------------------------------------- decoding


def _logits(model: TransformerLM, params: Any, tokens_BxT: jax.Array) -> jax.Array:
    return model.apply({"params": params}, tokens_BxT)


@functools.cache
def window_decoder(model: TransformerLM, block: int) -> FunctionalDecoder:
    """A :class:`~seqjax.decoding.Decodable` that feeds the model its last ``block`` tokens
    (:func:`~seqjax.decoding.recompute_decoder` with ``window=block``: nanoGPT's crop; one
    object per model and block, so ``jit`` reuses its compilation)."""
    return recompute_decoder(functools.partial(_logits, model), window=block)


def lm_decoder(model: Any, block_size: int) -> Any:
    """The :class:`~seqjax.decoding.Decodable` a character LM is sampled and scored through: a
    transformer through :func:`window_decoder` (its last ``block_size`` characters), an RNN
    as it is."""
    return window_decoder(model, block_size) if isinstance(model, TransformerLM) else model


def sampling(model: Any, block_size: int, prompt_ids: list[int], *, max_new_tokens: int,
             temperature: float, top_k: int, seed: int) -> tuple[Any, jax.Array, dict]:
    """``(decoder, prompt [1, T], sample's options)`` that continue ``prompt_ids``: a
    transformer keeps the prompt's last ``block_size + 1`` ids (nanoGPT's crop), an RNN all;
    greedy (no top-k) at temperature 0; ``top_k=0``: every token."""
    if not prompt_ids:
        raise ValueError("`prompt` must hold at least one token.")
    if isinstance(model, TransformerLM):
        prompt_ids = prompt_ids[-(block_size + 1):]
    return lm_decoder(model, block_size), jnp.asarray([prompt_ids], jnp.int32), dict(
        key=jax.random.PRNGKey(seed), max_new_tokens=max_new_tokens, temperature=temperature,
        top_k=top_k if temperature > 0 else 0)


def sample_ids(model: Any, params: Any, block_size: int, prompt_ids: list[int],
               **options: Any) -> list[int]:
    """The ids that continue ``prompt_ids`` (:func:`sampling`'s ``options``): the char LM's
    and the GPT recipe's one sampler."""
    decoder, prompt, kwargs = sampling(model, block_size, prompt_ids, **options)
    return [int(t) for t in np.asarray(sample(decoder, params, prompt, **kwargs).tokens[0])]


# ----------------------------------------------------------------------------- a trained LM


def restore(cfg: Any, workdir: str) -> tuple[Any, CharTokenizer, Any]:
    """``(model, tokenizer, params)``: the model ``cfg`` describes (:func:`build_model`), the
    tokenizer of ``workdir/tokenizer.json`` and the newest checkpoint's parameters."""
    tok = load_tokenizer(os.path.join(workdir, "tokenizer.json"))
    model = build_model(cfg, tok.vocab_size)
    return model, tok, restore_params(os.path.join(workdir, "checkpoints"))


def load_model(workdir: str) -> tuple[Any, Any, CharTokenizer, Any]:
    """``(model, params, tokenizer, config)`` of the newest checkpoint of the character LM
    trained in ``workdir`` by ``seqjax train char_lm`` (its config read from the work dir's
    ``experiment.json`` by the runner, as ``seqjax generate`` does).

    Example (after a run)::

        model, params, tok, cfg = load_model("workdirs/char_lm")
        logits = model.apply({"params": params}, jnp.asarray([tok.encode("ROMEO:")]))
    """
    from seqjax.experiments._runner import experiment_from_workdir

    _, cfg = experiment_from_workdir("char_lm", workdir, [])
    model, tok, params = restore(cfg, workdir)
    return model, params, tok, cfg

"""The experiments' text kit: a text as tokens, the LM decoders, a trained character LM.

What the GPT recipe (``experiments.gpt2``, and ``char_lm``, its preset) shares with
``experiments.norm_placement`` (the data) and ``experiments.sampling`` (a trained LM and its
decoder):

* **Data** — :func:`prepared_text` (a text file through ``seqjax prepare``'s nanoGPT layout,
  read back into memory), :func:`load_data` (the 65 characters of Tiny Shakespeare in
  nanoGPT's 90/10 split, or a prefix for smoke runs) and :func:`estimate_windows` (random
  ``[rows, block]`` windows, nanoGPT's ``estimate_loss``).
* **Decoding** — :func:`window_decoder` (a transformer fed its last ``block`` tokens,
  nanoGPT's crop), :func:`lm_decoder` (the decoder of either model) and :func:`sample_ids`.
* **A trained LM** — :func:`load_model` (model, parameters, tokenizer and config from a
  ``char_lm`` work dir).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.data.corpora import resolve_corpus
from seqjax.data.prepare import prepare
from seqjax.data.shard_windows import ShardWindows
from seqjax.data.shards import TokenData, open_tokens
from seqjax.data.tokenizers import CharTokenizer, SpecialTokens, Tokenizer, load_tokenizer
from seqjax.decoding import FunctionalDecoder, recompute_decoder, sample
from seqjax.models.gpt import TransformerLM
from seqjax.train.checkpoint import restore_params

#: nanoGPT's and llm.c's weight decay: every 2-D parameter (embeddings included); never the
#: biases and the norms' vectors (``OptimizerConfig.no_decay``).
NO_DECAY = (r"(^|/)bias$", r"(^|/)(scale|gamma|beta)$", r"norm")


# ----------------------------------------------------------------------------- data


def prepared_text(source: str, tok: Tokenizer, max_chars: int = 0) -> TokenData:
    """The text file ``source`` (its first ``max_chars`` characters; 0 = all) written by
    :func:`seqjax.data.prepare.prepare` as nanoGPT's ``train.bin``/``val.bin`` with ``tok``
    (the text cut at ``int(0.9 n)``) in a temporary folder, read back by
    :func:`seqjax.data.shards.open_tokens` and held in memory."""
    with tempfile.TemporaryDirectory() as folder:
        if max_chars:
            with open(source, encoding="utf-8") as f:
                text = f.read(max_chars)
            source = os.path.join(folder, os.path.basename(source))
            with open(source, "w", encoding="utf-8", newline="") as f:
                f.write(text)
        out = os.path.join(folder, "tokens")
        prepare(source, out, tokenizer=tok, format="nanogpt", split="text", val_fraction=0.1,
                workers=1)
        data = open_tokens(out, vocab_size=tok.vocab_size)
        return dataclasses.replace(data, train=[np.array(a) for a in data.train],
                                   val=[np.array(a) for a in data.val])


def load_data(cfg: Any) -> tuple[np.ndarray, np.ndarray, CharTokenizer]:
    """``(train_ids, val_ids, tokenizer)`` of Tiny Shakespeare read from ``cfg.data_path``
    (``cfg.max_chars > 0`` keeps a prefix, for smoke runs) as nanoGPT's ``shakespeare_char``:
    its 65 sorted characters, no special tokens, the text cut at ``int(0.9 n)``
    (:func:`prepared_text`)."""
    source = str(resolve_corpus("tinyshakespeare.txt", cfg.data_path))
    with open(source, encoding="utf-8") as f:
        tok = CharTokenizer.from_text(f.read(), SpecialTokens.none())  # all 65 characters
    data = prepared_text(source, tok, cfg.max_chars)
    return data.train[0].astype(np.int32), data.val[0].astype(np.int32), tok


def estimate_windows(shards: Any, rows: int, block_size: int, num: int, seed: int
                     ) -> list[dict]:
    """nanoGPT's ``estimate_loss`` batches: ``num`` batches of ``rows`` random windows of
    ``block_size`` from ``shards`` (:class:`ShardWindows`; a fixed ``seed``: the same batches
    every time): ``inputs``/``targets`` int32[rows, block_size] (targets shifted by one) and an
    all-true ``mask`` bool[rows, block_size]."""
    it = ShardWindows(shards, rows, block_size, seed=seed)
    return [{**b, "mask": np.ones(b["targets"].shape, bool)} for b in (next(it)
                                                                      for _ in range(num))]


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


def load_model(workdir: str) -> tuple[Any, Any, CharTokenizer, Any]:
    """``(model, params, tokenizer, config)`` of the newest checkpoint of the character LM
    trained in ``workdir`` by ``seqjax train char_lm`` (its config read from the work dir's
    ``experiment.json`` by the runner, as ``seqjax generate`` does).

    Example (after a run)::

        model, params, tok, cfg = load_model("workdirs/char_lm")
        logits = model.apply({"params": params}, jnp.asarray([tok.encode("ROMEO:")]))
    """
    from seqjax.experiments._runner import experiment_from_workdir

    recipe, cfg = experiment_from_workdir("char_lm", workdir, [])
    tok = load_tokenizer(os.path.join(workdir, "tokenizer.json"))
    params = restore_params(os.path.join(workdir, "checkpoints"))
    return recipe.build_model(cfg), params, tok, cfg

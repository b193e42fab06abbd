"""Decoding a character LM: greedy, beam, temperature, top-k, top-p (Bishop §12.3.2).

The model is the one trained by ``experiments.char_lm`` (nanoGPT's CPU config on Tiny
Shakespeare), read from ``lm_workdir`` (default ``workdirs/char_lm``) with the text kit's
:func:`~seqjax.experiments._text.load_model`. If that folder holds no checkpoint, this
experiment first trains a small character LM itself — ``seqjax train char_lm`` run by the
runner (``fallback_*`` settings, written to ``<workdir>/char_lm``) — and says so in its
summary.

For ``num_prompts`` prompts — ``prompt_chars`` characters from the start of random lines of
the *validation* text — every strategy continues each prompt by ``new_chars``
characters through :mod:`seqjax.decoding` (a transformer with learned positions sees its
last ``block_size`` characters: :func:`~seqjax.experiments._text.window_decoder`):

* ``greedy`` — :math:`y_n = \\arg\\max_k p(y_n = k \\mid y_{<n})`;
* ``beamK`` — beam search of width ``K`` (all hypotheses have the same length here, so
  length normalisation does not change the ranking);
* ``tempT`` — ancestral sampling from :math:`\\mathrm{softmax}(a / T)` (Bishop (12.35));
* ``topkK`` / ``toppP`` — sampling from the ``K`` most probable characters / from the
  nucleus of mass ``P`` (Holtzman et al. 2019), renormalised (``T = 1``).

Reported per strategy: the log-likelihood per character of the generated text under the
(untempered) model, distinct-1/2 (distinct word uni-/bigrams over all generated text, Li
et al. 2016), the share of generated words that occur in the training text, and a sample.
The row ``human`` scores the true validation continuation of each prompt: Bishop §12.3.2
(Fig. 12.17, after Holtzman et al.) notes that human text has a *lower* likelihood under
the model than beam-search output, and is more diverse.

Run:  python -m seqjax.experiments.sampling             (after experiments.char_lm; or trains one)
      python -m seqjax.experiments.sampling --smoke     (seconds, for CI: a tiny LM of its own)
"""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.decoding import beam_search, greedy_search, sample
from seqjax.experiments._config import NonNegInt, PosInt
from seqjax.experiments._gpt import load_tokens
from seqjax.experiments._kit import Task, machine_info, train
from seqjax.experiments._runner import train_experiment
from seqjax.experiments._text import lm_decoder, load_model
from seqjax.experiments.reports.sampling import plot_sampling
from seqjax.train.checkpoint import load_meta
from seqjax.utils import count_params

STRATEGIES = ("greedy", "beam4", "temp0.5", "temp0.8", "temp1.0", "temp1.5", "topk5",
              "topk20", "topp0.5", "topp0.9")


@dataclass(frozen=True)
class Config:
    """The options of ``seqjax train sampling``: the character LM, the prompts, the strategies.

    Attributes:
        lm_workdir: the ``char_lm`` work dir to read the model from (it must hold
            ``checkpoints/`` and ``experiment.json``); ``""`` = always train a small LM here.
        fallback_steps: training steps of the char LM trained here when ``lm_workdir``
            holds none.
        fallback_max_chars: that LM trains on the corpus's first N characters (0 = all of
            Tiny Shakespeare).
        fallback_smoke: train ``char_lm``'s ``smoke`` preset instead (seconds, for CI; the
            two ``fallback_*`` settings above are then unused).
        strategies: decoding strategies, a comma list of ``greedy``, ``beamK`` (beam width
            K), ``tempT`` (temperature T), ``topkK`` (top-k) and ``toppP`` (nucleus mass P).
        num_prompts: prompts, each from the start of a random line of the validation text.
        prompt_chars: characters per prompt.
        new_chars: characters each strategy generates per prompt (and the length of the
            true continuation scored as ``human``).
        seed: the choice of prompts and the sampling key.
        workdir: ``sampling.png``, ``samples.md``, ``sampling.json`` and the fallback LM
            (in ``WORKDIR/char_lm``); ``None`` = write nothing (``lm_workdir`` must then
            hold a model).
    """

    lm_workdir: str = "workdirs/char_lm"  # "" = always train a small LM here
    fallback_steps: PosInt = 1000
    fallback_max_chars: NonNegInt = 0  # 0 = all of Tiny Shakespeare
    fallback_smoke: bool = False  # train char_lm's "smoke" model instead (CI)
    strategies: tuple[str, ...] = STRATEGIES
    num_prompts: PosInt = 16
    prompt_chars: PosInt = 32
    new_chars: PosInt = 200
    seed: int = 0
    workdir: str | None = "workdirs/sampling"

    def __post_init__(self) -> None:
        for name in self.strategies:  # checked at the door, before the work dir is written
            parse_strategy(name)


PRESETS = {
    "smoke": {"lm_workdir": "", "fallback_smoke": True, "strategies": "greedy,beam2,topp0.9",
              "num_prompts": 2, "prompt_chars": 8, "new_chars": 12},
}


# ----------------------------------------------------------------------------- model


def load_or_train(cfg: Config) -> tuple[Any, Any, Any, Any, dict]:
    """``(model, params, tokenizer, char_lm.Config, provenance)`` of the character LM."""
    path = cfg.lm_workdir
    if path and os.path.isdir(os.path.join(path, "checkpoints")) and os.path.exists(
            os.path.join(path, "experiment.json")):
        model, params, tok, lm_cfg = load_model(path)
        step = load_meta(os.path.join(path, "checkpoints")).get("step")
        return model, params, tok, lm_cfg, {"source": "char_lm work dir", "path": path,
                                            "checkpoint_step": step}
    if cfg.workdir is None:
        raise ValueError("no trained char LM in `lm_workdir` and no `workdir` to train one in.")
    own = os.path.join(cfg.workdir, "char_lm")
    argv = ["--workdir", own] + (["--smoke", "--progress=false"] if cfg.fallback_smoke else [
        f"--steps={cfg.fallback_steps}", f"--max_chars={cfg.fallback_max_chars}",
        "--eval_every=0", "--val_tokens=4096", "--sample_tokens=100", "--checkpoint_every=0"])
    print(f"sampling: no checkpoint in {path!r}; training a char LM in {own}: "
          f"python -m seqjax.experiments.char_lm {' '.join(argv)}")
    train_experiment("char_lm", argv)  # as `seqjax train char_lm`: experiment.json, then run
    model, params, tok, lm_cfg = load_model(own)
    return model, params, tok, lm_cfg, {"source": "trained here (fallback)", "path": own,
                                        "checkpoint_step": lm_cfg.steps, "argv": argv}


def decoder_for(model: Any, lm_cfg: Any) -> Any:
    """The :class:`~seqjax.decoding.Decodable` used for every strategy."""
    return lm_decoder(model, lm_cfg.block_size)


@functools.partial(jax.jit, static_argnums=0)
def score(decoder: Any, params: Any, prompt_BxP: jax.Array, cont_BxN: jax.Array) -> jax.Array:
    """Per-character log-probabilities ``[B, N]`` of ``cont`` after ``prompt`` (teacher forced).

    Runs the decoder's own ``decode_step`` (the same model view the strategies sample
    from), so scores and the decoders' ``log_probs`` agree.
    """
    batch, plen = prompt_BxP.shape
    lengths = jnp.full((batch,), plen, jnp.int32)
    state = decoder.init_decode_state(params, prompt_BxP, lengths, plen + cont_BxN.shape[1])
    rows = jnp.arange(batch)

    def body(carry: tuple, nxt_B: jax.Array) -> tuple[tuple, jax.Array]:
        state, cur_B = carry
        logits_BxV, state = decoder.decode_step(params, state, cur_B)
        logp_B = jax.nn.log_softmax(logits_BxV.astype(jnp.float32), -1)[rows, nxt_B]
        return (state, nxt_B), logp_B

    _, logp_NxB = jax.lax.scan(body, (state, prompt_BxP[:, -1]), cont_BxN.T)
    return logp_NxB.T


def parse_strategy(name: str) -> dict:
    """``"greedy"``, ``"beamK"``, ``"tempT"``, ``"topkK"``, ``"toppP"`` → decoding arguments."""
    for prefix, key, conv in (("beam", "beam_size", int), ("temp", "temperature", float),
                              ("topk", "top_k", int), ("topp", "top_p", float)):
        if name.startswith(prefix):
            try:
                value = conv(name[len(prefix):])
            except ValueError:
                break
            if value > 0 and (key != "top_p" or value <= 1):
                return {key: value}
            break
    if name == "greedy":
        return {}
    raise ValueError(f"--strategies: unknown strategy {name!r}: use greedy, beamK (K >= 1), "
                     "tempT (T > 0), topkK (K >= 1) or toppP (0 < P <= 1).")


def decode(decoder: Any, params: Any, prompts: jax.Array, name: str, n: int,
           key: jax.Array) -> np.ndarray:
    """``[B, n]`` continuations of ``prompts`` by strategy ``name``."""
    args = parse_strategy(name)
    if name == "greedy":
        return np.asarray(greedy_search(decoder, params, prompts, max_new_tokens=n).tokens)
    if "beam_size" in args:
        out = beam_search(decoder, params, prompts, max_new_tokens=n, **args)
        return np.asarray(out.tokens[:, 0])
    return np.asarray(sample(decoder, params, prompts, key=key, max_new_tokens=n,
                             temperature=args.get("temperature", 1.0), top_k=args.get("top_k", 0),
                             top_p=args.get("top_p", 1.0)).tokens)


# ----------------------------------------------------------------------------- metrics


def words(text: str) -> list[str]:
    """Lower-case words (letters and apostrophes) of ``text``."""
    return re.findall(r"[a-z']+", text.lower())


def distinct_n(texts: list[str], n: int) -> float:
    """Distinct word n-grams / all word n-grams over ``texts`` (Li et al. 2016).

    Example:
        >>> distinct_n(["to be or not to be"], 2)
        0.8
    """
    grams = [tuple(w[i : i + n]) for t in texts for w in [words(t)]
             for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def build(cfg: Config) -> Task:
    """Sampling trains nothing: a task with no runs whose ``summarize`` hook decodes the
    prompts by every strategy and scores the continuations, ``report`` is the table and
    ``files`` the figure and the samples."""
    started = time.perf_counter()  # the strategies were checked by Config
    return Task("sampling", [], summarize=lambda _: measure(cfg, started),
                report=lambda s: s["table_md"], files=write_files, started=started)


def measure(cfg: Config, started: float) -> dict:
    """The char LM (:func:`load_or_train`), ``num_prompts`` validation prompts, and per
    strategy the continuations' log-likelihood, distinct-1/2, known words and a sample."""
    info = machine_info()
    model, params, tok, lm_cfg, provenance = load_or_train(cfg)
    tokens = load_tokens(lm_cfg)  # the LM's own data, as its recipe reads it
    train_ids, val_ids = tokens.train[0], tokens.val[0]
    vocab_words = set(words(tok.decode(train_ids)))
    val_text = tok.decode(val_ids)
    rng = np.random.default_rng(cfg.seed)
    span = cfg.prompt_chars + cfg.new_chars
    starts = [i + 1 for i, c in enumerate(val_text[: len(val_text) - span - 1]) if c == "\n"]
    starts = sorted(rng.choice(starts, size=min(cfg.num_prompts, len(starts)), replace=False))
    ids = np.asarray([val_ids[s : s + span] for s in starts], np.int32)
    prompts, human = jnp.asarray(ids[:, : cfg.prompt_chars]), jnp.asarray(ids[:, cfg.prompt_chars:])
    decoder = decoder_for(model, lm_cfg)
    print(f"sampling: {type(model).__name__} ({count_params(params):,} parameters) from "
          f"{provenance['path']} (step {provenance['checkpoint_step']}); {len(starts)} prompts "
          f"of {cfg.prompt_chars} chars, {cfg.new_chars} new chars; {info['cpu']}, "
          f"{info['cores']} cores, load {info['load_avg']}")
    rows, traces = [], {}
    for name in ("human", *cfg.strategies):
        t0 = time.perf_counter()
        if name == "human":
            cont = np.asarray(human)
        else:
            cont = decode(decoder, params, prompts, name, cfg.new_chars,
                          jax.random.PRNGKey(cfg.seed))
        logp = np.asarray(score(decoder, params, prompts, jnp.asarray(cont, jnp.int32)))
        texts = [tok.decode(c) for c in cont]
        ws = [w for t in texts for w in words(t)]
        row = {
            "strategy": name, "loglik_per_char": float(logp.mean()),
            "loglik_sd": float(logp.mean(1).std()),
            "distinct_1": distinct_n(texts, 1), "distinct_2": distinct_n(texts, 2),
            "known_words": float(np.mean([w in vocab_words for w in ws])) if ws else 0.0,
            "sample": tok.decode(np.asarray(prompts[0])) + "|" + texts[0],
            "seconds": time.perf_counter() - t0,
        }
        rows.append(row)
        traces[name] = logp[0].tolist()
        print(f"{name:>8}: log-lik/char {row['loglik_per_char']:7.3f}  distinct-1 "
              f"{row['distinct_1']:.3f}  distinct-2 {row['distinct_2']:.3f}  known words "
              f"{100 * row['known_words']:5.1f}%  | {texts[0][:60]!r}")
    wall = time.perf_counter() - started
    lines = ["| strategy | log-lik / char (nats) | distinct-1 | distinct-2 | known words |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['strategy']} | {r['loglik_per_char']:.3f} ± {r['loglik_sd']:.3f} | "
                     f"{r['distinct_1']:.3f} | {r['distinct_2']:.3f} | "
                     f"{100 * r['known_words']:.1f}% |")
    print(f"wall time {wall:.0f}s")
    summary = {"machine": info, "model": provenance, "lm_config": asdict(lm_cfg),
               "params": count_params(params), "prompt_starts": [int(s) for s in starts],
               "rows": rows, "table_md": "\n".join(lines), "logp_prompt1": traces, "wall_s": wall}
    if cfg.workdir is not None:
        summary["plot"] = os.path.join(cfg.workdir, "sampling.png")
    return summary


def write_files(folder: str, summary: dict) -> None:
    """``sampling.png`` (:func:`plot_sampling`) and ``samples.md`` (each strategy's first
    sample)."""
    rows = summary["rows"]
    plot_sampling(rows, summary["logp_prompt1"], os.path.join(folder, "sampling.png"))
    with open(os.path.join(folder, "samples.md"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(f"### {r['strategy']}\n\n```\n{r['sample']}\n```\n\n")


def run(cfg: Config) -> dict:
    """Decode with every strategy (training a small char LM first when none is found);
    the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

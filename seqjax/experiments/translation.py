"""English→French translation: GRU seq2seq without attention vs Bahdanau vs Luong vs a transformer.

Data: the Tatoeba/Anki sentence pairs (``seqjax.data.corpora.english_french``; 18,065 short
pairs in the offline file), preprocessed as in d2l (lower case, a space before ``, . ! ?``)
and split into words on spaces, so "he's" and "j'ai" are single tokens. Pairs are split
by *source sentence* (all translations of a held-out English sentence are held out and
serve as its references), 90/10.

Models (all from :mod:`seqjax.models`; same embedding/hidden width):

* ``gru`` — bidirectional GRU encoder, GRU decoder fed the fixed context ``z*`` at every
  step, no attention (Cho et al. 2014; MEDL Fig. 7.9(b): the encoder *bottleneck*);
* ``bahdanau`` — the same plus additive attention queried by the previous decoder state
  (Bahdanau et al. 2015; MEDL (7.22), Fig. 7.10);
* ``luong`` — the same encoder with Luong's "general" score queried by the current state
  and the attentional layer ``tanh(W_c [u; s])`` (Luong et al. 2015);
* ``transformer`` — a small post-norm encoder–decoder transformer (Vaswani et al. 2017;
  MEDL §7.5).

Reported: corpus BLEU on the held-out pairs (sacrebleu, multi-reference, on the
tokenised lower-case text: ``tokenize="none"``), BLEU against source length (the
encoder-bottleneck curve of Bahdanau et al. 2015, Fig. 2), an attention heatmap in the
style of MEDL Fig. 7.11, and d2l's four probe sentences (go . / i lost . / he's calm . /
i'm home .) with d2l's sentence BLEU (k = 2), mean ± sd over seeds.

Run:  python -m seqjax.experiments.translation                 (or: seqjax train translation)
      python -m seqjax.experiments.translation --smoke         (seconds, for CI)
      python -m seqjax.experiments.translation --archs=bahdanau --seeds=0 --steps=2000

Every model trains on every visible device (and host), data parallel unless ``--mesh`` /
``--strategy`` say otherwise; ``batch_size`` is the global batch.

The sequence-to-sequence machinery (reading and tokenising the pairs, building the models,
training with :func:`seqjax.train.loop.fit`, greedy/beam decoding with :mod:`seqjax.decoding`,
attention maps) is the experiments' kit, :mod:`seqjax.experiments._seq2seq`, shared with
``experiments.numbers``.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import jax
import numpy as np

from seqjax.data.tokenizers import WordTokenizer
from seqjax.experiments._config import Fraction, NonNegInt, PosInt, moved_into
from seqjax.experiments._kit import Run, Task, Trained, machine_info, mean_sd, train
from seqjax.experiments._seq2seq import (
    ARCH_LABELS,
    ARCHS,
    Arch,
    ModelOptions,
    attention_map,
    build_tokenizer,
    encode_pairs,
    encode_sources,
    load_pairs,
    make_model,
    seq2seq_run,
    translate,
)
from seqjax.experiments.reports.translation import plot_attention, plot_bleu_vs_length
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import ParallelOptions
from seqjax.utils import count_params

#: d2l's probe sentences and its references (d2l §10.7 / §11.4).
PROBES = (
    ("go .", "va !"),
    ("i lost .", "j'ai perdu ."),
    ("he's calm .", "il est calme ."),
    ("i'm home .", "je suis chez moi ."),
)


@dataclass(frozen=True)
class Config(TrainOptions, ParallelOptions):
    """The options of ``seqjax train translation``: the models, the data, training, decoding.

    Attributes:
        archs: comma list of ``gru``, ``bahdanau``, ``luong`` and ``transformer``.
        seeds: one run of every arch per seed (initialisation, dropout, batch order; the
            train/test split does not change).
        num_pairs: use the file's first N pairs (the shortest, as d2l); 0 = every pair.
        test_fraction: share of the distinct English sentences held out, with all their
            translations (the BLEU references).
        min_freq: words seen fewer times in the training pairs become ``<unk>``.
        max_tgt_len: drop pairs whose French has more than N tokens (words and punctuation);
            decoding stops after N + 1 tokens.
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        batch_size: pairs per step over all devices (the global batch).
        steps: optimiser steps of every run (the cosine schedule ends here).
        learning_rate: peak AdamW rate, after the warm-up; cosine decay to 5% of it.
        eval_every: steps between validation losses on the held-out pairs (first reference
            each); 0 = only at the end.
        beam_size: beam width of the decoding (length-normalised); 1 = greedy.
        decode_batch: sentences per decoding call (rows repeated to fill the last).
        max_test: held-out source sentences translated for BLEU (the first N, sorted);
            0 = all.
        heatmap_sentence: the English sentence whose attention weights are plotted
            (``bahdanau``, ``luong``; first seed; needs a ``workdir``).
        progress: show a progress bar.
        workdir: ``run.json``, plots, ``translation.json`` and each run's checkpoint and
            ``metrics.jsonl`` in ``WORKDIR/ARCH_seedS``; ``None`` = write nothing; rerun to
            resume.
    """

    #: The network's options moved into the group ``--model.*`` (refused on the command line
    #: naming the new spelling; read from a saved ``experiment.json``).
    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)

    archs: tuple[Arch, ...] = ARCHS
    seeds: tuple[int, ...] = (0, 1, 2)
    num_pairs: NonNegInt = 0  # 0 = every pair of the file; else the first (shortest) N, as d2l
    test_fraction: Fraction = 0.1
    min_freq: PosInt = 2
    max_tgt_len: PosInt = 10
    model: ModelOptions = ModelOptions()
    steps: NonNegInt = 3000  # TrainOptions' fields, with this recipe's defaults
    batch_size: PosInt = 64
    eval_every: NonNegInt = 1000
    beam_size: PosInt = 1
    decode_batch: PosInt = 256
    max_test: NonNegInt = 0  # 0 = every held-out source sentence
    heatmap_sentence: str = "i'm home ."
    progress: bool = True
    workdir: str | None = "workdirs/translation"


PRESETS = {
    "smoke": {
        "archs": "transformer", "seeds": "0", "num_pairs": 300,
        "model.embed_dim": 8, "model.hidden_size": 8, "model.num_layers": 1,
        "model.num_heads": 2, "batch_size": 16, "steps": 3, "eval_every": 0,
        "warmup_steps": 1, "max_test": 8, "log_every": 1, "decode_batch": 16,
        "progress": False,
    },
    # What was run on the shared 2-core CPU for seqjax/experiments/results/translation.md.
    "reduced": {"seeds": "0,1", "steps": 1500, "eval_every": 500},
}


# ----------------------------------------------------------------------------- metrics


def d2l_bleu(pred: str, label: str, k: int = 2) -> float:
    r"""d2l's sentence BLEU: :math:`\exp(\min(0, 1 - L_{ref}/L_{pred}))\prod_{n=1}^{k} p_n^{1/2^n}`.

    ``p_n`` is the clipped n-gram precision of the space-separated ``pred`` against
    ``label`` (0 when ``pred`` has no n-gram of that order). d2l (10.7.x), used for its
    probe sentences with ``k = 2``.

    Example:
        >>> round(d2l_bleu("il est riche .", "il est calme ."), 3)
        0.658
    """
    p, r = pred.split(), label.split()
    if not p:
        return 0.0
    score = math.exp(min(0.0, 1.0 - len(r) / len(p)))
    for n in range(1, k + 1):
        ref = collections.Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
        hyp = [tuple(p[i : i + n]) for i in range(len(p) - n + 1)]
        if not hyp:
            return 0.0
        matches = 0
        for g in hyp:
            if ref[g] > 0:
                matches += 1
                ref[g] -= 1
        score *= (matches / len(hyp)) ** (0.5 ** n)
    return score


def corpus_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """sacrebleu corpus BLEU (0–100) with a variable number of references per sentence.

    The text is already tokenised and lower-cased, so ``tokenize="none"``;
    ``effective_order`` keeps sets of very short sentences (no 4-grams) from scoring 0.
    """
    from sacrebleu.metrics import BLEU

    if not hyps:
        return float("nan")
    width = max(len(r) for r in refs)
    streams = [[r[j] if j < len(r) else None for r in refs] for j in range(width)]
    return float(BLEU(tokenize="none", effective_order=True).corpus_score(list(hyps),
                                                                          streams).score)


# ----------------------------------------------------------------------------- experiment


def split_by_source(src: Sequence[str], test_fraction: float,
                    seed: int = 0) -> tuple[set[str], set[str]]:
    """Held-out English sentences (a seeded ``test_fraction`` of the distinct sources)."""
    uniq = sorted(set(src))
    perm = np.random.default_rng(seed).permutation(len(uniq))
    n_test = max(1, int(round(test_fraction * len(uniq))))
    test = {uniq[i] for i in perm[:n_test]}
    return set(uniq) - test, test


def _word_len(sentence: str) -> int:
    return sum(1 for w in sentence.split() if w not in {",", ".", "!", "?"})


@dataclass
class _Data:
    """The kept pairs split by source sentence, the vocabularies and the encoded arrays."""

    train_src: set[str]
    train_pairs: list[tuple[str, str]]
    refs: dict[str, list[str]]  # the translations of each held-out source
    test_sents: list[str]  # the held-out sources translated for BLEU
    src_tok: WordTokenizer
    tgt_tok: WordTokenizer
    train_arr: dict[str, np.ndarray]
    val_arr: dict[str, np.ndarray]
    dec_x: np.ndarray  # decoded after training: held-out sentences, probes, heatmap
    dec_len: np.ndarray


def _data(cfg: Config) -> _Data:
    """The pairs with at most ``max_tgt_len`` French tokens, split by source sentence; the
    tokenizers of the training pairs; the training, validation and decoding arrays."""
    src, tgt = load_pairs(cfg.num_pairs)
    keep = [i for i, t in enumerate(tgt) if len(t.split()) <= cfg.max_tgt_len]
    src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
    train_src, test_src = split_by_source(src, cfg.test_fraction)
    train_pairs = [(s, t) for s, t in zip(src, tgt) if s in train_src]
    refs: dict[str, list[str]] = collections.defaultdict(list)
    for s, t in zip(src, tgt):
        if s in test_src:
            refs[s].append(t)
    test_sents = sorted(refs)
    if cfg.max_test > 0:
        test_sents = test_sents[: cfg.max_test]
    src_tok = build_tokenizer([s for s, _ in train_pairs], min_freq=cfg.min_freq)
    tgt_tok = build_tokenizer([t for _, t in train_pairs], min_freq=cfg.min_freq)
    src_len = max(len(s.split()) for s in src)
    train_arr = encode_pairs([s for s, _ in train_pairs], [t for _, t in train_pairs],
                             src_tok, tgt_tok, src_len=src_len, tgt_len=cfg.max_tgt_len)
    val_pairs = [(s, r[0]) for s, r in refs.items()]
    val_arr = encode_pairs([s for s, _ in val_pairs], [t for _, t in val_pairs], src_tok,
                           tgt_tok, src_len=src_len, tgt_len=cfg.max_tgt_len)
    dec_x, dec_len = encode_sources(
        [*test_sents, *(p for p, _ in PROBES), cfg.heatmap_sentence], src_tok, src_len)
    return _Data(train_src, train_pairs, refs, test_sents, src_tok, tgt_tok, train_arr,
                 val_arr, dec_x, dec_len)


def _bleu_by_length(hyps: list[str], refs: list[list[str]],
                    lengths: list[int]) -> dict[int, float]:
    """Corpus BLEU of the held-out sentences of each source length (in words)."""
    by_len = {}
    for n in sorted(set(lengths)):
        idx = [i for i, m in enumerate(lengths) if m == n]
        by_len[n] = corpus_bleu([hyps[i] for i in idx], [refs[i] for i in idx])
    return by_len


def _plot_heatmap(cfg: Config, d: _Data, arch: str, t: Trained, o_ids: list[int]) -> str:
    """``translation_attention_ARCH.png``: the attention weights of ``cfg.heatmap_sentence``
    translated as ``o_ids``."""
    s_ids = d.src_tok.encode(cfg.heatmap_sentence)
    alpha = attention_map(t.run.model, t.params, s_ids, o_ids)
    return plot_attention(
        alpha[:, : len(s_ids)], cfg.heatmap_sentence.split(),
        [d.tgt_tok.id_to_token(i) for i in o_ids],
        os.path.join(cfg.workdir, f"translation_attention_{arch}.png"),
        f"{ARCH_LABELS[arch]}: attention weights (MEDL Fig. 7.11 style)")


def build(cfg: Config) -> Task:
    """One seq2seq run per architecture and seed on the pairs whose English source is not
    held out; BLEU on the held-out sources, the probes, the tables."""
    for a in cfg.archs:
        if a not in ARCHS:
            raise ValueError(f"`archs` must be drawn from {ARCHS}; got {a!r}.")
    started, info = time.perf_counter(), machine_info()
    d = _data(cfg)
    lengths = [_word_len(s) for s in d.test_sents]
    heatmaps: dict[str, str] = {}

    def scores(arch: str, seed: int, t: Trained) -> dict:  # printed; a heatmap
        start = time.perf_counter()
        # One decoding call (one compiled shape): held-out sentences, probes, heatmap.
        all_ids = translate(t.run.model, t.params, d.dec_x, d.dec_len,
                            max_new_tokens=cfg.max_tgt_len + 1, beam_size=cfg.beam_size,
                            batch_size=cfg.decode_batch)
        n_test = len(d.test_sents)
        hyps = [d.tgt_tok.decode(h) for h in all_ids[:n_test]]
        test_refs = [d.refs[s] for s in d.test_sents]
        bleu = corpus_bleu(hyps, test_refs)
        by_len = _bleu_by_length(hyps, test_refs, lengths)
        probe_out = [d.tgt_tok.decode(h) for h in all_ids[n_test : n_test + len(PROBES)]]
        probes = [{"src": p, "ref": r, "out": o, "bleu": d2l_bleu(o, r)}
                  for (p, r), o in zip(PROBES, probe_out)]
        final = t.records[-1] if t.records else {}
        rec = {
            "arch": arch, "seed": seed, "params": count_params(t.params), "bleu": bleu,
            "bleu_by_length": by_len, "probes": probes, "train_s": t.seconds,
            "eval_s": time.perf_counter() - start, "final_train_loss": final.get("loss"),
            "val_loss": final.get("eval/loss"),
            "examples": [{"src": s, "out": h, "refs": d.refs[s]}
                         for s, h in list(zip(d.test_sents, hyps))[:8]],
        }
        print(f"{arch} seed {seed}: BLEU {bleu:.2f}; params {rec['params']:,}; "
              f"train {t.seconds:.0f}s; " + "; ".join(f"{q['src']} => {q['out']} "
                                                      f"({q['bleu']:.3f})" for q in probes))
        if (arch in ("bahdanau", "luong") and seed == cfg.seeds[0]
                and cfg.workdir is not None and jax.process_index() == 0):
            heatmaps[arch] = _plot_heatmap(cfg, d, arch, t, all_ids[-1])
        return rec

    m = cfg.model

    def runs() -> Iterator[Run]:
        for arch in cfg.archs:
            for seed in cfg.seeds:
                model = make_model(arch, d.src_tok.vocab_size, d.tgt_tok.vocab_size,
                                   embed_dim=m.embed_dim, hidden_size=m.hidden_size,
                                   dropout_rate=m.dropout_rate, num_heads=m.num_heads,
                                   num_layers=m.num_layers)
                mc = {"arch": arch, "src_vocab": d.src_tok.vocab_size,
                      "tgt_vocab": d.tgt_tok.vocab_size, "embed_dim": m.embed_dim,
                      "hidden_size": m.hidden_size}
                print(f"\n== {ARCH_LABELS[arch]}, seed {seed}")
                yield seq2seq_run(model, d.train_arr, d.val_arr, cfg, seed=seed,
                                  name=f"{arch}_seed{seed}", model_config=mc,
                                  evaluate=functools.partial(scores, arch, seed),
                                  plot=cfg.workdir is not None)

    about = (f"{len(d.train_pairs)} training pairs, {len(d.test_sents)} held-out source "
             f"sentences ({sum(len(d.refs[s]) for s in d.test_sents)} references); "
             f"vocabularies {d.src_tok.vocab_size} (en) / {d.tgt_tok.vocab_size} (fr); "
             f"{info['cpu']}, {info['cores']} cores, load {info['load_avg']}")
    extra = {"machine": info, "heatmaps": heatmaps, "n_train": len(d.train_pairs),
             "n_test": len(d.test_sents), "vocab": (d.src_tok.vocab_size, d.tgt_tok.vocab_size),
             "probe_seen": {p: p in d.train_src for p, _ in PROBES}}
    return Task("translation", runs(), about=about, started=started,
                summarize=lambda trained: {**_summarise(cfg, [t.results for t in trained],
                                                        lengths), **extra},
                files=lambda folder, s: draw(folder, s, lengths))


def run(cfg: Config) -> dict:
    """Train every architecture for every seed on every visible device; the summary."""
    return train(build(cfg), cfg)


def _by_arch(runs: list[dict]) -> dict[str, list[dict]]:
    by_arch: dict[str, list[dict]] = collections.defaultdict(list)
    for r in runs:
        by_arch[r["arch"]].append(r)
    return by_arch


def _summarise(cfg: Config, runs: list[dict], lengths: list[int]) -> dict:
    """The runs and the tables (BLEU by model, by source length, on the probes); printed."""
    by_arch = _by_arch(runs)
    counts = collections.Counter(lengths)
    lines = ["| model | params | held-out BLEU | train s / seed |", "|---|---:|---:|---:|"]
    for arch, rs in by_arch.items():
        lines.append(f"| {ARCH_LABELS[arch]} | {rs[0]['params']:,} | "
                     f"{mean_sd([r['bleu'] for r in rs])} | "
                     f"{np.mean([r['train_s'] for r in rs]):.0f} |")
    lines += ["", "| source words | n | " + " | ".join(by_arch) + " |",
              "|---:|---:|" + "---:|" * len(by_arch)]
    for n in sorted(counts):
        lines.append(f"| {n} | {counts[n]} | " + " | ".join(
            mean_sd([r["bleu_by_length"][n] for r in rs]) for rs in by_arch.values()) + " |")
    lines += ["", "| probe | reference | " + " | ".join(by_arch) + " |",
              "|---|---|" + "---|" * len(by_arch)]
    for j, (p, ref) in enumerate(PROBES):
        cells = []
        for rs in by_arch.values():
            outs = collections.Counter(r["probes"][j]["out"] for r in rs)
            cells.append(f"{mean_sd([r['probes'][j]['bleu'] for r in rs])} "
                         f"(\"{outs.most_common(1)[0][0]}\")")
        lines.append(f"| {p} | {ref} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print("\n" + table)
    out = {"runs": runs, "table_md": table}
    if cfg.workdir is not None:
        out["bleu_vs_length_png"] = os.path.join(cfg.workdir, "translation_bleu_vs_length.png")
    return out


def draw(folder: str, summary: dict, lengths: list[int]) -> None:
    """``translation_bleu_vs_length.png``: held-out BLEU by source length, per model."""
    counts = collections.Counter(lengths)
    curves = {a: {n: [r["bleu_by_length"][n] for r in rs] for n in counts}
              for a, rs in _by_arch(summary["runs"]).items()}
    plot_bleu_vs_length(curves, dict(counts),
                        os.path.join(folder, "translation_bleu_vs_length.png"),
                        labels=ARCH_LABELS)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

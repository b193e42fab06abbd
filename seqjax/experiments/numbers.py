"""English→French number names with attention (the quickstart): 97 → "quatre-vingt-dix-sept".

Data: ``seqjax.data.packaged.number_names`` (num2words), the numbers ``0 .. max_number-1``
written in English and in French, split into words, hyphens and commas
("quatre - vingt - dix - sept"). French counts in twenties from 60 to 99 (97 = 4·20 + 17,
"quatre-vingt-dix-sept"), says "mille" for "one thousand" and drops "and", so the model
must learn a non-trivial alignment. A seeded ``test_fraction`` of the numbers of every
length (1, 2, 3, 4 digits) is held out.

Model (default): a bidirectional-GRU encoder and a GRU decoder with additive attention
(Bahdanau et al. 2015; MEDL (7.22), Fig. 7.10), :class:`seqjax.models.Seq2Seq`, trained
with teacher forcing by :func:`seqjax.train.loop.fit`; translation by greedy search
(:mod:`seqjax.decoding`). ``--archs=gru,bahdanau,luong,transformer`` compares the
models of ``experiments.translation`` (the experiments' seq2seq kit,
:mod:`seqjax.experiments._seq2seq`; ``gru`` has no attention: the fixed-context bottleneck).

Reported: exact match (the whole French name right) on the held-out numbers against the
number of digits; a few translations; the attention heatmap of 97 (MEDL Fig. 7.11 style),
where "quatre", "vingt", "dix" look at "ninety" and "sept" at "seven"; the loss curve.

Every model trains on every visible device (and host), data parallel unless ``--mesh`` /
``--strategy`` say otherwise; ``batch_size`` is the global batch.

Run:  seqjax train numbers --preset quickstart     (about a minute on one CPU core)
      seqjax train numbers                        (or: python -m seqjax.experiments.numbers)
      seqjax generate --workdir workdirs/numbers --prompt 1997
      seqjax eval --workdir workdirs/numbers
      seqjax train numbers --smoke                (seconds, for CI)
"""

from __future__ import annotations

import collections
import functools
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import numpy as np

from seqjax.data.tokenizers import WORD_PATTERN, WordTokenizer
from seqjax.experiments._config import Fraction, NonNegInt, PosFloat, PosInt, moved_into
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
    make_model,
    seq2seq_run,
    translate,
)
from seqjax.experiments.reports.numbers import plot_exact_match
from seqjax.experiments.reports.translation import plot_attention
from seqjax.train.checkpoint import restore_params
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import ParallelOptions
from seqjax.utils import count_params

#: Shown after training; 97 is the issue's example of French reordering.
SHOWCASE = (97, 71, 80, 1997, 2024, 7777)


@dataclass(frozen=True)
class Config(TrainOptions, ParallelOptions):
    """The options of ``seqjax train numbers`` (every architecture × seed is one model).

    Attributes:
        archs: the models to train, from ``gru`` (no attention), ``bahdanau``, ``luong`` and
            ``transformer`` (comma-separated).
        seeds: one model per seed and architecture: initialisation, dropout and batch order
            (the held-out split is fixed).
        max_number: the numbers ``0 .. max_number - 1`` are translated.
        test_fraction: fraction of the numbers of each digit count held out (at least one).
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        batch_size: training pairs per step, over all devices (the global batch; at most the
            training set).
        steps: optimiser steps per model (the cosine schedule ends here).
        learning_rate: peak AdamW learning rate, after the warm-up (cosine decay to 5% of it).
        eval_every: steps between evaluations of the loss on the held-out numbers (also at
            the end); 0 = only at the end.
        beam_size: 1 = greedy search; more = beam search with that many beams.
        decode_batch: source rows per decoding batch.
        heatmap_number: the number whose attention weights are plotted (``bahdanau``,
            ``luong``; first seed); if not below ``max_number``, the first number shown.
        log_every: steps between logged records (``metrics.jsonl``; printed with ``progress``).
        progress: show a progress bar and print the log records.
        workdir: one folder per model (``ARCH_seedS``: checkpoints, logs, loss plot), the
            plots and ``numbers.json``; rerun to resume; unset = nothing written.
    """

    #: The network's options moved into the group ``--model.*`` (refused on the command line
    #: naming the new spelling; read from a saved ``experiment.json``).
    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)

    archs: tuple[Arch, ...] = ("bahdanau",)
    seeds: tuple[int, ...] = (0,)
    max_number: PosInt = 10000
    test_fraction: Fraction = 0.2
    model: ModelOptions = ModelOptions(embed_dim=32, dropout_rate=0.0)
    steps: NonNegInt = 2000  # TrainOptions' fields, with this recipe's defaults
    batch_size: PosInt = 64
    learning_rate: PosFloat = 5e-3
    eval_every: NonNegInt = 1000
    beam_size: PosInt = 1
    decode_batch: PosInt = 500
    heatmap_number: NonNegInt = 97
    log_every: PosInt = 200
    progress: bool = True
    workdir: str | None = "workdirs/numbers"


PRESETS = {
    "smoke": {"max_number": 120, "model.embed_dim": 8, "model.hidden_size": 8, "batch_size": 16,
              "steps": 3, "eval_every": 0, "warmup_steps": 1, "log_every": 1,
              "decode_batch": 32, "progress": False},
    # The comparison in seqjax/experiments/results/numbers.md.
    "compare": {"archs": "gru,bahdanau,transformer", "seeds": "0,1,2"},
    # The README's first command: one Bahdanau model in about a minute on one CPU core,
    # with the progress bar, metrics, translations and plots (in its own work dir).
    "quickstart": {"steps": 600, "eval_every": 300, "log_every": 100,
                   "workdir": "workdirs/numbers_quickstart"},
}


def detokenize(text: str) -> str:
    """``"quatre - vingt - dix - sept"`` → ``"quatre-vingt-dix-sept"``; ``" ,"`` → ``","``."""
    return text.replace(" - ", "-").replace(" ,", ",")


def load_numbers(max_number: int) -> tuple[list[int], list[str], list[str]]:
    """``(numbers, english, french)`` for ``0 .. max_number-1`` from num2words."""
    from seqjax.data.packaged import number_names

    ds = number_names(range(max_number))
    return list(ds["number"]), list(ds["src"]), list(ds["tgt"])


def split_numbers(numbers: list[int], test_fraction: float,
                  seed: int = 0) -> tuple[list[int], list[int]]:
    """Indices ``(train, test)``: ``test_fraction`` of each digit count, at least one."""
    rng = np.random.default_rng(seed)
    by_digits: dict[int, list[int]] = collections.defaultdict(list)
    for i, n in enumerate(numbers):
        by_digits[len(str(n))].append(i)
    train, test = [], []
    for d in sorted(by_digits):
        idx = rng.permutation(by_digits[d])
        k = max(1, int(round(test_fraction * len(idx)))) if len(idx) > 1 else 0
        test += sorted(idx[:k].tolist())
        train += sorted(idx[k:].tolist())
    return train, test


@dataclass
class _Data:
    numbers: list[int]
    src: list[str]
    tgt: list[str]
    train: list[int]
    test: list[int]
    src_tok: WordTokenizer
    tgt_tok: WordTokenizer
    src_len: int
    tgt_len: int


def _data(cfg: Config) -> _Data:
    numbers, src, tgt = load_numbers(cfg.max_number)
    train, test = split_numbers(numbers, cfg.test_fraction)
    src_tok = build_tokenizer([src[i] for i in train], pattern=WORD_PATTERN)
    tgt_tok = build_tokenizer([tgt[i] for i in train], pattern=WORD_PATTERN)
    src_len = max(len(src_tok.split(s)) for s in src)
    tgt_len = max(len(tgt_tok.split(t)) for t in tgt)
    return _Data(numbers, src, tgt, train, test, src_tok, tgt_tok, src_len, tgt_len)


def _model(cfg: Config, arch: str, d: _Data) -> Any:
    """The model ``arch`` at ``cfg.model``'s sizes for the vocabularies of ``d``."""
    m = cfg.model
    return make_model(arch, d.src_tok.vocab_size, d.tgt_tok.vocab_size,
                      embed_dim=m.embed_dim, hidden_size=m.hidden_size,
                      dropout_rate=m.dropout_rate, num_layers=m.num_layers,
                      num_heads=m.num_heads)


def _english(prompt: str) -> str:
    """A prompt as English number words: digits ("97") go through num2words."""
    prompt = prompt.strip()
    if prompt.replace(",", "").isdigit():
        from num2words import num2words

        return num2words(int(prompt.replace(",", "")))
    return prompt.lower()


def _examples(d: _Data, show: list[int], out: list[list[int]]) -> list[dict]:
    """The translations of the numbers ``show`` (the rows of ``out`` after the held-out ones)."""
    examples = []
    for j, n in enumerate(show):
        pred = detokenize(d.tgt_tok.decode(out[len(d.test) + j]))
        examples.append({"number": n, "english": d.src[n], "french": d.tgt[n],
                         "predicted": pred, "correct": pred == d.tgt[n],
                         "held_out": n in {d.numbers[i] for i in d.test}})
    return examples


def _print_translations(rec: dict, n_test: int) -> None:
    """Print a run's exact match on the ``n_test`` held-out numbers and its examples."""
    print(f"{rec['arch']} seed {rec['seed']}: exact match {100 * rec['exact_match']:.1f}% on "
          f"{n_test} held-out numbers; params {rec['params']:,}; "
          f"{rec['train_s']:.0f}s training")
    for e in rec["examples"]:
        mark = "ok" if e["correct"] else f"expected {e['french']}"
        seen = "held out" if e["held_out"] else "seen in training"
        print(f"  {e['number']:>5} {e['english']!r:<48} -> {e['predicted']}  "
              f"[{mark}; {seen}]")


def _plot_heatmap(cfg: Config, d: _Data, arch: str, heat: int, t: Trained,
                  o_ids: list[int]) -> str:
    """``numbers_attention_HEAT_ARCH.png``: the attention weights of the number ``heat``
    translated as ``o_ids``."""
    alpha = attention_map(t.run.model, t.params, d.src_tok.encode(d.src[heat]), o_ids)
    return plot_attention(
        alpha, d.src_tok.split(d.src[heat]), [d.tgt_tok.id_to_token(i) for i in o_ids],
        os.path.join(cfg.workdir, f"numbers_attention_{heat}_{arch}.png"),
        f"{heat}: attention weights of {ARCH_LABELS[arch]}")


def build(cfg: Config) -> Task:
    """One seq2seq run per architecture and seed on the fixed split; the exact-match table."""
    for a in cfg.archs:
        if a not in ARCHS:
            raise ValueError(f"`archs` must be drawn from {ARCHS}; got {a!r}.")
    started, info = time.perf_counter(), machine_info()
    d = _data(cfg)
    arrays = encode_pairs(d.src, d.tgt, d.src_tok, d.tgt_tok, src_len=d.src_len,
                          tgt_len=d.tgt_len)
    train = {k: v[d.train] for k, v in arrays.items()}
    test = {k: v[d.test] for k, v in arrays.items()}
    digits = [len(str(d.numbers[i])) for i in d.test]
    counts = collections.Counter(digits)
    show = [n for n in SHOWCASE if n < cfg.max_number] or [d.numbers[d.test[0]]]
    heat = cfg.heatmap_number if cfg.heatmap_number < cfg.max_number else show[0]
    dec_x, dec_len = encode_sources([d.src[i] for i in d.test] + [d.src[n] for n in show]
                                    + [d.src[heat]], d.src_tok, d.src_len)
    plots: dict[str, str] = {}

    def translations(arch: str, seed: int, t: Trained) -> dict:  # printed; a heatmap
        out = translate(t.run.model, t.params, dec_x, dec_len, max_new_tokens=d.tgt_len + 1,
                        beam_size=cfg.beam_size, batch_size=cfg.decode_batch)
        ok = [out[j] == d.tgt_tok.encode(d.tgt[i]) for j, i in enumerate(d.test)]
        by_digits = {k: float(np.mean([o for o, g in zip(ok, digits) if g == k]))
                     for k in sorted(counts)}
        examples = _examples(d, show, out)
        final = t.records[-1] if t.records else {}
        rec = {"arch": arch, "seed": seed, "params": count_params(t.params),
               "exact_match": float(np.mean(ok)), "by_digits": by_digits,
               "train_s": t.seconds, "final_train_loss": final.get("loss"),
               "val_loss": final.get("eval/loss"), "examples": examples,
               "errors": [{"number": d.numbers[i], "predicted":
                           detokenize(d.tgt_tok.decode(out[j])), "french": d.tgt[i]}
                          for j, i in enumerate(d.test) if not ok[j]][:10]}
        _print_translations(rec, len(d.test))
        if (arch not in ("gru", "transformer") and seed == cfg.seeds[0] and t.folder
                and jax.process_index() == 0):
            plots[f"attention_{arch}"] = _plot_heatmap(cfg, d, arch, heat, t, out[-1])
        return rec

    def runs() -> Iterator[Run]:
        for arch in cfg.archs:
            for seed in cfg.seeds:
                print(f"\n== {ARCH_LABELS[arch]}, seed {seed}")
                mc = {"arch": arch, "src_vocab": d.src_tok.vocab_size,
                      "tgt_vocab": d.tgt_tok.vocab_size, "embed_dim": cfg.model.embed_dim,
                      "hidden_size": cfg.model.hidden_size}
                yield seq2seq_run(_model(cfg, arch, d), train, test, cfg, seed=seed,
                                  name=f"{arch}_seed{seed}", model_config=mc,
                                  evaluate=functools.partial(translations, arch, seed),
                                  print_logs=cfg.progress, plot=cfg.workdir is not None)

    def summarize(trained: list[Trained]) -> dict:
        table = exact_match_table([t.results for t in trained], counts)
        print("\nexact match (%) on held-out numbers, by number of digits:\n" + table)
        if cfg.workdir is not None:
            plots["exact_match"] = os.path.join(cfg.workdir, "numbers_exact_match.png")
        return {"machine": info, "runs": [t.results for t in trained], "table_md": table,
                "n_train": len(d.train), "n_test": len(d.test), "plots": plots}

    about = (f"{len(d.train)} training / {len(d.test)} held-out numbers below "
             f"{cfg.max_number}; vocabularies {d.src_tok.vocab_size} (en) / "
             f"{d.tgt_tok.vocab_size} (fr); {info['cpu']}, {info['cores']} cores, "
             f"load {info['load_avg']}")
    return Task("numbers", runs(), about=about, summarize=summarize,
                files=lambda folder, s: draw(cfg, folder, s, counts), started=started)


def exact_match_table(runs: list[dict], counts: Mapping[int, int]) -> str:
    """Exact match (%) on the held-out numbers by digit count, one row per architecture."""
    by_arch: dict[str, list[dict]] = collections.defaultdict(list)
    for r in runs:
        by_arch[r["arch"]].append(r)
    lines = ["| model | params | " + " | ".join(
        f"{k} digit{'s' if k > 1 else ''} (n={counts[k]})" for k in sorted(counts))
        + " | all | train s |", "|---|---:|" + "---:|" * (len(counts) + 2)]
    for arch, rs in by_arch.items():
        lines.append(f"| {ARCH_LABELS[arch]} | {rs[0]['params']:,} | " + " | ".join(
            mean_sd([100 * r["by_digits"][k] for r in rs]) for k in sorted(counts))
            + f" | {mean_sd([100 * r['exact_match'] for r in rs])} | "
            f"{np.mean([r['train_s'] for r in rs]):.0f} |")
    return "\n".join(lines)


def draw(cfg: Config, folder: str, summary: dict, counts: Mapping[int, int]) -> None:
    """``numbers_exact_match.png``: exact match by digit count for each architecture."""
    by_arch: dict[str, list[dict]] = collections.defaultdict(list)
    for r in summary["runs"]:
        by_arch[r["arch"]].append(r)
    plot_exact_match({a: {k: [r["by_digits"][k] for r in rs] for k in counts}
                      for a, rs in by_arch.items()}, dict(counts),
                     os.path.join(folder, "numbers_exact_match.png"), labels=ARCH_LABELS)
    print("plots: " + ", ".join(sorted(summary["plots"].values())) + ", "
          + os.path.join(folder, f"{cfg.archs[0]}_seed{cfg.seeds[0]}", "loss.png"))


def run(cfg: Config) -> dict:
    """Train every architecture for every seed on every visible device; the summary."""
    return train(build(cfg), cfg)


def _restore(cfg: Config) -> tuple[Any, Any, _Data]:
    if not cfg.workdir:
        raise ValueError("`workdir` is required: the checkpoint to load.")
    d = _data(cfg)
    arch, seed = cfg.archs[0], cfg.seeds[0]
    params = restore_params(os.path.join(cfg.workdir, f"{arch}_seed{seed}", "checkpoints"))
    return _model(cfg, arch, d), params, d


def evaluate(cfg: Config) -> dict:
    """Exact match of the first model in ``cfg.workdir`` on the held-out numbers."""
    model, params, d = _restore(cfg)
    x, n = encode_sources([d.src[i] for i in d.test], d.src_tok, d.src_len)
    out = translate(model, params, x, n, max_new_tokens=d.tgt_len + 1,
                    beam_size=cfg.beam_size, batch_size=cfg.decode_batch)
    ok = [o == d.tgt_tok.encode(d.tgt[i]) for o, i in zip(out, d.test)]
    return {"exact_match": float(np.mean(ok)), "held_out": len(ok)}


def generate(cfg: Config, prompt: str, *, max_new_tokens: int = 20, temperature: float = 0.0,
             seed: int = 0) -> str:
    """French for ``prompt`` ("97" or "ninety-seven"), by greedy (or beam) search."""
    del temperature, seed
    model, params, d = _restore(cfg)
    english = _english(prompt)
    x, n = encode_sources([english], d.src_tok, d.src_len)
    out = translate(model, params, x, n, max_new_tokens=min(max_new_tokens, d.tgt_len + 1),
                    beam_size=cfg.beam_size, batch_size=1)[0]
    return f"{english} -> {detokenize(d.tgt_tok.decode(out))}"


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

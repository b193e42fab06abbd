r"""Count baselines (Bishop §12.2.3–12.2.4) against an RNN and a transformer.

Two character-level tasks on the offline corpora (:func:`seqjax.data.corpora.resolve_corpus`):

* **Language modelling** — Tiny Shakespeare (nanoGPT's 90/10 split, 65 characters).
  Bag of words (Bishop (12.28)) and n-grams of order 2, 3, 5 (Bishop (12.31)–(12.32),
  counts as (12.46)), fitted on the whole training split, against an LSTM LM
  (:class:`~seqjax.models.RNNLanguageModel`; J&M (9.6)–(9.8), MEDL (7.16)–(7.17)) and a
  GPT (:class:`~seqjax.models.TransformerLM`; J&M §9.8) trained for ``steps`` steps on
  random windows. Metric: nats and bits per character on the first ``lm_eval_chars``
  characters of the validation split. The count models score the stream with their full
  ``n - 1`` history; the networks score it in consecutive windows of ``block_size``
  characters, the context restarting at each window.
* **Sequence classification** — language identification: is a Tatoeba sentence
  (``fra-eng.txt``) English or French? Each pair gives one sentence of each class;
  pairs are split at random into training and test. Naive Bayes over characters (Bishop
  (12.29)–(12.30)) and class-conditional bi-/tri-gram models (the same Bayes rule, word
  order seen) against a GRU classifier (:class:`~seqjax.models.RNNClassifier`, last state;
  J&M Fig. 9.8) and a pre-norm transformer encoder with a ``<cls>`` token
  (:class:`~seqjax.models.Bert` without MLM head; Bishop §12.3.3). Metric: test accuracy.

Smoothing of the count models: add-k with ``k = add_k`` (fixed in advance, not tuned on
the evaluation data; Bishop's "reassigning a small level of probability uniformly").

Every visible device trains the networks (data parallel, as the other experiments);
``batch_size`` is the global batch.

Run:  python -m seqjax.experiments.baselines               (or: seqjax train baselines)
      python -m seqjax.experiments.baselines --smoke       (seconds, for CI)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.data.corpora import resolve_corpus, tiny_shakespeare
from seqjax.experiments._config import NonNegInt, PosFloat, PosInt, moved_into
from seqjax.experiments._kit import (
    Run,
    Task,
    Trained,
    machine_info,
    pad_rows,
    train,
)
from seqjax.experiments.reports.baselines import report, tables
from seqjax.models.baselines import NGramClassifier, NGramLM
from seqjax.models.bert import Bert, BertConfig, bert_block
from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.models.rnn import (
    RNNClassifier,
    RNNClassifierConfig,
    RNNLanguageModel,
    RNNLMConfig,
)
from seqjax.train.losses import masked_cross_entropy, token_accuracy
from seqjax.train.options import TrainOptions
from seqjax.train.parallel import ParallelOptions
from seqjax.utils import count_params

PAD, CLS = 0, 1  # classification vocabulary: 0 padding, 1 <cls>, then the characters


@dataclass(frozen=True)
class ModelOptions:
    """The networks' sizes, ``--model.KEY=VALUE``: the four networks compared with the count
    models (the LSTM LM and the GPT, the GRU and the transformer classifier) share them.

    Attributes:
        hidden_size: LSTM and GRU width (one layer each).
        embed_dim: character embedding size of the LSTM and GRU; width ``d`` of both
            transformers.
        num_layers: blocks of both transformers.
        num_heads: attention heads of both transformers.
    """

    hidden_size: PosInt = 128  # LSTM / GRU width
    embed_dim: PosInt = 64
    num_layers: PosInt = 2  # transformer blocks
    num_heads: PosInt = 4


@dataclass(frozen=True)
class Config(TrainOptions, ParallelOptions):
    """The options of ``seqjax train baselines`` (count models against RNNs and transformers).

    Attributes:
        ngram_orders: orders ``n`` of the count language models (1 = bag of words).
        class_orders: orders ``n`` of the count classifiers (1 = naive Bayes).
        add_k: add-k pseudo-count of every count model (> 0).
        lm_eval_chars: validation characters scored (the first N of the split).
        lm_train_chars: use only the first N training characters (0 = the whole split).
        lm_train_windows: random training windows of ``block_size`` characters drawn for the
            LSTM and GPT (the default, ``steps`` × ``batch_size``, sees each about once).
        class_train_pairs: Tatoeba pairs for training (each gives an English and a French
            sentence).
        class_test_pairs: Tatoeba pairs for the test accuracy.
        max_chars: sentences are truncated to this many characters (classification).
        block_size: window length of the LM networks, in training and scoring (GPT context).
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        steps: optimiser steps of each network.
        batch_size: windows or sentences per step, over all devices (capped at the training
            set).
        learning_rate: peak AdamW learning rate (warm-up, then cosine to 0; no weight decay).
        seed: pair sample and split, window sampling, initialisation and batch order.
        progress: show a progress bar.
        data_path: the folder holding ``tinyshakespeare.txt`` and ``fra-eng.txt``; unset =
            ``$SEQJAX_DATA_DIR``, the user cache, a download, ``shared/data``
            (``seqjax.data.corpora``).
        workdir: each network's logs and checkpoints (a subfolder each), ``run.json`` and
            ``baselines.json``; unset = nothing written.
    """

    ngram_orders: tuple[PosInt, ...] = (1, 2, 3, 5)  # 1 = bag of words (12.28)
    class_orders: tuple[PosInt, ...] = (1, 2, 3)  # 1 = naive Bayes (12.29)-(12.30)
    add_k: PosFloat = 0.1
    lm_eval_chars: PosInt = 20_000
    lm_train_chars: NonNegInt = 0  # 0: the whole training split (1,003,854 characters)
    lm_train_windows: PosInt = 48_000  # steps × batch_size: each window seen about once
    class_train_pairs: PosInt = 4000
    class_test_pairs: PosInt = 1000
    max_chars: PosInt = 64  # sentences are truncated to this many characters
    block_size: PosInt = 64
    model: ModelOptions = ModelOptions()
    steps: NonNegInt = 1500  # TrainOptions' field, with this recipe's default
    seed: int = 0
    progress: bool = True
    data_path: str | None = None  # the folder holding tinyshakespeare.txt and fra-eng.txt
    workdir: str | None = "workdirs/baselines"

    RENAMED: ClassVar[dict[str, str]] = moved_into("model", ModelOptions)


PRESETS = {
    "smoke": {"ngram_orders": "1,2", "class_orders": "1,2", "lm_eval_chars": 512,
              "lm_train_chars": 50_000,
              "lm_train_windows": 64, "class_train_pairs": 64, "class_test_pairs": 16,
              "max_chars": 24, "block_size": 16, "model.hidden_size": 8, "model.embed_dim": 8,
              "model.num_layers": 1, "model.num_heads": 2, "steps": 3, "warmup_steps": 1,
              "batch_size": 8, "log_every": 1, "progress": False},
}


# ----------------------------------------------------------------------------- data


def language_id_data(cfg: Config) -> dict[str, Any]:
    """Sentences of ``fra-eng.txt`` as character ids with labels 0 = English, 1 = French."""
    pairs = []
    for line in resolve_corpus("fra-eng.txt", cfg.data_path).read_text(
            encoding="utf-8").splitlines():
        cols = line.split("\t")
        if len(cols) >= 2 and cols[0] and cols[1]:
            pairs.append((cols[0], cols[1]))
    need = cfg.class_train_pairs + cfg.class_test_pairs
    if need > len(pairs):
        raise ValueError(f"`class_train_pairs` + `class_test_pairs` = {need} exceeds the "
                         f"{len(pairs)} pairs of fra-eng.txt.")
    order = np.random.default_rng(cfg.seed).permutation(len(pairs))[:need]
    chosen = [pairs[i] for i in order]
    chars = sorted({c for en, fr in chosen for c in en + fr})
    index = {c: i + 2 for i, c in enumerate(chars)}  # 0 pad, 1 <cls>

    def encode(split: list[tuple[str, str]]) -> tuple[list[np.ndarray], np.ndarray]:
        seqs, labels = [], []
        for en, fr in split:
            for label, s in ((0, en), (1, fr)):
                seqs.append(np.array([index[c] for c in s[: cfg.max_chars]], np.int64))
                labels.append(label)
        return seqs, np.array(labels, np.int32)

    train = encode(chosen[: cfg.class_train_pairs])
    test = encode(chosen[cfg.class_train_pairs:])
    return {"train": train, "test": test, "vocab_size": len(chars) + 2}


def _padded(seqs: list[np.ndarray], width: int, cls: bool) -> tuple[np.ndarray, np.ndarray]:
    x = np.full((len(seqs), width + cls), PAD, np.int32)
    lengths = np.empty(len(seqs), np.int32)
    for i, s in enumerate(seqs):
        row = ([CLS] if cls else []) + list(s)
        x[i, :len(row)] = row
        lengths[i] = max(1, len(row))
    return x, lengths


# ----------------------------------------------------------------------------- training


def network_run(model: Any, init_x: np.ndarray, train: dict[str, np.ndarray],
                test: dict[str, np.ndarray], loss_fn: Any, eval_fn: Any, cfg: Config,
                name: str, row: Callable[[Trained], dict]) -> Run:
    """A network trained by AdamW + warm-up/cosine (no weight decay, clipping at 1.0) on
    ``train``, the whole ``test`` set evaluated at the end as one global batch (padded to
    the mesh, ``keep`` False on the padding rows); its folder ``name``, its ``evaluate``
    hook ``row``."""
    params = jax.jit(model.init)(jax.random.PRNGKey(cfg.seed), jnp.asarray(init_x))["params"]
    return Run(
        model=model, params=params, loss_fn=loss_fn, data=train,
        optimizer=cfg.optimizer_config("adamw"),
        fit=cfg.fit_config(best_metric=None, tensorboard=False, plot=False),
        batch_size=min(cfg.batch_size, len(train["y"])), seed=cfg.seed,
        dropout_seed=cfg.seed + 1, eval_fn=eval_fn,
        eval_data=lambda par: [pad_rows({**test, "keep": np.ones(len(test["y"]), bool)},
                                        par.batch_shards, {"keep": False})],
        model_config={"model": name}, name=name, evaluate=row)


def lm_task(cfg: Config) -> tuple[list[dict], list[Run]]:
    """Language modelling: the count models' rows (fitted here) and the LSTM's and GPT's
    runs on random training windows, scored on the validation windows."""
    data = tiny_shakespeare(cfg.data_path)
    train_ids, val_ids = data.train_ids, data.val_ids[: cfg.lm_eval_chars]
    if cfg.lm_train_chars > 0:
        train_ids = train_ids[: cfg.lm_train_chars]
    vocab = data.tokenizer.vocab_size
    rows = []
    print(f"Tiny Shakespeare: {len(train_ids):,} training characters, scoring the first "
          f"{len(val_ids):,} validation characters; |V| = {vocab}")
    for order in cfg.ngram_orders:
        start = time.perf_counter()
        lm = NGramLM(order, vocab, k=cfg.add_k).fit(train_ids)
        nll = lm.nll(val_ids)
        entries = sum(len(t[0]) for t in lm._check_fitted())
        name = "bag of words (12.28)" if order == 1 else f"{order}-gram (12.32)"
        rows.append({"task": "lm", "model": name, "nats": nll, "bpc": nll / math.log(2),
                     "size": f"{entries:,} counts", "seconds": time.perf_counter() - start})
        print(f"{name}: {nll:.3f} nats/char ({nll / math.log(2):.3f} bpc)")

    block = cfg.block_size
    rng = np.random.default_rng(cfg.seed)
    starts = rng.integers(0, len(train_ids) - block - 1, cfg.lm_train_windows)
    win = np.stack([train_ids[s: s + block + 1] for s in starts]).astype(np.int32)
    train = {"x": win[:, :-1], "y": win[:, 1:]}
    n_val = (len(val_ids) - 1) // block
    vx = val_ids[: n_val * block].reshape(n_val, block).astype(np.int32)
    vy = val_ids[1: n_val * block + 1].reshape(n_val, block).astype(np.int32)
    test = {"x": vx, "y": vy}
    net = cfg.model
    models = {
        "LSTM LM": RNNLanguageModel(RNNLMConfig(vocab_size=vocab, embed_dim=net.embed_dim,
                                                hidden_size=net.hidden_size, cell_type="lstm")),
        "transformer LM (GPT)": TransformerLM(TransformerLMConfig(
            vocab_size=vocab, num_layers=net.num_layers, embed_dim=net.embed_dim, block_size=block,
            block=gpt_block(net.num_heads))),
    }
    runs = []
    for name, model in models.items():
        def loss_fn(p: Any, b: dict, rng: jax.Array, model: Any = model) -> tuple:
            logits = model.apply({"params": p}, b["x"])
            return masked_cross_entropy(logits, b["y"]), {}

        def eval_fn(p: Any, b: dict, model: Any = model) -> dict:
            logits = model.apply({"params": p}, b["x"])
            keep = jnp.broadcast_to(b["keep"][:, None], b["y"].shape)
            return {"loss": masked_cross_entropy(logits, b["y"], keep),
                    "tokens": jnp.sum(keep).astype(jnp.float32)}

        def row(t: Trained, name: str = name) -> dict:
            nll = float(t.eval["eval/loss"])
            print(f"{name}: {nll:.3f} nats/char ({nll / math.log(2):.3f} bpc), "
                  f"{t.seconds:.0f}s")
            return {"task": "lm", "model": name, "nats": nll, "bpc": nll / math.log(2),
                    "size": f"{count_params(t.params):,} params", "seconds": t.seconds}

        runs.append(network_run(model, train["x"][:1], train, test, loss_fn, eval_fn, cfg,
                                name.split()[0].lower(), row))
    return rows, runs


def classification_task(cfg: Config) -> tuple[list[dict], list[Run]]:
    """Language identification: the count classifiers' rows (fitted here) and the GRU's and
    the transformer encoder's runs, scored on the test sentences."""
    d = language_id_data(cfg)
    (tr_seqs, tr_y), (te_seqs, te_y) = d["train"], d["test"]
    vocab = d["vocab_size"]
    print(f"\nLanguage ID (fra-eng.txt): {len(tr_y):,} training / {len(te_y):,} test sentences, "
          f"{vocab - 2} characters")
    rows = []
    for order in cfg.class_orders:
        start = time.perf_counter()
        clf = NGramClassifier(order, vocab, 2, k=cfg.add_k).fit(tr_seqs, tr_y)
        acc = float(np.mean(clf.predict(te_seqs) == te_y))
        name = ("naive Bayes (12.29)-(12.30)" if order == 1
                else f"{order}-gram Bayes classifier")
        rows.append({"task": "classification", "model": name, "accuracy": acc,
                     "size": f"{sum(len(t[0]) for m in clf.models for t in m._check_fitted()):,}"
                             " counts", "seconds": time.perf_counter() - start})
        print(f"{name}: {100 * acc:.2f}%")

    runs = []
    net = cfg.model
    for name in ("GRU classifier", "transformer classifier"):
        cls = name.startswith("transformer")
        xtr, ltr = _padded(tr_seqs, cfg.max_chars, cls)
        xte, lte = _padded(te_seqs, cfg.max_chars, cls)
        if cls:
            block = bert_block(net.num_heads, mlp_dim=2 * net.embed_dim, norm="pre",
                               dropout_rate=0.0)
            model = Bert(BertConfig(vocab_size=vocab, num_layers=net.num_layers,
                                    embed_dim=net.embed_dim, block_size=cfg.max_chars + 1,
                                    block=block, type_vocab_size=0, mlm_head=False,
                                    pooler=False, num_classes=2, init_std=0.02))

            def logits_of(p: Any, b: dict, model: Any = model) -> jax.Array:
                return model.apply({"params": p}, b["x"], b["len"])["class_logits"]
        else:
            model = RNNClassifier(RNNClassifierConfig(
                num_classes=2, vocab_size=vocab, embed_dim=net.embed_dim,
                hidden_size=net.hidden_size, cell_type="gru", pooling="last"))

            def logits_of(p: Any, b: dict, model: Any = model) -> jax.Array:
                return model.apply({"params": p}, b["x"], b["len"])

        def loss_fn(p: Any, b: dict, rng: jax.Array, logits_of: Any = logits_of) -> tuple:
            logits = logits_of(p, b)
            return masked_cross_entropy(logits, b["y"]), {
                "accuracy": jnp.mean(jnp.argmax(logits, -1) == b["y"])}

        def eval_fn(p: Any, b: dict, logits_of: Any = logits_of) -> dict:
            logits = logits_of(p, b)
            return {"loss": masked_cross_entropy(logits, b["y"], b["keep"]),
                    "accuracy": token_accuracy(logits, b["y"], b["keep"]),
                    "tokens": jnp.sum(b["keep"]).astype(jnp.float32)}

        def row(t: Trained, name: str = name) -> dict:
            acc = float(t.eval["eval/accuracy"])
            print(f"{name}: {100 * acc:.2f}% ({t.seconds:.0f}s)")
            return {"task": "classification", "model": name, "accuracy": acc,
                    "size": f"{count_params(t.params):,} params", "seconds": t.seconds}

        runs.append(network_run(
            model, xtr[:1], {"x": xtr, "len": ltr, "y": tr_y}, {"x": xte, "len": lte, "y": te_y},
            loss_fn, eval_fn, cfg, "gru" if not cls else "transformer_cls", row))
    return rows, runs


def build(cfg: Config) -> Task:
    """The count models of both tasks (fitted at once) and the four networks' runs
    (:func:`lm_task`, :func:`classification_task`); the rows in order and the two tables
    as the task's hooks."""
    for o in (*cfg.ngram_orders, *cfg.class_orders):
        if o < 1:
            raise ValueError(f"n-gram orders must be >= 1; got {o} in `ngram_orders` / "
                             "`class_orders`.")
    started = time.perf_counter()
    info = machine_info()
    lm_rows, lm_runs = lm_task(cfg)
    class_rows, class_runs = classification_task(cfg)

    def summarize(trained: list[Trained]) -> dict:
        nets = [t.results for t in trained]
        rows = (lm_rows + [r for r in nets if r["task"] == "lm"] + class_rows
                + [r for r in nets if r["task"] == "classification"])
        lm_md, class_md = tables(rows)
        return {"machine": info, "rows": rows, "lm_table_md": lm_md, "class_table_md": class_md}

    return Task("baselines", lm_runs + class_runs, started=started, summarize=summarize,
                about=f"{info['cpu']}, {info['cores']} cores, load {info['load_avg']}",
                report=report)


def run(cfg: Config) -> dict:
    """The count baselines and the networks (on every visible device); the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

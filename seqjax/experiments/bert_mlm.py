"""A small BERT pre-trained by masked language modelling, then fine-tuned as a classifier,
beside the decoder form: a causal LM pre-trained on the same text, fine-tuned on its last token.

Data: the distinct English sentences of the Tatoeba/Anki pairs
(``seqjax.data.corpora.english_french``, d2l's preprocessing), word-level, split 90/10 by
sentence. Every input is ``<cls> w_1 … w_n`` **without the sentence's final punctuation**.

1. **Pre-training** (Bishop §12.3.3, Fig. 12.18; Devlin et al. 2018): a 2-layer
   :class:`~seqjax.models.Bert` with the tied MLM head learns to restore the words chosen
   by :func:`seqjax.models.bert.mlm_mask` — 15% of the words, of which 80% become
   ``<mask>``, 10% a random word, 10% stay — from the unlabelled training sentences.
2. **Fine-tuning**: the same encoder with a classifier on the ``<class>`` position
   (pooler + linear, Bishop §12.3.3) predicts the punctuation that was removed —
   ``.``, ``?`` or ``!`` (statement, question, exclamation) — from ``n_labels`` labelled
   training sentences, starting either from the pre-trained encoder or from scratch.
   The punctuation never appears in pre-training, so the gain measures what MLM taught
   the encoder about English (question words, inversion, …), not a leaked label.
3. **The decoder form** (J&M §9.4.2 and §9.9.1; GPT-1), with ``decoder`` (default on): a
   :class:`~seqjax.models.TransformerLM` of the same depth, width, heads, MLP and dropout
   (pre-norm, tied output) is pre-trained as a causal language model on the same
   unlabelled sentences (the same steps, batch and schedule; ``<cls>`` is its
   begin-of-sentence token, so it predicts ``w_1 … w_n`` from their prefixes), then
   :class:`~seqjax.models.TransformerLMClassifier` — the same trunk with a linear head on
   the hidden state of the **last** word ``w_n`` (right padding: position ``length − 1``)
   — is fine-tuned with the same label budgets, seeds, steps and optimiser, from the
   pre-trained LM and from scratch.

Reported: held-out MLM loss and masked-word accuracy, fill-in-the-blank examples, the
causal LM's held-out loss and next-word accuracy, and test accuracy / macro-F1 of both
classifiers (pre-trained vs scratch) against the number of labels, mean ± sd over seeds;
the majority class is the floor.

Both stages train on every visible device (and host), data parallel unless ``--mesh`` /
``--strategy`` say otherwise; ``pretrain_batch_size`` and ``finetune_batch_size`` are global
batches.

Run:  python -m seqjax.experiments.bert_mlm            (or: seqjax train bert_mlm)
      python -m seqjax.experiments.bert_mlm --smoke    (seconds, for CI)
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.data.tokenizers import SpecialTokens, WordTokenizer
from seqjax.experiments._config import Fraction, NonNegInt, PosFloat, PosInt, moved_into
from seqjax.experiments._kit import (
    Run,
    Task,
    Trained,
    machine_info,
    pad_rows,
    train,
)
from seqjax.experiments._seq2seq import load_pairs
from seqjax.experiments.reports.bert_mlm import plot_results, results_table
from seqjax.models.bert import Bert, BertConfig, bert_block, mlm_mask
from seqjax.models.gpt import (
    TransformerLM,
    TransformerLMClassifier,
    TransformerLMConfig,
    gpt_block,
)
from seqjax.train.loop import FitConfig
from seqjax.train.losses import masked_cross_entropy, token_accuracy
from seqjax.train.optim import OptimizerConfig
from seqjax.train.options import warmup_cosine
from seqjax.train.parallel import Parallel, ParallelOptions
from seqjax.utils import count_params

CLASSES = (".", "?", "!")
SPECIALS = SpecialTokens(bos=None, eos=None, sep=None)  # <pad> <unk> <mask> <cls>


@dataclass(frozen=True)
class ModelOptions:
    """The network's sizes, ``--model.KEY``: one set shared by the two forms compared — the
    BERT encoder (:class:`~seqjax.models.Bert`) and, with ``decoder``, the causal LM
    (:class:`~seqjax.models.TransformerLM`) — in pre-training and fine-tuning alike.

    Attributes:
        num_layers: encoder blocks.
        num_heads: attention heads.
        embed_dim: model width ``d`` (embeddings and every block).
        mlp_dim: hidden width of each block's MLP.
        dropout_rate: dropout rate of the encoder, in both stages.
    """

    num_layers: PosInt = 2
    num_heads: PosInt = 4
    embed_dim: PosInt = 64
    mlp_dim: PosInt = 128
    dropout_rate: Fraction = 0.1


@dataclass(frozen=True)
class Config(ParallelOptions):
    """The options of ``seqjax train bert_mlm`` (MLM pre-training, then fine-tuning).

    Attributes:
        num_pairs: use only the first N pairs of ``fra-eng.txt`` (the shortest; 0 = all).
        test_fraction: fraction of the distinct sentences held out (MLM evaluation and
            classifier test).
        min_freq: words seen fewer times in the training sentences become ``<unk>``.
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        pretrain_steps: MLM optimiser steps.
        pretrain_batch_size: sentences per MLM step, over all devices (capped at the
            training set).
        pretrain_learning_rate: peak AdamW learning rate of pre-training (warm-up, then
            cosine to 0; weight decay 0.01, clipping at 1.0).
        finetune_steps: optimiser steps of each fine-tuning run.
        finetune_batch_size: labelled sentences per fine-tuning step, over all devices
            (capped at the number of labels).
        finetune_learning_rate: peak AdamW learning rate of fine-tuning (same schedule).
        n_labels: labelled training sentences of each fine-tuning setting (0 = every
            training sentence).
        seeds: fine-tuning seeds (labelled sample, initialisation, batch order, dropout);
            results are mean ± sd over them.
        warmup_steps: linear warm-up steps of both stages (a stage no longer stops inside it).
        log_every: steps between logged records (both stages).
        decoder: also run the decoder form: pre-train a causal LM of the same size with the
            same ``pretrain_*`` options, then fine-tune its last-token classifier with the same
            ``finetune_*`` options, label budgets and seeds.
        progress: show a progress bar during pre-training.
        workdir: pre-training logs and checkpoints (``pretrain/``, and ``lm_pretrain/`` for
            the causal LM), ``run.json``, ``bert_mlm.json`` and ``bert_mlm.png``; unset =
            nothing written.
    """

    #: Spellings of this recipe's options before they took the library's names, or before
    #: the network's moved into the group ``--model.*`` (refused on the command line naming
    #: the new one; read from a saved ``experiment.json``).
    RENAMED: ClassVar[dict[str, str]] = {
        "pretrain_batch": "pretrain_batch_size", "pretrain_lr": "pretrain_learning_rate",
        "finetune_batch": "finetune_batch_size", "finetune_lr": "finetune_learning_rate",
        **moved_into("model", ModelOptions)}

    num_pairs: NonNegInt = 0  # 0 = all pairs of the file
    test_fraction: Fraction = 0.1
    min_freq: PosInt = 2
    model: ModelOptions = ModelOptions()
    pretrain_steps: NonNegInt = 3000
    pretrain_batch_size: PosInt = 128
    pretrain_learning_rate: PosFloat = 2e-3
    finetune_steps: NonNegInt = 300
    finetune_batch_size: PosInt = 32
    finetune_learning_rate: PosFloat = 1e-3
    n_labels: tuple[NonNegInt, ...] = (100, 1000, 0)  # 0 = every training sentence
    seeds: tuple[int, ...] = (0, 1, 2)
    warmup_steps: NonNegInt = 100
    log_every: PosInt = 100
    decoder: bool = True
    progress: bool = True
    workdir: str | None = "workdirs/bert_mlm"


PRESETS = {
    "smoke": {
        "num_pairs": 400,
        "model.num_layers": 1,
        "model.num_heads": 2,
        "model.embed_dim": 16,
        "model.mlp_dim": 32,
        "pretrain_steps": 3,
        "pretrain_batch_size": 16,
        "finetune_steps": 3,
        "finetune_batch_size": 8,
        "n_labels": "40",
        "seeds": "0,1",
        "warmup_steps": 1,
        "log_every": 1,
        "progress": False,
    },
}


# ----------------------------------------------------------------------------- data


def sentences(num_pairs: int) -> list[str]:
    """Distinct English sentences (d2l preprocessing) ending in ``.``, ``?`` or ``!``."""
    src, _ = load_pairs(num_pairs)
    return sorted({s for s in src if s.split()[-1] in CLASSES and len(s.split()) > 1})


def encode(sents: list[str], tok: WordTokenizer, length: int) -> dict[str, np.ndarray]:
    """``tokens`` ``<cls> words`` (final punctuation removed), ``lengths``, ``label``."""
    n = len(sents)
    tokens = np.zeros((n, length), np.int32)
    lengths = np.zeros(n, np.int32)
    labels = np.zeros(n, np.int32)
    for i, s in enumerate(sents):
        words = s.split()
        ids = [tok.cls_id, *tok.encode(" ".join(words[:-1]))][:length]
        tokens[i, : len(ids)] = ids
        lengths[i] = len(ids)
        labels[i] = CLASSES.index(words[-1])
    return {"tokens": tokens, "lengths": lengths, "label": labels}


def _bert(cfg: Config, vocab: int, length: int, *, classifier: bool) -> Bert:
    m = cfg.model
    return Bert(
        BertConfig(
            vocab_size=vocab,
            num_layers=m.num_layers,
            embed_dim=m.embed_dim,
            block_size=length,
            block=bert_block(m.num_heads, mlp_dim=m.mlp_dim, dropout_rate=m.dropout_rate),
            type_vocab_size=0,
            mlm_head=not classifier,
            pooler=classifier,
            num_classes=3 if classifier else 0,
        )
    )


def _optimizer(lr: float, steps: int, warmup: int) -> OptimizerConfig:
    """AdamW (weight decay 0.01, clipping at 1.0), warm-up then cosine decay to 0."""
    return OptimizerConfig(name="adamw", learning_rate=lr, **warmup_cosine(steps, warmup),
                           weight_decay=0.01, clip_norm=1.0)


# ----------------------------------------------------------------------------- pre-training


def _mlm_batch(
    model: Bert, tok: WordTokenizer, p: Any, batch: dict, key: jax.Array, train: bool
) -> tuple[jax.Array, dict]:
    tokens = batch["tokens"]
    valid = jnp.arange(tokens.shape[1])[None] < batch["lengths"][:, None]
    maskable = valid & (tokens != tok.cls_id)
    k_mask, k_drop = jax.random.split(key)
    inputs, selected = mlm_mask(
        k_mask, tokens, vocab_size=tok.vocab_size, mask_id=tok.mask_id, maskable_BxT=maskable
    )
    out = model.apply(
        {"params": p},
        inputs,
        batch["lengths"],
        deterministic=not train,
        rngs={"dropout": k_drop} if train else {},
    )
    logits = out["mlm_logits"]
    loss = masked_cross_entropy(logits, tokens, selected)
    return loss, {
        "accuracy": token_accuracy(logits, tokens, selected),
        "tokens": jnp.sum(selected).astype(jnp.float32),
    }


def pretrain(cfg: Config, tok: WordTokenizer, train: dict, val: dict, length: int,
             done: Callable[[Trained], dict]) -> Run:
    """MLM pre-training of the encoder (folder ``pretrain``), evaluated on 4 fixed maskings
    of the held-out sentences; its ``evaluate`` hook ``done``."""
    model = _bert(cfg, tok.vocab_size, length, classifier=False)

    def loss_fn(p: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
        return _mlm_batch(model, tok, p, batch, rng, True)

    def eval_fn(p: Any, batch: dict) -> dict:
        # Every row carries the pass's key (a batch leaf is split over the devices by row).
        loss, m = _mlm_batch(model, tok, p, batch, batch["key"][0], False)
        return {"loss": loss, **m}

    # Fixed masks for evaluation: 4 passes over the held-out sentences, one key each. The
    # masks are drawn for the whole [N, T] batch at once (rows appended to split it over
    # the devices are length-1 `<cls>` rows, never masked, and leave the others' draws
    # unchanged).
    n_val = len(val["tokens"])

    def mlm_val(par: Parallel) -> list[dict]:
        return [pad_rows({**val, "key": np.repeat(np.asarray(jax.random.PRNGKey(100 + i))[None],
                                                   n_val, axis=0)},
                         par.batch_shards, {"lengths": 1})
                for i in range(4)]

    return _pretrain_run(cfg, model, loss_fn, eval_fn, train, mlm_val, "pretrain",
                         {"stage": "mlm", "vocab": tok.vocab_size, "dim": cfg.model.embed_dim,
                          "layers": cfg.model.num_layers}, done)


def _pretrain_run(cfg: Config, model: Any, loss_fn: Any, eval_fn: Any, train: dict,
                  val: Callable[[Parallel], list[dict]], name: str, model_config: dict,
                  done: Callable[[Trained], dict]) -> Run:
    """``cfg.pretrain_steps`` steps of ``loss_fn`` over the training sentences (both
    pre-trainings: AdamW, warm-up and cosine decay; the parameters from key 0, the batch
    order from seed 0, the dropout key 1), in the folder ``name``."""
    params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.asarray(train["tokens"][:1]))["params"]
    return Run(
        model=model, params=params, loss_fn=loss_fn,
        data={k: train[k] for k in ("tokens", "lengths")},
        optimizer=_optimizer(cfg.pretrain_learning_rate, cfg.pretrain_steps, cfg.warmup_steps),
        fit=FitConfig(steps=cfg.pretrain_steps, log_every=cfg.log_every,
                      checkpoint_every=0, best_metric=None, progress=cfg.progress,
                      tensorboard=False, plot=cfg.workdir is not None),
        batch_size=min(cfg.pretrain_batch_size, len(train["tokens"])), seed=0, dropout_seed=1,
        eval_fn=eval_fn, eval_data=val, model_config=model_config, name=name, evaluate=done)


def _lm_config(cfg: Config, vocab: int, length: int) -> TransformerLMConfig:
    """The causal LM of the decoder form: BERT's depth, width, heads, MLP and dropout
    (``cfg.model``)."""
    m = cfg.model
    return TransformerLMConfig(
        vocab_size=vocab,
        num_layers=m.num_layers,
        embed_dim=m.embed_dim,
        block_size=length,
        block=gpt_block(m.num_heads, mlp_dim=m.mlp_dim, dropout_rate=m.dropout_rate),
        tie_embeddings=True,
    )


def _lm_batch(
    model: TransformerLM, p: Any, batch: dict, key: jax.Array, train: bool
) -> tuple[jax.Array, dict]:
    """Next-word cross-entropy: position ``t`` predicts token ``t + 1`` of ``<cls> w_1 … w_n``
    (``<cls>`` plays the begin-of-sentence token), over the real tokens only."""
    tokens = batch["tokens"]
    logits = model.apply(
        {"params": p},
        tokens,
        batch["lengths"],
        deterministic=not train,
        rngs={"dropout": key} if train else {},
    )[:, :-1]
    targets = tokens[:, 1:]
    keep = jnp.arange(1, tokens.shape[1])[None] < batch["lengths"][:, None]
    loss = masked_cross_entropy(logits, targets, keep)
    return loss, {
        "accuracy": token_accuracy(logits, targets, keep),
        "tokens": jnp.sum(keep).astype(jnp.float32),
    }


def pretrain_lm(cfg: Config, tok: WordTokenizer, train: dict, val: dict, length: int,
                done: Callable[[Trained], dict]) -> Run:
    """Causal-LM pre-training of the decoder form (same steps, batch and schedule as MLM;
    folder ``lm_pretrain``); its ``evaluate`` hook ``done``."""
    model = TransformerLM(_lm_config(cfg, tok.vocab_size, length))

    def loss_fn(p: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
        return _lm_batch(model, p, batch, rng, True)

    def eval_fn(p: Any, batch: dict) -> dict:
        loss, m = _lm_batch(model, p, batch, jax.random.PRNGKey(0), False)
        return {"loss": loss, **m}

    # Appended rows (to split the batch over the devices) have length 1: no target.
    return _pretrain_run(cfg, model, loss_fn, eval_fn, train,
                         lambda par: [pad_rows(dict(val), par.batch_shards, {"lengths": 1})],
                         "lm_pretrain",
                         {"stage": "causal_lm", "vocab": tok.vocab_size,
                          "dim": cfg.model.embed_dim, "layers": cfg.model.num_layers}, done)


def fill_in(
    model: Bert, params: Any, tok: WordTokenizer, sents: list[str], length: int, k: int = 3
) -> list[dict]:
    """Mask the second word of each sentence and list the model's ``k`` best guesses."""
    apply = jax.jit(lambda p, x, n: model.apply({"params": p}, x, n)["mlm_logits"])
    out = []
    for s in sents:
        words = s.split()[:-1]
        ids = [tok.cls_id, *tok.encode(" ".join(words))]
        masked = list(ids)
        masked[2] = tok.mask_id
        x = jnp.asarray([masked + [0] * (length - len(masked))], jnp.int32)
        logits = apply(params, x, jnp.asarray([len(masked)], jnp.int32))
        probs = jax.nn.softmax(logits[0, 2])
        top = np.argsort(-np.asarray(probs))[:k]
        out.append(
            {
                "input": " ".join([*words[:1], "<mask>", *words[2:]]),
                "answer": words[1],
                "guesses": [(tok.id_to_token(int(i)), float(probs[i])) for i in top],
            }
        )
    return out


# ----------------------------------------------------------------------------- fine-tuning


def macro_f1(pred: np.ndarray, gold: np.ndarray, classes: int = 3) -> float:
    """Unweighted mean of the per-class F1 scores over the classes in ``pred`` or ``gold``.

    Example:
        >>> macro_f1(np.array([0, 1, 1]), np.array([0, 1, 0]), classes=3)
        0.6666666666666666
    """
    f1s = []
    for c in range(classes):
        tp = np.sum((pred == c) & (gold == c))
        fp = np.sum((pred == c) & (gold != c))
        fn = np.sum((pred != c) & (gold == c))
        if tp + fp + fn:
            f1s.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(f1s))


def finetune(cfg: Config, form: str, model: Any, class_logits: Any,
             pre_params: Callable[[], Any], train: dict, test: dict) -> Iterator[Run]:
    """The fine-tuning runs of ``model`` (a classifier whose ``apply`` output gives the
    logits through ``class_logits``) for every label budget and seed, from the pre-trained
    parameters (``pre_params()``, read when the first run is built; the keys both trees
    share) and from scratch, each named ``finetune_FORM_INIT_nN_seedS`` and writing nothing
    (its row is the result); a run's
    ``evaluate`` hook gives its test accuracy and macro-F1."""
    n_train = len(train["tokens"])
    init_fn = jax.jit(model.init)

    def loss_fn(p: Any, batch: dict, rng: jax.Array) -> tuple[jax.Array, dict]:
        logits = class_logits(model.apply({"params": p}, batch["tokens"], batch["lengths"],
                                          deterministic=False, rngs={"dropout": rng}))
        return masked_cross_entropy(logits, batch["label"]), {
            "accuracy": token_accuracy(logits, batch["label"])}

    predict = jax.jit(
        lambda p, x, n: jnp.argmax(class_logits(model.apply({"params": p}, x, n)), -1))

    def score(t: Trained, n: int, seed: int, init: str) -> dict:
        pred = np.asarray(predict(t.params, jnp.asarray(test["tokens"]),
                                  jnp.asarray(test["lengths"])))
        acc, f1 = float(np.mean(pred == test["label"])), macro_f1(pred, test["label"])
        print(f"fine-tune {form} {init:>10}, {n:>5} labels, seed {seed}: accuracy "
              f"{100 * acc:.1f}%, macro-F1 {f1:.3f}")
        return {"model": form, "n_labels": n, "seed": seed, "init": init, "accuracy": acc,
                "macro_f1": f1, "seconds": t.seconds}

    for n_lab in cfg.n_labels:
        n = n_train if n_lab <= 0 else min(n_lab, n_train)
        for seed in cfg.seeds:
            pick = np.sort(np.random.default_rng(1000 + seed).permutation(n_train)[:n])
            labelled = {k: v[pick] for k, v in train.items()}
            for init in ("pretrained", "scratch"):
                params = init_fn(jax.random.PRNGKey(seed), jnp.asarray(train["tokens"][:1]))[
                    "params"]
                if init == "pretrained":  # copies: the train step donates its input state
                    pre = pre_params()
                    params = {**params, **jax.tree_util.tree_map(
                        jnp.copy, {k: pre[k] for k in params if k in pre})}
                yield Run(
                    model=model, params=params, loss_fn=loss_fn, data=labelled,
                    optimizer=_optimizer(cfg.finetune_learning_rate, cfg.finetune_steps,
                                         cfg.warmup_steps),
                    fit=FitConfig(steps=cfg.finetune_steps, log_every=cfg.log_every,
                                  checkpoint_every=0, best_metric=None, progress=False,
                                  tensorboard=False, plot=False),
                    batch_size=min(cfg.finetune_batch_size, n), seed=seed, dropout_seed=seed + 7,
                    name=f"finetune_{form}_{init}_n{n}_seed{seed}",
                    writes=False,  # the many short fine-tunings are rows of the table
                    evaluate=lambda t, n=n, seed=seed, init=init: score(t, n, seed, init))


def _data(cfg: Config) -> tuple[list[str], list[str], WordTokenizer, int]:
    """The training and test sentences (a seeded ``test_fraction`` held out, each in sorted
    order), the tokenizer of the training sentences and the length of the longest input."""
    sents = sentences(cfg.num_pairs)
    perm = np.random.default_rng(0).permutation(len(sents))
    n_test = max(1, int(round(cfg.test_fraction * len(sents))))
    test_s = [sents[i] for i in sorted(perm[:n_test])]
    train_s = [sents[i] for i in sorted(perm[n_test:])]
    tok = WordTokenizer.from_texts([" ".join(s.split()[:-1]) for s in train_s],
                                   min_freq=cfg.min_freq, pattern=r"\S+",
                                   special_tokens=SPECIALS)
    length = 1 + max(len(s.split()) - 1 for s in sents)
    return train_s, test_s, tok, length


def _fill_in_demo(t: Trained, tok: WordTokenizer, test_s: list[str], length: int) -> list[dict]:
    """:func:`fill_in` of the pre-trained MLM on the first 6 held-out sentences of 4 words or
    more; printed after the held-out MLM loss and accuracy."""
    demo = fill_in(t.run.model, t.params, tok,
                   [s for s in test_s if len(s.split()) >= 4][:6], length)
    print(f"held-out MLM loss {t.eval['eval/loss']:.3f}, masked-word accuracy "
          f"{100 * t.eval['eval/accuracy']:.1f}% ({t.seconds:.0f}s)")
    for d in demo:
        print(f"  {d['input']!r} ({d['answer']}): "
              + ", ".join(f"{w} {p:.2f}" for w, p in d["guesses"]))
    return demo


def _template(model: Any, train: dict) -> Any:
    """The parameter tree of a classifier (shapes only), as built on the training arrays."""
    return jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          jnp.asarray(train["tokens"][:1]))["params"]


def build(cfg: Config) -> Task:
    """The sentences and the tokenizer; the runs in order: MLM pre-training, the BERT
    fine-tunings, then (``decoder``) causal-LM pre-training and the GPT fine-tunings (each
    fine-tuning built once its pre-training is done); the table and the figure as hooks."""
    started = time.perf_counter()
    info = machine_info()
    train_s, test_s, tok, length = _data(cfg)
    train, test = encode(train_s, tok, length), encode(test_s, tok, length)
    counts = collections.Counter(test["label"].tolist())
    majority = max(counts.values()) / len(test_s)
    pre: dict[str, Any] = {}  # what the pre-trainings leave for the fine-tunings

    def mlm_done(t: Trained) -> dict:
        pre["mlm"] = t.params
        return {"fill_in": _fill_in_demo(t, tok, test_s, length)}

    def lm_done(t: Trained) -> dict:
        pre["lm"] = t.params
        print(f"held-out LM loss {t.eval['eval/loss']:.3f}, next-word accuracy "
              f"{100 * t.eval['eval/accuracy']:.1f}% ({t.seconds:.0f}s)")
        return {}

    bert = _bert(cfg, tok.vocab_size, length, classifier=True)
    gpt = TransformerLMClassifier(_lm_config(cfg, tok.vocab_size, length),
                                  num_classes=len(CLASSES))

    def runs() -> Iterator[Run]:
        print("\n== MLM pre-training")
        yield pretrain(cfg, tok, train, test, length, mlm_done)
        yield from finetune(cfg, "bert", bert, lambda out: out["class_logits"],
                            lambda: pre["mlm"], train, test)
        if cfg.decoder:
            print("\n== causal LM pre-training (the decoder form)")
            yield pretrain_lm(cfg, tok, train, test, length, lm_done)
            yield from finetune(cfg, "gpt", gpt, lambda out: out, lambda: pre["lm"], train,
                                test)

    def summarize(trained: list[Trained]) -> dict:
        by_name = {t.run.name: t for t in trained}
        mlm = by_name["pretrain"]
        rows = [t.results for t in trained if t.run.name.startswith("finetune_bert")]
        decoder: dict[str, Any] = {}
        if cfg.decoder:
            lm = by_name["lm_pretrain"]
            decoder = {"lm_eval": lm.eval, "pretrain_s": lm.seconds,
                       "params_lm": count_params(lm.params),
                       "params_classifier": count_params(_template(gpt, train)),
                       "runs": [t.results for t in trained
                                if t.run.name.startswith("finetune_gpt")]}
        table = results_table(rows + decoder.get("runs", []), majority)
        s = {"machine": info, "pretrain_s": mlm.seconds, "params_mlm": count_params(mlm.params),
             "params_classifier": count_params(_template(bert, train)), "vocab": tok.vocab_size,
             "n_train": len(train_s), "n_test": len(test_s),
             "test_classes": {CLASSES[c]: n for c, n in counts.items()},
             "majority_accuracy": majority, "mlm_eval": mlm.eval,
             "fill_in": mlm.results["fill_in"], "runs": rows, "decoder": decoder,
             "table_md": table}
        if cfg.workdir is not None:
            s["plot"] = os.path.join(cfg.workdir, "bert_mlm.png")
        return s

    return Task(
        "bert_mlm", runs(), started=started, summarize=summarize,
        about=(f"{len(train_s)} training / {len(test_s)} test sentences; vocabulary "
               f"{tok.vocab_size}; test classes "
               f"{dict((CLASSES[c], n) for c, n in counts.items())}; {info['cpu']}, "
               f"{info['cores']} cores, load {info['load_avg']}"),
        report=lambda s: s["table_md"] + f"\n\nwall time {s['wall_s']:.0f}s",
        files=lambda folder, s: plot_results(s["runs"] + s["decoder"].get("runs", []),
                                             majority, os.path.join(folder, "bert_mlm.png")))


def run(cfg: Config) -> dict:
    """Pre-train, fine-tune and compare on every visible device; the summary."""
    return train(build(cfg), cfg)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

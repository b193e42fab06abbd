r"""The experiments' image kit: digits as raster-order code sequences for a transformer LM.

What ``experiments.image_gpt`` (Bishop §12.4.2) and ``experiments.text_to_image`` (Bishop
§12.4.5) share:

* **Data** — :func:`digit_splits`: the scikit-learn 8×8 digits in a fixed train/test split
  (and a validation share for early stopping).
* **Tokens** — :func:`raster_patches` (pixels or patches in raster order, Bishop Fig. 12.23)
  and its inverse :func:`from_raster_patches`; :func:`tokenizer` (a K-means codebook, Bishop
  (12.38)), :func:`encode` (nearest code) and :func:`decode` (through the codebook).
* **Training** — :func:`lm_arrays` (next-token arrays of ``[prompt, codes]`` with the loss
  on the codes only), :func:`lm_run` (the kit's :class:`~seqjax.experiments._kit.Run` of a
  :class:`~seqjax.models.gpt.TransformerLM` with the causal LM loss over the codes, early
  stopping on a validation split),
  :func:`independent_baseline` (a categorical per position).
* **Evaluation and sampling** — :func:`image_bits` (bits per image of the codes given the
  prompt) and :func:`generate` (codes sampled in raster order after a prompt).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np

from seqjax._checks import check_rate
from seqjax.data.batching import split_arrays
from seqjax.data.packaged import digits
from seqjax.decoding import FunctionalDecoder, sample
from seqjax.experiments._kit import Run, Trained, pad_rows
from seqjax.models.gpt import TransformerLM
from seqjax.nn.vq import kmeans_codebook, nearest_code
from seqjax.train.losses import masked_cross_entropy
from seqjax.train.parallel import Parallel
from seqjax.utils import count_params

Array = jax.Array
Tokenisation = Literal["pixels", "patches"]
TOKENISATIONS: tuple[str, ...] = get_args(Tokenisation)


# ----------------------------------------------------------------------------- tokens


def raster_patches(images_NxHxW: np.ndarray, patch: int) -> np.ndarray:
    """``[N, (H/p)(W/p), p²]``: patches in raster order (row by row, left to right), each
    flattened row-major; ``patch = 1`` gives the pixels in raster order (Bishop Fig. 12.23)."""
    n, h, w = images_NxHxW.shape
    if h % patch or w % patch:
        raise ValueError(f"`patch` must divide the image size {h}×{w}; got {patch}.")
    x = images_NxHxW.reshape(n, h // patch, patch, w // patch, patch)
    return x.transpose(0, 1, 3, 2, 4).reshape(n, (h // patch) * (w // patch), patch * patch)


def from_raster_patches(patches_NxLxP: np.ndarray, size: int, patch: int) -> np.ndarray:
    """Inverse of :func:`raster_patches`: ``[N, size, size]`` images."""
    n = patches_NxLxP.shape[0]
    g = size // patch
    x = patches_NxLxP.reshape(n, g, g, patch, patch).transpose(0, 1, 3, 2, 4)
    return x.reshape(n, size, size)


def tokenizer(kind: str, train_images: np.ndarray, cfg: Any) -> tuple[np.ndarray, int]:
    """``(codebook [K, p²], patch size)`` fitted by K-means on the training images; ``cfg``
    needs ``patch_size``, ``pixel_codes``, ``patch_codes`` and ``seed``."""
    if kind not in TOKENISATIONS:
        raise ValueError(f"`tokens` must be drawn from {TOKENISATIONS}; got {kind!r}.")
    patch = 1 if kind == "pixels" else cfg.patch_size
    k = cfg.pixel_codes if kind == "pixels" else cfg.patch_codes
    vecs = raster_patches(train_images, patch).reshape(-1, patch * patch)
    return kmeans_codebook(vecs, k, seed=cfg.seed), patch


def encode(images: np.ndarray, codebook: np.ndarray, patch: int) -> np.ndarray:
    """Token ids ``int32[N, L]`` (Bishop (12.38), raster order)."""
    k, _ = nearest_code(jnp.asarray(raster_patches(images, patch)), jnp.asarray(codebook))
    return np.asarray(k, np.int32)


def decode(tokens: np.ndarray, codebook: np.ndarray, patch: int, size: int = 8) -> np.ndarray:
    return from_raster_patches(np.asarray(codebook)[np.asarray(tokens)], size, patch)


# ----------------------------------------------------------------------------- training


def independent_baseline(train_tok: np.ndarray, test_tok: np.ndarray, vocab: int) -> float:
    """Test NLL (bits per image) of a categorical per position, add-one smoothed counts."""
    counts = np.ones((train_tok.shape[1], vocab))
    for n in range(train_tok.shape[1]):
        counts[n] += np.bincount(train_tok[:, n], minlength=vocab)
    logp = np.log2(counts / counts.sum(1, keepdims=True))
    return float(-np.mean(np.sum(logp[np.arange(test_tok.shape[1]), test_tok], 1)))


def lm_arrays(prompt_NxP: np.ndarray, codes_NxL: np.ndarray) -> dict[str, np.ndarray]:
    """Next-token arrays of the sequences ``[prompt, codes]``: ``inputs`` (all but the last
    token), ``targets`` (all but the first) and ``mask``, True where the target is an image
    code — the loss and the bits/image are over the ``L`` codes only, never the prompt."""
    seq = np.concatenate([prompt_NxP, codes_NxL], 1).astype(np.int32)
    p = prompt_NxP.shape[1]
    mask = np.zeros(seq[:, 1:].shape, bool)
    mask[:, p - 1 :] = True
    return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "mask": mask}


def lm_run(
    cfg: Any,
    splits: dict[str, dict[str, np.ndarray]],
    vocab: int,
    num_codes: int,
    *,
    name: str,
    model_config: dict,
    evaluate: Callable[[TransformerLM, Any, dict], dict] | None = None,
) -> Run:
    """The :class:`~seqjax.experiments._kit.Run` of a :class:`TransformerLM` trained with the
    causal LM loss on the image codes of ``splits["train"]`` (arrays of :func:`lm_arrays`);
    early stopping on ``splits["val"]``.

    Codes are the ids ``0 … num_codes − 1`` of a vocabulary of ``vocab`` ids; an image
    position predicts a code, so every other id gets logit −∞ there (the NLL is over the
    ``K`` codes, as the baseline's). Every ``cfg.eval_every`` steps (and at the end) the
    validation NLL is measured and the parameters with the lowest are kept (early stopping;
    without a ``"val"`` split, the last ones). The run's results: ``test_bits_per_image``
    (of those parameters), ``last_test_bits_per_image`` (the last step's), ``best_step``,
    ``val_curve`` ``[(step, val bits/image), …]``, ``first_loss``, ``last_loss``,
    ``params``, ``train_s``, updated by ``evaluate(model, kept parameters, results)`` when
    given. ``cfg`` needs ``model`` (a :class:`~seqjax.experiments._gpt.TransformerOptions`,
    the network, built for ``vocab`` ids and windows of the inputs' ``length + 1``), ``steps``,
    ``batch_size``, ``learning_rate``, ``warmup_steps``, ``clip_norm``, ``weight_decay``,
    ``eval_every``, ``seed``, ``log_every`` and ``progress`` (as the ``Config`` of image_gpt
    and text_to_image).
    """
    train = splits["train"]
    length = train["inputs"].shape[1]
    model = cfg.model.build(vocab, length + 1)  # learned positions for length + 1 tokens
    params = model.init(jax.random.PRNGKey(cfg.seed), jnp.zeros((1, length), jnp.int32))["params"]
    not_code_V = jnp.arange(vocab) >= num_codes
    # a dropout key in training when any dropout is on (the attention's may be set alone)
    dropout = cfg.model.dropout_rate > 0 or (cfg.model.attention_dropout_rate or 0.0) > 0

    def code_logits(p: Any, inputs: Array, rng: Array | None = None) -> Array:
        logits = model.apply(
            {"params": p},
            inputs,
            deterministic=rng is None,
            rngs=None if rng is None else {"dropout": rng},
        )
        return jnp.where(not_code_V, -jnp.inf, logits)

    def loss_fn(p: Any, batch: dict, rng: Array) -> tuple[Array, dict]:
        logits = code_logits(p, batch["inputs"], rng if dropout else None)
        return masked_cross_entropy(logits, batch["targets"], batch["mask"]), {}

    def nll_fn(p: Any, batch: dict) -> dict:  # summed over the kept (code) targets
        logits = code_logits(p, batch["inputs"])
        return {
            "loss": masked_cross_entropy(logits, batch["targets"], batch["mask"]),
            "tokens": jnp.sum(batch["mask"]).astype(jnp.float32),
        }

    def bits_per_image(p: Any, arrays: dict[str, np.ndarray]) -> float:
        return float(np.mean(image_bits(model, p, arrays, num_codes)))

    best: dict[str, Any] = {"loss": np.inf, "params": None, "curve": []}
    val = splits.get("val")

    def results(t: Trained) -> dict:
        history = t.result.history
        eval_steps = [r["step"] for r in history if "eval/loss" in r]
        curve = list(zip(eval_steps, best["curve"]))
        if len(eval_steps) != len(best["curve"]):
            curve = []
        kept = t.params if best["params"] is None else best["params"]
        best_step = (curve[best["index"]][0] if best["params"] is not None and curve
                     else t.steps)
        losses = [r["loss"] for r in history if "loss" in r]
        out = {
            "test_bits_per_image": bits_per_image(kept, splits["test"]),
            "last_test_bits_per_image": bits_per_image(t.params, splits["test"]),
            "best_step": int(best_step),
            "val_curve": [[int(s), float(b)] for s, b in curve],
            "train_s": t.seconds,
            "params": count_params(kept),
            "first_loss": losses[0] if losses else float("nan"),
            "last_loss": losses[-1] if losses else float("nan"),
        }
        return out if evaluate is None else evaluate(model, kept, out)

    return Run(
        model=model, params=params, loss_fn=loss_fn, data=train,
        optimizer=cfg.optimizer_config("adamw"),
        fit=cfg.fit_config(best_metric=None, tensorboard=False, plot=False),
        batch_size=cfg.batch_size, seed=cfg.seed, dropout_seed=cfg.seed + 1,
        # one global batch, padded to split over the devices (padding rows: mask False)
        eval_fn=None if val is None else nll_fn,
        eval_data=None if val is None else (
            lambda par: [pad_rows(val, par.batch_shards, {"mask": False})]),
        wrap_eval_step=functools.partial(_keep_best, best, val), model_config=model_config,
        name=name, evaluate=results)


def _keep_best(
    best: dict[str, Any], val: dict[str, np.ndarray], val_step: Callable[..., Any], par: Parallel
) -> Callable[..., Any]:
    """:func:`lm_run`'s ``wrap_eval_step``: ``val_step`` that also appends the validation
    bits per image to ``best["curve"]`` and keeps the parameters of the lowest in ``best``."""
    per_image = float(val["mask"].sum()) / len(val["mask"])

    def eval_and_keep(p: Any, batch: dict) -> dict:
        m = val_step(p, batch)
        loss = float(m["loss"])
        best["curve"].append(loss * per_image / np.log(2.0))
        if loss < best["loss"]:  # early stopping: keep the best parameters so far
            best.update(loss=loss, params=par.gather(p), index=len(best["curve"]) - 1)
        return m

    return eval_and_keep


def image_bits(
    model: TransformerLM, params: Any, arrays: dict[str, np.ndarray], num_codes: int
) -> np.ndarray:
    """``float[N]``: each sequence's ``−log₂ p(c_1 … c_L | prompt)``, the NLL in bits of its
    image codes (the ``mask``-ed targets of :func:`lm_arrays`) under ``model``, over the
    codes ``0 … num_codes − 1`` (every other id's logit is −∞, as in training)."""
    not_code_V = jnp.arange(model.config.vocab_size) >= num_codes

    @jax.jit
    def bits_N(p: Any, inputs_NxT: Array, targets_NxT: Array, mask_NxT: Array) -> Array:
        logits_NxTxV = jnp.where(not_code_V, -jnp.inf, model.apply({"params": p}, inputs_NxT))
        nll_NxT = masked_cross_entropy(logits_NxTxV, targets_NxT, mask_NxT, reduction="none")
        return jnp.sum(jnp.where(mask_NxT, nll_NxT, 0.0), -1) / jnp.log(2.0)

    return np.asarray(
        bits_N(params, *(jnp.asarray(arrays[k]) for k in ("inputs", "targets", "mask")))
    )


def generate(
    model: TransformerLM,
    params: Any,
    prompt_BxP: np.ndarray,
    num_codes: int,
    length: int,
    temperature: float,
    seed: int,
) -> np.ndarray:
    """``int32[B, length]`` image codes sampled in raster order after ``prompt_BxP``; only
    the codes ``0 … num_codes − 1`` are drawn (every other id's logit is −∞ at every step)."""
    not_code_V = jnp.arange(model.config.vocab_size) >= num_codes

    def step(p: Any, state: Any, tokens_B: Array) -> tuple[Array, Any]:
        logits_BxV, state = model.decode_step(p, state, tokens_B)
        return jnp.where(not_code_V, -jnp.inf, logits_BxV), state

    decoder = FunctionalDecoder(model.init_decode_state, step)
    out = sample(
        decoder,
        params,
        jnp.asarray(prompt_BxP, jnp.int32),
        key=jax.random.PRNGKey(seed),
        max_new_tokens=length,
        temperature=temperature,
    )
    return np.asarray(out.tokens)


# ----------------------------------------------------------------------------- data


def digit_splits(val_fraction: float) -> dict[str, dict[str, np.ndarray]]:
    """The scikit-learn digits (``x: [N, 8, 8]`` in [0, 1], ``y`` the digit) in a fixed
    80/20 ``train``/``test`` split (seed 0) and, when ``val_fraction > 0``, that fraction
    of ``train`` held out as ``val`` (seed 1; ``train`` keeps the rest, ``fit`` the
    whole 80%)."""
    check_rate(val_fraction, "val_fraction")
    data = digits("rows")
    fit_rows, test = split_arrays({"x": data["inputs"], "y": data["labels"]}, 0.2, seed=0)
    out = {"fit": fit_rows, "train": fit_rows, "test": test}
    if val_fraction > 0:
        out["train"], out["val"] = split_arrays(fit_rows, val_fraction, seed=1)
    return out

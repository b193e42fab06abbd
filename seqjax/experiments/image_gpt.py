r"""A raster-order image transformer on scikit-learn digits (Bishop §12.4.2, Fig. 12.23).

Bishop §12.4.2 generates images autoregressively: the pixels are read in **raster order**
(row by row, left to right; Fig. 12.23's ``x_1..x_16`` on a 4×4 grid) and

.. math::
    p(x_1, …, x_N) = \prod_{n=1}^{N} p(x_n \mid x_1, …, x_{n-1})\qquad (12.37)

is modelled by a decoder-only transformer with the causal LM loss, exactly as text
(Bishop §12.3.1). Pixels must be **discrete** tokens: each value (or patch) is
replaced by its nearest code vector, ``x_n → \arg\min_{c_k ∈ \mathcal C} \lVert x_n − c_k
\rVert^2`` (12.38), with a codebook fitted by K-means (ImageGPT's colour palette).
Two tokenisations of the 8×8 digits (16 grey levels, scaled to [0, 1]):

* ``pixels``: every pixel is one token, a ``K``-level grey palette (1-D K-means;
  64 tokens per image);
* ``patches``: every 2×2 patch is one token, a codebook of ``K`` patch vectors in ℝ⁴
  (16 tokens per image; vector quantisation proper).

The model is :class:`seqjax.models.TransformerLM` on ``[<start>, t_1 … t_{N−1}]`` with
targets ``[t_1 … t_N]``; samples are drawn by :func:`seqjax.decoding.sample` from
``<start>`` and decoded through the codebook (:func:`seqjax.nn.vq.nearest_code`,
``codebook[k]``). Baseline: independent pixels — a categorical distribution per position
(add-one smoothed counts), the ``p(x) = ∏ p(x_n)`` that ignores the context. Test
negative log-likelihood is reported in bits per image.

1,438 training images are few for a 100k-parameter transformer: without regularisation it
over-fits and, on patches, loses to the baseline (``results/image_gpt_ablation.md``). So
the model trains with dropout, and the parameters of the step with the lowest NLL on a
held-out validation split (early stopping) are the ones tested. :func:`train_lm`,
:func:`lm_arrays`, :func:`image_bits` and :func:`generate` take any prompt before the codes
(``<start>`` here; text in :mod:`seqjax.experiments.text_to_image`).

Run:  python -m seqjax.experiments.image_gpt --results_dir seqjax/experiments/results
      python -m seqjax.experiments.image_gpt --smoke --workdir /tmp/igpt     (seconds)
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np

from seqjax.data.batching import split_arrays
from seqjax.data.iterators import ArrayIterator
from seqjax.data.packaged import digits
from seqjax.decoding import FunctionalDecoder, sample
from seqjax.experiments._config import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt
from seqjax.experiments._kit import pad_rows, write_results, write_run_info
from seqjax.experiments.reports.image_gpt import plot_samples, report
from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.nn.vq import kmeans_codebook, nearest_code
from seqjax.train.loop import FitConfig, fit
from seqjax.train.losses import masked_cross_entropy
from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer
from seqjax.train.parallel import Parallel, ParallelOptions
from seqjax.utils import count_params

Array = jax.Array
Tokenisation = Literal["pixels", "patches"]
TOKENISATIONS: tuple[str, ...] = get_args(Tokenisation)


@dataclass(frozen=True)
class Config(ParallelOptions):
    """The options of ``seqjax train image_gpt`` (a raster-order transformer on 8×8 digits).

    Attributes:
        tokens: tokenisations, one model each: ``pixels`` (a token per pixel) or ``patches``
            (a token per ``patch_size`` × ``patch_size`` patch).
        pixel_codes: ``K``, grey levels of the ``pixels`` palette (K-means).
        patch_codes: ``K``, patch vectors of the ``patches`` codebook (K-means).
        patch_size: side of a ``patches`` token in pixels (must divide 8).
        num_layers: transformer blocks.
        num_heads: attention heads.
        embed_dim: model width ``d``.
        dropout_rate: dropout rate on the embeddings, residual branches and attention weights.
        steps: AdamW steps per tokenisation (the cosine schedule ends here).
        batch_size: images per step, over all devices (the global batch).
        learning_rate: peak AdamW learning rate, after the warm-up (cosine decay to 0).
        warmup_steps: linear warm-up steps (at most ``steps − 1``).
        weight_decay: AdamW's decoupled weight decay (weight matrices; not biases, norms
            or embeddings).
        val_fraction: share of the training images held out for early stopping (the
            parameters with the lowest validation NLL are kept); 0 = none, the last step's
            parameters. The codebook and the baseline are fitted on all training images.
        eval_every: steps between validation evaluations (also at the end).
        num_samples: images sampled per tokenisation (at most 16 are plotted).
        temperature: sampling temperature.
        seed: K-means, initialisation, batch order and sampling (the 80/20 split is fixed).
        log_every: steps between logged records (``metrics.jsonl``, the progress line).
        progress: show a progress bar.
        workdir: ``run.json``, ``pixels/`` and ``patches/`` (each training run: a checkpoint
            at the end, ``metrics.jsonl``), ``image_gpt_samples.png``, ``image_gpt.md`` and
            ``image_gpt.json``; ``None`` = nothing written.
        results_dir: also write the plot and ``image_gpt.md`` here; ``None`` = not.
    """

    tokens: tuple[Tokenisation, ...] = TOKENISATIONS
    pixel_codes: PosInt = 4
    patch_codes: PosInt = 32
    patch_size: PosInt = 2
    num_layers: PosInt = 2
    num_heads: PosInt = 4
    embed_dim: PosInt = 64
    dropout_rate: Fraction = 0.1
    steps: NonNegInt = 1500
    batch_size: PosInt = 64
    learning_rate: PosFloat = 3e-3
    warmup_steps: NonNegInt = 100
    weight_decay: NonNegFloat = 0.01
    val_fraction: Fraction = 0.1
    eval_every: NonNegInt = 100
    num_samples: PosInt = 32
    temperature: PosFloat = 1.0
    seed: int = 0
    log_every: PosInt = 250
    progress: bool = False
    workdir: str | None = "workdirs/image_gpt"
    results_dir: str | None = None


# smoke: 2×2 patches, a 1-layer d = 32 model, 200 steps (seconds); at this size the model
# already beats the independent-position baseline by ~5 bits/image on seeds 0–3 (the test).
PRESETS = {
    "smoke": {
        "tokens": ("patches",),
        "num_layers": 1,
        "num_heads": 2,
        "embed_dim": 32,
        "steps": 200,
        "warmup_steps": 20,
        "batch_size": 32,
        "eval_every": 50,
        "num_samples": 8,
        "log_every": 50,
    }
}


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


def tokenizer(kind: str, train_images: np.ndarray, cfg: Config) -> tuple[np.ndarray, int]:
    """``(codebook [K, p²], patch size)`` fitted by K-means on the training images."""
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


def train_lm(
    cfg: Any,
    splits: dict[str, dict[str, np.ndarray]],
    vocab: int,
    num_codes: int,
    par: Parallel,
    workdir: str | None,
    model_config: dict,
) -> tuple[TransformerLM, Any, dict]:
    """Train a :class:`TransformerLM` with the causal LM loss on the image codes of
    ``splits["train"]`` (arrays of :func:`lm_arrays`); early stopping on ``splits["val"]``.

    Codes are the ids ``0 … num_codes − 1`` of a vocabulary of ``vocab`` ids; an image
    position predicts a code, so every other id gets logit −∞ there (the NLL is over the
    ``K`` codes, as the baseline's). Every ``cfg.eval_every`` steps (and at the end) the
    validation NLL is measured and the parameters with the lowest are kept (early stopping;
    without a ``"val"`` split, the last ones). Returns the model, those parameters and a
    dict with ``test_bits_per_image`` (theirs), ``last_test_bits_per_image`` (the last
    step's), ``best_step``, ``val_curve`` ``[(step, val bits/image), …]``, ``first_loss``,
    ``last_loss``, ``params``, ``train_s``. ``cfg`` needs ``layers``, ``heads``,
    ``embed_dim``, ``dropout``, ``steps``, ``batch_size``, ``learning_rate``,
    ``warmup_steps``, ``weight_decay``, ``eval_every``, ``seed``, ``log_every`` and
    ``progress`` (as :class:`Config`).
    """
    train = splits["train"]
    length = train["inputs"].shape[1]
    model = TransformerLM(
        TransformerLMConfig(
            vocab_size=vocab,
            num_layers=cfg.num_layers,
            embed_dim=cfg.embed_dim,
            max_len=length + 1,
            tie_embeddings=False,
            block=gpt_block(cfg.num_heads, dropout_rate=cfg.dropout_rate),
        )
    )
    params = model.init(jax.random.PRNGKey(cfg.seed), jnp.zeros((1, length), jnp.int32))["params"]
    tx, schedule = make_optimizer(
        OptimizerConfig(
            "adamw",
            learning_rate=cfg.learning_rate,
            schedule="warmup_cosine",
            warmup_steps=min(cfg.warmup_steps, cfg.steps - 1),
            total_steps=max(cfg.steps, 1),
            weight_decay=cfg.weight_decay,
            clip_norm=1.0,
        )
    )
    state = par.shard_state(TrainState.create(params, tx, jax.random.PRNGKey(cfg.seed + 1)))
    not_code_V = jnp.arange(vocab) >= num_codes

    def code_logits(p: Any, inputs: Array, rng: Array | None = None) -> Array:
        logits = model.apply(
            {"params": p},
            inputs,
            deterministic=rng is None,
            rngs=None if rng is None else {"dropout": rng},
        )
        return jnp.where(not_code_V, -jnp.inf, logits)

    def loss_fn(p: Any, batch: dict, rng: Array) -> tuple[Array, dict]:
        logits = code_logits(p, batch["inputs"], rng if cfg.dropout_rate > 0 else None)
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
    eval_kwargs: dict[str, Any] = {}
    val = splits.get("val")
    if val is not None:
        per_image = float(val["mask"].sum()) / len(val["mask"])
        # one global batch, padded to split over the devices (padding rows: mask False)
        val_batch = pad_rows(val, par.batch_shards, {"mask": False})
        val_step = par.eval_step(nll_fn)

        def eval_and_keep(p: Any, batch: dict) -> dict:
            m = val_step(p, batch)
            loss = float(m["loss"])
            best["curve"].append(loss * per_image / np.log(2.0))
            if loss < best["loss"]:  # early stopping: keep the best parameters so far
                best.update(loss=loss, params=par.gather(p), index=len(best["curve"]) - 1)
            return m

        eval_kwargs = {"eval_step": eval_and_keep, "eval_data": [val_batch]}
    start = time.perf_counter()
    result = fit(
        state,
        par.train_step(loss_fn, schedule=schedule),
        ArrayIterator(
            train, par.local_batch_size(cfg.batch_size), seed=cfg.seed, **par.iterator_shard()
        ),
        FitConfig(
            num_steps=cfg.steps,
            log_every=cfg.log_every,
            eval_every=cfg.eval_every,
            checkpoint_every=0,
            best_metric=None,
            progress=cfg.progress,
            tensorboard=False,
            plot=False,
        ),
        workdir=workdir,
        model_config=model_config,
        parallel=par,
        **eval_kwargs,
    )
    last_params = par.gather(result.state.params)
    secs = time.perf_counter() - start
    eval_steps = [r["step"] for r in result.history if "eval/loss" in r]
    curve = list(zip(eval_steps, best["curve"])) if len(eval_steps) == len(best["curve"]) else []
    params = last_params if best["params"] is None else best["params"]
    best_step = (
        curve[best["index"]][0] if best["params"] is not None and curve else int(result.state.step)
    )
    test = splits["test"]
    history = [r for r in result.history if "loss" in r]
    return (
        model,
        params,
        {
            "test_bits_per_image": bits_per_image(params, test),
            "last_test_bits_per_image": bits_per_image(last_params, test),
            "best_step": int(best_step),
            "val_curve": [[int(s), float(b)] for s, b in curve],
            "train_s": secs,
            "params": count_params(params),
            "first_loss": history[0]["loss"] if history else float("nan"),
            "last_loss": history[-1]["loss"] if history else float("nan"),
        },
    )


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


def digit_splits(val_fraction: float) -> dict[str, dict[str, np.ndarray]]:
    """The scikit-learn digits (``x: [N, 8, 8]`` in [0, 1], ``y`` the digit) in a fixed
    80/20 ``train``/``test`` split (seed 0) and, when ``val_fraction > 0``, that fraction
    of ``train`` held out as ``val`` (seed 1; ``train`` keeps the rest, ``fit`` the
    whole 80%)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"`val_fraction` must lie in [0, 1); got {val_fraction}.")
    data = digits("rows")
    fit_rows, test = split_arrays({"x": data["inputs"], "y": data["labels"]}, 0.2, seed=0)
    out = {"fit": fit_rows, "train": fit_rows, "test": test}
    if val_fraction > 0:
        out["train"], out["val"] = split_arrays(fit_rows, val_fraction, seed=1)
    return out


def run(cfg: Config) -> dict:
    par = Parallel.from_options(cfg)
    par.check_batch_size(cfg.batch_size)
    t0 = time.perf_counter()
    write_run_info(par, cfg.workdir)
    data = digit_splits(cfg.val_fraction)
    runs, samples = [], {}
    for kind in cfg.tokens:
        codebook, patch = tokenizer(kind, data["fit"]["x"], cfg)
        vocab = len(codebook)
        tok = {name: encode(d["x"], codebook, patch) for name, d in data.items()}
        recon = decode(tok["test"], codebook, patch)
        start_id = vocab  # <start> is the last id
        splits = {
            name: lm_arrays(np.full((len(t), 1), start_id, np.int32), t)
            for name, t in tok.items()
            if name != "fit"
        }
        sub = None if cfg.workdir is None else os.path.join(cfg.workdir, kind)
        model, params, info = train_lm(
            cfg, splits, vocab + 1, vocab, par, sub, {"tokens": kind, "embed_dim": cfg.embed_dim}
        )
        length = tok["test"].shape[1]
        gen = generate(
            model,
            params,
            np.full((cfg.num_samples, 1), start_id, np.int32),
            vocab,
            length,
            cfg.temperature,
            cfg.seed,
        )
        samples[kind] = (
            decode(gen, codebook, patch),
            decode(tok["test"][: cfg.num_samples], codebook, patch),
        )
        info.update(
            {
                "tokens": kind,
                "codes": vocab,
                "sequence_length": int(length),
                "patch": patch,
                "reconstruction_rmse": float(np.sqrt(np.mean((recon - data["test"]["x"]) ** 2))),
                "independent_bits_per_image": independent_baseline(tok["fit"], tok["test"], vocab),
                "uniform_bits_per_image": float(length * np.log2(vocab)),
                "codebook": np.round(codebook, 3).tolist(),
            }
        )
        runs.append(info)
        print(
            f"{kind}: {vocab} codes × {length} tokens; test "
            f"{info['test_bits_per_image']:.1f} bits/image at step {info['best_step']} "
            f"(last step {info['last_test_bits_per_image']:.1f}; independent positions "
            f"{info['independent_bits_per_image']:.1f}, uniform "
            f"{info['uniform_bits_per_image']:.0f}); {info['train_s']:.0f}s"
        )
    wall = time.perf_counter() - t0
    summary = {
        "config": asdict(cfg),
        "runs": runs,
        "wall_s": wall,
        "n_train": int(len(data["train"]["x"])),
        "n_fit": int(len(data["fit"]["x"])),
        "n_val": int(len(data["val"]["x"])) if "val" in data else 0,
        "n_test": int(len(data["test"]["x"])),
        "parallel": par.describe(),
    }
    from seqjax.experiments._kit import command_line

    markdown = report(cfg, summary, command_line("image_gpt", cfg))
    print(markdown)
    write_results("image_gpt", cfg, markdown, summary,
                  plot=lambda folder: plot_samples(samples, folder))
    return summary


def main(argv: list[str] | None = None) -> dict:
    from seqjax.experiments._runner import experiment_main

    return experiment_main(__file__, argv)


if __name__ == "__main__":
    main()

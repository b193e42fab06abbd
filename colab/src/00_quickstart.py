# %% [markdown]
# # seqjax quickstart: a character-level GPT on Tiny Shakespeare
#
# <a href="https://colab.research.google.com/github/seqjax/seqjax/blob/main/colab/00_quickstart.ipynb" target="_parent"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open In Colab"/></a>
#
# Train a small GPT (`seqjax.models.gpt.TransformerLM`) on Tiny Shakespeare on every
# device of the runtime (all 8 TPU cores of a v2-8 or v5e-8, every GPU) with the
# library's `Parallel` layout, sharded train step and `fit` loop: a progress bar, a
# loss curve, samples, and a checkpoint that is saved, restored and resumed.
# The configuration is nanoGPT's `shakespeare_char` on a TPU or GPU and its CPU
# variant otherwise.

# %%
import os

import jax

from seqjax.utils import notebook_setup

SMOKE = notebook_setup()  # notebook_setup(smoke=True): tiny sizes, offline data
BACKEND, DEVICES = jax.default_backend(), jax.devices()  # "tpu", "gpu" or "cpu"

# %% [markdown]
# ## Data
#
# Characters are the tokens: the 65 distinct characters of the text, split 90/10 into training and validation as nanoGPT does.

# %%
import numpy as np

from seqjax.data import CharTokenizer, SpecialTokens, fetch_tiny_shakespeare, split_text

text = fetch_tiny_shakespeare(offline_sample=SMOKE)
if SMOKE:
    text = text[:20_000]
tok = CharTokenizer.from_text(text, SpecialTokens.none())
ids = np.asarray(tok.encode(text), np.int32)
train_ids, val_ids = split_text(ids, 0.9)
print(f"{len(text):,} characters, vocabulary of {tok.vocab_size}: "
      f"{''.join(tok.vocab)!r}")
print(f"{len(train_ids):,} training / {len(val_ids):,} validation characters")

# %% [markdown]
# ## Model and configuration
#
# `TransformerLM` is a decoder-only, pre-norm transformer with learned positions
# and a tied output matrix (Bishop §12.3.1; J&M §9.8). The presets are nanoGPT's
# shapes; `BATCH` is the *global* batch (all devices together), rounded up to a
# multiple of the number of devices so that it splits evenly over them.

# %%
import dataclasses

import jax.numpy as jnp

from seqjax.models.gpt import TRANSFORMER_LM_PRESETS, TransformerLM, TransformerLMConfig, gpt_block
from seqjax.utils import count_params

if SMOKE:
    cfg = TransformerLMConfig(vocab_size=tok.vocab_size, num_layers=1, embed_dim=16,
                              block_size=16, block=gpt_block(2, use_bias=False))
    STEPS, BATCH, LR, WARMUP, EVAL_EVERY, EVAL_BATCHES = 2, 2, 1e-3, 1, 2, 1
elif BACKEND == "cpu":  # nanoGPT's README CPU run: 4 layers, 128 wide, block 64
    cfg = TRANSFORMER_LM_PRESETS["nanogpt-cpu"].replace(vocab_size=tok.vocab_size)
    STEPS, BATCH, LR, WARMUP, EVAL_EVERY, EVAL_BATCHES = 1000, 12, 1e-3, 100, 200, 20
else:  # nanoGPT's train_shakespeare_char: 6 layers, 384 wide, block 256
    cfg = TRANSFORMER_LM_PRESETS["nanogpt-shakespeare-char"].replace(
        vocab_size=tok.vocab_size)
    STEPS, BATCH, LR, WARMUP, EVAL_EVERY, EVAL_BATCHES = 5000, 64, 1e-3, 100, 500, 50
N_DEV = jax.device_count()
BATCH = -(-BATCH // N_DEV) * N_DEV  # a multiple of the device count
COMPUTE = jnp.bfloat16 if BACKEND in ("tpu", "gpu") else None  # mixed precision

model = TransformerLM(cfg, dtype=COMPUTE)
print(cfg)
print(f"{STEPS} steps of {BATCH} x {cfg.block_size} characters, compute dtype {COMPUTE}")

# %% [markdown]
# ## Every device: `Parallel` and the sharded train step
#
# `Parallel.create()` lays the run over *all* the devices JAX sees (and every host
# of a multi-host job): a device `Mesh` with axes `("data", "fsdp", "model")`, here
# every device on `data` — data parallelism: each device gets a slice of the global
# batch, the parameters are replicated, and one `jax.jit` step averages the
# gradients over the devices. `MESH = "fsdp=8"` on a TPU v2-8 / v5e-8 shards the
# parameters and optimiser state too (ZeRO-3); nothing else changes.
# `par.create_state` builds the state directly in its sharded layout, and
# `par.train_step` / `par.eval_step` compile the steps for the mesh.

# %%
from seqjax.train import (
    OptimizerConfig,
    Parallel,
    flax_apply_fn,
    make_lm_eval,
    make_lm_loss,
    make_optimizer,
)

MESH = ""  # "" = every device on `data`; e.g. "fsdp=8" or "data=4,fsdp=2"
par = Parallel.create(MESH)
par.check_batch_size(BATCH)
print(par)
print(f"training on {par.num_devices} x {DEVICES[0].device_kind}:",
      [str(d) for d in par.mesh.devices.flat])

tx, schedule = make_optimizer(OptimizerConfig(
    name="adamw", learning_rate=LR, schedule="warmup_cosine", warmup_steps=WARMUP,
    steps=STEPS, min_lr_ratio=0.1, beta2=0.99, weight_decay=0.1, clip_norm=1.0))
x0 = jnp.zeros((1, cfg.block_size), jnp.int32)
state = par.create_state(lambda rng: model.init(rng, x0)["params"], tx,
                         jax.random.PRNGKey(0))
print(f"{count_params(state.params):,} parameters")

apply_fn = flax_apply_fn(model)
train_step = par.train_step(make_lm_loss(apply_fn), schedule=schedule,
                            compute_dtype=COMPUTE)
eval_step = par.eval_step(make_lm_eval(apply_fn), compute_dtype=COMPUTE)

# %% [markdown]
# ## Train with `fit`
#
# `fit` runs the steps with a progress bar (loss, tokens/s, ETA), evaluates every
# `eval_every` steps, and keeps orbax checkpoints in `WORKDIR/checkpoints`
# (with the model config and the tokenizer), and `run.json` records the devices
# and the mesh. Interrupting the cell saves a checkpoint and returns; running it
# again resumes from the newest checkpoint. Batches are random windows of the
# training text (nanoGPT's sampler): the iterator yields this process's rows of each
# global batch (all of them on a single-host runtime) and `fit(parallel=par)`
# splits them over the devices; the evaluation batches are whole global batches.

# %%
import json
import tempfile

from seqjax.data import LMWindowIterator
from seqjax.train import FitConfig, fit

WORKDIR = tempfile.mkdtemp(prefix="seqjax_quickstart_") if SMOKE else "workdirs/quickstart"

train_data = LMWindowIterator(train_ids, par.local_batch_size(BATCH), cfg.block_size, seed=0,
                              **par.host_rows())
val_windows = LMWindowIterator(val_ids, BATCH, cfg.block_size, seed=1)
# the config as JSON, saved with each checkpoint (its initialisers and dtypes are code: None)
MODEL_CONFIG = json.loads(json.dumps(dataclasses.asdict(cfg), default=lambda v: None))
eval_batches = [next(val_windows) for _ in range(EVAL_BATCHES)]

result = fit(
    state, train_step, train_data,
    FitConfig(steps=STEPS, log_every=1 if SMOKE else 50, eval_every=EVAL_EVERY,
              tensorboard=False, plot=False),
    parallel=par, workdir=WORKDIR, eval_step=eval_step, eval_data=eval_batches,
    model_config=MODEL_CONFIG, tokenizer=tok.to_json(),
)
with open(os.path.join(WORKDIR, "run.json")) as f:
    print("run.json:", json.load(f))
print(result.status, "at step", int(result.state.step), "| validation:",
      {k: round(v, 4) for k, v in result.eval_metrics.items()})

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

from seqjax.train import read_metrics

records = read_metrics(os.path.join(WORKDIR, "metrics.jsonl"))  # this run and earlier ones
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot([r["step"] for r in records], [r["loss"] for r in records], label="train")
evals = [r for r in records if "eval/loss" in r]
ax.plot([r["step"] for r in evals], [r["eval/loss"] for r in evals], "o-",
        label="validation")
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy (nats / character)")
ax.grid(alpha=0.3)
ax.legend()
plt.show()

# %% [markdown]
# ## Sample
#
# `seqjax.decoding.sample` runs the whole generation loop inside one `jax.jit`
# with a KV cache per layer: temperature 0.8 and the 20 most probable characters
# (Bishop (12.35)). With learned positions the model sees at most `block_size`
# characters, so it writes `block_size - 1` after the one-character prompt.
# `par.gather` copies the (possibly sharded) trained parameters to the host.

# %%
from seqjax.decoding import sample

host_params = par.gather(result.state.params)  # numpy copies, on every process
prompt = jnp.asarray([tok.encode("\n")] * 3, jnp.int32)
out = sample(model, host_params, prompt, key=jax.random.PRNGKey(1),
             max_new_tokens=cfg.block_size - 1, temperature=0.8, top_k=20)
for row in np.asarray(out.tokens):
    print(tok.decode(row))
    print("-" * 40)

# %% [markdown]
# ## Restore the checkpoint, and resume
#
# `restore_params` reads the parameters alone, for inference (here into the
# layout of `target`; without it, onto one device). The model config and the
# tokenizer were saved next to them. Calling `fit` again in the same work dir
# with more steps restores the full state (parameters, optimiser, RNG, data
# position) and continues where training stopped.

# %%
from seqjax.train import evaluate, load_meta, load_tokenizer_json, restore_params

ckpt_dir = os.path.join(WORKDIR, "checkpoints")
meta = load_meta(ckpt_dir)
print("newest checkpoint: step", meta["step"], "| metrics:",
      {k: round(v, 4) for k, v in meta["metrics"].items() if isinstance(v, float)})
saved = load_tokenizer_json(ckpt_dir)
tok2 = CharTokenizer(saved["vocab"], SpecialTokens(**saved["special_tokens"]))
assert meta["model_config"] == MODEL_CONFIG and tok2.vocab == tok.vocab

params2 = restore_params(ckpt_dir, target=result.state.params)
same = all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(params2),
                                                jax.tree_util.tree_leaves(result.state.params)))
print("restored parameters equal the trained ones:", same)
print("validation loss of the restored parameters:",
      round(evaluate(eval_step, params2, eval_batches,
                     place_batch=par.place_global)["loss"], 4))
assert same

# %%
MORE = 1 if SMOKE else 500
fresh_data = LMWindowIterator(train_ids, par.local_batch_size(BATCH), cfg.block_size,
                              seed=0, **par.host_rows())  # position: from the checkpoint
resumed = fit(
    result.state, train_step, fresh_data,  # result.state is only the template
    FitConfig(steps=STEPS + MORE, log_every=1 if SMOKE else 50,
              eval_every=EVAL_EVERY, tensorboard=False, plot=False),
    parallel=par, workdir=WORKDIR, eval_step=eval_step, eval_data=eval_batches,
    model_config=MODEL_CONFIG, tokenizer=tok.to_json(),
)
print(f"resumed from step {resumed.start_step}, now at step {int(resumed.state.step)}")
assert resumed.start_step >= STEPS  # (more than STEPS when the notebook is run again)

# %% [markdown]
# ## Next
#
# * `01_rnns_from_the_equations`: the recurrent cells, BPTT and vanishing gradients.
# * `03_transformers`: the GPT built from its blocks, the KV cache and sampling.
# * The same run from a terminal: `python -m seqjax.experiments.char_lm` (and `--preset gpu`).

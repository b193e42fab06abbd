# %% [markdown]
# # Encoders: BERT's masked-language-model pre-training and a ViT
#
# <a href="https://colab.research.google.com/github/seqjax/seqjax/blob/main/colab/04_bert_and_vit.ipynb" target="_parent"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open In Colab"/></a>
#
# Two bidirectional transformer encoders (Bishop §12.3.3 and §12.4.1). A small
# character-level BERT (`seqjax.models.bert.Bert`) pre-trained on Tiny Shakespeare
# with the masked-language-model objective fills in hidden characters; a vision
# transformer (`seqjax.models.vit.ViT`) reads scikit-learn's 8×8 handwritten digits
# as sequences of patches.

# %%
import jax

from seqjax.utils import notebook_setup

SMOKE = notebook_setup()  # notebook_setup(smoke=True): tiny sizes, offline data
BACKEND, DEVICES = jax.default_backend(), jax.devices()  # "tpu", "gpu" or "cpu"

# %% [markdown]
# ## Masked-language-model pre-training
#
# BERT sees the whole sequence at once (no causal mask) and is trained to recover
# corrupted tokens: 15% of the positions are selected; a selected token becomes
# `<mask>` 80% of the time, a random token 10% of the time, and stays 10% of the time
# (`mlm_mask`, Bishop §12.3.3). The loss is taken at the selected positions only.
# Here the tokens are characters and a sequence is `<cls>` followed by a window of
# the text.

# %%
import jax.numpy as jnp
import numpy as np

from seqjax.data import (
    CharTokenizer,
    LMWindowIterator,
    SpecialTokens,
    fetch_tiny_shakespeare,
    split_text,
)
from seqjax.models.bert import Bert, BertConfig, bert_block, mlm_mask
from seqjax.train import (
    FitConfig,
    OptimizerConfig,
    Parallel,
    TrainState,
    fit,
    make_optimizer,
    masked_cross_entropy,
    token_accuracy,
)
from seqjax.utils import count_params

# Both models train on every device: all of them on the `data` axis of a mesh,
# each taking a slice of every global batch (a multiple of the device count).
par = Parallel.create()
print(par)
print(f"training on {par.num_devices} x {DEVICES[0].device_kind}")


def global_batch(n):
    """``n`` rounded up to a multiple of the devices the batch is split over."""
    return -(-n // par.batch_shards) * par.batch_shards


text = fetch_tiny_shakespeare(offline_sample=SMOKE)
if SMOKE:
    text = text[:20_000]
tok = CharTokenizer.from_text(text, SpecialTokens(bos=None, eos=None, sep=None))
CLS, MASK = tok.cls_id, tok.mask_id
train_ids, val_ids = split_text(np.asarray(tok.encode(text), np.int32), 0.9)

if SMOKE:
    WINDOW, STEPS, BATCH = 16, 2, 8
    bert_cfg = BertConfig(vocab_size=tok.vocab_size, num_layers=1, embed_dim=16,
                          block=bert_block(2, mlp_dim=32), block_size=WINDOW + 1,
                          type_vocab_size=0, pooler=False)
else:
    WINDOW, STEPS, BATCH = 64, 3000 if BACKEND != "cpu" else 1000, 64
    bert_cfg = BertConfig(vocab_size=tok.vocab_size, num_layers=4, embed_dim=128,
                          block=bert_block(4, mlp_dim=512, dropout_rate=0.1),
                          block_size=WINDOW + 1, type_vocab_size=0, pooler=False)
BATCH = global_batch(BATCH)
bert = Bert(bert_cfg)


def with_cls(batch):
    """``<cls>`` + a window of characters (the window iterator's inputs)."""
    x = batch["inputs"]
    return {"tokens": np.concatenate([np.full((len(x), 1), CLS, x.dtype), x], axis=1)}


def corrupt(key, tokens):
    return mlm_mask(key, tokens, vocab_size=tok.vocab_size, mask_id=MASK,
                    maskable_BxT=tokens != CLS)


def mlm_loss(params, batch, rng):
    mask_key, drop_key = jax.random.split(rng)
    inputs, selected = corrupt(mask_key, batch["tokens"])
    logits = bert.apply({"params": params}, inputs, deterministic=False,
                        rngs={"dropout": drop_key})["mlm_logits"]
    loss = masked_cross_entropy(logits, batch["tokens"], selected)
    return loss, {"accuracy": token_accuracy(logits, batch["tokens"], selected),
                  "tokens": jnp.sum(selected)}


# %%
example = with_cls(next(LMWindowIterator(train_ids, BATCH, WINDOW, seed=0)))
params = jax.jit(bert.init)(jax.random.PRNGKey(0), example["tokens"])["params"]
print(f"BERT: {count_params(params):,} parameters")
tx, schedule = make_optimizer(OptimizerConfig(
    name="adamw", learning_rate=1e-3, schedule="warmup_cosine", warmup_steps=1 if SMOKE else 200,
    steps=STEPS, weight_decay=0.01, clip_norm=1.0))
state = par.shard_state(TrainState.create(params, tx, jax.random.PRNGKey(1)))
data = map(with_cls, LMWindowIterator(train_ids, par.local_batch_size(BATCH), WINDOW,
                                      seed=1, **par.host_rows()))
bert_run = fit(state, par.train_step(mlm_loss, schedule=schedule), data,
               FitConfig(steps=STEPS, log_every=1 if SMOKE else 100,
                         tensorboard=False, plot=False),
               parallel=par)
bert_params = par.gather(bert_run.state.params)  # host copies for what follows


# %% [markdown]
# **Fill in the blanks.** Validation windows with every character selected by the
# corruption replaced by `<mask>`; the model's guesses at those positions, against
# always guessing the most frequent character.

# %%
@jax.jit
def fill_in(params, tokens, key):
    inputs, selected = mlm_mask(key, tokens, vocab_size=tok.vocab_size, mask_id=MASK,
                                maskable_BxT=tokens != CLS, mask_rate=1.0, random_rate=0.0)
    logits = bert.apply({"params": params}, inputs)["mlm_logits"]
    return inputs, selected, jnp.argmax(logits, -1)


val = with_cls(next(LMWindowIterator(val_ids, BATCH, WINDOW, seed=2)))["tokens"]
inputs, selected, guess = map(np.asarray, fill_in(bert_params, val,
                                                  jax.random.PRNGKey(3)))
frequent = np.bincount(train_ids, minlength=tok.vocab_size).argmax()
acc = (guess == val)[selected].mean() if selected.any() else float("nan")
base = (val == frequent)[selected].mean() if selected.any() else float("nan")
print(f"masked characters recovered: {100 * acc:.1f}% (most frequent character: "
      f"{100 * base:.1f}%)\n")
show = lambda ids: "".join("_" if i == MASK else tok.vocab[i] for i in ids[1:])
for row in range(min(3, BATCH)):
    print("masked :", repr(show(inputs[row])))
    print("guessed:", repr(show(np.where(selected[row], guess[row], val[row]))))
    print("truth  :", repr(show(val[row])), "\n")

# %% [markdown]
# ## A vision transformer on handwritten digits
#
# An image $x\in\mathbb R^{H\times W\times C}$ becomes $N = HW/P^2$ flattened
# $P\times P$ patches, each linearly embedded; a learned `<class>` token is
# prepended, learned positions are added, and the class token's final state is
# classified (Bishop §12.4.1, Fig. 12.22). The digits are 8×8, so 2×2 patches give
# a sequence of 16 tokens.

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

from seqjax.data import digits
from seqjax.models.vit import ViT, ViTConfig, patchify, vit_block

d = digits("images")  # float32[1797, 8, 8, 1] in [0, 1], labels int32[1797]
order = np.random.default_rng(0).permutation(len(d["labels"]))
n_test = len(order) // 5
test = {k: v[order[:n_test]] for k, v in d.items()}
train = {k: v[order[n_test:]] for k, v in d.items()}
PATCH = 2
patches = np.asarray(patchify(train["inputs"][:1], PATCH))[0]  # [16, 4]

fig, axes = plt.subplots(1, 2, figsize=(6, 2.6), gridspec_kw={"width_ratios": [1, 2]})
axes[0].imshow(train["inputs"][0, :, :, 0], cmap="Greys")
axes[0].set_title(f"label {train['labels'][0]}")
for k in range(0, 8, PATCH):
    axes[0].axhline(k - 0.5, color="tab:red", lw=0.8)
    axes[0].axvline(k - 0.5, color="tab:red", lw=0.8)
axes[1].imshow(patches.T, cmap="Greys", aspect="auto")
axes[1].set_title(f"{len(patches)} patch tokens of {PATCH}x{PATCH} pixels")
axes[1].set_xlabel("token")
plt.show()

# %%
from seqjax.data import ArrayIterator

if SMOKE:
    vit_cfg = ViTConfig(image_size=8, patch_size=PATCH, channels=1, num_classes=10,
                        num_layers=1, embed_dim=16, block=vit_block(2, mlp_dim=32))
    VIT_STEPS, VIT_BATCH = 2, 16
else:
    vit_cfg = ViTConfig(image_size=8, patch_size=PATCH, channels=1, num_classes=10,
                        num_layers=4, embed_dim=64,
                        block=vit_block(4, mlp_dim=128, dropout_rate=0.1))
    VIT_STEPS, VIT_BATCH = 1500, 64
VIT_BATCH = global_batch(VIT_BATCH)
vit = ViT(vit_cfg)
vit_params = jax.jit(vit.init)(jax.random.PRNGKey(0), train["inputs"][:1])["params"]
print(f"ViT: {count_params(vit_params):,} parameters")


def vit_loss(params, batch, rng):
    logits = vit.apply({"params": params}, batch["inputs"], deterministic=False,
                       rngs={"dropout": rng})
    loss = masked_cross_entropy(logits, batch["labels"])
    return loss, {"accuracy": token_accuracy(logits, batch["labels"])}


tx, schedule = make_optimizer(OptimizerConfig(
    name="adamw", learning_rate=1e-3, schedule="warmup_cosine", warmup_steps=1 if SMOKE else 100,
    steps=VIT_STEPS, weight_decay=0.05, clip_norm=1.0))
vit_state = par.shard_state(TrainState.create(vit_params, tx, jax.random.PRNGKey(1)))
vit_run = fit(vit_state, par.train_step(vit_loss, schedule=schedule),
              ArrayIterator(train, par.local_batch_size(VIT_BATCH), seed=0,
                            **par.host_rows()),
              FitConfig(steps=VIT_STEPS, log_every=1 if SMOKE else 100,
                        tensorboard=False, plot=False),
              parallel=par)

predict = jax.jit(lambda p, x: jnp.argmax(vit.apply({"params": p}, x), -1))
pred = np.asarray(predict(par.gather(vit_run.state.params), test["inputs"]))
print(f"test accuracy: {100 * np.mean(pred == test['labels']):.1f}% on {n_test} digits")

# %%
fig, axes = plt.subplots(2, 8, figsize=(9, 2.8))
for ax, img, y, p in zip(axes.flat, test["inputs"], test["labels"], pred):
    ax.imshow(img[:, :, 0], cmap="Greys")
    ax.set_title(f"{p}" + ("" if p == y else f" ({y})"), color="k" if p == y else "tab:red",
                 fontsize=9)
    ax.axis("off")
fig.suptitle("ViT predictions on held-out digits (truth in brackets when wrong)", fontsize=9)
plt.show()

fig, ax = plt.subplots(figsize=(6, 3))
for label, run in (("BERT (MLM)", bert_run), ("ViT", vit_run)):
    ax.plot([r["step"] for r in run.history], [r["loss"] for r in run.history], label=label)
ax.set_xlabel("step")
ax.set_ylabel("training loss")
ax.set_yscale("log")
ax.grid(alpha=0.3)
ax.legend()
plt.show()

# %% [markdown]
# Next: fine-tune the pre-trained encoder for classification (`BertConfig(num_classes=...)`
# uses the `<cls>` state), or load real BERT weights with `seqjax.interop`.
# `python -m seqjax.experiments.bert_mlm` and `python -m seqjax.experiments.digits` are the
# scripted versions.

# %% [markdown]
# # Sequence to sequence, with and without attention
#
# <a href="https://colab.research.google.com/github/seqjax/seqjax/blob/main/colab/02_seq2seq_attention.ipynb" target="_parent"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open In Colab"/></a>
#
# English number names to French ("ninety-seven" → "quatre-vingt-dix-sept") with
# the RNN encoder–decoder `seqjax.models.seq2seq.Seq2Seq`: once with the fixed
# context vector of Sutskever et al. (MEDL Fig. 7.9(a)) and once with Bahdanau's
# additive attention (MEDL (7.20)–(7.22), Fig. 7.10). French counts in twenties
# from 60 to 99, so the model has to learn a real alignment; the attention
# heatmaps show it (MEDL Fig. 7.11).

# %%
import jax

from seqjax.utils import notebook_setup

SMOKE = notebook_setup()  # notebook_setup(smoke=True): tiny sizes, offline data
BACKEND, DEVICES = jax.default_backend(), jax.devices()  # "tpu", "gpu" or "cpu"

# %% [markdown]
# ## Data
#
# `number_names` writes the numbers with `num2words`; words, hyphens and commas are the tokens. A seeded fifth of the numbers is held out.

# %%
import jax.numpy as jnp
import numpy as np

from seqjax.data import SpecialTokens, WordTokenizer, number_names

MAX_NUMBER = 64 if SMOKE else 1000
ds = number_names(range(MAX_NUMBER))
numbers, english, french = list(ds["number"]), list(ds["src"]), list(ds["tgt"])

SPECIALS = SpecialTokens(mask=None, sep=None, cls=None)  # <pad> <unk> <bos> <eos>
src_tok = WordTokenizer.from_texts(english, special_tokens=SPECIALS)
tgt_tok = WordTokenizer.from_texts(french, special_tokens=SPECIALS)
PAD, BOS, EOS = tgt_tok.pad_id, tgt_tok.bos_id, tgt_tok.eos_id
SRC_LEN = max(len(src_tok.encode(s)) for s in english)
TGT_LEN = max(len(tgt_tok.encode(t)) for t in french) + 1  # + <eos>


def encode(rows):
    """Fixed-shape arrays for teacher forcing: tgt_in = <bos> y, tgt_out = y <eos>."""
    n = len(rows)
    out = {"src": np.full((n, SRC_LEN), PAD, np.int32), "src_lengths": np.zeros(n, np.int32),
           "tgt_in": np.full((n, TGT_LEN), PAD, np.int32),
           "tgt_out": np.full((n, TGT_LEN), PAD, np.int32),
           "mask": np.zeros((n, TGT_LEN), bool)}
    for i, r in enumerate(rows):
        s, t = src_tok.encode(english[r]), tgt_tok.encode(french[r])
        out["src"][i, :len(s)], out["src_lengths"][i] = s, len(s)
        out["tgt_in"][i, :len(t) + 1] = [BOS, *t]
        out["tgt_out"][i, :len(t) + 1] = [*t, EOS]
        out["mask"][i, :len(t) + 1] = True
    return out


order = np.random.default_rng(0).permutation(MAX_NUMBER)
test_rows, train_rows = np.sort(order[:MAX_NUMBER // 5]), np.sort(order[MAX_NUMBER // 5:])
train, test = encode(train_rows), encode(test_rows)
print(f"{len(train_rows)} training and {len(test_rows)} held-out numbers; vocabularies "
      f"{src_tok.vocab_size} (en) and {tgt_tok.vocab_size} (fr)")
print(english[97 % MAX_NUMBER], "->", tgt_tok.split(french[97 % MAX_NUMBER]))

# %% [markdown]
# ## Two models
#
# Both read the source with a GRU and write the target with a GRU decoder trained by
# teacher forcing (MEDL §7.4). Without attention the encoder's last state $z^*$ is
# all the decoder gets; with attention every decoder step builds its own context
# $u^{\langle t\rangle}=\sum_\tau\alpha^{\langle t\rangle}_\tau v^{\langle\tau\rangle}$ from the
# (bidirectional) encoder outputs, with additive scores
# $\alpha^{\langle t\rangle}=\mathrm{softmax}_\tau\, w^\top\tanh(W_a s^{\langle t-1\rangle}+W_b v^{\langle\tau\rangle})$.

# %%
from seqjax.models import RNNConfig, Seq2Seq, Seq2SeqConfig
from seqjax.utils import count_params

EMBED, HIDDEN = (8, 8) if SMOKE else (32, 64)
STEPS, BATCH, LR = (2, 16, 5e-3) if SMOKE else (2000, 64, 5e-3)  # BATCH: the global batch
encoder = RNNConfig(vocab_size=src_tok.vocab_size, embed_dim=EMBED, hidden_size=HIDDEN,
                    cell_type="gru")
models = {
    "no attention": Seq2Seq(Seq2SeqConfig(encoder=encoder, tgt_vocab_size=tgt_tok.vocab_size,
                                          context="initial_state")),
    "attention": Seq2Seq(Seq2SeqConfig(encoder=encoder.replace(bidirectional=True),
                                       tgt_vocab_size=tgt_tok.vocab_size,
                                       context="attention", attention="bahdanau")),
}

# %% [markdown]
# ## Train
#
# The same `Parallel` layout, sharded train step and `fit` loop as the quickstart, on every device of the runtime (each device takes a slice of the global batch), here without a work dir (nothing is written). `par.gather` brings the trained parameters back to the host for decoding.

# %%
from seqjax.data import ArrayIterator
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

par = Parallel.create()  # every device on `data`
BATCH = -(-BATCH // par.batch_shards) * par.batch_shards  # a multiple of the devices
print(par)
print(f"training on {par.num_devices} x {DEVICES[0].device_kind}, global batch {BATCH}")


def make_loss(model):
    def loss_fn(params, batch, rng):
        logits = model.apply({"params": params}, batch["src"], batch["tgt_in"],
                             batch["src_lengths"])
        loss = masked_cross_entropy(logits, batch["tgt_out"], batch["mask"])
        return loss, {"accuracy": token_accuracy(logits, batch["tgt_out"], batch["mask"]),
                      "tokens": jnp.sum(batch["mask"])}
    return loss_fn


trained, histories = {}, {}
for name, model in models.items():
    params = jax.jit(model.init)(jax.random.PRNGKey(0), train["src"][:1],
                                 train["tgt_in"][:1])["params"]
    tx, schedule = make_optimizer(OptimizerConfig(
        name="adam", learning_rate=LR, schedule="warmup_cosine", warmup_steps=1 if SMOKE else 100,
        steps=STEPS, clip_norm=1.0))
    print(f"{name}: {count_params(params):,} parameters")
    state = par.shard_state(TrainState.create(params, tx, jax.random.PRNGKey(1)))
    result = fit(state, par.train_step(make_loss(model), schedule=schedule),
                 ArrayIterator(train, par.local_batch_size(BATCH), seed=0,
                               **par.host_rows()),
                 FitConfig(steps=STEPS, log_every=1 if SMOKE else 50,
                           tensorboard=False, plot=False),
                 parallel=par)
    trained[name], histories[name] = par.gather(result.state.params), result.history

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, hist in histories.items():
    ax.plot([r["step"] for r in hist], [r["loss"] for r in hist], label=name)
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy per target token")
ax.set_yscale("log")
ax.grid(alpha=0.3)
ax.legend()
plt.show()

# %% [markdown]
# ## Translate the held-out numbers
#
# Greedy decoding (`seqjax.decoding.greedy_search`, one compiled loop): the source is
# passed to the model's `init_decode_state` through `inputs`, the prompt is `<bos>`,
# and generation stops at `<eos>`. A translation counts when the whole French
# name is right.

# %%
from seqjax.decoding import greedy_search

SHOW = [n for n in (97, 71, 80, 21) if n < MAX_NUMBER][:3]  # for the heatmaps below
eval_rows = np.concatenate([test_rows, SHOW])  # one batch, one compiled loop per model
evaluation = encode(eval_rows)


def detok(ids):
    ids = list(ids)
    ids = ids[:ids.index(EOS)] if EOS in ids else ids
    return tgt_tok.decode(ids, skip_special=True).replace(" - ", "-").replace(" ,", ",")


decoded, translations = {}, {}
for name, model in models.items():
    out = greedy_search(model, trained[name], jnp.full((len(eval_rows), 1), BOS, jnp.int32),
                        max_new_tokens=TGT_LEN, eos_id=EOS, pad_id=PAD,
                        inputs={"src": evaluation["src"],
                                "src_lengths": evaluation["src_lengths"]})
    decoded[name] = np.asarray(out.tokens)
    translations[name] = [detok(row) for row in decoded[name][:len(test_rows)]]
    exact = np.mean([t == french[r] for t, r in zip(translations[name], test_rows)])
    print(f"{name:>12}: exact match on held-out numbers {100 * exact:.1f}%")
for i in range(min(6, len(test_rows))):
    r = test_rows[i]
    print(f"{numbers[r]:>4} {english[r]!r:28} -> " +
          " | ".join(f"{name}: {translations[name][i]!r}" for name in models))
wrong = [numbers[r] for t, r in zip(translations["attention"], test_rows) if t != french[r]]
print(f"\nheld-out numbers the attention model gets wrong ({len(wrong)}):", wrong[:20])

# %% [markdown]
# ## Where the decoder looks
#
# Teacher-forcing the attention model on its own translation with
# `method="with_weights"` gives $\alpha^{\langle t\rangle}$ for every output word
# (rows) over the source words (columns); each row sums to 1. For 97 the French
# words "quatre", "vingt" and "dix" should look at "ninety" and "sept" at "seven".

# %%
att_model, att_params = models["attention"], trained["attention"]
rows = encode(SHOW)
generated = decoded["attention"][len(test_rows):]
tgt_in = np.full((len(SHOW), TGT_LEN), PAD, np.int32)
tgt_in[:, 0] = BOS
tgt_in[:, 1:] = generated[:, :TGT_LEN - 1]
_, alpha = jax.jit(lambda p, s, t, n: att_model.apply({"params": p}, s, t, n,
                                                        method="with_weights"))(
    att_params, rows["src"], tgt_in, rows["src_lengths"])
alpha = np.asarray(alpha)
assert np.allclose(alpha.sum(-1), 1.0, atol=1e-5)  # softmax rows

fig, axes = plt.subplots(1, len(SHOW), figsize=(4.2 * len(SHOW), 3.8), squeeze=False)
for ax, n, a, gen in zip(axes[0], SHOW, alpha, generated):
    src_words = src_tok.split(english[n])
    gen = list(gen)
    n_out = gen.index(EOS) + 1 if EOS in gen else len(gen)
    out_words = [tgt_tok.id_to_token(int(i)) for i in gen[:n_out]]
    ax.imshow(a[:n_out, :len(src_words)], cmap="Greys", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(src_words)), src_words, rotation=45, ha="right")
    ax.set_yticks(range(n_out), out_words)
    ax.set_title(f"{n}: {english[n]}", fontsize=9)
    print(f"{n}: " + ", ".join(f"{w} <- {src_words[j]}" for w, j in
                               zip(out_words, a[:n_out, :len(src_words)].argmax(-1))))
fig.tight_layout()
plt.show()

# %% [markdown]
# Without attention the whole source has to squeeze through one vector; the
# attention model's errors concentrate where French reorders or regroups
# (70–99). More: `python -m seqjax.experiments.numbers` (0–9999, the transformer too), and
# `seqjax.data.english_french()` for the Tatoeba sentence pairs
# (`python -m seqjax.experiments.translation`).

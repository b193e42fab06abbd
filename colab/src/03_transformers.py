# %% [markdown]
# # Transformers: a GPT from its blocks, the KV cache, sampling
#
# <a href="https://colab.research.google.com/github/seqjax/seqjax/blob/main/colab/03_transformers.ipynb" target="_parent"><img src="https://colab.research.google.com/assets/colab-badge.svg" alt="Open In Colab"/></a>
#
# A decoder-only transformer assembled from `seqjax.nn` blocks and checked against
# the library's `TransformerLM`; a short training run on Tiny Shakespeare; cached
# decoding checked against the full causal pass; and the sampling strategies of
# Bishop §12.3.2 side by side: greedy, temperature, top-k, nucleus and beam search.

# %%
import jax

from seqjax.utils import notebook_setup

SMOKE = notebook_setup()  # notebook_setup(smoke=True): tiny sizes, offline data
BACKEND, DEVICES = jax.default_backend(), jax.devices()  # "tpu", "gpu" or "cpu"

# %%
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from seqjax.data import CharTokenizer, SpecialTokens, fetch_tiny_shakespeare, split_text

jax.config.update("jax_default_matmul_precision", "highest")  # exact comparisons on TPU

text = fetch_tiny_shakespeare(offline_sample=SMOKE)
if SMOKE:
    text = text[:20_000]
tok = CharTokenizer.from_text(text, SpecialTokens.none())
train_ids, val_ids = split_text(np.asarray(tok.encode(text), np.int32), 0.9)
print(f"{len(text):,} characters, vocabulary of {tok.vocab_size}")

# %% [markdown]
# ## A GPT from blocks
#
# Bishop §12.3.1 and J&M §9.8: token embeddings plus learned positions, a stack of
# causal pre-norm blocks
# $Z = X + \mathrm{MHA}(\mathrm{LN}(X))$, $\tilde X = Z + \mathrm{MLP}(\mathrm{LN}(Z))$
# (Bishop (12.21), (12.23)), a final LayerNorm and the tied output matrix $E^\top$.
# `TransformerBlock`'s parameter tree is the one `TransformerLM` keeps under
# `decoder/layers_i`, so the weights carry over and the logits must agree.

# %%
from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.nn import BlockConfig, LayerNorm, LearnedPositionalEmbedding, TransformerBlock
from seqjax.utils import count_params


class BlockGPT(nn.Module):
    vocab_size: int
    num_layers: int
    num_heads: int
    embed_dim: int
    block_size: int

    @nn.compact
    def __call__(self, tokens_BxT):
        init = nn.initializers.normal(stddev=0.02)
        embed = nn.Embed(self.vocab_size, self.embed_dim, embedding_init=init,
                         name="token_embed")
        x_BxTxD = LearnedPositionalEmbedding(self.block_size, name="pos_embed")(
            embed(tokens_BxT))                       # E[x_n] + P_n
        block = BlockConfig.decoder(self.num_heads, cross_attention=False)  # causal, pre-norm
        for i in range(self.num_layers):
            x_BxTxD = TransformerBlock(block, name=f"block_{i}")(x_BxTxD)
        return embed.attend(LayerNorm(name="final_norm")(x_BxTxD))  # logits = h E^T


if SMOKE:
    L, H, D, BLOCK = 1, 2, 16, 16
else:
    L, H, D, BLOCK = 4, 4, 128, 64
gpt = BlockGPT(tok.vocab_size, L, H, D, BLOCK)
lm = TransformerLM(TransformerLMConfig(vocab_size=tok.vocab_size, num_layers=L, embed_dim=D,
                                       block_size=BLOCK, block=gpt_block(H)))
x = jnp.asarray([train_ids[:BLOCK]])
p_blocks = jax.jit(gpt.init)(jax.random.PRNGKey(0), x)["params"]
p_lm = {"token_embed": p_blocks["token_embed"], "pos_embed": p_blocks["pos_embed"],
        "decoder": {**{f"layers_{i}": p_blocks[f"block_{i}"] for i in range(L)},
                    "final_norm": p_blocks["final_norm"]}}
logits_blocks, logits_lm = jax.jit(lambda pb, pl: (gpt.apply({"params": pb}, x),
                                                   lm.apply({"params": pl}, x)))(p_blocks, p_lm)
print(f"{count_params(p_blocks):,} parameters; max |BlockGPT - TransformerLM| = "
      f"{float(jnp.abs(logits_blocks - logits_lm).max()):.2e}")
assert jnp.allclose(logits_blocks, logits_lm, atol=1e-5)

# %% [markdown]
# ## A short training run
#
# `TransformerLM` with the block weights above, trained on every device of the
# runtime: `Parallel.create()` puts all devices on the `data` axis of a mesh,
# `par.train_step` compiles one sharded step (loss, gradient, AdamW update, the
# gradients averaged over the devices), and `fit` feeds it random windows of the
# text, a slice of each global batch per device. Training is teacher-forced and
# parallel over positions: the causal mask stops position $n$ from seeing
# positions after it (MEDL (7.27)). `par.gather` copies the trained parameters
# to the host for the decoding below.

# %%
from seqjax.data import LMWindowIterator
from seqjax.train import (
    FitConfig,
    OptimizerConfig,
    Parallel,
    TrainState,
    fit,
    flax_apply_fn,
    make_lm_loss,
    make_optimizer,
)

par = Parallel.create()  # every device on `data`
STEPS = 2 if SMOKE else (3000 if BACKEND != "cpu" else 1000)
BATCH = 8 if SMOKE else 32  # the global batch: a multiple of the device count
BATCH = -(-BATCH // par.batch_shards) * par.batch_shards
print(par)
print(f"training on {par.num_devices} x {DEVICES[0].device_kind}, global batch {BATCH}")
tx, _ = make_optimizer(OptimizerConfig(name="adamw", learning_rate=1e-3, weight_decay=0.1,
                                       clip_norm=1.0))
state = par.shard_state(TrainState.create(p_lm, tx, jax.random.PRNGKey(1)))
train_step = par.train_step(make_lm_loss(flax_apply_fn(lm)))
batches = LMWindowIterator(train_ids, par.local_batch_size(BATCH), BLOCK, seed=0,
                           **par.host_rows())
result = fit(state, train_step, batches,
             FitConfig(steps=STEPS, log_every=250, tensorboard=False, plot=False),
             parallel=par)
for r in result.history:  # logged: the first step, every 250th and the last
    print(f"step {r['step']}: loss {r['loss']:.3f}")
params = par.gather(result.state.params)

# %% [markdown]
# ## KV cache == full causal pass
#
# Generating token $n$ needs the keys and values of tokens $1..n-1$; a KV cache keeps
# them, so each step attends over the cache instead of recomputing the whole prefix
# ($O(n)$ instead of $O(n^2)$ per token, Bishop §12.3.1). `TransformerLM`'s
# `init_decode_state` / `decode_step` feed one token at a time; their logits must
# equal the full forward pass at every position.

# %%
forward = jax.jit(lambda p, tokens: lm.apply({"params": p}, tokens))
seq = jnp.asarray([val_ids[:BLOCK]])
full_logits = forward(params, seq)[0]

decode_step = jax.jit(lm.decode_step)
cache = lm.init_decode_state(params, seq[:, :1], max_len=BLOCK)  # empty caches
step_logits = []
for t in range(BLOCK):
    logits, cache = decode_step(params, cache, seq[:, t])
    step_logits.append(logits[0])
err = float(jnp.abs(jnp.stack(step_logits) - full_logits).max())
print(f"max |cached step - full pass| over {BLOCK} positions: {err:.2e}")
assert err < 1e-4

# %% [markdown]
# The whole generation loop runs inside one `jax.jit` (`seqjax.decoding`). Greedy
# search with the cache and with `recompute_decoder` (the full pass over the
# growing prefix at every step, the reference) must produce the same text.

# %%
import time

from seqjax.decoding import greedy_search, recompute_decoder


def lm_logits(p, tokens_BxT):  # a module-level function: hashable for jit caching
    return lm.apply({"params": p}, tokens_BxT)


prompt = jnp.asarray([val_ids[-8:]])  # the last 8 characters of the text
new = BLOCK - prompt.shape[1]
timings = {}
for name, decoder in (("KV cache", lm), ("recompute", recompute_decoder(lm_logits))):
    greedy_search(decoder, params, prompt, max_new_tokens=new)  # compile
    start = time.perf_counter()
    out = greedy_search(decoder, params, prompt, max_new_tokens=new)
    out.tokens.block_until_ready()
    timings[name] = (time.perf_counter() - start, np.asarray(out.tokens[0]))
    print(f"{name:>10}: {1e3 * timings[name][0]:7.1f} ms  {tok.decode(timings[name][1])!r}")
assert (timings["KV cache"][1] == timings["recompute"][1]).all()

# %% [markdown]
# ## Sampling strategies
#
# Temperature rescales the logits, $p_k\propto\exp(a_k/T)$ (Bishop (12.35)); top-k
# keeps the $k$ most probable tokens; top-p (nucleus) keeps the smallest set whose
# probability reaches $p$. `process_logits` applies them; here is what they do to
# the next-character distribution at the end of the validation window above.

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

from seqjax.decoding import process_logits

print(f"...{tok.decode(seq[0, -24:])!r} -> ?")
next_logits = full_logits[-1:]
settings = {"T = 1": dict(), "T = 0.5": dict(temperature=0.5), "T = 1.5": dict(temperature=1.5),
            "top-k = 5": dict(top_k=5), "top-p = 0.9": dict(top_p=0.9)}
base = np.asarray(jax.nn.softmax(next_logits[0]))
shown = np.argsort(base)[::-1][:12]
fig, ax = plt.subplots(figsize=(9, 3.2))
width = 0.8 / len(settings)
for j, (label, kw) in enumerate(settings.items()):
    probs = np.asarray(jax.nn.softmax(process_logits(next_logits, **kw)[0]))
    ax.bar(np.arange(len(shown)) + j * width, probs[shown], width, label=label)
ax.set_xticks(np.arange(len(shown)) + 0.4, [repr(tok.vocab[i])[1:-1] for i in shown])
ax.set_ylabel("probability of the next character")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# And the texts they write from the same prompt (one compiled loop per strategy;
# the same PRNG key gives the same text). Greedy and beam search are deterministic;
# beam search keeps the 4 most probable prefixes by total log-probability
# (Bishop (12.34)).

# %%
from seqjax.decoding import beam_search, sample

key = jax.random.PRNGKey(0)  # prompt and length as for the greedy check above
strategies = {
    "greedy": lambda: greedy_search(lm, params, prompt, max_new_tokens=new).tokens[0],
    "T = 0.5": lambda: sample(lm, params, prompt, key=key, max_new_tokens=new,
                              temperature=0.5).tokens[0],
    "T = 1.0": lambda: sample(lm, params, prompt, key=key, max_new_tokens=new).tokens[0],
    "T = 1.5": lambda: sample(lm, params, prompt, key=key, max_new_tokens=new,
                              temperature=1.5).tokens[0],
    "top-k = 10": lambda: sample(lm, params, prompt, key=key, max_new_tokens=new,
                                 top_k=10).tokens[0],
    "top-p = 0.9": lambda: sample(lm, params, prompt, key=key, max_new_tokens=new,
                                  top_p=0.9).tokens[0],
    "beam, K = 4": lambda: beam_search(lm, params, prompt, beam_size=4,
                                       max_new_tokens=new).tokens[0, 0],
}
for name, run in strategies.items():
    print(f"--- {name}\n{tok.decode(prompt[0])}{tok.decode(np.asarray(run()))}")

# %% [markdown]
# Low temperature and beam search repeat themselves; high temperature invents
# words; top-k and top-p cut the implausible tail while keeping variety. More in
# `python -m seqjax.experiments.sampling`.

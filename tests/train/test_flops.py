"""MFU accounting: FLOPs per token (6N + 12·L·H·Q·T, causal half) and the trainer's mfu."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.train.flops import lm_flops_per_token, transformer_flops_per_token
from seqjax.train.loop import FitConfig, fit
from seqjax.train.step import create_train_state, make_train_step


def test_transformer_flops_per_token_gpt2_small():
    # GPT-2 small at T = 1024 (nanoGPT's estimate_mfu): 6N + 12·12·12·64·1024.
    n = 124_337_664
    full = transformer_flops_per_token(n, 12, 12, 64, 1024, causal=False)
    assert full == 6 * n + 12 * 12 * 12 * 64 * 1024
    assert transformer_flops_per_token(n, 12, 12, 64, 1024) == 6 * n + 6 * 12 * 12 * 64 * 1024
    for bad in (dict(num_layers=0), dict(block_size=1.5), dict(num_params=-1), dict(head_dim=True)):
        args = dict(num_params=n, num_layers=12, num_heads=12, head_dim=64, block_size=1024)
        args.update(bad)
        with pytest.raises(ValueError, match=next(iter(bad))):
            transformer_flops_per_token(**args)


def test_lm_flops_per_token_counts_all_but_the_position_table():
    cfg = TransformerLMConfig(vocab_size=65, num_layers=2, embed_dim=32, block_size=16,
                              block=gpt_block(4))
    params = jax.jit(TransformerLM(cfg).init)(jax.random.PRNGKey(0),
                                              jnp.zeros((1, 16), jnp.int32))
    total = sum(x.size for x in jax.tree_util.tree_leaves(params))
    n = total - 16 * 32  # the learned position table
    want = 6 * n + 6 * 2 * 4 * 8 * 16
    assert lm_flops_per_token(cfg, params) == want
    assert lm_flops_per_token(cfg, params["params"]) == want
    assert lm_flops_per_token(cfg, params, block_size=8) == 6 * n + 6 * 2 * 4 * 8 * 8
    # The context length has one spelling, the recipes' option's: the old one names it.
    with pytest.raises(TypeError, match="`seq_len` is renamed `block_size`"):
        lm_flops_per_token(cfg, params, seq_len=8)
    with pytest.raises(TypeError, match="`seq_len` is renamed `block_size`"):
        transformer_flops_per_token(n, 2, 4, 8, seq_len=8)


def _toy():
    def loss_fn(params, batch, rng):
        return jnp.mean((params["w"] * batch - 1.0) ** 2), {}

    state, _ = create_train_state(lambda rng: {"w": jnp.zeros(())}, optax.sgd(0.1),
                                  jax.random.PRNGKey(0))
    return state, make_train_step(loss_fn), iter([np.full((4,), 1.0 + i, np.float32)
                                                  for i in range(4)])


def test_fit_logs_mfu_from_flops_per_step_and_peak():
    cfg = FitConfig(steps=4, log_every=2, progress=False, tensorboard=False, plot=False,
                    async_checkpointing=False, flops_per_step=1e9, peak_flops=1e12)
    result = fit(*_toy(), cfg)
    assert [r["step"] for r in result.history] == [1, 2, 4]  # the first step, then every 2
    for record in result.history:
        # MFU is over the devices the run uses (the toy state lives on one of the 8)
        expected = 1e9 * record["steps_per_s"] / 1e12
        np.testing.assert_allclose(record["mfu"], expected, rtol=1e-6)
    assert jax.device_count() == 8
    no_flops = FitConfig(**{**cfg.__dict__, "flops_per_step": None})
    assert all("mfu" not in r for r in fit(*_toy(), no_flops).history)

"""Schedules, clipping, the weight-decay mask, gradient accumulation and TrainState."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seqjax.train.optim import (
    OptimizerConfig,
    TrainState,
    decay_mask,
    inverse_sqrt_schedule,
    make_optimizer,
    make_schedule,
)


def test_warmup_cosine_schedule():
    f = make_schedule(OptimizerConfig(learning_rate=2.0, schedule="warmup_cosine",
                                      warmup_steps=10, total_steps=110, end_lr_ratio=0.1))
    for s in (0, 3, 10, 37, 80, 110, 500):
        if s < 10:
            want = 2.0 * s / 10
        else:
            frac = min(s - 10, 100) / 100
            want = 0.2 + (2.0 - 0.2) * 0.5 * (1 + math.cos(math.pi * frac))
        assert float(f(s)) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_linear_and_constant_schedules():
    f = make_schedule(OptimizerConfig(learning_rate=1.0, schedule="linear", warmup_steps=4,
                                      total_steps=14))
    assert [round(float(f(s)), 4) for s in (0, 2, 4, 9, 14, 20)] == [0, 0.5, 1, 0.5, 0, 0]
    g = make_schedule(OptimizerConfig(learning_rate=0.3))
    assert float(g(0)) == pytest.approx(0.3) and float(g(10**6)) == pytest.approx(0.3)


def test_inverse_sqrt_is_vaswani():
    d_model, warmup = 512, 4000
    f = inverse_sqrt_schedule((d_model * warmup) ** -0.5, warmup)
    for s in (0, 100, 3999, 4000, 20000):
        n = s + 1  # Vaswani's step_num starts at 1
        want = d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)
        assert float(f(s)) == pytest.approx(want, rel=1e-5)


def test_config_errors():
    with pytest.raises(ValueError, match="`name`"):
        OptimizerConfig("lamb")
    with pytest.raises(ValueError, match="total_steps"):
        OptimizerConfig(schedule="warmup_cosine", warmup_steps=10)


def test_decay_mask_skips_biases_norms_embeddings():
    params = {
        "embed": {"embedding": jnp.ones((5, 3))},
        "wpe": {"embedding": jnp.ones((4, 3))},
        "block_0": {
            "ln_1": {"scale": jnp.ones(3), "bias": jnp.ones(3)},
            "LayerNorm_0": {"scale": jnp.ones(3)},
            "attn": {"query": {"kernel": jnp.ones((3, 2, 2)), "bias": jnp.ones((2, 2))}},
            "mlp": {"up": {"kernel": jnp.ones((3, 6))}},
        },
        "rnn": {"cell": {"input": {"kernel": jnp.ones((3, 4)), "bias": jnp.ones(4)},
                         "recurrent_kernel": jnp.ones((4, 4))}},
        "head": {"kernel": jnp.ones((3, 5)), "bias": jnp.ones(5)},
    }
    m = decay_mask(params)
    assert m["embed"]["embedding"] is False and m["wpe"]["embedding"] is False
    assert not any(jax.tree_util.tree_leaves(m["block_0"]["ln_1"]))
    assert m["block_0"]["LayerNorm_0"]["scale"] is False
    assert m["block_0"]["attn"]["query"] == {"kernel": True, "bias": False}
    assert m["block_0"]["mlp"]["up"]["kernel"] is True
    cell = m["rnn"]["cell"]
    assert cell["recurrent_kernel"] is True and cell["input"]["bias"] is False
    assert m["head"] == {"kernel": True, "bias": False}
    # adamw applies decay exactly where the mask says: zero gradients, one step.
    tx, _ = make_optimizer(OptimizerConfig("adamw", learning_rate=0.5, weight_decay=0.1))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
    for u, keep in zip(jax.tree_util.tree_leaves(updates), jax.tree_util.tree_leaves(m)):
        np.testing.assert_allclose(np.asarray(u), -0.5 * 0.1 if keep else 0.0, rtol=1e-6)


def test_clipping_is_the_slides_rule():
    # g <- η g / ||g|| if ||g|| > η, else g (keeps the direction).
    tx, _ = make_optimizer(OptimizerConfig("sgd", learning_rate=1.0, clip_norm=1.0))
    p = {"a": jnp.zeros(2), "b": jnp.zeros(())}
    big = {"a": jnp.array([3.0, 0.0]), "b": jnp.array(4.0)}
    update = jax.jit(tx.update)
    upd, _ = update(big, tx.init(p), p)
    np.testing.assert_allclose(np.asarray(upd["a"]), [-0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(float(upd["b"]), -0.8, rtol=1e-6)
    small = {"a": jnp.array([0.3, 0.0]), "b": jnp.array(0.4)}
    upd, _ = update(small, tx.init(p), p)
    np.testing.assert_allclose(np.asarray(upd["a"]), [-0.3, 0.0], rtol=1e-6)


def test_train_state():
    s = TrainState.create({"w": jnp.ones(2)}, optax.sgd(0.5), jax.random.key(3))
    assert s.rng.dtype == jnp.uint32 and s.rng.shape == (2,)
    s = s.apply_gradients({"w": jnp.ones(2)})
    assert int(s.step) == 1 and s.params["w"].tolist() == [0.5, 0.5] and s.num_params == 2
    with pytest.raises(ValueError, match="PRNGKey"):
        TrainState.create({"w": jnp.ones(2)}, optax.sgd(0.5), jnp.zeros(3, jnp.uint32))


@pytest.mark.parametrize("name,extra", [("adamw", {"weight_decay": 0.1, "clip_norm": 0.5}),
                                        ("adam", {}),
                                        ("sgd", {"momentum": 0.9, "weight_decay": 0.01})])
def test_flat_state_is_the_same_optimiser_with_fewer_leaves(name, extra):
    """flat_state=True keeps m, v (or the momentum) as one vector each: same updates."""
    rng = np.random.default_rng(0)
    params = {"dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                        "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32)},
              "embed": {"embedding": jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)},
              "norm": {"scale": jnp.ones((4,), jnp.float32)}}
    results = {}
    for flat in (False, True):
        tx, _ = make_optimizer(OptimizerConfig(name, 0.05, flat_state=flat, **extra))
        p, state = params, tx.init(params)
        for i in range(5):
            g = jax.tree_util.tree_map(lambda x, i=i: jnp.sin(x * (i + 1)), p)
            updates, state = tx.update(g, state, p)
            p = optax.apply_updates(p, updates)
        results[flat] = (p, len(jax.tree_util.tree_leaves(state)))
    for a, b in zip(jax.tree_util.tree_leaves(results[False][0]),
                    jax.tree_util.tree_leaves(results[True][0])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert results[True][1] < results[False][1]
    assert results[True][1] <= 4

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
                                      warmup_steps=10, steps=110, min_lr_ratio=0.1))
    for s in (0, 3, 10, 37, 80, 110, 500):
        if s < 10:
            want = 2.0 * s / 10
        else:
            frac = min(s - 10, 100) / 100
            want = 0.2 + (2.0 - 0.2) * 0.5 * (1 + math.cos(math.pi * frac))
        assert float(f(s)) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_linear_and_constant_schedules():
    f = make_schedule(OptimizerConfig(learning_rate=1.0, schedule="linear", warmup_steps=4,
                                      steps=14))
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
        OptimizerConfig(name="lamb")
    with pytest.raises(ValueError, match="`steps`"):
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
    tx, _ = make_optimizer(OptimizerConfig(name="adamw", learning_rate=0.5, weight_decay=0.1))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
    for u, keep in zip(jax.tree_util.tree_leaves(updates), jax.tree_util.tree_leaves(m)):
        np.testing.assert_allclose(np.asarray(u), -0.5 * 0.1 if keep else 0.0, rtol=1e-6)


def test_clipping_is_the_slides_rule():
    # g <- η g / ||g|| if ||g|| > η, else g (keeps the direction).
    tx, _ = make_optimizer(OptimizerConfig(name="sgd", learning_rate=1.0, clip_norm=1.0))
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
def test_flat_optimizer_is_the_same_optimiser_with_fewer_leaves(name, extra):
    """flat_optimizer=True keeps m, v (or the momentum) as one vector each: same updates."""
    rng = np.random.default_rng(0)
    params = {"dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                        "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32)},
              "embed": {"embedding": jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)},
              "norm": {"scale": jnp.ones((4,), jnp.float32)}}
    results = {}
    for flat in (False, True):
        tx, _ = make_optimizer(OptimizerConfig(name=name, learning_rate=0.05, flat_optimizer=flat,
                                               **extra))
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


# ----------------------------------------------------------------------------- Muon

def _ns_numpy(x, steps, coeffs=(3.4445, -4.7750, 2.0315)):
    """Newton–Schulz on the wide orientation, float64 (torch.optim.Muon's algorithm)."""
    a, b, c = coeffs
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (np.linalg.norm(x) + 1e-8)
    for _ in range(steps):
        g = x @ x.T
        x = a * x + (b * g + c * g @ g) @ x
    return x.T if tall else x


def test_muon_is_the_numpy_reference_per_group():
    """3 steps: the matrices follow Nesterov momentum → Newton–Schulz → √max(1, B/A) →
    decoupled decay; the embedding and the bias follow AdamW at their own group's rate."""
    rng = np.random.default_rng(0)
    params = {"up": {"kernel": rng.normal(size=(3, 5)), "bias": rng.normal(size=(5,))},
              "down": {"kernel": rng.normal(size=(5, 3))},
              "token_embed": {"embedding": rng.normal(size=(7, 3))}}
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)
    cfg = OptimizerConfig(name="muon", learning_rate=0.02, weight_decay=0.1, ns_steps=4,
                          group_learning_rates=(("embed", 0.3), ("scalar", 0.01)), beta2=0.95)
    tx, _ = make_optimizer(cfg)
    state, p = tx.init(params), params
    ref = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
    mom = {k: np.zeros_like(ref[k]["kernel"]) for k in ("up", "down")}
    adam = {k: [np.zeros_like(v), np.zeros_like(v)] for k, v in
            (("embedding", ref["token_embed"]["embedding"]), ("bias", ref["up"]["bias"]))}
    for t in range(1, 4):
        grads = jax.tree_util.tree_map(lambda x, t=t: jnp.cos(x * t) + 0.1 * x, p)
        g = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), grads)
        updates, state = tx.update(grads, state, p)
        p = optax.apply_updates(p, updates)
        for k in ("up", "down"):
            w, gk = ref[k]["kernel"], g[k]["kernel"]
            mom[k] = 0.95 * mom[k] + gk
            o = _ns_numpy(gk + 0.95 * mom[k], 4) * math.sqrt(max(1, w.shape[1] / w.shape[0]))
            ref[k]["kernel"] = w - 0.02 * (o + 0.1 * w)
        for (outer, inner), lr in ((("token_embed", "embedding"), 0.3), (("up", "bias"), 0.01)):
            m, v = adam[inner]
            gk = g[outer][inner]
            m[:] = 0.9 * m + 0.1 * gk
            v[:] = 0.95 * v + 0.05 * gk**2
            step = (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.95**t)) + 1e-8)
            ref[outer][inner] = ref[outer][inner] - lr * step  # embed, scalar: no decay
    for a, b in zip(jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), b, rtol=2e-5, atol=2e-6)


def test_muon_groups_and_a_scanned_stack_is_its_layers():
    """param_groups: embeddings, heads, vectors (biases of any rank) and matrices; a
    scanned [L, ...] stack gets each layer's own update, as the unrolled layers do."""
    from seqjax.train.optim import muon_dimension_numbers, param_groups

    rng = np.random.default_rng(1)
    layer = lambda: {"self_attn": {"query": {"kernel": rng.normal(size=(8, 2, 4)),
                                             "bias": rng.normal(size=(2, 4))},
                                   "out": {"kernel": rng.normal(size=(2, 4, 8))}},
                     "ffn": {"up": {"kernel": rng.normal(size=(8, 16))}},
                     "norm": {"scale": rng.normal(size=(8,))}}
    layers = [layer(), layer()]
    top = {"token_embed": {"embedding": rng.normal(size=(9, 8))},
           "lm_head": {"kernel": rng.normal(size=(8, 9))}}
    unrolled = {**top, "decoder": {f"layers_{i}": lay for i, lay in enumerate(layers)}}
    stacked = {**top, "decoder": {"layers": jax.tree_util.tree_map(
        lambda *xs: np.stack(xs), *layers)}}
    groups = param_groups(stacked)
    assert groups["token_embed"]["embedding"] == "embed" and groups["lm_head"]["kernel"] == "head"
    lay = groups["decoder"]["layers"]
    assert lay["self_attn"]["query"] == {"kernel": "matrix", "bias": "scalar"}
    assert lay["norm"]["scale"] == "scalar" and lay["ffn"]["up"]["kernel"] == "matrix"
    dims = muon_dimension_numbers(stacked)["decoder"]["layers"]["self_attn"]
    assert tuple(dims["query"]["kernel"]) == (1, (2, 3))
    assert tuple(dims["out"]["kernel"]) == ((1, 2), 3)
    tx, _ = make_optimizer(OptimizerConfig(name="muon", learning_rate=0.02))
    ups = {}
    for name, params in (("unrolled", unrolled), ("stacked", stacked)):
        params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)
        ups[name], _ = tx.update(jax.tree_util.tree_map(jnp.sin, params), tx.init(params), params)
    for i in range(2):
        got = jax.tree_util.tree_map(lambda x, i=i: x[i], ups["stacked"]["decoder"]["layers"])
        for a, b in zip(jax.tree_util.tree_leaves(got),
                        jax.tree_util.tree_leaves(ups["unrolled"]["decoder"][f"layers_{i}"])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # a [D, H, K] projection is one D x HK matrix: orthogonal rows after NS (singular values ~1)
    q = np.asarray(ups["unrolled"]["decoder"]["layers_0"]["self_attn"]["query"]["kernel"])
    sv = np.linalg.svd(q.reshape(8, 8) / -0.02, compute_uv=False)
    assert 0.5 < sv.min() and sv.max() < 1.5


def test_muon_flat_optimizer_is_the_same_update_with_fewer_leaves():
    rng = np.random.default_rng(2)
    params = {"a": {"kernel": jnp.asarray(rng.normal(size=(4, 6)), jnp.float32),
                    "bias": jnp.asarray(rng.normal(size=(6,)), jnp.float32)},
              "b": {"kernel": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)},
              "embed": {"embedding": jnp.asarray(rng.normal(size=(5, 4)), jnp.float32)}}
    out = {}
    for flat in (False, True):
        tx, _ = make_optimizer(OptimizerConfig(name="muon", learning_rate=0.02, weight_decay=0.1,
                                               clip_norm=1.0, flat_optimizer=flat))
        p, state = params, tx.init(params)
        for i in range(4):
            updates, state = tx.update(jax.tree_util.tree_map(lambda x, i=i: jnp.sin(x * (i + 1)),
                                                              p), state, p)
            p = optax.apply_updates(p, updates)
        out[flat] = p, len(jax.tree_util.tree_leaves(state))
    leaves = jax.tree_util.tree_leaves
    for a, b in zip(leaves(out[False][0]), leaves(out[True][0])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert out[True][1] < out[False][1]


@pytest.mark.parametrize("kw,match", [
    ({"ns_steps": 0}, "ns_steps"),
    ({"group_learning_rates": (("embeddings", 0.1),)}, "group_learning_rates"),
    ({"group_weight_decays": (("head", -1.0),)}, "group_weight_decays"),
    ({"no_decay": ("bias",)}, "no_decay"),
    ({"momentum": 1.0}, "momentum"),
])
def test_muon_config_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        OptimizerConfig(name="muon", learning_rate=0.02, **kw)


def test_muon_options_refused_by_other_optimizers_and_no_matrix_refused():
    with pytest.raises(ValueError, match="ns_steps.*'muon'"):
        OptimizerConfig(name="adamw", learning_rate=1e-3, ns_steps=3)
    tx, _ = make_optimizer(OptimizerConfig(name="muon", learning_rate=0.02))
    with pytest.raises(ValueError, match="no matrix to orthogonalise"):
        tx.init({"embed": {"embedding": jnp.ones((4, 2))}, "norm": {"scale": jnp.ones(2)}})


def test_the_optimizer_fields_are_spelled_as_the_recipes_options():
    """steps, min_lr_ratio, beta1, beta2, flat_optimizer: the names of `seqjax train`'s
    options; each old spelling is a TypeError naming the new one."""
    for old, new in (("total_steps", "steps"), ("end_lr_ratio", "min_lr_ratio"),
                     ("b1", "beta1"), ("b2", "beta2"), ("flat_state", "flat_optimizer")):
        with pytest.raises(TypeError, match=f"`{old}` \\(renamed `{new}`\\)"):
            OptimizerConfig(**{old: 1})

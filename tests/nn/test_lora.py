"""LoRA adapters (Bishop §12.3.5, (12.36))."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from seqjax.nn.attention import MultiHeadAttention
from seqjax.nn.lora import init_lora, lora_delta, merge_lora, unmerge_lora
from seqjax.nn.transformer import BlockConfig, TransformerEncoder
from seqjax.utils import count_params
from tests.models.helpers import fit

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.standard_normal((4, 5, 16)), jnp.float32)
MHA = MultiHeadAttention(num_heads=2)


def _mha_params():
    shapes = jax.eval_shape(MHA.init, jax.random.PRNGKey(0), X)["params"]
    return jax.tree_util.tree_map(
        lambda s: jnp.asarray(0.3 * RNG.standard_normal(s.shape), jnp.float32), shapes)


def test_adapter_shapes_and_count():
    params = _mha_params()
    lora = init_lora(jax.random.PRNGKey(1), params, rank=3)
    assert lora["query"]["lora_a"].shape == (16, 3) and lora["query"]["lora_b"].shape == (3, 16)
    assert lora["out"]["lora_a"].shape == (16, 3) and lora["out"]["lora_b"].shape == (3, 16)
    assert count_params(lora) == 4 * 3 * (16 + 16)  # 2RD per D×D matrix, 4 projections
    assert float(jnp.abs(lora["value"]["lora_b"]).max()) == 0.0  # starts at W_0
    only_q = init_lora(jax.random.PRNGKey(1), params, rank=2, path_filter=lambda p: "query" in p)
    assert list(only_q) == ["query"]
    stacked = jax.eval_shape(TransformerEncoder(config=BlockConfig(num_heads=2, mlp_dim=8),
                                                num_layers=3, scan_layers=True).init,
                             jax.random.PRNGKey(0), X)["params"]
    lora_s = init_lora(jax.random.PRNGKey(2), stacked, rank=2)
    assert lora_s["layers"]["self_attn"]["key"]["lora_a"].shape == (3, 16, 2)
    with pytest.raises(ValueError, match="rank"):
        init_lora(jax.random.PRNGKey(1), params, rank=0)
    with pytest.raises(ValueError, match="no module"):
        init_lora(jax.random.PRNGKey(1), {"dense": {"kernel": jnp.ones((2, 2))}}, rank=1)


def test_merge_is_w0_plus_ab_and_unmerge_inverts():
    """X Ŵ = X W_0 + X A B (Bishop (12.36)) on a plain Dense, and on MHA projections."""
    dense = nn.Dense(6)
    p = dense.init(jax.random.PRNGKey(0), X)["params"]
    lora = init_lora(jax.random.PRNGKey(1), {"dense": p}, rank=2, targets={"dense": (1, 1)})
    lora["dense"]["lora_b"] = jnp.asarray(RNG.standard_normal((2, 6)), jnp.float32)
    merged = merge_lora({"dense": p}, lora, scale=0.5)["dense"]
    a, b = lora["dense"]["lora_a"], lora["dense"]["lora_b"]
    expected = X @ p["kernel"] + 0.5 * (X @ a) @ b + p["bias"]
    np.testing.assert_allclose(dense.apply({"params": merged}, X), expected, rtol=1e-5, atol=1e-5)
    back = unmerge_lora({"dense": merged}, lora, scale=0.5)["dense"]
    np.testing.assert_allclose(back["kernel"], p["kernel"], atol=1e-6)

    params = _mha_params()
    lora = init_lora(jax.random.PRNGKey(1), params, rank=2)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(
        lambda x, y: bool((x == y).all()), merge_lora(params, lora), params))  # B = 0
    lora = jax.tree_util.tree_map(lambda x: x + 0.1, lora)
    merged = merge_lora(params, lora)
    np.testing.assert_allclose(merged["out"]["kernel"],
                               params["out"]["kernel"] + lora_delta(lora["out"], (2, 8, 16)),
                               rtol=1e-6)
    roundtrip = unmerge_lora(merged, lora)
    for name in ("query", "key", "value", "out"):
        np.testing.assert_allclose(roundtrip[name]["kernel"], params[name]["kernel"], atol=1e-6)
        np.testing.assert_array_equal(merged[name]["bias"], params[name]["bias"])


def test_lora_fine_tuning_recovers_a_low_rank_change():
    """Train only A, B (W_0 frozen) to match a model whose W_q, W_v moved by a rank-2 update."""
    base = _mha_params()
    u = jnp.asarray(RNG.standard_normal((16, 2)), jnp.float32)
    w = jnp.asarray(RNG.standard_normal((2, 16)), jnp.float32)
    target = dict(base)
    for name in ("query", "value"):
        target[name] = {**base[name],
                        "kernel": base[name]["kernel"] + 0.3 * (u @ w).reshape(16, 2, 8)}
    xs = jnp.asarray(RNG.standard_normal((300, 8, 5, 16)), jnp.float32)
    ys = jax.vmap(lambda x: MHA.apply({"params": target}, x))(xs)
    lora = init_lora(jax.random.PRNGKey(3), base, rank=2,
                     path_filter=lambda p: p[-1] in ("query", "value"))

    def loss(lora, batch):
        x, y = batch
        return jnp.mean((MHA.apply({"params": merge_lora(base, lora)}, x) - y) ** 2)

    before = float(loss(lora, (xs[0], ys[0])))
    lora, _ = fit(loss, lora, (xs, ys), lr=1e-2)
    assert float(loss(lora, (xs[0], ys[0]))) < 1e-2 * before

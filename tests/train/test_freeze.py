"""Freezing / partial fine-tuning: ``seqjax.train.optim.freeze`` and ``trainable_mask``."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from seqjax.train import freeze, trainable_mask
from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer


def _params(seed=0):
    r = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(r.normal(size=s), jnp.float32)  # noqa: E731
    return {"encoder": {"kernel": f(3, 4), "bias": f(4)},
            "head": {"kernel": f(4, 2), "bias": f(2)}}


def _grads(seed):
    return _params(seed + 100)


def _bits(x):
    return np.asarray(x).view(np.uint32)


@pytest.mark.parametrize("trainable", [
    {"encoder": {"kernel": False, "bias": False}, "head": {"kernel": True, "bias": True}},
    r"^head/",
    (r"^head/kernel$", r"^head/bias$"),
    lambda path, leaf: path.startswith("head"),
])
def test_frozen_leaves_bit_identical_and_trainable_follow_the_optimizer(trainable):
    """Frozen leaves never change (bitwise) through AdamW + weight decay + clipping; the
    trainable ones follow exactly the same optimiser run on the trainable subtree alone."""
    cfg = OptimizerConfig(name="adamw", learning_rate=0.05, weight_decay=0.3, clip_norm=0.5)
    tx, _ = make_optimizer(cfg, trainable=trainable)
    ref_tx, _ = make_optimizer(cfg)
    params = _params()
    state = TrainState.create(params, tx, jax.random.PRNGKey(0))
    ref = TrainState.create({"head": params["head"]}, ref_tx, jax.random.PRNGKey(0))
    step = jax.jit(lambda s, g: s.apply_gradients(g))
    for i in range(4):
        g = _grads(i)
        state = step(state, g)
        ref = step(ref, {"head": g["head"]})
    for name in ("kernel", "bias"):
        np.testing.assert_array_equal(_bits(state.params["encoder"][name]),
                                      _bits(params["encoder"][name]))
        np.testing.assert_array_equal(state.params["head"][name], ref.params["head"][name])
        assert not np.array_equal(state.params["head"][name], params["head"][name])


def test_frozen_leaves_get_no_weight_decay_state_or_clipping_share():
    """With a zero gradient AdamW's decay still moves a trainable matrix, never a frozen one;
    the clipping norm is the trainable gradient's (numpy reference of one SGD step)."""
    params = _params()
    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    tx = freeze(optax.adamw(0.1, weight_decay=0.5), r"kernel$")
    state = tx.init(params)
    upd, state = tx.update(zero, state, params)
    new = optax.apply_updates(params, upd)
    np.testing.assert_allclose(new["head"]["kernel"], params["head"]["kernel"] * (1 - 0.05),
                               rtol=1e-6)
    np.testing.assert_array_equal(_bits(new["head"]["bias"]), _bits(params["head"]["bias"]))
    # Adam moments exist only for the trainable leaves.
    n_state = sum(np.size(x) for x in jax.tree_util.tree_leaves(state))
    n_kernels = 3 * 4 + 4 * 2
    assert n_state == 2 * n_kernels + 1  # mu, nu and the step count

    # Clipping inside the frozen optimiser: g <- eta g / ||g_trainable|| (slides' rule).
    g = _grads(7)
    eta, lr = 0.1, 1.0
    tx = freeze(optax.chain(optax.clip_by_global_norm(eta), optax.sgd(lr)), r"^head/")
    upd, _ = tx.update(g, tx.init(params), params)
    gh = np.concatenate([np.ravel(g["head"]["kernel"]), np.ravel(g["head"]["bias"])])
    scale = min(1.0, eta / np.linalg.norm(gh))
    np.testing.assert_allclose(upd["head"]["kernel"], -lr * scale * np.asarray(g["head"]["kernel"]),
                               rtol=1e-6)
    assert float(jnp.abs(upd["encoder"]["kernel"]).max()) == 0.0


def test_trainable_mask_forms_and_errors():
    p = _params()
    want = {"encoder": {"kernel": False, "bias": False}, "head": {"kernel": True, "bias": False}}
    assert trainable_mask(p, "head/kernel") == want
    assert trainable_mask(p, ["head/kernel"]) == want
    assert trainable_mask(p, lambda path, leaf: path == "head/kernel") == want
    assert trainable_mask(p, want) == want
    with pytest.raises(ValueError, match="`trainable` must be a tree of bools"):
        trainable_mask(p, {"encoder": True, "head": False})
    with pytest.raises(TypeError, match="predicate must return a bool"):
        trainable_mask(p, lambda path, leaf: "yes")
    with pytest.raises(TypeError, match="regexes must be strings"):
        trainable_mask(p, ("head", 3))
    with pytest.raises(TypeError, match="`tx` must be an optax.GradientTransformation"):
        freeze("adam", want)

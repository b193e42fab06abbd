"""Each strategy gives the layout its name promises, for every model family (shardings
inspected leaf by leaf), and an RNN's time loop has no collectives (compiled HLO)."""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seqjax.models.bert import Bert, BertConfig, bert_block
from seqjax.models.gpt import TransformerLM, TransformerLMConfig, gpt_block
from seqjax.models.rnn import RNNLanguageModel, RNNLMConfig
from seqjax.train.losses import make_lm_loss
from seqjax.train.optim import OptimizerConfig, TrainState, make_optimizer, path_to_str
from seqjax.train.parallel import Parallel
from seqjax.train.sharding import logical_axes, make_mesh, tree_shardings
from seqjax.train.step import flax_apply_fn

V, T = 64, 8


def _gpt(scan):
    return TransformerLM(TransformerLMConfig(vocab_size=V, num_layers=2, embed_dim=32, block_size=T,
                                             block=gpt_block(4), scan_layers=scan))


def _bert(scan):
    return Bert(BertConfig(vocab_size=V, num_layers=2, embed_dim=32, block_size=T,
                           block=bert_block(4, mlp_dim=64), scan_layers=scan))


MODELS = {
    "gpt": lambda: _gpt(False),
    "gpt-scan": lambda: _gpt(True),
    "bert": lambda: _bert(False),
    "bert-scan": lambda: _bert(True),
    "lstm-lm": lambda: RNNLanguageModel(RNNLMConfig(vocab_size=V, embed_dim=32, num_layers=2,
                                                    cell_type="lstm")),
    "gru-lm": lambda: RNNLanguageModel(RNNLMConfig(vocab_size=V, embed_dim=32, num_layers=1,
                                                   cell_type="gru")),
}


def _params(name):
    model = MODELS[name]()
    return jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          jnp.zeros((1, T), jnp.int32))["params"]


def _leaves(name, mesh, strategy):
    params = _params(name)
    sh = tree_shardings(params, mesh, strategy, min_fsdp_size=0)
    for (path, leaf), s in zip(jax.tree_util.tree_leaves_with_path(params),
                               jax.tree_util.tree_leaves(sh)):
        p = path_to_str(path)
        spec = tuple(s.spec) + (None,) * (leaf.ndim - len(s.spec))
        yield p, leaf.shape, logical_axes(p, leaf.ndim), spec


@pytest.mark.parametrize("name", list(MODELS))
def test_tensor_strategy_splits_heads_mlp_and_vocab_never_layers(name):
    mesh = make_mesh(data=4, model=2)
    seen = collections.Counter()
    for path, shape, names, spec in _leaves(name, mesh, "tensor"):
        for ax, (n, s) in enumerate(zip(names, spec)):
            if s == "model":
                assert n in ("heads", "mlp", "vocab"), (path, names, spec)
                seen[n] += 1
            elif n in ("heads", "mlp", "vocab") and shape[ax] % 2 == 0 and \
                    "model" not in spec:
                raise AssertionError(f"{path}: {n} axis not split: {spec}")
        if "layers" in names:
            assert spec[names.index("layers")] is None, (path, spec)
        if "rnn" in names:  # recurrences stay replicated: no all-gather per time step
            assert set(spec) == {None}, (path, spec)
    assert seen["vocab"] >= 1, seen  # the embedding (and an untied head) is vocab-split
    if name.startswith(("gpt", "bert")):
        assert seen["heads"] >= 2 and seen["mlp"] >= 2, seen


@pytest.mark.parametrize("name", list(MODELS))
def test_fsdp_strategy_shards_every_matrix_once_never_the_layer_axis(name):
    mesh = make_mesh(data=2, fsdp=4)
    for path, shape, names, spec in _leaves(name, mesh, "fsdp"):
        assert "model" not in spec
        assert spec.count("fsdp") == (1 if any(d % 4 == 0 and n != "layers"
                                               for d, n in zip(shape, names)) else 0), path
        if "layers" in names:
            assert spec[names.index("layers")] is None, (path, spec)


def test_scanned_and_unrolled_stacks_split_the_same_logical_axes():
    mesh = make_mesh(data=2, fsdp=2, model=2)
    unrolled = {re.sub(r"layers_\d+", "layers", p): (n, s)
                for p, _, n, s in _leaves("gpt", mesh, "fsdp+tensor")}
    stacked = 0
    for path, _, names, spec in _leaves("gpt-scan", mesh, "fsdp+tensor"):
        n, s = unrolled[path]
        if "/layers/" not in path:  # embeddings, final norm: no layer axis
            assert (names, spec) == (n, s), path
            continue
        stacked += 1
        assert names[0] == "layers" and spec[0] is None, (path, names, spec)
        assert names[1:] == n and spec[1:] == s, (path, names, spec, n, s)
    assert stacked >= 8


def _collectives_in_while_bodies(hlo: str) -> dict[str, collections.Counter]:
    bodies = {b.lstrip("%") for b in re.findall(r"body=(%?[\w.\-]+)", hlo)}
    out = {}
    for comp in re.split(r"\n(?=\S[^\n]*\{\s*\n)", hlo):
        head = re.match(r"(?:ENTRY\s+)?%?([\w.\-]+)", comp.strip())
        if head and head.group(1) in bodies:
            out[head.group(1)] = collections.Counter(re.findall(
                r"\b(all-gather|all-reduce|reduce-scatter|collective-permute|all-to-all)"
                r"(?:-start)?\(", comp))
    return out


@pytest.mark.parametrize(("cell", "mesh", "strategy"), [
    ("lstm", "data=2,fsdp=4", "fsdp"),
    ("gru", "data=2,fsdp=4", "fsdp"),
    ("lstm", "data=4,model=2", "tensor"),
    ("lstm", "data=2,fsdp=2,model=2", "fsdp+tensor"),
])
def test_rnn_time_loop_has_no_collectives(cell, mesh, strategy):
    model = RNNLanguageModel(RNNLMConfig(vocab_size=V, embed_dim=32, num_layers=2,
                                         cell_type=cell))
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))["params"]
    par = Parallel.create(mesh, strategy, min_fsdp_size=0)
    tx, _ = make_optimizer(OptimizerConfig(name="adamw", learning_rate=1e-3))
    state = par.shard_state(TrainState.create(params, tx, jax.random.PRNGKey(1)))
    assert any(not x.sharding.is_fully_replicated
               for x in jax.tree_util.tree_leaves(state.params))
    step = par.train_step(make_lm_loss(flax_apply_fn(model)))
    batch = par.place({"inputs": np.zeros((8, 16), np.int32),
                       "targets": np.ones((8, 16), np.int32)})
    hlo = step.lower(state, batch).compile().as_text()
    loops = _collectives_in_while_bodies(hlo)
    assert loops, "expected the scanned time loops in the HLO"
    assert all(not c for c in loops.values()), loops
    # the parameters' collectives happen outside the loops
    assert re.search(r"\ball-gather(-start)?\(", hlo) or strategy == "tensor"


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_fsdp_transformer_step_keeps_activations_batch_split(scan):
    """The residual stream is constrained to the batch split, so FSDP's weight split does
    not leak into the activations (no all-to-all reshuffles between layers)."""
    model = _gpt(scan)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))["params"]
    par = Parallel.create("data=2,fsdp=4", "fsdp", min_fsdp_size=0)
    tx, _ = make_optimizer(OptimizerConfig(name="adamw", learning_rate=1e-3))
    state = par.shard_state(TrainState.create(params, tx, jax.random.PRNGKey(1)))
    step = par.train_step(make_lm_loss(flax_apply_fn(model)))
    batch = par.place({"inputs": np.zeros((8, T), np.int32), "targets": np.ones((8, T), np.int32)})
    hlo = step.lower(state, batch).compile().as_text()
    assert re.search(r"\ball-gather(-start)?\(", hlo)  # FSDP gathers the weights
    assert not re.search(r"\ball-to-all(-start)?\(", hlo)

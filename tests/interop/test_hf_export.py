"""``seqjax export``: a gpt2 work dir as a Hugging Face folder — transformers loads it offline
with the run's logits and token ids, ``load_hf_gpt2`` reads back the checkpoint's parameters,
and a model or tokenizer GPT-2 cannot hold, a bad work dir or destination, and an interrupted
write leave no folder that looks complete.

The work dirs are made as ``seqjax train gpt2`` leaves them (``experiment.json`` and an orbax
checkpoint holding the model config), with random parameters instead of a training run."""

from __future__ import annotations

import dataclasses
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # never touch the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

from seqjax import cli  # noqa: E402
from seqjax._io import write_json  # noqa: E402
from seqjax.experiments import gpt2  # noqa: E402
from seqjax.experiments._config import ConfigError, apply_overrides  # noqa: E402
from seqjax.interop import hf_export  # noqa: E402
from seqjax.interop.hf_export import check_exportable, export_gpt2  # noqa: E402
from seqjax.interop.hf_gpt2 import gpt2_params_to_hf, load_hf_gpt2  # noqa: E402
from seqjax.models.gpt import TransformerLM  # noqa: E402
from seqjax.train import TrainState  # noqa: E402
from seqjax.train.checkpoint import Checkpointer  # noqa: E402
from tests.experiments.test_gpt2 import _rank_file  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures",
                       "tinyshakespeare.txt")
STEP = 4
#: The recipe's GPT-2 presets at the smoke size: ``smoke`` is the ``cpu`` preset's switches
#: (no biases, exact GELU), ``gpt2`` the 124M preset's (biases, tanh GELU); ``untied`` the
#: modern switches GPT2LMHeadModel holds (an untied head, ReLU²).
VARIANTS = {"smoke": {}, "gpt2": {"model.use_bias": True, "model.activation": "gelu_tanh"},
            "untied": {"model.tie_embeddings": False, "model.activation": "relu_squared"}}
TEXTS = ["Hello world", " Hello  world\n\n  x ", "naïve café — 日本語 😀 \t\tend  ",
         "I'm can't we'll they're  1234567 3.14159", "  \n \n\n", "a" * 300, "x\u00a0y\u2003z",
         "ROMEO:\nBut, soft! what light through yonder window breaks?"]


def _transformers():
    torch = pytest.importorskip("torch", reason="the exported model runs in PyTorch")
    transformers = pytest.importorskip("transformers", reason="the export is for transformers")
    return torch, transformers


def _config(workdir, options=None, **more) -> gpt2.Config:
    """The smoke preset with ``options`` (dotted keys: ``{"model.use_bias": True}``) and
    ``more`` (flat ones) over it."""
    return apply_overrides(gpt2.Config(), {**gpt2.PRESETS["smoke"], "data_path": "unused",
                                           "workdir": str(workdir), **(options or {}), **more})


def _make_workdir(workdir, checkpoint=True, options=None, **more):
    """A work dir as ``seqjax train gpt2`` writes it: ``experiment.json`` (the whole config)
    and, with ``checkpoint``, step 4's checkpoint with the recipe's model config. Random
    parameters (biases and norm offsets included, so every tensor's place is tested)."""
    cfg = _config(workdir, options, **more)
    write_json(os.path.join(workdir, "experiment.json"),
               {"experiment": "gpt2", "config": dataclasses.asdict(cfg)})
    if not checkpoint:
        return cfg, None
    model = gpt2.build_model(cfg)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))
    leaves, tree = jax.tree_util.tree_flatten(shapes["params"])
    rng = np.random.default_rng(len(leaves))
    params = jax.tree_util.tree_unflatten(
        tree, [jnp.asarray(rng.normal(0, 0.5, leaf.shape), jnp.float32) for leaf in leaves])
    state = TrainState.create(params, optax.sgd(0.1), jax.random.PRNGKey(0))
    with Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False,
                      model_config=gpt2.model_config(cfg)) as ckpt:
        ckpt.save(state, step=STEP)
    return cfg, params


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``{variant: (cfg, params, out)}``: each variant's work dir exported by the CLI."""
    rank = _rank_file()
    out = {}
    for name, options in VARIANTS.items():
        root = tmp_path_factory.mktemp(name)
        cfg, params = _make_workdir(root / "w", options=options, rank_file=rank)
        assert cli.main(["export", "--workdir", str(root / "w"), str(root / "hf")]) == 0
        out[name] = cfg, params, root / "hf"
    return out


def _flat(tree) -> dict:
    return {jax.tree_util.keystr(k): np.asarray(a)
            for k, a in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_transformers_loads_the_export_with_the_runs_logits(exported, variant):
    torch, transformers = _transformers()
    cfg, params, out = exported[variant]
    assert sorted(os.listdir(out)) == [
        "config.json", "merges.txt", "model.safetensors", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    assert hf.config.vocab_size == cfg.vocab_size == 50304  # the padded rows are kept
    assert hf.config.tie_word_embeddings == cfg.model.tie_embeddings
    tokens = np.random.default_rng(0).integers(0, 50257, (3, cfg.block_size))
    with torch.no_grad():
        got = hf(torch.from_numpy(tokens)).logits.numpy()
    model = TransformerLM(gpt2.build_model(cfg).config)  # float32 compute
    want = np.asarray(model.apply({"params": params}, jnp.asarray(tokens)))
    assert got.shape == want.shape == (3, cfg.block_size, 50304)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_round_trip_is_exact(exported, variant):
    cfg, params, out = exported[variant]
    model, variables = load_hf_gpt2(out)
    ours = gpt2.build_model(cfg).config
    assert (model.config.num_layers, model.config.embed_dim, model.config.block.num_heads,
            model.config.block_size, model.config.vocab_size, model.config.tie_embeddings,
            model.config.block.activation, model.config.block.norm_epsilon) == \
        (ours.num_layers, ours.embed_dim, ours.block.num_heads, ours.block_size,
         ours.vocab_size, ours.tie_embeddings, ours.block.activation, ours.block.norm_epsilon)
    want, got = _flat(params), _flat(variables["params"])
    for k, a in want.items():
        np.testing.assert_array_equal(got[k], a, err_msg=k)
    # a run without biases comes back with GPT-2's biases, all zero
    extra = set(got) - set(want)
    assert bool(extra) == (not cfg.model.use_bias)
    assert all(k.endswith("['bias']") and not got[k].any() for k in extra)


def test_the_tokenizer_encodes_as_the_runs(exported):
    _, transformers = _transformers()
    from tokenizers import Tokenizer

    cfg, _, out = exported["smoke"]
    run_tok = gpt2.text_tokenizer(cfg)
    texts = [*TEXTS, open(FIXTURE, encoding="utf-8").read()]
    tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert (tok.eos_token_id, tok.bos_token_id, len(tok)) == (50256, 50256, 50257)
    fast = Tokenizer.from_file(str(out / "tokenizer.json"))  # what transformers 4 reads
    slow_dir = out.parent / "vocab_merges"  # vocab.json + merges.txt alone
    slow_dir.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "config.json"):
        (slow_dir / name).write_bytes((out / name).read_bytes())
    slow = transformers.AutoTokenizer.from_pretrained(slow_dir, local_files_only=True)
    for text in texts:
        want = run_tok.encode(text)
        assert tok(text, add_special_tokens=False)["input_ids"] == want, text[:40]
        assert fast.encode(text, add_special_tokens=False).ids == want, text[:40]
        assert slow(text, add_special_tokens=False)["input_ids"] == want, text[:40]
        assert tok.decode(want) == text
    merges = (out / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[:4] == ["#version: 0.2", "Ġ t", "Ġ a", "h e"] and len(merges) == 50001


def test_a_tokenizer_json_run_exports_that_file(tmp_path, capsys):
    _, transformers = _transformers()
    from seqjax.data.tokenizers import CharTokenizer, SpecialTokens, train_bpe

    text = open(FIXTURE, encoding="utf-8").read()
    path = tmp_path / "tokenizer.json"
    train_bpe([text], vocab_size=400, special_tokens=SpecialTokens(eos="<|endoftext|>")
              ).save(path)
    _make_workdir(tmp_path / "w", tokenizer=f"hf:{path}", vocab_size=512)
    out = export_gpt2(tmp_path / "w", tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == path.read_bytes()
    tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    run_tok = gpt2.text_tokenizer(_config(tmp_path / "w", tokenizer=f"hf:{path}"))
    assert tok.eos_token_id == run_tok.eot
    for t in TEXTS[:4]:
        assert tok(t, add_special_tokens=False)["input_ids"] == run_tok.encode(t)
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == run_tok.eot
    # the same file saved by seqjax (train_bpe) and named seqjax:PATH exports the same way
    _make_workdir(tmp_path / "s", tokenizer=f"seqjax:{path}", vocab_size=512)
    assert (export_gpt2(tmp_path / "s", tmp_path / "s_hf") / "tokenizer.json").read_bytes() \
        == path.read_bytes()
    # seqjax's character tokenizer has no transformers class: refused, naming --tokenizer
    chars = tmp_path / "chars.json"
    CharTokenizer.from_text(text).save(chars)
    _make_workdir(tmp_path / "c", checkpoint=False, tokenizer=f"seqjax:{chars}", vocab_size=128)
    assert cli.main(["export", "--workdir", str(tmp_path / "c"), str(tmp_path / "c_hf")]) == 2
    err = capsys.readouterr().err
    assert "--tokenizer seqjax:" in err and "CharTokenizer" in err and err.count("\n") == 1
    assert not (tmp_path / "c_hf").exists()


def test_a_model_gpt2_cannot_hold_is_refused_by_option(tmp_path, capsys):
    check_exportable(_config(tmp_path, {**VARIANTS["untied"], "model.use_bias": False}))  # exports
    with pytest.raises(ConfigError, match="--model.architecture=lstm .GPT-2 needs "
                                          "--model.architecture=transformer"):
        check_exportable(_config(tmp_path, {"model.architecture": "lstm"}))
    with pytest.raises(ConfigError) as err:
        check_exportable(_config(tmp_path, gpt2.PRESETS["modern_smoke"]))
    for option in ("--model.positions=rope", "--model.qk_norm=true",
                   "--model.norm_type=rmsnorm", "--model.logit_softcap=30.0"):
        assert option in str(err.value)
    # the CLI refuses before it reads a checkpoint or writes anything
    _make_workdir(tmp_path / "w", checkpoint=False, options={**gpt2.PRESETS["modern_smoke"],
                                                             "model.logit_softcap": 0.0})
    assert cli.main(["export", "--workdir", str(tmp_path / "w"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqjax: error: cannot export") and err.count("\n") == 1
    assert "--model.positions=rope" in err and "--model.logit_softcap" not in err
    assert not (tmp_path / "hf").exists()


def test_bad_inputs_exit_2_and_write_nothing(exported, tmp_path, capsys):
    cfg, _, _ = exported["smoke"]
    work = cfg.workdir
    cases = [
        (["--workdir", str(tmp_path / "none"), str(tmp_path / "a")], "no experiment.json"),
        (["--workdir", work, "--step", "7", str(tmp_path / "a")], "--step 7: no checkpoint"),
        (["--workdir", work, "--force", work], "is or holds the work dir"),
        (["--workdir", work, "--force", os.path.dirname(work)], "is or holds the work dir"),
        (["--workdir", work, FIXTURE], "is not a folder"),
        (["--workdir", work, str(tmp_path / "a"), "--dtype=bf16"], "unknown argument"),
    ]
    for argv, message in cases:
        assert cli.main(["export", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "a").exists()
    _make_workdir(tmp_path / "w", checkpoint=False)  # experiment.json, no checkpoint
    assert cli.main(["export", "--workdir", str(tmp_path / "w"), str(tmp_path / "a")]) == 2
    assert "no checkpoints in" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["w"]


def test_an_existing_folder_needs_force_and_an_interrupted_export_leaves_none(
        exported, tmp_path, monkeypatch, capsys):
    cfg, _, first = exported["gpt2"]
    argv = ["export", "--workdir", cfg.workdir]
    out = tmp_path / "hf"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert cli.main([*argv, str(out)]) == 2
    assert "not empty; pass --force" in capsys.readouterr().err
    assert os.listdir(out) == ["mine.txt"]

    def interrupted(path, tensors):
        path.write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_export, "_write_weights", interrupted)
    with pytest.raises(KeyboardInterrupt):  # with --force: the old folder stays as it was
        cli.main([*argv, "--step", str(STEP), "--force", str(out)])
    assert os.listdir(tmp_path) == ["hf"] and os.listdir(out) == ["mine.txt"]
    with pytest.raises(KeyboardInterrupt):  # a new folder: none is left, nor its temporary
        cli.main([*argv, str(tmp_path / "new")])
    assert os.listdir(tmp_path) == ["hf"]

    def full_disk(path, tensors):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(hf_export, "_write_weights", full_disk)
    assert cli.main([*argv, str(tmp_path / "new")]) == 3
    err = capsys.readouterr().err
    assert "could not write the export" in err and "No space left" in err
    assert os.listdir(tmp_path) == ["hf"]
    monkeypatch.undo()
    assert cli.main([*argv, "--force", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert sorted(os.listdir(out)) == sorted(os.listdir(first))
    assert (out / "model.safetensors").read_bytes() == (first / "model.safetensors").read_bytes()
    assert os.listdir(tmp_path) == ["hf"]


def test_scanned_parameters_export_as_the_unscanned(tmp_path):
    options = {"model.num_layers": 3, "model.use_bias": True}
    cfg = gpt2.build_model(_config(tmp_path, options)).config
    x = jnp.zeros((1, 4), jnp.int32)
    params = TransformerLM(cfg).init(jax.random.PRNGKey(1), x)["params"]
    stacked = {**params, "decoder": {
        "final_norm": params["decoder"]["final_norm"],
        "layers": jax.tree_util.tree_map(lambda *a: jnp.stack(a), *(
            params["decoder"][f"layers_{i}"] for i in range(3)))}}
    want = gpt2_params_to_hf(params, cfg)
    got = gpt2_params_to_hf(stacked, cfg.replace(scan_layers=True))
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)

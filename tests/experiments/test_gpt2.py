"""``seqjax train gpt2``: the smoke run on GPT-2-BPE Tiny Shakespeare bins (the fixture's few
KB), its evaluation (validation tokens, HellaSwag on items written here, a sample), resume,
``seqjax eval``/``generate`` on the work dir, and the inputs it refuses."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from seqjax import cli
from seqjax.data.shards import write_shard
from seqjax.experiments import char_lm, gpt2
from seqjax.experiments._config import ConfigError, apply_overrides
from tests.experiments._devices import assert_trained_on_all_devices


def _preset(name: str, **changes) -> gpt2.Config:
    return apply_overrides(gpt2.Config(), {**gpt2.PRESETS[name], **changes})

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures",
                       "tinyshakespeare.txt")


def _rank_file() -> str:
    pytest.importorskip("tiktoken", reason="GPT-2's BPE needs tiktoken (the pretrain extra)")
    from seqjax.data.text_tokenizers import gpt2_rank_file

    path = gpt2_rank_file()
    if path is None:
        pytest.skip("GPT-2's ranks ship in openai-whisper (pip install --no-deps openai-whisper)")
    return path


@pytest.fixture(scope="module")
def bins(tmp_path_factory):
    """nanoGPT's Shakespeare layout from the fixture: the text cut 90/10, GPT-2 BPE."""
    from seqjax.data.text_tokenizers import load_text_tokenizer

    rank = _rank_file()
    tok = load_text_tokenizer("gpt2", rank_file=rank)
    text = open(FIXTURE, encoding="utf-8").read()
    cut = int(len(text) * 0.9)
    folder = tmp_path_factory.mktemp("bins")
    write_shard(folder / "train.bin", tok.encode(text[:cut]), header=False)
    write_shard(folder / "val.bin", tok.encode(text[cut:]), header=False)
    return str(folder), rank


def _hellaswag(path) -> None:
    items = [{"ctx": "ROMEO: I will go to the", "endings": ["house.", "moon of blue cheese.",
                                                            "king.", "sea of"], "label": 0},
             {"ctx": "First Citizen: We are", "endings": ["all resolved.", "seven.", "going",
                                                          "not."], "label": 0}]
    path.write_text("".join(json.dumps(it) + "\n" for it in items))


def test_smoke_trains_evaluates_samples_and_resumes(bins, tmp_path):
    data, rank = bins
    hs = tmp_path / "hellaswag_val.jsonl"
    _hellaswag(hs)
    lambada = tmp_path / "lambada.jsonl"
    lambada.write_text("".join(json.dumps({"text": t}) + "\n" for t in (
        "ROMEO: I will go to the house", "JULIET: good night, good night", "KING: my lord")))
    work = str(tmp_path / "w")
    argv = ["train", "gpt2", "--smoke", f"--data_path={data}", f"--rank_file={rank}",
            f"--hellaswag={hs}", f"--tasks={lambada}", f"--workdir={work}"]
    assert cli.main(argv) == 0
    summary = json.loads(open(os.path.join(work, "gpt2.json")).read())
    assert summary["steps"] == 4 and summary["status"] == "completed"
    assert 9.0 < summary["val_loss"] < 11.5  # ln 50304 = 10.83 at the start
    assert summary["val_tokens"] == 256
    assert summary["hellaswag_items"] == 2 and 0 <= summary["hellaswag_acc_norm"] <= 1
    assert summary["lambada_items"] == 3 and summary["lambada_acc"] in (0, 1 / 3, 2 / 3, 1)
    assert isinstance(summary["sample"], str) and summary["sample"]
    assert os.path.exists(os.path.join(work, "samples.txt"))
    assert_trained_on_all_devices(work)
    records = [json.loads(ln) for ln in open(os.path.join(work, "metrics.jsonl"))]
    assert [r["step"] for r in records] == [1, 2, 4]
    assert records[-1]["hellaswag/acc_norm"] == summary["hellaswag_acc_norm"]  # in the loop
    # the same command with more steps resumes from step 4 (the batches are the step's)
    assert cli.main([*argv, "--steps=6"]) == 0
    records = [json.loads(ln) for ln in open(os.path.join(work, "metrics.jsonl"))]
    steps = [r["step"] for r in records]
    assert steps[:3] == [1, 2, 4] and steps[-1] == 6 and steps == sorted(set(steps))
    # seqjax eval / generate on the work dir
    assert cli.main(["generate", "--workdir", work, "--prompt", "ROMEO:",
                     "--max_new_tokens", "5"]) == 0
    assert cli.main(["eval", "--workdir", work]) == 0


def test_bad_inputs_are_refused_by_name(bins, tmp_path, capsys):
    data, rank = bins
    base = ["train", "gpt2", "--smoke", f"--rank_file={rank}",
            f"--workdir={tmp_path / 'w'}"]
    assert cli.main(base) == 2
    assert "--data_path is required" in capsys.readouterr().err
    # ids beyond the model's vocabulary: refused when the shards are opened
    assert cli.main([*base, f"--data_path={data}", "--vocab_size=300", "--sample_tokens=0"]) == 2
    err = capsys.readouterr().err
    assert "train.bin: token id" in err and "[0, 300)" in err
    # a corpus shorter than one window
    short = tmp_path / "short"
    short.mkdir()
    write_shard(short / "train.bin", np.arange(10), header=False)
    write_shard(short / "val.bin", np.arange(40), header=False)
    assert cli.main([*base, f"--data_path={short}", "--sample_tokens=0"]) == 2
    assert "too short for one window" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "w" / "checkpoints")
    assert not os.path.exists(tmp_path / "w" / "experiment.json")  # nothing of a refused run


def test_character_shards_train_and_sample_from_a_prompt(tmp_path, capsys):
    """``seqjax prepare --tokenizer char`` (nanoGPT's shakespeare_char): a tokenizer with no
    end-of-text token trains, samples from ``--sample_prompt``, and is refused without one
    (or with document-aligned windows) before the first step."""
    from seqjax.data.prepare import prepare

    data = tmp_path / "chars"
    prepare(FIXTURE, data, tokenizer="char", format="nanogpt", split="text", workers=1)
    work = tmp_path / "w"
    base = ["train", "gpt2", "--smoke", f"--data_path={data}", "--vocab_size=65",
            "--tokenizer=char", f"--workdir={work}"]  # char: the tokenizer.json beside them
    assert cli.main(base) == 2
    assert "--sample_prompt: the tokenizer" in capsys.readouterr().err
    assert cli.main([*base, "--sample_prompt=ROMEO:", "--align=document"]) == 2
    assert "--align=document" in capsys.readouterr().err
    assert not os.path.exists(work / "checkpoints")
    assert cli.main([*base, "--sample_prompt=ROMEO:"]) == 0
    summary = json.loads((work / "gpt2.json").read_text())
    assert summary["sample"].startswith("ROMEO:") and len(summary["sample"]) == 6 + 8
    assert "from the prompt 'ROMEO:'" in (work / "gpt2.md").read_text()
    # a text file as --data_path, tokenised at the start (its characters); an LSTM on windows
    # drawn on the device; nanoGPT's estimate beside the whole validation split
    text = open(FIXTURE, encoding="utf-8").read()
    work = tmp_path / "text"
    assert cli.main(["train", "gpt2", "--smoke", f"--data_path={FIXTURE}", "--tokenizer=char",
                     f"--vocab_size={len(set(text))}", "--model.architecture=lstm",
                     "--input=device", "--eval_batches=2", "--val_tokens=0",
                     "--sample_prompt=ROMEO:",                     f"--workdir={work}"]) == 0
    summary = json.loads((work / "gpt2.json").read_text())
    assert summary["val_tokens"] == len(text) - int(len(text) * 0.9) - 1  # every one but the first
    assert summary["val_loss_estimate"] > 0 and summary["train_loss_estimate"] > 0
    assert "| model | LSTM 1 x 16, T = 16" in (work / "gpt2.md").read_text()


def test_every_input_is_checked_before_the_first_step(bins, tmp_path, capsys):
    """A broken evaluation file, an item that does not fit the window, a work dir resumed on
    other data: one line naming the option or work dir, exit 2, nothing trained or written."""
    data, rank = bins
    work = tmp_path / "w"
    base = ["train", "gpt2", "--smoke", f"--data_path={data}", f"--rank_file={rank}",
            f"--workdir={work}", "--sample_tokens=0"]
    hs = tmp_path / "hellaswag_val.jsonl"
    _hellaswag(hs)
    hs.write_text(hs.read_text() + '{"ctx": "a", "endings": ["b"], "label": 0}\n')
    assert cli.main([*base, f"--hellaswag={hs}"]) == 2
    err = capsys.readouterr().err
    assert f"--hellaswag: {hs}, line 3: 'endings' must be a list of at least 2" in err
    long = tmp_path / "lambada.jsonl"
    long.write_text(json.dumps({"context": "a", "continuation": "word " * 40}) + "\n")
    assert cli.main([*base, f"--tasks={long}"]) == 2
    assert "--tasks: task 'lambada', item 0: a continuation of" in capsys.readouterr().err
    assert not os.path.exists(work / "checkpoints") and not os.path.exists(work / "metrics.jsonl")
    # train 2 steps, then resume on other data (the validation bin as the training split)
    assert cli.main([*base, "--steps=2"]) == 0
    other = tmp_path / "other"
    other.mkdir()
    for split in ("train", "val"):
        write_shard(other / f"{split}.bin", np.fromfile(os.path.join(data, "val.bin"),
                                                        np.uint16), header=False)
    assert cli.main([*base, f"--data_path={other}", "--steps=4"]) == 2
    err = capsys.readouterr().err
    assert (f"the work dir {str(work)!r} holds a run trained on other data "
            f"(--data_path {data!r})") in err
    assert "num_tokens" in err and "another --workdir" in err
    saved = json.loads((work / "experiment.json").read_text())["config"]
    assert saved["data_path"] == data and saved["steps"] == 2  # the refused run changed nothing


def test_offline_without_gpt2_ranks_says_where_it_looked(bins, tmp_path, monkeypatch, capsys):
    tiktoken_load = pytest.importorskip("tiktoken.load")
    from seqjax.data import text_tokenizers

    def offline(*args, **kwargs):
        raise ConnectionError("Max retries exceeded with url: openaipublic.blob.core.windows.net")

    data, _ = bins
    monkeypatch.setattr(text_tokenizers, "gpt2_rank_file", lambda: None)
    monkeypatch.setattr(tiktoken_load, "read_file", offline)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))
    import tiktoken.registry
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # no encoding built before
    assert cli.main(["train", "gpt2", "--smoke", f"--data_path={data}",
                     f"--workdir={tmp_path / 'w'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ": error: --tokenizer: GPT-2's BPE ranks are not" in err[0]
    for named in ("--rank_file", "openai-whisper", str(tmp_path / "empty_cache"),
                  "TIKTOKEN_CACHE_DIR", "ConnectionError"):
        assert named in err[0]


def test_a_stopped_run_exits_75_at_any_point_and_the_same_command_finishes(
        bins, tmp_path, monkeypatch, capsys):
    """SIGTERM while the data is opened (before fit: nothing trained), in the middle of
    training (saved at the next step) and after training (the results written): each exits
    75 with one line; the same command then finishes with 0."""
    import signal
    import threading

    from seqjax.data.shard_windows import ShardWindows
    from seqjax.train.preemption import EXIT_STOPPED

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled in the main thread only")
    data, rank = bins
    work = tmp_path / "w"
    argv = ["train", "gpt2", "--smoke", f"--data_path={data}", f"--rank_file={rank}",
            f"--workdir={work}", "--sample_tokens=0", "--steps=6", "--checkpoint_every=2"]
    from seqjax.experiments import _gpt  # the recipe gpt2 and char_lm are presets of

    load_tokens = _gpt.load_tokens

    def term_while_opening(cfg):
        signal.raise_signal(signal.SIGTERM)
        return load_tokens(cfg)

    with monkeypatch.context() as m:
        m.setattr(_gpt, "load_tokens", term_while_opening)
        assert cli.main(argv) == EXIT_STOPPED
    err = capsys.readouterr().err
    assert "SIGTERM: stopped at step 0 before training" in err
    assert "seqjax: stopped by SIGTERM at step 0; the same command resumes the run (exit status " \
           "75)" in err
    assert not (work / "checkpoints").exists() or not os.listdir(work / "checkpoints")
    assert not (work / "metrics.jsonl").read_text()  # nothing trained

    batch = ShardWindows.batch

    def term_at_step_3(self, step):
        if step == 3:
            signal.raise_signal(signal.SIGTERM)
        return batch(self, step)

    with monkeypatch.context() as m:
        m.setattr(ShardWindows, "batch", term_at_step_3)
        assert cli.main(argv) == EXIT_STOPPED
    err = capsys.readouterr().err
    assert "SIGTERM: stopped at step 4; checkpoint saved in" in err
    assert not (work / "gpt2.json").exists()  # nothing written from a part-trained run

    from seqjax.experiments import _kit
    write_results = _kit.write_results

    def term_while_writing(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        return write_results(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(_kit, "write_results", term_while_writing)
        assert cli.main(argv) == EXIT_STOPPED
    assert "stopped by SIGTERM after training (its results written)" in capsys.readouterr().err
    assert cli.main(argv) == 0  # finished: evaluated again, 0
    assert json.loads((work / "gpt2.json").read_text())["steps"] == 6


def test_a_manifest_of_another_tokenizer_is_refused(bins, tmp_path, capsys):
    data, rank = bins
    from seqjax._io import write_json
    from seqjax.data.shards import read_shard, sha256_file

    folder = tmp_path / "shards"
    folder.mkdir()
    for split, name in (("val", "x_val_000000.bin"), ("train", "x_train_000001.bin")):
        write_shard(folder / name, read_shard(os.path.join(data, f"{split}.bin"), header=False))
    entries = [{"file": n, "split": s, "tokens": len(read_shard(folder / n)),
                "sha256": sha256_file(folder / n)}
               for s, n in (("val", "x_val_000000.bin"), ("train", "x_train_000001.bin"))]
    write_json(folder / "manifest.json", {"format": "llmc", "shards": entries, "tokenizer": {
        "kind": "huggingface", "name": "other", "vocab_size": 32000, "eot": 2}})
    rc = cli.main(["train", "gpt2", "--smoke", f"--data_path={folder}", f"--rank_file={rank}",
                   f"--workdir={tmp_path / 'w'}"])
    assert rc == 2
    assert "another tokenizer" in capsys.readouterr().err


def test_micro_batch_sets_the_accumulation():
    cfg = gpt2.Config()
    assert cfg.batch_size * cfg.block_size == 524_288  # llm.c's tokens per step
    assert gpt2.grad_accum(cfg, 8) == 4 and gpt2.grad_accum(cfg, 1) == 32
    assert gpt2.grad_accum(cfg, 64) == 1
    with pytest.raises(ValueError, match="multiple of --micro_batch_size"):
        gpt2.grad_accum(gpt2.Config(batch_size=500), 8)
    # one number, one option: --grad_accum beside a micro-batch size is refused, not ignored
    with pytest.raises(ValueError, match=r"--grad_accum \(4\) and --micro_batch_size \(16\)"):
        gpt2.grad_accum(gpt2.Config(grad_accum=4), 8)
    assert gpt2.grad_accum(gpt2.Config(grad_accum=4, micro_batch_size=None), 8) == 4


def test_124m_is_gpt2_small_padded():
    from seqjax.utils import count_params

    model = gpt2.build_model(gpt2.Config())
    cfg = model.config
    assert (cfg.num_layers, cfg.embed_dim, cfg.block_size, cfg.vocab_size) == (12, 768, 1024, 50304)
    assert cfg.block.dropout_rate == 0.0 and cfg.block.use_bias
    import jax
    import jax.numpy as jnp

    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
    # GPT-2 124M: 124,439,808 parameters at |V| = 50257; 36,096 more for the 47 padded rows
    assert count_params(shapes["params"]) == 124_439_808 + 47 * 768


def test_modern_smoke_trains_with_muon_and_resumes_bit_for_bit(bins, tmp_path):
    """Every modern switch and Muon through the recipe; a run restarted from its step-2
    checkpoint ends on the parameters of the run that was not interrupted."""
    import shutil

    import jax

    from seqjax.train.checkpoint import restore_params

    data, rank = bins
    work = tmp_path / "w"
    argv = ["train", "gpt2", "--preset", "modern_smoke", f"--data_path={data}",
            f"--rank_file={rank}", "--sample_tokens=0", "--checkpoint_every=2",
            f"--workdir={work}"]
    assert cli.main(argv) == 0
    summary = json.loads((work / "gpt2.json").read_text())
    assert summary["steps"] == 4 and 9.0 < summary["val_loss"] < 11.5
    saved = json.loads((work / "experiment.json").read_text())
    assert saved["config"]["optimizer"] == "muon"
    assert saved["config"]["model"]["positions"] == "rope"
    model = gpt2.build_model(_preset("modern_smoke")).config
    assert (model.logit_softcap, model.tie_embeddings, model.block.qk_norm) == (30.0, False, True)
    uninterrupted = restore_params(str(work / "checkpoints"))
    shutil.rmtree(work / "checkpoints" / "4")  # as if the run had stopped after step 2's
    assert cli.main(argv) == 0
    resumed = restore_params(str(work / "checkpoints"))
    for a, b in zip(jax.tree_util.tree_leaves(uninterrupted), jax.tree_util.tree_leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_muon_options_reach_the_optimizer_and_bad_values_are_refused(capsys):
    opt = gpt2.optimizer(_preset("modern"))
    assert opt.name == "muon" and opt.learning_rate == 0.05 and opt.ns_steps == 5
    assert dict(opt.group_learning_rates) == {"embed": 0.6, "head": 0.008, "scalar": 0.04}
    adamw = gpt2.optimizer(_preset("modern", optimizer="adamw"))
    assert adamw.name == "adamw" and adamw.learning_rate == 0.04  # AdamW stays available
    for bad, match in (("--ns_steps=0", "ns_steps"),
                       ("--model.logit_softcap=-1", "--model.logit_softcap"),
                       ("--optimizer=lion", "optimizer")):
        assert cli.main(["train", "gpt2", "--preset", "modern_smoke", bad, "--data_path=x"]) == 2
        assert match in capsys.readouterr().err


def test_the_network_is_one_group_of_options_and_the_flat_spellings_name_it(capsys):
    """``--model.KEY`` reaches the model; the flat spellings of before exit 2 with the new
    one; ``--help`` lists the group; an ``experiment.json`` and a checkpoint record written
    with the flat names are still read."""
    from seqjax.experiments._config import config_from_dict
    from seqjax.experiments._runner import build_config, experiment_help

    cfg = build_config(gpt2, "gpt2", ["--model.num_layers=2", "--model.positions=rope",
                                      "--model.architecture=transformer"], resume=False)
    model = gpt2.build_model(cfg).config
    assert (model.num_layers, model.positions, model.block.use_rope) == (2, "rope", True)
    for argv, says in ((["--num_layers=2"], "--num_layers is now --model.num_layers"),
                       (["--model=lstm"], "--model is now --model.architecture (the options "
                                         "of --model are one group); use "
                                         "--model.architecture=lstm."),
                       (["--model.num_layer=2"], "Did you mean --model.num_layers?"),
                       (["--model.embed_dim=10", "--model.num_heads=4"],
                        "--model.embed_dim must be a multiple of --model.num_heads"),
                       (["--model.dropout_rate=1.5"], "--model.dropout_rate must")):
        assert cli.main(["train", "gpt2", "--smoke", *argv, "--data_path=x"]) == 2
        assert says in capsys.readouterr().err
    for argv, says in ((["--model"], "use --model.architecture=VALUE."),
                       (["--model.=lstm"], "--model.: no option named after the '.'"),
                       (["--model.model=lstm"], "--model.model is now --model.architecture")):
        assert cli.main(["train", "gpt2", "--smoke", *argv, "--data_path=x"]) == 2
        assert says in capsys.readouterr().err
    # a group given whole (a preset's dict) goes over the recipe's group, not the class's
    cfg = apply_overrides(char_lm.Config(), {"model": {"num_layers": 3}})
    assert cfg.model == dataclasses.replace(char_lm.Config().model, num_layers=3)
    assert "--model.attention_dropout_rate (float in [0, 1) | None" in experiment_help("gpt2")
    old = {**{k: v for k, v in _preset("smoke").__dict__.items() if k != "model"},
           "model": "lstm", "num_layers": 3, "embed_dim": 24, "attention_dropout_rate": 0.1,
           "dropout": 0.2}  # "dropout": renamed "dropout_rate" before it moved
    read = config_from_dict(gpt2.Config, old)
    assert read.model == gpt2.ModelOptions(architecture="lstm", num_layers=3, embed_dim=24,
                                           attention_dropout_rate=0.1, dropout_rate=0.2)
    assert cli.main(["train", "char_lm", "--attention_dropout=0"]) == 2
    assert "--model.attention_dropout_rate" in capsys.readouterr().err
    # a saved group's bad value names the option as it is now spelled; a group saved as
    # something else than its options is refused, naming it
    from seqjax.experiments import image_gpt

    saved = {**dataclasses.asdict(char_lm.Config()), "model": {"num_layers": "x"}}
    with pytest.raises(ConfigError, match="--model.num_layers: expected int; got 'x'"):
        config_from_dict(char_lm.Config, saved)
    with pytest.raises(ConfigError, match="--model is a group of options"):
        config_from_dict(image_gpt.Config, {**dataclasses.asdict(image_gpt.Config()), "model": 3})
    # the checkpoint's record keeps the flat names, so a work dir of before still resumes
    assert gpt2.model_config(read) == {"vocab_size": 50304, "block_size": 16,
                                       "tokenizer": "gpt2", "num_layers": 3, "num_heads": 12,
                                       "embed_dim": 24, "use_bias": True,
                                       "activation": "gelu_tanh", "model": "lstm",
                                       "attention_dropout_rate": 0.1}

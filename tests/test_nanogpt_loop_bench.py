"""The nanoGPT training-loop benchmark (``benchmarks/nanogpt_loop.py``) and the torch peer's
device handling in ``benchmarks/gpt.py``: CPU-only, a few seconds."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from benchmarks import gpt, nanogpt_loop  # noqa: E402

LAST_LINE = re.compile(r"^nanogpt_loop: ms/iter \d+\.\d{3}; steps/s \d+\.\d{3}$")


def _last_line(out: str) -> str:
    return out.rstrip("\n").splitlines()[-1]


def test_smoke_main_ends_with_the_grep_line(capsys):
    assert nanogpt_loop.main(["--smoke", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert LAST_LINE.match(_last_line(out)), _last_line(out)
    assert "preset smoke" in out and "device cpu" in out and "iter 4: loss" in out


def test_smoke_without_a_data_file_uses_random_tokens(monkeypatch, capsys):
    monkeypatch.setattr(nanogpt_loop, "default_data_path", lambda: None)
    assert nanogpt_loop.main(["--smoke", "--quiet", "--steps", "3", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "random tokens" in out and "iter 0: loss" not in out
    assert LAST_LINE.match(_last_line(out))


def test_main_refuses_a_missing_data_file_and_an_absent_gpu():
    with pytest.raises(SystemExit):
        nanogpt_loop.main(["--smoke", "--data_path", "/no/such/file.txt"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            nanogpt_loop.main(["--smoke", "--device", "cuda"])
        with pytest.raises(ValueError, match="CUDA"):
            nanogpt_loop.run_loop("smoke", 2, "cuda", None)


def test_run_loop_learns_a_repetitive_text(tmp_path):
    path = tmp_path / "rep.txt"
    path.write_text("to be or not to be, that is the question. " * 200)
    res = nanogpt_loop.run_loop("smoke", 20, "cpu", str(path), warmup=5)
    for key in ("ms_per_iter", "steps_per_s", "wall_s", "final_loss"):
        assert math.isfinite(res[key]) and res[key] > 0, key
    assert res["device"] == "cpu" and res["timed_iters"] == 15 and not res["compiled"]
    assert res["steps_per_s"] == pytest.approx(1e3 / res["ms_per_iter"])
    assert "|V| = 15" in res["data"]
    assert [it for it, _ in res["losses"]] == list(range(20))  # log_interval 1
    first, last = res["losses"][0][1], res["final_loss"]
    assert first == pytest.approx(math.log(15), abs=0.3)  # ~uniform at initialisation
    assert last < first - 0.3


def test_warmup_is_capped_so_one_iteration_is_timed():
    res = nanogpt_loop.run_loop("smoke", 2, "cpu", None, warmup=10)
    assert res["warmup"] == 1 and res["timed_iters"] == 1


def test_lr_schedule_is_warmup_then_cosine():
    p = nanogpt_loop.PRESETS["gpu"]
    lrs = [nanogpt_loop.get_lr(it, p) for it in range(p.lr_decay_iters + 10)]
    warm = lrs[: p.warmup_iters]
    assert all(a < b for a, b in zip(warm, warm[1:])) and warm[-1] < p.learning_rate
    assert lrs[p.warmup_iters] == pytest.approx(p.learning_rate)
    mid = (p.warmup_iters + p.lr_decay_iters) // 2
    assert lrs[mid] == pytest.approx((p.learning_rate + p.min_lr) / 2, rel=1e-3)
    assert lrs[p.lr_decay_iters] == pytest.approx(p.min_lr)
    assert lrs[-1] == p.min_lr


def test_presets_are_nanogpts():
    g, c = nanogpt_loop.PRESETS["gpu"], nanogpt_loop.PRESETS["cpu"]
    assert (g.num_layers, g.num_heads, g.embed_dim, g.block_size, g.batch) == (6, 6, 384, 256, 64)
    assert (g.dropout, g.learning_rate, g.min_lr, g.warmup_iters) == (0.2, 1e-3, 1e-4, 100)
    assert (g.beta2, g.weight_decay, g.bias, g.compile, g.log_interval) == (
        0.99, 0.1, False, True, 10)
    assert (c.num_layers, c.num_heads, c.embed_dim, c.block_size, c.batch) == (4, 4, 128, 64, 12)
    assert (c.dropout, c.compile) == (0.0, False)


def test_encoding_is_sorted_characters_and_the_split_is_90_10(tmp_path):
    ids, vocab = nanogpt_loop.encode_text("hello, world")
    chars = sorted(set("hello, world"))
    assert vocab == len(chars) and ids.dtype == np.uint16
    assert "".join(chars[i] for i in ids) == "hello, world"
    path = tmp_path / "t.txt"
    path.write_text("abcdefghij" * 10)
    train, vocab, note = nanogpt_loop.load_train_tokens(str(path), block_size=4)
    assert vocab == 10 and len(train) == 90 and str(path) in note


# ----------------------------------------------------------------------------- gpt.py


def test_torch_gpt_without_dropout_is_unchanged():
    """dropout=0 (the default) builds the same parameters and computes the same outputs,
    in training mode, as before dropout existed; dropout > 0 only acts in training mode."""
    idx = torch.from_numpy(gpt.batch_tokens(gpt.SMOKE)[:, :-1].astype(np.int64))

    def build(**kw):
        torch.manual_seed(0)
        return gpt.torch_gpt(gpt.SMOKE, **kw)

    plain, zero, drop = build(), build(dropout=0.0), build(dropout=0.3)
    with torch.no_grad():
        ref = plain.train()(idx)
        torch.testing.assert_close(zero.train()(idx), ref, rtol=0, atol=0)
        torch.testing.assert_close(plain.eval()(idx), ref, rtol=0, atol=0)
        torch.testing.assert_close(drop.eval()(idx), ref, rtol=0, atol=0)
        assert not torch.allclose(drop.train()(idx), ref)
    with pytest.raises(ValueError):
        gpt.torch_gpt(gpt.SMOKE, dropout=1.0)


def test_torch_peer_on_cpu_is_fp32_eager_and_unchanged():
    if torch.cuda.is_available():
        pytest.skip("the CPU path is only taken without CUDA")
    prepared = gpt.torch_peer(gpt.SMOKE)
    assert prepared.compile_kind == "first call"
    losses = [prepared.step() for _ in range(3)]
    # The losses of the 2nd to 4th steps (seed 0; the 1st is the set-up call) as the peer
    # computed them before it had a CUDA path.
    assert losses == pytest.approx([4.165657997131348, 4.135170936584473, 4.105551242828369],
                                   rel=1e-4)
    with pytest.raises(ValueError, match="CUDA only"):
        gpt.torch_peer(gpt.SMOKE, "bfloat16")
    with pytest.raises(SystemExit):
        gpt.main(["--smoke", "--dtype", "bfloat16", "--peers", "seqjax,torch-nanogpt"])
    opt = gpt.torch_optimizer(gpt.torch_gpt(gpt.SMOKE))
    assert not opt.defaults.get("fused")  # fused AdamW on CUDA only
    assert "CPU, eager, fp32" in gpt.torch_note("float32")


def test_torch_gpt_accepts_the_gpt2_small_shape():
    shape = gpt.GPTShape(num_layers=12, num_heads=12, embed_dim=768, block_size=1024,
                         batch=1, vocab_size=50304, use_bias=True)
    with torch.device("meta"):  # no memory, no compute: the shapes only
        model = gpt.torch_gpt(shape)
        logits = model(torch.zeros(1, 1024, dtype=torch.long))
    n = sum(p.numel() for p in model.parameters())
    assert n - 1024 * 768 == 123_689_472  # nanoGPT's count (no positions) at |V| = 50304
    assert logits.shape == (1, 1024, 50304)

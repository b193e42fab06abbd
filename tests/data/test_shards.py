"""Token shards on disk (llm.c's format, nanoGPT's bins, the manifest) and the step-indexed
loader over them: every bad file refused by name, the batch of step s a pure function of
(seed, s), the same global batch whatever the number of processes, exact resume."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from seqjax._io import write_json
from seqjax.data.iterators import LMWindowIterator
from seqjax.data.shard_windows import ShardWindows, ValidationWindows
from seqjax.data.shards import (
    HEADER_BYTES,
    MAGIC,
    ShardError,
    open_tokens,
    read_shard,
    sha256_file,
    write_shard,
)

EOT = 99


def _llmc(folder, train_sizes=(3000, 500, 2000), val_size=400, vocab=90, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    write_shard(os.path.join(folder, "t_val_000000.bin"), rng.integers(0, vocab, val_size))
    shards = []
    for i, n in enumerate(train_sizes, 1):
        ids = rng.integers(0, vocab, n)
        ids[rng.random(n) < 0.02] = EOT  # documents
        ids[0] = EOT
        write_shard(os.path.join(folder, f"t_train_{i:06d}.bin"), ids)
        shards.append(ids)
    return shards


# ----------------------------------------------------------------------------- the format


def test_llmc_header_layout_is_llmc(tmp_path):
    """256 int32 (magic, version, count), then uint16 little-endian: llm.c's
    dev/data/data_common.py write_datafile."""
    path = tmp_path / "x_train_000001.bin"
    write_shard(path, [1, 2, 65535])
    raw = path.read_bytes()
    head = np.frombuffer(raw[:HEADER_BYTES], "<i4")
    assert head[:3].tolist() == [20240520, 1, 3] and not head[3:].any()
    assert np.frombuffer(raw[HEADER_BYTES:], "<u2").tolist() == [1, 2, 65535]
    assert len(raw) == HEADER_BYTES + 6
    assert read_shard(path).tolist() == [1, 2, 65535]


def test_nanogpt_bins_read_as_they_are(tmp_path):
    ids = np.arange(1000) % 50257
    ids.astype(np.uint16).tofile(tmp_path / "train.bin")  # nanoGPT's prepare.py
    np.arange(100).astype(np.uint16).tofile(tmp_path / "val.bin")
    for path in (tmp_path, tmp_path / "train.bin"):
        data = open_tokens(path, vocab_size=50257)
        assert data.format == "nanogpt" and data.manifest is None
        assert np.array_equal(data.train[0], ids) and data.num_tokens("val") == 100


@pytest.mark.parametrize(("corrupt", "message"), [
    (lambda raw: np.int32(7).tobytes() + raw[4:], "magic 7, expected 20240520"),
    (lambda raw: raw[:4] + np.int32(2).tobytes() + raw[8:], "version 2, expected 1"),
    (lambda raw: raw[:-2], "the header says 100 tokens .* but the file has"),
    (lambda raw: raw + b"\0\0", "the header says 100 tokens"),
    (lambda raw: raw[:100], "shorter than llm.c's 1024-byte header"),
])
def test_a_bad_shard_is_refused_by_name(tmp_path, corrupt, message):
    path = tmp_path / "x_train_000001.bin"
    write_shard(path, np.arange(100))
    path.write_bytes(corrupt(path.read_bytes()))
    with pytest.raises(ShardError, match=message) as err:
        read_shard(path)
    assert str(path) in str(err.value)


def test_ids_outside_the_vocabulary_are_refused_when_opened(tmp_path):
    _llmc(tmp_path, vocab=90)
    open_tokens(tmp_path, vocab_size=100)
    with pytest.raises(ShardError, match=r"t_train_000001.bin: token id 99 is outside the "
                                         r"model's vocabulary \[0, 50\)"):
        open_tokens(tmp_path, vocab_size=50)


def test_writes_refuse_what_uint16_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match=r"\[0, 65535\]"):
        write_shard(tmp_path / "a.bin", [0, 70000])
    with pytest.raises(ValueError, match="1-D integer"):
        write_shard(tmp_path / "a.bin", np.ones((2, 2)))
    assert not list(tmp_path.iterdir())  # nothing half written


def test_manifest_counts_sha_and_tokenizer(tmp_path):
    _llmc(tmp_path)
    files = sorted(p.name for p in tmp_path.glob("*.bin"))
    entries = [{"file": f, "split": "val" if "_val_" in f else "train",
                "tokens": len(read_shard(tmp_path / f)), "sha256": sha256_file(tmp_path / f)}
               for f in files]
    tok = {"kind": "tiktoken", "name": "gpt2", "vocab_size": 50257, "eot": 50256}
    write_json(tmp_path / "manifest.json", {"format": "llmc", "tokenizer": tok,
                                            "shards": entries})
    data = open_tokens(tmp_path / "manifest.json", verify=True)
    assert data.num_tokens("train") == 5500 and data.tokenizer == tok
    data.check_tokenizer({"name": "gpt2", "vocab_size": 50257})
    with pytest.raises(ShardError, match="another tokenizer .*vocab_size: the run's 100"):
        data.check_tokenizer({"name": "gpt2", "vocab_size": 100})
    # a count that disagrees with the file, a changed byte, a missing shard
    bad = json.loads((tmp_path / "manifest.json").read_text())
    bad["shards"][0]["tokens"] += 1
    write_json(tmp_path / "m2.json", bad)
    with pytest.raises(ShardError, match="the manifest says"):
        open_tokens(tmp_path / "m2.json")
    raw = bytearray((tmp_path / files[0]).read_bytes())
    raw[-1] ^= 1
    (tmp_path / files[0]).write_bytes(bytes(raw))
    with pytest.raises(ShardError, match="SHA-256"):
        open_tokens(tmp_path, verify=True)
    os.remove(tmp_path / files[0])
    with pytest.raises(ShardError, match="does not exist .*rerun"):
        open_tokens(tmp_path)


def test_no_shards_or_no_validation_split(tmp_path):
    with pytest.raises(ShardError, match="no token shards"):
        open_tokens(tmp_path)
    write_shard(tmp_path / "x_train_000001.bin", np.arange(10))
    with pytest.raises(ShardError, match="no val shard"):
        open_tokens(tmp_path)
    assert MAGIC == 20240520


# ----------------------------------------------------------------------------- the loader


def test_the_global_batch_is_the_same_for_any_number_of_processes(tmp_path):
    shards = open_tokens(_llmc(tmp_path) and tmp_path).train
    one = ShardWindows(shards, 12, 32, seed=5)
    parts = [ShardWindows(shards, 3, 32, seed=5, host_index=i, host_count=4)
             for i in range(4)]
    for _ in range(6):
        whole = next(one)
        rows = [next(p) for p in parts]
        for key in ("inputs", "targets"):
            assert np.array_equal(whole[key], np.concatenate([r[key] for r in rows]))


def test_windows_come_from_one_shard_and_cover_every_shard(tmp_path):
    raw = _llmc(tmp_path)
    data = open_tokens(tmp_path)
    it = ShardWindows(data.train, 64, 32, seed=0)
    seen = set()
    for step in range(20):
        shard_G, start_G = it.global_starts(step)
        b = next(it)
        for r, (s, start) in enumerate(zip(shard_G, start_G)):
            assert 0 <= start <= len(raw[s]) - 33
            assert np.array_equal(b["inputs"][r], raw[s][start: start + 32])
            assert np.array_equal(b["targets"][r], raw[s][start + 1: start + 33])
            seen.add(int(s))
    assert seen == {0, 1, 2}
    assert b["inputs"].dtype == np.int32


def test_document_aligned_windows_start_at_a_document(tmp_path):
    _llmc(tmp_path)
    data = open_tokens(tmp_path)
    it = ShardWindows(data.train, 16, 32, seed=0, align="document", eot=EOT)
    for _ in range(5):
        assert (next(it)["inputs"][:, 0] == EOT).all()
    with pytest.raises(ValueError, match="needs the end-of-text id"):
        ShardWindows(data.train, 2, 8, align="document")


def test_resume_from_the_step_alone_on_another_process_count(tmp_path):
    _llmc(tmp_path)
    shards = open_tokens(tmp_path).train
    ref = ShardWindows(shards, 8, 16, seed=3)
    want = [next(ref) for _ in range(7)]
    two = [ShardWindows(shards, 4, 16, seed=3, host_index=i, host_count=2) for i in range(2)]
    for _ in range(4):
        for p in two:
            next(p)
    state = two[1].get_state()
    assert state["step"] == 4 and state["global_batch_size"] == 8
    state = json.loads(json.dumps(state))  # what a checkpoint stores
    one = ShardWindows(shards, 8, 16, seed=3)
    one.set_state(state)
    for w in want[4:]:
        got = next(one)
        assert np.array_equal(got["inputs"], w["inputs"])
    other = ShardWindows(shards, 8, 16, seed=4)
    with pytest.raises(ValueError, match="seed: expected 4, got 3"):
        other.set_state(state)


def test_a_corpus_shorter_than_one_window_is_refused(tmp_path):
    write_shard(tmp_path / "x_train_000001.bin", np.arange(10))
    with pytest.raises(ValueError, match=r"too short for one window of block_size \+ 1 = 17 "
                                         r"tokens \(the longest shard holds 10\)"):
        ShardWindows([read_shard(tmp_path / "x_train_000001.bin")], 2, 16)
    with pytest.raises(ValueError, match="too short"):
        ValidationWindows([np.arange(10)], 2, 16)


def test_same_distribution_as_nanogpts_sampler_on_one_shard():
    """One shard: start offsets uniform on [0, N - T - 1], as nanoGPT's get_batch and
    LMWindowIterator (which draws from the same generator)."""
    ids = np.arange(500)
    ours = ShardWindows([ids], 4, 16, seed=9)
    theirs = LMWindowIterator(ids, 4, 16, seed=9)
    for _ in range(5):
        assert np.array_equal(next(ours)["inputs"], next(theirs)["inputs"])


def test_validation_windows_are_fixed_tokens_in_order():
    shards = [np.arange(100), np.arange(1000, 1050)]
    v = ValidationWindows(shards, 4, 10, num_tokens=60)
    assert v.tokens == 60 and len(v) == 2
    first, last = v[0], v[1]
    assert first["inputs"][0].tolist() == list(range(10))
    assert first["targets"][0].tolist() == list(range(1, 11))
    assert last["mask"][:2].all() and not last["mask"][2:].any()
    everything = ValidationWindows(shards, 4, 10)
    rows = sum(int(b["mask"][:, 0].sum()) for b in everything)
    assert rows == 9 + 4  # windows of 11 tokens in each shard, never across
    assert everything[-1]["inputs"][0].tolist() == list(range(1030, 1040))

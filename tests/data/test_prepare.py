"""seqjax.data.prepare (``seqjax prepare``): llm.c shards and nanoGPT bins read back by
open_tokens, the validation split's rules, any number of workers giving the same bytes,
jsonl / parquet / datasets inputs, atomic restarts, bad input, and nanoGPT's and llm.c's
Tiny Shakespeare numbers (corpus-marked)."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from seqjax.data import prepare as prepare_module
from seqjax.data.prepare import PARTIAL_DIR, main, prepare
from seqjax.data.shards import MANIFEST, ShardError, open_tokens, read_shard, sha256_file
from seqjax.data.text_tokenizers import load_text_tokenizer
from seqjax.data.tokenizers import CharTokenizer, SpecialTokens
from tests.conftest import FIXTURES_DIR
from tests.data.test_text_tokenizers import _tokenizer_json, gpt2_or_skip

FIXTURE = os.path.join(FIXTURES_DIR, "tinyshakespeare.txt")
with open(FIXTURE, encoding="utf-8") as _f:
    TEXT = _f.read()


def paragraphs(text: str) -> list[str]:
    """llm.c's tinyshakespeare.py documents: cut at "\\n\\n", which ends each but the last."""
    parts = text.split("\n\n")
    return [p + "\n\n" if i < len(parts) - 1 else p for i, p in enumerate(parts)]


@pytest.fixture
def chars(tmp_path) -> str:
    """A seqjax character tokenizer of the fixture (eos = 3), as a prepare spec."""
    path = tmp_path / "chars.json"
    CharTokenizer.from_text(TEXT + "{}\"").save(path)
    return f"seqjax:{path}"


def concat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a) for a in arrays])


def check_manifest(out) -> dict:
    """The manifest's shards exist with its counts and SHA-256; returns it."""
    with open(os.path.join(out, MANIFEST), encoding="utf-8") as f:
        manifest = json.load(f)
    for entry in manifest["shards"]:
        path = os.path.join(out, entry["file"])
        assert sha256_file(path) == entry["sha256"]
        header = manifest["format"] == "llmc"
        assert len(read_shard(path, header=header)) == entry["tokens"]
    assert not os.path.exists(os.path.join(out, PARTIAL_DIR))
    return manifest


def test_llmc_gpt2_shards_read_back(tmp_path):
    tok = gpt2_or_skip()
    out = tmp_path / "out"
    manifest = prepare(FIXTURE, out, tokenizer="gpt2", docs="paragraphs", shard_size=700,
                       val_documents=3, workers=1)
    docs = paragraphs(TEXT)
    expected = [[tok.eot] + tok.encode(d) for d in docs]
    data = open_tokens(out, vocab_size=50257, verify=True)
    assert data.format == "llmc" and data.tokenizer == tok.describe()
    val, train = concat(data.val), concat(data.train)
    np.testing.assert_array_equal(val, sum(expected[:3], []))
    np.testing.assert_array_equal(train, sum(expected[3:], []))
    # EOT opens every document and appears nowhere else.
    assert int((train == tok.eot).sum()) == len(docs) - 3 and train[0] == tok.eot
    files = [e["file"] for e in manifest["shards"]]
    assert files[0] == "tinyshakespeare_val_000000.bin"
    assert files[1:] == [f"tinyshakespeare_train_{i:06d}.bin" for i in range(1, len(files))]
    assert all(e["tokens"] == 700 for e in manifest["shards"][1:-1])
    assert manifest["splits"]["val"] == {"tokens": len(val), "documents": 3, "shards": 1}
    assert manifest["splits"]["train"]["documents"] == len(docs) - 3
    assert sum(e["documents"] for e in manifest["shards"]) == manifest["documents"] == len(docs)
    check_manifest(out)


def test_workers_give_identical_output(tmp_path, chars, monkeypatch):
    monkeypatch.setattr(prepare_module, "_CHUNK_DOCS", 16)  # many chunks in flight
    shas = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        m = prepare(FIXTURE, out, tokenizer=chars, docs="lines", shard_size=1000,
                    val_tokens=1500, workers=workers)
        shas.append([(e["file"], e["sha256"]) for e in m["shards"]])
        check_manifest(out)
    assert shas[0] == shas[1] and len(shas[0]) > 3


def test_hf_tokenizer_json_in_workers_keeps_special_spellings(tmp_path):
    path = _tokenizer_json(tmp_path / "tokenizer.json")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"the cat<|endoftext|> {i}"}) + "\n"
                              for i in range(40)))
    made = [prepare(corpus, tmp_path / f"w{w}", tokenizer=path, val_documents=4, workers=w)
            for w in (1, 2)]
    assert [e["sha256"] for e in made[0]["shards"]] == [e["sha256"] for e in made[1]["shards"]]
    train = concat(open_tokens(tmp_path / "w2").train)
    assert int((train == 0).sum()) == 36  # one EOT per document: the spelling is text


def test_validation_rules(tmp_path, chars):
    docs = [d for d in TEXT.split("\n") if d]
    tok = load_text_tokenizer(chars)
    sizes = [len(tok.encode(d)) + 1 for d in docs]
    m = prepare(FIXTURE, tmp_path / "a", tokenizer=chars, docs="lines", workers=1)
    k = max(1, int(0.01 * len(docs)))  # the default: 1% of the documents
    assert m["splits"]["val"]["documents"] == k
    assert m["splits"]["val"]["tokens"] == sum(sizes[:k])
    assert m["options"]["validation"] == {"val_fraction": 0.01, "documents": len(docs),
                                          "val_documents": k}
    m = prepare(FIXTURE, tmp_path / "b", tokenizer=chars, docs="lines", workers=1,
                val_fraction=0.25)
    assert m["splits"]["val"]["documents"] == int(0.25 * len(docs))
    # val_tokens: exactly that many, the crossing document counted in validation, its tail
    # beginning the training split; nothing lost.
    cut = sizes[0] + sizes[1] + 5
    m = prepare(FIXTURE, tmp_path / "c", tokenizer=chars, docs="lines", workers=1,
                val_tokens=cut)
    assert m["splits"]["val"] == {"tokens": cut, "documents": 3, "shards": 1}
    assert m["splits"]["train"]["documents"] == len(docs) - 3
    assert m["tokens"] == sum(sizes)
    assert m["empty_documents_skipped"] == TEXT.splitlines().count("")


def test_nanogpt_documents_mode(tmp_path, chars):
    out = tmp_path / "nano"
    m = prepare(FIXTURE, out, tokenizer=chars, format="nanogpt", docs="paragraphs",
                val_documents=2, workers=2)
    tok = load_text_tokenizer(chars)
    expected = [tok.encode(d) + [tok.eot] for d in paragraphs(TEXT)]  # EOT after each
    data = open_tokens(out, verify=True)
    assert data.format == "nanogpt"
    assert sorted(os.listdir(out)) == [MANIFEST, "train.bin", "val.bin"]
    np.testing.assert_array_equal(concat(data.val), sum(expected[:2], []))
    np.testing.assert_array_equal(concat(data.train), sum(expected[2:], []))
    assert os.path.getsize(out / "val.bin") == 2 * m["splits"]["val"]["tokens"]  # headerless
    check_manifest(out)


def nanogpt_shakespeare(enc, text: str) -> tuple[list[int], list[int]]:
    """nanoGPT's data/shakespeare/prepare.py."""
    n = len(text)
    return enc.encode_ordinary(text[:int(n * 0.9)]), enc.encode_ordinary(text[int(n * 0.9):])


def test_nanogpt_text_split_matches_nanogpt_on_the_fixture(tmp_path):
    tok = gpt2_or_skip()
    out = tmp_path / "shakespeare"
    m = prepare(FIXTURE, out, format="nanogpt", split="text", val_fraction=0.1, workers=1)
    train, val = nanogpt_shakespeare(tok.encoding, TEXT)
    with open(out / "train.bin", "rb") as f:
        assert f.read() == np.array(train, np.uint16).tobytes()
    with open(out / "val.bin", "rb") as f:
        assert f.read() == np.array(val, np.uint16).tobytes()
    assert m["splits"]["train"]["tokens"] == len(train)
    assert m["splits"]["val"]["tokens"] == len(val)
    check_manifest(out)


def nanogpt_shakespeare_char(text: str) -> tuple[list[int], list[int], list[str]]:
    """nanoGPT's ``data/shakespeare_char/prepare.py``: the sorted distinct characters, the
    text cut at ``int(n * 0.9)``."""
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    n = len(text)
    return ([stoi[c] for c in text[:int(n * 0.9)]], [stoi[c] for c in text[int(n * 0.9):]],
            chars)


def test_char_tokenizer_writes_nanogpts_shakespeare_char(tmp_path):
    out = tmp_path / "shakespeare_char"
    m = prepare(FIXTURE, out, tokenizer="char", format="nanogpt", split="text", workers=1)
    train, val, chars = nanogpt_shakespeare_char(TEXT)
    assert (out / "train.bin").read_bytes() == np.array(train, np.uint16).tobytes()
    assert (out / "val.bin").read_bytes() == np.array(val, np.uint16).tobytes()
    tok = load_text_tokenizer(f"seqjax:{out / 'tokenizer.json'}")  # saved beside the shards
    assert tok.vocab == chars and tok.eot is None
    assert m["tokenizer"] == tok.describe() and m["options"]["tokenizer"] == "char"
    open_tokens(out).check_tokenizer(tok.describe())
    check_manifest(out)
    m = prepare(FIXTURE, tmp_path / "llmc", tokenizer="char", split="text", workers=1)
    assert concat(open_tokens(tmp_path / "llmc").train).tolist() == train  # no EOT either
    for bad in ({"split": "documents"}, {"eot": 0}):
        with pytest.raises(ValueError, match="tokenizer='char'.*needs split='text'"):
            prepare(FIXTURE, tmp_path / "x", tokenizer="char", **bad)


def test_documents_need_an_end_of_text_id(tmp_path):
    plain = CharTokenizer.from_text(TEXT, SpecialTokens.none())
    with pytest.raises(ValueError, match="no end-of-text id.*split='documents'.*load_text_tok"):
        prepare(FIXTURE, tmp_path / "out", tokenizer=plain, workers=1)
    plain.save(tmp_path / "plain.json")
    with pytest.raises(ValueError, match=r"plain.json.*no end-of-text id.*--eot ID_OR_TOKEN"):
        prepare(FIXTURE, tmp_path / "out", tokenizer=f"seqjax:{tmp_path / 'plain.json'}")
    m = prepare(FIXTURE, tmp_path / "out", tokenizer=plain, split="text", workers=1)
    assert m["tokenizer"]["eot"] is None


@pytest.mark.corpus
def test_tiny_shakespeare_counts_match_nanogpt_and_llmc(tmp_path, corpus_dir):
    tok = gpt2_or_skip()
    path = corpus_dir / "tinyshakespeare.txt"
    text = path.read_text(encoding="utf-8")
    assert len(text) == 1_115_394
    m = prepare(path, tmp_path / "nano", format="nanogpt", split="text", val_fraction=0.1,
                workers=1)
    assert (m["splits"]["train"]["tokens"], m["splits"]["val"]["tokens"]) == (301_966, 36_059)
    train, val = nanogpt_shakespeare(tok.encoding, text)
    assert (tmp_path / "nano" / "train.bin").read_bytes() == np.array(train, np.uint16).tobytes()
    assert (tmp_path / "nano" / "val.bin").read_bytes() == np.array(val, np.uint16).tobytes()
    # llm.c's dev/data/tinyshakespeare.py: paragraphs, EOT first, val = the first 32,768 tokens.
    m = prepare(path, tmp_path / "llmc", docs="paragraphs", val_tokens=32_768, workers=2)
    assert (m["splits"]["train"]["tokens"], m["splits"]["val"]["tokens"]) == (305_260, 32_768)
    stream = [t for d in paragraphs(text) for t in [tok.eot] + tok.encode(d)]
    data = open_tokens(tmp_path / "llmc", vocab_size=50257, verify=True)
    np.testing.assert_array_equal(concat(data.val), stream[:32_768])
    np.testing.assert_array_equal(concat(data.train), stream[32_768:])
    # nanoGPT's data/shakespeare_char/prepare.py: 65 characters, 1,003,854 / 111,540.
    m = prepare(path, tmp_path / "char", tokenizer="char", format="nanogpt", split="text",
                workers=1)
    assert (m["splits"]["train"]["tokens"], m["splits"]["val"]["tokens"],
            m["tokenizer"]["vocab_size"]) == (1_003_854, 111_540, 65)


def test_jsonl_and_parquet_inputs(tmp_path, chars):
    lines = [d for d in TEXT.split("\n") if d]
    txt = tmp_path / "lines.txt"
    txt.write_text("\n".join(lines) + "\n", encoding="utf-8")
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"body": d, "id": i}) + "\n"
                             for i, d in enumerate(lines)), encoding="utf-8")
    kw = dict(tokenizer=chars, val_documents=5, shard_size=2000, workers=1, name="x")
    ref = prepare(txt, tmp_path / "txt", docs="lines", **kw)
    got = prepare(jsonl, tmp_path / "jsonl", text_field="body", **kw)
    assert [e["sha256"] for e in got["shards"]] == [e["sha256"] for e in ref["shards"]]
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    folder = tmp_path / "parquet"
    folder.mkdir()
    pq.write_table(pa.table({"body": lines[:100]}), folder / "a.parquet")
    pq.write_table(pa.table({"body": lines[100:]}), folder / "b.parquet")
    got = prepare(folder, tmp_path / "pq", text_field="body", **kw)  # a folder, sorted
    assert [e["sha256"] for e in got["shards"]] == [e["sha256"] for e in ref["shards"]]
    assert got["inputs"]["files"] == [str(folder / "a.parquet"), str(folder / "b.parquet")]
    got = prepare(str(folder / "*.parquet"), tmp_path / "glob", text_field="body", **kw)
    assert [e["sha256"] for e in got["shards"]] == [e["sha256"] for e in ref["shards"]]
    with pytest.raises(ValueError, match=r"a.parquet: no column 'text'.*\['body'\]"):
        prepare(folder, tmp_path / "bad", tokenizer=chars, workers=1)


def test_hf_datasets_inputs(tmp_path, chars):
    datasets = pytest.importorskip("datasets")
    lines = [d for d in TEXT.split("\n") if d][:60]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in lines), encoding="utf-8")
    kw = dict(tokenizer=chars, val_documents=5, workers=1, name="x")
    ref = prepare(jsonl, tmp_path / "ref", **kw)
    streamed = prepare(None, tmp_path / "streamed", hf_dataset="json",
                       hf_data_files=str(jsonl), streaming=True, **kw)
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": lines}).save_to_disk(str(saved))
    from_disk = prepare(None, tmp_path / "disk", hf_dataset=str(saved), **kw)
    for m in (streamed, from_disk):
        assert [e["sha256"] for e in m["shards"]] == [e["sha256"] for e in ref["shards"]]
    assert streamed["inputs"]["hf_dataset"] == "json" and streamed["inputs"]["streaming"]
    # A streamed dataset's length is unknown: validation defaults to llm.c's first shard.
    m = prepare(None, tmp_path / "first_shard", hf_dataset="json", hf_data_files=str(jsonl),
                streaming=True, tokenizer=chars, shard_size=300, workers=1)
    assert m["splits"]["val"]["tokens"] == 300
    with pytest.raises(ValueError, match="`val_fraction` needs the number of documents"):
        prepare(None, tmp_path / "f", hf_dataset="json", hf_data_files=str(jsonl),
                streaming=True, tokenizer=chars, val_fraction=0.1, workers=1)
    with pytest.raises(ValueError, match="no column 'body'"):
        prepare(None, tmp_path / "g", hf_dataset=str(saved), text_field="body",
                tokenizer=chars, workers=1)


class Failing(CharTokenizer):
    """A character tokenizer that raises after ``after`` documents (a run that dies mid-way)."""

    def __init__(self, inner: CharTokenizer, after: int):
        super().__init__(inner.vocab, inner.special_tokens)
        self.origin, self.name, self.sha256 = inner.origin, inner.name, inner.sha256
        self.after, self.seen = after, 0

    def encode_ordinary(self, text):
        self.seen += 1
        if self.seen > self.after:
            raise RuntimeError("tokenizer died")
        return super().encode_ordinary(text)


def test_a_failed_run_leaves_no_manifest_and_a_rerun_finishes(tmp_path, chars):
    tok = load_text_tokenizer(chars)
    out = tmp_path / "out"
    kw = dict(docs="lines", shard_size=500, val_documents=10, workers=1)
    with pytest.raises(RuntimeError, match="tokenizer died"):
        prepare(FIXTURE, out, tokenizer=Failing(tok, after=150), **kw)
    assert os.listdir(out) == []  # no manifest, no shard, no partial folder
    with pytest.raises(ShardError, match="no token shards"):
        open_tokens(out)
    first = prepare(FIXTURE, out, tokenizer=tok, **kw)
    # A failing rerun over a finished folder leaves the finished output readable.
    with pytest.raises(RuntimeError, match="tokenizer died"):
        prepare(FIXTURE, out, tokenizer=Failing(tok, after=150), **kw)
    assert open_tokens(out, verify=True).manifest["shards"] == first["shards"]


def test_a_killed_run_leaves_no_manifest_and_a_rerun_finishes(tmp_path, chars):
    out = tmp_path / "out"
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal
        from seqjax.data import prepare as module
        from seqjax.data.prepare import prepare
        module._CHUNK_DOCS = 20  # shards get written before the kill
        from seqjax.data.text_tokenizers import load_text_tokenizer
        tok = load_text_tokenizer({chars!r})
        encode = tok.encode_ordinary
        seen = [0]
        def dying(text):
            seen[0] += 1
            if seen[0] > 200:
                os.kill(os.getpid(), signal.SIGKILL)
            return encode(text)
        tok.encode_ordinary = dying
        prepare({FIXTURE!r}, {str(out)!r}, tokenizer=tok, docs="lines", shard_size=500,
                val_documents=10, workers=1)
    """))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": root})
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()[-2000:]
    assert not os.path.exists(out / MANIFEST)
    staged = os.listdir(out / PARTIAL_DIR)
    assert any(f.endswith(".bin") for f in staged)  # complete shards, held back
    assert [f for f in os.listdir(out) if f != PARTIAL_DIR] == []
    with pytest.raises(ShardError, match="no token shards"):
        open_tokens(out)
    assert main([FIXTURE, "--out", str(out), "--tokenizer", chars, "--docs", "lines",
                 "--shard_size", "500", "--val_documents", "10", "--workers", "1"]) == 0
    data = open_tokens(out, verify=True)
    assert data.num_tokens("val") > 0 and data.num_tokens("train") > 0
    check_manifest(out)


def test_a_rerun_removes_stale_shards_of_its_name(tmp_path, chars):
    out = tmp_path / "out"
    kw = dict(tokenizer=chars, docs="lines", val_documents=10, workers=1)
    many = prepare(FIXTURE, out, shard_size=300, **kw)
    few = prepare(FIXTURE, out, shard_size=3000, **kw)
    assert len(many["shards"]) > len(few["shards"])
    assert sorted(os.listdir(out)) == sorted([MANIFEST] + [e["file"] for e in few["shards"]])


def test_bad_input_errors(tmp_path, chars):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="no input files found.*nope.txt.*does not exist"):
        prepare(tmp_path / "nope.txt", out, tokenizer=chars)
    (tmp_path / "empty_folder").mkdir()
    with pytest.raises(ValueError, match="no input files found.*empty_folder"):
        prepare(tmp_path / "empty_folder", out, tokenizer=chars)
    with pytest.raises(ValueError, match=r"no input files found.*\*.jsonl"):
        prepare(str(tmp_path / "*.jsonl"), out, tokenizer=chars)
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"data.csv.*not a .txt/.jsonl/.parquet file"):
        prepare(tmp_path / "data.csv", out, tokenizer=chars)
    (tmp_path / "empty.txt").write_text("")
    for split in ("documents", "text"):
        with pytest.raises(ValueError, match="empty corpus.*empty.txt"):
            prepare(tmp_path / "empty.txt", out, tokenizer=chars, split=split, workers=1)
    one = tmp_path / "one.jsonl"
    one.write_text('{"text": "ab"}\n{"body": "c"}\n')
    with pytest.raises(ValueError, match=r"one.jsonl:2: no text field 'text'.*\['body'\]"):
        prepare(one, out, tokenizer=chars, workers=1)
    with pytest.raises(ValueError, match="the training split is empty"):
        prepare(FIXTURE, out, tokenizer=chars, workers=1)  # one document: all validation
    with pytest.raises(ValueError, match="give input files or `hf_dataset`"):
        prepare(None, out, tokenizer=chars)
    with pytest.raises(ValueError, match="`format` must be one of 'llmc', 'nanogpt'; got 'npy'"):
        prepare(FIXTURE, out, tokenizer=chars, format="npy")
    with pytest.raises(ValueError, match="at most one of"):
        prepare(FIXTURE, out, tokenizer=chars, val_documents=2, val_tokens=10)
    with pytest.raises(ValueError, match=r"`shard_size` must be an int in \[1, 2\*\*31 - 1\]"):
        prepare(FIXTURE, out, tokenizer=chars, shard_size=0)
    assert not os.path.exists(out / MANIFEST) and not os.path.exists(out / PARTIAL_DIR)


class Huge(CharTokenizer):
    """A tokenizer whose ids do not fit uint16."""

    def __init__(self, vocab_size: int, emit: int):
        super().__init__(["<eot>"], SpecialTokens(pad=None, unk=None, bos=None, eos="<eot>",
                                                  mask=None, sep=None, cls=None))
        self.name, self._vocab_size, self.emit = "huge", vocab_size, emit

    @property
    def vocab_size(self):
        return self._vocab_size

    def encode_ordinary(self, text):
        return [self.emit] * len(text)


def test_ids_above_uint16_are_refused(tmp_path):
    with pytest.raises(ValueError, match="100,277 ids; uint16 shards hold ids in \\[0, 65535\\]"):
        prepare(FIXTURE, tmp_path / "a", tokenizer=Huge(100_277, 1), workers=1)
    with pytest.raises(ValueError, match="'huge' gave the id 70000; uint16 shards"):
        prepare(FIXTURE, tmp_path / "b", tokenizer=Huge(50_000, 70_000), docs="lines",
                workers=1)
    assert not os.path.exists(tmp_path / "b" / PARTIAL_DIR)


def test_cli_runs_and_reports(tmp_path, chars, capsys):
    out = tmp_path / "out"
    assert main([FIXTURE, "--out", str(out), "--tokenizer", chars, "--format", "nanogpt",
                 "--split", "text", "--workers", "1"]) == 0
    printed = capsys.readouterr()
    assert "train " in printed.out and "val.bin" in printed.err
    n = len(TEXT)
    m = check_manifest(out)
    assert m["splits"]["val"]["tokens"] == n - int(n * 0.9)  # one char per token
    assert m["options"]["validation"] == {"val_fraction": 0.1}


@pytest.mark.parametrize("val", [["--val_documents", "5"], []], ids=["bytes", "documents"])
def test_progress_lines_then_a_summary(tmp_path, chars, capsys, monkeypatch, val):
    """In a log (stderr not a terminal): a line per PROGRESS_EVERY_S with documents, tokens,
    tokens/s and the time left — from the .txt inputs' bytes, or from the documents counted
    for the default val_fraction — then the summary."""
    from seqjax.data import prepare as prepare_module

    monkeypatch.setattr(prepare_module, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(prepare_module, "_CHUNK_DOCS", 50)
    out = tmp_path / "out"
    assert main([FIXTURE, "--out", str(out), "--tokenizer", chars, "--docs", "lines",
                 "--workers", "1", *val]) == 0
    err = capsys.readouterr().err.splitlines()
    lines = [ln for ln in err if ln.startswith("prepare: ") and "tokens/s" in ln]
    assert len(lines) >= 3, err
    assert re.fullmatch(r"prepare: [\d,]+ documents, [\d,]+ tokens, [\d,]+ tokens/s, \d+% "
                        r"\(about \d+ s left\)", lines[0]), lines[0]
    m = check_manifest(out)
    docs = m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"]
    assert re.fullmatch(rf"prepare: tokenised {docs:,} documents, {m['tokens']:,} tokens in "
                        r"[\d.]+ s \([\d,]+ tokens/s\)", lines[-1]), lines[-1]
    done = int(lines[-2].split(", ")[3].split("%")[0])  # the line breaks cut are not counted
    assert done == 100 if not val else 90 <= done <= 100


def test_progress_bar_on_a_terminal(tmp_path, chars, capsys):
    summary = []
    prepare(FIXTURE, tmp_path / "out", tokenizer=chars, docs="lines", workers=1, progress=True,
            log=summary.append)
    err = capsys.readouterr().err
    assert "tokenising: 100%" in err and "tokens/s" in err  # the bar, on stderr
    assert any(line.startswith("prepare: tokenised ") for line in summary)


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("seqjax prepare: error: no input files")
    assert main([FIXTURE, "--out", str(tmp_path / "o"), "--tokenizer", "gpt3"]) == 2
    assert "'gpt2', 'hf:PATH'" in capsys.readouterr().err


def test_every_option_is_described_once_for_the_function_and_the_command():
    import inspect

    params = [p for p in inspect.signature(prepare).parameters if p not in ("log", "progress")]
    assert list(prepare_module.OPTIONS) == params
    doc = prepare.__doc__
    help_text = " ".join(prepare_module._parser().format_help().split())
    for name, (_, text) in prepare_module.OPTIONS.items():
        assert f"        {name}: " in doc, name
        assert " ".join(text.split())[:40] in help_text, name


def test_cli_help_gives_every_default():
    parser = prepare_module._parser()
    for action in parser._actions:
        if action.dest != "help":
            assert "default" in action.help or "required" in action.help, action.dest
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0


def test_a_folder_input_skips_hidden_names_and_does_not_follow_symlinked_folders(tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / ".hidden").mkdir()
    (tmp_path / "elsewhere").mkdir()
    for path in (docs / "a.txt", docs / "sub" / "b.txt", docs / ".hidden" / "c.txt",
                 docs / ".d.txt", tmp_path / "elsewhere" / "e.txt"):
        path.write_text("some text.\n")
    os.symlink(tmp_path / "elsewhere", docs / "link")
    os.symlink(docs, docs / "sub" / "loop")  # a cycle: read once, not again through the link
    got = prepare_module._find_files([str(docs)])
    assert got == [str(docs / "a.txt"), str(docs / "sub" / "b.txt")]

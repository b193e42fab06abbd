"""seqjax.data.text_tokenizers: GPT-2 through tiktoken (offline, from openai-whisper's rank
file), any tokenizer.json, seqjax's own tokenizers, all one interface (seqjax's Tokenizer);
special tokens in ordinary text stay text."""

import importlib.util
import os
import pickle
import sys

import pytest

from seqjax.data.text_tokenizers import (
    GPT2_EOT,
    GPT2_RANKS_SHA256,
    TiktokenTokenizer,
    gpt2_rank_file,
    load_text_tokenizer,
)
from seqjax.data.tokenizers import CharTokenizer, HFTokenizer, SpecialTokens, Tokenizer, train_bpe


def gpt2_or_skip() -> TiktokenTokenizer:
    """GPT-2 from whisper's rank file; skips without tiktoken or openai-whisper."""
    if importlib.util.find_spec("tiktoken") is None:
        pytest.skip("needs tiktoken (pip install \"seqjax[pretrain]\")")
    path = gpt2_rank_file()
    if path is None:
        pytest.skip("needs openai-whisper for GPT-2's offline rank file "
                    "(pip install --no-deps openai-whisper)")
    tok = load_text_tokenizer("gpt2", rank_file=path)
    assert isinstance(tok, TiktokenTokenizer)
    return tok


def test_gpt2_known_ids():
    tok = gpt2_or_skip()
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.eot == GPT2_EOT == 50256 and tok.vocab_size == 50257
    assert tok.describe() == {"kind": "tiktoken", "name": "gpt2", "vocab_size": 50257,
                              "eot": 50256}
    assert tok.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"
    assert tok.decode([15496, 995, 50256], skip_special=True) == "Hello world"
    assert isinstance(tok, Tokenizer) and tok.eos_id == 50256 and tok.bos_id is None
    assert tok.token_to_id("<|endoftext|>") == 50256 and tok.token_to_id("no such") is None
    assert tok.id_to_token(995) == " world"
    with pytest.raises(ValueError, match="outside"):
        tok.decode([50257])


def test_gpt2_saves_its_ranks_as_whispers_file(tmp_path):
    tok = gpt2_or_skip()
    tok.save(tmp_path / "gpt2.tiktoken")  # what rank_file= reads: the same SHA-256 as whisper's
    again = load_text_tokenizer("gpt2", rank_file=tmp_path / "gpt2.tiktoken")
    assert again.encode("Hello world") == [15496, 995]


def test_gpt2_special_token_spelling_is_ordinary_text():
    tok = gpt2_or_skip()
    ids = tok.encode_ordinary("a<|endoftext|>b")
    assert GPT2_EOT not in ids and tok.encode("a<|endoftext|>b") == ids
    assert tok.decode(ids) == "a<|endoftext|>b"
    assert tok.encode_batch(["Hello world", "a<|endoftext|>b"]) == [[15496, 995], ids]


def test_gpt2_default_uses_whisper_ranks_and_pickles():
    tok = gpt2_or_skip()
    default = load_text_tokenizer("gpt2")  # rank_file unset: whisper's, found by find_spec
    assert default.encode("Hello world") == [15496, 995]
    again = pickle.loads(pickle.dumps(tok))  # what a worker process receives
    assert again.encode(" the cat") == tok.encode(" the cat") and again.eot == 50256


def test_gpt2_rank_file_is_found_without_importing_whisper():
    if importlib.util.find_spec("whisper") is None:
        assert gpt2_rank_file() is None
        pytest.skip("openai-whisper not installed (gpt2_rank_file() is None)")
    was_imported = "whisper" in sys.modules
    path = gpt2_rank_file()
    assert path is not None and path.endswith(os.path.join("whisper", "assets", "gpt2.tiktoken"))
    assert ("whisper" in sys.modules) == was_imported


def test_gpt2_rank_file_errors(tmp_path):
    if importlib.util.find_spec("tiktoken") is None:
        pytest.skip("needs tiktoken")
    missing = tmp_path / "nope.tiktoken"
    with pytest.raises(ValueError, match="nope.tiktoken.*does not exist"):
        load_text_tokenizer("gpt2", rank_file=missing)
    other = tmp_path / "other.tiktoken"
    other.write_text("YQ== 0\n")
    with pytest.raises(ValueError, match=f"other.tiktoken.*not GPT-2's ranks.*{GPT2_RANKS_SHA256}"):
        load_text_tokenizer("gpt2", rank_file=other)
    with pytest.raises(ValueError, match="`eot` cannot be changed for 'gpt2'"):
        load_text_tokenizer("gpt2", eot=0)


def test_gpt2_without_tiktoken_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken -> ImportError
    with pytest.raises(ModuleNotFoundError, match=r'seqjax\[pretrain\]'):
        load_text_tokenizer("gpt2")


def _tokenizer_json(path, specials=("<|endoftext|>", "<pad>")) -> str:
    tk = pytest.importorskip("tokenizers")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=300, special_tokens=list(specials),
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     show_progress=False)
    tokenizer.train_from_iterator(["the cat sat on the mat"] * 20, trainer)
    tokenizer.save(str(path))
    return str(path)


def test_hf_tokenizer_json(tmp_path):
    path = _tokenizer_json(tmp_path / "tokenizer.json")
    for spec in (f"hf:{path}", path):
        tok = load_text_tokenizer(spec)
        assert isinstance(tok, HFTokenizer)  # the one Hugging Face wrapper
        assert tok.eot == 0 and tok.vocab_size <= 300
        ids = tok.encode_ordinary("the cat<|endoftext|>")
        assert 0 not in ids  # the spelling is text, not the special id
        assert 0 in tok.encode("the cat<|endoftext|>")  # encode: HF's rule, special tokens
        assert tok.encode_ordinary("the cat<|endoftext|>") == ids  # the flag was put back
        assert tok.decode(ids) == "the cat<|endoftext|>"
        d = tok.describe()
        assert d["kind"] == "hf" and d["name"] == "tokenizer.json" and d["eot"] == 0
        assert len(d["sha256"]) == 64
    again = pickle.loads(pickle.dumps(tok))  # a worker process keeps special tokens as text
    assert again.encode_ordinary("the cat<|endoftext|>") == ids


def test_hf_tokenizer_eot_choice_and_errors(tmp_path):
    path = _tokenizer_json(tmp_path / "tokenizer.json", specials=("<pad>", "<unk>"))
    assert load_text_tokenizer(f"hf:{path}").eot is None  # none found: what needs one says so
    assert load_text_tokenizer(f"hf:{path}", eot="<unk>").eot == 1
    assert load_text_tokenizer(f"hf:{path}", eot=0).eot == 0
    with pytest.raises(ValueError, match=r"`eot` must be an id in \[0, "):
        load_text_tokenizer(f"hf:{path}", eot=10**6)
    with pytest.raises(ValueError, match="`eot` '<eos>' is not a token"):
        load_text_tokenizer(f"hf:{path}", eot="<eos>")
    with pytest.raises(ValueError, match="missing/tokenizer.json.*does not exist"):
        load_text_tokenizer(str(tmp_path / "missing" / "tokenizer.json"))
    bad = tmp_path / "bad" / "tokenizer.json"
    bad.parent.mkdir()
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not a Hugging Face tokenizer.json"):
        load_text_tokenizer(str(bad))


def test_seqjax_char_tokenizer(tmp_path):
    path = tmp_path / "chars.json"
    CharTokenizer.from_text("hello world").save(path)
    tok = load_text_tokenizer(f"seqjax:{path}")
    assert isinstance(tok, CharTokenizer)  # the seqjax tokenizer itself
    assert tok.eot == 3  # pad, unk, bos, eos, ...
    assert tok.decode(tok.encode_ordinary("hello")) == "hello"
    assert tok.describe() == {"kind": "seqjax", "name": "chars.json", "vocab_size": 15,
                              "eot": 3, "sha256": tok.sha256}
    plain = tmp_path / "plain.json"
    CharTokenizer.from_text("ab\n", special_tokens=SpecialTokens.none()).save(plain)
    assert load_text_tokenizer(f"seqjax:{plain}").eot is None  # nanoGPT's characters: no EOT
    assert load_text_tokenizer(f"seqjax:{plain}", eot="\n").eot == 0


def test_seqjax_bpe_tokenizer_keeps_special_spellings_as_text(tmp_path):
    pytest.importorskip("tokenizers")
    path = tmp_path / "bpe.json"
    train_bpe(["the cat sat on the mat"] * 20, vocab_size=300).save(path)
    tok = load_text_tokenizer(f"seqjax:{path}")
    assert tok.eot == 3
    ids = tok.encode_ordinary("the cat<eos>")
    assert 3 not in ids and tok.decode(ids) == "the cat<eos>"
    assert pickle.loads(pickle.dumps(tok)).encode_ordinary("the cat<eos>") == ids


def test_a_tokenizer_without_eot_describes_itself_and_retired_names_say_the_new_one():
    tok = CharTokenizer.from_text("ab", special_tokens=SpecialTokens.none())
    assert tok.eot is None
    assert tok.describe() == {"kind": "seqjax", "name": "CharTokenizer", "vocab_size": 2,
                              "eot": None}
    with pytest.raises(TypeError, match="`text` must be a str"):
        tok.encode_ordinary(b"ab")  # type: ignore[arg-type]
    for old, new in (("TextTokenizer", "Tokenizer"), ("HFTextTokenizer", "HFTokenizer"),
                     ("SeqjaxTextTokenizer", "seqjax tokenizer itself")):
        with pytest.raises(ImportError, match=f"{old} was removed: use .*{new}"):
            exec(f"from seqjax.data.text_tokenizers import {old}")


def test_unknown_spec_names_the_accepted_forms(tmp_path):
    with pytest.raises(ValueError, match="'gpt2', 'hf:PATH'.*'seqjax:PATH'; got 'gpt3'"):
        load_text_tokenizer("gpt3")
    with pytest.raises(ValueError, match="`rank_file` is for the 'gpt2' tokenizer only"):
        load_text_tokenizer("seqjax:x.json", rank_file="gpt2.tiktoken")
    with pytest.raises(TypeError, match="must be a str spec"):
        load_text_tokenizer(None)  # type: ignore[arg-type]

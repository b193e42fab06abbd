"""Tokenizers: char / word / BPE / tokenizer.json, special tokens, JSON save/load, bad data."""

import collections
import json

import numpy as np
import pytest

from seqjax.data.tokenizers import (
    WHITESPACE_PATTERN,
    CharTokenizer,
    HFTokenizer,
    SpecialTokens,
    WordTokenizer,
    load_tokenizer,
    train_bpe,
)

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n"


def test_char_vocab_specials_first_and_roundtrip():
    tok = CharTokenizer.from_text(TEXT)
    specials = ["<pad>", "<unk>", "<bos>", "<eos>", "<mask>", "<sep>", "<cls>"]
    assert tok.vocab[:7] == specials
    assert tok.vocab[7:] == sorted(set(TEXT))
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert (tok.mask_id, tok.sep_id, tok.cls_id) == (4, 5, 6)
    ids = tok.encode(TEXT, add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and len(ids) == len(TEXT) + 2
    assert tok.decode(ids, skip_special=True) == TEXT
    assert tok.decode(ids).startswith("<bos>First")


def test_char_without_specials_matches_nanogpt_ids():
    tok = CharTokenizer.from_text(TEXT, SpecialTokens.none())
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}  # nanoGPT's shakespeare_char/prepare.py
    assert tok.encode(TEXT) == [stoi[c] for c in TEXT]
    assert tok.vocab_size == len(chars) and tok.pad_id is None and tok.special_ids == []


def test_unknown_characters_map_to_unk_and_are_counted():
    tok = CharTokenizer.from_text("abc")
    ids, unknown = tok.encode_with_unknowns("abzzé")
    assert ids == [tok.token_to_id("a"), tok.token_to_id("b")] + [tok.unk_id] * 3
    assert unknown == collections.Counter({"z": 2, "é": 1})
    with pytest.raises(ValueError, match="'z' is not in the vocabulary"):
        CharTokenizer.from_text("abc", SpecialTokens.none()).encode("z")


def test_decode_rejects_ids_outside_vocabulary():
    tok = CharTokenizer.from_text("abc")  # 7 specials + 3 chars
    assert tok.vocab_size == 10
    msg = r"id 10, outside the vocabulary \[0, 10\) \(vocab_size=10\)"
    with pytest.raises(ValueError, match=msg):
        tok.decode([7, 10])
    with pytest.raises(ValueError, match="id -1"):
        tok.decode(np.array([-1, 7]))
    with pytest.raises(TypeError, match="integers"):
        tok.decode(np.array([7.0]))
    with pytest.raises(ValueError, match="id 10"):
        tok.id_to_token(10)


def test_over_long_sequences_error_or_truncate():
    tok = CharTokenizer.from_text("abcdef")
    with pytest.raises(ValueError, match="8 tokens, more than max_length=5.*truncation=True"):
        tok.encode("abcdef", add_bos=True, add_eos=True, max_length=5)
    ids = tok.encode("abcdef", add_bos=True, add_eos=True, max_length=5, truncation=True)
    assert len(ids) == 5 and ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids, skip_special=True) == "abc"
    assert tok.encode("abc", max_length=3) == tok.encode("abc")  # exactly at the limit is fine
    with pytest.raises(ValueError, match="at least 2"):
        tok.encode("a", add_bos=True, add_eos=True, max_length=1, truncation=True)


def test_empty_text():
    tok = CharTokenizer.from_text("ab")
    assert tok.encode("") == []
    assert tok.encode("", add_bos=True, add_eos=True) == [tok.bos_id, tok.eos_id]
    assert tok.decode([]) == ""


def test_missing_special_role_is_a_clear_error():
    tok = CharTokenizer.from_text("ab", SpecialTokens(bos=None))
    with pytest.raises(ValueError, match="no 'bos' special token"):
        tok.encode("ab", add_bos=True)


def test_word_tokenizer_min_freq_order_and_unknowns():
    texts = ["the cat sat on the mat .", "The dog sat .", "the end"]
    tok = WordTokenizer.from_texts(texts, min_freq=2)
    # most frequent first, ties alphabetical; 'The' differs from 'the' (case-sensitive)
    assert tok.vocab[7:] == ["the", ".", "sat"]
    ids, unknown = tok.encode_with_unknowns("the cat sat .")
    assert tok.decode(ids) == "the <unk> sat ."
    assert unknown == {"cat": 1}
    low = WordTokenizer.from_texts(texts, min_freq=2, lowercase=True)
    assert low.encode("THE") == [low.token_to_id("the")]
    capped = WordTokenizer.from_texts(texts, max_size=9)
    assert capped.vocab_size == 9 and capped.vocab[7:] == ["the", "."]
    with pytest.raises(ValueError, match="min_freq"):
        WordTokenizer.from_texts(texts, min_freq=0)


def test_word_tokenizer_keeps_angle_bracket_markers_whole():
    # Penn Treebank's text holds "<unk>": the default pattern must not split it in three
    text = "pierre <unk> N years old , mr. <unk> 's"
    tok = WordTokenizer.from_texts([text], special_tokens=SpecialTokens(pad=None, bos=None))
    assert tok.split(text)[:2] == ["pierre", "<unk>"]
    assert tok.encode("<unk> <eos>") == [tok.unk_id, tok.eos_id]
    assert "<" not in tok.vocab and "unk" not in tok.vocab
    # the default still splits punctuation; WHITESPACE_PATTERN keeps PTB's words ("mr.", "'s")
    assert tok.split("mr. x's") == ["mr", ".", "x", "'", "s"]
    ws = WordTokenizer.from_texts([text], pattern=WHITESPACE_PATTERN)
    assert ws.split(text) == text.split()


@pytest.mark.parametrize("kind", ["char", "word"])
def test_save_load_json_roundtrip(tmp_path, kind):
    if kind == "char":
        tok = CharTokenizer.from_text(TEXT, SpecialTokens(mask=None, sep=None, cls=None))
    else:
        tok = WordTokenizer.from_texts([TEXT], lowercase=True)
    path = tmp_path / "tok.json"
    tok.save(path)
    data = json.loads(path.read_text())  # plain JSON, no pickle
    assert data["type"] == kind
    back = load_tokenizer(path)
    assert type(back) is type(tok) and back.vocab == tok.vocab
    assert back.special_tokens == tok.special_tokens
    assert back.encode("hear me SPEAK!") == tok.encode("hear me SPEAK!")


def test_load_tokenizer_rejects_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="neither a seqjax tokenizer"):
        load_tokenizer(p)
    p.write_text("not json")
    with pytest.raises(ValueError, match="not a JSON tokenizer"):
        load_tokenizer(p)


def test_batch_encode_decode():
    tok = CharTokenizer.from_text("abc")
    batch = tok.encode_batch(["ab", "c"], add_eos=True)
    assert batch == [[7, 8, 3], [9, 3]]
    padded = np.array([[7, 8, 3], [9, 3, 0]])
    assert tok.decode_batch(padded, skip_special=True) == ["ab", "c"]


def test_bpe_trained_with_hf_tokenizers(tmp_path):
    corpus = [TEXT * 3, "Peter Piper picked a peck of pickled peppers"] * 20
    tok = train_bpe(corpus, vocab_size=300)
    assert tok.special_ids == list(range(7)) and tok.pad_id == 0
    assert tok.vocab_size <= 300
    ids = tok.encode(TEXT)
    assert len(ids) < len(TEXT) / 2  # merges compress the training text
    for s in [TEXT, "naïve café — ünïcödé ✓", ""]:  # byte level: everything round-trips
        assert tok.decode(tok.encode(s)) == s
    path = tmp_path / "bpe.json"
    tok.save(path)
    back = load_tokenizer(path)
    assert isinstance(back, HFTokenizer) and back.encode(TEXT) == ids
    assert back.eos_id == tok.eos_id == 3
    with pytest.raises(ValueError, match=f"vocab_size={tok.vocab_size}"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="at least 263"):
        train_bpe(corpus, vocab_size=100)


def _bert_like_tokenizer_json(path):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "the",
             "cat", "##s", "."]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(words[:5])
    tok.save(str(path))


def test_load_existing_wordpiece_tokenizer_json(tmp_path):
    path = tmp_path / "tokenizer.json"
    _bert_like_tokenizer_json(path)
    tok = load_tokenizer(path)
    assert isinstance(tok, HFTokenizer)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.bos_id is None and tok.vocab_size == 12
    assert tok.tokens("Unaffable cats") == ["un", "##aff", "##able", "cat", "##s"]
    ids, unknown = tok.encode_with_unknowns("the xyz cat.")
    assert ids == [8, 1, 9, 11] and unknown == {"xyz": 1}
    assert tok.decode([5, 6, 7]) == "unaffable"
    templ = HFTokenizer.from_file(path, use_template=True)
    assert templ.encode("the cat") == [2, 8, 9, 3]
    assert templ.decode([2, 8, 9, 3], skip_special=True) == "the cat"
    with pytest.raises(ValueError, match=r"id 12, outside the vocabulary \[0, 12\)"):
        tok.decode([2, 12])

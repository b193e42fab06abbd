"""The corpora (seqjax.data.corpora): the resolver (its order, corrupt and partial files,
offline failure; no network: local files and a fake URL opener) and the text corpora (Tiny
Shakespeare, English-French) with their hub and URL fallbacks. Penn Treebank's tests are in
tests/experiments/test_ptb.py, beside the experiment that reads it."""

import hashlib
import io

import numpy as np
import pytest

from seqjax.data import corpora
from seqjax.data.corpora import (
    CORPORA,
    CorpusNotFoundError,
    CorpusSource,
    english_french,
    find_data_dir,
    resolve_corpus,
    tiny_shakespeare,
)

CONTENT = b"First Citizen:\nSpeak.\n"
URL = "https://example.invalid/x.txt"


class _Opener:
    """``urlopen`` stand-in: serves ``content`` (optionally failing after some bytes)."""

    def __init__(self, content=CONTENT, fail_after=None, error=None):
        self.content, self.fail_after, self.error, self.calls = content, fail_after, error, []

    def __call__(self, url, timeout):
        self.calls.append((url, timeout))
        if self.error is not None:
            raise self.error
        opener = self

        class Response(io.BytesIO):
            length = len(opener.content)

            def read(self, n=-1):
                if opener.fail_after is not None and self.tell() >= opener.fail_after:
                    raise ConnectionResetError("connection reset by peer")
                return super().read(min(n, 8) if n > 0 else n)

        return Response(self.content)


@pytest.fixture
def places(tmp_path, monkeypatch):
    """A registered corpus ``x.txt``, an empty cache, no $SEQJAX_DATA_DIR, a shared folder."""
    monkeypatch.setitem(
        CORPORA,
        "x.txt",
        CorpusSource("x.txt", URL, hashlib.sha256(CONTENT).hexdigest(), "a test corpus"),
    )
    monkeypatch.setenv(corpora.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(corpora.DATA_DIR_ENV, raising=False)
    monkeypatch.delenv(corpora.OFFLINE_ENV, raising=False)  # the fake opener is the network
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setattr(corpora, "shared_data_dirs", lambda: [shared])
    return tmp_path


def test_the_order_path_env_cache_download_shared(places, monkeypatch):
    env_dir, given = places / "env", places / "given"
    env_dir.mkdir()
    given.mkdir()
    for folder, text in ((env_dir, b"env"), (given, b"given"), (places / "shared", b"shared")):
        (folder / "x.txt").write_bytes(text)
    opener = _Opener()
    monkeypatch.setenv(corpora.DATA_DIR_ENV, str(env_dir))
    assert resolve_corpus("x.txt", given, opener=opener).read_bytes() == b"given"
    assert resolve_corpus("x.txt", given / "x.txt", opener=opener).read_bytes() == b"given"
    assert resolve_corpus("x.txt", opener=opener).read_bytes() == b"env"
    monkeypatch.delenv(corpora.DATA_DIR_ENV)
    path = resolve_corpus("x.txt", opener=opener)  # downloaded into the cache
    assert path == places / "cache" / "x.txt" and path.read_bytes() == CONTENT
    assert opener.calls == [(URL, 30.0)]
    assert resolve_corpus("x.txt", opener=opener) == path and len(opener.calls) == 1
    path.unlink()
    assert resolve_corpus("x.txt", download=False).read_bytes() == b"shared"


def test_an_explicit_path_must_exist(places):
    with pytest.raises(CorpusNotFoundError, match="does not exist"):
        resolve_corpus("x.txt", places / "missing.txt", opener=_Opener())


def test_a_corrupt_cached_file_is_set_aside_and_fetched_again(places):
    cache = places / "cache"
    cache.mkdir()
    (cache / "x.txt").write_bytes(b"First Cit")  # a cut earlier download
    path = resolve_corpus("x.txt", opener=_Opener())
    assert path.read_bytes() == CONTENT
    assert (cache / "x.txt.corrupt").read_bytes() == b"First Cit"


@pytest.mark.parametrize(
    "opener, why",
    [
        (_Opener(fail_after=8), "ConnectionResetError"),
        (_Opener(content=b"something else"), "expected SHA-256"),
        (_Opener(error=OSError("Name or service not known")), "Name or service not known"),
    ],
)
def test_failed_downloads_leave_nothing_and_say_everything(places, opener, why):
    with pytest.raises(CorpusNotFoundError) as err:
        resolve_corpus("x.txt", opener=opener)
    message = str(err.value)
    assert why in message
    for part in (
        "SEQJAX_DATA_DIR (not set)",
        "the cache",
        URL,
        "shared/data",
        "--data_path=FILE",
        "a test corpus",
    ):
        assert part in message
    assert list((places / "cache").iterdir()) == []  # no partial file under any name


def test_a_corpus_without_a_canonical_source_says_so(places):
    with pytest.raises(CorpusNotFoundError, match="no canonical source"):
        resolve_corpus("fra-eng.txt")


@pytest.mark.corpus
def test_tiny_shakespeare_checksum_is_the_shared_copy(corpus_dir):
    expected = CORPORA["tinyshakespeare.txt"].sha256
    assert corpora.sha256_file(corpus_dir / "tinyshakespeare.txt") == expected


def test_the_cli_exits_2_naming_the_places(places, monkeypatch, capsys):
    from seqjax import cli

    monkeypatch.setitem(
        CORPORA,
        "tinyshakespeare.txt",
        CorpusSource("tinyshakespeare.txt", (places / "nowhere.txt").as_uri(), "0" * 64),
    )
    code = cli.main(["train", "char_lm", "--smoke", "--workdir", str(places / "run")])
    assert code == 2
    err = capsys.readouterr().err
    assert "tinyshakespeare.txt" in err and "--data_path=FILE" in err and "Traceback" not in err


def test_offline_mode_never_downloads(places, monkeypatch):
    monkeypatch.setenv(corpora.OFFLINE_ENV, "1")
    opener = _Opener()
    with pytest.raises(CorpusNotFoundError, match=r"a download \(\$SEQJAX_OFFLINE is set\)"):
        resolve_corpus("x.txt", opener=opener)
    assert opener.calls == []


# --------------------------------------------------------------------- the text corpora


@pytest.mark.corpus
def test_tiny_shakespeare_nanogpt_split():
    d = tiny_shakespeare()
    assert d.tokenizer.vocab_size == 65
    assert (len(d.train_ids), len(d.val_ids)) == (1_003_854, 111_540)
    assert d.train_ids.dtype == np.int32
    assert d.tokenizer.decode(d.train_ids[:14]) == "First Citizen:"
    # nanoGPT's ids: index into the sorted character set
    assert d.tokenizer.vocab == sorted(d.tokenizer.vocab) and d.tokenizer.vocab[0] == "\n"


@pytest.mark.corpus
def test_english_french_pairs():
    ds = english_french()
    assert len(ds) == 18_065
    assert ds[0] == {"src": "Go.", "tgt": "Va !"}


def test_find_data_dir_resolution(tmp_path, monkeypatch):
    (tmp_path / "tinyshakespeare.txt").write_text("abcab\n")
    monkeypatch.setenv(corpora.DATA_DIR_ENV, str(tmp_path))
    assert find_data_dir() == tmp_path
    d = tiny_shakespeare(train_fraction=0.5)
    assert d.tokenizer.vocab == ["\n", "a", "b", "c"] and len(d.train_ids) == 3
    assert find_data_dir(tmp_path) == tmp_path
    monkeypatch.setenv(corpora.DATA_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="SEQJAX_DATA_DIR.*path=.*hub_name="):
        find_data_dir()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tiny_shakespeare(tmp_path / "missing.txt")
    monkeypatch.delenv(corpora.DATA_DIR_ENV)
    monkeypatch.setattr(corpora, "shared_data_dirs", lambda: [tmp_path / "no" / "shared"])
    with pytest.raises(FileNotFoundError, match="no offline data folder found"):
        find_data_dir()


def test_hub_fallbacks_without_network(monkeypatch):
    import datasets

    def load_dataset(path, name=None, split=None, **kwargs):
        if path == "karpathy/tiny_shakespeare":
            return datasets.DatasetDict(
                {
                    "test": datasets.Dataset.from_dict({"text": ["C"]}),
                    "train": datasets.Dataset.from_dict({"text": ["AB"]}),
                    "validation": datasets.Dataset.from_dict({"text": ["b"]}),
                }
            )
        assert (path, name, split) == ("opus_books", "en-fr", "train")
        return datasets.Dataset.from_dict({"translation": [{"en": "Hi", "fr": "Salut"}]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    d = tiny_shakespeare(hub_name="karpathy/tiny_shakespeare", train_fraction=0.5)
    assert d.tokenizer.decode(np.r_[d.train_ids, d.val_ids]) == "ABbC"  # train, validation, test
    assert english_french(hub_name="opus_books", hub_config="en-fr")[0] == {
        "src": "Hi",
        "tgt": "Salut",
    }


def test_tiny_shakespeare_from_a_url_and_the_fallback_chain(tmp_path, monkeypatch):
    """``url=`` downloads the plain file (here a ``file://`` URL); ``fetch_tiny_shakespeare``
    takes a local copy, else the built-in opening offline, else the hub, else the URL."""
    corpus = tmp_path / "tinyshakespeare.txt"
    corpus.write_text("First Citizen:\nSpeak.\n", encoding="utf-8")
    assert corpora.tiny_shakespeare_text(url=corpus.as_uri()) == "First Citizen:\nSpeak.\n"
    with pytest.raises(ValueError, match="at most one of `hub_name` and `url`"):
        corpora.tiny_shakespeare_text(hub_name="x/y", url=corpus.as_uri())

    monkeypatch.setenv(corpora.DATA_DIR_ENV, str(tmp_path))
    assert corpora.fetch_tiny_shakespeare(offline_sample=True) == "First Citizen:\nSpeak.\n"

    calls = []

    def no_local_copy(path=None, *, hub_name=None, url=None):
        calls.append((hub_name, url))
        if hub_name is None and url is None:
            raise FileNotFoundError("no local copy")
        if hub_name is not None:
            raise ConnectionError("offline")
        return "downloaded"

    monkeypatch.setattr(corpora, "tiny_shakespeare_text", no_local_copy)
    assert corpora.fetch_tiny_shakespeare(offline_sample=True) == corpora.TINY_SHAKESPEARE_OPENING
    assert calls == [(None, None)]
    assert corpora.fetch_tiny_shakespeare() == "downloaded"
    assert calls[1:] == [
        (None, None),
        ("karpathy/tiny_shakespeare", None),
        (None, corpora.CHAR_RNN_SHAKESPEARE_URL),
    ]


@pytest.mark.corpus
def test_tiny_shakespeare_opening_is_the_corpus_opening():
    assert corpora.tiny_shakespeare_text().startswith(corpora.TINY_SHAKESPEARE_OPENING)

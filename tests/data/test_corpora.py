"""The corpus resolver: its order, corrupt and partial files, offline failure (no network:
local files and a fake URL opener)."""

import hashlib
import io

import pytest

from seqjax.data import corpora
from seqjax.data.corpora import CORPORA, CorpusNotFoundError, CorpusSource, resolve_corpus

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
    monkeypatch.setitem(CORPORA, "x.txt", CorpusSource(
        "x.txt", URL, hashlib.sha256(CONTENT).hexdigest(), "a test corpus"))
    monkeypatch.setenv(corpora.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(corpora.DATA_DIR_ENV, raising=False)
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


@pytest.mark.parametrize("opener, why", [
    (_Opener(fail_after=8), "ConnectionResetError"),
    (_Opener(content=b"something else"), "expected SHA-256"),
    (_Opener(error=OSError("Name or service not known")), "Name or service not known"),
])
def test_failed_downloads_leave_nothing_and_say_everything(places, opener, why):
    with pytest.raises(CorpusNotFoundError) as err:
        resolve_corpus("x.txt", opener=opener)
    message = str(err.value)
    assert why in message
    for part in ("SEQJAX_DATA_DIR (not set)", "the cache", URL, "shared/data",
                 "--data_path=FILE", "a test corpus"):
        assert part in message
    assert list((places / "cache").iterdir()) == []  # no partial file under any name


def test_a_corpus_without_a_canonical_source_says_so(places):
    with pytest.raises(CorpusNotFoundError, match="no canonical source"):
        resolve_corpus("fra-eng.txt")


def test_tiny_shakespeare_checksum_is_the_shared_copy():
    shared = [d / "tinyshakespeare.txt" for d in corpora.shared_data_dirs()]
    shared = [p for p in shared if p.is_file()]
    if not shared:
        pytest.skip("no shared copy of the corpus")
    assert corpora._sha256(shared[0]) == CORPORA["tinyshakespeare.txt"].sha256


def test_the_cli_exits_2_naming_the_places(places, monkeypatch, capsys):
    from seqjax import cli

    monkeypatch.setitem(CORPORA, "tinyshakespeare.txt", CorpusSource(
        "tinyshakespeare.txt", (places / "nowhere.txt").as_uri(), "0" * 64))
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

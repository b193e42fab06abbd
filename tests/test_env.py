"""The one boolean parser (seqjax._env): its spellings, its errors, the environment."""

import pytest

from seqjax._env import FALSE_WORDS, TRUE_WORDS, env_bool, is_bool, parse_bool


@pytest.mark.parametrize("text, want", [
    *((w, True) for w in TRUE_WORDS), *((w, False) for w in FALSE_WORDS),
    ("TRUE", True), (" Off ", False), ("Y", True), ("N", False),
])
def test_every_spelling_in_any_case(text, want):
    assert parse_bool(text, "--x") is want and is_bool(text)


@pytest.mark.parametrize("text", ["", "2", "maybe", "/some/dir", "truee"])
def test_anything_else_is_an_error_naming_its_source(text):
    assert not is_bool(text)
    with pytest.raises(ValueError, match=f"--flag must be true or false; got {text!r}"):
        parse_bool(text, "--flag")


def test_the_environment_unset_or_empty_is_the_default(monkeypatch):
    monkeypatch.delenv("SEQJAX_TEST_SWITCH", raising=False)
    assert env_bool("SEQJAX_TEST_SWITCH", True) is True
    monkeypatch.setenv("SEQJAX_TEST_SWITCH", " ")
    assert env_bool("SEQJAX_TEST_SWITCH", False) is False
    monkeypatch.setenv("SEQJAX_TEST_SWITCH", "off")
    assert env_bool("SEQJAX_TEST_SWITCH", True) is False
    monkeypatch.setenv("SEQJAX_TEST_SWITCH", "nope")
    with pytest.raises(ValueError, match=r"\$SEQJAX_TEST_SWITCH must be true or false"):
        env_bool("SEQJAX_TEST_SWITCH", True)

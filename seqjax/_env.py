"""One way to read a yes/no switch from text (an environment variable, a command-line value):
``1``, ``true``, ``yes``, ``y``, ``on`` are true; ``0``, ``false``, ``no``, ``n``, ``off`` false
(any case, surrounding spaces ignored); anything else is a ``ValueError`` naming where the text
came from, never a silent default."""

from __future__ import annotations

import os

__all__ = ["FALSE_WORDS", "TRUE_WORDS", "env_bool", "is_bool", "parse_bool"]

TRUE_WORDS = ("1", "true", "yes", "y", "on")
FALSE_WORDS = ("0", "false", "no", "n", "off")


def parse_bool(text: str, what: str) -> bool:
    """``text`` as a boolean; ``what`` names it in the error (``"--checked"``, ``"$SEQJAX_SMOKE"``).

    Example:
        >>> parse_bool(" Yes", "--flag"), parse_bool("0", "--flag")
        (True, False)
    """
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{what} must be true or false; got {text!r} "
                     f"(true: {'/'.join(TRUE_WORDS)}; false: {'/'.join(FALSE_WORDS)}).")


def is_bool(text: str) -> bool:
    """Whether :func:`parse_bool` reads ``text``."""
    return text.strip().lower() in TRUE_WORDS + FALSE_WORDS


def env_bool(name: str, default: bool) -> bool:
    """The environment variable ``name`` as a boolean (:func:`parse_bool`); ``default`` when
    it is unset or empty."""
    text = os.environ.get(name, "")
    return default if not text.strip() else parse_bool(text, f"${name}")

"""Names as text: a file name's bytes that are not UTF-8, and a name as a one-line
message shows it. Every message that prints a name the user or a file gave
(a class, a path, a group, a pattern) quotes it with :func:`shown`."""

from __future__ import annotations


def is_text(name: str) -> bool:
    """False for a name that is not valid UTF-8: Python gives such bytes of a file
    name as lone surrogates, which no UTF-8 file (labels.txt, JSON lines) can hold."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def as_text(name: str) -> str:
    """``name`` with each byte that is not UTF-8 written as ``\\xNN`` (valid names unchanged)."""
    if is_text(name):
        return name
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that came from text, not from a file name
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def printable(name: str) -> str:
    """``name`` as one line of a terminal can show it: bad bytes as ``\\xNN``, unprintable
    characters (line breaks, controls, invisible format characters) escaped."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in as_text(name)
    )


def shown(name: str) -> str:
    """``name`` quoted for a one-line message, :func:`printable`."""
    return f"'{printable(name)}'"

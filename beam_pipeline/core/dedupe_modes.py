"""--dedupe's modes and how its value reads (the flag: core/flags.py)."""

from __future__ import annotations

# --dedupe: what it drops, besides keeping one of each group. "exact": identical
# source files; "near": near copies as well (docs/images.md, "Near duplicates").
DEDUPE_MODES = ("exact", "near")


def dedupe_mode(value, switch_words: dict[str, bool]) -> str:
    """--dedupe's value as the config holds it: "" (off), "exact" or "near".

    A switch's words (``switch_words``: text -> on) stay valid, ``--dedupe=true``
    being ``exact``, as scripts and Flex Templates passed them before ``near``.
    """
    if isinstance(value, bool):
        return "exact" if value else ""
    text = str(value).strip().lower()
    if text in DEDUPE_MODES:
        return text
    return "exact" if switch_words.get(text, False) else ""

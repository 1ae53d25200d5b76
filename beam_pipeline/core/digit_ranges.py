"""Regular expressions that match exactly the decimal integers of a range.

The Flex Template's parameters (``deploy/metadata.json``) can only check a
value with a regex, so each integer flag's range check is turned into one
here (``flags.int_range``), exact rather than approximate. Pure.
"""

from __future__ import annotations


def int_range_regex(lo: int, hi: int | None) -> str:
    """A regex of the decimal integers in ``lo..hi`` (``hi`` None: no bound), ``0 <= lo <= 9``
    when unbounded."""
    if hi is None:
        if not 0 <= lo <= 9:
            raise ValueError("an unbounded range starts at 0..9")
        return f"^([{lo}-9]|[1-9][0-9]+)$"
    parts = []
    for digits in range(len(str(lo)), len(str(hi)) + 1):
        low = max(lo, 10 ** (digits - 1) if digits > 1 else 0)
        high = min(hi, 10**digits - 1)
        if low <= high:
            parts.extend(_digits_between(str(low), str(high)))
    return "^(" + "|".join(parts) + ")$"


def _digit_class(first: int, last: int) -> str:
    return str(first) if first == last else f"[{first}-{last}]"


def _digits_between(low: str, high: str) -> list[str]:
    """Regexes matching exactly the numbers ``low..high`` of one length (as strings)."""
    rest = len(low) - 1
    if rest == 0:
        return [_digit_class(int(low), int(high))]
    if low[0] == high[0]:
        return [low[0] + part for part in _digits_between(low[1:], high[1:])]
    first, last, parts, tail = int(low[0]), int(high[0]), [], []
    if low[1:] != "0" * rest:  # low's first digit only partly
        parts = [low[0] + part for part in _digits_between(low[1:], "9" * rest)]
        first += 1
    if high[1:] != "9" * rest:  # high's first digit only partly
        tail = [high[0] + part for part in _digits_between("0" * rest, high[1:])]
        last -= 1
    if first <= last:
        parts.append(_digit_class(first, last) + "[0-9]" * rest)
    return parts + tail

"""Errors that end the command line with one clear message and a non-zero exit."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable


class UsageError(ValueError):
    """Bad arguments or unusable input/output, found before any work starts.

    The CLI prints ``str(error)`` alone (no traceback) and exits with status 2.
    """


class BooksDoNotBalance(RuntimeError):
    """The job's own accounting found images lost, doubled, or too many rejected.

    Raised inside the pipeline's final step, so ``imagerecords.json`` is never
    written for an incomplete dataset. The CLI recognises it by name in the
    runner's error text and prints its message.
    """


# A runner may hand back only the text of an error raised on a worker, so the
# details travel inside the one-line message, as JSON after this marker.
_REASONS_MARKER = " reasons="
TOP_REASONS = 3


def too_many_rejects(
    reasons: Iterable[str], listed: int, max_fraction: float, rejects_file: str
) -> BooksDoNotBalance:
    """The error for a run with more rejections than ``--max_reject_fraction`` allows.

    Names the most common reasons (with counts), where all of them are listed,
    and the value of the flag that would accept them.
    """
    counts = Counter(reasons)
    rejected = sum(counts.values())
    # The smallest two-decimal threshold that accepts this run.
    needed = math.ceil(rejected / listed * 100) / 100
    message = (
        f"too many rejected images: {rejected} of {listed} ({rejected / listed:.1%}) > "
        f"--max_reject_fraction {max_fraction:g}; imagerecords.json was not written. "
        f"All are listed in {rejects_file}; to accept them, pass "
        f"--max_reject_fraction {needed:g}"
    )
    top = [[count, reason] for reason, count in counts.most_common(TOP_REASONS)]
    return BooksDoNotBalance(message + _REASONS_MARKER + json.dumps(top))


def split_reasons(message: str) -> tuple[str, list[tuple[int, str]]]:
    """``message`` without its reasons, and the ``(count, reason)`` pairs it carried."""
    head, marker, tail = message.partition(_REASONS_MARKER)
    if not marker:
        return message, []
    try:
        return head, [(int(count), str(reason)) for count, reason in json.loads(tail)]
    except (ValueError, TypeError):
        return head, []

"""Errors that end the command line with one clear message and a non-zero exit."""

from __future__ import annotations

import errno
import json
import math
import os
from collections import Counter
from collections.abc import Iterable

from beam_pipeline.core.metadata import INFO_FILE


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


# What every error of a run that stopped part-way says: nothing it wrote
# looks finished, and the same command carries on from what it converted
# (docs/scale.md).
NOT_FINISHED = f"no {INFO_FILE} was written"
RESUME_HINT = "rerun the same command to resume"


class RunStopped(RuntimeError):
    """The run cannot go on for a reason outside it (storage lost, disk full).

    Its message is the whole ``error:`` line (what failed, where, what to do);
    the CLI recognises the subclasses by name in a runner's wrapped error text.
    """


class StorageUnreachable(RunStopped):
    """Google Cloud Storage did not answer for --gcs_timeout_s (``gcs.unreachable``)."""


class CannotWrite(RunStopped):
    """Writing one of the job's files failed: disk full, file too large, ..."""


class OldDatasetChanged(RunStopped):
    """``--reuse``'s dataset changed while the run read it (a shard gone, cut short or
    rewritten since it was checked): nothing more is taken from it."""


# Why a write failed, in words a user acts on.
_WRITE_ADVICE = {
    errno.ENOSPC: "the disk is full: free some space",
    errno.EDQUOT: "the disk quota is used up: free some space",
    errno.EFBIG: "the file reached a size limit (ulimit -f, or the largest file the file "
    "system holds): raise the limit",
}


def cannot_write(path: str, error: OSError) -> CannotWrite:
    """The error for a failed write of ``path``: names the file, the reason and the fix."""
    name = errno.errorcode.get(error.errno or 0, "")
    reason = error.strerror or (os.strerror(error.errno) if error.errno else str(error))
    detail = f"{reason} ({name})" if name else reason
    advice = _WRITE_ADVICE.get(error.errno or 0)
    then = f"{advice}, then {RESUME_HINT}" if advice else RESUME_HINT
    return CannotWrite(f"could not write {path}: {detail}; {NOT_FINISHED}; {then}")


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

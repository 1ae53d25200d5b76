"""The Convert stage's bookkeeping: what one conversion outcome adds to the counters,
and the outcome as an engine keeps it.

Both engines call :func:`counts` for every outcome (the local engine adds it
to a Counter, the Beam graph's conversion steps to Beam metrics of the same
names, core/counters.py) and keep :func:`interned` outcomes.
"""

from __future__ import annotations

import sys

from beam_pipeline.core import counters
from beam_pipeline.core.elements import Converted, Origin, Outcome, Rejection

# The counter each way of coming about adds one to, beside those of the outcome.
_HOW_COUNTERS = {Origin.AHEAD: counters.CONVERTED_AHEAD, Origin.RESUMED: counters.RESUMED}


def counts(outcome: Outcome, how: Origin = Origin.CONVERTED) -> dict[str, int]:
    """The counters one outcome adds to (those above zero), by name.

    An outcome taken from an interrupted run (``how`` ``Origin.RESUMED``) counts
    only its record's bytes, or its rejection; one taken from ``--reuse``'s
    dataset counts the source bytes read to check it, and ``images_reused``.
    """
    found = {_HOW_COUNTERS[how]: 1} if how in _HOW_COUNTERS else {}
    result = outcome.result
    if isinstance(result, Rejection):
        found[counters.REJECTED] = 1
        return found
    found[counters.RECORD_BYTES] = result.entry.size
    found[counters.NEAR_HASHED] = int(outcome.near_hashed and how is not Origin.RESUMED)
    if outcome.reused:
        found.update({counters.BYTES_READ: outcome.bytes_read, counters.REUSED: 1})
    elif how is not Origin.RESUMED:
        found.update(
            {
                counters.BYTES_READ: outcome.bytes_read,
                counters.CONVERTED: 1,
                counters.PASSED_THROUGH: int(outcome.passed_through),
                counters.REPAIRED: int(outcome.repaired),
                counters.BAD_PROFILE: int(outcome.bad_profile),
            }
        )
    return {name: n for name, n in found.items() if n}


def interned(outcome: Outcome) -> Outcome:
    """``outcome`` with the path of the spill file its record lies in interned: one
    string per spill file, not one per record (the memory a record costs to keep,
    and the size of a pickled batch of references)."""
    result = outcome.result
    if not isinstance(result, Converted) or isinstance(result.entry.data, bytes):
        return outcome
    where = result.entry.data
    where = where._replace(path=sys.intern(where.path))
    return outcome._replace(result=result._replace(entry=result.entry._replace(data=where)))

"""The job's books and the shard plan of each split, from its order keys. Pure: no Beam.

The listed, written and rejected keys of a split, sorted, give the books (every
listed image once a record or a rejection) and the plan (docs/format.md sections 3, 5).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from beam_pipeline.core import keys

MAX_PROBLEMS_SHOWN = 20
_MASK = (1 << 64) - 1


class KeyTally(NamedTuple):
    """Order keys of one split seen by one step: the books' input (per batch, not per image)."""

    listed: tuple[int, ...] = ()
    written: tuple[int, ...] = ()
    rejected: tuple[int, ...] = ()
    record_bytes: int = 0


class Problem(NamedTuple):
    """A key whose books do not balance; the ID is looked up when the job reports it."""

    kind: str  # "lost" | "doubled" | "unlisted"
    key: int
    listed: int
    written: int
    rejected: int


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """Books and shard plan of one split (the side input of the shard writer and Finalize)."""

    split: str
    listed: int
    rejected: int
    record_bytes: int
    boundaries: tuple[int, ...]  # first key of shards 1..n-1
    counts: tuple[int, ...]  # records in each shard
    key_sums: tuple[int, ...]  # sum of each shard's keys mod 2^64: what it must hold
    problem_count: int = 0
    problems: tuple[Problem, ...] = ()

    @property
    def shards(self) -> int:
        return len(self.counts)

    @property
    def written(self) -> int:
        return sum(self.counts)

    def shard_of(self, key: int) -> int:
        return keys.shard_of_key(key, self.boundaries)


def as_keys(values) -> np.ndarray:
    return np.asarray(values, dtype=np.uint64)


def key_sum(values) -> int:
    """Sum of the keys mod 2^64 (a checksum of which records a shard holds)."""
    return int(np.sum(as_keys(values), dtype=np.uint64)) & _MASK


def balance(listed: np.ndarray, written: np.ndarray, rejected: np.ndarray) -> list[Problem]:
    """Every listed key exactly once written or rejected; the keys where not.

    Two different IDs with the same 64-bit key (odds ~1e-8 for a million
    images) count twice on both sides and still balance.
    """
    outcomes = np.concatenate([written, rejected])
    if len(listed) == len(outcomes) and np.array_equal(np.sort(listed), np.sort(outcomes)):
        return []
    union = np.union1d(listed, outcomes)

    def counts(values):
        found, number = np.unique(values, return_counts=True)
        out = np.zeros(len(union), dtype=np.int64)
        out[np.searchsorted(union, found)] = number
        return out

    n_listed, n_written, n_rejected = counts(listed), counts(written), counts(rejected)
    bad = np.nonzero(n_listed != n_written + n_rejected)[0]
    problems = []
    for i in bad:
        seen = (int(n_listed[i]), int(n_written[i]), int(n_rejected[i]))
        if not seen[0]:
            kind = "unlisted"
        elif seen[1] + seen[2] < seen[0]:
            kind = "lost"
        else:
            kind = "doubled"
        problems.append(Problem(kind, int(union[i]), *seen))
    return problems


def plan_split(
    split: str,
    listed: np.ndarray,
    written: np.ndarray,
    rejected: np.ndarray,
    record_bytes: int,
    target_bytes: int,
    min_shards: int,
) -> SplitPlan:
    """Books and shard plan of one split from its (unsorted) keys."""
    written = np.sort(written)
    shards = keys.num_shards(record_bytes, target_bytes, min_shards, records=len(written))
    starts = keys.shard_starts(len(written), shards)
    boundaries = tuple(int(written[i]) for i in starts[1:-1])
    counts = tuple(b - a for a, b in itertools.pairwise(starts))
    sums = tuple(key_sum(written[a:b]) for a, b in itertools.pairwise(starts))
    problems = balance(listed, written, rejected)
    return SplitPlan(
        split=split,
        listed=len(listed),
        rejected=len(rejected),
        record_bytes=record_bytes,
        boundaries=boundaries,
        counts=counts,
        key_sums=sums,
        problem_count=len(problems),
        problems=tuple(problems[:MAX_PROBLEMS_SHOWN]),
    )


def describe(problem: Problem, name: str | None) -> str:
    """One line for the error message, with the ID when it could be found."""
    who = name if name is not None else f"order key {problem.key:#018x}"
    if problem.kind == "lost":
        return f"lost (neither written nor rejected): {who}"
    if problem.kind == "unlisted":
        return f"not listed but written/rejected: {who}"
    return f"doubled ({problem.written} records, {problem.rejected} rejections): {who}"


def check_books(
    plans: Sequence[SplitPlan],
    *,
    written: int,
    rejected: int,
    shard_problems: Sequence[str] = (),
    names_of: Callable[[set[int]], Mapping[int, str]] = lambda wanted: {},
) -> str | None:
    """Whether the job may write imagerecords.json: ``None``, or why not.

    Args:
        plans: every split's books and shard plan.
        written: records in the shards kept (after ``check_shards``).
        rejected: rejections.
        shard_problems: what ``check_shards`` found wrong with the shards.
        names_of: order keys -> image IDs, called only when keys must be
            named in the message (the job lists its input again for it).
    """
    key_problems = [p for plan in plans for p in plan.problems]
    problem_count = sum(plan.problem_count for plan in plans)
    if problem_count or shard_problems:
        names = names_of({p.key for p in key_problems}) if key_problems else {}
        shown = sorted(describe(p, names.get(p.key)) for p in key_problems)
        return (
            f"the job's books do not balance: {problem_count} image IDs were lost or "
            f"doubled; imagerecords.json was not written. First: "
            + "; ".join((shown + list(shard_problems))[:MAX_PROBLEMS_SHOWN])
        )
    listed = sum(plan.listed for plan in plans)
    if not listed:
        return "no images were found in the input; nothing was written"
    if written + rejected != listed:
        return (
            f"the job's books do not balance: listed {listed}, wrote {written}, "
            f"rejected {rejected}; imagerecords.json was not written"
        )
    return None

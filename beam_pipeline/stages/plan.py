"""The Plan stage: the listed, written and rejected order keys of each split -> its SplitPlan.

:class:`KeyTallies` adds up one split's ``(split, KeyTally)`` pairs: a CombineFn on Beam,
one process on the local engine (:class:`Books`).
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import numpy as np

from beam_pipeline.core import books, keys
from beam_pipeline.core.elements import RecordBatch, Rejection


def written(batch: RecordBatch) -> tuple[str, books.KeyTally]:
    """The keys and record bytes a batch writes."""
    entries = batch.entries
    tally = books.KeyTally(
        written=tuple(e.key for e in entries), record_bytes=sum(e.size for e in entries)
    )
    return batch.split, tally


def rejected(seed: int, rejection: Rejection) -> tuple[str, books.KeyTally]:
    """The key of a rejected image."""
    return rejection.split, books.KeyTally(rejected=(keys.order_key(seed, rejection.image_id),))


class Tallied(NamedTuple):
    """One split's keys so far: the accumulator of :class:`KeyTallies`.

    Each key list holds uint64 arrays (one per tally until compacted).
    """

    listed: list
    written: list
    rejected: list
    record_bytes: int


class KeyTallies:
    """KeyTally of one split -> (listed, written, rejected keys, record bytes), all of
    the split: the methods of a Beam CombineFn, pure of Beam."""

    def create_accumulator(self) -> Tallied:
        return Tallied([], [], [], 0)

    def add_input(self, accumulator: Tallied, tally: books.KeyTally) -> Tallied:
        for into, values in (
            (accumulator.listed, tally.listed),
            (accumulator.written, tally.written),
        ):
            if values:
                into.append(books.as_keys(values))
        if tally.rejected:
            accumulator.rejected.append(books.as_keys(tally.rejected))
        return accumulator._replace(record_bytes=accumulator.record_bytes + tally.record_bytes)

    def merge_accumulators(self, accumulators) -> Tallied:
        merged = Tallied([], [], [], 0)
        for more in accumulators:
            merged.listed.extend(more.listed)
            merged.written.extend(more.written)
            merged.rejected.extend(more.rejected)
            merged = merged._replace(record_bytes=merged.record_bytes + more.record_bytes)
        return self.compact(merged)

    def compact(self, accumulator: Tallied) -> Tallied:
        # One array per kind: 8 bytes per key, however many batches came in.
        def joined(parts: list) -> list:
            return [np.concatenate(parts)] if len(parts) > 1 else parts

        return Tallied(
            joined(accumulator.listed),
            joined(accumulator.written),
            joined(accumulator.rejected),
            accumulator.record_bytes,
        )

    def extract_output(self, accumulator: Tallied) -> tuple:
        """(listed, written, rejected keys, record bytes): ``books.plan_split``'s arguments."""

        def joined(parts: list) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)

        a = accumulator
        return joined(a.listed), joined(a.written), joined(a.rejected), a.record_bytes


def plan(config, split: str, tallied) -> books.SplitPlan:
    """One split's plan from its added-up tallies (:meth:`KeyTallies.extract_output`)."""
    return books.plan_split(split, *tallied, config.target_shard_bytes, config.min_shards)


class Books:
    """Every split's tallies, added up as they come, in one process (the local engine)."""

    def __init__(self):
        self._adder = KeyTallies()
        self._splits: dict = collections.defaultdict(self._adder.create_accumulator)

    def add(self, split: str, tally: books.KeyTally) -> None:
        self._splits[split] = self._adder.add_input(self._splits[split], tally)

    def plans(self, config) -> dict[str, books.SplitPlan]:
        """(split -> SplitPlan) of every split seen."""
        extract = self._adder.extract_output
        return {
            split: plan(config, split, extract(self._splits[split]))
            for split in sorted(self._splits)
        }

"""The Plan stage: the listed, written and rejected order keys of each split ->
its SplitPlan (the books and the shard plan, ``books.plan_split``).

The keys arrive as ``(split, KeyTally)`` pairs: listed ones from the List
stage (``list_images.ListedKeys``), written ones per RecordBatch
(:func:`written`), rejected ones per Rejection (:func:`rejected`).
:class:`KeyTallies` adds up one split's tallies; the Beam graph's
``PlanShards`` runs it as a CombineFn across workers, the local engine in
one process (:class:`Books`).
"""

from __future__ import annotations

import collections

import numpy as np

from beam_pipeline.core import books, keys
from beam_pipeline.stages.convert import RecordBatch, Rejection


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


class KeyTallies:
    """KeyTally of one split -> (listed, written, rejected keys, record bytes), all of
    the split: the methods of a Beam CombineFn, pure of Beam."""

    def create_accumulator(self):
        return [], [], [], 0

    def add_input(self, accumulator, tally: books.KeyTally):
        listed, written_keys, rejected_keys, size = accumulator
        for into, values in ((listed, tally.listed), (written_keys, tally.written)):
            if values:
                into.append(books.as_keys(values))
        if tally.rejected:
            rejected_keys.append(books.as_keys(tally.rejected))
        return listed, written_keys, rejected_keys, size + tally.record_bytes

    def merge_accumulators(self, accumulators):
        listed, written_keys, rejected_keys, size = [], [], [], 0
        for more in accumulators:
            listed += more[0]
            written_keys += more[1]
            rejected_keys += more[2]
            size += more[3]
        return self.compact((listed, written_keys, rejected_keys, size))

    def compact(self, accumulator):
        # One array per kind: 8 bytes per key, however many batches came in.
        *parts, size = accumulator
        return (*([np.concatenate(p)] if len(p) > 1 else p for p in parts), size)

    def extract_output(self, accumulator):
        *parts, size = accumulator
        empty = np.zeros(0, dtype=np.uint64)
        return (*(np.concatenate(p) if p else empty for p in parts), size)


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

"""The Near duplicates stage: records whose fingerprints are within the threshold
are paired, pairs become groups; with ``--dedupe near`` every member of a group
but the keeper becomes a rejection.

Both engines run the same steps: every record's band keys (:func:`keyed`),
the records that share a key gathered into a bucket, each bucket's verified
pairs (:func:`bucket`), the distinct pairs into groups (``near_search.report``).
The Beam graph gathers with a ``GroupByKey`` (``near_graph.py``); the local
engine with :func:`find_local`, which writes the keyed entries to run files
partitioned by the key's low bits and gathers one partition at a time, so
that what it holds is one partition's keys, not every image's 76.

Pure of Beam.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np

from beam_pipeline.core import near_duplicates, near_search
from beam_pipeline.core.duplicates import Member
from beam_pipeline.core.elements import RecordBatch, Rejection, RejectKind
from beam_pipeline.stages import dedupe

# A pair as it crosses a Beam shuffle: plain values (a deterministic key for Distinct).
PairRow = tuple[str, str, int, str, str, int, int]


def keyed(batch: RecordBatch) -> Iterator[tuple[int, near_search.Entry]]:
    """RecordBatch -> (band key, Entry) for every band key of every record."""
    for e in batch.entries:
        if e.near:  # every converted record has one; hand-made test entries may not
            yield from near_search.keyed(Member(e.image_id, batch.split, e.label), e.near)


def bucket(item: tuple[int, Iterable[near_search.Entry]]):
    """(band key, its entries) -> the bucket's Pairs, or its Oversized report."""
    key, entries = item
    return near_search.bucket(key, list(entries))


def to_row(pair: near_search.Pair) -> PairRow:
    return (*pair.a, *pair.b, pair.distance)


def from_row(row) -> near_search.Pair:
    return near_search.Pair(Member(*row[0:3]), Member(*row[3:6]), row[6])


def drop_near(batch: RecordBatch, drops: dict[str, str]) -> tuple[RecordBatch, list[Rejection]]:
    """The batch without the near copies in ``drops`` (image ID -> reason), and a
    Rejection per copy."""
    return dedupe.drop_copies(batch, drops, RejectKind.NEAR_DUPLICATE)


def drop_all_near(
    batches: Iterable[RecordBatch], found: Found
) -> tuple[list[RecordBatch], list[Rejection]]:
    """--dedupe near in one process: the batches without the near copies, and a
    Rejection per copy."""
    return dedupe.drop_from_all(
        batches, near_search.dropped(found.groups), RejectKind.NEAR_DUPLICATE
    )


# ------------------------------------------------------------- the local engine

PARTITIONS = 64  # run files: one partition's keys are 1/64 of every image's
_RUN = np.dtype([("key", "<u8"), ("image", "<u4"), ("whole", "u1")])
_CHUNK = 2048  # images whose keyed entries are sorted into the partitions at once


def partition_of(key: int, partitions: int = PARTITIONS) -> int:
    """The run file a band key goes to: its low bits (a key's bits are the hash's)."""
    return key % partitions


class Found(NamedTuple):
    """What the search hands to Finalize."""

    groups: list[near_search.Group] = []
    oversized: list[near_search.Oversized] = []  # buckets left unpaired, sorted


def found_of(pairs: Iterable[near_search.Pair], oversized) -> Found:
    """The groups of the pairs (distinct or not) and the oversized buckets, sorted."""
    return Found(near_search.report(pairs), sorted(set(oversized)))


def find_local(batches: Iterable[RecordBatch], work_dir: str) -> Found:
    """The search in one process, its memory bounded by one partition of keys.

    ``work_dir``: a local folder for the run files (a temporary folder is made
    in it and removed on every way out).
    """
    members: list[Member] = []
    prints: list[bytes] = []
    for batch in batches:
        for e in batch.entries:
            if e.near:
                members.append(Member(e.image_id, batch.split, e.label))
                prints.append(e.near)
    os.makedirs(work_dir, exist_ok=True)
    runs = tempfile.mkdtemp(prefix="near-", dir=work_dir)
    try:
        _write_runs(prints, runs)
        pairs, oversized = set(), []
        for partition in range(PARTITIONS):
            for result in _partition_buckets(runs, partition, members, prints):
                if isinstance(result, near_search.Oversized):
                    oversized.append(result)
                else:
                    pairs.update(result)
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    return found_of(pairs, oversized)


def _run_path(runs: str, partition: int) -> str:
    return os.path.join(runs, f"{partition:03d}.run")


def _write_runs(prints: list[bytes], runs: str) -> None:
    """Every image's keyed entries, appended to its key's partition a chunk of images
    at a time (what is held is one chunk's entries, not every image's)."""
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(_run_path(runs, p), "ab")) for p in range(PARTITIONS)]
        for start in range(0, len(prints), _CHUNK):
            rows = [
                (key, image, whole)
                for image in range(start, min(start + _CHUNK, len(prints)))
                for key, whole in near_duplicates.band_keys(near_search.unpack(prints[image]))
            ]
            entries = np.array(rows, dtype=_RUN)
            parts = entries["key"] % PARTITIONS
            order = np.argsort(parts, kind="stable")
            entries, parts = entries[order], parts[order]
            bounds = np.searchsorted(parts, np.arange(PARTITIONS + 1))
            for partition in range(PARTITIONS):
                low, high = bounds[partition], bounds[partition + 1]
                if low < high:
                    files[partition].write(entries[low:high].tobytes())


def _partition_buckets(runs: str, partition: int, members, prints):
    entries = np.fromfile(_run_path(runs, partition), dtype=_RUN)
    entries = entries[np.argsort(entries["key"], kind="stable")]
    keys = entries["key"]
    bounds = [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist(), len(entries)]
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end - start < 2:
            continue
        part = entries[start:end]
        bucket_entries = [
            near_search.Entry(members[i], bool(w), prints[i])
            for i, w in zip(part["image"].tolist(), part["whole"].tolist(), strict=True)
        ]
        yield near_search.bucket(int(part["key"][0]), bucket_entries)

"""The Duplicates stage: groups of records whose sources share a SHA-256; --dedupe's copies.

The Beam graph's ``FindDuplicates`` runs these as steps, the local engine in one pass;
who is kept is ``duplicates.py``'s rule.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator

from beam_pipeline.core.elements import RecordBatch, Rejection, RejectKind
from beam_pipeline.features.dedupe import duplicates

Group = tuple[str, list[duplicates.Member]]  # (sha256, every image with that source)


def members(batch: RecordBatch) -> Iterator[tuple[str, duplicates.Member]]:
    """RecordBatch -> (sha256, Member) per record: ~150 bytes per image, not the image."""
    for e in batch.entries:
        if e.sha256:  # every converted record has one; hand-made test entries may not
            yield e.sha256, duplicates.Member(e.image_id, batch.split, e.label)


def is_group(group: Group) -> bool:
    """A hash held by two or more images."""
    return len(group[1]) > 1


def copies(group: Group) -> list[tuple[str, str]]:
    """(image ID, rejection reason) of every member --dedupe drops from ``group``."""
    return [(m.image_id, reason) for m, reason in duplicates.dropped(group[1])]


def drop_copies(
    batch: RecordBatch, drops: dict[str, str], kind: RejectKind = RejectKind.DUPLICATE
) -> tuple[RecordBatch, list[Rejection]]:
    """The batch without the copies in ``drops`` (image ID -> reason), and a Rejection
    of ``kind`` per copy (exact copies, or near ones for ``--dedupe near``)."""
    kept, dropped = duplicates.drop_copies(batch.entries, drops)
    rejections = [Rejection(e.image_id, e.path, batch.split, reason, kind) for e, reason in dropped]
    return RecordBatch(batch.split, tuple(kept)), rejections


def drop_from_all(
    batches: Iterable[RecordBatch], drops: dict[str, str], kind: RejectKind = RejectKind.DUPLICATE
) -> tuple[list[RecordBatch], list[Rejection]]:
    """:func:`drop_copies` over every batch, in one process."""
    kept, rejections = [], []
    for batch in batches:
        batch, dropped = drop_copies(batch, drops, kind)
        kept.append(batch)
        rejections += dropped
    return kept, rejections


def find_groups(batches: Iterable[RecordBatch]) -> list[Group]:
    """Every group of the batches, in one process."""
    found = collections.defaultdict(list)
    for batch in batches:
        for sha256, member in members(batch):
            found[sha256].append(member)
    return [group for group in found.items() if is_group(group)]


def drop_all_copies(
    batches: Iterable[RecordBatch], groups: list[Group]
) -> tuple[list[RecordBatch], list[Rejection]]:
    """--dedupe in one process: the batches without the copies of ``groups``, and a
    Rejection per copy."""
    return drop_from_all(batches, dict(pair for group in groups for pair in copies(group)))

"""The List stage: one source's rows -> ImageRefs, Skipped files, listed keys, group census.

Both engines run it per source (a class folder or a manifest); the listed keys, in
batches of :data:`BATCH`, are the books' independent count.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from beam_pipeline.core import books, groups, keys
from beam_pipeline.core.elements import ImageRef
from beam_pipeline.storage.listing import Skipped

BATCH = 1 << 16  # keys per ListedKeys: 512 KB


class ListedKeys(NamedTuple):
    """The order keys of up to :data:`BATCH` images listed in one split."""

    split: str
    tally: books.KeyTally


def list_source(
    layout, source, seed: int, splits, group_by: str | None = None, rows=None
) -> Iterator[ImageRef | Skipped | ListedKeys | groups.Census]:
    """Every image of ``source`` as an ImageRef (its split the layout's, else drawn by
    ``groups.split_of`` from its group: ``group_by``'s or the manifest's, else its own),
    every file that is not an image as a Skipped, and the keys of the images listed
    as ListedKeys: one per :data:`BATCH` per split, and the rest at the end. Count the
    images listed from the ListedKeys. Last, the source's ``groups.Census``.

    ``rows``: the source's rows as ``layout.rows`` gives them, when the caller
    lists them itself (the dry run, which also wants the files' sizes)."""
    pending: dict[str, list[int]] = {}
    census = groups.Census()
    for row in layout.rows(source) if rows is None else rows:
        if isinstance(row, Skipped):
            yield row
            continue
        image_id, path, label, split, column = row
        group = groups.group_of(group_by, image_id, column)
        split = split or groups.split_of(seed, image_id, group, splits)
        census.add(split, group, label)
        yield ImageRef(image_id, path, label, split)
        listed = pending.setdefault(split, [])
        listed.append(keys.order_key(seed, image_id))
        if len(listed) >= BATCH:
            yield ListedKeys(split, books.KeyTally(listed=tuple(listed)))
            listed.clear()
    for split, listed in pending.items():
        if listed:
            yield ListedKeys(split, books.KeyTally(listed=tuple(listed)))
    yield census

"""The Near duplicates stage: fingerprints within the threshold paired, pairs into groups.

Both engines run these steps; the local engine gathers its buckets with
:func:`find_local` in bounded memory (docs/architecture.md, "Near-duplicate search").
Pure of Beam.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np

from beam_pipeline.core.elements import RecordBatch, Rejection, RejectKind, ShardEntry
from beam_pipeline.features.dedupe import stage as dedupe
from beam_pipeline.features.dedupe.duplicates import Member
from beam_pipeline.features.near import hashes as near_duplicates
from beam_pipeline.features.near import search as near_search

# A pair as it crosses a Beam shuffle: plain values (a deterministic key for Distinct).
PairRow = tuple[str, str, int, str, str, int, int]


def fingerprints(batch: RecordBatch) -> Iterator[tuple[bytes, Member]]:
    """RecordBatch -> (packed fingerprint, Member) for every record the search takes:
    those with a fingerprint (every converted record; hand-made test entries
    may lack one) that has texture (``near_search.searched``)."""
    for e in batch.entries:
        if e.near and near_search.searched(e.near):
            yield e.near, Member(e.image_id, batch.split, e.label)


def untextured(batch: RecordBatch) -> int:
    """How many of the batch's fingerprints lack texture: the search leaves them out."""
    return sum(1 for e in batch.entries if e.near and not near_search.searched(e.near))


def twins(
    item: tuple[bytes, Iterable[Member]],
) -> tuple[tuple[bytes, Member], list[near_search.Pair]]:
    """(fingerprint, the records that have it) -> (fingerprint, the first of them by
    ID) and a Pair at distance 0 joining each other one to that first.

    Records of one fingerprint are near copies of each other and of whatever
    the first is a near copy of, so only the first goes on to the band search:
    a thousand copies of one blank or placeholder image make 999 pairs, not
    the half a million an all-against-all bucket would (nor, past the bucket
    limit, no group at all).
    """
    packed, members = item
    first, *others = sorted(members)
    return (packed, first), [near_search.Pair(first, m, 0) for m in others]


def keyed(item: tuple[bytes, Member]) -> list[tuple[int, near_search.Entry]]:
    """(fingerprint, its first record) -> (band key, Entry) for each of its band keys."""
    packed, member = item
    return near_search.keyed(member, packed)


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

PARTITIONS = 64  # run files of one band: one partition's keys are 1/64 of the band's
# A run file's entry: one uint64 of (the band's bits, image, slot), the slot
# the hash filed under the key or PROBE_SLOT for a probe, so that a plain
# sort orders a partition by key, then image.
_SLOT_BITS = 5
PROBE_SLOT = (1 << _SLOT_BITS) - 1
_IMAGE_BITS = 32
_KEY_SHIFT = _IMAGE_BITS + _SLOT_BITS
assert near_duplicates.BAND_BITS + _KEY_SHIFT <= 64, "band keys too wide for a run entry"
assert len(near_duplicates.WINDOWS) < PROBE_SLOT, "too many hashes for a run entry's slot"
_CHUNK = 8192  # images whose keyed entries are sorted into the partitions at once


def partition_of(key: int, partitions: int = PARTITIONS) -> int:
    """The run file a band key goes to: its low bits (a key's bits are the hash's)."""
    return key % partitions


class Found(NamedTuple):
    """What the search hands to Finalize."""

    groups: list[near_search.Group] = []
    oversized: list[near_search.Oversized] = []  # buckets left unpaired, sorted
    untextured: int = 0  # images left out of the search (``near_search.searched``)


def found_of(pairs: Iterable[near_search.Pair], oversized, untextured: int = 0) -> Found:
    """The groups of the pairs (distinct or not) and the oversized buckets, sorted."""
    return Found(near_search.report(pairs), sorted(set(oversized)), untextured)


def find_local(batches: Iterable[RecordBatch], work_dir: str) -> Found:
    """The search in one process, its memory bounded by one band's two key sets
    (16 MB and 128 MB at 27 bits, ``write_runs``) and one partition of its keys.

    The same pairs and oversized buckets as :func:`bucket` over every band
    key (the Beam graph's), on arrays, a band at a time: a pair's distance
    depends on its two images only, so the candidates of a partition's
    buckets are deduplicated first and each verified once.

    ``work_dir``: a local folder for the run files (a temporary folder is made
    in it and removed on every way out).
    """
    members = _Members()
    packed = bytearray()
    width = 0
    left_out = 0
    for batch in batches:
        hashed = [e for e in batch.entries if e.near]
        if not hashed:
            continue
        width = width or len(hashed[0].near)
        odd = next((e for e in hashed if len(e.near) != width), None)
        if odd is not None:
            raise ValueError(
                f"{odd.image_id}: a fingerprint of {len(odd.near)} bytes among ones of "
                f"{width} (records of two near-duplicate schemes in one search)"
            )
        kept = [e for e in hashed if near_search.searched(e.near)]
        left_out += len(hashed) - len(kept)
        hashed = kept
        if not hashed:
            continue
        members.add(batch.split, hashed)
        packed += b"".join(e.near for e in hashed)
    if not members:
        return found_of([], [], left_out)
    hashes, colours = _fingerprint_arrays(packed, width)
    del packed
    searched, pairs = _first_of_twins(hashes, colours, members)
    os.makedirs(work_dir, exist_ok=True)
    oversized = []
    for band in range(near_duplicates.BAND_COUNT):
        runs = tempfile.mkdtemp(prefix="near-", dir=work_dir)
        try:
            write_runs(hashes, runs, searched, band)
            for partition in range(PARTITIONS):
                entries = np.fromfile(run_path(runs, partition), dtype=np.uint64)
                candidates, too_big = partition_candidates(entries, hashes, band)
                oversized += too_big
                pairs += verified(candidates, len(members), hashes, colours, members)
        finally:
            shutil.rmtree(runs, ignore_errors=True)
    return found_of(pairs, oversized, left_out)


class _Members:
    """The searched records as a sequence of ``Member`` values, each made only when
    asked for: a search at 1.28 M images pairs a few thousand of them, and
    making a ``Member`` per record cost a quarter of the search's CPU."""

    def __init__(self):
        self._starts: list[int] = []  # the index of each part's first record
        self._parts: list[tuple[str, list[ShardEntry]]] = []
        self._count = 0

    def add(self, split: str, entries: list[ShardEntry]) -> None:
        self._starts.append(self._count)
        self._parts.append((split, entries))
        self._count += len(entries)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> Member:
        part = bisect.bisect_right(self._starts, index) - 1
        split, entries = self._parts[part]
        entry = entries[index - self._starts[part]]
        return Member(entry.image_id, split, entry.label)


def _fingerprint_arrays(packed: bytearray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(images, slots)`` uint64 hashes and ``(images, 3)`` colours of packed
    fingerprints of ``width`` bytes each (``near_search.pack``)."""
    raw = np.frombuffer(packed, np.uint8).reshape(-1, width)
    colour_at = width - near_search.COLOUR_BYTES
    hashes = np.empty((len(raw), colour_at // near_search.HASH_BYTES), np.uint64)
    for low in range(0, len(raw), _CHUNK):  # a chunk at a time: no second copy of them all
        hashes[low : low + _CHUNK] = raw[low : low + _CHUNK, :colour_at].copy().view(">u8")
    return hashes, raw[:, colour_at:].copy()


def _first_of_twins(hashes, colours, members) -> tuple[np.ndarray, list[near_search.Pair]]:
    """:func:`twins` on arrays: which images go on to the band search (a bool per
    image: those whose fingerprint no other has, and the first of each set that
    share one) and the pairs joining the others to their first.

    Identical fingerprints share their whole hash, so only runs of an equal
    whole hash (sorted) are compared in full.
    """
    searched = np.ones(len(members), bool)
    pairs: list[near_search.Pair] = []
    order = np.argsort(hashes[:, 0], kind="stable")
    whole = hashes[order, 0]
    starts = np.flatnonzero(np.r_[True, whole[1:] != whole[:-1]])
    sizes = np.diff(np.r_[starts, len(whole)])
    for start, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist(), strict=True):
        run = order[start : start + size]
        rows = np.concatenate([hashes[run].view(np.uint8).reshape(size, -1), colours[run]], 1)
        _, which = np.unique(rows, axis=0, return_inverse=True)
        which = which.ravel()
        for kind in np.flatnonzero(np.bincount(which) > 1).tolist():
            same = run[which == kind].tolist()
            (_, first), joined = twins((b"", [members[i] for i in same]))
            searched[same] = False
            searched[next(i for i in same if members[i] == first)] = True
            pairs += joined
    return searched, pairs


def run_path(runs: str, partition: int) -> str:
    return os.path.join(runs, f"{partition:03d}.run")


def _chunks(hashes: np.ndarray, searched: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, rows)`` of the images ``searched`` says, a chunk at a time."""
    for start in range(0, len(hashes), _CHUNK):
        rows = np.flatnonzero(searched[start : start + _CHUNK]) + start
        if len(rows):
            yield start, rows


def write_runs(hashes: np.ndarray, runs: str, searched: np.ndarray, band: int) -> None:
    """One band's entries of every image ``searched`` says, appended to their key's
    partition a chunk of images at a time (what is held is one chunk's entries,
    not every image's): first its probes under keys some hash has, then its
    homes under keys those probes look up. An entry under any other key meets
    nothing (``near_search.bucket``), so leaving it out changes no pair.

    The homes' keys are a bit a key (16 MB at 27 bits); the written probes'
    keys a bool a key (128 MB), set for those probes only.
    """
    offset = near_duplicates.band_offsets()[band]
    masks = near_duplicates.flip_masks()
    slots = np.arange(hashes.shape[1], dtype=np.uint64)

    def homes_of(rows):
        return near_duplicates.band_rows(hashes[rows], offset)

    filed = near_duplicates.KnownKeys.of(
        (homes_of(rows) for _, rows in _chunks(hashes, searched)), near_duplicates.BAND_BITS
    )
    probed = np.zeros(1 << near_duplicates.BAND_BITS, bool)
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(run_path(runs, p), "ab")) for p in range(PARTITIONS)]
        for _, rows in _chunks(hashes, searched):
            probe = near_duplicates.band_rows(hashes[rows, :1], offset) ^ masks
            at = np.nonzero(filed.has(probe))
            probed[probe[at]] = True
            _append(files, run_entries(probe[at], rows[at[0]], np.uint64(PROBE_SLOT)))
        del filed
        for _, rows in _chunks(hashes, searched):
            home = homes_of(rows)
            at = np.nonzero(probed[home])
            _append(files, run_entries(home[at], rows[at[0]], slots[at[1]]))


def _append(files, entries: np.ndarray) -> None:
    """Run entries appended to their partitions' files."""
    parts = ((entries >> np.uint64(_KEY_SHIFT)) % np.uint64(PARTITIONS)).astype(np.uint8)
    order = np.argsort(parts, kind="stable")  # a radix sort of bytes
    entries, parts = entries[order], parts[order]
    bounds = np.searchsorted(parts, np.arange(PARTITIONS + 1))
    for partition in range(PARTITIONS):
        low, high = bounds[partition], bounds[partition + 1]
        if low < high:
            files[partition].write(entries[low:high].tobytes())


def run_entries(keys: np.ndarray, images: np.ndarray, slots) -> np.ndarray:
    """Run-file entries of a band's bits, image indexes and slots (``PROBE_SLOT``: a probe)."""
    if len(images) and int(images.max()) >> _IMAGE_BITS:
        raise ValueError(f"more than 2**{_IMAGE_BITS} images in one near-duplicate search")
    return (
        keys.astype(np.uint64) << np.uint64(_KEY_SHIFT)
        | images.astype(np.uint64) << np.uint64(_SLOT_BITS)
        | slots
    )


def partition_candidates(
    entries: np.ndarray, hashes: np.ndarray, band: int
) -> tuple[np.ndarray, list[near_search.Oversized]]:
    """One band's partition of run entries -> its distinct candidate pairs as
    ``i * images + j`` (``i < j``, sorted) and its oversized buckets.

    ``near_search.bucket``'s rule on arrays: the entries sorted (by key), each
    probe of a key's run meets every home of another image in the run, and
    the meeting is kept when the whole hash and the home's hash are within
    the threshold (``near_duplicates.meets``); a run of a probe and a home
    past ``near_search.MAX_BUCKET`` images is reported instead.
    """
    images = len(hashes)
    if not len(entries):
        return np.zeros(0, np.int64), []
    entries = np.sort(entries)
    keys = entries >> np.uint64(_KEY_SHIFT)
    image = ((entries >> np.uint64(_SLOT_BITS)) & np.uint64((1 << _IMAGE_BITS) - 1)).astype(
        np.int64
    )
    slot = (entries & np.uint64(PROBE_SLOT)).astype(np.int64)
    probe = slot == PROBE_SLOT
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    sizes = np.diff(np.r_[starts, len(keys)])
    probes = np.add.reduceat(probe.astype(np.int64), starts)
    both = (probes > 0) & (probes < sizes)
    # An image with two entries under a key (a probe and a home, or two
    # homes): one image of the bucket.
    imaged = entries >> np.uint64(_SLOT_BITS)
    distinct = np.add.reduceat(np.r_[True, imaged[1:] != imaged[:-1]].astype(np.int64), starts)
    big = both & (distinct > near_search.MAX_BUCKET)
    band_key = band << near_duplicates.BAND_BITS
    oversized = [
        near_search.Oversized(band_key | int(k), int(c))
        for k, c in zip(keys[starts[big]].tolist(), distinct[big].tolist(), strict=True)
    ]
    run = np.repeat(np.arange(len(starts)), sizes)
    meets = np.flatnonzero(probe & both[run] & ~big[run])
    # Each probe against every position of its run: a ragged arange.
    first, count = starts[run[meets]], sizes[run[meets]]
    into = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    at, other = np.repeat(meets, count), np.repeat(first, count) + into
    keep = ~probe[other] & (image[other] != image[at])
    a, b, s = image[at[keep]], image[other[keep]], slot[other[keep]]
    # The pairing that met: the prober's whole hash against the home's hash.
    close = np.bitwise_count(hashes[a, 0] ^ hashes[b, s]) <= near_duplicates.THRESHOLD
    a, b = a[close], b[close]
    pairs = np.sort(np.minimum(a, b) * images + np.maximum(a, b))
    return pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if len(pairs) else pairs, oversized


_VERIFY_CHUNK = 1 << 14  # candidates whose hashes are gathered at once (in cache)


def verified(candidates, images: int, hashes, colours, members) -> list[near_search.Pair]:
    """The candidates that ``near_duplicates.verify`` accepts, as Pairs."""
    pairs = []
    # The candidates' rows are gathered into the same two buffers each chunk.
    rows_a = np.empty((_VERIFY_CHUNK, hashes.shape[1]), hashes.dtype)
    rows_b = np.empty_like(rows_a)
    for low in range(0, len(candidates), _VERIFY_CHUNK):
        chunk = candidates[low : low + _VERIFY_CHUNK]
        i, j = np.divmod(chunk, images)
        a_rows, b_rows = rows_a[: len(chunk)], rows_b[: len(chunk)]
        np.take(hashes, i, axis=0, out=a_rows)
        np.take(hashes, j, axis=0, out=b_rows)
        d = near_duplicates.distances(a_rows, b_rows)
        # The support and colours of the few within the distance only: most
        # candidates are not.
        close = np.flatnonzero(d <= near_duplicates.THRESHOLD)
        i, j, d = i[close], j[close], d[close]
        held = near_duplicates.supports(a_rows[close], b_rows[close]) <= near_duplicates.SUPPORT
        i, j, d = i[held], j[held], d[held]
        ok = near_duplicates.colours_agree_rows(colours[i], colours[j])
        for a, b, dist in zip(i[ok].tolist(), j[ok].tolist(), d[ok].tolist(), strict=True):
            ma, mb = members[a], members[b]
            if ma.image_id == mb.image_id:
                continue  # one image under two entries cannot happen; never pair it with itself
            pairs.append(
                near_search.Pair(ma, mb, dist) if ma < mb else near_search.Pair(mb, ma, dist)
            )
    return pairs

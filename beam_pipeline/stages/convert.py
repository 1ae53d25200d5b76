"""One listed image -> a Converted record or a Rejection. No Beam import at module level.

Kept free of Beam so that the local conversion processes (see
``pipeline._PooledConvertFn``) start in a fraction of a second: they import
Pillow, protobuf and this package's pure modules only.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from typing import NamedTuple

from beam_pipeline.core import deadline, images, keys, records, spill
from beam_pipeline.stages import reuse
from beam_pipeline.storage import gcs, paths


class SpillLocation(NamedTuple):
    """Where a local conversion process appended a framed record (see spill.py)."""

    path: str
    offset: int


class ShardEntry(NamedTuple):
    """One record on its way to a shard: what WriteShards sorts and writes."""

    key: int  # order key, unsigned 64-bit
    image_id: str
    label: int
    size: int  # bytes of the framed TFRecord
    # The framed TFRecord itself (records through the runner's shuffle), or
    # where the local pool spilled it (only a reference crosses the graph).
    data: bytes | SpillLocation
    # The source file, for a rejection --dedupe makes of this record.
    path: str = ""
    sha256: str = ""  # of the source file: duplicates are grouped by it


class Converted(NamedTuple):
    """A converted image: its split and its shard entry."""

    split: str
    entry: ShardEntry


class RecordBatch(NamedTuple):
    """Records of one split: the element between ConvertImages and WriteShards.

    A batch carries up to a few MB of record bytes, or up to a few thousand
    spill references, so that the runner handles one element per batch, not
    per image.
    """

    split: str
    entries: tuple[ShardEntry, ...]


class Rejection(NamedTuple):
    image_id: str
    path: str
    split: str
    reason: str


class Outcome(NamedTuple):
    """What converting one image produced, with the numbers the counters need."""

    result: Converted | Rejection
    bytes_read: int
    passed_through: bool
    repaired: bool = False  # extra bytes dropped, re-encoded clean
    bad_profile: bool = False  # unusable colour profile, pixels kept
    reused: bool = False  # the record was taken from --reuse's dataset, not converted


def read_bytes(path: str) -> bytes:
    if "://" not in path:  # local: plain open() is the cheapest way
        with open(path, "rb") as stream:
            return stream.read()
    from apache_beam.io.filesystem import CompressionTypes

    gcs.bound_retries()  # this process may not have been told --gcs_timeout_s yet
    opened = paths.filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    with opened as stream:
        return stream.read()


class Decoded(NamedTuple):
    """The path-only half of a conversion: what does not depend on label, split or seed."""

    bytes_read: int
    sha256: str
    converted: images.Converted | None
    reason: str | None  # why it is rejected, when converted is None


# The rejections whose cause lies outside the file's bytes: it could not be
# read (permission denied, a network error, a file not there yet: OSError or a
# remote filesystem's error) or its conversion ran out of time (which depends
# on the machine's load). A resumed run tries those images again, so that its
# output is what an uninterrupted run gives once the cause is gone. Every
# other rejection (images.Rejected: bad image data, a bomb, an unsupported
# image) is what the same bytes get again, and a resumed run reuses it.
CANNOT_READ = "cannot read: "
TIMED_OUT = "timed out: "


def is_transient(reason: str) -> bool:
    """Whether a rejection may not happen again: a resumed run retries the image."""
    return reason.startswith((CANNOT_READ, TIMED_OUT))


def decode_path(path: str, spec: images.ImageSpec) -> Decoded:
    """Reads and converts one file; never raises for a bad image."""
    try:
        data = read_bytes(path)
    except Exception as error:  # an unreadable file is a rejection, not a crash
        gcs.raise_if_unreachable(error, path)  # but GCS out of reach stops the run
        return unreadable(error)
    return decode_data(data, spec, path)


def unreadable(error: Exception) -> Decoded:
    return Decoded(0, "", None, f"{CANNOT_READ}{type(error).__name__}: {error}")


def decode_data(
    data: bytes, spec: images.ImageSpec, what: str = "an image", sha256: str | None = None
) -> Decoded:
    """Converts one file's bytes, already read; never raises for a bad image.

    ``what`` names the file in the time limit's log line; ``sha256``: the
    bytes' hash, when the caller has it already.
    """
    try:
        with deadline.limit(spec.timeout_s, what):
            converted = images.convert(data, spec)
    except images.Rejected as rejection:
        return Decoded(len(data), "", None, str(rejection))
    except deadline.ImageTimeout:
        return Decoded(len(data), "", None, timeout_reason(spec.timeout_s))
    return Decoded(len(data), sha256 or hashlib.sha256(data).hexdigest(), converted, None)


def timeout_reason(seconds: float) -> str:
    return f"{TIMED_OUT}converting took longer than --image_timeout_s {seconds:g}"


def finish(ref: tuple[str, str, int, str], decoded: Decoded, seed: int, classes) -> Outcome:
    """Builds the record (or rejection) of ``ref`` from its decoded image."""
    image_id, path, label, split = ref
    if decoded.converted is None:
        return Outcome(Rejection(image_id, path, split, decoded.reason), decoded.bytes_read, False)
    converted = decoded.converted
    payload = records.image_record(
        converted.jpeg,
        converted.height,
        converted.width,
        label,
        classes[label],
        image_id,
        decoded.sha256,
    )
    framed = records.frame_record(payload)
    key = keys.order_key(seed, image_id)
    entry = ShardEntry(key, image_id, label, len(framed), framed, path, decoded.sha256)
    return Outcome(
        Converted(split, entry),
        decoded.bytes_read,
        converted.passed_through,
        converted.repaired,
        converted.bad_profile,
    )


def convert_ref(
    ref: tuple[str, str, int, str],
    spec: images.ImageSpec,
    seed: int,
    classes: tuple[str, ...],
    old: reuse.OldRecord | None = None,
) -> Outcome:
    """Reads, converts and serializes one image; never raises for a bad image.

    Args:
        ref: ``(image_id, path, label, split)`` (a ``listing.ImageRef`` or plain tuple).
        old: ``--reuse``'s record of the same ID: taken over when the source
            file's SHA-256 is the one it names (:func:`reuse_or_convert`).
    """
    if old is not None:
        return reuse_or_convert(ref, old, spec, seed, classes)
    return finish(ref, decode_path(ref[1], spec), seed, classes)


def hash_source(path: str) -> tuple[str, int, bytes | None]:
    """``(sha256, size, bytes)`` of a source file; bytes None when it was hashed in place.

    A local file is hashed through a read-only memory map: no copy of it is
    made (docs/performance.md, "Measurements behind code choices"), and --reuse needs its
    bytes only when it changed. A remote one is read (it may be converted).

    Raises:
        Exception: the file cannot be read (a rejection, as in a full run).
    """
    if "://" in path:
        data = read_bytes(path)
        return hashlib.sha256(data).hexdigest(), len(data), data
    with open(path, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        if not size:  # an empty file cannot be mapped
            data = stream.read()
            return hashlib.sha256(data).hexdigest(), len(data), data
        with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return hashlib.sha256(mapped).hexdigest(), size, None


def reuse_or_convert(ref, old: reuse.OldRecord, spec, seed, classes) -> Outcome:
    """The record OLD holds for ``ref``'s ID when the source has not changed; else
    a conversion of the source. Either way the bytes a full conversion would write.

    A reused record is its bytes as :func:`reuse.take` read and checked them,
    never a reference into OLD's shard: what is copied into the output later
    is what was checked, whatever happens to OLD meanwhile.
    """
    image_id, path, label, split = ref
    try:
        sha256, size, data = hash_source(path)
    except Exception as error:  # an unreadable file is a rejection, as in a full run
        gcs.raise_if_unreachable(error, path)  # but GCS out of reach stops the run
        return finish(ref, unreadable(error), seed, classes)
    taken = reuse.take(old, image_id, sha256, label, classes[label])
    if taken is not None:
        framed, _ = taken
        key = keys.order_key(seed, image_id)
        entry = ShardEntry(key, image_id, label, len(framed), framed, path, sha256)
        return Outcome(Converted(split, entry), size, False, reused=True)
    if data is None:  # changed: read it, and hash what is converted (it may change again)
        return finish(ref, decode_path(path, spec), seed, classes)
    return finish(ref, decode_data(data, spec, path, sha256), seed, classes)


def convert_chunk(refs, spec, seed, classes, olds=None) -> list[Outcome]:
    """Converts a few images in one task (a few per task amortise the IPC, ~15% here).

    ``olds``: ``--reuse``'s record for each ref (or None), when there is one.
    """
    if olds is None:
        return [convert_ref(ref, spec, seed, classes) for ref in refs]
    return [convert_ref(ref, spec, seed, classes, old) for ref, old in zip(refs, olds, strict=True)]


def spill_chunk(refs, spec, seed, classes, spill_dir: str, olds=None) -> list[Outcome]:
    """Runs in a local pool process: converts a few images, appends their records
    (and rejections, so that a resumed run need not decode them again) to this
    process's spill file, and returns references in place of the record bytes.

    A transient rejection (:func:`is_transient`) is returned but not spilled:
    a resumed run converts that image again. A record reused from
    ``--reuse``'s dataset is spilled like a converted one: the shard writer
    copies the bytes that were checked, not OLD's shard as it is by then.
    """
    outcomes = convert_chunk(refs, spec, seed, classes, olds)
    entries = {}  # index in outcomes -> spill entry
    for index, outcome in enumerate(outcomes):
        result = outcome.result
        if isinstance(result, Converted):
            e = result.entry
            entries[index] = spill.encode(
                spill.RECORD, result.split, e.image_id, e.key, e.label, e.data, "", e.sha256
            )
        elif not is_transient(result.reason):
            key = keys.order_key(seed, result.image_id)
            entries[index] = spill.encode(
                spill.REJECTION, result.split, result.image_id, key, -1, b"", result.reason
            )
    writer = spill.writer(spill_dir)
    offsets = dict(zip(entries, writer.append(list(entries.values())), strict=True))
    spilled = []
    for index, outcome in enumerate(outcomes):
        result = outcome.result
        if isinstance(result, Converted) and index in entries:
            e = result.entry
            # The framed record is the entry's tail.
            where = SpillLocation(writer.path, offsets[index] + len(entries[index]) - e.size)
            outcome = outcome._replace(result=result._replace(entry=e._replace(data=where)))
        spilled.append(outcome)
    return spilled


def from_spill(item: spill.Spilled, path: str) -> Converted | Rejection:
    """The element a resumed run uses for an image an earlier run spilled."""
    if item.reason:
        return Rejection(item.image_id, path, item.split, item.reason)
    where = SpillLocation(item.path, item.offset)
    entry = ShardEntry(item.key, item.image_id, item.label, item.size, where, path, item.sha256)
    return Converted(item.split, entry)

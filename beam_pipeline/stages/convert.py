"""One listed image -> a Converted record or a Rejection. No Beam import at module level.

Kept free of Beam so that the local conversion processes (see
``pipeline._PooledConvertFn``) start in a fraction of a second: they import
Pillow, protobuf and this package's pure modules only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import NamedTuple

from beam_pipeline.core import deadline, images, keys, spill
from beam_pipeline.core.elements import (
    Converted,
    ImageRef,
    Outcome,
    Rejection,
    RejectKind,
    ShardEntry,
    SpillLocation,
)
from beam_pipeline.storage import gcs
from beam_pipeline.storage.reading import read_bytes
from imagerecords import codec

# A feature's hook for an image it holds a record of already (--reuse):
# (ref, old, spec, seed, classes) -> the Outcome, taken over or converted.
Prior = Callable[..., Outcome]


class Conversion(NamedTuple):
    """The path-only half of a conversion: what does not depend on label, split or seed."""

    bytes_read: int
    sha256: str
    image: images.EncodedImage | None
    reason: str | None  # why it is rejected, when image is None
    kind: RejectKind | None = None  # the rejection's kind, when image is None


def decode_path(path: str, spec: images.ImageSpec) -> Conversion:
    """Reads and converts one file; never raises for a bad image."""
    try:
        data = read_bytes(path)
    except Exception as error:  # an unreadable file is a rejection, not a crash
        gcs.raise_if_unreachable(error, path)  # but GCS out of reach stops the run
        return unreadable(error)
    return decode_data(data, spec, path)


def unreadable(error: Exception) -> Conversion:
    """The rejection of a file that could not be read (a resumed run retries it)."""
    kind = RejectKind.UNREADABLE
    return Conversion(0, "", None, f"{kind.prefix}{type(error).__name__}: {error}", kind)


def decode_data(
    data: bytes, spec: images.ImageSpec, what: str = "an image", sha256: str | None = None
) -> Conversion:
    """Converts one file's bytes, already read; never raises for a bad image.

    ``what`` names the file in the time limit's log line; ``sha256``: the
    bytes' hash, when the caller has it already.
    """
    try:
        with deadline.limit(spec.timeout_s, what):
            converted = images.convert(data, spec)
    except images.Rejected as rejection:
        return Conversion(len(data), "", None, str(rejection), RejectKind.BAD_IMAGE)
    except deadline.ImageTimeout:
        return Conversion(len(data), "", None, timeout_reason(spec.timeout_s), RejectKind.TIMED_OUT)
    return Conversion(len(data), sha256 or hashlib.sha256(data).hexdigest(), converted, None)


def timeout_reason(seconds: float) -> str:
    return f"{RejectKind.TIMED_OUT.prefix}converting took longer than --image_timeout_s {seconds:g}"


def finish(ref: ImageRef, decoded: Conversion, seed: int, classes) -> Outcome:
    """Builds the record (or rejection) of ``ref`` from its decoded image."""
    image_id, label = ref.image_id, ref.label
    converted = decoded.image
    if converted is None:
        rejection = Rejection(image_id, ref.path, ref.split, decoded.reason, decoded.kind)
        return Outcome(rejection, decoded.bytes_read, False)
    payload = codec.image_record(
        converted.jpeg,
        converted.height,
        converted.width,
        label,
        classes[label],
        image_id,
        decoded.sha256,
        converted.near_features,
    )
    framed = codec.frame_record(payload)
    key = keys.order_key(seed, image_id)
    entry = ShardEntry(
        key, image_id, label, len(framed), framed, ref.path, decoded.sha256, converted.near
    )
    return Outcome(
        Converted(ref.split, entry),
        decoded.bytes_read,
        converted.passed_through,
        converted.repaired,
        converted.bad_profile,
        near_hashed=True,
    )


def convert_ref(
    ref: ImageRef,
    spec: images.ImageSpec,
    seed: int,
    classes: tuple[str, ...],
    old=None,
    prior: Prior | None = None,
) -> Outcome:
    """Reads, converts and serializes one image; never raises for a bad image.

    Args:
        ref: the listed image.
        old: what a feature holds of this image already (``--reuse``'s record of
            its ID), opaque here: ``prior`` takes it over or converts the source.
    """
    if old is not None:
        return prior(ref, old, spec, seed, classes)
    return finish(ref, decode_path(ref.path, spec), seed, classes)


def convert_chunk(refs, spec, seed, classes, olds=None, prior=None) -> list[Outcome]:
    """Converts a few images in one task (a few per task amortise the IPC, ~15% here).

    ``olds``: the ``old`` of each ref (or None), when there is one (:func:`convert_ref`).
    """
    if olds is None:
        return [convert_ref(ref, spec, seed, classes) for ref in refs]
    return [
        convert_ref(ref, spec, seed, classes, old, prior)
        for ref, old in zip(refs, olds, strict=True)
    ]


class SpillTask(NamedTuple):
    """What every :func:`spill_chunk` of one job takes beside its images, in its
    argument order: ``spill_chunk(refs, *task)``."""

    spec: images.ImageSpec
    seed: int
    classes: tuple[str, ...]
    spill_dir: str
    prior: Prior | None = None  # what takes an image's ``old`` over (convert_ref)

    @classmethod
    def of(cls, config, prior: Prior | None = None) -> SpillTask:
        """The task of a ``JobConfig`` whose layout is found."""
        classes = tuple(config.layout.classes)
        return cls(config.image, config.seed, classes, config.spill_directory, prior)


def spill_chunk(refs, spec, seed, classes, spill_dir: str, prior=None, olds=None) -> list[Outcome]:
    """Runs in a local pool process: converts a few images, appends their records
    (and rejections, so that a resumed run need not decode them again) to this
    process's spill file, and returns references in place of the record bytes.

    A transient rejection (``RejectKind.transient``) is returned but not spilled:
    a resumed run converts that image again. A record reused from
    ``--reuse``'s dataset is spilled like a converted one: the shard writer
    copies the bytes that were checked, not OLD's shard as it is by then.
    """
    outcomes = convert_chunk(refs, spec, seed, classes, olds, prior)
    entries = {}  # index in outcomes -> spill entry
    for index, outcome in enumerate(outcomes):
        result = outcome.result
        if isinstance(result, Converted):
            e = result.entry
            entries[index] = spill.encode(
                spill.RECORD, result.split, e.image_id, e.key, e.label, e.data, "", e.sha256, e.near
            )
        elif not result.kind.transient:
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
        # Only rejections of the bytes themselves are spilled (spill_chunk).
        return Rejection(item.image_id, path, item.split, item.reason, RejectKind.BAD_IMAGE)
    where = SpillLocation(item.path, item.offset)
    entry = ShardEntry(
        item.key, item.image_id, item.label, item.size, where, path, item.sha256, item.near
    )
    return Converted(item.split, entry)

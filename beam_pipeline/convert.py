"""One listed image -> a Record or a Rejection. No Beam import at module level.

Kept free of Beam so that the local conversion processes (see
``pipeline._PooledConvertFn``) start in a fraction of a second: they import
Pillow, protobuf and this package's pure modules only.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from beam_pipeline import images, keys, records


class Record(NamedTuple):
    """A converted image: the element between ConvertImages and WriteShards."""

    split: str
    key: int  # order key, unsigned 64-bit
    image_id: str
    label: int
    # The serialized tf.train.Example; or, for a record converted by the local
    # pool, its size in bytes while the bytes stay parked in this process
    # (local_pool.park; WriteShards takes them back).
    payload: bytes | int


def payload_size(payload: bytes | int) -> int:
    """A record's payload size, whether it travels with the record or is parked."""
    return payload if isinstance(payload, int) else len(payload)


class Rejection(NamedTuple):
    image_id: str
    path: str
    split: str
    reason: str


class Outcome(NamedTuple):
    """What converting one image produced, with the numbers the counters need."""

    result: Record | Rejection
    bytes_read: int
    passed_through: bool


def read_bytes(path: str) -> bytes:
    if "://" not in path:  # local: plain open() is the cheapest way
        with open(path, "rb") as stream:
            return stream.read()
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
        return stream.read()


class Decoded(NamedTuple):
    """The path-only half of a conversion: what does not depend on label, split or seed."""

    bytes_read: int
    sha256: str
    converted: images.Converted | None
    reason: str | None  # why it is rejected, when converted is None


def decode_path(path: str, spec: images.ImageSpec) -> Decoded:
    """Reads and converts one file; never raises for a bad image."""
    try:
        data = read_bytes(path)
    except Exception as error:  # an unreadable file is a rejection, not a crash
        return Decoded(0, "", None, f"cannot read: {type(error).__name__}: {error}")
    return decode_data(data, spec)


def decode_data(data: bytes, spec: images.ImageSpec) -> Decoded:
    """Converts one file's bytes, already read; never raises for a bad image."""
    try:
        converted = images.convert(data, spec)
    except images.Rejected as rejection:
        return Decoded(len(data), "", None, str(rejection))
    return Decoded(len(data), hashlib.sha256(data).hexdigest(), converted, None)


def finish(ref: tuple[str, str, int, str], decoded: Decoded, seed: int, classes) -> Outcome:
    """Builds the record (or rejection) of ``ref`` from its decoded image."""
    image_id, path, label, split = ref
    if decoded.converted is None:
        return Outcome(Rejection(image_id, path, split, decoded.reason), decoded.bytes_read, False)
    converted = decoded.converted
    payload = records.make_example(
        {
            "image/encoded": converted.jpeg,
            "image/format": b"jpeg",
            "image/height": converted.height,
            "image/width": converted.width,
            "image/channels": 3,
            "image/class/label": label,
            "image/class/text": classes[label],
            "image/filename": image_id,
            "image/key/sha256": decoded.sha256,
        }
    )
    record = Record(split, keys.order_key(seed, image_id), image_id, label, payload)
    return Outcome(record, decoded.bytes_read, converted.passed_through)


def convert_ref(
    ref: tuple[str, str, int, str], spec: images.ImageSpec, seed: int, classes: tuple[str, ...]
) -> Outcome:
    """Reads, converts and serializes one image; never raises for a bad image.

    Args:
        ref: ``(image_id, path, label, split)`` (a ``listing.ImageRef`` or plain tuple).
    """
    return finish(ref, decode_path(ref[1], spec), seed, classes)


def convert_chunk(refs, *args) -> list[Outcome]:
    """Runs in a local pool process: a few images per task amortise the IPC (~15% here)."""
    return [convert_ref(ref, *args) for ref in refs]


def decode_chunk(paths: list[str], spec: images.ImageSpec) -> list[Decoded]:
    """Runs in a local pool process for images converted ahead of the pipeline."""
    return [decode_path(path, spec) for path in paths]

"""The format's codec: TFRecord framing, the Example schema and the published file names.

Everything that writes or reads a shard's bytes goes through it (docs/architecture.md,
"The codec"). Imports nothing of ``beam_pipeline`` or ``reader``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# ------------------------------------------------------------ published files
# The names docs/format.md sections 5, 7 and 11 give.
INFO_FILE = "imagerecords.json"
# Where format_version 1 kept it; in version 2 that name is TFDS's file.
V1_INFO_FILE = "dataset_info.json"
LABELS_FILE = "labels.txt"
REJECTS_FILE = "rejects.jsonl"
SKIPPED_FILE = "skipped.jsonl"
# The near-duplicate groups, one a line (format_version 3).
NEAR_DUPLICATES_FILE = "near_duplicates.jsonl"

# ------------------------------------------------------------- TFRecord frames
# A frame (docs/format.md section 5): the data's length (uint64, little
# endian), the masked CRC32C of those 8 bytes, the data, its masked CRC32C.
FRAME_HEAD = 12  # length (8) + its masked CRC (4)
FRAME_FOOT = 4  # the data's masked CRC
FRAME_OVERHEAD = FRAME_HEAD + FRAME_FOOT  # bytes frame_record adds to each record
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def _crc32c(data: bytes) -> int:
    """CRC32C of ``data``; replaces itself by ``google_crc32c.value`` on the first call."""
    global _crc32c
    import google_crc32c  # on first use: see the module docstring

    _crc32c = google_crc32c.value
    return _crc32c(data)


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord: length, masked CRC32C of length, data, masked CRC32C of data."""
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc(length)), data, _CRC.pack(masked_crc(data))))


def stated_length(header: bytes) -> int:
    """The data length a frame's header gives, unchecked (``header``: 8 bytes or more)."""
    return _LENGTH.unpack_from(header)[0]


def header_intact(header: bytes) -> bool:
    """Whether ``header`` is a whole frame header whose length matches its CRC."""
    return len(header) == FRAME_HEAD and masked_crc(header[:8]) == _CRC.unpack_from(header, 8)[0]


def data_intact(data: bytes, footer: bytes) -> bool:
    """Whether ``footer`` is the 4-byte masked CRC of ``data``."""
    return len(footer) == FRAME_FOOT and masked_crc(data) == _CRC.unpack(footer)[0]


def frame_crc(footer: bytes) -> int:
    """The masked CRC a frame's 4-byte footer states (unchecked)."""
    return _CRC.unpack(footer)[0]


def is_intact(framed: bytes) -> bool:
    """Whether ``framed`` is exactly one whole TFRecord with both CRCs right."""
    if len(framed) < FRAME_OVERHEAD or len(framed) != stated_length(framed) + FRAME_OVERHEAD:
        return False
    return header_intact(framed[:FRAME_HEAD]) and data_intact(
        framed[FRAME_HEAD:-FRAME_FOOT], framed[-FRAME_FOOT:]
    )


def payload(framed: bytes) -> bytes:
    """The data of one whole frame (unchecked: :func:`is_intact` checks it)."""
    return framed[FRAME_HEAD:-FRAME_FOOT]


class DamagedRecord(ValueError):
    """A TFRecord frame that is truncated or fails a CRC."""


def read_frame(stream, max_length: int | None = None) -> bytes | None:
    """The data of the next TFRecord frame of a binary stream, or None at its end.

    Raises:
        DamagedRecord: a truncated frame, a CRC that does not match, or a length
            over ``max_length`` (a reader that knows its records are small).
    """
    header = stream.read(FRAME_HEAD)
    if not header:
        return None
    if len(header) != FRAME_HEAD:
        raise DamagedRecord("truncated TFRecord header")
    if not header_intact(header):
        raise DamagedRecord("TFRecord length CRC mismatch")
    length = stated_length(header)
    if max_length is not None and length > max_length:
        raise DamagedRecord(f"TFRecord length {length} over {max_length}")
    data = stream.read(length)
    footer = stream.read(FRAME_FOOT)
    if len(data) != length or len(footer) != FRAME_FOOT:
        raise DamagedRecord("truncated TFRecord")
    if not data_intact(data, footer):
        raise DamagedRecord("TFRecord data CRC mismatch")
    return data


def iter_records(stream) -> Iterator[bytes]:
    """Reads framed records from a binary stream, checking both CRCs (see :func:`read_frame`)."""
    while (data := read_frame(stream)) is not None:
        yield data


# ------------------------------------------------------------ Example schema
# The record keys of docs/format.md section 6, with their value types.
FEATURE_TYPES: dict[str, str] = {
    "image/encoded": "bytes",
    "image/format": "bytes",
    "image/height": "int64",
    "image/width": "int64",
    "image/channels": "int64",
    "image/class/label": "int64",
    "image/class/text": "bytes",
    "image/filename": "bytes",
    "image/key/sha256": "bytes",
    # format_version 3: the image's near-duplicate fingerprint, as the converter
    # computed it (docs/format.md section 6); readers need not read them.
    "image/near/phash": "bytes",
    "image/near/colour": "bytes",
}
NEAR_FEATURES = ("image/near/phash", "image/near/colour")


def _build_example_classes():
    f = descriptor_pb2.FieldDescriptorProto
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="imagerecords/tf_example.proto", package="tensorflow", syntax="proto3"
    )

    def message(name, *fields, options=None):
        msg = file_proto.message_type.add(name=name)
        for number, field_name, label, ftype, type_name, packed in fields:
            field = msg.field.add(name=field_name, number=number, label=label, type=ftype)
            if type_name:
                field.type_name = type_name
            if packed:
                field.options.packed = True
        if options:
            msg.options.CopyFrom(options)
        return msg

    rep, opt = f.LABEL_REPEATED, f.LABEL_OPTIONAL
    message("BytesList", (1, "value", rep, f.TYPE_BYTES, None, False))
    message("FloatList", (1, "value", rep, f.TYPE_FLOAT, None, True))
    message("Int64List", (1, "value", rep, f.TYPE_INT64, None, True))
    feature = message(
        "Feature",
        (1, "bytes_list", opt, f.TYPE_MESSAGE, ".tensorflow.BytesList", False),
        (2, "float_list", opt, f.TYPE_MESSAGE, ".tensorflow.FloatList", False),
        (3, "int64_list", opt, f.TYPE_MESSAGE, ".tensorflow.Int64List", False),
    )
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message("Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, label=opt, type=f.TYPE_STRING)
    entry.field.add(
        name="value", number=2, label=opt, type=f.TYPE_MESSAGE, type_name=".tensorflow.Feature"
    )
    entry.options.map_entry = True
    features.field.add(
        name="feature",
        number=1,
        label=rep,
        type=f.TYPE_MESSAGE,
        type_name=".tensorflow.Features.FeatureEntry",
    )
    message("Example", (1, "features", opt, f.TYPE_MESSAGE, ".tensorflow.Features", False))

    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Feature")),
    )


Example, Feature = _build_example_classes()


def make_example(values: Mapping[str, bytes | int | str]) -> bytes:
    """Serializes one image record; keys and types follow ``FEATURE_TYPES``.

    ``deterministic=True`` fixes the map's key order, so the same record is the
    same bytes in every process (docs/format.md section 6).
    """
    example = Example()
    feature_map = example.features.feature
    for key, value in values.items():
        kind = FEATURE_TYPES[key]
        if kind == "int64":
            feature_map[key].int64_list.value.append(int(value))
        else:
            if isinstance(value, str):
                value = value.encode("utf-8")
            feature_map[key].bytes_list.value.append(value)
    return example.SerializeToString(deterministic=True)


def image_record(
    jpeg: bytes,
    height: int,
    width: int,
    label: int,
    class_name: str | bytes,
    image_id: str | bytes,
    sha256: str | bytes,
    near: tuple[bytes, bytes] | None = None,
) -> bytes:
    """One image's serialized Example (docs/format.md section 6): the one builder of records.

    A conversion calls it with what it made; a reused record whose label
    changed (``reuse.relabel``) with what its old record holds, so the two
    are the same bytes whenever their values are the same. ``near``: the
    values of :data:`NEAR_FEATURES` (None: a record without them, format 2's).
    """
    values = {
        "image/encoded": jpeg,
        "image/format": b"jpeg",
        "image/height": height,
        "image/width": width,
        "image/channels": 3,
        "image/class/label": label,
        "image/class/text": class_name,
        "image/filename": image_id,
        "image/key/sha256": sha256,
    }
    if near is not None:
        values.update(zip(NEAR_FEATURES, near, strict=True))
    return make_example(values)


def near_of(data: bytes) -> tuple[bytes, bytes] | None:
    """The :data:`NEAR_FEATURES` values of a serialized Example; None when it has none."""
    features = Example.FromString(data).features.feature
    found = []
    for key in NEAR_FEATURES:
        feature = features.get(key)
        if feature is None or feature.WhichOneof("kind") != "bytes_list":
            return None
        values = feature.bytes_list.value
        if len(values) != 1:
            return None
        found.append(values[0])
    return found[0], found[1]


def parse_example(data: bytes) -> dict[str, bytes | int]:
    """Inverse of :func:`make_example` (used by tools and tests, not by the reader)."""
    example = Example.FromString(data)
    out: dict[str, bytes | int] = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value)
        out[key] = values[0] if len(values) == 1 else values
    return out

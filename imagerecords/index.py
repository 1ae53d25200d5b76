"""Where each record of a shard starts: from its ``.idx`` file, or by scanning its framing.

One array of ``num_examples + 1`` offsets, 8 bytes a record; without an ``.idx`` file
the scan hops from header to header (docs/trainers.md, "The source").
"""

from __future__ import annotations

from array import array

from imagerecords import codec, storage, trust
from imagerecords.info import Shard

# Bytes per request when scanning a gs:// shard: few requests, bounded memory.
GCS_SCAN_WINDOW = 8 << 20


class IndexFileError(trust.DatasetError):
    """A ``.idx`` file, or a shard's framing, does not match what the metadata says."""


def shard_offsets(files: storage.Files, shard: Shard) -> array:
    """``num_examples + 1`` record boundaries of ``shard``, checked against its metadata."""
    if shard.index_path is not None:
        data = files.read_all(shard.index_path, trust.index_limit(shard.num_examples))
        if data is None:
            raise IndexFileError(f"{shard.index_path} is missing (the metadata lists it)")
        return parse_index(data, shard)
    window = GCS_SCAN_WINDOW if storage.is_gcs(shard.path) else codec.FRAME_HEAD
    return scan_offsets(files, shard, window)


def parse_index(data: bytes, shard: Shard) -> array:
    """The offsets of a ``.idx`` file; every line must continue where the last one ended."""
    offsets = array("q", [0])
    for number, line in enumerate(data.splitlines(), 1):
        fields = trust.index_line(line)
        if fields is None:
            raise IndexFileError(f"{shard.index_path}: line {number} is not '<offset> <length>'")
        offset, length = fields
        if (
            offset != offsets[-1]
            or length < codec.FRAME_OVERHEAD
            or offset + length > shard.num_bytes
        ):
            raise IndexFileError(
                f"{shard.index_path}: line {number} says record at {offset} of {length} bytes, "
                f"the previous one ended at {offsets[-1]} (the shard has {shard.num_bytes})"
            )
        offsets.append(offset + length)
    _check(offsets, shard, shard.index_path)
    return offsets


def scan_offsets(files: storage.Files, shard: Shard, window: int) -> array:
    """The offsets found by walking the shard's TFRecord headers."""
    offsets = array("q", [0])
    buffer, buffer_start = b"", 0
    position = 0
    while position < shard.num_bytes:
        if position + codec.FRAME_HEAD > buffer_start + len(buffer):
            stop = min(shard.num_bytes, position + max(window, codec.FRAME_HEAD))
            buffer, buffer_start = files.read(shard.path, position, stop), position
        header = buffer[position - buffer_start : position - buffer_start + codec.FRAME_HEAD]
        if len(header) < codec.FRAME_HEAD:
            raise IndexFileError(
                f"{shard.path}: ends inside the header of record {len(offsets) - 1} "
                f"at byte {position}, before the {shard.num_bytes} bytes the metadata gives"
            )
        if not codec.header_intact(header):
            raise IndexFileError(
                f"{shard.path}: record {len(offsets) - 1} at byte {position} has a "
                "corrupt header (length CRC mismatch)"
            )
        position += codec.stated_length(header) + codec.FRAME_OVERHEAD
        offsets.append(position)
    _check(offsets, shard, shard.path)
    return offsets


def _check(offsets: array, shard: Shard, source: str) -> None:
    records = len(offsets) - 1
    if records != shard.num_examples or offsets[-1] != shard.num_bytes:
        raise IndexFileError(
            f"{source}: {records} records in {offsets[-1]} bytes, but the metadata gives "
            f"{shard.num_examples} records in {shard.num_bytes} bytes for {shard.path}"
        )

"""A shard file read in plain Python, record by record (no ``tf.data``), for ``reader.inspect``.

The summary, ``--verify`` and the pictures read shards this way: the record
and its byte offset are known at every step, so a problem names them, where
``tf.data``'s errors name neither. Reads through ``tf.io.gfile`` (local, ``gs://``).
"""

from __future__ import annotations

import tensorflow as tf

from imagerecords import codec


class ShardReadError(Exception):
    """A shard whose records cannot be followed to the end (the message says where)."""


def feature(example, key: str):
    """The single value of ``key`` in a tf.train.Example, or None when absent."""
    if key not in example.features.feature:
        return None
    entry = example.features.feature[key]
    kind = entry.WhichOneof("kind")
    values = getattr(entry, kind).value if kind else []
    return values[0] if len(values) == 1 else None


def walk_records(path: str, wanted: set[int] | None, limit: int | None = None):
    """Yields ``(index, data)`` for the records of a shard, without checking CRCs.

    Every length field is checked against the bytes the file has left before
    anything is read or skipped: a corrupt one (even one claiming 2^46 bytes)
    is a :class:`ShardReadError`, never a read of that size.

    Args:
        wanted: record indices to return (others are skipped with a seek), or
            ``None`` for all.
        limit: stop after this many records.

    Raises:
        ShardReadError: the shard ends inside a record, or a length field points
            past its end; the message gives the record and its byte offset.
    """
    last = max(wanted) if wanted else None
    size = tf.io.gfile.stat(path).length
    with tf.io.gfile.GFile(path, "rb") as f:
        index = offset = 0
        while limit is None or index < limit:
            if last is not None and index > last:
                return
            header = f.read(codec.FRAME_HEAD)
            if not header:
                break
            problem = framing_problem(header, size - offset, size)
            if problem:
                raise ShardReadError(f"record {index} (byte {offset:,}): {problem}")
            length = codec.stated_length(header)
            if wanted is None or index in wanted:
                data = f.read(length)
                f.read(codec.FRAME_FOOT)
                yield index, data
            else:
                f.seek(length + codec.FRAME_FOOT, whence=1)
            offset += length + codec.FRAME_OVERHEAD
            index += 1
    if wanted and index <= last:
        raise ShardReadError(f"it ends after {index:,} records, before record {last:,}")


def framing_problem(header: bytes, left: int, size: int) -> str | None:
    """Why the record whose header starts ``left`` bytes before the end of a
    ``size``-byte file cannot be read whole, or None."""
    if len(header) < codec.FRAME_HEAD:
        return f"truncated: {len(header)} of {codec.FRAME_HEAD} header bytes"
    length = codec.stated_length(header)
    if length > size:
        return f"corrupt framing: the length field says {length:,} bytes, the file has {size:,}"
    if length + codec.FRAME_OVERHEAD > left:
        more, have = length + codec.FRAME_FOOT, left - codec.FRAME_HEAD
        return f"truncated: the record needs {more:,} more bytes, the file has {have:,}"
    return None


def parse_example(data: bytes, where: str) -> tf.train.Example:
    """The record parsed, or a :class:`ShardReadError` saying where it is not an Example."""
    try:
        return tf.train.Example.FromString(data)
    except Exception as error:  # protobuf's DecodeError (the reader imports TensorFlow only)
        raise ShardReadError(f"{where}: not a tf.train.Example ({error})") from None

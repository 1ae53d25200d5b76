"""``shard_records``: the records of one shard, counted against imagerecords.json as they are read.

A shard with a record too many or too few, or one that is corrupt or cut
short, fails the read with an error naming the shard file and the counts,
where TensorFlow's own ``DataLossError`` names neither.
"""

from __future__ import annotations

import tensorflow as tf

from reader.info import INFO_FILENAME

# TFRecordDataset's read buffer. The default (256 KiB) means many small reads;
# on gs:// each read is an HTTP range request, so read in larger pieces.
_READ_BUFFER_BYTES = 8 << 20

# Records of a shard counted per call of the count check (see shard_records):
# one small function call per chunk, not one per record, which would cost about
# as much as reading the record.
_COUNT_CHUNK = 128


def shard_records(
    path: tf.Tensor,
    expected: tf.Tensor | None = None,
    dataset: str = "DATASET",
    listed_in: str = INFO_FILENAME,
) -> tf.data.Dataset:
    """The serialized records of one shard; with ``expected``, checked against that count.

    With ``expected`` (the shard's ``num_examples`` in imagerecords.json), a shard
    that holds more or fewer records, or whose records cannot all be read (a
    corrupt or cut-short record), fails the read with an ``InvalidArgumentError``
    naming the shard file and the count. TensorFlow's own ``DataLossError``
    names neither, so a read error ends the shard early instead
    (``ignore_errors``), and the count, which then falls short, says where.

    ``ignore_errors`` would retry an error that does not go away forever: one
    from *opening* the file (missing, no permission), which ``TFRecordDataset``
    meets again on every retry. So the file is first opened by a reader that
    reads one byte and yields nothing, outside ``ignore_errors``: such an
    error propagates as TensorFlow raises it, with the path in its message.

    The count is checked once per :data:`_COUNT_CHUNK` records: the records are
    batched into chunks, numbered, checked, and unbatched again; a zero-length
    chunk after the last one marks the end.

    Args:
        path: The shard's path (a scalar string tensor).
        expected: Its record count (int64 scalar), or ``None``: unchecked.
        dataset: The dataset folder, for the message's ``inspect --verify`` hint.
        listed_in: The name of the metadata file that lists ``expected``.
    """
    records = tf.data.TFRecordDataset(path, buffer_size=_READ_BUFFER_BYTES)
    if expected is None:
        return records
    expected = tf.cast(expected, tf.int64)
    # Batched, so that it joins the chunks, not each record: it yields nothing.
    opened = tf.data.FixedLengthRecordDataset(path, 1, buffer_size=1).take(1).skip(1)
    opened = opened.batch(_COUNT_CHUNK)
    end = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))

    def check(index: tf.Tensor, chunk: tf.Tensor) -> tf.Tensor:
        size = tf.size(chunk, out_type=tf.int64)
        read = index * _COUNT_CHUNK + size
        # A chunk short of _COUNT_CHUNK is the shard's last: the count must be
        # reached there. The end marker (size 0) after full chunks: the same.
        more = tf.logical_and(size > 0, read > expected)
        fewer = tf.logical_and(size < _COUNT_CHUNK, read < expected)
        as_text = tf.strings.as_string
        message = tf.where(
            more,
            tf.strings.join(
                [path, ": the shard holds more than the ", as_text(expected), " records "]
                + [f"{listed_in} lists"]
            ),
            tf.strings.join(
                [path, ": reading stopped after ", as_text(read), " of the ", as_text(expected)]
                + [f" records {listed_in} lists: the shard holds fewer, or is cut short"]
                + [f" or corrupt (python -m reader.inspect {dataset} --verify names the record)"]
            ),
        )
        tf.debugging.Assert(tf.logical_not(tf.logical_or(more, fewer)), [message])
        return chunk

    chunks = opened.concatenate(records.ignore_errors().batch(_COUNT_CHUNK)).concatenate(end)
    # zip with a range, not enumerate(), which costs more per shard to set up.
    numbered = tf.data.Dataset.zip((tf.data.Dataset.range(2**62), chunks))
    return numbered.map(check).unbatch()

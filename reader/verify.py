"""``reader.inspect --verify``: every shard re-read and checked against imagerecords.json.

Framing, CRCs, keys, decodes and counts of every record and shard; the other
published files are ``published.py``'s. Every problem is a line, never an exception.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
from array import array
from collections.abc import Callable

import tensorflow as tf

from imagerecords import codec, trust
from reader import info as info_lib
from reader import published, shard_file
from reader.shard_file import ShardReadError

_READ_CHUNK = 4 * 2**20


@dataclasses.dataclass
class ShardCheck:
    split: str
    file: str
    records: int = 0
    class_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    filenames: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    # Where each record read starts, then where the last one ends: the frames
    # an .idx file must give. ``complete``: the framing held to the file's end.
    frames: array = dataclasses.field(default_factory=lambda: array("q", [0]))
    complete: bool = False


def _size_problem(height: int, width: int, image: info_lib.StoredImage) -> str | None:
    """Whether a stored size contradicts the dataset's resize settings."""
    size, mode = image.size, image.resize
    if not size:
        return None
    if mode in ("shorter",) and min(height, width) > size:
        return f"{width}x{height} has a shorter side above --image_size {size}"
    if mode in ("longer", "crop") and max(height, width) > size:
        return f"{width}x{height} has a side above --image_size {size}"
    if mode == "pad" and (height, width) != (size, size):
        return f"{width}x{height} is not {size}x{size} (resize=pad)"
    return None


def _check_record(check: ShardCheck, where: str, data: bytes, info: info_lib.DatasetInfo):
    try:
        example = shard_file.parse_example(data, where)
    except ShardReadError as error:
        check.problems.append(str(error))
        return
    kinds = {
        "image/encoded": bytes,
        "image/height": int,
        "image/width": int,
        "image/class/label": int,
        "image/class/text": bytes,
        "image/filename": bytes,
    }
    values = {key: shard_file.feature(example, key) for key in kinds}
    missing = [key for key, value in values.items() if not isinstance(value, kinds[key])]
    if missing:
        check.problems.append(f"{where}: missing or of the wrong type: {', '.join(missing)}")
        return
    label = values["image/class/label"]
    text = values["image/class/text"].decode("utf-8", "replace")
    filename = values["image/filename"].decode("utf-8", "replace")
    where = f"{where} ({filename})"
    check.filenames.append(filename)
    if not 0 <= label < info.num_classes:
        check.problems.append(f"{where}: label {label} is outside 0..{info.num_classes - 1}")
    else:
        check.class_counts[info.classes[label]] += 1
        if text != info.classes[label]:
            check.problems.append(
                f"{where}: class text {text!r} but label {label} is {info.classes[label]!r}"
            )
    try:
        shape = tf.io.decode_jpeg(values["image/encoded"], channels=3).shape
    except tf.errors.OpError as error:
        check.problems.append(f"{where}: image does not decode ({error.message.splitlines()[0]})")
        return
    height, width = int(values["image/height"]), int(values["image/width"])
    if (shape[0], shape[1]) != (height, width):
        check.problems.append(
            f"{where}: image is {shape[1]}x{shape[0]}, the record says {width}x{height}"
        )
    problem = _size_problem(height, width, info.image)
    if problem:
        check.problems.append(f"{where}: {problem}")


def verify_shard(split: str, shard: info_lib.ShardInfo, info: info_lib.DatasetInfo) -> ShardCheck:
    """Re-reads one shard: framing, both CRCs of every record, the records
    themselves, and the shard's count, size and SHA-256 against imagerecords.json.

    Every problem is a line in the result's ``problems``, none an exception.
    """
    check = ShardCheck(split, shard.file)
    if not tf.io.gfile.exists(shard.path):
        check.problems.append(f"{shard.file}: missing (listed in imagerecords.json)")
        return check
    try:
        offset, digest = _read_shard_checked(shard, info, check)
    except (tf.errors.OpError, OSError) as error:
        why = error.message if isinstance(error, tf.errors.OpError) else str(error)
        check.problems.append(f"{shard.file}: cannot be read: {why}")
        return check
    if shard.num_examples is not None and check.records != shard.num_examples:
        check.problems.append(
            f"{shard.file}: {check.records:,} records, imagerecords.json says "
            f"{shard.num_examples:,}"
        )
    if shard.num_bytes is not None and offset != shard.num_bytes:
        check.problems.append(
            f"{shard.file}: {offset:,} bytes, imagerecords.json says {shard.num_bytes:,}"
        )
    if shard.sha256 and digest != shard.sha256:
        check.problems.append(f"{shard.file}: SHA-256 differs from imagerecords.json")
    if shard.index:
        data, problems = published.read_published(
            info.path,
            shard.index,
            f"{info.metadata_file} lists it for {shard.file}",
            trust.index_limit(check.records),
        )
        if data is not None:
            problems = published.index_problems(shard.index, data, check.frames, check.complete)
        check.problems += problems
    return check


def _read_shard_checked(shard: info_lib.ShardInfo, info: info_lib.DatasetInfo, check: ShardCheck):
    """Reads the shard once, record by record, into ``check``: ``(bytes, SHA-256 hex)``.

    A length field is checked against the bytes the file has left before the
    record is read, so a corrupt one (even one claiming 2^46 bytes) is a
    problem line, not a read of that size.
    """
    size = tf.io.gfile.stat(shard.path).length
    digest = hashlib.sha256()
    offset = 0
    with tf.io.gfile.GFile(shard.path, "rb") as f:

        def read(n: int) -> bytes:
            nonlocal offset
            data = f.read(n)
            digest.update(data)
            offset += len(data)
            return data

        index = 0
        while True:
            start = offset
            where = f"{shard.file}: record {index} (byte {start:,})"
            header = read(codec.FRAME_HEAD)
            if not header:
                check.complete = True
                break
            if len(header) == codec.FRAME_HEAD and not codec.header_intact(header):
                check.problems.append(f"{where}: length CRC mismatch: the framing is corrupt")
                break
            problem = shard_file.framing_problem(header, size - start, size)
            if problem:
                check.problems.append(f"{where}: {problem}")
                break
            length = codec.stated_length(header)
            data = read(length)
            footer = read(codec.FRAME_FOOT)
            if len(data) < length or len(footer) < codec.FRAME_FOOT:  # the file shrank meanwhile
                check.problems.append(f"{where}: truncated while it was read")
                break
            check.records += 1
            check.frames.append(offset)
            if not codec.data_intact(data, footer):
                check.problems.append(f"{where}: data CRC mismatch: the record's bytes changed")
            else:
                _check_record(check, where, data, info)
            index += 1
        while read(_READ_CHUNK):  # the rest, after a framing error, for the hash
            pass
    return offset, digest.hexdigest()


def verify(
    info: info_lib.DatasetInfo, workers: int = 8, progress: Callable[[str], None] | None = None
) -> list[str]:
    """Every problem found by re-reading the dataset (an empty list: all holds)."""
    problems = published.file_problems(info)
    jobs = [(split.name, shard) for split in info.splits.values() for shard in split.shards]
    checks: dict[str, ShardCheck] = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(jobs)))) as pool:
        futures = {pool.submit(verify_shard, name, shard, info): shard for name, shard in jobs}
        for done, future in enumerate(concurrent.futures.as_completed(futures), start=1):
            check = future.result()
            checks[check.file] = check
            if progress:
                status = f"{len(check.problems)} problems" if check.problems else "ok"
                progress(
                    f"verified {done}/{len(jobs)}: {check.file}: {check.records:,} records, {status}"
                )
    seen: dict[str, str] = {}
    for _, shard in jobs:
        check = checks[shard.file]
        problems += check.problems
        for filename in check.filenames:
            if filename in seen:
                problems.append(f"{shard.file}: {filename} is also in {seen[filename]}")
            seen.setdefault(filename, shard.file)
    for split in info.splits.values():
        counted = collections.Counter()
        for shard in split.shards:
            counted.update(checks[shard.file].class_counts)
        for name in info.classes:
            if counted.get(name, 0) != split.class_counts.get(name, 0):
                problems.append(
                    f"split {split.name}: {counted.get(name, 0):,} records of class {name!r}, "
                    f"imagerecords.json says {split.class_counts.get(name, 0):,}"
                )
    return problems

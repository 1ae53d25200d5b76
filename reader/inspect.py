"""``python -m reader.inspect PATH``: what a converted dataset holds, and whether it is intact.

Also installed as the ``imagerecords-inspect`` command. Without options it
prints a summary (classes, splits, records, shards, sizes, image settings,
rejects, duplicates when recorded) and the evidence that the global shuffle
worked: for each shard, how its first records mix the classes compared with
the split as a whole. ``--verify`` re-reads every shard and checks it against
``imagerecords.json``; ``--contact_sheet`` and ``--histogram`` draw pictures.

Like the rest of ``reader`` it reads through ``tf.io.gfile`` (local, ``gs://``).
Pillow is imported only when a picture is asked for, and ``google_crc32c``
(installed with imagerecords) only by ``--verify``, so ``import reader`` still
loads nothing but TensorFlow.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import hashlib
import io
import json
import math
import random
import struct
import sys
from collections.abc import Callable, Sequence

import tensorflow as tf

from reader import info as info_lib

# Records read from the start of each shard for the shuffle evidence. Records
# inside a shard are in hash-key order, so its first records are a random
# draw from the shard.
SHUFFLE_SAMPLE = 256
# A shard is flagged when its class mix is this many standard deviations
# away from what a uniform shuffle of the split gives.
FLAG_SIGMAS = 4.0
MAX_SHARDS_LISTED = 30
_READ_CHUNK = 4 * 2**20

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A bad argument; exit status 2."""


# ---------------------------------------------------------------- records


def _masked_crc(data: bytes) -> int:
    import google_crc32c  # imported by --verify only (see module docstring)

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _feature(example, key: str):
    """The single value of ``key`` in a tf.train.Example, or None when absent."""
    if key not in example.features.feature:
        return None
    feature = example.features.feature[key]
    kind = feature.WhichOneof("kind")
    values = getattr(feature, kind).value if kind else []
    return values[0] if len(values) == 1 else None


class ShardReadError(Exception):
    """A shard whose records cannot be followed to the end (the message says where)."""


def _walk_records(path: str, wanted: set[int] | None, limit: int | None = None):
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
            header = f.read(12)
            if not header:
                break
            problem = _framing_problem(header, size - offset, size)
            if problem:
                raise ShardReadError(f"record {index} (byte {offset:,}): {problem}")
            (length,) = struct.unpack("<Q", header[:8])
            if wanted is None or index in wanted:
                data = f.read(length)
                f.read(4)
                yield index, data
            else:
                f.seek(length + 4, whence=1)
            offset += 12 + length + 4
            index += 1
    if wanted and index <= last:
        raise ShardReadError(f"it ends after {index:,} records, before record {last:,}")


def _framing_problem(header: bytes, left: int, size: int) -> str | None:
    """Why the record whose header starts ``left`` bytes before the end of a
    ``size``-byte file cannot be read whole, or None."""
    if len(header) < 12:
        return f"truncated: {len(header)} of 12 header bytes"
    (length,) = struct.unpack("<Q", header[:8])
    if length > size:
        return f"corrupt framing: the length field says {length:,} bytes, the file has {size:,}"
    if 12 + length + 4 > left:
        return f"truncated: the record needs {length + 4:,} more bytes, the file has {left - 12:,}"
    return None


# ---------------------------------------------------------------- summary


@dataclasses.dataclass(frozen=True)
class ShardMix:
    """How one shard mixes the classes, from its first records."""

    split: str
    file: str
    sampled: int
    top_class: str | None
    top_share: float  # of the sampled records
    split_share: float  # the same class's share of the split
    switches: int  # neighbouring records of different classes
    expected_switches: float
    flagged: str | None  # why it looks unshuffled, or None


def shard_mix(split: str, file: str, labels: Sequence[int], split_shares: Sequence[float]):
    """Compares a shard's label sequence with a uniform shuffle of its split.

    Two tests, each flagged beyond :data:`FLAG_SIGMAS` standard deviations: the
    most common class's share (a shard holding mostly one class), and the
    number of class switches between neighbours, a runs test that catches
    records grouped by class even when the shard's totals look right.
    """
    n = len(labels)
    if n == 0:
        return ShardMix(split, file, 0, None, 0.0, 0.0, 0, 0.0, None)
    counts = collections.Counter(labels)
    top, top_n = max(counts.items(), key=lambda item: (item[1], -item[0]))
    share, p = top_n / n, split_shares[top] if top < len(split_shares) else 0.0
    switches = sum(a != b for a, b in zip(labels, labels[1:], strict=False))
    q = 1.0 - sum(s * s for s in split_shares)  # P(two random records differ)
    expected = (n - 1) * q
    flagged = None
    share_sd = math.sqrt(max(p * (1 - p), 1e-12) / n)
    switch_sd = math.sqrt(max((n - 1) * q * (1 - q), 1e-12))
    if n >= 10 and share - p > FLAG_SIGMAS * share_sd and share - p > 0.05:
        flagged = f"class {top} is {share:.0%} of its first {n} records vs {p:.0%} of {split}"
    elif n >= 10 and expected - switches > FLAG_SIGMAS * switch_sd:
        flagged = (
            f"{switches} class switches between neighbouring records, "
            f"{expected:.0f} expected: records look grouped by class"
        )
    return ShardMix(split, file, n, top, share, p, switches, expected, flagged)


def _labels_of(path: str, limit: int | None) -> list[int]:
    labels = []
    for index, data in _walk_records(path, None, limit):
        label = _feature(_example(data, f"record {index}"), "image/class/label")
        labels.append(label if isinstance(label, int) else -1)
    return labels


def _example(data: bytes, where: str) -> tf.train.Example:
    """The record parsed, or a :class:`ShardReadError` saying where it is not an Example."""
    try:
        return tf.train.Example.FromString(data)
    except Exception as error:  # protobuf's DecodeError (the reader imports TensorFlow only)
        raise ShardReadError(f"{where}: not a tf.train.Example ({error})") from None


def shuffle_evidence(
    info: info_lib.DatasetInfo, per_shard: int = SHUFFLE_SAMPLE, workers: int = 8
) -> list[ShardMix]:
    """:func:`shard_mix` of the first ``per_shard`` records of every shard."""
    jobs = []
    for split in info.splits.values():
        total = max(1, split.num_examples)
        shares = [split.class_counts.get(c, 0) / total for c in info.classes]
        for shard in split.shards:
            jobs.append((split.name, shard, shares))

    def one(job):
        name, shard, shares = job
        try:
            labels = _labels_of(shard.path, per_shard)
        except (ShardReadError, tf.errors.OpError, OSError) as error:
            why = error.message if isinstance(error, tf.errors.OpError) else str(error)
            return ShardMix(name, shard.file, 0, None, 0, 0, 0, 0, f"cannot be read: {why}")
        mix = shard_mix(name, shard.file, labels, shares)
        top = info.classes[mix.top_class] if mix.top_class is not None else None
        return dataclasses.replace(mix, top_class=top)

    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(one, jobs))


def _read_text(path: str) -> str | None:
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "r") as f:
        return f.read()


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f}"


def summary(info: info_lib.DatasetInfo, mixes: Sequence[ShardMix] | None) -> str:
    """The human-readable summary of a dataset."""
    raw = info.raw
    lines = [f"dataset {info.path}"]
    about = [f"format {info.format_version}"]
    about += [f"{k} {raw[k]}" for k in ("created_by", "source", "seed") if raw.get(k) is not None]
    lines.append("  " + ", ".join(about))
    image = raw.get("image") or {}
    lines.append("  image: " + ", ".join(f"{k}={v}" for k, v in image.items()))
    shown = ", ".join(info.classes[:20]) + (", ..." if len(info.classes) > 20 else "")
    lines.append(f"  classes ({info.num_classes}): {shown}")
    lines.append("")
    lines.append(
        f"{'split':<12}{'records':>10}{'shards':>8}{'MB':>10}{'MB/shard (min-max)':>22}"
        f"{'kB/record':>11}"
    )
    for split in info.splits.values():
        sizes = [s.num_bytes for s in split.shards if s.num_bytes is not None]
        spread = f"{min(sizes) / 1e6:.1f}-{max(sizes) / 1e6:.1f}" if sizes else "-"
        per_record = (
            f"{split.num_bytes / split.num_examples / 1e3:.1f}"
            if split.num_bytes and split.num_examples
            else "-"
        )
        lines.append(
            f"{split.name:<12}{split.num_examples:>10,}{len(split.shards):>8}"
            f"{_mb(split.num_bytes):>10}{spread:>22}{per_record:>11}"
        )
    lines.append("")
    lines += _class_table(info)
    lines.append("")
    lines += _rejects_lines(info)
    skipped = raw.get("skipped")
    if isinstance(skipped, dict) and skipped.get("count"):
        reasons = skipped.get("by_reason") or {}
        shown = ", ".join(f"{n:,} {why}" for why, n in sorted(reasons.items(), key=lambda x: -x[1]))
        lines.append(
            f"skipped (not converted): {skipped['count']:,}"
            + (f" (listed in {skipped['file']})" if skipped.get("file") else "")
            + (f": {shown}" if shown else "")
        )
    duplicates = raw.get("duplicates")
    if isinstance(duplicates, dict):
        lines.append(
            "duplicates: "
            + ", ".join(
                f"{k.replace('_', '-')} {duplicates[k]:,}"
                for k in ("groups", "images", "cross_split", "cross_class")
                if isinstance(duplicates.get(k), int)
            )
            + (f" (see {duplicates['file']})" if duplicates.get("file") else "")
        )
    if mixes is not None:
        lines.append("")
        lines += _mix_lines(mixes)
    return "\n".join(lines)


def _class_table(info: info_lib.DatasetInfo) -> list[str]:
    names = list(info.splits)
    width = max([5, *(len(c) for c in info.classes)])
    rows = [(c, [info.splits[s].class_counts.get(c, 0) for s in names]) for c in info.classes]
    head = f"{'class':<{width}}" + "".join(f"{s:>10}" for s in names)
    out = [head]
    if len(rows) > 40:
        rows.sort(key=lambda row: -sum(row[1]))
        out.append(f"({len(rows)} classes: the 10 largest and the 10 smallest)")
        rows = rows[:10] + [("...", None)] + rows[-10:]
    for name, counts in rows:
        if counts is None:
            out.append(name)
            continue
        out.append(f"{name:<{width}}" + "".join(f"{n:>10,}" for n in counts))
    missing = [
        c for c in info.classes if not any(info.splits[s].class_counts.get(c) for s in names)
    ]
    if missing:
        out.append(f"warning: {len(missing)} classes have no records: {', '.join(missing[:10])}")
    return out


def _rejects_lines(info: info_lib.DatasetInfo) -> list[str]:
    rejected = info.raw.get("rejected") or {}
    name = rejected.get("file") or "rejects.jsonl"
    line = f"rejected: {info.rejected_count:,}"
    if not info.rejected_count:
        return [line]
    text = _read_text(info_lib.join_path(info.path, name))
    if text is None:
        return [line + f" ({name} is missing)"]
    reasons = collections.Counter()
    example = {}
    for row in text.splitlines():
        if not row.strip():
            continue
        try:
            entry = json.loads(row)
        except json.JSONDecodeError:
            continue
        kind = str(entry.get("reason", "?")).split(":", 1)[0]
        reasons[kind] += 1
        example.setdefault(kind, entry.get("id") or entry.get("path"))
    out = [line + f" (listed in {name}); top reasons:"]
    for kind, n in reasons.most_common(5):
        out.append(f"  {n:>8,}  {kind} (e.g. {example[kind]})")
    return out


def _mix_lines(mixes: Sequence[ShardMix]) -> list[str]:
    flagged = [m for m in mixes if m.flagged]
    out = [
        f"shuffle: class mix of the first {SHUFFLE_SAMPLE} records of each of {len(mixes)} "
        f"shards vs its split ({len(flagged)} flagged)"
    ]
    shown = mixes if len(mixes) <= MAX_SHARDS_LISTED else flagged
    if len(mixes) > MAX_SHARDS_LISTED:
        out.append(f"  ({len(mixes)} shards: only flagged ones are listed)")
    if shown:
        out.append(
            f"  {'shard':<34}{'read':>6}  {'largest class':<20}{'share':>7}{'in split':>9}"
            f"{'switches':>10}{'expected':>9}"
        )
    for m in shown:
        top = (m.top_class or "-")[:19]
        out.append(
            f"  {m.file:<34}{m.sampled:>6}  {top:<20}{m.top_share:>7.0%}{m.split_share:>9.0%}"
            f"{m.switches:>10}{m.expected_switches:>9.0f}"
        )
        if m.flagged:
            out.append(f"    ! {m.flagged}")
    return out


# ---------------------------------------------------------------- verify


@dataclasses.dataclass
class ShardCheck:
    split: str
    file: str
    records: int = 0
    class_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    filenames: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)


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
        example = _example(data, where)
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
    values = {key: _feature(example, key) for key in kinds}
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
            header = read(12)
            if not header:
                break
            if len(header) == 12 and _masked_crc(header[:8]) != struct.unpack("<I", header[8:])[0]:
                check.problems.append(f"{where}: length CRC mismatch: the framing is corrupt")
                break
            problem = _framing_problem(header, size - start, size)
            if problem:
                check.problems.append(f"{where}: {problem}")
                break
            (length,) = struct.unpack("<Q", header[:8])
            data = read(length)
            footer = read(4)
            if len(data) < length or len(footer) < 4:  # the file shrank while it was read
                check.problems.append(f"{where}: truncated while it was read")
                break
            check.records += 1
            if _masked_crc(data) != struct.unpack("<I", footer)[0]:
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
    problems = []
    labels_path = info_lib.join_path(info.path, info_lib.LABELS_FILENAME)
    labels = _read_text(labels_path)
    if labels is None:
        problems.append(f"{info_lib.LABELS_FILENAME}: missing")
    elif labels.splitlines() != list(info.classes):
        problems.append(
            f"{info_lib.LABELS_FILENAME}: its {len(labels.splitlines())} lines are not "
            f"imagerecords.json's {info.num_classes} classes in order"
        )
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


def _unlisted_shards(info: info_lib.DatasetInfo) -> list[str]:
    listed = {shard.file for split in info.splits.values() for shard in split.shards}
    found = tf.io.gfile.glob(info_lib.join_path(info.path, "*.tfrecord"))
    return sorted(name for name in (p.rsplit("/", 1)[-1] for p in found) if name not in listed)


# ---------------------------------------------------------------- pictures

TILE = 128
CAPTION = 18
PAD = 6
HEADER = 24
BACKGROUND = (24, 24, 28)
TEXT = (235, 235, 235)
SPLIT_COLOURS = ((66, 133, 244), (244, 160, 0), (15, 157, 88), (219, 68, 55), (171, 71, 188))


@dataclasses.dataclass(frozen=True)
class Tile:
    """One image on the contact sheet and where it was drawn."""

    split: str
    filename: str
    class_name: str
    box: tuple[int, int, int, int]  # left, top, right, bottom of the pasted image


def _pillow():
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise UsageError("pictures need Pillow: pip install pillow") from None
    return Image, ImageDraw, ImageFont


def _font(size: int):
    _, _, ImageFont = _pillow()
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed bitmap font
        return ImageFont.load_default()


def draw_samples(
    info: info_lib.DatasetInfo, split: str, count: int, rng: random.Random
) -> list[tuple[str, str, bytes]]:
    """``count`` records of ``split`` drawn uniformly: ``(filename, class, jpeg)``."""
    entry = info.split(split)
    picks = sorted(rng.sample(range(entry.num_examples), min(count, entry.num_examples)))
    by_shard: dict[int, set[int]] = collections.defaultdict(set)
    starts, total = [], 0
    for shard in entry.shards:
        starts.append(total)
        total += shard.num_examples or 0
    for pick in picks:
        shard = max(i for i, start in enumerate(starts) if start <= pick)
        by_shard[shard].add(pick - starts[shard])
    out = []
    keys = ("image/filename", "image/class/text", "image/encoded")
    for shard_index, wanted in sorted(by_shard.items()):
        shard = entry.shards[shard_index]
        try:
            for index, data in _walk_records(shard.path, wanted):
                example = _example(data, f"record {index}")
                filename, text, jpeg = (_feature(example, key) for key in keys)
                if None in (filename, text, jpeg):
                    raise ShardReadError(f"record {index}: missing one of {', '.join(keys)}")
                out.append(
                    (filename.decode("utf-8", "replace"), text.decode("utf-8", "replace"), jpeg)
                )
        except ShardReadError as error:
            raise ShardReadError(f"{shard.file}: {error}") from None
    return out


def contact_sheet(
    info: info_lib.DatasetInfo,
    out_file: str,
    splits: Sequence[str],
    samples: int,
    seed: int,
    columns: int = 8,
    tile: int = TILE,
) -> list[Tile]:
    """Draws ``samples`` random records of each split, captioned with their class.

    Each image is shrunk to fit a ``tile`` x ``tile`` square (never enlarged).

    Returns:
        The tiles, in drawing order, with the box each image was pasted in.
    """
    Image, ImageDraw, _ = _pillow()
    rng = random.Random(seed)
    drawn = {split: draw_samples(info, split, samples, rng) for split in splits}
    columns = max(1, min(columns, max(len(d) for d in drawn.values()) or 1))
    cell_w, cell_h = tile + PAD, tile + CAPTION + PAD
    width = PAD + columns * cell_w
    height = sum(HEADER + max(1, math.ceil(len(d) / columns)) * cell_h for d in drawn.values())
    sheet = Image.new("RGB", (width, height + PAD), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    title, caption = _font(15), _font(12)
    tiles, top = [], 0
    for split, records in drawn.items():
        draw.text(
            (PAD, top + 4),
            f"{split}: {len(records)} of {info.num_examples(split):,} records",
            fill=TEXT,
            font=title,
        )
        top += HEADER
        for i, (filename, class_name, jpeg) in enumerate(records):
            row, col = divmod(i, columns)
            x, y = PAD + col * cell_w, top + row * cell_h
            try:
                image = Image.open(io.BytesIO(jpeg)).convert("RGB")
            except OSError as error:  # PIL's UnidentifiedImageError is one
                raise ShardReadError(f"{filename}: the image does not decode ({error})") from None
            image.thumbnail((tile, tile), Image.Resampling.BICUBIC)
            left, upper = x + (tile - image.width) // 2, y + (tile - image.height) // 2
            sheet.paste(image, (left, upper))
            label = class_name if len(class_name) <= 20 else class_name[:19] + "…"
            draw.text((x + 2, y + tile + 2), label, fill=TEXT, font=caption)
            box = (left, upper, left + image.width, upper + image.height)
            tiles.append(Tile(split, filename, class_name, box))
        top += max(1, math.ceil(len(records) / columns)) * cell_h
    _save_png(sheet, out_file)
    return tiles


HISTOGRAM_WIDTH = 900
_BAR = 12
_MAX_CLASSES_DRAWN = 60


@dataclasses.dataclass(frozen=True)
class Bar:
    split: str
    class_name: str
    count: int
    box: tuple[int, int, int, int]


def histogram(info: info_lib.DatasetInfo, out_file: str, splits: Sequence[str]) -> list[Bar]:
    """Class counts per split as grouped horizontal bars (the largest and
    smallest classes only, when there are too many to draw)."""
    Image, ImageDraw, _ = _pillow()
    classes = list(info.classes)
    skipped = 0
    if len(classes) > _MAX_CLASSES_DRAWN:
        total = {c: sum(info.class_counts(s).get(c, 0) for s in splits) for c in classes}
        ranked = sorted(classes, key=lambda c: (-total[c], c))
        half = _MAX_CLASSES_DRAWN // 2
        skipped = len(classes) - 2 * half
        classes = ranked[:half] + ranked[-half:]
    font, title = _font(12), _font(15)
    label_w = min(220, 12 + 7 * max(len(c) for c in classes))
    group_h = _BAR * len(splits) + 8
    legend_h = 24
    height = HEADER + legend_h + group_h * len(classes) + (group_h if skipped else 0) + PAD
    image = Image.new("RGB", (HISTOGRAM_WIDTH, height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    draw.text(
        (PAD, 4),
        f"class counts per split ({info.num_classes} classes"
        + (f"; the {len(classes) // 2} largest and smallest)" if skipped else ")"),
        fill=(0, 0, 0),
        font=title,
    )
    x = PAD
    for i, split in enumerate(splits):
        colour = SPLIT_COLOURS[i % len(SPLIT_COLOURS)]
        draw.rectangle((x, HEADER + 4, x + 12, HEADER + 16), fill=colour)
        draw.text((x + 16, HEADER + 3), split, fill=(0, 0, 0), font=font)
        x += 30 + 8 * len(split)
    longest = max([1, *(info.class_counts(s).get(c, 0) for s in splits for c in classes)])
    bar_space = HISTOGRAM_WIDTH - label_w - 70
    bars, y = [], HEADER + legend_h
    for n, name in enumerate(classes):
        if skipped and n == len(classes) // 2:
            draw.text(
                (PAD, y + 2), f"... {skipped} classes not drawn ...", fill=(90, 90, 90), font=font
            )
            y += group_h
        shown = name if len(name) <= 30 else name[:29] + "…"
        draw.text((PAD, y + 2), shown, fill=(0, 0, 0), font=font)
        for i, split in enumerate(splits):
            count = info.class_counts(split).get(name, 0)
            length = round(bar_space * count / longest)
            top = y + i * _BAR
            box = (label_w, top, label_w + length, top + _BAR - 2)
            if length:
                draw.rectangle(
                    (box[0], box[1], box[2] - 1, box[3] - 1),
                    fill=SPLIT_COLOURS[i % len(SPLIT_COLOURS)],
                )
            draw.text((label_w + length + 4, top - 1), f"{count:,}", fill=(60, 60, 60), font=font)
            bars.append(Bar(split, name, count, box))
        y += group_h
    _save_png(image, out_file)
    return bars


def _save_png(image, out_file: str) -> None:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    with tf.io.gfile.GFile(out_file, "wb") as f:
        f.write(buffer.getvalue())


# ---------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, no usage dump
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m reader.inspect",
        description="Summarise, verify and picture an imagerecords dataset (local path or gs://).",
        epilog="example: python -m reader.inspect ./flowers-records --verify "
        "--contact_sheet sheet.png",
    )
    add = parser.add_argument
    add("path", help="The dataset folder (holding imagerecords.json)")
    add(
        "--verify",
        action="store_true",
        help="Re-read every shard: framing and CRCs, record counts, sizes and SHA-256 against "
        "imagerecords.json, every image decodes at its recorded size, labels agree with "
        "labels.txt. Exit status 1 naming each problem",
    )
    add("--contact_sheet", metavar="FILE.png", help="Draw random records of each split")
    add("--histogram", metavar="FILE.png", help="Draw the class counts per split")
    add("--split", action="append", help="Only this split (repeatable; default: all)")
    add("--samples", type=int, default=16, help="Images per split on the contact sheet (16)")
    add("--seed", type=int, default=0, help="Seed of the contact sheet's draw (0)")
    add("--workers", type=int, default=8, help="Shards read in parallel (8)")
    add("--no_shuffle_check", action="store_true", help="Skip reading the start of every shard")
    return parser


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.samples < 1:
        raise UsageError(f"--samples must be at least 1, got {args.samples}")
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    for option in ("contact_sheet", "histogram"):
        value = getattr(args, option)
        if value is not None and not value.lower().endswith(".png"):
            raise UsageError(f"--{option} must name a .png file, got {value}")
    try:
        info = info_lib.load_info(args.path)
    except info_lib.IncompleteDatasetError as error:
        raise UsageError(str(error)) from None
    splits = args.split or list(info.splits)
    for name in splits:
        info.split(name)  # UnknownSplitError names the splits there are
    if args.contact_sheet or args.histogram:
        _pillow()  # fail before any work when Pillow is missing
    mixes = None if args.no_shuffle_check else shuffle_evidence(info, workers=args.workers)
    print(summary(info, mixes), flush=True)
    # Verify first: a damaged shard is then reported as FAIL lines before a
    # picture that needs one of its records stops at it.
    status = _verify_and_report(info, args.workers) if args.verify else EXIT_OK
    try:
        if args.contact_sheet:
            tiles = contact_sheet(info, args.contact_sheet, splits, args.samples, args.seed)
            print(
                f"contact sheet: {len(tiles)} images of {', '.join(splits)} -> {args.contact_sheet}"
            )
        if args.histogram:
            histogram(info, args.histogram, splits)
            print(f"histogram: {', '.join(splits)} -> {args.histogram}")
    except ShardReadError as error:
        print(f"error: cannot draw the pictures: {error}", file=sys.stderr)
        return EXIT_PROBLEMS
    return status


def _verify_and_report(info: info_lib.DatasetInfo, workers: int) -> int:
    """Runs :func:`verify`, prints one ``FAIL`` line per problem; returns the exit status."""
    shards = sum(len(s.shards) for s in info.splits.values())
    print(f"\nverify: re-reading {shards} shards with {workers} workers", flush=True)
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if shards > 10 else None
    problems = verify(info, workers, say)
    for name in _unlisted_shards(info):
        print(f"note: {name} is not listed in imagerecords.json (not part of the dataset)")
    if not problems:
        records = sum(s.num_examples for s in info.splits.values())
        print(
            f"verify: OK: {shards} shards, {records:,} records: framing, CRCs, counts, "
            "sizes, SHA-256, images and labels all agree with imagerecords.json"
        )
        return EXIT_OK
    for problem in problems[:100]:
        print(f"FAIL {problem}")
    if len(problems) > 100:
        print(f"... and {len(problems) - 100} more")
    print(f"verify: {len(problems)} problems", file=sys.stderr)
    return EXIT_PROBLEMS


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``imagerecords-inspect``); returns the exit status."""
    try:
        return _run(argv)
    except (UsageError, info_lib.UnknownSplitError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except info_lib.DatasetInfoError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_PROBLEMS


if __name__ == "__main__":
    sys.exit(main())

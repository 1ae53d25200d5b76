"""Writes a small dataset that follows docs/format.md sections 3, 5, 6 and 7, without Beam.

The reader's tests must not depend on the converter (written in parallel, and
slow to start), so this module produces the same *files* in pure Python:

* one Pillow-made JPEG per image, of varying sizes, each a solid class colour
  with a small random patch (so every image is different, and a test can check
  that the decoded pixels belong to the label they came with);
* split assignment ``u = H(seed, "split", id)`` and the global shuffle
  ``k = H(seed, "order", id)``: shard ``i`` of ``n`` holds keys in
  ``[i*2^64/n, (i+1)*2^64/n)``, sorted inside the shard, empty shards dropped
  and the rest renumbered, so classes are interleaved inside every shard just
  as the real converter leaves them;
* records built with ``imagerecords.codec`` (the converter's own encoder);
* ``labels.txt``, ``rejects.jsonl``, TFDS's three files (format version 2, by
  ``beam_pipeline.core.tfds_metadata``, the converter's own) and
  ``imagerecords.json`` written last.

The hashing is re-implemented here (a few lines) rather than imported from
``beam_pipeline.core.keys`` so the fixture does not move when the converter's
internals do; it is the contract's algorithm either way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
import struct
from collections import Counter
from collections.abc import Mapping, Sequence

from PIL import Image, ImageDraw

from beam_pipeline.core import images, metadata, tfds_metadata
from beam_pipeline.features.near import search as near_search
from beam_pipeline.features.near.feature import PIXELS
from imagerecords import codec

# Far apart in RGB, so a decoded image's mean colour names its class.
CLASS_COLOURS = (
    (220, 30, 30),
    (30, 200, 30),
    (30, 30, 220),
    (230, 230, 30),
    (30, 220, 220),
    (220, 30, 220),
)


@dataclasses.dataclass(frozen=True)
class FixtureRecord:
    """What the fixture wrote for one image."""

    filename: str
    label: int
    class_name: str
    sha256: str
    height: int
    width: int
    colour: tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class FixtureDataset:
    """A dataset on disk plus the ground truth a test compares against.

    Attributes:
        path: The dataset folder.
        info: The ``imagerecords.json`` content that was written.
        records: split name -> its records in shard order (the on-disk order).
    """

    path: str
    info: dict
    records: dict[str, list[FixtureRecord]]

    def filenames(self, split: str) -> list[str]:
        return [r.filename for r in self.records[split]]


def _hash64(seed: int, purpose: str, image_id: str) -> int:
    payload = f"{seed}\0{purpose}\0{image_id}".encode()
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big")


def _assign_split(seed: int, image_id: str, fractions: Mapping[str, float]) -> str:
    point = _hash64(seed, "split", image_id) / 2**64
    cumulative = 0.0
    for name, fraction in fractions.items():
        cumulative += fraction
        if point < cumulative:
            return name
    return list(fractions)[-1]


def _make_jpeg(rng: random.Random, colour, height: int, width: int, quality: int) -> bytes:
    image = Image.new("RGB", (width, height), colour)
    # A small patch of random colour (<= ~4 % of the area) makes every image
    # unique while leaving the mean close to the class colour.
    patch_w, patch_h = max(1, width // 5), max(1, height // 5)
    x, y = rng.randrange(width - patch_w + 1), rng.randrange(height - patch_h + 1)
    fill = tuple(rng.randrange(256) for _ in range(3))
    ImageDraw.Draw(image).rectangle([x, y, x + patch_w - 1, y + patch_h - 1], fill=fill)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def write_dataset(
    out_dir: str | os.PathLike,
    classes: Sequence[str] = ("cat", "dog", "fish"),
    per_class: int | Sequence[int] = 30,
    splits: Mapping[str, float] | None = None,
    shards: Mapping[str, int] | None = None,
    seed: int = 42,
    min_side: int = 24,
    max_side: int = 96,
    jpeg_quality: int = 90,
    format_version: int = metadata.FORMAT_VERSION,
    write_info: bool = True,
    class_sorted_shards: bool = False,
) -> FixtureDataset:
    """Writes a contract-conformant dataset to ``out_dir`` and returns its ground truth.

    Args:
        out_dir: Output folder (created).
        classes: Class names; ids follow the sorted order, as the converter's do.
        per_class: Images per class (one number, or one per class).
        splits: Split fractions; default ``train=0.75, val=0.25``.
        shards: Hash-range shard count per split before empty ones are dropped;
            default ``train=4``, every other split ``1``.
        seed: The split and order hash seed.
        min_side, max_side: Image sides are drawn from this range, independently.
        jpeg_quality: JPEG quality of the stored images.
        format_version: Written into ``imagerecords.json`` (tests of refusals).
        write_info: ``False`` leaves out ``imagerecords.json``, like an unfinished run.
        class_sorted_shards: Sort the records inside each shard by class instead of
            by order key. Not what the converter writes: a worst case that shows
            whether the *reader's* shuffle mixes classes.
    """
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    classes = sorted(classes)
    splits = dict(splits or {"train": 0.75, "val": 0.25})
    shards = {name: 1 for name in splits} | {"train": 4} | dict(shards or {})
    counts = [per_class] * len(classes) if isinstance(per_class, int) else list(per_class)
    rng = random.Random(seed)

    by_split: dict[str, list[tuple[int, FixtureRecord, bytes]]] = {name: [] for name in splits}
    for label, (name, count) in enumerate(zip(classes, counts, strict=True)):
        colour = CLASS_COLOURS[label % len(CLASS_COLOURS)]
        for i in range(count):
            image_id = f"{name}/img_{i:04d}.jpg"
            height, width = rng.randint(min_side, max_side), rng.randint(min_side, max_side)
            jpeg = _make_jpeg(rng, colour, height, width, jpeg_quality)
            record = FixtureRecord(
                filename=image_id,
                label=label,
                class_name=name,
                sha256=hashlib.sha256(jpeg).hexdigest(),
                height=height,
                width=width,
                colour=colour,
            )
            # Format 3's records hold the stored JPEG's fingerprint, as the converter's do.
            near = (
                near_search.features(images.near_of_stored(jpeg, PIXELS))
                if format_version >= 3
                else None
            )
            payload = codec.image_record(
                jpeg, height, width, label, name, image_id, record.sha256, near
            )
            split = _assign_split(seed, image_id, splits)
            by_split[split].append((_hash64(seed, "order", image_id), record, payload))

    info_splits = {}
    ordered: dict[str, list[FixtureRecord]] = {}
    for split, items in by_split.items():
        n = shards[split]
        ranges: dict[int, list] = {}
        for key, record, payload in sorted(items, key=lambda item: item[0]):
            ranges.setdefault((key * n) >> 64, []).append((record, payload))
        if class_sorted_shards:
            for hash_range in ranges.values():
                hash_range.sort(key=lambda item: item[0].label)
        nonempty = sorted(ranges)
        shard_entries = []
        ordered[split] = []
        for index, hash_range in enumerate(nonempty):
            file = f"{split}-{index:05d}-of-{len(nonempty):05d}.tfrecord"
            data = b"".join(codec.frame_record(payload) for _, payload in ranges[hash_range])
            with open(os.path.join(out_dir, file), "wb") as f:
                f.write(data)
            shard_entries.append(
                {
                    "file": file,
                    "num_examples": len(ranges[hash_range]),
                    "num_bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
            ordered[split].extend(record for record, _ in ranges[hash_range])
        class_counts = Counter(r.class_name for r in ordered[split])
        info_splits[split] = {
            "num_examples": len(ordered[split]),
            "num_bytes": sum(s["num_bytes"] for s in shard_entries),
            "class_counts": {name: class_counts.get(name, 0) for name in classes},
            "shards": shard_entries,
        }

    with open(os.path.join(out_dir, "labels.txt"), "w", encoding="utf-8") as f:
        f.write("".join(f"{name}\n" for name in classes))
    with open(os.path.join(out_dir, "rejects.jsonl"), "w", encoding="utf-8"):
        pass
    info = {
        "format_version": format_version,
        "created_by": "imagerecords tests/shard_fixtures.py",
        "source": "memory://fixture",
        "seed": seed,
        "classes": classes,
        "image": {"resize": "none", "size": max_side, "jpeg_quality": jpeg_quality},
        "features": dict(codec.FEATURE_TYPES),
        "splits": info_splits,
        "rejected": {"count": 0, "file": "rejects.jsonl"},
    }
    if write_info:
        if format_version >= 2:  # in version 1, dataset_info.json is the metadata itself
            for name, data in tfds_metadata.tfds_files(info).items():
                with open(os.path.join(out_dir, name), "wb") as f:
                    f.write(data)
        # Last, as the converter does: its presence means "complete".
        name = metadata.V1_INFO_FILE if format_version == 1 else metadata.INFO_FILE
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)
    return FixtureDataset(path=out_dir, info=info, records=ordered)


# ---------------------------------------------------------------- damaging shards
# For tests of what the reader and `inspect --verify` make of a damaged shard:
# real files, changed the way a disk, a copy or a buggy writer would.


def record_spans(path: str | os.PathLike) -> list[tuple[int, int]]:
    """``(offset of the record's 12-byte header, its data length)`` per record of a shard."""
    with open(path, "rb") as f:
        data = f.read()
    spans, offset = [], 0
    while offset < len(data):
        length = codec.stated_length(data[offset : offset + codec.FRAME_HEAD])
        spans.append((offset, length))
        offset += length + codec.FRAME_OVERHEAD
    return spans


def set_length_field(path: str | os.PathLike, index: int, length: int, valid_crc: bool) -> None:
    """Writes ``length`` into record ``index``'s length field; with ``valid_crc`` also the
    length's masked CRC, so that only the length's size tells it is wrong."""
    start, _ = record_spans(path)[index]
    field = struct.pack("<Q", length)
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(field)
        if valid_crc:
            f.write(struct.pack("<I", codec.masked_crc(field)))


def replace_record(path: str | os.PathLike, index: int, payload: bytes) -> None:
    """Replaces record ``index`` with ``payload``, framed with valid CRCs."""
    start, length = record_spans(path)[index]
    with open(path, "rb") as f:
        data = f.read()
    end = start + 12 + length + 4
    with open(path, "wb") as f:
        f.write(data[:start] + codec.frame_record(payload) + data[end:])


def flip_data_byte(path: str | os.PathLike, index: int) -> int:
    """Flips a bit in the middle of record ``index``'s data (its CRC no longer matches);
    returns the record's offset."""
    start, length = record_spans(path)[index]
    with open(path, "r+b") as f:
        f.seek(start + 12 + length // 2)
        byte = f.read(1)
        f.seek(start + 12 + length // 2)
        f.write(bytes([byte[0] ^ 0x20]))
    return start

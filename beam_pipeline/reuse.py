"""``--reuse OLD``: a grown folder's dataset, converting only its new and changed images.

An image's record depends only on its source bytes, the settings that decide
a record's bytes (the ``image`` ones, ``settings.image_settings``), its label,
its class name and its ID (docs/format.md section 6). So when OLD was made
with the same image settings, an image whose ID has a record in OLD and
whose source file has the SHA-256 that record names (``image/key/sha256``)
gets exactly the bytes OLD holds, and they are copied instead of decoded,
resized and encoded again. When only the label changed (classes added or
removed shift the numbers; a manifest moved the image to another class) the
record is rebuilt from OLD's fields with the new label and class name
(:func:`relabel`), still without decoding the image. Everything else -
splits, order keys, shards, books, duplicates, rejections, metadata - is
done as in any run, so the output is byte for byte a full conversion's.

"Unchanged" is the source's SHA-256, read and hashed again: ~0.05 ms for a
web photo, ~1 ms for a 1.4 MB phone photo, against 5-25 ms to convert them
(docs/performance.md, "Growing a dataset"). It needs nothing OLD does not
already hold (every format version, local or gs://), and it is not fooled
by a file replaced with another of the same size and modification time. A
user who distrusts it converts without ``--reuse``.

Images OLD rejected are converted again: ``rejects.jsonl`` names no hash, so
whether the file changed is unknown (they are few: ``--max_reject_fraction``).

OLD is read, never written: its metadata (``find_info``: ``dataset_info.json``
or ``imagerecords.json``) at launch; its shards by whoever converts - the
local engine scans them on its pool into an :class:`Index`, the Beam graph
scans them on its workers (one element per shard) and joins the records to
the listed images by ID (``pipeline.ConvertImages``), so Dataflow reads OLD
from gs:// with no copy on the launching machine.

Pure: no Beam, no Pillow.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import os
import random
import struct
import time
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from beam_pipeline import listing, records, settings
from beam_pipeline.errors import UsageError
from imagerecords import info as info_lib
from imagerecords import storage

log = logging.getLogger(__name__)

# Bytes read per request while scanning a shard (one request per window on gs://).
SCAN_WINDOW_LOCAL = 1 << 20
SCAN_WINDOW_GCS = 8 << 20
_HEADER = 12  # TFRecord: length (8) + masked CRC32C of it (4)


class OldRecord(NamedTuple):
    """Where OLD holds one image's record, and what the record says about its source."""

    sha256: str  # hex SHA-256 of the source file the record was made from
    label: int
    class_name: str
    shard: str  # OLD's shard file, local path or gs:// URL
    offset: int  # of the framed record in the shard
    size: int  # of the framed record


class Candidate(NamedTuple):
    """A listed image and OLD's record of the same ID (None: OLD has none)."""

    ref: tuple  # (image_id, path, label, split), a listing.ImageRef
    old: OldRecord | None


@dataclasses.dataclass(frozen=True)
class OldDataset:
    """What OLD's metadata says: where it is, how its images were made, its shards."""

    path: str  # normalized (listing.normalize_root)
    info_path: str
    classes: tuple[str, ...]
    image: dict  # settings.image_settings_from_info: name -> value
    created_by: str
    shards: tuple[tuple[str, int], ...]  # (path, bytes) of every shard, split by split
    records: int  # in all its shards


def open_old(path: str) -> OldDataset:
    """Reads OLD's metadata (either format version's file name).

    Raises:
        UsageError: OLD is not a finished imagerecords dataset, or cannot be read.
    """
    from beam_pipeline import images  # Pillow: only for the spec's declarations

    old = listing.normalize_root(path)
    if "://" in old and not storage.is_gcs(old):
        raise UsageError(f"--reuse {path}: only local folders and gs:// can be read")
    try:
        info_path, info = info_lib.find_info(old)
    except info_lib.DatasetNotFoundError:
        raise UsageError(
            f"--reuse {path} is not a finished imagerecords dataset: it holds no "
            f"{' or '.join(info_lib.INFO_FILES)} (a run that did not finish cannot be reused)"
        ) from None
    except ValueError as error:
        raise UsageError(f"--reuse {path}: {error}") from None
    except Exception as error:  # a storage or credentials failure
        if storage.is_gcs(old):
            from beam_pipeline import gcs

            found = gcs.usage_error(error, old, "read the dataset in")
            if found is not None:
                raise found from None
        raise UsageError(
            f"--reuse {path}: cannot read it ({type(error).__name__}: {error})"
        ) from None
    shards = []
    total = 0
    for split in info.get("splits", {}):
        for shard in info_lib.split_shards(old, info_path, info, split):
            shards.append((shard.path, shard.num_bytes))
            total += shard.num_examples
    return OldDataset(
        path=old,
        info_path=info_path,
        classes=tuple(info.get("classes", ())),
        image=settings.image_settings_from_info(info, images.ImageSpec),
        created_by=str(info.get("created_by", "")),
        shards=tuple(shards),
        records=total,
    )


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def refusal(old: OldDataset, output: str, image_settings: dict) -> str:
    """Why a run writing ``output`` with ``image_settings`` cannot reuse ``old``; "" if it can.

    ``image_settings``: the run's ``settings.image_settings(spec)``.
    """
    out = listing.normalize_root(output)
    if _inside(out, old.path) or _inside(old.path, out):
        what = "is" if out == old.path else "lies inside" if _inside(out, old.path) else "holds"
        return (
            f"--output {output} {what} the --reuse dataset {old.path}: write the new "
            "dataset to another folder (the old one is only read)"
        )
    changed = []
    for name, value in image_settings.items():
        if name not in old.image:
            changed.append(f"{name} not recorded -> {settings.show(value)}")
        elif old.image[name] != value:
            changed.append(f"{name} {settings.show(old.image[name])} -> {settings.show(value)}")
    if changed:
        return (
            f"--reuse {old.path} was made with other image settings ({', '.join(changed)}): "
            "its records are not what this run would write; give the same settings, "
            "or convert without --reuse"
        )
    return ""


def check(old: OldDataset, output: str, image_settings: dict) -> None:
    """:func:`refusal` as a UsageError."""
    problem = refusal(old, output, image_settings)
    if problem:
        raise UsageError(problem)


# ----------------------------------------------------------------- scanning OLD


class _Windows:
    """Reads a file front to back through large ranged reads (local or gs://)."""

    def __init__(self, files: storage.Files, path: str, size: int):
        self._files, self._path, self._size = files, path, size
        self._window = SCAN_WINDOW_GCS if storage.is_gcs(path) else SCAN_WINDOW_LOCAL
        self._buffer, self._start, self.position = b"", 0, 0

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer at the end of the file)."""
        end = self.position + n
        if end > self._start + len(self._buffer):
            stop = min(self._size, max(end, self.position + self._window))
            have = self._buffer[self.position - self._start :]
            more = self._files.read(self._path, self._start + len(self._buffer), stop)
            self._buffer, self._start = have + more, self.position
        data = self._buffer[self.position - self._start : end - self._start]
        self.position += len(data)
        return data


def _masked_crc(data: bytes) -> int:
    return records._masked_crc(data)


def iter_shard(
    path: str, size: int, classes: Sequence[str], files: storage.Files | None = None
) -> Iterator[tuple[str, OldRecord]]:
    """``(image ID, OldRecord)`` of every record of one OLD shard, in order.

    Reads the shard once, front to back, checking both CRCs of every record
    and parsing its Example (~15 us; the image is not decoded). A damaged
    record ends the scan of its shard with a warning: the images after it
    are converted, which gives the same output, only slower.
    """
    stream = _Windows(files or storage.Files(), path, size)
    while stream.position < size:
        offset = stream.position
        header = stream.read(_HEADER)
        problem = ""
        if (
            len(header) < _HEADER
            or _masked_crc(header[:8]) != struct.unpack_from("<I", header, 8)[0]
        ):
            problem = "a damaged record header"
        else:
            (length,) = struct.unpack_from("<Q", header)
            payload = stream.read(length)
            footer = stream.read(4)
            if len(payload) != length or len(footer) != 4:
                problem = "a record cut short"
            elif _masked_crc(payload) != struct.unpack("<I", footer)[0]:
                problem = "a record whose data CRC does not match"
        if problem:
            log.warning(
                "--reuse: %s holds %s at byte %d; its later records are converted instead",
                path,
                problem,
                offset,
            )
            return
        features = records.Example.FromString(payload).features.feature
        try:
            image_id = features["image/filename"].bytes_list.value[0].decode("utf-8")
            sha256 = features["image/key/sha256"].bytes_list.value[0].decode("ascii")
            label = int(features["image/class/label"].int64_list.value[0])
            class_name = features["image/class/text"].bytes_list.value[0].decode("utf-8")
        except (IndexError, UnicodeDecodeError):
            continue  # not a record of this format: never reused
        if not 0 <= label < len(classes) or classes[label] != class_name:
            label = -1  # not what OLD's classes say: always rebuilt with the new label
        yield image_id, OldRecord(sha256, label, class_name, path, offset, stream.position - offset)


class ShardScan(NamedTuple):
    """One shard's records in flat form: what a pool process sends back (~90 bytes a record)."""

    shard: str
    ids: bytes  # UTF-8 IDs, each followed by a NUL (no path holds one)
    sha256: bytes  # 32 raw bytes per record
    labels: array  # "i"
    offsets: array  # "q"
    sizes: array  # "q"


def scan_shard(path: str, size: int, classes: Sequence[str]) -> ShardScan:
    """:func:`iter_shard` of one shard, flattened (runs on a local pool process)."""
    ids, sha256 = bytearray(), bytearray()
    labels, offsets, sizes = array("i"), array("q"), array("q")
    for image_id, old in iter_shard(path, size, classes):
        ids += image_id.encode("utf-8") + b"\0"
        sha256 += bytes.fromhex(old.sha256) if len(old.sha256) == 64 else bytes(32)
        labels.append(old.label)
        offsets.append(old.offset)
        sizes.append(old.size)
    return ShardScan(path, bytes(ids), bytes(sha256), labels, offsets, sizes)


class Index:
    """image ID -> :class:`OldRecord` over every record of OLD, in flat arrays.

    About 90 bytes plus the ID's length per record (a dict of OldRecords
    would be ~600): a sorted array of the IDs' hashes (``hash()``: the index
    is built and read in one process), the IDs in one byte buffer to confirm
    a match, the source hashes as 32 raw bytes each. The first record of an
    ID wins (a dataset holds each ID once).
    """

    def __init__(self, classes: Sequence[str], scans: Iterable[ShardScan]):
        self._classes = tuple(classes)
        self._shards: list[str] = []
        ids, sha256 = bytearray(), bytearray()
        id_ends, shard_of = array("q"), array("i")
        labels, offsets, sizes = array("i"), array("q"), array("q")
        for number, scan in enumerate(scans):
            self._shards.append(scan.shard)
            base = len(ids)
            ids += scan.ids
            ends = np.flatnonzero(np.frombuffer(scan.ids, dtype=np.uint8) == 0) + base
            id_ends.frombytes(ends.astype(np.int64).tobytes())
            shard_of.extend([number] * len(scan.labels))
            sha256 += scan.sha256
            labels.extend(scan.labels)
            offsets.extend(scan.offsets)
            sizes.extend(scan.sizes)
        self._ids, self._id_ends, self._sha256 = bytes(ids), id_ends, bytes(sha256)
        self._shard_of, self._labels, self._offsets, self._sizes = shard_of, labels, offsets, sizes
        hashes = np.fromiter(
            (hash(self._id(position)) for position in range(len(labels))),
            dtype=np.int64,
            count=len(labels),
        )
        self._order = np.argsort(hashes, kind="stable").astype(np.int32)
        self._hashes = hashes[self._order]

    def __len__(self) -> int:
        return len(self._labels)

    def _id(self, position: int) -> bytes:
        start = self._id_ends[position - 1] + 1 if position else 0
        return self._ids[start : self._id_ends[position]]

    def _position(self, image_id: str) -> int | None:
        encoded = image_id.encode("utf-8")
        wanted = hash(encoded)
        at = int(np.searchsorted(self._hashes, wanted))
        while at < len(self._hashes) and self._hashes[at] == wanted:
            position = int(self._order[at])
            if self._id(position) == encoded:
                return position
            at += 1
        return None

    def get(self, image_id: str) -> OldRecord | None:
        position = self._position(image_id)
        if position is None:
            return None
        label = self._labels[position]
        return OldRecord(
            self._sha256[32 * position : 32 * position + 32].hex(),
            label,
            self._classes[label] if label >= 0 else "",
            self._shards[self._shard_of[position]],
            self._offsets[position],
            self._sizes[position],
        )

    def __contains__(self, image_id: str) -> bool:
        return self._position(image_id) is not None

    def ids(self) -> Iterator[str]:
        """Every ID in the index (for the dry run's count of dropped images)."""
        for position in range(len(self)):
            yield self._id(position).decode("utf-8")


def build_index(old: OldDataset, run=None) -> Index:
    """Scans every shard of ``old`` (``run(fn, *args)`` -> a future: a pool process
    per shard; default: in this process, one shard after another)."""
    if run is None:
        return Index(old.classes, (scan_shard(p, n, old.classes) for p, n in old.shards))
    futures = [run(scan_shard, p, n, old.classes) for p, n in old.shards]
    return Index(old.classes, (future.result() for future in futures))


# ---------------------------------------------------------- taking a record over

_files = storage.Files()  # per process (fork-safe: a child opens its own)


def read_record(old: OldRecord) -> bytes | None:
    """OLD's framed record, or None when it cannot be read or is not intact."""
    try:
        framed = _files.read(old.shard, old.offset, old.offset + old.size)
    except Exception as error:  # OLD went away, a network error: convert instead
        log.warning("--reuse: cannot read %s (%s); converting instead", old.shard, error)
        return None
    return framed if records.is_intact(framed) else None


def relabel(framed: bytes, label: int, class_name: str) -> bytes:
    """The same record with another label and class name: the bytes a conversion
    with them would write (``records.image_record`` builds both)."""
    values = records.parse_example(framed[_HEADER:-4])
    payload = records.image_record(
        values["image/encoded"],
        values["image/height"],
        values["image/width"],
        label,
        class_name,
        values["image/filename"],
        values["image/key/sha256"],
    )
    return records.frame_record(payload)


def is_local(old: OldRecord) -> bool:
    return not storage.is_gcs(old.shard)


# ---------------------------------------------------------------------- dry run


@dataclasses.dataclass
class Forecast:
    """What a ``--reuse`` run of the listed images would do (the dry run's line)."""

    in_old: int  # listed images with a record in OLD
    new: int  # listed images without one (new, or rejected by OLD): converted
    dropped: int  # OLD's records of images no longer listed
    checked: int  # of in_old, sources read and hashed
    unchanged: int  # of checked, the same bytes: reused
    relabelled: int  # of unchanged, with another label: rewritten, not decoded
    hash_cpu_s: float  # CPU seconds hashing took, per image checked

    @property
    def reused(self) -> float:
        """Expected records reused (exact when every source was checked)."""
        return self.unchanged * self.in_old / self.checked if self.checked else 0.0

    @property
    def changed(self) -> float:
        return self.in_old - self.reused

    @property
    def exact(self) -> bool:
        return self.checked == self.in_old

    def cpu_per_image(self, converting_s: float) -> float:
        """CPU per listed image of the reuse run: conversions for the new and changed
        images, a read and a hash for the reused ones."""
        total = self.in_old + self.new
        spent = (self.new + self.changed) * converting_s + self.reused * self.hash_cpu_s
        return spent / total if total else 0.0

    def describe(self, old: OldDataset) -> str:
        """The dry run's line: what the run would reuse, convert and drop."""
        approx = "" if self.exact else "~"
        scale = self.in_old / self.checked if self.checked else 0.0
        relabelled = self.relabelled * scale
        text = (
            f"reuse {old.path} ({old.records:,} records): "
            f"reused {approx}{self.reused:,.0f} unchanged"
            + (f" ({approx}{relabelled:,.0f} with a new label)" if self.relabelled else "")
            + f"; converted {approx}{self.changed:,.0f} changed and {self.new:,} without a "
            f"record there (new, or rejected by it); dropped {self.dropped:,} no longer listed"
        )
        if not self.exact:
            text += f" (from {self.checked:,} of {self.in_old:,} sources hashed)"
        return text


def _source_sha256(path: str) -> str | None:
    try:
        if "://" not in path:
            with open(path, "rb") as stream:
                data = stream.read()
        else:
            from beam_pipeline import convert

            data = convert.read_bytes(path)
    except Exception:  # unreadable: the run rejects it (converted, in the count)
        return None
    return hashlib.sha256(data).hexdigest()


# Wall time the dry run spends hashing sources before it extrapolates.
FORECAST_BUDGET_S = 10.0


def forecast(
    refs: Sequence[tuple[str, str, int, str]],
    index: Index,
    classes: Sequence[str],
    seed: int,
    budget_s: float,
    threads: int | None = None,
) -> Forecast:
    """Counts what a reuse run would do; hashes the sources of the images OLD holds,
    in a seeded random order, until all are done or ``budget_s`` of wall time has
    passed (the rest is extrapolated)."""
    listed = set()
    pairs = []
    for ref in refs:
        listed.add(ref[0])
        old = index.get(ref[0])
        if old is not None:
            pairs.append((ref, old))
    dropped = sum(1 for image_id in index.ids() if image_id not in listed)
    random.Random(seed).shuffle(pairs)
    started, cpu_started = time.monotonic(), time.process_time()
    checked = unchanged = relabelled = 0
    threads = threads or os.cpu_count() or 1
    batch = 64 * threads
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for at in range(0, len(pairs), batch):
            if at and time.monotonic() - started > budget_s:
                break
            part = pairs[at : at + batch]
            for (ref, old), sha256 in zip(
                part, pool.map(_source_sha256, [ref[1] for ref, _ in part]), strict=True
            ):
                checked += 1
                if sha256 == old.sha256:
                    unchanged += 1
                    label = ref[2]
                    relabelled += label != old.label or classes[label] != old.class_name
    cpu = (time.process_time() - cpu_started) / max(1, checked)
    return Forecast(
        len(pairs), len(refs) - len(pairs), dropped, checked, unchanged, relabelled, cpu
    )

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

"Unchanged" is the source's SHA-256, read and hashed again, against the one
OLD's record names, read from that record when it is used (:func:`take`,
which also checks the record's ID and CRCs): ~0.1 ms for a web photo,
~1.5 ms for a 1.4 MB phone photo, against 4-25 ms to convert them
(docs/performance.md, "Growing a dataset"). It needs nothing OLD does not
already hold (every format version, local or gs://), and it is not fooled
by a file replaced with another of the same size and modification time. A
user who distrusts it converts without ``--reuse``.

Images OLD rejected are converted again: ``rejects.jsonl`` names no hash, so
whether the file changed is unknown (they are few: ``--max_reject_fraction``).

OLD is read, never written: its metadata (``find_info``: ``imagerecords.json``,
or a version-1 ``dataset_info.json``) at launch; its shards by whoever converts - the
local engine scans them on its pool into an :class:`Index` (24 bytes a
record), the Beam graph scans them on its workers (one element per shard)
and joins the records to the listed images by ID (``pipeline.MatchOld``),
so Dataflow reads OLD from gs:// with no copy on the launching machine.

Pure: no Beam, no Pillow.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import logging
import mmap
import os
import random
import time
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from beam_pipeline.core import settings
from beam_pipeline.core.errors import UsageError
from beam_pipeline.storage import paths, reading
from imagerecords import codec, storage
from imagerecords import info as info_lib

log = logging.getLogger(__name__)

# Bytes read per request while scanning a shard (one request per window on gs://).
SCAN_WINDOW_LOCAL = 1 << 20
SCAN_WINDOW_GCS = 8 << 20


class OldRecord(NamedTuple):
    """Where OLD holds the record of an image ID: all a conversion process needs to
    read it, check it against the source (:func:`take`) and copy it."""

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

    path: str  # normalized (paths.normalize_root)
    info_path: str
    image: dict  # settings.image_settings_from_info: name -> value
    created_by: str
    shards: tuple[tuple[str, int], ...]  # (path, bytes) of every shard, split by split
    records: int  # in all its shards


def open_old(path: str) -> OldDataset:
    """Reads OLD's metadata (either format version's file name).

    Raises:
        UsageError: OLD is not a finished imagerecords dataset, or cannot be read.
    """
    from beam_pipeline.core import images  # Pillow: only for the spec's declarations

    old = paths.normalize_root(path)
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
            from beam_pipeline.storage import gcs

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
    out = paths.normalize_root(output)
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


def version_note(old: OldDataset) -> str:
    """A line when another converter made OLD's records ("" when this one did)."""
    from beam_pipeline.core import metadata

    if not old.created_by or old.created_by == metadata.CREATED_BY:
        return ""
    return (
        f"imagerecords: {old.path} was made by {old.created_by}: its records are reused as "
        "that version encoded them (a run without --reuse encodes every image anew)"
    )


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


def iter_shard(
    path: str, size: int, files: storage.Files | None = None
) -> Iterator[tuple[str, OldRecord]]:
    """``(image ID, OldRecord)`` of every record of one OLD shard, in order.

    Reads the shard once, front to back, checking both CRCs of every record
    and parsing its Example for the ID (~15 us; the image is not decoded). A
    damaged record ends the scan of its shard with a warning: the images
    after it are converted, which gives the same output, only slower.
    """
    stream = _Windows(files or storage.Files(), path, size)
    while stream.position < size:
        offset = stream.position
        header = stream.read(codec.FRAME_HEAD)
        problem = ""
        if not codec.header_intact(header):
            problem = "a damaged record header"
        else:
            length = codec.stated_length(header)
            payload = stream.read(length)
            footer = stream.read(codec.FRAME_FOOT)
            if len(payload) != length or len(footer) != codec.FRAME_FOOT:
                problem = "a record cut short"
            elif not codec.data_intact(payload, footer):
                problem = "a record whose data CRC does not match"
        if problem:
            log.warning(
                "--reuse: %s holds %s at byte %d; its later records are converted instead",
                path,
                problem,
                offset,
            )
            return
        names = codec.Example.FromString(payload).features.feature["image/filename"]
        try:
            image_id = names.bytes_list.value[0].decode("utf-8")
        except (IndexError, UnicodeDecodeError):
            continue  # not a record of this format: never reused
        yield image_id, OldRecord(path, offset, stream.position - offset)


def id_hash(image_id: str) -> int:
    """A stable signed 64-bit hash of an image ID (the same in every process)."""
    digest = hashlib.blake2b(image_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class ShardScan(NamedTuple):
    """One shard's records in flat form: what a pool process sends back (24 bytes a record)."""

    shard: str
    hashes: array  # "q": id_hash of each record's ID
    offsets: array  # "q"
    sizes: array  # "q"


def scan_shard(path: str, size: int) -> ShardScan:
    """:func:`iter_shard` of one shard, flattened (runs on a local pool process)."""
    hashes, offsets, sizes = array("q"), array("q"), array("q")
    for image_id, old in iter_shard(path, size):
        hashes.append(id_hash(image_id))
        offsets.append(old.offset)
        sizes.append(old.size)
    return ShardScan(path, hashes, offsets, sizes)


class _Column:
    """A growing array in its own anonymous memory map (given back whole on close)."""

    def __init__(self, kind):
        self.kind = np.dtype(kind)
        self.used = 0
        # Private: a shared anonymous map cannot grow (its pages past the first
        # size would raise SIGBUS).
        self.map = mmap.mmap(-1, 1 << 16, flags=mmap.MAP_PRIVATE)

    def append(self, data: bytes) -> None:
        if self.used + len(data) > len(self.map):
            self.map.resize(max(2 * len(self.map), self.used + len(data)))
        self.map[self.used : self.used + len(data)] = data
        self.used += len(data)

    def view(self) -> np.ndarray:
        return np.frombuffer(self.map, self.kind, self.used // self.kind.itemsize)


class Index:
    """image ID -> :class:`OldRecord` over every record of OLD: 24 bytes a record.

    Per record only the hash of its ID (:func:`id_hash`), its shard and its
    place there, sorted by hash: 24 MB for a million records. Neither the ID
    nor the source's hash is kept: the conversion process reads the record
    and checks both (:func:`take`), so a hash shared by two IDs costs a
    conversion, never a wrong record. Each array lives in an anonymous
    memory map and each shard's scan is copied in as it arrives, so building
    leaves no freed heap behind and :meth:`close` gives it all back (freed
    heap would stay with the process, which is at its largest later, when
    the last conversions finish).
    """

    _KINDS = {"hashes": np.int64, "offsets": np.int64, "sizes": np.int64, "shard_of": np.int32}

    def __init__(self, scans: Iterable[ShardScan]):
        self._shards: list[str] = []
        self._columns = {name: _Column(kind) for name, kind in self._KINDS.items()}
        c = self._columns
        for number, scan in enumerate(scans):  # one at a time: only one scan is held
            self._shards.append(scan.shard)
            c["hashes"].append(scan.hashes.tobytes())
            c["offsets"].append(scan.offsets.tobytes())
            c["sizes"].append(scan.sizes.tobytes())
            c["shard_of"].append(np.full(len(scan.hashes), number, np.int32).tobytes())
            del scan
        self._v = {name: column.view() for name, column in c.items()}
        order = np.argsort(self._v["hashes"], kind="stable")
        for column in self._v.values():
            column[:] = column[order]

    def __len__(self) -> int:
        return len(self._v["hashes"]) if self._v else 0

    def get(self, image_id: str) -> OldRecord | None:
        """The record of ``image_id``'s hash, if OLD holds one (:func:`take` checks it)."""
        if not self._v:
            return None
        wanted = id_hash(image_id)
        hashes = self._v["hashes"]
        at = int(np.searchsorted(hashes, wanted))
        if at == len(hashes) or hashes[at] != wanted:
            return None
        v = self._v
        return OldRecord(
            self._shards[v["shard_of"][at]], int(v["offsets"][at]), int(v["sizes"][at])
        )

    def close(self) -> None:
        """Gives the memory back (every image has been looked up); empty after."""
        self._v = {}  # the views first: a map with views into it cannot close
        for column in self._columns.values():
            column.map.close()


def build_index(old: OldDataset, run=None) -> Index:
    """Scans every shard of ``old`` (``run(fn, *args)`` -> a future: a pool process
    per shard; default: in this process, one shard after another)."""
    if run is None:
        return Index(scan_shard(p, n) for p, n in old.shards)
    futures = collections.deque(run(scan_shard, p, n) for p, n in old.shards)

    def in_turn():  # nothing here keeps a result once the index has copied it
        while futures:
            yield futures.popleft().result()

    return Index(in_turn())


# ---------------------------------------------------------- taking a record over

_files = storage.Files()  # per process (fork-safe: a child opens its own)


def read_record(old: OldRecord) -> bytes | None:
    """OLD's framed record, or None when it cannot be read or is not intact."""
    try:
        framed = _files.read(old.shard, old.offset, old.offset + old.size)
    except Exception as error:  # OLD went away, a network error: convert instead
        log.warning("--reuse: cannot read %s (%s); converting instead", old.shard, error)
        return None
    return framed if codec.is_intact(framed) else None


def take(
    old: OldRecord, image_id: str, sha256: str, label: int, class_name: str
) -> tuple[bytes, bool] | None:
    """OLD's record for an image whose source has the hash ``sha256``, with this label.

    Returns ``(framed record, unchanged)``: the record as it is when its ID,
    source hash, label and class name are the image's (``unchanged``), or
    rebuilt with the new label and class name (:func:`relabel`); the bytes a
    conversion would write either way. None when OLD's record is of another
    image or another source, or cannot be read: the image is converted.
    """
    framed = read_record(old)
    if framed is None:
        return None
    example = codec.Example.FromString(codec.payload(framed))
    features = example.features.feature
    if _value(features, "image/filename") != image_id.encode("utf-8") or _value(
        features, "image/key/sha256"
    ) != sha256.encode("ascii"):
        return None
    if _value(features, "image/class/label") == label and _value(
        features, "image/class/text"
    ) == class_name.encode("utf-8"):
        return framed, True
    return _rebuilt(features, label, class_name), False


def _value(features, key: str):
    """The one value of a record's feature (None when it has none)."""
    feature = features.get(key)
    kind = feature.WhichOneof("kind") if feature is not None else None
    values = getattr(feature, kind).value if kind else ()
    return values[0] if len(values) == 1 else None


def _rebuilt(features, label: int, class_name: str) -> bytes:
    payload = codec.image_record(
        _value(features, "image/encoded"),
        _value(features, "image/height"),
        _value(features, "image/width"),
        label,
        class_name,
        _value(features, "image/filename"),
        _value(features, "image/key/sha256"),
    )
    return codec.frame_record(payload)


def relabel(framed: bytes, label: int, class_name: str) -> bytes:
    """The same record with another label and class name: the bytes a conversion
    with them would write (``codec.image_record`` builds both)."""
    features = codec.Example.FromString(codec.payload(framed)).features.feature
    return _rebuilt(features, label, class_name)


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
    check_cpu_s: float  # CPU seconds per image checked (source hashed, record read)

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
        spent = (self.new + self.changed) * converting_s + self.reused * self.check_cpu_s
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


def _check(ref: tuple, old: OldRecord, classes: Sequence[str]) -> tuple[bool, bool]:
    """(reused, with a new label) for one image, as a conversion process decides."""
    image_id, path, label, _ = ref
    try:
        sha256, _, _ = reading.hash_source(path)
    except Exception:  # unreadable: the run rejects it (converted, in the count)
        return False, False
    taken = take(old, image_id, sha256, label, classes[label])
    return taken is not None, taken is not None and not taken[1]


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
    """Counts what a reuse run would do; checks the images OLD holds as the run
    would (the source hashed, OLD's record read: :func:`take`), in a seeded random
    order, until all are done or ``budget_s`` of wall time has passed (the rest
    is extrapolated)."""
    pairs = []
    for ref in refs:
        old = index.get(ref[0])
        if old is not None:
            pairs.append((ref, old))
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
            for reused, new_label in pool.map(lambda pair: _check(*pair, classes), part):
                checked += 1
                unchanged += reused
                relabelled += new_label
    cpu = (time.process_time() - cpu_started) / max(1, checked)
    dropped = len(index) - len(pairs)  # each listed ID matches one record at most
    return Forecast(
        len(pairs), len(refs) - len(pairs), dropped, checked, unchanged, relabelled, cpu
    )

"""``--reuse OLD``'s shards read and checked: which records OLD holds, and where.

Each shard read once and hashed; one that fails gives no record (:func:`scan_records`).
The local engine keeps an :class:`OldIndex`, Beam joins by ID. OLD's names are resolved
inside it by ``imagerecords.trust`` and read through ``storage.Files``. Pure: no Beam, no Pillow.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import mmap
from array import array
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from beam_pipeline.core import errors
from beam_pipeline.core.errors import OldDatasetChanged
from imagerecords import codec, storage

log = logging.getLogger(__name__)

# Bytes read per request while scanning a shard (one request per window on gs://).
SCAN_WINDOW_LOCAL = 1 << 20
SCAN_WINDOW_GCS = 8 << 20


class OldRecord(NamedTuple):
    """Where OLD holds the record of an image ID: all a conversion process needs to
    read it, check it against the source and against the scan (``reuse.take``) and
    copy it."""

    shard: str  # OLD's shard file, local path or gs:// URL
    offset: int  # of the framed record in the shard
    size: int  # of the framed record
    crc: int  # its data CRC as the scan read it (the frame's last 4 bytes, little-endian)
    refingerprint: bool = False  # its fingerprint is not this run's scheme's (OldShard's)


class OldShard(NamedTuple):
    """One shard as OLD's metadata describes it: what its scan checks it against."""

    path: str
    num_bytes: int
    num_examples: int
    sha256: str
    # OLD recorded no fingerprint scheme or an earlier one (reuse.open_old): a record's
    # fingerprint is made again from its stored JPEG (reuse.take), never trusted.
    refingerprint: bool = False


class _Windows:
    """Reads a file front to back through large ranged reads (local or gs://), hashing
    every byte once as it arrives (``digest``)."""

    def __init__(self, files: storage.Files, path: str, size: int):
        self._files, self._path, self._size = files, path, size
        self._window = SCAN_WINDOW_GCS if storage.is_gcs(path) else SCAN_WINDOW_LOCAL
        self._buffer, self._start, self.position = b"", 0, 0
        self.digest = hashlib.sha256()

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer at the end of the file)."""
        end = self.position + n
        if end > self._start + len(self._buffer):
            stop = min(self._size, max(end, self.position + self._window))
            have = self._buffer[self.position - self._start :]
            more = read_old(self._files, self._path, self._start + len(self._buffer), stop)
            self.digest.update(more)
            self._buffer, self._start = have + more, self.position
        data = self._buffer[self.position - self._start : end - self._start]
        self.position += len(data)
        return data


def read_old(files: storage.Files, path: str, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of a file of OLD: from gs:// within --gcs_timeout_s,
    else through ``files``. The one read of OLD's shards, by the scan and the take.

    Raises:
        errors.StorageUnreachable: GCS did not answer (hanging or refusing).
        OldDatasetChanged: the file cannot be read (gone since the launch found it).
    """
    gcs_path = storage.is_gcs(path)
    try:
        if gcs_path:
            from beam_pipeline.storage import gcs  # loads the storage client: gs:// only

            return gcs.read_range(path, start, stop)
        return files.read(path, start, stop)
    except errors.RunStopped:
        raise  # GCS out of reach: not a change of OLD
    except Exception as error:
        if gcs_path:
            gcs.raise_if_unreachable(error, path)
        raise changed(path, f"cannot be read ({type(error).__name__}: {error})") from None


def changed(shard: str, what: str) -> OldDatasetChanged:
    """The error that stops a run whose OLD changed under it: names OLD and what to do."""
    folder, _, name = shard.rpartition("/")
    return OldDatasetChanged(
        f"the --reuse dataset {folder} changed while this run read it: {name} {what}; "
        f"{errors.NOT_FINISHED}; let whatever writes to it finish, then "
        f"{errors.RESUME_HINT} (or convert without --reuse)"
    )


def _shard_problem(shard: OldShard, files: storage.Files | None, found: list) -> str:
    """Reads ``shard`` once, front to back, appending ``(image ID, OldRecord)`` of each
    record to ``found``; returns why the shard is not to be trusted ("" when it is).

    Checks both CRCs of every record, parses its Example for the ID (the
    image is not decoded) and hashes the whole shard against the SHA-256
    OLD's metadata gives it.

    Raises:
        OldDatasetChanged: the shard is gone, or shorter than the launch found it.
    """
    stream = _Windows(files or storage.Files(), shard.path, shard.num_bytes)
    while stream.position < shard.num_bytes:
        offset = stream.position
        header = stream.read(codec.FRAME_HEAD)
        if len(header) < codec.FRAME_HEAD:
            raise changed(shard.path, f"ends at byte {stream.position}, not {shard.num_bytes}")
        if not codec.header_intact(header):
            return f"a damaged record header at byte {offset}"
        length = codec.stated_length(header)
        if offset + codec.FRAME_OVERHEAD + length > shard.num_bytes:
            return f"a record at byte {offset} that runs past the shard's end"
        payload = stream.read(length)
        footer = stream.read(codec.FRAME_FOOT)
        if len(payload) != length or len(footer) != codec.FRAME_FOOT:
            raise changed(shard.path, f"ends at byte {stream.position}, not {shard.num_bytes}")
        if not codec.data_intact(payload, footer):
            return f"a record whose data CRC does not match at byte {offset}"
        try:
            example = codec.Example.FromString(payload)
        except DecodeError:
            return f"a record that is not a tf.train.Example at byte {offset}"
        names = example.features.feature["image/filename"]
        try:
            image_id = names.bytes_list.value[0].decode("utf-8")
        except (IndexError, UnicodeDecodeError):
            continue  # not a record of this format: never reused
        found.append(
            (
                image_id,
                OldRecord(
                    shard.path,
                    offset,
                    stream.position - offset,
                    codec.frame_crc(footer),
                    shard.refingerprint,
                ),
            )
        )
    found_sha256 = stream.digest.hexdigest()
    if found_sha256 != shard.sha256:
        return f"SHA-256 {found_sha256[:12]}..., not the {shard.sha256[:12]}... its metadata gives"
    return ""


class Scanned(NamedTuple):
    """One shard's records, once the shard is checked: all of them, or none."""

    records: list  # (image ID, OldRecord) in shard order; [] when the shard failed
    distrusted: int = 0  # records OLD's metadata gives the shard, when it failed
    problem: str = ""  # why it failed: the line to show (:func:`warn`)


def warn(problem: str) -> None:
    """Shows why a shard gave no record (in the process that gathers the scans)."""
    if problem:
        log.warning("%s", problem)


def scan_records(shard: OldShard, files: storage.Files | None = None) -> Scanned:
    """Every record of one OLD shard, with its ID, if the shard is what OLD's metadata
    describes; none (and the line that says why, ``problem``) if it is damaged or
    another file.

    Nothing of a shard that fails is taken: its images are converted, which
    gives the same output, only slower. A record that later reads back other
    than the scan read it stops the run (``reuse.read_record``).

    Raises:
        OldDatasetChanged: the shard is gone, or shorter than the launch found it.
    """
    found: list = []
    problem = _shard_problem(shard, files, found)
    if not problem:
        return Scanned(found)
    line = (
        f"--reuse: {shard.path} holds {problem}: none of its {shard.num_examples} records "
        "is reused (their images are converted)"
    )
    return Scanned([], shard.num_examples, line)


def id_hash(image_id: str) -> int:
    """A stable signed 64-bit hash of an image ID (the same in every process)."""
    digest = hashlib.blake2b(image_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class ShardScan(NamedTuple):
    """One shard's records in flat form: what a pool process sends back (28 bytes a record)."""

    shard: str
    hashes: array  # "q": id_hash of each record's ID
    offsets: array  # "q"
    sizes: array  # "q"
    crcs: array  # "I": each record's data CRC as scanned
    distrusted: int = 0  # the shard failed its check: records not taken
    problem: str = ""  # and why (Scanned.problem)
    refingerprint: bool = False  # OldShard's


def scan_shard(shard: OldShard) -> ShardScan:
    """:func:`scan_records` of one shard, flattened (runs on a local pool process)."""
    hashes, offsets, sizes, crcs = array("q"), array("q"), array("q"), array("I")
    scanned = scan_records(shard)
    for image_id, old in scanned.records:
        hashes.append(id_hash(image_id))
        offsets.append(old.offset)
        sizes.append(old.size)
        crcs.append(old.crc)
    return ShardScan(
        shard.path,
        hashes,
        offsets,
        sizes,
        crcs,
        scanned.distrusted,
        scanned.problem,
        shard.refingerprint,
    )


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


class OldIndex:
    """image ID -> :class:`OldRecord` over every record of OLD: 28 bytes a record.

    Per record only the hash of its ID (:func:`id_hash`), its shard, its
    place there and its data CRC, sorted by hash: 28 MB for a million
    records. Neither the ID nor the source's hash is kept: the conversion
    process reads the record and checks both (``reuse.take``), so a hash
    shared by two IDs costs a conversion, never a wrong record. Each array
    lives in an anonymous memory map and each shard's scan is copied in as
    it arrives, so building leaves no freed heap behind and :meth:`close`
    gives it all back (freed heap would stay with the process, which is at
    its largest later, when the last conversions finish).

    ``distrusted``: records of shards that failed their check (not indexed); why
    each failed is shown as it arrives (:func:`warn`).
    """

    _KINDS = {
        "hashes": np.int64,
        "offsets": np.int64,
        "sizes": np.int64,
        "crcs": np.uint32,
        "shard_of": np.int32,
    }

    def __init__(self, scans: Iterable[ShardScan]):
        self._shards: list[str] = []
        self._refingerprint: list[bool] = []  # per shard, as its scan says
        self._columns = {name: _Column(kind) for name, kind in self._KINDS.items()}
        self.distrusted = 0
        c = self._columns
        for number, scan in enumerate(scans):  # one at a time: only one scan is held
            self._shards.append(scan.shard)
            self._refingerprint.append(scan.refingerprint)
            self.distrusted += scan.distrusted
            warn(scan.problem)
            c["hashes"].append(scan.hashes.tobytes())
            c["offsets"].append(scan.offsets.tobytes())
            c["sizes"].append(scan.sizes.tobytes())
            c["crcs"].append(scan.crcs.tobytes())
            c["shard_of"].append(np.full(len(scan.hashes), number, np.int32).tobytes())
            del scan
        self._v = {name: column.view() for name, column in c.items()}
        order = np.argsort(self._v["hashes"], kind="stable")
        for column in self._v.values():
            column[:] = column[order]

    def __len__(self) -> int:
        return len(self._v["hashes"]) if self._v else 0

    def get(self, image_id: str) -> OldRecord | None:
        """The record of ``image_id``'s hash, if OLD holds one (``reuse.take`` checks it)."""
        if not self._v:
            return None
        wanted = id_hash(image_id)
        hashes = self._v["hashes"]
        at = int(np.searchsorted(hashes, wanted))
        if at == len(hashes) or hashes[at] != wanted:
            return None
        v = self._v
        shard = int(v["shard_of"][at])
        return OldRecord(
            self._shards[shard],
            int(v["offsets"][at]),
            int(v["sizes"][at]),
            int(v["crcs"][at]),
            self._refingerprint[shard],
        )

    def close(self) -> None:
        """Gives the memory back (every image has been looked up); empty after."""
        self._v = {}  # the views first: a map with views into it cannot close
        for column in self._columns.values():
            column.map.close()


def build_index(shards: Sequence[OldShard], run=None) -> OldIndex:
    """Scans every shard of OLD (``run(fn, *args)`` -> a future: a pool process per
    shard; default: in this process, one shard after another)."""
    if run is None:
        return OldIndex(scan_shard(shard) for shard in shards)
    futures = collections.deque(run(scan_shard, shard) for shard in shards)

    def in_turn():  # nothing here keeps a result once the index has copied it
        while futures:
            yield futures.popleft().result()

    return OldIndex(in_turn())

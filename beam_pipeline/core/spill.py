"""Spill files: converted records on local disk, and the resume index over them.

One file per conversion process; only ``(path, offset)`` crosses the graph. The entry
layout and why it makes a run resumable: docs/architecture.md, "Spill files".
Pure: no Beam, no TensorFlow.
"""

from __future__ import annotations

import array
import hashlib
import io
import os
import struct
import uuid
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from beam_pipeline.core import errors, metadata
from imagerecords import codec

# The spill files' format, part of the resume key (resume.key): a rerun never
# reads another format's files. 2: records carry their source's sha256
# (duplicates); 3: rejections are spilled only when the same bytes would get
# them again (elements.RejectKind.transient), and the key holds --resample;
# 4: records carry their near-duplicate fingerprint (the search's input,
# taken from the spill on resume, never computed again).
FORMAT = 4
RECORD, REJECTION = 1, 2
SUFFIX = ".spill"
SETTINGS_FILE = "job.json"
_HEAD = struct.Struct("<BQqQH")
_MAX_HEAD = 1 << 20  # an entry head is small: a longer frame there is damage


def default_dir(output: str) -> str:
    """Where a run that writes to ``output`` spills: always a local folder.

    Under the output's temp folder when the output is local; for a gs://
    output, under ``$IMAGERECORDS_SPILL_DIR`` (default ``~/.cache/imagerecords``)
    in a folder named after the output, so that a rerun finds it again.
    """
    if "://" not in output:
        return os.path.join(output, metadata.TMP_DIR, "spill")
    base = os.environ.get("IMAGERECORDS_SPILL_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "imagerecords"
    )
    # Made absolute here, where it enters: a relative or ~ spelling names one
    # folder for every process of the run, and messages name that folder whole.
    base = os.path.abspath(os.path.expanduser(base))
    return os.path.join(base, "spill-" + hashlib.sha256(output.encode()).hexdigest()[:16])


class Spilled(NamedTuple):
    """One entry of a spill file, as :func:`scan` finds it."""

    image_id: str
    split: str
    key: int
    label: int
    size: int  # bytes of the framed record (0 for a rejection)
    path: str
    offset: int  # of the framed record in ``path``
    reason: str  # why it was rejected; "" for a record
    sha256: str = ""  # of a record's source file (duplicates are grouped by it)
    near: bytes = b""  # a record's near-duplicate fingerprint (near_search.pack)


def encode(
    kind: int,
    split: str,
    image_id: str,
    key: int,
    label: int,
    framed: bytes = b"",
    reason: str = "",
    sha256: str = "",
    near: bytes = b"",
) -> bytes:
    """One entry's bytes: the framed header, then ``framed`` (a record's TFRecord)."""
    text = "\0".join((split, image_id, reason, sha256)).encode("utf-8")
    head = _HEAD.pack(kind, key, label, len(framed), len(near)) + near + text
    return codec.frame_record(head) + framed


class Writer:
    """Appends entries to one new spill file; made per process, never shared."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.pid = os.getpid()
        self.path = os.path.join(directory, f"{self.pid}-{uuid.uuid4().hex[:12]}{SUFFIX}")
        # O_APPEND + one write per chunk: a kill leaves whole earlier chunks.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._size = 0

    def append(self, entries: list[bytes]) -> list[int]:
        """Writes the entries; returns each one's offset in the file."""
        offsets = []
        for entry in entries:
            offsets.append(self._size)
            self._size += len(entry)
        data = memoryview(b"".join(entries))
        try:
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
        except OSError as error:  # a full disk, a file size limit: say which file
            raise errors.cannot_write(self.path, error) from error
        return offsets

    def close(self) -> None:
        os.close(self._fd)


_writers: dict[str, Writer] = {}


def writer(directory: str) -> Writer:
    """This process's writer for ``directory`` (a forked child gets its own)."""
    current = _writers.get(directory)
    if current is None or current.pid != os.getpid():
        current = _writers[directory] = Writer(directory)
    return current


def scan(path: str) -> Iterator[Spilled]:
    """The whole, intact entries of a spill file, in order; stops at the first bad one."""
    with open(path, "rb", buffering=0) as raw:
        stream = io.BufferedReader(raw, buffer_size=1 << 20)
        offset = 0
        while True:
            head = _read_frame(stream)
            if head is None:
                return
            kind, key, label, size, near_size = _HEAD.unpack_from(head)
            near = bytes(head[_HEAD.size : _HEAD.size + near_size])
            text = head[_HEAD.size + near_size :]
            split, image_id, reason, sha256 = text.decode("utf-8").split("\0", 3)
            offset += codec.FRAME_OVERHEAD + len(head)
            if kind == RECORD:
                framed = stream.read(size)
                if len(framed) != size or not codec.is_intact(framed):
                    return
                yield Spilled(image_id, split, key, label, size, path, offset, "", sha256, near)
                offset += size
            elif kind == REJECTION:
                yield Spilled(image_id, split, key, label, 0, path, offset, reason)
            else:
                return


def _read_frame(stream) -> bytes | None:
    """The data of the next frame, or None at the end or at a damaged frame (a run
    killed mid-write leaves one at the end; what follows it is not trusted)."""
    try:
        data = codec.read_frame(stream, max_length=_MAX_HEAD)
    except codec.DamagedRecord:
        return None
    return data if data is None or len(data) >= _HEAD.size else None


def spill_files(directory: str) -> list[str]:
    """The spill files in ``directory``, sorted (so duplicates resolve the same way)."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX))
    except FileNotFoundError:
        return []
    return [os.path.join(directory, n) for n in names]


class Index(Mapping):
    """image ID -> :class:`Spilled`, over every spill file of a folder, in flat arrays.

    A resumed run holds one entry per image an earlier run spilled; as a dict
    of Spilled tuples that was ~0.5-1.1 KB an image (a resumed run of 1.28M
    images peaked 0.9 GB above a full run). Here an entry is its fields in
    typed arrays, its ID in one byte buffer, its sha256 as 32 raw bytes and
    one int -> int slot from the ID's hash to its position; a
    :class:`Spilled` is made only for the entry asked for. The first copy of
    an ID wins (files in sorted order, entries in file order), as a retried
    bundle spills twice.
    """

    def __init__(self, paths: list[str]):
        self._paths = paths
        self._splits: list[str] = []
        self._reasons: dict[int, str] = {}  # position -> reason, for the (few) rejections
        # hash(ID) -> position. hash() never leaves this process (the index is
        # built and read here); IDs that share a hash go to _more.
        self._where: dict[int, int] = {}
        self._more: dict[int, list[int]] = {}
        self._ids = bytearray()
        self._id_ends = array.array("Q")
        self._keys, self._sizes, self._offsets = (array.array("Q") for _ in range(3))
        self._labels = array.array("q")
        self._files = array.array("I")
        self._split_of = array.array("H")
        self._sha256 = bytearray()
        # Fingerprints, one byte buffer: every record's has the same length.
        self._near = bytearray()
        self._near_ends = array.array("Q")
        split_numbers: dict[str, int] = {}
        for number, path in enumerate(paths):
            for item in scan(path):
                if item.image_id in self:
                    continue  # a later copy
                if item.split not in split_numbers:
                    split_numbers[item.split] = len(self._splits)
                    self._splits.append(item.split)
                self._add(item, number, split_numbers[item.split])

    def _add(self, item: Spilled, file_number: int, split_number: int) -> None:
        position = len(self._keys)
        wanted = hash(item.image_id)
        if wanted in self._where:
            self._more.setdefault(wanted, []).append(position)
        else:
            self._where[wanted] = position
        if item.reason:
            self._reasons[position] = item.reason
        self._ids += item.image_id.encode("utf-8")
        self._id_ends.append(len(self._ids))
        self._keys.append(item.key)
        self._labels.append(item.label)
        self._sizes.append(item.size)
        self._offsets.append(item.offset)
        self._files.append(file_number)
        self._split_of.append(split_number)
        self._sha256 += bytes.fromhex(item.sha256) if item.sha256 else bytes(32)
        self._near += item.near
        self._near_ends.append(len(self._near))

    def _id_bytes(self, position: int) -> bytes:
        start = self._id_ends[position - 1] if position else 0
        return self._ids[start : self._id_ends[position]]

    def _position(self, image_id: str) -> int | None:
        wanted = hash(image_id)
        position = self._where.get(wanted)
        if position is None:
            return None
        encoded = image_id.encode("utf-8")
        if self._id_bytes(position) == encoded:
            return position
        for candidate in self._more.get(wanted, ()):
            if self._id_bytes(candidate) == encoded:
                return candidate
        return None

    def _spilled(self, position: int, image_id: str) -> Spilled:
        reason = self._reasons.get(position, "")
        sha256 = "" if reason else self._sha256[32 * position : 32 * position + 32].hex()
        near_start = self._near_ends[position - 1] if position else 0
        near = bytes(self._near[near_start : self._near_ends[position]])
        return tuple.__new__(  # Spilled(...) without its keyword handling
            Spilled,
            (
                image_id,
                self._splits[self._split_of[position]],
                self._keys[position],
                self._labels[position],
                self._sizes[position],
                self._paths[self._files[position]],
                self._offsets[position],
                reason,
                sha256,
                near,
            ),
        )

    def get(self, image_id, default=None):
        position = self._position(image_id) if isinstance(image_id, str) else None
        return default if position is None else self._spilled(position, image_id)

    def __getitem__(self, image_id: str) -> Spilled:
        position = self._position(image_id) if isinstance(image_id, str) else None
        if position is None:
            raise KeyError(image_id)
        return self._spilled(position, image_id)

    def __contains__(self, image_id) -> bool:
        return isinstance(image_id, str) and self._position(image_id) is not None

    def __iter__(self) -> Iterator[str]:
        for position in range(len(self._keys)):
            yield self._id_bytes(position).decode("utf-8")

    def __len__(self) -> int:
        return len(self._keys)


_indexes: dict[str, Index] = {}


def load_index(directory: str) -> Index:
    """image ID -> its spilled record or rejection, over every spill file found.

    Read once per directory and process: the CLI loads it before it starts
    converting (the images in it are not converted again) and the conversion
    step gets the same index; files this run writes are not in it.
    """
    if directory not in _indexes:
        _indexes[directory] = Index(spill_files(directory))
    return _indexes[directory]


def forget_indexes() -> None:
    """Drops the indexes :func:`load_index` read (the run is over)."""
    _indexes.clear()
    for open_writer in _writers.values():
        if open_writer.pid == os.getpid():
            open_writer.close()
    _writers.clear()


class Reader:
    """Reads framed records back from spill files, keeping each file open once."""

    def __init__(self):
        self._fds: dict[str, int] = {}

    def read(self, path: str, offset: int, size: int) -> bytes:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise OSError(f"spill file {path} ends before offset {offset + size}")
        return data

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

"""A shard's records staged on the worker's own disk, then written in key order.

The shuffle path's shard writer: records go to a local file as they arrive, only key
and position stay in memory (docs/architecture.md, "Spill files"). Pure: no Beam.
"""

from __future__ import annotations

import os
import tempfile
from array import array
from collections.abc import Iterable, Iterator

import numpy as np

from beam_pipeline.core import errors
from beam_pipeline.core.elements import ShardEntry, SpillLocation
from beam_pipeline.stages.shards import WrittenShard, write_shard

_BUFFER = 1 << 20


def write_staged_shard(
    output: str,
    split: str,
    shard: int,
    count: int,
    entries: Iterable[ShardEntry],
    index_files: bool = False,
    staging_dir: str | None = None,
) -> WrittenShard:
    """Writes shard ``shard`` of ``count`` from ``entries`` in any order, read once.

    The same bytes as ``write_shard(..., sort_entries(list(entries)))``, in
    memory that does not grow with the records' bytes. The staging file is
    made in ``staging_dir`` (default: the system's temp folder, ``$TMPDIR``)
    under a unique name and deleted on every way out, so a retried bundle
    stages afresh and, the order being a function of the entries alone,
    writes the same shard.
    """
    with _Staged(staging_dir) as staged:
        for entry in entries:
            staged.add(entry)
        return write_shard(output, split, shard, count, staged.in_order(), index_files)


class _Staged:
    """The staging file and, per record, where it is: the only per-record memory."""

    def __init__(self, directory: str | None):
        fd, self.path = tempfile.mkstemp(prefix="imagerecords-", suffix=".stage", dir=directory)
        self._file = os.fdopen(fd, "wb", buffering=_BUFFER)
        self._size = 0
        # Where each record's bytes are: this file, or a spill file that
        # already holds them (the local pool's references are not copied).
        self._sources = [self.path]
        self._source_of_path = {self.path: 0}
        self._keys = array("Q")
        self._labels = array("q")
        self._source = array("i")
        self._offsets = array("q")
        self._sizes = array("q")
        # The image ID, staged too: it orders records whose keys are equal.
        self._id_offsets = array("q")
        self._id_sizes = array("i")

    def __enter__(self) -> _Staged:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._file.close()
        except OSError as error:
            if exc[0] is None:  # else the error on its way out already names the file
                raise errors.cannot_write(self.path, error) from error
        finally:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def _append(self, data: bytes) -> int:
        offset = self._size
        try:
            self._file.write(data)
        except OSError as error:  # a full disk, a file size limit: say which file
            raise errors.cannot_write(self.path, error) from error
        self._size += len(data)
        return offset

    def add(self, entry: ShardEntry) -> None:
        image_id = entry.image_id.encode("utf-8")
        self._id_offsets.append(self._append(image_id))
        self._id_sizes.append(len(image_id))
        if isinstance(entry.data, bytes):
            self._source.append(0)
            self._offsets.append(self._append(entry.data))
        else:
            path = entry.data.path
            source = self._source_of_path.setdefault(path, len(self._sources))
            if source == len(self._sources):
                self._sources.append(path)
            self._source.append(source)
            self._offsets.append(entry.data.offset)
        self._keys.append(entry.key)
        self._labels.append(entry.label)
        self._sizes.append(entry.size)

    def _order(self) -> np.ndarray:
        """Indices of the records by (key, image ID, arrival): ``sort_entries``' order.

        A stable sort by key, then each run of equal keys (rare: keys are 64-bit
        hashes of the IDs) stably by image ID, read back from the file.
        """
        keys = np.frombuffer(self._keys, dtype=np.uint64) if self._keys else np.zeros(0, np.uint64)
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        ties = np.flatnonzero(ordered[1:] == ordered[:-1])
        if ties.size:
            with open(self.path, "rb") as stream:
                for start, end in _runs(ties):
                    run = order[start:end]
                    ids = [self._image_id(stream, i) for i in run]
                    order[start:end] = run[sorted(range(len(run)), key=ids.__getitem__)]
        return order

    def _image_id(self, stream, index: int) -> str:
        stream.seek(self._id_offsets[index])
        return stream.read(self._id_sizes[index]).decode("utf-8")

    def in_order(self) -> Iterator[ShardEntry]:
        """The records by (key, image ID, arrival), each a reference to where its bytes are.

        The image ID is not carried (``""``): writing a shard does not need it.
        """
        try:
            self._file.flush()
        except OSError as error:
            raise errors.cannot_write(self.path, error) from error
        for index in self._order():
            yield ShardEntry(
                self._keys[index],
                "",
                self._labels[index],
                self._sizes[index],
                SpillLocation(self._sources[self._source[index]], self._offsets[index]),
            )


def _runs(ties: np.ndarray) -> Iterator[tuple[int, int]]:
    """``[start, end)`` of each run of equal keys, from the positions ``i`` where
    key ``i`` equals key ``i + 1`` in sorted order."""
    start = previous = int(ties[0])
    for position in ties[1:].tolist():
        if position != previous + 1:
            yield start, previous + 2
            start = position
        previous = position
    yield start, previous + 2

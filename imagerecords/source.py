"""A random-access source over a split's TFRecord shards: Grain's and PyTorch's protocol.

``source[i]`` is record ``i`` of the split, both CRC32Cs checked, parsed into a dict;
decoding is the caller's (docs/trainers.md, "The source").
"""

from __future__ import annotations

import bisect
import logging
import operator
from array import array
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate

from imagerecords import codec, storage
from imagerecords import index as index_lib
from imagerecords import info as info_lib
from imagerecords.index import IndexFileError
from imagerecords.trust import DatasetError

# Record key (docs/format.md section 6) -> name in the dict a read returns.
# A key the converter adds later keeps its record key as its name.
FIELD_NAMES: dict[str, str] = {
    "image/encoded": "image",
    "image/format": "format",
    "image/height": "height",
    "image/width": "width",
    "image/channels": "channels",
    "image/class/label": "label",
    "image/class/text": "class_name",
    "image/filename": "filename",
    "image/key/sha256": "sha256",
}
# Bytes features that stay bytes; the others are UTF-8 text and come back as str.
BINARY_KEYS = frozenset({"image/encoded"})
# Features a read leaves out: the near-duplicate fingerprint is the converter's
# (format_version 3), of no use to a trainer.
LEFT_OUT = frozenset(codec.NEAR_FEATURES)

# Concurrent requests of one batch on gs:// (the storage client's HTTP pool
# keeps 10 connections); local reads are page-cache copies and run in turn.
GCS_THREADS = 8
# Shards whose index is loaded at once when the source is built.
INDEX_THREADS = 8


class CorruptRecordError(DatasetError):
    """A record's bytes fail the TFRecord CRC32C checks (or the file ends early)."""


def parse_record(data: bytes) -> dict:
    """A serialized ``tf.train.Example`` of this format -> the dict a read returns."""
    features = codec.Example.FromString(data).features.feature
    # The format's keys in FIELD_NAMES order, then any newer ones.
    keys = [key for key in FIELD_NAMES if key in features]
    keys += sorted(key for key in features if key not in FIELD_NAMES and key not in LEFT_OUT)
    out = {}
    for key in keys:
        feature = features[key]
        kind = feature.WhichOneof("kind")
        values = getattr(feature, kind).value if kind else ()
        value = values[0] if len(values) == 1 else list(values)
        if kind == "bytes_list" and key not in BINARY_KEYS and len(values) == 1:
            value = value.decode("utf-8")
        out[FIELD_NAMES.get(key, key)] = value
    return out


class RecordSource:
    """Records of one split of a dataset, by position; picklable, thread-safe, fork-safe.

    Args:
        dataset: the dataset folder, local or ``gs://``.
        split: ``"train"``, ``"val"``, ...
        parse: return parsed dicts (default) or the serialized Example bytes.

    The constructor reads the metadata and every shard's index (its ``.idx``
    file, or a scan of its framing when there is none; see ``imagerecords.index``),
    so a missing file or a mismatch fails here, naming it, before training
    starts; and a pickled source (a DataLoader worker's copy) carries the
    offsets with it instead of reading them again.
    """

    def __init__(self, dataset: str, split: str, *, parse: bool = True):
        self._files = storage.Files()
        self.dataset = dataset
        self.split = split
        self.parse = parse
        self.info_path, self.info = info_lib.find_info(dataset, self._files)
        self.shards = info_lib.split_shards(dataset, self.info_path, self.info, split)
        classes = self.info.get("classes")
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise DatasetError(f"{self.info_path}: 'classes' must be a list of names")
        unindexed = [s for s in self.shards if s.index_path is None and storage.is_gcs(s.path)]
        if unindexed:
            logging.getLogger(__name__).warning(
                "%s has no index files: reading its %d shards of %r once to find the records "
                "(convert with --index_files to skip this)",
                dataset,
                len(unindexed),
                split,
            )
        with ThreadPoolExecutor(INDEX_THREADS) as pool:
            self._offsets: list[array] = list(
                pool.map(lambda s: index_lib.shard_offsets(self._files, s), self.shards)
            )
        # _starts[k]: the split position of shard k's first record.
        self._starts = [0, *accumulate(s.num_examples for s in self.shards)]

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; label ``i`` is ``classes[i]``."""
        return tuple(self.info["classes"])

    @property
    def requests(self) -> int:
        """Reads this process has issued so far (ranged GETs on gs://), metadata included."""
        return self._files.requests

    def __len__(self) -> int:
        return self._starts[-1]

    def __repr__(self) -> str:
        return (
            f"RecordSource({self.dataset!r}, {self.split!r}): "
            f"{len(self)} records in {len(self.shards)} shards"
        )

    def _locate(self, index) -> tuple[int, int]:
        """Split position -> (shard number, record number in that shard)."""
        position = operator.index(index)
        if position < 0:
            position += len(self)
        if not 0 <= position < len(self):
            raise IndexError(f"record {index} of a split of {len(self)} records")
        shard = bisect.bisect_right(self._starts, position) - 1
        return shard, position - self._starts[shard]

    def __getitem__(self, index):
        shard, record = self._locate(index)
        offsets = self._offsets[shard]
        data = self._read(shard, offsets[record], offsets[record + 1])
        return self._finish(shard, record, data)

    def _read(self, shard: int, start: int, stop: int) -> bytes:
        path = self.shards[shard].path
        try:
            return self._files.read(path, start, stop)
        except OSError as error:  # gone, or a folder now: the dataset changed
            raise DatasetError(f"{path}: cannot be read ({error.strerror or error})") from None

    def __getitems__(self, indices: Sequence[int]) -> list:
        """Records at ``indices``, in that order; adjacent ones are read with one request."""
        located = [self._locate(i) for i in indices]
        runs: list[tuple[int, int, int]] = []  # (shard, first record, end record)
        for shard, record in sorted(set(located)):
            if runs and runs[-1][0] == shard and runs[-1][2] == record:
                runs[-1] = (shard, runs[-1][1], record + 1)
            else:
                runs.append((shard, record, record + 1))

        def read_run(run):
            shard, first, end = run
            offsets = self._offsets[shard]
            data = self._read(shard, offsets[first], offsets[end])
            base = offsets[first]
            return {
                (shard, record): self._finish(
                    shard,
                    record,
                    data[offsets[record] - base : offsets[record + 1] - base],
                )
                for record in range(first, end)
            }

        remote = any(storage.is_gcs(self.shards[shard].path) for shard, _, _ in runs)
        if remote and len(runs) > 1:
            with ThreadPoolExecutor(min(GCS_THREADS, len(runs))) as pool:
                parts = list(pool.map(read_run, runs))
        else:
            parts = [read_run(run) for run in runs]
        found = {key: value for part in parts for key, value in part.items()}
        out, seen = [], set()
        for key in located:
            value = found[key]
            if key in seen and isinstance(value, dict):
                value = dict(value)  # a repeated index gets its own dict to transform
            seen.add(key)
            out.append(value)
        return out

    # Grain's batched-read protocol (SupportsBatchedReadRandomAccessDataSource).
    _getitems = __getitems__

    def _finish(self, shard: int, record: int, framed: bytes):
        """Checks a framed record's CRCs; returns its Example, parsed unless ``parse=False``."""
        if not codec.is_intact(framed):
            offsets = self._offsets[shard]
            raise CorruptRecordError(
                f"{self.shards[shard].path}: record {record} (bytes {offsets[record]}-"
                f"{offsets[record + 1]}) fails its TFRecord CRC32C check"
                + (
                    ""
                    if len(framed) == offsets[record + 1] - offsets[record]
                    else "; file too short"
                )
            )
        payload = codec.payload(framed)
        return parse_record(payload) if self.parse else payload

    def close(self) -> None:
        """Closes this process's files; the source opens them again if read later."""
        self._files.close()


__all__ = ["CorruptRecordError", "DatasetError", "IndexFileError", "RecordSource", "parse_record"]

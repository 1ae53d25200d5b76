"""Finds a dataset's own metadata and its splits' shards, without TensorFlow.

:func:`find_info` looks for ``imagerecords.json``, then format 1's
``dataset_info.json``, skipping TFDS's own (docs/format.md section 7).
"""

from __future__ import annotations

import dataclasses

from imagerecords import codec, storage, trust
from imagerecords.trust import DatasetError

# Newest name first (docs/format.md section 11).
INFO_FILES = (codec.INFO_FILE, codec.V1_INFO_FILE)
# The format versions this package reads; the same shard layout in both, only
# the metadata file's name differs.
SUPPORTED_FORMAT_VERSIONS = (1, 2, 3)


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """No imagerecords metadata in the folder: the conversion did not finish (or never ran)."""


class UnknownSplitError(KeyError, DatasetError):
    """The split is not in the dataset; the message lists those that are."""

    def __str__(self) -> str:  # KeyError would print the message in quotes.
        return str(self.args[0])


@dataclasses.dataclass(frozen=True)
class Shard:
    """One ``.tfrecord`` file of a split, as the metadata describes it."""

    path: str
    num_examples: int
    num_bytes: int
    index_path: str | None  # its ``.idx`` file, when the converter wrote one


def find_info(dataset: str, files: storage.Files | None = None) -> tuple[str, dict]:
    """The path and parsed contents of ``dataset``'s imagerecords metadata.

    Raises:
        DatasetNotFoundError: neither file is there (or only TFDS's).
        DatasetError: the file is not JSON, not the dataset's own regular file,
            or of a format version not supported.
    """
    storage.check_scheme(dataset)
    files = files or storage.Files()
    for name in INFO_FILES:
        path = trust.resolve(dataset, name, "its metadata file", dataset)
        data = files.read_all(path, trust.MAX_METADATA_BYTES)
        if data is None:
            continue
        info = trust.load_json(data, path)
        if not isinstance(info, dict) or "format_version" not in info:
            continue  # TFDS's dataset_info.json (format 2), not ours
        trust.check_version(info, path, SUPPORTED_FORMAT_VERSIONS)
        return path, info
    raise DatasetNotFoundError(
        f"{dataset} holds no {' or '.join(INFO_FILES)} of imagerecords: "
        "the conversion did not finish, or this is not an imagerecords dataset"
    )


def split_shards(dataset: str, info_path: str, info: dict, split: str) -> list[Shard]:
    """The shards of ``split`` in shard order (the converter's seeded permutation).

    Every name resolved inside ``dataset`` and every number checked
    (:mod:`imagerecords.trust`) before anything is read or allocated.
    """
    splits = info.get("splits")
    if not isinstance(splits, dict):
        raise DatasetError(f"{info_path}: 'splits' must be an object, got {trust.shown(splits)}")
    if split not in splits:
        raise UnknownSplitError(
            f"split {split!r} is not in {info_path}; its splits are: "
            f"{', '.join(splits) or '(none)'}"
        )
    rows = splits[split].get("shards") if isinstance(splits[split], dict) else None
    if not isinstance(rows, list):
        raise DatasetError(f"{info_path}: split {split!r} has no 'shards' list")
    shards = []
    for number, row in enumerate(rows):
        where = f"{info_path}: split {split!r} shard {number}"
        fields = trust.shard_fields(dataset, row, where)
        for field in ("num_examples", "num_bytes"):
            if fields[field] is None:
                raise DatasetError(f"{where}: no {field}")
        shards.append(
            Shard(fields["path"], fields["num_examples"], fields["num_bytes"], fields["index_path"])
        )
    if sum(shard.num_examples for shard in shards) > trust.MAX_NUMBER:
        raise DatasetError(f"{info_path}: split {split!r} holds more records than can be counted")
    return shards

"""Finds a dataset's own metadata and its splits' shards, without TensorFlow.

:func:`find_info` looks for ``imagerecords.json``, then format 1's
``dataset_info.json``, skipping TFDS's own (docs/format.md section 7).
"""

from __future__ import annotations

import dataclasses
import json

from imagerecords import codec, storage

# Newest name first (docs/format.md section 11).
INFO_FILES = (codec.INFO_FILE, codec.V1_INFO_FILE)
# The format versions this package reads; the same shard layout in both, only
# the metadata file's name differs.
SUPPORTED_FORMAT_VERSIONS = (1, 2, 3)


class DatasetNotFoundError(FileNotFoundError):
    """No imagerecords metadata in the folder: the conversion did not finish (or never ran)."""


class UnknownSplitError(KeyError, ValueError):
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
        ValueError: the file is not JSON, or of a format version not supported.
    """
    storage.check_scheme(dataset)
    files = files or storage.Files()
    for name in INFO_FILES:
        path = storage.join(dataset, name)
        data = files.read_all(path)
        if data is None:
            continue
        try:
            info = json.loads(data)
        except ValueError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None
        if not isinstance(info, dict) or "format_version" not in info:
            continue  # TFDS's dataset_info.json (format 2), not ours
        version = info["format_version"]
        if version not in SUPPORTED_FORMAT_VERSIONS:
            supported = ", ".join(map(str, SUPPORTED_FORMAT_VERSIONS))
            raise ValueError(
                f"{path} has format_version {version}; this imagerecords reads {supported}"
            )
        return path, info
    raise DatasetNotFoundError(
        f"{dataset} holds no {' or '.join(INFO_FILES)} of imagerecords: "
        "the conversion did not finish, or this is not an imagerecords dataset"
    )


def split_shards(dataset: str, info_path: str, info: dict, split: str) -> list[Shard]:
    """The shards of ``split`` in shard order (the converter's seeded permutation)."""
    splits = info.get("splits", {})
    if split not in splits:
        raise UnknownSplitError(
            f"split {split!r} is not in {info_path}; its splits are: "
            f"{', '.join(splits) or '(none)'}"
        )
    return [
        Shard(
            path=storage.join(dataset, row["file"]),
            num_examples=int(row["num_examples"]),
            num_bytes=int(row["num_bytes"]),
            index_path=storage.join(dataset, row["index"]) if row.get("index") else None,
        )
        for row in splits[split]["shards"]
    ]

"""``imagerecords.json`` -> a small, frozen, typed object (docs/format.md section 7).

No ``imagerecords.json``, no dataset: the reader never guesses one from a shard glob.
Reads through ``tf.io.gfile`` (local, ``gs://``, ``ram://``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import posixpath
import types
from collections.abc import Mapping

import tensorflow as tf

from imagerecords import codec, trust

# One class for both packages, so that code catching either catches the other's.
from imagerecords.info import UnknownSplitError
from imagerecords.trust import DatasetError

# The published files' names are the format's.
INFO_FILENAME = codec.INFO_FILE
# Where format_version 1 kept the metadata; in version 2 that name is TFDS's file.
V1_INFO_FILENAME = codec.V1_INFO_FILE
LABELS_FILENAME = codec.LABELS_FILE
# The converter's marker of a run that has not finished (docs/format.md section
# 5; beam_pipeline.storage.output.MARKER, which the reader cannot import: a test checks
# that the two agree). A successful run deletes it last, after INFO_FILENAME.
CONVERTER_MARKER = ".imagerecords-tmp/job.json"
# docs/format.md section 11: a version this reader does not list is refused.
SUPPORTED_FORMAT_VERSIONS = (1, 2, 3)


class DatasetInfoError(DatasetError):
    """``imagerecords.json`` is unreadable, of an unknown version, or malformed."""


class IncompleteDatasetError(DatasetError, FileNotFoundError):
    """The folder has no ``imagerecords.json``: the conversion did not finish (or never ran)."""


def is_url(path: str) -> bool:
    """Whether ``path`` is on a URL-style filesystem (``gs://``, ``s3://``, ...)."""
    return "://" in path


def join_path(base: str, name: str) -> str:
    """Joins a file name onto a local or URL-style (``gs://``) directory.

    ``os.path.join`` would use ``\\`` on Windows for ``gs://`` paths; URL-style
    paths always take ``/``.
    """
    if is_url(base):
        return posixpath.join(base, name)
    return tf.io.gfile.join(base, name)


def read_member(
    folder: str,
    name,
    field: str,
    where: str,
    limit: int = trust.MAX_METADATA_BYTES,
    label: str = "",
):
    """The bytes of the dataset's file ``name`` (None when it is missing).

    The name is resolved inside ``folder`` first (:func:`imagerecords.trust.resolve`);
    a local file is read without blocking and only when regular, a URL's after
    its size is checked against ``limit``. ``label``: the file in a message
    (default: its path).

    Raises:
        DatasetError: the name leads outside the dataset, or to no regular file,
            or to one larger than ``limit``.
    """
    path = trust.resolve(folder, name, field, where)
    if not is_url(path):
        return trust.read_local(path, limit, label)
    if not tf.io.gfile.exists(path):
        return None
    size = tf.io.gfile.stat(path).length
    if size > limit:
        raise DatasetError(f"{label or path}: {size:,} bytes, more than the {limit:,} it can hold")
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read(limit + 1)[:limit]


def read_text(folder: str, name, where: str) -> str | None:
    """A text file of a dataset (``labels.txt``, ``rejects.jsonl``), or None when it is missing."""
    data = read_member(folder, name, "file", where, trust.MAX_LIST_BYTES)
    return None if data is None else data.decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One ``.tfrecord`` file of a split.

    Attributes:
        file: The file name relative to the dataset folder, as written in the JSON.
        path: The full path (dataset folder + ``file``), ready for ``TFRecordDataset``.
        num_examples: Records in this shard, or ``None`` when the JSON does not say.
        num_bytes: Size in bytes, or ``None`` when the JSON does not say.
        sha256: Hex SHA-256 of the file, or ``None``.
        index: The name of its ``.idx`` file (``--index_files``), or ``None``.
    """

    file: str
    path: str
    num_examples: int | None = None
    num_bytes: int | None = None
    sha256: str | None = None
    index: str | None = None


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split (``train``, ``val``, ...).

    Attributes:
        name: The split name.
        num_examples: Records in the split (all shards together).
        num_bytes: Bytes in the split, or ``None``.
        class_counts: Read-only mapping class name -> records of that class.
        shards: The shards, in shard order (reading them in this order yields the
            converter's seeded permutation of the split).
    """

    name: str
    num_examples: int
    num_bytes: int | None
    class_counts: Mapping[str, int]
    shards: tuple[ShardInfo, ...]

    @property
    def files(self) -> tuple[str, ...]:
        """Full paths of the shards, in shard order."""
        return tuple(shard.path for shard in self.shards)


@dataclasses.dataclass(frozen=True)
class StoredImage:
    """How the converter stored the images (``"image"`` in the JSON).

    Attributes:
        resize: ``shorter``, ``longer``, ``crop``, ``pad`` or ``none``.
        size: The ``--image_size`` the converter used, or ``None``.
        jpeg_quality: JPEG quality used when re-encoding, or ``None``.
    """

    resize: str | None = None
    size: int | None = None
    jpeg_quality: int | None = None


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """A parsed ``imagerecords.json``; build it with :func:`load_info`.

    Attributes:
        path: The dataset folder.
        format_version: The contract version (only 1 exists).
        classes: Class names; the class id is the position in this tuple.
        image: How the images were stored.
        splits: Read-only mapping split name -> :class:`SplitInfo`, in JSON order.
        seed: The converter's seed, or ``None``.
        source: Where the images came from, or ``None``.
        created_by: The tool and version that wrote the dataset, or ``None``.
        features: Read-only mapping record key -> type name, as written by the converter.
        rejected_count: Images the converter rejected (see ``rejects.jsonl``).
        raw: The whole decoded JSON (read-only at the top level), for fields this
            class does not model (e.g. the converter's extra ``image`` settings).
    """

    path: str
    format_version: int
    classes: tuple[str, ...]
    image: StoredImage
    splits: Mapping[str, SplitInfo]
    seed: int | None = None
    source: str | None = None
    created_by: str | None = None
    features: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    rejected_count: int = 0
    raw: Mapping = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}), repr=False, compare=False
    )

    @property
    def metadata_file(self) -> str:
        """The name of the file this was read from (``dataset_info.json`` in format_version 1)."""
        return V1_INFO_FILENAME if self.format_version == 1 else INFO_FILENAME

    @property
    def num_classes(self) -> int:
        """Number of classes (labels are ``0 .. num_classes - 1``)."""
        return len(self.classes)

    @property
    def split_names(self) -> tuple[str, ...]:
        """The split names, in the order the JSON lists them."""
        return tuple(self.splits)

    def split(self, name: str) -> SplitInfo:
        """The :class:`SplitInfo` of ``name``.

        Raises:
            UnknownSplitError: naming the splits that do exist.
        """
        try:
            return self.splits[name]
        except KeyError:
            raise UnknownSplitError(
                f"split {name!r} is not in {join_path(self.path, INFO_FILENAME)}; "
                f"its splits are: {', '.join(self.splits) or '(none)'}"
            ) from None

    def num_examples(self, split: str) -> int:
        """Records in ``split``."""
        return self.split(split).num_examples

    def class_counts(self, split: str) -> Mapping[str, int]:
        """Class name -> records of that class in ``split``."""
        return self.split(split).class_counts

    def files(self, split: str) -> tuple[str, ...]:
        """Full paths of the shards of ``split``, in shard order."""
        return self.split(split).files

    def steps_per_epoch(self, split: str, batch_size: int, drop_remainder: bool = True) -> int:
        """Batches in one pass over ``split``.

        Args:
            split: The split name.
            batch_size: The *global* batch size (what one training step consumes
                over all replicas).
            drop_remainder: ``True`` (training default) counts full batches only,
                ``False`` (evaluation default, or ``pad_to_batch``) also counts the
                last partial batch.

        Returns:
            ``floor(n / batch_size)`` or ``ceil(n / batch_size)``.

        Raises:
            ValueError: ``drop_remainder`` and the split holds fewer examples
                than one batch: the answer would be 0, which Keras reads as
                "no limit" on a repeating dataset (training would never end).
        """
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        n = self.num_examples(split)
        if drop_remainder and n < batch_size:
            raise ValueError(too_few_for_a_batch(split, n, batch_size))
        return n // batch_size if drop_remainder else math.ceil(n / batch_size)


def too_few_for_a_batch(split: str, examples: int, batch_size: int, where: str = "") -> str:
    """The message for a split (or one input pipeline's share) smaller than one batch."""
    return (
        f"split {split!r} holds {examples} examples{where}, fewer than one batch of "
        f"{batch_size}: with drop_remainder=True not one batch is complete (an epoch of 0 "
        f"steps). Use a batch size of at most {examples}, or drop_remainder=False"
    )


def _as_int(value, what: str, where: str, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    try:
        return trust.as_int(value, what, where)
    except DatasetError as error:
        raise DatasetInfoError(str(error)) from None


def _parse_split(name: str, raw, folder: str, classes: tuple[str, ...], where: str) -> SplitInfo:
    where = f"{where}: split {name!r}"
    if not isinstance(raw, Mapping):
        raise DatasetInfoError(f"{where} must be an object")
    raw_shards = raw.get("shards")
    if not isinstance(raw_shards, list):
        raise DatasetInfoError(f"{where} has no 'shards' list")
    shards = []
    for i, shard in enumerate(raw_shards):
        if not isinstance(shard, Mapping) or not isinstance(shard.get("file"), str):
            raise DatasetInfoError(f"{where}: shard {i} has no 'file'")
        if not isinstance(shard.get("index", ""), str):
            raise DatasetInfoError(f"{where}: shard {i}'s 'index' must be a file name")
        try:
            fields = trust.shard_fields(folder, dict(shard), f"{where}: shard {i}")
        except DatasetError as error:
            raise DatasetInfoError(str(error)) from None
        del fields["index_path"]
        shards.append(ShardInfo(**fields))
    num_examples = _as_int(raw.get("num_examples"), "num_examples", where)
    counted = [s.num_examples for s in shards]
    if None not in counted and sum(counted) != num_examples:
        raise DatasetInfoError(
            f"{where}: num_examples is {num_examples} but its shards hold {sum(counted)}"
        )
    class_counts = raw.get("class_counts", {})
    if not isinstance(class_counts, Mapping):
        raise DatasetInfoError(f"{where}: class_counts must be an object")
    unknown = sorted(set(class_counts) - set(classes))
    if unknown:
        raise DatasetInfoError(f"{where}: class_counts names unknown classes {unknown}")
    return SplitInfo(
        name=name,
        num_examples=num_examples,
        num_bytes=_as_int(raw.get("num_bytes"), "num_bytes", where, True),
        class_counts=types.MappingProxyType(
            {c: _as_int(n, f"class_counts[{c!r}]", where) for c, n in class_counts.items()}
        ),
        shards=tuple(shards),
    )


def _optional(raw: Mapping, key: str, kinds: type | tuple[type, ...], where: str):
    """``raw[key]`` if it is absent, null or of ``kinds`` (never a bool for an int)."""
    value = raw.get(key)
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
        raise DatasetInfoError(f"{where}: {key} {trust.shown(value)} is of the wrong type")
    return value


def info_from_dict(raw: Mapping, path: str, name: str = INFO_FILENAME) -> DatasetInfo:
    """Builds a :class:`DatasetInfo` from the decoded JSON of the dataset at ``path``.

    ``name``: the metadata file it came from (format_version 1: dataset_info.json).

    Raises:
        DatasetInfoError: on an unknown ``format_version`` or a malformed field.
    """
    where = join_path(path, name)
    if not isinstance(raw, Mapping):
        raise DatasetInfoError(f"{where}: expected a JSON object")
    try:
        trust.check_depth(dict(raw), where)
        version = trust.check_version(raw, where, SUPPORTED_FORMAT_VERSIONS)
    except DatasetError as error:
        raise DatasetInfoError(str(error)) from None
    classes = raw.get("classes")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise DatasetInfoError(f"{where}: 'classes' must be a list of names")
    if len(set(classes)) != len(classes):
        raise DatasetInfoError(f"{where}: 'classes' has duplicate names")
    classes = tuple(classes)
    splits = raw.get("splits")
    if not isinstance(splits, Mapping) or not splits:
        raise DatasetInfoError(f"{where}: 'splits' must be a non-empty object")
    blocks = {key: raw.get(key) or {} for key in ("image", "rejected", "features")}
    for key, block in blocks.items():
        if not isinstance(block, Mapping):
            raise DatasetInfoError(f"{where}: '{key}' must be an object, got {trust.shown(block)}")
    image, rejected, features = blocks["image"], blocks["rejected"], blocks["features"]
    if not all(isinstance(kind, str) for kind in features.values()):
        raise DatasetInfoError(f"{where}: 'features' must map record keys to type names")
    return DatasetInfo(
        path=path,
        format_version=version,
        classes=classes,
        image=StoredImage(
            resize=_optional(image, "resize", str, where),
            size=_as_int(image.get("size"), "image.size", where, True),
            jpeg_quality=_as_int(image.get("jpeg_quality"), "image.jpeg_quality", where, True),
        ),
        splits=types.MappingProxyType(
            {name: _parse_split(name, s, path, classes, where) for name, s in splits.items()}
        ),
        seed=_optional(raw, "seed", int, where),
        source=_optional(raw, "source", str, where),
        created_by=_optional(raw, "created_by", str, where),
        features=types.MappingProxyType(dict(features)),
        rejected_count=_as_int(rejected.get("count", 0), "rejected.count", where) or 0,
        raw=types.MappingProxyType(dict(raw)),
    )


def _split_info_path(path: str) -> tuple[str, str | None]:
    """``(folder, metadata file name)`` for a folder or a metadata file's path.

    A folder's file is ``imagerecords.json``, or for a format_version 1 dataset
    ``dataset_info.json`` holding a ``format_version`` (in version 2 that name
    is TFDS's file, which has none); None when the folder has neither.
    """
    for name in (INFO_FILENAME, V1_INFO_FILENAME):
        if path == name or path.endswith(("/" + name, "\\" + name)):
            return path[: -len(name)].rstrip("/\\") or ".", name
    folder = path.rstrip("/") or "/"
    if _member_exists(folder, INFO_FILENAME):
        return folder, INFO_FILENAME
    if _member_exists(folder, V1_INFO_FILENAME):
        data = read_member(folder, V1_INFO_FILENAME, "its metadata file", folder)
        try:
            doc = trust.load_json(data, join_path(folder, V1_INFO_FILENAME))
        except DatasetError:
            return folder, V1_INFO_FILENAME  # ours, damaged: say so when it is read
        if isinstance(doc, dict) and "format_version" in doc:
            return folder, V1_INFO_FILENAME
    return folder, None


def _member_exists(folder: str, name: str) -> bool:
    """Whether the dataset's fixed-name file ``name`` is there (refused when it is not its own)."""
    path = trust.resolve(folder, name, "its metadata file", folder)
    return tf.io.gfile.exists(path) if is_url(path) else os.path.lexists(path)


def load_info(path: str) -> DatasetInfo:
    """Reads and checks the metadata of the dataset at ``path``.

    Args:
        path: The dataset folder (local, ``gs://...``, any ``tf.io.gfile`` path),
            or its ``imagerecords.json`` (``dataset_info.json`` for a dataset
            of format_version 1) itself.

    Returns:
        The parsed, frozen :class:`DatasetInfo`.

    Raises:
        IncompleteDatasetError: the folder has no ``imagerecords.json`` (the
            converter writes it last, so the conversion is unfinished or failed).
        DatasetInfoError: the file is not JSON, has an unknown ``format_version``,
            a malformed field, or names a file that is not the dataset's own
            (docs/format.md, "What a reader refuses").
    """
    try:
        path, name = _split_info_path(str(path))
        info_file = join_path(path, name or INFO_FILENAME)
        data = None if name is None else read_member(path, name, "its metadata file", path)
        if data is None:
            raise IncompleteDatasetError(f"cannot read dataset at {path}: {_why_incomplete(path)}")
        raw = trust.load_json(data, info_file)
    except (IncompleteDatasetError, DatasetInfoError):
        raise
    except DatasetError as error:
        raise DatasetInfoError(str(error)) from None
    return info_from_dict(raw, path, name)


def _why_incomplete(path: str) -> str:
    """What a folder without ``imagerecords.json`` holds instead, for the error message."""
    if not (tf.io.gfile.exists(path) and tf.io.gfile.isdir(path)):
        return "the folder does not exist"
    shards = tf.io.gfile.glob(join_path(path, "*.tfrecord"))
    marker = join_path(path, CONVERTER_MARKER)
    if tf.io.gfile.exists(marker):
        written = f" ({len(shards)} .tfrecord file(s) so far)" if shards else ""
        return (
            f"the conversion into it did not finish: it holds the converter's {CONVERTER_MARKER}"
            f"{written} but no {INFO_FILENAME}, which the converter writes last. Run the "
            f"converter's command again ({_resume_command(path)}, with the same "
            "settings) to resume it"
        )
    if shards:
        return (
            f"it holds {len(shards)} .tfrecord file(s) but no {INFO_FILENAME}, which the "
            "converter writes last: the conversion is unfinished or failed (see its log "
            "and rejects.jsonl), so these shards may be partial"
        )
    return f"it has no {INFO_FILENAME}: is this an imagerecords output folder?"


def _resume_command(output: str) -> str:
    """The converter's command line for ``output``, with the input its marker names."""
    try:
        data = read_member(output, CONVERTER_MARKER, "its marker", output)
        marker = trust.load_json(data or b"", join_path(output, CONVERTER_MARKER))
        source = marker.get("input") if isinstance(marker, dict) else None
    except (tf.errors.OpError, DatasetError):
        source = None
    given = f"--input {source} " if isinstance(source, str) and source else ""
    return f"python -m beam_pipeline {given}--output {output} ..."

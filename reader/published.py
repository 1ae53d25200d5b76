"""``--verify`` of the files a dataset publishes beside its shards, against its metadata.

The ``.idx`` files, TFDS's three files, ``labels.txt`` and the lists, each checked
against ``imagerecords.json``, and any file nothing names (docs/format.md sections 7,
11). One line per problem; the helpers are pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from imagerecords import trust
from imagerecords.trust import DatasetError
from reader import info as info_lib
from reader.decode import LABEL

# TFDS's metadata files (beam_pipeline.core.tfds_metadata.FILES, which the
# reader cannot import: a test checks that the two agree).
TFDS_INFO_FILENAME = "dataset_info.json"
TFDS_FEATURES_FILENAME = "features.json"
# TFDS names a ClassLabel's names file after the feature's path.
TFDS_LABELS_FILENAME = LABEL.replace("/", "-") + ".labels.txt"
TFDS_FILES = (TFDS_INFO_FILENAME, TFDS_FEATURES_FILENAME, TFDS_LABELS_FILENAME)
# What TFDS reads when a split names no template (tensorflow_datasets/core/naming.py).
TFDS_DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
TFDS_FILE_FORMAT = "tfrecord"
# The converter's working folder, which a finished run removes last.
CONVERTER_FOLDER = info_lib.CONVERTER_MARKER.split("/")[0]


def published_files(info: info_lib.DatasetInfo) -> list[str]:
    """Every file name the dataset's metadata says is part of it (relative to its folder)."""
    names = [info.metadata_file, info_lib.LABELS_FILENAME]
    for split in info.splits.values():
        for shard in split.shards:
            names += [shard.file] + ([shard.index] if shard.index else [])
    names += list_files(info)
    if info.format_version >= 2:  # version 1's dataset_info.json is its own metadata
        names += TFDS_FILES
    return names


def list_files(info: info_lib.DatasetInfo) -> list[str]:
    """The files its blocks name (``rejected``, ``skipped``, ``duplicates``: the lists).

    Any block's ``file``, not only these three: a file added beside the shards
    within a format version is named this way (docs/format.md section 11).
    """
    blocks = info.raw.values()
    return [b["file"] for b in blocks if isinstance(b, Mapping) and isinstance(b.get("file"), str)]


def foreign_problems(
    entries: Sequence[str], published: Sequence[str], folders: set[str], metadata_file: str
) -> list[str]:
    """A line for each entry of the dataset's folder that no published file accounts for.

    ``entries`` are the folder's names (a ``gs://`` listing ends a folder's with
    ``/``); ``folders`` the local names that are folders.
    """
    known = set(published)
    problems = []
    for entry in sorted(entries):
        name = entry.rstrip("/")
        if name in known or not name:  # not name: a gs:// folder's own placeholder object
            continue
        if name == CONVERTER_FOLDER:
            problems.append(
                f"{name}/: the converter's working folder, which a finished run removes: "
                "a run into this folder did not finish (run its command again to complete it)"
            )
        elif entry.endswith("/") or name in folders:
            problems.append(f"{name}/: a folder that is not part of the dataset")
        else:
            problems.append(
                f"{name}: not part of the dataset (neither {metadata_file} nor the files "
                "it publishes name it)"
            )
    return problems


def labels_problem(name: str, text: str, classes: Sequence[str], metadata_file: str) -> str | None:
    """Why a class names file (one name a line) is not ``classes`` in order, or None."""
    lines = text.splitlines()
    if lines == list(classes):
        return None
    pairs = enumerate(zip(lines, classes, strict=False))  # up to the shorter one's end
    first = next((i for i, (a, b) in pairs if a != b), min(len(lines), len(classes)))
    here = f"line {first + 1} is {lines[first]!r}" if first < len(lines) else "it ends there"
    want = f"class {first} is {classes[first]!r}" if first < len(classes) else "no class is"
    return (
        f"{name}: its {len(lines)} lines are not {metadata_file}'s {len(classes)} classes "
        f"in order ({here}, {want})"
    )


def index_problems(name: str, data: bytes, frames: Sequence[int], complete: bool) -> list[str]:
    """What is wrong in a ``.idx`` file, against its shard's frame boundaries.

    ``frames`` holds where each record of the shard starts and, last, where
    the last one ends (``records + 1`` numbers); ``complete`` says the shard's
    framing held to its end (when it did not, lines past the last frame
    found are not judged: the shard's own problem is reported).
    """
    try:
        lines = data.decode("ascii").splitlines()
    except UnicodeDecodeError:
        return [f"{name}: not ASCII text, not '<offset> <length>' lines"]
    records = len(frames) - 1
    wrong = []
    for number, line in enumerate(lines, start=1):
        said = trust.index_line(line.encode("ascii"))
        if said is None:  # the dataset's own .idx file (trust.resolve): its line is shown
            return [f"{name}: line {number} is {line[:40]!r}, not '<offset> <length>'"]
        if number > records:
            if not complete:
                break
            return [f"{name}: {len(lines):,} lines, the shard has {records:,} records"]
        real = (frames[number - 1], frames[number] - frames[number - 1])
        if said != real:
            wrong.append((number, said, real))
    problems = []
    if wrong:
        number, (offset, length), (start, size) = wrong[0]
        more = f" ({len(wrong) - 1:,} more lines are wrong)" if len(wrong) > 1 else ""
        problems.append(
            f"{name}: line {number} says record {number - 1} is {length:,} bytes at byte "
            f"{offset:,}, the shard has it {size:,} bytes at byte {start:,}{more}"
        )
    if complete and len(lines) < records:
        problems.append(f"{name}: {len(lines):,} lines, the shard has {records:,} records")
    return problems


_proto_int = trust.proto_int


def fill_template(template: str, split: str, index: int, shards: int, dataset: str) -> str:
    """The shard name TFDS makes of ``template`` (its naming.ShardedFileTemplate's rule).

    Raises:
        DatasetError: the template is not one of the forms TFDS writes
            (:func:`imagerecords.trust.check_template`), or a name is too long.
    """
    try:
        trust.check_template(template, "filepathTemplate")
    except DatasetError:
        raise DatasetError(
            f"{trust.shown(template)} cannot be filled (not a form TFDS writes: only its "
            f"fields {', '.join(sorted(trust.TEMPLATE_FIELDS))}, bare)"
        ) from None
    if max(len(split), len(dataset)) > trust.MAX_NAME:
        raise DatasetError(f"{trust.shown(template)} cannot be filled (a name is too long)")
    digits = max(5, len(str(shards)))
    number, count = f"{index:0{digits}d}", f"{shards:0{digits}d}"
    try:
        return template.format(
            SPLIT=split,
            DATASET=dataset,
            FILEFORMAT=TFDS_FILE_FORMAT,
            SHARD_INDEX=number,
            NUM_SHARDS=count,
            SHARD_X_OF_Y=f"{number}-of-{count}",
        )
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as error:
        raise DatasetError(f"{template!r} cannot be filled ({error!r})") from None


def _tfds_split_problems(
    where: str, entry: Mapping, split: info_lib.SplitInfo, dataset: str, metadata_file: str
) -> list[str]:
    problems = []
    lengths = entry.get("shardLengths")
    if not isinstance(lengths, list):
        return [f"{where}: no shardLengths list"]
    if len(lengths) != len(split.shards):
        problems.append(
            f"{where}: {len(lengths)} shardLengths, {metadata_file} lists "
            f"{len(split.shards)} shards"
        )
    else:
        wrong = [
            (shard, length)
            for shard, length in zip(split.shards, lengths, strict=True)
            if shard.num_examples is not None and _proto_int(length) != shard.num_examples
        ]
        if wrong:
            shard, length = wrong[0]
            more = f" ({len(wrong) - 1} more shards differ)" if len(wrong) > 1 else ""
            problems.append(
                f"{where}: shardLengths gives {shard.file} {length!r} records, "
                f"{metadata_file} {shard.num_examples:,}{more}"
            )
    if split.num_bytes is not None and _proto_int(entry.get("numBytes")) != split.num_bytes:
        problems.append(
            f"{where}: numBytes {entry.get('numBytes')!r}, {metadata_file} says {split.num_bytes:,}"
        )
    template = entry.get("filepathTemplate") or TFDS_DEFAULT_TEMPLATE
    if not isinstance(template, str):
        return problems + [f"{where}: filepathTemplate {template!r} is not a string"]
    for index, shard in enumerate(split.shards):
        try:
            named = fill_template(template, split.name, index, len(split.shards), dataset)
        except DatasetError as error:
            return problems + [f"{where}: filepathTemplate {error}"]
        if named != shard.file:
            problems.append(
                f"{where}: filepathTemplate {template!r} names shard {index} {named!r}, "
                f"the shard is {shard.file!r}"
            )
            break
    return problems


def tfds_info_problems(info: info_lib.DatasetInfo, text: str) -> list[str]:
    """What in TFDS's ``dataset_info.json`` contradicts the dataset's metadata."""
    name = TFDS_INFO_FILENAME
    try:
        doc = trust.load_json(text, name)
    except DatasetError as error:
        return [str(error)]
    if not isinstance(doc, Mapping):
        return [f"{name}: not a JSON object"]
    meta = info.metadata_file
    problems = []
    if doc.get("fileFormat") != TFDS_FILE_FORMAT:
        problems.append(f"{name}: fileFormat {doc.get('fileFormat')!r}, the shards are tfrecord")
    config = info.raw.get("config")
    for key, field in (("name", "tfds_name"), ("version", "tfds_version")):
        want = config.get(field) if isinstance(config, Mapping) else None
        if want is not None and doc.get(key) != want:
            problems.append(f"{name}: {key} {doc.get(key)!r}, {meta}'s config.{field} {want!r}")
    splits = doc.get("splits")
    if not isinstance(splits, list) or not all(
        isinstance(s, Mapping) and isinstance(s.get("name"), str) for s in splits
    ):
        return problems + [f"{name}: 'splits' is not a list of named splits"]
    listed = {s["name"]: s for s in splits}
    # TFDS cannot read a split of no shards, so the converter leaves those out.
    wanted = {n: s for n, s in info.splits.items() if s.shards}
    for extra in sorted(set(listed) - set(wanted)):
        problems.append(f"{name}: split {extra!r}, which has no shards in {meta}")
    dataset = doc.get("name") if isinstance(doc.get("name"), str) else ""
    for split in wanted.values():
        if split.name not in listed:
            problems.append(
                f"{name}: no split {split.name!r} ({meta} lists {len(split.shards)} shards of it)"
            )
        else:
            where = f"{name}: split {split.name!r}"
            problems += _tfds_split_problems(where, listed[split.name], split, dataset, meta)
    return problems


def _feature_leaves(node, path: tuple[str, ...] = ()) -> dict[str, Mapping]:
    """``features.json``'s nested FeaturesDicts as record key -> feature (keys joined by ``/``)."""
    inner = node.get("featuresDict") if isinstance(node, Mapping) else None
    if not (isinstance(inner, Mapping) and isinstance(inner.get("features"), Mapping)):
        return {"/".join(path): node}
    leaves = {}
    for key, child in inner["features"].items():
        leaves.update(_feature_leaves(child, path + (key,)))
    return leaves


def tfds_features_problems(info: info_lib.DatasetInfo, text: str) -> list[str]:
    """What in TFDS's ``features.json`` contradicts the dataset's record keys and classes."""
    name = TFDS_FEATURES_FILENAME
    try:
        leaves = _feature_leaves(trust.load_json(text, name))
    except DatasetError as error:
        return [str(error)]
    problems = []
    if info.features and set(leaves) != set(info.features):
        missing = sorted(set(info.features) - set(leaves))
        extra = sorted(set(leaves) - set(info.features))
        problems.append(
            f"{name}: its features are not {info.metadata_file}'s record keys "
            f"(missing {missing}, not a record key {extra})"
        )
    label = leaves.get(LABEL)
    if label is not None:
        classes = label.get("classLabel") if isinstance(label, Mapping) else None
        count = _proto_int(classes.get("numClasses")) if isinstance(classes, Mapping) else None
        if count != info.num_classes:
            problems.append(
                f"{name}: {LABEL} is not a ClassLabel of {info.num_classes} classes "
                f"(it says {classes!r})"
            )
    return problems


def read_published(
    folder: str, name: str, missing: str, limit: int = trust.MAX_METADATA_BYTES
) -> tuple[bytes | None, list[str]]:
    """A published file's bytes, or None and the problem (``missing`` says why it must exist).

    Read only once it is known to be the dataset's own regular file
    (:func:`reader.info.read_member`): a refusal is the problem line.
    """
    try:
        data = info_lib.read_member(folder, name, "file", name, limit, label=name)
    except DatasetError as error:
        return None, [str(error)]
    except (tf.errors.OpError, OSError) as error:
        why = error.message if isinstance(error, tf.errors.OpError) else error.strerror
        return None, [f"{name}: cannot be read: {why}"]
    if data is None:
        return None, [f"{name}: missing ({missing})"]
    return data, []


def _text(name: str, data: bytes) -> tuple[str | None, list[str]]:
    try:
        return data.decode("utf-8"), []
    except UnicodeDecodeError as error:
        return None, [f"{name}: not UTF-8 text ({error})"]


def _class_names(name: str):
    """The check of the class names file ``name`` (one class a line)."""

    def check(info: info_lib.DatasetInfo, text: str) -> list[str]:
        problem = labels_problem(name, text, info.classes, info.metadata_file)
        return [problem] if problem else []

    return check


def file_problems(info: info_lib.DatasetInfo) -> list[str]:
    """Every problem of the published files but the shards and their ``.idx`` files."""
    meta, problems = info.metadata_file, []
    checks = [(info_lib.LABELS_FILENAME, "the class names", _class_names(info_lib.LABELS_FILENAME))]
    if info.format_version >= 2:
        checks += [
            (TFDS_INFO_FILENAME, "TFDS's metadata", tfds_info_problems),
            (TFDS_FEATURES_FILENAME, "TFDS's metadata", tfds_features_problems),
            (TFDS_LABELS_FILENAME, "TFDS's class names", _class_names(TFDS_LABELS_FILENAME)),
        ]
    for name, what, check in checks:
        data, found = read_published(info.path, name, f"{what}, which the converter writes")
        text, bad = _text(name, data) if data is not None else (None, [])
        problems += found + bad + (check(info, text) if text is not None else [])
    for name in list_files(info):
        try:
            path = trust.resolve(info.path, name, "file", meta)
        except DatasetError as error:
            problems.append(str(error))
            continue
        if not tf.io.gfile.exists(path):
            problems.append(f"{name}: missing ({meta} names it)")
    try:
        entries = tf.io.gfile.listdir(info.path)
    except tf.errors.OpError as error:
        return problems + [f"{info.path}: cannot be listed: {error.message}"]
    published = published_files(info)
    folders = set()
    if not info_lib.is_url(info.path):  # a gs:// listing marks its folders itself
        unknown = set(entries) - set(published)
        folders = {e for e in unknown if tf.io.gfile.isdir(info_lib.join_path(info.path, e))}
    return problems + foreign_problems(entries, published, folders, meta)

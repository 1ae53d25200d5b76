"""What a reader takes from a dataset's metadata, checked where it is used.

A dataset is often something no run of ours wrote (a shared bucket, a
colleague's folder, a download). Every name its metadata gives must resolve
to a regular file inside its folder or ``gs://`` prefix, every number must be
an int in range, its JSON of bounded size and depth, and TFDS's shard
template one of the forms TFDS writes. Anything else is a
:class:`DatasetError`: one line naming the file, the field and the value, and
never whether a path outside the dataset exists, nor another file's content.
``RecordSource``, ``reader.make_dataset``, ``reader.inspect --verify`` and
``--reuse`` all come here (docs/format.md, "What a reader refuses").
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import stat
import string

GCS_SCHEME = "gs://"
# The largest metadata file read (imagerecords.json, TFDS's JSON, labels.txt):
# a dataset of a million images writes a few hundred KB.
MAX_METADATA_BYTES = 64 << 20
# The largest list read whole (rejects.jsonl for the summary): a million
# rejected images write ~150 MB.
MAX_LIST_BYTES = 1 << 30
# JSON nesting deeper than this is refused before any code walks it (the
# format's own files nest four levels).
MAX_JSON_DEPTH = 32
# Every count and size: int64 offsets (``array("q")``) hold it, a sum of shards too.
MAX_NUMBER = 2**62
# A framed TFRecord holds at least its 16 bytes of framing.
MIN_RECORD_BYTES = 16
# The longest ``.idx`` line: two numbers of up to 19 digits, a space, CR LF.
MAX_INDEX_LINE = 42
# A file name taken from metadata (bytes); longer ones are no file of ours.
MAX_NAME = 1024
# The fields TFDS fills in a ``filepathTemplate`` (tensorflow_datasets naming.py).
TEMPLATE_FIELDS = frozenset(
    {"DATASET", "SPLIT", "FILEFORMAT", "SHARD_INDEX", "NUM_SHARDS", "SHARD_X_OF_Y"}
)
MAX_TEMPLATE = 256

_DIGITS = re.compile(rb"[0-9]{1,19}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class DatasetError(ValueError):
    """A dataset that cannot be read as it is: one line naming the file and what is wrong."""


def shown(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: a value of the file's own, in a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_url(path: str) -> bool:
    return "://" in path


def join(base: str, name: str) -> str:
    return posixpath.join(base, name) if is_url(base) else os.path.join(base, name)


def as_int(value, field: str, where: str, low: int = 0, high: int = MAX_NUMBER) -> int:
    """``value`` if it is an int (not a bool, str or float) from ``low`` to ``high``."""
    if type(value) is not int or not low <= value <= high:
        raise DatasetError(
            f"{where}: {field} must be an integer from {low} to {high}, got {shown(value)}"
        )
    return value


def proto_int(value) -> int | None:
    """An int64 of proto3 JSON (a number, or a string of up to 19 digits) in range, or None."""
    if isinstance(value, str) and _DIGITS.fullmatch(value.encode("ascii", "replace")):
        value = int(value)
    if type(value) is int and 0 <= value <= MAX_NUMBER:
        return value
    return None


def index_line(line: bytes) -> tuple[int, int] | None:
    """``(offset, length)`` of one ``.idx`` line ``b"<offset> <length>"``, or None."""
    fields = line.split()
    if len(fields) != 2 or not all(_DIGITS.fullmatch(f) for f in fields):
        return None
    offset, length = int(fields[0]), int(fields[1])
    return (offset, length) if offset <= MAX_NUMBER and length <= MAX_NUMBER else None


def index_limit(records: int | None) -> int:
    """The most bytes a ``.idx`` file of ``records`` lines can hold."""
    return MAX_METADATA_BYTES if records is None else MAX_INDEX_LINE * (records + 1)


def check_depth(value, where: str) -> None:
    """Refuses JSON nested deeper than MAX_JSON_DEPTH (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise DatasetError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        )
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def load_json(data: bytes | str, where: str):
    """The parsed JSON of a metadata file, of bounded depth; DatasetError when it is not JSON."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise DatasetError(f"{where}: not valid JSON (not UTF-8 text)") from None
    try:
        value = json.loads(data)
    except RecursionError:
        raise DatasetError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as error:  # JSONDecodeError, or a number of too many digits
        raise DatasetError(f"{where}: not valid JSON ({str(error)[:100]})") from None
    check_depth(value, where)
    return value


def check_version(info, where: str, supported: tuple[int, ...]) -> int:
    """``format_version`` of a metadata object: an int this reader reads."""
    version = info.get("format_version")
    readable = ", ".join(map(str, supported))
    if type(version) is not int:
        raise DatasetError(
            f"{where}: format_version must be an integer (this imagerecords reads {readable}), "
            f"got {shown(version)}"
        )
    if version not in supported:
        raise DatasetError(
            f"{where}: format_version {version} is not supported (the dataset's format_version "
            f"{version}; this imagerecords reads {readable}): upgrade imagerecords or "
            "re-convert the dataset"
        )
    return version


def check_name(name, field: str, where: str) -> str:
    """``name`` if it can only name a file inside the dataset: relative, no ``..``, no scheme."""
    if not isinstance(name, str) or not name:
        raise DatasetError(f"{where}: {field} must be a file name, got {shown(name)}")
    parts = name.split("/")
    if (
        len(name.encode("utf-8", "replace")) > MAX_NAME
        or _CONTROL.search(name)
        or "\\" in name
        or ":" in parts[0]  # a scheme (gs://, file:) or a drive (C:)
        or any(part in ("", ".", "..") for part in parts)  # also a leading "/"
    ):
        raise DatasetError(
            f"{where}: {field} {shown(name, 200)} is not a file name inside the dataset"
        )
    return name


def resolve(dataset: str, name, field: str, where: str) -> str:
    """The path of file ``name`` of ``dataset``, once it is known to be the dataset's.

    A local name must not lead out of the folder through a link, and what it
    names, when it exists, must be a regular file (no device, FIFO, socket or
    folder). A missing file is the caller's to report. ``gs://`` has no links:
    the name's own form keeps it under the prefix.
    """
    path = join(dataset, check_name(name, field, where))
    if is_url(dataset):
        return path
    base = os.path.realpath(dataset)
    real = os.path.realpath(path)
    if os.path.commonpath([base, real]) != base or real == base:
        # Said the same way whatever lies there: nothing outside is revealed.
        raise DatasetError(f"{where}: {field} {shown(name, 200)} leads outside the dataset")
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return path
    except OSError as error:
        raise DatasetError(
            f"{where}: {field} {shown(name, 200)} cannot be read ({error.strerror})"
        ) from None
    if not stat.S_ISREG(mode):
        raise DatasetError(
            f"{where}: {field} {shown(name, 200)} is {_kind(mode)}, not a regular file"
        )
    return path


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((what for test, what in kinds if test(mode)), "a special file")


def open_regular(path: str, label: str = "") -> int:
    """A read-only descriptor of the local regular file ``path``.

    Opened without blocking (a FIFO put there after :func:`resolve` returns at
    once instead of waiting for a writer), then refused unless regular.

    Raises:
        FileNotFoundError: it is not there.
        DatasetError: it is not a regular file.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DatasetError(f"{label or path}: {_kind(mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_local(path: str, limit: int = MAX_METADATA_BYTES, label: str = "") -> bytes | None:
    """The whole local regular file ``path`` (at most ``limit`` bytes), or None when missing.

    ``label``: the file's name in a message (default: ``path``).
    """
    label = label or path
    try:
        fd = open_regular(path, label)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with os.fdopen(fd, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        if size > limit:
            raise DatasetError(f"{label}: {size:,} bytes, more than the {limit:,} it can hold")
        data = stream.read(limit + 1)
    if len(data) > limit:  # it grew while it was read
        raise DatasetError(f"{label}: more than the {limit:,} bytes it can hold")
    return data


def check_template(template, where: str) -> str:
    """TFDS's ``filepathTemplate``: literal text and TFDS's own fields, bare (no format spec)."""
    if not isinstance(template, str) or len(template) > MAX_TEMPLATE:
        raise DatasetError(f"{where}: filepathTemplate {shown(template)} is not a TFDS template")
    try:
        fields = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError:
        fields = [("", "", None)]  # unbalanced braces
    for name, spec, conversion in fields:
        if name not in TEMPLATE_FIELDS or spec or conversion:
            raise DatasetError(
                f"{where}: filepathTemplate {shown(template)} is not a form TFDS writes "
                f"(only {', '.join('{' + f + '}' for f in sorted(TEMPLATE_FIELDS))})"
            )
    return template


def shard_fields(dataset: str, row, where: str) -> dict:
    """One shard row of imagerecords.json, checked: its names resolved, its numbers in range.

    Returns ``file``, ``path``, ``num_examples``, ``num_bytes`` (None when the
    row does not say), ``sha256`` (None or a string), ``index`` and
    ``index_path`` (None without an ``.idx`` file).
    """
    if not isinstance(row, dict):
        raise DatasetError(f"{where} is not an object")
    path = resolve(dataset, row.get("file"), "file", where)
    index = row.get("index")
    index_path = None if index is None else resolve(dataset, index, "index", where)
    counts = {}
    for field in ("num_examples", "num_bytes"):
        value = row.get(field)
        counts[field] = None if value is None else as_int(value, field, where)
    if (
        None not in counts.values()
        and counts["num_examples"] * MIN_RECORD_BYTES > counts["num_bytes"]
    ):
        raise DatasetError(
            f"{where}: {counts['num_examples']:,} records cannot fit in "
            f"{counts['num_bytes']:,} bytes (each takes at least {MIN_RECORD_BYTES})"
        )
    sha256 = row.get("sha256")
    if sha256 is not None and not isinstance(sha256, str):
        raise DatasetError(f"{where}: sha256 must be a hex string, got {shown(sha256)}")
    return {"file": row["file"], "path": path, **counts, "sha256": sha256} | {
        "index": index,
        "index_path": index_path,
    }

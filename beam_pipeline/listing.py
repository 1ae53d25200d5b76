"""Finds the images: class folders, pre-split layouts and manifests.

Discovery of the *folders* happens when the pipeline is built (a handful of
delimiter listings), so bad input is refused before any work starts and the
class list - hence the class ids - is fixed. Listing the *files* inside each
folder happens in the pipeline, one folder per element, so a million-image
bucket is not listed by one worker (docs/format.md section 2).

Every entry below a local class folder is accounted for: an image to convert,
or a :class:`Skipped` row with the reason (docs/images.md, "What happens to
each kind of entry"). Nothing is opened while listing: the kind of an entry
comes from its directory entry (and a stat for a symbolic link), so a FIFO or
a device can never block a worker.
"""

from __future__ import annotations

import csv
import dataclasses
import errno
import io
import json
import os
import posixpath
import stat
import sys
import unicodedata
from collections.abc import Iterator
from typing import NamedTuple

from beam_pipeline import gcs, keys
from beam_pipeline.errors import UsageError

PRESPLIT_FOLDERS = ("train", "val", "validation", "test")
MANIFEST_SUFFIXES = (".csv", ".jsonl")
# Files that sit next to images in real folders (licences, notes, label lists,
# scraping leftovers) and are clearly not images: skipped and listed, never
# converted, so they cannot be rejections that fail the job (docs/format.md 2).
NOT_IMAGE_SUFFIXES = (
    ".txt",
    ".csv",
    ".json",
    ".jsonl",
    ".md",
    ".html",
    ".htm",
    ".xml",
    ".py",
    ".yaml",
    ".yml",
)
NOT_IN_CLASS_FOLDER = "not inside a class folder"
HIDDEN = "hidden"  # not a skipped.jsonl reason: the job ignores these; the dry run counts them
NOT_TEXT = "name is not valid UTF-8"
IN_NOT_TEXT_FOLDER = "inside a folder whose name is not valid UTF-8"
SYMLINKED_FOLDER = "symbolic link to a folder (not followed)"
BROKEN_SYMLINK = "broken symbolic link (its target does not exist)"
# The flag that turns an unreadable class folder from an error into a skipped row.
SKIP_UNREADABLE_FLAG = "--skip_unreadable_folders"
_PATH_MAX = 4096  # Linux's PATH_MAX, where os.pathconf cannot say


def unreadable_folder_reason(error: OSError) -> str:
    """The skipped row's reason for a folder that could not be listed."""
    return f"folder cannot be read ({_why(error)}): the files in it are unknown"


def path_too_long_reason(limit: int) -> str:
    return f"path longer than the system allows ({limit} bytes)"


def not_regular_reason(mode: int) -> str:
    """Why an entry that is neither a file nor a folder is skipped (never opened)."""
    kinds = (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "folder"),
    )
    kind = next((name for test, name in kinds if test(mode)), "unknown kind")
    return f"not a regular file ({kind})"


def _why(error: OSError) -> str:
    if error.errno == errno.ENAMETOOLONG:
        return "path longer than the system allows"
    return error.strerror or type(error).__name__


def skip_reason(path: str) -> str | None:
    """Why a file in a class folder is skipped instead of converted, or None."""
    suffix = posixpath.splitext(path.replace("\\", "/"))[1].lower()
    if suffix in NOT_IMAGE_SUFFIXES:
        return f"not an image file ({suffix})"
    return None


class Skipped(NamedTuple):
    """A file the job did not try to convert (docs/format.md section 2)."""

    path: str  # full local path or URL
    reason: str


class ImageRef(NamedTuple):
    """One listed input image: the element between listing and conversion."""

    image_id: str  # path relative to the input root, POSIX separators
    path: str  # full local path or URL, for FileSystems.open
    label: int
    split: str


@dataclasses.dataclass(frozen=True)
class ClassFolder:
    """A folder whose files (at any depth) all belong to one class."""

    path: str
    label: int
    split: str | None  # fixed by a pre-split layout, else None (assigned by hash)
    # Why the folder could not be read at discovery (only with --skip_unreadable_folders):
    # listing it then yields just that one Skipped row. A split folder of a pre-split
    # layout that could not be read (its classes unknown) has label -1.
    unreadable: str | None = None


@dataclasses.dataclass(frozen=True)
class Layout:
    """What the launcher found: the classes and where to list images."""

    kind: str  # "classes" | "presplit" | "manifest"
    root: str
    classes: tuple[str, ...]
    folders: tuple[ClassFolder, ...] = ()
    manifest: str | None = None
    num_manifest_rows: int = 0
    # Files outside any class folder (directly under the input, or under a
    # split folder), skipped and listed in skipped.jsonl.
    loose_files: tuple[str, ...] = ()
    # A manifest whose every image path is on this machine (and which is too).
    manifest_all_local: bool = False

    @property
    def sources(self) -> tuple:
        """What listing reads: the manifest's path, or the class folders."""
        return (self.manifest,) if self.kind == "manifest" else self.folders

    def rows(self, source) -> Iterator:
        """``(image_id, path, label, split)`` per image of one source, or Skipped."""
        if self.kind == "manifest":
            label_of = {name: i for i, name in enumerate(self.classes)}
            for row in read_manifest(source, self.root):
                reason = _not_a_file(row.path) if is_local(row.path) else None
                if reason is not None:  # a FIFO would block the worker that opens it
                    yield Skipped(row.path, reason)
                    continue
                yield row.image_id, row.path, label_of[row.label_name], row.split
        else:
            yield from list_folder(source, self.root)

    @property
    def split_names(self) -> tuple[str, ...]:
        """Splits fixed by the layout (pre-split folders), in a stable order."""
        seen: dict[str, None] = {}
        for folder in self.folders:
            if folder.split:
                seen[folder.split] = None
        return tuple(seen)


# ---------------------------------------------------------------- path helpers


def _filesystems():
    """Beam's FileSystems, imported on first use: local discovery needs no Beam,
    so the CLI can validate a local input and start converting before Beam loads."""
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def is_gcs(path: str) -> bool:
    return path.startswith("gs://")


def is_local(path: str) -> bool:
    return "://" not in path


def join(base: str, *parts: str) -> str:
    if is_local(base):
        return os.path.join(base, *parts)
    return posixpath.join(base, *parts)


def normalize_root(path: str) -> str:
    """Absolute local path or URL, without a trailing separator."""
    if is_local(path):
        return os.path.abspath(os.path.expanduser(path))
    return path.rstrip("/")


def relative_id(root: str, path: str) -> str:
    """The image ID: ``path`` relative to ``root`` with POSIX separators."""
    rel = path[len(root) :].lstrip("/\\")
    return rel.replace(os.sep, "/") if is_local(root) else rel


def is_hidden(relative_path: str) -> bool:
    return any(part.startswith(".") for part in relative_path.replace("\\", "/").split("/"))


def is_text(name: str) -> bool:
    """False for a name that is not valid UTF-8: Python gives such bytes of a file
    name as lone surrogates, which no UTF-8 file (labels.txt, JSON lines) can hold."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def as_text(name: str) -> str:
    """``name`` with each byte that is not UTF-8 written as ``\\xNN`` (valid names unchanged)."""
    if is_text(name):
        return name
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that came from text, not from a file name
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def shown(name: str) -> str:
    """``name`` quoted for a one-line message: bad bytes as ``\\xNN``, unprintable
    characters (line breaks, controls, invisible format characters) escaped."""
    text = "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in as_text(name)
    )
    return f"'{text}'"


def _not_a_file(path: str) -> str | None:
    """Why a local path that exists is not a file to open, without opening it; None
    for a regular file (or a symbolic link to one) and for a path that cannot be
    stat'ed (the conversion then rejects it with the error)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else not_regular_reason(mode)


def _escape_glob(path: str) -> str:
    """A pattern matching at least ``path``: wildcard characters become ``?``.

    FileSystems.match treats * ? [ as wildcards and has no escape that works
    everywhere ("[[]" makes Python's re warn), so callers filter the matches by
    the literal prefix.
    """
    return "".join("?" if c in "*?[" else c for c in path)


# ----------------------------------------------------- discovery (launch time)


def list_subfolders(path: str) -> list[str]:
    """Immediate, non-hidden sub-folder names of ``path``, sorted."""
    return list_level(path)[0]


def list_level(path: str) -> tuple[list[str], list[str]]:
    """``(sub-folder names, full paths of files)`` directly in ``path``, non-hidden, sorted."""
    if is_gcs(path):
        folders, files = gcs.list_level(path)
        names = [posixpath.basename(p) for p in folders]
    elif is_local(path):
        with os.scandir(path) as entries:
            entries = list(entries)
        names = [e.name for e in entries if e.is_dir()]
        files = [e.path for e in entries if not e.is_dir()]
    else:
        # Any other Beam filesystem: derive the first level from a full match.
        root = path.rstrip("/") + "/"
        names, files = set(), []
        for metadata in _filesystems().match([_escape_glob(root) + "**"])[0].metadata_list:
            rel = metadata.path[len(root) :]
            if metadata.path.startswith(root) and "/" in rel:
                names.add(rel.split("/", 1)[0])
            elif metadata.path.startswith(root) and rel:
                files.append(metadata.path)
        names = list(names)
    visible = sorted(f for f in files if not posixpath.basename(f).startswith("."))
    return sorted(n for n in names if n and not n.startswith(".")), visible


def _has_any_file(path: str) -> bool:
    """True if some file that is not skipped lies anywhere below a local folder."""
    return any(
        not isinstance(row, Skipped) and skip_reason(row[0]) is None
        for row in _walk_class_folder(path)
    )


_CLASS_NAME_RULE = (
    "a class name must be non-blank UTF-8 text with no line break, control character or "
    "white space at either end (labels.txt has one class per line, read back with "
    "splitlines() and often strip())"
)


def class_name_problem(name: str) -> str | None:
    """What keeps ``name`` from being line i of labels.txt and read back whole, or None."""
    if not is_text(name):
        return "is not valid UTF-8"
    if not name.strip():
        return "is blank"
    if name.splitlines() != [name]:  # \n \r \v \f \x1c-\x1e \x85 \u2028 \u2029
        return "holds a line break"
    if name != name.strip():
        return "begins or ends with white space"
    for c in name:
        # Cc: the C0 and C1 controls; U+FEFF: a byte-order mark, which a reader that
        # opens labels.txt as utf-8-sig drops from the first class.
        if unicodedata.category(c) == "Cc" or c == "\ufeff":
            return f"holds the control character {shown(c)}"
    return None


def check_class_name(name: str, where: str) -> None:
    """Refuses a class name that labels.txt ("line i = class i") could not hold.

    Raises:
        UsageError: naming the class escaped (bad bytes as ``\\xNN``, controls as
            Python writes them) and what is wrong with it.
    """
    problem = class_name_problem(name)
    if problem is not None:
        raise UsageError(f"{where} {shown(name)} {problem}: {_CLASS_NAME_RULE}; rename it")


def _readable(folder: ClassFolder, skip_unreadable: bool, what: str) -> ClassFolder:
    """``folder``, or (with --skip_unreadable_folders) the same marked unreadable.

    Raises:
        UsageError: the folder cannot be listed, and the flag was not given.
    """
    try:
        os.scandir(folder.path).close()
    except OSError as error:
        return _unreadable(folder, error, skip_unreadable, what)
    return folder


def _unreadable(folder: ClassFolder, error: OSError, skip_unreadable: bool, what: str):
    if not skip_unreadable:
        raise UsageError(
            f"--input: cannot read the {what} {shown(folder.path)} ({_why(error)}); fix its "
            f"permissions, or pass {SKIP_UNREADABLE_FLAG} to convert the rest and list it "
            "in skipped.jsonl"
        ) from None
    return dataclasses.replace(folder, unreadable=unreadable_folder_reason(error))


def sort_class_names(names) -> list[str]:
    """Sorted class names; numerically when every name is an integer (so "10" > "9")."""
    names = set(names)
    if names and all(n.isdigit() for n in names):
        return sorted(names, key=lambda n: (int(n), n))
    return sorted(names)


def discover(
    input_path: str | None, manifest: str | None = None, skip_unreadable_folders: bool = False
) -> Layout:
    """Inspects the input and returns its :class:`Layout`.

    Args:
        skip_unreadable_folders: a local class folder (or split folder) that
            cannot be read becomes one skipped row instead of an error.

    Raises:
        UsageError: the input is missing, empty or not laid out as expected, a
            class name cannot be written to labels.txt, or a class folder cannot be read.
    """
    if manifest:
        return _discover_manifest(manifest, input_path)
    if not input_path:
        raise UsageError("--input is required (or --manifest)")
    root = normalize_root(input_path)
    if is_local(root):
        if not os.path.exists(root):
            raise UsageError(f"--input: {input_path} does not exist")
        if not os.path.isdir(root):
            raise UsageError(f"--input: {input_path} is not a folder")
    elif is_gcs(root):
        gcs.check_input(root)
    try:
        top, loose = list_level(root)
    except OSError as error:
        raise UsageError(f"--input: cannot read {shown(input_path)} ({_why(error)})") from None
    if not top:
        found = f" (its {len(loose)} files must be inside class folders)" if loose else ""
        raise UsageError(
            f"--input: no class folders in {input_path}{found}; "
            f"expected {input_path}/<class_name>/<images>"
        )
    unread: list[ClassFolder] = []  # split folders that could not be read (with the flag)
    if set(top) <= set(PRESPLIT_FOLDERS) and "train" in top and len(top) >= 2:
        folders = []
        class_names: set[str] = set()
        per_split = {}
        for split in top:
            try:
                per_split[split], files = list_level(join(root, split))
            except OSError as error:
                folder = ClassFolder(join(root, split), -1, split)
                unread.append(_unreadable(folder, error, skip_unreadable_folders, "split folder"))
                continue
            loose += files
        for split, names in per_split.items():
            for name in names:
                check_class_name(name, f"--input: class folder {split}/")
            class_names.update(names)
        classes = sort_class_names(class_names)
        ids = {name: i for i, name in enumerate(classes)}
        for split, names in per_split.items():
            folders += [ClassFolder(join(root, split, n), ids[n], split) for n in names]
        kind = "presplit"
    else:
        for name in top:
            check_class_name(name, "--input: class folder")
        classes = sort_class_names(top)
        folders = [ClassFolder(join(root, name), i, None) for i, name in enumerate(classes)]
        kind = "classes"
    if not classes:
        raise UsageError(f"--input: {input_path} has split folders but no class folders in them")
    if is_local(root):
        folders = [_readable(f, skip_unreadable_folders, "class folder") for f in folders]
        if not any(_has_any_file(f.path) for f in folders if not f.unreadable):
            raise UsageError(f"--input: no image files found under {input_path}")
    return Layout(
        kind=kind,
        root=root,
        classes=tuple(classes),
        folders=tuple(folders + unread),
        loose_files=tuple(sorted(as_text(path) for path in loose)),
    )


# ------------------------------------------------------------------- manifests


class ManifestRow(NamedTuple):
    image_id: str
    path: str
    label_name: str
    split: str | None


def _open_text(path: str):
    if is_local(path):  # no Beam: a local manifest can run on the local engine
        return open(path, encoding="utf-8-sig", newline="")
    from apache_beam.io.filesystem import CompressionTypes

    raw = _filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


def read_manifest(manifest: str, input_root: str | None = None) -> Iterator[ManifestRow]:
    """Rows of a ``path,label[,split]`` CSV or JSONL manifest.

    Relative paths are relative to ``input_root`` (``--input``) when given,
    else to the manifest's folder; their IDs are the relative paths as written
    (normalised). Absolute paths get IDs relative to ``input_root`` when they
    lie under it, else the path itself.

    Raises:
        UsageError: a malformed row, naming its line.
    """
    root = normalize_root(input_root) if input_root else None
    base = root or _manifest_folder(manifest)
    with _open_text(manifest) as stream:
        if manifest.endswith(".jsonl"):
            rows = _jsonl_rows(stream, manifest)
        else:
            rows = _csv_rows(stream, manifest)
        for line, path, label, split in rows:
            if not path or not label:
                raise UsageError(f"--manifest {manifest}:{line}: needs a path and a label")
            if not is_text(path):  # a JSON "\udcff" escape: no file has that name
                raise UsageError(
                    f"--manifest {manifest}:{line}: the path {shown(path)} is not valid UTF-8"
                )
            if split and not keys.is_valid_split_name(split):
                raise UsageError(f"--manifest {manifest}:{line}: bad split name {split!r}")
            if is_local(path) and not os.path.isabs(path):
                full = normalize_root(join(base, path))
                image_id = posixpath.normpath(path.replace("\\", "/"))
            else:
                full = path
                image_id = relative_id(root, path) if root and path.startswith(root + "/") else path
            yield ManifestRow(image_id, full, label, split or None)


def _manifest_folder(manifest: str) -> str:
    if is_local(manifest):
        return normalize_root(os.path.dirname(os.path.abspath(manifest)))
    return normalize_root(posixpath.dirname(manifest))


def _csv_rows(stream, name):
    reader = csv.reader(stream)
    for number, row in enumerate(reader, start=1):
        if not row or all(not cell.strip() for cell in row):
            continue
        cells = [cell.strip() for cell in row]
        if number == 1 and cells[0].lower() == "path":
            continue  # header
        if len(cells) not in (2, 3):
            raise UsageError(f"--manifest {name}:{number}: expected path,label[,split], got {row}")
        yield number, cells[0], cells[1], cells[2] if len(cells) == 3 else None


def _jsonl_rows(stream, name):
    for number, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as error:
            raise UsageError(f"--manifest {name}:{number}: not JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise UsageError(f"--manifest {name}:{number}: expected an object")
        label, split = row.get("label"), row.get("split")
        if split is not None and not isinstance(split, str):
            raise UsageError(
                f"--manifest {name}:{number}: split must be a string, got {json.dumps(split)}"
            )
        yield (
            number,
            str(row.get("path") or ""),
            "" if label is None else str(label),
            split,
        )


def _discover_manifest(manifest: str, input_path: str | None) -> Layout:
    if is_local(manifest) and not os.path.isfile(manifest):
        raise UsageError(f"--manifest: {manifest} does not exist")
    if not manifest.endswith(MANIFEST_SUFFIXES):
        raise UsageError(f"--manifest must end in .csv or .jsonl, got {manifest}")
    if is_gcs(manifest):
        gcs.check_input(manifest)  # one clear line for missing bucket, 403, no credentials
    elif not is_local(manifest) and not _filesystems().exists(manifest):
        raise UsageError(f"--manifest: {manifest} does not exist")
    if input_path and is_local(input_path) and not os.path.isdir(input_path):
        raise UsageError(
            f"--input {input_path} (the folder the manifest's relative paths start from) "
            "is not a folder"
        )
    # The pipeline reads the manifest with this same root (ListImages), so the
    # IDs checked for duplicates here are the IDs the records get.
    root = normalize_root(input_path) if input_path else _manifest_folder(manifest)
    labels: set[str] = set()
    seen: set[str] = set()
    duplicates: list[str] = []
    count = 0
    all_local = is_local(manifest)
    for row in read_manifest(manifest, root):
        all_local = all_local and is_local(row.path)
        if row.label_name not in labels:
            check_class_name(row.label_name, f"--manifest {manifest}: label")
        labels.add(row.label_name)
        if row.image_id in seen:
            duplicates.append(row.image_id)
        seen.add(row.image_id)
        count += 1
    if duplicates:
        shown = ", ".join(duplicates[:5])
        raise UsageError(f"--manifest: {len(duplicates)} paths appear more than once: {shown}")
    if not count:
        raise UsageError(f"--manifest: {manifest} lists no images")
    return Layout(
        kind="manifest",
        root=root,
        classes=tuple(sort_class_names(labels)),
        manifest=manifest,
        num_manifest_rows=count,
        manifest_all_local=all_local,
    )


# ------------------------------------------------- listing (inside the pipeline)


def files_under(folder: str) -> list[str]:
    """The path of every file below ``folder`` (any depth), on any Beam filesystem.

    Matches by the literal folder path, whatever characters it holds.
    """
    return [path for path, _ in sized_files_under(folder)]


def sized_files_under(folder: str) -> list[tuple[str, int | None]]:
    """``(path, size in bytes)`` of every file below ``folder``, as :func:`files_under`.

    For the output folder and remote inputs. A local folder is walked without
    Beam the way Beam's LocalFileSystem lists one (``os.walk``, symlinked
    folders not followed, files that vanish or cannot be stat'ed left out);
    a local *input* folder is listed by :func:`entries_under`, which leaves
    nothing out.
    """
    prefix = folder.rstrip("/")
    if is_local(prefix):
        return list(_walk_local(prefix))
    found = _filesystems().match([_escape_glob(prefix) + "/**"])[0].metadata_list
    # Drop siblings that the escaped pattern also matched ("a?1" for "a[1").
    return [(m.path, m.size_in_bytes) for m in found if m.path.startswith(prefix + "/")]


def _walk_local(prefix: str) -> Iterator[tuple[str, int]]:
    for dirpath, _, filenames in os.walk(prefix):
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                size = os.stat(path).st_size
            except OSError:  # vanished, or a broken symlink: Beam's listing drops these too
                continue
            yield path, size


Entry = tuple[str, "int | None"]  # (path, size in bytes or None) of a file to convert


def entries_under(
    folder: str, sizes: bool = False, hidden: bool = False
) -> Iterator[Entry | Skipped]:
    """Every entry below a class folder (any depth, any filesystem): ``(path, size)``
    for a file to convert, else a :class:`Skipped` row with the reason.

    Sizes are given for remote files, and for local ones only with ``sizes`` (a
    stat per file). Hidden files and folders are left out; with ``hidden``, each
    is a ``HIDDEN`` row instead (the dry run counts them).
    """
    prefix = folder.rstrip("/")
    if is_local(prefix):
        yield from _walk_class_folder(prefix, sizes, hidden)
        return
    for path, size in sized_files_under(prefix):
        if path.endswith("/"):
            continue  # a GCS "folder placeholder" object, not a file
        if is_hidden(path[len(prefix) :]):
            if hidden:
                yield Skipped(path, HIDDEN)
            continue
        yield path, size


def _walk_class_folder(
    top: str, sizes: bool = False, hidden: bool = False
) -> Iterator[Entry | Skipped]:
    """:func:`entries_under` for a local folder. Opens no file: a regular file is
    known from its directory entry (no stat, unless ``sizes``), anything else is
    stat'ed at most, so a FIFO or a device cannot block the listing or a worker."""
    limit = _path_max(top)
    pending = [(top, True)]  # (folder, whether its path below ``top`` is valid UTF-8)
    while pending:
        folder, text = pending.pop()
        try:
            with os.scandir(folder) as found:
                entries = list(found)
        except OSError as error:
            yield Skipped(as_text(folder), unreadable_folder_reason(error))
            continue
        for entry in entries:
            path = entry.path
            if entry.name.startswith("."):
                if hidden:
                    yield Skipped(as_text(path), HIDDEN)
                continue
            own = is_text(entry.name)
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append((path, text and own))
                elif not (text and own):  # its ID could not be hashed, written or read back
                    yield Skipped(as_text(path), NOT_TEXT if text else IN_NOT_TEXT_FOLDER)
                elif len(path) * 4 >= limit and len(os.fsencode(path)) >= limit:
                    yield Skipped(as_text(path), path_too_long_reason(limit))  # open() would fail
                elif entry.is_file(follow_symlinks=False):
                    yield path, entry.stat(follow_symlinks=False).st_size if sizes else None
                else:
                    yield _odd_entry(entry, sizes)
            except OSError as error:  # gone since the folder was read, or cannot be stat'ed
                yield Skipped(as_text(path), f"cannot be read ({_why(error)})")


def _odd_entry(entry: os.DirEntry, sizes: bool) -> Entry | Skipped:
    """A symbolic link (a file to convert when it points to a regular file,
    wherever that is), or an entry that is not a regular file at all."""
    path, where = entry.path, as_text(entry.path)
    if not entry.is_symlink():
        return Skipped(where, not_regular_reason(entry.stat(follow_symlinks=False).st_mode))
    try:
        target = os.stat(path)
    except OSError as error:
        if error.errno == errno.ENOENT:
            return Skipped(where, BROKEN_SYMLINK)
        return Skipped(where, f"symbolic link cannot be followed ({_why(error)})")
    if stat.S_ISREG(target.st_mode):
        return path, target.st_size if sizes else None
    if stat.S_ISDIR(target.st_mode):
        return Skipped(where, SYMLINKED_FOLDER)
    return Skipped(where, not_regular_reason(target.st_mode))


def _path_max(folder: str) -> int:
    """The longest path (in bytes, with its terminating NUL) the system opens."""
    try:
        limit = os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError):
        return _PATH_MAX
    return limit if limit > 0 else sys.maxsize


def list_folder(
    folder: ClassFolder, root: str
) -> Iterator[tuple[str, str, int, str | None] | Skipped]:
    """Every entry below a class folder: ``(image_id, path, label, split)`` per file
    to convert, or :class:`Skipped` for anything else (:func:`entries_under`) and
    for a file that is clearly not an image (``skip_reason``)."""
    for row in sized_folder_rows(folder, root):
        yield row if isinstance(row, Skipped) else row[:4]


def sized_folder_rows(
    folder: ClassFolder, root: str, sizes: bool = False, hidden: bool = False
) -> Iterator[tuple[str, str, int, str | None, int | None] | Skipped]:
    """:func:`list_folder` with each file's size last (see :func:`entries_under`
    for ``sizes`` and ``hidden``): the dry run's census lists with this."""
    if folder.unreadable:
        yield Skipped(as_text(folder.path), folder.unreadable)
        return
    for row in entries_under(folder.path, sizes, hidden):
        if isinstance(row, Skipped):
            yield row
            continue
        path, size = row
        reason = skip_reason(path)
        if reason is not None:
            yield Skipped(as_text(path), reason)
            continue
        yield relative_id(root, path), path, folder.label, folder.split, size


def local_files(layout: Layout, limit: int, max_bytes: int) -> list[str]:
    """Files the pipeline will list, found without Beam, up to ``limit``
    files or ``max_bytes`` of source data, whichever comes first.

    Used only to start converting while Beam loads: a file listed here that
    the pipeline does not list costs a wasted conversion, never a wrong record.
    The byte bound keeps the results waiting for the pipeline small even for
    ``--resize none`` on large photos.
    """
    return [path for path, _ in _local_files(layout, limit, max_bytes)]


def local_refs(
    layout: Layout, limit: int, max_bytes: int, seed: int, splits: dict[str, float]
) -> list[ImageRef]:
    """:func:`local_files` as the ImageRefs the pipeline will list for them."""
    return [
        ImageRef(
            relative_id(layout.root, path),
            path,
            folder.label,
            folder.split or keys.assign_split(seed, relative_id(layout.root, path), splits),
        )
        for path, folder in _local_files(layout, limit, max_bytes)
    ]


def _local_files(layout: Layout, limit: int, max_bytes: int) -> list[tuple[str, ClassFolder]]:
    # The same walk as the pipeline's listing: the workers converting ahead open
    # these files, so a FIFO must not be among them.
    found: list[tuple[str, ClassFolder]] = []
    total = 0
    for folder in layout.folders:
        if folder.unreadable:
            continue
        for row in _walk_class_folder(folder.path, sizes=True):
            if isinstance(row, Skipped) or skip_reason(row[0]) is not None:
                continue
            path, size = row
            total += size or 0
            if total > max_bytes or len(found) >= limit:
                return found
            found.append((path, folder))
    return found


def estimate_image_count(layout: Layout) -> int:
    """About how many images listing will yield: for a progress total, not for the books.

    A plain walk, about 1 µs a file against listing's 13 µs (no stat, no
    per-file checks beyond the name), so that a total is known long before
    the listing, which runs only as fast as conversion pulls it, is done.
    Files that listing skips for what a stat shows (not regular, unreadable)
    are counted; the progress total is set to the exact count at the end.
    """
    if layout.kind == "manifest":
        return layout.num_manifest_rows
    if not is_local(layout.root):
        return 0
    count = 0
    for folder in layout.folders:
        for _, dirnames, filenames in os.walk(folder.path):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            count += sum(
                1 for name in filenames if not name.startswith(".") and skip_reason(name) is None
            )
    return count

"""Lists the files of one class folder (or one manifest), inside the job.

Every entry is an image or a :class:`Skipped` row (docs/images.md); nothing is opened
while listing, so a FIFO or a device never blocks a worker.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import posixpath
import stat
import sys
from collections.abc import Iterator
from typing import NamedTuple

from beam_pipeline.storage.paths import (
    as_text,
    filesystems,
    is_hidden,
    is_local,
    is_text,
    relative_id,
)

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
_PATH_MAX = 4096  # Linux's PATH_MAX, where os.pathconf cannot say


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


def unreadable_folder_reason(error: OSError) -> str:
    """The skipped row's reason for a folder that could not be listed."""
    return f"folder cannot be read ({why(error)}): the files in it are unknown"


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


def why(error: OSError) -> str:
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


def not_a_file(path: str) -> str | None:
    """Why a local path that exists is not a file to open, without opening it; None
    for a regular file (or a symbolic link to one) and for a path that cannot be
    stat'ed (the conversion then rejects it with the error)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else not_regular_reason(mode)


def escape_glob(path: str) -> str:
    """A pattern matching at least ``path``: wildcard characters become ``?``.

    FileSystems.match treats * ? [ as wildcards and has no escape that works
    everywhere ("[[]" makes Python's re warn), so callers filter the matches by
    the literal prefix.
    """
    return "".join("?" if c in "*?[" else c for c in path)


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
    found = filesystems().match([escape_glob(prefix) + "/**"])[0].metadata_list
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
        yield from walk_class_folder(prefix, sizes, hidden)
        return
    for path, size in sized_files_under(prefix):
        if path.endswith("/"):
            continue  # a GCS "folder placeholder" object, not a file
        if is_hidden(path[len(prefix) :]):
            if hidden:
                yield Skipped(path, HIDDEN)
            continue
        yield path, size


def walk_class_folder(
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
                yield Skipped(as_text(path), f"cannot be read ({why(error)})")


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
        return Skipped(where, f"symbolic link cannot be followed ({why(error)})")
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

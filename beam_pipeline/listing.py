"""Finds the images: class folders, pre-split layouts and manifests.

Discovery of the *folders* happens when the pipeline is built (a handful of
delimiter listings), so bad input is refused before any work starts and the
class list - hence the class ids - is fixed. Listing the *files* inside each
folder happens in the pipeline, one folder per element, so a million-image
bucket is not listed by one worker (docs/format.md section 2).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import posixpath
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


def _visible_local_files(path: str) -> Iterator[str]:
    """Non-hidden files below a local folder, in sorted walk order (no Beam)."""
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith("."):
                yield os.path.join(dirpath, name)


def _has_any_file(path: str) -> bool:
    """True if some non-hidden file that is not skipped lies anywhere below a local folder."""
    return any(skip_reason(f) is None for f in _visible_local_files(path))


def check_class_name(name: str, where: str) -> None:
    """Refuses a class name that labels.txt ("line i = class i") could not hold.

    Raises:
        UsageError: the name is empty or holds a newline or another control
            character, naming it as Python would write it.
    """
    if not name.strip() or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise UsageError(
            f"{where} {name!r}: a class name must be non-blank and hold no newline or other "
            "control character (labels.txt has one class per line); rename it"
        )


def sort_class_names(names) -> list[str]:
    """Sorted class names; numerically when every name is an integer (so "10" > "9")."""
    names = set(names)
    if names and all(n.isdigit() for n in names):
        return sorted(names, key=lambda n: (int(n), n))
    return sorted(names)


def discover(input_path: str | None, manifest: str | None = None) -> Layout:
    """Inspects the input and returns its :class:`Layout`.

    Raises:
        UsageError: the input is missing, empty or not laid out as expected.
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
    top, loose = list_level(root)
    if not top:
        found = f" (its {len(loose)} files must be inside class folders)" if loose else ""
        raise UsageError(
            f"--input: no class folders in {input_path}{found}; "
            f"expected {input_path}/<class_name>/<images>"
        )
    if set(top) <= set(PRESPLIT_FOLDERS) and "train" in top and len(top) >= 2:
        folders = []
        class_names: set[str] = set()
        per_split = {}
        for split in top:
            per_split[split], files = list_level(join(root, split))
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
    if is_local(root) and not any(_has_any_file(f.path) for f in folders):
        raise UsageError(f"--input: no image files found under {input_path}")
    return Layout(
        kind=kind,
        root=root,
        classes=tuple(classes),
        folders=tuple(folders),
        loose_files=tuple(sorted(loose)),
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

    A local folder is walked without Beam, the way Beam's LocalFileSystem
    lists one (``os.walk``, symlinked folders not followed, files that vanish
    or cannot be stat'ed left out), so that both engines list the same files.
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


def list_folder(
    folder: ClassFolder, root: str
) -> Iterator[tuple[str, str, int, str | None] | Skipped]:
    """Every non-hidden file below a class folder: ``(image_id, path, label, split)``,
    or :class:`Skipped` for a file that is clearly not an image (``skip_reason``)."""
    prefix = folder.path.rstrip("/")
    for path in files_under(prefix):
        if path.endswith("/"):
            continue  # a GCS "folder placeholder" object, not a file
        if is_hidden(path[len(prefix) :]):
            continue
        reason = skip_reason(path)
        if reason is not None:
            yield Skipped(path, reason)
            continue
        yield relative_id(root, path), path, folder.label, folder.split


def local_files(layout: Layout, limit: int, max_bytes: int) -> list[str]:
    """Files the pipeline will list, found with os.walk (no Beam), up to ``limit``
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
    found: list[tuple[str, ClassFolder]] = []
    total = 0
    for folder in layout.folders:
        for path in _visible_local_files(folder.path):
            if skip_reason(path) is not None:
                continue
            try:
                total += os.path.getsize(path)
            except OSError:
                continue  # vanished or unreadable: the pipeline will say so
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

"""Discovery, at launch: the classes, their folders, and what a manifest lists.

Found when the job is built, so bad input is refused before work starts and the class
ids are fixed; the files inside are ``listing.py``'s, one folder per element.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import unicodedata
from collections.abc import Iterator

from beam_pipeline.core import groups, keys
from beam_pipeline.core.elements import ImageRef
from beam_pipeline.core.errors import UsageError
from beam_pipeline.storage import gcs
from beam_pipeline.storage.listing import (
    ClassFolder,
    Skipped,
    escape_glob,
    list_folder,
    not_a_file,
    skip_reason,
    unreadable_folder_reason,
    walk_class_folder,
    why,
)
from beam_pipeline.storage.manifest import manifest_folder, read_manifest
from beam_pipeline.storage.paths import (
    Place,
    as_text,
    filesystems,
    is_gcs,
    is_local,
    is_text,
    join,
    relative_id,
    shown,
)

PRESPLIT_FOLDERS = ("train", "val", "validation", "test")
MANIFEST_SUFFIXES = (".csv", ".jsonl")
# The flag that turns an unreadable class folder from an error into a skipped row.
SKIP_UNREADABLE_FLAG = "--skip_unreadable_folders"


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
        """``(image_id, path, label, split, group)`` per image of one source, or Skipped.

        ``split`` and ``group`` are what the layout says (a pre-split folder, a
        manifest's columns), else None."""
        if self.kind == "manifest":
            label_of = {name: i for i, name in enumerate(self.classes)}
            for row in read_manifest(source, self.root):
                reason = not_a_file(row.path) if is_local(row.path) else None
                if reason is not None:  # a FIFO would block the worker that opens it
                    yield Skipped(row.path, reason)
                    continue
                yield row.image_id, row.path, label_of[row.label_name], row.split, row.group
        else:
            for row in list_folder(source, self.root):
                yield row if isinstance(row, Skipped) else (*row, None)

    @property
    def split_names(self) -> tuple[str, ...]:
        """Splits fixed by the layout (pre-split folders), in a stable order."""
        seen: dict[str, None] = {}
        for folder in self.folders:
            if folder.split:
                seen[folder.split] = None
        return tuple(seen)


# ----------------------------------------------------- discovery (launch time)


def list_level(path: str) -> tuple[list[str], list[str]]:
    """``(sub-folder names, full paths of files)`` directly in ``path``, non-hidden, sorted."""
    if is_gcs(path):
        folders, files = gcs.list_level(path)
        names = [posixpath.basename(p) for p in folders]
    elif is_local(path):
        with os.scandir(path) as entries:
            entries = list(entries)
        names = [e.name for e in entries if _is_local_folder(e)]
        files = [e.path for e in entries if not _is_local_folder(e)]
    else:
        # Any other Beam filesystem: derive the first level from a full match.
        root = path.rstrip("/") + "/"
        names, files = set(), []
        for metadata in filesystems().match([escape_glob(root) + "**"])[0].metadata_list:
            rel = metadata.path[len(root) :]
            if metadata.path.startswith(root) and "/" in rel:
                names.add(rel.split("/", 1)[0])
            elif metadata.path.startswith(root) and rel:
                files.append(metadata.path)
        names = list(names)
    visible = sorted(f for f in files if not posixpath.basename(f).startswith("."))
    return sorted(n for n in names if n and not n.startswith(".")), visible


def _is_local_folder(entry: os.DirEntry) -> bool:
    """Whether a listed entry is a folder (a link to one counts).

    A link that cannot be followed (a loop, a link to itself: ELOOP) is no
    folder; it is listed with the files, so one stray link outside the class
    folders is a skipped row, not the end of the job.
    """
    try:
        return entry.is_dir()
    except OSError:
        return False


def _has_any_file(path: str) -> bool:
    """True if some file that is not skipped lies anywhere below a local folder."""
    return any(
        not isinstance(row, Skipped) and skip_reason(row[0]) is None
        for row in walk_class_folder(path)
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
            f"--input: cannot read the {what} {shown(folder.path)} ({why(error)}); fix its "
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
    input_path: Place | None, manifest: Place | None = None, skip_unreadable_folders: bool = False
) -> Layout:
    """Inspects the input and returns its :class:`Layout`.

    ``input_path`` and ``manifest``: places (``paths.place``, where the flags
    entered), used as they are.

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
    root = input_path
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
        raise UsageError(f"--input: cannot read {shown(input_path)} ({why(error)})") from None
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


def _discover_manifest(manifest: str, input_path: str | None) -> Layout:
    if is_local(manifest) and not os.path.isfile(manifest):
        raise UsageError(f"--manifest: {manifest} does not exist")
    if not manifest.endswith(MANIFEST_SUFFIXES):
        raise UsageError(f"--manifest must end in .csv or .jsonl, got {manifest}")
    if is_gcs(manifest):
        gcs.check_input(manifest)  # one clear line for missing bucket, 403, no credentials
    elif not is_local(manifest) and not filesystems().exists(manifest):
        raise UsageError(f"--manifest: {manifest} does not exist")
    if input_path and is_local(input_path) and not os.path.isdir(input_path):
        raise UsageError(
            f"--input {input_path} (the folder the manifest's relative paths start from) "
            "is not a folder"
        )
    # The pipeline reads the manifest with this same root (ListImages), so the
    # IDs checked for duplicates here are the IDs the records get.
    root = input_path or manifest_folder(manifest)
    labels: set[str] = set()
    splits: set[str] = set()
    seen: set[str] = set()
    duplicates: list[str] = []
    count = 0
    all_local = is_local(manifest)
    for row in read_manifest(manifest, root):
        all_local = all_local and is_local(row.path)
        if row.label_name not in labels:
            check_class_name(row.label_name, f"--manifest {manifest}: label")
        labels.add(row.label_name)
        if row.split and row.split not in splits:
            clash = keys.case_clash(splits, row.split)
            if clash is not None:
                raise UsageError(f"--manifest {manifest}: {clash}; rename one")
            splits.add(row.split)
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


# ------------------------------------------- what the launcher reads ahead


def local_refs(
    layout: Layout,
    limit: int,
    max_bytes: int,
    seed: int,
    splits: dict[str, float],
    group_by: str | None = None,
) -> list[ImageRef]:
    """The ImageRefs the pipeline will list first, found without Beam, up to
    ``limit`` images or ``max_bytes`` of source data, whichever comes first.

    Used only to start converting while Beam loads: a file listed here that
    the pipeline does not list costs a wasted conversion, never a wrong record.
    The byte bound keeps the results waiting for the pipeline small even for
    ``--resize none`` on large photos.
    """
    refs = []
    for path, folder in _local_files(layout, limit, max_bytes):
        image_id = relative_id(layout.root, path)
        group = groups.group_of(group_by, image_id)
        split = folder.split or groups.split_of(seed, image_id, group, splits)
        refs.append(ImageRef(image_id, path, folder.label, split))
    return refs


def _local_files(layout: Layout, limit: int, max_bytes: int) -> list[tuple[str, ClassFolder]]:
    # The same walk as the pipeline's listing: the workers converting ahead open
    # these files, so a FIFO must not be among them.
    found: list[tuple[str, ClassFolder]] = []
    total = 0
    for folder in layout.folders:
        if folder.unreadable:
            continue
        for row in walk_class_folder(folder.path, sizes=True):
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

    A plain walk, an order of magnitude cheaper a file than listing (no stat,
    no per-file checks beyond the name; docs/performance.md), so that a total is known long before
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

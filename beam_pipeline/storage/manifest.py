"""Manifests: a ``path,label[,split[,group]]`` CSV or JSONL file instead of class folders.

Read twice with the same root: at discovery (to check every row and fix the
class list) and by the listing step, so the IDs checked for duplicates are
the IDs the records get.
"""

from __future__ import annotations

import csv
import io
import json
import os
import posixpath
from collections.abc import Iterator
from typing import NamedTuple

from beam_pipeline.core import keys
from beam_pipeline.core.errors import UsageError
from beam_pipeline.storage.paths import (
    Place,
    filesystems,
    is_local,
    is_text,
    join,
    normalize_root,
    relative_id,
    shown,
)


class ManifestRow(NamedTuple):
    image_id: str
    path: str
    label_name: str
    split: str | None
    group: str | None  # names the image's group (core/groups.py), like --group_by


def _open_text(path: str):
    if is_local(path):  # no Beam: a local manifest can run on the local engine
        return open(path, encoding="utf-8-sig", newline="")
    from apache_beam.io.filesystem import CompressionTypes

    raw = filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


def read_manifest(manifest: Place, input_root: Place | None = None) -> Iterator[ManifestRow]:
    """Rows of a ``path,label[,split[,group]]`` CSV or JSONL manifest.

    Relative paths are relative to ``input_root`` (``--input``) when given,
    else to the manifest's folder; their IDs are the relative paths as written
    (normalised). Absolute paths get IDs relative to ``input_root`` when they
    lie under it, else the path itself.

    Raises:
        UsageError: a malformed row, naming its line.
    """
    root = input_root or None
    base = root or manifest_folder(manifest)
    with _open_text(manifest) as stream:
        if manifest.endswith(".jsonl"):
            rows = _jsonl_rows(stream, manifest)
        else:
            rows = _csv_rows(stream, manifest)
        for line, path, label, split, group in rows:
            if not path or not label:
                raise UsageError(f"--manifest {manifest}:{line}: needs a path and a label")
            if not is_text(path):  # a JSON "\udcff" escape: no file has that name
                raise UsageError(
                    f"--manifest {manifest}:{line}: the path {shown(path)} is not valid UTF-8"
                )
            problem = keys.split_name_problem(split) if split else None
            if problem is not None:
                raise UsageError(
                    f"--manifest {manifest}:{line}: the split name {problem}; rename it"
                )
            if is_local(path) and not os.path.isabs(path):
                full = normalize_root(join(base, path))
                image_id = posixpath.normpath(path.replace("\\", "/"))
            else:
                full = path
                image_id = relative_id(root, path) if root and path.startswith(root + "/") else path
            yield ManifestRow(image_id, full, label, split or None, group or None)


def manifest_folder(manifest: Place) -> Place:
    """The folder of a manifest's relative paths, by default: the manifest's own."""
    if is_local(manifest):
        return os.path.dirname(manifest)
    return posixpath.dirname(manifest)


def _csv_rows(stream, name):
    reader = csv.reader(stream)
    for number, row in enumerate(reader, start=1):
        if not row or all(not cell.strip() for cell in row):
            continue
        cells = [cell.strip() for cell in row]
        if number == 1 and cells[0].lower() == "path":
            continue  # header
        if len(cells) not in (2, 3, 4):
            raise UsageError(
                f"--manifest {name}:{number}: expected path,label[,split[,group]], got {row}"
            )
        cells += [""] * (4 - len(cells))
        yield number, cells[0], cells[1], cells[2] or None, cells[3] or None


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
        label, split, group = row.get("label"), row.get("split"), row.get("group")
        for key, value in (("split", split), ("group", group)):
            if value is not None and not isinstance(value, str):
                raise UsageError(
                    f"--manifest {name}:{number}: {key} must be a string, got {json.dumps(value)}"
                )
        yield (
            number,
            str(row.get("path") or ""),
            "" if label is None else str(label),
            split,
            group,
        )

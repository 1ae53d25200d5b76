"""Manifests: a CSV (columns by header, else ``path,label[,split[,group]]``) or JSONL
file instead of class folders; docs/format.md section 2 has the rules.

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
    """Rows of a CSV or JSONL manifest (:data:`COLUMNS`).

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
            yield ManifestRow(image_id, full, label, split, group)


def manifest_folder(manifest: Place) -> Place:
    """The folder of a manifest's relative paths, by default: the manifest's own."""
    if is_local(manifest):
        return os.path.dirname(manifest)
    return posixpath.dirname(manifest)


# A manifest's columns, in the order a CSV without a header gives them.
COLUMNS = ("path", "label", "split", "group")


def name_value(value: str | None) -> str | None:
    """A label, split or group as the manifest wrote it (CSV cell or JSONL string):
    white space at either end trimmed, and nothing left (empty, or all white
    space) is no value. A path is never trimmed: a file's name may end in a space."""
    if value is None:
        return None
    return value.strip() or None


def path_value(value: str | None) -> str | None:
    """A path as the manifest wrote it, every character kept; empty or all white space
    is no path."""
    return value if value and value.strip() else None


def header_columns(cells: list[str]) -> list[str] | None:
    """The column names of a CSV's first row, when it is a header (one of its cells,
    trimmed, is a column name in any case), else None (positional rows).

    Raises:
        ValueError: a header naming a column twice, or one that is not a column.
    """
    names = [cell.strip().lower() for cell in cells]
    if not any(name in COLUMNS for name in names):
        return None
    unknown = [cell for cell, name in zip(cells, names, strict=True) if name not in COLUMNS]
    if unknown:
        raise ValueError(
            f"unknown column {unknown[0].strip()!r} in the header (columns: {', '.join(COLUMNS)})"
        )
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ValueError(f"the header names the column {twice!r} twice")
    missing = [n for n in COLUMNS[:2] if n not in names]
    if missing:
        raise ValueError(f"the header has no {missing[0]!r} column")
    return names


def _row(number: int, values: dict) -> tuple:
    return (
        number,
        path_value(values.get("path")),
        name_value(values.get("label")),
        name_value(values.get("split")),
        name_value(values.get("group")),
    )


def _csv_rows(stream, name):
    reader = csv.reader(stream)
    columns, first = None, True
    for number, row in enumerate(reader, start=1):
        if not row or all(not cell.strip() for cell in row):
            continue
        if first:  # the first row that is not blank: a header, or the first row
            first = False
            try:
                columns = header_columns(row)
            except ValueError as error:
                raise UsageError(f"--manifest {name}:{number}: {error}") from None
            if columns is not None:
                continue
        width = len(columns) if columns else len(COLUMNS)
        if len(row) > width or (columns is None and len(row) < 2):
            wanted = ",".join(columns) if columns else "path,label[,split[,group]]"
            raise UsageError(f"--manifest {name}:{number}: expected {wanted}, got {row}")
        yield _row(number, dict(zip(columns or COLUMNS, row, strict=False)))


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
        unknown = sorted(key for key in row if key not in COLUMNS)
        if unknown:
            raise UsageError(
                f"--manifest {name}:{number}: unknown key {unknown[0]!r} "
                f"(keys: {', '.join(COLUMNS)})"
            )
        for key in ("split", "group"):
            value = row.get(key)
            if value is not None and not isinstance(value, str):
                raise UsageError(
                    f"--manifest {name}:{number}: {key} must be a string, got {json.dumps(value)}"
                )
        path, label = row.get("path"), row.get("label")
        yield _row(
            number,
            {
                **row,
                "path": None if path is None else str(path),
                "label": None if label is None else str(label),
            },
        )

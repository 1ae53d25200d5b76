"""Puts the job's files in place atomically and deletes only what the job wrote.

Every write goes to a temporary name and is renamed; only :data:`OURS` and the
temporary folder are deleted (docs/architecture.md, "Writing the output").
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO

from beam_pipeline.core import errors, metadata, spill, tfds_metadata
from beam_pipeline.core.metadata import LOCK
from beam_pipeline.storage import listing, paths

# The job's marker (resume.py): the last file a successful run deletes.
MARKER = f"{metadata.TMP_DIR}/{spill.SETTINGS_FILE}"
# What a run writes directly under OUTPUT (a final name, or its temporary name
# while write_atomically runs); everything under metadata.TMP_DIR is the job's too.
_FILES = (
    metadata.INFO_FILE,
    metadata.V1_INFO_FILE,  # format_version 1's metadata; TFDS's in version 2
    metadata.LABELS_FILE,
    metadata.REJECTS_FILE,
    metadata.SKIPPED_FILE,
    metadata.NEAR_DUPLICATES_FILE,
    metadata.DUPLICATES_FILE,
    *tfds_metadata.FILES,
)
OURS = re.compile(
    rf"^({'|'.join(map(re.escape, _FILES))}"
    r"|[A-Za-z0-9_]+-\d{5}-of-\d{5}\.tfrecord(\.idx)?)(\.tmp-[0-9a-f]{32})?$"
)


def is_ours(relative: str) -> bool:
    """Whether a path relative to --output (POSIX separators) is one a run writes."""
    return bool(OURS.match(relative)) or relative.startswith(metadata.TMP_DIR + "/")


def _filesystems(path: str):
    """Beam's FileSystems, for a write of ``path`` (not local): fenced on the run's
    gs:// lock first (``lock.check_fence``), so a run that lost it writes no more."""
    from beam_pipeline.storage import gcs, lock

    gcs.bound_retries()
    lock.check_fence(path)
    return paths.filesystems()


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
    """Turns a failure to write ``path`` into an error that names it.

    An OSError of a local file (disk full, file too large, read-only, ...)
    becomes ``errors.CannotWrite``; GCS out of reach for --gcs_timeout_s,
    ``errors.StorageUnreachable``. Others pass unchanged.
    """
    try:
        yield
    except Exception as error:
        named = _named(error, path)
        if named is None:
            raise
        raise named from error


def _named(error: Exception, path: str) -> errors.RunStopped | None:
    if isinstance(error, errors.RunStopped):
        return None
    if paths.is_local(path):
        return errors.cannot_write(path, error) if isinstance(error, OSError) else None
    from beam_pipeline.storage import gcs

    return gcs.unreachable(path, error) if gcs.is_unreachable(error) else None


class _Writing:
    """A file being written whose write and close errors name it (see :func:`naming`)."""

    def __init__(self, path: str, stream: BinaryIO):
        self.path, self._stream = path, stream

    def write(self, data) -> int:
        try:
            return self._stream.write(data)
        except Exception as error:  # not `with naming()`: this runs once per record
            named = _named(error, self.path)
            if named is None:
                raise
            raise named from error

    def close(self) -> None:
        with naming(self.path):
            self._stream.close()

    def __enter__(self) -> _Writing:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def create(path: str) -> _Writing:
    """Opens a new file for writing bytes as they are (no compression).

    Makes a local file's folders. Write to a temporary name, then rename it
    into place with :func:`move_into_place`. Its errors name ``path``.
    """
    with naming(path):
        if paths.is_local(path):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            return _Writing(path, open(path, "wb"))
        from apache_beam.io.filesystem import CompressionTypes

        stream = _filesystems(path).create(path, compression_type=CompressionTypes.UNCOMPRESSED)
        return _Writing(path, stream)


def write_atomically(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path``: a temporary file beside it, then a rename.

    A reader sees the old file or the whole new one, never part of it. A run
    killed between the two steps leaves ``<path>.tmp-<32 hex>``, which
    :data:`OURS` recognises, so the next run deletes it.
    """
    temp = f"{path}.tmp-{uuid.uuid4().hex}"
    with create(temp) as stream:
        stream.write(data)
    _rename([(temp, path)])


def _rename(moves: Sequence[tuple[str, str]]) -> None:
    if not moves:
        return
    if all(paths.is_local(src) for src, _ in moves):
        for src, dst in moves:
            with naming(dst):
                os.replace(src, dst)
        return
    # One call for all: GCS has no rename (copy, then delete), batched by Beam.
    with naming(moves[0][1]):
        _filesystems(moves[0][1]).rename([src for src, _ in moves], [dst for _, dst in moves])


def files_under(folder: str) -> list[str]:
    """The path of every file below ``folder``, any depth; none if it does not exist.

    A local ``folder`` that is a symbolic link holds none: the job's clean-ups
    list with this, and never delete through a link (resume.refusal refuses
    one before the run; this holds should one appear during it).
    """
    if paths.is_local(folder):
        if os.path.islink(folder):
            return []
        return [
            os.path.join(dirpath, name) for dirpath, _, names in os.walk(folder) for name in names
        ]
    return listing.files_under(folder)


def move_into_place(moves: Iterable[tuple[str, str]], temp_folder: str) -> None:
    """Renames each ``(temp, final)`` pair whose temporary file is still in ``temp_folder``.

    Idempotent: a retried step completes the renames an earlier try began and
    does not fail on the ones it finished. Lists ``temp_folder`` once instead
    of checking each file (thousands of requests on GCS).

    Args:
        moves: (temporary path, final path) pairs; every temporary path lies
            below ``temp_folder``.
        temp_folder: The folder the temporary files were written to.
    """
    existing = {_normal(path) for path in files_under(temp_folder)}
    _rename([(src, dst) for src, dst in moves if _normal(src) in existing])


def _normal(path: str) -> str:
    return os.path.normpath(path) if paths.is_local(path) else path


def delete(files: Sequence[str]) -> None:
    """Deletes files; a local file already gone is no error (a retried clean-up)."""
    files = list(files)
    if not files:
        return
    if all(paths.is_local(path) for path in files):
        for path in files:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        return
    _filesystems(files[0]).delete(files)


def delete_ours(output: str, relative: Iterable[str]) -> None:
    """Deletes files the job writes, named relative to ``output``.

    Raises:
        ValueError: A name is not one a run writes (see :func:`is_ours`);
            nothing is deleted then.
    """
    relative = list(relative)
    foreign = [name for name in relative if not is_ours(name)]
    if foreign:
        raise ValueError(f"not a file this job writes, so not deleted: {foreign[0]}")
    delete([paths.join(output, name) for name in relative])


def delete_temp_files(output: str, keep: Iterable[str] = ()) -> None:
    """Deletes every file in the job's temporary folder of ``output`` but ``keep``.

    Args:
        output: The --output folder.
        keep: Names relative to ``output`` to leave, e.g. :data:`MARKER`.
    """
    kept = {_normal(paths.join(output, name)) for name in (*keep, LOCK)}
    found = files_under(paths.join(output, metadata.TMP_DIR))
    delete([path for path in found if _normal(path) not in kept])


def delete_temp_folder(output: str) -> None:
    """Deletes the job's temporary folder of ``output`` and everything in it.

    All but a live run's :data:`LOCK`: its owner removes it, and the folder
    with it, once the run is over (lock.py).
    """
    folder = paths.join(output, metadata.TMP_DIR)
    if not paths.is_local(folder):
        delete_temp_files(output)
        return
    if not os.path.exists(os.path.join(output, LOCK)):
        shutil.rmtree(folder, ignore_errors=True)
        return
    delete_temp_files(output)
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)


def delete_local_folder(path: str | None) -> None:
    """Deletes a local folder only the job writes (its spill folder) with its contents."""
    if path and os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def remove_empty_folders(path: str) -> None:
    """Removes ``path`` and the local folders below it that hold no files."""
    for dirpath, _, _ in sorted(os.walk(path), key=lambda walk: -len(walk[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass

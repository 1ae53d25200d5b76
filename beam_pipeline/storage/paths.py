"""Paths and names: local paths and URLs alike, and file names that are not text.

Every module that handles an input or output location goes through these, so
a local path and a ``gs://`` URL are joined, compared and shown the same way.
Pure string work, but for :func:`filesystems` (Beam's, imported on first use).
"""

from __future__ import annotations

import os
import posixpath
from typing import NewType

from beam_pipeline.core.errors import UsageError

# Names as text and as a message shows them are the core's (it prints names too).
from beam_pipeline.core.text import as_text, is_text, shown  # noqa: F401


def filesystems():
    """Beam's FileSystems, imported on first use: local discovery needs no Beam,
    so the CLI can validate a local input and start converting before Beam loads.

    Callers want it for a path that is not local, so Beam's gs:// filesystem is
    registered here if it is not yet: a local run in the same process imports
    Beam without the storage client (beam_private.import_beam_for_local_run),
    and Beam registers filesystems only as it imports them.
    """
    from apache_beam.io.filesystems import FileSystems

    try:
        import apache_beam.io.gcp.gcsfilesystem  # noqa: F401
    except ImportError:  # Beam without its [gcp] extra: gs:// fails with Beam's own message
        pass
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


def resolve(path: str) -> str:
    """The location ``path`` names, for telling whether two paths are the same place.

    A local path made absolute with ``~`` expanded and every symbolic link and
    ``..`` resolved (as far as the path exists: an output not made yet
    resolves through the folders above it); a URL as :func:`normalize_root`
    gives it. Two spellings of one folder (``latest -> v3``, ``a/../v3``)
    resolve to the same string.
    """
    if is_local(path):
        return os.path.realpath(os.path.expanduser(path))
    return normalize_root(path)


# A location as the run names it from where it enters (a flag) on: resolved
# once there (:func:`place`), then joined and compared as it is, never
# normalised again (tests/test_paths_once.py checks who calls these).
Place = NewType("Place", str)


def place(path: str, flag: str = "") -> Place:
    """``path`` as it enters the run: the place it names (:func:`resolve`), so that
    every spelling of one folder (a trailing slash, ``..``, a symbolic link)
    gives the same dataset.

    Raises:
        UsageError: ``path`` starts like a gs:// URL but is not one
            (:func:`gcs_url_problem`), named by ``flag``.
    """
    problem = gcs_url_problem(path)
    if problem:
        raise UsageError(f"{flag or 'a path'} {shown(path)} {problem}: expected gs://BUCKET/PATH")
    return Place(resolve(path))


def gcs_url_problem(path: str) -> str:
    """What is wrong with ``path`` as a gs:// URL, when it starts like one ("" otherwise).

    A local path never starts with ``gs:`` here: ``gs:bucket/x`` or ``gs:/x``
    is a URL mistyped, and taken as a local path it would write a folder
    named ``gs:`` in the working directory (``./gs:x`` still names one).
    """
    if path[:3].lower() != "gs:":
        return ""
    if not path.startswith("gs://"):
        return "is not a gs:// URL (it needs gs:// in lower case, with two slashes)"
    if not path[len("gs://") :].split("/", 1)[0]:
        return "names no bucket"
    return ""  # a bucket's name is GCS's to judge (gcs.check_output: one line)


def _identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) of a local path, following links; None where it does not exist."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies below it, both resolved (:func:`resolve`).

    Local paths are compared as filesystem objects too: ``folder``'s device
    and inode against those of ``path`` and of each folder above it (from
    ``path``'s nearest existing one up), so that a bind mount, a second mount
    of one export or a case-insensitive filesystem, which give one folder two
    names no string comparison can match, are still found to be the same place.
    """
    path, folder = resolve(path), resolve(folder)
    if path == folder or path.startswith(folder.rstrip("/") + "/"):
        return True
    if not (is_local(path) and is_local(folder)):
        return False
    target = _identity(folder)
    if target is None:
        return False
    while True:
        found = _identity(path)
        if found == target:
            return True
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent


def relative_id(root: str, path: str) -> str:
    """The image ID: ``path`` relative to ``root`` with POSIX separators."""
    rel = path[len(root) :].lstrip("/\\")
    return rel.replace(os.sep, "/") if is_local(root) else rel


def is_hidden(relative_path: str) -> bool:
    """Whether a component of a ``/``-separated path starts with a dot.

    Only ``/`` separates: a backslash is an ordinary character of a GCS object
    name (and of a POSIX file name), so ``a/back\\.slash.jpg`` is not hidden.
    """
    return any(part.startswith(".") for part in relative_path.split("/"))

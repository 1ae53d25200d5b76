"""Reading one file whole, local or remote: a source image, or a small file of a dataset.

The conversion reads its sources here, and ``--reuse`` hashes them here to
see whether they changed. A local file is read with plain ``open()``, a
remote one through Beam's ``FileSystems``, imported only then, so the local
conversion processes never load Beam.
"""

from __future__ import annotations

import hashlib
import mmap
import os

from beam_pipeline.storage import gcs, paths


def read_bytes(path: str) -> bytes:
    if "://" not in path:  # local: plain open() is the cheapest way
        with open(path, "rb") as stream:
            return stream.read()
    from apache_beam.io.filesystem import CompressionTypes

    gcs.bound_retries()  # this process may not have been told --gcs_timeout_s yet
    opened = paths.filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    with opened as stream:
        return stream.read()


def hash_source(path: str) -> tuple[str, int, bytes | None]:
    """``(sha256, size, bytes)`` of a source file; bytes None when it was hashed in place.

    A local file is hashed through a read-only memory map: no copy of it is
    made (docs/performance.md, "Measurements behind code choices"), and --reuse needs its
    bytes only when it changed. A remote one is read (it may be converted).

    Raises:
        Exception: the file cannot be read (a rejection, as in a full run).
    """
    if "://" in path:
        data = read_bytes(path)
        return hashlib.sha256(data).hexdigest(), len(data), data
    with open(path, "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        if not size:  # an empty file cannot be mapped
            data = stream.read()
            return hashlib.sha256(data).hexdigest(), len(data), data
        with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return hashlib.sha256(mapped).hexdigest(), size, None

"""Byte ranges of local files and ``gs://`` objects, one process at a time.

``os.pread`` locally, one ranged GET per read on GCS; a :class:`Files` is picklable and
opens its descriptors and client again in a child process.
"""

from __future__ import annotations

import os
import posixpath
import threading

from imagerecords import trust

GCS_SCHEME = "gs://"


def is_gcs(path: str) -> bool:
    return path.startswith(GCS_SCHEME)


def join(base: str, name: str) -> str:
    """A file name under a local folder or a ``gs://`` prefix."""
    if is_gcs(base):
        return posixpath.join(base, name)
    return os.path.join(base, name)


def split_gcs(url: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``."""
    bucket, _, name = url[len(GCS_SCHEME) :].partition("/")
    return bucket, name


def check_scheme(path: str) -> None:
    """Local paths and ``gs://`` only: say so before anything is read."""
    if "://" in path and not is_gcs(path):
        raise ValueError(f"{path}: only local paths and gs:// URLs can be read")


class Files:
    """Reads whole files and byte ranges; counts the reads it issues (``requests``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._fds: dict[str, int] = {}
        self._client = None
        # Reads issued by this process: one per range (a GET on gs://, a pread locally).
        self.requests = 0

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def _own(self) -> None:
        """Forget what a parent process opened (its descriptors, its HTTP sessions)."""
        if self._pid != os.getpid():
            self._lock = threading.Lock()
            self._pid = os.getpid()
            self._fds = {}
            self._client = None
            self.requests = 0

    def _count(self) -> None:
        self._own()
        with self._lock:  # reads run on several threads at once
            self.requests += 1

    def _fd(self, path: str) -> int:
        self._own()
        fd = self._fds.get(path)
        if fd is None:
            with self._lock:
                fd = self._fds.get(path)
                if fd is None:
                    # Never a FIFO's wait nor a device's endless bytes (trust.open_regular).
                    fd = self._fds[path] = trust.open_regular(path)
        return fd

    def _blob(self, url: str):
        self._own()
        if self._client is None:
            with self._lock:
                if self._client is None:
                    # Imported here: local datasets never need the storage client.
                    from google.cloud import storage

                    # project=None: object reads need no project, and inferring
                    # one fails for user credentials without a gcloud project.
                    self._client = storage.Client(project=None)
        bucket, name = split_gcs(url)
        return self._client.bucket(bucket).blob(name)

    def read(self, path: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``path``; fewer only if the file is shorter."""
        self._count()
        if is_gcs(path):
            # end is inclusive; checksum=None: a range has no whole-object hash
            # to compare with (the TFRecord CRCs check the bytes instead).
            return self._blob(path).download_as_bytes(
                start=start, end=stop - 1, checksum=None, raw_download=True
            )
        fd = self._fd(path)
        data = os.pread(fd, stop - start, start)
        while 0 < len(data) < stop - start:  # pread may return less; read the rest
            more = os.pread(fd, stop - start - len(data), start + len(data))
            if not more:
                break
            data += more
        return data

    def read_all(self, path: str, limit: int = trust.MAX_METADATA_BYTES) -> bytes | None:
        """The whole file, or None when it does not exist.

        Raises:
            trust.DatasetError: it is larger than ``limit``, or (locally) not a regular file.
        """
        self._count()
        if is_gcs(path):
            from google.api_core import exceptions

            blob = self._blob(path)
            try:
                # end is inclusive: one byte past the limit says it is over.
                data = blob.download_as_bytes(start=0, end=limit, raw_download=True)
            except exceptions.NotFound:
                return None
            except exceptions.RequestRangeNotSatisfiable:
                return b""  # an empty object
            if len(data) > limit:
                raise trust.DatasetError(f"{path}: more than the {limit:,} bytes it can hold")
            return data
        return trust.read_local(path, limit)

    def close(self) -> None:
        if self._pid == os.getpid():
            for fd in self._fds.values():
                os.close(fd)
        self._fds = {}
        self._client = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: os may be gone
            pass

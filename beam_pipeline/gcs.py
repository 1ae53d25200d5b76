"""Google Cloud Storage helpers the generic Beam FileSystems API lacks.

Beam's ``FileSystems.match`` lists every object under a prefix; class discovery
needs only the first "folder" level, which GCS answers with a delimiter listing
in a few requests however many objects there are.
"""

from __future__ import annotations


def split_url(url: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``."""
    if not url.startswith("gs://"):
        raise ValueError(f"not a gs:// URL: {url}")
    bucket, _, prefix = url[len("gs://") :].partition("/")
    return bucket, prefix


def _client():
    from google.cloud import storage

    return storage.Client()


def list_prefixes(url: str) -> list[str]:
    """Immediate sub-"folders" of ``url`` as ``gs://bucket/prefix/name`` (no trailing slash)."""
    bucket, prefix = split_url(url.rstrip("/") + "/")
    iterator = _client().list_blobs(bucket, prefix=prefix, delimiter="/")
    for _ in iterator.pages:  # prefixes are filled in while pages are read
        pass
    return sorted(f"gs://{bucket}/{p.rstrip('/')}" for p in iterator.prefixes)

"""Beam's own GCS filesystem (``FileSystems`` on ``gs://``) against the emulator.

The converter does everything on GCS through these calls: match (listing),
open (ranged reads), create (resumable uploads in 16 MiB chunks), rename (GCS
has none: copy, then delete) and delete. They run in the test process and in
DirectRunner ``multi_processing`` workers, which must inherit the emulator and
credential settings from the environment.
"""

from __future__ import annotations

import hashlib
import json
import os

import apache_beam as beam
import pytest
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

pytestmark = pytest.mark.e2e

# Fixtures used by name in this module (an import would read as unused to linters).

CHUNK = 16 * 1024 * 1024  # BeamBlobWriter's resumable-upload chunk size


def _write(path: str, data: bytes, piece: int = 1 << 20) -> None:
    with FileSystems.create(path) as stream:
        for start in range(0, len(data), piece):
            stream.write(data[start : start + piece])


def _read(path: str) -> bytes:
    with FileSystems.open(path) as stream:
        return stream.read()


def _names(url: str) -> list[str]:
    return sorted(m.path for m in FileSystems.match([url])[0].metadata_list)


def test_create_open_match_in_this_process(gcs_emulator, gcs_bucket):
    base = f"gs://{gcs_bucket}/fs"
    # Three resumable-upload chunks, the last one partial: the emulator must
    # stitch them like GCS does.
    big = os.urandom(2 * CHUNK + 12345)
    _write(f"{base}/big.bin", big)
    _write(f"{base}/empty.bin", b"")
    _write(f"{base}/sub/deeper/small.txt", b"hello")
    gcs_emulator.upload_bytes(f"{base}/sub/", b"")  # a folder placeholder

    assert gcs_emulator.read_bytes(f"{base}/big.bin") == big
    assert _read(f"{base}/big.bin") == big
    with FileSystems.open(f"{base}/big.bin") as stream:  # ranged reads after a seek
        stream.seek(CHUNK + 7)
        assert stream.read(100) == big[CHUNK + 7 : CHUNK + 107]
    assert _read(f"{base}/empty.bin") == b""

    everything = FileSystems.match([f"{base}/**"])[0].metadata_list
    sizes = {m.path[len(base) + 1 :]: m.size_in_bytes for m in everything}
    assert sizes == {"big.bin": len(big), "empty.bin": 0, "sub/": 0, "sub/deeper/small.txt": 5}
    # Placeholders come back from match as files ending in "/": listing code must skip them.
    assert _names(f"{base}/*.bin") == [f"{base}/big.bin", f"{base}/empty.bin"]
    assert _names(f"{base}/nothing/**") == []
    assert FileSystems.exists(f"{base}/big.bin")
    assert not FileSystems.exists(f"{base}/missing.bin")


def test_rename_copies_then_deletes_and_replaces(gcs_emulator, gcs_bucket):
    """The temp-then-rename pattern the shard writer relies on, many files at once."""
    base = f"gs://{gcs_bucket}/rename"
    # Beam batches copies and deletes 100 per request; 105 files take two batches.
    temps = [f"{base}/_tmp/shard-{i:03d}.tmp" for i in range(105)]
    finals = [f"{base}/shard-{i:03d}" for i in range(105)]
    for i, temp in enumerate(temps):
        gcs_emulator.upload_bytes(temp, f"new {i}".encode())  # one request each
    _write(finals[0], b"an older run's shard")  # a retried bundle renames over it
    FileSystems.rename(temps, finals)
    assert _names(f"{base}/**") == sorted(finals)
    assert _read(finals[0]) == b"new 0" and _read(finals[104]) == b"new 104"

    with pytest.raises(BeamIOError, match="404"):
        FileSystems.rename([f"{base}/_tmp/gone"], [f"{base}/x"])

    # delete() lists each path before deleting it (two requests per file), so
    # keep this short; a name that is a prefix of others deletes only itself.
    FileSystems.delete(finals[:10] + [f"{base}/shard-01"])
    assert _names(f"{base}/**") == sorted(finals[10:])
    # A path ending in "/" deletes everything under it, placeholder included.
    gcs_emulator.upload_bytes(f"{base}/_tmp/", b"")
    gcs_emulator.upload_bytes(f"{base}/_tmp/a/b", b"x")
    FileSystems.delete([f"{base}/_tmp/"])
    assert _names(f"{base}/**") == sorted(finals[10:])


def test_missing_bucket_is_an_error_not_an_empty_match(gcs_emulator):
    with pytest.raises(BeamIOError, match="NotFound"):
        FileSystems.match(["gs://no-such-bucket-7/images/**"])


class _RoundTrip(beam.DoFn):
    """Writes, renames and reads back one object on GCS; records what the worker saw."""

    def __init__(self, base: str):
        self._base = base

    def process(self, index):
        data = hashlib.sha256(str(index).encode()).digest() * 1000
        final = f"{self._base}/data/{index:03d}.bin"
        temp = f"{self._base}/tmp/{index:03d}.bin.tmp"
        _write(temp, data)
        FileSystems.rename([temp], [final])
        report = {
            "index": index,
            "pid": os.getpid(),
            "emulator": os.environ.get("STORAGE_EMULATOR_HOST"),
            "credentials": os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"),
            "read_back_ok": _read(final) == data,
        }
        _write(f"{self._base}/reports/{index:03d}.json", json.dumps(report).encode())
        yield index


def test_multi_processing_workers_use_the_emulator(gcs_emulator, gcs_bucket):
    base = f"gs://{gcs_bucket}/workers"
    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    with beam.Pipeline(options=options) as pipeline:
        _ = pipeline | beam.Create(range(12)) | beam.Reshuffle() | beam.ParDo(_RoundTrip(base))

    names = gcs_emulator.list_names(base)
    reports = [json.loads(gcs_emulator.read_bytes(f"{base}/{n}")) for n in names if "reports/" in n]
    assert sorted(r["index"] for r in reports) == list(range(12))
    assert all(r["read_back_ok"] for r in reports)
    assert {r["emulator"] for r in reports} == {gcs_emulator.url}
    assert os.getpid() not in {r["pid"] for r in reports}  # really ran in worker processes
    assert not [n for n in names if n.startswith("tmp/")], "temp objects left behind"
    # Without the fake credentials file each worker would first spend ~30 s
    # looking for credentials (a wait, not an error): check that every worker
    # saw the file, rather than timing the run (slow on a loaded machine).
    credentials = os.environ["GOOGLE_APPLICATION_CREDENTIALS"]
    assert os.path.isfile(credentials)
    assert {r["credentials"] for r in reports} == {credentials}

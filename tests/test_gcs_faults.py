"""GCS lost for good mid-run: the run stops at the requests GCS left unanswered, says
so in one line, and the same command resumes once GCS is back.

The CLI runs in a subprocess whose ``STORAGE_EMULATOR_HOST`` points at a
:class:`tests.gcs_faults.DroppingProxy` in front of the session's emulator;
the proxy goes dark for good at a chosen request (an image download while
converting, the first upload while writing). Nothing in the converter is
replaced: the real storage client and Beam's GcsIO meet real refused
connections.

How long a run takes to end is the machine's to decide; what the run does is
the product's: it stops with the ``error:`` line and exit status 1, leaves no
process and no finished-looking output, and sends GCS no more than the
requests it had in flight (the proxy counts what it never answered), instead
of waiting out every image or record left. That each request gives up at
--gcs_timeout_s, retries and each attempt both, tests/test_gcs_helpers.py
reads from what the storage client reports.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_pipeline.core import metadata
from tests import contract
from tests.gcs_faults import MEDIA_DOWNLOAD, SHARD_UPLOAD, DroppingProxy
from tests.image_factory import make_class_folders

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
GCS_TIMEOUT_S = "5"  # --gcs_timeout_s of the failing runs
PER_CLASS = 40
# Requests a hanging GCS may be left holding when the run ends: those in
# flight when it went (each conversion process's read, Beam's lookups, the
# lock's removal at exit), far fewer than the images (80) or records (120)
# the run had left to read one after another had it not stopped.
IN_FLIGHT_AT_MOST = 20
# Only against a run that never ends: GCS lost, a run ends seconds later.
HUNG_S = 300


@pytest.fixture(scope="module")
def source(gcs_emulator, tmp_path_factory):
    """120 images in a bucket, and their local copy."""
    work = tmp_path_factory.mktemp("gcs-faults")
    local = work / "images"
    ids = make_class_folders(str(local), per_class=PER_CLASS, nested=False, size_range=(60, 120))
    bucket = gcs_emulator.create_bucket()
    gcs_emulator.upload_dir(local, f"gs://{bucket}/images")
    return bucket, local, ids, work


def _start(args: list[str], emulator_url: str, spill: Path) -> subprocess.Popen:
    """The CLI in its own process group (so that the test sees any child it leaves)."""
    env = dict(os.environ, STORAGE_EMULATOR_HOST=emulator_url, IMAGERECORDS_SPILL_DIR=str(spill))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )


def _cli(url_in: str, url_out: str, emulator_url: str, spill: Path, *extra: str):
    args = ["--input", url_in, "--output", url_out, "--runner", "DirectRunner"]
    return _start([*args, "--local_processes", "2", *extra], emulator_url, spill)


def _ends_once_lost(process: subprocess.Popen, proxy: DroppingProxy, where: str) -> str:
    """Waits for the proxy to drop, then for the run to end; its stderr."""
    try:
        deadline = time.monotonic() + HUNG_S
        while not proxy.dropped.wait(0.1) and process.poll() is None:
            assert time.monotonic() < deadline, f"the run never got to {where}"
        assert proxy.dropped.is_set(), f"the run never got to {where}: {process.communicate()}"
        try:
            _, err = process.communicate(timeout=HUNG_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run never ended once GCS was lost ({where})")
        # The run stopped at what it had in flight (with a hanging GCS, each of
        # those waited for by its attempt's own limit and no longer).
        held = proxy.unanswered
        assert 1 <= len(held) <= IN_FLIGHT_AT_MOST, held
    finally:
        proxy.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    # Nothing of the run is left (its conversion processes were waited for).
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)
    return err


def _the_one_error_line(process: subprocess.Popen, err: str) -> str:
    assert process.returncode == 1, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == [lines[-1]], err
    line = lines[-1]
    assert line.startswith("error: lost the connection to Google Cloud Storage: could not reach ")
    assert f"--gcs_timeout_s {GCS_TIMEOUT_S}" in line and line.endswith(
        "rerun the same command to resume"
    )
    return line


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "hanging"])
@pytest.mark.parametrize(
    "where, drop_at, after, named",
    [
        ("reading images", MEDIA_DOWNLOAD, PER_CLASS, "gs://{bucket}/images/"),
        (
            "writing the output",
            SHARD_UPLOAD,
            1,
            "gs://{bucket}/out-writing-{mode}/.imagerecords-tmp/",
        ),
    ],
    ids=["reading", "writing"],
)
def test_gcs_lost_for_good_ends_the_run_in_one_line_and_the_rerun_resumes(
    gcs_emulator, source, tmp_path, where, drop_at, after, named, hang
):
    """Lost for good either way: connections refused, or accepted and never answered."""
    bucket, local, ids, work = source
    mode = "hanging" if hang else "refused"
    out = f"gs://{bucket}/out-{where.split()[0]}-{mode}"
    spill = tmp_path / "spill"
    proxy = DroppingProxy(gcs_emulator.url, drop_at, after, hang=hang)
    process = _cli(f"gs://{bucket}/images", out, proxy.url, spill, "--gcs_timeout_s", GCS_TIMEOUT_S)
    err = _ends_once_lost(process, proxy, where)
    line = _the_one_error_line(process, err)
    assert named.format(bucket=bucket, mode=mode) in line, line
    assert metadata.INFO_FILE not in gcs_emulator.list_names(out)

    # GCS is back (straight to the emulator): the same command finishes the job,
    # from the records the first run converted, not from scratch.
    rerun = _cli(f"gs://{bucket}/images", out, gcs_emulator.url, spill)
    stdout, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    counters = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", stdout)}
    assert counters.get("images_resumed", 0) > 0, stdout
    fetched = gcs_emulator.download_dir(out, tmp_path / "fetched")
    by_split = contract.check_output(str(fetched), input_root=str(local))
    assert sorted(i for rows in by_split.values() for i in contract.ids(rows)) == sorted(ids)
    assert not [n for n in gcs_emulator.list_names(out) if n.startswith(".imagerecords-tmp")]


@pytest.fixture(scope="module")
def old_on_gcs(gcs_emulator, source):
    """A finished dataset of the source's images on gs://, and its number of shards."""
    from beam_pipeline.__main__ import main

    bucket, local, _, work = source
    made = work / "old"
    assert main(["--input", str(local), "--output", str(made), "--quiet"]) == 0
    gcs_emulator.upload_dir(made, f"gs://{bucket}/old")
    return f"gs://{bucket}/old", len(list(made.glob("*.tfrecord")))


# A read of one of OLD's shards (the index scan's, or one record's).
OLD_SHARD_READ = re.compile(r"^GET /download/\S*/o/old%2F[^?/]*\.tfrecord\?\S*alt=media")


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "hanging"])
@pytest.mark.parametrize("where", ["scanning OLD", "reading a record of OLD"])
def test_gcs_lost_while_reusing_a_gcs_dataset_ends_the_run_in_one_line(
    gcs_emulator, source, old_on_gcs, tmp_path, where, hang
):
    """``--reuse gs://OLD`` with GCS lost: the run stops at what it had in flight, rather
    than waiting out each record's read and converting the image instead."""
    _, local, _, _ = source
    old, shards = old_on_gcs
    # The scan reads each (small) shard in one request before any record is read.
    after = 1 if where == "scanning OLD" else shards + 1
    proxy = DroppingProxy(gcs_emulator.url, OLD_SHARD_READ, after, hang=hang)
    out = tmp_path / "new"
    args = [
        "--input",
        str(local),
        "--output",
        str(out),
        "--reuse",
        old,
        "--gcs_timeout_s",
        GCS_TIMEOUT_S,
    ]
    process = _start([*args, "--local_processes", "2"], proxy.url, tmp_path / "spill")
    err = _ends_once_lost(process, proxy, where)
    line = _the_one_error_line(process, err)
    assert f"could not reach {old}/" in line, line
    assert not (out / metadata.INFO_FILE).exists()


def test_a_bad_gcs_timeout_is_refused(tmp_path, capsys):
    from beam_pipeline.__main__ import main

    argv = ["--input", str(tmp_path), "--output", str(tmp_path / "o"), "--gcs_timeout_s", "0"]
    assert main(argv) == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: --gcs_timeout_s must be above 0 and at most 86400, got 0"
    )

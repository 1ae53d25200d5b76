"""GCS lost for good mid-run: the run ends within --gcs_timeout_s, says so in one line,
and the same command resumes once GCS is back.

The CLI runs in a subprocess whose ``STORAGE_EMULATOR_HOST`` points at a
:class:`tests.gcs_faults.DroppingProxy` in front of the session's emulator;
the proxy goes dark for good at a chosen request (an image download while
converting, the first upload while writing). Nothing in the converter is
replaced: the real storage client and Beam's GcsIO meet real refused
connections.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_pipeline.core import metadata
from tests import contract
from tests.gcs_faults import MEDIA_DOWNLOAD, SHARD_UPLOAD, DroppingProxy
from tests.image_factory import make_class_folders

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 5  # --gcs_timeout_s of the failing runs
# The run must end within the flag plus this (one request attempt in flight
# may take the client's own 60 s timeout; shutting the pool down, a few more).
SLACK_S = 60
PER_CLASS = 40


@pytest.fixture(scope="module")
def source(gcs_emulator, tmp_path_factory):
    """120 images in a bucket, and their local copy."""
    work = tmp_path_factory.mktemp("gcs-faults")
    local = work / "images"
    ids = make_class_folders(str(local), per_class=PER_CLASS, nested=False, size_range=(60, 120))
    bucket = gcs_emulator.create_bucket()
    gcs_emulator.upload_dir(local, f"gs://{bucket}/images")
    return bucket, local, ids, work


def _cli(url_in: str, url_out: str, emulator_url: str, spill: Path, *extra: str):
    env = dict(os.environ, STORAGE_EMULATOR_HOST=emulator_url, IMAGERECORDS_SPILL_DIR=str(spill))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", "--input", url_in, "--output", url_out]
        + ["--runner", "DirectRunner", "--local_processes", "2", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    "where, drop_at, after, named",
    [
        ("reading images", MEDIA_DOWNLOAD, PER_CLASS, "gs://{bucket}/images/"),
        ("writing the output", SHARD_UPLOAD, 1, "gs://{bucket}/out-writing/.imagerecords-tmp/"),
    ],
    ids=["reading", "writing"],
)
def test_gcs_lost_for_good_ends_the_run_in_one_line_and_the_rerun_resumes(
    gcs_emulator, source, tmp_path, where, drop_at, after, named
):
    bucket, local, ids, work = source
    out = f"gs://{bucket}/out-{where.split()[0]}"
    spill = tmp_path / "spill"
    proxy = DroppingProxy(gcs_emulator.url, drop_at, after)
    try:
        process = _cli(f"gs://{bucket}/images", out, proxy.url, spill, "--gcs_timeout_s", "5")
        deadline = time.monotonic() + 300
        while not proxy.dropped.wait(0.1) and process.poll() is None:
            assert time.monotonic() < deadline, f"the run never got to {where}"
        assert proxy.dropped.is_set(), f"the run never got to {where}: {process.communicate()}"
        dropped = time.monotonic()
        # The bound under test: well under the default (300 s), whatever the machine.
        _, err = process.communicate(timeout=TIMEOUT_S + SLACK_S + 60)
        took = time.monotonic() - dropped
    finally:
        proxy.close()
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == [lines[-1]], err
    line = lines[-1]
    assert line.startswith("error: lost the connection to Google Cloud Storage: could not reach ")
    assert named.format(bucket=bucket) in line, line
    assert "--gcs_timeout_s 5" in line and line.endswith("rerun the same command to resume")
    assert took < TIMEOUT_S + SLACK_S, f"the run ended {took:.0f} s after GCS was lost"
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


def test_a_bad_gcs_timeout_is_refused(tmp_path, capsys):
    from beam_pipeline.__main__ import main

    argv = ["--input", str(tmp_path), "--output", str(tmp_path / "o"), "--gcs_timeout_s", "0"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "error: --gcs_timeout_s must be positive, got 0"

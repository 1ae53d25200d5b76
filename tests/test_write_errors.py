"""A write that fails (file too large, disk full) names the file in the one error line.

Real limits, no mocks: ``RLIMIT_FSIZE`` (``ulimit -f``) set on the CLI's
process, which makes a write past it fail with EFBIG (Python ignores
SIGXFSZ, so the write raises instead of the process dying), and a 1 MB
tmpfs mounted in a private mount namespace for a disk that fills up
(ENOSPC); the mount vanishes with the process.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys

import pytest

from beam_pipeline.core import errors, metadata
from tests.image_factory import make_class_folders

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """About 2.5 MB of records: more than the limits below."""
    root = tmp_path_factory.mktemp("write-errors") / "images"
    make_class_folders(str(root), per_class=100, nested=False, size_range=(300, 500))
    return root


def _file_size_limit(limit: int):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_limit


def _cli(*args: str, preexec_fn=None, prefix=(), env=None) -> tuple[int, str]:
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    result = subprocess.run(
        [*prefix, sys.executable, "-m", "beam_pipeline", *args, "--quiet"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        preexec_fn=preexec_fn,
    )
    return result.returncode, result.stderr


def _one_error_line(status: int, err: str) -> str:
    assert status == 1, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: could not write "), err
    assert lines[0].endswith("rerun the same command to resume"), err
    return lines[0]


EFBIG = (
    f"File too large (EFBIG); no {metadata.INFO_FILE} was written; the file reached a size limit"
)


def test_a_spill_file_past_the_file_size_limit_is_named(images, tmp_path):
    out = tmp_path / "o"
    status, err = _cli(
        "--input", str(images), "--output", str(out), "--local_processes", "2",
        preexec_fn=_file_size_limit(256 * 1024),
    )  # fmt: skip
    line = _one_error_line(status, err)
    spill_dir = re.escape(str(out / metadata.TMP_DIR / "spill"))
    assert re.match(
        rf"error: could not write {spill_dir}/\d+-[0-9a-f]+\.spill: {re.escape(EFBIG)}", line
    )


def test_a_staged_shard_past_the_file_size_limit_is_named(images, tmp_path):
    """On Beam with one process a shard's records are staged on local disk first
    (staging.py, under $TMPDIR): that file reaches the limit first."""
    out, staging = tmp_path / "o", tmp_path / "staging"
    staging.mkdir()
    status, err = _cli(
        "--input", str(images), "--output", str(out),
        "--runner", "DirectRunner", "--direct_running_mode=in_memory",
        preexec_fn=_file_size_limit(256 * 1024), env={"TMPDIR": str(staging)},
    )  # fmt: skip
    line = _one_error_line(status, err)
    staged = re.escape(str(staging))
    assert re.match(rf"error: could not write {staged}/imagerecords-\w+\.stage: ", line), line
    assert EFBIG in line
    assert os.listdir(staging) == []  # the staging file is gone all the same


_WRITE_SHARD = """
import sys
from beam_pipeline.core import errors
from beam_pipeline.stages import shards
from beam_pipeline.core.elements import ShardEntry
records = [ShardEntry(key, str(key), 0, 50_000, b"x" * 50_000) for key in range(4)]
try:
    shards.write_shard(sys.argv[1], "train", 0, 1, records)
except errors.CannotWrite as error:
    print(error)
"""


_WRITE_METADATA = """
import sys
from beam_pipeline.core import errors
from beam_pipeline.storage import output
try:
    output.write_atomically(sys.argv[1], b"{}" * 100_000)
except errors.CannotWrite as error:
    print(error)
"""


def _in_subprocess(script: str, *args: str, limit: int) -> str:
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        preexec_fn=_file_size_limit(limit),
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_shard_past_the_file_size_limit_is_named(tmp_path):
    printed = _in_subprocess(_WRITE_SHARD, str(tmp_path / "o"), limit=64 * 1024)
    temp = re.escape(str(tmp_path / "o" / metadata.TMP_DIR))
    assert re.fullmatch(
        rf"could not write {temp}/train-00000\.[0-9a-f]{{32}}: {re.escape(EFBIG)}.*\n", printed
    ), printed


def test_metadata_past_the_file_size_limit_is_named(tmp_path):
    path = tmp_path / "o" / metadata.INFO_FILE
    printed = _in_subprocess(_WRITE_METADATA, str(path), limit=64 * 1024)
    assert re.fullmatch(
        rf"could not write {re.escape(str(path))}\.tmp-[0-9a-f]{{32}}: {re.escape(EFBIG)}.*\n",
        printed,
    ), printed


def _private_tmpfs_prefix(mountpoint) -> tuple[str, ...] | None:
    """A command prefix that runs the rest with a 1 MB tmpfs on ``mountpoint``, mounted in a
    mount namespace of its own (root, or an unprivileged user namespace); None if neither."""
    unshare = shutil.which("unshare")
    if not unshare or not sys.platform.startswith("linux"):
        return None
    mount = 'mount -t tmpfs -o size=1m tmpfs "$0" && exec "$@"'
    for namespace in (["--mount"], ["--mount", "--map-root-user"]):
        prefix = (unshare, *namespace, "sh", "-c", mount, str(mountpoint))
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return prefix
    return None


def test_a_full_disk_is_named(images, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    prefix = _private_tmpfs_prefix(disk)
    if prefix is None:
        pytest.skip("cannot mount a tmpfs here (neither root nor user namespaces)")
    out = disk / "o"
    status, err = _cli(
        "--input", str(images), "--output", str(out), "--local_processes", "2", prefix=prefix
    )
    line = _one_error_line(status, err)
    assert line.startswith(f"error: could not write {out}/"), line
    assert f"No space left on device (ENOSPC); no {metadata.INFO_FILE} was written; " in line
    assert "the disk is full: free some space, then rerun the same command to resume" in line


def test_cannot_write_says_what_failed_where_and_what_next():
    error = errors.cannot_write("/x/y", OSError(28, "No space left on device"))
    assert str(error) == (
        f"could not write /x/y: No space left on device (ENOSPC); no {metadata.INFO_FILE} was "
        "written; the disk is full: free some space, then rerun the same command to resume"
    )
    error = errors.cannot_write("/x/y", PermissionError(13, "Permission denied"))
    assert str(error) == (
        f"could not write /x/y: Permission denied (EACCES); no {metadata.INFO_FILE} was "
        "written; rerun the same command to resume"
    )

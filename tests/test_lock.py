"""A live run owns its --output (beam_pipeline/storage/lock.py), on a local folder.

The CLI runs as a real subprocess in its own process group, so that a test
can run two at once into one folder, or SIGKILL one (no clean-up at all, as
a crash or the OOM killer would) and start the next. The gs:// lock is
tested against the emulator in test_gcs_lock.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core import metadata, spill
from beam_pipeline.core.errors import UsageError
from beam_pipeline.storage import lock
from tests import held_run
from tests.image_factory import make_class_folders

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCK = lock.LOCK


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Enough images that a run is still converting a while after it started."""
    root = tmp_path_factory.mktemp("lock") / "images"
    make_class_folders(str(root), per_class=400, nested=False, size_range=(300, 500))
    return root


def _command(images, out):
    return [sys.executable, "-m", "beam_pipeline", "--input", str(images), "--output", str(out)]


def _start(images, out, gate) -> subprocess.Popen:
    """The CLI into ``out``, its 2 processes held after 500 images in all until ``gate``
    exists (tests/held_run.py): it cannot end before the test has done its part."""
    args = [*_command(images, out)[3:], "--local_processes", "2"]
    return subprocess.Popen(
        held_run.command(gate, 500, args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )


def _spilled(out) -> int:
    count = 0
    for path in spill.spill_files(spill.default_dir(str(out))):
        with contextlib.suppress(FileNotFoundError):
            count += sum(1 for _ in spill.scan(path))
    return count


def _wait_converting(process: subprocess.Popen, out, at_least: int = 100) -> None:
    deadline = time.monotonic() + 180
    while _spilled(out) < at_least:
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "nothing was converted"
        time.sleep(0.02)


def _frozen_while(process: subprocess.Popen):
    """SIGSTOPs ``process``'s group (it and its conversion processes) for a block:
    however slowly what the block starts comes up, the run is alive and no further on."""

    @contextlib.contextmanager
    def frozen():
        os.killpg(process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)

    return frozen()


def _second_run(images, out) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*_command(images, out), "--local_processes", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


@pytest.mark.e2e
@pytest.mark.parametrize("deleted", [False, True], ids=["lock-file-there", "lock-file-deleted"])
def test_a_second_run_into_a_live_runs_output_is_refused_at_once(images, tmp_path, deleted):
    """Refused while the first run lives, even when its lock file was deleted by
    hand meanwhile (--output itself is locked too)."""
    out, gate = tmp_path / "o", tmp_path / "gate"
    first = _start(images, out, gate)
    try:
        _wait_converting(first, out)
        owner = json.loads((out / LOCK).read_text())
        assert owner["pid"] == first.pid
        with _frozen_while(first):
            if deleted:
                (out / LOCK).unlink()
            second = _second_run(images, out)
    finally:
        gate.touch()
        _, err_first = first.communicate(timeout=300)
    assert second.returncode == 2, second.stderr
    named = f"pid {first.pid} on {owner['host']}, started {owner['started']}"
    assert second.stderr.strip() == (
        f"error: --output {out} is in use by another run{'' if deleted else f' ({named})'}; "
        "two runs must not write one output: "
        "wait for that run to end (or stop it), then run this command again"
    )
    # The first run was not disturbed, and a finished dataset has no temp folder.
    assert first.returncode == 0, err_first
    info = json.loads((out / metadata.INFO_FILE).read_text())
    assert sum(split["num_examples"] for split in info["splits"].values()) == 1200
    assert not (out / metadata.TMP_DIR).exists()


@pytest.mark.e2e
def test_a_killed_runs_lock_is_taken_over_and_the_run_resumed(images, tmp_path):
    out = tmp_path / "o"
    killed = _start(images, out, tmp_path / "gate")  # never opened: killed while held
    try:
        _wait_converting(killed, out, at_least=300)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)  # no clean-up: the lock file stays
        killed.wait()
    assert json.loads((out / LOCK).read_text())["pid"] == killed.pid

    result = subprocess.run(
        [*_command(images, out), "--local_processes", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "resuming the unfinished run" in result.stderr
    counters = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", result.stdout)}
    assert counters["images_resumed"] >= 300
    assert (out / metadata.INFO_FILE).exists()
    assert not (out / metadata.TMP_DIR).exists()


def test_the_lock_names_its_owner_and_goes_with_its_folders(tmp_path):
    out = str(tmp_path / "new" / "o")
    held = lock.acquire(out)
    try:
        with pytest.raises(lock.OutputInUse, match=rf"in use by another run \(pid {os.getpid()} "):
            lock.acquire(out)  # another open file description: flock refuses it too
        assert isinstance(lock.OutputInUse("x"), UsageError)  # exit status 2
    finally:
        held.release()
    assert not os.path.exists(out)  # it made the folders; empty, they go with it
    again = lock.acquire(out)  # free again
    again.release()


def test_a_runs_own_clean_ups_leave_its_lock(tmp_path):
    """resume.prepare and Finalize clear the temp folder; the lock outlives them."""
    from beam_pipeline.storage import output as output_files

    out = str(tmp_path / "o")
    os.makedirs(out)
    held = lock.acquire(out)
    try:
        temp = os.path.join(out, metadata.TMP_DIR)
        os.makedirs(os.path.join(temp, "spill"))
        for name in ("spill/1.spill", "train-00000.abc", "job.json"):
            with open(os.path.join(temp, name), "w") as stream:
                stream.write("x")
        output_files.delete_temp_folder(out)
        assert os.listdir(temp) == ["lock"]
        with pytest.raises(lock.OutputInUse):
            lock.acquire(out)
    finally:
        held.release()
    assert os.listdir(out) == []  # the folder existed before the lock: it stays


@pytest.mark.e2e
def test_a_dry_run_does_not_lock(images, tmp_path, capsys):
    out = str(tmp_path / "o")
    held = lock.acquire(out)
    try:
        assert main(["--input", str(images), "--output", out, "--dry_run", "--quiet"]) == 0
    finally:
        held.release()

"""The gs:// lock of a live run (beam_pipeline/storage/lock.py) against the GCS emulator.

The lock is an object created only if none exists, renewed by a heartbeat,
taken over (under a generation precondition) only from a run that is gone:
its process gone from this machine, or its heartbeat older than
``lock.STALE_AFTER`` periods. Locks "from another machine" are objects this
test writes as such a run would have left them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from beam_pipeline.storage import lock
from tests import held_run
from tests.image_factory import make_class_folders

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lock_url(out: str) -> str:
    return f"{out}/{lock.LOCK}"


def _owner_elsewhere(heartbeat_age_s: float, period_s: float = 30.0) -> dict:
    """A lock as a run on another machine writes it."""
    return {
        "host": "elsewhere",
        "pid": 4242,
        "started": "2026-01-01T00:00:00+00:00",
        "token": "0" * 32,
        "heartbeat": time.time() - heartbeat_age_s,
        "heartbeat_s": period_s,
        "boot_id": "another-machine",
    }


def test_a_held_lock_refuses_a_second_run_and_goes_on_release(gcs_emulator, gcs_bucket):
    out = f"gs://{gcs_bucket}/out"
    held = lock.acquire(out)
    try:
        owner = json.loads(gcs_emulator.read_bytes(_lock_url(out)))
        assert owner["pid"] == os.getpid() and owner["heartbeat_s"] == lock.HEARTBEAT_S
        with pytest.raises(lock.OutputInUse, match=rf"in use by another run \(pid {os.getpid()} "):
            lock.acquire(out)
    finally:
        held.release()
    assert gcs_emulator.list_names(out) == []


def test_a_live_lock_from_another_machine_is_respected(gcs_emulator, gcs_bucket):
    out = f"gs://{gcs_bucket}/out"
    gcs_emulator.upload_bytes(_lock_url(out), json.dumps(_owner_elsewhere(10)))
    with pytest.raises(lock.OutputInUse) as refused:
        lock.acquire(out)
    message = str(refused.value)
    assert "(pid 4242 on elsewhere, started 2026-01-01T00:00:00+00:00)" in message
    assert "its last heartbeat 10 s ago" in message and "taken over 120 s after" in message


def test_a_stale_lock_is_taken_over_by_one_run_only(gcs_emulator, gcs_bucket):
    """Two runs find the same stale lock at once: the generation precondition lets one win."""
    out = f"gs://{gcs_bucket}/out"
    gcs_emulator.upload_bytes(_lock_url(out), json.dumps(_owner_elsewhere(3600)))
    start = threading.Barrier(2)
    results = []

    def take():
        start.wait()
        try:
            results.append(lock.acquire(out))
        except lock.OutputInUse as error:
            results.append(error)

    threads = [threading.Thread(target=take) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    winners = [r for r in results if isinstance(r, lock.GcsLock)]
    assert len(results) == 2 and len(winners) == 1, results
    owner = json.loads(gcs_emulator.read_bytes(_lock_url(out)))
    assert owner["token"] == winners[0]._owner["token"]
    winners[0].release()
    assert gcs_emulator.list_names(out) == []


@pytest.mark.parametrize("sigint", ["python's", "ignored"])
def test_the_heartbeat_renews_the_lock_and_a_takeover_stops_the_run(
    gcs_emulator, gcs_bucket, monkeypatch, sigint
):
    """The takeover stops the run at once, even in a call that blocks, and in a run
    started in the background of a shell (SIGINT ignored, which interrupt_main obeys)."""
    monkeypatch.setenv(lock.HEARTBEAT_ENV, "0.5")
    out = f"gs://{gcs_bucket}/out"
    held = lock.acquire(out)
    previous = signal.signal(
        signal.SIGINT, signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler
    )
    try:
        first = json.loads(gcs_emulator.read_bytes(_lock_url(out)))["heartbeat"]
        held.start_heartbeat()
        deadline = time.monotonic() + 60
        while json.loads(gcs_emulator.read_bytes(_lock_url(out)))["heartbeat"] == first:
            assert time.monotonic() < deadline, "the heartbeat never renewed the lock"
            time.sleep(0.1)
        # Another run takes the lock over (as it would after this run went silent):
        # at its next beat this run finds out, and stops (job.run reports it).
        gcs_emulator.upload_bytes(_lock_url(out), json.dumps(_owner_elsewhere(0)))
        with pytest.raises(KeyboardInterrupt):
            time.sleep(60)
        assert held.lost
    finally:
        held.release()
        signal.signal(signal.SIGINT, previous)
    # Not deleted: it is the other run's now.
    assert json.loads(gcs_emulator.read_bytes(_lock_url(out)))["host"] == "elsewhere"


def test_a_killed_runs_lock_on_this_machine_is_taken_over_at_once(
    gcs_emulator, tmp_path, monkeypatch
):
    """A second run is refused while the first lives; once it is SIGKILLed (its lock
    object left behind, its heartbeat fresh), the same command resumes it.

    Driven by events only: the first run is held (tests/held_run.py) so it cannot
    end, and frozen (SIGSTOP, its whole group) once it has spilled a record (what
    the rerun resumes), so however slowly the second run starts, the first is
    still alive, holding its lock, when the second asks.
    """
    images = tmp_path / "images"
    make_class_folders(str(images), per_class=400, nested=False, size_range=(200, 400))
    bucket = gcs_emulator.create_bucket()
    out = f"gs://{bucket}/out"
    monkeypatch.setenv("IMAGERECORDS_SPILL_DIR", str(tmp_path / "spill"))  # so default_dir finds it
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    # A heartbeat period far longer than the test: the lock is never stale by age,
    # so the takeover below can only come from the owner's process being gone.
    env[lock.HEARTBEAT_ENV] = "3600"
    command = [sys.executable, "-m", "beam_pipeline", "--input", str(images), "--output", out]
    command += ["--local_processes", "2"]
    gate = tmp_path / "gate"  # never created: the first run is killed while held
    first = subprocess.Popen(
        held_run.command(gate, 300, command[3:]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        for line in first.stderr:  # the lock is taken and the marker written before it
            if line.startswith("imagerecords: running on"):
                break
        while not held_run.spilled(out):
            assert first.poll() is None, "the first run ended before it spilled a record"
            time.sleep(0.02)
        os.killpg(first.pid, signal.SIGSTOP)
        assert first.poll() is None, "the first run ended before it was frozen"
        second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):  # (gone already: the asserts say why)
            os.killpg(first.pid, signal.SIGKILL)  # a stopped process dies of SIGKILL too
        first.wait()
    assert second.returncode == 2, second.stderr
    assert second.stderr.startswith(
        f"error: --output {out} is in use by another run (pid {first.pid}"
    )
    assert json.loads(gcs_emulator.read_bytes(_lock_url(out)))["pid"] == first.pid

    rerun = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert re.search(
        rf"took over the lock of --output from another run \(pid {first.pid} ", rerun.stderr
    )
    assert "resuming the unfinished run" in rerun.stderr
    assert not [n for n in gcs_emulator.list_names(out) if n.startswith(".imagerecords-tmp")]


def _generations(gcs_emulator, out: str) -> dict[str, int]:
    """Every object under ``out`` but the lock, with its generation (a rewrite changes it)."""
    bucket, prefix = out[len("gs://") :].split("/", 1)
    blobs = gcs_emulator.client().list_blobs(bucket, prefix=prefix + "/")
    return {b.name: b.generation for b in blobs if not b.name.endswith("/lock")}


def test_a_run_that_lost_its_gs_lock_writes_nothing_more_into_that_output(gcs_emulator, tmp_path):
    """Frozen (SIGSTOP) once it runs, its lock taken over meanwhile, then woken: the run
    stops with one line before its next write, and that output is as it was left.

    The run's heartbeat period is longer than the test, so the run cannot learn of
    the takeover from its heartbeat: only the fence on its writes stops it.
    """
    images = tmp_path / "images"
    make_class_folders(str(images), per_class=20, nested=False, size_range=(60, 120))
    bucket = gcs_emulator.create_bucket()
    out = f"gs://{bucket}/out"
    env = dict(os.environ, IMAGERECORDS_SPILL_DIR=str(tmp_path / "spill"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env[lock.HEARTBEAT_ENV] = "3600"
    command = [sys.executable, "-m", "beam_pipeline", "--input", str(images), "--output", out]
    run = subprocess.Popen(
        [*command, "--local_processes", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        for line in run.stderr:  # the lock is taken and the marker written before it
            if line.startswith("imagerecords: running on"):
                os.killpg(run.pid, signal.SIGSTOP)
                break
        assert run.poll() is None, "the run ended before it said it runs"
        before = _generations(gcs_emulator, out)
        assert f"out/{lock.LOCK.rsplit('/', 1)[0]}/job.json" in before  # its marker
        # Another run takes the lock over (as it would once this one's heartbeat is stale).
        gcs_emulator.upload_bytes(_lock_url(out), json.dumps(_owner_elsewhere(0)))
        os.killpg(run.pid, signal.SIGCONT)
        err = run.stderr.read()
        run.wait(timeout=300)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 1, err
    lines = err.strip().splitlines()
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]], err
    assert lines[-1].startswith(
        f"error: this run lost its lock of --output {out} while it was stopped or out of "
        "reach: it is held by another run (pid 4242 on elsewhere, "
    ), err
    assert _generations(gcs_emulator, out) == before
    assert json.loads(gcs_emulator.read_bytes(_lock_url(out)))["host"] == "elsewhere"

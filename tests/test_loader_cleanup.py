"""The Grain pipeline leaves no shared memory behind, and no resource_tracker warning.

Each loop runs in a Python process of its own (the warning is printed as the
interpreter exits): the Grain block of docs/trainers.md as written, a loop
that raises, and a loop whose worker is killed. Its segments are found in
/dev/shm by their names, which carry that process's id, so other processes'
segments do not count. The PyTorch loader's cases are in
tests/test_imagerecords_torch.py (they need its venv).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from imagerecords import grain as imagerecords_grain
from tests import trainer_fixtures

REPO = Path(__file__).resolve().parent.parent
SHM = imagerecords_grain._SHM_DIR
pytestmark = pytest.mark.skipif(not os.path.isdir(SHM), reason="needs /dev/shm (Linux)")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return trainer_fixtures.convert(tmp_path_factory.mktemp("cleanup"))


def documented_grain_block() -> str:
    """The first ```python block under docs/trainers.md's "## Grain"."""
    text = (REPO / "docs" / "trainers.md").read_text()
    section = text[text.index("\n## Grain\n") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def segments_of(pid: int) -> list[str]:
    """The segment names made for process ``pid`` (by its workers) still in /dev/shm."""
    prefix = imagerecords_grain.segment_prefix(pid)
    return sorted(name for name in os.listdir(SHM) if name.startswith(prefix))


def run_script(tmp_path: Path, code: str, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    """``code`` run as a script in a Python process of its own; its result and its pid."""
    script = tmp_path / "loop.py"
    script.write_text(code)
    process = subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(
        process.args, process.returncode, stdout, stderr
    ), process.pid


def assert_clean(result: subprocess.CompletedProcess, pid: int) -> None:
    assert "resource_tracker" not in result.stderr and "leaked" not in result.stderr, result.stderr
    assert segments_of(pid) == []


@pytest.mark.e2e
def test_the_documented_grain_loop_leaves_nothing(dataset, tmp_path):
    (tmp_path / "photos-records").symlink_to(dataset.path)
    result, pid = run_script(tmp_path, documented_grain_block())
    assert result.returncode == 0, result.stderr
    assert "val records" in result.stdout
    assert_clean(result, pid)


# One loop, told how to end: "raise" (the loop body fails), "kill" (a worker is
# killed with SIGKILL; the pipeline then fails, and the loop goes on to close).
# It prints, as JSON, the names its workers left at each point it reaches.
LOOP = textwrap.dedent(
    """
    import json, multiprocessing, os, signal, sys
    from imagerecords import grain as imagerecords_grain

    def left():
        prefix = imagerecords_grain.segment_prefix(os.getpid())
        return sorted(n for n in os.listdir(imagerecords_grain._SHM_DIR) if n.startswith(prefix))

    def main(path, how):
        pipeline = imagerecords_grain.dataset(
            path, "train", batch_size=4, image_size=24, training=True, num_workers=2
        )
        iterator = iter(pipeline)
        held = [next(iterator) for _ in range(3)]  # batches the loop still holds
        if how == "raise":
            raise RuntimeError("the loop's own error")
        killed = multiprocessing.active_children()[0].pid
        os.kill(killed, signal.SIGKILL)
        try:
            while True:
                held.append(next(iterator))
        except RuntimeError as error:
            failed = str(error)
        print(json.dumps({"failed": failed, "killed": killed, "left": left()}))
        iterator.close()
        print(json.dumps({"closed": left(), "held": len(held)}))

    if __name__ == "__main__":
        main(*sys.argv[1:])
    """
)


@pytest.mark.e2e
def test_a_loop_that_raises_leaves_nothing(dataset, tmp_path):
    result, pid = run_script(tmp_path, LOOP, dataset.path, "raise")
    assert result.returncode == 1 and "the loop's own error" in result.stderr
    assert_clean(result, pid)


@pytest.mark.e2e
def test_a_killed_worker_leaves_nothing(dataset, tmp_path):
    result, pid = run_script(tmp_path, LOOP, dataset.path, "kill")
    assert result.returncode == 0, result.stderr
    failed, closed = (json.loads(line) for line in result.stdout.splitlines())
    assert "terminated unexpectedly" in failed["failed"]
    # Once the pipeline fails, the killed worker's names are gone (its ring's
    # among them); once it is closed, every worker's, the held batches' too.
    killed = imagerecords_grain.segment_prefix(pid, failed["killed"])
    assert not [name for name in failed["left"] if name.startswith(killed)]
    assert closed["closed"] == [] and closed["held"] >= 3
    assert_clean(result, pid)


KILLED_OWNER = textwrap.dedent(
    """
    import json, multiprocessing, os, signal, sys
    from imagerecords import grain as imagerecords_grain

    if __name__ == "__main__":
        pipeline = imagerecords_grain.dataset(
            sys.argv[1], "train", batch_size=4, image_size=24, training=True, num_workers=2
        )
        iterator = iter(pipeline)
        held = [next(iterator) for _ in range(3)]
        workers = [child.pid for child in multiprocessing.active_children()]
        print(json.dumps(workers), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.e2e
def test_workers_whose_owner_is_killed_unlink_their_names_and_exit(dataset, tmp_path):
    """``kill -9`` of the training script: its workers (Grain's would wait on their
    queues for ever) notice, unlink their segments' names and exit."""
    script = tmp_path / "owner.py"
    script.write_text(KILLED_OWNER)
    process = subprocess.Popen(
        [sys.executable, str(script), dataset.path], stdout=subprocess.PIPE, text=True
    )
    workers = json.loads(process.stdout.readline())
    assert process.wait(timeout=300) == -9 and len(workers) == 2
    pidfds = []
    try:
        for pid in workers:
            try:
                pidfds.append(os.pidfd_open(pid))
            except ProcessLookupError:  # gone already
                pass
        for pidfd in pidfds:  # each becomes readable when its process exits
            ready, _, _ = select.select([pidfd], [], [], 60)
            assert ready, "a worker of the killed process is still running"
        assert segments_of(process.pid) == []
    finally:
        for pidfd in pidfds:  # never left running, whatever happened above
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # that process, not its pid's
            os.close(pidfd)
        process.stdout.close()
        for name in segments_of(process.pid):  # what a failed run left
            os.unlink(os.path.join(SHM, name))


@pytest.mark.e2e
def test_sweep_unlinks_the_names_of_ended_workers_only(tmp_path):
    """The names of a live child stay; those of a child that exited (reaped, or a
    zombie not yet waited for) or of a process that is not a child go; another
    owner's names, and names not of this module, are not touched."""
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    reaped = subprocess.Popen([sys.executable, "-c", ""])
    reaped.wait()
    zombie = subprocess.Popen([sys.executable, "-c", ""])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
    me, prefix = os.getpid(), imagerecords_grain.segment_prefix
    kept = {
        prefix(me, live.pid) + "a1",
        prefix(me + 1, reaped.pid) + "b2",  # another process's workers
        "psm_0123",
        f"{imagerecords_grain.SEGMENT_PREFIX}{me}x-1-c3",
    }
    gone = {prefix(me, reaped.pid) + "d4", prefix(me, zombie.pid) + "e5"}
    gone.add(prefix(me, os.getppid()) + "f6")  # alive, but not a child of this process
    try:
        for name in kept | gone:
            (tmp_path / name).write_bytes(b"x")
        swept = imagerecords_grain.sweep(str(tmp_path))
    finally:
        live.communicate(b"")
        zombie.wait()
    assert sorted(swept) == sorted(gone)
    assert sorted(os.listdir(tmp_path)) == sorted(kept)

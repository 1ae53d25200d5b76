"""A fuzzed dataset: 1,000 mutations of a real dataset's metadata through every reader.

The mutations (tests/fuzz_readers.py, seeded: the same cases every run) change
JSON values, types, numbers, nesting, names, TFDS templates and ``.idx``
lines, and replace published files with links out, FIFOs, folders and
devices. A child process runs RecordSource, ``reader.make_dataset`` (one
batch), ``reader.inspect --verify`` and the ``--reuse`` scan on each; this
test watches it. Each reader must end every case cleanly or with its one-line
error, never hang past :data:`HANG_S`, grow no more than :data:`MAX_RSS_KB` past its warm-up peak, and
never open a file outside the dataset: the sentinels the mutations point at
are watched with inotify (an open of any of them is an event; an open of the
FIFO that blocks is a hang).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import selectors
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import fuzz_readers

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
MUTATIONS = 1000
SEED = 43
HANG_S = 10  # per reader and case
WARM_UP_S = 300  # imports and TensorFlow's first pipeline, on a loaded machine
MAX_RSS_KB = 1 << 20  # 1 GiB, past what the readers hold once warm (TensorFlow and all)
IN_ACCESS, IN_OPEN = 0x1, 0x20
IN_NONBLOCK = os.O_NONBLOCK
_EVENT = struct.Struct("iIII")


class Watch:
    """inotify on a folder: every open or read of a file in it is an event."""

    def __init__(self, folder: Path):
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = self._libc.inotify_init1(IN_NONBLOCK)
        if self.fd < 0:
            pytest.skip(f"inotify is not available here (errno {ctypes.get_errno()})")
        if self._libc.inotify_add_watch(self.fd, bytes(folder), IN_OPEN | IN_ACCESS) < 0:
            pytest.skip(f"inotify cannot watch {folder} (errno {ctypes.get_errno()})")

    def events(self) -> list[str]:
        """The names of the files opened or read since the last call."""
        names = []
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return names
            at = 0
            while at < len(data):
                _, mask, _, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0")
                names.append(f"{name.decode() or '.'} ({'open' if mask & IN_OPEN else 'read'})")
                at += _EVENT.size + size

    def close(self):
        os.close(self.fd)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return fuzz_readers.make_dataset(tmp_path_factory.mktemp("fuzz"))


def test_the_watch_sees_an_open(tmp_path, pristine):
    # The fuzz test's evidence: an open of a sentinel, even one that neither
    # reads nor blocks, is an event.
    outside = tmp_path / "outside"
    fuzz_readers.make_sentinels(outside, pristine)
    watch = Watch(outside)
    assert watch.events() == []
    os.close(os.open(outside / "sentinel.fifo", os.O_RDONLY | os.O_NONBLOCK))
    os.stat(outside / "sentinel.tfrecord")  # a stat is no open
    os.path.realpath(outside / "sentinel.json")
    with open(outside / "sentinel.idx", "rb") as f:
        f.read()
    assert watch.events() == ["sentinel.fifo (open)", "sentinel.idx (open)", "sentinel.idx (read)"]
    watch.close()


@pytest.mark.timeout(1800)
def test_every_reader_survives_a_thousand_mutations(tmp_path, pristine):
    work = tmp_path / "work"
    outside = work / "outside"  # what the mutations' "../outside/..." names reach
    fuzz_readers.make_sentinels(outside, pristine)
    watch = Watch(outside)
    command = [sys.executable, "-m", "tests.fuzz_readers", str(pristine), str(work)]
    command += [str(outside), str(SEED), str(MUTATIONS)]
    stderr = (tmp_path / "stderr.txt").open("wb")
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr)
    selector = selectors.DefaultSelector()
    selector.register(child.stdout, selectors.EVENT_READ)
    bad, over, opened, done = [], [], [], {reader: 0 for reader in fuzz_readers.READERS}
    case, running, deadline, buffer, finished = "", None, time.monotonic() + WARM_UP_S, b"", False
    baseline = 0  # KB, the child's peak after its warm-up
    try:
        while not finished:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                pytest.fail(f"{running or 'the warm-up'} ran past {HANG_S} s on case {case}")
            chunk = os.read(child.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in (raw.decode("utf-8", "replace") for raw in lines):
                word, _, rest = line.partition(" ")
                if word == "baseline":
                    baseline = int(rest)
                elif word == "case":
                    case = rest
                elif word == "start":
                    running, deadline = rest, time.monotonic() + HANG_S
                elif word in ("done", "bad"):
                    number, reader, rss, outcome = rest.split(" ", 3)
                    done[reader] += word == "done"
                    if word == "bad":
                        bad.append(f"case {case}: {reader}: {outcome}")
                    if int(rss) - baseline > MAX_RSS_KB:
                        grown = (int(rss) - baseline) // 1024
                        over.append(f"case {case}: {reader}: RSS grew {grown} MB past the warm-up")
                    opened += [f"case {case}: {reader}: {e}" for e in watch.events()]
                    running, deadline = None, time.monotonic() + WARM_UP_S
                elif word == "finished":
                    finished = True
                elif bad and not word:
                    continue
                elif bad and word not in ("warm",):
                    bad[-1] += "\n" + line  # the traceback of the last bad case
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        stderr.close()
        watch.close()
    assert finished and child.returncode == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
    assert not opened, "\n".join(opened[:20])
    assert not bad, "\n\n".join(bad[:5])
    assert not over, "\n".join(over[:10])
    assert done == {reader: MUTATIONS for reader in fuzz_readers.READERS}

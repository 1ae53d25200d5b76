"""Progress a person can read: live lines on a terminal, plain lines in a log, none with --quiet."""

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

import pytest

from beam_pipeline.engines import progress
from beam_pipeline.storage import discovery, listing
from tests.image_factory import make_class_folders

PER_CLASS = 40
IMAGES = 3 * PER_CLASS


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress") / "images"
    make_class_folders(str(root), per_class=PER_CLASS)
    # Entries listing leaves out or skips: not in the total.
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "cat" / ".hidden.jpg").write_bytes(b"hidden")
    os.makedirs(root / "dog" / ".cache")
    (root / "dog" / ".cache" / "x.jpg").write_bytes(b"hidden folder")
    return root


def _cli(folder, output, *extra):
    argv = [sys.executable, "-m", "beam_pipeline", "--input", str(folder), "--output", str(output)]
    return argv + list(extra)


def test_a_phase_in_a_log_says_done_total_rate_and_time_left():
    stream = io.StringIO()
    reporter = progress.Reporter(stream, interactive=False, plain_interval_s=0)
    with reporter.phase("converting", total=200) as phase:
        phase.update(50, skipped=10, resumed=10, rejected=2)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("imagerecords: converting 50/200 images (25.0%), ")
    assert " images/s, " in lines[0] and " left (resumed 10, rejected 2)" in lines[0]
    assert lines[1].startswith("imagerecords: converting: 50 images in 00:0")
    assert lines[1].endswith("(resumed 10, rejected 2)")


def test_a_log_gets_a_line_per_interval_not_per_update():
    stream = io.StringIO()
    reporter = progress.Reporter(stream, interactive=False, plain_interval_s=3600)
    with reporter.phase("converting", total=1000) as phase:
        for _ in range(1000):
            phase.update(1)
    (only,) = stream.getvalue().splitlines()  # the closing line alone
    assert only.startswith("imagerecords: converting: 1,000 images in ")


def test_the_rate_leaves_out_work_found_done():
    phase = progress.Reporter(io.StringIO(), interactive=False).phase("converting", 100)
    phase.update(90, skipped=90)
    assert phase.rate(phase.started + 10) == 0
    phase.update(5)
    assert phase.rate(phase.started + 10) == 0.5
    assert "00:10 left" in phase.line(phase.started + 10)  # 5 more at 0.5 images/s


def test_a_silent_reporter_writes_nothing():
    stream = io.StringIO()
    reporter = progress.Reporter(stream, enabled=False, interactive=True)
    with reporter.phase("converting", 10) as phase:
        phase.update(10)
    reporter.step("planned")
    assert stream.getvalue() == ""


def test_the_estimate_counts_what_listing_lists(folder):
    layout = discovery.discover(str(folder))
    listed = [
        row
        for source in layout.sources
        for row in layout.rows(source)
        if not isinstance(row, listing.Skipped)
    ]
    assert discovery.estimate_image_count(layout) == len(listed) == IMAGES


@pytest.mark.e2e
def test_a_run_logged_to_a_file_says_each_phase(folder, tmp_path):
    run = subprocess.run(
        _cli(folder, tmp_path / "out"), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert f"imagerecords: converting: {IMAGES} images in" in "\n".join(lines)
    said = [line.split(":")[1].strip() for line in lines if line.startswith("imagerecords: ")]
    steps = [s for s in said if s in ("converting", "planning", "publishing") or "shard" in s]
    # Planning is announced before its work (it takes seconds at a million images),
    # then its result; writing names its shard count.
    assert steps[0] == "converting" and steps[1] == "planning", steps
    assert steps[2].startswith("planned ") and steps[2].endswith(" splits"), steps
    assert re.fullmatch(r"writing \d+ shards", steps[3]), steps
    assert steps[-1] == "publishing", steps
    assert re.search(rf"imagerecords: writing \d+ shards: {IMAGES} records in", run.stderr)
    assert "\r" not in run.stderr  # no redrawing in a log


@pytest.mark.e2e
def test_quiet_shows_no_progress(folder, tmp_path):
    run = subprocess.run(
        _cli(folder, tmp_path / "out", "--quiet"), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert "converting" not in run.stderr and "writing" not in run.stderr


def _read_all(fd, process) -> bytes:
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            out += chunk
        elif process.poll() is not None:
            break
    return out


def _shown_on_terminal(command: list[str], rows: int, columns: int) -> str:
    """What ``command`` shows on a pseudo-terminal of that size; it must exit 0."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    try:
        shown = _read_all(leader, process).decode("utf-8", "replace")
    finally:
        os.close(leader)
        process.wait(timeout=300)
    assert process.returncode == 0, shown
    return shown


# A terminal of 120 columns, and one that says 0 x 0 (a pseudo-terminal whose
# size nobody set, as `script` or `docker run -t` give): tqdm hid the line there.
@pytest.mark.e2e
@pytest.mark.parametrize("rows, columns", [(40, 120), (0, 0)])
def test_a_terminal_gets_a_live_line_with_total_and_time_left(folder, tmp_path, rows, columns):
    shown = _shown_on_terminal(_cli(folder, tmp_path / "out"), rows, columns)
    # Redrawn in place, with done/total, a percentage and the time left ([elapsed<left]).
    assert "\rimagerecords: converting: 100%|" in shown
    assert f"| {IMAGES}/{IMAGES} [" in shown
    # The rate, in whichever form tqdm picks for it: below one image a second
    # (a slow or loaded machine) it shows seconds per image instead.
    assert "<00:" in shown and re.search(r"\d( images/s|s/ images)\]", shown), shown
    # Writing counts records, so a run of a few big shards still moves.
    assert re.search(rf"imagerecords: writing \d+ shards: 100%\|[^\r]*\| {IMAGES}/{IMAGES} ", shown)


BEAM = ("--runner", "DirectRunner")


@pytest.mark.e2e
def test_a_beam_run_in_a_terminal_gets_the_live_line_with_total_and_time_left(folder, tmp_path):
    shown = _shown_on_terminal(_cli(folder, tmp_path / "out", *BEAM), 40, 120)
    assert "imagerecords: running on DirectRunner (in_memory" in shown
    assert "\rimagerecords: converting: 100%|" in shown
    assert f"| {IMAGES}/{IMAGES} [" in shown and " images/s" in shown


@pytest.mark.parametrize("processes", ["1", "2"])  # converted in the step, or on the pool
def test_a_beam_run_in_a_log_says_done_total_percentage_and_time_left(
    folder, tmp_path, capsys, monkeypatch, processes
):
    from beam_pipeline.__main__ import main

    monkeypatch.setattr(progress, "PLAIN_INTERVAL_S", 0.0)  # a line per image, not per 15 s
    argv = ["--input", str(folder), "--output", str(tmp_path / "out"), *BEAM]
    assert main([*argv, "--local_processes", processes]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("imagerecords: converting")]
    pattern = rf"imagerecords: converting (\d+)/{IMAGES} images \(\d+\.\d%\), [\d,]+ images/s, \d\d:\d\d left"
    counts = [int(re.fullmatch(pattern, line).group(1)) for line in lines[:-1]]
    assert counts == list(range(1, IMAGES + 1)), lines
    assert re.fullmatch(rf"imagerecords: converting: {IMAGES} images in \d\d:\d\d", lines[-1])
    assert "images so far" not in err


def test_a_terminal_line_leaves_work_found_done_out_of_its_rate_and_time_left():
    """A resumed run's first images come back at once: no rate, no time left, from them.

    With tqdm's own rate, the 90 resumed images would show as a rate of
    millions of images/s and "00:00 left" for the other 10.
    """
    stream = io.StringIO()
    reporter = progress.Reporter(stream, interactive=True)
    with reporter.phase("converting", total=100) as phase:
        phase.update(90, skipped=90, resumed=90)
    last = stream.getvalue().split("\r")[-1]
    assert "| 90/100 [00:00<?, ? images/s, resumed 90]" in last

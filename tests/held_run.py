"""A CLI run that cannot finish before its test lets it.

    python -m tests.held_run GATE AFTER -- ARGS...

runs ``python -m beam_pipeline ARGS`` with one change: once AFTER images
have been begun in all (the command line and every process forked from it
count together), each converting process waits until the file GATE exists
before it converts its next image (outside the per-image time limit). The
count is shared, not per process: the converter hands results back in order,
so a process held on its own count while the other still had work could
stall the run with fewer images converted than the test waits for. A test that needs a
run still going (to start a second one into its output, to kill it)
otherwise races the run's end, which a fast or idle machine can reach before
the test acts; with the run held, the test acts first for certain, then
creates GATE (or kills the run, or sends it a Ctrl-C). The first process
held creates :func:`held_marker` of GATE: the event a test waits for, after
which the run can go no further until GATE exists. The local conversion
processes are forked from the command line, so they inherit the change.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import runpy
import sys
import time

from beam_pipeline.core import spill
from beam_pipeline.stages import convert


def held_marker(gate) -> str:
    """The file that appears once the run is held (the first process waits at GATE)."""
    return f"{gate}.held"


def spilled(output: str) -> int:
    """Records a run into ``output`` has spilled so far (what a rerun resumes); a
    spill file the run is renaming as it is read counts nothing."""
    count = 0
    for path in spill.spill_files(spill.default_dir(str(output))):
        with contextlib.suppress(FileNotFoundError):
            count += sum(1 for _ in spill.scan(path))
    return count


def command(gate, after: int, args: list[str]) -> list[str]:
    """The command line that runs ``python -m beam_pipeline args``, held after ``after``."""
    return [sys.executable, "-m", "tests.held_run", str(gate), str(after), "--", *map(str, args)]


def hold(gate: str, after: int) -> None:
    """Makes every process of this one (forks included) wait for ``gate`` once
    ``after`` images have been begun by all of them together."""
    real = convert.decode_data
    # Shared memory, made before the pool forks: every process counts into it.
    begun = multiprocessing.get_context("fork").Value("q", 0)

    def decode_data(*args, **kwargs):
        with begun.get_lock():
            begun.value += 1
            held = begun.value > after
        if held and not os.path.exists(gate):
            open(held_marker(gate), "a").close()
        while held and not os.path.exists(gate):
            time.sleep(0.01)
        return real(*args, **kwargs)

    convert.decode_data = decode_data


def main() -> None:
    gate, after, separator, *args = sys.argv[1:]
    assert separator == "--", sys.argv
    hold(gate, int(after))
    sys.argv = ["beam_pipeline", *args]
    runpy.run_module("beam_pipeline", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

"""``python -m bench.tools.progress_cost``: what the progress line costs a conversion.

1. Per call: ``Phase.update`` a million times on a live bar (a terminal), on
   plain lines (a log) and silent (``--quiet``): microseconds per call, the
   cost the conversion loop pays per image.
2. End to end: the same local run on ``--images`` small distinct JPEGs (the
   scale benchmark's folder), its stderr a pseudo-terminal (the live bar
   redrawn in place) against ``--quiet``, alternating, best of ``--rounds``:
   wall and CPU seconds of the whole process tree, and their ratio.

    python -m bench.tools.progress_cost [--images 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import os
import pty
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from beam_pipeline.engines import progress
from bench.common.settings import CACHE_DIR, REPO_DIR
from bench.scale.growth import many_small_set

CALLS = 1_000_000


def per_call_us(reporter: progress.Reporter) -> float:
    """Best of three: microseconds per ``Phase.update`` call."""
    best = float("inf")
    for _ in range(3):
        with reporter.phase("converting", CALLS) as phase:
            start = time.perf_counter()
            for _ in range(CALLS):
                phase.update(1)
            best = min(best, time.perf_counter() - start)
    return best / CALLS * 1e6


def run_on_terminal(command: list[str]) -> tuple[float, float, str]:
    """Runs ``command`` with stdout and stderr on a pseudo-terminal; (wall s, tree CPU s, output)."""
    leader, follower = pty.openpty()
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, cwd=REPO_DIR
    )
    os.close(follower)
    chunks: list[bytes] = []

    def drain() -> None:  # a terminal that is not read blocks the writer
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    # wait4: the child's CPU with that of every process it waited for (its pool).
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    reader.join(timeout=5)
    os.close(leader)
    output = b"".join(chunks).decode("utf-8", "replace")
    if process.returncode != 0:
        raise SystemExit(f"the run failed ({process.returncode}):\n{output[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.progress_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--images", type=int, default=20_000, help="small JPEGs converted")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind; the best counts")
    args = parser.parse_args(argv)

    live = progress.Reporter(stream=io.StringIO(), interactive=True)
    plain = progress.Reporter(stream=io.StringIO(), interactive=False)
    print(f"Phase.update, per call (best of 3 x {CALLS:,} calls):")
    for name, reporter in (("live bar", live), ("plain lines", plain), ("quiet", progress.SILENT)):
        print(f"  {name:12s} {per_call_us(reporter):6.2f} us")

    folder = many_small_set(args.images, CACHE_DIR)
    out_root = Path(tempfile.mkdtemp(prefix="progress-cost-"))
    best: dict[str, tuple[float, float]] = {}
    try:
        for round_ in range(args.rounds):
            for mode in ("live", "quiet"):
                out = out_root / f"{mode}-{round_}"
                command = [sys.executable, "-m", "beam_pipeline", "--input", str(folder)]
                command += ["--output", str(out)] + (["--quiet"] if mode == "quiet" else [])
                wall, cpu, shown = run_on_terminal(command)
                if mode == "live" and "\r" not in shown:
                    raise SystemExit("the live run drew no live line: is this a terminal?")
                shutil.rmtree(out)
                was = best.get(mode, (float("inf"), float("inf")))
                best[mode] = (min(was[0], wall), min(was[1], cpu))
                print(f"  round {round_ + 1} {mode:5s}: {wall:6.1f} s wall, {cpu:6.1f} s CPU")
    finally:
        shutil.rmtree(out_root, ignore_errors=True)
    (live_wall, live_cpu), (quiet_wall, quiet_cpu) = best["live"], best["quiet"]
    print(
        f"{args.images:,} images, best of {args.rounds}: live bar {live_wall:.1f} s wall, "
        f"{live_cpu:.1f} s CPU; --quiet {quiet_wall:.1f} s wall, {quiet_cpu:.1f} s CPU; "
        f"live / quiet: {live_wall / quiet_wall:.3f}x wall, {live_cpu / quiet_cpu:.3f}x CPU "
        f"(load average {os.getloadavg()[0]:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

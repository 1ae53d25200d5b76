"""``python -m bench.tools.convert_ahead``: what converting ahead gains a pooled Beam run.

On the pooled path (``--runner DirectRunner``, more than one local process)
the command line has the pool convert the first images while Beam is
imported and the graph is built (``job.launch``, ``Pool.convert_ahead``).
This runs the same job on the web set with it and without it
(``job.CONVERT_AHEAD_LIMIT`` set to 0 in the child before ``main``),
alternating, ``--rounds`` times each: the wall seconds of each run, the best
and the median of each, and the gain.

    python -m bench.tools.convert_ahead [--images 450] [--rounds 3] [--processes 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common.data import ensure_image_set
from bench.common.settings import CACHE_DIR, REPO_DIR

# The child: the converter's own entry point, with convert-ahead on or off.
_CHILD = (
    "import sys; from beam_pipeline.cli import job; "
    "job.CONVERT_AHEAD_LIMIT = int(sys.argv.pop(1)); "
    "from beam_pipeline.__main__ import main; sys.exit(main())"
)


def one_run(images: str, out: str, processes: int, ahead: bool) -> float:
    """Wall seconds of one conversion of ``images`` into a fresh ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    limit = "1024" if ahead else "0"
    command = [sys.executable, "-c", _CHILD, limit, "--input", images, "--output", out]
    command += ["--runner", "DirectRunner", "--local_processes", str(processes), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO_DIR)}
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO_DIR, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=450)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    data = ensure_image_set("web", args.images, CACHE_DIR, f"ahead{args.images}")
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "out")
        for _ in range(args.rounds):
            for ahead in (True, False):
                times[ahead].append(one_run(str(data.path), out, args.processes, ahead))
    print(
        f"{data.num_images} web images, DirectRunner in_memory, "
        f"{args.processes} conversion processes, load {os.getloadavg()[0]:.1f}"
    )
    for ahead, label in ((True, "converting ahead"), (False, "not converting ahead")):
        runs = ", ".join(f"{t:.1f}" for t in times[ahead])
        print(
            f"{label:>22}: best {min(times[ahead]):.1f} s, median "
            f"{statistics.median(times[ahead]):.1f} s ({runs})"
        )
    gain = statistics.median(times[False]) - statistics.median(times[True])
    print(f"{'gain':>22}: {gain:.1f} s of the median")


if __name__ == "__main__":
    main()

"""``python -m bench.tools.near_run_cost``: what near-duplicate detection adds to a whole run.

    python -m bench.tools.near_run_cost [--images 20000] [--rounds 2]
    python -m bench.tools.near_run_cost --images 1280000 --rounds 1   # the scale point

The scale part's many-small-files folder (distinct 32x32 JPEGs, each its own
random picture: ``bench/scale/growth.py``) converted by the command line's
local engine, twice a round, alternating which goes first: as it is, and
with near-duplicate detection off (in the child, before ``main``,
``images.near_fingerprint`` returns nothing, so no fingerprint is made, no
band key is cut and the search has nothing to gather or pair; the stage's
pass over the records stays, so the ratio errs high). Each run alone:
wall seconds, CPU seconds of the whole process tree, peak RSS; then the
best CPU of each and their ratio. Writes ``bench/results/near_run.json``
and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from beam_pipeline.cli.summary import read_counters
from bench.common.procstats import run_measured
from bench.common.settings import CACHE_DIR, REPO_DIR, RESULTS_DIR
from bench.scale.growth import many_small_set

# The child: the converter's own entry point, with the fingerprint on or off.
# The entry point is imported first, as `python -m beam_pipeline` loads it
# (it sets what must be set before NumPy loads).
_CHILD = (
    "import sys\n"
    "from beam_pipeline.__main__ import main\n"
    "from beam_pipeline.core import images\n"
    "if sys.argv.pop(1) == 'off':\n"
    "    images.near_fingerprint = lambda image: b''\n"
    "sys.exit(main())\n"
)
MODES = ("on", "off")


def one_run(folder: Path, out: Path, mode: str, timeout_s: float) -> dict:
    """One conversion of ``folder`` into a fresh ``out``: its measurements."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-c", _CHILD, mode, "--input", str(folder), "--output", str(out)]
    proc = run_measured(
        command,
        cwd=REPO_DIR,
        env={**os.environ, "PYTHONPATH": str(REPO_DIR)},
        timeout_s=timeout_s,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        raise SystemExit(f"error: the run with near duplicates {mode} failed: {last}")
    counted = read_counters(proc.stdout)
    row = {
        "mode": mode,
        "wall_s": round(proc.wall_s, 1),
        "cpu_s": round(proc.cpu_s, 1),
        "peak_tree_rss_mb": round(proc.peak_tree_rss_mb),
        "images_converted": counted.get("images_converted", 0),
        "images_near_hashed": counted.get("images_near_hashed", 0),
        "near_duplicate_pairs": counted.get("near_duplicate_pairs", 0),
        "load_average": round(os.getloadavg()[0], 1),
    }
    print(f"[bench] near {mode:<3} {json.dumps(row)}", flush=True)
    return row


def markdown(result: dict) -> str:
    lines = [
        f"{result['images']:,} distinct 32x32 JPEGs (bench/scale/growth.py many_small_set), "
        "the local engine's default run, near-duplicate detection on and off "
        f"(`python -m bench.tools.near_run_cost --images {result['images']} "
        f"--rounds {result['rounds']}`), each run alone, rounds alternating which goes first.",
        "",
        "| near duplicates | wall s | CPU s (process tree) | CPU ms per image | peak RSS MB | "
        "fingerprinted | pairs | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["runs"]:
        lines.append(
            f"| {row['mode']} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | "
            f"{1000 * row['cpu_s'] / result['images']:.3f} | {row['peak_tree_rss_mb']} | "
            f"{row['images_near_hashed']:,} | {row['near_duplicate_pairs']:,} | "
            f"{row['load_average']} |"
        )
    lines += [
        "",
        f"Best CPU on / off: **{result['cpu_ratio']:.3f}x** (goal: at most 1.05x); "
        f"best wall on / off: {result['wall_ratio']:.3f}x.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=7200)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    folder = many_small_set(args.images, CACHE_DIR)
    runs = []
    with tempfile.TemporaryDirectory(prefix="near-run-") as work:
        out = Path(work) / "out"
        for number in range(args.rounds):
            for mode in MODES if number % 2 == 0 else MODES[::-1]:
                runs.append(one_run(folder, out, mode, args.timeout_s))
    best = {m: min(r["cpu_s"] for r in runs if r["mode"] == m) for m in MODES}
    wall = {m: min(r["wall_s"] for r in runs if r["mode"] == m) for m in MODES}
    result = {
        "images": args.images,
        "rounds": args.rounds,
        "runs": runs,
        "cpu_ratio": round(best["on"] / best["off"], 4),
        "wall_ratio": round(wall["on"] / wall["off"], 4),
    }
    text = markdown(result)
    print(text)
    if not args.no_write:
        (RESULTS_DIR / "near_run.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS_DIR / "near_run.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench.tools.near_run_cost``: what near-duplicate detection adds to a whole run.

    python -m bench.tools.near_run_cost [--images 20000] [--rounds 2]
    python -m bench.tools.near_run_cost --images 1280000 --rounds 1   # the scale point

The scale part's many-small-files folder (distinct 32x32 JPEGs, each its own
random picture: ``bench/scale/growth.py``) converted by the command line's
local engine, three ways a round, the order turning each round:

- ``on``: as it is;
- ``no-search``: every record still gets its fingerprint (the format holds
  one in every record, and its cost in a conversion has its own goal, the
  ``near`` benchmark's share of ``images.convert``), but the search is left
  out (in the child, before ``main``, ``near.find_local`` returns no
  groups): the issue's "the search on against without it";
- ``off``: no fingerprint either (the pixel hook's ``fingerprint`` returns
  nothing, so no band key is cut and the search has nothing to gather or
  pair; the stage's pass over the records stays, so that ratio errs high).

Each run alone: wall seconds, CPU seconds of the whole process tree, peak
RSS; then the best CPU of each and the ratios to ``on``. Writes
``bench/results/near_run.json`` and ``.md``.
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

# The child: the converter's own entry point, with a part of the feature left
# out. The entry point is imported first, as `python -m beam_pipeline` loads
# it (it sets what must be set before NumPy loads).
# With the search on, the child also times the search itself (CPU and wall
# around ``near.find_local``) and prints it on stderr: its share of the same
# run's CPU holds however fast the machine is at that moment, where the
# difference between two runs minutes apart does not (on this shared 2-core
# machine one configuration's 200,000-image run took 30 to 60 s).
_SEARCH_TAG = "[near-search] "
_CHILD = (
    "import json, sys, time\n"
    "from beam_pipeline.__main__ import main\n"
    "from beam_pipeline.features.near import feature\n"
    "from beam_pipeline.features.near import stage as near\n"
    "mode = sys.argv.pop(1)\n"
    "search = near.find_local\n"
    "def timed(batches, work_dir):\n"
    "    cpu, wall = time.process_time(), time.monotonic()\n"
    "    found = search(batches, work_dir)\n"
    "    took = {'cpu_s': time.process_time() - cpu, 'wall_s': time.monotonic() - wall}\n"
    f"    print({_SEARCH_TAG!r} + json.dumps(took), file=sys.stderr, flush=True)\n"
    "    return found\n"
    "near.find_local = timed\n"
    "if mode in ('no-search', 'off'):\n"
    "    near.find_local = lambda batches, work_dir: near.found_of([], [])\n"
    "def nothing(image):\n"
    "    return b''\n"
    "if mode == 'off':\n"
    "    feature.PIXELS = feature.PIXELS._replace(fingerprint=nothing)\n"
    "sys.exit(main())\n"
)
MODES = ("on", "no-search", "off")


def search_took(stderr: str) -> dict:
    """The child's own timing of its search (``{}`` when it did not search)."""
    for line in stderr.splitlines():
        if line.startswith(_SEARCH_TAG):
            return json.loads(line[len(_SEARCH_TAG) :])
    return {}


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
    took = search_took(proc.stderr)
    if took:
        row["search_cpu_s"] = round(took["cpu_s"], 1)
        row["search_wall_s"] = round(took["wall_s"], 1)
        row["search_share"] = round(took["cpu_s"] / proc.cpu_s, 4)
    print(f"[bench] near {mode:<3} {json.dumps(row)}", flush=True)
    return row


_MEANING = {
    "no-search": "the search (on against no-search)",
    "off": "the whole feature, fingerprints too (on against off)",
}


def markdown(result: dict) -> str:
    lines = [
        f"{result['images']:,} distinct 32x32 JPEGs (bench/scale/growth.py many_small_set), "
        f"the local engine's default run, modes {', '.join(result['modes'])} (the tool's "
        f"docstring; `python -m bench.tools.near_run_cost --images {result['images']} "
        f"--rounds {result['rounds']} --modes {','.join(result['modes'])}`), each run alone, "
        "the order turning each round.",
        "",
        "| mode | wall s | CPU s (process tree) | CPU ms per image | search CPU s (its share) "
        "| peak RSS MB | fingerprinted | pairs | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["runs"]:
        search = (
            f"{row['search_cpu_s']:.1f} ({100 * row['search_share']:.1f}%)"
            if "search_share" in row
            else "-"
        )
        lines.append(
            f"| {row['mode']} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | "
            f"{1000 * row['cpu_s'] / result['images']:.3f} | {search} | "
            f"{row['peak_tree_rss_mb']} | {row['images_near_hashed']:,} | "
            f"{row['near_duplicate_pairs']:,} | {row['load_average']} |"
        )
    lines += [
        "",
        f"The search's own CPU within a run with it: at most "
        f"**{100 * result['search_share_max']:.1f}%** of that run's CPU (goal: the run "
        "within 1.05x of its CPU without the search).",
        "",
    ]
    for mode in result["modes"][1:]:
        lines.append(
            f"- {_MEANING[mode]}: best CPU {result['cpu_ratio'][mode]:.3f}x, best wall "
            f"{result['wall_ratio'][mode]:.3f}x (runs minutes apart: they carry the "
            "machine's drift)."
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=7200)
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"which of {', '.join(MODES)} to run"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    if "on" not in modes or len(modes) < 2:
        parser.error(f"--modes: 'on' and at least one of {', '.join(MODES[1:])}")
    folder = many_small_set(args.images, CACHE_DIR)
    runs = []
    with tempfile.TemporaryDirectory(prefix="near-run-") as work:
        out = Path(work) / "out"
        for number in range(args.rounds):
            turn = number % len(modes)
            for mode in modes[turn:] + modes[:turn]:
                runs.append(one_run(folder, out, mode, args.timeout_s))
    best = {m: min(r["cpu_s"] for r in runs if r["mode"] == m) for m in modes}
    wall = {m: min(r["wall_s"] for r in runs if r["mode"] == m) for m in modes}
    result = {
        "images": args.images,
        "rounds": args.rounds,
        "modes": list(modes),
        "runs": runs,
        # Each mode's best CPU and wall against the best of "on".
        "cpu_ratio": {m: round(best["on"] / best[m], 4) for m in modes[1:]},
        "wall_ratio": {m: round(wall["on"] / wall[m], 4) for m in modes[1:]},
        # The search's own share of each run with it: the drift-free figure.
        "search_share_max": max(r["search_share"] for r in runs if r["mode"] == "on"),
    }
    text = markdown(result)
    print(text)
    if not args.no_write:
        (RESULTS_DIR / "near_run.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS_DIR / "near_run.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

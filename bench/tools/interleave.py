"""Two commits' converter and reader (or trainers') ratios, measured in alternating rounds.

``python -m bench.tools.interleave OLD [NEW] --rounds 3`` (NEW: this
checkout's HEAD) checks each commit out in its own git worktree under
``bench/.cache/interleave/``, then runs, round after round, one round of each
commit's own ``python -m bench --only converter`` (the codec floor and
imagerecords, web and phone) and ``--only reader``, the two commits
alternating and taking turns to go first (OLD NEW, NEW OLD, OLD NEW, ...), so
that a burst of load from another job, or the machine slowing down as the
run goes on, falls on both. Each round's headline ratios are those of
``report.ratios`` (imagerecords over the floor, the reader over
image_dataset_from_directory), read from that round's ``results.json``;
every ratio is of two tools timed in the same round of the same commit, so
it holds up on a loaded machine better than any images/s does. The load
average before and after each round is kept with it.

Writes ``interleave-OLD-NEW.json`` and ``.md`` to ``--out`` (default
``bench/results/raw/interleave/``, gitignored) and prints the table. The
worktrees are removed on every way out; the image sets are generated once,
by this checkout, and shared by both (``bench/common/data.py``'s recipe has
not changed since the commits this was written for: a commit with another
recipe would generate its own into its cache).

``--suite trainers`` times ``python -m bench --only trainers`` instead: each
loader's CPU per image and images/s over the one-thread floor's (``crop_loop``)
in the same round.

Examples::

    python -m bench.tools.interleave a030232 --rounds 3
    python -m bench.tools.interleave a030232 HEAD --rounds 3 --out bench/results
    python -m bench.tools.interleave 55b5400 --suite trainers --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path

from bench import report
from bench.common import data
from bench.common.procstats import tree_sample
from bench.common.settings import CACHE_DIR, FULL, REPO_DIR, RESULTS_DIR
from bench.train.pipelines import VARIANTS

WORK_DIR = CACHE_DIR / "interleave"
# The ratios compared, as report.ratios names them, with their labels.
HEADLINES = {
    "converter_web_vs_floor": "web converter / codec floor (images/s)",
    "converter_phone_vs_floor": "phone converter / codec floor (images/s)",
    "reader_train_vs_keras": "reader (train) / image_dataset_from_directory (images/s)",
    "converter_web_cpu_floor_over_ir": "web: floor CPU / imagerecords CPU per image",
    "converter_phone_cpu_floor_over_ir": "phone: floor CPU / imagerecords CPU per image",
    "reader_train_cpu_keras_dir_over_ir": "reader: Keras CPU / imagerecords CPU per image",
}
# One round of a commit: its own bench, the two halves the ratios need.
PARTS = (
    ("--only", "converter", "--converters", "floor,imagerecords", "--repeats", "1"),
    ("--only", "reader", "--read-rounds", "1"),
)
# The trainers suite: one round of every loader, each over the floor of the same round.
TRAINER_PARTS = (("--only", "trainers", "--read-rounds", "1"),)
TRAINER_FLOOR = "crop_loop"
TRAINER_LOADERS = tuple(v for v in VARIANTS if v != TRAINER_FLOOR)
TRAINER_HEADLINES = {
    **{f"{v}_cpu_over_floor": f"{v}: CPU per image / floor's (x)" for v in TRAINER_LOADERS},
    **{f"{v}_speed_over_floor": f"{v}: images/s / floor's (images/s)" for v in TRAINER_LOADERS},
}


def round_order(revs: tuple[str, str], rounds: int) -> list[tuple[int, str]]:
    """(round, commit) in the order they run: the two alternate, and take turns going first."""
    order = []
    for index in range(rounds):
        first, second = revs if index % 2 == 0 else revs[::-1]
        order += [(index, first), (index, second)]
    return order


def bench_commands(results_dir: Path, cache_dir: Path, parts=PARTS) -> list[list[str]]:
    """The ``python -m bench`` command lines of one round, run in the commit's worktree."""
    common = ["--results-dir", str(results_dir), "--cache-dir", str(cache_dir)]
    return [[sys.executable, "-m", "bench", *part, *common] for part in parts]


def headlines(results: dict) -> dict[str, float]:
    """The compared ratios of one round's ``results.json`` (NaN where a half failed)."""
    ratios = report.ratios(results)
    return {key: ratios[key] for key in HEADLINES}


def trainer_headlines(result: dict) -> dict[str, float]:
    """Each loader over the floor in one round's ``trainers.json`` (NaN where one failed)."""
    rows = {r["variant"]: r for r in result.get("rows", []) if r.get("ok")}
    floor = rows.get(TRAINER_FLOOR)
    out = {}
    for variant in TRAINER_LOADERS:
        row = rows.get(variant)
        both = row is not None and floor is not None
        cpu = row["cpu_ms_per_image"] / floor["cpu_ms_per_image"] if both else float("nan")
        speed = row["images_per_s"] / floor["images_per_s"] if both else float("nan")
        out[f"{variant}_cpu_over_floor"] = cpu
        out[f"{variant}_speed_over_floor"] = speed
    return out


@dataclasses.dataclass(frozen=True)
class Suite:
    """What one round runs, the file it reads back, and the ratios it compares."""

    parts: tuple
    result_file: str
    headlines: object  # results -> {key: ratio}
    labels: dict


SUITES = {
    "converter-reader": Suite(PARTS, "results.json", headlines, HEADLINES),
    "trainers": Suite(TRAINER_PARTS, "trainers.json", trainer_headlines, TRAINER_HEADLINES),
}


def spread(values: list[float]) -> dict:
    """Median, lowest and highest of the rounds that measured the ratio."""
    good = [v for v in values if v == v]  # NaN: that round's half failed
    if not good:
        return {"median": float("nan"), "low": float("nan"), "high": float("nan"), "rounds": 0}
    return {
        "median": statistics.median(good),
        "low": min(good),
        "high": max(good),
        "rounds": len(good),
    }


def summarize(
    rounds: list[dict], revs: tuple[str, str], labels: dict = HEADLINES
) -> dict[str, dict[str, dict]]:
    """ratio -> commit -> its spread over that commit's rounds."""
    return {
        key: {rev: spread([r["ratios"][key] for r in rounds if r["rev"] == rev]) for rev in revs}
        for key in labels
    }


def _x(value: float) -> str:
    return "n/a" if value != value else f"{value:.2f}x"


def markdown(result: dict, labels: dict = HEADLINES) -> str:
    """The comparison as Markdown: every round, then each ratio's median and range."""
    old, new = result["revs"]
    lines = [
        f"| round | commit | {' | '.join(labels[k].rsplit(' (', 1)[0] for k in labels)} "
        "| load (1 min) before / after |",
        "|---|---|" + "---:|" * len(labels) + "---|",
    ]
    for r in result["rounds"]:
        cells = " | ".join(_x(r["ratios"][k]) for k in labels)
        lines.append(
            f"| {r['round'] + 1} | {r['rev']} | {cells} "
            f"| {r['loadavg_before'][0]:.1f} / {r['loadavg_after'][0]:.1f} |"
        )
    lines += ["", f"| ratio | {old}: median (range) | {new}: median (range) |", "|---|---|---|"]
    for key, label in labels.items():
        cells = [
            f"{_x(s['median'])} ({_x(s['low'])}-{_x(s['high'])}, {s['rounds']} rounds)"
            for s in (result["summary"][key][old], result["summary"][key][new])
        ]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def _git(*args: str, cwd: Path = REPO_DIR) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def resolve(rev: str) -> str:
    """The commit ``rev`` names, abbreviated; one ``error:`` line when it names none."""
    try:
        return _git("rev-parse", "--short=7", "--verify", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(
            f"error: {rev!r} names no commit here: give a commit, tag or branch"
        ) from None


def add_worktree(commit: str) -> Path:
    """A fresh detached worktree of ``commit``; a folder already there is not trusted."""
    path = WORK_DIR / "worktrees" / commit
    if path.exists():
        raise SystemExit(
            f"error: {path} exists (left by an interrupted run?): remove it with "
            f"`git worktree remove --force {path}` and run again"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    _git("worktree", "add", "--detach", str(path), commit)
    # The trainers' torch rows run in the torch venv, which a fresh worktree lacks.
    torch_venv = REPO_DIR / ".venv-torch"
    if torch_venv.is_dir():
        (path / ".venv-torch").symlink_to(torch_venv)
    return path


def remove_worktree(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO_DIR, check=False)


def shared_cache(commit: str) -> Path:
    """The commit's own benchmark cache (its outputs, logs), with this checkout's image sets."""
    cache = WORK_DIR / "cache" / commit
    cache.mkdir(parents=True, exist_ok=True)
    link = cache / "data"
    if not link.is_symlink():
        link.symlink_to(CACHE_DIR / "data")
    return cache


def kill_tree(pid: int) -> None:
    """SIGKILL to ``pid`` and every descendant: bench starts each measured tool in a
    session of its own, which a Ctrl-C at the terminal does not reach."""
    _, tree, _ = tree_sample(pid)  # taken whole first: a killed parent's children move away
    for member in tree:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_round(
    worktree: Path, results_dir: Path, cache_dir: Path, suite: Suite = SUITES["converter-reader"]
) -> dict:
    """One round of a commit's benchmarks in its worktree: the result file it wrote."""
    # `--only` keeps the other halves of a results.json it finds: an earlier
    # run's numbers must never pass for this round's.
    shutil.rmtree(results_dir, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(worktree)}
    for command in bench_commands(results_dir, cache_dir, suite.parts):
        print(f"[interleave] {worktree.name}: {' '.join(command[1:])}", flush=True)
        with subprocess.Popen(command, cwd=worktree, env=env) as proc:
            try:
                code = proc.wait()
            except BaseException:  # Ctrl-C: the children go too, before the worktree does
                kill_tree(proc.pid)
                proc.wait()
                raise
        if code != 0:
            raise SystemExit(f"error: {worktree.name}'s bench exited {code} (see its output above)")
    return json.loads((results_dir / suite.result_file).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.interleave", description=__doc__.splitlines()[0]
    )
    parser.add_argument("old", help="the commit before (the baseline)")
    parser.add_argument("new", nargs="?", default="HEAD", help="the commit after (default HEAD)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "raw" / "interleave")
    parser.add_argument(
        "--suite", choices=sorted(SUITES), default="converter-reader", help="what a round runs"
    )
    args = parser.parse_args(argv)
    suite = SUITES[args.suite]
    if args.rounds < 1:
        raise SystemExit(f"error: --rounds {args.rounds}: give at least 1")
    revs = (resolve(args.old), resolve(args.new))
    if revs[0] == revs[1]:
        raise SystemExit(f"error: {args.old} and {args.new} are the same commit: give two")
    for name, count in (("web", FULL.web_images), ("phone", FULL.phone_images)):
        data.ensure_image_set(name, count, CACHE_DIR, FULL.name)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    worktrees: dict[str, Path] = {}
    rounds = []
    try:
        for rev in revs:
            worktrees[rev] = add_worktree(rev)
        for index, rev in round_order(revs, args.rounds):
            results_dir = WORK_DIR / "results" / rev / f"round-{index + 1}"
            before = [round(x, 2) for x in os.getloadavg()]
            results = run_round(worktrees[rev], results_dir, shared_cache(rev), suite)
            rounds.append(
                {
                    "round": index,
                    "rev": rev,
                    "loadavg_before": before,
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                    "ratios": suite.headlines(results),
                }
            )
            print(f"[interleave] round {index + 1} {rev}: {rounds[-1]['ratios']}", flush=True)
    finally:
        for path in worktrees.values():
            remove_worktree(path)
    result = {
        "revs": list(revs),
        "started_at": started,
        "finished_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "suite": args.suite,
        "rounds": rounds,
        "summary": summarize(rounds, revs, suite.labels),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.suite == "converter-reader" else f"-{args.suite}"
    stem = args.out / f"interleave-{revs[0]}-{revs[1]}{suffix}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result, suite.labels)
    stem.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

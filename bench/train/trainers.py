"""The same shards through each trainer's loader, side by side (issue 26).

Part of ``make bench`` (``python -m bench --only trainers`` runs it alone and
writes ``bench/results/trainers.md`` and ``trainers.json``); ``python -m
bench.trainers`` runs it on its own and writes under the cache instead.

Converts the benchmark's web set once (cached, as the reader half does), then
times each loader of ``bench.train.pipelines`` in its own child process
(``bench.train.worker``): fresh imports, its own thread pools and worker
processes, rounds interleaved so that a burst of load from elsewhere hits one
round of each loader. Reported per loader: the best round's images/s, and the
CPU per image of the loader's whole process tree, best and range over the
rounds (on a shared machine the steadier of the two), and that CPU over the
tf.data reader's in the same run.

Examples::

    python -m bench --only trainers        # 2,000 web images, batch 128, 2 rounds
    python -m bench.trainers --quick       # 48 images, batch 16: a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

from bench.common import data, machine
from bench.common.epochs import read_results
from bench.common.procstats import run_measured
from bench.common.settings import CACHE_DIR, FULL, QUICK, READ_IMAGE_SIZE, REPO_DIR, Sizes
from bench.convert import converters
from bench.train.pipelines import LABELS, TORCH_VARIANTS, VARIANTS
from imagerecords.codec import INFO_FILE

RESULT_NAME = "trainers"  # trainers.json and trainers.md
# The loader every other is compared with, in the same run.
BASELINE = "reader_uint8"
# The interpreter of the torch rows: the venv `make test-torch` builds (the
# shared one has no torch: ~3 GB of CUDA wheels).
TORCH_PYTHON = REPO_DIR / ".venv-torch" / "bin" / "python"


def records_for(sizes: Sizes, cache_dir: Path, log_dir: Path) -> Path:
    """The converted web set (converting it, untimed, if the cache has none)."""
    web = data.ensure_image_set("web", sizes.web_images, cache_dir, sizes.name)
    out_root = cache_dir / "out" / sizes.name
    out = converters.imagerecords_output(out_root, "web")
    if not (out / INFO_FILE).exists():
        print("[bench] converting the web set for the trainers' loaders ...", flush=True)
        result = converters.run_converter("imagerecords", web, out_root, log_dir, sizes.timeout_s)
        if not result.ok:
            raise SystemExit(f"error: the conversion failed: {result.note}")
    return out


def interpreter(variant: str, torch_python: Path = TORCH_PYTHON) -> str | None:
    """The Python that runs ``variant``: the torch venv's for the torch rows (None when
    there is none), else this one."""
    if variant not in TORCH_VARIANTS:
        return sys.executable
    return str(torch_python) if torch_python.exists() else None


def not_installed(variant: str) -> dict:
    """The round of a torch row with no torch venv: skipped, saying so."""
    return {
        "variant": variant,
        "ok": False,
        "skipped": True,
        "note": f"not run: torch is not installed (no {TORCH_PYTHON.relative_to(REPO_DIR)}; "
        "make test-torch builds it)",
    }


def run_one(variant: str, records: Path, sizes: Sizes, log_path: Path) -> dict:
    """One round of one loader, in its own process: the worker's result line."""
    python = interpreter(variant)
    if python is None:
        return not_installed(variant)
    cmd = [python, "-m", "bench.train.worker", "--variant", variant]
    cmd += ["--records", str(records), "--batch", str(sizes.read_batch_size)]
    cmd += ["--image-size", str(READ_IMAGE_SIZE)]
    cmd += ["--warmup", str(sizes.read_warmup_epochs), "--epochs", str(sizes.read_epochs)]
    proc = run_measured(cmd, cwd=REPO_DIR, timeout_s=sizes.timeout_s, log_path=log_path)
    result = read_results(proc.stdout).get(variant)
    if result is not None:
        result["peak_tree_rss_mb"] = round(proc.peak_tree_rss_mb)
        return result
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"variant": variant, "ok": False, "note": f"exit {proc.returncode}: {tail}"[:200]}


def summarize(variant: str, rounds: list[dict]) -> dict:
    """One table row from a loader's rounds: the best images/s and CPU per image, and the range.

    The best round is the one least disturbed by the machine's other work.
    """
    ok = [r for r in rounds if r["ok"]]
    row = {"variant": variant, "label": LABELS[variant], "ok": bool(ok), "rounds": rounds}
    if not ok:
        row["note"] = rounds[-1].get("note", "failed") if rounds else "not run"
        row["skipped"] = bool(rounds) and all(r.get("skipped") for r in rounds)
        return row
    cpu = [r["cpu_ms_per_image"] for r in ok]
    row.update(
        images_per_s=max(r["images_per_s"] for r in ok),
        cpu_ms_per_image=min(cpu),
        cpu_ms_range=[min(cpu), max(cpu)],
        peak_tree_rss_mb=max(r["peak_tree_rss_mb"] for r in ok),
        rounds_ok=len(ok),
    )
    return row


def cpu_ratios(rows: list[dict], baseline: str = BASELINE) -> dict[str, float]:
    """Each measured loader's best CPU per image over the baseline's, from the same run."""
    base = next((r for r in rows if r["variant"] == baseline and r["ok"]), None)
    if base is None:
        return {}
    return {r["variant"]: r["cpu_ms_per_image"] / base["cpu_ms_per_image"] for r in rows if r["ok"]}


def run_trainers(sizes: Sizes, cache_dir: Path, rounds: int, variants=VARIANTS) -> dict:
    """Every loader, ``rounds`` interleaved rounds each: the JSON-friendly result."""
    log_dir = cache_dir / "logs" / sizes.name
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    records = records_for(sizes, cache_dir, log_dir)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for round_index in range(rounds):
        for variant in variants:
            log_path = log_dir / f"trainer-{variant}-r{round_index}.log"
            result = run_one(variant, records, sizes, log_path)
            # Other jobs share the machine: each round keeps the load it ran under.
            result["loadavg_1min_end"] = round(os.getloadavg()[0], 2)
            runs[variant].append(result)
            figures = (
                f"{result['images_per_s']:8.1f} images/s {result['cpu_ms_per_image']:6.2f} "
                "CPU ms/image"
                if result["ok"]
                else f"n/a: {result['note']}"
            )
            print(
                f"[bench] trainer {variant:<16} round {round_index + 1}: {figures} "
                f"(load {result['loadavg_1min_end']})",
                flush=True,
            )
    info = json.loads((records / INFO_FILE).read_text())
    return {
        "sizes": sizes.name,
        "measured_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "code": machine.git_state(),
        "machine": {k: v for k, v in machine.describe().items() if k != "loadavg_start"},
        "loadavg_start": loadavg_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "train_images": int(info["splits"]["train"]["num_examples"]),
        "batch": sizes.read_batch_size,
        "image_size": READ_IMAGE_SIZE,
        "warmup": sizes.read_warmup_epochs,
        "epochs": sizes.read_epochs,
        "rounds": rounds,
        "rows": [summarize(v, runs[v]) for v in variants],
    }


def succeeded(result: dict) -> bool:
    """Every row measured, or skipped for want of its library (it says so): no failure."""
    return all(r["ok"] or r.get("skipped") for r in result["rows"])


def _number(value: float) -> str:
    return f"{value:,.0f}"


def table(result: dict) -> str:
    """The Markdown table of a result: one row per loader."""
    rounds = result["rounds"]
    ratios = cpu_ratios(result["rows"])
    lines = [
        f"| loader | images/s (best of {rounds}) | CPU ms per image (best of {rounds}; range) "
        f"| CPU per image, x {LABELS[BASELINE].split(',')[0]} | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        if not r["ok"]:
            lines.append(f"| {r['label']} | n/a: {r['note']} | | | |")
            continue
        low, high = r["cpu_ms_range"]
        ratio = f"{ratios[r['variant']]:.2f}" if r["variant"] in ratios else "n/a"
        lines.append(
            f"| {r['label']} | {_number(r['images_per_s'])} | "
            f"{r['cpu_ms_per_image']:.2f} ({low:.2f}-{high:.2f}) | {ratio} | "
            f"{r['peak_tree_rss_mb']} |"
        )
    return "\n".join(lines)


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Trainers' loaders on the same shards ({result['sizes']})",
        "",
        f"Measured {result['measured_at']} at {result['code']} on {m['nproc']} cores "
        f"({m['cpu_model']}); load average {result['loadavg_start']} at the start, "
        f"{result['loadavg_end']} at the end (a shared machine: other jobs were running).",
        f"The web set's train split ({result['train_images']:,} records, shorter side 256) "
        f"as training batches: a random window resized to {result['image_size']}x"
        f"{result['image_size']}, flipped half the time, uint8, batch {result['batch']}; "
        f"{result['warmup']} untimed and {result['epochs']} timed epochs per round, each "
        "loader in its own process, rounds interleaved. CPU is that of the loader's "
        "process and all its workers; peak RSS the whole tree's. What each loader does: "
        "`bench/train/pipelines.py`, docs/trainers.md. Reproduce: `python -m bench "
        + ("--quick " if result["sizes"] == QUICK.name else "")
        + f"--only trainers --read-rounds {result['rounds']}` (part of `make bench`).",
        "",
        table(result),
    ]
    return "\n".join(lines) + "\n"


def write(result: dict, folder: Path) -> None:
    """``trainers.json`` and ``trainers.md`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{RESULT_NAME}.json").write_text(json.dumps(result, indent=1) + "\n")
    (folder / f"{RESULT_NAME}.md").write_text(markdown(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.trainers", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--rounds", type=int, default=None, help="default: 2 (quick: 1)")
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="default: all")
    parser.add_argument("--out", type=Path, help="where trainers.json and .md go")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else 2)
    result = run_trainers(sizes, CACHE_DIR, rounds, tuple(args.variant or VARIANTS))
    write(result, args.out or CACHE_DIR / "logs" / sizes.name)
    print(table(result))
    return 0 if succeeded(result) else 1


if __name__ == "__main__":
    sys.exit(main())

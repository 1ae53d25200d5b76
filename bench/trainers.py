"""``python -m bench.trainers``: the same shards through each trainer's loader, side by side.

Converts the benchmark's web set once (cached, as ``python -m bench`` does for
its reader half), then times each loader of ``bench.trainer_pipelines`` in its
own child process (``bench.trainer_worker``): fresh imports, its own thread
pools and worker processes, rounds interleaved so that a burst of load from
elsewhere hits one round of each loader; the best round of each is reported.

Examples::

    python -m bench.trainers            # 2,000 web images, batch 128, 2 rounds
    python -m bench.trainers --quick    # 48 images, batch 16: a smoke run

Writes ``trainers.json`` (and prints a table) under
``bench/.cache/logs/<sizes>/``, or ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from beam_pipeline.metadata import INFO_FILE
from bench import converters, data
from bench.procstats import run_measured
from bench.settings import CACHE_DIR, FULL, QUICK, READ_IMAGE_SIZE, REPO_DIR
from bench.trainer_pipelines import LABELS, VARIANTS


def records_for(sizes, log_dir: Path) -> Path:
    """The converted web set (converting it, untimed, if the cache has none)."""
    web = data.ensure_image_set("web", sizes.web_images, CACHE_DIR, sizes.name)
    out_root = CACHE_DIR / "out" / sizes.name
    out = converters.imagerecords_output(out_root, "web")
    if not (out / INFO_FILE).exists():
        print("[bench] converting the web set ...", flush=True)
        result = converters.run_converter("imagerecords", web, out_root, log_dir, sizes.timeout_s)
        if not result.ok:
            raise SystemExit(f"error: the conversion failed: {result.note}")
    return out


def run_one(variant: str, records: Path, sizes, log_path: Path) -> dict:
    cmd = [sys.executable, "-m", "bench.trainer_worker", "--variant", variant]
    cmd += ["--records", str(records), "--batch", str(sizes.read_batch_size)]
    cmd += ["--image-size", str(READ_IMAGE_SIZE)]
    cmd += ["--warmup", str(sizes.read_warmup_epochs), "--epochs", str(sizes.read_epochs)]
    proc = run_measured(cmd, cwd=REPO_DIR, timeout_s=sizes.timeout_s, log_path=log_path)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            result = json.loads(line[len("BENCH_RESULT ") :])
            result["peak_tree_rss_mb"] = round(proc.peak_tree_rss_mb)
            return result
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"variant": variant, "ok": False, "note": f"exit {proc.returncode}: {tail}"[:200]}


def table(results: list[dict]) -> str:
    lines = [
        "| loader | images/s | CPU ms per image | peak RSS (MB) |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        if r["ok"]:
            lines.append(
                f"| {LABELS[r['variant']]} | {r['images_per_s']:.0f} | "
                f"{r['cpu_ms_per_image']:.2f} | {r['peak_tree_rss_mb']} |"
            )
        else:
            lines.append(f"| {LABELS[r['variant']]} | n/a: {r['note']} | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainers", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--rounds", type=int, default=None, help="default: 2 (quick: 1)")
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="default: all")
    parser.add_argument("--out", type=Path, help="where trainers.json goes")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else 2)
    log_dir = CACHE_DIR / "logs" / sizes.name
    records = records_for(sizes, log_dir)
    best: dict[str, dict] = {}
    for round_index in range(rounds):
        for variant in args.variant or VARIANTS:
            result = run_one(
                variant, records, sizes, log_dir / f"trainer-{variant}-r{round_index}.log"
            )
            print(
                f"[bench] trainer {variant:<16} "
                + (
                    f"{result['images_per_s']:8.1f} images/s {result['cpu_ms_per_image']:6.2f} "
                    "CPU ms/image"
                    if result["ok"]
                    else f"n/a: {result['note']}"
                ),
                flush=True,
            )
            old = best.get(variant)
            if old is None or (
                result["ok"] and (not old["ok"] or result["images_per_s"] > old["images_per_s"])
            ):
                best[variant] = result
    results = list(best.values())
    out = args.out or log_dir / "trainers.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "sizes": sizes.name,
                "batch": sizes.read_batch_size,
                "rounds": rounds,
                "rows": results,
            },
            indent=1,
        )
        + "\n"
    )
    print(table(results))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

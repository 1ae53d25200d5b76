"""``python -m bench`` (``make bench``): the converter and reader benchmarks.

Examples::

    python -m bench                    # everything, full size (~10 min on 2 cores)
    python -m bench --quick            # tiny smoke run, results under bench/results/raw/quick
    python -m bench --only converter   # re-measure one half, keep the other half's numbers
    python -m bench --only reader
    python -m bench --only scale       # memory and speed at 1x, 8x, 64x the web set, and
                                       # 20k and 1M small files: full, killed, resumed
    python -m bench --only scale --scale-factors none   # the small files alone (keeps
                                       # the factor rows of the last scale.json)
    python -m bench --only reuse       # --reuse OLD of a grown folder vs a full conversion
    python -m bench --only trainers    # the shards through tf.data, TFDS and Grain loaders
    python -m bench --only codecs      # the codec study: Pillow vs libvips vs simplejpeg
    python -m bench --only near        # near-duplicate hashes: recall, false pairs, cost, scale
    python -m bench --report-only      # redraw table and chart from results.json

Only ``python -m bench`` without ``--quick`` (also with ``--only`` or
``--report-only``) writes the committed ``bench/results/``, unless
``--results-dir`` says otherwise: commit those files with the measurement
they record, and only then. Everything else (quick runs, the tools in
``bench.tools``, the test suite) writes under gitignored folders.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from pathlib import Path

from bench import report
from bench.common import data, machine, procstats, settings
from bench.common.settings import CACHE_DIR, FULL, QUICK, RESULTS_DIR, Sizes
from bench.convert import codecs, converters, quality
from bench.near import duplicates as near_duplicates
from bench.read import readers
from bench.scale import growth as scale
from bench.scale import reuse
from bench.train import trainers
from imagerecords.codec import INFO_FILE


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument(
        "--only",
        choices=("converter", "codecs", "reader", "scale", "trainers", "reuse", "near"),
        help="run one part",
    )
    parser.add_argument(
        "--scale-factors",
        help="sizes of the scale part, as multiples of the web set "
        f"(default: {','.join(map(str, scale.FULL_FACTORS))}; quick: "
        f"{','.join(map(str, scale.QUICK_FACTORS))}); 'none' keeps the last scale.json's rows",
    )
    parser.add_argument(
        "--scale-many",
        help="the scale part's many-small-files point(s): images, comma-separated "
        f"(default: {','.join(map(str, scale.MANY_SIZES))}; quick: "
        f"{','.join(map(str, scale.QUICK_MANY_SIZES))}); 0 keeps the last "
        "scale.json's",
    )
    parser.add_argument(
        "--sets",
        default="web,phone",
        help="image sets for the converter benchmark (comma-separated; default web,phone)",
    )
    parser.add_argument(
        "--converters",
        default=",".join(converters.CONVERTERS),
        help="converters to run (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="runs of each converter per set, best one reported (default: 3; quick: 1)",
    )
    parser.add_argument(
        "--read-rounds",
        type=int,
        help="rounds of every reader pipeline and trainer's loader, best one reported "
        "(default: 2; quick: 1)",
    )
    parser.add_argument(
        "--codec-rounds",
        type=int,
        help="interleaved rounds of the codec study, best one kept (default: 2; quick: 1)",
    )
    parser.add_argument(
        "--simd-python",
        help="an interpreter with Pillow-SIMD installed: adds its Pillow rows to the codec study",
    )
    parser.add_argument(
        "--reuse-baseline",
        type=Path,
        help="the reuse part also runs --reuse with this checkout's converter (another "
        "commit's worktree), each round: a same-run before/after of its CPU per reused image",
    )
    parser.add_argument(
        "--reuse-factors",
        help="the reuse part's sizes, as multiples of each set, e.g. web=1,phone=2 "
        f"(default: {','.join(f'{k}={v}' for k, v in reuse.FULL_FACTORS.items())})",
    )
    parser.add_argument(
        "--reuse-rounds",
        type=int,
        help="interleaved rounds of the reuse part (default: 3; quick: 1)",
    )
    parser.add_argument(
        "--near-scale",
        help="the near part's synthetic index sizes, images, comma-separated (default: "
        f"{','.join(map(str, near_duplicates.FULL_SCALE))}; quick: "
        f"{','.join(map(str, near_duplicates.QUICK_SCALE))})",
    )
    parser.add_argument("--results-dir", type=Path, help="default bench/results (quick: raw/quick)")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument(
        "--report-only", action="store_true", help="redraw from results.json, measure nothing"
    )
    return parser.parse_args(argv)


def results_folder(args: argparse.Namespace) -> Path:
    """Where a run writes its results: a quick run never writes the committed ones."""
    if args.results_dir:
        return args.results_dir
    return RESULTS_DIR / "raw" / "quick" if args.quick else RESULTS_DIR


def _previous(results_dir: Path, sizes: Sizes) -> dict:
    """The last results of the same size, so ``--only`` keeps the other half."""
    path = results_dir / "results.json"
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    return old if old.get("sizes") == sizes.name else {}


def _converter_half(args, sizes: Sizes, sets: dict, out_root: Path, log_dir: Path) -> dict:
    wanted = [c.strip() for c in args.converters.split(",") if c.strip()]
    rows = []
    for image_set in sets.values():
        converters.warm_page_cache(image_set)
        # Rounds are interleaved (floor, naive, imagerecords, floor, ...) so that a
        # burst of load from another job hits one round of each, not all of one tool.
        runs: dict[str, list] = {c: [] for c in wanted}
        for round_index in range(args.repeats):
            for converter in wanted:
                runs[converter].append(
                    converters.run_converter(
                        converter,
                        image_set,
                        out_root,
                        log_dir,
                        timeout_s=sizes.timeout_s,
                        tag=f"-r{round_index}" if args.repeats > 1 else "",
                    )
                )
        references: dict = {}  # each sampled source decoded once per set
        for converter in wanted:
            best = converters.best_of(runs[converter])
            if best.ok:
                out_dir = converters.output_dir(out_root, converter, image_set.name)
                best.psnr_db, best.ssim = quality.converter_quality(
                    converter, image_set, out_dir, references
                )
            rows.append(dataclasses.asdict(best))
    return {
        "measured_at": _now(),
        "code": machine.git_state(),
        "repeats": args.repeats,
        "rows": rows,
    }


def _codec_half(args, sizes: Sizes, sets: dict, out_root: Path, log_dir: Path) -> dict:
    limits = {"web": sizes.codec_web_images, "phone": sizes.codec_phone_images}
    rows = codecs.run_codecs(
        {n: s for n, s in sets.items() if n in limits},
        limits,
        out_root / "codecs",
        log_dir,
        rounds=args.codec_rounds,
        simd_python=args.simd_python,
    )
    return {
        "measured_at": _now(),
        "code": machine.git_state(),
        "rounds": args.codec_rounds,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "rows": [dataclasses.asdict(r) for r in rows],
    }


def _records_for_reader(sizes: Sizes, web: data.ImageSet, out_root: Path, log_dir: Path):
    """imagerecords' output for the web set, converting it (untimed) if needed."""
    out = converters.imagerecords_output(out_root, "web")
    if (out / INFO_FILE).exists():
        return out
    print("[bench] converting the web set for the reader benchmark ...", flush=True)
    result = converters.run_converter("imagerecords", web, out_root, log_dir, sizes.timeout_s)
    return out if result.ok else None


def _reader_half(
    sizes: Sizes, web: data.ImageSet, out_root: Path, log_dir: Path, rounds: int
) -> dict:
    records = _records_for_reader(sizes, web, out_root, log_dir)
    rows = readers.run_readers(
        web.path,
        records,
        batch=sizes.read_batch_size,
        warmup=sizes.read_warmup_epochs,
        epochs=sizes.read_epochs,
        one_process=sizes is QUICK,
        log_dir=log_dir,
        timeout_s=sizes.timeout_s,
        rounds=rounds,
    )
    return {
        "measured_at": _now(),
        "code": machine.git_state(),
        "batch": sizes.read_batch_size,
        "image_size": 224,
        "warmup": sizes.read_warmup_epochs,
        "epochs": sizes.read_epochs,
        "rounds": rounds,
        "rows": [dataclasses.asdict(r) for r in rows],
    }


def _sizes_arg(text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    if text is None:
        return default
    if text.strip().lower() in ("none", "0", ""):
        return ()
    return tuple(int(f.replace("_", "")) for f in text.split(","))


def _scale_part(args, sizes: Sizes, cache_dir: Path, results_dir: Path) -> int:
    """The scale benchmark: writes scale.md and scale.json next to results.md.

    A part that is not run (``--scale-factors none``, ``--scale-many 0``)
    keeps its rows from the last scale.json of the same size, with their own
    date and commit.
    """
    factors = _sizes_arg(
        args.scale_factors, scale.QUICK_FACTORS if sizes is QUICK else scale.FULL_FACTORS
    )
    many = _sizes_arg(
        args.scale_many, scale.QUICK_MANY_SIZES if sizes is QUICK else scale.MANY_SIZES
    )
    previous_path = results_dir / "scale.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
    if previous.get("sizes") != sizes.name:
        previous = {}
    out_root, log_dir = cache_dir / "out" / sizes.name, cache_dir / "logs" / sizes.name
    result: dict = {"sizes": sizes.name}
    ok = True
    if factors:
        web = data.ensure_image_set("web", sizes.web_images, cache_dir, sizes.name)
        loadavg = [round(x, 2) for x in os.getloadavg()]
        rows = scale.run_scale(
            web, factors, cache_dir, out_root, log_dir, timeout_s=sizes.timeout_s * max(factors)
        )
        ok = all(r.ok for r in rows)
        result.update(
            measured_at=_now(),
            code=machine.git_state(),
            loadavg=loadavg,
            base_images=web.num_images,
            rows=[dataclasses.asdict(r) for r in rows],
            summary=scale.summarize(rows),
        )
    else:
        for key in ("measured_at", "code", "loadavg", "base_images", "rows", "summary"):
            if key in previous:
                result[key] = previous[key]
    if many:
        loadavg = [round(x, 2) for x in os.getloadavg()]
        rows, identical = [], {}
        for images in many:
            got, identical[images] = scale.run_many(
                images, cache_dir, out_root, log_dir,
                timeout_s=sizes.timeout_s * max(1, images // 10_000),
            )  # fmt: skip
            rows += got
        ok = ok and all(r.ok for r in rows) and all(identical.values())
        result["many"] = {
            "measured_at": _now(),
            "code": machine.git_state(),
            "loadavg": loadavg,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "rows": [dataclasses.asdict(r) for r in rows],
            "summary": scale.summarize_many(rows, identical),
        }
    elif "many" in previous:
        result["many"] = previous["many"]
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "scale.json").write_text(json.dumps(result, indent=1) + "\n")
    text = scale.markdown(result)
    (results_dir / "scale.md").write_text(text)
    print(text)
    return 0 if ok else 1


def _trainers_part(args, sizes: Sizes, cache_dir: Path, results_dir: Path) -> int:
    """tf.data reader, TFDS and Grain on the same shards: trainers.md and trainers.json."""
    result = trainers.run_trainers(sizes, cache_dir, args.read_rounds)
    trainers.write(result, results_dir)
    print(trainers.markdown(result))
    return 0 if trainers.succeeded(result) else 1


def _reuse_part(args, sizes: Sizes, cache_dir: Path, results_dir: Path) -> int:
    """The reuse benchmark: writes reuse.md and reuse.json next to results.md."""
    factors = dict(reuse.QUICK_FACTORS if sizes is QUICK else reuse.FULL_FACTORS)
    for pair in (args.reuse_factors or "").split(","):
        if pair.strip():
            name, _, factor = pair.partition("=")
            factors[name.strip()] = int(factor)
    counts = {"web": sizes.web_images, "phone": sizes.phone_images}
    loadavg = [round(x, 2) for x in os.getloadavg()]
    rounds = args.reuse_rounds or (1 if sizes is QUICK else 3)
    parts = []
    for name in [s.strip() for s in args.sets.split(",") if s.strip()]:
        image_set = data.ensure_image_set(name, counts[name], cache_dir, sizes.name)
        grown = reuse.grow(image_set, factors[name], cache_dir)
        rows, identical = reuse.run_reuse(
            grown,
            cache_dir / "out" / sizes.name,
            cache_dir / "logs" / sizes.name,
            rounds,
            timeout_s=sizes.timeout_s * factors[name],
            baseline=args.reuse_baseline,
        )
        summary = reuse.summarize(grown, rows, identical)
        parts.append({**summary, "rows": [dataclasses.asdict(r) for r in rows]})
    result = {
        "sizes": sizes.name,
        "measured_at": _now(),
        "code": machine.git_state(),
        "loadavg": loadavg,
        "rounds": rounds,
        "factors": factors,
        "baseline": str(args.reuse_baseline) if args.reuse_baseline else None,
        "sets": parts,
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "reuse.json").write_text(json.dumps(result, indent=1) + "\n")
    text = reuse.markdown(result)
    (results_dir / "reuse.md").write_text(text)
    print(text)
    ok = all(p["identical"] and all(r["ok"] for r in p["rows"]) for p in parts)
    return 0 if ok else 1


def _near_part(args, sizes: Sizes, cache_dir: Path, results_dir: Path) -> int:
    """The near-duplicate benchmark: writes near.md and near.json next to results.md."""
    default = near_duplicates.QUICK_SCALE if sizes is QUICK else near_duplicates.FULL_SCALE
    result = near_duplicates.run(
        cache_dir,
        quick=sizes is QUICK,
        rounds=args.repeats,
        scale_sizes=_sizes_arg(args.near_scale, default),
    )
    result.update(sizes=sizes.name, measured_at=_now(), code=machine.git_state())
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "near.json").write_text(json.dumps(result, indent=1) + "\n")
    text = near_duplicates.markdown(result)
    (results_dir / "near.md").write_text(text)
    print(text)
    return 0


def _gpu_part(sizes: Sizes, web: data.ImageSet, out_root: Path, log_dir: Path) -> dict:
    """ResNet-50 fed by the reader vs image_dataset_from_directory (skipped without a GPU)."""
    records = converters.imagerecords_output(out_root, "web")
    if not (records / INFO_FILE).exists():
        return {"skipped": "skipped: no imagerecords output to read", "rows": []}
    cmd = [sys.executable, "-m", "bench.read.gpu_step", "--records", str(records)]
    cmd += ["--files-root", str(web.path), "--batch", str(sizes.read_batch_size)]
    proc = procstats.run_measured(
        cmd, cwd=settings.REPO_DIR, timeout_s=sizes.timeout_s, log_path=log_dir / "gpu.log"
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"skipped": f"failed: exit {proc.returncode}: {tail}"[:300], "rows": []}
    part = json.loads(lines[-1])
    print(f"[bench] gpu: {part['skipped'] or part['rows']}", flush=True)
    return {"measured_at": _now(), "code": machine.git_state(), **part}


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns the process exit status."""
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.read_rounds is None:
        args.read_rounds = 1 if args.quick else 2
    if args.codec_rounds is None:
        args.codec_rounds = 1 if args.quick else 2
    results_dir = results_folder(args)
    if args.report_only:
        report.write(json.loads((results_dir / "results.json").read_text()), results_dir)
        print(f"[bench] redrew {results_dir}/results.md and chart.png")
        return 0

    started = time.perf_counter()
    cache_dir = args.cache_dir
    if args.only == "scale":
        return _scale_part(args, sizes, cache_dir, results_dir)
    if args.only == "trainers":
        return _trainers_part(args, sizes, cache_dir, results_dir)
    if args.only == "reuse":
        return _reuse_part(args, sizes, cache_dir, results_dir)
    if args.only == "near":
        return _near_part(args, sizes, cache_dir, results_dir)
    out_root = cache_dir / "out" / sizes.name
    log_dir = cache_dir / "logs" / sizes.name
    results = _previous(results_dir, sizes)
    results.update(machine=machine.describe(), sizes=sizes.name)

    set_names = [s.strip() for s in args.sets.split(",") if s.strip()]
    if args.only in (None, "reader") and "web" not in set_names:
        set_names.append("web")  # the reader benchmark reads the web set
    counts = {"web": sizes.web_images, "phone": sizes.phone_images}
    sets = {n: data.ensure_image_set(n, counts[n], cache_dir, sizes.name) for n in set_names}
    results["data"] = [{**dataclasses.asdict(s), "path": str(s.path)} for s in sets.values()]

    converter_sets = {n: s for n, s in sets.items() if n in args.sets.split(",")}
    if args.only in (None, "converter"):
        results["converter"] = _converter_half(args, sizes, converter_sets, out_root, log_dir)
    if args.only in (None, "codecs"):
        results["codecs"] = _codec_half(args, sizes, converter_sets, out_root, log_dir)
    if args.only in (None, "reader"):
        results["reader"] = _reader_half(sizes, sets["web"], out_root, log_dir, args.read_rounds)
        results["gpu"] = _gpu_part(sizes, sets["web"], out_root, log_dir)

    if args.only is None:
        _scale_part(args, sizes, cache_dir, results_dir)
        _trainers_part(args, sizes, cache_dir, results_dir)
        _reuse_part(args, sizes, cache_dir, results_dir)
        _near_part(args, sizes, cache_dir, results_dir)
    results["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results["finished_at"] = _now()
    results["duration_s"] = round(time.perf_counter() - started, 1)
    report.write(results, results_dir)
    print(f"[bench] wrote {results_dir}/results.md, results.json, chart.png "
          f"in {results['duration_s']:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

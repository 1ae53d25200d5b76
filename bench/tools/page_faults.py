"""What ``import reader``'s allocator choice saves: ``python -m bench.tools.page_faults``.

``import reader`` sets ``TF_CPU_ALLOCATOR_USE_BFC=true`` (``reader/allocator.py``)
so that TensorFlow's CPU allocator reuses the blocks of large batches. With
the default allocator, a float32 training batch (128 x 224 x 224 x 3, 77 MB)
can be a fresh ``mmap`` each time, whose pages the kernel faults in and
zeroes (glibc serves blocks above its mmap threshold that way); whether it
is depends on the C library, its tunables and the kernel, so this is measured
here, not asserted in a test.

The same training pipeline runs twice, each in a fresh process, one after
the other: with the variable set to ``false`` (TensorFlow's default
allocator: the baseline) and left to the reader (BFC). Each pulls
``--warmup`` batches, then counts the minor page faults (``ru_minflt``) and
CPU time of the next ``--batches``. The records are a converted set of
synthetic noisy photos (``--images``, made in a temporary folder), or any
dataset given with ``--records`` (its ``train`` split).

Where oneDNN is on (TensorFlow turns it on by itself on some CPUs; set
``TF_ENABLE_ONEDNN_OPTS`` to choose), its CPU allocator serves both runs and
the variable changes nothing: the table says whether oneDNN was on and which
runs had an allocator with statistics (BFC's or oneDNN's).

Prints the table and writes it to ``bench/results/raw/profile/page_faults.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common.settings import READ_IMAGE_SIZE, RESULTS_DIR, TARGET_SHORTER_SIDE

PROFILE_DIR = RESULTS_DIR / "raw" / "profile"
ENV = "TF_CPU_ALLOCATOR_USE_BFC"  # reader.allocator.ENV; not imported: it would load TensorFlow
ALLOCATORS = {
    "default": ("TensorFlow's default (TF_CPU_ALLOCATOR_USE_BFC=false)", "false"),
    "bfc": ("BFC (import reader, the default)", None),
}


def make_records(folder: Path, images: int) -> Path:
    """Converts ``images`` synthetic noisy photos (500x375) into a train-only dataset."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    source = folder / "images"
    for i in range(images):
        cls = source / f"class{i % 4}"
        cls.mkdir(parents=True, exist_ok=True)
        ramp = np.linspace(0, 255, 500)[None, :, None] * rng.uniform(0.3, 1.0, (1, 1, 3))
        pixels = ramp + rng.normal(0, 14, (375, 500, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
            cls / f"{i:05d}.jpg", quality=90
        )
    records = folder / "records"
    subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "--input", str(source), "--output", str(records)]
        + ["--image_size", str(TARGET_SHORTER_SIDE), "--splits", "train=1.0", "--quiet"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return records


def measure(records: str, batch: int, warmup: int, batches: int) -> dict:
    """In this process: the faults and CPU of ``batches`` training batches after ``warmup``."""
    import tensorflow as tf  # first, as users do: no op runs before the reader is imported

    import reader

    ds = reader.make_dataset(records, "train", batch, READ_IMAGE_SIZE, training=True, seed=0)
    iterator = iter(ds)
    for _ in range(warmup):
        next(iterator)
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(batches):
        next(iterator)
    after = resource.getrusage(resource.RUSAGE_SELF)
    images = batch * batches
    try:
        tf.config.experimental.get_memory_info("CPU:0")
        statistics = True
    except ValueError:  # "Allocator stats not available": TensorFlow's default allocator
        statistics = False
    return {
        "env": os.environ.get(ENV),
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "TensorFlow's choice for this CPU"),
        "statistics": statistics,
        "tensorflow": tf.__version__,
        "faults_per_batch": (after.ru_minflt - before.ru_minflt) / batches,
        "faults_per_image": (after.ru_minflt - before.ru_minflt) / images,
        "cpu_ms_per_image": 1000
        * (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        / images,
        "system_ms_per_image": 1000 * (after.ru_stime - before.ru_stime) / images,
    }


def run_child(allocator: str, records: str, args) -> dict:
    """:func:`measure` in a fresh process with the allocator's setting of the variable."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    value = ALLOCATORS[allocator][1]
    if value is not None:
        env[ENV] = value
    command = [sys.executable, "-m", "bench.tools.page_faults", "--child", records]
    command += ["--batch", str(args.batch), "--warmup", str(args.warmup)]
    command += ["--batches", str(args.batches)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"the {allocator} run failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def report(results: dict[str, dict], args) -> str:
    megabytes = args.batch * READ_IMAGE_SIZE * READ_IMAGE_SIZE * 3 * 4 / 1e6
    lines = [
        f"page faults of the training pipeline: float32 batches of {args.batch} x "
        f"{READ_IMAGE_SIZE} x {READ_IMAGE_SIZE} x 3 ({megabytes:.0f} MB), {args.batches} batches "
        f"after {args.warmup} warm-up, each allocator in a fresh process "
        f"(TensorFlow {results['bfc']['tensorflow']}, "
        f"TF_ENABLE_ONEDNN_OPTS: {results['bfc']['onednn']})",
        f"{'allocator':<56}{'faults/batch':>14}{'faults/image':>14}{'CPU ms/img':>12}"
        f"{'system ms/img':>15}{'statistics':>12}",
    ]
    for name, (label, _) in ALLOCATORS.items():
        r = results[name]
        lines.append(
            f"{label:<56}{r['faults_per_batch']:>14,.0f}{r['faults_per_image']:>14.1f}"
            f"{r['cpu_ms_per_image']:>12.3f}{r['system_ms_per_image']:>15.3f}"
            f"{'yes' if r['statistics'] else 'no':>12}"
        )
    ratio = results["default"]["faults_per_batch"] / max(1.0, results["bfc"]["faults_per_batch"])
    lines.append(f"default / BFC page faults: {ratio:.1f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.page_faults", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--records", help="a dataset to read (its train split); default: made here")
    parser.add_argument("--images", type=int, default=320, help="synthetic images to convert")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--child", metavar="RECORDS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.batch, args.warmup, args.batches)))
        return
    with tempfile.TemporaryDirectory() as folder:
        records = args.records or str(make_records(Path(folder), args.images))
        results = {name: run_child(name, records, args) for name in ALLOCATORS}
    text = report(results, args)
    PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    (PROFILE_DIR / "page_faults.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

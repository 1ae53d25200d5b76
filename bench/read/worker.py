"""Times reader pipelines in this process: ``python -m bench.read.worker --variant V ...``.

For each ``--variant`` it builds the pipeline (``bench.read.pipelines``), runs
``--warmup`` epochs untimed (page cache, tf.data AUTOTUNE, shuffle buffers,
graph tracing), then ``--epochs`` timed epochs, and prints one JSON line per
variant. An "epoch" is as many images as the pipeline's source holds; a
repeating pipeline is timed by pulling batches from one iterator until that
many images came out, a finite one (eval) by a full fresh pass.

Batches are consumed in Python (``next(iterator)``) and not copied anywhere:
what is timed is the input pipeline, as a training step would see it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from bench.common.procstats import process_cpu_s
from bench.read.pipelines import BUILDERS, VARIANTS


def _time_epochs(pipeline, warmup: int, epochs: int) -> tuple[list[float], list[int], float]:
    """Per timed epoch: seconds and images; and the CPU seconds of all timed epochs."""
    seconds, counts, cpu = [], [], 0.0
    if pipeline.infinite:
        iterator = iter(pipeline.dataset)
        for epoch in range(warmup + epochs):
            start, cpu_start, images = time.perf_counter(), process_cpu_s(), 0
            while images < pipeline.epoch_images:
                images += int(next(iterator)[0].shape[0])
            if epoch >= warmup:
                seconds.append(time.perf_counter() - start)
                counts.append(images)
                cpu += process_cpu_s() - cpu_start
    else:
        for epoch in range(warmup + epochs):
            start, cpu_start, images = time.perf_counter(), process_cpu_s(), 0
            for batch in pipeline.dataset:
                images += int(batch[0].shape[0])
            if epoch >= warmup:
                seconds.append(time.perf_counter() - start)
                counts.append(images)
                cpu += process_cpu_s() - cpu_start
    return seconds, counts, cpu


def run_variant(variant: str, args) -> dict:
    """Builds and times one variant; never raises (errors become the result)."""
    result = {"variant": variant, "ok": False}
    try:
        start = time.perf_counter()
        pipeline = BUILDERS[variant](args.files_root, args.records, args.batch, args.image_size)
        result["build_s"] = time.perf_counter() - start
        seconds, counts, cpu = _time_epochs(pipeline, args.warmup, args.epochs)
        if not counts or not counts[0]:
            raise RuntimeError("the pipeline produced no batches")
        result.update(
            ok=True,
            epoch_seconds=seconds,
            epoch_images=counts,
            images_per_s=sum(counts) / sum(seconds),
            cpu_ms_per_image=1000 * cpu / sum(counts),
        )
    except Exception as error:  # report, don't crash the other variants
        traceback.print_exc()
        result["note"] = f"{type(error).__name__}: {error}"[:300]
    return result


def main(argv: list[str] | None = None) -> None:
    """Parses arguments, times each variant and prints one JSON line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", choices=VARIANTS, required=True)
    parser.add_argument("--files-root", type=Path, required=True)
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    for variant in args.variant:
        print("BENCH_RESULT " + json.dumps(run_variant(variant, args)), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

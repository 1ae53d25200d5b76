"""Times one trainer's loader in this process: ``python -m bench.train.worker --variant V ...``.

The child of ``bench.trainers``: builds ``bench.train.pipelines.BUILDERS[V]``,
pulls ``--warmup`` untimed epochs of batches from one iterator, then
``--epochs`` timed ones, and prints one ``BENCH_RESULT`` JSON line. CPU is
that of this process *and its descendants* during the timed epochs (Grain's
loader decodes in worker processes; ``getrusage`` of this process alone would
leave them out), read from ``/proc``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path

from bench.common.procstats import tree_sample
from bench.train.pipelines import BUILDERS, TORCH_VARIANTS, VARIANTS

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and every live descendant."""
    _, ticks, _ = tree_sample(os.getpid())
    return sum(ticks.values()) / _CLK_TCK


def time_epochs(pipeline, warmup: int, epochs: int) -> tuple[list[float], list[int], float]:
    """Per timed epoch: seconds and images; and the tree's CPU seconds over all timed epochs."""
    seconds, counts, cpu = [], [], 0.0
    iterator = iter(pipeline.dataset)
    try:
        for epoch in range(warmup + epochs):
            start, cpu_start, images = time.perf_counter(), tree_cpu_s(), 0
            while images < pipeline.epoch_images:
                images += int(next(iterator)[0].shape[0])
            if epoch >= warmup:
                seconds.append(time.perf_counter() - start)
                counts.append(images)
                cpu += tree_cpu_s() - cpu_start
    finally:
        # Grain's worker processes and shared memory go now, not in interpreter
        # teardown (where Grain prints tracebacks of its clean-up).
        getattr(iterator, "close", lambda: None)()
    return seconds, counts, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    result = {"variant": args.variant, "ok": False}
    if args.variant in TORCH_VARIANTS and importlib.util.find_spec("torch") is None:
        result.update(skipped=True, note=f"not run: torch is not installed in {sys.executable}")
        print("BENCH_RESULT " + json.dumps(result), flush=True)
        return
    try:
        start = time.perf_counter()
        pipeline = BUILDERS[args.variant](args.records, args.batch, args.image_size)
        result["build_s"] = time.perf_counter() - start
        seconds, counts, cpu = time_epochs(pipeline, args.warmup, args.epochs)
        result.update(
            ok=True,
            epoch_seconds=seconds,
            epoch_images=counts,
            images_per_s=sum(counts) / sum(seconds),
            cpu_ms_per_image=1000 * cpu / sum(counts),
        )
    except Exception as error:  # report, don't crash
        traceback.print_exc()
        result["note"] = f"{type(error).__name__}: {error}"[:300]
    print("BENCH_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

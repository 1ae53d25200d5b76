"""What a loader benchmark's worker process does with a pipeline, and the line it prints.

The reader and trainer workers (``bench.read.worker``, ``bench.train.worker``)
time their pipelines the same way: untimed warm-up epochs, then timed ones,
each with its wall clock, its images and the CPU seconds some counter adds up
over it; and each hands its result to the harness as one ``BENCH_RESULT`` line
of JSON on stdout, which the harness (``bench.read.readers``,
``bench.train.trainers``) picks out of everything else the child prints.

Imports nothing beyond the standard library: the trainer worker also runs
under the torch venv's interpreter.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Iterable, Iterator

RESULT_PREFIX = "BENCH_RESULT "


def add_epoch_arguments(parser) -> None:
    """The worker's batch, image size and epochs (the harness passes each)."""
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)


def batch_images(batch) -> int:
    """The images of one batch: the length of its first element (one row per image)."""
    return int(batch[0].shape[0])


def pull_images(iterator: Iterator, count: int) -> int:
    """Pulls batches from one running iterator until ``count`` images came out; returns
    how many did (a repeating pipeline's epoch: no restart between epochs)."""
    images = 0
    while images < count:
        images += batch_images(next(iterator))
    return images


def pass_images(batches: Iterable) -> int:
    """One whole fresh pass over a finite pipeline; returns its images."""
    images = 0
    for batch in batches:
        images += batch_images(batch)
    return images


def time_epochs(
    run_epoch: Callable[[], int], warmup: int, epochs: int, cpu_s: Callable[[], float]
) -> tuple[list[float], list[int], float]:
    """Per timed epoch: seconds and images; and the CPU seconds of all timed epochs.

    ``run_epoch``: runs one epoch and returns its images; the first ``warmup``
    calls are not timed. ``cpu_s``: CPU seconds used so far by what is measured.
    """
    seconds, counts, cpu = [], [], 0.0
    for epoch in range(warmup + epochs):
        start, cpu_start = time.perf_counter(), cpu_s()
        images = run_epoch()
        if epoch >= warmup:
            seconds.append(time.perf_counter() - start)
            counts.append(images)
            cpu += cpu_s() - cpu_start
    return seconds, counts, cpu


def timed_result(variant: str, build: Callable[[], object], time_pipeline: Callable) -> dict:
    """``build()``'s pipeline timed by ``time_pipeline(pipeline)`` (as ``time_epochs``
    returns), as the result line's fields; never raises (an error becomes the result,
    with its traceback on stderr), so one broken variant does not end the others."""
    result = {"variant": variant, "ok": False}
    try:
        start = time.perf_counter()
        pipeline = build()
        result["build_s"] = time.perf_counter() - start
        seconds, counts, cpu = time_pipeline(pipeline)
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


def print_result(result: dict) -> None:
    """Hands ``result`` to the harness: one line on stdout."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def read_results(stdout: str) -> dict[str, dict]:
    """Variant -> result of every result line in a worker's output (other lines ignored)."""
    return {
        raw["variant"]: raw
        for raw in (
            json.loads(line[len(RESULT_PREFIX) :])
            for line in stdout.splitlines()
            if line.startswith(RESULT_PREFIX)
        )
    }

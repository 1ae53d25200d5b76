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
import sys
from collections.abc import Callable
from pathlib import Path

from bench.common.epochs import (
    add_epoch_arguments,
    pass_images,
    print_result,
    pull_images,
    time_epochs,
    timed_result,
)
from bench.common.procstats import process_cpu_s
from bench.read.pipelines import BUILDERS, VARIANTS


def _epoch_runner(pipeline) -> Callable[[], int]:
    """One epoch of ``pipeline``, returning its images: batches pulled from one running
    iterator for a repeating pipeline, a whole fresh pass for a finite one (eval)."""
    if pipeline.infinite:
        iterator = iter(pipeline.dataset)
        return lambda: pull_images(iterator, pipeline.epoch_images)
    return lambda: pass_images(pipeline.dataset)


def run_variant(variant: str, args) -> dict:
    """Builds and times one variant; never raises (errors become the result)."""
    return timed_result(
        variant,
        lambda: BUILDERS[variant](args.files_root, args.records, args.batch, args.image_size),
        lambda pipeline: time_epochs(
            _epoch_runner(pipeline), args.warmup, args.epochs, process_cpu_s
        ),
    )


def main(argv: list[str] | None = None) -> None:
    """Parses arguments, times each variant and prints one JSON line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", choices=VARIANTS, required=True)
    parser.add_argument("--files-root", type=Path, required=True)
    parser.add_argument("--records", type=Path, required=True)
    add_epoch_arguments(parser)
    args = parser.parse_args(argv)
    for variant in args.variant:
        print_result(run_variant(variant, args))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

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
import os
import sys
from pathlib import Path

from bench.common.epochs import (
    add_epoch_arguments,
    print_result,
    pull_images,
    time_epochs,
    timed_result,
)
from bench.common.procstats import tree_cpu_s
from bench.train.pipelines import BUILDERS, TORCH_VARIANTS, VARIANTS


def time_loader(pipeline, warmup: int, epochs: int) -> tuple[list[float], list[int], float]:
    """Per timed epoch: seconds and images; and the tree's CPU seconds over all timed epochs."""
    iterator = iter(pipeline.dataset)
    try:
        return time_epochs(
            lambda: pull_images(iterator, pipeline.epoch_images),
            warmup,
            epochs,
            lambda: tree_cpu_s(os.getpid()),
        )
    finally:
        # Grain's worker processes and shared memory go now, not in interpreter
        # teardown (where Grain prints tracebacks of its clean-up).
        getattr(iterator, "close", lambda: None)()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--records", type=Path, required=True)
    add_epoch_arguments(parser)
    args = parser.parse_args(argv)
    if args.variant in TORCH_VARIANTS and importlib.util.find_spec("torch") is None:
        note = f"not run: torch is not installed in {sys.executable}"
        print_result({"variant": args.variant, "ok": False, "skipped": True, "note": note})
        return
    result = timed_result(
        args.variant,
        lambda: BUILDERS[args.variant](args.records, args.batch, args.image_size),
        lambda pipeline: time_loader(pipeline, args.warmup, args.epochs),
    )
    print_result(result)


if __name__ == "__main__":
    main()

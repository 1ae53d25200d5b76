"""Converter baseline (a), the codec floor: ``python -m bench.convert.floor --input DIR``.

A ``multiprocessing.Pool`` with one process per core maps
:func:`bench.convert.imageops.convert_file` over every image (sorted list,
``imap_unordered``, chunks of 8 so the per-task IPC is amortised but the last
chunks still balance). Nothing else happens: no listing in parallel, no keys,
no shuffle, no protobuf, no output files. It is the speed limit for any
converter on this machine that uses Pillow, and what imagerecords aims at.

Prints one JSON line: images, input and output bytes, and ``work_s`` (time
from the first task to the last result, without interpreter start-up; the
harness measures the full wall clock from outside).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from pathlib import Path

from bench.common.data import list_images
from bench.convert.converters import print_work_summary
from bench.convert.imageops import convert_file


def main(argv: list[str] | None = None) -> None:
    """Runs the codec floor over ``--input`` and prints its JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)

    files = [str(p) for p in list_images(args.input)]
    start = time.perf_counter()
    in_bytes = out_bytes = 0
    # fork: the workers inherit the imported Pillow instead of re-importing it,
    # which is how a careful pool on Linux starts.
    with multiprocessing.get_context("fork").Pool(args.processes) as pool:
        for n_in, n_out in pool.imap_unordered(convert_file, files, chunksize=8):
            in_bytes += n_in
            out_bytes += n_out
    work_s = time.perf_counter() - start
    print_work_summary(len(files), in_bytes, out_bytes, work_s, args.processes)


if __name__ == "__main__":
    main()

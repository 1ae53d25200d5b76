"""``python -m bench.tools.dryrun_scale``: ``--dry_run`` on a folder of 100,000 images.

What it checks: the dry run takes seconds, not minutes, on 100,000 images,
because it lists everything but converts only a sample. The images
are tiny copies of one real JPEG (made in seconds; what is measured is the
listing and the per-image bookkeeping, not the codec), in 100 class folders.
Prints the listing time, the sample time and the whole dry run's wall and CPU
time, best of ``--repeats`` runs in this process.

    python -m bench.tools.dryrun_scale [--images 100000] [--repeats 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import tempfile
import time

from PIL import Image

from beam_pipeline.__main__ import run
from beam_pipeline.cli import dryrun
from beam_pipeline.storage import discovery


def make_folder(root: str, images: int, classes: int = 100) -> float:
    """Writes ``images`` small JPEGs in ``classes`` folders; returns the seconds it took."""
    started = time.perf_counter()
    buffer = io.BytesIO()
    Image.linear_gradient("L").resize((64, 48)).convert("RGB").save(buffer, "JPEG")
    data = buffer.getvalue()
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class_{c:03d}"), exist_ok=True)
    for i in range(images):
        with open(os.path.join(root, f"class_{i % classes:03d}", f"img_{i:06d}.jpg"), "wb") as f:
            f.write(data)
    return time.perf_counter() - started


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.dryrun_scale", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", help="use (and keep) this folder instead of a temporary one")
    args = parser.parse_args(argv)
    work = args.keep or tempfile.mkdtemp(prefix="imagerecords-dryrun-bench-")
    root = os.path.join(work, "images")
    try:
        if not os.path.isdir(root):
            print(f"writing {args.images:,} images ... {make_folder(root, args.images):.1f} s")
        argv = ["--input", root, "--output", os.path.join(work, "out"), "--dry_run"]
        best = None
        for _ in range(args.repeats):
            # The listing alone, then the whole dry run (listing + sample + report).
            layout = discovery.discover(root)
            wall, cpu = time.perf_counter(), time.process_time()
            found = dryrun.census(layout, 42, {"train": 0.8, "val": 0.1, "test": 0.1})
            listing_s = time.perf_counter() - wall
            listing_cpu = time.process_time() - cpu
            wall, cpu = time.perf_counter(), time.process_time()
            with contextlib.redirect_stdout(io.StringIO()):
                result = run(argv)
            run_s, run_cpu = time.perf_counter() - wall, time.process_time() - cpu
            row = (run_s, run_cpu, listing_s, listing_cpu, result["sampled"], len(found.refs))
            best = row if best is None or row < best else best
        run_s, run_cpu, listing_s, listing_cpu, sampled, listed = best
        print(
            f"dry run on {listed:,} images: {run_s:.2f} s wall, {run_cpu:.2f} s CPU "
            f"(listing {listing_s:.2f} s wall, {listing_cpu:.2f} s CPU; {sampled} images "
            f"converted), best of {args.repeats}"
        )
        assert not os.path.exists(os.path.join(work, "out")), "the dry run wrote its output"
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

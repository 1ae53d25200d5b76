"""Times one codec path on one thread: ``python -m bench.convert.codec_worker --codec C --input DIR``.

Reads every image of ``--input`` (first ``--limit`` in sorted order) into
memory, converts each once untimed (imports, libvips start-up, page cache),
then converts all of them ``--passes`` times and prints one JSON line: CPU
seconds and wall seconds of the best pass, images, input and output bytes.
With ``--out DIR`` it also writes each output JPEG there (for the quality
figures, computed by ``bench.convert.codecs`` in another interpreter if need be).

Runs under any interpreter with Pillow on it (``--python`` of ``bench.convert.codecs``
points it at one with Pillow-SIMD).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

# One thread per process in every library (set before any of them is imported).
for _name in ("VIPS_CONCURRENCY", "OMP_NUM_THREADS", "OPENCV_FOR_THREADS_NUM"):
    os.environ.setdefault(_name, "1")

from bench.common.data import list_images  # noqa: E402
from bench.convert.codec_paths import PATHS, unavailable  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    """Runs the codec and prints its JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec", required=True, choices=sorted(PATHS))
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    why = unavailable(args.codec)
    if why:
        print(json.dumps({"codec": args.codec, "ok": False, "note": why}))
        return
    files = list_images(args.input)
    if args.limit:
        files = files[: args.limit]
    blobs = [(f.relative_to(args.input), f.read_bytes()) for f in files]
    convert = PATHS[args.codec]
    outputs = [convert(data) for _, data in blobs]  # warm-up, and the bytes to report
    if args.out:
        for (rel, _), jpeg in zip(blobs, outputs, strict=True):
            target = args.out / rel.with_suffix(".jpg")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(jpeg)
    best_cpu = best_wall = float("inf")
    for _ in range(args.passes):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _, data in blobs:
            convert(data)
        best_cpu = min(best_cpu, time.process_time() - cpu0)
        best_wall = min(best_wall, time.perf_counter() - wall0)
    print(
        json.dumps(
            {
                "codec": args.codec,
                "ok": True,
                "images": len(blobs),
                "in_bytes": sum(len(d) for _, d in blobs),
                "out_bytes": sum(len(o) for o in outputs),
                "cpu_s": best_cpu,
                "wall_s": best_wall,
                "pillow": _pillow_version(),
            }
        )
    )


def _pillow_version() -> str:
    import PIL

    return PIL.__version__


if __name__ == "__main__":
    main()

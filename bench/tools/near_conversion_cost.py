"""What near-duplicate detection adds to a conversion, with a same-run baseline.

    python -m bench.tools.near_conversion_cost            # 300 web images, 5 rounds
    python -m bench.tools.near_conversion_cost --set small --images 2000
    python -m bench.tools.near_conversion_cost --search 200000

Convert: ``images.convert`` of every image of a bench set (``--set web``, the
web set; ``small``, the scale part's 32x32 JPEGs), in this process, rounds
alternating between the conversion as it is and the same conversion with the
fingerprint left out (``images.near_fingerprint`` replaced by a function that
returns nothing, and a pass-through JPEG's check decoded at 1/8 scale, all the
check itself needs, rather than at ``images.PASS_THROUGH_CHECK``, the scale
the fingerprint needs): CPU seconds per image, best of the rounds.

Search (``--search N``): ``features/near/stage.find_local`` over N fingerprints in a
child process (its wall time and peak RSS); the fingerprints are of random
bits, so the buckets hold what random collisions give, the search's floor
at that size, not a folder full of copies.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from beam_pipeline.core import images
from beam_pipeline.features.near import hashes as near_duplicates
from beam_pipeline.features.near import search as near_search

CACHE = Path(__file__).resolve().parent.parent / ".cache"


def _cpu_per_image(datas: list[bytes], spec: images.ImageSpec) -> float:
    start = time.process_time()
    for data in datas:
        try:
            images.convert(data, spec)
        except images.Rejected:
            pass
    return (time.process_time() - start) / len(datas)


def _set_files(name: str, count: int) -> list[Path]:
    from bench.common import data

    if name == "small":
        from bench.scale import growth

        return sorted(growth.many_small_set(count, CACHE).rglob("*.jpg"))
    return data.list_images(data.ensure_image_set("web", count, CACHE, f"near-cost-{count}").path)


def convert_cost(count: int, rounds: int, image_set: str = "web") -> dict:
    datas = [p.read_bytes() for p in _set_files(image_set, count)]
    spec = images.ImageSpec()
    hashed, check = images.near_fingerprint, images.PASS_THROUGH_CHECK
    with_near, without = [], []
    _cpu_per_image(datas[:20], spec)  # warm caches (the DCT transforms, Pillow's plugins)
    for _ in range(rounds):
        with_near.append(_cpu_per_image(datas, spec))
        images.near_fingerprint = lambda image: b""
        images.PASS_THROUGH_CHECK = (1, 1)
        try:
            without.append(_cpu_per_image(datas, spec))
        finally:
            images.near_fingerprint, images.PASS_THROUGH_CHECK = hashed, check
    best, base = min(with_near), min(without)
    return {
        "set": image_set,
        "images": len(datas),
        "rounds": rounds,
        "cpu_s_per_image_with_near": round(best, 6),
        "cpu_s_per_image_without": round(base, 6),
        "added_fraction": round(best / base - 1, 4),
        "load_average": os.getloadavg()[0],
    }


def _search_child(count: int) -> None:
    from beam_pipeline.core.elements import RecordBatch, ShardEntry
    from beam_pipeline.features.near import stage as near

    rng = random.Random(1)
    windows = len(near_duplicates.WINDOWS)
    entries = tuple(
        ShardEntry(
            0,
            f"{n:08d}",
            0,
            0,
            b"",
            near=near_search.pack(
                near_duplicates.Fingerprint(
                    tuple(rng.getrandbits(64) for _ in range(windows)), (85, 85, 85)
                )
            ),
        )
        for n in range(count)
    )
    batches = [RecordBatch("train", entries)]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start, cpu_start = time.monotonic(), time.process_time()
    with tempfile.TemporaryDirectory() as work:
        found = near.find_local(batches, work)
    wall, cpu = time.monotonic() - start, time.process_time() - cpu_start
    print(
        json.dumps(
            {
                "images": count,
                "search_wall_s": round(wall, 1),
                "search_cpu_s": round(cpu, 1),
                "cpu_ms_per_image": round(cpu / count * 1e3, 4),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                "rss_before_search_mb": rss_before // 1024,
                "pairs": sum(len(g.pairs) for g in found.groups),
                "oversized": len(found.oversized),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--set", choices=("web", "small"), default="web", dest="image_set")
    parser.add_argument("--search", type=int, default=0, help="fingerprints to search (0: none)")
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _search_child(args.child)
        return
    if args.search:
        done = subprocess.run(
            [sys.executable, "-m", "bench.tools.near_conversion_cost", "--child", str(args.search)],
            capture_output=True,
            text=True,
            check=True,
        )
        print(done.stdout.strip())
        return
    print(json.dumps(convert_cost(args.images, args.rounds, args.image_set)))


if __name__ == "__main__":
    main()

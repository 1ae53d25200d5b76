"""What near-duplicate detection adds to a conversion, with a same-run baseline.

    python -m bench.tools.near_conversion_cost            # 300 web images, 7 rounds
    python -m bench.tools.near_conversion_cost --set small --images 2000
    python -m bench.tools.near_conversion_cost --search 200000

Convert: ``images.convert`` of a bench set (``web``; ``small``: 32x32 JPEGs), CPU
per image, as it is (``product``) and without the fingerprint (``floor``: only
no pixel hook: no fingerprint, and a pass-through check decodes at 1/8, all it
needs itself), in ABBA turns each round; the best-of share, the
rounds' spread, the load before and after, and the fingerprint's own us per
image inside the conversion and alone on the images it was given.

Search (``--search N``): ``features/near/stage.find_local`` over N random fingerprints in
a child process (wall time, peak RSS): the search's floor at that size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from beam_pipeline.core import images
from beam_pipeline.features.near import hashes as near_duplicates
from beam_pipeline.features.near import search as near_search
from beam_pipeline.features.near.feature import PIXELS

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


def _converting_with(
    spec: images.ImageSpec, fingerprint: Callable | None, side: int
) -> images.ImageSpec:
    """``spec`` with ``fingerprint`` as its fingerprint (None: no pixel hook) and
    ``side`` as what the pass-through check's decode covers."""
    if fingerprint is None:
        return dataclasses.replace(spec, pixels=None)
    pixels = images.PixelHook(
        scheme=PIXELS.scheme,
        earlier=PIXELS.earlier,
        same=PIXELS.same,
        draft_side=side,
        fingerprint=fingerprint,
        features=PIXELS.features,
    )
    return dataclasses.replace(spec, pixels=pixels)


def variants(fingerprint: Callable = PIXELS.fingerprint) -> dict[str, tuple]:
    """The passes a round makes: name -> (fingerprint, pass-through check side)."""
    return {"product": (fingerprint, PIXELS.draft_side), "floor": (None, 1)}


def _spread(values: list[float], digits: int = 1) -> dict:
    return {
        "min": round(min(values), digits),
        "median": round(statistics.median(values), digits),
        "max": round(max(values), digits),
    }


def _fingerprint_us(datas: list[bytes], spec: images.ImageSpec, fingerprint: Callable):
    """(us per image inside the conversion, the images it was given)."""
    taken: list = []
    spent = [0.0]

    def timed(image):
        start = time.thread_time()
        packed = fingerprint(image)
        spent[0] += time.thread_time() - start
        taken.append(image)
        return packed

    _cpu_per_image(datas, _converting_with(spec, timed, PIXELS.draft_side))
    return spent[0] / len(datas) * 1e6, taken


def _alone_us(stored: list, fingerprint: Callable) -> float:
    start = time.thread_time()
    for image in stored:
        fingerprint(image)
    return (time.thread_time() - start) / max(1, len(stored)) * 1e6


def convert_cost(
    count: int, rounds: int, image_set: str = "web", passes: dict[str, tuple] | None = None
) -> dict:
    """The costs above; ``passes`` (``variants()`` and any more, each measured like
    the product) is for comparing fingerprints in one run."""
    datas = [p.read_bytes() for p in _set_files(image_set, count)]
    spec = images.ImageSpec()
    passes = passes or variants()
    load_before = os.getloadavg()
    _cpu_per_image(datas[:20], spec)  # warm caches (the DCT transforms, Pillow's plugins)
    cpu: dict[str, list[float]] = {name: [] for name in passes}
    inside: dict[str, list[float]] = {name: [] for name in passes if passes[name][0]}
    alone: dict[str, list[float]] = {name: [] for name in inside}
    for round_ in range(rounds):
        order = list(passes) if round_ % 2 == 0 else list(reversed(passes))
        for name in order:
            cpu[name].append(_cpu_per_image(datas, _converting_with(spec, *passes[name])))
        for name in inside:
            us, stored = _fingerprint_us(datas, spec, passes[name][0])
            inside[name].append(us)
            alone[name].append(_alone_us(stored, passes[name][0]))
    floor = cpu["floor"]
    result: dict = {
        "set": image_set,
        "images": len(datas),
        "rounds": rounds,
        "load_average_before": [round(x, 2) for x in load_before],
        "cpu_us_per_image_floor": round(min(floor) * 1e6, 1),
    }
    for name in inside:
        shares = [with_ / without - 1 for with_, without in zip(cpu[name], floor, strict=True)]
        result[name] = {
            "cpu_us_per_image": round(min(cpu[name]) * 1e6, 1),
            "share_of_convert": round(min(cpu[name]) / min(floor) - 1, 4),
            "round_shares": _spread(shares, 4),
            "fingerprint_us_in_convert": _spread(inside[name]),
            "fingerprint_us_alone": _spread(alone[name]),
        }
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


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
    parser.add_argument("--rounds", type=int, default=7)
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

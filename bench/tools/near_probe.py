"""``python -m bench.tools.near_probe``: would a multi-probe band index find the copies the band index loses?

    python -m bench.tools.near_probe [--images 1280000] [--rounds 2]

Two parts, printed as markdown:

- **recall**: both photo sets (calibration and held-out, at the tile's size and
  a stored image's) through band layouts: today's exact 23-bit bands, more
  exact bands, and wider bands whose whole-hash key is also probed with each
  one-bit flip (a meeting kept only when its own pairing is within the
  threshold), against every pair verified (the ceiling no band index passes);
- **cost**: the local engine's search (``near/stage.py``'s runs, candidates and
  verification) of this tree against another's (``--baseline-tree``: a
  checkout of phash19-v4), each in a child process on the same synthetic
  hashes (``bench/near/duplicates.py``'s), alternating rounds, best CPU of each.

A measurement, not the engine: nothing here changes what a conversion pairs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from beam_pipeline.core import keys
from beam_pipeline.features.dedupe.duplicates import Member
from beam_pipeline.features.near import hashes as nd
from beam_pipeline.features.near import stage as near
from bench.common.settings import CACHE_DIR
from bench.near import calibration, heldout
from bench.near import duplicates as bench_near

# (name, exact bands (count, bits), one-flip bands (count, bits)); None: every pair.
LAYOUTS = (
    ("phash19-v4: 8 x 23 exact", (8, 23), None),
    ("12 x 23 exact", (12, 23), None),
    ("16 x 24 exact", (16, 24), None),
    ("64 x 24 exact", (64, 24), None),
    ("8 x 23 exact + 2 x 26 one-flip", (8, 23), (2, 26)),
    ("8 x 23 exact + 4 x 26 one-flip", (8, 23), (4, 26)),
    ("6 x 27 one-flip", None, (6, 27)),
    ("7 x 27 one-flip", None, (7, 27)),
    ("6 x 28 one-flip", None, (6, 28)),
    ("8 x 28 one-flip", None, (8, 28)),
    ("8 x 27 one-flip", None, (8, 27)),
    ("8 x 26 one-flip", None, (8, 26)),
    ("phash19-v5: the product's candidate_pairs (6 x 27 one-flip)", "product", None),
    ("every pair verified", "all", None),
)


def ring_band(h: int, offset: int, bits: int) -> int:
    return nd.band_of(h, offset % nd.HASH_BITS, bits)


def flip_candidates(fps, count: int, bits: int, shift: int = 0) -> set[tuple[int, int]]:
    """Pairs ``(i, j)`` of which one's whole hash is within one flipped bit of a
    hash of the other in some band of ``count`` one-flip bands of ``bits``
    (offsets shifted ``shift`` bits), and within the threshold of it."""
    offsets = [o + shift for o in nd.band_offsets(count)]
    index: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, fp in enumerate(fps):
        for band, offset in enumerate(offsets):
            for slot, h in enumerate(fp.hashes):
                index.setdefault((band, ring_band(h, offset, bits)), []).append((i, slot))
    pairs = set()
    for i, fp in enumerate(fps):
        whole = fp.hashes[0]
        for band, offset in enumerate(offsets):
            key = ring_band(whole, offset, bits)
            for probe in [key] + [key ^ (1 << b) for b in range(bits)]:
                for j, slot in index.get((band, probe), ()):
                    if j != i and nd.hamming(whole, fps[j].hashes[slot]) <= nd.THRESHOLD:
                        pairs.add((min(i, j), max(i, j)))
    return pairs


def exact_candidates(fps, count: int, bits: int) -> set[tuple[int, int]]:
    """phash19-v4's rule: pairs sharing a band key, a whole hash's at least (the
    meeting pairing not checked)."""
    buckets: dict[int, list[tuple[int, bool]]] = {}
    for index, fp in enumerate(fps):
        for key, whole in nd.band_keys(fp, bits, count):
            buckets.setdefault(key, []).append((index, whole))
    return {
        (a, b) if a < b else (b, a)
        for members in buckets.values()
        for (a, wa), (b, wb) in itertools.combinations(members, 2)
        if (wa or wb) and a != b
    }


def layout_candidates(fps, exact, flips) -> set[tuple[int, int]]:
    if exact == "all":
        return set(itertools.combinations(range(len(fps)), 2))
    if exact == "product":
        return nd.candidate_pairs(fps)
    found = exact_candidates(fps, *exact) if exact else set()
    if flips:
        # Between the exact bands' offsets where both are used.
        found |= flip_candidates(fps, *flips, shift=4 if exact else 0)
    return found


def recall(near_set: calibration.NearSet, upscale: int, exact, flips) -> dict:
    """Found, cross-split found, false pairs and groups ``--dedupe near`` leaves
    spanning splits, of one layout on one set (``verify`` as the engines do)."""
    names = near_set.names
    fps = [nd.fingerprint(bench_near.load_image(near_set.image_path(n), upscale)) for n in names]
    origin = {n: n for n in near_set.originals} | {c: o for c, o, _ in near_set.copies}
    fractions = keys.parse_splits(keys.DEFAULT_SPLITS)
    split = {n: keys.assign_split(0, n, fractions) for n in names}
    found = {
        p
        for p in layout_candidates(fps, exact, flips)
        if nd.verify(fps[p[0]], fps[p[1]]) is not None
    }
    at = {n: i for i, n in enumerate(names)}
    hits = [tuple(sorted((at[c], at[o]))) in found for c, o, _ in near_set.copies]
    cross = [h for h, (c, o, _) in zip(hits, near_set.copies, strict=True) if split[c] != split[o]]
    return {
        "found": sum(hits) / len(hits),
        "cross_split": sum(cross) / len(cross),
        "cross_split_of": f"{sum(cross)}/{len(cross)}",
        "false": sum(origin[names[i]] != origin[names[j]] for i, j in found),
        **bench_near.left_spanning(names, split, origin, found),
    }


class _Members:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Member:
        return Member(f"{i:09d}", "train", 0)


def local_search(hashes: np.ndarray, colours: np.ndarray, work_dir: str) -> int:
    """``near.find_local`` after its input is read: its runs, candidates and
    verification, every image searched, a band at a time. Returns the pairs
    (not distinct)."""
    n = len(hashes)
    members = _Members(n)
    pairs = 0
    for band in range(nd.BAND_COUNT):
        runs = tempfile.mkdtemp(prefix="near-", dir=work_dir)
        try:
            near.write_runs(hashes, runs, np.ones(n, bool), band)
            for p in range(near.PARTITIONS):
                entries = np.fromfile(near.run_path(runs, p), dtype=np.uint64)
                candidates, _ = near.partition_candidates(entries, hashes, band)
                pairs += len(near.verified(candidates, n, hashes, colours, members))
        finally:
            shutil.rmtree(runs, ignore_errors=True)
    return pairs


# Runs in a child with a tree on its path: ``local_search`` there is that
# tree's engine (phash19-v4's tool had one of the same signature).
_ONE_SEARCH = """
import resource, sys, tempfile, time
import numpy as np
from bench.near import duplicates as b
from bench.tools import near_probe as p
n = int(sys.argv[1])
hashes, _ = b.synthetic_hashes(n, b.PLANTED)
colours = np.full((n, 3), 85, np.uint8)
with tempfile.TemporaryDirectory() as work:
    start = time.process_time()
    pairs = p.local_search(hashes, colours, work)
    cpu = time.process_time() - start
print(cpu, pairs, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def cost(images: int, rounds: int, trees: dict[str, str]) -> list[dict]:
    """CPU seconds of each tree's local search, rounds alternating (each round's
    order turns); also its pairs and the child's peak RSS (MB)."""
    best = {name: (float("inf"), 0, 0) for name in trees}
    for r in range(rounds):
        names = list(trees) if r % 2 == 0 else list(trees)[::-1]
        for name in names:
            env = dict(os.environ, PYTHONPATH=trees[name])
            out = subprocess.run(
                [sys.executable, "-c", _ONE_SEARCH, str(images)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
                cwd=trees[name],
            ).stdout.split()
            cpu, pairs, rss = float(out[0]), int(out[1]), int(out[2])
            best[name] = min(best[name], (cpu, pairs, max(rss, best[name][2])))
    base = best[next(iter(trees))][0]
    return [
        {"search": k, "cpu_s": v[0], "pairs": v[1], "rss_mb": v[2], "of_first": v[0] / base}
        for k, v in best.items()
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-tree", help="a checkout to time against (phash19-v4)")
    parser.add_argument("--no-cost", action="store_true")
    parser.add_argument("--no-recall", action="store_true")
    parser.add_argument("--layout", action="append", help="only layouts whose name has this")
    args = parser.parse_args(argv)
    if not args.no_recall:
        _recall_table(args.layout)
    if not args.no_cost:
        trees = {"baseline": args.baseline_tree} if args.baseline_tree else {}
        trees["this tree"] = os.getcwd()
        print(f"\nSearch CPU at {args.images:,} synthetic images, best of {args.rounds}:\n")
        print("| search | CPU s | of the first | pairs | peak RSS MB |\n|---|---|---|---|---|")
        for row in cost(args.images, args.rounds, trees):
            print(
                f"| {row['search']} | {row['cpu_s']:.1f} | {row['of_first']:.2f}x "
                f"| {row['pairs']} | {row['rss_mb']} |",
                flush=True,
            )
    return 0


def _recall_table(only: list[str] | None) -> None:
    sets = {
        "calibration": calibration.ensure_near_set(CACHE_DIR),
        "held-out": heldout.ensure_heldout_set(CACHE_DIR),
    }
    print(
        "| layout | "
        + " | ".join(f"{s} {size}" for s in sets for size in ("tile", "stored"))
        + " |"
    )
    print("|---" * (1 + 2 * len(sets)) + "|")
    for name, exact, flips in LAYOUTS:
        if only and not any(o in name for o in only):
            continue
        cells = []
        for near_set in sets.values():
            for upscale in (1, bench_near.STORED_UPSCALE):
                r = recall(near_set, upscale, exact, flips)
                cells.append(
                    f"{r['found']:.1%} / {r['cross_split']:.1%} ({r['cross_split_of']}) / {r['false']} "
                    f"(left {r['left_spanning']})"
                )
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

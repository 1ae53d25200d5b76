"""``python -m bench.tools.near_probe``: would a multi-probe band index find the copies the band index loses?

    python -m bench.tools.near_probe [--images 1280000] [--rounds 2]

Two parts, printed as markdown:

- **recall**: both photo sets (calibration and held-out, at the tile's size and
  a stored image's) through band layouts: today's exact 23-bit bands, more
  exact bands, and wider bands whose whole-hash key is also probed with each
  one-bit flip (a meeting kept only when its own pairing is within the
  threshold), against every pair verified (the ceiling no band index passes);
- **cost**: the local engine's search (``stages/near.py``'s runs, candidates
  and verification) against :func:`probe_search`, a NumPy prototype of the
  one-flip index, on synthetic hashes (``bench/near/duplicates.py``'s),
  alternating rounds, best CPU of each.

A measurement, not the engine: nothing here changes what a conversion pairs.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
import time

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
    ("today: 8 x 23 exact", (nd.BAND_COUNT, nd.BAND_BITS), None),
    ("12 x 23 exact", (12, 23), None),
    ("16 x 24 exact", (16, 24), None),
    ("64 x 24 exact", (64, 24), None),
    ("8 x 23 exact + 2 x 26 one-flip", (nd.BAND_COUNT, nd.BAND_BITS), (2, 26)),
    ("8 x 23 exact + 4 x 26 one-flip", (nd.BAND_COUNT, nd.BAND_BITS), (4, 26)),
    ("6 x 27 one-flip", None, (6, 27)),
    ("7 x 27 one-flip", None, (7, 27)),
    ("6 x 28 one-flip", None, (6, 28)),
    ("8 x 28 one-flip", None, (8, 28)),
    ("8 x 27 one-flip", None, (8, 27)),
    ("8 x 26 one-flip", None, (8, 26)),
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


def layout_candidates(fps, exact, flips) -> set[tuple[int, int]]:
    if exact == "all":
        return set(itertools.combinations(range(len(fps)), 2))
    found = nd.candidate_pairs(fps, exact[1], exact[0]) if exact else set()
    if flips:
        # Between the exact bands' offsets where both are used.
        found |= flip_candidates(fps, *flips, shift=4 if exact else 0)
    return found


def recall(near_set: calibration.NearSet, upscale: int, exact, flips) -> dict:
    """Found, cross-split found, false pairs and groups ``--dedupe near`` leaves
    spanning splits, of one layout on one set (``verify`` as the engines do)."""
    names = near_set.names
    fps = [nd.fingerprint(bench_near._load(near_set.image_path(n), upscale)) for n in names]
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
        **bench_near._left_spanning(names, split, origin, found),
    }


def _ring(hashes: np.ndarray, offset: int, bits: int) -> np.ndarray:
    ring = hashes >> np.uint64(offset)
    if offset:
        ring |= hashes << np.uint64(nd.HASH_BITS - offset)
    return ring & np.uint64((1 << bits) - 1)


def probe_search(hashes: np.ndarray, bits: int, count: int, chunk: int = 1 << 16) -> np.ndarray:
    """The one-flip index over ``(images, slots)`` hashes, per band: a table of
    the keys every hash has, the whole hashes' probes (the key and its ``bits``
    one-bit flips) that hit it, a table of those, the index entries it keeps,
    then each kept probe meets its key's entries and the meeting is kept when
    its pairing is within the threshold. Returns the pairs as ``i * images + j``."""
    n, slots = hashes.shape
    whole, flat = hashes[:, 0].copy(), hashes.reshape(-1)
    flips = np.array([0] + [1 << b for b in range(bits)], np.uint64)
    entry_bits = int(n * slots - 1).bit_length()
    shift, mask = np.uint64(entry_bits), np.uint64((1 << entry_bits) - 1)
    seen = np.zeros(1 << bits, bool)
    found = []
    for offset in nd.band_offsets(count):
        seen[:] = False
        for low in range(0, n, chunk):
            seen[_ring(hashes[low : low + chunk], offset, bits).ravel()] = True
        whole_key = _ring(whole, offset, bits)
        probes = []
        for low in range(0, n, chunk):
            keys_ = whole_key[low : low + chunk, None] ^ flips[None, :]
            hit = seen[keys_]
            image = np.nonzero(hit)[0].astype(np.uint64) + np.uint64(low)
            probes.append(keys_[hit] << shift | image)
        probe = np.sort(np.concatenate(probes))
        probe_key = probe >> shift
        seen[:] = False
        seen[probe_key] = True
        kept = []
        for low in range(0, n, chunk):
            keys_ = _ring(hashes[low : low + chunk], offset, bits).ravel()
            at = np.flatnonzero(seen[keys_])
            kept.append(keys_[at] << shift | (at.astype(np.uint64) + np.uint64(low * slots)))
        index = np.sort(np.concatenate(kept))
        index_key = index >> shift
        start = np.searchsorted(index_key, probe_key, "left")
        many = np.searchsorted(index_key, probe_key, "right") - start
        a = np.repeat((probe & mask).astype(np.int64), many)
        into = np.arange(many.sum()) - np.repeat(np.cumsum(many) - many, many)
        entry = (index[np.repeat(start, many) + into] & mask).astype(np.int64)
        close = np.bitwise_count(whole[a] ^ flat[entry]) <= nd.THRESHOLD
        a, b = a[close], entry[close] // slots
        a, b = a[a != b], b[a != b]
        found.append(np.minimum(a, b) * n + np.maximum(a, b))
    return np.unique(np.concatenate(found))


class _Members:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Member:
        return Member(f"{i:09d}", "train", 0)


def local_search(hashes: np.ndarray, colours: np.ndarray, work_dir: str) -> int:
    """``near.find_local`` after its input is read: its runs, candidates and
    verification, every image searched. Returns the pairs (not distinct)."""
    n = len(hashes)
    members = _Members(n)
    runs = tempfile.mkdtemp(prefix="near-", dir=work_dir)
    try:
        near._write_runs(hashes, runs, np.ones(n, bool))
        pairs = 0
        for p in range(near.PARTITIONS):
            entries = np.fromfile(near._run_path(runs, p), dtype=np.uint64)
            candidates, _ = near.partition_candidates(entries, n)
            pairs += len(near._verified(candidates, n, hashes, colours, members))
        return pairs
    finally:
        shutil.rmtree(runs, ignore_errors=True)


def cost(images: int, rounds: int, layouts: list[tuple[int, int]]) -> list[dict]:
    """CPU seconds of each search, rounds alternating (each round's order turns)."""
    hashes, _ = bench_near.synthetic_hashes(images, bench_near.PLANTED)
    colours = np.full((images, 3), 85, np.uint8)
    runs = {"today (local engine)": lambda: local_search(hashes, colours, work)}
    for bits, count in layouts:
        runs[f"{count} x {bits} one-flip (prototype)"] = lambda bits=bits, count=count: len(
            probe_search(hashes, bits, count)
        )
    best = {name: float("inf") for name in runs}
    with tempfile.TemporaryDirectory() as work:
        for r in range(rounds):
            names = list(runs) if r % 2 == 0 else list(runs)[::-1]
            for name in names:
                start = time.process_time()
                runs[name]()
                best[name] = min(best[name], time.process_time() - start)
    base = best["today (local engine)"]
    return [{"search": k, "cpu_s": v, "of_today": v / base} for k, v in best.items()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cost-layouts", default="27x8", help="bitsxcount, comma-separated")
    parser.add_argument("--no-cost", action="store_true")
    args = parser.parse_args(argv)
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
        cells = []
        for near_set in sets.values():
            for upscale in (1, bench_near.STORED_UPSCALE):
                r = recall(near_set, upscale, exact, flips)
                cells.append(
                    f"{r['found']:.1%} / {r['cross_split']:.1%} ({r['cross_split_of']}) / {r['false']} "
                    f"(left {r['left_spanning']})"
                )
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    if not args.no_cost:
        layouts = [tuple(int(x) for x in s.split("x")) for s in args.cost_layouts.split(",")]
        print(f"\nSearch CPU at {args.images:,} synthetic images, best of {args.rounds}:\n")
        print("| search | CPU s | of today |\n|---|---|---|")
        for row in cost(args.images, args.rounds, layouts):
            print(f"| {row['search']} | {row['cpu_s']:.1f} | {row['of_today']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

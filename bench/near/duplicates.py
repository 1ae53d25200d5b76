"""``python -m bench --only near``: near-duplicate hashes calibrated and costed.

Three measurements, written to ``near.md`` and ``near.json``:

* **calibration** (``bench/near/calibration.py``'s set of real photos and known near
  copies): for each scheme (hash kind, whole image alone or with windows), the
  recall of the copies (all, and those the converter's default split puts in
  another split than their original) and the false pairs per 10,000 images,
  per threshold and per kind of copy, through the real band index;
* **cost**: CPU per image of ``near_duplicates.fingerprint`` of the image the
  converter stores (decoded from its output: the size it has after the resize,
  before the encode, where the engine would hash it, whatever the source's
  format or size, and whether it passed through) against the CPU per image of
  ``images.convert`` of the same files, same run, best of N rounds;
* **scale**: the band index's pair search on synthetic hash sets (random
  64-bit hashes, six per image like the windowed scheme, with planted near
  pairs) at 100k and 1.28 M images: wall time, peak memory of the arrays
  (tracemalloc), candidates, pairs found of those planted.
"""

from __future__ import annotations

import io
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np
from PIL import Image

from beam_pipeline.core import images, keys
from beam_pipeline.core import near_duplicates as nd
from bench.common import data
from bench.near import calibration as near_data

THRESHOLDS = tuple(range(0, 17))
# The centre and four corners at 90% of each side: the first crop-tolerant try.
FIVE_WINDOWS = nd.WINDOWS[:1] + (
    (0.05, 0.05, 0.95, 0.95),
    (0.0, 0.0, 0.9, 0.9),
    (0.1, 0.0, 1.0, 0.9),
    (0.0, 0.1, 0.9, 1.0),
    (0.1, 0.1, 1.0, 1.0),
)
SCHEMES = {  # name -> (hash kind, windows)
    "phash whole": ("phash", nd.WINDOWS[:1]),
    "dhash whole": ("dhash", nd.WINDOWS[:1]),
    "ahash whole": ("ahash", nd.WINDOWS[:1]),
    "phash 5 windows": ("phash", FIVE_WINDOWS),
    "dhash 5 windows": ("dhash", FIVE_WINDOWS),
    "phash 18 windows": ("phash", nd.WINDOWS),
    "dhash 18 windows": ("dhash", nd.WINDOWS),
}
CHOSEN = "phash 18 windows"
FULL_SCALE = (100_000, 400_000, 1_280_000)
QUICK_SCALE = (20_000,)
# Band widths measured: the calibration's recall through each, and the scale
# search with each (16-bit bands only up to ``MAX_16_BIT``: their random
# candidates grow as the square of the images, ~1.9e9 at 1.28 M).
BAND_WIDTHS = (16, 21, 32)
MAX_16_BIT = 400_000
PLANTED = 1000


def _load(path: Path) -> Image.Image:
    with Image.open(path) as im:
        return im.convert("RGB")


def calibrate(near: near_data.NearSet, kind: str, windows, band_bits: int = nd.BAND_BITS) -> dict:
    """Recall and false pairs of one scheme at every threshold in ``THRESHOLDS``."""
    names = near.names
    fps = [nd.fingerprint(_load(near.image_path(n)), kind, windows) for n in names]
    index = {n: i for i, n in enumerate(names)}
    origin = {n: n for n in near.originals} | {c: o for c, o, _ in near.copies}
    fractions = keys.parse_splits(keys.DEFAULT_SPLITS)
    split = {n: keys.assign_split(0, n, fractions) for n in names}
    candidates = nd.candidate_pairs(fps, band_bits)
    # Distance and colour of every candidate, once; each threshold only filters.
    checked = {
        (i, j): (nd.distance(fps[i], fps[j]), nd.colours_agree(fps[i], fps[j]))
        for i, j in candidates
    }
    rows = []
    for t in THRESHOLDS:
        found = {p for p, (d, ok) in checked.items() if d <= t and ok}
        false = sum(1 for i, j in found if origin[names[i]] != origin[names[j]])
        per_kind: dict[str, list[int]] = {}
        cross = [0, 0]
        for copy, original, copy_kind in near.copies:
            pair = tuple(sorted((index[copy], index[original])))
            hit = int(pair in found)
            per_kind.setdefault(copy_kind, [0, 0])
            per_kind[copy_kind][0] += hit
            per_kind[copy_kind][1] += 1
            if split[copy] != split[original]:
                cross[0] += hit
                cross[1] += 1
        hits = sum(v[0] for v in per_kind.values())
        rows.append(
            {
                "threshold": t,
                "recall": hits / len(near.copies),
                "cross_split_recall": cross[0] / max(1, cross[1]),
                "cross_split_copies": cross[1],
                "false_pairs": false,
                "false_per_10k": false / len(names) * 10_000,
                "per_kind": {k: v[0] / v[1] for k, v in sorted(per_kind.items())},
            }
        )
    return {"images": len(names), "candidates": len(candidates), "rows": rows}


def best_threshold(rows: list[dict], max_false_per_10k: float = 1.0) -> dict:
    """The row of highest recall whose false pairs stay under the goal."""
    ok = [r for r in rows if r["false_per_10k"] < max_false_per_10k]
    return max(ok, key=lambda r: (r["recall"], -r["threshold"])) if ok else rows[0]


def cost(files: list[Path], rounds: int) -> dict:
    """CPU per image: the converter's ``images.convert`` vs the fingerprint of its output."""
    sources = [p.read_bytes() for p in files]
    spec = images.ImageSpec()
    outputs = [_decoded(images.convert(b, spec).jpeg) for b in sources]
    convert_s, hash_s = [], []
    for _ in range(rounds):
        start = time.process_time()
        for b in sources:
            images.convert(b, spec)
        convert_s.append((time.process_time() - start) / len(sources))
        start = time.process_time()
        for img in outputs:
            nd.fingerprint(img)
        hash_s.append((time.process_time() - start) / len(outputs))
    return {
        "images": len(files),
        "rounds": rounds,
        "convert_ms": min(convert_s) * 1e3,
        "fingerprint_ms": min(hash_s) * 1e3,
        "ratio": min(hash_s) / min(convert_s),
    }


def _decoded(jpeg: bytes) -> Image.Image:
    with Image.open(io.BytesIO(jpeg)) as im:
        return im.convert("RGB")


def synthetic_hashes(n: int, planted: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(n, len(WINDOWS))`` random uint64 hashes; the first ``planted`` pairs of
    rows ``(2k, 2k+1)`` are near copies: the whole-image hash of ``2k+1`` is
    ``2k``'s third window's with 0-6 bits flipped. Returns the hashes and the
    planted pairs."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**63, size=(n, len(nd.WINDOWS)), dtype=np.int64).view(np.uint64)
    hashes ^= rng.integers(0, 2, size=hashes.shape, dtype=np.uint64) << np.uint64(63)
    pairs = np.stack([np.arange(planted) * 2, np.arange(planted) * 2 + 1], axis=1)
    for k, (a, b) in enumerate(pairs):
        flips = rng.choice(64, size=k % 7, replace=False)
        hashes[b, 0] = hashes[a, 2] ^ np.uint64(sum(1 << int(f) for f in flips))
    return hashes, pairs


def search(
    hashes: np.ndarray,
    threshold: int = nd.THRESHOLD,
    band_bits: int = nd.BAND_BITS,
    chunk: int = 20_000,
):
    """The band index over an ``(n, slots)`` array of hashes, slot 0 the whole image's.

    Per band, every hash's key is sorted (what a GroupByKey on the band key
    does) and each whole-image hash meets every hash of its bucket
    (``band_keys``' rule: a pair needs one whole hash), ``chunk`` whole hashes
    at a time so memory stays bounded. A candidate is verified on the pair of
    hashes that met (one popcount); ``near_duplicates.distance`` also tries
    the image's other windows, which finds a superset. Returns the pairs
    ``(i, j)``, ``i < j``, and the number of candidates.
    """
    n, slots = hashes.shape
    flat = hashes.ravel()
    owner = np.repeat(np.arange(n, dtype=np.int64), slots)
    mask = np.uint64((1 << band_bits) - 1)
    found, candidates = [], 0
    for band in range(nd.HASH_BITS // band_bits):
        key = (flat >> np.uint64(band * band_bits)) & mask
        order = np.argsort(key, kind="stable")
        key_sorted = key[order]
        whole_key = key[::slots]
        for lo in range(0, n, chunk):
            q = np.arange(lo, min(n, lo + chunk))
            start = np.searchsorted(key_sorted, whole_key[q], "left")
            count = np.searchsorted(key_sorted, whole_key[q], "right") - start
            a = np.repeat(q, count)
            base = np.repeat(start - np.cumsum(count) + count, count)
            entry = order[base + np.arange(len(a))]
            b = owner[entry]
            keep = a != b
            a, entry, b = a[keep], entry[keep], b[keep]
            candidates += len(a)
            near = np.bitwise_count(hashes[a, 0] ^ flat[entry]) <= threshold
            a, b = a[near], b[near]
            found.append(np.minimum(a, b) * n + np.maximum(a, b))
    pairs = np.unique(np.concatenate(found)) if found else np.empty(0, np.int64)
    return {(int(p // n), int(p % n)) for p in pairs}, candidates


def scale(n: int, band_bits: int) -> dict:
    hashes, planted = synthetic_hashes(n, PLANTED)
    # The hashes themselves are the input (a fingerprint per image the engine
    # already holds); tracemalloc counts what the search adds to them.
    tracemalloc.start()
    start = time.perf_counter()
    found, candidates = search(hashes, band_bits=band_bits)
    wall = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    planted_set = {tuple(p) for p in planted.tolist()}
    return {
        "images": n,
        "band_bits": band_bits,
        "wall_s": wall,
        "peak_mb": peak / 2**20,
        "hash_mb": hashes.nbytes / 2**20,
        "candidates": candidates,
        "planted_found": len(planted_set & found) / len(planted_set),
        "other_pairs": len(found - planted_set),
    }


def run(cache_dir: Path, quick: bool, rounds: int, scale_sizes: tuple[int, ...]) -> dict:
    """Every part; the dict ``markdown`` prints and ``near.json`` keeps."""
    near = near_data.ensure_near_set(cache_dir)
    tag = "quick" if quick else "full"
    web = data.ensure_image_set("web", 48 if quick else 2000, cache_dir, tag)
    files = data.list_images(web.path)[: 24 if quick else 200]
    loadavg = [round(x, 2) for x in os.getloadavg()]
    schemes = {name: calibrate(near, *spec) for name, spec in SCHEMES.items()}
    bands = {}
    for bits in BAND_WIDTHS:
        got = calibrate(near, *SCHEMES[CHOSEN], band_bits=bits)
        row = got["rows"][nd.THRESHOLD]
        bands[bits] = {"candidates": got["candidates"], **row}
    costs = cost(files, rounds)
    scales = [
        scale(n, bits) for n in scale_sizes for bits in (16, 21) if bits != 16 or n <= MAX_16_BIT
    ]
    return {
        "near_set": {"originals": len(near.originals), "copies": len(near.copies)},
        "loadavg": loadavg,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "schemes": schemes,
        "chosen": {name: best_threshold(s["rows"]) for name, s in schemes.items()},
        "bands": bands,
        "cost": costs,
        "scale": scales,
        "threshold": nd.THRESHOLD,
    }


def markdown(result: dict) -> str:
    ns = result["near_set"]
    lines = [
        "# Near duplicates",
        "",
        f"Calibration set: {ns['originals']} distinct real photo tiles, {ns['copies']} "
        f"near copies; load {result['loadavg']} at the start, {result['loadavg_end']} at the end.",
        "",
        "| scheme | best threshold | recall | cross-split recall | false pairs / 10k "
        "| resize | jpeg | crop | brightness | combined |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in result["chosen"].items():
        kinds = " | ".join(f"{row['per_kind'].get(k, 0):.0%}" for k in near_data.KINDS)
        # best_threshold falls back to threshold 0 when none stays under the goal.
        shown = row["threshold"] if row["false_per_10k"] < 1 else f"none ({row['threshold']}:)"
        lines.append(
            f"| {name} | {shown} | {row['recall']:.1%} | "
            f"{row['cross_split_recall']:.1%} ({row['cross_split_copies']}) | "
            f"{row['false_per_10k']:.1f} | {kinds} |"
        )
    rows = result["schemes"][CHOSEN]["rows"]
    lines += ["", f"{CHOSEN} by threshold:", "", "| t | recall | false pairs / 10k |"]
    lines.append("|---|---|---|")
    lines += [f"| {r['threshold']} | {r['recall']:.1%} | {r['false_per_10k']:.1f} |" for r in rows]
    c = result["cost"]
    lines += [
        "",
        f"Cost ({c['images']} web images, best of {c['rounds']}): convert "
        f"{c['convert_ms']:.2f} ms CPU per image, fingerprint {c['fingerprint_ms']:.3f} ms "
        f"({c['ratio']:.1%}).",
        "",
        f"{CHOSEN} at threshold {result['threshold']} through bands of each width:",
        "",
        "| band bits | bands | candidates | recall | false pairs / 10k |",
        "|---|---|---|---|---|",
    ]
    for bits, b in result["bands"].items():
        lines.append(
            f"| {bits} | {nd.HASH_BITS // int(bits)} | {b['candidates']} | {b['recall']:.1%} "
            f"| {b['false_per_10k']:.1f} |"
        )
    lines += [
        "",
        "| images | band bits | wall s | peak MB | hashes MB | candidates | planted found "
        "| other pairs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in result["scale"]:
        lines.append(
            f"| {s['images']:,} | {s['band_bits']} | {s['wall_s']:.1f} | {s['peak_mb']:.0f} | {s['hash_mb']:.0f} "
            f"| {s['candidates']:,} | {s['planted_found']:.1%} | {s['other_pairs']} |"
        )
    return "\n".join(lines) + "\n"

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
  64-bit hashes with the DC bit set, as many per image as the scheme has, and
  planted near pairs) at 100k to 1.28 M images: CPU and wall time, peak
  memory of the arrays (tracemalloc), candidates, pairs found of those
  planted, and the search's CPU per image against a whole conversion's (the
  scale part's web run, ``bench/results/scale.json``).
"""

from __future__ import annotations

import io
import json
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np
from PIL import Image

from beam_pipeline.core import images, keys
from beam_pipeline.features.near import hashes as nd
from beam_pipeline.features.near.feature import PIXELS
from bench.common import data
from bench.common.settings import RESULTS_DIR
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
# Band layouts measured, (bits, count): the calibration's recall through
# each, and the scale search with each. Four disjoint bands of 16 bits only up
# to ``MAX_16_BIT``: their random candidates grow as the square of the images.
CHOSEN_BANDS = (nd.BAND_BITS, nd.BAND_COUNT)
BAND_LAYOUTS = ((16, 4), (21, 3), (20, 5), CHOSEN_BANDS, (22, 5), (24, 6), (32, 2))
SCALE_LAYOUTS = ((16, 4), (21, 3), CHOSEN_BANDS)
MAX_16_BIT = 400_000
PLANTED = 1000
# The whole-image hash's first bit is the DC coefficient against the median
# of the others: set in every real hash.
DC_BIT = np.uint64(1 << (nd.HASH_BITS - 1))


def load_image(path: Path, upscale: int = 1) -> Image.Image:
    with Image.open(path) as im:
        rgb = im.convert("RGB")
    if upscale == 1:
        return rgb
    return rgb.resize((rgb.width * upscale, rgb.height * upscale), Image.Resampling.BICUBIC)


# The set's tiles are 128 px: their fingerprint base is a full reduce by 4 or
# less. Upscaled by this, they are the size a conversion stores (256 px a
# side by default), where the base is sampled (near_duplicates.SAMPLED_FROM).
STORED_UPSCALE = 2


def calibrate(
    near: near_data.NearSet,
    kind: str,
    windows,
    band_bits: int = nd.BAND_BITS,
    band_count: int = nd.BAND_COUNT,
    upscale: int = 1,
) -> dict:
    """Recall and false pairs of one scheme at every threshold in ``THRESHOLDS``,
    of the set's images upscaled ``upscale`` times."""
    names = near.names
    fps = [nd.fingerprint(load_image(near.image_path(n), upscale), kind, windows) for n in names]
    index = {n: i for i, n in enumerate(names)}
    origin = {n: n for n in near.originals} | {c: o for c, o, _ in near.copies}
    fractions = keys.parse_splits(keys.DEFAULT_SPLITS)
    split = {n: keys.assign_split(0, n, fractions) for n in names}
    candidates = nd.candidate_pairs(fps, band_bits, band_count)
    # Distance and colour of every candidate, once; each threshold only filters.
    # The pHash's texture flag is the search's rule too (the other kinds have none).
    textured = [kind != "phash" or nd.textured(fp) for fp in fps]
    checked = {
        (i, j): (
            nd.distance(fps[i], fps[j]),
            nd.colours_agree(fps[i], fps[j])
            and textured[i]
            and textured[j]
            and nd.support(fps[i], fps[j]) <= nd.SUPPORT,
        )
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
        spanning = left_spanning(names, split, origin, found)
        rows.append(
            {
                "threshold": t,
                "recall": hits / len(near.copies),
                "cross_split_recall": cross[0] / max(1, cross[1]),
                "cross_split_copies": cross[1],
                "false_pairs": false,
                "false_per_10k": false / len(names) * 10_000,
                "per_kind": {k: v[0] / v[1] for k, v in sorted(per_kind.items())},
                "untextured": len(textured) - sum(textured),
                **spanning,
            }
        )
    copy_pairs = sum(origin[names[i]] == origin[names[j]] for i, j in candidates)
    return {
        "images": len(names),
        "candidates": len(candidates),
        # Candidates of distinct photos, against what uniform random hashes would
        # give: real hashes share structure, so the scale search's random count
        # is a floor.
        "other_candidates": len(candidates) - copy_pairs,
        "uniform_candidates": _uniform_candidates(len(names), len(windows), band_bits, band_count),
        "rows": rows,
    }


def left_spanning(names, split, origin, found) -> dict:
    """What ``--dedupe near`` leaves of the set's true groups (an original and its
    copies) that span splits: of those, how many still do after each found
    group keeps only its keeper (``near_search.keeper``)."""
    from beam_pipeline.features.dedupe.duplicates import Member
    from beam_pipeline.features.near import search as near_search

    members = [Member(n, split[n], 0) for n in names]
    dropped = near_search.dropped(
        [
            near_search.Group(tuple(members[names.index(i)] for i in g), ())
            for g in nd.groups((names[i], names[j]) for i, j in found)
        ]
    )
    truth: dict[str, set[str]] = {}
    for n in names:
        truth.setdefault(origin[n], set()).add(n)
    spanning = [g for g in truth.values() if len({split[n] for n in g}) > 1]
    left = [g for g in spanning if len({split[n] for n in g if n not in dropped}) > 1]
    return {"groups_spanning": len(spanning), "left_spanning": len(left)}


def _uniform_candidates(images: int, slots: int, band_bits: int, band_count: int) -> float:
    """Expected pairs of distinct images that share a band key, for random hashes:
    every whole hash against every hash of the others, per band."""
    return images * (images - 1) / 2 * 2 * slots * band_count / 2**band_bits


def best_threshold(rows: list[dict], max_false_per_10k: float = 1.0) -> dict:
    """The row of highest recall whose false pairs stay under the goal."""
    ok = [r for r in rows if r["false_per_10k"] < max_false_per_10k]
    return max(ok, key=lambda r: (r["recall"], -r["threshold"])) if ok else rows[0]


def cost(files: list[Path], rounds: int) -> dict:
    """CPU per image: the converter's ``images.convert`` vs the fingerprint of its output."""
    sources = [p.read_bytes() for p in files]
    spec = images.ImageSpec(pixels=PIXELS)  # as a run converts: fingerprint included
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
    """``(n, len(WINDOWS))`` random uint64 hashes with the DC bit set; the first
    ``planted`` pairs of rows ``(2k, 2k+1)`` are near copies: the whole-image
    hash of ``2k+1`` is ``2k``'s third window's with 0, 2, 4 or 6 of its other
    bits flipped (a textured pair's distance is nearly always even: each hash
    has as many bits above its median), and ``2k``'s fourth window is its
    third with 2 bits flipped (the pair's support). Returns the hashes and the
    planted pairs."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**63, size=(n, len(nd.WINDOWS)), dtype=np.int64).view(np.uint64)
    hashes |= DC_BIT
    pairs = np.stack([np.arange(planted) * 2, np.arange(planted) * 2 + 1], axis=1)
    for k, (a, b) in enumerate(pairs):
        flips = rng.choice(nd.HASH_BITS - 1, size=2 * (k % 4), replace=False)
        hashes[b, 0] = hashes[a, 2] ^ np.uint64(sum(1 << int(f) for f in flips))
        # A neighbouring window of a photo is close to the window too: the
        # pair's support (near_duplicates.support), 2 bits further.
        hashes[a, 3] = hashes[a, 2] ^ np.uint64(0b11 << int(rng.integers(0, 62)))
    return hashes, pairs


def _band_of(hashes: np.ndarray, offset: int, band_bits: int) -> np.ndarray:
    """``near_duplicates.band_of`` of every hash of an array."""
    ring = hashes >> np.uint64(offset)
    if offset:
        ring |= hashes << np.uint64(nd.HASH_BITS - offset)
    return ring & np.uint64((1 << band_bits) - 1)


def search(
    hashes: np.ndarray,
    threshold: int = nd.THRESHOLD,
    band_bits: int = nd.BAND_BITS,
    band_count: int = nd.BAND_COUNT,
    chunk: int = 50_000,
    flips: int = nd.PROBE_FLIPS,
):
    """The band index over an ``(n, slots)`` array of hashes, slot 0 the whole image's.

    Per band (``band_keys``' layout), every hash's key is sorted (what a
    GroupByKey on the band key does) and each whole-image hash's probes (its
    key, up to ``flips`` bits flipped: ``probe_keys``) meet every hash of their
    buckets,
    ``chunk`` whole hashes at a time so memory stays bounded. A candidate is
    verified on the pair of hashes that met (one popcount);
    ``near_duplicates.distance`` also tries the image's other windows, which
    finds a superset. Returns the pairs ``(i, j)``, ``i < j``, and the number
    of candidates.
    """
    n, slots = hashes.shape
    flat = hashes.ravel()
    # Key and entry packed in one uint64 and sorted as numbers: a plain sort
    # of one array, where an argsort of the keys moves two.
    entry_bits = max(1, int(flat.size - 1).bit_length())
    if band_bits + entry_bits > 64:
        raise ValueError(f"{flat.size} hashes with {band_bits}-bit bands do not pack in 64 bits")
    shift, entry_mask = np.uint64(entry_bits), np.uint64((1 << entry_bits) - 1)
    found, candidates = [], 0
    masks = nd.flip_masks(band_bits, flips)
    for offset in nd.band_offsets(band_count):
        key = _band_of(flat, offset, band_bits)
        whole_key = key[::slots].copy()
        # In place, so the band's arrays are the key array, its sorted entries
        # and a passing index: three of the hashes' count, not six.
        key <<= shift
        key |= np.arange(flat.size, dtype=np.uint64)
        key.sort()
        order = (key & entry_mask).view(np.int64)
        key >>= shift
        key_sorted = key
        for lo in range(0, n, chunk):
            q = np.repeat(np.arange(lo, min(n, lo + chunk)), len(masks))
            probe = whole_key[q] ^ np.tile(masks, len(q) // len(masks))
            start = np.searchsorted(key_sorted, probe, "left")
            count = np.searchsorted(key_sorted, probe, "right") - start
            a = np.repeat(q, count)
            base = np.repeat(start - np.cumsum(count) + count, count)
            entry = order[base + np.arange(len(a))]
            b = entry // slots
            keep = a != b
            a, entry, b = a[keep], entry[keep], b[keep]
            candidates += len(a)
            near = np.bitwise_count(hashes[a, 0] ^ flat[entry]) <= threshold
            a, b = a[near], b[near]
            found.append(np.minimum(a, b) * n + np.maximum(a, b))
    pairs = np.unique(np.concatenate(found)) if found else np.empty(0, np.int64)
    return {(int(p // n), int(p % n)) for p in pairs}, candidates


def conversion_cpu_ms(results_dir: Path = RESULTS_DIR) -> dict | None:
    """The scale part's CPU per image of a whole conversion (the local default run
    of the web set at its largest size), from its last ``scale.json``."""
    path = results_dir / "scale.json"
    if not path.exists():
        return None
    rows = [r for r in json.loads(path.read_text())["rows"] if r["converter"] == "imagerecords"]
    rows = [r for r in rows if r.get("ok", True)]
    if not rows:
        return None
    row = max(rows, key=lambda r: r["images"])
    return {"images": row["images"], "cpu_ms_per_image": row["cpu_ms_per_image"]}


def scale(n: int, band_bits: int, band_count: int, baseline_ms: float | None) -> dict:
    hashes, planted = synthetic_hashes(n, PLANTED)
    # The hashes themselves are the input (a fingerprint per image the engine
    # already holds); tracemalloc counts what the search adds to them.
    tracemalloc.start()
    start, cpu_start = time.perf_counter(), time.process_time()
    found, candidates = search(hashes, band_bits=band_bits, band_count=band_count)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    planted_set = {tuple(p) for p in planted.tolist()}
    cpu_ms = cpu / n * 1e3
    return {
        "images": n,
        "band_bits": band_bits,
        "band_count": band_count,
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_ms_per_image": cpu_ms,
        "of_conversion": cpu_ms / baseline_ms if baseline_ms else None,
        "peak_mb": peak / 2**20,
        "hash_mb": hashes.nbytes / 2**20,
        "candidates": candidates,
        "planted_found": len(planted_set & found) / len(planted_set),
        "other_pairs": len(found - planted_set),
    }


def held_out_rows(cache_dir: Path) -> dict | None:
    """The chosen scheme at its threshold on the held-out set (``heldout.py``),
    at the set's size and a stored image's; None where its photos are not installed."""
    from bench.near import heldout

    try:
        held = heldout.ensure_heldout_set(cache_dir)
    except RuntimeError:
        return None
    rows = {
        upscale: calibrate(held, *SCHEMES[CHOSEN], upscale=upscale)["rows"][nd.THRESHOLD]
        for upscale in (1, STORED_UPSCALE)
    }
    return {"originals": len(held.originals), "copies": len(held.copies), "rows": rows}


def run(cache_dir: Path, quick: bool, rounds: int, scale_sizes: tuple[int, ...]) -> dict:
    """Every part; the dict ``markdown`` prints and ``near.json`` keeps."""
    near = near_data.ensure_near_set(cache_dir)
    tag = "quick" if quick else "full"
    web = data.ensure_image_set("web", 48 if quick else 2000, cache_dir, tag)
    files = data.list_images(web.path)[: 24 if quick else 200]
    loadavg = [round(x, 2) for x in os.getloadavg()]
    schemes = {name: calibrate(near, *spec) for name, spec in SCHEMES.items()}
    bands = {}
    for bits, count in BAND_LAYOUTS:
        got = calibrate(near, *SCHEMES[CHOSEN], band_bits=bits, band_count=count)
        row = got["rows"][nd.THRESHOLD]
        bands[f"{count}x{bits}"] = {
            "band_bits": bits,
            "band_count": count,
            "candidates": got["candidates"],
            "other_candidates": got["other_candidates"],
            "uniform_candidates": got["uniform_candidates"],
            **row,
        }
    stored = calibrate(near, *SCHEMES[CHOSEN], upscale=STORED_UPSCALE)
    held_out = held_out_rows(cache_dir)
    costs = cost(files, rounds)
    baseline = conversion_cpu_ms()
    baseline_ms = baseline["cpu_ms_per_image"] if baseline else None
    scales = [
        scale(n, bits, count, baseline_ms)
        for n in scale_sizes
        for bits, count in SCALE_LAYOUTS
        if bits != 16 or n <= MAX_16_BIT
    ]
    return {
        "near_set": {"originals": len(near.originals), "copies": len(near.copies)},
        "loadavg": loadavg,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "schemes": schemes,
        "chosen": {name: best_threshold(s["rows"]) for name, s in schemes.items()},
        "stored_size": {"upscale": STORED_UPSCALE, "rows": stored["rows"]},
        "held_out": held_out,
        "bands": bands,
        "cost": costs,
        "conversion_baseline": baseline,
        "scale": scales,
        "threshold": nd.THRESHOLD,
        "band_layout": f"{nd.BAND_COUNT}x{nd.BAND_BITS}",
    }


def _held_out_line(held: dict | None) -> str:
    if not held:
        return "Held-out set (bench/near/heldout.py): its photos are not installed."
    parts = [
        f"{'as tiled' if up == 1 else f'upscaled {up}x'}: recall {r['recall']:.1%}, "
        f"cross-split {r['cross_split_recall']:.1%} ({r['cross_split_copies']}), "
        f"false pairs / 10k {r['false_per_10k']:.1f}, groups left spanning splits by "
        f"--dedupe near {r['left_spanning']} of {r['groups_spanning']}"
        for up, r in held["rows"].items()
    ]
    return (
        f"Held-out set ({held['originals']} tiles of other photos, {held['copies']} copies, "
        f"threshold {nd.THRESHOLD}): " + "; ".join(parts) + "."
    )


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
    stored = result["stored_size"]
    lines += [
        "",
        f"{CHOSEN}, the set upscaled {stored['upscale']}x (a stored image's size, "
        "the sampled base):",
        "",
        "| t | recall | cross-split recall | false pairs / 10k |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['threshold']} | {r['recall']:.1%} | {r['cross_split_recall']:.1%} "
        f"| {r['false_per_10k']:.1f} |"
        for r in stored["rows"][:9]
    ]
    held = result.get("held_out")
    lines += ["", _held_out_line(held)]
    c = result["cost"]
    base = result.get("conversion_baseline")
    lines += [
        "",
        f"Cost ({c['images']} web images, best of {c['rounds']}): convert "
        f"{c['convert_ms']:.2f} ms CPU per image, fingerprint {c['fingerprint_ms']:.3f} ms "
        f"({c['ratio']:.1%}).",
        "",
        f"{CHOSEN} at threshold {result['threshold']} through each band layout "
        f"(chosen: {result['band_layout']}); other candidates: pairs of distinct photos, "
        "against the count uniform random hashes would give:",
        "",
        "| bands x bits | candidates | other candidates | uniform | recall "
        "| cross-split recall | false pairs / 10k |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, b in result["bands"].items():
        lines.append(
            f"| {name} | {b['candidates']} | {b['other_candidates']} "
            f"| {b['uniform_candidates']:.1f} | {b['recall']:.1%} "
            f"| {b['cross_split_recall']:.1%} | {b['false_per_10k']:.1f} |"
        )
    shown = (
        f"the web run's {base['cpu_ms_per_image']:.2f} CPU ms per image at {base['images']:,} "
        "images (bench/results/scale.json)"
        if base
        else "no scale.json to compare with"
    )
    lines += [
        "",
        f"Search on synthetic hashes; of conversion: its CPU per image against {shown}.",
        "",
        "| images | bands x bits | CPU s | wall s | CPU ms / image | of conversion | peak MB "
        "| hashes MB | candidates | planted found | other pairs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["scale"]:
        share = f"{r['of_conversion']:.2%}" if r["of_conversion"] is not None else ""
        lines.append(
            f"| {r['images']:,} | {r['band_count']}x{r['band_bits']} | {r['cpu_s']:.1f} "
            f"| {r['wall_s']:.1f} | {r['cpu_ms_per_image']:.4f} | {share} | {r['peak_mb']:.0f} "
            f"| {r['hash_mb']:.0f} | {r['candidates']:,} | {r['planted_found']:.1%} "
            f"| {r['other_pairs']} |"
        )
    return "\n".join(lines) + "\n"

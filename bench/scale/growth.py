"""Scale benchmark: memory and speed of the local default run as the data grows.

``python -m bench --only scale`` converts the web set at 1x, 8x and 64x
(2,000, 16,000 and 128,000 images at full size) with the converter's local
default (``python -m beam_pipeline --input ... --output ...``, nothing
else), and prints per size: wall time, images/s, CPU ms per image and the
peak RSS of the whole process tree, plus the memory each extra image costs.
The codec floor (the same Pillow work in a plain process pool) runs at the
smaller sizes, so that the converter's *marginal* rate - images per second
between two sizes, start-up excluded - can be put next to the floor's.

The larger sets are the base set's photos hard-linked under new names in
new class-folder positions: every one is a separate image to the converter
(its own ID, hence its own split, order key and record), while the disk
holds the base set once. Every file is read through the page cache, as in
the converter benchmark, so the numbers measure the converter, not the disk.

**Many small files** (``--scale-many N,...``, default 20,000 and 1,000,000;
quick: 20,000):
the per-image costs - listing, references, keys, the resume index - at a
count where they, not the codec, decide memory, in minutes rather than
hours. N distinct 32x32 JPEGs (every file its own bytes: no two are
duplicates to the converter) in 1,000 class folders, converted three times
with the same command: a full run; a run killed with SIGKILL (its whole
process group) once its spill files hold half of the full run's record
bytes, i.e. about half of the images converted; and that command again,
which resumes. Each is measured like the rows above; the resumed output
must be byte-identical to the full run's (every file's SHA-256 compared),
and the resumed run's peak RSS is compared with the full run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from beam_pipeline.cli.summary import read_counters
from beam_pipeline.core import spill
from bench.common.data import ImageSet, list_images
from bench.common.procstats import run_measured
from bench.common.settings import REPO_DIR
from bench.convert.converters import SUMMARY_LINE

FULL_FACTORS = (1, 8, 64)
QUICK_FACTORS = (1, 8)
FLOOR_UP_TO = 8  # the floor runs at factors up to this (its memory does not grow)
# The many-small-files sizes: the small one is the baseline of memory per extra image.
MANY_SIZES = (20_000, 1_000_000)
QUICK_MANY_SIZES = (20_000,)
MANY_CLASSES = 1_000
MANY_SIDE = 32  # pixels: a tiny JPEG (~3 KB), so that per-image costs dominate
MANY_RECIPE = 2  # each image its own random pixels (1: one picture per class)
KILL_AT = 0.5  # of the full run's record bytes in the spill files
GOAL_RESUMED_VS_FULL = 1.2  # issue 28: a resumed run's peak RSS <= 1.2x the full run's


@dataclasses.dataclass
class ScaleRow:
    """One converter run at one size."""

    converter: str  # "imagerecords" | "floor"
    factor: int
    images: int
    ok: bool
    note: str = ""
    wall_s: float = float("nan")
    work_s: float = float("nan")
    images_per_s: float = float("nan")
    cpu_s: float = float("nan")
    cpu_ms_per_image: float = float("nan")
    peak_tree_rss_mb: float = float("nan")
    output_mb: float = float("nan")


def scaled_set(base: ImageSet, factor: int, cache_dir: Path) -> tuple[Path, int]:
    """The base set ``factor`` times over (hard links); returns (folder, images)."""
    files = list_images(base.path)
    if factor == 1:
        return base.path, len(files)
    folder = cache_dir / "data" / f"{base.path.name}-x{factor}"
    stamp = folder.with_suffix(".json")
    wanted = {"base": str(base.path), "files": len(files), "factor": factor}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return folder, len(files) * factor
    shutil.rmtree(folder, ignore_errors=True)
    print(f"[bench] linking {len(files) * factor} images into {folder} ...", flush=True)
    for path in files:
        relative = path.relative_to(base.path)
        for copy in range(factor):
            target = folder / relative.parent / f"{path.stem}-{copy:03d}{path.suffix}"
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:  # a filesystem without hard links
                shutil.copyfile(path, target)
    stamp.write_text(json.dumps(wanted))
    return folder, len(files) * factor


def _folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def _run(converter: str, folder: Path, images: int, factor: int, out_dir: Path, log_dir: Path,
         timeout_s: float) -> ScaleRow:  # fmt: skip
    if converter == "floor":
        command = [sys.executable, "-m", "bench.convert.floor", "--input", str(folder)]
    else:
        shutil.rmtree(out_dir, ignore_errors=True)
        command = [sys.executable, "-m", "beam_pipeline", "--input", str(folder)]
        command += ["--output", str(out_dir)]
    proc = run_measured(
        command, cwd=REPO_DIR, timeout_s=timeout_s,
        log_path=log_dir / f"scale-{converter}-x{factor}.log",
    )  # fmt: skip
    row = ScaleRow(converter, factor, images, ok=proc.returncode == 0)
    if not row.ok:
        last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        row.note = "timed out" if proc.returncode is None else f"exit {proc.returncode}: {last}"
        return row
    row.wall_s = proc.wall_s
    row.images_per_s = images / proc.wall_s
    row.cpu_s = proc.cpu_s
    row.cpu_ms_per_image = 1000 * proc.cpu_s / images
    row.peak_tree_rss_mb = proc.peak_tree_rss_mb
    if converter == "floor":
        row.work_s = json.loads(proc.stdout.strip().splitlines()[-1])["work_s"]
    else:
        match = SUMMARY_LINE.search(proc.stdout)
        row.work_s = float(match.group(2)) if match else float("nan")
        row.output_mb = _folder_mb(out_dir)
        shutil.rmtree(out_dir, ignore_errors=True)  # 64x is gigabytes
    print(
        f"[bench] scale x{factor:<3} {converter:<12} {images:>7} images {row.wall_s:7.1f} s "
        f"{row.images_per_s:7.1f} images/s {row.cpu_ms_per_image:6.2f} CPU ms/image "
        f"{row.peak_tree_rss_mb:6.0f} MB peak",
        flush=True,
    )
    return row


def summarize(rows: list[ScaleRow]) -> dict:
    """RSS growth, memory per extra image and marginal rates, from the rows."""
    ours = sorted(
        (r for r in rows if r.converter == "imagerecords" and r.ok), key=lambda r: r.factor
    )
    floor = {r.factor: r for r in rows if r.converter == "floor" and r.ok}
    out: dict = {}
    if len(ours) >= 2:
        first, last = ours[0], ours[-1]
        out["rss_ratio"] = {
            f"x{r.factor}": r.peak_tree_rss_mb / first.peak_tree_rss_mb for r in ours
        }
        extra = last.images - first.images
        out["kb_per_extra_image"] = 1000 * (last.peak_tree_rss_mb - first.peak_tree_rss_mb) / extra
        for low, high in zip(ours, ours[1:], strict=False):
            if high.work_s <= low.work_s:
                # A tiny (quick) run can take no longer at the larger size: no
                # marginal rate is measurable, so none is reported.
                continue
            marginal = (high.images - low.images) / (high.work_s - low.work_s)
            key = f"x{low.factor}-x{high.factor}"
            out.setdefault("marginal_images_per_s", {})[key] = marginal
            if low.factor in floor and high.factor in floor:
                f_low, f_high = floor[low.factor], floor[high.factor]
                if f_high.work_s <= f_low.work_s:
                    continue
                floor_rate = (f_high.images - f_low.images) / (f_high.work_s - f_low.work_s)
                out.setdefault("marginal_vs_floor", {})[key] = marginal / floor_rate
    return out


def markdown(result: dict) -> str:
    """scale.md: the factor rows (if any), then the many-small-files part (if any)."""
    lines = [f"# Scale benchmark ({result['sizes']})", ""]
    if "rows" in result:
        lines += [*_factor_lines(result), ""]
    if "many" in result:
        lines.append(many_markdown(result["many"]).rstrip("\n"))
    return "\n".join(lines) + "\n"


def _factor_lines(result: dict) -> list[str]:
    rows = [ScaleRow(**r) for r in result["rows"]]
    lines = [
        f"## The web set at several sizes (base set: {result['base_images']} web images)",
        "",
        f"Measured {result['measured_at']} at {result['code']}; load average "
        f"{result['loadavg']} at the start. Local default run (`python -m beam_pipeline "
        "--input ... --output ...`); peak RSS is the whole process tree's.",
        "",
        "| converter | size | images | wall s | images/s | CPU ms/image | peak RSS MB | output MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r.ok:
            lines.append(f"| {r.converter} | x{r.factor} | {r.images} | failed: {r.note} |||||")
            continue
        lines.append(
            f"| {r.converter} | x{r.factor} | {r.images} | {r.wall_s:.1f} | {r.images_per_s:.0f} "
            f"| {r.cpu_ms_per_image:.2f} | {r.peak_tree_rss_mb:.0f} | "
            + ("" if r.output_mb != r.output_mb else f"{r.output_mb:.0f}")
            + " |"
        )
    summary = result["summary"]
    lines.append("")
    for key, value in summary.get("rss_ratio", {}).items():
        lines.append(f"- peak RSS at {key} / at x1: {value:.2f}")
    if "kb_per_extra_image" in summary:
        lines.append(f"- memory per extra image: {summary['kb_per_extra_image']:.2f} KB")
    for key, value in summary.get("marginal_images_per_s", {}).items():
        vs = summary.get("marginal_vs_floor", {}).get(key)
        lines.append(
            f"- marginal rate {key}: {value:.0f} images/s"
            + (f" = {vs:.2f}x the codec floor's" if vs else "")
        )
    return lines


def run_scale(base: ImageSet, factors, cache_dir: Path, out_root: Path, log_dir: Path,
              timeout_s: float) -> list[ScaleRow]:  # fmt: skip
    """Converts the base set at every factor (floor first at the small ones)."""
    rows = []
    for factor in factors:
        folder, images = scaled_set(base, factor, cache_dir)
        for path in list_images(folder):  # page cache: no run pays the disk
            path.read_bytes()
        if factor <= FLOOR_UP_TO:
            rows.append(_run("floor", folder, images, factor, out_root, log_dir, timeout_s))
        out_dir = out_root / "scale" / f"x{factor}"
        rows.append(_run("imagerecords", folder, images, factor, out_dir, log_dir, timeout_s))
    return rows


# --- many small files: a full run, a killed one, its resumption -----------------------


@dataclasses.dataclass
class ManyRow:
    """One run of the many-small-files point."""

    images: int  # in the folder
    run: str  # "full" | "killed" | "resumed"
    ok: bool
    note: str = ""
    wall_s: float = float("nan")
    images_per_s: float = float("nan")
    cpu_s: float = float("nan")
    cpu_ms_per_image: float = float("nan")
    peak_tree_rss_mb: float = float("nan")
    peak_proc_rss_mb: float = float("nan")
    images_converted: int = 0
    images_resumed: int = 0


def many_small_set(images: int, cache_dir: Path) -> Path:
    """``images`` distinct 32x32 JPEGs in up to 1,000 class folders (cached, stamped).

    Each file is its own random picture, so every image has its own bytes
    (no duplicates, docs/images.md) and its own pixels: copies of one picture
    under other bytes would all be near duplicates of each other (a group of
    a thousand per class), which is not the many-distinct-images case this
    point measures. 1,000,000 files take a few minutes.
    """
    folder = cache_dir / "data" / f"many-{images}"
    stamp = folder.with_suffix(".json")
    wanted = {"images": images, "classes": MANY_CLASSES, "side": MANY_SIDE, "recipe": MANY_RECIPE}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    print(f"[bench] writing {images:,} small JPEGs into {folder} ...", flush=True)
    rng = np.random.default_rng(MANY_RECIPE)
    classes = min(MANY_CLASSES, images)
    for c in range(classes):
        (folder / f"class_{c:04d}").mkdir(parents=True, exist_ok=True)
    for start in range(0, images, MANY_CLASSES):
        pictures = rng.integers(0, 256, (MANY_CLASSES, MANY_SIDE, MANY_SIDE, 3), dtype=np.uint8)
        for i in range(start, min(images, start + MANY_CLASSES)):
            buffer = io.BytesIO()
            Image.fromarray(pictures[i - start]).save(buffer, "JPEG", quality=90)
            path = folder / f"class_{i % classes:04d}" / f"img_{i:07d}.jpg"
            path.write_bytes(buffer.getvalue())
    stamp.write_text(json.dumps(wanted))
    return folder


def _spill_bytes(out_dir: Path) -> int:
    """Bytes in the run's spill files so far (0 before the folder exists)."""
    try:
        with os.scandir(spill.default_dir(str(out_dir))) as entries:
            return sum(e.stat().st_size for e in entries if e.name.endswith(spill.SUFFIX))
    except FileNotFoundError:
        return 0


def _digests(folder: Path) -> dict[str, str]:
    """Every file's SHA-256 under ``folder``, by relative path."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        out[str(path.relative_to(folder))] = digest.hexdigest()
    return out


def _many_row(images: int, run: str, proc) -> ManyRow:
    row = ManyRow(images, run, ok=proc.returncode == 0)
    row.wall_s, row.cpu_s = proc.wall_s, proc.cpu_s
    row.peak_tree_rss_mb, row.peak_proc_rss_mb = proc.peak_tree_rss_mb, proc.peak_proc_rss_mb
    if run == "killed":
        row.ok = proc.returncode == -9
        if not row.ok:
            row.note = f"exit {proc.returncode} before the kill: nothing to resume"
    elif not row.ok:
        last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        row.note = "timed out" if proc.returncode is None else f"exit {proc.returncode}: {last}"
    else:
        counted = read_counters(proc.stdout)
        row.images_converted = counted.get("images_converted", 0)
        row.images_resumed = counted.get("images_resumed", 0)
        row.images_per_s = images / proc.wall_s
        row.cpu_ms_per_image = 1000 * proc.cpu_s / images
    print(
        f"[bench] many {images:>9,} {run:<8} {row.wall_s:7.1f} s {row.cpu_s:7.1f} CPU s "
        f"{row.peak_tree_rss_mb:6.0f} MB peak (largest process {row.peak_proc_rss_mb:.0f} MB), "
        f"converted {row.images_converted:,}, resumed {row.images_resumed:,} {row.note}",
        flush=True,
    )
    return row


def run_many(images: int, cache_dir: Path, out_root: Path, log_dir: Path, timeout_s: float):
    """Full, killed and resumed runs of ``images`` small files; (rows, identical)."""
    folder = many_small_set(images, cache_dir)
    for path in list_images(folder):  # page cache: no run pays the disk
        path.read_bytes()
    command = [sys.executable, "-m", "beam_pipeline", "--input", str(folder), "--output"]
    rows = []
    full_out = out_root / "scale" / f"many-{images}-full"
    shutil.rmtree(full_out, ignore_errors=True)
    proc = run_measured(
        [*command, str(full_out)], cwd=REPO_DIR, timeout_s=timeout_s,
        log_path=log_dir / f"scale-many-{images}-full.log",
    )  # fmt: skip
    rows.append(_many_row(images, "full", proc))
    if not rows[-1].ok:
        return rows, False
    full_digests = _digests(full_out)
    shutil.rmtree(full_out, ignore_errors=True)  # disk: the resumed run writes as much again
    record_bytes = read_counters(proc.stdout).get("record_bytes", 0)

    out = out_root / "scale" / f"many-{images}-resumed"
    shutil.rmtree(out, ignore_errors=True)
    for run in ("killed", "resumed"):
        proc = run_measured(
            [*command, str(out)], cwd=REPO_DIR, timeout_s=timeout_s,
            log_path=log_dir / f"scale-many-{images}-{run}.log",
            kill_when=(lambda: _spill_bytes(out) >= KILL_AT * record_bytes)
            if run == "killed" else None,
        )  # fmt: skip
        rows.append(_many_row(images, run, proc))
        if not rows[-1].ok:
            return rows, False
    identical = _digests(out) == full_digests
    shutil.rmtree(out, ignore_errors=True)
    return rows, identical


def summarize_many(rows: list[ManyRow], identical: dict[int, bool]) -> dict:
    """Per size: resumed / full peak RSS; across sizes: memory per extra image."""
    by = {(r.images, r.run): r for r in rows if r.ok}
    sizes = sorted({r.images for r in rows})
    out: dict = {"identical": {str(n): identical.get(n, False) for n in sizes}}
    for n in sizes:
        full, resumed = by.get((n, "full")), by.get((n, "resumed"))
        if full and resumed:
            ratio = resumed.peak_tree_rss_mb / full.peak_tree_rss_mb
            out.setdefault("resumed_vs_full", {})[str(n)] = ratio
    for run in ("full", "resumed"):
        done = [by[(n, run)] for n in sizes if (n, run) in by]
        if len(done) >= 2:
            low, high = done[0], done[-1]
            out.setdefault("bytes_per_extra_image", {})[run] = (
                1e6 * (high.peak_tree_rss_mb - low.peak_tree_rss_mb) / (high.images - low.images)
            )
    return out


def many_markdown(part: dict) -> str:
    lines = [
        "## Many small files: a full run, a killed one, the rerun that resumes it",
        "",
        f"Measured {part['measured_at']} at {part['code']}; load average {part['loadavg']} "
        f"at the start, {part['loadavg_end']} at the end. Distinct {MANY_SIDE}x{MANY_SIDE} "
        f"JPEGs in up to {MANY_CLASSES:,} class folders; the same command three times: a full "
        f"run, a run killed with SIGKILL once its spill files held {KILL_AT:.0%} of the full "
        "run's record bytes, and the rerun, which resumes. Peak RSS is the whole process "
        "tree's (the largest single process in brackets).",
        "",
        "| images | run | wall s | images/s | CPU ms/image | peak RSS MB | converted | resumed |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in (ManyRow(**row) for row in part["rows"]):
        if r.run == "killed":
            lines.append(
                f"| {r.images:,} | killed | {r.wall_s:.1f} | | | "
                f"{r.peak_tree_rss_mb:.0f} ({r.peak_proc_rss_mb:.0f}) | | |"
                + (f" {r.note}" if r.note else "")
            )
        elif not r.ok:
            lines.append(f"| {r.images:,} | {r.run} | failed: {r.note} ||||||")
        else:
            lines.append(
                f"| {r.images:,} | {r.run} | {r.wall_s:.1f} | {r.images_per_s:.0f} | "
                f"{r.cpu_ms_per_image:.3f} | {r.peak_tree_rss_mb:.0f} "
                f"({r.peak_proc_rss_mb:.0f}) | {r.images_converted:,} | {r.images_resumed:,} |"
            )
    summary = part["summary"]
    lines.append("")
    for n, ratio in summary.get("resumed_vs_full", {}).items():
        verdict = "met" if ratio <= GOAL_RESUMED_VS_FULL else "NOT met"
        lines.append(
            f"- {int(n):,} images: resumed peak / full peak = {ratio:.2f} (goal <= "
            f"{GOAL_RESUMED_VS_FULL}: {verdict}); resumed output byte-identical to the full "
            f"run's: {summary['identical'][n]}"
        )
    for run, value in summary.get("bytes_per_extra_image", {}).items():
        lines.append(f"- memory per extra image, {run} run: {value:.0f} bytes")
    return "\n".join(lines) + "\n"

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
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

from bench.converters import _SUMMARY
from bench.data import ImageSet, list_images
from bench.procstats import run_measured
from bench.settings import REPO_DIR

FULL_FACTORS = (1, 8, 64)
QUICK_FACTORS = (1, 8)
FLOOR_UP_TO = 8  # the floor runs at factors up to this (its memory does not grow)


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
        command = [sys.executable, "-m", "bench.convert_floor", "--input", str(folder)]
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
        match = _SUMMARY.search(proc.stdout)
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
    rows = [ScaleRow(**r) for r in result["rows"]]
    lines = [
        f"# Scale benchmark ({result['sizes']}, base set: {result['base_images']} web images)",
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
    return "\n".join(lines) + "\n"


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

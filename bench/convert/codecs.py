"""The codec study: which decoder + resize + encoder turns a photo into the
stored JPEG fastest, and how sharp the result is.

For each image set and each path of ``bench.convert.codec_paths`` (plus Pillow-SIMD's
Pillow paths when ``--simd-python`` names an interpreter that has it), a fresh
``bench.convert.codec_worker`` process converts the same images on one thread; rounds
are interleaved (every path once, then again) and each path's best round
(least CPU) is kept. Speed is CPU milliseconds per image on one core (the
steady number on a shared machine) and its ratio to ``pillow_bicubic``, the
codec floor, measured in the same run.

Quality, for the first ``QUALITY_IMAGES`` inputs that are JPEGs (the others
take Pillow in every path): the output,
decoded, against a reference made from the same source by Pillow at its best
(full decode, no draft, EXIF orientation, Lanczos straight to the output's
size): median PSNR (dB) and median SSIM, and the mean output size.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from bench.common.data import ImageSet, list_images
from bench.common.procstats import run_measured
from bench.common.settings import REPO_DIR
from bench.convert.codec_paths import CODECS, LABELS
from bench.convert.quality import median_quality

SIMD_CODECS = ("pillow_bicubic", "pillow_bilinear")
# Quality is measured on the first images only: SSIM of every output of every
# path took longer than the speed runs themselves.
QUALITY_IMAGES = 100
SIMD_PREFIX = "simd:"
FLOOR = "pillow_bicubic"


@dataclasses.dataclass
class CodecResult:
    """One conversion path on one image set.

    Attributes:
        image_set: "web" or "phone".
        codec: a ``bench.convert.codec_paths.CODECS`` name, or ``simd:<name>`` (Pillow-SIMD).
        label: what it does, in words.
        ok: it ran.
        note: why not.
        images: images converted per pass.
        cpu_ms_per_image: CPU ms per image, best round (one thread).
        images_per_core_s: 1000 / cpu_ms_per_image.
        speed_vs_floor: cpu_ms_per_image of the floor / this path's (> 1: faster).
        out_kb_per_image: mean output size (all inputs).
        psnr_db: median PSNR against the reference (JPEG inputs).
        ssim: median SSIM against the reference (JPEG inputs).
        round_cpu_ms: every round's CPU ms per image (the spread is the noise).
        pillow: the Pillow (or Pillow-SIMD) version it ran with.
    """

    image_set: str
    codec: str
    label: str
    ok: bool
    note: str = ""
    images: int = 0
    cpu_ms_per_image: float = float("nan")
    images_per_core_s: float = float("nan")
    speed_vs_floor: float = float("nan")
    out_kb_per_image: float = float("nan")
    psnr_db: float = float("nan")
    ssim: float = float("nan")
    round_cpu_ms: list[float] = dataclasses.field(default_factory=list)
    pillow: str = ""


def _quality(
    image_set: ImageSet, out_dir: Path, files: list[Path], cache: dict
) -> tuple[float, float]:
    """(median PSNR, median SSIM) of a path's outputs against the references."""
    pairs = [
        (source, (out_dir / source.relative_to(image_set.path).with_suffix(".jpg")).read_bytes())
        for source in files
        if source.read_bytes()[:3] == b"\xff\xd8\xff"
    ]
    return median_quality(pairs, cache)


def _run_worker(
    python: str, codec: str, image_set: ImageSet, limit: int, out: Path | None, log: Path
) -> dict:
    cmd = [
        python,
        "-m",
        "bench.convert.codec_worker",
        "--codec",
        codec,
        "--input",
        str(image_set.path),
    ]
    cmd += ["--limit", str(limit)]
    if out is not None:
        cmd += ["--out", str(out)]
    proc = run_measured(cmd, cwd=REPO_DIR, timeout_s=900, log_path=log)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "note": f"exit {proc.returncode}: {tail}"[:200]}
    return json.loads(lines[-1])


def run_codecs(
    sets: dict[str, ImageSet],
    limits: dict[str, int],
    out_root: Path,
    log_dir: Path,
    rounds: int,
    simd_python: str | None = None,
) -> list[CodecResult]:
    """Runs the study on each set; returns one result per (set, path)."""
    paths = [(sys.executable, c, c) for c in CODECS]
    if simd_python:
        paths += [(simd_python, c, SIMD_PREFIX + c) for c in SIMD_CODECS]
    results = []
    for name, image_set in sets.items():
        files = list_images(image_set.path)[: limits[name]]
        runs: dict[str, list[dict]] = {row: [] for _, _, row in paths}
        for round_index in range(rounds):
            for python, codec, row in paths:
                out = out_root / name / row.replace(":", "_") if round_index == 0 else None
                log = log_dir / f"codec-{name}-{row.replace(':', '_')}-r{round_index}.log"
                runs[row].append(_run_worker(python, codec, image_set, len(files), out, log))
        quality_cache: dict = {}
        set_rows = []
        for _, codec, row in paths:
            ok_runs = [r for r in runs[row] if r.get("ok")]
            label = LABELS[codec] + (" [Pillow-SIMD]" if row.startswith(SIMD_PREFIX) else "")
            if not ok_runs:
                note = runs[row][-1].get("note", "failed") if runs[row] else "not run"
                set_rows.append(CodecResult(name, row, label, ok=False, note=note))
                continue
            best = min(ok_runs, key=lambda r: r["cpu_s"])
            result = CodecResult(
                name,
                row,
                label,
                ok=True,
                images=best["images"],
                cpu_ms_per_image=1000 * best["cpu_s"] / best["images"],
                out_kb_per_image=best["out_bytes"] / best["images"] / 1000,
                round_cpu_ms=[round(1000 * r["cpu_s"] / r["images"], 3) for r in ok_runs],
                pillow=best.get("pillow", ""),
            )
            result.images_per_core_s = 1000 / result.cpu_ms_per_image
            out_dir = out_root / name / row.replace(":", "_")
            result.psnr_db, result.ssim = _quality(
                image_set, out_dir, files[:QUALITY_IMAGES], quality_cache
            )
            set_rows.append(result)
        floor = next((r for r in set_rows if r.codec == FLOOR and r.ok), None)
        for r in set_rows:
            if floor and r.ok:
                r.speed_vs_floor = floor.cpu_ms_per_image / r.cpu_ms_per_image
            print(
                f"[bench] codec {name:<5} {r.codec:<28} "
                + (
                    f"{r.cpu_ms_per_image:7.2f} CPU ms/image  x{r.speed_vs_floor:4.2f}  "
                    f"{r.psnr_db:5.2f} dB  SSIM {r.ssim:.4f}  {r.out_kb_per_image:5.1f} KB"
                    if r.ok
                    else f"n/a: {r.note}"
                ),
                flush=True,
            )
        results += set_rows
    return results

"""Reuse benchmark: a grown folder converted with ``--reuse`` against a full conversion.

``python -m bench --only reuse`` takes the web set at 8x (16,000 images, the
scale benchmark's hard-linked copies) and the phone set at 10x (2,000 images),
and for each makes two folders of hard links: *before*, and *after* it grew
- 1% new images, 0.5% changed (the same name, the image mirrored and saved
again), 0.5% removed. It converts *before* (untimed: that is OLD), then
times, in interleaved rounds, a full conversion of *after* and
``--reuse OLD`` of *after*, both with the converter's defaults (the local
engine), each in a fresh child process (``procstats.run_measured``: wall
clock, CPU of the whole process tree, peak RSS of the tree). It checks that
the two outputs are the same bytes (imagerecords.json apart from its
``reuse`` block), and reports each run's CPU as a fraction of the full
conversion's, next to the share the new and changed images alone take of it.

With ``--reuse-baseline DIR`` (a checkout of another commit, e.g. ``git
worktree add /tmp/base main``) each round also runs the reuse run with that
checkout's converter (``reuse-baseline``), on the same OLD: a before/after
of the same run, on the same machine at the same time. Each reuse run's
**CPU per reused image** is its whole CPU divided by the records it reused
(start-up, the few conversions, OLD's scan, hashing every source, copying
every record); what a change costs per reused image is the difference of
the two, the rest being the same in both.

The machine is shared: CPU seconds are the steadier figure; the best of the
rounds is reported, every round is in reuse.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import sys
from pathlib import Path

from PIL import Image, ImageOps

from beam_pipeline.cli.summary import read_counters
from beam_pipeline.core import metadata
from bench.common.data import ImageSet, list_images
from bench.common.procstats import run_measured
from bench.common.settings import REPO_DIR
from bench.scale.growth import scaled_set

# 1% of the phone set's 200 images would be 2: it is taken 10 times (1,990 images).
FULL_FACTORS = {"web": 8, "phone": 10}
QUICK_FACTORS = {"web": 1, "phone": 1}
NEW, CHANGED, REMOVED = 0.01, 0.005, 0.005
SEED = 27


@dataclasses.dataclass
class ReuseRow:
    """One timed run."""

    set: str
    images: int  # in the grown folder
    run: str  # "full" | "reuse" | "reuse-baseline" (the --reuse-baseline checkout's converter)
    round: int
    ok: bool
    note: str = ""
    wall_s: float = float("nan")
    cpu_s: float = float("nan")
    peak_tree_rss_mb: float = float("nan")
    images_converted: int = 0
    images_reused: int = 0


@dataclasses.dataclass
class Grown:
    """The two folders of one set, and what changed between them."""

    set: str
    before: Path
    after: Path
    images: int  # in `after`
    new: int
    changed: int
    removed: int


def _changed_bytes(path: Path, out: Path) -> None:
    """The same picture, mirrored and saved again: new bytes under the same name."""
    with Image.open(path) as image:
        image.load()
        fmt = image.format
        mirrored = ImageOps.mirror(image)
    if fmt == "JPEG":
        mirrored.save(out, "JPEG", quality=90)
    else:
        mirrored.save(out, fmt)


def grow(image_set: ImageSet, factor: int, cache_dir: Path) -> Grown:
    """Hard-linked *before* and *after* folders of ``image_set`` at ``factor``x (cached)."""
    source, _ = scaled_set(image_set, factor, cache_dir)
    files = sorted(list_images(source))
    n_new, n_changed, n_removed = (max(1, round(len(files) * f)) for f in (NEW, CHANGED, REMOVED))
    folder = cache_dir / "data" / f"reuse-{source.name}"
    stamp = folder.with_suffix(".json")
    wanted = {"source": str(source), "files": len(files), "seed": SEED, "version": 1}
    picked = random.Random(SEED).sample(files, n_new + n_changed + n_removed)
    new, changed, removed = (
        set(picked[:n_new]),
        set(picked[n_new : n_new + n_changed]),
        set(picked[n_new + n_changed :]),
    )
    grown = Grown(
        image_set.name,
        folder / "before",
        folder / "after",
        len(files) - n_removed,
        n_new,
        n_changed,
        n_removed,
    )
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return grown
    shutil.rmtree(folder, ignore_errors=True)
    print(f"[bench] reuse: linking {len(files)} images into {folder} ...", flush=True)
    for path in files:
        relative = path.relative_to(source)
        for side in ("before", "after"):
            if (side == "before" and path in new) or (side == "after" and path in removed):
                continue
            target = folder / side / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if side == "after" and path in changed:
                _changed_bytes(path, target)
            else:
                os.link(path, target)
    stamp.write_text(json.dumps(wanted))
    return grown


def _convert(
    folder: Path, out: Path, log: Path, timeout_s: float, *extra: str, code: Path = REPO_DIR
):
    """One conversion in a fresh process, with the converter of the checkout ``code``."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "beam_pipeline", "--input", str(folder)]
    command += ["--output", str(out), *extra]
    env = {**os.environ, "PYTHONPATH": str(code)}
    return run_measured(command, cwd=code, env=env, timeout_s=timeout_s, log_path=log)


def same_as_full(new: Path, full: Path) -> bool:
    """``new`` holds ``full``'s files, byte for byte, imagerecords.json apart from ``reuse``."""

    def files(folder: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()
        }

    got, want = files(new), files(full)
    if sorted(got) != sorted(want):
        return False
    info = json.loads(got.pop(metadata.INFO_FILE))
    info.pop("reuse", None)
    return info == json.loads(want.pop(metadata.INFO_FILE)) and got == want


def run_reuse(
    grown: Grown,
    out_root: Path,
    log_dir: Path,
    rounds: int,
    timeout_s: float,
    baseline: Path | None = None,
):
    """OLD from *before* (untimed), then ``rounds`` of (full, reuse) on *after*, and
    of reuse-baseline (``baseline``'s converter) when one is given.

    Returns the rows and whether the outputs were the same bytes.
    """
    for path in list_images(grown.before) + list_images(grown.after):
        path.read_bytes()  # page cache: no run pays the disk
    old = out_root / "reuse" / grown.set / "old"
    proc = _convert(grown.before, old, log_dir / f"reuse-{grown.set}-old.log", timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"converting OLD failed: {proc.stderr.strip()[-300:]}")
    rows, identical = [], None
    runs = ("full", "reuse", "reuse-baseline") if baseline else ("full", "reuse")
    for round_index in range(rounds):
        for run in runs:
            out = out_root / "reuse" / grown.set / run
            extra = ("--reuse", str(old)) if run != "full" else ()
            log = log_dir / f"reuse-{grown.set}-{run}-r{round_index}.log"
            code = baseline if run == "reuse-baseline" else REPO_DIR
            proc = _convert(grown.after, out, log, timeout_s, *extra, code=code)
            row = ReuseRow(grown.set, grown.images, run, round_index, proc.returncode == 0)
            if not row.ok:
                row.note = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            else:
                counted = read_counters(proc.stdout)
                row.wall_s, row.cpu_s = proc.wall_s, proc.cpu_s
                row.peak_tree_rss_mb = proc.peak_tree_rss_mb
                row.images_converted = counted.get("images_converted", 0)
                row.images_reused = counted.get("images_reused", 0)
            rows.append(row)
            print(
                f"[bench] reuse {grown.set:<6} {run:<6} round {round_index}: "
                f"{row.wall_s:6.1f} s wall {row.cpu_s:7.1f} CPU s "
                f"{row.peak_tree_rss_mb:6.0f} MB peak, converted {row.images_converted}, "
                f"reused {row.images_reused}",
                flush=True,
            )
        if identical is None:
            full, new = (out_root / "reuse" / grown.set / r for r in ("full", "reuse"))
            identical = same_as_full(new, full)
    shutil.rmtree(out_root / "reuse" / grown.set, ignore_errors=True)
    return rows, bool(identical)


def summarize(grown: Grown, rows: list[ReuseRow], identical: bool) -> dict:
    """Best round of each run; the reuse run's CPU against the full conversion's."""
    best = {}
    for run in ("full", "reuse", "reuse-baseline"):
        done = [r for r in rows if r.run == run and r.ok]
        if done:
            best[run] = min(done, key=lambda r: r.cpu_s)
    out = {
        **dataclasses.asdict(grown),
        "before": str(grown.before),
        "after": str(grown.after),
        "identical": identical,
    }
    # What a reuse run spends per record it reuses, everything included.
    for run, key in (
        ("reuse", "cpu_ms_per_reused"),
        ("reuse-baseline", "baseline_cpu_ms_per_reused"),
    ):
        if run in best and best[run].images_reused:
            out[key] = 1000 * best[run].cpu_s / best[run].images_reused
    if "full" in best and "reuse" in best:
        full, reuse = best["full"], best["reuse"]
        out.update(
            full_cpu_s=full.cpu_s,
            reuse_cpu_s=reuse.cpu_s,
            cpu_fraction=reuse.cpu_s / full.cpu_s,
            # The new and changed images' share of the full conversion's CPU.
            converting_share=(grown.new + grown.changed) / grown.images,
            full_wall_s=full.wall_s,
            reuse_wall_s=reuse.wall_s,
            wall_fraction=reuse.wall_s / full.wall_s,
            full_peak_rss_mb=full.peak_tree_rss_mb,
            reuse_peak_rss_mb=reuse.peak_tree_rss_mb,
        )
    return out


def markdown(result: dict) -> str:
    lines = [
        f"# Reuse benchmark ({result['sizes']})",
        "",
        f"Measured {result['measured_at']} at {result['code']}; load average "
        f"{result['loadavg']} at the start. Each set's folder grew by {NEW:.0%} new images, "
        f"{CHANGED:.1%} changed and {REMOVED:.1%} removed; every run uses the converter's "
        "defaults (the local engine); CPU is the whole process tree's; best of "
        f"{result['rounds']} rounds (by CPU).",
        "",
        "| set | images | new / changed / removed | run | wall s | CPU s | CPU vs full "
        "| peak RSS MB | converted | reused |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for part in result["sets"]:
        best = {}
        for row in part["rows"]:
            if row["ok"] and (row["run"] not in best or row["cpu_s"] < best[row["run"]]["cpu_s"]):
                best[row["run"]] = row
        for run in ("full", "reuse", "reuse-baseline"):
            row = best.get(run)
            if row is None and run == "reuse-baseline":
                continue
            if row is None:
                lines.append(f"| {part['set']} | {part['images']} | | {run} | failed |||||")
                continue
            share = row["cpu_s"] / best["full"]["cpu_s"] if "full" in best else float("nan")
            lines.append(
                f"| {part['set']} | {part['images']:,} | {part['new']} / {part['changed']} / "
                f"{part['removed']} | {run} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | "
                f"{share:.1%} | {row['peak_tree_rss_mb']:.0f} | {row['images_converted']:,} | "
                f"{row['images_reused']:,} |"
            )
    lines.append("")
    for part in result["sets"]:
        if "cpu_fraction" in part:
            lines.append(
                f"- {part['set']}: the reuse run took {part['cpu_fraction']:.1%} of the full "
                f"conversion's CPU ({part['wall_fraction']:.1%} of its wall time); converting "
                f"the new and changed images alone is {part['converting_share']:.1%} of it. "
                f"Output identical to the full conversion's: {part['identical']}"
            )
        if "cpu_ms_per_reused" in part:
            text = f"- {part['set']}: {part['cpu_ms_per_reused']:.3f} CPU ms per reused image"
            if "baseline_cpu_ms_per_reused" in part:
                before = part["baseline_cpu_ms_per_reused"]
                text += (
                    f" (the --reuse-baseline checkout's converter: {before:.3f}; "
                    f"{part['cpu_ms_per_reused'] - before:+.3f} ms)"
                )
            lines.append(text)
    return "\n".join(lines) + "\n"

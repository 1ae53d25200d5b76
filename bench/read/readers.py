"""Reader benchmark: runs ``bench.read.worker`` for each pipeline and collects the numbers.

In a full run every variant gets its own child process (fresh TensorFlow, its
own thread pools and memory peak); a quick run puts all variants in one child
to pay TensorFlow's start-up once.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from bench.common.epochs import read_results
from bench.common.procstats import run_measured
from bench.common.settings import READ_IMAGE_SIZE, REPO_DIR
from bench.read.pipelines import RECORD_VARIANTS, VARIANTS
from imagerecords.codec import INFO_FILE


@dataclasses.dataclass
class ReaderResult:
    """One reader pipeline.

    Attributes:
        variant: one of ``bench.read.pipelines.VARIANTS``.
        ok: whether it ran.
        note: why not (empty when fine).
        images_per_s: images / second over the timed epochs.
        epoch_images_per_s: the same, per timed epoch (spread = noise).
        cpu_ms_per_image: CPU time of the process during the timed epochs per
            image (all threads); steadier than images/s on a loaded machine.
        round_images_per_s: images/s of every round (the best one is reported).
        peak_tree_rss_mb: peak RSS of its child process (only when it ran alone).
        cpu_s: CPU seconds of the child (only when it ran alone).
    """

    variant: str
    ok: bool
    note: str = ""
    images_per_s: float = float("nan")
    epoch_images_per_s: list[float] = dataclasses.field(default_factory=list)
    cpu_ms_per_image: float = float("nan")
    round_images_per_s: list[float] = dataclasses.field(default_factory=list)
    peak_tree_rss_mb: float = float("nan")
    cpu_s: float = float("nan")


# (label, pipeline, baseline) of the ratios printed after a run: the reader's speed goals.
RATIOS = (
    ("training / crop-decode floor (goal >= 0.9x)", "imagerecords_train", "floor_crop_decode"),
    ("eval / full-decode floor (goal >= 0.9x)", "imagerecords_eval", "floor_full_decode"),
    ("training / image_dataset_from_directory (goal >= 3x)", "imagerecords_train", "keras_dir"),
    ("uint8 training / crop-decode floor", "imagerecords_train_uint8", "floor_crop_decode"),
    ("uint8 eval / full-decode floor", "imagerecords_eval_uint8", "floor_full_decode"),
    ("uint8 training / image_dataset_from_directory", "imagerecords_train_uint8", "keras_dir"),
)


def ratio_lines(results: list[ReaderResult]) -> list[str]:
    """Each of ``RATIOS`` in images/s and in CPU per image (the baseline's over the pipeline's).

    A ratio whose two pipelines did not both run is left out.
    """
    by_variant = {r.variant: r for r in results if r.ok}
    lines = []
    for label, pipeline, baseline in RATIOS:
        ours, base = by_variant.get(pipeline), by_variant.get(baseline)
        if ours is None or base is None:
            continue
        speed = ours.images_per_s / base.images_per_s
        cpu = base.cpu_ms_per_image / ours.cpu_ms_per_image
        lines.append(f"{label}: {speed:.2f}x images/s, {cpu:.2f}x CPU per image")
    return lines


def _unavailable(variant: str, files_root: Path, records_dir: Path | None) -> str:
    if variant in RECORD_VARIANTS and (
        records_dir is None or not (records_dir / INFO_FILE).exists()
    ):
        return "no imagerecords output to read"
    return ""


def run_readers(
    files_root: Path,
    records_dir: Path | None,
    *,
    batch: int,
    warmup: int,
    epochs: int,
    one_process: bool,
    log_dir: Path,
    timeout_s: float,
    variants: tuple[str, ...] = VARIANTS,
    rounds: int = 1,
) -> list[ReaderResult]:
    """Times each reader pipeline, ``rounds`` times over, and keeps each one's best round.

    Rounds run every variant once (keras, files, tfrecord, imagerecords, ...,
    then again), so a burst of load from another job hits one round of each
    pipeline rather than all of one; as for the converters, the fastest round
    is the best estimate of the pipeline itself.

    Args:
        files_root: the original image set (for the file-based baselines).
        records_dir: imagerecords' output for that set (None if it failed).
        batch: batch size.
        warmup: untimed epochs first.
        epochs: timed epochs per round.
        one_process: run all variants in one child (quick) instead of one each.
        log_dir: where the children's output is kept.
        timeout_s: limit per child.
        variants: which pipelines.
        rounds: how many times to run each.

    Returns:
        One result per variant, in ``variants`` order.
    """
    refused = {}
    for variant in variants:
        why = _unavailable(variant, files_root, records_dir)
        if why:
            refused[variant] = ReaderResult(variant, ok=False, note=why)
    runnable = [v for v in variants if v not in refused]
    worker_args = [
        *("--files-root", str(files_root), "--records", str(records_dir or "")),
        *("--batch", str(batch), "--image-size", str(READ_IMAGE_SIZE)),
        *("--warmup", str(warmup), "--epochs", str(epochs)),
    ]
    groups = [runnable] if one_process and runnable else [[v] for v in runnable]
    best: dict[str, ReaderResult] = {}
    history: dict[str, list[float]] = {v: [] for v in variants}
    for round_index in range(rounds):
        tag = f"-r{round_index}" if rounds > 1 else ""
        round_results = {**refused, **_run_round(groups, worker_args, log_dir, timeout_s, tag)}
        for variant in variants:
            result = round_results[variant]
            print(
                f"[bench] read {variant:<27} "
                + (f"{result.images_per_s:8.1f} images/s" if result.ok else f"n/a: {result.note}"),
                flush=True,
            )
            history[variant].append(round(result.images_per_s, 1) if result.ok else float("nan"))
            old = best.get(variant)
            if old is None or (
                result.ok and (not old.ok or result.images_per_s > old.images_per_s)
            ):
                best[variant] = result
    for variant in variants:
        best[variant].round_images_per_s = history[variant]
    results = [best[v] for v in variants]
    for line in ratio_lines(results):
        print(f"[bench] read ratio {line}", flush=True)
    return results


def _run_round(
    groups: list[list[str]], worker_args: list[str], log_dir: Path, timeout_s: float, tag: str
) -> dict[str, ReaderResult]:
    """One round of ``run_readers``: a worker child per group of variants, with
    ``worker_args`` (limit ``timeout_s``, logs in ``log_dir``, their names ending in
    ``tag``). Returns variant -> result."""
    results: dict[str, ReaderResult] = {}
    for group in groups:
        cmd = [sys.executable, "-m", "bench.read.worker"]
        for variant in group:
            cmd += ["--variant", variant]
        proc = run_measured(
            cmd + worker_args,
            cwd=REPO_DIR,
            timeout_s=timeout_s,
            log_path=log_dir / f"read-{'+'.join(group)}{tag}.log",
        )
        found = read_results(proc.stdout)
        for variant in group:
            raw = found.get(variant)
            if raw is None:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                why = "timed out" if proc.returncode is None else f"exit {proc.returncode}: {tail}"
                results[variant] = ReaderResult(variant, ok=False, note=why[:200])
                continue
            result = ReaderResult(variant, ok=raw["ok"], note=raw.get("note", ""))
            if raw["ok"]:
                result.images_per_s = raw["images_per_s"]
                result.cpu_ms_per_image = raw["cpu_ms_per_image"]
                result.epoch_images_per_s = [
                    n / s for n, s in zip(raw["epoch_images"], raw["epoch_seconds"], strict=True)
                ]
            if len(group) == 1:
                result.peak_tree_rss_mb = proc.peak_tree_rss_mb
                result.cpu_s = proc.cpu_s
            results[variant] = result
    return results

"""Writes the benchmark's results: ``results.json``, ``results.md`` and ``chart.png``.

The JSON holds every raw number and is the source of the other two, so the
table and chart can be re-drawn (``python -m bench --report-only``) without
re-running anything.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.convert.converters import LABELS as CONVERTER_LABELS
from bench.read.gpu_step import LABELS as GPU_LABELS
from bench.read.pipelines import LABELS as READER_LABELS

_NAN = float("nan")


def _ratio(numerator: float | None, denominator: float | None) -> float:
    if not numerator or not denominator or math.isnan(numerator) or math.isnan(denominator):
        return float("nan")
    return numerator / denominator


def ratios(results: dict) -> dict:
    """The headline ratios (the project's speed goals) from the raw results."""
    conv = {
        (r["image_set"], r["converter"]): r for r in results.get("converter", {}).get("rows", [])
    }
    out = {}
    for image_set in ("web", "phone"):
        ir = conv.get((image_set, "imagerecords"), {}).get("images_per_s")
        out[f"converter_{image_set}_vs_floor"] = _ratio(
            ir, conv.get((image_set, "floor"), {}).get("images_per_s")
        )
        out[f"converter_{image_set}_vs_naive"] = _ratio(
            ir, conv.get((image_set, "naive"), {}).get("images_per_s")
        )
        out[f"converter_{image_set}_beam_vs_floor"] = _ratio(
            conv.get((image_set, "imagerecords_beam"), {}).get("images_per_s"),
            conv.get((image_set, "floor"), {}).get("images_per_s"),
        )
        # CPU per image of the floor over imagerecords': the share of the work
        # that is the codec's, steadier than images/s on a loaded machine.
        out[f"converter_{image_set}_cpu_floor_over_ir"] = _ratio(
            conv.get((image_set, "floor"), {}).get("cpu_ms_per_image"),
            conv.get((image_set, "imagerecords"), {}).get("cpu_ms_per_image"),
        )
    read = {r["variant"]: r for r in results.get("reader", {}).get("rows", [])}
    train = read.get("imagerecords_train", {}).get("images_per_s")
    out["reader_train_vs_keras"] = _ratio(train, read.get("keras_dir", {}).get("images_per_s"))
    out["reader_train_vs_tfrecord"] = _ratio(
        train, read.get("tfrecord_per_example", {}).get("images_per_s")
    )
    for base in ("keras_dir", "tfrecord_per_example"):
        out[f"reader_train_cpu_{base}_over_ir"] = _ratio(
            read.get(base, {}).get("cpu_ms_per_image"),
            read.get("imagerecords_train", {}).get("cpu_ms_per_image"),
        )
    # The fallback where the native op cannot be built (no C++ compiler).
    out["reader_train_stock_vs_tfrecord"] = _ratio(
        read.get("imagerecords_train_stock", {}).get("images_per_s"),
        read.get("tfrecord_per_example", {}).get("images_per_s"),
    )
    # cache="decoded" is a different mode (decoded pixels in RAM): reported next to
    # the default training row, never instead of it.
    decoded = read.get("imagerecords_train_decoded", {})
    out["reader_train_decoded_vs_keras"] = _ratio(
        decoded.get("images_per_s"), read.get("keras_dir", {}).get("images_per_s")
    )
    out["reader_train_decoded_vs_tfrecord"] = _ratio(
        decoded.get("images_per_s"), read.get("tfrecord_per_example", {}).get("images_per_s")
    )
    out["reader_train_decoded_cpu_tfrecord_per_example_over_ir"] = _ratio(
        read.get("tfrecord_per_example", {}).get("cpu_ms_per_image"),
        decoded.get("cpu_ms_per_image"),
    )

    # Each reader path against the floor of its own work (plain tf.data doing
    # only the decode it must do), and the uint8 batches.
    def ips(variant):
        return read.get(variant, {}).get("images_per_s")

    out["reader_train_vs_crop_floor"] = _ratio(ips("imagerecords_train"), ips("floor_crop_decode"))
    out["reader_eval_vs_full_floor"] = _ratio(ips("imagerecords_eval"), ips("floor_full_decode"))
    out["reader_train_uint8_vs_crop_floor"] = _ratio(
        ips("imagerecords_train_uint8"), ips("floor_crop_decode")
    )
    out["reader_train_uint8_vs_keras"] = _ratio(ips("imagerecords_train_uint8"), ips("keras_dir"))
    out["reader_eval_uint8_vs_full_floor"] = _ratio(
        ips("imagerecords_eval_uint8"), ips("floor_full_decode")
    )
    out["reader_eval_vs_keras"] = _ratio(
        read.get("imagerecords_eval", {}).get("images_per_s"),
        read.get("keras_dir", {}).get("images_per_s"),
    )
    return out


def _at_commit(half: dict) -> str:
    """The ' at commit X' of a half that recorded its code (a skipped part has none)."""
    return f" at commit {half['code']}" if half.get("code") else ""


def _fmt(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def _x(value) -> str:
    """A ratio as "1.23x", or "n/a"."""
    text = _fmt(value, 2)
    return text if text == "n/a" else text + "x"


def _verdict(value: float, target: float) -> str:
    if math.isnan(value):
        return "not measured"
    return "**met**" if value >= target else "not met"


def _level(value: float, target: float) -> str:
    """Like _verdict, for rows the target is not judged on (a different mode)."""
    if math.isnan(value):
        return "not measured"
    return f"{target}x level reached" if value >= target else f"below the {target}x level"


def markdown(results: dict) -> str:
    """The results as a Markdown page (machine, data, tables, ratios)."""
    m = results["machine"]
    lines = [
        "# imagerecords benchmark results",
        "",
        f"Written by `python -m bench` ({results['sizes']}) on {results['finished_at']}; "
        "see `docs/performance.md` for the method.",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu_model']}, `nproc` = {m['nproc']}; RAM {m['ram_gib']} GiB; {m['os']}",
        f"- Python {m['python']}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f"; {m['libjpeg']}",
        f"- Code at the last run: commit {m.get('git', 'unknown')} (each half names its own below)",
        f"- Load average (1/5/15 min) at start {m['loadavg_start']}, "
        f"at end {m.get('loadavg_end', 'n/a')} (a shared machine: other jobs were running)",
        "",
        "## Data (generated from scikit-image's photos, cached)",
        "",
        "| set | images | MB | mean MP | formats |",
        "|---|---:|---:|---:|---|",
    ]
    for d in results["data"]:
        formats = ", ".join(f"{k} {v}" for k, v in d["formats"].items())
        lines.append(
            f"| {d['name']} | {d['num_images']} | {d['num_bytes'] / 1e6:.1f} "
            f"| {d['megapixels']:.2f} | {formats} |"
        )
    r = ratios(results)
    conv = results.get("converter")
    if conv:
        lines += [
            "",
            f"## Converter (measured {conv['measured_at']}{_at_commit(conv)})",
            "",
            "images/s and MB/s: wall clock of the whole process, start-up included, best of "
            f"{conv.get('repeats', 1)} run(s) (all runs' wall times in the last column); "
            "`work` is the tool's own timing without start-up. CPU ms/image: all processes "
            "of the tree, start-up included. Peak RSS: summed over the process tree. "
            "PSNR / SSIM: medians of the stored JPEGs of the set's first "
            "100 JPEG sources against Pillow's best rendering of each (full decode, "
            "Lanczos to the stored size; `bench/convert/quality.py`).",
            "",
            "| set | converter | images/s | MB/s in | wall s | work images/s | CPU ms/image "
            "| PSNR dB | SSIM | peak RSS MB | runs (wall s) | note |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for row in conv["rows"]:
            walls = " / ".join(f"{w:.1f}" for w in row.get("all_wall_s") or [])
            lines.append(
                f"| {row['image_set']} | {CONVERTER_LABELS[row['converter']]} "
                f"| {_fmt(row['images_per_s'])} | {_fmt(row['mb_per_s'])} "
                f"| {_fmt(row['wall_s'])} | {_fmt(row['work_images_per_s'])} "
                f"| {_fmt(row.get('cpu_ms_per_image'), 2)} "
                f"| {_fmt(row.get('psnr_db'), 2)} | {_fmt(row.get('ssim'), 4)} "
                f"| {_fmt(row['peak_tree_rss_mb'], 0)} | {walls} | {row['note']} |"
            )
        lines += [
            "",
            "| ratio | web | phone | target |",
            "|---|---:|---:|---|",
            f"| imagerecords / codec floor | {_x(r['converter_web_vs_floor'])} "
            f"| {_x(r['converter_phone_vs_floor'])} | >= 0.95x (issue 15): web "
            f"{_verdict(r['converter_web_vs_floor'], 0.95)}, phone "
            f"{_verdict(r['converter_phone_vs_floor'], 0.95)} |",
            f"| imagerecords on Beam (DirectRunner) / codec floor "
            f"| {_x(r['converter_web_beam_vs_floor'])} "
            f"| {_x(r['converter_phone_beam_vs_floor'])} | (the same job through Beam) |",
            f"| imagerecords / naive loop | {_x(r['converter_web_vs_naive'])} "
            f"| {_x(r['converter_phone_vs_naive'])} | well above 1x |",
            f"| CPU per image: floor / imagerecords "
            f"| {_x(r['converter_web_cpu_floor_over_ir'])} "
            f"| {_x(r['converter_phone_cpu_floor_over_ir'])} "
            "| (load-robust view: 1.0x = no framework CPU at all) |",
        ]
    lines += _codec_lines(results.get("codecs"))
    read = results.get("reader")
    if read:
        lines += [
            "",
            f"## Reader (web set, measured {read['measured_at']}{_at_commit(read)})",
            "",
            f"Images/s at {read['image_size']}x{read['image_size']}, batch {read['batch']}, "
            f"{read['epochs']} timed epoch(s) after {read['warmup']} warm-up epoch(s), each "
            "pipeline in its own process (a quick run: all in one), best of "
            f"{read.get('rounds', 1)} interleaved round(s) (every round's images/s in the "
            "`rounds` column; the best round's epochs under `per epoch`). Baselines repeat, so "
            "all are timed in steady state. CPU ms/image: the process's CPU time (all threads) "
            "in the timed epochs, per image.",
            "",
            "| pipeline | images/s | rounds | per epoch | CPU ms/image | peak RSS MB | note |",
            "|---|---:|---|---|---:|---:|---|",
        ]
        for row in read["rows"]:
            per_epoch = " / ".join(f"{x:.0f}" for x in row["epoch_images_per_s"]) or "n/a"
            rounds = " / ".join(
                "n/a" if x is None else f"{x:.0f}" for x in row.get("round_images_per_s") or []
            )
            lines.append(
                f"| {READER_LABELS[row['variant']]} | {_fmt(row['images_per_s'])} | {rounds} "
                f"| {per_epoch} "
                f"| {_fmt(row.get('cpu_ms_per_image'), 2)} "
                f"| {_fmt(row['peak_tree_rss_mb'], 0)} | {row['note']} |"
            )
        lines += [
            "",
            "| ratio | value | target |",
            "|---|---:|---|",
            f"| imagerecords (train) / image_dataset_from_directory "
            f"| {_x(r['reader_train_vs_keras'])} "
            f"| >= 1.5x: {_verdict(r['reader_train_vs_keras'], 1.5)}; "
            f">= 3x (stretch): {_verdict(r['reader_train_vs_keras'], 3.0)} |",
            f"| imagerecords (train) / crop-decode floor "
            f"| {_x(r.get('reader_train_vs_crop_floor'))} "
            f"| >= 0.9x: {_verdict(r.get('reader_train_vs_crop_floor', _NAN), 0.9)} |",
            f"| imagerecords (eval) / full-decode floor "
            f"| {_x(r.get('reader_eval_vs_full_floor'))} "
            f"| >= 0.9x: {_verdict(r.get('reader_eval_vs_full_floor', _NAN), 0.9)} |",
            f"| *uint8 batches:* imagerecords (train, uint8) / crop-decode floor "
            f"| {_x(r.get('reader_train_uint8_vs_crop_floor'))} | (its own row) |",
            f"| *uint8 batches:* imagerecords (train, uint8) / image_dataset_from_directory "
            f"| {_x(r.get('reader_train_uint8_vs_keras'))} | (its own row) |",
            f"| *uint8 batches:* imagerecords (eval, uint8) / full-decode floor "
            f"| {_x(r.get('reader_eval_uint8_vs_full_floor'))} | (its own row) |",
            f"| imagerecords (train) / per-example TFRecord "
            f"| {_x(r['reader_train_vs_tfrecord'])} "
            f"| >= 1.3x: {_verdict(r['reader_train_vs_tfrecord'], 1.3)} |",
            f"| CPU per image: image_dataset_from_directory / imagerecords (train) "
            f"| {_x(r['reader_train_cpu_keras_dir_over_ir'])} | (load-robust view) |",
            f"| CPU per image: per-example TFRecord / imagerecords (train) "
            f"| {_x(r['reader_train_cpu_tfrecord_per_example_over_ir'])} "
            "| (load-robust view) |",
            f"| *fallback:* imagerecords (train, stock TF ops) / per-example TFRecord "
            f"| {_x(r.get('reader_train_stock_vs_tfrecord'))} "
            "| where no C++ compiler is found |",
            f"| imagerecords (eval) / image_dataset_from_directory "
            f"| {_x(r['reader_eval_vs_keras'])} | - |",
            f"| *different mode:* imagerecords (train, cache=decoded) "
            f"/ image_dataset_from_directory | {_x(r.get('reader_train_decoded_vs_keras'))} "
            f"| not a target row; {_level(r.get('reader_train_decoded_vs_keras', _NAN), 1.5)} |",
            f"| *different mode:* imagerecords (train, cache=decoded) / per-example TFRecord "
            f"| {_x(r.get('reader_train_decoded_vs_tfrecord'))} "
            f"| not a target row; "
            f"{_level(r.get('reader_train_decoded_vs_tfrecord', _NAN), 1.3)} |",
            f"| *different mode:* CPU per image: per-example TFRecord / imagerecords "
            f"(train, cache=decoded) "
            f"| {_x(r.get('reader_train_decoded_cpu_tfrecord_per_example_over_ir'))} "
            "| (load-robust view) |",
            "",
            "The targets are judged on the default training row. `cache=decoded` keeps "
            "the split's decoded pixels in RAM (decoded once, in the untimed warm-up epoch; "
            "see docs/reader.md) and suits data sets that fit in memory trained for many "
            "epochs; the pipelines it is compared with decode every epoch.",
        ]
    lines += _gpu_lines(results.get("gpu"))
    lines += ["", "![chart](chart.png)", ""]
    return "\n".join(lines)


def _gpu_lines(gpu: dict | None) -> list[str]:
    """The ResNet-50 training step (bench.read.gpu_step): a table, or why it was skipped."""
    if not gpu:
        return []
    lines = ["", "## ResNet-50 training step fed by each reader (GPU only)", ""]
    if gpu.get("skipped"):
        return lines + [gpu["skipped"]]
    lines += [
        f"Measured {gpu.get('measured_at', '')}{_at_commit(gpu)} on {gpu.get('device', '?')} "
        f"(Keras on {gpu.get('backend', '?')}), batch {gpu.get('batch', '?')}, "
        f"{gpu.get('steps', '?')} timed steps after {gpu.get('warmup', '?')}, each pipeline "
        "alone in its own process pinned to `host CPUs` cores. `synthetic` reuses one batch "
        "already on the accelerator: the model-only rate. Accelerator idle: "
        "1 - steps x synthetic step time / wall, the share of the time the accelerator "
        "waited for input. Host wait: host time per step in `next(iterator)`.",
        "",
        "| host CPUs | pipeline | images/s | step ms | accelerator idle | host wait ms | note |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for row in gpu["rows"]:
        label = GPU_LABELS.get(row["variant"], row["variant"])
        if row.get("error"):
            lines.append(f"| {row['host_cpus']} | {label} | - | - | - | - | {row['error']} |")
            continue
        idle = row.get("accelerator_idle_fraction")
        idle_text = "-" if idle is None else f"{_fmt(100 * idle, 1)}%"
        lines.append(
            f"| {row['host_cpus']} | {label} | {_fmt(row['images_per_s'])} "
            f"| {_fmt(row['step_ms'], 1)} | {idle_text} | {_fmt(row['host_wait_ms'], 1)} | |"
        )
    return lines


def _codec_lines(study: dict | None) -> list[str]:
    """The codec study's table (bench.convert.codecs): speed on one core next to quality."""
    if not study:
        return []
    lines = [
        "",
        f"## Codec study (measured {study['measured_at']}{_at_commit(study)}, "
        f"load {study.get('loadavg', 'n/a')})",
        "",
        "Each path converts the first images of the set to the stored JPEG (shorter side "
        "256, q90, 4:2:0) on one thread, in its own process; best of "
        f"{study.get('rounds', 1)} interleaved round(s) (every round in the last column). "
        "`x floor`: CPU per image of Pillow draft + bicubic (the codec floor) over this "
        "path's (> 1 is faster). PSNR / SSIM: medians over the first 100 inputs' JPEGs, output "
        "against Pillow's best of the same source (full decode, Lanczos to the same size).",
        "",
        "| set | path | CPU ms/image | images/s per core | x floor | PSNR dB | SSIM "
        "| KB/image | rounds (CPU ms) | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in study["rows"]:
        rounds = " / ".join(f"{x:.2f}" for x in row.get("round_cpu_ms") or [])
        lines.append(
            f"| {row['image_set']} | {row['label']} | {_fmt(row['cpu_ms_per_image'], 2)} "
            f"| {_fmt(row['images_per_core_s'], 0)} | {_x(row['speed_vs_floor'])} "
            f"| {_fmt(row['psnr_db'], 2)} | {_fmt(row['ssim'], 4)} "
            f"| {_fmt(row['out_kb_per_image'], 1)} | {rounds} | {row['note']} |"
        )
    return lines


def chart(results: dict, path: Path) -> None:
    """Draws images/s per tool: converter on each set, and the reader."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    conv = results.get("converter")
    if conv:
        for image_set in ("web", "phone"):
            rows = [r for r in conv["rows"] if r["image_set"] == image_set]
            if rows:
                floor = next((r["images_per_s"] for r in rows if r["converter"] == "floor"), None)
                panels.append(
                    (
                        f"Converter, {image_set} set (images/s, wall clock)",
                        [CONVERTER_LABELS[r["converter"]] for r in rows],
                        [r["images_per_s"] for r in rows],
                        [(0.95 * floor, "target: 0.95x floor")] if floor else [],
                    )
                )
    read = results.get("reader")
    if read:
        rows = read["rows"]
        keras = next((r["images_per_s"] for r in rows if r["variant"] == "keras_dir"), None)
        tfrecord = next(
            (r["images_per_s"] for r in rows if r["variant"] == "tfrecord_per_example"), None
        )
        targets = []
        if keras and not math.isnan(keras):
            targets.append((1.5 * keras, "1.5x keras"))
        if tfrecord and not math.isnan(tfrecord):
            targets.append((1.3 * tfrecord, "1.3x TFRecord"))
        panels.append(
            (
                f"Reader, web set (images/s at {read['image_size']}px, batch {read['batch']})",
                [READER_LABELS[r["variant"]] for r in rows],
                [r["images_per_s"] for r in rows],
                targets,
            )
        )
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.3 * len(panels) + 0.6))
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (title, labels, values, targets) in zip(axes, panels, strict=True):
        clean = [0.0 if (v is None or math.isnan(v)) else v for v in values]
        colours = [
            "#f4a582" if "cache=decoded" in label else "#d62728" if "imagerecords" in label
            else "#7f7f7f"
            for label in labels
        ]  # fmt: skip
        bars = ax.barh(range(len(labels)), clean, color=colours)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10, loc="left")
        for bar, value in zip(bars, values, strict=True):
            text = "n/a" if value is None or math.isnan(value) else f"{value:,.0f}"
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {text}",
                    va="center", fontsize=8)  # fmt: skip
        targets = [t for t in targets if t[0] is not None and not math.isnan(t[0])]
        for x, text in targets:
            # Dashed line at the target, labelled above the first bar (axis is inverted).
            ax.axvline(x, color="#1f77b4", linestyle="--", linewidth=1)
            ax.text(x, -0.45, f" {text}", color="#1f77b4", fontsize=7, va="bottom")
        ax.set_xlim(0, max(clean + [t[0] for t in targets]) * 1.25 or 1)
        ax.set_ylim(len(labels) - 0.5, -0.9)  # room above the first bar for target labels
        ax.tick_params(axis="x", labelsize=8)
    m = results["machine"]
    fig.suptitle(
        f"imagerecords benchmark: {m['nproc']} cores, {m['cpu_model']}, {m['ram_gib']} GiB "
        f"({results['sizes']})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _no_nan(value):
    # NaN is not JSON; a number that was not measured is null.
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(v) for v in value]
    return value


def write(results: dict, results_dir: Path) -> None:
    """Writes results.json, results.md and chart.png into ``results_dir``."""
    results_dir.mkdir(parents=True, exist_ok=True)
    results["ratios"] = ratios(results)
    text = json.dumps(_no_nan(results), indent=1, default=str)
    (results_dir / "results.json").write_text(text + "\n")
    (results_dir / "results.md").write_text(markdown(results))
    chart(results, results_dir / "chart.png")

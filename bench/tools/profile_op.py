"""What the reader's resize op costs, and how much of it is writing the batch.

``python -m bench.tools.profile_op [--rounds N]``

The native op (``ImagerecordsResizeCrops``) alone, one thread, on one batch
of the web set's training windows (the reader's crop distribution, decoded
once up front), float32 and uint8 output, the variants interleaved round by
round, CPU ms per image, best and median of the rounds. Next to it, the same
op on crops that already have the output size: its cast path, which only
widens each byte and streams it into the batch, so it is the least any
pipeline pays to *write* a batch of that dtype; and the host's streaming
write bandwidth that implies. The difference between the two rows is the
resize arithmetic.

Why it matters: the training floor of ``make bench`` (``decode_and_crop_jpeg``
of each window) writes the uint8 crops, ~100 KB per image; a float32 batch at
224 px is 602 KB per image. Whether that write adds to the arithmetic or
overlaps with it depends on the host and its load (docs/performance.md,
"What a float32 batch costs the host").

Written to ``bench/results/raw/profile/op.txt`` and printed.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.common.procstats import process_cpu_s
from bench.common.settings import CACHE_DIR, FULL, QUICK, READ_IMAGE_SIZE, RESULTS_DIR
from bench.convert.converters import imagerecords_output

PROFILE_DIR = RESULTS_DIR / "raw" / "profile"


def training_windows(records: Path, count: int, seed: int = 0):
    """``(flat uint8 pixels, int32 [count, 2] shapes)`` of ``count`` decoded random windows."""
    import tensorflow as tf

    from reader import AugmentConfig, decode

    augment = AugmentConfig()  # the reader's default crop distribution
    files = sorted(str(p) for p in records.glob("train-*"))
    pixels, shapes = [], []
    for i, record in enumerate(tf.data.TFRecordDataset(files).take(count)):
        encoded = decode.parse_single(record)[decode.ENCODED]
        window = decode.random_crop_window(
            tf.io.extract_jpeg_shape(encoded),
            tf.constant([seed, i], tf.int64),
            area_range=augment.crop_area_range,
            aspect_ratio_range=augment.crop_aspect_ratio_range,
        )
        image = tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
        pixels.append(tf.reshape(image, [-1]))
        shapes.append(tf.shape(image)[:2])
    return tf.concat(pixels, 0), tf.stack(shapes)


def main(argv: list[str] | None = None) -> None:
    """Times the op on training windows and on output-size crops, and writes the summary."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.profile_op", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="the benchmark's cache")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    parser.add_argument("--calls", type=int, default=15, help="op calls per round (default 15)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    records = imagerecords_output(args.cache_dir / "out" / sizes.name, "web")
    if not (records / "dataset_info.json").exists():
        raise SystemExit(f"no imagerecords output at {records}: run `python -m bench` first")

    import tensorflow as tf

    from reader import native  # importing reader sets the BFC allocator (reader/allocator.py)

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    op = native.ops()
    if op is None:
        raise SystemExit(f"the native op is unavailable: {native.unavailable_reason()}")
    batch, size = sizes.read_batch_size, READ_IMAGE_SIZE
    crops, shapes = training_windows(records, batch)
    same = tf.zeros([batch * size * size * 3], tf.uint8) + 7
    same_shapes = tf.fill([batch, 2], size)
    flips = tf.constant([i % 2 == 0 for i in range(batch)])
    no_flips = tf.zeros([batch], tf.bool)  # the cast path's mirrored copy is a scalar loop
    variants = {}
    for dtype in (tf.float32, tf.uint8):
        for name, (pixels, hw, mirror) in {
            "training windows": (crops, shapes, flips),
            "output-size crops, no flips (cast + write)": (same, same_shapes, no_flips),
        }.items():
            fn = tf.function(
                lambda p, s, f, t=dtype: op.imagerecords_resize_crops(
                    p, s, f, size=[size, size], T=t
                )
            )
            fn(pixels, hw, mirror)  # trace, and the allocator's first batch
            variants[f"{dtype.name:<8} {name}"] = (fn, pixels, hw, mirror, dtype.size)
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (fn, pixels, hw, mirror, _) in variants.items():
            start = process_cpu_s()
            for _ in range(args.calls):
                fn(pixels, hw, mirror)
            times[name].append(1000 * (process_cpu_s() - start) / (args.calls * batch))
    mean_h = float(tf.reduce_mean(tf.cast(shapes[:, 0], tf.float32)))
    mean_w = float(tf.reduce_mean(tf.cast(shapes[:, 1], tf.float32)))
    lines = [
        f"# resize op alone, one thread, batch {batch} at {size} px, {args.rounds} interleaved "
        f"rounds of {args.calls} calls; training windows average {mean_h:.0f} x {mean_w:.0f} px",
        f"{'output / input':<48}{'best ms/img':>12}{'median':>9}{'write GB/s':>12}",
    ]
    for name, (*_, itemsize) in variants.items():
        best, median = min(times[name]), statistics.median(times[name])
        image_bytes = size * size * 3 * itemsize
        rate = f"{image_bytes / (best / 1000) / 1e9:>12.1f}" if "cast" in name else " " * 12
        lines.append(f"{name:<48}{best:>12.4f}{median:>9.4f}{rate}")
    print("\n".join(lines), flush=True)
    PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    (PROFILE_DIR / "op.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

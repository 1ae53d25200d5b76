"""Where the reader's time goes: ``python -m bench.tools.profile_reader [--quick]``.

An ablation on imagerecords' web-set output: the same records through
pipelines that each add one stage, timed in one process after a warm-up,
with the process's CPU time per image next to the images/s (on a shared
2-core machine CPU-ms per image is the steadier number, and
``2 cores / CPU-ms`` is the ceiling). Stages:

* raw ``TFRecordDataset`` -> batch (I/O + framing only);
* + ``parse_example`` on the batch, vs ``parse_single_example`` per record;
* + ``decode_jpeg`` (full image, no resize), per record vs ``map_fn`` over a batch;
* + resize to 224 (the tutorial pipeline);
* + random crop while decoding (``decode_and_crop_jpeg``) + flip, per record;
* imagerecords' reader as shipped (train, train with ``decode_before_batching``, eval);
* for reference, decoding the original files (what ``image_dataset_from_directory`` pays).

Written to ``bench/results/raw/profile/reader.txt`` and printed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.common.data import list_images
from bench.common.procstats import process_cpu_s
from bench.common.settings import CACHE_DIR, FULL, QUICK, READ_IMAGE_SIZE, RESULTS_DIR
from bench.convert.converters import imagerecords_output

PROFILE_DIR = RESULTS_DIR / "raw" / "profile"


def _measure(ds, images_per_epoch: int, epochs: int) -> tuple[float, float]:
    """(images/s, CPU ms per image) over ``epochs`` after one warm-up epoch."""
    iterator = iter(ds)

    def pull(n):
        got = 0
        while got < n:
            batch = next(iterator)
            first = batch[0] if isinstance(batch, tuple) else batch
            got += int(first.shape[0])
        return got

    pull(images_per_epoch)
    cpu0, t0 = process_cpu_s(), time.perf_counter()
    got = pull(images_per_epoch * epochs)
    wall, cpu = time.perf_counter() - t0, process_cpu_s() - cpu0
    return got / wall, 1000 * cpu / got


def build_variants(records: Path, files_root: Path, batch: int) -> dict:
    """name -> (dataset factory, images per epoch)."""
    import tensorflow as tf

    import reader

    auto = tf.data.AUTOTUNE
    size = (READ_IMAGE_SIZE, READ_IMAGE_SIZE)
    info = json.loads((records / "dataset_info.json").read_text())
    n_train = info["splits"]["train"]["num_examples"]
    shards = sorted(str(p) for p in records.glob("train-*.tfrecord"))
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }

    def records_ds():
        return tf.data.TFRecordDataset(shards).repeat()

    def single(fn):
        return lambda: records_ds().map(fn, num_parallel_calls=auto).batch(batch).prefetch(auto)

    def parse1(r):
        e = tf.io.parse_single_example(r, spec)
        return e["image/encoded"], e["image/class/label"]

    def decode1(r):
        e = tf.io.parse_single_example(r, spec)
        return tf.io.decode_jpeg(e["image/encoded"], channels=3)[:8, :8], e["image/class/label"]

    def decode_resize1(r):
        e = tf.io.parse_single_example(r, spec)
        image = tf.io.decode_jpeg(e["image/encoded"], channels=3)
        return tf.image.resize(image, size), e["image/class/label"]

    def crop_resize1(r):
        e = tf.io.parse_single_example(r, spec)
        encoded = e["image/encoded"]
        shape = tf.io.extract_jpeg_shape(encoded)
        begin, crop, _ = tf.image.sample_distorted_bounding_box(
            shape,
            tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            area_range=(0.08, 1.0),
            aspect_ratio_range=(3 / 4, 4 / 3),
            max_attempts=10,
            min_object_covered=0.1,
        )
        window = tf.stack([begin[0], begin[1], crop[0], crop[1]])
        image = tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
        image = tf.image.random_flip_left_right(tf.image.resize(image, size))
        return image, e["image/class/label"]

    def stateless_window(shape, seed):
        begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape,
            tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            seed=seed,
            area_range=(0.08, 1.0),
            aspect_ratio_range=(3 / 4, 4 / 3),
            max_attempts=10,
            min_object_covered=0.1,
            use_image_if_no_bounding_boxes=True,
        )
        return begin, crop

    def train_one(encoded, label, seed):
        # Proposal: crop while decoding, then resize and flip, one record per call.
        shape = tf.io.extract_jpeg_shape(encoded)
        begin, crop = stateless_window(shape, seed)
        window = tf.stack([begin[0], begin[1], crop[0], crop[1]])
        image = tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
        image = tf.image.resize(image, size)
        image = tf.image.stateless_random_flip_left_right(image, seed + 1)
        return image, label

    def train_one_crop_and_resize(encoded, label, seed):
        # Proposal: full decode, then one crop_and_resize op does crop + resize + flip
        # (a box with x1 > x2 is mirrored), no separate flip copy.
        image = tf.io.decode_jpeg(encoded, channels=3)
        shape = tf.shape(image)
        begin, crop = stateless_window(shape, seed)
        h, w = tf.cast(shape[0] - 1, tf.float32), tf.cast(shape[1] - 1, tf.float32)
        y1 = tf.cast(begin[0], tf.float32) / h
        x1 = tf.cast(begin[1], tf.float32) / w
        y2 = tf.cast(begin[0] + crop[0] - 1, tf.float32) / h
        x2 = tf.cast(begin[1] + crop[1] - 1, tf.float32) / w
        flip = tf.random.stateless_uniform([], seed + 1) < 0.5
        box = tf.where(flip, tf.stack([y1, x2, y2, x1]), tf.stack([y1, x1, y2, x2]))
        image = tf.image.crop_and_resize(image[None], box[None], [0], size)[0]
        return image, label

    def seeded(ds):
        return tf.data.Dataset.zip((ds, tf.data.Dataset.counter())).map(
            lambda x, i: (*x, tf.stack([tf.constant(7, tf.int64), i]))
        )

    def per_record(fn, batched_parse_first: bool):
        def build():
            ds = records_ds().shuffle(2048)
            if batched_parse_first:
                # parse_example on batches of 128, then unbatch: the vectorised parse
                # and a per-record parallel decode.
                ds = ds.batch(batch).map(
                    lambda r: tf.io.parse_example(r, spec), num_parallel_calls=auto
                )
                ds = ds.map(lambda e: (e["image/encoded"], e["image/class/label"])).unbatch()
            else:
                ds = ds.map(parse1, num_parallel_calls=auto)
            ds = seeded(ds).map(fn, num_parallel_calls=auto, deterministic=False)
            return ds.batch(batch, drop_remainder=True).prefetch(auto)

        return build

    def batched_map_fn_train(parallel_iterations):
        def build():
            def fn(e, i):
                seeds = tf.random.stateless_uniform(
                    [tf.shape(e["image/encoded"])[0], 2], [7, i], None, None, tf.int64
                )
                return tf.map_fn(
                    lambda a: train_one(*a),
                    (e["image/encoded"], e["image/class/label"], seeds),
                    fn_output_signature=(
                        tf.TensorSpec([*size, 3], tf.float32),
                        tf.TensorSpec([], tf.int64),
                    ),
                    parallel_iterations=parallel_iterations,
                )

            ds = records_ds().shuffle(2048).batch(batch, drop_remainder=True)
            ds = ds.map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=auto)
            ds = tf.data.Dataset.zip((ds, tf.data.Dataset.counter()))
            return ds.map(fn, num_parallel_calls=auto, deterministic=False).prefetch(auto)

        return build

    def decoded_cache():
        # Proposal: decode once into uint8 and cache in memory (fits when the split's
        # decoded size is small: 1,589 x 341x256x3 = 0.4 GB here); every epoch after
        # the first only crops (a slice of the cached pixels), resizes and flips.
        def crop_resize_flip(image, label, seed):
            begin, crop = stateless_window(tf.shape(image), seed)
            image = tf.slice(image, begin, crop)
            image = tf.image.resize(image, size)
            return tf.image.stateless_random_flip_left_right(image, seed + 1), label

        ds = tf.data.TFRecordDataset(shards).map(parse1, num_parallel_calls=auto)
        ds = ds.map(
            lambda e, y: (tf.io.decode_jpeg(e, channels=3), y), num_parallel_calls=auto
        ).cache()
        ds = seeded(ds.shuffle(2048).repeat())
        ds = ds.map(crop_resize_flip, num_parallel_calls=auto, deterministic=False)
        return ds.batch(batch, drop_remainder=True).prefetch(auto)

    def batched_parse():
        ds = records_ds().batch(batch)
        return ds.map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=auto).map(
            lambda e: (e["image/encoded"], e["image/class/label"])
        )

    def batched_map_fn_decode():
        def fn(e):
            images = tf.map_fn(
                lambda x: tf.io.decode_jpeg(x, channels=3)[:8, :8],
                e["image/encoded"],
                fn_output_signature=tf.TensorSpec([None, None, 3], tf.uint8),
                parallel_iterations=16,
            )
            return images, e["image/class/label"]

        ds = records_ds().batch(batch)
        ds = ds.map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=auto)
        return ds.map(fn, num_parallel_calls=auto).prefetch(auto)

    def files_decode():
        files = tf.data.Dataset.list_files(str(files_root / "*" / "*"), seed=1).repeat()

        def load(path):
            image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
            return tf.image.resize(image, size), 0

        return files.map(load, num_parallel_calls=auto).batch(batch).prefetch(auto)

    def ir(**kw):
        return lambda: reader.make_dataset(
            str(records), "train", batch_size=batch, image_size=READ_IMAGE_SIZE, **kw
        ).repeat()

    n_files = len(list_images(files_root))
    return {
        "raw records, batched": (lambda: records_ds().batch(batch), n_train),
        "+ parse_example per batch": (batched_parse, n_train),
        "+ parse_single_example per record": (single(parse1), n_train),
        "+ decode_jpeg per record (no resize)": (single(decode1), n_train),
        "+ decode_jpeg via map_fn over batch (no resize)": (batched_map_fn_decode, n_train),
        "tutorial: parse1 + decode + resize 224": (single(decode_resize1), n_train),
        "parse1 + crop-decode + resize + flip": (single(crop_resize1), n_train),
        "P1 train: parse1 -> map(crop-decode+resize+flip)": (
            per_record(train_one, False),
            n_train,
        ),
        "P2 train: parse_example(batch) -> unbatch -> map(same)": (
            per_record(train_one, True),
            n_train,
        ),
        "P3 train: P2 with decode + crop_and_resize(flip box)": (
            per_record(train_one_crop_and_resize, True),
            n_train,
        ),
        "P4 train: batch -> map_fn(same), parallel_iterations=16": (
            batched_map_fn_train(16),
            n_train,
        ),
        "P5 train: batch -> map_fn(same), parallel_iterations=128": (
            batched_map_fn_train(128),
            n_train,
        ),
        "P6 train: decoded uint8 cache -> crop+resize+flip": (decoded_cache, n_train),
        "imagerecords train (as shipped)": (ir(training=True), n_train),
        "imagerecords train, decode_before_batching": (
            ir(training=True, decode_before_batching=True),
            n_train,
        ),
        "imagerecords eval (as shipped)": (ir(training=False), n_train),
        "original files: decode_image + resize": (files_decode, n_files),
    }


def main(argv: list[str] | None = None) -> None:
    """Times every ablation variant and writes the summary."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.tools.profile_reader", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="the benchmark's cache")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--only", help="substring of the variants to run")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    records = imagerecords_output(args.cache_dir / "out" / sizes.name, "web")
    files_root = args.cache_dir / "data" / f"web-{sizes.name}"
    if not (records / "dataset_info.json").exists():
        raise SystemExit(f"no imagerecords output at {records}: run `python -m bench` first")
    lines = [
        f"# reader ablation, web set, batch {sizes.read_batch_size}, "
        f"{args.epochs} epochs after 1 warm-up",
        f"{'variant':<50}{'images/s':>10}{'CPU ms/img':>12}",
    ]
    print("\n".join(lines), flush=True)
    for name, (factory, per_epoch) in build_variants(
        records, files_root, sizes.read_batch_size
    ).items():
        if args.only and args.only not in name:
            continue
        try:
            rate, cpu_ms = _measure(factory(), per_epoch, args.epochs)
        except Exception as error:  # a reader option that fails must not hide the others
            lines.append(f"{name:<50}  failed: {type(error).__name__}: {str(error)[:120]!r}")
        else:
            lines.append(f"{name:<50}{rate:>10.0f}{cpu_ms:>12.2f}")
        print(lines[-1], flush=True)
    PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    (PROFILE_DIR / "reader.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""The input pipelines the reader benchmark compares, each as users write it.

All yield ``(images float32 [B, 224, 224, 3], labels int [B])`` batches.
The three baselines are given ``.repeat()`` so that, like imagerecords'
training pipeline, they are timed in steady state: no iterator restart or
drained prefetch buffer at epoch boundaries counts against them.

* ``keras_dir``: ``keras.utils.image_dataset_from_directory`` on the original
  files (its defaults: shuffled file list, ``decode_image``, bilinear resize
  to 224x224 without keeping the aspect ratio), then ``prefetch``.
* ``tfdata_files``: the hand-written equivalent: ``list_files`` ->
  ``map(read_file + decode_image + resize, AUTOTUNE)`` -> ``batch`` ->
  ``prefetch``.
* ``tfrecord_per_example``: the usual TFRecord tutorial, on the same shards
  imagerecords wrote: ``TFRecordDataset`` -> ``map(parse_single_example ->
  decode_jpeg -> resize, AUTOTUNE)`` -> ``batch`` -> ``prefetch``.
* ``imagerecords_train`` / ``imagerecords_eval``: ``reader.make_dataset(OUT,
  "train", batch_size, image_size=224, training=True|False)``; the evaluation
  pipeline with ``repeat=True``, so that, like the floor it is compared with,
  it is timed in steady state.
* ``imagerecords_eval_pass``: the evaluation pipeline as a user runs it, one
  fresh finite pass per epoch: each pass also pays the iterator's start (tf.data
  graph rewrite, thread pools) and the ramp-up and drain of the parallel map.
* ``imagerecords_train_stock``: the default training pipeline with
  ``native_ops=False``: stock TensorFlow ops flip and resize each image, as on a
  machine where the reader's native op cannot be compiled (no C++ compiler).
* ``imagerecords_train_decoded``: the same training pipeline with
  ``cache="decoded"``: a different mode (the split's decoded pixels are kept in
  RAM after the first epoch, which the warm-up epoch pays for), not the default.
* ``imagerecords_train_uint8`` / ``imagerecords_eval_uint8``: the same pipelines
  with ``dtype=tf.uint8`` (what DALI and FFCV hand over: the model normalises on
  the accelerator), a quarter of the bytes per batch.
* ``floor_crop_decode``: the training floor: the same shards read,
  batched, ``parse_example``-ed, and each record's random window (the reader's
  distribution: area 0.08-1, aspect 3/4-4/3) decoded with
  ``decode_and_crop_jpeg``, the windows laid end to end in one uint8 tensor per
  batch. No resize, no flip, no float32 batch: the reader minus its own work.
* ``floor_full_decode``: the evaluation floor: the same, decoding each whole
  image (``decode_jpeg``), no crop, no resize.

The floors yield ``(shapes [B, 2], pixels [N] uint8, labels [B])``: the first
element still has one row per image, which is what the worker counts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from imagerecords.codec import INFO_FILE

VARIANTS = (
    "keras_dir",
    "tfdata_files",
    "tfrecord_per_example",
    "imagerecords_train",
    "imagerecords_train_stock",
    "imagerecords_train_decoded",
    "imagerecords_eval",
    "imagerecords_eval_pass",
    "imagerecords_train_uint8",
    "imagerecords_eval_uint8",
    "floor_crop_decode",
    "floor_full_decode",
)
# The baselines that read only the original files; every other variant reads
# the imagerecords output (and cannot run without it).
FILE_VARIANTS = ("keras_dir", "tfdata_files")
RECORD_VARIANTS = tuple(v for v in VARIANTS if v not in FILE_VARIANTS)
LABELS = {
    "keras_dir": "keras image_dataset_from_directory (files)",
    "tfdata_files": "hand-written tf.data over files",
    "tfrecord_per_example": "TFRecord, per-example parse (tutorial)",
    "imagerecords_train": "imagerecords reader, training (augment)",
    "imagerecords_train_stock": "imagerecords reader, training, stock TF ops (no C++ compiler)",
    "imagerecords_train_decoded": "imagerecords reader, training, cache=decoded (RAM)",
    "imagerecords_eval": "imagerecords reader, eval (steady state)",
    "imagerecords_eval_pass": "imagerecords reader, eval, one fresh pass per epoch",
    "imagerecords_train_uint8": "imagerecords reader, training, uint8 batches",
    "imagerecords_eval_uint8": "imagerecords reader, eval, uint8 batches",
    "floor_crop_decode": "floor: read + parse + decode_and_crop_jpeg, batched, no resize",
    "floor_full_decode": "floor: read + parse + decode_jpeg (whole image), batched",
}


@dataclasses.dataclass
class Pipeline:
    """A dataset to time.

    Attributes:
        dataset: the ``tf.data.Dataset``.
        epoch_images: images in one epoch of this pipeline's source.
        infinite: True if it repeats (timed by counting batches from one
            iterator); False if every epoch is a fresh pass (eval).
    """

    dataset: object
    epoch_images: int
    infinite: bool


def _count_files(root: Path) -> int:
    from bench.common.data import list_images

    return len(list_images(root))


def keras_dir(files_root: Path, records_dir: Path, batch: int, size: int) -> Pipeline:
    """``image_dataset_from_directory`` over the original image files."""
    import keras
    import tensorflow as tf

    ds = keras.utils.image_dataset_from_directory(
        str(files_root), image_size=(size, size), batch_size=batch, seed=42, verbose=False
    )
    return Pipeline(ds.repeat().prefetch(tf.data.AUTOTUNE), _count_files(files_root), True)


def tfdata_files(files_root: Path, records_dir: Path, batch: int, size: int) -> Pipeline:
    """A hand-written ``list_files -> map(decode, resize)`` pipeline."""
    import tensorflow as tf

    classes = sorted(p.name for p in files_root.iterdir() if p.is_dir())
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(classes, list(range(len(classes)))), default_value=-1
    )

    def load(path):
        label = table.lookup(tf.strings.split(path, "/")[-2])
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        return tf.image.resize(image, (size, size)), label

    files = tf.data.Dataset.list_files(str(files_root / "*" / "*"), shuffle=True, seed=42)
    ds = files.repeat().map(load, num_parallel_calls=tf.data.AUTOTUNE)
    return Pipeline(ds.batch(batch).prefetch(tf.data.AUTOTUNE), _count_files(files_root), True)


def _train_shards(records_dir: Path) -> list[str]:
    return sorted(str(p) for p in records_dir.glob("train-*.tfrecord"))


def num_examples(records_dir: Path, split: str = "train") -> int:
    """The images of ``split`` in an imagerecords output, from its info file."""
    import json

    info = json.loads((records_dir / INFO_FILE).read_text())
    return int(info["splits"][split]["num_examples"])


def random_window(encoded, seed=None):
    """``[y, x, height, width]`` of a random window of a JPEG, in the reader's
    distribution (area 8-100%, aspect 3/4-4/3), for ``decode_and_crop_jpeg``.

    ``seed``: a stateless draw from this ``[2]`` seed; None: TensorFlow's
    stateful op, as a user's pipeline without seeds writes it.
    """
    import tensorflow as tf

    shape, whole = (
        tf.io.extract_jpeg_shape(encoded),
        tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
    )
    distribution = dict(
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    if seed is None:
        begin, extent, _ = tf.image.sample_distorted_bounding_box(shape, whole, **distribution)
    else:
        begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape, whole, seed=seed, **distribution
        )
    return tf.stack([begin[0], begin[1], extent[0], extent[1]])


def tfrecord_per_example(files_root: Path, records_dir: Path, batch: int, size: int) -> Pipeline:
    """The tutorial TFRecord pipeline, one ``parse_single_example`` per record."""
    import tensorflow as tf

    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        image = tf.io.decode_jpeg(example["image/encoded"], channels=3)
        return tf.image.resize(image, (size, size)), example["image/class/label"]

    ds = tf.data.TFRecordDataset(_train_shards(records_dir)).repeat()
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return Pipeline(ds.batch(batch).prefetch(tf.data.AUTOTUNE), num_examples(records_dir), True)


def _imagerecords(records_dir: Path, batch: int, size: int, training: bool, **options) -> Pipeline:
    import reader

    ds = reader.make_dataset(
        str(records_dir), "train", batch_size=batch, image_size=size, training=training, **options
    )
    infinite = options.get("repeat", training)
    return Pipeline(ds, num_examples(records_dir), infinite)


def imagerecords_train(files_root: Path, records_dir: Path, batch: int, size: int) -> Pipeline:
    """imagerecords' reader in training mode (shuffle, repeat, augmentation)."""
    return _imagerecords(records_dir, batch, size, training=True)


def imagerecords_train_stock(
    files_root: Path, records_dir: Path, batch: int, size: int
) -> Pipeline:
    """The training pipeline without the native op (the fallback where it cannot be built)."""
    return _imagerecords(records_dir, batch, size, training=True, native_ops=False)


def imagerecords_train_decoded(
    files_root: Path, records_dir: Path, batch: int, size: int
) -> Pipeline:
    """imagerecords' reader in training mode with ``cache="decoded"`` (pixels kept in RAM)."""
    return _imagerecords(records_dir, batch, size, training=True, cache="decoded")


def imagerecords_eval(files_root: Path, records_dir: Path, batch: int, size: int) -> Pipeline:
    """imagerecords' reader in eval mode (records in order), repeated: steady state."""
    return _imagerecords(records_dir, batch, size, training=False, repeat=True)


def imagerecords_eval_pass(files_root: Path, records_dir: Path, batch: int, size: int) -> Pipeline:
    """imagerecords' reader in eval mode, one fresh finite pass per epoch."""
    return _imagerecords(records_dir, batch, size, training=False)


def imagerecords_train_uint8(
    files_root: Path, records_dir: Path, batch: int, size: int
) -> Pipeline:
    """The training pipeline with uint8 batches (normalised by the model)."""
    import tensorflow as tf

    return _imagerecords(records_dir, batch, size, training=True, dtype=tf.uint8)


def imagerecords_eval_uint8(files_root: Path, records_dir: Path, batch: int, size: int) -> Pipeline:
    """The evaluation pipeline with uint8 batches (steady state, as ``imagerecords_eval``)."""
    import tensorflow as tf

    return _imagerecords(records_dir, batch, size, training=False, dtype=tf.uint8, repeat=True)


def _decode_floor(records_dir: Path, batch: int, crop: bool) -> Pipeline:
    """Shards -> batch -> parse_example -> decode each record's window (uint8) -> one tensor."""
    import tensorflow as tf

    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }

    def decode(encoded, seed):
        if not crop:
            return tf.io.decode_jpeg(encoded, channels=3)
        return tf.io.decode_and_crop_jpeg(encoded, random_window(encoded, seed), channels=3)

    def decode_batch(serialized, index):
        features = tf.io.parse_example(serialized, spec)
        encoded = features["image/encoded"]
        count = tf.shape(encoded)[0]
        seeds = tf.random.stateless_uniform(
            [count, 2], seed=tf.stack([tf.constant(7, tf.int64), index]), minval=None,
            maxval=None, dtype=tf.int64,
        )  # fmt: skip

        def step(i, pixels, shapes):
            image = decode(encoded[i], seeds[i])
            return (
                i + 1,
                pixels.write(i, tf.reshape(image, [-1])),
                shapes.write(i, tf.shape(image)[:2]),
            )

        _, pixels, shapes = tf.while_loop(
            lambda i, *_: i < count,
            step,
            (
                tf.constant(0),
                tf.TensorArray(tf.uint8, size=count, infer_shape=False, element_shape=[None]),
                tf.TensorArray(tf.int32, size=count, element_shape=[2]),
            ),
            parallel_iterations=batch,
        )
        return shapes.stack(), pixels.concat(), features["image/class/label"]

    auto = tf.data.AUTOTUNE
    ds = tf.data.TFRecordDataset(_train_shards(records_dir), buffer_size=8 << 20).repeat()
    ds = tf.data.Dataset.zip((ds.batch(batch, drop_remainder=True), tf.data.Dataset.counter()))
    ds = ds.map(decode_batch, num_parallel_calls=auto, deterministic=False).prefetch(auto)
    return Pipeline(ds, num_examples(records_dir), True)


def floor_crop_decode(files_root: Path, records_dir: Path, batch: int, size: int) -> Pipeline:
    """The training floor: decode each record's random window, batched, no resize."""
    return _decode_floor(records_dir, batch, crop=True)


def floor_full_decode(files_root: Path, records_dir: Path, batch: int, size: int) -> Pipeline:
    """The evaluation floor: decode each whole image, batched, no resize."""
    return _decode_floor(records_dir, batch, crop=False)


BUILDERS = {
    "keras_dir": keras_dir,
    "tfdata_files": tfdata_files,
    "tfrecord_per_example": tfrecord_per_example,
    "imagerecords_train": imagerecords_train,
    "imagerecords_train_stock": imagerecords_train_stock,
    "imagerecords_train_decoded": imagerecords_train_decoded,
    "imagerecords_eval": imagerecords_eval,
    "imagerecords_eval_pass": imagerecords_eval_pass,
    "imagerecords_train_uint8": imagerecords_train_uint8,
    "imagerecords_eval_uint8": imagerecords_eval_uint8,
    "floor_crop_decode": floor_crop_decode,
    "floor_full_decode": floor_full_decode,
}

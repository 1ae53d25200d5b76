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
  "train", batch_size, image_size=224, training=True|False)``.
* ``imagerecords_train_stock``: the default training pipeline with
  ``native_ops=False``: stock TensorFlow ops flip and resize each image, as on a
  machine where the reader's native op cannot be compiled (no C++ compiler).
* ``imagerecords_train_decoded``: the same training pipeline with
  ``cache="decoded"``: a different mode (the split's decoded pixels are kept in
  RAM after the first epoch, which the warm-up epoch pays for), not the default.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

VARIANTS = (
    "keras_dir",
    "tfdata_files",
    "tfrecord_per_example",
    "imagerecords_train",
    "imagerecords_train_stock",
    "imagerecords_train_decoded",
    "imagerecords_eval",
)
LABELS = {
    "keras_dir": "keras image_dataset_from_directory (files)",
    "tfdata_files": "hand-written tf.data over files",
    "tfrecord_per_example": "TFRecord, per-example parse (tutorial)",
    "imagerecords_train": "imagerecords reader, training (augment)",
    "imagerecords_train_stock": "imagerecords reader, training, stock TF ops (no C++ compiler)",
    "imagerecords_train_decoded": "imagerecords reader, training, cache=decoded (RAM)",
    "imagerecords_eval": "imagerecords reader, eval",
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
    from bench.data import list_images

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


def _num_examples(records_dir: Path, split: str) -> int:
    import json

    info = json.loads((records_dir / "dataset_info.json").read_text())
    return int(info["splits"][split]["num_examples"])


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
    return Pipeline(
        ds.batch(batch).prefetch(tf.data.AUTOTUNE), _num_examples(records_dir, "train"), True
    )


def _imagerecords(records_dir: Path, batch: int, size: int, training: bool, **options) -> Pipeline:
    import reader

    ds = reader.make_dataset(
        str(records_dir), "train", batch_size=batch, image_size=size, training=training, **options
    )
    return Pipeline(ds, _num_examples(records_dir, "train"), training)


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
    """imagerecords' reader in eval mode (each record once, in order)."""
    return _imagerecords(records_dir, batch, size, training=False)


BUILDERS = {
    "keras_dir": keras_dir,
    "tfdata_files": tfdata_files,
    "tfrecord_per_example": tfrecord_per_example,
    "imagerecords_train": imagerecords_train,
    "imagerecords_train_stock": imagerecords_train_stock,
    "imagerecords_train_decoded": imagerecords_train_decoded,
    "imagerecords_eval": imagerecords_eval,
}

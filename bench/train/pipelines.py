"""The loaders of other trainers, timed on the same shards (issue 26; ``bench.train.trainers``).

Each yields ``(images uint8 [B, 224, 224, 3], labels [B])`` training batches:
a random window (8-100% of the area, aspect 3/4-4/3) resized to 224x224 and
flipped half the time, from the same converted web set.

* ``reader_uint8``: this project's tf.data reader, ``reader.make_dataset(...,
  training=True, dtype=tf.uint8)`` (its native crop-resize op).
* ``tfds_as_dataset``: TFDS as big_vision uses it: ``builder_from_directory``
  on the converted folder itself (the converter writes TFDS's metadata files
  beside the shards), ``as_dataset(shuffle_files=True)`` with the image left
  encoded, then ``decode_and_crop_jpeg`` of a sampled window,
  ``resize``, flip, batch, prefetch.
* ``grain_source``: Grain over ``imagerecords.RecordSource`` (``parse=False``):
  a global shuffle, ``imagerecords.transforms.train_crop`` (the reader's window and resize
  without TensorFlow, docs/trainers.md), batch, on one worker process per
  core (``mp_prefetch``), each computing one batch at a time.
* ``grain_threads``: the same pipeline in the loader's own process, one read
  thread per core (``ReadOptions``): simplejpeg and OpenCV release the GIL
  while they work, so the threads decode in parallel and no batch crosses
  between processes.

PyTorch's ``DataLoader`` is not timed: torch is not installed; over the same
source it runs the same ``train_crop`` in its worker processes.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from bench.read.pipelines import Pipeline
from imagerecords.codec import INFO_FILE

VARIANTS = ("reader_uint8", "tfds_as_dataset", "grain_source", "grain_threads")
LABELS = {
    "reader_uint8": "imagerecords tf.data reader, uint8 batches",
    "tfds_as_dataset": "TFDS builder_from_directory + as_dataset, decode_and_crop_jpeg",
    "grain_source": "Grain MapDataset over RecordSource + imagerecords.transforms.train_crop, "
    "a worker process per core",
    "grain_threads": "the same Grain pipeline, a read thread per core in one process",
}
SHUFFLE_SEED = 0


def _num_examples(records_dir: Path, split: str = "train") -> int:
    info = json.loads((records_dir / INFO_FILE).read_text())
    return int(info["splits"][split]["num_examples"])


def reader_uint8(records_dir: Path, batch: int, size: int) -> Pipeline:
    import tensorflow as tf

    import reader

    ds = reader.make_dataset(
        str(records_dir), "train", batch_size=batch, image_size=size, training=True, dtype=tf.uint8
    )
    return Pipeline(ds, _num_examples(records_dir), True)


def tfds_as_dataset(records_dir: Path, batch: int, size: int) -> Pipeline:
    import tensorflow as tf
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(records_dir))  # TFDS's files are beside ours
    ds = builder.as_dataset(
        split="train",
        shuffle_files=True,
        decoders={"image": {"encoded": tfds.decode.SkipDecoding()}},
        read_config=tfds.ReadConfig(shuffle_seed=SHUFFLE_SEED),
    )
    whole = tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4])

    def crop(example):
        encoded = example["image"]["encoded"]
        begin, extent, _ = tf.image.sample_distorted_bounding_box(
            tf.io.extract_jpeg_shape(encoded),
            whole,
            min_object_covered=0.1,
            aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        window = tf.stack([begin[0], begin[1], extent[0], extent[1]])
        image = tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
        image = tf.image.random_flip_left_right(tf.image.resize(image, (size, size)))
        return tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8), example["image"]["class"][
            "label"
        ]

    auto = tf.data.AUTOTUNE
    ds = ds.repeat().shuffle(1024, seed=SHUFFLE_SEED).map(crop, num_parallel_calls=auto)
    return Pipeline(
        ds.batch(batch, drop_remainder=True).prefetch(auto), _num_examples(records_dir), True
    )


@functools.cache
def _one_opencv_thread() -> None:
    """OpenCV spreads each resize over its own thread pool: for one small image per call,
    beside the loader's own threads or processes, that costs more than it saves (5%
    of the threaded Grain row's CPU per image); docs/trainers.md tells loaders so."""
    import cv2

    cv2.setNumThreads(1)


def grain_crop(record, rng, size):
    """Top-level (so Grain's worker processes can unpickle it): the transform timed."""
    from imagerecords.transforms import train_crop

    _one_opencv_thread()
    return train_crop(record, rng, size)


def as_pair(batch):
    return batch["image"], batch["label"]


def _grain_batches(records_dir: Path, batch: int, size: int):
    """The Grain pipeline of both Grain rows, up to the batches: ``(MapDataset, records)``."""
    import grain

    from imagerecords import RecordSource

    # The serialized records: train_crop parses only the JPEG and the label.
    source = RecordSource(str(records_dir), "train", parse=False)
    ds = (
        grain.MapDataset.source(source)
        .shuffle(seed=SHUFFLE_SEED)
        .repeat()
        .random_map(functools.partial(grain_crop, size=size), seed=SHUFFLE_SEED)
        .batch(batch, drop_remainder=True)
        .map(as_pair)
    )
    return ds, len(source)


def grain_source(records_dir: Path, batch: int, size: int) -> Pipeline:
    import grain

    ds, records = _grain_batches(records_dir, batch, size)
    # One batch at a time in each worker: more read threads there only contend
    # for the worker's GIL (Grain's default of 16 cost a quarter more CPU).
    ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=1))
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=os.cpu_count() or 1))
    return Pipeline(ds, records, True)


def grain_threads(records_dir: Path, batch: int, size: int) -> Pipeline:
    import grain

    ds, records = _grain_batches(records_dir, batch, size)
    threads = os.cpu_count() or 1
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=threads)
    return Pipeline(ds.to_iter_dataset(options), records, True)


BUILDERS = {
    "reader_uint8": reader_uint8,
    "tfds_as_dataset": tfds_as_dataset,
    "grain_source": grain_source,
    "grain_threads": grain_threads,
}

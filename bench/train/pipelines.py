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
* ``grain_workers``: ``imagerecords.grain.dataset`` (what a JAX loop
  iterates: the permutation per epoch, ``imagerecords.transforms.train_crop``
  with its draws from the seed, whole batches made in ``WORKERS`` worker
  processes, handed over in shared memory).
* ``grain_threads``: the same with ``num_workers=0``: a read thread per core
  in the loader's own process (simplejpeg and OpenCV release the GIL), no
  batch crossing between processes.
* ``torch_workers``: ``imagerecords.torch.loader`` with ``WORKERS`` worker
  processes (the same batches as the Grain rows for a seed), run from the
  torch venv (``.venv-torch``, ``make test-torch`` builds it).
* ``torch_in_process``: the same with ``num_workers=0``.
* ``crop_loop``: no loader: the same records through ``train_crop`` in a plain
  loop on one thread, each image written into its batch's array: what every
  loader above does per image, so the floor of what they can cost.

The in-process rows run one OpenCV thread per process, as docs/trainers.md
advises (the worker rows' workers set it themselves).
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

from bench.read.pipelines import Pipeline, num_examples, random_window

# Worker processes of the rows that have them (the tests' default is 2 as well).
WORKERS = 2
# Batches a worker row's loader can hold made ahead of the loop, per worker: Grain's
# per_worker_buffer_size (1) and its read thread's prefetch (1), and the DataLoader's
# prefetch_factor (2), each with the batch the worker is making. A timed window of
# about this many batches is served from what the warm-up left made, not measured.
AHEAD_BATCHES_PER_WORKER = 3
VARIANTS = (
    "reader_uint8",
    "tfds_as_dataset",
    "grain_workers",
    "grain_threads",
    "torch_workers",
    "torch_in_process",
    "crop_loop",
)
# The rows that need torch: they run in the torch venv (bench.trainers).
TORCH_VARIANTS = frozenset({"torch_workers", "torch_in_process"})
LABELS = {
    "reader_uint8": "imagerecords tf.data reader, uint8 batches",
    "tfds_as_dataset": "TFDS builder_from_directory + as_dataset, decode_and_crop_jpeg",
    "grain_workers": f"imagerecords.grain.dataset, {WORKERS} worker processes",
    "grain_threads": "imagerecords.grain.dataset, num_workers=0 (a read thread per core)",
    "torch_workers": f"imagerecords.torch.loader, {WORKERS} worker processes",
    "torch_in_process": "imagerecords.torch.loader, num_workers=0",
    "crop_loop": "no loader: train_crop in a loop on one thread (the floor)",
}
SHUFFLE_SEED = 0


def batches_ahead() -> int:
    """The most batches any row's loader holds made before the loop asks for them."""
    return WORKERS * AHEAD_BATCHES_PER_WORKER


def reader_uint8(records_dir: Path, batch: int, size: int) -> Pipeline:
    import tensorflow as tf

    import reader

    ds = reader.make_dataset(
        str(records_dir), "train", batch_size=batch, image_size=size, training=True, dtype=tf.uint8
    )
    return Pipeline(ds, num_examples(records_dir), True)


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

    def crop(example):
        encoded = example["image"]["encoded"]
        image = tf.io.decode_and_crop_jpeg(encoded, random_window(encoded), channels=3)
        image = tf.image.random_flip_left_right(tf.image.resize(image, (size, size)))
        return tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8), example["image"]["class"][
            "label"
        ]

    auto = tf.data.AUTOTUNE
    ds = ds.repeat().shuffle(1024, seed=SHUFFLE_SEED).map(crop, num_parallel_calls=auto)
    return Pipeline(
        ds.batch(batch, drop_remainder=True).prefetch(auto), num_examples(records_dir), True
    )


@functools.cache
def _one_opencv_thread() -> None:
    """OpenCV spreads each resize over its own thread pool: for one small image per call,
    beside the loader's own threads, that costs more than it saves (5% of the
    threaded Grain row's CPU per image); docs/trainers.md tells loaders so."""
    import cv2

    cv2.setNumThreads(1)


def _loader_options(batch: int, size: int, workers: int) -> dict:
    """What the Grain and torch rows ask of their loader: the same training batches."""
    return dict(
        batch_size=batch, image_size=size, training=True, seed=SHUFFLE_SEED, num_workers=workers
    )


def _loader_rows(loader_pipeline):
    """The two rows of one loader: ``WORKERS`` worker processes, and none (the work in
    this process, on one OpenCV thread). ``loader_pipeline(records_dir, batch, size,
    workers)`` builds it."""

    def with_workers(records_dir: Path, batch: int, size: int) -> Pipeline:
        return loader_pipeline(records_dir, batch, size, WORKERS)

    def in_process(records_dir: Path, batch: int, size: int) -> Pipeline:
        _one_opencv_thread()
        return loader_pipeline(records_dir, batch, size, 0)

    return with_workers, in_process


def _grain(records_dir: Path, batch: int, size: int, workers: int) -> Pipeline:
    from imagerecords import grain as imagerecords_grain

    ds = imagerecords_grain.dataset(
        str(records_dir), "train", **_loader_options(batch, size, workers)
    )
    return Pipeline(_pairs(ds), num_examples(records_dir), True)


def _pairs(batches):
    """``(images, labels)`` of each batch dict (the worker times pairs); closing it
    closes the loader's iterator (Grain's worker processes and shared memory)."""
    iterator = iter(batches)
    try:
        for batch in iterator:
            yield batch["image"], batch["label"]
    finally:
        getattr(iterator, "close", lambda: None)()


grain_workers, grain_threads = _loader_rows(_grain)


class _Epochs:
    """A torch loader's epochs one after another (``set_epoch`` before each), as pairs."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for epoch in itertools.count():
            self.loader.set_epoch(epoch)
            yield from _pairs(self.loader)


def _torch(records_dir: Path, batch: int, size: int, workers: int) -> Pipeline:
    from imagerecords import torch as imagerecords_torch

    loader = imagerecords_torch.loader(
        str(records_dir), "train", **_loader_options(batch, size, workers)
    )
    return Pipeline(_Epochs(loader), num_examples(records_dir), True)


torch_workers, torch_in_process = _loader_rows(_torch)


class _CropLoop:
    """Every record of the split in turn through ``train_crop``, batch after batch."""

    def __init__(self, records_dir: Path, batch: int, size: int):
        from imagerecords import RecordSource

        self.source = RecordSource(str(records_dir), "train", parse=False)
        self.batch, self.size = batch, size

    def __iter__(self):
        import numpy as np

        from imagerecords import streams, transforms

        records = itertools.cycle(range(len(self.source)))
        for epoch in itertools.count():
            images = np.empty((self.batch, self.size, self.size, 3), np.uint8)
            labels = np.empty(self.batch, np.int64)
            for i, record in zip(range(self.batch), records, strict=False):
                rng = streams.crop_rng(SHUFFLE_SEED, epoch, record)
                crop = transforms.train_crop(self.source[record], rng, self.size, out=images[i])
                labels[i] = crop["label"]
            yield images, labels


def crop_loop(records_dir: Path, batch: int, size: int) -> Pipeline:
    _one_opencv_thread()
    return Pipeline(_CropLoop(records_dir, batch, size), num_examples(records_dir), True)


BUILDERS = {
    "reader_uint8": reader_uint8,
    "tfds_as_dataset": tfds_as_dataset,
    "grain_workers": grain_workers,
    "grain_threads": grain_threads,
    "torch_workers": torch_workers,
    "torch_in_process": torch_in_process,
    "crop_loop": crop_loop,
}

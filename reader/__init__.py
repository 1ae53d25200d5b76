"""imagerecords' reader: a fast ``tf.data`` input from imagerecords shards.

Imports only TensorFlow, the standard library and the format's codec
(``imagerecords.codec``: protobuf, which TensorFlow brings), so a training job
(GPU, TPU) needs neither Beam nor Pillow. See ``docs/reader.md``.

    import reader
    info = reader.load_info("gs://bucket/dataset")
    ds = reader.make_dataset("gs://bucket/dataset", "train", batch_size=256,
                             image_size=224, training=True)
    model.fit(ds, steps_per_epoch=info.steps_per_epoch("train", 256), epochs=90)

The names below are the public front door. Everything else stays importable
from its module: ``reader.info`` (``SplitInfo``, ``ShardInfo``,
``StoredImage``), ``reader.dataset`` (``InputReader``,
``decoded_cache_bytes``), ``reader.parser`` (``Parser``), ``reader.decode`` (``IMAGENET_MEAN``,
``IMAGENET_STD``), ``reader.native`` (``NativeOpsError``) and
``reader.inspect`` (``python -m reader.inspect``).
"""

from reader.allocator import prefer_bfc_cpu_allocator

# Before any TensorFlow op creates the CPU allocator (see reader/allocator.py).
prefer_bfc_cpu_allocator()

from reader.config import AugmentConfig, ReaderConfig  # noqa: E402
from reader.dataset import distributed_dataset, make_dataset  # noqa: E402
from reader.info import (  # noqa: E402
    DatasetInfo,
    DatasetInfoError,
    IncompleteDatasetError,
    UnknownSplitError,
    load_info,
)

__all__ = [
    "AugmentConfig",
    "DatasetInfo",
    "DatasetInfoError",
    "IncompleteDatasetError",
    "ReaderConfig",
    "UnknownSplitError",
    "distributed_dataset",
    "load_info",
    "make_dataset",
]

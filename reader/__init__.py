"""imagerecords' reader: a fast ``tf.data`` input from imagerecords shards.

Imports only TensorFlow and the standard library, so a training job (GPU, TPU)
needs neither Beam nor Pillow. See ``docs/reader.md``.

    import reader
    info = reader.load_info("gs://bucket/dataset")
    ds = reader.make_dataset("gs://bucket/dataset", "train", batch_size=256,
                             image_size=224, training=True)
    model.fit(ds, steps_per_epoch=info.steps_per_epoch("train", 256), epochs=90)
"""

from reader.dataset import (
    InputReader,
    ReaderConfig,
    decoded_cache_bytes,
    distributed_dataset,
    make_dataset,
)
from reader.decode import IMAGENET_MEAN, IMAGENET_STD
from reader.info import (
    DatasetInfo,
    DatasetInfoError,
    ImageSpec,
    IncompleteDatasetError,
    ShardInfo,
    SplitInfo,
    UnknownSplitError,
    load_info,
)
from reader.native import NativeOpsError

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DatasetInfo",
    "DatasetInfoError",
    "ImageSpec",
    "IncompleteDatasetError",
    "InputReader",
    "NativeOpsError",
    "ReaderConfig",
    "ShardInfo",
    "SplitInfo",
    "UnknownSplitError",
    "decoded_cache_bytes",
    "distributed_dataset",
    "load_info",
    "make_dataset",
]

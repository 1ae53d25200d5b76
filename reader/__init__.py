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
``reader.inspect`` (``python -m reader.inspect``). Those modules, with
``reader.config``, are ``PUBLIC_MODULES``: a client may import their names
without a leading underscore and expect to keep them; the other modules are
the package's inside.
"""

import importlib
import importlib.util

from reader.allocator import prefer_bfc_cpu_allocator

# Before any TensorFlow op creates the CPU allocator (see reader/allocator.py).
prefer_bfc_cpu_allocator()

# The public names and their modules, imported (TensorFlow with them) on first
# use: `python -m reader.inspect` imports this package first, and checks its
# arguments before TensorFlow takes seconds to load.
_EXPORTS = {
    "AugmentConfig": "reader.config",
    "ReaderConfig": "reader.config",
    "distributed_dataset": "reader.dataset",
    "make_dataset": "reader.dataset",
    "DatasetInfo": "reader.info",
    "DatasetInfoError": "reader.info",
    "IncompleteDatasetError": "reader.info",
    "UnknownSplitError": "reader.info",
    "load_info": "reader.info",
}

PUBLIC_MODULES = (
    "reader",
    "reader.config",
    "reader.info",
    "reader.dataset",
    "reader.parser",
    "reader.decode",
    "reader.native",
    "reader.inspect",
)


def __getattr__(name: str):
    """A public name, or a submodule (``reader.info``), imported on first use."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = sorted(_EXPORTS)

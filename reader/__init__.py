"""imagerecords' reader: a fast ``tf.data`` input from imagerecords shards.

Imports only TensorFlow, the standard library and ``imagerecords.codec``, so a
training job needs neither Beam nor Pillow (docs/reader.md)::

    ds = reader.make_dataset("gs://bucket/dataset", "train", batch_size=256,
                             image_size=224, training=True)

The names below are the front door; ``PUBLIC_MODULES`` the modules a client may
import from.
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

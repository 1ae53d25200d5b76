"""Read imagerecords datasets without TensorFlow or Beam: a random-access source.

``RecordSource(dataset, split)`` is what Grain and PyTorch map-style datasets ask for
(docs/trainers.md). Needs ``protobuf``, ``google-crc32c`` and, for ``gs://``,
``google-cloud-storage``; ``PUBLIC_MODULES`` names the modules a client may import from.
"""

from imagerecords.info import DatasetNotFoundError, UnknownSplitError, find_info
from imagerecords.source import CorruptRecordError, IndexFileError, RecordSource

PUBLIC_MODULES = (
    "imagerecords",
    "imagerecords.codec",
    "imagerecords.transforms",
    "imagerecords.grain",
    "imagerecords.torch",
    "imagerecords.streams",
)

__all__ = [
    "CorruptRecordError",
    "DatasetNotFoundError",
    "IndexFileError",
    "RecordSource",
    "UnknownSplitError",
    "find_info",
]

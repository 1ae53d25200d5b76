"""Read imagerecords datasets without TensorFlow or Beam: a random-access source.

``RecordSource(dataset, split)`` is what Grain and PyTorch map-style datasets ask for
(docs/trainers.md). Needs ``protobuf``, ``google-crc32c`` and, for ``gs://``,
``google-cloud-storage``; ``PUBLIC_MODULES`` names the modules a client may import from.
A dataset that cannot be read as it is raises ``DatasetError``, one line naming the file.
"""

from imagerecords.info import DatasetNotFoundError, UnknownSplitError, find_info
from imagerecords.source import CorruptRecordError, IndexFileError, RecordSource
from imagerecords.trust import DatasetError

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
    "DatasetError",
    "DatasetNotFoundError",
    "IndexFileError",
    "RecordSource",
    "UnknownSplitError",
    "find_info",
]

"""Read imagerecords datasets without TensorFlow or Beam: a random-access source.

``RecordSource(dataset, split)`` has a length and returns record ``i`` parsed
into a dict (image bytes, label, file name, ...). It is what Grain's
``MapDataset.source`` / ``DataLoader`` and PyTorch's map-style ``Dataset``
protocol ask for; docs/trainers.md shows both.

Importing this package loads neither TensorFlow nor Apache Beam: it needs
``protobuf``, ``google-crc32c`` and, for ``gs://``, ``google-cloud-storage``.
"""

from imagerecords.info import DatasetNotFoundError, UnknownSplitError, find_info
from imagerecords.source import CorruptRecordError, IndexFileError, RecordSource

__all__ = [
    "CorruptRecordError",
    "DatasetNotFoundError",
    "IndexFileError",
    "RecordSource",
    "UnknownSplitError",
    "find_info",
]

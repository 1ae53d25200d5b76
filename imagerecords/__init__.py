"""Read imagerecords datasets without TensorFlow or Beam: a random-access source.

``RecordSource(dataset, split)`` has a length and returns record ``i`` parsed
into a dict (image bytes, label, file name, ...). It is what Grain's
``MapDataset.source`` / ``DataLoader`` and PyTorch's map-style ``Dataset``
protocol ask for; docs/trainers.md shows both.

Importing this package loads neither TensorFlow nor Apache Beam: it needs
``protobuf``, ``google-crc32c`` and, for ``gs://``, ``google-cloud-storage``.

``PUBLIC_MODULES`` are the modules whose names without a leading underscore
a client may import and expect to keep: this package's names below, the
format's codec (``imagerecords.codec``: the TFRecord framing, the Example
schema, the published file names), the training and evaluation crops
(``imagerecords.transforms``), the two loaders (``imagerecords.grain``,
``imagerecords.torch``; docs/trainers.md) and what they share, for a loader
of one's own: each host's records per epoch and each crop's random numbers
(``imagerecords.streams``).

Every error of a dataset that cannot be read as it is (a name leading out of
its folder, a number out of range, a damaged record) is a ``DatasetError``,
one line naming the file (``imagerecords.trust``).
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

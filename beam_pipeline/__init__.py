"""imagerecords' Apache Beam job: image folders -> shuffled, split TFRecord shards.

Imports no TensorFlow (docs/format.md section 1). Run it with ``python -m beam_pipeline``.
"""

__version__ = "0.1.0"

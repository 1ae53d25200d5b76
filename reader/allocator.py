"""Makes TensorFlow's CPU allocator reuse memory (BFC) unless the user chose otherwise.

Set on ``import reader``, before TensorFlow creates its CPU allocator; a value the
user set, even ``false``, is left alone. Why: docs/reader.md, "Performance notes".
"""

from __future__ import annotations

import os

ENV = "TF_CPU_ALLOCATOR_USE_BFC"


def prefer_bfc_cpu_allocator() -> None:
    """Sets ``TF_CPU_ALLOCATOR_USE_BFC=true`` unless it is set already."""
    os.environ.setdefault(ENV, "true")

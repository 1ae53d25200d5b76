"""Makes TensorFlow's CPU allocator reuse memory (BFC) unless the user chose otherwise.

A training batch is large (128 x 224 x 224 x 3 float32 = 77 MB). TensorFlow's
default CPU allocator takes every such block from ``malloc``, which serves
anything over 32 MB with a fresh ``mmap``: the kernel then faults in and
zeroes every page of every batch, and takes them back on ``free``
(docs/performance.md, "Measurements behind code choices", has the measurement).
TensorFlow's BFC allocator
(``TF_CPU_ALLOCATOR_USE_BFC``, the one it uses on GPUs) keeps the blocks and
hands them out again, so the pages are touched once per process.

TensorFlow reads the variable when it creates its CPU allocator (the first op
or device query), not at import, so setting it when ``reader`` is imported
works as long as no TensorFlow op has run yet. A value the user set, even
``false``, is left alone. The cost: memory a pipeline once used stays with the
process (the BFC allocator does not give it back).
"""

from __future__ import annotations

import os

ENV = "TF_CPU_ALLOCATOR_USE_BFC"


def prefer_bfc_cpu_allocator() -> None:
    """Sets ``TF_CPU_ALLOCATOR_USE_BFC=true`` unless it is set already."""
    os.environ.setdefault(ENV, "true")

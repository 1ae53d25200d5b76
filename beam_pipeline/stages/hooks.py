"""What the conversion path offers a feature (features/): steps over the converted
batches, and blocks that Finalize publishes. The path knows no feature by name;
engines/ pass each its features (docs/architecture.md, "Features")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple


class Block(NamedTuple):
    """What a feature publishes beside the records: imagerecords.json's ``name`` block,
    made once the dataset's splits are known (None: left out), and the files it
    writes with the lists (name -> bytes, before the books are checked)."""

    name: str
    info: Callable[[Sequence[str]], dict | None]
    files: tuple[tuple[str, bytes], ...] = ()


def fixed(name: str, info: dict | None, files: tuple[tuple[str, bytes], ...] = ()) -> Block:
    """A block whose content does not depend on the splits."""
    return Block(name, lambda _splits: info, files)


class LocalStep(NamedTuple):
    """A feature's step over every converted batch, in the local engine.

    ``run(config, batches, counted)`` -> (the batches kept, a Rejection per record
    dropped, the feature's result); ``blocks(config, results)`` -> its Blocks, from
    the results of every step by name (a feature may read another's).
    """

    name: str
    run: Callable[[Any, list, Any], tuple[list, list, Any]]
    blocks: Callable[[Any, Mapping[str, Any]], list[Block]]


class BeamStep(NamedTuple):
    """The same step in the Beam graph.

    ``transform(config)``: a PTransform of RecordBatch -> {"batches", "rejected",
    ``result``}; Finalize takes ``result`` as a side input through ``side``
    (``AsList`` or ``AsSingleton``), then calls ``blocks`` as the local step's.
    """

    name: str
    transform: Callable[[Any], Any]
    result: str
    side: Callable[[Any], Any]
    blocks: Callable[[Any, Mapping[str, Any]], list[Block]]

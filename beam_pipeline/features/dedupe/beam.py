"""The Beam graph's exact dedupe step (``pipeline.build`` runs it first after ConvertImages).

``FindDuplicates``: RecordBatch -> the groups of identical sources; with --dedupe
also the batches without the copies and a Rejection per copy.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsDict, AsList, TaggedOutput

from beam_pipeline.core import counters
from beam_pipeline.core.elements import RecordBatch
from beam_pipeline.features.dedupe import feature, stage
from beam_pipeline.stages.hooks import BeamStep

REJECTED = "rejected"


class _DropDuplicates(beam.DoFn):
    """RecordBatch -> RecordBatch without the copies --dedupe drops + a Rejection per copy."""

    def __init__(self):
        self._dropped = Metrics.counter(counters.NAMESPACE, counters.DROPPED_AS_DUPLICATES)

    def process(self, batch: RecordBatch, drops: dict[str, str]):
        kept, copies = stage.drop_copies(batch, drops)
        for rejection in copies:
            self._dropped.inc()
            yield TaggedOutput(REJECTED, rejection)
        if kept.entries:
            yield kept


class FindDuplicates(beam.PTransform):
    """RecordBatch -> groups of identical sources (``groups``); with dedupe, the records kept.

    Outputs ``groups``: (sha256, [Member]) for every hash held by two or more
    images; ``batches``: the records to plan and write (all of them without
    dedupe); ``rejected``: the dropped copies (empty without dedupe).
    """

    def __init__(self, dedupe: bool):
        super().__init__()
        self._dedupe = dedupe

    def expand(self, batches):
        groups = (
            batches
            # RecordBatch -> (sha256, Member)
            | "HashAndMember" >> beam.FlatMap(stage.members)
            | "MembersPerHash" >> beam.CombinePerKey(beam.combiners.ToListCombineFn())
            # (sha256, [Member]) with at least two members
            | "OnlyDuplicates" >> beam.Filter(stage.is_group)
        )
        if not self._dedupe:
            empty = batches.pipeline | "NoDrops" >> beam.Create([], reshuffle=False)
            return {"groups": groups, "batches": batches, "rejected": empty}
        drops = groups | "CopiesToDrop" >> beam.FlatMap(stage.copies)
        kept = batches | "DropCopies" >> beam.ParDo(
            _DropDuplicates(), drops=AsDict(drops)
        ).with_outputs(REJECTED, main="batches")
        return {"groups": groups, "batches": kept.batches, "rejected": kept[REJECTED]}


def _transform(config) -> FindDuplicates:
    return FindDuplicates(config.dedupe)


BEAM = BeamStep(feature.NAME, _transform, "groups", AsList, feature.blocks)

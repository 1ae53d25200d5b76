"""The Beam graph's Near duplicates stage (``pipeline.build`` wires it after FindDuplicates).

``FindNearDuplicates``: RecordBatch -> the groups, the oversized buckets and how many
were left out for lack of texture (``found``); with --dedupe near also the batches
without the copies and a Rejection per copy. The steps are ``stage.py``'s,
gathered with ``GroupByKey``.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsList, AsSingleton, TaggedOutput

from beam_pipeline.core import counters
from beam_pipeline.core.elements import RecordBatch
from beam_pipeline.features.near import feature
from beam_pipeline.features.near import search as near_search
from beam_pipeline.features.near import stage as near
from beam_pipeline.stages.hooks import BeamStep

OVERSIZED = "oversized"
TWINS = "twins"
REJECTED = "rejected"


class _TwinsFn(beam.DoFn):
    """(fingerprint, [Member]) -> (fingerprint, its first Member); a PairRow per
    other Member on ``twins``."""

    def process(self, item):
        first, joined = near.twins(item)
        for pair in joined:
            yield TaggedOutput(TWINS, near.to_row(pair))
        yield first


class _BucketFn(beam.DoFn):
    """(band key, [Entry]) -> a PairRow per verified pair; an Oversized bucket on
    ``oversized``."""

    def process(self, item):
        result = near.bucket(item)
        if isinstance(result, near_search.Oversized):
            yield TaggedOutput(OVERSIZED, tuple(result))
            return
        for pair in result:
            yield near.to_row(pair)


def _found(pairs, oversized, untextured: int) -> near.Found:
    return near.found_of(
        [near.from_row(row) for row in pairs],
        [near_search.Oversized(*o) for o in oversized],
        untextured,
    )


class _DropNearFn(beam.DoFn):
    """RecordBatch -> RecordBatch without the near copies + a Rejection per copy."""

    def __init__(self):
        self._dropped = Metrics.counter(counters.NAMESPACE, counters.DROPPED_AS_NEAR)

    def process(self, batch: RecordBatch, found: near.Found):
        kept, copies = near.drop_near(batch, near_search.dropped(found.groups))
        for rejection in copies:
            self._dropped.inc()
            yield TaggedOutput(REJECTED, rejection)
        if kept.entries:
            yield kept


def _count_pairs(found: near.Found) -> near.Found:
    pairs = sum(len(g.pairs) for g in found.groups)
    if pairs:  # (a counter never counted is absent, as the local engine's Counter has it)
        Metrics.counter(counters.NAMESPACE, counters.NEAR_PAIRS).inc(pairs)
    return found


class FindNearDuplicates(beam.PTransform):
    """RecordBatch -> {"found": one near.Found, "batches", "rejected"}.

    Without --dedupe near, ``batches`` are the input and ``rejected`` is empty.
    """

    def __init__(self, dedupe_near: bool):
        super().__init__()
        self._dedupe_near = dedupe_near

    def expand(self, batches):
        firsts = (
            batches
            # RecordBatch -> (fingerprint, Member), one per record
            | "Fingerprints" >> beam.FlatMap(near.fingerprints)
            | "GroupByFingerprint" >> beam.GroupByKey()
            # -> (fingerprint, its first Member); PairRow per copy on "twins"
            | "FirstOfTwins" >> beam.ParDo(_TwinsFn()).with_outputs(TWINS, main="firsts")
        )
        buckets = (
            firsts.firsts
            # (fingerprint, Member) -> (band key, Entry), one per band
            | "BandKeys" >> beam.FlatMap(near.keyed)
            | "GroupByBandKey" >> beam.GroupByKey()
            | "VerifyBucket" >> beam.ParDo(_BucketFn()).with_outputs(OVERSIZED, main="pairs")
        )
        pairs = (
            (buckets.pairs, firsts[TWINS])
            | "AllPairs" >> beam.Flatten()
            | "DistinctPairs" >> beam.Distinct()
        )
        # Per batch, its fingerprints the search leaves out (no texture).
        untextured = batches | "Untextured" >> beam.FlatMap(
            lambda b: [n] if (n := near.untextured(b)) else []
        )
        # One element that takes the pairs, the oversized buckets and the
        # counts as side inputs: a list even when empty, without
        # CombineGlobally's KeyWithVoid.
        found = (
            batches.pipeline
            | "OneSearch" >> beam.Create([None], reshuffle=False)
            | "Groups"
            >> beam.Map(
                lambda _, rows, oversized, left_out: _count_pairs(
                    _found(rows, oversized, sum(left_out))
                ),
                AsList(pairs),
                AsList(buckets[OVERSIZED]),
                AsList(untextured),
            )
        )
        if not self._dedupe_near:
            empty = batches.pipeline | "NoNearDrops" >> beam.Create([], reshuffle=False)
            return {"found": found, "batches": batches, "rejected": empty}
        kept = batches | "DropNearCopies" >> beam.ParDo(
            _DropNearFn(), found=AsSingleton(found)
        ).with_outputs(REJECTED, main="batches")
        return {"found": found, "batches": kept.batches, "rejected": kept[REJECTED]}


def _transform(config) -> FindNearDuplicates:
    return FindNearDuplicates(config.dedupe_near)


BEAM = BeamStep(feature.NAME, _transform, "found", AsSingleton, feature.blocks)

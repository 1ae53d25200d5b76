"""The Beam graph's part of --reuse: ``MatchOld`` pairs each listed image with OLD's
record of its ID (``pipeline.ConvertImages`` runs it before converting)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from beam_pipeline.core import counters
from beam_pipeline.features.reuse import scan
from beam_pipeline.features.reuse import stage as reuse


def _pair_with_old(element):
    """(image ID, {"ref": [ImageRef], "old": [OldRecord]}) -> reuse.Candidate per ref."""
    _, found = element
    olds = list(found["old"])
    for ref in found["ref"]:
        yield reuse.Candidate(ref, olds[0] if olds else None)


class _ScanOldShard(beam.DoFn):
    """scan.OldShard -> (image ID, OldRecord) per record, once the shard passed its
    check; a shard that failed counts its records as distrusted."""

    def __init__(self):
        super().__init__()
        self._distrusted = Metrics.counter(counters.NAMESPACE, counters.OLD_DISTRUSTED)

    def process(self, shard):
        scanned = scan.scan_records(scan.OldShard(*shard))
        if scanned.distrusted:
            self._distrusted.inc(scanned.distrusted)
            scan.warn(scanned.problem)
        yield from scanned.records


class MatchOld(beam.PTransform):
    """ImageRef -> reuse.Candidate: each image with --reuse's record of its ID, if any.

    OLD's shards are scanned on the workers, one element per shard (nothing of
    OLD passes through the launching machine), and joined to the listed
    images by ID: ~150 bytes an image through the shuffle, not the records,
    which the conversion step reads from OLD only for the images unchanged.
    """

    def __init__(self, old: reuse.OldDataset):
        super().__init__()
        self._old = old

    def expand(self, refs):
        old = (
            refs.pipeline
            | "OldShards" >> beam.Create(list(self._old.shards), reshuffle=False)
            | "SpreadShards" >> beam.Reshuffle()
            # (shard, bytes) -> (image ID, OldRecord) per record
            | "ScanShard" >> beam.ParDo(_ScanOldShard())
        )
        by_id = refs | "ById" >> beam.Map(lambda ref: (ref.image_id, ref))
        return (
            {"ref": by_id, "old": old}
            | "JoinById" >> beam.CoGroupByKey()
            | "PairWithOld" >> beam.FlatMap(_pair_with_old)
        )

"""The Beam graph: one composite PTransform per stage (docs/format.md sections 2-7).

ListImages      PBegin -> ImageRef ("refs") + listed keys + Skipped + group census
ConvertImages   ImageRef -> RecordBatch + Rejection; with --reuse MatchOld first
STEPS           the features' steps over RecordBatch (features/: dedupe, near)
PlanShards      {RecordBatch, listed, Rejection} -> (split, SplitPlan)
WriteShards     RecordBatch + plans -> WrittenShard of a temp file
Finalize        side inputs -> the lists, labels.txt, imagerecords.json (last)

The pooled and the shuffle path share it (docs/scale.md, "Two paths through one graph").
"""

from __future__ import annotations

import functools
import logging
import time

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsDict, AsList, AsSingleton, TaggedOutput
from apache_beam.transforms.window import GlobalWindows

from beam_pipeline.core import counters, groups
from beam_pipeline.core.elements import (
    Converted,
    ImageRef,
    Origin,
    Outcome,
    RecordBatch,
    Rejection,
    ShardEntry,
)
from beam_pipeline.engines import local_pool, pooled, progress
from beam_pipeline.features.dedupe import beam as dedupe_beam
from beam_pipeline.features.near import beam as near_beam
from beam_pipeline.features.reuse import beam as reuse_beam
from beam_pipeline.features.reuse import feature as reuse_feature
from beam_pipeline.features.reuse import stage as reuse
from beam_pipeline.stages import list_images, outcomes, plan
from beam_pipeline.stages.convert import SpillTask, convert_ref
from beam_pipeline.stages.finalize import Finalizer, groups_block
from beam_pipeline.stages.job_config import JobConfig
from beam_pipeline.stages.shards import by_shard
from beam_pipeline.stages.staging import write_staged_shard
from beam_pipeline.storage import discovery, listing

REJECTED = "rejected"
GROUPS = "groups"
REUSED = "reused"
LISTED = "listed"
SKIPPED = "skipped"
_LOG_EVERY_S = 15.0  # progress line per converting worker

log = logging.getLogger(__name__)

# The features' steps over the converted batches, in the order they run (hooks.BeamStep).
STEPS = (
    dedupe_beam.BEAM,
    near_beam.BEAM,
)


def _counter(name: str):
    """The Beam metric of one of core/counters.py's counters."""
    return Metrics.counter(counters.NAMESPACE, name)


# --------------------------------------------------------------------- listing


class _ListFn(beam.DoFn):
    """ClassFolder or manifest path -> ImageRef; (split, KeyTally) of listed keys on
    ``listed``; Skipped (a file that is clearly not an image) on ``skipped``; the
    source's groups.Census on ``groups`` (list_images.list_source)."""

    def __init__(self, config: JobConfig):
        self._args = (config.layout, config.seed, config.splits, config.group_by)
        self._listed = _counter(counters.LISTED)

    def process(self, source):
        layout, seed, splits, group_by = self._args
        for row in list_images.list_source(layout, source, seed, splits, group_by):
            if isinstance(row, ImageRef):
                yield row
            elif isinstance(row, listing.Skipped):
                yield TaggedOutput(SKIPPED, row)
            elif isinstance(row, groups.Census):
                yield TaggedOutput(GROUPS, row)
            else:
                self._listed.inc(len(row.tally.listed))
                yield TaggedOutput(LISTED, tuple(row))


class ListImages(beam.PTransform):
    """PBegin -> {"refs": ImageRef with its split, "listed": (split, KeyTally), "skipped",
    "groups": the census of all sources, one element}."""

    def __init__(self, config: JobConfig):
        super().__init__()
        self._config = config

    def expand(self, pbegin):
        layout = self._config.layout
        pooled = self._config.conversion_processes > 1
        if layout.kind == "manifest":
            # one worker streams the file; conversion fans out below
            sources = pbegin | "ManifestPath" >> beam.Create([layout.manifest], reshuffle=False)
        else:
            # Create's own Reshuffle would cost a shuffle stage; SpreadFolders
            # below redistributes where there is more than one worker.
            sources = pbegin | "ClassFolders" >> beam.Create(list(layout.folders), reshuffle=False)
            if not pooled:
                # ClassFolder, one per worker: folders are listed in parallel
                sources = sources | "SpreadFolders" >> beam.Reshuffle()
        listed = sources | "ListFolder" >> beam.ParDo(_ListFn(self._config)).with_outputs(
            LISTED, SKIPPED, GROUPS, main="refs"
        )
        # One key, not CombineGlobally: every source sends a census, so one always
        # comes out without the steps CombineGlobally adds for an empty input.
        census = (
            listed[GROUPS]
            | "CensusKey" >> beam.Map(lambda census: (GROUPS, census))
            | "GroupCensus" >> beam.CombinePerKey(_CensusFn())
            | "CensusOnly" >> beam.Values()
        )
        refs = listed.refs
        if not pooled:
            # ImageRef, redistributed so that conversion is not fused to the listing worker;
            # (one local runner process: the conversion pool fans out instead)
            refs = refs | "SpreadImages" >> beam.Reshuffle()
        return {"refs": refs, LISTED: listed[LISTED], SKIPPED: listed[SKIPPED], GROUPS: census}


class _CensusFn(beam.CombineFn):
    """groups.Census of each source -> the census of all (merged in any order)."""

    def create_accumulator(self):
        return groups.Census()

    def add_input(self, accumulator, census):
        return accumulator.merge(census)

    def merge_accumulators(self, accumulators):
        return groups.merged(accumulators)

    def extract_output(self, accumulator):
        return accumulator


# ------------------------------------------------------------------ conversion


class _Batcher:
    """Collects converted records per split into RecordBatches of bounded size."""

    MAX_ENTRIES = 2048  # spill references: ~100 KB of element
    MAX_BYTES = 4 * 2**20  # record bytes that travel with the element

    def __init__(self):
        self._open: dict[str, tuple[list[ShardEntry], int]] = {}

    def add(self, converted: Converted) -> RecordBatch | None:
        split, entry = converted
        entries, size = self._open.get(split) or ([], 0)
        entries.append(entry)
        if isinstance(entry.data, bytes):
            size += entry.size
        if len(entries) >= self.MAX_ENTRIES or size >= self.MAX_BYTES:
            self._open.pop(split, None)
            return RecordBatch(split, tuple(entries))
        self._open[split] = (entries, size)
        return None

    def flush(self) -> list[RecordBatch]:
        batches = [RecordBatch(split, tuple(entries)) for split, (entries, _) in self._open.items()]
        self._open = {}
        return batches


def _candidate(element) -> tuple[ImageRef, reuse.OldRecord | None]:
    """(ImageRef, OLD's record or None) of a conversion step's element (an ImageRef, or
    a reuse.Candidate under --reuse), whatever tuple type the runner's coder gives."""
    if isinstance(element, reuse.Candidate):
        return ImageRef(*element.ref), element.old
    return ImageRef(*element), None


class _ConvertFn(beam.DoFn):
    """ImageRef -> RecordBatch, or Rejection on the ``rejected`` output; converts inline.

    Under --reuse the elements are reuse.Candidates, and each bundle sends the
    number of records it took from OLD to the ``reused`` output (exact, unlike
    a metric: a retried bundle's outputs are dropped with it).

    ``shown``: where the progress goes when the step runs in the launching
    process (DirectRunner ``in_memory``): the local engine's ``converting``
    phase, with the total :func:`discovery.estimate_image_count` finds, the
    percentage and the time left. None elsewhere (a worker sees only its own
    part): a plain log line of its count now and then.
    """

    def __init__(self, config: JobConfig, shown: progress.Reporter | None = None):
        self._args = (config.image, config.seed, config.layout.classes)
        self._counters = {name: _counter(name) for name in counters.MEANING}
        self._layout = config.layout
        # (Beam pickles the step: the reporter's stream is found again in setup.)
        self._show = None if shown is None else (shown.enabled, shown.interactive)

    def setup(self):
        self._count = 0
        self._started = self._last_log = time.monotonic()
        self._phase = None
        if self._show is not None:
            # Counted here before the first image (0 where it cannot count, a
            # gs:// input), so every line has its total.
            total = discovery.estimate_image_count(self._layout) or None
            self._phase = progress.converting_line(*self._show, total)

    def teardown(self):
        if getattr(self, "_phase", None) is not None:
            progress.close_converting_line(self._phase)
            self._phase = None

    def start_bundle(self):
        self._batcher = _Batcher()
        self._reused = 0

    def process(self, element):
        ref, old = _candidate(element)
        yield from self._emit(convert_ref(ref, *self._args, old, reuse_feature.take_or_convert))

    def _emit(self, outcome: Outcome, how: Origin = Origin.CONVERTED):
        """Counts an outcome; yields a Rejection (tagged) or, when one is full, a batch."""
        counted = outcomes.counts(outcome, how)
        for name, count in counted.items():
            self._counters[name].inc(count)
        if self._phase is not None:
            progress.count_converted(self._phase, counted)
        result = outcome.result
        if isinstance(result, Rejection):
            yield TaggedOutput(REJECTED, result)
            return
        self._reused += outcome.reused
        if how is not Origin.RESUMED and self._phase is None:
            self._count += 1
            now = time.monotonic()
            if now - self._last_log >= _LOG_EVERY_S:
                rate = self._count / (now - self._started)
                log.info("converted %d images so far (%.1f images/s)", self._count, rate)
                self._last_log = now
        batch = self._batcher.add(result)
        if batch is not None:
            yield batch

    def finish_bundle(self):
        for batch in self._batcher.flush():
            yield GlobalWindows.windowed_value(batch)
        if self._reused:
            yield TaggedOutput(REUSED, GlobalWindows.windowed_value(self._reused))


class _PooledConvertFn(_ConvertFn):
    """Like _ConvertFn, but spreads the images over local worker processes that spill.

    For runners that execute a bundle in one process (DirectRunner in_memory),
    this is what uses every core: the Beam graph stays in one process with no
    gRPC hops, and only the codec work moves to the pool
    (:class:`pooled.PoolConverter`, which the local engine uses too).
    """

    def __init__(
        self,
        config: JobConfig,
        processes: int,
        pool: local_pool.Pool | None = None,
        shown: progress.Reporter | None = None,
    ):
        super().__init__(config, shown)
        self._processes = processes
        self._task = SpillTask.of(config, reuse_feature.take_or_convert)
        self._pool = pool  # pickled as a handle: the same Pool in this process

    def setup(self):
        super().setup()
        self._converter = pooled.PoolConverter(self._task, self._processes, self._pool)

    def _emit_all(self, finished):
        for outcome, how in finished:
            yield from self._emit(outcomes.interned(outcome), how)

    def start_bundle(self):
        super().start_bundle()
        self._converter.start()

    def process(self, element):
        yield from self._emit_all(self._converter.add(*_candidate(element)))

    def finish_bundle(self):
        for output in self._emit_all(self._converter.finish()):
            if isinstance(output, TaggedOutput):
                yield TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))
            else:
                yield GlobalWindows.windowed_value(output)
        yield from super().finish_bundle()

    def teardown(self):
        super().teardown()
        converter = getattr(self, "_converter", None)
        if converter is not None:
            converter.close()


class ConvertImages(beam.PTransform):
    """ImageRef -> RecordBatch, with Rejection on the ``rejected`` output (and, under
    --reuse, per bundle the number of records taken from OLD on ``reused``)."""

    def __init__(
        self,
        config: JobConfig,
        pool: local_pool.Pool | None = None,
        shown: progress.Reporter | None = None,
    ):
        super().__init__()
        self._config = config
        self._pool = pool
        self._shown = shown

    def expand(self, refs):
        processes = self._config.conversion_processes
        fn = (
            _PooledConvertFn(self._config, processes, self._pool, self._shown)
            if processes > 1
            else _ConvertFn(self._config, self._shown)
        )
        if self._config.reuse:
            refs = refs | "MatchOld" >> reuse_beam.MatchOld(
                reuse.open_again(self._config.reuse, self._config.image)
            )
        return refs | "Convert" >> beam.ParDo(fn).with_outputs(REJECTED, REUSED, main="batches")


# ------------------------------------------------------------------ shard plan


class _TallyFn(plan.KeyTallies, beam.CombineFn):
    """KeyTally of one split -> (listed, written, rejected keys, record bytes), all of the
    split (plan.KeyTallies, as a Beam CombineFn)."""


class PlanShards(beam.PTransform):
    """{batches, listed, rejected} -> (split, SplitPlan): the books and shard plan per split.

    Only order keys (8 bytes per image) and sizes come here, batched; the plan
    cuts each split into exactly ``max(min_shards, ceil(bytes/target))``
    non-empty shards by rank of the keys (docs/format.md section 3).
    """

    def __init__(self, config: JobConfig):
        super().__init__()
        self._config = config

    def expand(self, pcolls):
        config = self._config
        return (
            (
                pcolls["listed"],
                pcolls["batches"] | "WrittenKeys" >> beam.Map(plan.written),
                pcolls["rejected"]
                | "RejectedKeys" >> beam.Map(functools.partial(plan.rejected, config.seed)),
            )
            | "AllKeys" >> beam.Flatten()
            # (split, KeyTally) -> (split, (listed, written, rejected keys, bytes))
            | "TallyPerSplit" >> beam.CombinePerKey(_TallyFn())
            # -> (split, SplitPlan)
            | "PlanSplit"
            >> beam.MapTuple(lambda split, tallied: (split, plan.plan(config, split, tallied)))
        )


# --------------------------------------------------------------------- shards


class _WriteShardFn(beam.DoFn):
    """((split, shard), [RecordBatch]) -> WrittenShard of a temp file.

    Consumes the grouped batches once, staging their records on the worker's
    own disk (staging.py): memory holds each record's key and position, not
    its bytes, however large the shard.
    """

    def __init__(self, output: str, index_files: bool = False):
        self._output = output
        self._index_files = index_files
        self._shards = _counter(counters.SHARDS_WRITTEN)
        self._bytes = _counter(counters.SHARD_BYTES_WRITTEN)

    def process(self, element, plans):
        (split, shard), batches = element
        entries = (entry for batch in batches for entry in batch.entries)
        info = write_staged_shard(
            self._output, split, shard, plans[split].shards, entries, self._index_files
        )
        self._shards.inc()
        self._bytes.inc(info.num_bytes)
        yield info


class WriteShards(beam.PTransform):
    """{batches, plans} -> WrittenShard, one per shard of the plans."""

    def __init__(self, config: JobConfig):
        super().__init__()
        self._config = config

    def expand(self, pcolls):
        plans = AsDict(pcolls["plans"])
        writer = _WriteShardFn(self._config.output, self._config.index_files)
        return (
            pcolls["batches"]
            # RecordBatch -> ((split, shard), RecordBatch of that shard's records)
            | "AssignShards" >> beam.FlatMap(by_shard, plans=plans)
            | "GroupByShard" >> beam.GroupByKey()
            # -> WrittenShard
            | "WriteShard" >> beam.ParDo(writer, plans=plans)
        )


# ---------------------------------------------------------------- bookkeeping


class _Finalize(beam.DoFn):
    """None + side inputs -> a JSON line of records per split; publishes the dataset
    (finalize.Finalizer: idempotent, so a retried Finalize completes what the first try began).

    ``results``: each step's result by its name (STEPS), for the steps' blocks.
    """

    def __init__(self, config: JobConfig):
        self._config = config

    def process(self, _, shards, rejects, plans, skipped, census, reused=0, **results):
        config = self._config
        blocks = [groups_block(config, census), *reuse_feature.blocks(config, reused)]
        blocks += [block for step in STEPS for block in step.blocks(config, results)]
        yield Finalizer(config).run(shards, rejects, plans, skipped, blocks)


# ----------------------------------------------------------------------- graph


def build(
    pipeline: beam.Pipeline,
    config: JobConfig,
    pool: local_pool.Pool | None = None,
    shown: progress.Reporter | None = None,
):
    """Adds the whole conversion to ``pipeline``; returns the final summary PCollection.

    ``pool``: the conversion processes the command line forked, for the pooled
    path (None: the conversion step forks its own). ``shown``: where the
    conversion's progress goes, for a runner that runs the step in this
    process (None: a worker's log line now and then).
    """
    listed = pipeline | "ListImages" >> ListImages(config)
    converted = listed["refs"] | "ConvertImages" >> ConvertImages(config, pool, shown)
    # The features' steps, in order: each takes the batches the one before kept.
    batches, rejected, results = converted.batches, [converted[REJECTED]], {}
    for step in STEPS:
        transform = step.transform(config)
        out = batches | type(transform).__name__ >> transform
        batches = out["batches"]
        rejected.append(out["rejected"])
        results[step.name] = step.side(out[step.result])
    # Rejection: bad images, then what each step dropped
    rejects = tuple(rejected) | "AllRejections" >> beam.Flatten()
    plans = {
        "batches": batches,
        "listed": listed["listed"],
        "rejected": rejects,
    } | "PlanShards" >> PlanShards(config)
    shards = {"batches": batches, "plans": plans} | "WriteShards" >> WriteShards(config)
    reused = {}
    if config.reuse:
        total = converted[REUSED] | "ReusedTotal" >> beam.CombineGlobally(sum)
        reused["reused"] = AsSingleton(total)
    return (
        pipeline
        | "Start" >> beam.Create([None], reshuffle=False)
        | "Finalize"
        >> beam.ParDo(
            _Finalize(config),
            shards=AsList(shards),
            rejects=AsList(rejects),
            plans=AsList(plans),
            skipped=AsList(listed[SKIPPED]),
            census=AsSingleton(listed[GROUPS]),
            **reused,
            **results,
        )
    )

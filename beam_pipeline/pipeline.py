"""The Beam graph: one composite PTransform per stage (docs/format.md sections 2-7).

ListImages      PBegin -> ImageRef ("refs") + (split, KeyTally) of listed keys ("listed")
                + Skipped ("skipped")
ConvertImages   ImageRef -> RecordBatch (main) + Rejection ("rejected")
FindDuplicates  RecordBatch -> (sha256, [Member]) groups of identical sources; with
                --dedupe also the batches without the copies + a Rejection per copy
PlanShards      {RecordBatch, listed, Rejection} -> (split, SplitPlan): books + shard plan
WriteShards     RecordBatch + plans -> ShardInfo of a temp file
Finalize        side inputs -> rejects.jsonl, labels.txt, dataset_info.json (last)

Two paths share this graph (docs/scale.md). With the local pool
(``conversion_processes > 1``) records go to spill files on local disk and a
RecordBatch carries only references; otherwise (Dataflow, multi_processing)
a RecordBatch carries up to a few MB of record bytes through the shuffle.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import sys
import time
import uuid
from collections import Counter

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsDict, AsList, TaggedOutput
from apache_beam.transforms.window import GlobalWindows

from beam_pipeline import (
    books,
    duplicates,
    errors,
    images,
    keys,
    listing,
    local_pool,
    metadata,
    spill,
)
from beam_pipeline import output as output_files
from beam_pipeline.convert import (
    Converted,
    Outcome,
    RecordBatch,
    Rejection,
    ShardEntry,
    convert_ref,
    from_spill,
    spill_chunk,
    timeout_reason,
)
from beam_pipeline.errors import BooksDoNotBalance, UsageError

NAMESPACE = "imagerecords"
TMP_DIR = metadata.TMP_DIR
REJECTED = "rejected"
LISTED = "listed"
SKIPPED = "skipped"
_LOG_EVERY_S = 15.0  # progress line per converting worker

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """Everything the graph needs; built and validated by the CLI."""

    layout: listing.Layout
    output: str
    splits: dict[str, float]
    seed: int = 42
    image: images.ImageSpec = images.ImageSpec()
    target_shard_bytes: int = 200 * 2**20
    min_shards: int = 1
    max_reject_fraction: float = 0.01
    # Also write <shard>.idx: "offset length" per record (NVIDIA DALI's format).
    index_files: bool = False
    # >1: convert in that many local processes, which spill the records to
    # local disk (one machine: in-process or multi_processing DirectRunner).
    conversion_processes: int = 1
    # Where the local processes spill; default spill.default_dir(output).
    spill_dir: str | None = None
    # Keep one image of each group of identical source files (--dedupe).
    dedupe: bool = False

    def __post_init__(self):
        """The CLI's value checks, so that code building a JobConfig gets the same errors."""
        if not self.output:
            raise UsageError("--output is required")
        fractions = list(self.splits.values())
        if not fractions or any(not 0.0 <= f <= 1.0 for f in fractions):
            raise UsageError(f"--splits: fractions must be in [0, 1], got {self.splits}")
        if abs(sum(fractions) - 1.0) > keys._FRACTION_TOLERANCE:
            raise UsageError(f"--splits: fractions must sum to 1, got {sum(fractions):g}")
        if not self.target_shard_bytes > 0:
            raise UsageError("--target_shard_mb must be positive")
        if self.min_shards < 1:
            raise UsageError(f"--min_shards must be at least 1, got {self.min_shards}")
        if not 0.0 <= self.max_reject_fraction <= 1.0:
            raise UsageError(
                f"--max_reject_fraction must be in [0, 1], got {self.max_reject_fraction:g}"
            )
        if self.conversion_processes < 1:
            raise UsageError(
                f"--local_processes must be at least 1, got {self.conversion_processes}"
            )

    @property
    def split_names(self) -> list[str]:
        """Splits in dataset_info order: the layout's own, else --splits."""
        return list(self.layout.split_names or self.splits)

    @property
    def spill_directory(self) -> str:
        return self.spill_dir or spill.default_dir(self.output)


def _output_path(output: str, name: str) -> str:
    return listing.join(output, name)


# --------------------------------------------------------------------- listing


class _ListFn(beam.DoFn):
    """ClassFolder or manifest path -> ImageRef; (split, KeyTally) of listed keys on
    ``listed``; Skipped (a file that is clearly not an image) on ``skipped``.

    The listed keys go out per folder (at most ``BATCH`` per element), not per
    image: they are the books' independent count of what must come out.
    """

    BATCH = 1 << 16

    def __init__(self, config: JobConfig):
        self._layout, self._seed, self._splits = config.layout, config.seed, config.splits
        self._listed = Metrics.counter(NAMESPACE, "images_listed")

    def process(self, source):
        seed, splits = self._seed, self._splits
        pending: dict[str, list[int]] = {}
        for row in self._rows(source):
            if isinstance(row, listing.Skipped):
                yield TaggedOutput(SKIPPED, row)
                continue
            image_id, path, label, split = row
            split = split or keys.assign_split(seed, image_id, splits)
            self._listed.inc()
            yield listing.ImageRef(image_id, path, label, split)
            listed = pending.setdefault(split, [])
            listed.append(keys.order_key(seed, image_id))
            if len(listed) >= self.BATCH:
                yield TaggedOutput(LISTED, (split, books.KeyTally(listed=tuple(listed))))
                listed.clear()
        for split, listed in pending.items():
            if listed:
                yield TaggedOutput(LISTED, (split, books.KeyTally(listed=tuple(listed))))

    def _rows(self, source):
        layout = self._layout
        if layout.kind == "manifest":
            label_of = {name: i for i, name in enumerate(layout.classes)}
            for row in listing.read_manifest(source, layout.root):
                yield row.image_id, row.path, label_of[row.label_name], row.split
        else:
            yield from listing.list_folder(source, layout.root)


class ListImages(beam.PTransform):
    """PBegin -> {"refs": ImageRef with its split, "listed": (split, KeyTally), "skipped"}."""

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
            LISTED, SKIPPED, main="refs"
        )
        refs = listed.refs
        if not pooled:
            # ImageRef, redistributed so that conversion is not fused to the listing worker;
            # (one local runner process: the conversion pool fans out instead)
            refs = refs | "SpreadImages" >> beam.Reshuffle()
        return {"refs": refs, LISTED: listed[LISTED], SKIPPED: listed[SKIPPED]}


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


class _ConvertFn(beam.DoFn):
    """ImageRef -> RecordBatch, or Rejection on the ``rejected`` output; converts inline."""

    def __init__(self, config: JobConfig):
        self._args = (config.image, config.seed, config.layout.classes)
        self._converted = Metrics.counter(NAMESPACE, "images_converted")
        self._rejected = Metrics.counter(NAMESPACE, "images_rejected")
        self._passed = Metrics.counter(NAMESPACE, "images_passed_through")
        self._repaired = Metrics.counter(NAMESPACE, "images_repaired")
        self._bad_profile = Metrics.counter(NAMESPACE, "images_bad_profile")
        self._bytes_in = Metrics.counter(NAMESPACE, "bytes_read")
        self._bytes_out = Metrics.counter(NAMESPACE, "record_bytes")

    def setup(self):
        self._count = 0
        self._started = self._last_log = time.monotonic()

    def start_bundle(self):
        self._batcher = _Batcher()

    def process(self, ref):
        yield from self._emit(convert_ref(tuple(ref), *self._args))

    def _emit(self, outcome: Outcome, converted_now: bool = True):
        """Counts an outcome; yields a Rejection (tagged) or, when one is full, a batch."""
        result = outcome.result
        if isinstance(result, Rejection):
            self._rejected.inc()
            yield TaggedOutput(REJECTED, result)
            return
        self._bytes_out.inc(result.entry.size)
        if converted_now:
            self._bytes_in.inc(outcome.bytes_read)
            self._converted.inc()
            if outcome.passed_through:
                self._passed.inc()
            if outcome.repaired:
                self._repaired.inc()
            if outcome.bad_profile:
                self._bad_profile.inc()
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


class _Picked:
    """Future-like: one image's outcome out of a chunk converted ahead of the pipeline."""

    def __init__(self, future, index):
        self._future, self._index = future, index

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> list[Outcome]:
        return [self._future.result()[self._index]]


class _PooledConvertFn(_ConvertFn):
    """Like _ConvertFn, but spreads the images over local worker processes that spill.

    For runners that execute a bundle in one process (DirectRunner in_memory),
    this is what uses every core: the Beam graph stays in one process with no
    gRPC hops, and only the codec work moves to the pool. Each worker appends
    its records to its own spill file and sends back a reference, so record
    bytes never pass through this process or the runner (docs/scale.md).
    Images an earlier, interrupted run already spilled are taken from its
    spill files instead of being converted again. Results may come back in
    any order; shard contents are sorted later, so output bytes do not change.
    A worker that dies (a decoder crash) costs the one image that killed it,
    which becomes a rejection; the others are converted again.
    """

    CHUNK = 8

    def __init__(self, config: JobConfig, processes: int):
        super().__init__(config)
        self._processes = processes
        self._spill_dir = config.spill_directory
        self._task_args = (*self._args, self._spill_dir)
        self._ahead = Metrics.counter(NAMESPACE, "images_converted_ahead")
        self._resumed = Metrics.counter(NAMESPACE, "images_resumed")

    def setup(self):
        super().setup()
        self._done = spill.load_index(self._spill_dir)
        self._executor = local_pool.take(self._processes)

    def _new_executor(self):
        return local_pool.new(self._processes)

    def _emit(self, outcome: Outcome, converted_now: bool = True):
        result = outcome.result
        if isinstance(result, Converted):
            # One string object per spill file: a pickled batch then names each file once.
            where = result.entry.data
            where = where._replace(path=sys.intern(where.path))
            outcome = outcome._replace(
                result=result._replace(entry=result.entry._replace(data=where))
            )
        return super()._emit(outcome, converted_now)

    def start_bundle(self):
        super().start_bundle()
        self._chunk: list[tuple] = []
        self._pending: collections.deque = collections.deque()  # (refs, future)

    def process(self, ref):
        ref = tuple(ref)
        image_id, path, label, split = ref
        earlier = self._done.get(image_id)
        if earlier is not None and earlier.split == split and earlier.label in (label, -1):
            self._resumed.inc()  # converted (or rejected) by an interrupted run
            yield from self._emit(Outcome(from_spill(earlier, path), 0, False), False)
            return
        ahead = local_pool.claim(path)
        if ahead is not None and ahead[2] == ref:  # converted while Beam was starting
            self._ahead.inc()
            self._pending.append(([ref], _Picked(*ahead[:2])))
        else:
            self._chunk.append(ref)
            if len(self._chunk) >= self.CHUNK:
                self._submit()
        # Keep every process busy, but bound what is in flight (memory).
        while self._pending and (
            self._pending[0][1].done() or len(self._pending) > 3 * self._processes
        ):
            for outcome in self._next_outcomes():
                yield from self._emit(outcome)

    def _submit(self):
        if self._chunk:
            future = self._executor.submit(spill_chunk, self._chunk, *self._task_args)
            self._pending.append((self._chunk, future))
            self._chunk = []

    def _next_outcomes(self) -> list[Outcome]:
        try:
            outcomes = self._pending[0][1].result()
        except concurrent.futures.process.BrokenProcessPool:
            outcomes = self._recover()
        self._pending.popleft()
        return outcomes

    def _recover(self) -> list[Outcome]:
        """A worker died: convert every in-flight image again, one per task."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        local_pool.drop_ahead()  # those futures died with the pool
        executor = None
        for index, (refs, _) in enumerate(self._pending):
            outcomes = []
            for ref in refs:
                executor = executor or self._new_executor()
                started = time.monotonic()
                try:
                    outcomes += executor.submit(spill_chunk, [ref], *self._task_args).result()
                except concurrent.futures.process.BrokenProcessPool:
                    image_id, path, _, split = ref
                    reason = "crashed the image decoder (its worker process died)"
                    limit = self._args[0].timeout_s
                    if limit and time.monotonic() - started >= limit:
                        reason = timeout_reason(limit)  # the worker ended itself: deadline.py
                    outcomes.append(Outcome(Rejection(image_id, path, split, reason), 0, False))
                    executor.shutdown(wait=False)
                    executor = None
            finished = concurrent.futures.Future()
            finished.set_result(outcomes)
            self._pending[index] = (refs, finished)
        self._executor = executor or self._new_executor()
        return self._pending[0][1].result()

    def finish_bundle(self):
        self._submit()
        while self._pending:
            for outcome in self._next_outcomes():
                for output in self._emit(outcome):
                    if isinstance(output, TaggedOutput):
                        yield TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))
                    else:
                        yield GlobalWindows.windowed_value(output)
        yield from super().finish_bundle()

    def teardown(self):
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=True)


class ConvertImages(beam.PTransform):
    """ImageRef -> RecordBatch, with Rejection on the ``rejected`` output."""

    def __init__(self, config: JobConfig):
        super().__init__()
        self._config = config

    def expand(self, refs):
        processes = self._config.conversion_processes
        fn = (
            _PooledConvertFn(self._config, processes) if processes > 1 else _ConvertFn(self._config)
        )
        return refs | "Convert" >> beam.ParDo(fn).with_outputs(REJECTED, main="batches")


# ------------------------------------------------------------------ duplicates


def _members(batch: RecordBatch):
    """RecordBatch -> (sha256, Member) per record: ~150 bytes per image, not the image."""
    for e in batch.entries:
        if e.sha256:  # every converted record has one; hand-made test entries may not
            yield e.sha256, duplicates.Member(e.image_id, batch.split, e.label)


class _DropDuplicates(beam.DoFn):
    """RecordBatch -> RecordBatch without the copies --dedupe drops + a Rejection per copy."""

    def __init__(self):
        self._dropped = Metrics.counter(NAMESPACE, "images_dropped_as_duplicates")

    def process(self, batch: RecordBatch, drops: dict[str, str]):
        kept = []
        for entry in batch.entries:
            reason = drops.get(entry.image_id)
            if reason is None:
                kept.append(entry)
                continue
            self._dropped.inc()
            yield TaggedOutput(REJECTED, Rejection(entry.image_id, entry.path, batch.split, reason))
        if kept:
            yield RecordBatch(batch.split, tuple(kept))


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
            | "HashAndMember" >> beam.FlatMap(_members)
            | "MembersPerHash" >> beam.CombinePerKey(beam.combiners.ToListCombineFn())
            # (sha256, [Member]) with at least two members
            | "OnlyDuplicates" >> beam.Filter(lambda group: len(group[1]) > 1)
        )
        if not self._dedupe:
            empty = batches.pipeline | "NoDrops" >> beam.Create([], reshuffle=False)
            return {"groups": groups, "batches": batches, "rejected": empty}
        drops = groups | "CopiesToDrop" >> beam.FlatMap(
            lambda group: [(m.image_id, reason) for m, reason in duplicates.dropped(group[1])]
        )
        kept = batches | "DropCopies" >> beam.ParDo(
            _DropDuplicates(), drops=AsDict(drops)
        ).with_outputs(REJECTED, main="batches")
        return {"groups": groups, "batches": kept.batches, "rejected": kept[REJECTED]}


# ------------------------------------------------------------------ shard plan


class _TallyFn(beam.CombineFn):
    """KeyTally of one split -> (listed, written, rejected keys, record bytes), all of the split."""

    def create_accumulator(self):
        return [], [], [], 0

    def add_input(self, accumulator, tally: books.KeyTally):
        listed, written, rejected, size = accumulator
        for into, values in ((listed, tally.listed), (written, tally.written)):
            if values:
                into.append(books.as_keys(values))
        if tally.rejected:
            rejected.append(books.as_keys(tally.rejected))
        return listed, written, rejected, size + tally.record_bytes

    def merge_accumulators(self, accumulators):
        listed, written, rejected, size = [], [], [], 0
        for more in accumulators:
            listed += more[0]
            written += more[1]
            rejected += more[2]
            size += more[3]
        return self.compact((listed, written, rejected, size))

    def compact(self, accumulator):
        # One array per kind: 8 bytes per key, however many batches came in.
        *parts, size = accumulator
        return (*([np.concatenate(p)] if len(p) > 1 else p for p in parts), size)

    def extract_output(self, accumulator):
        *parts, size = accumulator
        empty = np.zeros(0, dtype=np.uint64)
        return (*(np.concatenate(p) if p else empty for p in parts), size)


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
        seed = self._config.seed
        target, minimum = self._config.target_shard_bytes, self._config.min_shards

        def written(batch: RecordBatch):
            entries = batch.entries
            tally = books.KeyTally(
                written=tuple(e.key for e in entries), record_bytes=sum(e.size for e in entries)
            )
            return batch.split, tally

        def rejected(rejection: Rejection):
            return rejection.split, books.KeyTally(
                rejected=(keys.order_key(seed, rejection.image_id),)
            )

        def plan(split, tallied):
            return split, books.plan_split(split, *tallied, target, minimum)

        return (
            (
                pcolls["listed"],
                pcolls["batches"] | "WrittenKeys" >> beam.Map(written),
                pcolls["rejected"] | "RejectedKeys" >> beam.Map(rejected),
            )
            | "AllKeys" >> beam.Flatten()
            # (split, KeyTally) -> (split, (listed, written, rejected keys, bytes))
            | "TallyPerSplit" >> beam.CombinePerKey(_TallyFn())
            # -> (split, SplitPlan)
            | "PlanSplit" >> beam.MapTuple(plan)
        )


# --------------------------------------------------------------------- shards


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """A shard written to a temp file: what Finalize checks, renames and describes."""

    split: str
    index: int
    shards: int  # in the split
    temp: str
    num_examples: int
    num_bytes: int
    sha256: str
    key_sum: int  # sum of its keys mod 2^64 (the books check it against the plan)
    class_counts: tuple[tuple[int, int], ...]  # (label, count), by label
    temp_index: str | None = None

    @property
    def file(self) -> str:
        return keys.shard_filename(self.split, self.index, self.shards)


def _by_shard(batch: RecordBatch, plans: dict[str, books.SplitPlan]):
    """RecordBatch -> ((split, shard), RecordBatch) for each shard its records fall in."""
    plan = plans[batch.split]
    parts: dict[int, list[ShardEntry]] = {}
    for entry in batch.entries:
        parts.setdefault(plan.shard_of(entry.key), []).append(entry)
    for shard, entries in parts.items():
        yield (batch.split, shard), RecordBatch(batch.split, tuple(entries))


class _WriteShardFn(beam.DoFn):
    """((split, shard), [RecordBatch]) -> ShardInfo of a temp file.

    Holds one shard's entries in memory (to sort them): references only on
    the local path, record bytes (the shard's size) on the shuffle path.
    """

    def __init__(self, output: str, index_files: bool = False):
        self._output = output
        self._index_files = index_files
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._bytes = Metrics.counter(NAMESPACE, "shard_bytes_written")

    def process(self, element, plans):
        (split, shard), batches = element
        entries = [entry for batch in batches for entry in batch.entries]
        # Sorting by (key, id) makes the shard's bytes independent of bundle order.
        entries.sort(key=lambda e: (e.key, e.image_id))
        yield self._write(split, shard, plans[split].shards, entries)

    def _write(self, split, shard, count, entries) -> ShardInfo:
        # A unique temporary name per attempt: a retried bundle never collides
        # with, or leaves, a partial file under a final name. Finalize renames
        # the reported files into place once the books balance.
        temp = _output_path(self._output, f"{TMP_DIR}/{split}-{shard:05d}.{uuid.uuid4().hex}")
        digest = hashlib.sha256()
        size = 0
        index: list[str] = []
        class_counts: Counter[int] = Counter()
        reader = spill.Reader()
        try:
            with output_files.create(temp) as stream:
                for entry in entries:
                    framed = entry.data
                    if not isinstance(framed, bytes):
                        framed = reader.read(framed.path, framed.offset, entry.size)
                    stream.write(framed)
                    digest.update(framed)
                    index.append(f"{size} {len(framed)}\n")
                    size += len(framed)
                    class_counts[entry.label] += 1
        finally:
            reader.close()
        temp_index = None
        if self._index_files:
            temp_index = temp + ".idx"
            with output_files.create(temp_index) as stream:
                stream.write("".join(index).encode())
        self._shards.inc()
        self._bytes.inc(size)
        return ShardInfo(
            split=split,
            index=shard,
            shards=count,
            temp=temp,
            num_examples=len(entries),
            num_bytes=size,
            sha256=digest.hexdigest(),
            key_sum=books.key_sum([e.key for e in entries]),
            class_counts=tuple(sorted(class_counts.items())),
            temp_index=temp_index,
        )


class WriteShards(beam.PTransform):
    """{batches, plans} -> ShardInfo, one per shard of the plans."""

    def __init__(self, config: JobConfig):
        super().__init__()
        self._config = config

    def expand(self, pcolls):
        plans = AsDict(pcolls["plans"])
        writer = _WriteShardFn(self._config.output, self._config.index_files)
        return (
            pcolls["batches"]
            # RecordBatch -> ((split, shard), RecordBatch of that shard's records)
            | "AssignShards" >> beam.FlatMap(_by_shard, plans=plans)
            | "GroupByShard" >> beam.GroupByKey()
            # -> ShardInfo
            | "WriteShard" >> beam.ParDo(writer, plans=plans)
        )


# ---------------------------------------------------------------- bookkeeping


def check_shards(
    plans: dict[str, books.SplitPlan], shards: list[ShardInfo]
) -> tuple[list[ShardInfo], list[str]]:
    """One written shard per planned shard, holding exactly the planned records.

    Returns the shards to keep and the problems. A shard reported twice with
    the same bytes (a retried write) is kept once.
    """
    chosen: dict[tuple[str, int], ShardInfo] = {}
    problems = []
    for shard in sorted(shards, key=lambda s: s.temp):
        seen = chosen.setdefault((shard.split, shard.index), shard)
        if seen is not shard and seen.sha256 != shard.sha256:
            problems.append(f"shard {shard.index} of {shard.split} written twice, differently")
    for split, plan in plans.items():
        for index in range(plan.shards):
            shard = chosen.get((split, index))
            if shard is None:
                problems.append(f"shard {index} of {split} was not written")
            elif (shard.num_examples, shard.key_sum) != (plan.counts[index], plan.key_sums[index]):
                problems.append(
                    f"shard {index} of {split} holds {shard.num_examples} records, "
                    f"not the {plan.counts[index]} planned"
                )
    return sorted(chosen.values(), key=lambda s: (s.split, s.index)), problems


class _Finalize(beam.DoFn):
    """None + side inputs -> a JSON line of records per split; publishes the dataset.

    Idempotent, so a retried Finalize completes what the first try began.
    """

    def __init__(self, config: JobConfig):
        self._config = config

    def process(self, _, shards, rejects, plans, skipped, groups):
        plans = dict(plans)
        skipped = list(skipped) + [
            listing.Skipped(path, listing.NOT_IN_CLASS_FOLDER)
            for path in self._config.layout.loose_files
        ]
        # The lists first: a run that fails its books still leaves them to read.
        self._write_lists(rejects, skipped, groups)
        kept = self._check_books(plans, list(shards), rejects)
        placed = place_shards(kept, self._config.output)
        info = self._info(placed, rejects, skipped, groups)
        self._publish(info)
        yield json.dumps({s: split["num_examples"] for s, split in info["splits"].items()})

    def _write_lists(self, rejects, skipped, groups) -> None:
        """rejects.jsonl, labels.txt, duplicates.jsonl and skipped.jsonl."""
        config = self._config
        output_files.write_atomically(
            _output_path(config.output, metadata.REJECTS_FILE),
            metadata.rejects_jsonl(
                {"path": r.path, "id": r.image_id, "split": r.split, "reason": r.reason}
                for r in rejects
            ),
        )
        output_files.write_atomically(
            _output_path(config.output, metadata.LABELS_FILE),
            metadata.labels_text(config.layout.classes),
        )
        output_files.write_atomically(
            _output_path(config.output, duplicates.DUPLICATES_FILE),
            duplicates.jsonl(groups, config.layout.classes),
        )
        output_files.write_atomically(
            _output_path(config.output, metadata.SKIPPED_FILE),
            metadata.skipped_jsonl({"path": s.path, "reason": s.reason} for s in skipped),
        )

    def _check_books(self, plans, shards, rejects) -> list[ShardInfo]:
        """The shards to keep, one per planned shard.

        Raises:
            BooksDoNotBalance: A record is lost or doubled, a shard is not as
                planned, or more images are bad than --max_reject_fraction allows.
        """
        config = self._config
        kept, shard_problems = check_shards(plans, shards)
        failure = books.check_books(
            list(plans.values()),
            written=sum(s.num_examples for s in kept),
            rejected=len(rejects),
            shard_problems=shard_problems,
            names_of=lambda wanted: _names_of(config, wanted),
        )
        if failure:
            raise BooksDoNotBalance(failure)
        total_listed = sum(plan.listed for plan in plans.values())
        # Copies dropped by --dedupe were asked for: they are not bad images.
        bad = [r.reason for r in rejects if not r.reason.startswith(duplicates.DUPLICATE_PREFIX)]
        if len(bad) / total_listed > config.max_reject_fraction:
            raise errors.too_many_rejects(
                bad,
                total_listed,
                config.max_reject_fraction,
                _output_path(config.output, metadata.REJECTS_FILE),
            )
        return kept

    def _info(self, placed, rejects, skipped, groups) -> dict:
        """The dataset_info.json object (docs/format.md section 7)."""
        config = self._config
        rejected_by_split = Counter(r.split for r in rejects)
        splits = metadata.split_order(
            config.split_names, [row["split"] for row in placed] + list(rejected_by_split)
        )
        spec = config.image
        info = metadata.build_info(
            source=config.layout.manifest or config.layout.root,
            seed=config.seed,
            classes=config.layout.classes,
            image={
                "resize": spec.resize,
                "size": spec.size,
                "upscale": spec.upscale,
                "jpeg_quality": spec.jpeg_quality,
                "format": "jpeg",
                "channels": 3,
                # Embedded colour profiles are applied (docs/images.md).
                "color_space": "sRGB",
            },
            splits=splits,
            shards=placed,
            rejected_by_split=rejected_by_split,
            skipped_reasons=[s.reason for s in skipped],
            config={
                "layout": config.layout.kind,
                "splits": config.splits if config.layout.kind != "presplit" else None,
                "target_shard_mb": config.target_shard_bytes / 2**20,
                "min_shards": config.min_shards,
                "max_reject_fraction": config.max_reject_fraction,
                "dedupe": config.dedupe,
            },
        )
        info["duplicates"] = duplicates.info_block(
            [members for _, members in groups], _first_split(splits)
        )
        return info

    def _publish(self, info: dict) -> None:
        """Deletes the temporary files, writes dataset_info.json, then drops the marker."""
        output = self._config.output
        output_files.delete_local_folder(self._config.spill_directory)
        output_files.delete_temp_files(output, keep=[output_files.MARKER])
        # Written last: its presence means the dataset is complete.
        output_files.write_atomically(
            _output_path(output, metadata.INFO_FILE), metadata.dumps(info)
        )
        output_files.delete_temp_folder(output)  # what is left: the job's marker


def _first_split(splits: list[str]) -> str:
    """The split a model trains on: "train" when there is one, else the first."""
    return "train" if "train" in splits else (splits[0] if splits else "train")


def _names_of(config: JobConfig, wanted: set[int]) -> dict[int, str]:
    """Order key -> image ID for the keys in ``wanted``, by listing the input again.

    Runs only when the books do not balance, to name the images in the message.
    """
    if not wanted:
        return {}
    layout = config.layout
    if layout.kind == "manifest":
        ids = (row.image_id for row in listing.read_manifest(layout.manifest, layout.root))
    else:
        ids = (
            entry[0]
            for folder in layout.folders
            for entry in listing.list_folder(folder, layout.root)
            if not isinstance(entry, listing.Skipped)
        )
    found = {}
    for image_id in ids:
        key = keys.order_key(config.seed, image_id)
        if key in wanted:
            found[key] = image_id
    return found


def place_shards(shards: list[ShardInfo], output: str) -> list[dict]:
    """Renames the checked shards' temp files to their final names.

    Idempotent, so a retried Finalize completes the renames the first try began.

    Returns:
        One dataset_info row per shard (see ``metadata.build_info``).
    """
    rows = []
    moves = []
    for shard in shards:
        final = _output_path(output, shard.file)
        row = {
            "split": shard.split,
            "file": shard.file,
            "num_examples": shard.num_examples,
            "num_bytes": shard.num_bytes,
            "sha256": shard.sha256,
            "class_counts": {str(label): n for label, n in shard.class_counts},
        }
        moves.append((shard.temp, final))
        if shard.temp_index:
            row["index"] = shard.file + ".idx"
            moves.append((shard.temp_index, final + ".idx"))
        rows.append(row)
    output_files.move_into_place(moves, _output_path(output, TMP_DIR))
    return rows


# ----------------------------------------------------------------------- graph


def build(pipeline: beam.Pipeline, config: JobConfig):
    """Adds the whole conversion to ``pipeline``; returns the final summary PCollection."""
    listed = pipeline | "ListImages" >> ListImages(config)
    converted = listed["refs"] | "ConvertImages" >> ConvertImages(config)
    found = converted.batches | "FindDuplicates" >> FindDuplicates(config.dedupe)
    batches = found["batches"]
    # Rejection: bad images, then the copies --dedupe dropped
    rejects = (converted[REJECTED], found["rejected"]) | "AllRejections" >> beam.Flatten()
    plans = {
        "batches": batches,
        "listed": listed["listed"],
        "rejected": rejects,
    } | "PlanShards" >> PlanShards(config)
    shards = {"batches": batches, "plans": plans} | "WriteShards" >> WriteShards(config)
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
            groups=AsList(found["groups"]),
        )
    )

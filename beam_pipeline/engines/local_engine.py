"""The local engine: the Beam graph's job, run in this process and its local pool, no Beam.

A job whose input folder and output are both on this machine, and that names
no Beam option, runs here by default (``job.choose_engine``). It runs the same
stages as ``pipeline.build`` with the same code for each (listing,
``pooled.PoolConverter``, ``books.plan_split``, ``shards.write_shard``,
``finalize.Finalizer``), in that order, so its output is byte for byte what
Beam's DirectRunner writes for the same arguments (tests/test_local_engine.py
compares them). What it leaves out is Beam itself: importing it, building
and translating the graph, and moving every converted image through the
runner as an element, ~2.5 s of CPU per run plus ~0.4 ms per image on one
core (docs/performance.md, "Local engine"). ``--runner DirectRunner`` runs
the same job on Beam.

Stages, with what passes between them:

List        class folders -> ImageRef per image + listed order keys per split + Skipped
(Reuse)     with --reuse OLD: OLD's shards -> reuse.Index (image ID -> OldRecord), on the pool
Convert     ImageRef (+ OLD's record of its ID) -> Outcome (a ShardEntry that points into a
            spill file, or into OLD's shard for a reused record; or a Rejection)
Duplicates  ShardEntries -> (sha256, [Member]) groups; with --dedupe, the copies rejected
Plan        listed / written / rejected keys per split -> SplitPlan (books + shard plan)
Write       ShardEntries of one shard, sorted -> ShardInfo of a temp file
Finalize    everything above -> rejects.jsonl, labels.txt, ..., imagerecords.json last
"""

from __future__ import annotations

import collections
import concurrent.futures
import sys
from collections import Counter

from beam_pipeline.core import books, duplicates, keys
from beam_pipeline.engines import pooled, progress
from beam_pipeline.stages import reuse
from beam_pipeline.stages.convert import Converted, Outcome, RecordBatch, Rejection, ShardEntry
from beam_pipeline.stages.finalize import Finalizer
from beam_pipeline.stages.job_config import JobConfig
from beam_pipeline.stages.shards import ShardInfo, by_shard, sort_entries, write_shard
from beam_pipeline.storage import listing


class _Listed:
    """What listing found: order keys per split (the books' count) and skipped files."""

    def __init__(self):
        self.keys: dict[str, list[int]] = collections.defaultdict(list)
        self.skipped: list[listing.Skipped] = []


def _list_images(config: JobConfig, listed: _Listed, counters: Counter):
    """Class folders (or the manifest) -> ImageRef, in order; fills ``listed`` on the way."""
    layout, seed, splits = config.layout, config.seed, config.splits
    for source in layout.sources:
        for row in layout.rows(source):
            if isinstance(row, listing.Skipped):
                listed.skipped.append(row)
                continue
            image_id, path, label, split = row
            split = split or keys.assign_split(seed, image_id, splits)
            counters["images_listed"] += 1
            listed.keys[split].append(keys.order_key(seed, image_id))
            yield listing.ImageRef(image_id, path, label, split)


class _Collected:
    """Every outcome of the conversion: records per split, rejections."""

    def __init__(self):
        self.entries: dict[str, list[ShardEntry]] = collections.defaultdict(list)
        self.rejects: list[Rejection] = []


def _count(outcome: Outcome, how: str, counters: Counter) -> None:
    """The counters of ``pipeline._ConvertFn`` / ``_PooledConvertFn``, by the same names."""
    if how in pooled.HOW_COUNTERS:
        counters[pooled.HOW_COUNTERS[how]] += 1
    counters.update(pooled.outcome_counts(outcome, how != pooled.RESUMED))


def _read_old(
    config: JobConfig, converter: pooled.PoolConverter, shown: progress.Reporter
) -> reuse.Index:
    """--reuse's dataset, scanned on the pool (a process per shard): its records by ID."""
    old = reuse.open_old(config.reuse)
    with shown.phase(f"reading {old.path}", len(old.shards), "shards") as phase:

        def run(fn, *args):
            future = converter.run_aside(fn, *args)
            future.add_done_callback(lambda _: phase.update(1))
            return future

        return reuse.build_index(old, run)


def _convert(
    config: JobConfig,
    refs,
    counters: Counter,
    shown: progress.Phase,
    converter: pooled.PoolConverter,
    old: reuse.Index | None,
) -> _Collected:
    """ImageRefs -> records (spill references) and rejections, on the local pool.

    ``old``: --reuse's records: each image goes to the pool with the one of its ID.
    It is closed (its arrays freed) once every image has been looked up, before
    the last conversions finish and the process tree is at its largest.
    """
    # The total comes from a quick count on a pool process: listing itself only
    # runs as fast as conversion pulls it.
    estimate = converter.run_aside(listing.estimate_image_count, config.layout)
    collected = _Collected()

    def collect(outcomes):
        done = resumed = rejected = reused = 0
        for outcome, how in outcomes:
            _count(outcome, how, counters)
            done += 1
            resumed += how == pooled.RESUMED
            reused += outcome.reused
            result = outcome.result
            if isinstance(result, Converted):
                entry = result.entry
                # One string per spill file, not one per record (memory per image).
                where = entry.data._replace(path=sys.intern(entry.data.path))
                collected.entries[result.split].append(entry._replace(data=where))
            else:
                rejected += 1
                collected.rejects.append(result)
        if shown.total is None and estimate.done() and not estimate.exception():
            shown.set_total(max(estimate.result(), shown.done))
        if done:
            shown.update(done, skipped=resumed, resumed=resumed, rejected=rejected, reused=reused)

    if old is None:
        for ref in refs:
            collect(converter.add(ref))
    else:
        for ref in refs:
            collect(converter.add(ref, old.get(ref.image_id)))
        old.close()
    collect(converter.finish())
    return collected


def _find_duplicates(config: JobConfig, collected: _Collected, counters: Counter) -> list:
    """(sha256, [Member]) for every source held by two or more images; with --dedupe,
    every copy but the keeper leaves the records and becomes a rejection."""
    members = collections.defaultdict(list)
    for split, entries in collected.entries.items():
        for e in entries:
            if e.sha256:
                members[e.sha256].append(duplicates.Member(e.image_id, split, e.label))
    groups = [(sha256, group) for sha256, group in members.items() if len(group) > 1]
    if config.dedupe and groups:
        drops = {
            m.image_id: reason for _, group in groups for m, reason in duplicates.dropped(group)
        }
        for split, entries in collected.entries.items():
            kept, copies = duplicates.drop_copies(entries, drops)
            for entry, reason in copies:
                counters["images_dropped_as_duplicates"] += 1
                collected.rejects.append(Rejection(entry.image_id, entry.path, split, reason))
            collected.entries[split] = kept
    return groups


def _plan(config: JobConfig, listed: _Listed, collected: _Collected) -> dict[str, books.SplitPlan]:
    """(split -> SplitPlan): the books and the shard plan of every split seen."""
    rejected = collections.defaultdict(list)
    for rejection in collected.rejects:
        rejected[rejection.split].append(keys.order_key(config.seed, rejection.image_id))
    plans = {}
    for split in sorted(set(listed.keys) | set(collected.entries) | set(rejected)):
        entries = collected.entries.get(split, [])
        plans[split] = books.plan_split(
            split,
            books.as_keys(listed.keys.get(split, [])),
            books.as_keys([e.key for e in entries]),
            books.as_keys(rejected.get(split, [])),
            sum(e.size for e in entries),
            config.target_shard_bytes,
            config.min_shards,
        )
    return plans


def _write_shards(
    config: JobConfig,
    collected: _Collected,
    plans: dict[str, books.SplitPlan],
    counters: Counter,
    shown: progress.Reporter,
) -> list[ShardInfo]:
    """Each split's records, cut by its plan, sorted, into temp files.

    Shards are written on one thread per conversion process: copying from the
    spill files, hashing and writing release the GIL, and the cores the
    conversion used would otherwise sit idle at the end of the run.
    """
    tasks = [
        (split, shard, plans[split].shards, list(batch.entries))
        for split, entries in sorted(collected.entries.items())
        for (_, shard), batch in by_shard(RecordBatch(split, tuple(entries)), plans)
    ]

    def write(task) -> ShardInfo:
        split, shard, count, records = task
        return write_shard(
            config.output, split, shard, count, sort_entries(records), config.index_files
        )

    threads = max(1, min(config.conversion_processes, len(tasks)))
    written = []
    with (
        concurrent.futures.ThreadPoolExecutor(threads) as pool,
        shown.phase("writing shards", len(tasks), "shards") as phase,
    ):
        for info in pool.map(write, tasks):
            written.append(info)
            phase.update(1)
    for info in written:
        counters["shards_written"] += 1
        counters["shard_bytes_written"] += info.num_bytes
    return written


def run(config: JobConfig, shown: progress.Reporter = progress.SILENT) -> dict[str, int]:
    """Runs the whole job; returns its counters (the names Beam's metrics would carry).

    ``shown``: where each phase's progress goes (:mod:`progress`).

    Raises:
        BooksDoNotBalance: the job lost, doubled or rejected too many images
            (imagerecords.json is then not written).
    """
    counters: Counter = Counter()
    listed = _Listed()
    converter = pooled.PoolConverter(
        config.image,
        config.seed,
        config.layout.classes,
        config.spill_directory,
        config.conversion_processes,
    )
    try:
        old = _read_old(config, converter, shown) if config.reuse else None
        with shown.phase("converting") as phase:
            refs = _list_images(config, listed, counters)
            collected = _convert(config, refs, counters, phase, converter, old)
            phase.set_total(counters["images_listed"])  # the exact count, now that listing is done
    finally:
        converter.close()
    groups = _find_duplicates(config, collected, counters)
    plans = _plan(config, listed, collected)
    planned = sum(plan.shards for plan in plans.values())
    shown.step(f"planned {planned} shards in {len(plans)} splits")
    shards = _write_shards(config, collected, plans, counters, shown)
    shown.step("publishing: the lists, the books, the shards renamed, imagerecords.json last")
    Finalizer(config).run(
        shards,
        collected.rejects,
        plans.items(),
        listed.skipped,
        groups,
        counters[pooled.REUSED_COUNTER],
    )
    return {name: value for name, value in counters.items() if value}

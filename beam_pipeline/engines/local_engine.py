"""The local engine: the Beam graph's job, run in this process and its local pool, no Beam.

The same stage code as ``pipeline.build``, in the same order (:func:`run` is the whole
flow), so the same bytes and counters (docs/architecture.md, "The local engine").
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections import Counter

from beam_pipeline.core import counters, groups
from beam_pipeline.core.elements import Converted, ImageRef, RecordBatch, Rejection
from beam_pipeline.engines import local_pool, pooled, progress
from beam_pipeline.features.dedupe import feature as dedupe_feature
from beam_pipeline.features.near import feature as near_feature
from beam_pipeline.features.reuse import feature as reuse_feature
from beam_pipeline.features.reuse import scan as reuse_scan
from beam_pipeline.features.reuse import stage as reuse
from beam_pipeline.stages import convert, list_images, outcomes, plan
from beam_pipeline.stages.finalize import Finalizer, groups_block
from beam_pipeline.stages.job_config import JobConfig
from beam_pipeline.stages.shards import WrittenShard, by_shard, sort_entries, write_shard
from beam_pipeline.storage import discovery, listing

# The features' steps over the converted batches, in the order they run (hooks.LocalStep).
STEPS = (
    dedupe_feature.LOCAL,
    near_feature.LOCAL,
)


def run(
    config: JobConfig,
    shown: progress.Reporter = progress.SILENT,
    pool: local_pool.Pool | None = None,
) -> dict[str, int]:
    """Runs the whole job; returns its counters (core/counters.py, those above zero).

    ``shown``: where each phase's progress goes (:mod:`progress`). ``pool``: the
    conversion processes the command line forked (None: forked here).

    Raises:
        BooksDoNotBalance: the job lost, doubled or rejected too many images
            (imagerecords.json is then not written).
    """
    counted: Counter = Counter()
    books, skipped, census = plan.Books(), [], groups.Census()
    processes = config.conversion_processes
    task = convert.SpillTask.of(config, reuse_feature.take_or_convert)
    converter = pooled.PoolConverter(task, processes, pool)
    try:
        # List and Convert, interleaved (listing runs as fast as conversion pulls it)
        old = _read_old(config, converter, shown, counted) if config.reuse else None
        with shown.phase("converting") as phase:
            refs = _list_images(config, books, skipped, census, counted)
            batches, rejects = _convert(config, refs, counted, phase, converter, old)
            phase.set_total(counted[counters.LISTED])  # the exact count, now that listing is done
    finally:
        converter.close()
    # The features' steps, in order: each takes the batches the one before kept
    shown.step("planning: duplicate groups, the books, the shard plan")
    results = {}
    for step in STEPS:
        batches, copies, results[step.name] = step.run(config, batches, counted)
        rejects += copies
    # Plan
    for batch in batches:
        books.add(*plan.written(batch))
    for rejection in rejects:
        books.add(*plan.rejected(config.seed, rejection))
    plans = books.plans(config)
    shown.step(f"planned {sum(p.shards for p in plans.values())} shards in {len(plans)} splits")
    # Write
    shards = _write_shards(config, batches, plans, counted, shown)
    # Finalize
    shown.step("publishing: the lists, the books, the shards renamed, imagerecords.json last")
    blocks = [groups_block(config, census), *reuse_feature.blocks(config, counted[counters.REUSED])]
    blocks += [block for step in STEPS for block in step.blocks(config, results)]
    Finalizer(config).run(shards, rejects, plans.items(), skipped, blocks)
    return {name: value for name, value in counted.items() if value}


def _list_images(
    config: JobConfig, books: plan.Books, skipped: list, census: groups.Census, counted: Counter
):
    """Every source's ImageRefs, in order; the listed keys go to ``books``, each
    source's groups to ``census``."""
    layout, seed, splits = config.layout, config.seed, config.splits
    for source in layout.sources:
        for row in list_images.list_source(layout, source, seed, splits, config.group_by):
            if isinstance(row, ImageRef):
                yield row
            elif isinstance(row, listing.Skipped):
                skipped.append(row)
            elif isinstance(row, groups.Census):
                census.merge(row)
            else:
                counted[counters.LISTED] += len(row.tally.listed)
                books.add(*row)


def _read_old(
    config: JobConfig, converter: pooled.PoolConverter, shown: progress.Reporter, counted: Counter
) -> reuse_scan.OldIndex:
    """--reuse's dataset, scanned on the pool (a process per shard): its records by ID,
    but those of shards that failed their check (counted)."""
    old = reuse.open_again(config.reuse, config.image)
    with shown.phase(f"reading {old.path}", len(old.shards), "shards") as phase:

        def run(fn, *args):
            future = converter.run_aside(fn, *args)
            future.add_done_callback(lambda _: phase.update(1))
            return future

        index = reuse_scan.build_index(old.shards, run)
    counted[counters.OLD_DISTRUSTED] += index.distrusted
    return index


def _convert(
    config: JobConfig,
    refs,
    counted: Counter,
    shown: progress.Phase,
    converter: pooled.PoolConverter,
    old: reuse_scan.OldIndex | None,
) -> tuple[list[RecordBatch], list[Rejection]]:
    """ImageRefs -> a RecordBatch of records (spill references) per split, and the
    rejections, on the local pool.

    ``old``: --reuse's records: each image goes to the pool with the one of its ID.
    It is closed (its arrays freed) once every image has been looked up, before
    the last conversions finish and the process tree is at its largest.
    """
    # The total comes from a quick count on a pool process: listing itself only
    # runs as fast as conversion pulls it.
    estimate = converter.run_aside(discovery.estimate_image_count, config.layout)
    entries, rejects = collections.defaultdict(list), []

    def collect(finished):
        now, done = Counter(), 0
        for outcome, how in finished:
            done += 1
            now.update(outcomes.counts(outcome, how))
            result = outcomes.interned(outcome).result
            if isinstance(result, Converted):
                entries[result.split].append(result.entry)
            else:
                rejects.append(result)
        counted.update(now)
        if shown.total is None and estimate.done() and not estimate.exception():
            shown.set_total(max(estimate.result(), shown.done))
        if done:
            resumed = now[counters.RESUMED]
            rejected, reused = now[counters.REJECTED], now[counters.REUSED]
            shown.update(done, skipped=resumed, resumed=resumed, rejected=rejected, reused=reused)

    for ref in refs:
        collect(converter.add(ref, old.get(ref.image_id) if old is not None else None))
    if old is not None:
        old.close()
    collect(converter.finish())
    batches = [RecordBatch(split, tuple(entries.pop(split))) for split in sorted(entries)]
    return batches, rejects


def _write_shards(
    config: JobConfig,
    batches: list[RecordBatch],
    plans: dict,
    counted: Counter,
    shown: progress.Reporter,
) -> list[WrittenShard]:
    """Each split's records, cut by its plan, sorted, into temp files.

    Shards are written on one thread per conversion process: copying from the
    spill files, hashing and writing release the GIL, and the cores the
    conversion used would otherwise sit idle at the end of the run.
    """
    tasks = [
        (split, shard, plans[split].shards, list(part.entries))
        for batch in batches
        for (split, shard), part in by_shard(batch, plans)
    ]

    threads = max(1, min(config.conversion_processes, len(tasks)))
    total = sum(len(records) for *_, records in tasks)
    written = []
    with (
        concurrent.futures.ThreadPoolExecutor(threads) as executor,
        shown.phase(f"writing {len(tasks)} shards", total, "records") as phase,
    ):
        # Counted in records, not shards: a run of ten big shards would otherwise
        # show 0% for minutes. The threads report through one lock.
        lock = threading.Lock()

        def count(n: int) -> None:
            with lock:
                phase.update(n)

        def write(task) -> WrittenShard:
            split, shard, shards, records = task
            entries = sort_entries(records)
            return write_shard(
                config.output, split, shard, shards, entries, config.index_files, count
            )

        written = list(executor.map(write, tasks))
    for info in written:
        counted[counters.SHARDS_WRITTEN] += 1
        counted[counters.SHARD_BYTES_WRITTEN] += info.num_bytes
    return written

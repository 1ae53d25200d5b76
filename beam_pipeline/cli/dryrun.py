"""``--dry_run``: what a conversion would do, from a listing and a sample; writes nothing.

Lists the whole input, converts a seeded sample in memory with the job's own code,
drops its copies with the run's own Duplicates and Near duplicates steps, and makes a
:class:`RunForecast` (exact when the sample is the whole input), then renders it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import posixpath
import random
import sys
import tempfile
import time
from collections.abc import Sequence

from beam_pipeline.cli import arguments, estimates
from beam_pipeline.cli.forecast import CopiesForecast, RunForecast, SplitEstimate, render
from beam_pipeline.core import books, groups, images, metadata, settings
from beam_pipeline.core.elements import ImageRef, RecordBatch, Rejection, RejectKind, ShardEntry
from beam_pipeline.core.errors import UsageError
from beam_pipeline.engines import choice
from beam_pipeline.features.dedupe import duplicates
from beam_pipeline.features.dedupe import stage as dedupe
from beam_pipeline.features.near import search as near_search
from beam_pipeline.features.near import stage as near
from beam_pipeline.features.reuse import scan as reuse_scan
from beam_pipeline.features.reuse import stage as reuse
from beam_pipeline.stages import convert, list_images, plan
from beam_pipeline.storage import discovery, listing, paths, reading

SAMPLE_SIZE = 300
# The sample's CPU budget (SAMPLE_MIN images at least): large photos must not slow it.
SAMPLE_CPU_BUDGET_S = 8.0
SAMPLE_MIN = 30
_REMOTE_READERS = 16  # threads reading sampled images from GCS

# ------------------------------------------------------------------ listing


@dataclasses.dataclass
class InputCensus:
    """What listing the whole input with the job's List stage found."""

    refs: list[ImageRef]  # sorted, so that the sample drawn with the seed is the same
    counts: dict[tuple[str, int], int]  # (split, label) -> images
    listed: dict[str, list[int]]  # split -> the order keys listed, for the Plan stage
    skipped: dict[str, list[str]]  # why -> the relative paths skipped for it
    extensions: collections.Counter
    input_bytes: int | None  # total size of the listed files, when the listing says
    groups: groups.Census  # who is in which split, as the job's listing counts it


def _rows(layout: discovery.Layout, source, sizes: list[int]):
    """``layout.rows(source)``, but a class folder's are listed with their sizes
    (added to ``sizes``) and hidden entries (as Skipped): ``listing.sized_folder_rows``."""
    if layout.kind == "manifest":
        yield from layout.rows(source)
        return
    for row in listing.sized_folder_rows(source, layout.root, sizes=True, hidden=True):
        if isinstance(row, listing.Skipped):
            yield row
            continue
        *head, size = row
        sizes.append(size or 0)
        yield (*head, None)  # in no group the layout names


def census(layout: discovery.Layout, seed: int, fractions, group_by=None) -> InputCensus:
    """Lists the whole input with the job's List stage (``list_images.list_source``),
    a source per thread (gs:// through Beam's FileSystems), converting nothing."""
    root, sizes = layout.root, []
    folders = layout.kind != "manifest"
    refs, skipped, found, listed = [], collections.defaultdict(list), groups.Census(), {}
    for path in layout.loose_files:
        skipped[listing.NOT_IN_CLASS_FOLDER].append(paths.relative_id(root, path))

    def list_one(source) -> list:
        rows = _rows(layout, source, sizes)
        return list(list_images.list_source(layout, source, seed, fractions, group_by, rows))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for items in pool.map(list_one, layout.sources):
            for item in items:
                if isinstance(item, ImageRef):
                    refs.append(item)
                elif isinstance(item, listing.Skipped):
                    skipped[item.reason].append(
                        paths.relative_id(root, item.path) if folders else item.path
                    )
                elif isinstance(item, groups.Census):
                    found.merge(item)
                else:  # the keys the job's books count as listed
                    listed.setdefault(item.split, []).extend(item.tally.listed)
    refs.sort()
    counts = collections.Counter((ref.split, ref.label) for ref in refs)
    extensions = collections.Counter(
        posixpath.splitext(r.image_id)[1].lower() or "(none)" for r in refs
    )
    skipped = {why: sorted(names) for why, names in skipped.items()}
    total = sum(sizes) if folders else None
    return InputCensus(refs, dict(counts), listed, skipped, extensions, total, found)


# ------------------------------------------------------------------ sample


@dataclasses.dataclass
class Sample:
    """The converted sample: its records per split, its rejections and the CPU it took."""

    converted: int  # images converted (records + rejections)
    entries: dict[str, list[ShardEntry]]  # split -> the records, as the job's batches hold them
    rejections: list[Rejection]
    cpu_s: float  # conversion CPU time in this process
    wall_s: float
    read_remote: bool  # sampled images were read from a remote store before timing


def _read_all(paths: Sequence[str]) -> list[bytes | Exception]:
    def read(path):
        try:
            return reading.read_bytes(path)
        except Exception as error:  # unreadable: the job rejects it the same way
            return error

    with concurrent.futures.ThreadPoolExecutor(_REMOTE_READERS) as pool:
        return list(pool.map(read, paths))


def convert_sample(
    refs: Sequence[tuple[str, str, int, str]],
    spec: images.ImageSpec,
    seed: int,
    classes: Sequence[str],
    size: int = SAMPLE_SIZE,
    cpu_budget_s: float = SAMPLE_CPU_BUDGET_S,
) -> Sample:
    """Converts up to ``size`` images drawn with ``seed``, in memory, one at a time."""
    chosen = random.Random(seed).sample(list(refs), min(size, len(refs)))
    remote = [ref.path for ref in chosen if not paths.is_local(ref.path)]
    prefetched = dict(zip(remote, _read_all(remote), strict=True))
    sample = Sample(0, collections.defaultdict(list), [], 0.0, 0.0, bool(remote))
    classes = tuple(classes)
    wall_start = time.perf_counter()
    for ref in chosen:
        if sample.converted >= SAMPLE_MIN and sample.cpu_s > cpu_budget_s:
            break
        started = time.process_time()
        if ref.path in prefetched:
            data = prefetched[ref.path]
            if isinstance(data, Exception):
                decoded = convert.unreadable(data)
            else:
                decoded = convert.decode_data(data, spec)
        else:
            decoded = convert.decode_path(ref.path, spec)
        outcome = convert.finish(ref, decoded, seed, classes)
        sample.cpu_s += time.process_time() - started
        sample.converted += 1
        result = outcome.result
        if isinstance(result, Rejection):
            sample.rejections.append(result)
        else:  # the record's bytes are not needed: its framed size is
            sample.entries[result.split].append(result.entry._replace(data=b""))
    sample.wall_s = time.perf_counter() - wall_start
    sample.entries = dict(sample.entries)
    return sample


@dataclasses.dataclass(frozen=True)
class Copies:
    """What the job's Duplicates and Near duplicates stages make of the sample
    (``dedupe.find_groups``, ``near.find_local`` and their drops, as the local
    engine runs them): the records kept and the copies ``--dedupe`` drops."""

    batches: tuple[RecordBatch, ...]
    dropped: tuple[Rejection, ...]  # identical copies, then near ones
    exact: tuple[dedupe.Group, ...]
    near: near.Found


def find_copies(sample: Sample, mode: str) -> Copies:
    """The job's duplicate rules over the sample; ``mode``: ``--dedupe`` ("", exact, near)."""
    batches = [RecordBatch(s, tuple(sample.entries[s])) for s in sorted(sample.entries)]
    exact = dedupe.find_groups(batches)
    dropped: list[Rejection] = []
    if mode and exact:
        batches, copies = dedupe.drop_all_copies(batches, exact)
        dropped += copies
    with tempfile.TemporaryDirectory(prefix="imagerecords-dry-run-") as work:
        found = near.find_local(batches, work)
    if mode == "near" and found.groups:
        batches, copies = near.drop_all_near(batches, found)
        dropped += copies
    return Copies(tuple(batches), tuple(dropped), tuple(exact), found)


# ---------------------------------------------------------------- forecast


def estimate_splits(
    census: InputCensus, sample: Sample, copies: Copies, split_names, config, whole: bool
) -> list[SplitEstimate]:
    """Records, rejects, drops, bytes and shards per split, planned by the job's Plan
    stage (``plan.Books``, ``config``'s shard target).

    ``whole``: the sample is the whole input, so the books are the run's own (its
    records, rejections and dropped copies); else the sample's reject rate, each
    split's drop rate and the mean record size are applied to its listed keys.
    """
    tallies = plan.Books()
    drops: collections.Counter = collections.Counter(r.split for r in copies.dropped)
    rejects: collections.Counter = collections.Counter(r.split for r in sample.rejections)
    if whole:
        for split, listed in census.listed.items():
            tallies.add(split, books.KeyTally(listed=tuple(listed)))
        for batch in copies.batches:
            tallies.add(*plan.written(batch))
        for rejection in (*sample.rejections, *copies.dropped):
            tallies.add(*plan.rejected(config.seed, rejection))
    else:
        kept = [e.size for b in copies.batches for e in b.entries]
        mean = sum(kept) / len(kept) if kept else 0.0
        reject_rate = len(sample.rejections) / max(1, sample.converted)
        # Drops by each split's own rate: --dedupe near keeps the train copy, so they
        # fall in val and test more than in train. Bad images are no split's.
        sampled = rejects + collections.Counter({s: len(e) for s, e in sample.entries.items()})
        dropped, drops, rejects = drops, collections.Counter(), collections.Counter()
        for split, listed in census.listed.items():
            rejects[split] = round(len(listed) * reject_rate)
            drop_rate = dropped[split] / max(1, sampled[split])
            drops[split] = min(round(len(listed) * drop_rate), len(listed) - rejects[split])
            records = len(listed) - rejects[split] - drops[split]
            written = books.KeyTally(
                listed=tuple(listed),
                written=tuple(listed[:records]),
                record_bytes=round(records * mean),
            )
            tallies.add(split, written)
            tallies.add(split, books.KeyTally(rejected=tuple(listed[records:])))
    plans = tallies.plans(config)
    out = []
    for name in split_names:
        p = plans.get(name)
        if p is None:
            out.append(SplitEstimate(name, 0, 0, 0, 0, 0))
        else:
            out.append(
                SplitEstimate(
                    name,
                    p.listed,
                    p.written,
                    rejects[name],
                    p.record_bytes,
                    p.shards,
                    drops[name],
                )
            )
    return out


def copies_forecast(copies: Copies, split_names, dedupe: str, classes) -> CopiesForecast:
    """The blocks the run's imagerecords.json would hold, made by the run's functions."""
    first = duplicates.first_split(list(split_names))
    exact = [members for _, members in copies.exact]
    near_groups = [g.members for g in copies.near.groups]
    conflicts = duplicates.run_conflicts(exact, near_groups, dedupe, near_search.keeper)
    kinds = collections.Counter(r.kind for r in copies.dropped)
    return CopiesForecast(
        duplicates.info_block(exact, first),
        near_search.info_block(copies.near.groups, copies.near.oversized),
        kinds[RejectKind.DUPLICATE],
        kinds[RejectKind.NEAR_DUPLICATE],
        duplicates.conflicts_block(conflicts, classes),
    )


def local_run(config, options, beam) -> tuple[str, int, bool]:
    """How the job would convert here: (what runs it, its conversion processes,
    whether on Beam), planned as the job plans it (``choice.plan``). A job for another runner (Dataflow,
    Dask) is estimated on the local engine, for comparison."""
    engine = choice.plan(beam, options.local_processes, config.layout, config.output)
    if engine.local:
        return "local engine", engine.processes, False
    if engine.beam.on_direct_runner:
        return f"Beam DirectRunner {engine.beam.direct_running_mode}", engine.converting, True
    return "local engine", options.local_processes or os.cpu_count() or 1, False


def make_forecast(command, output_problem: str | None, old: reuse.OldDataset = None):
    """Lists, samples and estimates: the :class:`RunForecast` and --reuse's forecast (or None).

    ``command``: the parsed command line (``arguments.Command``), its input discovered.
    ``old``: --reuse's dataset: what the run would reuse, convert and drop is
    counted (reuse.forecast) and the time estimates are for that run.
    """
    started = time.perf_counter()
    config, beam = command.config, command.beam
    layout = config.layout
    try:
        machine = estimates.machine_type(beam.machine_type or estimates.DEFAULT_MACHINE_TYPE)
    except ValueError as error:
        raise UsageError(str(error)) from None
    fractions = config.splits
    found = census(layout, config.seed, fractions, config.group_by)
    listed_s = time.perf_counter() - started
    if not found.refs:
        raise UsageError(f"--input: no image files found under {layout.root}")
    # The job's split order (finalize): the config's, then any others a manifest names.
    split_names = metadata.split_order(config.split_names, [split for split, _ in found.counts])
    sample = convert_sample(
        found.refs, config.image, config.seed, layout.classes, SAMPLE_SIZE, SAMPLE_CPU_BUDGET_S
    )
    whole = sample.converted == len(found.refs)
    copies = find_copies(sample, config.dedupe)
    splits = estimate_splits(found, sample, copies, split_names, config, whole)
    total_images = len(found.refs)
    cpu_per_image = sample.cpu_s / max(1, sample.converted)
    ahead = None
    if old is not None:
        index = reuse_scan.build_index(old.shards)
        budget = reuse.FORECAST_BUDGET_S
        ahead = reuse.forecast(
            found.refs, index, layout.classes, config.image.pixels, config.seed, budget
        )
    run_cpu_per_image = ahead.cpu_per_image(cpu_per_image) if ahead else cpu_per_image
    engine, processes, on_beam = local_run(config, command.options, beam)
    total_bytes = sum(s.bytes for s in splits)
    asked = None if layout.kind == "presplit" else fractions
    result = RunForecast(
        root=layout.root,
        layout_kind=layout.kind,
        output_problem=output_problem,
        listed_s=listed_s,
        images=total_images,
        input_bytes=found.input_bytes,
        classes=tuple(layout.classes),
        split_names=tuple(split_names),
        counts=found.counts,
        groups=groups.info_block(found.groups, config.group_by, split_names, asked),
        skipped=found.skipped,
        extensions=dict(found.extensions),
        reuse_line=ahead.describe(old) if ahead else None,
        image_settings=settings.describe(settings.image_settings(config.image)),
        sampled=sample.converted,
        whole=whole,
        splits=tuple(splits),
        rejections=tuple(sample.rejections),
        dedupe=config.dedupe,
        copies=copies_forecast(copies, split_names, config.dedupe, layout.classes),
        max_reject_fraction=config.max_reject_fraction,
        cpu_per_image=cpu_per_image,
        read_remote=sample.read_remote,
        engine=engine,
        processes=processes,
        elsewhere="" if beam.on_direct_runner else f"; the job runs on {beam.runner}",
        local_wall_s=estimates.local_wall_s(total_images, run_cpu_per_image, processes, on_beam),
        machine=machine,
        cost=estimates.dataflow_cost(total_images, run_cpu_per_image, total_bytes, machine),
        took_s=time.perf_counter() - started,
    )
    return result, ahead


def report(command, output_problem: str | None, out=None, old: reuse.OldDataset = None) -> dict:
    """Forecasts, prints the forecast; returns its numbers (for tests and tools)."""
    result, ahead = make_forecast(command, output_problem, old)
    (out or sys.stdout).write(render(result))
    numbers = result.numbers()
    if ahead:
        numbers["reuse"] = dataclasses.asdict(ahead)
    return numbers


def run(command, check_output) -> dict:
    """The ``--dry_run`` entry point of the CLI: the same input checks as a real run.

    Args:
        command: the parsed command line (``arguments.Command``).
        check_output: the CLI's read-only output check; what it refuses is
            reported as a warning instead of stopping the dry run.
    """
    command = arguments.discover(command)
    config = command.config
    layout, output = config.layout, config.output
    problem = None
    try:
        root = layout.root if layout.kind != "manifest" else None
        check_output(output, root, command.options.overwrite)
    except UsageError as error:
        problem = str(error)
    old = None
    if config.reuse:
        try:
            old = reuse.open_old(config.reuse, config.image)
            reuse.check(old, output, config.image)
        except UsageError as error:
            problem, old = problem or str(error), None
    return report(command, problem, old=old)

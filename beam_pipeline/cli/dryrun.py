"""``--dry_run``: what a conversion would do, from a listing and a sample; writes nothing.

Lists the whole input, converts a seeded sample in memory with the job's own code,
and extrapolates bytes, shards, rejects, speed, wall time and Dataflow cost.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import posixpath
import random
import re
import sys
import time
from collections.abc import Sequence

from beam_pipeline.cli import arguments
from beam_pipeline.core import books, groups, images, metadata, settings
from beam_pipeline.core.elements import ImageRef, Rejection
from beam_pipeline.core.errors import UsageError
from beam_pipeline.engines import choice
from beam_pipeline.stages import convert, list_images, plan, reuse, reuse_scan
from beam_pipeline.storage import discovery, listing, paths, reading

SAMPLE_SIZE = 300
# The sample's CPU budget (SAMPLE_MIN images at least): large photos must not slow it.
SAMPLE_CPU_BUDGET_S = 8.0
SAMPLE_MIN = 30
_REMOTE_READERS = 16  # threads reading sampled images from GCS

# How the estimates turn this machine's per-image CPU time into job times.
# Local: the local engine's speed per core as a fraction of the bare codec's,
# plus a fixed start-up; the same for the pooled DirectRunner (--runner
# DirectRunner). All from the benchmark (docs/performance.md, "Local engine"),
# so they are only as right as its machine is like this one.
LOCAL_EFFICIENCY = 0.95
LOCAL_FIXED_S = 0.3
BEAM_LOCAL_EFFICIENCY = 0.83
BEAM_LOCAL_FIXED_S = 1.5
# Dataflow: the planning factor of docs/scale.md's cost section (an
# assumption, not a measurement): twice the local CPU per image, for GCS reads
# over HTTPS, Runner v2's data plane and shuffle serialization.
DATAFLOW_FACTOR = 2.0
DEFAULT_MACHINE_TYPE = "n2-standard-4"

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")


@dataclasses.dataclass(frozen=True)
class Prices:
    """Dataflow batch list prices in USD, as in docs/scale.md (no discounts, no free tier)."""

    region: str = "us-central1"
    as_of: str = "2024, not re-checked"
    source: str = "cloud.google.com/dataflow/pricing"
    vcpu_hour: float = 0.056
    gb_hour: float = 0.003557
    shuffle_gb: float = 0.011  # Dataflow Shuffle, per GB processed (batch)
    pd_gb_hour: float = 0.000054  # standard persistent disk
    disk_gb: int = 25  # boot disk per worker when Dataflow Shuffle is on (the default)
    gcs_read_1000: float = 0.0004  # Cloud Storage class B operations (one read per image)


PRICES = Prices()

# GB of memory per vCPU by machine series and shape (Compute Engine machine types).
_MEMORY_PER_VCPU = {
    ("n1", "standard"): 3.75,
    ("n1", "highmem"): 6.5,
    ("n1", "highcpu"): 0.9,
    ("n2", "standard"): 4.0,
    ("n2", "highmem"): 8.0,
    ("n2", "highcpu"): 1.0,
    ("n2d", "standard"): 4.0,
    ("n2d", "highmem"): 8.0,
    ("n2d", "highcpu"): 1.0,
    ("e2", "standard"): 4.0,
    ("e2", "highmem"): 8.0,
    ("e2", "highcpu"): 1.0,
    ("c2", "standard"): 4.0,
    ("c2d", "standard"): 4.0,
    ("c2d", "highmem"): 8.0,
    ("c2d", "highcpu"): 2.0,
    ("c3", "standard"): 4.0,
    ("c3", "highmem"): 8.0,
    ("c3", "highcpu"): 2.0,
    ("c3d", "standard"): 4.0,
    ("c3d", "highmem"): 8.0,
    ("c3d", "highcpu"): 2.0,
    ("c4", "standard"): 3.75,
    ("c4", "highmem"): 7.75,
    ("c4", "highcpu"): 2.0,
    ("n4", "standard"): 4.0,
    ("n4", "highmem"): 8.0,
    ("n4", "highcpu"): 2.0,
}


# ------------------------------------------------------------ pure estimates


@dataclasses.dataclass(frozen=True)
class MachineType:
    name: str
    vcpus: int
    memory_gb: float


def machine_type(name: str) -> MachineType:
    """vCPUs and memory of a Compute Engine machine type name.

    ``custom-8-16384`` (and ``n2-custom-8-16384``) give memory in MB.

    Raises:
        ValueError: a name that is not ``SERIES-SHAPE-VCPUS`` or a custom type.
    """
    custom = re.fullmatch(r"(?:[a-z0-9]+-)?custom-(\d+)-(\d+)(?:-ext)?", name)
    if custom:
        vcpus, memory_mb = int(custom.group(1)), int(custom.group(2))
        return MachineType(name, vcpus, memory_mb / 1024)
    match = re.fullmatch(r"([a-z][a-z0-9]*)-(standard|highmem|highcpu)-(\d+)", name)
    if not match or (match.group(1), match.group(2)) not in _MEMORY_PER_VCPU:
        raise ValueError(
            f"unknown machine type {name!r}: expected e.g. n2-standard-4, c3-highcpu-8 "
            "or custom-8-16384"
        )
    vcpus = int(match.group(3))
    return MachineType(name, vcpus, vcpus * _MEMORY_PER_VCPU[match.group(1), match.group(2)])


@dataclasses.dataclass(frozen=True)
class DataflowCost:
    vcpu_hours: float
    worker_hours: float
    shuffle_gb: float
    usd: float


def dataflow_cost(
    images: int, cpu_s_per_image: float, output_bytes: float, machine: MachineType, prices=PRICES
) -> DataflowCost:
    """Worker time and list-price cost of converting ``images`` on Dataflow.

    Workers are billed per vCPU-hour and GB-hour; every record passes once
    through Dataflow Shuffle (the GroupByKey into shards), billed here as
    written plus read (an upper bound, as in docs/scale.md); each image is one
    Cloud Storage read. Start-up and shut-down of the workers (a few minutes
    per job) are not included.
    """
    vcpu_hours = images * cpu_s_per_image * DATAFLOW_FACTOR / 3600
    worker_hours = vcpu_hours / machine.vcpus
    shuffle_gb = 2 * output_bytes / 1e9
    usd = (
        vcpu_hours * prices.vcpu_hour
        + worker_hours * machine.memory_gb * prices.gb_hour
        + worker_hours * prices.disk_gb * prices.pd_gb_hour
        + shuffle_gb * prices.shuffle_gb
        + images / 1000 * prices.gcs_read_1000
    )
    return DataflowCost(vcpu_hours, worker_hours, shuffle_gb, usd)


def local_wall_s(
    images: int, cpu_s_per_image: float, processes: int, on_beam: bool = False
) -> float:
    """Wall time of a local run with ``processes`` conversion processes
    (the local engine, or Beam's DirectRunner when ``on_beam``)."""
    fixed, efficiency = (
        (BEAM_LOCAL_FIXED_S, BEAM_LOCAL_EFFICIENCY)
        if on_beam
        else (LOCAL_FIXED_S, LOCAL_EFFICIENCY)
    )
    return fixed + images * cpu_s_per_image / (max(1, processes) * efficiency)


def reason_kind(reason: str) -> str:
    """The stable head of a rejection reason: ``corrupt image``, ``not an image``, ..."""
    return reason.split(":", 1)[0].strip()


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
    """The converted sample: sizes, rejections and the CPU it took."""

    converted: int  # images converted (records + rejections)
    record_bytes: list[int]  # framed size of each record, as written to a shard
    by_split: dict[str, list[int]]
    rejections: list[tuple[str, str]]  # (image_id, reason)
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
    sample = Sample(0, [], collections.defaultdict(list), [], 0.0, 0.0, bool(remote))
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
            sample.rejections.append((result.image_id, result.reason))
        else:
            size_framed = result.entry.size  # the framed record, as the shard holds it
            sample.record_bytes.append(size_framed)
            sample.by_split[result.split].append(size_framed)
    sample.wall_s = time.perf_counter() - wall_start
    sample.by_split = dict(sample.by_split)
    return sample


# ------------------------------------------------------------------ report


@dataclasses.dataclass(frozen=True)
class SplitEstimate:
    name: str
    images: int
    records: float
    rejects: float
    bytes: float
    shards: int


def estimate_splits(
    census: InputCensus, sample: Sample, split_names, config
) -> list[SplitEstimate]:
    """Records, bytes and shards per split: the sample's reject rate and mean record
    size applied to each split's listed keys, which the job's Plan stage
    (``plan.Books``, ``config``'s shard target) then cuts into shards."""
    reject_rate = len(sample.rejections) / sample.converted if sample.converted else 0.0
    mean_all = sum(sample.record_bytes) / len(sample.record_bytes) if sample.record_bytes else 0.0
    tallies = plan.Books()
    for split, listed in census.listed.items():
        records = len(listed) - round(len(listed) * reject_rate)
        written = books.KeyTally(
            listed=tuple(listed),
            written=tuple(listed[:records]),
            record_bytes=round(records * mean_all),
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
                SplitEstimate(name, p.listed, p.written, p.rejected, p.record_bytes, p.shards)
            )
    return out


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _fmt_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _files(n: int) -> str:
    return f"{n:,} file" if n == 1 else f"{n:,} files"


def _fmt_hours(hours: float) -> str:
    return f"{hours:,.1f}" if hours >= 10 else f"{hours:.3g}"


def _fmt_usd(usd: float) -> str:
    return f"~${usd:,.2f}" if usd >= 0.01 else "under $0.01"


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


def report(command, output_problem: str | None, out=None, old: reuse.OldDataset = None) -> dict:
    """Lists, samples, estimates and prints; returns the numbers (for tests and tools).

    ``command``: the parsed command line (``arguments.Command``), its input discovered.

    ``old``: --reuse's dataset: what the run would reuse, convert and drop is
    counted (reuse.forecast) and the time estimates are for that run.
    """
    started = time.perf_counter()
    config, beam = command.config, command.beam
    layout = config.layout
    out = out or sys.stdout
    say = lambda text="": print(text, file=out)  # noqa: E731
    try:
        machine = machine_type(beam.machine_type or DEFAULT_MACHINE_TYPE)
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
    splits = estimate_splits(found, sample, split_names, config)
    total_images = len(found.refs)
    cpu_per_image = sample.cpu_s / max(1, sample.converted)
    ahead = None
    if old is not None:
        index = reuse_scan.build_index(old.shards)
        budget = reuse.FORECAST_BUDGET_S
        ahead = reuse.forecast(found.refs, index, layout.classes, config.seed, budget)
    run_cpu_per_image = ahead.cpu_per_image(cpu_per_image) if ahead else cpu_per_image
    engine, processes, on_beam = local_run(config, command.options, beam)
    total_bytes = sum(s.bytes for s in splits)
    cost = dataflow_cost(total_images, run_cpu_per_image, total_bytes, machine)

    say(f"dry run: nothing was written. Input {layout.root} ({layout.kind} layout)")
    if output_problem:
        say(f"warning: the real run would stop before starting: {output_problem}")
    size_note = f", {_fmt_bytes(found.input_bytes)}" if found.input_bytes else ""
    say(
        f"listed {total_images:,} images{size_note} in {len(layout.classes)} classes "
        f"in {listed_s:.1f} s"
    )
    say()
    width = max([5, *(len(c) for c in layout.classes)])
    say(f"{'class':<{width}}" + "".join(f"{s:>10}" for s in split_names) + f"{'total':>10}")
    for label, name in enumerate(layout.classes):
        row = [found.counts.get((s, label), 0) for s in split_names]
        say(f"{name:<{width}}" + "".join(f"{n:>10,}" for n in row) + f"{sum(row):>10,}")
    say(
        f"{'total':<{width}}" + "".join(f"{e.images:>10,}" for e in splits) + f"{total_images:>10,}"
    )
    empty = [
        name
        for label, name in enumerate(layout.classes)
        if not any(found.counts.get((s, label)) for s in split_names)
    ]
    if empty:
        say(f"warning: {len(empty)} classes have no images: {', '.join(empty[:10])}")
    asked = None if layout.kind == "presplit" else fractions
    grouped = groups.info_block(found.groups, config.group_by, split_names, asked)
    for line in groups.report_lines(grouped):
        say(line)
    for why, files in found.skipped.items():
        say(f"skipped ({why}): {_files(len(files))}, e.g. {', '.join(files[:3])}")
    odd = {ext: n for ext, n in found.extensions.items() if ext not in IMAGE_EXTENSIONS}
    if odd:
        shown = ", ".join(f"{ext} {n:,}" for ext, n in sorted(odd.items(), key=lambda x: -x[1]))
        say(f"other extensions (converted if the content is an image): {shown}")
    if ahead:
        say(ahead.describe(old))
    say()
    say(
        f"sample: {sample.converted} images converted in memory "
        f"({settings.describe(settings.image_settings(config.image))})"
    )
    say(
        f"{'split':<12}{'images':>10}{'records':>10}{'rejects':>9}{'output':>11}{'shards':>8}"
        f"{'per shard':>11}"
    )
    for e in splits:
        per_shard = _fmt_bytes(e.bytes / e.shards) if e.shards else "-"
        say(
            f"{e.name:<12}{e.images:>10,}{e.records:>10,.0f}{e.rejects:>9,.0f}"
            f"{_fmt_bytes(e.bytes):>11}{e.shards:>8}{per_shard:>11}"
        )
    reject_rate = len(sample.rejections) / max(1, sample.converted)
    if sample.rejections:
        kinds = collections.Counter(reason_kind(r) for _, r in sample.rejections)
        say(f"likely rejects: ~{reject_rate:.1%} ({len(sample.rejections)} of the sample)")
        for kind, n in kinds.most_common(5):
            example = next(i for i, r in sample.rejections if reason_kind(r) == kind)
            say(f"  ~{n / sample.converted * total_images:,.0f} {kind} (e.g. {example})")
        if reject_rate > config.max_reject_fraction:
            say(
                f"warning: ~{reject_rate:.1%} rejected is above --max_reject_fraction "
                f"{config.max_reject_fraction:g}: the job would likely fail"
            )
    else:
        say(f"likely rejects: none in the sample of {sample.converted}")
    say()
    per_s = 1 / cpu_per_image if cpu_per_image else float("inf")
    read_note = " (reading from storage not timed)" if sample.read_remote else ""
    say(
        f"speed on this machine: {per_s:,.0f} images/s per core, "
        f"{cpu_per_image * 1000:.1f} ms CPU per image{read_note}"
    )
    wall = local_wall_s(total_images, run_cpu_per_image, processes, on_beam)
    elsewhere = "" if beam.on_direct_runner else f"; the job runs on {beam.runner}"
    say(
        f"local run ({engine}, {processes} conversion processes{elsewhere}): "
        f"about {_fmt_duration(wall)}"
    )
    say(
        f"Dataflow on {machine.name} ({machine.vcpus} vCPU, {machine.memory_gb:g} GB): "
        f"~{_fmt_hours(cost.vcpu_hours)} vCPU-hours, ~{_fmt_bytes(cost.shuffle_gb * 1e9)} shuffled, "
        f"{_fmt_usd(cost.usd)} plus a few minutes of worker start-up"
    )
    say(
        f"  (at {PRICES.region} list prices, {PRICES.source}, {PRICES.as_of}: "
        f"${PRICES.vcpu_hour}/vCPU-h, ${PRICES.gb_hour}/GB-h, ${PRICES.shuffle_gb}/GB "
        f"shuffled, ${PRICES.gcs_read_1000} per 1,000 image reads; {DATAFLOW_FACTOR:g}x this "
        "machine's CPU per image: see docs/scale.md)"
    )
    say(f"dry run took {time.perf_counter() - started:.1f} s")
    return {
        "images": total_images,
        "splits": {
            e.name: {"images": e.images, "records": e.records, "bytes": e.bytes, "shards": e.shards}
            for e in splits
        },
        "sampled": sample.converted,
        "reject_rate": reject_rate,
        "cpu_s_per_image": cpu_per_image,
        "local_wall_s": wall,
        "dataflow": dataclasses.asdict(cost),
        "skipped": {why: len(paths) for why, paths in found.skipped.items()},
        **({"groups": grouped} if grouped else {}),
        **({"reuse": dataclasses.asdict(ahead)} if ahead else {}),
    }


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
            old = reuse.open_old(config.reuse)
            reuse.check(old, output, settings.image_settings(config.image))
        except UsageError as error:
            problem, old = problem or str(error), None
    return report(command, problem, old=old)

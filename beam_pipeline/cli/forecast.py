"""The dry run's forecast: what it holds (:class:`RunForecast`, made by ``dryrun.py``) and
how it is printed (:func:`render`)."""

from __future__ import annotations

import collections
import dataclasses

from beam_pipeline.cli.estimates import DATAFLOW_FACTOR, PRICES, DataflowCost, MachineType
from beam_pipeline.core import groups
from beam_pipeline.core.elements import Rejection

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")


@dataclasses.dataclass(frozen=True)
class SplitEstimate:
    name: str
    images: int
    records: float
    rejects: float
    bytes: float
    shards: int
    drops: float = 0  # copies --dedupe drops


@dataclasses.dataclass(frozen=True)
class CopiesForecast:
    """The duplicate counts the run's imagerecords.json would hold, over the sample."""

    exact: dict  # duplicates.info_block of the sample's groups
    near: dict  # near_search.info_block of the sample's near groups
    dropped_exact: int
    dropped_near: int
    conflicts: dict | None  # duplicates.conflicts_block: pictures in two classes


@dataclasses.dataclass(frozen=True)
class RunForecast:
    """Everything the dry run says, computed before a line is printed (:func:`render`)."""

    root: str
    layout_kind: str
    output_problem: str | None
    listed_s: float
    images: int  # listed
    input_bytes: int | None
    classes: tuple[str, ...]
    split_names: tuple[str, ...]
    counts: dict  # (split, label) -> images listed
    groups: dict | None  # groups.info_block of the listing
    skipped: dict  # why -> the relative paths skipped for it
    extensions: dict  # extension -> images
    reuse_line: str | None  # what --reuse's dataset gives, in a line
    image_settings: str  # settings.describe of the image settings
    sampled: int  # images converted in memory
    whole: bool  # the sample is the whole input: the counts per split are the run's
    splits: tuple[SplitEstimate, ...]
    rejections: tuple[Rejection, ...]  # the sample's bad images
    dedupe: str  # --dedupe: "", "exact" or "near"
    copies: CopiesForecast
    max_reject_fraction: float
    cpu_per_image: float
    read_remote: bool
    engine: str
    processes: int
    elsewhere: str  # the runner the job runs on, when the estimate is for another
    local_wall_s: float
    machine: MachineType
    cost: DataflowCost
    took_s: float

    @property
    def reject_rate(self) -> float:
        return len(self.rejections) / max(1, self.sampled)

    @property
    def limit_rate(self) -> float:
        """What --max_reject_fraction is held to: bad images and near drops (RejectKind.bad)."""
        return (len(self.rejections) + self.copies.dropped_near) / max(1, self.sampled)

    def numbers(self) -> dict:
        """The forecast as plain values (for tests and tools)."""
        return {
            "images": self.images,
            "splits": {
                e.name: {
                    "images": e.images,
                    "records": e.records,
                    "rejects": e.rejects,
                    "drops": e.drops,
                    "bytes": e.bytes,
                    "shards": e.shards,
                }
                for e in self.splits
            },
            "sampled": self.sampled,
            "whole": self.whole,
            "reject_rate": self.reject_rate,
            "duplicates": dataclasses.asdict(self.copies),
            "cpu_s_per_image": self.cpu_per_image,
            "local_wall_s": self.local_wall_s,
            "dataflow": dataclasses.asdict(self.cost),
            "skipped": {why: len(paths) for why, paths in self.skipped.items()},
            **({"groups": self.groups} if self.groups else {}),
        }


def reason_kind(reason: str) -> str:
    """The stable head of a rejection reason: ``corrupt image``, ``not an image``, ..."""
    return reason.split(":", 1)[0].strip()


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


def _input_lines(f: RunForecast) -> list[str]:
    """The listing: the input, the classes per split, groups, skipped files."""
    lines = [f"dry run: nothing was written. Input {f.root} ({f.layout_kind} layout)"]
    if f.output_problem:
        lines.append(f"warning: the real run would stop before starting: {f.output_problem}")
    size_note = f", {_fmt_bytes(f.input_bytes)}" if f.input_bytes else ""
    lines += [
        f"listed {f.images:,} images{size_note} in {len(f.classes)} classes in {f.listed_s:.1f} s",
        "",
    ]
    width = max([5, *(len(c) for c in f.classes)])
    lines.append(
        f"{'class':<{width}}" + "".join(f"{s:>10}" for s in f.split_names) + f"{'total':>10}"
    )
    for label, name in enumerate(f.classes):
        row = [f.counts.get((s, label), 0) for s in f.split_names]
        lines.append(f"{name:<{width}}" + "".join(f"{n:>10,}" for n in row) + f"{sum(row):>10,}")
    lines.append(
        f"{'total':<{width}}" + "".join(f"{e.images:>10,}" for e in f.splits) + f"{f.images:>10,}"
    )
    empty = [
        name
        for label, name in enumerate(f.classes)
        if not any(f.counts.get((s, label)) for s in f.split_names)
    ]
    if empty:
        lines.append(f"warning: {len(empty)} classes have no images: {', '.join(empty[:10])}")
    lines += groups.report_lines(f.groups)
    for why, files in f.skipped.items():
        lines.append(f"skipped ({why}): {_files(len(files))}, e.g. {', '.join(files[:3])}")
    odd = {ext: n for ext, n in f.extensions.items() if ext not in IMAGE_EXTENSIONS}
    if odd:
        shown = ", ".join(f"{ext} {n:,}" for ext, n in sorted(odd.items(), key=lambda x: -x[1]))
        lines.append(f"other extensions (converted if the content is an image): {shown}")
    if f.reuse_line:
        lines.append(f.reuse_line)
    return lines


def _sample_lines(f: RunForecast) -> list[str]:
    """The sample: the table of splits, the rejects and the copies."""
    lines = [
        f"sample: {f.sampled} images converted in memory ({f.image_settings})",
        "the sample is the whole input: records, rejects and drops per split are the run's"
        if f.whole
        else f"the sample is {f.sampled:,} of {f.images:,} images: the counts are estimates",
    ]
    drops = f"{'drops':>8}" if f.dedupe else ""
    lines.append(
        f"{'split':<12}{'images':>10}{'records':>10}{'rejects':>9}{drops}{'output':>11}"
        f"{'shards':>8}{'per shard':>11}"
    )
    for e in f.splits:
        per_shard = _fmt_bytes(e.bytes / e.shards) if e.shards else "-"
        dropped = f"{e.drops:>8,.0f}" if f.dedupe else ""
        lines.append(
            f"{e.name:<12}{e.images:>10,}{e.records:>10,.0f}{e.rejects:>9,.0f}{dropped}"
            f"{_fmt_bytes(e.bytes):>11}{e.shards:>8}{per_shard:>11}"
        )
    lines += _reject_lines(f)
    lines += _copies_lines(f)
    lines += _limit_line(f)
    return lines


def _reject_lines(f: RunForecast) -> list[str]:
    if not f.rejections:
        return [f"likely rejects: none in the sample of {f.sampled}"]
    kinds = collections.Counter(reason_kind(r.reason) for r in f.rejections)
    if f.whole:
        lines = [f"rejects: {len(f.rejections)} ({f.reject_rate:.1%})"]
    else:
        lines = [f"likely rejects: ~{f.reject_rate:.1%} ({len(f.rejections)} of the sample)"]
    for kind, n in kinds.most_common(5):
        example = next(r.image_id for r in f.rejections if reason_kind(r.reason) == kind)
        count = f"{n:,}" if f.whole else f"~{n / f.sampled * f.images:,.0f}"
        lines.append(f"  {count} {kind} (e.g. {example})")
    return lines


def _limit_line(f: RunForecast) -> list[str]:
    """The warning that the run would stop at --max_reject_fraction, near drops counted."""
    if f.limit_rate <= f.max_reject_fraction:
        return []
    likely = "" if f.whole else "~"
    near = " (near drops included)" if f.copies.dropped_near else ""
    return [
        f"warning: {likely}{f.limit_rate:.1%} rejected{near} is above --max_reject_fraction "
        f"{f.max_reject_fraction:g}: the job would {'' if f.whole else 'likely '}fail"
    ]


def _groups(n: int, of: str = "") -> str:
    """``n`` groups and the verb: "1 group holds ", "2 groups of identical files hold "."""
    return f"{n:,} group {of}holds " if n == 1 else f"{n:,} groups {of}hold "


def _copies_lines(f: RunForecast) -> list[str]:
    """The sample's identical and near copies, and what --dedupe drops of them."""
    exact, close = f.copies.exact, f.copies.near
    where = "" if f.whole else " in the sample (likely more: a copy is seen only with its twin)"
    lines = []
    if exact["groups"]:
        lines.append(
            f"duplicates{where}: {_groups(exact['groups'], 'of identical files ')}"
            f"{exact['images']} images (across splits: {exact['cross_split']}, "
            f"across classes: {exact['cross_class']})"
        )
    if close["groups"]:
        lines.append(
            f"near duplicates{where}: {_groups(close['groups'])}{close['images']} images "
            f"(across splits: {close['cross_split']})"
        )
    if not lines:
        return [f"duplicates: none in the sample of {f.sampled}"]
    conflicts = f.copies.conflicts
    if conflicts:
        first = conflicts["listed"][0]
        who = " = ".join(f"{m['id']} ({m['label']})" for m in first["members"])
        lines.append(
            f"label conflicts{where}: {conflicts['count']} in two or more classes "
            f"({conflicts['exact']} identical, {conflicts['near']} near), e.g. {who}"
        )
    dropped = f.copies.dropped_exact + f.copies.dropped_near
    if f.dedupe:
        lines.append(
            f"--dedupe {f.dedupe} drops {dropped} copies ({f.copies.dropped_exact} identical, "
            f"{f.copies.dropped_near} near)" + ("" if f.whole else " in the sample")
        )
    else:
        lines.append("without --dedupe every copy is written")
    return lines


def _cost_lines(f: RunForecast) -> list[str]:
    per_s = 1 / f.cpu_per_image if f.cpu_per_image else float("inf")
    read_note = " (reading from storage not timed)" if f.read_remote else ""
    machine, cost = f.machine, f.cost
    return [
        f"speed on this machine: {per_s:,.0f} images/s per core, "
        f"{f.cpu_per_image * 1000:.1f} ms CPU per image{read_note}",
        f"local run ({f.engine}, {f.processes} conversion processes{f.elsewhere}): "
        f"about {_fmt_duration(f.local_wall_s)}",
        f"Dataflow on {machine.name} ({machine.vcpus} vCPU, {machine.memory_gb:g} GB): "
        f"~{_fmt_hours(cost.vcpu_hours)} vCPU-hours, ~{_fmt_bytes(cost.shuffle_gb * 1e9)} shuffled, "
        f"{_fmt_usd(cost.usd)} plus a few minutes of worker start-up",
        f"  (at {PRICES.region} list prices, {PRICES.source}, {PRICES.as_of}: "
        f"${PRICES.vcpu_hour}/vCPU-h, ${PRICES.gb_hour}/GB-h, ${PRICES.shuffle_gb}/GB "
        f"shuffled, ${PRICES.gcs_read_1000} per 1,000 image reads; {DATAFLOW_FACTOR:g}x this "
        "machine's CPU per image: see docs/scale.md)",
        f"dry run took {f.took_s:.1f} s",
    ]


def render(f: RunForecast) -> str:
    """The dry run's report, as printed."""
    lines = [*_input_lines(f), "", *_sample_lines(f), "", *_cost_lines(f)]
    return "\n".join(lines) + "\n"

"""``reader.inspect``'s summary of a dataset, and the evidence that its global shuffle worked.

The summary: classes, splits, records, shards and sizes, image settings,
class counts, rejects, skipped files and duplicates when recorded. The
shuffle evidence: for each shard, how its first records mix the classes
compared with the split as a whole (:func:`shard_mix`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import math
from collections.abc import Sequence

import tensorflow as tf

from reader import info as info_lib
from reader import shard_file
from reader.shard_file import ShardReadError

# Records read from the start of each shard for the shuffle evidence. Records
# inside a shard are in hash-key order, so its first records are a random
# draw from the shard.
SHUFFLE_SAMPLE = 256
# A shard is flagged when its class mix is this many standard deviations
# away from what a uniform shuffle of the split gives.
FLAG_SIGMAS = 4.0
MAX_SHARDS_LISTED = 30


@dataclasses.dataclass(frozen=True)
class ShardMix:
    """How one shard mixes the classes, from its first records."""

    split: str
    file: str
    sampled: int
    top_class: str | None
    top_share: float  # of the sampled records
    split_share: float  # the same class's share of the split
    switches: int  # neighbouring records of different classes
    expected_switches: float
    flagged: str | None  # why it looks unshuffled, or None


def shard_mix(split: str, file: str, labels: Sequence[int], split_shares: Sequence[float]):
    """Compares a shard's label sequence with a uniform shuffle of its split.

    Two tests, each flagged beyond :data:`FLAG_SIGMAS` standard deviations: the
    most common class's share (a shard holding mostly one class), and the
    number of class switches between neighbours, a runs test that catches
    records grouped by class even when the shard's totals look right.
    """
    n = len(labels)
    if n == 0:
        return ShardMix(split, file, 0, None, 0.0, 0.0, 0, 0.0, None)
    counts = collections.Counter(labels)
    top, top_n = max(counts.items(), key=lambda item: (item[1], -item[0]))
    share, p = top_n / n, split_shares[top] if top < len(split_shares) else 0.0
    switches = sum(a != b for a, b in zip(labels, labels[1:], strict=False))
    q = 1.0 - sum(s * s for s in split_shares)  # P(two random records differ)
    expected = (n - 1) * q
    flagged = None
    share_sd = math.sqrt(max(p * (1 - p), 1e-12) / n)
    switch_sd = math.sqrt(max((n - 1) * q * (1 - q), 1e-12))
    if n >= 10 and share - p > FLAG_SIGMAS * share_sd and share - p > 0.05:
        flagged = f"class {top} is {share:.0%} of its first {n} records vs {p:.0%} of {split}"
    elif n >= 10 and expected - switches > FLAG_SIGMAS * switch_sd:
        flagged = (
            f"{switches} class switches between neighbouring records, "
            f"{expected:.0f} expected: records look grouped by class"
        )
    return ShardMix(split, file, n, top, share, p, switches, expected, flagged)


def _labels_of(path: str, limit: int | None) -> list[int]:
    labels = []
    for index, data in shard_file.walk_records(path, None, limit):
        label = shard_file.feature(
            shard_file.parse_example(data, f"record {index}"), "image/class/label"
        )
        labels.append(label if isinstance(label, int) else -1)
    return labels


def shuffle_evidence(
    info: info_lib.DatasetInfo, per_shard: int = SHUFFLE_SAMPLE, workers: int = 8
) -> list[ShardMix]:
    """:func:`shard_mix` of the first ``per_shard`` records of every shard."""
    jobs = []
    for split in info.splits.values():
        total = max(1, split.num_examples)
        shares = [split.class_counts.get(c, 0) / total for c in info.classes]
        for shard in split.shards:
            jobs.append((split.name, shard, shares))

    def one(job):
        name, shard, shares = job
        try:
            labels = _labels_of(shard.path, per_shard)
        except (ShardReadError, tf.errors.OpError, OSError) as error:
            why = error.message if isinstance(error, tf.errors.OpError) else str(error)
            return ShardMix(name, shard.file, 0, None, 0, 0, 0, 0, f"cannot be read: {why}")
        mix = shard_mix(name, shard.file, labels, shares)
        top = info.classes[mix.top_class] if mix.top_class is not None else None
        return dataclasses.replace(mix, top_class=top)

    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(one, jobs))


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f}"


def summary(info: info_lib.DatasetInfo, mixes: Sequence[ShardMix] | None) -> str:
    """The human-readable summary of a dataset."""
    raw = info.raw
    lines = [f"dataset {info.path}"]
    about = [f"format {info.format_version}"]
    about += [f"{k} {raw[k]}" for k in ("created_by", "source", "seed") if raw.get(k) is not None]
    lines.append("  " + ", ".join(about))
    image = raw.get("image") or {}
    lines.append("  image: " + ", ".join(f"{k}={v}" for k, v in image.items()))
    shown = ", ".join(info.classes[:20]) + (", ..." if len(info.classes) > 20 else "")
    lines.append(f"  classes ({info.num_classes}): {shown}")
    lines.append("")
    lines.append(
        f"{'split':<12}{'records':>10}{'shards':>8}{'MB':>10}{'MB/shard (min-max)':>22}"
        f"{'kB/record':>11}"
    )
    for split in info.splits.values():
        sizes = [s.num_bytes for s in split.shards if s.num_bytes is not None]
        spread = f"{min(sizes) / 1e6:.1f}-{max(sizes) / 1e6:.1f}" if sizes else "-"
        per_record = (
            f"{split.num_bytes / split.num_examples / 1e3:.1f}"
            if split.num_bytes and split.num_examples
            else "-"
        )
        lines.append(
            f"{split.name:<12}{split.num_examples:>10,}{len(split.shards):>8}"
            f"{_mb(split.num_bytes):>10}{spread:>22}{per_record:>11}"
        )
    lines.append("")
    lines += _class_table(info)
    lines.append("")
    lines += _rejects_lines(info)
    for key, render in (
        ("skipped", skipped_lines),
        ("duplicates", duplicates_lines),
        ("near_duplicates", near_lines),
        ("groups", groups_lines),
    ):
        lines += _block_lines(info, key, render)
    if mixes is not None:
        lines.append("")
        lines += _mix_lines(mixes)
    return "\n".join(lines)


def _block_lines(info: info_lib.DatasetInfo, key: str, render) -> list[str]:
    """``render(block)`` of a descriptive block of the metadata, or a line saying it is malformed.

    The blocks only describe the run (the reader reads none of them), and any
    value in them may be of any type in a dataset no run of ours wrote.
    """
    try:
        return render(info.raw.get(key))
    except (TypeError, ValueError, KeyError, AttributeError):
        return [f"{key}: {info.metadata_file}'s block is not of the form this reader knows"]


def skipped_lines(block) -> list[str]:
    """The ``skipped`` block: files neither converted nor rejected."""
    if not (isinstance(block, dict) and block.get("count")):
        return []
    reasons = block.get("by_reason") or {}
    shown = ", ".join(f"{n:,} {why}" for why, n in sorted(reasons.items(), key=lambda x: -x[1]))
    return [
        f"skipped (not converted): {block['count']:,}"
        + (f" (listed in {block['file']})" if block.get("file") else "")
        + (f": {shown}" if shown else "")
    ]


def duplicates_lines(block) -> list[str]:
    """The ``duplicates`` block: groups of identical source files."""
    if not isinstance(block, dict):
        return []
    return [
        "duplicates: "
        + ", ".join(
            f"{k.replace('_', '-')} {block[k]:,}"
            for k in ("groups", "images", "cross_split", "cross_class")
            if isinstance(block.get(k), int)
        )
        + (f" (see {block['file']})" if block.get("file") else "")
    ]


def near_lines(block) -> list[str]:
    """The ``near_duplicates`` block (format_version 3) in a line or two; none without it."""
    if not isinstance(block, dict):
        return []
    counts = ", ".join(
        f"{k.replace('_', '-')} {block[k]:,}"
        for k in ("pairs", "groups", "images", "cross_split")
        if isinstance(block.get(k), int)
    )
    lines = [
        f"near duplicates: {counts}"
        + (f" (see {block['file']})" if block.get("file") else "")
        + (
            f"; scheme {block['scheme']}, threshold {block.get('threshold')}"
            if block.get("scheme")
            else ""
        )
    ]
    if block.get("oversized_buckets"):
        lines.append(
            f"near duplicates: {block['oversized_buckets']:,} band keys shared by more than "
            f"{block.get('bucket_limit')} images were not paired (flat or blank images)"
        )
    return lines


def groups_lines(block) -> list[str]:
    """The ``groups`` block (``--group_by``): the groups per split and any lumpy split."""
    if not isinstance(block, dict):
        return []
    by_split = block.get("by_split") or {}
    parts = [
        f"{split} {row.get('groups', 0):,} ({row.get('fraction', 0):.1%} of images)"
        for split, row in by_split.items()
        if isinstance(row, dict)
    ]
    pattern = block.get("group_by")
    lines = [
        f"groups: {block.get('groups', 0):,}"
        + (f" by {pattern}" if pattern else " (from the manifest)")
        + (f": {', '.join(parts)}" if parts else "")
    ]
    straddling = (block.get("straddling") or {}).get("count")
    if straddling:
        lines.append(f"groups: {straddling:,} span more than one split")
    for split, why in sorted((block.get("lumpy") or {}).items()):
        lines.append(f"groups: {split} is lumpy: {why}")
    return lines


def _class_table(info: info_lib.DatasetInfo) -> list[str]:
    names = list(info.splits)
    width = max([5, *(len(c) for c in info.classes)])
    rows = [(c, [info.splits[s].class_counts.get(c, 0) for s in names]) for c in info.classes]
    head = f"{'class':<{width}}" + "".join(f"{s:>10}" for s in names)
    out = [head]
    if len(rows) > 40:
        rows.sort(key=lambda row: -sum(row[1]))
        out.append(f"({len(rows)} classes: the 10 largest and the 10 smallest)")
        rows = rows[:10] + [("...", None)] + rows[-10:]
    for name, counts in rows:
        if counts is None:
            out.append(name)
            continue
        out.append(f"{name:<{width}}" + "".join(f"{n:>10,}" for n in counts))
    missing = [
        c for c in info.classes if not any(info.splits[s].class_counts.get(c) for s in names)
    ]
    if missing:
        out.append(f"warning: {len(missing)} classes have no records: {', '.join(missing[:10])}")
    return out


def _rejects_lines(info: info_lib.DatasetInfo) -> list[str]:
    rejected = info.raw.get("rejected") or {}
    name = rejected.get("file") or "rejects.jsonl"
    line = f"rejected: {info.rejected_count:,}"
    if not info.rejected_count:
        return [line]
    text = info_lib.read_text(info.path, name, f"{info.metadata_file}: rejected")
    if text is None:
        return [line + f" ({name} is missing)"]
    reasons = collections.Counter()
    example = {}
    for row in text.splitlines():
        if not row.strip():
            continue
        try:
            entry = json.loads(row)
        except json.JSONDecodeError:
            continue
        kind = str(entry.get("reason", "?")).split(":", 1)[0]
        reasons[kind] += 1
        example.setdefault(kind, entry.get("id") or entry.get("path"))
    out = [line + f" (listed in {name}); top reasons:"]
    for kind, n in reasons.most_common(5):
        out.append(f"  {n:>8,}  {kind} (e.g. {example[kind]})")
    return out


def _mix_lines(mixes: Sequence[ShardMix]) -> list[str]:
    flagged = [m for m in mixes if m.flagged]
    out = [
        f"shuffle: class mix of the first {SHUFFLE_SAMPLE} records of each of {len(mixes)} "
        f"shards vs its split ({len(flagged)} flagged)"
    ]
    shown = mixes if len(mixes) <= MAX_SHARDS_LISTED else flagged
    if len(mixes) > MAX_SHARDS_LISTED:
        out.append(f"  ({len(mixes)} shards: only flagged ones are listed)")
    if shown:
        out.append(
            f"  {'shard':<34}{'read':>6}  {'largest class':<20}{'share':>7}{'in split':>9}"
            f"{'switches':>10}{'expected':>9}"
        )
    for m in shown:
        top = (m.top_class or "-")[:19]
        out.append(
            f"  {m.file:<34}{m.sampled:>6}  {top:<20}{m.top_share:>7.0%}{m.split_share:>9.0%}"
            f"{m.switches:>10}{m.expected_switches:>9.0f}"
        )
        if m.flagged:
            out.append(f"    ! {m.flagged}")
    return out

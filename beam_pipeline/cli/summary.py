"""The end-of-run summary: the table of splits, the rate, CPU time and counters.

Formatting only, apart from :func:`counters`, which asks a finished Beam
result for its metrics.
"""

from __future__ import annotations

import re
import resource

from beam_pipeline.core import groups, images, settings
from beam_pipeline.core.counters import CONVERTED, NAMESPACE, NEAR_HASHED, RESUMED
from beam_pipeline.features.dedupe import feature as dedupe_feature
from beam_pipeline.features.near import feature as near_feature

# The summary's last line: "counters: bytes_read=288368, images_converted=60, ...".
COUNTERS_PREFIX = "counters: "
# The end-of-run lines of imagerecords.json's blocks, in the order they print:
# each feature's (the dedupe and near ones), then the listing's groups.
BLOCK_LINES = (
    dedupe_feature.summary_lines,
    near_feature.summary_lines,
    lambda info: groups.report_lines(info.get("groups")),
)


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of the children it has waited for.

    The children are the local conversion pool and DirectRunner's worker
    processes, all reaped before the summary; a remote runner's workers are not
    among them.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def format_summary(info: dict, seconds: float, counted: dict[str, int], cpu: float | None) -> str:
    """The table printed at the end of a run: per split, the total, the rate, the counters.

    Args:
        info: The run's imagerecords.json, parsed.
        seconds: Wall time of the run.
        counted: The run's counters (core/counters.py), by name.
        cpu: CPU seconds of this process tree, or None when the work ran elsewhere.
    """
    lines = [f"{'split':<12}{'records':>10}{'rejected':>10}{'shards':>8}{'MB':>10}"]
    rejected = info["rejected"].get("by_split", {})
    for name, split in info["splits"].items():
        lines.append(
            f"{name:<12}{split['num_examples']:>10}{rejected.get(name, 0):>10}"
            f"{len(split['shards']):>8}{split['num_bytes'] / 1e6:>10.1f}"
        )
    written = sum(s["num_examples"] for s in info["splits"].values())
    total = written + info["rejected"]["count"]
    lines.append(
        f"{'total':<12}{written:>10}{info['rejected']['count']:>10}"
        f"{sum(len(s['shards']) for s in info['splits'].values()):>8}"
        f"{sum(s['num_bytes'] for s in info['splits'].values()) / 1e6:>10.1f}"
    )
    lines.append(rate_line(total, counted.get(RESUMED, 0), seconds, cpu))
    stored = settings.image_settings_from_info(info, images.ImageSpec)
    if stored:
        lines.append(f"images stored with {settings.describe(stored)}")
    reused = info.get("reuse")
    if reused:
        # Of the fingerprints computed, those not of a conversion: of reused records.
        anew = counted.get(NEAR_HASHED, 0) - counted.get(CONVERTED, 0)
        lines.append(
            f"reused {reused['images_reused']} records of {reused['dataset']} "
            "(their sources unchanged"
            + (
                f"; {anew} fingerprinted from their stored JPEG, as that dataset's "
                "are of format 2 or an earlier scheme"
                if anew > 0
                else ""
            )
            + "); the others were converted"
        )
    skipped = info.get("skipped", {})
    if skipped.get("count"):
        reasons = ", ".join(f"{n} {why}" for why, n in skipped.get("by_reason", {}).items())
        lines.append(
            f"skipped {skipped['count']} files that are not images to convert ({reasons}): "
            f"listed in {skipped['file']} in the output folder"
        )
    for block_lines in BLOCK_LINES:
        lines += block_lines(info)
    if counted:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(counted.items()))
        lines.append(COUNTERS_PREFIX + shown)
    return "\n".join(lines)


def rate_line(total: int, resumed: int, seconds: float, cpu: float | None) -> str:
    """How fast this run went: the images it read itself per second, and their CPU cost.

    A resumed run took ``resumed`` images from the unfinished run's spill files
    in moments; counting them would promise a rate the next run will not see.
    """
    done = max(total - resumed, 0)
    line = (
        f"{done} images read in {seconds:.1f} s wall time: {done / max(seconds, 1e-9):.1f} images/s"
    )
    if resumed:
        line = f"{line} ({resumed} more taken from the unfinished run, not counted)"
    if cpu is None:
        return f"{line} (CPU time not measured: the work ran on the runner's workers)"
    # What a small local run tells about the cost of a big one (docs/scale.md).
    return (
        f"{line}, {cpu / max(done, 1):.4f} CPU-s/image "
        f"({cpu:.1f} CPU-s in this process and its local worker processes)"
    )


def read_counters(printed: str) -> dict[str, int]:
    """The counters of a summary's counters line in ``printed`` ({} when it has none):
    for benchmarks and tests that run the command and read what it printed."""
    line = next((s for s in printed.splitlines() if s.startswith(COUNTERS_PREFIX)), "")
    return {name: int(value) for name, value in re.findall(r"(\w+)=(\d+)", line)}


def counters(result) -> dict[str, int]:
    """The counters (core/counters.py) of a finished Beam result, summed by name."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        queried = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    except Exception:  # some runners do not report metrics
        return {}
    out = {}
    for counter in queried["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        out[counter.key.metric.name] = out.get(counter.key.metric.name, 0) + (value or 0)
    return out

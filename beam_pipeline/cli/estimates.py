"""The dry run's time and cost estimates: a machine's CPU per image -> local wall time
and Dataflow vCPU-hours, shuffle and list-price cost (docs/scale.md). Pure."""

from __future__ import annotations

import dataclasses
import re

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

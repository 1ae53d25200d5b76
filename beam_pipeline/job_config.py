"""What a conversion job needs to know: :class:`JobConfig`. Pure: no Beam.

Both engines take it: the Beam graph (``pipeline.build``) and the local
engine (``local_engine.run``), so that one config gives the same dataset
on either.
"""

from __future__ import annotations

import dataclasses

from beam_pipeline import images, keys, listing, spill
from beam_pipeline.errors import UsageError


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


def output_path(output: str, name: str) -> str:
    """``name`` (which may hold a "/") inside the output folder, on any filesystem."""
    return listing.join(output, name)

"""What a conversion job needs to know: :class:`JobConfig`. Pure: no Beam.

Both engines take it: the Beam graph (``pipeline.build``) and the local
engine (``local_engine.run``), so that one config gives the same dataset
on either.
"""

from __future__ import annotations

import dataclasses

from beam_pipeline.core import flags, images, keys, settings, spill, tfds_metadata
from beam_pipeline.core.errors import UsageError
from beam_pipeline.storage import discovery, paths


def _splits(config: JobConfig):
    """--splits, or None where the layout's own folders are the splits."""
    return None if config.layout.kind == "presplit" else config.splits


# The block of imagerecords.json that records most of the job's settings.
_CONFIG = "config"
_RECORDS_ALREADY_MADE = "it acts on the records once they are made"
_TFDS_ONLY = "it names the dataset in TFDS's metadata files, not in any record"


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """Everything the graph needs; built and validated by the CLI.

    Each field declares whether it decides a record's bytes, split or label
    and where imagerecords.json records it (``settings.py``): the resume key
    and imagerecords.json's settings are derived from these declarations.
    """

    # The input as discovery found it; None in the config parsing gives, before
    # the job looks at the input (arguments.discover fills it).
    layout: discovery.Layout | None = settings.parts(
        settings.part(
            "input", key="source", recorded=True, value=lambda c: c.layout.manifest or c.layout.root
        ),
        settings.part("layout", recorded=_CONFIG, value=lambda c: c.layout.kind),
        settings.part("classes", recorded=True, value=lambda c: list(c.layout.classes)),
    )
    output: str = settings.does_not_decide(
        "where the dataset goes: the run it resumes is there", flag=flags.Table.output
    )
    splits: dict[str, float] = settings.decides(flags.Table.splits, recorded=_CONFIG, value=_splits)
    seed: int = settings.decides(flags.Table.seed, recorded=True)
    # --group_by: a regex whose first capture group of an image ID names its group,
    # whose split it takes (core/groups.py); recorded in the "groups" block.
    group_by: str | None = settings.decides(flags.Table.group_by, recorded="groups")
    image: images.ImageSpec = settings.nested(images.ImageSpec)
    target_shard_bytes: int = settings.does_not_decide(
        "it only decides how the same records are cut into shards",
        flag=flags.Table.target_shard_mb,
        recorded=_CONFIG,
    )
    min_shards: int = settings.does_not_decide(
        "it only decides how the same records are cut into shards",
        flag=flags.Table.min_shards,
        recorded=_CONFIG,
    )
    max_reject_fraction: float = settings.does_not_decide(
        "it only decides whether the books are accepted",
        flag=flags.Table.max_reject_fraction,
        recorded=_CONFIG,
    )
    # Also write <shard>.idx: "offset length" per record (NVIDIA DALI's format).
    index_files: bool = settings.does_not_decide(
        _RECORDS_ALREADY_MADE, flag=flags.Table.index_files
    )
    # >1: convert in that many local processes, which spill the records to
    # local disk (one machine: in-process or multi_processing DirectRunner).
    # (--local_processes is a run option: the engine decides this from it.)
    conversion_processes: int = settings.does_not_decide(
        "the same records come out of any number of processes",
        name=flags.Table.local_processes.name,
        default=1,
    )
    # Where the local processes spill; default spill.default_dir(output).
    spill_dir: str | None = settings.does_not_decide(
        "where records wait, not what they are", default=None
    )
    # Keep one image of each group of duplicates (--dedupe): "" (off), "exact"
    # (identical source files) or "near" (near copies as well).
    dedupe: str = settings.does_not_decide(
        _RECORDS_ALREADY_MADE + ": the copies are dropped after conversion",
        flag=flags.Table.dedupe,
        recorded=_CONFIG,
        # imagerecords.json: false when off, else the mode.
        value=lambda config: config.dedupe or False,
    )

    # The dataset's name and version in TFDS's metadata files (tfds_metadata.py).
    # Not the output folder's name by default: the same input and settings give
    # the same bytes wherever they are written.
    tfds_name: str = settings.does_not_decide(
        _TFDS_ONLY, flag=flags.Table.tfds_name, recorded=_CONFIG
    )
    tfds_version: str = settings.does_not_decide(
        _TFDS_ONLY, flag=flags.Table.tfds_version, recorded=_CONFIG
    )
    # --reuse: a finished dataset whose records of unchanged images are copied
    # (reuse.py); the output is the same bytes a full conversion writes.
    reuse: str | None = settings.does_not_decide(
        "a reused record is the bytes a conversion would write: it decides how "
        "records are made, not what they are",
        flag=flags.Table.reuse,
    )

    def __post_init__(self):
        """The CLI's value checks, so that code building a JobConfig gets the same errors."""
        if not self.output:
            raise UsageError("--output is required")
        fractions = list(self.splits.values())
        if not fractions or any(not 0.0 <= f <= 1.0 for f in fractions):
            raise UsageError(f"--splits: fractions must be in [0, 1], got {self.splits}")
        if abs(sum(fractions) - 1.0) > keys.FRACTION_TOLERANCE:
            raise UsageError(f"--splits: fractions must sum to 1, got {sum(fractions):g}")
        try:
            settings.check_flags(self)  # each flag's own check (core/flags.py)
        except ValueError as error:
            raise UsageError(str(error)) from None
        if self.conversion_processes < 1:
            raise UsageError(
                f"--local_processes must be at least 1, got {self.conversion_processes}"
            )
        try:
            tfds_metadata.check_name_and_version(self.tfds_name, self.tfds_version)
        except ValueError as error:
            raise UsageError(f"--tfds_name/--tfds_version: {error}") from None

    @property
    def split_names(self) -> list[str]:
        """Splits in imagerecords.json order: the layout's own, else --splits."""
        return list(self.layout.split_names or self.splits)

    @property
    def dedupe_near(self) -> bool:
        """--dedupe near: near copies are dropped too, not only identical files."""
        return self.dedupe == "near"

    @property
    def spill_directory(self) -> str:
        return self.spill_dir or spill.default_dir(self.output)


def output_path(output: str, name: str) -> str:
    """``name`` (which may hold a "/") inside the output folder, on any filesystem."""
    return paths.join(output, name)

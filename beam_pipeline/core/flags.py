"""Every flag of the converter's command line, declared once, as an attribute of :class:`Table`.

The parser, the configs' defaults and checks, ``deploy/metadata.json`` and
docs/flags.md derive from it (docs/architecture.md, "Where each kind of fact lives").
Pure: no Beam, no Pillow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from beam_pipeline.core import dedupe_modes, groups, keys, tfds_metadata
from beam_pipeline.core.digit_ranges import int_range_regex

RESIZE_MODES = ("shorter", "longer", "crop", "pad", "none")
# --resample's names; each is the Pillow filter of that name (images.py).
RESAMPLE_NAMES = ("bicubic", "bilinear", "lanczos")
MAX_IMAGE_SIZE = 65500  # JPEG's largest side
# Conversion is CPU work (decode, resize, encode): a few processes per core
# cover the time each waits on its file (gs:// reads included); many more
# only share the same cores, and each holds its own memory.
MAX_PROCESSES_PER_CORE = 4
# Past these a value is a mistake: an int of 64 bits (what imagerecords.json's readers
# hold the seed in), five digits of shard count (keys.shard_name), a terabyte shard, a day.
MAX_INT, MAX_SHARDS, MAX_SHARD_MB, MAX_WAIT_S = 2**63 - 1, 99999, 1e6, 86400.0

_GCS_PATH = r"^gs://[^\n\r]+$"


@dataclasses.dataclass(frozen=True)
class Check:
    """A value check: ``problem(value)`` says what is wrong ("" when nothing);
    ``regex`` is the shape of a valid value as text (the template's check);
    ``choices``: the values allowed, where they are a list."""

    problem: Callable[[Any], str]
    regex: str | None = None
    choices: tuple[str, ...] = ()


def one_of(choices: tuple[str, ...]) -> Check:
    return Check(
        lambda v: "" if v in choices else f"must be one of {', '.join(choices)}; got {v!r}",
        "^(" + "|".join(choices) + ")$",
        choices,
    )


def int_range(lo: int, hi: int | None = None) -> Check:
    def problem(v):
        if lo <= v and (hi is None or v <= hi):
            return ""
        return (
            f"must be at least {lo}, got {v}" if hi is None else f"must be in {lo}..{hi}, got {v}"
        )

    return Check(problem, int_range_regex(lo, hi))


def positive(hi: float) -> Check:
    return Check(
        lambda v: "" if 0 < v <= hi else f"must be above 0 and at most {hi:g}, got {v:g}",
        r"^[0-9]+(\.[0-9]+)?$",
    )


def fraction() -> Check:
    return Check(
        lambda v: "" if 0.0 <= v <= 1.0 else f"must be in [0, 1], got {v:g}",
        r"^(0(\.[0-9]+)?|1(\.0+)?)$",
    )


def seconds_limit(hi: float) -> Check:
    """0 (no limit) up to ``hi`` seconds; refuses NaN."""
    return Check(
        lambda v: "" if 0 <= v <= hi else f"must be in 0..{hi:g}, got {v:g}",
        r"^[0-9]+(\.[0-9]+)?$",
    )


def _raises(parse: Callable[[Any], object]) -> Callable[[Any], str]:
    """A check from a function that raises ValueError naming the problem."""

    def problem(value):
        try:
            parse(value)
        except ValueError as error:
            return str(error)
        return ""

    return problem


@dataclasses.dataclass(frozen=True)
class Template:
    """The flag as a Flex Template parameter (``deploy/metadata.json``).

    ``regex``: where a template value must differ from the command line's
    (a ``gs://`` path); by default the regex of the flag's check or kind.
    ``help``: where the template's user needs other words than ``--help``'s.
    """

    label: str
    regex: str | None = None
    help: str | None = None


# A switch's value, as text (any case): on the command line and in the template.
BOOLEAN_WORDS = {"true": True, "1": True, "yes": True, "on": True}
BOOLEAN_WORDS |= {"false": False, "0": False, "no": False, "off": False}


def kind_problem(kind: str, value) -> str:
    """What any flag of ``kind`` refuses, whatever its check says: inf and nan, an int
    past :data:`MAX_INT`, an empty text (``--reuse ''`` would be taken as left out)."""
    if value is None:
        return ""
    if kind == "float" and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if kind == "int" and abs(value) > MAX_INT:
        return f"must be in {-MAX_INT}..{MAX_INT}, got {value}"
    if kind == "str" and not value.strip():
        return "is empty: give a value, or leave the flag out"
    return ""


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag: ``--name``.

    Attributes:
        help: What it does; ``{default}`` is replaced by the default.
        kind: ``str``, ``int``, ``float`` or ``bool`` (a switch that also
            takes a value: ``--overwrite`` and ``--overwrite=true``).
        default: Its value when not given (None: none).
        check: What a value must be; the configs run it (``settings.check_flags``).
            A ``str`` check receives the text, or None when not given.
        to_field: The field's value from the flag's (default: the same).
        from_field: The flag's value from the field's, to check a converted field.
        metavar: The value's name in ``--help``.
        required: The command line must give it.
        template: How the Flex Template offers it; None: it does not.
        shown_default: The default in words, where the value is decided later
            (``--local_processes``: the number of cores).
        const: A ``str`` flag's value when given alone (``--dedupe``: ``exact``).
        location: Its value names a place (a folder or file, local or ``gs://``).
        name: The flag without its ``--``: the name of its attribute of :class:`Table`.

    The config field a flag fills names it (``settings.decides(Table.seed)``);
    a flag that no field names is a run option (``RunOptions``, of the flag's name).
    """

    help: str
    kind: str = "str"
    default: Any = None
    check: Check | None = None
    to_field: Callable[[Any], Any] | None = None
    from_field: Callable[[Any], Any] | None = None
    metavar: str | None = None
    required: bool = False
    template: Template | None = None
    shown_default: str | None = None
    const: str | None = None
    location: bool = False
    name: str = ""

    def __set_name__(self, owner, name: str) -> None:
        object.__setattr__(self, "name", name)  # the attribute of Table that declares it

    @property
    def option(self) -> str:
        return f"--{self.name}"

    @property
    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None:
            return "none"
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)

    @property
    def help_text(self) -> str:
        return self.help.replace("{default}", self.default_text)

    def problem(self, value) -> str:
        """The error line for a bad ``value`` ("" if good): :func:`kind_problem`, then the check."""
        found = kind_problem(self.kind, value)
        if not found and self.check is not None:
            found = self.check.problem(value)
        if not found or found.startswith(self.option):
            return found
        return f"{self.option} {found}"

    @property
    def checked_as_given(self) -> bool:
        """Its field holds what the value became and cannot be read back (a
        ``to_field`` without a ``from_field``: --dedupe, --splits), so the value is
        checked on its way in (:meth:`field_value`), not on the config."""
        return self.to_field is not None and self.from_field is None

    def field_value(self, value):
        """The field's value of the flag's; raises ValueError where the flag's check,
        which no config can run on this field, refuses it."""
        if self.to_field is None or value is None:
            return value
        if self.checked_as_given:
            problem = self.problem(value)
            if problem:
                raise ValueError(problem)
        return self.to_field(value)


class Table:
    """Every flag, in ``--help``'s and docs/flags.md's order: each attribute is the
    flag of its name (``Table.image_size`` is ``--image_size``)."""

    input = Flag(
        "Image root: INPUT/<class>/**/<image>, or INPUT/{train,val,test}/<class>/...; with "
        "--manifest, the folder its relative paths start from",
        template=Template(
            "Input images",
            _GCS_PATH,
            "gs://bucket/prefix holding one folder per class (or train/val/test folders of "
            "class folders). Leave empty when using manifest.",
        ),
        location=True,
    )
    output = Flag(
        "Output folder (local path or gs://bucket/prefix)",
        required=True,
        template=Template(
            "Output folder",
            _GCS_PATH,
            "gs://bucket/prefix for the shards, labels.txt, rejects.jsonl and "
            "imagerecords.json. Must be empty unless overwrite is true.",
        ),
        location=True,
    )
    manifest = Flag(
        "CSV or JSONL with path,label[,split] rows instead of class folders; relative paths "
        "start from --input if given, else from the manifest's own folder",
        metavar="FILE",
        template=Template("Manifest", r"^gs://[^\n\r]+\.(csv|jsonl)$"),
        location=True,
    )
    splits = Flag(
        "NAME=FRACTION,... summing to 1; names of letters, digits and _, not 'all' (TFDS "
        "reserves it), no two differing only in case (default {default})",
        default=keys.DEFAULT_SPLITS,
        check=Check(
            _raises(keys.parse_splits), r"^[A-Za-z0-9_]+=[0-9.]+(,[A-Za-z0-9_]+=[0-9.]+)*$"
        ),
        to_field=keys.parse_splits,
        template=Template("Split fractions"),
    )
    seed = Flag(
        "Seed of the split and shuffle hashes (default {default})",
        kind="int",
        default=42,
        template=Template("Seed"),
    )
    group_by = Flag(
        "Keep each group of images in one split: the first capture group of a search of the "
        "image ID (its path relative to --input) names its group, whose split is drawn from "
        "that name; an ID that does not match is its own group (a manifest may give a group "
        "column instead). E.g. '^([^/]+/patient\\d+)_'",
        metavar="REGEX",
        check=Check(_raises(groups.check_group_by), r"^[^\n\r]*\([^\n\r]*$"),
        template=Template("Group pattern"),
    )
    image_size = Flag(
        "Target size in pixels (default {default})",
        kind="int",
        default=256,
        check=int_range(1, MAX_IMAGE_SIZE),
        template=Template("Image size"),
    )
    resize = Flag(
        "shorter: shorter side = size; longer: longer side = size; crop: centre crop to "
        "exactly size x size (smaller images are enlarged first); pad: exactly size x size, "
        "letterboxed with black bars (smaller images are centred, not enlarged, unless "
        "--upscale); none (default {default})",
        default="shorter",
        check=one_of(RESIZE_MODES),
        template=Template("Resize mode"),
    )
    upscale = Flag(
        "Also enlarge images smaller than --image_size (shorter, longer, pad; crop always "
        "does) (default {default})",
        kind="bool",
        default=False,
        template=Template("Upscale small images"),
    )
    jpeg_quality = Flag(
        "JPEG quality of the stored images, 1-100 (default {default})",
        kind="int",
        default=90,
        check=int_range(1, 100),
        template=Template("JPEG quality"),
    )
    resample = Flag(
        "Downscaling filter: bicubic, bilinear (faster, softer) or lanczos (sharper, slower) "
        "(default {default})",
        default="bicubic",
        check=one_of(RESAMPLE_NAMES),
        template=Template("Downscaling filter"),
    )
    image_timeout_s = Flag(
        "Reject an image whose conversion takes longer than this many seconds (default "
        "{default}; 0: no limit)",
        kind="float",
        default=60.0,
        check=seconds_limit(MAX_WAIT_S),
    )
    target_shard_mb = Flag(
        "Target shard size in MB: shards per split = max(min_shards, ceil(split bytes / "
        "target)), exactly (fewer only when the split has fewer records) (default {default})",
        kind="float",
        default=200.0,
        check=positive(MAX_SHARD_MB),
        to_field=lambda mb: int(mb * 2**20),
        from_field=lambda size: size / 2**20,
        template=Template("Target shard size (MB)"),
    )
    min_shards = Flag(
        "Minimum shards per split; raise it to at least the number of hosts that read the "
        "data (default {default})",
        kind="int",
        default=1,
        check=int_range(1, MAX_SHARDS),
        template=Template("Minimum shards per split"),
    )
    max_reject_fraction = Flag(
        "Fail (and write no imagerecords.json) if a larger fraction of the images is "
        "rejected (default {default})",
        kind="float",
        default=0.01,
        check=fraction(),
        template=Template("Maximum rejected fraction"),
    )
    overwrite = Flag(
        "Replace a finished dataset in --output (a folder holding anything else is refused); "
        "not needed to resume an unfinished run (default {default})",
        kind="bool",
        default=False,
        template=Template("Overwrite"),
    )
    reuse = Flag(
        "A finished dataset of this input made with the same image settings (local or gs://; "
        "only read): an image whose source file has the SHA-256 its record names is copied "
        "from it, not converted again. The output is what a full conversion writes",
        metavar="OLD",
        template=Template("Previous dataset to reuse", _GCS_PATH),
        location=True,
    )
    skip_unreadable_folders = Flag(
        "When a local class folder cannot be read, list it in skipped.jsonl (its class keeps "
        "its place in labels.txt) and convert the rest; default: such a folder stops the job "
        "before it starts",
        kind="bool",
        default=False,
    )
    dedupe = Flag(
        "Keep one image of each group of duplicates; reject the others. --dedupe (or exact): "
        "groups of identical source files, keeping the smallest ID, the others 'duplicate of "
        "<id>' (not counted towards --max_reject_fraction); --dedupe near: near copies too "
        "(resized, re-encoded, lightly cropped), keeping the one in the first split (train, "
        "val, test) with the smallest ID, the others 'near duplicate of <id>' (counted towards "
        "--max_reject_fraction: a near drop is a judgement, not a certainty). Groups "
        "are always reported in duplicates.jsonl and near_duplicates.jsonl (default {default})",
        default="off",
        check=one_of((*dedupe_modes.DEDUPE_MODES, *BOOLEAN_WORDS)),
        to_field=lambda value: dedupe_modes.dedupe_mode(value, BOOLEAN_WORDS),
        metavar="MODE",
        const="exact",
        template=Template("Drop duplicates"),
    )
    index_files = Flag(
        "Also write <shard>.tfrecord.idx files ('offset length' per record, the format "
        "NVIDIA DALI's TFRecord reader needs) (default {default})",
        kind="bool",
        default=False,
        template=Template("Index files"),
    )
    tfds_name = Flag(
        "The dataset's name in TFDS's metadata files, which let "
        "tfds.builder_from_directory(OUTPUT) read the shards: lower-case letters, digits and "
        "_ (default {default})",
        default=tfds_metadata.DEFAULT_NAME,
    )
    tfds_version = Flag(
        "The dataset's version in TFDS's metadata files, MAJOR.MINOR.PATCH (default {default})",
        default=tfds_metadata.DEFAULT_VERSION,
    )
    local_processes = Flag(
        "Convert images in this many local processes, at least 1, on a local run: the local "
        "engine or Beam's DirectRunner in_memory (default {default}; at most "
        f"{MAX_PROCESSES_PER_CORE} per core, a larger number is capped with one line; so is "
        "--direct_num_workers in Beam's multi_processing mode)",
        kind="int",
        check=Check(lambda v: "" if v is None or v >= 1 else f"must be at least 1, got {v}"),
        shown_default="all cores; 1 when --direct_running_mode is given",
    )
    dry_run = Flag(
        "Write nothing: list the input, convert a sample in memory and print what the job "
        "would produce (records, bytes and shards per split, likely rejects) and take (local "
        "time, Dataflow vCPU-hours and cost for --machine_type)",
        kind="bool",
        default=False,
    )
    gcs_timeout_s = Flag(
        "Stop the run (one error line; rerunning resumes it) when Google Cloud Storage has "
        "not answered a request for this long (default {default}: rides out the blips the "
        "storage client retries, and still ends a run whose connection is gone within minutes)",
        kind="float",
        default=300.0,
        check=positive(MAX_WAIT_S),
    )
    quiet = Flag("Print only the summary", kind="bool", default=False)
    verbose = Flag(
        "Show the traceback of an error, not only its one line",
        kind="bool",
        default=False,
    )
    wait = Flag(
        "Wait for the job and print its summary (default {default}; a Flex Template launch "
        "passes false and returns once the job is submitted)",
        kind="bool",
        default=True,
    )


FLAGS: tuple[Flag, ...] = tuple(v for v in vars(Table).values() if isinstance(v, Flag))
BY_NAME = {flag.name: flag for flag in FLAGS}


def check_values(values: dict) -> None:
    """Raises ValueError for the first flag whose value (of ``values``, by name) is refused."""
    for flag in FLAGS:
        if flag.name in values:
            problem = flag.problem(values[flag.name])
            if problem:
                raise ValueError(problem)

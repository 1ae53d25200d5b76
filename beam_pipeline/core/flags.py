"""Every flag of the converter's command line, declared once: :data:`FLAGS`.

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
_KIND_REGEX = {
    "bool": "^(" + "|".join(BOOLEAN_WORDS) + ")$",
    "int": "^-?[0-9]+$",
    "float": r"^[0-9]+(\.[0-9]+)?$",
}


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
        name: The flag without its ``--``.
        help: What it does; ``{default}`` is replaced by the default.
        kind: ``str``, ``int``, ``float`` or ``bool`` (a switch that also
            takes a value: ``--overwrite`` and ``--overwrite=true``).
        default: Its value when not given (None: none).
        check: What a value must be; the configs run it (:func:`check_fields`).
            A ``str`` check receives the text, or None when not given.
        field: The config field it fills: ``"seed"`` (JobConfig),
            ``"image.size"`` (JobConfig's ImageSpec); None: a run option
            (``RunOptions``, of the flag's name) that decides nothing of the output.
        to_field: The field's value from the flag's (default: the same).
        from_field: The flag's value from the field's, to check a converted field.
        metavar: The value's name in ``--help``.
        required: The command line must give it.
        template: How the Flex Template offers it; None: it does not.
        shown_default: The default in words, where the value is decided later
            (``--local_processes``: the number of cores).
        const: A ``str`` flag's value when given alone (``--dedupe``: ``exact``).
    """

    name: str
    help: str
    kind: str = "str"
    default: Any = None
    check: Check | None = None
    field: str | None = None
    to_field: Callable[[Any], Any] | None = None
    from_field: Callable[[Any], Any] | None = None
    metavar: str | None = None
    required: bool = False
    template: Template | None = None
    shown_default: str | None = None
    const: str | None = None

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


FLAGS: tuple[Flag, ...] = (
    Flag(
        "input",
        "Image root: INPUT/<class>/**/<image>, or INPUT/{train,val,test}/<class>/...; with "
        "--manifest, the folder its relative paths start from",
        template=Template(
            "Input images",
            _GCS_PATH,
            "gs://bucket/prefix holding one folder per class (or train/val/test folders of "
            "class folders). Leave empty when using manifest.",
        ),
    ),
    Flag(
        "output",
        "Output folder (local path or gs://bucket/prefix)",
        required=True,
        field="output",
        template=Template(
            "Output folder",
            _GCS_PATH,
            "gs://bucket/prefix for the shards, labels.txt, rejects.jsonl and "
            "imagerecords.json. Must be empty unless overwrite is true.",
        ),
    ),
    Flag(
        "manifest",
        "CSV or JSONL with path,label[,split] rows instead of class folders; relative paths "
        "start from --input if given, else from the manifest's own folder",
        metavar="FILE",
        template=Template("Manifest", r"^gs://[^\n\r]+\.(csv|jsonl)$"),
    ),
    Flag(
        "splits",
        "NAME=FRACTION,... summing to 1; names of letters, digits and _, not 'all' (TFDS "
        "reserves it), no two differing only in case (default {default})",
        default=keys.DEFAULT_SPLITS,
        check=Check(
            _raises(keys.parse_splits), r"^[A-Za-z0-9_]+=[0-9.]+(,[A-Za-z0-9_]+=[0-9.]+)*$"
        ),
        field="splits",
        to_field=keys.parse_splits,
        template=Template("Split fractions"),
    ),
    Flag(
        "seed",
        "Seed of the split and shuffle hashes (default {default})",
        kind="int",
        default=42,
        field="seed",
        template=Template("Seed"),
    ),
    Flag(
        "group_by",
        "Keep each group of images in one split: the first capture group of a search of the "
        "image ID (its path relative to --input) names its group, whose split is drawn from "
        "that name; an ID that does not match is its own group (a manifest may give a group "
        "column instead). E.g. '^([^/]+/patient\\d+)_'",
        metavar="REGEX",
        check=Check(_raises(groups.check_group_by), r"^[^\n\r]*\([^\n\r]*$"),
        field="group_by",
        template=Template("Group pattern"),
    ),
    Flag(
        "image_size",
        "Target size in pixels (default {default})",
        kind="int",
        default=256,
        check=int_range(1, MAX_IMAGE_SIZE),
        field="image.size",
        template=Template("Image size"),
    ),
    Flag(
        "resize",
        "shorter: shorter side = size; longer: longer side = size; crop: centre crop to "
        "exactly size x size (smaller images are enlarged first); pad: exactly size x size, "
        "letterboxed with black bars (smaller images are centred, not enlarged, unless "
        "--upscale); none (default {default})",
        default="shorter",
        check=one_of(RESIZE_MODES),
        field="image.resize",
        template=Template("Resize mode"),
    ),
    Flag(
        "upscale",
        "Also enlarge images smaller than --image_size (shorter, longer, pad; crop always "
        "does) (default {default})",
        kind="bool",
        default=False,
        field="image.upscale",
        template=Template("Upscale small images"),
    ),
    Flag(
        "jpeg_quality",
        "JPEG quality of the stored images, 1-100 (default {default})",
        kind="int",
        default=90,
        check=int_range(1, 100),
        field="image.jpeg_quality",
        template=Template("JPEG quality"),
    ),
    Flag(
        "resample",
        "Downscaling filter: bicubic, bilinear (faster, softer) or lanczos (sharper, slower) "
        "(default {default})",
        default="bicubic",
        check=one_of(RESAMPLE_NAMES),
        field="image.resample",
        template=Template("Downscaling filter"),
    ),
    Flag(
        "image_timeout_s",
        "Reject an image whose conversion takes longer than this many seconds (default "
        "{default}; 0: no limit)",
        kind="float",
        default=60.0,
        check=seconds_limit(MAX_WAIT_S),
        field="image.timeout_s",
    ),
    Flag(
        "target_shard_mb",
        "Target shard size in MB: shards per split = max(min_shards, ceil(split bytes / "
        "target)), exactly (fewer only when the split has fewer records) (default {default})",
        kind="float",
        default=200.0,
        check=positive(MAX_SHARD_MB),
        field="target_shard_bytes",
        to_field=lambda mb: int(mb * 2**20),
        from_field=lambda size: size / 2**20,
        template=Template("Target shard size (MB)"),
    ),
    Flag(
        "min_shards",
        "Minimum shards per split; raise it to at least the number of hosts that read the "
        "data (default {default})",
        kind="int",
        default=1,
        check=int_range(1, MAX_SHARDS),
        field="min_shards",
        template=Template("Minimum shards per split"),
    ),
    Flag(
        "max_reject_fraction",
        "Fail (and write no imagerecords.json) if a larger fraction of the images is "
        "rejected (default {default})",
        kind="float",
        default=0.01,
        check=fraction(),
        field="max_reject_fraction",
        template=Template("Maximum rejected fraction"),
    ),
    Flag(
        "overwrite",
        "Replace a finished dataset in --output (a folder holding anything else is refused); "
        "not needed to resume an unfinished run (default {default})",
        kind="bool",
        default=False,
        template=Template("Overwrite"),
    ),
    Flag(
        "reuse",
        "A finished dataset of this input made with the same image settings (local or gs://; "
        "only read): an image whose source file has the SHA-256 its record names is copied "
        "from it, not converted again. The output is what a full conversion writes",
        metavar="OLD",
        field="reuse",
        template=Template("Previous dataset to reuse", _GCS_PATH),
    ),
    Flag(
        "skip_unreadable_folders",
        "When a local class folder cannot be read, list it in skipped.jsonl (its class keeps "
        "its place in labels.txt) and convert the rest; default: such a folder stops the job "
        "before it starts",
        kind="bool",
        default=False,
    ),
    Flag(
        "dedupe",
        "Keep one image of each group of duplicates; reject the others. --dedupe (or exact): "
        "groups of identical source files, keeping the smallest ID, the others 'duplicate of "
        "<id>' (not counted towards --max_reject_fraction); --dedupe near: near copies too "
        "(resized, re-encoded, lightly cropped), keeping the one in the first split (train, "
        "val, test) with the smallest ID, the others 'near duplicate of <id>' (counted towards "
        "--max_reject_fraction: a near drop is a judgement, not a certainty). Groups "
        "are always reported in duplicates.jsonl and near_duplicates.jsonl (default {default})",
        default="off",
        check=one_of((*dedupe_modes.DEDUPE_MODES, *BOOLEAN_WORDS)),
        field="dedupe",
        to_field=lambda value: dedupe_modes.dedupe_mode(value, BOOLEAN_WORDS),
        metavar="MODE",
        const="exact",
        template=Template("Drop duplicates"),
    ),
    Flag(
        "index_files",
        "Also write <shard>.tfrecord.idx files ('offset length' per record, the format "
        "NVIDIA DALI's TFRecord reader needs) (default {default})",
        kind="bool",
        default=False,
        field="index_files",
        template=Template("Index files"),
    ),
    Flag(
        "tfds_name",
        "The dataset's name in TFDS's metadata files, which let "
        "tfds.builder_from_directory(OUTPUT) read the shards: lower-case letters, digits and "
        "_ (default {default})",
        default=tfds_metadata.DEFAULT_NAME,
        field="tfds_name",
    ),
    Flag(
        "tfds_version",
        "The dataset's version in TFDS's metadata files, MAJOR.MINOR.PATCH (default {default})",
        default=tfds_metadata.DEFAULT_VERSION,
        field="tfds_version",
    ),
    Flag(
        "local_processes",
        "Convert images in this many local processes, at least 1, on a local run: the local "
        "engine or Beam's DirectRunner in_memory (default {default}; at most "
        f"{MAX_PROCESSES_PER_CORE} per core, a larger number is capped with one line; so is "
        "--direct_num_workers in Beam's multi_processing mode)",
        kind="int",
        check=Check(lambda v: "" if v is None or v >= 1 else f"must be at least 1, got {v}"),
        shown_default="all cores; 1 when --direct_running_mode is given",
    ),
    Flag(
        "dry_run",
        "Write nothing: list the input, convert a sample in memory and print what the job "
        "would produce (records, bytes and shards per split, likely rejects) and take (local "
        "time, Dataflow vCPU-hours and cost for --machine_type)",
        kind="bool",
        default=False,
    ),
    Flag(
        "gcs_timeout_s",
        "Stop the run (one error line; rerunning resumes it) when Google Cloud Storage has "
        "not answered a request for this long (default {default}: rides out the blips the "
        "storage client retries, and still ends a run whose connection is gone within minutes)",
        kind="float",
        default=300.0,
        check=positive(MAX_WAIT_S),
    ),
    Flag("quiet", "Print only the summary", kind="bool", default=False),
    Flag(
        "verbose",
        "Show the traceback of an error, not only its one line",
        kind="bool",
        default=False,
    ),
    Flag(
        "wait",
        "Wait for the job and print its summary (default {default}; a Flex Template launch "
        "passes false and returns once the job is submitted)",
        kind="bool",
        default=True,
    ),
)

BY_NAME = {flag.name: flag for flag in FLAGS}
BY_FIELD = {flag.field: flag for flag in FLAGS if flag.field}


def default(name: str):
    return BY_NAME[name].default


def field(flag_name: str, declared: dict | None = None, *, prefix: str = ""):
    """A config field filled by ``--flag_name``: its default is the flag's
    (converted to the field's value), ``declared`` its settings metadata."""
    flag = BY_NAME[flag_name]
    if flag.field is None or not flag.field.startswith(prefix):
        raise ValueError(f"--{flag_name} fills no field under {prefix!r}")
    metadata = {**(declared or {}), _FLAG_KEY: flag_name}
    if flag.default is None and flag.required:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=flag.field_value(flag.default), metadata=metadata)


_FLAG_KEY = "imagerecords.flag"


def check_fields(config, skip: frozenset[str] = frozenset()) -> None:
    """Raises ValueError naming the first field of ``config`` whose flag's check refuses it."""
    for config_field in dataclasses.fields(config):
        name = config_field.metadata.get(_FLAG_KEY)
        if name is None or config_field.name in skip:
            continue
        flag = BY_NAME[name]
        value = getattr(config, config_field.name)
        if flag.checked_as_given:
            continue  # checked by field_value, on its way in
        if flag.from_field is not None:
            value = flag.from_field(value)
        problem = flag.problem(value)
        if problem:
            raise ValueError(problem)


def check_values(values: dict) -> None:
    """Raises ValueError for the first flag whose value (of ``values``, by name) is refused."""
    for flag in FLAGS:
        if flag.name in values:
            problem = flag.problem(values[flag.name])
            if problem:
                raise ValueError(problem)

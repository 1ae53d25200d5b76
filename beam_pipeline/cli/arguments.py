"""The command line's arguments: our flags, checked, and Beam's, passed through.

:func:`parse_args` splits the command line into this tool's flags and Beam's
pipeline options and checks both without importing Beam (Beam's against the
option table in ``beam_options``), so a bad flag ends with one ``error:`` line
before any process is forked. Beam's flags are read there once, into a
:class:`~beam_pipeline.beam_internals.beam_options.BeamFlags` that every later
step reads (the runner, the DirectRunner's mode, ...).
:func:`with_local_defaults` fills in the local DirectRunner's mode and the
number of conversion processes.
"""

from __future__ import annotations

import argparse
import os
import sys

from beam_pipeline.beam_internals import beam_options, beam_private
from beam_pipeline.core import groups, images, keys, tfds_metadata
from beam_pipeline.core.errors import UsageError
from beam_pipeline.storage import discovery, gcs

EXAMPLE_ARGS = (
    "--input ./flowers --output ./flowers-records --splits train=0.9,val=0.1 --image_size 256"
)


# Conversion is CPU work (decode, resize, encode): a few processes per core
# cover the time each waits on its file (gs:// reads included); many more
# only share the same cores, and each holds its own memory.
MAX_PROCESSES_PER_CORE = 4


def capped_processes(requested: int, cpus: int) -> tuple[int, str | None]:
    """``--local_processes`` as run on ``cpus`` cores, and the line saying it was capped.

    Each conversion process is forked up front; a count far beyond the cores
    would fork until the kernel's out-of-memory killer ends the run.
    """
    cap = MAX_PROCESSES_PER_CORE * max(1, cpus)
    if requested <= cap:
        return requested, None
    return cap, (
        f"--local_processes {requested} is more than {cap} ({MAX_PROCESSES_PER_CORE} per core "
        f"on this machine's {cpus} cores); running {cap}"
    )


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# A switch that also takes a value: `--overwrite` and `--overwrite=true` both work,
# as Dataflow Flex Templates pass every parameter as --name=value.
_FLAG = {"nargs": "?", "const": True, "default": False, "type": _boolean, "metavar": "BOOL"}


def program_name(argv0: str) -> str:
    """How the user started the converter: the ``imagerecords`` command (its own
    name), else ``python -m beam_pipeline``."""
    name = os.path.basename(argv0)
    if not name or name.endswith(".py") or name.startswith("-"):  # -m: .../__main__.py
        return "python -m beam_pipeline"
    return name


def build_parser() -> argparse.ArgumentParser:
    prog = program_name(sys.argv[0] if sys.argv else "")
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Convert an image-folder dataset into shuffled, split TFRecord shards. "
        "Any other flag is an Apache Beam pipeline option (--runner, --project, ...).",
        epilog=f"example: {prog} {EXAMPLE_ARGS}",
        allow_abbrev=False,
    )
    add = parser.add_argument
    add(
        "--input",
        help="Image root: INPUT/<class>/**/<image>, or INPUT/{train,val,test}/<class>/...; "
        "with --manifest, the folder its relative paths start from",
    )
    add("--output", required=True, help="Output folder (local path or gs://bucket/prefix)")
    add(
        "--manifest",
        help="CSV or JSONL with path,label[,split] rows instead of class folders; relative "
        "paths start from --input if given, else from the manifest's own folder",
    )
    add(
        "--splits",
        default=keys.DEFAULT_SPLITS,
        help="NAME=FRACTION,... summing to 1; names of letters, digits and _, not 'all' "
        "(TFDS reserves it) (default %(default)s)",
    )
    add("--seed", type=int, default=42, help="Seed of the split and shuffle hashes (default 42)")
    add(
        groups.FLAG,
        metavar="REGEX",
        help="Keep each group of images in one split: the first capture group of a search "
        "of the image ID (its path relative to --input) names its group, whose split is "
        "drawn from that name; an ID that does not match is its own group (a manifest "
        "may give a group column instead). E.g. '^([^/]+/patient\\d+)_'",
    )
    add("--image_size", type=int, default=256, help="Target size in pixels (default 256)")
    add(
        "--resize",
        default="shorter",
        help="shorter: shorter side = size; longer: longer side = size; crop: centre "
        "crop to exactly size x size (smaller images are enlarged first); pad: exactly "
        "size x size, letterboxed with black bars (smaller images are centred, not "
        "enlarged, unless --upscale); none (default shorter)",
    )
    add(
        "--upscale",
        **_FLAG,
        help="Also enlarge images smaller than --image_size (shorter, longer, pad; "
        "crop always does)",
    )
    add("--jpeg_quality", type=int, default=90, help="JPEG quality 1-100 (default 90)")
    add(
        "--resample",
        default="bicubic",
        help="Downscaling filter: bicubic|bilinear (faster, softer)|lanczos (sharper, slower); "
        "default bicubic",
    )
    add(
        "--image_timeout_s",
        type=float,
        default=60.0,
        help="Reject an image whose conversion takes longer than this (default 60; 0: no limit)",
    )
    add(
        "--target_shard_mb", type=float, default=200.0, help="Target shard size in MB (default 200)"
    )
    add("--min_shards", type=int, default=1, help="Minimum shards per split (default 1)")
    add(
        "--max_reject_fraction",
        type=float,
        default=0.01,
        help="Fail (and write no imagerecords.json) if more images are rejected (default 0.01)",
    )
    add("--overwrite", **_FLAG, help="Replace the outputs of an earlier run in --output")
    add(
        "--reuse",
        metavar="OLD",
        help="A finished dataset of this input made with the same image settings (local or "
        "gs://; only read): an image whose source file has the SHA-256 its record names is "
        "copied from it, not converted again. The output is what a full conversion writes",
    )
    add(
        discovery.SKIP_UNREADABLE_FLAG,
        **_FLAG,
        help="When a local class folder cannot be read, list it in skipped.jsonl (its class "
        "keeps its place in labels.txt) and convert the rest; default: such a folder stops "
        "the job before it starts",
    )
    add(
        "--dedupe",
        **_FLAG,
        help="Keep one image of each group of identical source files (the smallest ID); "
        "reject the others as 'duplicate of <id>' (they do not count towards "
        "--max_reject_fraction). Groups are always reported in duplicates.jsonl",
    )
    add(
        "--index_files",
        **_FLAG,
        help="Also write <shard>.tfrecord.idx files ('offset length' per record, the "
        "format NVIDIA DALI's TFRecord reader needs)",
    )
    add(
        "--tfds_name",
        default=tfds_metadata.DEFAULT_NAME,
        help="The dataset's name in TFDS's metadata files, which let "
        "tfds.builder_from_directory(OUTPUT) read the shards: lower-case letters, digits "
        f"and _ (default {tfds_metadata.DEFAULT_NAME})",
    )
    add(
        "--tfds_version",
        default=tfds_metadata.DEFAULT_VERSION,
        help=f"The dataset's version in TFDS's metadata files, MAJOR.MINOR.PATCH "
        f"(default {tfds_metadata.DEFAULT_VERSION})",
    )
    add(
        "--local_processes",
        type=int,
        default=None,
        help="Convert images in this many local processes, at least 1, on a local run: "
        "the local engine or Beam's DirectRunner in_memory (default: all cores; 1 when "
        f"--direct_running_mode is given; at most {MAX_PROCESSES_PER_CORE} per core, a "
        "larger number is capped with one line)",
    )
    add(
        "--dry_run",
        **_FLAG,
        help="Write nothing: list the input, convert a sample in memory and print what the "
        "job would produce (records, bytes and shards per split, likely rejects) and take "
        "(local time, Dataflow vCPU-hours and cost for --machine_type)",
    )
    add(
        "--gcs_timeout_s",
        type=float,
        default=gcs.DEFAULT_TIMEOUT_S,
        help="Stop the run (one error line; rerunning resumes it) when Google Cloud Storage "
        "has not answered a request for this long (default %(default)g: rides out the "
        "blips the storage client retries, and still ends a run whose connection is gone "
        "within minutes)",
    )
    add("--quiet", **_FLAG, help="Print only the summary")
    add("--verbose", **_FLAG, help="Show the traceback of an error, not only its one line")
    add(
        "--wait",
        type=_boolean,
        default=True,
        metavar="true|false",
        help="Wait for the job and print its summary (default true; a Flex Template "
        "launch passes false and returns once the job is submitted)",
    )
    return parser


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, no usage dump
        raise _ArgumentError(message)


def _require_dask(beam: beam_options.BeamFlags) -> None:
    """Refuses the Dask runner, before any work, where Dask is not installed."""
    from importlib.util import find_spec

    if not beam.on_dask:
        return
    if not (find_spec("dask") and find_spec("distributed")):
        raise UsageError(
            "the Dask runner needs Dask: pip install 'dask[distributed]' "
            "(here and on every worker; docs/dask.md)"
        )
    beam_private.require_beam_for_dask()


def _check_beam_args(beam_args: list[str]) -> beam_options.BeamFlags:
    """Every Beam flag and its value, checked and read without importing Beam (see beam_options)."""
    # The Flex Template launcher may add flags of its own; warn, don't fail.
    lenient = bool(os.environ.get("IMAGERECORDS_LENIENT_OPTIONS"))
    beam = beam_options.check(beam_args, _OWN_FLAGS, lenient=lenient)
    _require_dask(beam)
    # (A Flex Template launcher passes the project, region and locations itself.)
    missing = None if lenient else beam_options.missing_runner_options(beam)
    if missing is not None:
        raise UsageError(missing)
    return beam


_OWN_FLAGS = {opt for a in build_parser()._actions for opt in a.option_strings}


def parse_args(argv: list[str]):
    """-> (our namespace, Beam's flags). Raises UsageError for any bad argument, Beam's included.

    Imports no Beam, so a bad flag is refused before any process is forked.
    Beam's flags come back read (:class:`beam_options.BeamFlags`): whatever
    depends on one reads it there, never from the command line again.
    """
    parser = build_parser()
    parser.__class__ = _Parser
    # A required flag is checked after the unknown ones: `--ouput x` is a typo
    # to name, not a missing --output. (--help still shows it as required.)
    asks_help = bool({"-h", "--help"} & set(argv))
    required = [action for action in parser._actions if action.required and not asks_help]
    for action in required:
        action.required = False
    try:
        args, beam_args = parser.parse_known_args(argv)
    except _ArgumentError as error:
        raise UsageError(str(error)) from None
    beam = _check_beam_args(beam_args)
    missing = [a.option_strings[0] for a in required if getattr(args, a.dest) is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)}")
    if not args.input and not args.manifest:
        raise UsageError("--input is required (or --manifest FILE)")
    try:
        args.split_fractions = keys.parse_splits(args.splits)
        groups.check_group_by(args.group_by)
        args.image_spec = images.ImageSpec.from_flags(vars(args))
    except ValueError as error:
        raise UsageError(str(error)) from None
    if not args.target_shard_mb > 0:
        raise UsageError(f"--target_shard_mb must be positive, got {args.target_shard_mb:g}")
    if args.local_processes is not None and args.local_processes < 1:
        raise UsageError(f"--local_processes must be at least 1, got {args.local_processes}")
    if args.local_processes is not None:
        args.local_processes, note = capped_processes(args.local_processes, os.cpu_count() or 1)
        if note and not args.quiet:
            print(f"imagerecords: {note}", file=sys.stderr, flush=True)
    if not args.gcs_timeout_s > 0:
        raise UsageError(f"--gcs_timeout_s must be positive, got {args.gcs_timeout_s:g}")
    if args.min_shards < 1:
        raise UsageError(f"--min_shards must be at least 1, got {args.min_shards}")
    if not 0.0 <= args.max_reject_fraction <= 1.0:
        raise UsageError(
            f"--max_reject_fraction must be in [0, 1], got {args.max_reject_fraction:g}"
        )
    return args, beam


def with_local_defaults(
    beam: beam_options.BeamFlags, processes: int | None
) -> tuple[beam_options.BeamFlags, int]:
    """DirectRunner with no explicit mode: use every core, not one in-memory thread.

    Returns Beam's flags (with the mode added) and the number of local
    conversion processes (1: none beside the runner's own workers).
    ``multi_threading`` is avoided on purpose (docs/format.md section 5: it was seen
    to lose records under load).
    """
    if not beam.on_direct_runner:
        return beam, 1
    mode = beam.direct_running_mode
    if mode is not None:
        return beam, (processes or 1) if mode == "in_memory" else 1
    extra = ["--direct_running_mode=in_memory"]
    if not beam.given("pipeline_type_check"):
        # Beam's construction-time type checks guard user-written pipelines; this
        # one is fixed and tested, and checking it costs CPU on every run while
        # the conversion processes need the cores.
        extra.append("--no_pipeline_type_check")
    return beam.plus(extra), processes or os.cpu_count() or 1


def direct_workers(beam: beam_options.BeamFlags, processes: int) -> int:
    """The processes that convert on a DirectRunner run: the local pool's in the
    ``in_memory`` mode, else Beam's workers (``--direct_num_workers``: Beam's
    default 1; 0 is one per core)."""
    if beam.direct_running_mode == "in_memory":
        return processes
    return beam.get("direct_num_workers", 1) or os.cpu_count() or 1


def verbose_requested(argv: list[str]) -> bool:
    """--verbose as the parser will read it (the last one wins), for an error
    raised before or while parsing."""
    found = False
    for index, arg in enumerate(argv):
        name, has_value, value = arg.partition("=")
        if name != "--verbose":
            continue
        if not has_value and index + 1 < len(argv) and not argv[index + 1].startswith("-"):
            value, has_value = argv[index + 1], True
        try:
            found = _boolean(value) if has_value else True
        except argparse.ArgumentTypeError:
            found = False
    return found

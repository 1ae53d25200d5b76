"""The command line's arguments: our flags, checked, and Beam's, passed through.

:func:`parse_args` checks both without importing Beam, so a bad flag ends with one
``error:`` line before any process is forked, and reads Beam's once into ``BeamFlags``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from beam_pipeline.beam_internals import beam_options, beam_private
from beam_pipeline.core import flags, images, settings
from beam_pipeline.core.errors import UsageError
from beam_pipeline.core.flags import MAX_PROCESSES_PER_CORE
from beam_pipeline.engines import choice
from beam_pipeline.features.near import feature as near_feature
from beam_pipeline.stages.job_config import JobConfig
from beam_pipeline.storage import discovery, paths

EXAMPLE_ARGS = (
    "--input ./flowers --output ./flowers-records --splits train=0.9,val=0.1 --image_size 256"
)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How this run goes, beside the dataset it makes: the flags that fill no
    config field (core/flags.py), each checked by its flag's check."""

    input: str | None
    manifest: str | None
    skip_unreadable_folders: bool
    overwrite: bool
    local_processes: int | None
    dry_run: bool
    gcs_timeout_s: float
    quiet: bool
    verbose: bool
    wait: bool

    def __post_init__(self):
        try:
            flags.check_values(dataclasses.asdict(self))
        except ValueError as error:
            raise UsageError(str(error)) from None
        if not self.input and not self.manifest:
            raise UsageError("--input is required (or --manifest FILE)")


@dataclasses.dataclass(frozen=True)
class Command:
    """The command line, parsed: the job's config, the run's options, Beam's flags.

    ``config.layout`` is None until :func:`discover` finds the input (parsing
    reads no folder).
    """

    config: JobConfig
    options: RunOptions
    beam: beam_options.BeamFlags


def capped_processes(
    requested: int, cpus: int, flag: str = "--local_processes"
) -> tuple[int, str | None]:
    """A count of processes (``flag``'s value) as run on ``cpus`` cores, and the line
    saying it was capped.

    Each conversion process is forked up front; a count far beyond the cores
    would fork until the kernel's out-of-memory killer ends the run.
    """
    cap = MAX_PROCESSES_PER_CORE * max(1, cpus)
    if requested <= cap:
        return requested, None
    return cap, (
        f"{flag} {requested} is more than {cap} ({MAX_PROCESSES_PER_CORE} per core "
        f"on this machine's {cpus} cores); running {cap}"
    )


def capped_direct_workers(
    beam: beam_options.BeamFlags, cpus: int
) -> tuple[beam_options.BeamFlags, str | None]:
    """Beam's flags with ``--direct_num_workers`` capped as ``--local_processes`` is,
    where Beam forks that many worker processes (DirectRunner's ``multi_processing``
    mode), and the line saying it was capped.

    The cap is a later ``--direct_num_workers``: Beam's parser takes the last
    one, and so do the dry run and the job, which read these flags.
    """
    workers = beam.direct_num_workers
    if not (beam.on_direct_runner and beam.direct_running_mode == "multi_processing" and workers):
        return beam, None
    capped, note = capped_processes(workers, cpus, "--direct_num_workers")
    if note is None:
        return beam, None
    return beam.plus([f"--direct_num_workers={capped}"]), note


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if not value:
        return False
    if value in flags.BOOLEAN_WORDS:
        return flags.BOOLEAN_WORDS[value]
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# A switch that also takes a value: `--overwrite` and `--overwrite=true` both work,
# as Dataflow Flex Templates pass every parameter as --name=value.
_SWITCH = {"nargs": "?", "const": True, "type": _boolean, "metavar": "BOOL"}
_TYPES = {"str": str, "int": int, "float": float}


def program_name(argv0: str) -> str:
    """How the user started the converter: the ``imagerecords`` command (its own
    name), else ``python -m beam_pipeline``."""
    name = os.path.basename(argv0)
    if not name or name.endswith(".py") or name.startswith("-"):  # -m: .../__main__.py
        return "python -m beam_pipeline"
    return name


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, no usage dump
        raise _ArgumentError(message)


def build_parser() -> argparse.ArgumentParser:
    return _build(argparse.ArgumentParser, require=True)


def _build(parser_class: type[argparse.ArgumentParser], require: bool):
    """The parser of our flags; ``require=False``: one that leaves the check of
    the required flags to its caller (:func:`parse_args`)."""
    prog = program_name(sys.argv[0] if sys.argv else "")
    parser = parser_class(
        prog=prog,
        description="Convert an image-folder dataset into shuffled, split TFRecord shards. "
        "Any other flag is an Apache Beam pipeline option (--runner, --project, ...).",
        epilog=f"example: {prog} {EXAMPLE_ARGS}",
        allow_abbrev=False,
    )
    for flag in flags.FLAGS:
        kind = _SWITCH if flag.kind == "bool" else {"type": _TYPES[flag.kind]}
        if flag.const is not None:  # a value that may be left out: --dedupe, --dedupe near
            kind = {**kind, "nargs": "?", "const": flag.const}
        named = {"metavar": flag.metavar} if flag.metavar else {}
        parser.add_argument(
            flag.option,
            default=flag.default,
            required=flag.required and require,
            help=flag.help_text,
            **kind,
            **named,
        )
    return parser


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


_OWN_FLAGS = {"-h", "--help", *(flag.option for flag in flags.FLAGS)}


def parse_args(argv: list[str]) -> Command:
    """The command line as a :class:`Command`. Raises UsageError for any bad argument,
    Beam's included.

    Imports no Beam and reads no folder, so a bad flag is refused before any
    process is forked. Beam's flags come back read (:class:`beam_options.BeamFlags`):
    whatever depends on one reads it there, never from the command line again.
    """
    # A required flag is checked after the unknown ones: `--ouput x` is a typo
    # to name, not a missing --output. (--help still shows it as required.)
    asks_help = bool({"-h", "--help"} & set(argv))
    try:
        args, beam_args = _build(_Parser, require=asks_help).parse_known_args(argv)
    except _ArgumentError as error:
        raise UsageError(str(error)) from None
    given = vars(args)  # flag name -> value
    try:  # every value as given, before any is converted (--target_shard_mb to bytes)
        flags.check_values(given)
    except ValueError as error:
        raise UsageError(str(error)) from None
    beam = _check_beam_args(beam_args)
    missing = [f.option for f in flags.FLAGS if f.required and given[f.name] is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)}")
    # A location is made a place where it enters (paths.place), which every
    # later step joins and compares as it is.
    given = {
        name: paths.place(value, f"--{name}") if flags.BY_NAME[name].location and value else value
        for name, value in given.items()
    }
    options = RunOptions(**{f.name: given[f.name] for f in dataclasses.fields(RunOptions)})
    cpus = os.cpu_count() or 1
    notes = []
    if options.local_processes is not None:
        capped, note = capped_processes(options.local_processes, cpus)
        notes.append(note)
        options = dataclasses.replace(options, local_processes=capped)
    beam, note = capped_direct_workers(beam, cpus)
    notes.append(note)
    for note in notes:
        if note and not options.quiet:
            print(f"imagerecords: {note}", file=sys.stderr, flush=True)
    return Command(_config(given, beam, options), options, beam)


def _config(given: dict, beam: beam_options.BeamFlags, options: RunOptions) -> JobConfig:
    """The JobConfig of the flags' values, each in the field that names its flag."""
    try:
        image = settings.flag_values(images.ImageSpec, given)
        spec = images.ImageSpec(pixels=near_feature.PIXELS, **image)
        values = settings.flag_values(JobConfig, given)
    except ValueError as error:
        raise UsageError(str(error)) from None
    _, processes = choice.with_local_defaults(beam, options.local_processes)
    return JobConfig(layout=None, image=spec, conversion_processes=processes, **values)


def discover(command: Command) -> Command:
    """The command with its config's layout: the input found (``discovery.discover``)."""
    options = command.options
    layout = discovery.discover(options.input, options.manifest, options.skip_unreadable_folders)
    return dataclasses.replace(command, config=dataclasses.replace(command.config, layout=layout))


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

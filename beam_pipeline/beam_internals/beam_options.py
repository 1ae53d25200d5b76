"""Apache Beam's command-line flags, checked and read once into :class:`BeamFlags`, without importing Beam.

Checked against ``_beam_option_table.py`` (written by running this module); with
another Beam installed, against a table built from it. Why: docs/architecture.md,
"Beam's flags without Beam".
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import pprint
import re
import types
from collections.abc import Mapping
from typing import Any

from beam_pipeline.core.errors import UsageError

# --runner names that select this project's DaskRunner (beam_pipeline/beam_internals/dask_runner.py:
# Beam's, with the translation fixes this job needs). Beam knows its Dask runner
# by the dotted path only; that path gets the fixed one too.
DASK_RUNNER_NAMES = ("DaskRunner", "dask", "apache_beam.runners.dask.dask_runner.DaskRunner")
DASK = "DaskRunner"
DIRECT = "DirectRunner"
DATAFLOW = "DataflowRunner"
# Where Beam's DataflowRunner looks for a region not given as --region, after
# the environment: gcloud's configuration.
_GCLOUD_REGION = ("gcloud", "config", "get-value", "compute/region")

# kind of a flag's value: "flag" (no value), "optional" (nargs="?"), "int",
# "float", "json", "text"
_CHECKS = {"int": int, "float": float, "json": json.loads}
# The largest value of a numeric Beam flag: Java's int.
MAX_BEAM_INT = 2**31 - 1
# argparse's actions that keep the last value given (every other one gathers).
_STORE_ACTIONS = ("_StoreAction", "_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction")


def _beam_version() -> str | None:
    """The installed Beam's version, read from its version.py without importing Beam.

    (``importlib.metadata`` costs ~0.1-0.8 s of imports and scanning here, on
    the path before the conversion processes start.)
    """
    spec = importlib.util.find_spec("apache_beam")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(path, encoding="utf-8") as stream:
            match = re.search(r"""__version__\s*=\s*['"]([^'"]+)['"]""", stream.read())
    except OSError:  # pragma: no cover
        return None
    return match.group(1) if match else None


def snapshot() -> dict:
    """The table of the installed Beam's flags (imports Beam)."""
    from apache_beam.options import pipeline_options
    from apache_beam.runners import runner

    try:  # registers the --dask_* options (they need dask installed to import)
        import apache_beam.runners.dask.dask_runner  # noqa: F401
    except ImportError:  # pragma: no cover - dask is in the test extras
        pass
    parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
    stack = [pipeline_options.PipelineOptions]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        try:
            cls._add_argparse_args(parser)
        except Exception:  # pragma: no cover - an option class we cannot introspect
            continue
    options = {}
    for action in parser._actions:
        if action.nargs == 0:
            kind = "flag"
        elif action.nargs == "?":
            kind = "optional"
        elif action.type is int:
            kind = "int"
        elif action.type is float:
            kind = "float"
        elif getattr(action.type, "__name__", "") == "loads":
            kind = "json"
        else:
            kind = "text"
        # Beam's store actions keep the last value given; the others (append,
        # comma-separated lists, dicts) gather every one.
        gathers = type(action).__name__ not in _STORE_ACTIONS
        const = action.const if isinstance(action.const, (bool, str, int, type(None))) else None
        choices = tuple(action.choices) if action.choices else None
        for name in action.option_strings:
            options[name] = (kind, choices, action.dest, const, gathers)
    return {
        "beam_version": _beam_version(),
        "options": dict(sorted(options.items())),
        # --runner NAME as Beam's create_runner finds it: lower-cased, with or
        # without "runner", else NAME itself as a dotted class path.
        "runners": dict(sorted(runner._RUNNER_MAP.items())),
        "runner_names": tuple(pipeline_options.StandardOptions.KNOWN_RUNNER_NAMES),
    }


def _table() -> dict:
    try:
        from beam_pipeline.beam_internals import _beam_option_table as table

        if table.TABLE["beam_version"] == _beam_version():
            return table.TABLE
    except ImportError:  # pragma: no cover - the table is part of the package
        pass
    return snapshot()


def number_problem(kind: str, number) -> str:
    """What every numeric Beam flag refuses ("" when nothing): each one counts or
    measures something (workers, ports, seconds, a rate), so a negative number or
    one that is not finite is a mistake Beam finds only after the job started
    (``--direct_num_workers -3`` forks, then fails); past :data:`MAX_BEAM_INT`
    (Java's int, which the runners hold it in) is one too."""
    if kind == "float" and not math.isfinite(number):
        return f"must be a finite number, got {number}"
    if number < 0:
        return f"must not be negative, got {number:g}"
    if kind == "int" and number > MAX_BEAM_INT:
        return f"must be at most {MAX_BEAM_INT}, got {number}"
    return ""


def _check_value(name: str, kind: str, choices, value: str | None) -> None:
    if kind == "flag":
        if value is not None:
            raise UsageError(f"{name} takes no value, got {name}={value}")
        return
    if value is None:
        if kind == "optional":
            return
        raise UsageError(f"{name} needs a value")
    if not value.strip():  # Beam would take '' as given, and fail on it late or not at all
        raise UsageError(f"{name} is empty: give a value, or leave the flag out")
    if choices is not None and value not in choices:
        raise UsageError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    check = _CHECKS.get(kind)
    if check is not None:
        try:
            read = check(value)
        except ValueError:
            what = {"int": "an integer", "float": "a number", "json": "JSON"}[kind]
            raise UsageError(f"{name} must be {what}, got {value!r}") from None
        problem = number_problem(kind, read) if kind in ("int", "float") else ""
        if problem:
            raise UsageError(f"{name} {problem}")


def runner_class(name: str, table: dict) -> str:
    """The runner ``--runner NAME`` makes, as Beam's ``create_runner`` finds it.

    A runner Beam knows by name comes back as its class name (``direct``,
    ``directrunner`` and Beam's dotted path are all ``DirectRunner``); any of
    :data:`DASK_RUNNER_NAMES` is :data:`DASK`; another dotted path is kept.
    """
    if name in DASK_RUNNER_NAMES:
        return DASK
    runners = table["runners"]
    path = runners.get(name.lower(), runners.get(name.lower() + "runner", name))
    return path.rsplit(".", 1)[-1] if path in runners.values() else path


def check_runner(name: str, table: dict) -> None:
    """Refuses a runner name Beam would not find (a dotted class path is left to Beam)."""
    runners = table["runners"]
    if (
        "." in name
        or name in DASK_RUNNER_NAMES
        or name.lower() in runners
        or name.lower() + "runner" in runners
    ):
        return
    raise UsageError(
        f"--runner {name}: unknown runner; Beam knows "
        f"{', '.join(table['runner_names'])}, or a dotted class path"
    )


@dataclasses.dataclass(frozen=True)
class BeamFlags:
    """Beam's flags as given, and the values Beam takes from them.

    Attributes:
        args: The flags, in order, as given (``PipelineOptions`` takes these).
        values: Beam's option name (its ``dest``) -> the value Beam's parser
            stores: a repeated flag's last value (argparse's ``store``), or a
            tuple of every value of a flag that gathers them (``--experiments``,
            ``--labels``, ...); a switch's value (``--no_pipeline_type_check``:
            False). Only the flags given.
        runner: The runner ``--runner`` makes (:func:`runner_class`), or None
            when no ``--runner`` is given (Beam's default, DirectRunner).
    """

    args: tuple[str, ...] = ()
    values: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    runner: str | None = None

    def __bool__(self) -> bool:  # any Beam flag at all (it sends the job to Beam)
        return bool(self.args)

    def given(self, option: str) -> bool:
        return option in self.values

    def get(self, option: str, default=None):
        return self.values.get(option, default)

    @property
    def on_direct_runner(self) -> bool:
        """DirectRunner: named, or Beam's default."""
        return self.runner in (None, DIRECT)

    @property
    def on_dask(self) -> bool:
        return self.runner == DASK

    @property
    def direct_running_mode(self) -> str | None:
        return self.get("direct_running_mode")

    @property
    def direct_num_workers(self) -> int | None:
        return self.get("direct_num_workers")

    @property
    def machine_type(self) -> str | None:
        """``--machine_type`` or its alias ``--worker_machine_type``."""
        return self.get("machine_type")

    @property
    def template_location(self) -> str | None:
        return self.get("template_location")

    def plus(self, extra: list[str]) -> BeamFlags:
        """These flags followed by ``extra`` (checked), as one parse would read them."""
        added = check(extra)
        values = dict(self.values)
        for option, value in added.values.items():
            if isinstance(value, tuple) and isinstance(values.get(option), tuple):
                value = values[option] + value
            values[option] = value
        return BeamFlags(
            self.args + added.args, types.MappingProxyType(values), added.runner or self.runner
        )


def closest_flag(name: str, known) -> str | None:
    """The known flag ``name`` was most likely meant to be (a typo, ``-`` for ``_``), or None."""
    import difflib

    underscored = "--" + name[2:].replace("-", "_")
    known = sorted(set(known))
    if underscored in known:
        return underscored
    found = difflib.get_close_matches(underscored, known, n=1, cutoff=0.8)
    return found[0] if found else None


def _value_of(kind: str, value: str | None, const):
    if value is None:
        return const
    if kind in ("int", "float"):
        return _CHECKS[kind](value)
    return value  # JSON and text stay text, as Beam's value providers see them


def check(beam_args: list[str], own_flags=frozenset(), lenient: bool = False) -> BeamFlags:
    """Checks every Beam flag and its value as Beam's parser would, and reads them.

    Args:
        beam_args: The arguments left after the CLI's own flags.
        own_flags: The CLI's own flag names, for "did you mean" hints.
        lenient: Warn about unknown flags instead of refusing them (a Flex
            Template launcher adds flags of its own); they are passed to Beam
            and read by no one here.

    Returns:
        The flags and their values (:class:`BeamFlags`).

    Raises:
        UsageError: one line naming the flag.
    """
    table = _table()
    options = table["options"]
    values: dict[str, Any] = {}
    runner = None
    index = 0
    while index < len(beam_args):
        arg = beam_args[index]
        index += 1
        if not arg.startswith("--"):
            raise UsageError(
                f"unknown option {arg}" if arg.startswith("-") else f"unexpected argument {arg!r}"
            )
        # Beam's parser takes no abbreviation (allow_abbrev=False): an exact name or nothing.
        name, has_value, value = arg.partition("=")
        if name not in options:
            near = closest_flag(name, (*own_flags, *options))
            message = f"unknown option {name}" + (f" (did you mean {near}?)" if near else "")
            if lenient:
                import logging

                logging.warning("%s; passing it to Beam as it is", message)
                # Its value, if given separately, belongs to it.
                if not has_value and index < len(beam_args):
                    if not beam_args[index].startswith("--"):
                        index += 1
                continue
            raise UsageError(message)
        kind, choices, dest, const, gathers = options[name]
        if not has_value:
            value = None
            if kind not in ("flag",) and index < len(beam_args):
                following = beam_args[index]
                if kind != "optional" or not following.startswith("--"):
                    value = following
                    index += 1
        _check_value(name, kind, choices, value)
        if name == "--runner" and value is not None:
            check_runner(value, table)
            runner = runner_class(value, table)
        read = _value_of(kind, value, const)
        values[dest] = values.get(dest, ()) + (read,) if gathers else read
    return BeamFlags(tuple(beam_args), types.MappingProxyType(values), runner)


def _gcloud_region() -> str | None:
    """The region gcloud is configured with, as Beam's DataflowRunner asks it; None without one."""
    import shutil
    import subprocess

    if shutil.which(_GCLOUD_REGION[0]) is None:
        return None
    try:
        done = subprocess.run(
            _GCLOUD_REGION, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def missing_runner_options(
    flags: BeamFlags, environ: Mapping[str, str] = os.environ, default_region=_gcloud_region
) -> str | None:
    """What the chosen runner needs that the flags do not give, as one line; None if nothing.

    Beam checks these only once the pipeline runs, after the input is listed
    and the conversion processes started; this reads the same rules from the
    flags alone. DataflowRunner needs a project, a region (``--region``, else
    ``$CLOUDSDK_COMPUTE_REGION`` or gcloud's, as Beam finds it) and a gs://
    folder for its temporary and staged files (``--temp_location`` or
    ``--staging_location``: Beam fills in the other one; it would otherwise
    try to create a bucket of its own). Dask needs the scheduler file it is
    told to read to exist (Dask would wait for it to appear), and one way to
    find the scheduler, not two. ``default_region``: gcloud's region, asked
    only when no other is given.
    """
    if flags.runner == DATAFLOW:
        needed = []
        if not flags.get("project"):
            needed.append("--project PROJECT")
        if not (flags.get("region") or environ.get("CLOUDSDK_COMPUTE_REGION") or default_region()):
            needed.append("--region REGION")
        locations = [flags.get("temp_location"), flags.get("staging_location")]
        if not any(str(where or "").startswith("gs://") for where in locations):
            needed.append("--temp_location gs://BUCKET/PATH")
        if needed:
            listed = ", ".join(needed[:-1]) + (" and " if len(needed) > 1 else "") + needed[-1]
            return (
                f"--runner {DATAFLOW} needs {listed} (see deploy/README.md); add "
                f"{'them' if len(needed) > 1 else 'it'} to the command"
            )
    if flags.on_dask:
        address, scheduler_file = flags.get("address"), flags.get("scheduler_file")
        if address and scheduler_file:
            return (
                "--dask_client_address and --dask_scheduler_file both name a Dask scheduler: "
                "give one of them"
            )
        if scheduler_file and "://" not in scheduler_file and not os.path.isfile(scheduler_file):
            return (
                f"--dask_scheduler_file {scheduler_file} does not exist (Dask would wait for "
                "it): start the scheduler with --scheduler-file first, or fix the path"
            )
    return None


def main() -> None:
    """Rewrites ``_beam_option_table.py`` from the installed Beam."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_beam_option_table.py")
    with open(path, "w") as stream:
        stream.write(
            '"""Every flag of the installed Apache Beam (generated by '
            '`python -m beam_pipeline.beam_internals.beam_options`; do not edit)."""\n\n'
            f"TABLE = {pprint.pformat(snapshot(), width=99, sort_dicts=False)}\n"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

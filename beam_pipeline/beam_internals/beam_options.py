"""Checks Apache Beam's command-line flags without importing Beam.

The CLI forks its conversion processes before Beam loads (``local_pool``), and
importing Beam takes seconds; so that no process is forked for a command that
will be refused, Beam's flags are checked first, against a table of every flag
the installed Beam accepts (``_beam_option_table.py``, written by
``python -m beam_pipeline.beam_internals.beam_options`` from Beam's own option classes).
When the installed Beam is not the version the table was made from, the check
imports Beam and builds the table from it instead (slower, never wrong).

Pure apart from that fallback: no Beam import on the common path.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pprint
import re

from beam_pipeline.core.errors import UsageError

# --runner names that select this project's DaskRunner (beam_pipeline/beam_internals/dask_runner.py:
# Beam's, with the translation fixes this job needs). Beam knows its Dask runner
# by the dotted path only; that path gets the fixed one too.
DASK_RUNNER_NAMES = ("DaskRunner", "dask", "apache_beam.runners.dask.dask_runner.DaskRunner")

# kind of a flag's value: "flag" (no value), "optional" (nargs="?"), "int",
# "float", "json", "text"
_CHECKS = {"int": int, "float": float, "json": json.loads}


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
        for name in action.option_strings:
            options[name] = (kind, tuple(action.choices) if action.choices else None)
    return {
        "beam_version": _beam_version(),
        "options": dict(sorted(options.items())),
        "runners": tuple(sorted(runner._RUNNER_MAP)),
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


def _check_value(name: str, kind: str, choices, value: str | None) -> None:
    if kind == "flag":
        if value is not None:
            raise UsageError(f"{name} takes no value, got {name}={value}")
        return
    if value is None:
        if kind == "optional":
            return
        raise UsageError(f"{name} needs a value")
    if choices is not None and value not in choices:
        raise UsageError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    check = _CHECKS.get(kind)
    if check is not None:
        try:
            check(value)
        except ValueError:
            what = {"int": "an integer", "float": "a number", "json": "JSON"}[kind]
            raise UsageError(f"{name} must be {what}, got {value!r}") from None


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


def check(beam_args: list[str], own_flags=frozenset(), lenient: bool = False) -> None:
    """Checks every Beam flag and its value as Beam's parser would.

    Args:
        beam_args: The arguments left after the CLI's own flags.
        own_flags: The CLI's own flag names, for "did you mean" hints.
        lenient: Warn about unknown flags instead of refusing them (a Flex
            Template launcher adds flags of its own).

    Raises:
        UsageError: one line naming the flag.
    """
    table = _table()
    options = table["options"]
    index = 0
    while index < len(beam_args):
        arg = beam_args[index]
        index += 1
        if not arg.startswith("--"):
            raise UsageError(
                f"unknown option {arg}" if arg.startswith("-") else f"unexpected argument {arg!r}"
            )
        name, has_value, value = arg.partition("=")
        if name not in options:
            hint = ""
            underscored = "--" + name[2:].replace("-", "_")
            if underscored in options or underscored in own_flags:
                hint = f" (did you mean {underscored}?)"
            message = f"unknown option {name}{hint}"
            if lenient:
                import logging

                logging.warning("%s; passing it to Beam as it is", message)
                # Its value, if given separately, belongs to it.
                if not has_value and index < len(beam_args):
                    if not beam_args[index].startswith("--"):
                        index += 1
                continue
            raise UsageError(message)
        kind, choices = options[name]
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

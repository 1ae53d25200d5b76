"""``python -m reader.inspect PATH``: what a converted dataset holds, and whether it is intact.

The command line (arguments, order, exit statuses) over ``overview.py``, ``verify.py``
and ``pictures.py``; Pillow and ``google_crc32c`` load only when needed.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys
import tempfile
from collections.abc import Sequence

# TensorFlow loads with the modules that read the dataset, imported once the
# arguments are checked: a typo is answered at once, not after seconds.
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class InspectUsageError(Exception):
    """A bad argument; exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, no usage dump
        raise InspectUsageError(message + _suggestion(self, message))


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """`` (did you mean --verify?)`` for an unrecognized flag close to a known one."""
    prefix = "unrecognized arguments: "
    if not message.startswith(prefix):
        return ""
    known = [name for action in parser._actions for name in action.option_strings]
    for given in message[len(prefix) :].split():
        name = given.split("=", 1)[0]
        if name.startswith("--"):
            underscored = "--" + name[2:].replace("-", "_")
            near = difflib.get_close_matches(underscored, known, n=1, cutoff=0.8)
            if near:
                return f" (did you mean {near[0]}?)"
    return ""


# What TensorFlow prints on stderr as it loads, before anything is asked of it:
# absl's notice that logging is not set up yet, and INFO lines (oneDNN is on,
# the CPU could use more instructions), each twice on TensorFlow 2.21: two of
# its libraries (libtensorflow_framework.so.2 and the profiler plugin's
# _pywrap_profiler_plugin.so) carry their own copy of absl's logging and of the
# code that logs them. A warning or an error is kept.
_START_UP_NOTICE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} [\d:.]+ +\d+ \w+\.cc:\d+\] "
    r"|To enable the following instructions: "
)


def without_start_up_notices(text: str) -> str:
    """``text`` (what went to stderr while TensorFlow loaded) less TensorFlow's notices."""
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if not _START_UP_NOTICE.match(line))


@contextlib.contextmanager
def _start_up_notices_dropped():
    """Everything written to file descriptor 2 in the block goes to stderr after
    it, without :func:`without_start_up_notices`'s lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            sys.stderr.write(without_start_up_notices(caught.read().decode("utf-8", "replace")))
            sys.stderr.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m reader.inspect",
        description="Summarise, verify and picture an imagerecords dataset (local path or gs://).",
        epilog="example: python -m reader.inspect ./flowers-records --verify "
        "--contact_sheet sheet.png",
    )
    add = parser.add_argument
    add("path", help="The dataset folder (holding imagerecords.json)")
    add(
        "--verify",
        action="store_true",
        help="Re-read every shard: framing and CRCs, record counts, sizes and SHA-256 against "
        "imagerecords.json, every image decodes at its recorded size, labels agree with "
        "labels.txt; and every other file the dataset publishes (.idx, TFDS's metadata, the "
        "lists), no file it does not. Exit status 1 naming each problem",
    )
    add("--contact_sheet", metavar="FILE.png", help="Draw random records of each split")
    add("--histogram", metavar="FILE.png", help="Draw the class counts per split")
    add(
        "--report",
        metavar="FILE.html",
        help="Write one self-contained page: the duplicate groups with thumbnails, the "
        "classes per split, the rejects and the contact sheet (docs/reader.md)",
    )
    add("--split", action="append", help="Only this split (repeatable; default: all)")
    add("--samples", type=int, default=16, help="Images per split on the contact sheet (16)")
    add("--seed", type=int, default=0, help="Seed of the contact sheet's draw (0)")
    add("--workers", type=int, default=8, help="Shards read in parallel (8)")
    add("--no_shuffle_check", action="store_true", help="Skip reading the start of every shard")
    add("--verbose", action="store_true", help="Show the traceback of an error, not one line")
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The checked arguments (imports no TensorFlow). Raises InspectUsageError."""
    args = build_parser().parse_args(argv)
    if args.samples < 1:
        raise InspectUsageError(f"--samples must be at least 1, got {args.samples}")
    if args.workers < 1:
        raise InspectUsageError(f"--workers must be at least 1, got {args.workers}")
    for option, ending in (("contact_sheet", ".png"), ("histogram", ".png"), ("report", ".html")):
        value = getattr(args, option)
        if value is not None and not value.lower().endswith(ending):
            raise InspectUsageError(f"--{option} must name a {ending} file, got {value}")
    if args.report is not None and "://" not in args.report:  # written last: checked first
        folder = os.path.dirname(os.path.abspath(args.report))
        if not os.path.isdir(folder):
            raise InspectUsageError(f"--report: the folder {folder} does not exist")
    return args


def _run(args: argparse.Namespace) -> int:
    from reader import info as info_lib
    from reader import overview, pictures
    from reader.shard_file import ShardReadError

    try:
        info = info_lib.load_info(args.path)
    except info_lib.IncompleteDatasetError as error:
        raise InspectUsageError(str(error)) from None
    splits = args.split or list(info.splits)
    for name in splits:
        info.split(name)  # UnknownSplitError names the splits there are
    if args.contact_sheet or args.histogram or args.report:
        try:
            pictures.pillow()  # fail before any work when Pillow is missing
        except pictures.PillowMissingError as error:
            raise InspectUsageError(str(error)) from None
    mixes = None if args.no_shuffle_check else overview.shuffle_evidence(info, workers=args.workers)
    summary = overview.summary(info, mixes)
    print(summary, flush=True)
    # Verify first: a damaged shard is then reported as FAIL lines before a
    # picture that needs one of its records stops at it.
    status = _verify_and_report(info, args.workers) if args.verify else EXIT_OK
    try:
        if args.contact_sheet:
            tiles = pictures.contact_sheet(
                info, args.contact_sheet, splits, args.samples, args.seed
            )
            print(
                f"contact sheet: {len(tiles)} images of {', '.join(splits)} -> {args.contact_sheet}"
            )
        if args.histogram:
            pictures.histogram(info, args.histogram, splits)
            print(f"histogram: {', '.join(splits)} -> {args.histogram}")
        if args.report:
            from reader import report

            page = report.write_report(info, args.report, splits, args.samples, args.seed, summary)
            print(
                f"report: {page.groups} groups, {page.thumbnails} thumbnails, "
                f"{page.bytes / 1e6:.1f} MB -> {args.report}"
            )
    except ShardReadError as error:
        print(f"error: cannot draw the pictures: {error}", file=sys.stderr)
        return EXIT_PROBLEMS
    return status


def _verify_and_report(info, workers: int) -> int:
    """Runs :func:`reader.verify.verify`, prints one ``FAIL`` line per problem; returns the exit status."""
    from reader import verify

    shards = sum(len(s.shards) for s in info.splits.values())
    print(f"\nverify: re-reading {shards} shards with {workers} workers", flush=True)
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if shards > 10 else None
    problems = verify.verify(info, workers, say)
    if not problems:
        records = sum(s.num_examples for s in info.splits.values())
        print(
            f"verify: OK: {shards} shards, {records:,} records: framing, CRCs, counts, "
            "sizes, SHA-256, images, labels and every other file it publishes agree with "
            f"{info.metadata_file}, and it holds no other file"
        )
        return EXIT_OK
    for problem in problems[:100]:
        print(f"FAIL {problem}")
    if len(problems) > 100:
        print(f"... and {len(problems) - 100} more")
    print(f"verify: {len(problems)} problems", file=sys.stderr)
    return EXIT_PROBLEMS


def _missing_module_message(missing: ModuleNotFoundError) -> str:
    """What to do when this Python lacks TensorFlow or the project's own dependencies."""
    if (missing.name or "").split(".")[0] == "tensorflow":
        return (
            f"reader.inspect needs TensorFlow, which this Python ({sys.executable}) lacks: "
            "pip install tensorflow, or `source .venv/bin/activate` in the repository"
        )
    return (
        f"imagerecords is not installed for this Python ({sys.executable}: no module "
        f"{missing.name!r}): run `make demo` in the repository, then `source .venv/bin/activate`"
        " (or pip install the repository into this Python)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``imagerecords-inspect``); returns the exit status."""
    try:
        args = parse_args(argv)
    except InspectUsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _start_up_notices_dropped():
            from imagerecords.trust import DatasetError
            from reader import info as info_lib
    except ModuleNotFoundError as missing:
        if args.verbose:
            raise
        print(f"error: {_missing_module_message(missing)}", file=sys.stderr)
        return EXIT_USAGE

    try:
        return _run(args)
    except (InspectUsageError, info_lib.UnknownSplitError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except DatasetError as error:  # the dataset cannot be read as it is: one line naming it
        if args.verbose:
            raise
        print(f"error: {error}", file=sys.stderr)
        return EXIT_PROBLEMS


if __name__ == "__main__":
    sys.exit(main())

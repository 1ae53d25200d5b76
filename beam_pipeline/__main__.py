"""Command line: ``python -m beam_pipeline --input PATH --output PATH [...]``.

Flags not listed in ``arguments.py`` are Apache Beam pipeline options
(``--runner``, ``--project``, ``--direct_num_workers``, ...) and pass through
unchanged. :func:`main` runs the job (``job.py``) and turns every way it can
end into one ``error:`` line and an exit status.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback

try:
    from beam_pipeline import errors, job
    from beam_pipeline.arguments import build_parser, parse_args
    from beam_pipeline.errors import BooksDoNotBalance, UsageError
    from beam_pipeline.job import run
except KeyboardInterrupt:
    # Ctrl-C while the modules load (the first few tenths of a second), before
    # main() can report it: the same one line and status, not a traceback.
    if __name__ != "__main__":
        raise
    print("error: interrupted before the job started; nothing was written", file=sys.stderr)
    sys.exit(130)

__all__ = ["build_parser", "main", "parse_args", "run"]


def _books_message(error: BaseException) -> str | None:
    """The BooksDoNotBalance message inside a runner's wrapped exception, if any."""
    text = str(error)
    if isinstance(error, BooksDoNotBalance):
        text = "BooksDoNotBalance: " + text
    match = re.search(r"BooksDoNotBalance: (.*?)(?: \[while running|\n|$)", text)
    return match.group(1) if match else None


def _print_books_error(message: str, verbose: bool) -> None:
    """The error line, after the most common reasons when too many images were rejected."""
    message, reasons = errors.split_reasons(message)
    if reasons:
        print("most common reasons for rejection:", file=sys.stderr)
        for count, reason in reasons:
            print(f"  {count:>6}  {reason}", file=sys.stderr)
    _error(message, verbose)


# What Ctrl-C prints after "error: interrupted". Nothing the run wrote looks
# finished (no imagerecords.json), and the same command carries on: a local
# run keeps what it converted (docs/scale.md).
RESUME_HINT = "rerun the same command to resume"


def _error(message: str, verbose: bool) -> None:
    if verbose:
        traceback.print_exc()
    print(f"error: {message}", file=sys.stderr, flush=True)


_JOB_SERVICE_LOG = "apache_beam.runners.portability.local_job_service"


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0, 1 failed, 2 bad usage, 130 Ctrl-C)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # multi_processing workers relay their start-up chatter (unparseable runner
    # flags, no semi_persistent_directory) as warnings; they mean nothing here.
    logging.getLogger(_JOB_SERVICE_LOG).setLevel(logging.ERROR)
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv  # before parsing: a usage error can show its traceback too
    try:
        parsed = parse_args(argv)
        verbose = parsed[0].verbose
        if not verbose:
            # Beam logs an error raised in a step (with its traceback) before
            # re-raising it; the CLI reports it in one line instead.
            for name in ("apache_beam.runners.common", _JOB_SERVICE_LOG):
                logging.getLogger(name).setLevel(logging.CRITICAL)
        if not parsed[0].quiet:
            # Progress lines from the conversion step ("converted N images (R images/s)").
            logging.getLogger("beam_pipeline").setLevel(logging.INFO)
        job.run(argv, parsed)
    except UsageError as error:
        _error(str(error), verbose)
        return 2
    except BooksDoNotBalance as error:
        _print_books_error(_books_message(error) or str(error), verbose)
        return 1
    except KeyboardInterrupt:
        _error(f"interrupted; no imagerecords.json was written; {RESUME_HINT}", verbose)
        return 130
    except Exception as error:
        message = _books_message(error)
        if message is not None:
            _print_books_error(message, verbose)
            return 1
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        message = f"{type(error).__name__}: {first}"
        if not verbose:
            message += " (--verbose shows the traceback)"
        _error(message, verbose)
        return 1
    return 0


if __name__ == "__main__":
    # Every output is closed and renamed by now (beam_private: why, and when not).
    from beam_pipeline import beam_private

    beam_private.fast_exit(main())

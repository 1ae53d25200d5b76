"""Command line: ``python -m beam_pipeline --input PATH --output PATH [...]``.

Flags not listed in ``arguments.py`` are Apache Beam pipeline options
(``--runner``, ``--project``, ``--direct_num_workers``, ...) and pass through
unchanged. :func:`main` runs the job (``job.py``) and turns every way it can
end into one ``error:`` line and an exit status.
"""

from __future__ import annotations

import logging
import os
import re
import select
import signal
import sys
import threading
import traceback

# The conversion's NumPy products (the near-duplicate fingerprint's) are
# tiny: OpenBLAS's threads only spin, and every forked conversion process
# inherits them, so two processes on two cores spent their time waiting on
# each other (docs/performance.md). OpenBLAS reads this when NumPy loads, so
# it is set before any import that loads NumPy; a value the user gave stays.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

try:
    from beam_pipeline.beam_internals import beam_private
    from beam_pipeline.cli import job
    from beam_pipeline.cli.arguments import build_parser, parse_args, verbose_requested
    from beam_pipeline.cli.job import run
    from beam_pipeline.core import errors
    from beam_pipeline.core.errors import BooksDoNotBalance, UsageError
except KeyboardInterrupt:
    # Ctrl-C while the modules load (the first few tenths of a second), before
    # main() can report it: the same one line and status, not a traceback.
    if __name__ != "__main__":
        raise
    print("error: interrupted before the job started; nothing was written", file=sys.stderr)
    sys.exit(130)
except ModuleNotFoundError as missing:
    # `python3 -m beam_pipeline` in the repository with a Python that lacks the
    # dependencies (the install is in .venv): say where it is, not a traceback.
    if __name__ != "__main__" or (missing.name or "").startswith("beam_pipeline"):
        raise
    print(
        f"error: imagerecords is not installed for this Python ({sys.executable}: no module "
        f"{missing.name!r}): run `make demo` in the repository, then `source .venv/bin/activate`"
        " (or pip install the repository into this Python)",
        file=sys.stderr,
    )
    sys.exit(1)

__all__ = ["build_parser", "main", "parse_args", "run"]

# Dask's configuration of its own loggers, read from the environment when Dask
# loads (here and in a local cluster's worker processes): a local cluster
# logs each start, connection and close at INFO, ~35 lines a run.
DASK_LOG_LEVEL_ENV = "DASK_LOGGING__DISTRIBUTED"


def _wrapped_message(error: BaseException, *kinds: type[BaseException]) -> str | None:
    """The message of an error of one of ``kinds`` inside a runner's wrapped exception.

    Beam re-raises a step's error with the step named (``[while running ...]``),
    as the same type or as a RuntimeError holding its text; a worker process
    hands back only text. So the error is found by its name.
    """
    names = "|".join(kind.__name__ for kind in kinds)
    text = str(error)
    if isinstance(error, kinds):
        text = f"{type(error).__name__}: {text}"
    match = re.search(rf"(?:{names}): (.*?)(?: \[while running|\n|$)", text)
    return match.group(1) if match else None


def _books_message(error: BaseException) -> str | None:
    """The BooksDoNotBalance message inside a runner's wrapped exception, if any."""
    return _wrapped_message(error, BooksDoNotBalance)


def _gcs_lost_message(error: BaseException, parsed) -> str | None:
    """The message for GCS out of reach where no step named the URL (Beam's listing)."""
    options = parsed.options if parsed else None
    paths = (options.input, options.manifest, parsed.config.output) if parsed else ()
    roots = [p for p in paths if p and p.startswith("gs://")]
    if not roots:
        return None
    from beam_pipeline.storage import gcs

    stopped = gcs.unreachable_from(error, roots)
    return str(stopped) if stopped is not None else None


def _stopped_message(error: BaseException) -> str | None:
    """The message of a run that could not go on (errors.RunStopped), if ``error`` is one."""
    from beam_pipeline.storage.lock import OutputTakenOver

    return _wrapped_message(
        error,
        errors.StorageUnreachable,
        errors.CannotWrite,
        errors.OldDatasetChanged,
        OutputTakenOver,
    )


def _print_books_error(message: str, verbose: bool) -> None:
    """The error line, after the most common reasons when too many images were rejected."""
    message, reasons = errors.split_reasons(message)
    if reasons:
        print("most common reasons for rejection:", file=sys.stderr)
        for count, reason in reasons:
            print(f"  {count:>6}  {reason}", file=sys.stderr)
    _error(message, verbose)


# What Ctrl-C prints after "error: interrupted" (errors.py says why).
RESUME_HINT = errors.RESUME_HINT


# Sent to the main thread to wake it for a Ctrl-C another thread received
# (_MainThreadWaker). Ignored by default, so one that comes after the handler
# is restored does nothing.
WAKE_SIGNAL = signal.SIGURG
# How often the main thread is woken again until it has acted on the Ctrl-C.
WAKE_AGAIN_S = 0.02
_STOP_WATCHING = b"\0"  # no signal's number


def _ignore(signum, frame) -> None:
    """A Python handler that does nothing: its delivery interrupts a blocking wait."""


class _MainThreadWaker:
    """Makes the main thread act on a SIGINT whichever thread the kernel gave it to.

    The kernel hands a process's signal to any one of its threads; Python runs
    the handler in the main thread only, when that next runs bytecode. A main
    thread waiting on a lock (Beam's runner waits on its bundles' futures) is
    woken only by a signal to itself, so with the SIGINT taken by one of Beam's
    or gRPC's threads it slept on: until a bundle happened to finish (the
    handler ran late, after Beam had relayed what the dying workers said), or
    for ever (the workers that died of the same Ctrl-C never answered).

    Python writes each signal's number to the wakeup fd as it arrives, in
    whatever thread; a thread here reads it and sends :data:`WAKE_SIGNAL` to the
    main thread, whose wait is interrupted, and which then runs the pending
    SIGINT handler. Again every :data:`WAKE_AGAIN_S` until ``handled()``: a
    signal that lands just before the main thread blocks (its lock wait
    releases the GIL, then sleeps, with no look at pending signals between)
    wakes nothing. The wake itself raises nothing, so a wake the main thread
    did not need is harmless.
    """

    def __init__(self, handled):
        """``handled()``: whether the main thread has acted on the Ctrl-C."""
        self._handled = handled
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # what set_wakeup_fd requires
        self._thread: threading.Thread | None = None
        self._previous_wake = None

    def start(self) -> None:
        """Watches for SIGINT; from the main thread only. Left undone where
        someone else (an event loop) already reads the wakeup fd."""
        previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        if previous != -1:
            signal.set_wakeup_fd(previous, warn_on_full_buffer=False)
            self._close()
            return
        self._previous_wake = signal.signal(WAKE_SIGNAL, _ignore)
        self._thread = threading.Thread(target=self._watch, name="ctrl-c-waker", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        main = threading.main_thread().ident
        waking = False
        while True:
            timeout = WAKE_AGAIN_S if waking else None
            if select.select([self._read], [], [], timeout)[0]:
                arrived = os.read(self._read, 256)
                if not arrived or _STOP_WATCHING in arrived:
                    return
                waking = waking or signal.SIGINT in arrived
            waking = waking and not self._handled()
            if waking:
                signal.pthread_kill(main, WAKE_SIGNAL)

    def stop(self) -> None:
        if self._thread is None:
            return
        signal.set_wakeup_fd(-1)
        os.write(self._write, _STOP_WATCHING)
        self._thread.join()
        signal.signal(WAKE_SIGNAL, self._previous_wake)
        self._close()

    def _close(self) -> None:
        os.close(self._read)
        os.close(self._write)


class _CtrlC:
    """Notes a Ctrl-C, then raises KeyboardInterrupt as Python's own handler does.

    A runner may turn the KeyboardInterrupt into another error on its way out
    (Beam's DirectRunner re-raises it from a step as ``RuntimeError:
    KeyboardInterrupt [while running ...]``; the threads watching its worker
    processes raise when those end). Whatever comes out after a Ctrl-C is
    reported as the Ctrl-C it is.
    """

    def __init__(self, verbose: bool):
        self.seen = False
        self._verbose = verbose
        self._previous = None
        self._excepthook = threading.excepthook
        self._waker: _MainThreadWaker | None = None

    def __enter__(self) -> _CtrlC:
        # Only where Python's default handler is set: an ignored SIGINT (a
        # background job) stays ignored, and only the main thread may set one.
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._waker = _MainThreadWaker(lambda: self.seen)
            self._waker.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            self._waker.stop()
            signal.signal(signal.SIGINT, self._previous)
        threading.excepthook = self._excepthook

    def _handle(self, signum, frame) -> None:
        self.seen = True
        if not self._verbose:
            # The runner's threads that see its workers end need not say so,
            # nor Beam's loggers (multi_processing's data plane logs the broken
            # stream, the job service relays what a worker logs as it dies).
            threading.excepthook = lambda args: None
            for name in ("apache_beam", beam_private.JOB_SERVICE_LOGGER):
                logging.getLogger(name).setLevel(logging.CRITICAL + 1)
        # multi_processing's workers ignore the Ctrl-C (beam_private says why):
        # stopped now that nothing reports their end.
        beam_private.stop_sdk_workers()
        raise KeyboardInterrupt


def _is_ctrl_c(error: BaseException) -> bool:
    """Whether ``error`` is a KeyboardInterrupt that a runner wrapped in another error."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, KeyboardInterrupt) or re.match(r"KeyboardInterrupt\b", str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False


def _error(message: str, verbose: bool) -> None:
    if verbose:
        traceback.print_exc()
    print(f"error: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0, 1 failed, 2 bad usage, 130 Ctrl-C)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # multi_processing workers relay their start-up chatter (unparseable runner
    # flags, no semi_persistent_directory) as warnings; they mean nothing here.
    logging.getLogger(beam_private.JOB_SERVICE_LOGGER).setLevel(logging.ERROR)
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = verbose_requested(argv)  # before parsing: a usage error can show its traceback too
    ctrl_c = _CtrlC(verbose)
    parsed = None
    try:
        parsed = parse_args(argv)
        verbose = parsed.options.verbose
        ctrl_c = _CtrlC(verbose)
        if not verbose:
            # Beam logs an error raised in a step (with its traceback) before
            # re-raising it; the CLI reports it in one line instead.
            for name in (beam_private.STEP_ERRORS_LOGGER, beam_private.JOB_SERVICE_LOGGER):
                logging.getLogger(name).setLevel(logging.CRITICAL)
            os.environ.setdefault(DASK_LOG_LEVEL_ENV, "warning")  # a value set by the user wins
        if not parsed.options.quiet:
            # A remote worker's progress line ("converted N images so far (R images/s)").
            logging.getLogger("beam_pipeline").setLevel(logging.INFO)
        with ctrl_c:
            job.run(argv, parsed)
    except UsageError as error:
        _error(str(error), verbose)
        return 2
    except BooksDoNotBalance as error:
        _print_books_error(_books_message(error) or str(error), verbose)
        return 1
    except KeyboardInterrupt:
        return _interrupted(verbose)
    except Exception as error:
        message = _stopped_message(error)
        if message is None and not (ctrl_c.seen or _is_ctrl_c(error)):
            message = _gcs_lost_message(error, parsed)
        if message is not None:  # the run could not go on; the message says why and what next
            _error(message, verbose)
            return 1
        if ctrl_c.seen or _is_ctrl_c(error):
            return _interrupted(verbose)
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


def _interrupted(verbose: bool) -> int:
    _error(f"interrupted; {errors.NOT_FINISHED}; {RESUME_HINT}", verbose)
    return 130


if __name__ == "__main__":
    # Every output is closed and renamed by now (beam_private: why, and when not).
    beam_private.fast_exit(main())

"""The local conversion processes, forked before Beam starts any thread.

Why before: docs/architecture.md, "The local engine". Beam-free: the children import
only Pillow, protobuf and this package's pure modules.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import weakref
from typing import NamedTuple

from beam_pipeline.core import deadline
from beam_pipeline.core.elements import ImageRef
from beam_pipeline.stages import convert

# Every pool forked, for :func:`shutdown_all` on every way out (Ctrl-C included).
_all: weakref.WeakSet = weakref.WeakSet()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _ready() -> bool:
    return True


def _init_worker(parent: int, die_with_parent: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A worker is disposable: one stuck in native code past the image time
    # limit ends itself, and the pool rejects that image (deadline.py).
    deadline.allow_hard_exit()
    if die_with_parent and sys.platform == "linux":
        # Even a SIGKILLed CLI leaves no worker behind: the kernel kills the
        # child when the forking thread (here the main thread) ends.
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # pragma: no cover - no prctl
            return
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)


def new(processes: int) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of ``processes`` forked workers, started now (not on first use).

    The workers ignore SIGINT: Ctrl-C reaches the whole process group, and it
    is the parent's job to stop them (:func:`shutdown_all`), not theirs to die
    mid-task with a traceback each.
    """
    # fork: workers inherit the imported modules (start-up in milliseconds)
    # and, unlike spawn/forkserver, never re-import the caller's __main__.
    in_main_thread = threading.current_thread() is threading.main_thread()
    executor = concurrent.futures.ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_init_worker,
        # A pool forked from another thread (after a worker crash) would die
        # with that thread, not with the process: no parent-death signal there.
        initargs=(os.getpid(), in_main_thread),
    )
    _all.add(executor)
    # While the workers are forked (a fork executor starts them all at the first
    # submit), a Ctrl-C is noted, not acted on: a child is born with this
    # handler, so one that reaches it before its initializer ignores SIGINT is
    # harmless, and this process does not stop half-way through starting them.
    # It is acted on right after, as the previous handler would have. (Ignoring
    # SIGINT until the workers are up would drop a Ctrl-C that comes meanwhile:
    # the run would go on to the end.)
    previous = signal.getsignal(signal.SIGINT) if in_main_thread else None
    # Left alone: an ignored SIGINT, and a handler not set from Python (None).
    note = previous not in (None, signal.SIG_IGN)
    noted = []
    if note:
        signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        ready = executor.submit(_ready)
    finally:
        if note:
            signal.signal(signal.SIGINT, previous)
    if noted:
        _act_on_sigint(previous)
    ready.result()
    return executor


def _act_on_sigint(handler) -> None:
    """Does what ``handler`` (SIGINT's disposition) does with a SIGINT."""
    if callable(handler):
        handler(signal.SIGINT, None)  # Python's default raises KeyboardInterrupt
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signal.SIGINT)


class Ahead(NamedTuple):
    """One image's conversion started before the engine ran (:meth:`Pool.convert_ahead`)."""

    future: concurrent.futures.Future  # of a convert.spill_chunk of a few images
    index: int  # this image's place in that chunk
    ref: ImageRef  # the image it converts


class Pool:
    r"""The conversion processes the command line forks before Beam starts any thread,
    and the images they began converting ahead of the job: what the command line
    hands to the engine (``local_engine.run``, ``pipeline.build``), as an argument.

    The engine's converter :meth:`take`\ s the processes and :meth:`claim`\ s the
    images converted ahead. Beam pickles the conversion step with its pool: a
    Pool pickles to a handle that finds the same Pool in this process (the
    in-memory DirectRunner unpickles it here) and to None in any other, where
    the step forks its own.
    """

    def __init__(self, processes: int):
        self.processes = processes
        self._executor: concurrent.futures.ProcessPoolExecutor | None = new(processes)
        self._ahead: dict[str, Ahead] = {}  # path -> the conversion started ahead
        _handles[id(self)] = self

    def __reduce__(self):
        return _find, (os.getpid(), id(self))

    def take(self) -> concurrent.futures.ProcessPoolExecutor:
        """The processes forked at the start, the first time; a new pool after."""
        executor, self._executor = self._executor, None
        return executor or new(self.processes)

    def convert_ahead(self, refs: list, args: tuple, chunk: int = 8) -> None:
        r"""Starts converting ``refs`` before the engine runs (the pool must not be taken yet).

        Importing Beam, building the graph and starting the runner take seconds
        of one core; this puts the other cores to work meanwhile. The conversion step
        :meth:`claim`\ s these results instead of converting the same files again.

        Args:
            refs: the ``ImageRef``s the pipeline will list first.
            args: the rest of :func:`convert.spill_chunk`'s arguments.
        """
        if self._executor is None:
            return
        for start_at in range(0, len(refs), chunk):
            part = refs[start_at : start_at + chunk]
            future = self._executor.submit(convert.spill_chunk, part, *args)
            for index, ref in enumerate(part):
                self._ahead[ref.path] = Ahead(future, index, ref)

    def claim(self, path: str) -> Ahead | None:
        """The conversion of ``path`` started by :meth:`convert_ahead`, if any (once)."""
        return self._ahead.pop(path, None)

    def drop_ahead(self) -> None:
        """Forgets the conversions started ahead (their pool broke): convert normally."""
        self._ahead.clear()


# id -> Pool: what a pickled Pool's handle finds again in this process.
_handles: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _find(pid: int, handle: int) -> Pool | None:
    return _handles.get(handle) if pid == os.getpid() else None


def start(processes: int) -> Pool:
    """Forks ``processes`` conversion processes now, for the engine to take."""
    return Pool(processes)


def stop(executor: concurrent.futures.ProcessPoolExecutor) -> None:
    """Shuts ``executor`` down, and is done when its processes are gone.

    With no work left (a run that got every result) its processes are
    waited for. With work left (the run is ending early: an error, GCS out of
    reach, Ctrl-C) the queued work is cancelled and the processes are ended
    at once rather than waited for: a process waiting on a storage service
    that does not answer would hold the run that long for each task queued
    to it. A conversion process is disposable: what it wrote last to a spill
    file is checked (and dropped when cut short) by the run that resumes.
    """
    # The executor's own books (ProcessPoolExecutor keeps them; Python 3.14 adds
    # kill_workers): work not yet answered, and the processes.
    if not getattr(executor, "_pending_work_items", None):
        executor.shutdown(wait=True, cancel_futures=True)
        return
    processes = list((getattr(executor, "_processes", None) or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()
    for process in processes:
        process.join()
    executor.shutdown(wait=True)  # its manager thread, which sees them gone


def shutdown_all() -> None:
    """Stops every pool, taken or not (:func:`stop`; idempotent)."""
    for pool in list(_handles.values()):
        pool.drop_ahead()
    for executor in list(_all):
        stop(executor)

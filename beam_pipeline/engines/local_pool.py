"""The local conversion processes, forked before Beam starts any thread.

Forking a process while other threads are busy (Beam's runner, gRPC) can
leave a child holding a lock that no thread will ever release. The CLI
therefore calls :func:`start` before the pipeline runs, when the only other
threads are idle numpy/pyarrow ones, and the conversion step takes that pool
with :func:`take`. Code that builds the pipeline itself (tests, notebooks)
gets a pool forked on demand instead.

Beam-free on purpose: the children only ever import Pillow, protobuf and this
package's pure modules.
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

from beam_pipeline.core import deadline
from beam_pipeline.stages import convert

_started: dict[int, concurrent.futures.ProcessPoolExecutor] = {}
_all: weakref.WeakSet = weakref.WeakSet()
# path -> (future of a convert.spill_chunk, index in it, the ref it converts):
# images converted ahead of the pipeline
_ahead: dict[str, tuple[concurrent.futures.Future, int, tuple]] = {}


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
    # It is acted on right after, as the previous handler would have. (SIGINT
    # used to be ignored until the workers were up, which dropped a Ctrl-C that
    # came meanwhile: the run went on to the end.)
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


def start(processes: int) -> None:
    """Forks the pool now, for the next :func:`take` of that size."""
    if processes > 1 and processes not in _started:
        _started[processes] = new(processes)


def take(processes: int) -> concurrent.futures.ProcessPoolExecutor:
    """The pool :func:`start` made for this size, or a new one."""
    return _started.pop(processes, None) or new(processes)


def convert_ahead(refs: list, args: tuple, processes: int, chunk: int = 8) -> None:
    """Starts converting ``refs`` on the pool :func:`start` made, before the pipeline runs.

    Importing Beam, building the graph and starting the runner take ~2 s on
    one core; this puts the other cores to work meanwhile. The conversion step
    :func:`claim`s these results instead of converting the same files again.

    Args:
        refs: ``(image_id, path, label, split)`` tuples, as the pipeline will list them.
        args: the rest of :func:`convert.spill_chunk`'s arguments.
    """
    executor = _started.get(processes)
    if executor is None:
        return
    for start_at in range(0, len(refs), chunk):
        part = refs[start_at : start_at + chunk]
        future = executor.submit(convert.spill_chunk, part, *args)
        for index, ref in enumerate(part):
            _ahead[ref[1]] = (future, index, tuple(ref))


def claim(path: str) -> tuple[concurrent.futures.Future, int, tuple] | None:
    """The conversion of ``path`` started by :func:`convert_ahead`, if any (once)."""
    return _ahead.pop(path, None)


def drop_ahead() -> None:
    """Forgets the conversions started ahead (their pool broke): convert normally."""
    _ahead.clear()


def shutdown_all() -> None:
    """Stops every pool, taken or not, and waits for its processes (idempotent).

    The pools are listed before the strong references in ``_started`` go:
    dropping the last one first could let a pool vanish from the weak set
    unshut, its processes still running.
    """
    executors = list(_all) + list(_started.values())
    _started.clear()
    _ahead.clear()
    for executor in dict.fromkeys(executors):
        executor.shutdown(wait=True, cancel_futures=True)

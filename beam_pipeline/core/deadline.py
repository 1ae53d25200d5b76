"""A per-image time limit that works in any thread (``--image_timeout_s``).

A watchdog thread per process raises :class:`ImageTimeout` in the converting thread,
and ends a stuck local conversion process (docs/architecture.md, "The time limit").
Pure: imports neither Beam nor TensorFlow.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import threading
import time

log = logging.getLogger(__name__)

_POLL_S = 0.25
HARD_EXIT_STATUS = 75  # what a conversion process exits with when an image stalls it


@dataclasses.dataclass(slots=True)
class _Watched:
    """One thread's block under a time limit, as the watchdog sees it."""

    deadline: float  # time.monotonic() when the limit is reached
    limit: float
    what: str
    fired: float | None = None  # when ImageTimeout was raised in the thread
    logged: bool = False  # whether the stall past the limit was logged


_lock = threading.Lock()
_active: dict[int, _Watched] = {}  # thread id -> its block
_watchdog: threading.Thread | None = None
_watchdog_pid = 0
_hard_exit = False


class ImageTimeout(BaseException):
    """Raised in a thread whose image passed its limit.

    A BaseException, so that the converter's broad ``except Exception`` (which
    turns decoder errors into "corrupt image" rejections) lets it through.
    """


def allow_hard_exit() -> None:
    """Lets the watchdog end this process when a native call ignores the limit.

    Only for disposable conversion processes (local_pool's initializer).
    """
    global _hard_exit
    _hard_exit = True


def _raise_in(ident: int, exception) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), ctypes.py_object(exception) if exception else None
    )


def _watch() -> None:
    while True:
        time.sleep(_POLL_S)
        now = time.monotonic()
        with _lock:
            for ident, entry in list(_active.items()):
                deadline, limit, what, fired = entry.deadline, entry.limit, entry.what, entry.fired
                if fired is None and now >= deadline:
                    entry.fired = now
                    _raise_in(ident, ImageTimeout)
                elif fired is not None and now >= fired + limit and not entry.logged:
                    if _hard_exit:
                        log.error("%s: stuck in native code past the time limit; ending", what)
                        os._exit(HARD_EXIT_STATUS)
                    log.error(
                        "%s: still converting %.0f s after its %g s limit, inside native "
                        "code that cannot be interrupted",
                        what,
                        now - deadline + limit,
                        limit,
                    )
                    entry.logged = True


def _ensure_watchdog() -> None:
    global _watchdog, _watchdog_pid
    if _watchdog is None or _watchdog_pid != os.getpid():  # a forked child has no threads
        _watchdog = threading.Thread(target=_watch, name="image-timeout-watchdog", daemon=True)
        _watchdog_pid = os.getpid()
        _watchdog.start()


class limit:  # noqa: N801  (used as a context manager, like contextlib's)
    """``with limit(seconds, what):`` raises :class:`ImageTimeout` in the block past ``seconds``.

    ``seconds`` of 0 or None means no limit (nothing is registered).
    """

    __slots__ = ("_seconds", "_what", "_ident")

    def __init__(self, seconds: float | None, what: str = "an image"):
        self._seconds = seconds
        self._what = what

    def __enter__(self):
        if self._seconds:
            self._ident = threading.get_ident()
            entry = _Watched(time.monotonic() + self._seconds, self._seconds, self._what)
            with _lock:
                _ensure_watchdog()
                _active[self._ident] = entry
        return self

    def __exit__(self, kind, value, traceback):
        if not self._seconds:
            return False
        try:
            with _lock:
                entry = _active.pop(self._ident, None)
        finally:  # an exception delivered inside __exit__ must not leave the entry behind
            _active.pop(self._ident, None)
        if entry is not None and entry.fired is not None and kind is None:
            # The watchdog fired just as the block ended: drop the pending
            # exception so that it cannot surface in unrelated code.
            _raise_in(self._ident, None)
            raise ImageTimeout()
        return False

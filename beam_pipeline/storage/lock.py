"""A live run owns its --output: a lock in the job's temporary folder.

``flock(2)`` on a local output, a fenced object with a heartbeat on gs:// (docs/gcs.md,
"One run per output"; the design: docs/architecture.md, "The lock").
"""

from __future__ import annotations

import _thread
import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid

from beam_pipeline.core.errors import RESUME_HINT, RunStopped, UsageError
from beam_pipeline.core.metadata import LOCK
from beam_pipeline.storage import paths

# How often a gs:// lock's heartbeat is renewed, and how many periods without
# one make it a killed run's. Only gs:// needs them (flock dies with its process).
HEARTBEAT_S = 30.0
STALE_AFTER = 4
# Tests shorten the period (the stale rule reads each owner's own period).
HEARTBEAT_ENV = "IMAGERECORDS_LOCK_HEARTBEAT_S"
# "URL TOKEN" of this run's gs:// lock, for check_fence in every process of the run.
FENCE_ENV = "IMAGERECORDS_LOCK_FENCE"

log = logging.getLogger(__name__)


class OutputInUse(UsageError):
    """Another live run holds --output's lock."""


class OutputTakenOver(RunStopped):
    """This run's gs:// lock was taken over by another run while it ran."""


def _machine() -> dict:
    """What tells this machine and its process namespace apart from others (Linux)."""
    found = {}
    with contextlib.suppress(OSError):
        with open("/proc/sys/kernel/random/boot_id") as stream:
            found["boot_id"] = stream.read().strip()
    with contextlib.suppress(OSError):
        found["pid_ns"] = os.readlink("/proc/self/ns/pid")
    return found


def _owner() -> dict:
    now = time.time()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "token": uuid.uuid4().hex,
        "heartbeat": now,
        "heartbeat_s": float(os.environ.get(HEARTBEAT_ENV) or HEARTBEAT_S),
        **_machine(),
    }


def _describe(owner: dict | None) -> str:
    if not owner:
        return "another run"
    return (
        f"another run (pid {owner.get('pid', '?')} on {owner.get('host', '?')}, "
        f"started {owner.get('started', '?')})"
    )


def _in_use(output: str, owner: dict | None, extra: str = "") -> OutputInUse:
    return OutputInUse(
        f"--output {output} is in use by {_describe(owner)}{extra}; two runs must not write "
        "one output: wait for that run to end (or stop it), then run this command again"
    )


def acquire(output: str):
    """Takes ``output``'s lock for this process; a :class:`LocalLock` or :class:`GcsLock`.

    Raises:
        OutputInUse: a live run holds it.
        UsageError: the lock cannot be written (no permission, no such bucket).
    """
    if paths.is_local(output):
        return LocalLock.acquire(output)
    return GcsLock.acquire(output)


# ------------------------------------------------------------------ local


class LocalLock:
    """``OUTPUT/.imagerecords-tmp/lock`` held with flock(2) for the life of this process."""

    def __init__(self, output: str, path: str, fd: int, made: list[str], folder_fd: int | None):
        self.output, self.path, self._fd, self._made = output, path, fd, made
        self._folder_fd = folder_fd  # --output itself, locked too (None: cannot be)
        self.lost = False  # a local lock cannot be taken over while this process lives

    @classmethod
    def acquire(cls, output: str) -> LocalLock:
        path = os.path.join(output, LOCK)
        folder = os.path.dirname(path)
        # The folders this run creates go again with the lock when they are empty.
        made = [p for p in (folder, output) if not os.path.isdir(p)]
        folder_fd = None
        try:
            os.makedirs(folder, exist_ok=True)
            if os.path.islink(folder):  # made since resume.refusal looked: never write through it
                raise OSError(errno.ELOOP, "a symbolic link, which the converter does not follow")
            folder_fd = _lock_folder(output)
            while True:
                # O_NOFOLLOW: a link in the lock's place is refused, not truncated through.
                flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                fd = os.open(path, flags, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    owner = _parse(os.pread(fd, 1 << 16, 0))
                    os.close(fd)
                    raise _in_use(output, owner) from None
                # The owner removes the file while it holds it: a lock on a
                # file no longer there guards nothing, so try again.
                try:
                    current = os.stat(path).st_ino
                except FileNotFoundError:
                    current = None
                if current == os.fstat(fd).st_ino:
                    break
                os.close(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(_owner(), sort_keys=True).encode() + b"\n", 0)
        except OutputInUse:
            _close(folder_fd)
            raise
        except OSError as error:
            _close(folder_fd)
            raise UsageError(
                f"--output {output}: cannot create {path}: {error.strerror or error}"
            ) from None
        return cls(output, path, fd, made, folder_fd)

    def start_heartbeat(self) -> None:
        """Nothing to renew: the kernel holds a local lock until this process ends."""

    def release(self) -> None:
        """Removes the lock file (while still holding it), then the empty folders it made."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)
        os.close(self._fd)
        self._fd = None
        # Still holding --output's lock: a run waiting for it finds the folder
        # gone (or still there) once it gets it, never half-removed.
        for folder in (os.path.dirname(self.path), *self._made):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only when empty: a failed run's files stay
        _close(self._folder_fd)
        self._folder_fd = None


def _lock_folder(output: str) -> int | None:
    """Holds ``output`` (a folder) with flock; its descriptor, or None where the
    filesystem cannot lock a folder.

    Raises:
        OutputInUse: another live run holds it (its lock file, if still there,
            names the run).
    """
    while True:
        try:
            fd = os.open(output, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None  # not a folder we can open: the file's lock says the rest
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use(output, _owner_in(os.path.join(output, LOCK))) from None
        except OSError:  # NFS: flock of a descriptor opened read-only
            os.close(fd)
            return None
        # The run before removed the folder (empty, it made it) while it held it.
        try:
            current = os.stat(output).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return fd
        os.close(fd)
        os.makedirs(os.path.dirname(os.path.join(output, LOCK)), exist_ok=True)


def _owner_in(path: str) -> dict | None:
    try:
        with open(path, "rb") as stream:
            return _parse(stream.read(1 << 16))
    except OSError:
        return None


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _parse(data: bytes | None) -> dict | None:
    try:
        found = json.loads(data) if data else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


# ------------------------------------------------------------------ gs://


def _stale(owner: dict | None, updated: float | None, now: float) -> bool:
    """Whether a lock found on GCS belongs to a run that is gone."""
    if owner is None:  # not written by a run we know: judge by the object's own time
        return updated is not None and now - updated > STALE_AFTER * HEARTBEAT_S
    mine = _machine()
    if (
        mine
        and all(owner.get(k) == v for k, v in mine.items())
        and isinstance(owner.get("pid"), int)
    ):
        try:
            os.kill(owner["pid"], 0)
        except ProcessLookupError:
            return True  # this machine, this process namespace, and no such process
        except PermissionError:
            pass  # alive (someone else's)
    period = owner.get("heartbeat_s") or HEARTBEAT_S
    beat = owner.get("heartbeat")
    if not isinstance(beat, (int, float)) or not isinstance(period, (int, float)):
        return updated is not None and now - updated > STALE_AFTER * HEARTBEAT_S
    return now - beat > STALE_AFTER * period


class GcsLock:
    """A lock object on GCS, renewed by a heartbeat thread; see the module docstring."""

    def __init__(self, output: str, url: str, blob, owner: dict, generation: int):
        self.output, self.url, self._blob, self._owner = output, url, blob, owner
        self.generation = generation
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_handler = None  # STOP_SIGNAL's, while the heartbeat runs
        _fences[url] = self  # check_fence here: the generation this run wrote last
        os.environ[FENCE_ENV] = f"{url} {owner['token']}"

    @classmethod
    def acquire(cls, output: str) -> GcsLock:
        from google.api_core import exceptions as api

        from beam_pipeline.storage import gcs

        url = paths.join(output, LOCK)
        bucket, name = gcs.split_url(url)
        owner = _owner()
        try:
            blob = gcs.client().bucket(bucket).blob(name)
            for _ in range(5):  # each turn: another run changed the lock meanwhile
                try:
                    _write(blob, owner, if_generation_match=0)
                    return cls(output, url, blob, owner, blob.generation)
                except api.PreconditionFailed:
                    pass
                found = _read(blob)
                if found is None:
                    continue  # released meanwhile
                held, generation, updated = found
                if held and held.get("token") == owner["token"]:
                    # Our create went through but its answer was lost; a retry saw it.
                    return cls(output, url, blob, owner, generation)
                if not _stale(held, updated, time.time()):
                    raise _in_use(output, held, _heartbeat_age(held))
                try:
                    _write(blob, owner, if_generation_match=generation)
                except api.PreconditionFailed:
                    continue  # another run took it over first, or its owner renewed it
                log.warning(
                    "took over the lock of --output from %s, which ended without giving it back",
                    _describe(held),
                )
                return cls(output, url, blob, owner, blob.generation)
        except OutputInUse:
            raise
        except Exception as error:
            translated = gcs.usage_error(error, url, "write to")
            if translated is None:
                raise
            raise translated from error
        raise _in_use(output, None, " (its lock keeps changing hands)")

    def start_heartbeat(self) -> None:
        """Starts renewing the lock (after the local pool forked: no thread before that)."""
        if self._thread is None:
            if threading.current_thread() is threading.main_thread():
                self._previous_handler = signal.signal(STOP_SIGNAL, _stop_run)
            self._thread = threading.Thread(
                target=self._beat, name="imagerecords-lock", daemon=True
            )
            self._thread.start()

    def _beat(self) -> None:
        from google.api_core import exceptions as api

        period = self._owner["heartbeat_s"]
        while not self._stop.wait(period):
            self._owner["heartbeat"] = time.time()
            try:
                # One attempt per beat, at most one period long: the next beat
                # is the retry, and release() need not wait for a long one.
                _write(
                    self._blob,
                    self._owner,
                    if_generation_match=self.generation,
                    retry=None,
                    timeout=_attempt_s(period),
                )
                self.generation = self._blob.generation
            except api.PreconditionFailed:
                try:
                    found = _read(self._blob)
                except Exception:  # noqa: BLE001 - no answer now: the next beat asks again
                    continue
                if found and found[0] and found[0].get("token") == self._owner["token"]:
                    self.generation = found[1]  # our renewal went through; its answer did not
                    continue
                self.lost = True
                if not self._stop.is_set():
                    _interrupt_main()  # job.run reports OutputTakenOver
                return
            except Exception:  # noqa: BLE001 - GCS unreachable: the run's own requests say so
                continue

    def release(self) -> None:
        """Stops the heartbeat and deletes the lock, if it is still this run's.

        Bounded even when GCS is out of reach (the run may be ending for that
        reason): a lock left behind then is a stale one, which the next run
        takes over.
        """
        from google.cloud.storage.retry import DEFAULT_RETRY

        self._stop.set()
        period = self._owner["heartbeat_s"]
        if self._thread is not None:
            self._thread.join(_attempt_s(period) + 5)
        if self._previous_handler is not None:
            signal.signal(STOP_SIGNAL, self._previous_handler)
            self._previous_handler = None
        _fences.pop(self.url, None)
        if os.environ.get(FENCE_ENV, "").split(" ")[0] == self.url:
            del os.environ[FENCE_ENV]
        if self.lost:
            return
        from beam_pipeline.storage import gcs

        seconds = min(_RELEASE_S, gcs.timeout_s())  # no longer than any other request
        with contextlib.suppress(Exception):
            self._blob.delete(
                if_generation_match=self.generation,
                retry=DEFAULT_RETRY.with_timeout(seconds),
                timeout=seconds,
            )


def _heartbeat_age(owner: dict | None) -> str:
    if not owner or not isinstance(owner.get("heartbeat"), (int, float)):
        return ""
    age = max(0.0, time.time() - owner["heartbeat"])
    limit = STALE_AFTER * (owner.get("heartbeat_s") or HEARTBEAT_S)
    return (
        f", its last heartbeat {age:.0f} s ago; a killed run's lock is taken over "
        f"{limit:.0f} s after its last heartbeat"
    )


# How long giving a gs:// lock back may take when GCS does not answer.
_RELEASE_S = 10.0


# How the heartbeat stops the run when another took the lock over: a real
# signal to the main thread ends whatever call it waits in (interrupt_main only
# flags the next bytecode), and unlike SIGINT it is not ignored in a run started
# in the background of a shell.
STOP_SIGNAL = signal.SIGUSR1


def _stop_run(signum, frame) -> None:
    raise KeyboardInterrupt  # job.run reports it as OutputTakenOver: the lock is lost


def _interrupt_main() -> None:
    """Raises KeyboardInterrupt in the main thread at once (the heartbeat's thread calls it)."""
    if signal.getsignal(STOP_SIGNAL) is _stop_run:
        signal.pthread_kill(threading.main_thread().ident, STOP_SIGNAL)
    else:  # the heartbeat was started from another thread: no handler of ours
        _thread.interrupt_main()


def _attempt_s(period: float) -> float:
    """The time limit of one heartbeat request."""
    return max(1.0, min(period, 30.0))


def _write(blob, owner: dict, if_generation_match: int, **request) -> None:
    """Writes the lock object if its generation is ``if_generation_match`` (0: none yet)."""
    data = json.dumps(owner, sort_keys=True).encode()
    blob.upload_from_string(
        data,
        content_type="application/json",
        if_generation_match=if_generation_match,
        **request,
    )


def _read(blob) -> tuple[dict | None, int, float | None] | None:
    """(owner, generation, updated time) of the lock object; None when there is none."""
    from google.api_core import exceptions as api

    try:
        found = blob.bucket.get_blob(blob.name)
        if found is None:
            return None
        # Before the download: it sets them again from its response's headers.
        generation, updated = found.generation, found.updated
        data = found.download_as_bytes(if_generation_match=generation)
    except (api.NotFound, api.PreconditionFailed):
        return None  # gone, or changed while read: look again
    return _parse(data), generation, updated.timestamp() if updated else None


# ------------------------------------------------------------------ fencing

# url -> the GcsLock this process holds (the run's own process knows its generation).
_fences: dict[str, GcsLock] = {}
_fence_client = None  # (pid, client) of a process that only has FENCE_ENV


def check_fence(path: str) -> None:
    """Lets a write of ``path`` go ahead only while this run still holds the gs:// lock
    of the output ``path`` lies in (no lock of this run: nothing to check).

    Raises:
        OutputTakenOver: the lock is gone or another run's: nothing more may be
            written there.
    """
    fence = os.environ.get(FENCE_ENV, "")
    url, _, token = fence.partition(" ")
    output = url[: -len(LOCK)].rstrip("/")
    if not token or not path.startswith(output + "/") or path == url:
        return
    held = _fences.get(url)
    if held is not None and held.lost:
        raise _taken_over(output, None)
    # A blob of its own: a read sets a blob's fields, and the heartbeat reads its own.
    blob = held._blob.bucket.blob(held._blob.name) if held is not None else _fence_blob(url)
    found = _read_if(blob, held.generation if held is not None else None)
    if found is None or not found[0] or found[0].get("token") != token:
        raise _taken_over(output, found[0] if found else None)


def _read_if(blob, generation: int | None):
    """The lock as :func:`_read` gives it; one request when it is still ``generation``."""
    from google.api_core import exceptions as api

    if generation is not None:
        try:
            data = blob.download_as_bytes(if_generation_match=generation)
            return _parse(data), generation, None
        except (api.PreconditionFailed, api.NotFound):
            pass  # renewed since (by this run's heartbeat?), or gone: read what is there
    return _read(blob)


def _fence_blob(url: str):
    global _fence_client
    from beam_pipeline.storage import gcs

    if _fence_client is None or _fence_client[0] != os.getpid():
        _fence_client = (os.getpid(), gcs.client())
    bucket, name = gcs.split_url(url)
    return _fence_client[1].bucket(bucket).blob(name)


def _taken_over(output: str, owner: dict | None) -> OutputTakenOver:
    who = _describe(owner) if owner else "another run (or by hand: the lock is gone)"
    return OutputTakenOver(
        f"this run lost its lock of --output {output} while it was stopped or out of reach: "
        f"it is held by {who}; this run stopped without writing more there: let that run "
        f"finish, or stop it and {RESUME_HINT}"
    )

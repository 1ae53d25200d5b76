"""Converting on the local pool: ImageRefs in, Outcomes out, records spilled. Pure of Beam.

The conversion step of the local engine and of Beam's in-memory DirectRunner; how it
resumes, reuses and survives a dying worker: docs/architecture.md, "The local engine".
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from collections.abc import Iterator
from typing import NamedTuple

from beam_pipeline.core import spill
from beam_pipeline.core.elements import ImageRef, Origin, Outcome, Rejection, RejectKind
from beam_pipeline.engines import local_pool
from beam_pipeline.stages.convert import SpillTask, from_spill, spill_chunk, timeout_reason


class _Picked:
    """Future-like: one image's outcome out of a chunk converted ahead of the job."""

    def __init__(self, future, index):
        self._future, self._index = future, index

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> list[Outcome]:
        return [self._future.result()[self._index]]


class _InFlight(NamedTuple):
    """A chunk submitted to the pool, whose outcomes are not yet yielded."""

    chunk: list  # of (ImageRef, reuse.OldRecord or None)
    future: concurrent.futures.Future | _Picked  # of its list of Outcomes
    how: Origin


class PoolConverter:
    """Feeds ImageRefs to the local pool in chunks; yields ``(Outcome, how)`` as they finish.

    ``how`` is an ``Origin``: converted here, ahead of the job, or resumed. Call
    :meth:`start` before a batch of :meth:`add` calls, :meth:`finish` to drain,
    :meth:`close` at the end.
    """

    CHUNK = 8
    REUSE_CHUNK = 64

    def __init__(
        self,
        task: SpillTask,
        processes: int,
        pool: local_pool.Pool | None = None,
    ):
        """``task``: what every chunk is converted with (``SpillTask.of(config)``).
        ``pool``: the processes the command line forked, with the images it began
        converting ahead (None: a pool is forked here)."""
        self._spec = task.spec
        self._processes = processes
        self._spill_task = task
        self._done = spill.load_index(task.spill_dir)
        self._pool = pool or local_pool.Pool(processes)
        self._executor = self._pool.take()
        self.start()

    def start(self) -> None:
        """Forgets what is in flight (a runner discards a failed bundle's outputs)."""
        self._chunk: list[tuple[ImageRef, object]] = []  # (ref, old) pairs
        self._pending: collections.deque[_InFlight] = collections.deque()

    def add(self, ref: ImageRef, old=None) -> Iterator[tuple[Outcome, Origin]]:
        """Queues one image; yields whatever has finished.

        ``old``: ``--reuse``'s record of the image's ID (``reuse.OldRecord``), if any.
        """
        earlier = self._done.get(ref.image_id)
        if earlier is not None and earlier.split == ref.split and earlier.label in (ref.label, -1):
            yield Outcome(from_spill(earlier, ref.path), 0, False), Origin.RESUMED
            return
        ahead = self._pool.claim(ref.path)
        if ahead is not None and ahead.ref == ref:  # converted while the job was starting
            picked = _Picked(ahead.future, ahead.index)
            self._pending.append(_InFlight([(ref, None)], picked, Origin.AHEAD))
        else:
            self._chunk.append((ref, old))
            # Reuse checks cost a small fraction of a conversion: bigger chunks
            # keep the IPC per image small (docs/performance.md, REUSE_CHUNK).
            if len(self._chunk) >= (self.CHUNK if old is None else self.REUSE_CHUNK):
                self._submit()
        # Keep every process busy, but bound what is in flight (memory).
        while self._pending and (
            self._pending[0].future.done() or len(self._pending) > 3 * self._processes
        ):
            yield from self._next_outcomes()

    def finish(self) -> Iterator[tuple[Outcome, Origin]]:
        """Submits the last chunk and yields every outcome still in flight."""
        self._submit()
        while self._pending:
            yield from self._next_outcomes()

    def close(self) -> None:
        """Ends the processes (at once when work is left: the run is ending early)."""
        local_pool.stop(self._executor)

    def run_aside(self, fn, *args) -> concurrent.futures.Future:
        """Runs ``fn(*args)`` on a pool process beside the conversions (a quick count, say)."""
        return self._executor.submit(fn, *args)

    def _task(self, executor, chunk):
        """Submits a chunk of (ref, old) pairs to ``executor``."""
        refs = [ref for ref, _ in chunk]
        olds = [old for _, old in chunk]
        if any(old is not None for old in olds):
            return executor.submit(spill_chunk, refs, *self._spill_task, olds)
        return executor.submit(spill_chunk, refs, *self._spill_task)

    def _submit(self) -> None:
        if self._chunk:
            future = self._task(self._executor, self._chunk)
            self._pending.append(_InFlight(self._chunk, future, Origin.CONVERTED))
            self._chunk = []

    def _next_outcomes(self) -> Iterator[tuple[Outcome, Origin]]:
        how = self._pending[0].how
        try:
            outcomes = self._pending[0].future.result()
        except concurrent.futures.process.BrokenProcessPool:
            outcomes = self._recover()
        self._pending.popleft()
        for outcome in outcomes:
            yield outcome, how

    def _recover(self) -> list[Outcome]:
        """A worker died: convert every in-flight image again, one per task."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._pool.drop_ahead()  # those futures died with the pool
        executor = None
        for index, in_flight in enumerate(self._pending):
            outcomes = []
            for ref, old in in_flight.chunk:
                executor = executor or local_pool.new(self._processes)
                started = time.monotonic()
                try:
                    outcomes += self._task(executor, [(ref, old)]).result()
                except concurrent.futures.process.BrokenProcessPool:
                    kind = RejectKind.CRASHED
                    reason = f"{kind.prefix} (its worker process died)"
                    limit = self._spec.timeout_s
                    if limit and time.monotonic() - started >= limit:
                        # The worker ended itself: deadline.py.
                        kind, reason = RejectKind.TIMED_OUT, timeout_reason(limit)
                    rejection = Rejection(ref.image_id, ref.path, ref.split, reason, kind)
                    outcomes.append(Outcome(rejection, 0, False))
                    executor.shutdown(wait=False)
                    executor = None
            finished = concurrent.futures.Future()
            finished.set_result(outcomes)
            self._pending[index] = in_flight._replace(future=finished)
        self._executor = executor or local_pool.new(self._processes)
        return self._pending[0].future.result()

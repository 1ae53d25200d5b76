"""The Grain pipeline over a split: what a JAX training or evaluation loop iterates.

``dataset(path, split, ...)`` returns a ``grain.IterDataset`` of NumPy batches, each made
whole in a worker in shared memory that this module owns: every segment is unlinked once
its batch is dropped, or by ``sweep`` once its worker has ended; the order and crops are
``streams.py``'s (docs/trainers.md, "Grain").
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import mmap
import multiprocessing.util
import os
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Sequence

import grain
import numpy as np
from grain.multiprocessing import SharedMemoryArray

from imagerecords import streams

_LOG = logging.getLogger(__name__)


def host(shard_index: int | None, shard_count: int | None) -> tuple[int, int]:
    """This host's ``(index, count)``: as given, else JAX's processes, else one host."""
    if (shard_index is None) != (shard_count is None):
        raise ValueError("give both shard_index and shard_count, or neither")
    if shard_index is not None:
        return streams.check_host(shard_index, shard_count, ("shard_index", "shard_count"))
    if importlib.util.find_spec("jax") is not None:
        import jax

        return jax.process_index(), jax.process_count()
    launched = streams.launched_processes()
    if launched:
        _LOG.warning(
            "reading the whole split on this host: JAX is not installed and neither "
            "shard_index nor shard_count is given, but %s=%d says this job has %d processes "
            "(pass shard_index and shard_count so that each reads its part)",
            launched[0],
            launched[1],
            launched[1],
        )
    return 0, 1


# Set by ``_start_worker`` in each of Grain's worker processes: batches are
# then made in shared memory. ``_owner`` is the process that started the
# worker (the one that iterates), whose id each of the worker's segment names
# carries.
_in_worker = False
_owner: int | None = None


def _start_worker(worker_index: int, worker_count: int) -> None:
    """In each worker process, before its first batch (Grain's ``worker_init_fn``).

    One OpenCV thread: OpenCV would spread every small resize over a thread pool
    of its own, beside the other workers, for more CPU per image.
    """
    global _in_worker, _owner
    import cv2

    cv2.setNumThreads(1)
    _in_worker, _owner = True, os.getppid()
    threading.Thread(target=_watch_owner, args=(_owner,), daemon=True).start()


# How often a worker checks that the process it works for is still there.
OWNER_CHECK_S = 1.0


def _watch_owner(owner: int, period: float = OWNER_CHECK_S) -> None:
    """A worker's watch: once its owner is gone (killed: the worker's parent is then
    another process), nobody will map its segments or stop it, so it unlinks
    their names and exits. Grain's own worker would wait on its queue forever."""
    while os.getppid() == owner:
        time.sleep(period)
    prefix = segment_prefix(owner, os.getpid())
    for name in os.listdir(_SHM_DIR) if os.path.isdir(_SHM_DIR) else ():
        if name.startswith(prefix):
            _unlink(os.path.join(_SHM_DIR, name))
    os._exit(1)


# Where POSIX shared memory's names are files (Linux). The workers' segments
# are made there by name with os.open, not with multiprocessing's
# SharedMemory: that registers every name with the resource tracker, which
# then warns at exit of each one a closed or killed worker left in flight.
_SHM_DIR = "/dev/shm"
# Every segment name this module makes starts with it, then the iterating
# process's id and the worker's: ``imagerecords-<owner>-<worker>-<token>``.
SEGMENT_PREFIX = "imagerecords-"
# Segments each worker reuses for its batches' images: the batches in flight
# (Grain's per-worker buffer) and a few the loop holds. A new segment costs
# its pages' faults and zeroing in the worker; a batch that finds every slot
# held gets a new one, as without the ring.
RING_SLOTS = 6


def segment_prefix(owner: int, worker: int | None = None) -> str:
    """The start of the names of the segments made for process ``owner`` (by ``worker``)."""
    prefix = f"{SEGMENT_PREFIX}{owner}-"
    return prefix if worker is None else f"{prefix}{worker}-"


class _Segment(mmap.mmap):
    """A mapping of a named segment (``name``): the base of a batch's array, finalized with it."""

    name = ""


def _map(path: str, size: int, create: bool) -> _Segment:
    flags = os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        return _Segment(fd, size)
    except BaseException:
        if create:
            _unlink(path)
        raise
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:  # swept already (its worker ended)
        pass


class _Ring:
    """A worker's reused image segments, one batch each, handed over under new names.

    Each batch goes out under a new name, a hard link to its slot's segment,
    which the iterating process unlinks once it drops the batch (every view
    of it gone: ``_open_batch``). A slot is free again when its segment has
    no name but the ring's own (``st_nlink == 1``), so a batch the iterating
    process holds, or one still on its way, is never overwritten. The ring's
    own names are unlinked when the worker exits; a batch's link keeps its
    memory alive.
    """

    def __init__(self, prefix: str, slots: int = RING_SLOTS, folder: str = _SHM_DIR):
        self.prefix, self.folder = prefix, folder
        self.segments: list[tuple[str, np.ndarray] | None] = [None] * slots
        self._next = 0
        # read_options may give a worker several read threads: a slot is checked
        # and linked by one at a time, or two batches could share it.
        self._lock = threading.Lock()

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def new_name(self) -> str:
        return self.prefix + secrets.token_hex(8)

    def take(self, shape: tuple[int, ...]) -> tuple[str, np.ndarray]:
        """A batch's name and the pixels it names: a free slot's segment, else a new one."""
        with self._lock:
            return self._take(shape)

    def _take(self, shape: tuple[int, ...]) -> tuple[str, np.ndarray]:
        slots = len(self.segments)
        for step in range(slots):
            slot = (self._next + step) % slots
            segment = self.segments[slot]
            if segment is not None and os.stat(self.path(segment[0])).st_nlink > 1:
                continue  # a batch of it is still out
            if segment is None or segment[1].shape != shape:
                self.segments[slot] = None
                if segment is not None:
                    _unlink(self.path(segment[0]))
                segment = self.segments[slot] = self._segment(shape)
            self._next = (slot + 1) % slots
            name = self.new_name()
            os.link(self.path(segment[0]), self.path(name))
            return name, segment[1]
        return self._segment(shape)

    def _segment(self, shape: tuple[int, ...]) -> tuple[str, np.ndarray]:
        name = self.new_name()
        segment = _map(self.path(name), math.prod(shape), create=True)
        return name, np.ndarray(shape, np.uint8, buffer=segment)

    def close(self) -> None:
        """Unlinks the ring's own names (the worker's exit)."""
        segments, self.segments = self.segments, [None] * len(self.segments)
        for segment in segments:
            if segment is not None:
                _unlink(self.path(segment[0]))


_ring: _Ring | None = None  # this worker's, made at its first batch


_ring_lock = threading.Lock()


def _worker_ring() -> _Ring:
    global _ring
    with _ring_lock:
        if _ring is None:
            _ring = _Ring(segment_prefix(_owner, os.getpid()))
            multiprocessing.util.Finalize(_ring, _ring.close, exitpriority=10)
        return _ring


class _SharedBatch:
    """A worker's batch on its way: pickled as its columns and its images' segment name,
    which ``_open_batch`` maps in the iterating process (Grain passes an object that
    is not an array or a container as it is, and copies nothing of it)."""

    def __init__(self, name: str, images: np.ndarray, columns: dict):
        self.name, self.shape = name, images.shape
        # The images' key keeps its place in the batch; its array stays out of the pickle.
        self.columns = {key: None if key == "image" else value for key, value in columns.items()}

    def __reduce__(self):
        return _open_batch, (self.name, self.shape, self.columns)


def _open_batch(name: str, shape: tuple[int, ...], columns: dict, folder: str = _SHM_DIR) -> dict:
    """A worker's batch in the iterating process: its images mapped from the segment,
    whose name is unlinked once the last view of them is gone."""
    path = os.path.join(folder, name)
    segment = _map(path, math.prod(shape), create=False)
    segment.name = name
    weakref.finalize(segment, _unlink, path)
    images = np.ndarray(shape, np.uint8, buffer=segment)
    return {key: images if key == "image" else value for key, value in columns.items()}


def _live_child(pid: int) -> bool:
    """Whether ``pid`` is a child of this process that has not exited (per ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X") and int(fields[1]) == os.getpid()


def sweep(folder: str = _SHM_DIR) -> list[str]:
    """Unlinks the segment names this process's ended workers left, and returns them.

    A worker that ends (closed, failed or killed) may leave the names of batches
    that never arrived, of batches the loop still holds (its mapping stays), and,
    if it was killed, its ring's. A live worker's names are left alone.
    """
    mine = segment_prefix(os.getpid())
    try:
        names = [name for name in os.listdir(folder) if name.startswith(mine)]
    except FileNotFoundError:
        return []
    swept = []
    for name in names:
        worker = name[len(mine) :].partition("-")[0]
        if not (worker.isdigit() and _live_child(int(worker))):
            _unlink(os.path.join(folder, name))
            swept.append(name)
    return swept


_sweep_at_exit = None


def _sweep_when_done() -> None:
    """At this process's exit, after Grain's own finalizers have stopped the workers
    (their priority is 1), the names they left are unlinked."""
    global _sweep_at_exit
    if _sweep_at_exit is None:
        _sweep_at_exit = multiprocessing.util.Finalize(None, sweep, exitpriority=0)


class _Sweeping(grain.IterDataset):
    """The pipeline with worker processes: its iterator unlinks what its workers left
    once it is closed or ends (or fails: a worker killed, say)."""

    def __init__(self, parent: grain.IterDataset):
        super().__init__(parent)

    def __iter__(self) -> grain.DatasetIterator:
        _sweep_when_done()
        return _SweepingIterator(self._parent.__iter__())

    def __str__(self) -> str:
        return "imagerecords.grain._Sweeping"


class _SweepingIterator(grain.DatasetIterator):
    def __next__(self):
        try:
            return next(self._parent)
        except BaseException:
            sweep()
            raise

    def get_state(self) -> dict:
        return self._parent.get_state()

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state)

    def close(self) -> None:
        super().close()
        sweep()


class GrainBatches:
    """Batch ``b`` of a host's stream: positions ``b * batch_size`` on, as NumPy arrays.

    Grain's random-access source of the pipeline: making a whole batch here
    instead of with Grain's ``batch`` writes the images into the batch array
    itself (no stacking copy, and none into shared memory after) and leaves
    out Grain's per-record work.
    """

    def __init__(self, examples: streams.Examples, batch_size: int, num_batches: int, size: int):
        self.examples, self.batch_size = examples, batch_size
        self.num_batches, self.size = num_batches, size

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> dict | _SharedBatch:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} of {self.num_batches}")
        positions = range(index * self.batch_size, (index + 1) * self.batch_size)
        shape = (self.batch_size, self.size, self.size, 3)
        if not _in_worker:
            return self._columns(positions, np.empty(shape, np.uint8))
        if not os.path.isdir(_SHM_DIR):  # Grain's own shared memory passes it on by name
            return self._columns(positions, SharedMemoryArray(shape, np.uint8))
        ring = _worker_ring()
        name, images = ring.take(shape)
        try:
            return _SharedBatch(name, images, self._columns(positions, images))
        except BaseException:
            _unlink(ring.path(name))  # a record that fails: its batch never goes out
            raise

    def _columns(self, positions: range, images: np.ndarray) -> dict:
        columns = self.examples.batch(positions, images)
        # Labels int64, masks bool, text fields NumPy strings: what np.stack gives.
        return {
            key: value if key == "image" else np.asarray(value) for key, value in columns.items()
        }


def default_read_options(workers: int) -> grain.ReadOptions:
    """Read threads per process: one under worker processes, else one per core.

    Each element here is a whole batch. simplejpeg and OpenCV release the GIL,
    so in one process a thread per core decodes in parallel; in each worker
    process more threads only contend for its GIL (bench/train/pipelines.py
    has the measurements).
    """
    if workers:
        return grain.ReadOptions(num_threads=1, prefetch_buffer_size=1)
    cores = streams.default_workers()
    return grain.ReadOptions(num_threads=cores, prefetch_buffer_size=cores)


def dataset(
    path: str,
    split: str,
    *,
    batch_size: int,
    image_size: int,
    training: bool,
    seed: int = 0,
    shard_index: int | None = None,
    shard_count: int | None = None,
    num_workers: int | None = None,
    num_epochs: int | None = None,
    fields: Sequence[str] = (),
    read_options: grain.ReadOptions | None = None,
) -> grain.IterDataset:
    """Batches of one split for this host.

    Args:
        path: the dataset folder, local or ``gs://``.
        split: ``"train"``, ``"val"``, ...
        batch_size: examples per batch on this host.
        image_size: the side of the square images.
        training: random crops of a new permutation each epoch, full batches
            only; else every record once, in shard order, with padding and
            ``mask``.
        seed: decides the permutations and the crops.
        shard_index, shard_count: this host and the number of hosts; by
            default ``jax.process_index()`` and ``jax.process_count()``.
        num_workers: processes that read and decode (0: in this process; by
            default one per core).
        num_epochs: training epochs before the iterator ends (None: forever).
        fields: record fields to add to the batches (``"filename"``, ...).
        read_options: Grain's read threads and buffer per process (by default
            ``default_read_options(num_workers)``).
    """
    checked = streams.check_arguments(
        training,
        batch_size=batch_size,
        image_size=image_size,
        seed=seed,
        num_workers=num_workers,
        num_epochs=num_epochs,
    )
    batch_size, image_size, seed = checked["batch_size"], checked["image_size"], checked["seed"]
    num_workers, num_epochs = checked["num_workers"], checked["num_epochs"]
    index, count = host(shard_index, shard_count)
    fields = tuple(fields)
    source = streams.open_source(path, split, fields)
    padding = streams.padding_values(source, fields)
    if training:
        order = streams.TrainOrder(len(source), batch_size, index, count, seed)
        length = sys.maxsize if num_epochs is None else order.per_epoch * num_epochs
        make = functools.partial(streams.train_example, size=image_size, fields=fields)
    else:
        if num_epochs not in (None, 1):
            raise ValueError(f"num_epochs={num_epochs}: an evaluation reads the split once")
        order = streams.EvalOrder(len(source), batch_size, index, count)
        length = order.length
        make = functools.partial(streams.eval_example, size=image_size, padding=padding)
    examples = streams.Examples(source, order, make, length, seed)
    # Training keeps whole batches only; evaluation's length is whole batches.
    batches = GrainBatches(examples, batch_size, length // batch_size, image_size)
    workers = streams.default_workers() if num_workers is None else num_workers
    out = grain.MapDataset.source(batches).to_iter_dataset(
        read_options or default_read_options(workers)
    )
    if workers:
        options = grain.MultiprocessingOptions(num_workers=workers)
        out = _Sweeping(out.mp_prefetch(options, worker_init_fn=_start_worker))
    return out


__all__ = ["GrainBatches", "dataset", "default_read_options", "host", "sweep"]

"""The Grain pipeline over a split: what a JAX training or evaluation loop iterates.

``dataset(path, split, ...)`` returns a ``grain.IterDataset`` of NumPy batches, each made
whole in a worker in shared memory; the order and crops are ``streams.py``'s
(docs/trainers.md, "Grain").
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import multiprocessing.util
import os
import secrets
import sys
import threading
from collections.abc import Sequence
from multiprocessing import shared_memory

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
        return streams.check_host(shard_index, shard_count)
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
# then made in shared memory.
_in_worker = False


def _start_worker(worker_index: int, worker_count: int) -> None:
    """In each worker process, before its first batch (Grain's ``worker_init_fn``).

    One OpenCV thread: OpenCV would spread every small resize over a thread pool
    of its own, beside the other workers, for more CPU per image.
    """
    global _in_worker
    import cv2

    cv2.setNumThreads(1)
    _in_worker = True


# Where POSIX shared memory's names are files: a ring needs to link them.
_SHM_DIR = "/dev/shm"
# Segments each worker reuses for its batches' images: the batches in flight
# (Grain's per-worker buffer) and a few the loop holds. A new segment costs
# its pages' faults and zeroing in the worker; a batch that finds every slot
# held gets a new one, as without the ring.
RING_SLOTS = 6


class _Ring:
    """A worker's reused image segments, one batch each, handed over under new names.

    Grain sends a batch's ``SharedMemoryArray`` by its segment's name, and the
    main process unlinks that name once it drops the batch (every view of it
    gone). So each batch goes out under a new name, a hard link to its slot's
    segment: the slot is free again when its segment has no name but the
    ring's own (``st_nlink == 1``), and a batch the main process holds, or
    one still on its way, is never overwritten. The ring's own names are
    unlinked when the worker exits; a batch's link keeps its memory alive.
    """

    def __init__(self, slots: int = RING_SLOTS, folder: str = _SHM_DIR):
        self.folder = folder
        self.segments: list[tuple[shared_memory.SharedMemory, np.ndarray] | None] = [None] * slots
        self._next = 0
        # read_options may give a worker several read threads: a slot is checked
        # and linked by one at a time, or two batches could share it.
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        """A ``SharedMemoryArray`` of ``shape`` under a new name: a free slot's, else a new one."""
        with self._lock:
            return self._take(shape)

    def _take(self, shape: tuple[int, ...]) -> np.ndarray:
        slots = len(self.segments)
        for step in range(slots):
            slot = (self._next + step) % slots
            segment = self.segments[slot]
            if segment is not None and self._links(segment[0]) > 1:
                continue  # a batch of it is still out
            if segment is None or segment[1].shape != shape:
                if segment is not None:
                    self.segments[slot] = None
                    self._drop(segment)
                segment = self.segments[slot] = self._segment(shape)
            self._next = (slot + 1) % slots
            return self._hand_over(*segment)
        return SharedMemoryArray(shape, np.uint8)

    def _links(self, segment: shared_memory.SharedMemory) -> int:
        return os.stat(os.path.join(self.folder, segment.name)).st_nlink

    @staticmethod
    def _segment(shape) -> tuple[shared_memory.SharedMemory, np.ndarray]:
        segment = shared_memory.SharedMemory(create=True, size=math.prod(shape))
        return segment, np.ndarray(shape, np.uint8, buffer=segment.buf)

    def _hand_over(self, segment: shared_memory.SharedMemory, pixels: np.ndarray) -> np.ndarray:
        name = f"psm_{secrets.token_hex(8)}"
        os.link(os.path.join(self.folder, segment.name), os.path.join(self.folder, name))
        # Opened by the new name only for Grain to read it there; the pixels are
        # written through the ring's mapping, whose pages are faulted in already.
        # Opening registers the name with the resource tracker the main process
        # shares: unlinked there once dropped, by the tracker if it never arrives.
        handle = shared_memory.SharedMemory(name)
        batch = pixels.view(SharedMemoryArray)
        batch.shm = handle
        return batch

    @staticmethod
    def _drop(segment) -> None:
        shm, pixels = segment
        del segment, pixels
        shm.unlink()
        try:
            shm.close()
        except BufferError:  # a batch array of it is still here: unmapped with it
            pass

    def close(self) -> None:
        """Unlinks the ring's own names (the worker's exit)."""
        segments, self.segments = self.segments, [None] * len(self.segments)
        while segments:
            segment = segments.pop()
            if segment is not None:
                self._drop(segment)


_ring: _Ring | None = None  # this worker's, made at its first batch


_ring_lock = threading.Lock()


def _worker_ring() -> _Ring:
    global _ring
    with _ring_lock:
        if _ring is None:
            _ring = _Ring()
            multiprocessing.util.Finalize(_ring, _ring.close, exitpriority=10)
        return _ring


def _image_array(shape: tuple[int, ...]) -> np.ndarray:
    """A batch's image array: in shared memory in a worker (Grain passes it on by name,
    where an ordinary array would be copied there; from the worker's ring where
    /dev/shm holds the names), else in this process."""
    if not _in_worker:
        return np.empty(shape, np.uint8)
    if os.path.isdir(_SHM_DIR):
        return _worker_ring().take(shape)
    return SharedMemoryArray(shape, np.uint8)


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

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} of {self.num_batches}")
        start = index * self.batch_size
        images = _image_array((self.batch_size, self.size, self.size, 3))
        columns = self.examples.batch(range(start, start + self.batch_size), images)
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
        out = out.mp_prefetch(options, worker_init_fn=_start_worker)
    return out


__all__ = ["GrainBatches", "dataset", "default_read_options", "host"]

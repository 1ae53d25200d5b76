"""A PyTorch DataLoader over a split: what a PyTorch training or evaluation loop iterates.

``loader(path, split, ...)`` returns a :class:`Loader` of uint8 batches in
``channels_last`` order; the order and crops are ``streams.py``'s, and
``device="cuda"`` decodes on the GPU (docs/trainers.md, "PyTorch").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import DataLoader, Sampler

from imagerecords import streams, transforms

_LOG = logging.getLogger(__name__)


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's ``(rank, world size)``: as given, else torch.distributed's, else one."""
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither")
    if rank is not None:
        return streams.check_host(rank, world_size, ("rank", "world_size"))
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank(), distributed.get_world_size()
    launched = streams.launched_processes()
    if launched:
        _LOG.warning(
            "reading the whole split in this process: torch.distributed is not initialised "
            "and neither rank nor world_size is given, but %s=%d says this job has %d "
            "processes (initialise torch.distributed first, or pass rank and world_size)",
            launched[0],
            launched[1],
            launched[1],
        )
    return 0, 1


def _column(key: str, values: list):
    """One key's values of a batch: numbers as tensors, JPEGs as byte tensors, text as a list."""
    first = values[0]
    if key == "jpeg":  # None for padding
        return [
            None if data is None else torch.frombuffer(bytearray(data), dtype=torch.uint8)
            for data in values
        ]
    if isinstance(first, bool | np.bool_):
        return torch.tensor(values, dtype=torch.bool)
    if isinstance(first, int | np.integer | tuple):  # labels, numbers, crop windows
        return torch.tensor(values, dtype=torch.int64)
    return values


def collate(examples: list[dict]) -> dict:
    """Examples -> a batch: images ``[B, 3, H, W]`` uint8, numbers as tensors, text as lists."""
    batch = {}
    for key in examples[0]:
        values = [example[key] for example in examples]
        if key == "image":
            # np.stack makes a fresh, writable array: from_numpy shares it, no copy.
            batch[key] = torch.from_numpy(np.stack(values)).permute(0, 3, 1, 2)
        else:
            batch[key] = _column(key, values)
    return batch


def _image_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """A batch's uint8 image tensor: in shared memory in a DataLoader worker (which
    then sends it by handle; an ordinary tensor would be copied there first),
    else in this process's memory."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    return _shared_tensor(shape)


def _shared_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


# Segments each worker reuses for its batches' images: the batches in flight
# (the DataLoader's prefetch_factor, 2 by default) and a few the loop holds.
# A fresh segment costs its pages' faults and zeroing in the worker; a batch
# that finds every slot held gets a fresh one, as without the ring.
RING_SLOTS = 6
_FREE, _HELD = 0, 1


class _RingTicket:
    """Which reused segment a batch's images lie in: the worker's slot flags (shared
    memory the main process writes) and the slot. Not a tensor or a sequence, so
    ``pin_memory`` passes it on as it is."""

    def __init__(self, flags: torch.Tensor, slot: int):
        self.flags, self.slot = flags, slot

    def release(self) -> None:
        self.flags[self.slot] = _FREE


class _Ring:
    """A worker's reused image segments, one batch each.

    The worker takes a slot whose flag is free and marks it held; the main
    process (``Loader``) marks it free again once no tensor of that batch is
    left there (``_Releases``). A slot is never written while any view of its
    batch is alive in the main process: a held batch is not overwritten.
    """

    def __init__(self, slots: int = RING_SLOTS):
        self.flags = torch.zeros(slots, dtype=torch.uint8).share_memory_()
        self._flags = self.flags.numpy()
        self.segments: list[torch.Tensor | None] = [None] * slots
        self._next = 0

    def take(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, _RingTicket | None]:
        """An image tensor of ``shape`` and its ticket; a fresh one (no ticket) when
        every slot is held."""
        slots = len(self.segments)
        for step in range(slots):
            slot = (self._next + step) % slots
            if self._flags[slot] != _FREE:
                continue
            segment = self.segments[slot]
            if segment is None or segment.shape != shape:
                segment = self.segments[slot] = _shared_tensor(shape)
            self._flags[slot] = _HELD
            self._next = (slot + 1) % slots
            return segment, _RingTicket(self.flags, slot)
        return _shared_tensor(shape), None


_ring: _Ring | None = None  # this worker's, made at its first batch


def _worker_ring() -> _Ring:
    global _ring
    if _ring is None:
        _ring = _Ring()
    return _ring


class _Releases:
    """The main process's side of the rings: each received batch's ticket, released
    once that batch's image storage has no tensor left here."""

    def __init__(self):
        self._pending: list[tuple[StorageWeakRef, _RingTicket]] = []

    def hold(self, images: torch.Tensor, ticket: _RingTicket) -> None:
        self._pending.append((StorageWeakRef(images.untyped_storage()), ticket))

    def sweep(self) -> int:
        """Releases the slots whose batch is gone; returns how many are still held."""
        held = []
        for storage, ticket in self._pending:
            if storage.expired():
                ticket.release()
            else:
                held.append((storage, ticket))
        self._pending = held
        return len(held)


# The key a worker's batch carries its ticket under, taken off by the Loader.
_RING_KEY = "_ring_ticket"


class TorchBatches(torch.utils.data.Dataset):
    """The map-style dataset of the CPU decode: a batch of positions made in one call.

    The ``DataLoader`` hands each batch's positions to ``__getitems__``, which
    reads their records in one call and decodes each image straight into the
    batch's tensor (in a worker, in shared memory): no per-example collation,
    no stacking copy, no copy into shared memory after. With ``reuse`` (the
    ``Loader``'s) a worker writes into its ``_Ring`` and the batch carries a
    ``_RingTicket`` under ``_RING_KEY``, which the ``Loader`` takes off.
    """

    def __init__(self, examples: streams.Examples, size: int, *, reuse: bool = False):
        self.examples, self.size, self.reuse = examples, size, reuse

    def __getitem__(self, position: int) -> dict:
        return self.__getitems__([position])

    def __getitems__(self, positions: Sequence[int]) -> dict:
        shape = (len(positions), self.size, self.size, 3)
        ticket = None
        if self.reuse and torch.utils.data.get_worker_info() is not None:
            images, ticket = _worker_ring().take(shape)
        else:
            images = _image_tensor(shape)
        columns = self.examples.batch(positions, images.numpy())
        batch = {key: _column(key, values) for key, values in columns.items() if key != "image"}
        batch["image"] = images.permute(0, 3, 1, 2)  # channels_last: the same memory
        if ticket is not None:
            batch[_RING_KEY] = ticket
        return batch


def _made(batch: dict) -> dict:
    """The collate function of ``TorchBatches``: its batches are made already."""
    return batch


def _start_worker(worker_id: int, then=None, *, opencv_threads: bool = True) -> None:
    """Each worker process's start (the ``DataLoader``'s ``worker_init_fn``, before the
    caller's own ``then``): one OpenCV thread, as OpenCV would spread every small
    resize over a thread pool of its own, beside the other workers.

    Not in a forked worker (``opencv_threads=False``): there OpenCV's pool is the
    parent's, whose threads the child does not have, and resizing it hangs; a
    forked worker keeps the main process's setting.
    """
    if opencv_threads:
        import cv2

        cv2.setNumThreads(1)
    if then is not None:
        then(worker_id)


def _forks(context) -> bool:
    """Whether a ``DataLoader`` with this ``multiprocessing_context`` forks its workers."""
    import multiprocessing

    if context is None:
        context = multiprocessing.get_context()
    elif isinstance(context, str):
        context = multiprocessing.get_context(context)
    return context.get_start_method() == "fork"


class Positions(Sampler):
    """One epoch's positions of a rank's stream, from a batch on (after a restored state).

    Epoch ``e`` starts at position ``e * stride`` of the stream and yields
    ``batches`` whole batches of it (training drops the epoch's remainder).
    """

    def __init__(self, stride: int, batches: int, batch_size: int, training: bool):
        self.stride, self.batches = stride, batches
        self.batch_size, self.training = batch_size, training
        self.epoch, self.start_batch = 0, 0

    def __iter__(self):
        base = self.epoch * self.stride
        first, end = self.start_batch * self.batch_size, self.batches * self.batch_size
        return iter(range(base + first, base + end))

    def __len__(self) -> int:
        return (self.batches - self.start_batch) * self.batch_size


class Loader(DataLoader):
    """A ``DataLoader`` that knows its epoch and where in it a checkpoint was taken.

    ``set_epoch(e)`` before each epoch draws epoch ``e``'s permutation (as with
    ``DistributedSampler``). ``state_dict()`` is ``{"epoch", "batch"}``: the
    epoch and the number of its batches handed out; ``load_state_dict`` on a
    new loader of the same configuration makes its next iteration start at
    that batch (``set_epoch`` of the same epoch keeps it), reading none of the
    batches before it.
    """

    def __init__(self, examples, positions: Positions, *, device=None, image_size=0, **kwargs):
        decode_here = device is None
        if decode_here:
            kwargs["worker_init_fn"] = functools.partial(
                _start_worker,
                then=kwargs.get("worker_init_fn"),
                opencv_threads=not _forks(kwargs.get("multiprocessing_context")),
            )
        super().__init__(
            TorchBatches(examples, image_size, reuse=True) if decode_here else examples,
            batch_size=positions.batch_size,
            sampler=positions,
            drop_last=positions.training,
            collate_fn=_made if decode_here else collate,
            **kwargs,
        )
        self.positions = positions
        self.device = None if device is None else torch.device(device)
        self.image_size = image_size
        self._handed_out = 0
        self._releases = _Releases()

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.positions.epoch:
            self.positions.start_batch = 0
        self.positions.epoch = epoch

    def state_dict(self) -> dict:
        return {"epoch": self.positions.epoch, "batch": self._handed_out}

    def load_state_dict(self, state: dict) -> None:
        batches = self.positions.batches
        if not 0 <= state["batch"] <= batches:
            raise ValueError(f"batch {state['batch']} of an epoch of {batches} batches")
        self.positions.epoch, self.positions.start_batch = state["epoch"], state["batch"]
        self._handed_out = state["batch"]

    def __iter__(self):
        self._handed_out = self.positions.start_batch
        for batch in super().__iter__():
            ticket = batch.pop(_RING_KEY, None) if self.device is None else None
            if ticket is not None:
                self._releases.hold(batch["image"], ticket)
            self._releases.sweep()
            if self.device is not None:
                batch = decode_batch(batch, self.device, self.image_size)
            self._handed_out += 1
            yield batch
        self.positions.start_batch = 0  # the next pass of this epoch is a whole one


def _undecoded_train(
    record: dict, slot, rng, *, size: int, fields: Sequence[str], out: None = None
) -> dict:
    """A training example left for the device to decode: the JPEG, its window, the flip.

    The draws are ``transforms.train_crop``'s, in its order: the same seed gives
    the same windows and flips as decoding in the workers.
    """
    jpeg, label = transforms.image_and_label(record)
    window = transforms.random_window(*transforms.jpeg_shape(jpeg), rng)
    flip = bool(rng.random() < 0.5)
    out = {"jpeg": jpeg, "window": tuple(window), "flip": flip, "label": label}
    out.update((name, record[name]) for name in fields)
    return out


def _undecoded_eval(
    record: dict | None, slot, rng, *, size: int, padding: dict, out: None = None
) -> dict:
    """An evaluation example left for the device to decode, or padding (no JPEG)."""
    if record is None:
        out = {"jpeg": None, "window": (0, 0, 1, 1), "flip": False, "label": 0, "mask": False}
        return {**out, **padding}
    jpeg, label = transforms.image_and_label(record)
    window = transforms.center_window(*transforms.jpeg_shape(jpeg), size)
    out = {"jpeg": jpeg, "window": tuple(window), "flip": False, "mask": True, "label": label}
    out.update((name, record[name]) for name in padding)
    return out


def decode_batch(batch: dict, device: torch.device, size: int) -> dict:
    """A batch of JPEGs and windows -> its images, decoded, cropped and resized on ``device``.

    torchvision decodes the whole batch in one call (nvJPEG on a GPU); each
    window is then resized as the reader does (bilinear, half-pixel centres,
    no antialiasing: ``tf.image.resize``'s), rounded, mirrored if drawn so.
    Padding (no JPEG) stays zero.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    jpegs = batch.pop("jpeg")
    real = [i for i, data in enumerate(jpegs) if data is not None]
    images = (
        decode_jpeg([jpegs[i] for i in real], mode=ImageReadMode.RGB, device=device) if real else []
    )
    out = torch.zeros((len(jpegs), 3, size, size), dtype=torch.uint8, device=device)
    out = out.contiguous(memory_format=torch.channels_last)
    windows, flips = batch.pop("window").tolist(), batch.pop("flip").tolist()
    for i, image in zip(real, images, strict=True):
        top, left, height, width = windows[i]
        crop = image[None, :, top : top + height, left : left + width].float()
        resized = torch.nn.functional.interpolate(
            crop, size=(size, size), mode="bilinear", align_corners=False, antialias=False
        )
        pixels = resized[0].round_().clamp_(0, 255).to(torch.uint8)
        out[i] = pixels.flip(-1) if flips[i] else pixels
    batch["image"] = out
    return batch


def loader(
    path: str,
    split: str,
    *,
    batch_size: int,
    image_size: int,
    training: bool,
    seed: int = 0,
    num_workers: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    device: str | torch.device | None = None,
    fields: Sequence[str] = (),
    **dataloader_args,
) -> Loader:
    """Batches of one split for this rank.

    Args:
        path: the dataset folder, local or ``gs://``.
        split: ``"train"``, ``"val"``, ...
        batch_size: examples per batch on this rank.
        image_size: the side of the square images.
        training: random crops of a new permutation each epoch, full batches
            only; else every record once, in shard order, with padding and
            ``mask``.
        seed: decides the permutations and the crops.
        num_workers: DataLoader worker processes (0: in this process; by
            default one per core), persistent unless ``persistent_workers=False``.
        rank, world_size: this process and the number of processes; by
            default ``torch.distributed``'s when it is initialised.
        device: decode on this device (``"cuda"``) in the loader's process,
            with torchvision; None: decode in the workers, with the CPU.
        fields: record fields to add to the batches (``"filename"``, ...).
        dataloader_args: any other ``DataLoader`` argument
            (``multiprocessing_context``, ``pin_memory``, ``persistent_workers``, ...).
    """
    checked = streams.check_arguments(
        training, batch_size=batch_size, image_size=image_size, seed=seed, num_workers=num_workers
    )
    batch_size, image_size, seed = checked["batch_size"], checked["image_size"], checked["seed"]
    num_workers = checked["num_workers"]
    index, count = rank_and_world(rank, world_size)
    fields = tuple(fields)
    source = streams.open_source(path, split, fields)
    padding = streams.padding_values(source, fields)
    if training:
        order = streams.TrainOrder(len(source), batch_size, index, count, seed)
        positions = Positions(order.per_epoch, order.per_epoch // batch_size, batch_size, True)
        make = streams.train_example if device is None else _undecoded_train
        make = functools.partial(make, size=image_size, fields=fields)
    else:
        order = streams.EvalOrder(len(source), batch_size, index, count)
        positions = Positions(0, order.batches, batch_size, False)
        make = streams.eval_example if device is None else _undecoded_eval
        make = functools.partial(make, size=image_size, padding=padding)
    # The sampler gives every position; the examples' length is not asked.
    examples = streams.Examples(source, order, make, len(positions), seed)
    workers = streams.default_workers() if num_workers is None else num_workers
    # Workers that live from epoch to epoch: no process start (and, with spawn,
    # no imports) at every set_epoch; the sampler runs here, so they need no news.
    dataloader_args.setdefault("persistent_workers", workers > 0)
    return Loader(
        examples,
        positions,
        device=device,
        image_size=image_size,
        num_workers=workers,
        **dataloader_args,
    )


__all__ = ["TorchBatches", "Loader", "collate", "decode_batch", "loader", "rank_and_world"]

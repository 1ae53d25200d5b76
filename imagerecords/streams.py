"""One host's stream of examples, shared by the Grain and the PyTorch loader.

Which record position ``k`` of a host's stream is (:class:`TrainOrder`,
:class:`EvalOrder`), and the example made from it (docs/trainers.md, "Grain").
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from imagerecords import transforms
from imagerecords.source import RecordSource

# Distinct purposes of one seed: the epoch's permutation, a record's crop.
_PERMUTATION, _CROP = 0, 1

# Variables a launcher sets to the number of processes of a job (torchrun,
# SLURM, Open MPI): one of them above 1 while a loader was told of one host
# means the hosts would all read the same records.
LAUNCHER_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def permutation(num_records: int, seed: int, epoch: int) -> np.ndarray:
    """Epoch ``epoch``'s order of the whole split: a permutation of ``range(num_records)``."""
    return np.random.default_rng([seed, _PERMUTATION, epoch]).permutation(num_records)


def crop_rng(seed: int, epoch: int, record: int) -> np.random.Generator:
    """The random numbers of record ``record``'s crop in epoch ``epoch``."""
    return np.random.default_rng([seed, _CROP, epoch, record])


def check_int(name: str, value, least: int) -> int:
    """Argument ``name``'s ``value``: an integer (not a bool) of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
        raise ValueError(f"{name}={value!r}: must be an integer >= {least}")
    return int(value)


# The least value of each of the loaders' integer arguments.
LEAST = {"batch_size": 1, "image_size": 1, "seed": 0, "num_workers": 0, "num_epochs": 1}


def check_arguments(training, **values) -> dict[str, int | None]:
    """The loaders' arguments, checked (``LEAST``'s, given by name; None where it is
    the default): the values as ints."""
    if not isinstance(training, bool | np.bool_):
        raise ValueError(f"training={training!r}: must be True or False")
    return {
        name: None
        if value is None and name in ("num_workers", "num_epochs")
        else check_int(name, value, LEAST[name])
        for name, value in values.items()
    }


def check_host(
    index: int, count: int, names: tuple[str, str] = ("index", "count")
) -> tuple[int, int]:
    """``(index, count)`` of this host, checked; ``names`` are the arguments' (in errors)."""
    count = check_int(names[1], count, 1)
    index = check_int(names[0], index, 0)
    if index >= count:
        raise ValueError(f"{names[0]}={index} is not in 0..{count - 1} ({names[1]}={count})")
    return index, count


def launched_processes(environ: Mapping[str, str] = os.environ) -> tuple[str, int] | None:
    """The first launcher variable that says this job has more than one process."""
    for name in LAUNCHER_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 1:
            return name, int(value)
    return None


def default_workers() -> int:
    """Worker processes a loader starts unless told: one per core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@dataclasses.dataclass(frozen=True)
class Slot:
    """What position ``k`` of a host's stream holds: a record of the split, or padding."""

    record: int | None  # the split position; None for padding
    epoch: int


class TrainOrder:
    """Training positions of host ``index`` of ``count``: a new permutation each epoch."""

    def __init__(self, num_records: int, batch_size: int, index: int, count: int, seed: int):
        self.index, self.count = check_host(index, count)
        self.num_records, self.seed = num_records, seed
        self.per_epoch = num_records // count
        if self.per_epoch < batch_size:
            share = f" for each of {count} hosts" if count > 1 else ""
            raise ValueError(
                f"{num_records} records make {self.per_epoch} examples per epoch{share}, "
                f"fewer than one batch of {batch_size}: lower batch_size"
            )
        self._lock = threading.Lock()
        self._epoch, self._order = None, None

    def batches_per_epoch(self, batch_size: int) -> int:
        return self.per_epoch // batch_size

    def locate(self, position: int) -> Slot:
        epoch, offset = divmod(position, self.per_epoch)
        return Slot(int(self._permutation(epoch)[offset * self.count + self.index]), epoch)

    def _permutation(self, epoch: int) -> np.ndarray:
        with self._lock:  # read threads of one process share the epoch's order
            if self._epoch != epoch:
                self._order, self._epoch = permutation(self.num_records, self.seed, epoch), epoch
            return self._order

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_order", "_epoch")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._epoch, self._order = None, None


class EvalOrder:
    """Evaluation positions of host ``index`` of ``count``: its range, then padding.

    ``start``..``stop`` are the split positions it reads; ``batches`` is every
    host's number of batches, enough for the largest range.
    """

    def __init__(self, num_records: int, batch_size: int, index: int, count: int):
        self.index, self.count = check_host(index, count)
        if num_records == 0:
            raise ValueError("the split has no records to evaluate")
        self.start = index * num_records // count
        self.stop = (index + 1) * num_records // count
        largest = -(-num_records // count)
        self.batches = -(-largest // batch_size)
        self.length = self.batches * batch_size

    def locate(self, position: int) -> Slot:
        if not 0 <= position < self.length:
            raise IndexError(f"position {position} of a host's {self.length} evaluation examples")
        record = self.start + position
        return Slot(record if record < self.stop else None, 0)


class Examples:
    """Position ``k`` of a host's stream -> its example; picklable for worker processes.

    Args:
        source: the split's ``RecordSource``.
        order: a ``TrainOrder`` or an ``EvalOrder``.
        make: ``make(record, slot, rng, out=row)`` -> the example dict; ``record``
            is None for padding, ``rng`` None in evaluation, ``row`` the array to
            write the image into (None: a new one).
        length: positions of the stream (training runs on through epochs).
        seed: the crops' seed (training).
    """

    def __init__(
        self,
        source,
        order: TrainOrder | EvalOrder,
        make: Callable[[dict | None, Slot, np.random.Generator | None], dict],
        length: int,
        seed: int = 0,
    ):
        self.source, self.order, self.make = source, order, make
        self.length, self.seed = length, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, position: int) -> dict:
        return self.__getitems__([position])[0]

    def __getitems__(
        self, positions: Sequence[int], images: np.ndarray | None = None
    ) -> list[dict]:
        """The examples at ``positions``; with ``images`` (uint8 ``[len(positions), size,
        size, 3]``) each example's image is written into its row instead of a new array."""
        slots = [self.order.locate(int(p)) for p in positions]
        wanted = [slot.record for slot in slots if slot.record is not None]
        records = iter(self.source.__getitems__(wanted) if wanted else [])
        training = isinstance(self.order, TrainOrder)
        examples = []
        for i, slot in enumerate(slots):
            row = None if images is None else images[i]
            if slot.record is None:
                examples.append(self.make(None, slot, None, out=row))
                continue
            rng = crop_rng(self.seed, slot.epoch, slot.record) if training else None
            examples.append(self.make(next(records), slot, rng, out=row))
        return examples

    def batch(self, positions: Sequence[int], images: np.ndarray) -> dict[str, np.ndarray | list]:
        """The batch of ``positions``: ``images`` filled in (row ``i``, position ``i``'s
        image), and every other key's values as a list in position order.

        What both loaders batch with: the images go straight into the array the
        loader hands on (shared memory in a worker process), with no copy into a
        batch after, and the batch's records are read in one call.
        """
        examples = self.__getitems__(positions, images)
        columns = {key: [example[key] for example in examples] for key in examples[0]}
        columns["image"] = images
        return columns

    _getitems = __getitems__  # Grain's batched read


def open_source(path: str, split: str, fields: Sequence[str]) -> RecordSource:
    """The split's source: serialized records unless fields beyond the image and label are kept.

    The transforms parse only the image and the label out of a serialized
    record (``transforms.image_and_label``), half the work of the whole parse.
    """
    return RecordSource(path, split, parse=bool(fields))


def padding_values(source: RecordSource, fields: Sequence[str]) -> dict:
    """Kept fields' values in a padding example: "" for text, 0 for a number (record 0's types)."""
    if not fields:
        return {}
    record = source[0]
    unknown = [name for name in fields if name not in record]
    if unknown:
        raise ValueError(f"fields {unknown} are not in the records; they have: {', '.join(record)}")
    return {name: "" if isinstance(record[name], str) else type(record[name])() for name in fields}


def train_example(
    record: dict,
    slot: Slot,
    rng,
    *,
    size: int,
    fields: Sequence[str],
    out: np.ndarray | None = None,
) -> dict:
    """A training example: the random crop (into ``out`` when given), and the kept fields."""
    example = transforms.train_crop(record, rng, size, out=out)
    example.update((name, record[name]) for name in fields)
    return example


def eval_example(
    record: dict | None, slot: Slot, rng, *, size: int, padding: dict, out: np.ndarray | None = None
) -> dict:
    """An evaluation example with its ``mask``: the evaluation crop, or padding (black)."""
    if record is None:
        if out is None:
            image = np.zeros((size, size, 3), np.uint8)
        else:
            image = out  # a row of a batch array may hold anything: blacked here
            image.fill(0)
        return {"image": image, "label": 0, "mask": False, **padding}
    example = transforms.eval_crop(record, size, out=out)
    example["mask"] = True
    example.update((name, record[name]) for name in padding)
    return example

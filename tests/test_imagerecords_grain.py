"""imagerecords.grain.dataset and imagerecords.streams: the real converter's shards, real Grain.

Hosts are simulated by building each host's pipeline with its shard_index in
turn (what each host of a job computes on its own); JAX is not installed
here, so its path is checked with a stand-in module that has JAX's two calls.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import sys
import textwrap

import numpy as np
import pytest

from imagerecords import RecordSource, streams
from imagerecords import grain as imagerecords_grain
from tests import trainer_fixtures


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return trainer_fixtures.convert(tmp_path_factory.mktemp("grain"))


def _batches(path, split, **kwargs):
    kwargs = {"batch_size": 4, "image_size": 24, "num_workers": 0, **kwargs}
    return list(imagerecords_grain.dataset(path, split, **kwargs))


def _names(batches, masked=False) -> list[str]:
    if masked:
        return [str(n) for b in batches for n, m in zip(b["filename"], b["mask"], strict=True) if m]
    return [str(name) for batch in batches for name in batch["filename"]]


# ------------------------------------------------------------------ streams, pure


@pytest.mark.parametrize(
    "records, batch, hosts",
    [(34, 4, 1), (34, 4, 2), (34, 4, 3), (5, 4, 2), (5, 2, 3), (2, 8, 3), (12, 4, 3), (1, 1, 4)],
)
def test_eval_order_every_record_once_equal_batches(records, batch, hosts):
    orders = [streams.EvalOrder(records, batch, i, hosts) for i in range(hosts)]
    slots = [[order.locate(k).record for k in range(order.length)] for order in orders]
    real = [r for host in slots for r in host if r is not None]
    assert sorted(real) == list(range(records))  # each record once, across the hosts
    assert {order.batches for order in orders} == {orders[0].batches}
    assert orders[0].length == orders[0].batches * batch
    # As few batches as the largest share needs: no all-padding batch on every host.
    assert orders[0].batches == -(-max(o.stop - o.start for o in orders) // batch)
    for order, host in zip(orders, slots, strict=True):
        assert host == [
            *range(order.start, order.stop),
            *[None] * (order.length - len(range(order.start, order.stop))),
        ]
    with pytest.raises(IndexError):
        orders[0].locate(orders[0].length)


@pytest.mark.parametrize("records, hosts", [(34, 1), (34, 2), (34, 3), (10, 4)])
def test_train_order_hosts_disjoint_each_epoch_new_permutation(records, hosts):
    orders = [streams.TrainOrder(records, 1, i, hosts, seed=3) for i in range(hosts)]
    per_epoch = records // hosts
    epochs = []
    for epoch in range(3):
        taken = [
            order.locate(epoch * per_epoch + k).record for order in orders for k in range(per_epoch)
        ]
        assert len(set(taken)) == len(taken) == per_epoch * hosts  # disjoint across hosts
        epochs.append(taken)
    assert epochs[0] != epochs[1] != epochs[2]
    again = streams.TrainOrder(records, 1, 0, hosts, seed=3)
    assert [again.locate(k).record for k in range(per_epoch)] == epochs[0][:per_epoch]
    other = streams.TrainOrder(records, 1, 0, hosts, seed=4)
    assert [other.locate(k).record for k in range(per_epoch)] != epochs[0][:per_epoch]


def test_train_order_refuses_less_than_a_batch_per_host():
    with pytest.raises(ValueError, match="17 examples per epoch for each of 2 hosts, fewer than"):
        streams.TrainOrder(34, 18, 0, 2, seed=0)


@pytest.mark.parametrize(
    "index, count, error",
    [
        (0, 1, None),
        (2, 3, None),
        (3, 3, r"index=3 is not in 0..2 \(count=3\)"),
        (-1, 2, "index=-1: must be an integer >= 0"),
        (0, 0, "count=0: must be an integer >= 1"),
        (True, 2, "index=True: must be an integer"),  # a bool is not a host
        (0, 2.0, "count=2.0: must be an integer"),
        (np.int64(1), 2, None),
    ],
)
def test_check_host(index, count, error):
    if error is None:
        assert streams.check_host(index, count) == (index, count)
    else:
        with pytest.raises(ValueError, match=error):
            streams.check_host(index, count)


@pytest.mark.parametrize(
    "environ, found",
    [
        ({}, None),
        ({"WORLD_SIZE": "1"}, None),
        ({"WORLD_SIZE": "4"}, ("WORLD_SIZE", 4)),
        ({"SLURM_NTASKS": "2", "WORLD_SIZE": "1"}, ("SLURM_NTASKS", 2)),
        ({"OMPI_COMM_WORLD_SIZE": "x"}, None),
    ],
)
def test_launched_processes(environ, found):
    assert streams.launched_processes(environ) == found


# ------------------------------------------------------------------ evaluation


@pytest.mark.e2e
# val's 5 records share out unevenly: 2 + 3 and 1 + 2 + 2 make unequal batch counts
# without the padding batches.
@pytest.mark.parametrize(
    "split, hosts, batch", [("train", 2, 4), ("train", 3, 4), ("val", 2, 2), ("val", 3, 1)]
)
def test_eval_every_record_once_across_hosts_equal_batches_masked(dataset, split, hosts, batch):
    expected = RecordSource(dataset.path, split)
    per_host = [
        _batches(
            dataset.path,
            split,
            batch_size=batch,
            training=False,
            shard_index=i,
            shard_count=hosts,
            fields=("filename",),
        )
        for i in range(hosts)
    ]
    assert len({len(batches) for batches in per_host}) == 1
    assert sorted(n for b in per_host for n in _names(b, masked=True)) == sorted(
        r["filename"] for r in expected
    )
    labels = {r["filename"]: r["label"] for r in expected}
    for batches in per_host:
        for b in batches:
            assert b["image"].shape == (batch, 24, 24, 3) and b["image"].dtype == np.uint8
            assert b["mask"].dtype == bool
            for name, label, mask, image in zip(
                b["filename"], b["label"], b["mask"], b["image"], strict=True
            ):
                if mask:
                    assert label == labels[str(name)] and image.any()
                else:  # padding: an empty name, label 0, a black image
                    assert str(name) == "" and label == 0 and not image.any()
    padding = sum(int((~b["mask"]).sum()) for batches in per_host for b in batches)
    assert padding == hosts * len(per_host[0]) * batch - len(expected)


@pytest.mark.e2e
def test_eval_pixels_are_the_eval_crop_in_shard_order(dataset):
    from imagerecords import transforms

    source = RecordSource(dataset.path, "val")
    batches = _batches(dataset.path, "val", training=False, num_workers=2)
    images = np.concatenate([b["image"] for b in batches])
    for i in range(len(source)):
        assert np.array_equal(images[i], transforms.eval_crop(source[i], 24)["image"])


# ------------------------------------------------------------------ training


@pytest.mark.e2e
def test_training_every_record_once_per_epoch_new_order_deterministic(dataset):
    source = RecordSource(dataset.path, "train")
    n = len(source)  # 34; batches of 2, so epochs end on batch boundaries
    run = _batches(
        dataset.path, "train", training=True, batch_size=2, num_epochs=2, fields=("filename",)
    )
    names = _names(run)
    assert len(names) == 2 * n
    first, second = names[:n], names[n:]
    assert sorted(first) == sorted(second) == sorted(r["filename"] for r in source)
    assert first != second and first != [r["filename"] for r in source]
    again = _batches(
        dataset.path, "train", training=True, batch_size=2, num_epochs=2, fields=("filename",)
    )
    assert _names(again) == names
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(run, again, strict=True))
    other = _batches(
        dataset.path,
        "train",
        training=True,
        batch_size=2,
        num_epochs=1,
        seed=1,
        fields=("filename",),
    )
    assert _names(other) != first
    labels = {r["filename"]: r["label"] for r in source}
    assert [int(x) for b in run for x in b["label"]] == [labels[name] for name in names]


@pytest.mark.e2e
def test_training_hosts_read_disjoint_parts_of_each_epoch(dataset):
    per_host = [
        _names(
            _batches(
                dataset.path,
                "train",
                training=True,
                batch_size=1,
                num_epochs=1,
                shard_index=i,
                shard_count=3,
                fields=("filename",),
            )
        )
        for i in range(3)
    ]
    assert [len(names) for names in per_host] == [11, 11, 11]  # 34 // 3 each
    assert len(set().union(*per_host)) == 33


@pytest.mark.e2e
def test_workers_give_the_same_batches_as_one_process(dataset):
    kwargs = {"training": True, "num_epochs": 1, "fields": ("filename",)}
    alone = _batches(dataset.path, "train", num_workers=0, **kwargs)
    workers = _batches(dataset.path, "train", num_workers=2, **kwargs)
    assert _names(workers) == _names(alone)
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(alone, workers, strict=True))


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [0, 2])
def test_checkpoint_restores_to_the_next_batch(dataset, workers):
    def pipeline():
        return imagerecords_grain.dataset(
            dataset.path,
            "train",
            batch_size=4,
            image_size=24,
            training=True,
            seed=5,
            num_workers=workers,
            fields=("filename",),
        )

    iterator = iter(pipeline())
    for _ in range(9):  # past the first epoch's 8 batches
        next(iterator)
    state = iterator.get_state()
    expected = [next(iterator) for _ in range(3)]
    iterator.close()
    resumed = iter(pipeline())
    resumed.set_state(state)
    got = [next(resumed) for _ in range(3)]
    resumed.close()
    assert _names(got) == _names(expected)
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(got, expected, strict=True))


# ------------------------------------------------------------------ which host


def test_host_given_or_refused():
    assert imagerecords_grain.host(1, 3) == (1, 3)
    with pytest.raises(ValueError, match="give both shard_index and shard_count"):
        imagerecords_grain.host(1, None)
    with pytest.raises(ValueError, match=r"shard_index=3 is not in 0..2 \(shard_count=3\)"):
        imagerecords_grain.host(3, 3)
    with pytest.raises(ValueError, match="shard_index=True: must be an integer >= 0"):
        imagerecords_grain.host(True, 2)


@pytest.mark.parametrize(
    "argument, value, error",
    [
        ("batch_size", 0, "batch_size=0: must be an integer >= 1"),
        ("batch_size", -4, "batch_size=-4: must be an integer >= 1"),
        ("batch_size", 4.0, "batch_size=4.0: must be an integer >= 1"),
        ("batch_size", True, "batch_size=True: must be an integer >= 1"),
        ("image_size", 0, "image_size=0: must be an integer >= 1"),
        ("image_size", "24", "image_size='24': must be an integer >= 1"),
        ("seed", -1, "seed=-1: must be an integer >= 0"),
        ("num_workers", -1, "num_workers=-1: must be an integer >= 0"),
        ("num_workers", 1.5, "num_workers=1.5: must be an integer >= 0"),
        ("num_epochs", 0, "num_epochs=0: must be an integer >= 1"),
        ("training", "false", "training='false': must be True or False"),
        ("shard_index", True, "shard_index=True: must be an integer >= 0"),
        ("shard_count", 0, "shard_count=0: must be an integer >= 1"),
    ],
)
def test_bad_arguments_are_refused_by_name_before_the_dataset_is_opened(argument, value, error):
    kwargs = {"batch_size": 4, "image_size": 24, "training": True, "num_workers": 0}
    kwargs.update(shard_index=0, shard_count=1)
    kwargs[argument] = value
    with pytest.raises(ValueError, match=f"^{error}"):
        imagerecords_grain.dataset("/no/such/dataset", "train", **kwargs)


def test_one_host_warns_only_when_a_launcher_says_more(monkeypatch, caplog):
    for name in streams.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level(logging.WARNING, logger="imagerecords.grain"):
        assert imagerecords_grain.host(None, None) == (0, 1)
    assert caplog.records == []
    monkeypatch.setenv("WORLD_SIZE", "4")
    with caplog.at_level(logging.WARNING, logger="imagerecords.grain"):
        assert imagerecords_grain.host(None, None) == (0, 1)
    assert "WORLD_SIZE=4 says this job has 4 processes" in caplog.text


def test_jax_processes_decide_the_host(tmp_path, monkeypatch):
    """A stand-in ``jax`` with JAX's two calls (JAX is not installed here)."""
    (tmp_path / "jax.py").write_text(
        textwrap.dedent(
            """
            def process_index():
                return 2

            def process_count():
                return 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    assert imagerecords_grain.host(None, None) == (2, 3)
    assert imagerecords_grain.host(0, 1) == (0, 1)  # given wins


@pytest.mark.e2e
def test_unknown_field_and_epochs_of_an_evaluation_are_refused(dataset):
    with pytest.raises(ValueError, match=r"fields \['nope'\] are not in the records"):
        _batches(dataset.path, "val", training=False, fields=("nope",))
    with pytest.raises(ValueError, match="an evaluation reads the split once"):
        _batches(dataset.path, "val", training=False, num_epochs=2)


@pytest.mark.parametrize("workers, threads", [(0, streams.default_workers()), (1, 1), (4, 1)])
def test_default_read_threads(workers, threads):
    assert imagerecords_grain.default_read_options(workers).num_threads == threads


@pytest.mark.e2e
def test_serialized_records_give_the_same_batches_as_parsed_ones(dataset):
    """Without kept fields the source hands over serialized records (half the parse)."""
    kwargs = {"training": True, "num_epochs": 1}
    parsed = _batches(dataset.path, "train", fields=("filename",), **kwargs)
    serialized = _batches(dataset.path, "train", **kwargs)
    assert set(serialized[0]) == {"image", "label"}
    for a, b in zip(parsed, serialized, strict=True):
        assert np.array_equal(a["image"], b["image"]) and np.array_equal(a["label"], b["label"])


def _in_a_worker(monkeypatch, batches, index):
    """Batch ``index`` as a worker process makes it (``_start_worker`` ran), with its ring."""
    import cv2

    threads = cv2.getNumThreads()
    monkeypatch.setattr(imagerecords_grain, "_in_worker", False)
    monkeypatch.setattr(imagerecords_grain, "_ring", None)
    monkeypatch.setattr(imagerecords_grain, "_owner", None)
    monkeypatch.setattr(imagerecords_grain, "_watch_owner", lambda owner: None)  # not here
    try:
        imagerecords_grain._start_worker(0, 2)
        assert imagerecords_grain._in_worker and cv2.getNumThreads() == 1
        return batches[index]
    finally:
        cv2.setNumThreads(threads)


def _hand_over(batch):
    """What Grain does with a worker's batch: pickled there, unpickled here."""
    return pickle.loads(pickle.dumps(batch))


def _names_in_shm() -> set[str]:
    """The names this process made as a worker would (``_start_worker`` ran here)."""
    prefix = imagerecords_grain.segment_prefix(os.getppid(), os.getpid())
    return {name for name in os.listdir(imagerecords_grain._SHM_DIR) if name.startswith(prefix)}


@pytest.fixture
def as_a_worker():
    """Unlinks what a test made here as a worker would, even when it fails."""
    yield
    for name in _names_in_shm():
        os.unlink(os.path.join(imagerecords_grain._SHM_DIR, name))


@pytest.mark.e2e
def test_a_worker_makes_its_batch_in_shared_memory_that_goes_over_by_name(
    dataset, monkeypatch, as_a_worker
):
    """In a worker process a batch's images lie in shared memory, which goes to the
    iterating process by the segment's name, not by a copy; Grain passes the batch
    on as it is (no copy of any of its arrays into segments of its own)."""
    from grain._src.python.ipc import shared_memory_array

    source = streams.open_source(dataset.path, "train", ())
    order = streams.TrainOrder(len(source), 4, 0, 1, seed=0)
    make = functools.partial(streams.train_example, size=24, fields=())
    batches = imagerecords_grain.GrainBatches(streams.Examples(source, order, make, 40), 4, 10, 24)
    in_process = batches[3]
    assert type(in_process["image"]) is np.ndarray and in_process["label"].dtype == np.int64
    batch = _in_a_worker(monkeypatch, batches, 3)
    assert shared_memory_array.copy_to_shm(batch) is batch
    pickled = pickle.dumps(batch)
    assert len(pickled) < in_process["image"].nbytes
    received = pickle.loads(pickled)
    assert list(received) == list(in_process)
    for key, value in in_process.items():
        assert np.array_equal(received[key], value) and received[key].dtype == value.dtype
    name = received["image"].base.name
    assert name == batch.name and name in _names_in_shm()
    del received
    assert name not in _names_in_shm()  # dropped: its name is unlinked
    imagerecords_grain._ring.close()
    assert not _names_in_shm()
    with pytest.raises(IndexError, match="batch 10 of 10"):
        batches[10]


@pytest.mark.e2e
def test_a_batch_that_fails_in_a_worker_leaves_its_slot_free(dataset, monkeypatch, as_a_worker):
    """A record that fails while its batch is made: the batch's name goes, so its slot
    is not held by a batch that never goes out."""
    source = streams.open_source(dataset.path, "train", ())
    order = streams.TrainOrder(len(source), 4, 0, 1, seed=0)

    def broken(record, slot, rng, out=None):
        raise ValueError("a corrupt record")

    batches = imagerecords_grain.GrainBatches(
        streams.Examples(source, order, broken, 40), 4, 10, 24
    )
    with pytest.raises(ValueError, match="a corrupt record"):
        _in_a_worker(monkeypatch, batches, 0)
    ring = imagerecords_grain._ring
    assert _names_in_shm() == {ring.segments[0][0]}  # the slot's own name only
    assert os.stat(ring.path(ring.segments[0][0])).st_nlink == 1  # free: no batch of it out
    ring.close()


# ------------------------------------------------------------------ reused image segments


def _inode(array) -> int:
    """The segment a received batch's array lies in (its name is linked while held)."""
    return os.stat(os.path.join(imagerecords_grain._SHM_DIR, array.base.name)).st_ino


def _inodes_in_shm() -> set[int]:  # noqa: D103
    return {entry.inode() for entry in os.scandir(imagerecords_grain._SHM_DIR)}


def test_a_ring_slot_is_written_again_only_once_the_main_process_dropped_its_batch(as_a_worker):
    """Each batch goes out under a new name; a slot whose batch is held (a view is
    enough) or on its way is skipped, every slot out gives a new segment, and a slot
    whose batch the iterating process dropped (its name unlinked) is reused."""
    shape = (2, 4, 4, 3)
    ring = imagerecords_grain._Ring(imagerecords_grain.segment_prefix(os.getppid(), os.getpid()), 2)

    def take():
        name, pixels = ring.take(shape)
        return imagerecords_grain._SharedBatch(name, pixels, {"image": None})

    def hand_over():  # by name from the worker, mapped here
        return _hand_over(take())["image"]

    first = hand_over()
    first[:] = 7
    slot_0 = _inode(first)
    on_its_way = take()  # slot 1, not yet mapped here
    fresh = hand_over()
    assert len({slot_0, os.stat(ring.path(on_its_way.name)).st_ino, _inode(fresh)}) == 3
    view = first[1]
    del first
    assert _inode(hand_over()) != slot_0  # the view holds slot 0
    del view
    again = hand_over()
    assert _inode(again) == slot_0
    del again, fresh
    ring.close()
    assert slot_0 not in _inodes_in_shm()
    # Never mapped here, so its name stays: the sweep's (tests/test_loader_cleanup.py).
    assert _names_in_shm() == {on_its_way.name}


@pytest.mark.e2e
def test_a_worker_reuses_its_segments_and_never_overwrites_a_held_batch(dataset):
    """Three epochs through one worker, each batch dropped once the next one comes, but
    the first held to the end: it keeps its pixels and its segment, and the others
    share segments (a worker has at most a few batches out besides the held one,
    fewer than its six slots, so reuse is certain)."""
    kwargs = {"training": True, "num_epochs": 3, "seed": 3, "shard_index": 0, "shard_count": 1}
    expected = [batch["image"] for batch in _batches(dataset.path, "train", **kwargs)]
    iterator = iter(
        imagerecords_grain.dataset(
            dataset.path, "train", batch_size=4, image_size=24, num_workers=1, **kwargs
        )
    )
    held, segments = None, []
    for number, batch in enumerate(iterator):
        segments.append(_inode(batch["image"]))
        assert np.array_equal(batch["image"], expected[number])
        if held is None:
            held, held_pixels = batch, batch["image"].copy()
        del batch
    iterator.close()
    assert len(segments) == len(expected) > 20
    assert np.array_equal(held["image"], held_pixels)
    assert segments[0] not in segments[1:]
    assert len(set(segments[1:])) < len(segments) - 1

"""imagerecords.torch.loader: real PyTorch DataLoaders over the real converter's shards.

``make test-torch`` runs these (its venv has torch and torchvision); ``make
test`` has no torch and skips this module. Ranks are simulated by building each
rank's loader in turn, and once for real: three processes joined by
``torch.distributed`` (gloo) that find their rank themselves. The device
decode runs its code on the CPU (``device="cpu"``): no GPU here.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed here: run make test-torch")

import simplejpeg  # noqa: E402

from imagerecords import RecordSource, streams, transforms  # noqa: E402
from imagerecords import grain as imagerecords_grain  # noqa: E402
from imagerecords import torch as imagerecords_torch  # noqa: E402
from tests import trainer_fixtures  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.e2e]  # the fixture converts with the CLI


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return trainer_fixtures.convert(tmp_path_factory.mktemp("torch"))


def _loader(path, split, **kwargs):
    kwargs = {"batch_size": 4, "image_size": 24, "num_workers": 0, **kwargs}
    return imagerecords_torch.loader(path, split, **kwargs)


def _names(batches, masked=False) -> list[str]:
    if masked:
        return [n for b in batches for n, m in zip(b["filename"], b["mask"], strict=True) if m]
    return [name for batch in batches for name in batch["filename"]]


def _same_images(a, b) -> bool:
    return all(torch.equal(x["image"], y["image"]) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------ evaluation


# val's 5 records share out unevenly: 2 + 3 and 1 + 2 + 2 make unequal batch counts
# without the padding batches.
@pytest.mark.parametrize(
    "split, ranks, batch", [("train", 2, 4), ("train", 3, 4), ("val", 2, 2), ("val", 3, 1)]
)
def test_eval_every_record_once_across_ranks_equal_batches_masked(dataset, split, ranks, batch):
    expected = RecordSource(dataset.path, split)
    loaders = [
        _loader(
            dataset.path,
            split,
            batch_size=batch,
            training=False,
            rank=r,
            world_size=ranks,
            fields=("filename",),
        )
        for r in range(ranks)
    ]
    per_rank = [list(loader) for loader in loaders]
    assert len({len(batches) for batches in per_rank}) == 1
    assert [len(loader) for loader in loaders] == [len(b) for b in per_rank]
    assert sorted(n for b in per_rank for n in _names(b, masked=True)) == sorted(
        r["filename"] for r in expected
    )
    labels = {r["filename"]: r["label"] for r in expected}
    for batches in per_rank:
        for b in batches:
            image = b["image"]
            assert image.shape == (batch, 3, 24, 24) and image.dtype == torch.uint8
            assert image.is_contiguous(memory_format=torch.channels_last)
            assert b["mask"].dtype == torch.bool and b["label"].dtype == torch.int64
            for name, label, mask, pixels in zip(
                b["filename"], b["label"], b["mask"], image, strict=True
            ):
                if mask:
                    assert label == labels[name] and pixels.any()
                else:
                    assert name == "" and label == 0 and not pixels.any()
    padding = sum(int((~b["mask"]).sum()) for batches in per_rank for b in batches)
    assert padding == ranks * len(per_rank[0]) * batch - len(expected)


_RANK = """
import json, sys
import torch.distributed as dist
from imagerecords import torch as imagerecords_torch

dist.init_process_group("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=3)
dist.barrier()  # every pair of ranks connected before any goes on
loader = imagerecords_torch.loader(
    sys.argv[3], "train", batch_size=4, image_size=16, training=False, num_workers=0,
    fields=("filename",),
)
names = [n for b in loader for n, m in zip(b["filename"], b["mask"].tolist()) if m]
print(json.dumps({"rank": dist.get_rank(), "batches": len(loader), "names": names}))
dist.barrier()  # none leaves the group while another still talks to it
dist.destroy_process_group()
"""


def test_eval_ranks_from_torch_distributed(dataset, tmp_path):
    """Three processes in one gloo group: each finds its rank and reads its part."""
    init = f"file://{tmp_path / 'store'}"
    env = {**os.environ, "PYTHONPATH": str(trainer_fixtures.REPO)}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, init, str(rank), dataset.path],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(3)
    ]
    done = [process.communicate(timeout=300) + (process.returncode,) for process in ranks]
    failed = [f"rank {r}: {err[-2000:]}" for r, (_, err, code) in enumerate(done) if code != 0]
    assert not failed, "\n".join(failed)
    outs = [json.loads(out.strip().splitlines()[-1]) for out, _, _ in done]
    assert [out["rank"] for out in outs] == [0, 1, 2]
    assert len({out["batches"] for out in outs}) == 1
    names = [name for out in outs for name in out["names"]]
    assert sorted(names) == sorted(trainer_fixtures.split_names(dataset.path, "train"))


# ------------------------------------------------------------------ training


def test_set_epoch_reshuffles_deterministically_every_record_once(dataset):
    source = RecordSource(dataset.path, "train")
    loader = _loader(dataset.path, "train", training=True, batch_size=2, fields=("filename",))
    assert len(loader) == 17  # 34 records in batches of 2
    epochs = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        epochs.append(list(loader))
    first, second = _names(epochs[0]), _names(epochs[1])
    assert sorted(first) == sorted(second) == sorted(r["filename"] for r in source)
    assert first != second
    assert _names(list(loader)) == second  # the same epoch again: the same order
    again = _loader(dataset.path, "train", training=True, batch_size=2, fields=("filename",))
    assert _names(list(again)) == first and _same_images(list(again), epochs[0])
    other = _loader(
        dataset.path, "train", training=True, batch_size=2, seed=1, fields=("filename",)
    )
    assert _names(list(other)) != first


def test_training_drops_each_epochs_remainder_equal_for_every_rank(dataset):
    loaders = [
        _loader(dataset.path, "train", training=True, rank=r, world_size=3, fields=("filename",))
        for r in range(3)
    ]
    assert [len(loader) for loader in loaders] == [
        2,
        2,
        2,
    ]  # 11 records each an epoch: 2 batches of 4
    names = [name for loader in loaders for name in _names(list(loader))]
    assert len(set(names)) == len(names) == 24


def test_same_batches_as_the_grain_pipeline_for_a_seed(dataset):
    """One order, one crop per record and epoch: a model moves between the loaders."""
    kwargs = {"batch_size": 2, "image_size": 24, "seed": 9, "fields": ("filename",)}
    grain_batches = list(
        imagerecords_grain.dataset(
            dataset.path, "train", training=True, num_epochs=2, num_workers=0, **kwargs
        )
    )
    loader = imagerecords_torch.loader(
        dataset.path, "train", training=True, num_workers=0, **kwargs
    )
    torch_batches = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        torch_batches += list(loader)
    assert len(torch_batches) == len(grain_batches) == 34
    for g, t in zip(grain_batches, torch_batches, strict=True):
        assert [str(n) for n in g["filename"]] == t["filename"]
        assert np.array_equal(g["image"], t["image"].permute(0, 2, 3, 1).numpy())
        assert np.array_equal(g["label"], t["label"].numpy())


def test_resume_at_the_next_batch_from_a_state_dict(dataset):
    def make():
        return _loader(dataset.path, "train", training=True, seed=3, fields=("filename",))

    loader = make()
    loader.set_epoch(1)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(3)]
    state = loader.state_dict()
    assert state == {"epoch": 1, "batch": 3}
    tail = list(iterator)
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # a training loop's own call: the same epoch keeps the place
    assert len(resumed) == len(tail) == 5
    got = list(resumed)
    assert _names(got) == _names(tail) and _same_images(got, tail)
    assert len(set(_names(head + got))) == 32
    # The next pass over that epoch, or the next epoch, is whole again.
    assert len(list(resumed)) == 8
    resumed.set_epoch(2)
    assert len(resumed) == 8
    with pytest.raises(ValueError, match="batch 9 of an epoch of 8 batches"):
        make().load_state_dict({"epoch": 0, "batch": 9})


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_processes_give_the_same_batches_without_warnings(dataset, context):
    """Two epochs: the workers persist from one to the next and still follow set_epoch."""

    def two_epochs(loader):
        batches = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            batches += list(loader)
        return batches

    kwargs = {"training": True, "fields": ("filename",)}
    alone = two_epochs(_loader(dataset.path, "train", **kwargs))
    with warnings.catch_warnings():
        # Forked workers inherit the filter: a warning there fails the batch too.
        warnings.simplefilter("error")
        loader = _loader(
            dataset.path, "train", num_workers=2, multiprocessing_context=context, **kwargs
        )
        assert loader.persistent_workers
        workers = two_epochs(loader)
    assert _names(workers) == _names(alone) and _same_images(workers, alone)
    assert _names(alone[:8]) != _names(alone[8:])


def test_no_non_writable_array_warning_from_the_transforms(dataset):
    """The transforms may return read-only arrays; the batch is a fresh one."""
    record = RecordSource(dataset.path, "train")[0]
    example = transforms.eval_crop(record, 16)
    example["image"].setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = imagerecords_torch.collate([example, example])
    assert batch["image"].shape == (2, 3, 16, 16)


# ------------------------------------------------------------------ decoding on a device


def _full_decode_reference(record, window, flip, size):
    """The reader's way: the whole image decoded, the window resized (half-pixel bilinear)."""
    import cv2

    pixels = simplejpeg.decode_jpeg(record["image"], "RGB")
    y, x, h, w = window
    out = cv2.resize(pixels[y : y + h, x : x + w], (size, size), interpolation=cv2.INTER_LINEAR)
    return out[:, ::-1] if flip else out


def test_device_decode_on_the_cpu_training(dataset):
    source = RecordSource(dataset.path, "train")
    on_device = _loader(dataset.path, "train", training=True, device="cpu", fields=("filename",))
    in_workers = _loader(dataset.path, "train", training=True, fields=("filename",))
    by_name = {r["filename"]: i for i, r in enumerate(source)}
    device_batches, worker_batches = list(on_device), list(in_workers)
    assert _names(device_batches) == _names(worker_batches)
    gaps = []
    for batch, reference in zip(device_batches, worker_batches, strict=True):
        image = batch["image"]
        assert image.shape == (4, 3, 24, 24) and image.dtype == torch.uint8
        assert image.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(batch["label"], reference["label"])
        gaps.append((image.int() - reference["image"].int()).abs().float().mean().item())
    # The same windows and flips: against the whole-image decode they are within rounding.
    order = streams.TrainOrder(len(source), 4, 0, 1, seed=0)
    for k in range(8):
        record = source[order.locate(k).record]
        rng = streams.crop_rng(0, 0, order.locate(k).record)
        window = transforms.random_window(*transforms.jpeg_shape(record["image"]), rng)
        flip = rng.random() < 0.5
        expected = _full_decode_reference(record, window, flip, 24)
        got = device_batches[k // 4]["image"][k % 4].permute(1, 2, 0).numpy()
        assert np.abs(got.astype(int) - expected).max() <= 1
        assert by_name[device_batches[k // 4]["filename"][k % 4]] == order.locate(k).record
    # Against the workers' decode at 1/2, 1/4, 1/8 scale: close on average.
    assert np.mean(gaps) < 3


def test_serialized_records_give_the_same_batches_as_parsed_ones(dataset):
    """Without kept fields the source hands over serialized records, on either path."""
    for device in (None, "cpu"):
        kwargs = {"training": True, "device": device}
        parsed = list(_loader(dataset.path, "train", fields=("filename",), **kwargs))
        serialized = list(_loader(dataset.path, "train", **kwargs))
        assert set(serialized[0]) == {"image", "label"}
        assert _same_images(parsed, serialized)
        assert all(
            torch.equal(a["label"], b["label"]) for a, b in zip(parsed, serialized, strict=True)
        )


@pytest.mark.parametrize("ranks, batch", [(2, 4), (3, 1)])  # (3, 1): an all-padding batch
def test_device_decode_on_the_cpu_evaluation_with_padding(dataset, ranks, batch):
    source = RecordSource(dataset.path, "val")
    records = {record["filename"]: record for record in source}
    kwargs = {"batch_size": batch, "training": False, "world_size": ranks, "fields": ("filename",)}
    seen = []
    for rank in range(ranks):
        got = list(_loader(dataset.path, "val", device="cpu", rank=rank, **kwargs))
        want = list(_loader(dataset.path, "val", rank=rank, **kwargs))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g["mask"], w["mask"]) and g["filename"] == w["filename"]
            assert torch.equal(g["label"], w["label"])
            for name, mask, image in zip(g["filename"], g["mask"], g["image"], strict=True):
                if not mask:
                    assert not image.any()
                    continue
                record = records[name]
                window = transforms.center_window(*transforms.jpeg_shape(record["image"]), 24)
                expected = _full_decode_reference(record, window, False, 24)
                assert np.abs(image.permute(1, 2, 0).numpy().astype(int) - expected).max() <= 1
        seen += got
    # val's 5 records on 3 ranks, batches of 1: rank 0 reads 1 and pads a batch.
    assert any(not b["mask"].any() for b in seen) == (ranks == 3)


# ------------------------------------------------------------------ which rank


def test_rank_given_or_refused_and_the_launcher_warning(monkeypatch, caplog):
    assert imagerecords_torch.rank_and_world(2, 3) == (2, 3)
    with pytest.raises(ValueError, match="give both rank and world_size"):
        imagerecords_torch.rank_and_world(None, 2)
    for name in streams.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level(logging.WARNING, logger="imagerecords.torch"):
        assert imagerecords_torch.rank_and_world(None, None) == (0, 1)
    assert caplog.records == []
    monkeypatch.setenv("WORLD_SIZE", "2")
    with caplog.at_level(logging.WARNING, logger="imagerecords.torch"):
        assert imagerecords_torch.rank_and_world(None, None) == (0, 1)
    assert "WORLD_SIZE=2 says this job has 2 processes" in caplog.text


def test_imports_no_tensorflow(dataset):
    code = textwrap.dedent(
        f"""
        import sys
        from imagerecords import torch as imagerecords_torch
        loader = imagerecords_torch.loader({dataset.path!r}, "val", batch_size=2, image_size=8,
                                           training=False, num_workers=0)
        list(loader)
        print("tensorflow" in sys.modules, "apache_beam" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(trainer_fixtures.REPO)},
    )
    assert out.stdout.split() == ["False", "False"]


# ------------------------------------------------------------------ batches made in one call


def test_a_batch_is_made_in_one_call_as_the_examples_collated(dataset):
    """``TorchBatches``: the records of a batch read and decoded into one tensor, what the
    per-example path and ``collate`` give (the device path's way)."""
    source = streams.open_source(dataset.path, "val", ("filename",))
    order = streams.EvalOrder(len(source), 4, 0, 1)
    padding = streams.padding_values(source, ("filename",))
    make = functools.partial(streams.eval_example, size=24, padding=padding)
    examples = streams.Examples(source, order, make, order.length)
    made = imagerecords_torch.TorchBatches(examples, 24).__getitems__(
        range(4, 8)
    )  # 1 real, 3 padding
    expected = imagerecords_torch.collate(examples.__getitems__(range(4, 8)))
    assert made.keys() == expected.keys()
    assert made["image"].is_contiguous(memory_format=torch.channels_last)
    assert made["filename"] == expected["filename"] and made["filename"][1:] == ["", "", ""]
    for key in ("image", "label", "mask"):
        assert made[key].dtype == expected[key].dtype and torch.equal(made[key], expected[key])


def _report_opencv_threads(folder, worker_id):
    import cv2

    (folder / f"worker-{worker_id}").write_text(str(cv2.getNumThreads()))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_run_one_opencv_thread_unless_forked_and_the_callers_init_too(
    dataset, tmp_path, context
):
    """A spawned worker sets one OpenCV thread; a forked one keeps the main process's
    (resizing the pool it inherits hangs); the caller's ``worker_init_fn`` runs after."""
    import cv2

    loader = _loader(
        dataset.path, "train", training=True, num_workers=2, multiprocessing_context=context,
        worker_init_fn=functools.partial(_report_opencv_threads, tmp_path),
    )  # fmt: skip
    main = cv2.getNumThreads()
    cv2.resize(np.zeros((300, 300, 3), np.uint8), (224, 224))  # the main process's pool runs
    assert len(list(loader)) == 8
    reported = sorted(int(p.read_text()) for p in tmp_path.glob("worker-*"))
    assert reported == ([main, main] if context == "fork" else [1, 1])


@pytest.mark.parametrize(
    "context, forks", [("fork", True), ("spawn", False), ("forkserver", False)]
)
def test_which_workers_are_forked(context, forks):
    import multiprocessing

    assert imagerecords_torch._forks(context) is forks
    assert imagerecords_torch._forks(multiprocessing.get_context(context)) is forks


# ------------------------------------------------------------------ reused image segments


def _segment(batch) -> tuple[int, int]:
    """The shared-memory file a batch's images lie in (what the worker wrote into)."""
    fd, _ = batch["image"].untyped_storage()._share_fd_cpu_()
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def test_a_ring_slot_is_taken_again_only_once_released():
    """A worker's ring: held slots are skipped, every slot held gives a fresh segment
    without a ticket, and a released slot's segment is written again."""
    ring = imagerecords_torch._Ring(slots=2)
    first, ticket = ring.take((1, 2, 2, 3))
    second, other = ring.take((1, 2, 2, 3))
    assert (ticket.slot, other.slot) == (0, 1)
    fresh, none = ring.take((1, 2, 2, 3))
    assert none is None and fresh.data_ptr() not in (first.data_ptr(), second.data_ptr())
    ticket.release()
    again, ticket = ring.take((1, 2, 2, 3))
    assert ticket.slot == 0 and again.data_ptr() == first.data_ptr()


def test_the_main_process_releases_a_slot_once_no_view_of_its_batch_is_left():
    flags = torch.full((2,), imagerecords_torch._HELD, dtype=torch.uint8)
    releases = imagerecords_torch._Releases()
    kept, dropped = torch.zeros(2, 3), torch.zeros(2, 3)
    releases.hold(kept, imagerecords_torch._RingTicket(flags, 0))
    releases.hold(dropped, imagerecords_torch._RingTicket(flags, 1))
    view = kept[1:]  # a view keeps the batch held
    del kept, dropped
    assert releases.sweep() == 1 and flags.tolist() == [imagerecords_torch._HELD, 0]
    del view
    assert releases.sweep() == 0 and flags.tolist() == [0, 0]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_reuse_their_segments_and_never_overwrite_a_held_batch(dataset, context):
    """Three epochs through one worker, each batch dropped once the next one comes, but
    the first held to the end: it keeps its pixels and its segment, and the others
    come from at most ``RING_SLOTS - 1`` segments, each written again."""
    kwargs = {"training": True, "fields": ("filename",)}
    alone = _loader(dataset.path, "train", **kwargs)
    loader = _loader(
        dataset.path, "train", num_workers=1, multiprocessing_context=context, **kwargs
    )
    held, expected, segments, names = None, [], [], []
    for epoch in range(3):
        alone.set_epoch(epoch)
        loader.set_epoch(epoch)
        expected += [batch["image"].clone() for batch in alone]
        for batch in loader:
            segments.append(_segment(batch))
            names += batch["filename"]
            if held is None:
                held, held_pixels = batch, batch["image"].clone()
            else:
                assert torch.equal(batch["image"], expected[len(segments) - 1])
            del batch
    assert len(segments) == 24
    assert torch.equal(held["image"], held_pixels) and torch.equal(held_pixels, expected[0])
    assert segments[0] not in segments[1:]
    assert len(set(segments[1:])) <= 5  # RING_SLOTS - 1, the held batch's slot aside
    assert imagerecords_torch._RING_KEY not in held


# ------------------------------------------------------------------ nothing left behind

# Runs a loop in a Python process of its own (the resource tracker warns as the
# interpreter exits) and prints, as JSON, the pids of the worker processes it
# started: a segment of this loader is named by its maker's pid (torch's
# "torch_<pid>_...", imagerecords' "imagerecords-<owner>-..."), so the names of
# other processes do not count. "docs": the documented PyTorch block of
# docs/trainers.md as written; "raise": the loop body fails; "kill": a worker
# is killed with SIGKILL, and the loader fails. Passes on 55b5400 too: torch
# unlinks each segment's name as it makes it (its file_descriptor strategy).
CLEANUP_LOOP = textwrap.dedent(
    """
    import atexit, json, multiprocessing.process, os, re, signal, sys

    workers = []
    start = multiprocessing.process.BaseProcess.start

    def recorded(self):
        start(self)
        workers.append(self.pid)

    multiprocessing.process.BaseProcess.start = recorded
    atexit.register(lambda: print(json.dumps(workers)))
    how = sys.argv[2]
    if how == "docs":
        text = open(sys.argv[3]).read()
        block = text[text.index("\\n## PyTorch\\n") :]
        code = re.search(r"```python\\n(.*?)```", block, re.S).group(1)
        exec(compile(code.replace('"photos-records"', repr(sys.argv[1])), "block", "exec"),
             {"__name__": "__main__"})
        sys.exit()
    from imagerecords import torch as imagerecords_torch

    loader = imagerecords_torch.loader(
        sys.argv[1], "train", batch_size=4, image_size=24, training=True, num_workers=2
    )
    batches = iter(loader)
    held = [next(batches) for _ in range(3)]
    if how == "raise":
        raise RuntimeError("the loop's own error")
    os.kill(workers[0], signal.SIGKILL)
    try:
        held += list(batches)
    except (RuntimeError, ConnectionError):  # torch's word for it depends on the timing
        pass
    else:
        sys.exit("the loader did not fail")
    """
)


@pytest.mark.parametrize("how, code", [("docs", 0), ("raise", 1), ("kill", 0)])
def test_the_loop_leaves_no_segment_and_no_warning(dataset, tmp_path, how, code):
    script = tmp_path / "loop.py"
    script.write_text(CLEANUP_LOOP)
    docs = os.path.join(trainer_fixtures.REPO, "docs", "trainers.md")
    process = subprocess.Popen(
        [sys.executable, str(script), dataset.path, how, docs],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == code, stderr
    assert "resource_tracker" not in stderr and "leaked" not in stderr, stderr
    workers = json.loads(stdout.splitlines()[-1])
    assert len(workers) >= 2
    prefixes = (imagerecords_grain.segment_prefix(process.pid),) + tuple(
        f"torch_{pid}_" for pid in workers
    )
    shm = os.listdir(imagerecords_grain._SHM_DIR)
    assert [name for name in shm if name.startswith(prefixes)] == []


@pytest.mark.parametrize(
    "argument, value, error",
    [
        ("batch_size", 0, "batch_size=0: must be an integer >= 1"),
        ("batch_size", True, "batch_size=True: must be an integer >= 1"),
        ("image_size", 2.5, "image_size=2.5: must be an integer >= 1"),
        ("seed", -1, "seed=-1: must be an integer >= 0"),
        ("num_workers", -2, "num_workers=-2: must be an integer >= 0"),
        ("training", None, "training=None: must be True or False"),
        ("rank", True, "rank=True: must be an integer >= 0"),
        ("rank", 2, r"rank=2 is not in 0..1 \(world_size=2\)"),
        ("world_size", 0, "world_size=0: must be an integer >= 1"),
    ],
)
def test_bad_arguments_are_refused_by_name_before_the_dataset_is_opened(argument, value, error):
    kwargs = {"batch_size": 4, "image_size": 24, "training": True, "num_workers": 0}
    kwargs.update(rank=0, world_size=2)
    kwargs[argument] = value
    with pytest.raises(ValueError, match=f"^{error}"):
        imagerecords_torch.loader("/no/such/dataset", "train", **kwargs)

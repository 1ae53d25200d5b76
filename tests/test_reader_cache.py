"""reader.make_dataset(cache="decoded"): the same contract as the JPEG path, pixels decoded once."""

from __future__ import annotations

import collections
import logging

import numpy as np
import pytest
import tensorflow as tf

import reader
from reader import dataset as reader_dataset
from tests.shard_fixtures import write_dataset

pytestmark = pytest.mark.e2e

SIZE = 24


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    # Uneven classes; 4 train shards and 1 val shard.
    return write_dataset(tmp_path_factory.mktemp("decoded") / "ds", per_class=(17, 25, 12))


def collect(ds, batches: int | None = None) -> dict[str, np.ndarray]:
    parts = collections.defaultdict(list)
    for batch in ds if batches is None else ds.take(batches):
        for key, value in batch.items():
            parts[key].append(value.numpy())
    return {key: np.concatenate(values) for key, values in parts.items()}


def make(fixture, split="train", batch_size=8, training=False, **kwargs):
    return reader.make_dataset(
        fixture.path, split, batch_size, SIZE, training=training, return_dict=True, **kwargs
    )


@pytest.mark.parametrize("eval_crop", ["center", "resize"])
def test_eval_gives_every_record_once_in_order_with_the_uncached_pixels(fixture, eval_crop):
    plain = collect(make(fixture, eval_crop=eval_crop))
    ds = make(fixture, eval_crop=eval_crop, cache="decoded")
    assert ds.cardinality().numpy() == -(-len(fixture.records["train"]) // 8)
    for _ in range(2):  # the second pass reads the cache
        cached = collect(ds)
        assert [n.decode() for n in cached["filename"]] == fixture.filenames("train")
        np.testing.assert_array_equal(cached["label"], plain["label"])
        np.testing.assert_array_equal(cached["sha256"], plain["sha256"])
        np.testing.assert_array_equal(cached["image"], plain["image"])
        assert cached["image"].dtype == np.float32


def test_eval_pad_to_batch_and_input_context(fixture):
    n = len(fixture.records["train"])
    ds = reader.make_dataset(
        fixture.path,
        "train",
        16,
        SIZE,
        training=False,
        pad_to_batch=True,
        cache="decoded",
        dtype=tf.bfloat16,
        value_range="0_1",
    )
    images_spec, _, _ = ds.element_spec
    assert images_spec.shape.as_list() == [16, SIZE, SIZE, 3] and images_spec.dtype == tf.bfloat16
    batches = [(x.numpy().astype(np.float32), w.numpy()) for x, _, w in ds]
    assert sum(float(w.sum()) for _, w in batches) == n
    images = np.concatenate([x for x, _ in batches])
    assert images.shape[0] == 16 * len(batches)
    assert images.min() >= 0 and images.max() <= 1
    parts = []
    for i in range(2):
        context = tf.distribute.InputContext(2, i, 2)
        ds = make(fixture, batch_size=4, cache="decoded", input_context=context)
        parts.append([name.decode() for name in collect(ds)["filename"]])
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(fixture.filenames("train"))


def test_training_static_shapes_shuffled_epochs_and_augmentation(fixture):
    n = len(fixture.records["train"])
    batch = next(b for b in range(16, 1, -1) if n % b == 0)
    # deterministic: unordered parallel maps may let the next epoch's first images
    # overtake this epoch's last ones, and the checks below need whole epochs.
    ds = make(fixture, batch_size=batch, training=True, cache="decoded", seed=3, deterministic=True)
    assert ds.element_spec["image"].shape.as_list() == [batch, SIZE, SIZE, 3]
    assert ds.element_spec["label"].shape.as_list() == [batch]
    out = collect(ds, 3 * n // batch)
    epochs = [[x.decode() for x in out["filename"][i * n : (i + 1) * n]] for i in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == sorted(fixture.filenames("train"))
    assert epochs[0] != epochs[1] != epochs[2] and epochs[0] != fixture.filenames("train")
    assert out["image"].min() >= 0 and out["image"].max() <= 255
    # Random crops from the cached pixels: a file looks different from epoch to epoch.
    first = dict(zip(epochs[0], out["image"][:n], strict=True))
    second = dict(zip(epochs[1], out["image"][n : 2 * n], strict=True))
    assert sum(not np.allclose(first[k], second[k], atol=1) for k in first) > 0.8 * n
    # Each image still carries its label's colour (crop of the right cached image).
    by_name = {r.filename: r for r in fixture.records["train"]}
    for name, image in first.items():
        mean = np.median(image.reshape(-1, 3), axis=0)
        colours = np.array([by_name[name].colour])
        assert np.abs(mean - colours).max() < 40, (name, mean, colours)


def test_training_is_deterministic_with_a_seed(fixture):
    def batches(seed):
        ds = reader.make_dataset(
            fixture.path,
            "train",
            8,
            SIZE,
            training=True,
            seed=seed,
            deterministic=True,
            cache="decoded",
        )
        return [(x.numpy(), y.numpy()) for x, y in ds.take(12)]  # > 1 epoch (54 records)

    a, b, other = batches(7), batches(7), batches(8)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert any(not np.array_equal(xa, xo) for (xa, _), (xo, _) in zip(a, other, strict=True))


def test_training_without_augmentation_is_the_eval_transform(fixture):
    n = len(fixture.records["train"])
    plain = collect(make(fixture))
    off = collect(
        make(
            fixture,
            batch_size=1,
            training=True,
            cache="decoded",
            random_crop=False,
            horizontal_flip=False,
        ),
        n,
    )
    expected = dict(zip(plain["filename"], plain["image"], strict=True))
    for name, image in zip(off["filename"], off["image"], strict=True):
        np.testing.assert_array_equal(image, expected[name])


def test_memory_estimate_and_warning(fixture, monkeypatch, caplog):
    info = reader.load_info(fixture.path)
    n = info.num_examples("train")
    # The fixture stores resize="none": the estimate falls back to the shard bytes.
    estimate, how = reader_dataset.decoded_cache_bytes(info, "train")
    assert estimate == int(10 * info.split("train").num_bytes) and "JPEG bytes" in how
    shorter = info.raw | {"image": {"resize": "shorter", "size": 256}}
    shorter_info = reader.load_info(_write_info(fixture, shorter))
    assert reader_dataset.decoded_cache_bytes(shorter_info, "train")[0] == n * 256 * 384 * 3

    monkeypatch.setattr(reader_dataset, "_physical_memory_bytes", lambda: 1 << 40)
    with caplog.at_level(logging.WARNING, logger="reader.dataset"):
        make(fixture, cache="decoded")
    assert not [r for r in caplog.records if "cache='decoded'" in r.getMessage()]
    # A machine with less RAM than twice the estimate: warned, and told what to do.
    monkeypatch.setattr(reader_dataset, "_physical_memory_bytes", lambda: estimate)
    with caplog.at_level(logging.WARNING, logger="reader.dataset"):
        ds = make(fixture, cache="decoded")
    warnings = [r.getMessage() for r in caplog.records if "cache='decoded'" in r.getMessage()]
    assert len(warnings) == 1 and "more than half" in warnings[0] and "cache=None" in warnings[0]
    assert ds.cardinality().numpy() > 0  # a warning, not a refusal


def _write_info(fixture, info: dict) -> str:
    """A copy of the fixture's imagerecords.json with other fields (shards stay where they are)."""
    import json
    import os

    folder = os.path.join(os.path.dirname(fixture.path), "shorter")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "imagerecords.json"), "w", encoding="utf-8") as f:
        json.dump(info, f)
    return folder

"""reader.make_dataset in evaluation mode: exactness, order, shapes, dtypes, ranges, padding."""

from __future__ import annotations

import collections
import json
import logging
import re

import numpy as np
import pytest
import tensorflow as tf

import reader
from reader.decode import IMAGENET_MEAN, IMAGENET_STD
from tests.shard_fixtures import write_dataset

pytestmark = pytest.mark.e2e

SIZE = 24


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    # Uneven classes, 4 train shards (by-file sharding) and 1 val shard (the fallback).
    return write_dataset(tmp_path_factory.mktemp("eval") / "ds", per_class=(17, 25, 12))


def collect(ds) -> dict[str, np.ndarray]:
    """Concatenates every batch of a dict-valued dataset."""
    parts = collections.defaultdict(list)
    for batch in ds:
        for key, value in batch.items():
            parts[key].append(value.numpy())
    return {key: np.concatenate(values) for key, values in parts.items()}


def eval_dataset(fixture, split="train", batch_size=8, **kwargs):
    return reader.make_dataset(
        fixture.path, split, batch_size, SIZE, training=False, return_dict=True, **kwargs
    )


@pytest.mark.parametrize("split", ["train", "val"])
def test_every_record_once_in_shard_order(fixture, split):
    info = reader.load_info(fixture.path)
    out = collect(eval_dataset(fixture, split))
    assert len(out["label"]) == info.num_examples(split)
    names = [n.decode() for n in out["filename"]]
    # Shard order: exactly the fixture's on-disk order, which is the seeded permutation.
    assert names == fixture.filenames(split)
    assert [s.decode() for s in out["sha256"]] == [r.sha256 for r in fixture.records[split]]
    histogram = collections.Counter(info.classes[label] for label in out["label"])
    assert histogram == collections.Counter(info.class_counts(split))
    assert list(out["label"]) == [r.label for r in fixture.records[split]]


@pytest.mark.parametrize("eval_crop", ["center", "resize"])
def test_pixels_belong_to_their_label(fixture, eval_crop):
    """Each decoded image still has its own class colour: batched parse + decode kept pairs."""
    out = collect(eval_dataset(fixture, "val", eval_crop=eval_crop))
    by_name = {r.filename: r for r in fixture.records["val"]}
    for image, name in zip(out["image"], out["filename"], strict=True):
        assert image.shape == (SIZE, SIZE, 3)
        expected = np.array(by_name[name.decode()].colour, np.float32)
        # Median: the fixture's random patch covers <= 4 % of each image.
        assert np.abs(np.median(image.reshape(-1, 3), axis=0) - expected).max() < 12


def test_static_shapes_only_when_the_remainder_is_dropped(fixture):
    info = reader.load_info(fixture.path)
    n = info.num_examples("train")
    batch = next(b for b in range(5, 12) if n % b)
    default = reader.make_dataset(fixture.path, "train", batch, SIZE, training=False)
    assert default.element_spec[0].shape.as_list() == [None, SIZE, SIZE, 3]
    assert sum(int(x.shape[0]) for x, _ in default) == n
    dropped = reader.make_dataset(
        fixture.path, "train", batch, SIZE, training=False, drop_remainder=True
    )
    assert dropped.element_spec[0].shape.as_list() == [batch, SIZE, SIZE, 3]
    assert dropped.element_spec[1].shape.as_list() == [batch]
    assert sum(1 for _ in dropped) == info.steps_per_epoch("train", batch) == n // batch


def test_pad_to_batch_keeps_every_example_with_a_weight(fixture):
    info = reader.load_info(fixture.path)
    n = info.num_examples("train")
    batch = next(b for b in range(5, 12) if n % b)
    ds = reader.make_dataset(fixture.path, "train", batch, SIZE, training=False, pad_to_batch=True)
    images_spec, labels_spec, weight_spec = ds.element_spec
    assert images_spec.shape.as_list() == [batch, SIZE, SIZE, 3]
    assert labels_spec.shape.as_list() == [batch]
    assert weight_spec.shape.as_list() == [batch] and weight_spec.dtype == tf.float32
    weights = np.stack([w.numpy() for _, _, w in ds])
    assert len(weights) == info.steps_per_epoch("train", batch, drop_remainder=False)
    assert weights.sum() == n
    assert list(weights[-1]) == [1.0] * (n % batch) + [0.0] * (batch - n % batch)
    assert (weights[:-1] == 1).all()
    # In dict mode the padded rows are visible too: empty filenames, weight 0.
    out = collect(eval_dataset(fixture, "train", batch, pad_to_batch=True))
    real = out["weight"] == 1
    assert [x.decode() for x in out["filename"][real]] == fixture.filenames("train")
    assert (out["filename"][~real] == b"").all()


def test_pad_to_batch_refuses_contradictions(fixture):
    with pytest.raises(ValueError, match="drop_remainder"):
        reader.make_dataset(
            fixture.path, "val", 4, SIZE, False, pad_to_batch=True, drop_remainder=True
        )
    with pytest.raises(ValueError, match="repeat=False"):
        reader.make_dataset(fixture.path, "val", 4, SIZE, False, pad_to_batch=True, repeat=True)


def _first_batch(fixture, **kwargs):
    ds = reader.make_dataset(fixture.path, "val", 8, SIZE, training=False, **kwargs)
    return next(iter(ds))


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_value_ranges_and_dtypes(fixture, dtype):
    raw, labels = _first_batch(fixture, dtype=dtype, drop_remainder=True)
    assert raw.dtype == dtype and labels.dtype == tf.int32
    assert raw.shape == (8, SIZE, SIZE, 3)
    raw = tf.cast(raw, tf.float32).numpy()
    assert raw.min() >= 0 and raw.max() <= 255 and raw.max() > 200  # 0..255, not 0..1
    unit, _ = _first_batch(fixture, dtype=dtype, value_range="0_1")
    unit = tf.cast(unit, tf.float32).numpy()
    assert unit.min() >= 0 and unit.max() <= 1 and unit.max() > 0.75
    normed, _ = _first_batch(fixture, dtype=dtype, value_range="imagenet")
    normed = tf.cast(normed, tf.float32).numpy()
    mean, std = np.array(IMAGENET_MEAN), np.array(IMAGENET_STD)
    # bfloat16 keeps 8 bits of mantissa: compare with a relative tolerance.
    tolerance = 1e-5 if dtype == tf.float32 else 2e-2
    np.testing.assert_allclose(normed, (raw / 255 - mean) / std, rtol=tolerance, atol=tolerance)
    assert normed.min() < -1 and normed.max() > 1


def test_one_hot_labels(fixture):
    _, sparse = _first_batch(fixture)
    _, one_hot = _first_batch(fixture, one_hot=True)
    assert one_hot.shape == (8, 3) and one_hot.dtype == tf.float32
    assert (one_hot.numpy().sum(axis=1) == 1).all()
    assert (one_hot.numpy().argmax(axis=1) == sparse.numpy()).all()


def test_unknown_option_values_are_refused(fixture):
    with pytest.raises(ValueError, match="value_range"):
        _first_batch(fixture, value_range="-1_1")
    with pytest.raises(ValueError, match="eval_crop"):
        _first_batch(fixture, eval_crop="middle")
    with pytest.raises(ValueError, match="dtype"):
        _first_batch(fixture, dtype=tf.int32)
    with pytest.raises(TypeError, match="shuffle_bufer_size"):
        _first_batch(fixture, shuffle_bufer_size=10)


def _names(ds) -> list[str]:
    return [n.decode() for n in collect(ds)["filename"]]


def test_two_input_pipelines_split_the_files(fixture, caplog):
    contexts = [tf.distribute.InputContext(2, i, 2) for i in range(2)]
    with caplog.at_level(logging.WARNING):
        parts = [_names(eval_dataset(fixture, "train", input_context=c)) for c in contexts]
    assert not [r for r in caplog.records if "sharding by record" in r.getMessage()]
    assert parts[0] and parts[1]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(fixture.filenames("train"))


def test_fewer_files_than_pipelines_shards_by_record(fixture, caplog):
    assert len(reader.load_info(fixture.path).files("val")) == 1
    contexts = [tf.distribute.InputContext(2, i, 2) for i in range(2)]
    with caplog.at_level(logging.WARNING):
        parts = [_names(eval_dataset(fixture, "val", 4, input_context=c)) for c in contexts]
    warnings = [r for r in caplog.records if "sharding by record" in r.getMessage()]
    assert len(warnings) == 2 and warnings[0].levelno == logging.WARNING
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(fixture.filenames("val"))
    assert abs(len(parts[0]) - len(parts[1])) <= 1


def test_cache_in_memory_and_on_disk(fixture, tmp_path):
    expected = fixture.filenames("val")
    memory = eval_dataset(fixture, "val", cache="memory")
    assert _names(memory) == expected and _names(memory) == expected
    prefix = str(tmp_path / "cache" / "val")
    (tmp_path / "cache").mkdir()
    on_disk = eval_dataset(fixture, "val", cache=prefix)
    assert _names(on_disk) == expected
    assert any(p.name.startswith("val") for p in (tmp_path / "cache").iterdir())
    assert _names(on_disk) == expected  # second pass: from the cache files


def test_eval_length_is_known_and_checked(fixture, tmp_path):
    info = reader.load_info(fixture.path)
    ds = reader.make_dataset(fixture.path, "train", 8, SIZE, training=False)
    assert int(ds.cardinality()) == info.steps_per_epoch("train", 8, drop_remainder=False)
    for i in range(2):
        part = reader.make_dataset(
            fixture.path,
            "train",
            8,
            SIZE,
            training=False,
            input_context=tf.distribute.InputContext(2, i, 2),
        )
        records = sum(s.num_examples for s in info.split("train").shards[i::2])
        assert int(part.cardinality()) == -(-records // 8)
    # imagerecords.json promising more records than the shards hold: reading fails
    # loudly, naming the shard (tests/test_reader_counts.py has the other cases).
    broken = write_dataset(tmp_path / "ds", per_class=4)
    raw = dict(broken.info)
    raw["splits"]["val"]["num_examples"] += 8
    shard = raw["splits"]["val"]["shards"][0]
    shard["num_examples"] += 8
    (tmp_path / "ds" / "imagerecords.json").write_text(json.dumps(raw))
    message = (
        f"{tmp_path / 'ds' / shard['file']}: reading stopped after {shard['num_examples'] - 8} "
        f"of the {shard['num_examples']} records imagerecords.json lists"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(message)):
        for _ in reader.make_dataset(broken.path, "val", 4, SIZE, training=False):
            pass

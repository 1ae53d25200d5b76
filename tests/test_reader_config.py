"""reader's frozen configs: AugmentConfig checks its values; make_dataset takes keywords or a config."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import reader
from tests.shard_fixtures import write_dataset


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("config") / "ds", per_class=8)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("crop_area_range", (0.0, 1.0), "0 < low <= high <= 1"),
        ("crop_area_range", (0.5, 0.2), "0 < low <= high <= 1"),
        ("crop_area_range", (0.5, 1.5), "0 < low <= high <= 1"),
        ("crop_area_range", 0.5, "pair of numbers"),
        ("crop_area_range", (0.1, 0.5, 0.9), "pair of numbers"),
        ("crop_aspect_ratio_range", (-1.0, 2.0), "0 < low <= high"),
        ("crop_aspect_ratio_range", (2.0, 1.0), "0 < low <= high"),
        ("eval_crop", "middle", "eval_crop must be one of"),
        ("center_crop_fraction", 0.0, r"center_crop_fraction must be in \(0, 1\]"),
        ("center_crop_fraction", 1.2, r"center_crop_fraction must be in \(0, 1\]"),
        ("resize_method", "linear", "resize_method must be one of"),
    ],
)
def test_augment_config_refuses_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        reader.AugmentConfig(**{field: value})


@pytest.mark.parametrize(
    "field, value, stored",
    [
        ("crop_area_range", [0.25, 1], (0.25, 1.0)),
        ("crop_area_range", (1, 1), (1.0, 1.0)),
        ("crop_aspect_ratio_range", np.array([0.5, 2.0]), (0.5, 2.0)),
        ("center_crop_fraction", 1.0, 1.0),
        ("resize_method", tf.image.ResizeMethod.AREA, "area"),
    ],
)
def test_augment_config_keeps_good_values_as_hashable_ones(field, value, stored):
    config = reader.AugmentConfig(**{field: value})
    assert getattr(config, field) == stored
    hash(config)  # frozen and hashable: a config can key a cache


def test_reader_config_checks_its_values_when_built_directly():
    with pytest.raises(ValueError, match="value_range"):
        reader.ReaderConfig("train", 8, 32, True, value_range="-1_1")
    with pytest.raises(TypeError, match="AugmentConfig"):
        reader.ReaderConfig("train", 8, 32, True, augment={"random_crop": False})


def _images(ds, batches=2):
    return [np.asarray(batch[0]) for batch in ds.take(batches)]


@pytest.mark.e2e
def test_config_gives_the_keywords_batches(fixture):
    keywords = dict(seed=5, deterministic=True, random_crop=False, center_crop_fraction=0.5)
    by_keywords = reader.make_dataset(fixture.path, "train", 8, 32, True, **keywords)
    config = reader.ReaderConfig(
        split="train",
        batch_size=8,
        image_size=32,
        training=True,
        seed=5,
        deterministic=True,
        augment=reader.AugmentConfig(random_crop=False, center_crop_fraction=0.5),
    )
    by_config = reader.make_dataset(fixture.path, config=config)
    for a, b in zip(_images(by_keywords), _images(by_config), strict=True):
        np.testing.assert_array_equal(a, b)
    # The augmentation settings did reach the pipeline: other settings, other pixels.
    other = reader.make_dataset(
        fixture.path, config=dataclasses.replace(config, augment=reader.AugmentConfig())
    )
    assert not np.array_equal(_images(other, 1)[0], _images(by_config, 1)[0])


def test_config_and_keywords_together_are_refused(fixture):
    config = reader.ReaderConfig("train", 8, 32, True)
    with pytest.raises(ValueError, match="either config=ReaderConfig.* or keywords.*batch_size"):
        reader.make_dataset(fixture.path, batch_size=16, config=config)
    with pytest.raises(ValueError, match="not both; got config and horizontal_flip"):
        reader.make_dataset(fixture.path, config=config, horizontal_flip=False)
    with pytest.raises(TypeError, match="ReaderConfig"):
        reader.make_dataset(fixture.path, config={"split": "train"})


def test_keywords_need_the_four_required_ones(fixture):
    with pytest.raises(TypeError, match="needs batch_size, training"):
        reader.make_dataset(fixture.path, "train", image_size=32)


def test_augment_and_its_fields_together_are_refused(fixture):
    with pytest.raises(ValueError, match="augment=AugmentConfig.* or random_crop"):
        reader.make_dataset(
            fixture.path,
            "train",
            8,
            32,
            True,
            augment=reader.AugmentConfig(),
            random_crop=False,
        )
    with pytest.raises(ValueError, match="crop_area_range"):
        reader.make_dataset(fixture.path, "train", 8, 32, True, crop_area_range=(0.5, 0.1))

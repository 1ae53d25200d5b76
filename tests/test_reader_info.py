"""reader.load_info: imagerecords.json -> typed object, and its refusals."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
import tensorflow as tf

import imagerecords
import reader
from reader.info import StoredImage
from tests.shard_fixtures import write_dataset


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("info") / "ds", per_class=(13, 21, 8))


def test_parses_classes_counts_and_shards(fixture):
    info = reader.load_info(fixture.path)
    written = fixture.info
    assert info.classes == tuple(written["classes"])
    assert info.num_classes == len(written["classes"])
    assert info.format_version == 3
    assert info.raw["created_by"] == written["created_by"]
    assert info.seed == written["seed"]
    assert info.image == StoredImage(
        resize=written["image"]["resize"],
        size=written["image"]["size"],
        jpeg_quality=written["image"]["jpeg_quality"],
    )
    assert info.split_names == tuple(written["splits"])
    for split, raw in written["splits"].items():
        assert info.num_examples(split) == raw["num_examples"] == len(fixture.records[split])
        assert dict(info.class_counts(split)) == raw["class_counts"]
        # Full paths, in shard order, that exist.
        files = info.files(split)
        assert [os.path.basename(f) for f in files] == [s["file"] for s in raw["shards"]]
        assert all(os.path.exists(f) for f in files)
        assert [s.num_examples for s in info.split(split).shards] == [
            s["num_examples"] for s in raw["shards"]
        ]


def test_steps_per_epoch_rounds_down_or_up(fixture):
    info = reader.load_info(fixture.path)
    n = info.num_examples("train")
    # A batch size that does not divide n, so floor and ceil differ.
    batch = next(b for b in range(5, n) if n % b)
    assert info.steps_per_epoch("train", batch) == n // batch
    assert info.steps_per_epoch("train", batch, drop_remainder=False) == math.ceil(n / batch)
    assert info.steps_per_epoch("train", n) == 1
    with pytest.raises(ValueError, match="batch_size"):
        info.steps_per_epoch("train", 0)


def test_accepts_the_json_file_itself(fixture):
    by_file = reader.load_info(os.path.join(fixture.path, "imagerecords.json"))
    assert by_file.files("train") == reader.load_info(fixture.path).files("train")


def test_is_frozen(fixture):
    info = reader.load_info(fixture.path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.classes = ("x",)
    with pytest.raises(TypeError):
        info.splits["train"].class_counts["cat"] = 0


def test_missing_info_says_conversion_unfinished(tmp_path):
    write_dataset(tmp_path / "partial", per_class=3, write_info=False)
    with pytest.raises(reader.IncompleteDatasetError, match="unfinished") as err:
        reader.load_info(tmp_path / "partial")
    assert "imagerecords.json" in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(reader.IncompleteDatasetError, match="no imagerecords.json"):
        reader.load_info(tmp_path / "empty")
    with pytest.raises(reader.IncompleteDatasetError, match="does not exist"):
        reader.load_info(tmp_path / "nowhere")


def test_unknown_format_version_is_refused(tmp_path):
    write_dataset(tmp_path / "v4", per_class=3, format_version=4)
    with pytest.raises(reader.DatasetInfoError, match="format_version 4 is not supported"):
        reader.load_info(tmp_path / "v4")


def test_malformed_info_is_refused(tmp_path):
    fx = write_dataset(tmp_path / "ds", per_class=3)
    info_file = tmp_path / "ds" / "imagerecords.json"
    info_file.write_text("{not json")
    with pytest.raises(reader.DatasetInfoError, match="not valid JSON"):
        reader.load_info(fx.path)
    bad = json.loads(json.dumps(fx.info))
    bad["splits"]["train"]["num_examples"] += 1
    info_file.write_text(json.dumps(bad))
    with pytest.raises(reader.DatasetInfoError, match="shards hold"):
        reader.load_info(fx.path)


def test_unknown_split_lists_the_splits(fixture):
    info = reader.load_info(fixture.path)
    with pytest.raises(reader.UnknownSplitError, match="its splits are: train, val") as err:
        info.num_examples("test")
    assert isinstance(err.value, KeyError)
    with pytest.raises(reader.UnknownSplitError, match="'validation'.*train, val"):
        reader.make_dataset(fixture.path, "validation", 4, 16, training=False)


@pytest.mark.e2e
def test_reads_through_tf_gfile(fixture):
    """A non-local filesystem (TF's in-memory ram://) works like gs:// would: no open()."""
    root = "ram://imagerecords-test/ds"
    tf.io.gfile.makedirs(root)
    for name in os.listdir(fixture.path):
        tf.io.gfile.copy(os.path.join(fixture.path, name), f"{root}/{name}", overwrite=True)
    info = reader.load_info(root)
    assert info.files("val")[0].startswith("ram://")
    ds = reader.make_dataset(root, "val", 4, 16, training=False, return_dict=True)
    names = [n.decode() for batch in ds for n in batch["filename"].numpy()]
    assert names == fixture.filenames("val")


def test_public_names_are_the_front_door():
    """`import reader` offers the user's names; the rest lives in its module."""
    assert sorted(reader.__all__) == [
        "AugmentConfig",
        "DatasetInfo",
        "DatasetInfoError",
        "IncompleteDatasetError",
        "ReaderConfig",
        "UnknownSplitError",
        "distributed_dataset",
        "load_info",
        "make_dataset",
    ]
    # A name both packages offer is one class (imagerecords'), so catching either works.
    shared = {"UnknownSplitError"}
    for name in set(reader.__all__) - shared:
        assert getattr(reader, name).__module__.startswith("reader.")
    for name in shared:
        assert getattr(reader, name) is getattr(imagerecords, name)
    # The beam_pipeline's ImageSpec (converter settings) has no namesake here.
    assert not hasattr(reader, "ImageSpec")
    assert not hasattr(reader.info, "ImageSpec")


V1_DATASET = os.path.join(os.path.dirname(__file__), "data", "v1_dataset")


@pytest.mark.e2e
def test_a_format_version_1_dataset_still_reads():
    """tests/data/v1_dataset: written before the metadata moved to imagerecords.json."""
    info = reader.load_info(V1_DATASET)
    assert info.format_version == 1
    assert info.classes == ("cat", "dog", "fish")
    assert sum(info.num_examples(s) for s in info.split_names) == 12
    ds = reader.make_dataset(V1_DATASET, "train", batch_size=3, image_size=16, training=False)
    labels = [int(label) for _, batch in ds for label in batch.numpy()]
    assert len(labels) == info.num_examples("train")


def test_tfds_dataset_info_beside_ours_is_not_taken_for_ours(tmp_path):
    """In format_version 2, dataset_info.json is TFDS's (no format_version): not ours."""
    (tmp_path / "dataset_info.json").write_text('{"name": "x", "fileFormat": "tfrecord"}')
    with pytest.raises(reader.IncompleteDatasetError, match="no imagerecords.json"):
        reader.load_info(str(tmp_path))

"""beam_pipeline.core.tfds_metadata: TFDS's own metadata files make the shards a TFDS dataset.

The files are written next to a dataset the real CLI converted, and the real
``tensorflow_datasets`` reads it with ``builder_from_directory``: split
slicing, ``even_splits``, labels, file names and decoded images are checked
against the converter's records. The converter writes these files itself
(format_version 2), beside its own ``imagerecords.json``: nothing is added
after the conversion.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from beam_pipeline.core import keys, metadata, tfds_metadata
from imagerecords import RecordSource
from tests.image_factory import make_class_folders

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
CLASSES = ("ant", "bee", "cow", "doe")


def _convert(root: Path, out: Path, *extra: str) -> dict:
    subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "--input", str(root), "--output", str(out)]
        + ["--min_shards", "3", "--quiet", *extra],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    return json.loads((out / metadata.INFO_FILE).read_text())


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    base = tmp_path_factory.mktemp("tfds")
    root = base / "images"
    ids = make_class_folders(str(root), classes=CLASSES, per_class=12)
    out = base / "out"
    info = _convert(
        root,
        out,
        "--splits",
        "train=0.7,val=0.3",
        "--tfds_name",
        "photos",
        "--tfds_version",
        "2.1.0",
    )
    return types.SimpleNamespace(root=root, ids=ids, out=out, info=info)


def _tfds():
    return pytest.importorskip("tensorflow_datasets")


def _rows(ds) -> list[dict]:
    rows = []
    for example in ds.as_numpy_iterator():
        image = example["image"]
        rows.append(
            {
                "filename": image["filename"].decode(),
                "label": int(image["class"]["label"]),
                "class_name": image["class"]["text"].decode(),
                "shape": image["encoded"].shape,
                "size": (int(image["height"]), int(image["width"]), int(image["channels"])),
            }
        )
    return rows


def test_builder_from_directory_reads_every_split_as_written(dataset):
    tfds = _tfds()
    builder = tfds.builder_from_directory(str(dataset.out))
    assert builder.info.name == "photos" and str(builder.info.version) == "2.1.0"
    label = builder.info.features["image"]["class"]["label"]
    assert label.names == list(CLASSES)
    seen = []
    for split, entry in dataset.info["splits"].items():
        assert builder.info.splits[split].num_examples == entry["num_examples"]
        rows = _rows(builder.as_dataset(split=split))
        source = RecordSource(str(dataset.out), split)
        # Shards in order, records in order: the converter's permutation.
        assert [r["filename"] for r in rows] == [r["filename"] for r in source]
        for row in rows:
            assert row["label"] == CLASSES.index(row["filename"].split("/")[0])
            assert row["class_name"] == CLASSES[row["label"]]
            assert row["shape"] == row["size"]  # the JPEG decodes to its recorded size
        seen += [r["filename"] for r in rows]
    assert sorted(seen) == sorted(dataset.ids)


def test_split_slicing_and_even_splits(dataset):
    tfds = _tfds()
    builder = tfds.builder_from_directory(str(dataset.out))
    everything = [r["filename"] for r in _rows(builder.as_dataset(split="train"))]
    tenth = [r["filename"] for r in _rows(builder.as_dataset(split="train[:10%]"))]
    assert 0 < len(tenth) == builder.info.splits["train[:10%]"].num_examples < len(everything)
    assert tenth == everything[: len(tenth)]
    parts = [
        [r["filename"] for r in _rows(builder.as_dataset(split=part))]
        for part in tfds.even_splits("train", n=3)
    ]
    assert sorted(sum(parts, [])) == sorted(everything)  # each record in exactly one part
    assert all(parts)


def test_images_decode_with_static_shape_for_crop(tmp_path):
    tfds = _tfds()
    root = tmp_path / "images"
    make_class_folders(str(root), classes=CLASSES[:2], per_class=5)
    out = tmp_path / "out"
    _convert(root, out, "--resize", "crop", "--image_size", "40")
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.name == tfds_metadata.DEFAULT_NAME
    ds = builder.as_dataset(split="train")
    assert ds.element_spec["image"]["encoded"].shape == (40, 40, 3)
    assert all(r["shape"] == (40, 40, 3) for r in _rows(ds))


def test_files_are_deterministic_and_describe_the_record_keys(dataset):
    first = tfds_metadata.tfds_files(dataset.info, name="photos", version="2.1.0")
    assert first == tfds_metadata.tfds_files(dataset.info, name="photos", version="2.1.0")
    assert set(first) == {"dataset_info.json", "features.json", "image-class-label.labels.txt"}
    assert first["image-class-label.labels.txt"].decode().splitlines() == list(CLASSES)
    for name, data in first.items():  # what the converter wrote beside imagerecords.json
        assert (dataset.out / name).read_bytes() == data
    info = json.loads(first["dataset_info.json"])
    assert info["fileFormat"] == "tfrecord"
    for split in info["splits"]:
        shards = split["shardLengths"]
        template = split["filepathTemplate"]
        for index in range(len(shards)):
            # What TFDS substitutes into the template is this project's shard name.
            name = template.format(
                SPLIT=split["name"],
                SHARD_X_OF_Y=f"{index:05d}-of-{len(shards):05d}",
                FILEFORMAT="tfrecord",
            )
            assert name == keys.shard_filename(split["name"], index, len(shards))


def test_empty_split_left_out_and_bad_names_refused(dataset):
    info = json.loads(json.dumps(dataset.info))
    info["splits"]["test"] = {"num_examples": 0, "num_bytes": 0, "class_counts": {}, "shards": []}
    names = [s["name"] for s in tfds_metadata.dataset_info(info, "x", "1.0.0")["splits"]]
    assert names == ["train", "val"]
    with pytest.raises(ValueError, match="TFDS dataset name 'My Data'"):
        tfds_metadata.tfds_files(info, name="My Data")
    with pytest.raises(ValueError, match="use MAJOR.MINOR.PATCH"):
        tfds_metadata.tfds_files(info, version="1.0")
    info["splits"]["train"]["shards"][0]["file"] = "train-0.tfrecord"
    with pytest.raises(ValueError, match="should be named 'train-00000-of-00003.tfrecord'"):
        tfds_metadata.tfds_files(info)


def test_module_imports_neither_tensorflow_tfds_nor_beam():
    code = (
        "import sys\n"
        "import beam_pipeline.core.tfds_metadata\n"
        "print(sorted(m for m in ('tensorflow', 'tensorflow_datasets', 'apache_beam')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"


# Runs in a subprocess whose TensorFlow reaches the emulator (tests.gcs_fixtures).
READ_GCS = r"""
import json, sys
import tensorflow_datasets as tfds
builder = tfds.builder_from_directory(sys.argv[1])
rows = {}
for split in ("train", "train[:10%]"):
    rows[split] = [
        (ex["image"]["filename"].decode(), int(ex["image"]["class"]["label"]),
         list(ex["image"]["encoded"].shape))
        for ex in builder.as_dataset(split=split).as_numpy_iterator()
    ]
print("RESULT " + json.dumps(rows))
"""


@pytest.mark.e2e
def test_builder_from_directory_on_gcs(dataset, gcs_emulator, tf_gcs_env):
    _tfds()
    bucket = gcs_emulator.create_bucket()
    url = f"gs://{bucket}/photos"
    gcs_emulator.upload_dir(dataset.out, url)
    done = subprocess.run(
        [sys.executable, "-c", READ_GCS, url],
        env=tf_gcs_env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    rows = json.loads(line[len("RESULT ") :])
    local = RecordSource(str(dataset.out), "train")
    assert [r[0] for r in rows["train"]] == [r["filename"] for r in local]
    assert [r[1] for r in rows["train"]] == [r["label"] for r in local]
    assert all(shape[2] == 3 for _, _, shape in rows["train"])
    assert 0 < len(rows["train[:10%]"]) < len(rows["train"])


def test_the_split_names_the_converter_refuses_are_the_ones_tfds_reserves():
    tfds = _tfds()
    assert keys.TFDS_RESERVED_SPLITS == (str(tfds.Split.ALL),)
    assert keys.split_name_problem(str(tfds.Split.ALL)) is not None

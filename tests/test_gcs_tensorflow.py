"""TensorFlow's own ``gs://`` filesystem and the reader, against the emulator.

TensorFlow talks to hard-coded googleapis.com endpoints, so a subprocess runs
with ``https_proxy`` pointing at :mod:`tests.gcs_proxy` (TLS with a throwaway
CA) which forwards to the emulator: the same C++ GCS client, libcurl and JSON
API requests as on a TPU VM, no mocks. One subprocess does all the reading
(TensorFlow takes seconds to import) and reports what it saw as JSON.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core import tfds_metadata
from imagerecords import codec
from tests.image_factory import make_class_folders
from tests.shard_fixtures import write_dataset

pytestmark = pytest.mark.e2e

# Fixtures used by name in this module (an import would read as unused to linters).

# Runs in the subprocess: argv[1] is the fixture dataset's URL, argv[2] an
# unfinished one, argv[3] the converter's output.
READ_EVERYTHING = r"""
import json, sys
import tensorflow as tf
import reader
from reader.info import IncompleteDatasetError

url, unfinished, converted = sys.argv[1:4]
out = {}
gfile = tf.io.gfile
out["exists"] = [gfile.exists(url + "/imagerecords.json"), gfile.exists(url + "/nope.json")]
out["isdir"] = gfile.isdir(url)
out["listdir"] = sorted(gfile.listdir(url))
out["glob"] = sorted(gfile.glob(url + "/train-*.tfrecord"))
out["size"] = gfile.stat(url + "/imagerecords.json").length
with gfile.GFile(url + "/imagerecords.json") as f:
    info = json.load(f)

# Every shard with TFRecordDataset, in the order imagerecords.json lists them.
out["tfrecord"] = {}
for split, entry in info["splits"].items():
    files = [url + "/" + s["file"] for s in entry["shards"]]
    names = []
    for batch in tf.data.TFRecordDataset(files).batch(16):
        parsed = tf.io.parse_example(batch, {"image/filename": tf.io.FixedLenFeature([], tf.string)})
        names += [n.decode() for n in parsed["image/filename"].numpy()]
    out["tfrecord"][split] = names

# The reader: evaluation mode reads every record once, in order.
def read_eval(url):
    loaded = reader.load_info(url)
    seen = {}
    for split in loaded.split_names:
        names, labels = [], []
        ds = reader.make_dataset(url, split, batch_size=8, image_size=32, training=False,
                                 return_dict=True)
        for batch in ds:
            assert batch["image"].shape[1:] == (32, 32, 3)
            names += [n.decode() for n in batch["filename"].numpy()]
            labels += [int(x) for x in batch["label"].numpy()]
        seen[split] = {"num_examples": loaded.num_examples(split), "filenames": names,
                       "labels": labels}
    return seen

out["eval"] = read_eval(url)
out["converted_eval"] = read_eval(converted)

# Training mode: parallel interleave over the shards, so concurrent tunnels.
train = reader.make_dataset(url, "train", batch_size=8, image_size=32, training=True, seed=1)
out["train_batches"] = [list(images.shape) for images, _ in train.take(3)]
# One shard per pipeline (the converter's small output): read by the interleave's
# own thread on gs://, not on the consumer's.
one = reader.make_dataset(converted, "train", batch_size=4, image_size=32, training=True, seed=1)
out["one_shard_train"] = {
    "shards": len(reader.load_info(converted).files("train")),
    "batches": [list(images.shape) for images, _ in one.take(4)],
}

try:
    reader.load_info(unfinished)
    out["unfinished"] = None
except IncompleteDatasetError as error:
    out["unfinished"] = str(error)

# Writes go through the resumable-upload path (Location rewritten by the proxy).
with gfile.GFile(url + "/written-by-tf.txt", "w") as f:
    f.write("hello from TensorFlow\n" * 1000)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def dataset(gcs_emulator, tmp_path_factory):
    """A contract-conformant dataset (no Beam) uploaded to the emulator."""
    local = tmp_path_factory.mktemp("gcs-tf") / "ds"
    truth = write_dataset(local, per_class=12, shards={"train": 3})
    bucket = gcs_emulator.create_bucket()
    url = f"gs://{bucket}/datasets/ds"
    gcs_emulator.upload_dir(local, url)
    # An unfinished conversion: shards but no imagerecords.json.
    unfinished = f"gs://{bucket}/datasets/unfinished"
    for name in ("train-00000-of-00001.tfrecord", "labels.txt"):
        gcs_emulator.upload_bytes(f"{unfinished}/{name}", b"")
    return url, unfinished, truth


@pytest.fixture(scope="module")
def converted(gcs_emulator, tmp_path_factory):
    """The converter's own output on gs://, and its records' IDs per split in file order."""
    local = tmp_path_factory.mktemp("gcs-tf-convert") / "images"
    make_class_folders(str(local), per_class=5, size_range=(40, 90))
    bucket = gcs_emulator.create_bucket()
    gcs_emulator.upload_dir(local, f"gs://{bucket}/images")
    out = f"gs://{bucket}/records"
    argv = ["--input", f"gs://{bucket}/images", "--output", out, "--quiet"]
    assert main(argv + ["--direct_running_mode=in_memory", "--splits", "train=0.6,val=0.4"]) == 0
    info = json.loads(gcs_emulator.read_bytes(f"{out}/imagerecords.json"))
    truth = {}
    for split, entry in info["splits"].items():
        truth[split] = [
            codec.parse_example(record)["image/filename"].decode()
            for shard in entry["shards"]
            for record in codec.iter_records(
                io.BytesIO(gcs_emulator.read_bytes(f"{out}/{shard['file']}"))
            )
        ]
    return out, truth


@pytest.fixture(scope="module")
def seen(dataset, converted, tf_gcs_env, gcs_proxy):
    url, unfinished, _ = dataset
    result = subprocess.run(
        [sys.executable, "-c", READ_EVERYTHING, url, unfinished, converted[0]],
        env=tf_gcs_env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        log = gcs_proxy[2].read_text(errors="replace")[-3000:]
        pytest.fail(f"TF subprocess failed:\n{result.stderr[-4000:]}\nproxy log:\n{log}")
    return json.loads(lines[-1][len("RESULT ") :])


def test_gfile_metadata_and_listing(dataset, seen):
    url, _, truth = dataset
    shard_files = [s["file"] for e in truth.info["splits"].values() for s in e["shards"]]
    assert seen["exists"] == [True, False]
    assert seen["isdir"] is True
    assert seen["listdir"] == sorted(
        ["imagerecords.json", "labels.txt", "rejects.jsonl", *tfds_metadata.FILES] + shard_files
    )
    assert seen["glob"] == sorted(f"{url}/{f}" for f in shard_files if f.startswith("train-"))
    assert len(truth.info["splits"]["train"]["shards"]) == 3


def test_tfrecord_dataset_reads_every_record_in_shard_order(dataset, seen):
    _, _, truth = dataset
    assert seen["tfrecord"] == {split: truth.filenames(split) for split in truth.records}


def test_reader_eval_mode_yields_every_record_once_in_order(dataset, seen):
    _, _, truth = dataset
    assert set(seen["eval"]) == set(truth.records)
    for split, rows in truth.records.items():
        assert seen["eval"][split]["num_examples"] == len(rows)
        assert seen["eval"][split]["filenames"] == [r.filename for r in rows]
        assert seen["eval"][split]["labels"] == [r.label for r in rows]


def test_reader_reads_the_converters_gcs_output(converted, seen):
    _, truth = converted
    assert set(seen["converted_eval"]) == set(truth) == {"train", "val"}
    for split, filenames in truth.items():
        assert seen["converted_eval"][split]["num_examples"] == len(filenames)
        assert seen["converted_eval"][split]["filenames"] == filenames
    assert sum(len(f) for f in truth.values()) == 15


def test_reader_training_mode_over_gcs(seen):
    assert seen["train_batches"] == [[8, 32, 32, 3]] * 3
    # A one-shard split of ~9 records, repeated past its end.
    assert seen["one_shard_train"] == {"shards": 1, "batches": [[4, 32, 32, 3]] * 4}


def test_unfinished_dataset_is_refused_with_the_reason(seen):
    assert seen["unfinished"] is not None
    assert "no imagerecords.json" in seen["unfinished"]
    assert "1 .tfrecord file(s)" in seen["unfinished"]


def test_tensorflow_writes_reach_the_bucket(dataset, seen, gcs_emulator):
    url, _, _ = dataset
    assert gcs_emulator.read_bytes(f"{url}/written-by-tf.txt") == b"hello from TensorFlow\n" * 1000

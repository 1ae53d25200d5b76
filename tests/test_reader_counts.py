"""The reader counts records, not batches, and names the shard when they are not right.

Every shard's records are counted as they are read, against its
``num_examples`` in imagerecords.json. One record too many or too few usually
leaves the number of batches as it was (470, 471 and 472 records are 59
batches of 8), so only a count of records can tell; a corrupt or cut-short
shard (TensorFlow's ``DataLossError``, which names no file) or a missing one
ends its count early. Either way the error names the shard file.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest
import tensorflow as tf

import reader
from tests.shard_fixtures import flip_data_byte, record_spans, set_length_field, write_dataset

pytestmark = pytest.mark.e2e

SIZE = 24
SHARD = "train-00001-of-00004.tfrecord"


@pytest.fixture
def dataset(tmp_path):
    return write_dataset(tmp_path / "ds", per_class=(17, 25, 12))


def _shard(dataset) -> tuple[str, int]:
    """The damaged shard's path (as the reader names it) and its listed count."""
    listed = {s["file"]: s["num_examples"] for s in dataset.info["splits"]["train"]["shards"]}
    return os.path.join(dataset.path, SHARD), listed[SHARD]


def _same_batches(n: int) -> int:
    """A batch size for which n - 1, n and n + 1 records make as many batches."""
    return next(b for b in range(5, n) if n % b not in (0, 1))


def _fewer(read: int, listed: int) -> str:
    return f"reading stopped after {read} of the {listed} records imagerecords.json lists"


def _more(listed: int) -> str:
    return f"the shard holds more than the {listed} records imagerecords.json lists"


def _read_all(path, **kwargs) -> None:
    kwargs.setdefault("training", False)
    for _ in reader.make_dataset(path, "train", image_size=SIZE, **kwargs):
        pass


def _one_record_fewer(path: str) -> None:
    start, _ = record_spans(path)[-1]
    with open(path, "r+b") as f:
        f.truncate(start)  # a whole record gone: the file is still well framed


def _one_record_more(path: str) -> None:
    start, _ = record_spans(path)[-1]
    with open(path, "rb") as f:
        last = f.read()[start:]
    with open(path, "ab") as f:
        f.write(last)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"decode_before_batching": True},
        {"cache": "memory"},
        {"cache": "decoded"},
        {"pad_to_batch": True},
    ],
    ids=["default", "decode_before_batching", "cache_memory", "cache_decoded", "pad_to_batch"],
)
@pytest.mark.parametrize("change", ["fewer", "more"])
def test_evaluation_names_a_shard_with_a_record_too_few_or_too_many(dataset, change, options):
    path, listed = _shard(dataset)
    (_one_record_fewer if change == "fewer" else _one_record_more)(path)
    batch = _same_batches(dataset.info["splits"]["train"]["num_examples"])
    expected = _fewer(listed - 1, listed) if change == "fewer" else _more(listed)
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{path}: {expected}")):
        _read_all(dataset.path, batch_size=batch, **options)


def test_every_input_pipeline_checks_its_shards(dataset):
    path, listed = _shard(dataset)
    _one_record_fewer(path)
    context = tf.distribute.InputContext(2, 1, 2)  # by file: pipeline 1 reads shards 1 and 3
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(_fewer(listed - 1, listed))):
        _read_all(dataset.path, batch_size=4, input_context=context)
    by_record = tf.distribute.InputContext(8, 0, 8)  # 4 shards: every pipeline reads them all
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(_fewer(listed - 1, listed))):
        _read_all(dataset.path, batch_size=2, input_context=by_record)


@pytest.mark.parametrize("training", [False, True])
def test_a_corrupt_record_names_its_shard(dataset, training):
    # A flipped bit: TensorFlow's reader raises DataLossError "corrupted record at
    # <offset>", naming no file; the shard's count then stops at the record before.
    path, listed = _shard(dataset)
    flip_data_byte(path, 3)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=re.escape(f"{path}: " + _fewer(3, listed))
    ):
        _read_all(dataset.path, batch_size=4, training=training, repeat=False, seed=0)


def test_training_names_a_short_shard_in_its_first_epoch(dataset):
    path, listed = _shard(dataset)
    _one_record_fewer(path)
    ds = reader.make_dataset(dataset.path, "train", 4, SIZE, training=True, seed=0)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=re.escape(f"{path}: " + _fewer(listed - 1, listed))
    ):
        for _ in ds.take(2 * dataset.info["splits"]["train"]["num_examples"]):
            pass


@pytest.mark.parametrize("damage", ["length field", "cut short"])
def test_a_damaged_shard_is_named(dataset, damage):
    path, listed = _shard(dataset)
    _, length = record_spans(path)[2]
    if damage == "length field":  # one bit: its CRC no longer matches
        set_length_field(path, 2, length ^ 1, valid_crc=False)
    else:  # inside record 2's bytes
        start, _ = record_spans(path)[2]
        with open(path, "r+b") as f:
            f.truncate(start + 20)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=re.escape(f"{path}: " + _fewer(2, listed))
    ):
        _read_all(dataset.path, batch_size=4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("training", [False, True])
def test_a_missing_shard_is_an_error_naming_it_not_a_hang(dataset, training):
    # Read errors end a shard early (and its count names it); an error opening
    # the file would be retried forever that way, so it is TensorFlow's own.
    path, _ = _shard(dataset)
    os.remove(path)
    with pytest.raises(tf.errors.NotFoundError, match=re.escape(path)):
        _read_all(dataset.path, batch_size=4, training=training, repeat=False, seed=0)


def test_an_intact_dataset_reads_every_record_once(dataset):
    # The count check itself changes nothing: every record, in shard order.
    ds = reader.make_dataset(dataset.path, "train", 7, SIZE, training=False, return_dict=True)
    names = [n.decode() for batch in ds for n in batch["filename"].numpy()]
    assert names == dataset.filenames("train")


def test_a_format_version_1_dataset_names_its_own_metadata_file(tmp_path):
    # Before format_version 2 the counts were in dataset_info.json: the message says so.
    v1 = tmp_path / "v1"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "data", "v1_dataset"), v1)
    path = str(v1 / "train-00000-of-00001.tfrecord")
    _one_record_fewer(path)
    message = f"{path}: reading stopped after 8 of the 9 records dataset_info.json lists"
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(message)):
        _read_all(str(v1), batch_size=4)

"""``python -m reader.inspect``: summary, shuffle evidence, --verify and the pictures."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from reader import inspect as inspect_tool
from reader import load_info, overview, pictures
from tests.shard_fixtures import (
    flip_data_byte,
    record_spans,
    replace_record,
    set_length_field,
    write_dataset,
)

# Fixtures used by name in this module (an import would read as unused to linters).

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("inspect") / "good"
    return write_dataset(path, per_class=(30, 24, 18), min_side=40, max_side=90)


@pytest.fixture
def copy(good, tmp_path):
    """A private copy of the good dataset to damage."""
    target = tmp_path / "copy"
    shutil.copytree(good.path, target)
    return target


def _run(*argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    sys_out, sys_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        status = inspect_tool.main([str(a) for a in argv])
    finally:
        sys.stdout, sys.stderr = sys_out, sys_err
    return status, out.getvalue() + err.getvalue()


def _info(path) -> dict:
    with open(os.path.join(path, "imagerecords.json")) as f:
        return json.load(f)


def _write_info(path, info: dict) -> None:
    with open(os.path.join(path, "imagerecords.json"), "w") as f:
        json.dump(info, f)


def test_good_dataset_summary_and_verify_exit_0(good):
    status, text = _run(good.path, "--verify")
    assert status == 0, text
    info = good.info
    for name, split in info["splits"].items():
        assert f"{name:<12}{split['num_examples']:>10,}{len(split['shards']):>8}" in text
    assert "classes (3): cat, dog, fish" in text
    assert "(0 flagged)" in text
    records = sum(s["num_examples"] for s in info["splits"].values())
    assert f"verify: OK: 5 shards, {records} records" in text


def test_summary_shows_rejects_and_duplicates(copy):
    info = _info(copy)
    info["rejected"]["count"] = 3
    info["duplicates"] = {
        "groups": 2,
        "images": 5,
        "cross_split": 1,
        "cross_class": 0,
        "file": "duplicates.jsonl",
    }
    info["skipped"] = {
        "count": 3,
        "file": "skipped.jsonl",
        "by_reason": {"not an image file (.txt)": 1, "not inside a class folder": 2},
    }
    _write_info(copy, info)
    rows = [
        {"path": "/x/a.txt", "id": "a.txt", "split": "train", "reason": "not an image: text"},
        {"path": "/x/b.txt", "id": "b.txt", "split": "val", "reason": "not an image: text"},
        {"path": "/x/c.jpg", "id": "c.jpg", "split": "val", "reason": "corrupt image: broken"},
    ]
    (copy / "rejects.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    status, text = _run(copy, "--no_shuffle_check")
    assert status == 0, text
    assert "rejected: 3" in text
    assert "       2  not an image (e.g. a.txt)" in text
    assert "       1  corrupt image (e.g. c.jpg)" in text
    assert (
        "skipped (not converted): 3 (listed in skipped.jsonl): 2 not inside a class folder, "
        "1 not an image file (.txt)"
    ) in text
    assert (
        "duplicates: groups 2, images 5, cross-split 1, cross-class 0 (see duplicates.jsonl)"
        in text
    )


def test_shards_grouped_by_class_are_flagged(tmp_path):
    grouped = write_dataset(tmp_path / "grouped", per_class=40, class_sorted_shards=True)
    status, text = _run(grouped.path)
    assert status == 0  # a summary reports; only --verify fails
    mixes = overview.shuffle_evidence(load_info(grouped.path))
    flagged = {m.file for m in mixes if m.flagged}
    assert flagged == {m.file for m in mixes if m.sampled >= 10}
    assert "records look grouped by class" in text


@pytest.mark.parametrize(
    "labels, shares, flagged",
    [
        ([0, 1, 2] * 20, [1 / 3] * 3, None),
        ([0] * 20 + [1] * 20 + [2] * 20, [1 / 3] * 3, "switches"),
        ([0] * 50 + [1] * 10, [0.5, 0.5], "class 0 is 83%"),
        ([0, 0, 0], [0.5, 0.5], None),  # too few records to judge
        ([0] * 60, [1.0], None),  # one class: nothing to mix
    ],
)
def test_shard_mix(labels, shares, flagged):
    mix = overview.shard_mix("train", "train-00000-of-00001.tfrecord", labels, shares)
    if flagged is None:
        assert mix.flagged is None
    else:
        assert flagged in mix.flagged


def _fails(path, *names) -> str:
    status, text = _run(path, "--verify", "--no_shuffle_check")
    assert status == 1, text
    for name in names:
        assert name in text, text
    return text


def test_verify_names_a_truncated_shard(copy):
    shard = copy / "train-00002-of-00004.tfrecord"
    last_start, _ = record_spans(shard)[-1]
    with open(shard, "r+b") as f:
        f.truncate(last_start + 22)
    count = len(record_spans(copy / "train-00001-of-00004.tfrecord"))
    assert count  # sanity: the neighbour is intact
    records = _info(copy)["splits"]["train"]["shards"][2]["num_examples"]
    _fails(
        copy,
        f"train-00002-of-00004.tfrecord: record {records - 1} (byte {last_start:,}): truncated",
        f"train-00002-of-00004.tfrecord: {records - 1:,} records, imagerecords.json says "
        f"{records:,}",
        "train-00002-of-00004.tfrecord: SHA-256 differs",
    )


def test_verify_names_a_missing_shard(copy):
    os.remove(copy / "val-00000-of-00001.tfrecord")
    _fails(copy, "val-00000-of-00001.tfrecord: missing")


def test_verify_names_the_record_with_a_flipped_byte(copy):
    shard = copy / "train-00001-of-00004.tfrecord"
    start = flip_data_byte(shard, 3)
    text = _fails(
        copy,
        f"train-00001-of-00004.tfrecord: record 3 (byte {start:,}): data CRC mismatch",
        "train-00001-of-00004.tfrecord: SHA-256 differs",
    )
    assert "record 2 " not in text and "record 4 " not in text


def test_verify_names_edited_counts(copy):
    info = _info(copy)
    shard = info["splits"]["train"]["shards"][0]
    shard["num_examples"] += 1
    info["splits"]["train"]["num_examples"] += 1  # consistent totals: only a re-read can tell
    info["splits"]["train"]["class_counts"]["dog"] += 1
    _write_info(copy, info)
    _fails(
        copy,
        f"{shard['file']}: {shard['num_examples'] - 1:,} records, imagerecords.json says "
        f"{shard['num_examples']:,}",
        "split train: ",
        "of class 'dog', imagerecords.json says",
    )


def test_verify_names_a_count_that_does_not_add_up(copy):
    info = _info(copy)
    info["splits"]["val"]["num_examples"] += 5
    _write_info(copy, info)
    status, text = _run(copy, "--verify")
    assert status == 1
    assert text.startswith("error: ") and "split 'val': num_examples is" in text


def test_verify_names_labels_that_disagree(copy):
    (copy / "labels.txt").write_text("cat\nfish\ndog\n")
    _fails(copy, "labels.txt: its 3 lines are not imagerecords.json's 3 classes in order")


def _no_traceback(status: int, text: str) -> None:
    assert status == 1 and "Traceback" not in text, text


def test_verify_names_a_corrupt_length_field(copy):
    # The summary's shuffle evidence reads the first records of every shard
    # before --verify checks anything; following the wrong length into the
    # record's bytes would die in protobuf's parser.
    shard = copy / "train-00003-of-00004.tfrecord"
    _, length = record_spans(shard)[0]
    set_length_field(shard, 0, length - 64, valid_crc=False)
    status, text = _run(copy, "--verify")
    _no_traceback(status, text)
    assert "FAIL train-00003-of-00004.tfrecord: record 0 (byte 0): length CRC mismatch" in text
    assert "    ! cannot be read: record 0" in text  # the shuffle evidence's line


@pytest.mark.e2e
def test_verify_names_a_length_field_claiming_2_to_the_46_bytes(copy):
    # A length with a valid CRC that no file could hold: handed to a read it
    # crashed the process (a segmentation fault), so inspect compares it with
    # the file's size first. In a subprocess: a crash must not take pytest along.
    set_length_field(copy / "val-00000-of-00001.tfrecord", 0, 2**46, valid_crc=True)
    result = subprocess.run(
        [sys.executable, "-m", "reader.inspect", str(copy), "--verify"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _no_traceback(result.returncode, result.stdout + result.stderr)
    assert (
        "FAIL val-00000-of-00001.tfrecord: record 0 (byte 0): corrupt framing: the length "
        "field says 70,368,744,177,664 bytes, the file has "
    ) in result.stdout
    assert "FAIL val-00000-of-00001.tfrecord: 0 records, imagerecords.json says " in result.stdout


def test_verify_names_a_record_that_is_not_an_example(copy):
    # Valid framing and CRCs around bytes protobuf cannot parse.
    replace_record(copy / "train-00000-of-00004.tfrecord", 2, b"\xff" * 40)
    status, text = _run(copy, "--verify")
    _no_traceback(status, text)
    assert "FAIL train-00000-of-00004.tfrecord: record 2 (byte " in text
    assert "): not a tf.train.Example (" in text
    assert "    ! cannot be read: record 2: not a tf.train.Example (" in text


def test_verify_names_a_field_of_the_wrong_type(copy):
    shard = copy / "train-00001-of-00004.tfrecord"
    start, length = record_spans(shard)[1]
    with open(shard, "rb") as f:
        f.seek(start + 12)
        example = tf.train.Example.FromString(f.read(length))
    label = example.features.feature["image/class/label"]
    label.ClearField("int64_list")
    label.bytes_list.value.append(b"cat")
    replace_record(shard, 1, example.SerializeToString())
    status, text = _run(copy, "--verify")
    _no_traceback(status, text)
    assert (
        f"FAIL train-00001-of-00004.tfrecord: record 1 (byte {start:,}): missing or of the "
        "wrong type: image/class/label"
    ) in text


def test_pictures_of_a_damaged_shard_end_in_one_error_line(copy, tmp_path):
    shard = copy / "val-00000-of-00001.tfrecord"
    start, _ = record_spans(shard)[2]
    with open(shard, "r+b") as f:
        f.truncate(start + 30)
    status, text = _run(
        copy, "--contact_sheet", tmp_path / "sheet.png", "--split", "val", "--samples", "1000"
    )
    _no_traceback(status, text)
    last = text.strip().splitlines()[-1]
    assert last.startswith(
        f"error: cannot draw the pictures: val-00000-of-00001.tfrecord: record 2 (byte "
        f"{start:,}): truncated: the record needs "
    ) and last.endswith(" more bytes, the file has 18"), last


def test_bad_arguments_exit_2_with_one_line(good, tmp_path):
    cases = [
        ([tmp_path / "nothing-here"], "does not exist"),
        ([good.path, "--split", "nope"], "its splits are: train, val"),
        ([good.path, "--samples", "0"], "--samples must be at least 1"),
        ([good.path, "--contact_sheet", "sheet.jpg"], "must name a .png file"),
        ([good.path, "--frobnicate"], "unrecognized arguments: --frobnicate"),
        ([good.path, "--verfy"], "unrecognized arguments: --verfy (did you mean --verify?)"),
        ([good.path, "--contact-sheet=x.png"], "(did you mean --contact_sheet?)"),
    ]
    for argv, message in cases:
        status, text = _run(*argv)
        assert status == 2, (argv, text)
        assert text.startswith("error: ") and message in text and text.count("\n") == 1


@pytest.mark.e2e
@pytest.mark.parametrize(
    "argv, status",
    [(["--verfy"], 2), (["--samples", "0"], 2), (["--help"], 0)],
)
def test_bad_arguments_are_answered_before_tensorflow_loads(good, argv, status):
    code = (
        "import sys\n"
        "from reader import inspect\n"
        "try:\n"
        f"    code = inspect.main([{str(good.path)!r}, *{argv!r}])\n"
        "except SystemExit as done:  # --help\n"
        "    code = done.code\n"
        "print(code, 'tensorflow' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.stdout.strip().splitlines()[-1] == f"{status} False", result.stderr


def _records_by_filename(path) -> dict[str, bytes]:
    out = {}
    for shard in tf.io.gfile.glob(os.path.join(path, "*.tfrecord")):
        for data in tf.data.TFRecordDataset(shard):
            example = tf.train.Example.FromString(data.numpy())
            feature = example.features.feature
            name = feature["image/filename"].bytes_list.value[0].decode()
            out[name] = feature["image/encoded"].bytes_list.value[0]
    return out


def test_contact_sheet_tiles_are_the_named_splits_images(good, tmp_path):
    sheet = tmp_path / "sheet.png"
    status, text = _run(good.path, "--contact_sheet", sheet, "--split", "val", "--samples", "10")
    assert status == 0, text
    assert "contact sheet: 10 images of val" in text
    tiles = pictures.contact_sheet(
        load_info(good.path), str(tmp_path / "again.png"), ["val"], 10, 0
    )
    assert sheet.read_bytes() == (tmp_path / "again.png").read_bytes()  # same seed, same sheet

    image = np.asarray(Image.open(sheet).convert("RGB")).astype(int)
    # 8 columns (two rows for 10 images) under one split header.
    cell_w = pictures.TILE + pictures.PAD
    cell_h = pictures.TILE + pictures.CAPTION + pictures.PAD
    assert image.shape == (
        pictures.HEADER + 2 * cell_h + pictures.PAD,
        pictures.PAD + 8 * cell_w,
        3,
    )
    assert image.std() > 20  # not blank

    val = set(good.filenames("val"))
    assert len(tiles) == 10 and len({t.filename for t in tiles}) == 10
    assert {t.filename for t in tiles} <= val
    truth = {r.filename: r for r in good.records["val"]}
    encoded = _records_by_filename(good.path)
    for tile in tiles:
        assert tile.class_name == truth[tile.filename].class_name
        left, top, right, bottom = tile.box
        drawn = image[top:bottom, left:right]
        record = Image.open(io.BytesIO(encoded[tile.filename])).convert("RGB")
        expected = np.asarray(record.resize((right - left, bottom - top), Image.BICUBIC))
        assert np.abs(drawn - expected.astype(int)).mean() < 8, tile
        # The fixture paints each class its own colour: the tile shows that colour.
        assert (
            np.abs(np.median(drawn.reshape(-1, 3), axis=0) - truth[tile.filename].colour).max() < 30
        )


def test_histogram_bars_follow_the_class_counts(good, tmp_path):
    path = tmp_path / "hist.png"
    status, text = _run(good.path, "--histogram", path, "--no_shuffle_check")
    assert status == 0, text
    bars = pictures.histogram(load_info(good.path), str(tmp_path / "again.png"), ["train", "val"])
    image = np.asarray(Image.open(path).convert("RGB"))
    assert image.shape[1] == pictures.HISTOGRAM_WIDTH
    assert image.shape[0] > 3 * 2 * 12  # a bar per class and split
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 10  # not blank
    longest = max(bar.count for bar in bars)
    widest = max(bar.box[2] - bar.box[0] for bar in bars)
    for bar in bars:
        assert bar.count == good.info["splits"][bar.split]["class_counts"][bar.class_name]
        width = bar.box[2] - bar.box[0]
        assert width == pytest.approx(widest * bar.count / longest, abs=1)
        if width > 2:
            colour = pictures.SPLIT_COLOURS[["train", "val"].index(bar.split)]
            middle = image[(bar.box[1] + bar.box[3]) // 2, (bar.box[0] + bar.box[2]) // 2]
            assert tuple(middle) == colour


@pytest.mark.e2e
def test_import_reader_loads_nothing_but_tensorflow():
    # TensorFlow's bundled Keras imports Pillow itself when it is installed, so
    # the check is on what reader and reader.inspect add on top of TensorFlow.
    code = (
        "import sys\n"
        "import tensorflow\n"
        "before = set(sys.modules)\n"
        "import reader, reader.inspect\n"
        "forbidden = ('PIL', 'matplotlib', 'google_crc32c', 'apache_beam', 'beam_pipeline')\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith(forbidden)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.e2e
def test_console_script_is_installed(good):
    script = os.path.join(os.path.dirname(sys.executable), "imagerecords-inspect")
    result = subprocess.run(
        [script, good.path, "--no_shuffle_check"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "classes (3): cat, dog, fish" in result.stdout


# Runs in a subprocess whose TensorFlow reads gs:// from the emulator (see
# tests/test_gcs_tensorflow.py): argv[1] is a good dataset, argv[2] a damaged
# copy, argv[3] a local folder for the pictures.
INSPECT_ON_GCS = r"""
import contextlib, io, json, sys
from reader import inspect as inspect_tool

good, damaged, local = sys.argv[1:4]
out = {}
for name, argv in {
    "good": [good, "--verify", "--contact_sheet", local + "/sheet.png", "--samples", "4"],
    "damaged": [damaged, "--verify", "--no_shuffle_check"],
}.items():
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        status = inspect_tool.main(argv)
    out[name] = [status, text.getvalue()]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.e2e
def test_inspect_and_verify_on_gcs(good, tmp_path, gcs_emulator, tf_gcs_env):
    emulator, env = gcs_emulator, tf_gcs_env
    bucket = emulator.create_bucket()
    url, damaged = f"gs://{bucket}/good", f"gs://{bucket}/damaged"
    emulator.upload_dir(good.path, url)
    emulator.upload_dir(good.path, damaged)
    shard = os.path.join(good.path, "train-00003-of-00004.tfrecord")
    start, length = record_spans(shard)[1]
    data = bytearray(open(shard, "rb").read())
    data[start + 12 + length - 1] ^= 0xFF
    emulator.upload_bytes(f"{damaged}/train-00003-of-00004.tfrecord", bytes(data))
    result = subprocess.run(
        [sys.executable, "-c", INSPECT_ON_GCS, url, damaged, str(tmp_path)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-4000:]
    seen = json.loads(lines[-1][len("RESULT ") :])
    status, text = seen["good"]
    assert status == 0, text
    assert "verify: OK: 5 shards" in text and "(0 flagged)" in text
    assert Image.open(tmp_path / "sheet.png").size[0] > 4 * pictures.TILE
    status, text = seen["damaged"]
    assert status == 1
    assert "train-00003-of-00004.tfrecord: record 1 " in text and "data CRC mismatch" in text


@pytest.mark.parametrize(
    "text, kept",
    [
        (
            "WARNING: All log messages before absl::InitializeLog() is called are written to "
            "STDERR\n"
            "I0000 00:00:1796155662.096300   21659 port.cc:153] oneDNN custom operations are on.\n"
            "I0000 00:00:1796155662.178347   21659 cpu_feature_guard.cc:227] This TensorFlow "
            "binary is optimized to use available CPU instructions.\n"
            "To enable the following instructions: AVX2 FMA, in other operations, rebuild.\n",
            "",
        ),
        # A warning or an error TensorFlow prints is kept, and so is anything else.
        (
            "W0000 00:00:1796155662.1 21659 gpu_device.cc:2342] Cannot dlopen some GPU libraries.\n",
            "W0000 00:00:1796155662.1 21659 gpu_device.cc:2342] Cannot dlopen some GPU libraries.\n",
        ),
        ("E0000 00:00:1.0 1 x.cc:1] broken\nTraceback (most recent call last):\n", None),
        ("a line that names port.cc:153] in the middle\n", None),
    ],
)
def test_without_start_up_notices_drops_only_tensorflows_info_lines(text, kept):
    assert inspect_tool.without_start_up_notices(text) == (text if kept is None else kept)


@pytest.mark.e2e
def test_inspect_prints_no_tensorflow_start_up_notices(good):
    result = subprocess.run(
        [sys.executable, "-m", "reader.inspect", str(good.path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "absl::InitializeLog" not in result.stderr, result.stderr
    assert "] oneDNN" not in result.stderr and "cpu_feature_guard" not in result.stderr

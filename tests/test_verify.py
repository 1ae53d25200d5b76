"""``inspect --verify`` checks every file a dataset publishes, not only the shards.

One dataset made by the real converter (``--index_files``, rejects, skipped
files and duplicates, three classes, several shards per split) is copied and
damaged one way per case: an ``.idx`` file deleted, cut short, overwritten
with garbage or swapped with another shard's; TFDS's ``dataset_info.json``,
``features.json`` or class names edited; ``labels.txt`` edited; a file that
belongs to no published file. Each case must end in status 1 with a line
naming the file and what is wrong; the untouched dataset verifies OK. The
pure helpers of ``reader/published.py`` have their own tables below.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from array import array
from pathlib import Path

import pytest
import tensorflow as tf

from beam_pipeline.core import metadata, tfds_metadata
from imagerecords import RecordSource
from imagerecords.index import IndexFileError
from reader import info as info_lib
from reader import inspect as inspect_tool
from reader import published
from tests.image_factory import add_bad_files, make_class_folders

REPO = Path(__file__).resolve().parent.parent
CLASSES = ("cat", "dog", "fish")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A demo-like dataset: what the converter writes for a folder with odd entries."""
    base = tmp_path_factory.mktemp("verify")
    root = base / "images"
    make_class_folders(str(root), classes=CLASSES, per_class=14, size_range=(40, 90))
    add_bad_files(str(root))  # two rejections
    (root / "README.txt").write_text("outside every class folder: skipped\n")
    shutil.copy(root / "dog" / "dog_0001.jpg", root / "fish" / "copy_of_a_dog.jpg")  # duplicates
    out = base / "out"
    subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "--input", str(root), "--output", str(out)]
        + ["--image_size", "32", "--min_shards", "3", "--splits", "train=0.7,val=0.3"]
        + ["--index_files", "--max_reject_fraction", "0.5", "--quiet"],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    return out


@pytest.fixture
def copy(dataset, tmp_path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(dataset, target)
    return target


def _verify(path) -> tuple[int, str]:
    out = io.StringIO()
    sys_out, sys_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        status = inspect_tool.main([str(path), "--verify", "--no_shuffle_check"])
    finally:
        sys.stdout, sys.stderr = sys_out, sys_err
    return status, out.getvalue()


def _info(path: Path) -> dict:
    return json.loads((path / metadata.INFO_FILE).read_text())


def _shard(path: Path, split: str, index: int) -> dict:
    return _info(path)["splits"][split]["shards"][index]


def _edit_json(path: Path, name: str, edit) -> None:
    doc = json.loads((path / name).read_text())
    edit(doc)
    (path / name).write_text(json.dumps(doc, indent=2))


def _tfds_split(doc: dict, name: str) -> dict:
    return next(s for s in doc["splits"] if s["name"] == name)


def _lines(path: Path, name: str) -> list[str]:
    return (path / name).read_text().splitlines()


# ------------------------------------------------------------------ the damages
# Each takes the dataset's folder, damages it, and returns the lines that
# --verify must print (each a substring of one FAIL line).


def _idx_deleted(path):
    shard = _shard(path, "train", 1)
    (path / shard["index"]).unlink()
    return [f"FAIL {shard['index']}: missing (imagerecords.json lists it for {shard['file']})"]


def _idx_truncated_at_a_line(path):
    shard = _shard(path, "train", 0)
    lines = _lines(path, shard["index"])
    (path / shard["index"]).write_text("".join(line + "\n" for line in lines[:2]))
    return [f"FAIL {shard['index']}: 2 lines, the shard has {shard['num_examples']} records"]


def _idx_truncated_inside_a_line(path):
    shard = _shard(path, "val", 0)
    data = (path / shard["index"]).read_bytes()
    (path / shard["index"]).write_bytes(data[: len(data) - 2])  # the last length loses a digit
    offset, length = _lines(path, shard["index"])[-1].split()
    n = shard["num_examples"]
    return [
        f"FAIL {shard['index']}: line {n} says record {n - 1} is {int(length):,} bytes at "
        f"byte {int(offset):,}, the shard has it "
    ]


def _idx_garbage_bytes(path):
    shard = _shard(path, "train", 2)
    (path / shard["index"]).write_bytes(b"\x00\xff\xfe garbage \x9c" * 8)
    return [f"FAIL {shard['index']}: not ASCII text, not '<offset> <length>' lines"]


def _idx_garbage_text(path):
    shard = _shard(path, "train", 2)
    (path / shard["index"]).write_text("0 1234\nhello world\n")
    return [f"FAIL {shard['index']}: line 2 is 'hello world', not '<offset> <length>'"]


def _idx_swapped(path):
    first, second = _shard(path, "train", 0), _shard(path, "train", 1)
    a, b = (path / first["index"]).read_bytes(), (path / second["index"]).read_bytes()
    (path / first["index"]).write_bytes(b)
    (path / second["index"]).write_bytes(a)
    return [f"FAIL {first['index']}: line ", f"FAIL {second['index']}: line "]


def _shard_lengths_edited(path):
    shard = _shard(path, "train", 1)

    def edit(doc):
        lengths = _tfds_split(doc, "train")["shardLengths"]
        lengths[1] = str(int(lengths[1]) + 1)

    _edit_json(path, tfds_metadata.DATASET_INFO_FILE, edit)
    n = shard["num_examples"]
    return [
        f"FAIL dataset_info.json: split 'train': shardLengths gives {shard['file']} "
        f"'{n + 1}' records, imagerecords.json {n}"
    ]


def _shard_lengths_moved(path):
    # The split's total stays right: only the shard a record is in moved.
    def edit(doc):
        lengths = _tfds_split(doc, "train")["shardLengths"]
        lengths[0], lengths[2] = str(int(lengths[0]) - 1), str(int(lengths[2]) + 1)

    _edit_json(path, tfds_metadata.DATASET_INFO_FILE, edit)
    return ["FAIL dataset_info.json: split 'train': shardLengths gives ", "(1 more shards differ)"]


def _shard_lengths_one_short(path):
    _edit_json(
        path,
        tfds_metadata.DATASET_INFO_FILE,
        lambda doc: _tfds_split(doc, "val")["shardLengths"].pop(),
    )
    shards = len(_info(path)["splits"]["val"]["shards"])
    return [
        f"FAIL dataset_info.json: split 'val': {shards - 1} shardLengths, imagerecords.json "
        f"lists {shards} shards"
    ]


def _split_bytes_edited(path):
    def edit(doc):
        split = _tfds_split(doc, "val")
        split["numBytes"] = str(int(split["numBytes"]) * 2)

    _edit_json(path, tfds_metadata.DATASET_INFO_FILE, edit)
    size = _info(path)["splits"]["val"]["num_bytes"]
    return [f"FAIL dataset_info.json: split 'val': numBytes '{size * 2}', imagerecords.json says"]


def _split_removed(path):
    def edit(doc):
        doc["splits"] = [s for s in doc["splits"] if s["name"] != "val"]

    _edit_json(path, tfds_metadata.DATASET_INFO_FILE, edit)
    return ["FAIL dataset_info.json: no split 'val' (imagerecords.json lists 3 shards of it)"]


def _split_renamed(path):
    _edit_json(
        path,
        tfds_metadata.DATASET_INFO_FILE,
        lambda doc: _tfds_split(doc, "val").update(name="validation"),
    )
    return [
        "FAIL dataset_info.json: split 'validation', which has no shards in imagerecords.json",
        "FAIL dataset_info.json: no split 'val'",
    ]


def _template_edited(path):
    _edit_json(
        path,
        tfds_metadata.DATASET_INFO_FILE,
        lambda doc: _tfds_split(doc, "train").update(filepathTemplate="{SPLIT}.{SHARD_X_OF_Y}"),
    )
    return [
        "FAIL dataset_info.json: split 'train': filepathTemplate '{SPLIT}.{SHARD_X_OF_Y}' "
        "names shard 0 'train.00000-of-00003', the shard is 'train-00000-of-00003.tfrecord'"
    ]


def _template_removed(path):
    # TFDS then looks for its default names, which are not this project's.
    _edit_json(
        path,
        tfds_metadata.DATASET_INFO_FILE,
        lambda doc: _tfds_split(doc, "val").pop("filepathTemplate"),
    )
    return [
        "FAIL dataset_info.json: split 'val': filepathTemplate "
        "'{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}' names shard 0 "
        "'imagerecords-val.tfrecord-00000-of-00003'"
    ]


def _tfds_name_edited(path):
    _edit_json(path, tfds_metadata.DATASET_INFO_FILE, lambda doc: doc.update(name="photos"))
    return ["FAIL dataset_info.json: name 'photos', imagerecords.json's config.tfds_name"]


def _file_format_edited(path):
    _edit_json(
        path, tfds_metadata.DATASET_INFO_FILE, lambda doc: doc.update(fileFormat="array_record")
    )
    return ["FAIL dataset_info.json: fileFormat 'array_record', the shards are tfrecord"]


def _tfds_info_not_json(path):
    (path / tfds_metadata.DATASET_INFO_FILE).write_text('{"splits": [')
    return ["FAIL dataset_info.json: not valid JSON ("]


def _tfds_info_deleted(path):
    (path / tfds_metadata.DATASET_INFO_FILE).unlink()
    return ["FAIL dataset_info.json: missing (TFDS's metadata, which the converter writes)"]


def _class_count_edited(path):
    def edit(doc):
        label = doc["featuresDict"]["features"]["image"]["featuresDict"]["features"]["class"]
        label["featuresDict"]["features"]["label"]["classLabel"]["numClasses"] = "4"

    _edit_json(path, tfds_metadata.FEATURES_FILE, edit)
    return ["FAIL features.json: image/class/label is not a ClassLabel of 3 classes"]


def _feature_removed(path):
    def edit(doc):
        del doc["featuresDict"]["features"]["image"]["featuresDict"]["features"]["filename"]

    _edit_json(path, tfds_metadata.FEATURES_FILE, edit)
    return ["FAIL features.json: its features are not imagerecords.json's record keys "]


def _class_names_edited(path):
    name = tfds_metadata.labels_file()
    (path / name).write_text("cat\nfish\ndog\n")
    return [
        f"FAIL {name}: its 3 lines are not imagerecords.json's 3 classes in order "
        "(line 2 is 'fish', class 1 is 'dog')"
    ]


def _class_names_one_short(path):
    name = tfds_metadata.labels_file()
    (path / name).write_text("cat\ndog\n")
    return [f"FAIL {name}: its 2 lines are not imagerecords.json's 3 classes in order "]


def _class_names_deleted(path):
    name = tfds_metadata.labels_file()
    (path / name).unlink()
    return [f"FAIL {name}: missing (TFDS's class names, which the converter writes)"]


def _labels_edited(path):
    (path / metadata.LABELS_FILE).write_text("cat\ndog\nfish\nbird\n")
    return [
        "FAIL labels.txt: its 4 lines are not imagerecords.json's 3 classes in order "
        "(line 4 is 'bird', no class is)"
    ]


def _labels_not_utf8(path):
    (path / metadata.LABELS_FILE).write_bytes(b"cat\nd\xf6g\nfish\n")
    return ["FAIL labels.txt: not UTF-8 text ("]


def _list_deleted(path):
    (path / metadata.REJECTS_FILE).unlink()
    return ["FAIL rejects.jsonl: missing (imagerecords.json names it)"]


def _stray_file(path):
    (path / "notes.txt").write_text("mine\n")
    return ["FAIL notes.txt: not part of the dataset"]


def _stray_shard(path):
    shutil.copy(path / _shard(path, "val", 0)["file"], path / "val-00000-of-00001.tfrecord")
    return ["FAIL val-00000-of-00001.tfrecord: not part of the dataset"]


def _stray_index(path):
    # An .idx file where imagerecords.json lists none (its shard's "index" removed).
    def edit(doc):
        del doc["splits"]["val"]["shards"][2]["index"]

    _edit_json(path, metadata.INFO_FILE, edit)
    return [f"FAIL {_shard(path, 'val', 2)['file']}.idx: not part of the dataset"]


def _stray_folder(path):
    (path / "extra").mkdir()
    return ["FAIL extra/: a folder that is not part of the dataset"]


def _working_folder_left(path):
    (path / ".imagerecords-tmp").mkdir()
    (path / ".imagerecords-tmp" / "job.json").write_text("{}")
    return ["FAIL .imagerecords-tmp/: the converter's working folder, which a finished run removes"]


DAMAGES = {
    "idx deleted": _idx_deleted,
    "idx truncated at a line": _idx_truncated_at_a_line,
    "idx truncated inside a line": _idx_truncated_inside_a_line,
    "idx garbage bytes": _idx_garbage_bytes,
    "idx garbage text": _idx_garbage_text,
    "idx swapped": _idx_swapped,
    "shardLengths edited": _shard_lengths_edited,
    "shardLengths moved": _shard_lengths_moved,
    "shardLengths one short": _shard_lengths_one_short,
    "split numBytes edited": _split_bytes_edited,
    "split removed": _split_removed,
    "split renamed": _split_renamed,
    "filepathTemplate edited": _template_edited,
    "filepathTemplate removed": _template_removed,
    "TFDS name edited": _tfds_name_edited,
    "fileFormat edited": _file_format_edited,
    "dataset_info.json not JSON": _tfds_info_not_json,
    "dataset_info.json deleted": _tfds_info_deleted,
    "features.json class count edited": _class_count_edited,
    "features.json feature removed": _feature_removed,
    "TFDS class names edited": _class_names_edited,
    "TFDS class names one short": _class_names_one_short,
    "TFDS class names deleted": _class_names_deleted,
    "labels.txt edited": _labels_edited,
    "labels.txt not UTF-8": _labels_not_utf8,
    "list file deleted": _list_deleted,
    "stray file": _stray_file,
    "stray shard": _stray_shard,
    "stray index file": _stray_index,
    "stray folder": _stray_folder,
    "working folder left": _working_folder_left,
}


@pytest.mark.e2e
def test_the_untouched_dataset_verifies_ok(dataset):
    names = {p.name for p in dataset.iterdir()}
    # Sanity: the dataset publishes every kind of file the checks cover.
    assert set(tfds_metadata.FILES) | {"labels.txt", "skipped.jsonl", "duplicates.jsonl"} <= names
    assert sum(name.endswith(".idx") for name in names) == 6
    assert (_info(dataset)["rejected"]["count"], _info(dataset)["skipped"]["count"]) == (2, 1)
    assert _info(dataset)["duplicates"]["groups"] == 1
    lists = published.list_files(info_lib.load_info(str(dataset)))
    assert sorted(lists) == [
        "duplicates.jsonl",
        "near_duplicates.jsonl",
        "rejects.jsonl",
        "skipped.jsonl",
    ]
    status, text = _verify(dataset)
    assert status == 0, text
    assert "verify: OK: 6 shards, " in text and "FAIL" not in text


def test_the_version_1_dataset_verifies_ok():
    status, text = _verify(REPO / "tests" / "data" / "v1_dataset")
    assert status == 0, text


@pytest.mark.e2e
@pytest.mark.parametrize("damage", DAMAGES.values(), ids=DAMAGES.keys())
def test_verify_names_the_damaged_file(copy, damage):
    expected = damage(copy)
    status, text = _verify(copy)
    assert status == 1, text
    for line in expected:
        assert line in text, text
    assert "Traceback" not in text and "verify: OK" not in text


IDX_DAMAGES = {name: damage for name, damage in DAMAGES.items() if name.startswith("idx ")}


@pytest.mark.e2e
@pytest.mark.parametrize("damage", IDX_DAMAGES.values(), ids=IDX_DAMAGES.keys())
def test_each_idx_damage_is_one_record_source_refuses(copy, damage):
    # What --verify names is what breaks the .idx files' own reader, and the
    # untouched files are what it reads.
    for split in ("train", "val"):
        assert len(RecordSource(str(copy), split)) == _info(copy)["splits"][split]["num_examples"]
    damage(copy)
    with pytest.raises(IndexFileError):
        for split in ("train", "val"):
            RecordSource(str(copy), split)


@pytest.mark.e2e
def test_tfds_misreads_what_verify_names_in_its_files(copy):
    tfds = pytest.importorskip("tensorflow_datasets")
    _shard_lengths_edited(copy)
    _class_names_edited(copy)
    builder = tfds.builder_from_directory(str(copy))
    assert builder.info.features["image"]["class"]["label"].names == ["cat", "fish", "dog"]
    with pytest.raises(tf.errors.FailedPreconditionError, match="expected to contain"):
        for _ in builder.as_dataset(split="train"):
            pass


# ------------------------------------------------------------- the pure helpers

FRAMES = array("q", [0, 100, 250, 260])  # three records: 100, 150 and 10 bytes


@pytest.mark.parametrize(
    "data, complete, problems",
    [
        (b"0 100\n100 150\n250 10\n", True, []),
        (b"0 100\n100 150\n250 10", True, []),  # no final newline: RecordSource reads it too
        (b"0 100\n100 150\n", True, ["x.idx: 2 lines, the shard has 3 records"]),
        (b"", True, ["x.idx: 0 lines, the shard has 3 records"]),
        (
            b"0 100\n100 150\n250 10\n260 20\n",
            True,
            ["x.idx: 4 lines, the shard has 3 records"],
        ),
        (
            b"0 100\n100 160\n260 10\n",
            True,
            [
                "x.idx: line 2 says record 1 is 160 bytes at byte 100, the shard has it 150 "
                "bytes at byte 100 (1 more lines are wrong)"
            ],
        ),
        (b"0 100\n100 -150\n", True, ["x.idx: line 2 is '100 -150', not '<offset> <length>'"]),
        (b"0 100 7\n", True, ["x.idx: line 1 is '0 100 7', not '<offset> <length>'"]),
        (b"0 1\xe200\n", True, ["x.idx: not ASCII text, not '<offset> <length>' lines"]),
        # The shard's framing broke after two records: lines past them are not judged.
        (b"0 100\n100 150\n250 10\n", False, []),
        (b"0 100\n", False, []),
    ],
)
def test_index_problems(data, complete, problems):
    frames = FRAMES if complete else FRAMES[:3]
    assert published.index_problems("x.idx", data, frames, complete) == problems


@pytest.mark.parametrize(
    "text, problem",
    [
        ("a\nb\n", None),
        ("a\nb", None),
        ("b\na\n", "l.txt: its 2 lines are not m.json's 2 classes in order (line 1 is 'b', class 0 is 'a')"),
        ("a\n", "l.txt: its 1 lines are not m.json's 2 classes in order (it ends there, class 1 is 'b')"),
        ("a\nb\n\n", "l.txt: its 3 lines are not m.json's 2 classes in order (line 3 is '', no class is)"),
        ("a \nb\n", "l.txt: its 2 lines are not m.json's 2 classes in order (line 1 is 'a ', class 0 is 'a')"),
    ],
)  # fmt: skip
def test_labels_problem(text, problem):
    assert published.labels_problem("l.txt", text, ("a", "b"), "m.json") == problem


@pytest.mark.parametrize(
    "template, index, shards, name",
    [
        (published.TFDS_DEFAULT_TEMPLATE, 3, 12, "ds-train.tfrecord-00003-of-00012"),
        (tfds_metadata.FILEPATH_TEMPLATE, 0, 1, "train-00000-of-00001.tfrecord"),
        ("{SPLIT}/{SHARD_INDEX}", 7, 123456, "train/000007"),
        ("{SPLIT}-{NUM_SHARDS}", 0, 2, "train-00002"),
    ],
)
def test_fill_template_names_what_tfds_names(template, index, shards, name):
    tfds = pytest.importorskip("tensorflow_datasets")
    ours = published.fill_template(template, "train", index, shards, "ds")
    theirs = tfds.core.naming.ShardedFileTemplate(
        data_dir=Path("/"), template=template, dataset_name="ds", split="train",
        filetype_suffix="tfrecord",
    ).relative_filepath(shard_index=index, num_shards=shards)  # fmt: skip
    assert ours == theirs == name


@pytest.mark.parametrize("template", ["{SPLIT}-{SHARD}", "{0}", "{SPLIT.nope}", "{SPLIT:d}", "{"])
def test_fill_template_refuses_what_tfds_cannot_fill(template):
    with pytest.raises(ValueError, match="cannot be filled"):
        published.fill_template(template, "train", 0, 1, "ds")


@pytest.mark.parametrize(
    "entries, folders, problems",
    [
        (["m.json", "a.tfrecord", "a.tfrecord.idx"], set(), []),
        (["m.json", "b.tfrecord"], set(), ["b.tfrecord: not part of the dataset"]),
        (["m.json", "sub"], {"sub"}, ["sub/: a folder that is not part of the dataset"]),
        (["m.json", "sub/"], set(), ["sub/: a folder that is not part of the dataset"]),
        (["m.json", "", "/"], set(), []),
        ([".imagerecords-tmp/"], set(), [".imagerecords-tmp/: the converter's working folder"]),
    ],
)
def test_foreign_problems(entries, folders, problems):
    found = published.foreign_problems(
        entries, ["m.json", "a.tfrecord", "a.tfrecord.idx"], folders, "m.json"
    )
    assert len(found) == len(problems)
    for line, start in zip(found, problems, strict=True):
        assert line.startswith(start), line


def test_the_reader_names_the_files_tfds_metadata_writes():
    assert published.TFDS_FILES == tfds_metadata.FILES
    assert published.TFDS_FILE_FORMAT == tfds_metadata.FILE_FORMAT

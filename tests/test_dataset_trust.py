"""A dataset is input too: every reader opens only the files the dataset owns (issue 43).

One small dataset made by the real converter is copied and its metadata
edited one way per case: a name that leaves the folder (``..``, absolute, a
link out, another bucket), a special file (a FIFO, a device), a format bomb
in TFDS's template, deep JSON, wrong types and numbers. ``RecordSource``,
``reader.load_info`` (what ``make_dataset`` reads) and ``reader.inspect
--verify`` must each refuse with one ``DatasetError`` line naming the field,
never hang, never read outside, never say OK.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imagerecords import DatasetError, RecordSource, trust
from imagerecords import info as records_info
from reader import info as info_lib
from reader import inspect as inspect_tool
from reader import published
from tests.fuzz_readers import make_dataset

pytestmark = pytest.mark.e2e  # the dataset is made by the converter's command line

REPO = Path(__file__).resolve().parent.parent
INFO = "imagerecords.json"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("trust"))


@pytest.fixture
def copy(dataset, tmp_path) -> Path:
    target = tmp_path / "folder" / "ds"
    shutil.copytree(dataset, target)
    return target


def edit(path: Path, change, name: str = INFO) -> dict:
    doc = json.loads((path / name).read_text())
    change(doc)
    (path / name).write_text(json.dumps(doc))
    return doc


def first_shard(doc: dict) -> dict:
    return doc["splits"]["train"]["shards"][0]


def verify(path: Path) -> tuple[int, str]:
    out = io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        status = inspect_tool.main([str(path), "--verify", "--no_shuffle_check"])
    finally:
        sys.stdout, sys.stderr = saved
    return status, out.getvalue()


def refused_by_every_reader(path: Path, *words: str) -> None:
    """RecordSource, load_info and --verify each refuse ``path`` in one line with ``words``."""
    with pytest.raises(DatasetError) as raised:
        RecordSource(str(path), "train")
    message = str(raised.value)
    assert "\n" not in message and all(w in message for w in words), message
    with pytest.raises(info_lib.DatasetInfoError) as raised:
        info_lib.load_info(str(path))
    assert all(w in str(raised.value) for w in words), raised.value
    status, text = verify(path)
    assert status == inspect_tool.EXIT_PROBLEMS, text
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and all(w in errors[0] for w in words), text
    assert "verify: OK" not in text and "Traceback" not in text


# 3. Paths leave the dataset.


@pytest.mark.parametrize("field", ["file", "index"])
@pytest.mark.parametrize("name", ["../outside.tfrecord", "{outside}", "a/../../outside.tfrecord"])
def test_a_name_leading_out_of_the_folder_is_refused(copy, field, name):
    outside = copy.parent / "outside.tfrecord"
    shutil.copy(copy / "train-00000-of-00002.tfrecord", outside)  # a real shard, outside
    name = name.format(outside=outside)
    edit(copy, lambda doc: first_shard(doc).update({field: name}))
    refused_by_every_reader(copy, field, repr(name))


def test_a_link_out_of_the_folder_is_refused(copy):
    shard = copy / "train-00000-of-00002.tfrecord"
    outside = copy.parent / "moved.tfrecord"
    shard.rename(outside)
    shard.symlink_to(outside)  # the same bytes, through a link that leaves the folder
    refused_by_every_reader(copy, "leads outside the dataset")


def test_a_link_inside_the_folder_is_read(copy):
    shard = copy / "train-00000-of-00002.tfrecord"
    (copy / "sub").mkdir()
    shard.rename(copy / "sub" / shard.name)
    shard.symlink_to(Path("sub") / shard.name)
    assert len(RecordSource(str(copy), "train")) == 8
    assert info_lib.load_info(str(copy)).files("train")[0] == str(shard)


def test_whether_a_path_outside_exists_is_not_told(copy, tmp_path):
    (tmp_path / "exists").write_text("secret first line\n")
    said = []
    for name in ("../../exists", "../../missing"):
        edit(copy, lambda doc, name=name: first_shard(doc).update(file=name))
        status, text = verify(copy)
        said.append(text.replace(name, "NAME"))
        assert status == inspect_tool.EXIT_PROBLEMS and "secret" not in text
    assert said[0] == said[1]


def test_a_block_file_outside_is_a_verify_problem(copy, tmp_path):
    (tmp_path / "notes.jsonl").write_text("")
    edit(copy, lambda doc: doc["rejected"].update(file="../../notes.jsonl"))
    status, text = verify(copy)
    assert status == inspect_tool.EXIT_PROBLEMS
    assert "FAIL " in text and "'../../notes.jsonl' leads outside" not in text
    assert "'../../notes.jsonl' is not a file name inside the dataset" in text


@pytest.mark.parametrize("name", ["/local/path.tfrecord", "gs://other/x.tfrecord", "../x"])
def test_a_gcs_dataset_never_names_a_local_file_or_another_bucket(name):
    info = {"format_version": 3, "classes": ["a"], "splits": {"train": {"shards": [
        {"file": name, "num_examples": 1, "num_bytes": 100}]}}}  # fmt: skip
    with pytest.raises(DatasetError, match="not a file name inside the dataset"):
        records_info.split_shards("gs://bucket/ds", "gs://bucket/ds/" + INFO, info, "train")
    with pytest.raises(info_lib.DatasetInfoError, match="not a file name inside the dataset"):
        info_lib.info_from_dict({**info, "splits": info["splits"]}, "gs://bucket/ds")


# 4. Special files hang or exhaust memory.


@pytest.mark.timeout(120)
@pytest.mark.parametrize("field", ["file", "index"])
def test_a_fifo_is_refused_without_waiting_for_a_writer(copy, field):
    doc = json.loads((copy / INFO).read_text())
    target = copy / first_shard(doc)[field]
    target.unlink()
    os.mkfifo(target)  # nothing ever writes to it: opening it to read would block
    refused_by_every_reader(copy, "is a FIFO, not a regular file")


@pytest.mark.parametrize("field", ["file", "index"])
def test_a_device_is_refused(copy, field):
    edit(copy, lambda doc: first_shard(doc).update({field: "/dev/zero"}))
    refused_by_every_reader(copy, "'/dev/zero' is not a file name inside the dataset")
    (copy / "zero").symlink_to("/dev/zero")
    edit(copy, lambda doc: first_shard(doc).update({field: "zero"}))
    refused_by_every_reader(copy, "'zero' leads outside the dataset")


def test_a_fifo_put_there_after_the_check_does_not_block_a_read(copy):
    path = copy / "late.fifo"
    os.mkfifo(path)
    with pytest.raises(DatasetError, match="a FIFO, not a regular file"):
        trust.open_regular(str(path))
    with pytest.raises(DatasetError, match="a FIFO, not a regular file"):
        trust.read_local(str(path))


# 5. A format bomb in TFDS's template.


@pytest.mark.parametrize(
    "template",
    ["{SPLIT:>30}", "{SPLIT!r}", "{SPLIT[0]}", "{SPLIT.upper}", "{0}", "{SPLIT:>3000000000}"],
)
def test_a_template_of_a_form_tfds_does_not_write_is_refused(template):
    with pytest.raises(DatasetError, match="cannot be filled"):
        published.fill_template(template, "train", 0, 2, "ds")


def test_a_format_bomb_in_the_template_is_a_verify_problem(copy):
    bomb = "{SPLIT:>3000000000}"
    doc = json.loads((copy / "dataset_info.json").read_text())
    doc["splits"][0]["filepathTemplate"] = bomb
    (copy / "dataset_info.json").write_text(json.dumps(doc))
    status, text = verify(copy)
    assert status == inspect_tool.EXIT_PROBLEMS
    assert f"filepathTemplate '{bomb}' cannot be filled (not a form TFDS writes" in text


# 6. Tracebacks, not one line.


@pytest.mark.parametrize("name", [INFO, "features.json", "dataset_info.json"])
def test_deep_json_is_one_line(copy, name):
    doc = json.loads((copy / name).read_text())
    doc["deep"] = "DEEP"
    depth = 100_000
    (copy / name).write_text(json.dumps(doc).replace('"DEEP"', "[" * depth + "]" * depth))
    if name == INFO:
        refused_by_every_reader(copy, "JSON nested deeper than")
    else:
        status, text = verify(copy)
        assert status == inspect_tool.EXIT_PROBLEMS and "Traceback" not in text
        assert f"FAIL {name}: JSON nested deeper than {trust.MAX_JSON_DEPTH} levels" in text


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda doc: doc.update(rejected=[1]), "'rejected' must be an object"),
        (lambda doc: doc.update(features=[1]), "'features' must be an object"),
        (lambda doc: doc.update(format_version="3"), "format_version must be an integer"),
        (lambda doc: doc.update(format_version=True), "format_version must be an integer"),
        (lambda doc: first_shard(doc).update(num_examples="4"), "num_examples must be an integer"),
        (lambda doc: first_shard(doc).update(num_examples=4.0), "num_examples must be an integer"),
        (lambda doc: first_shard(doc).update(num_bytes=True), "num_bytes must be an integer"),
        (lambda doc: first_shard(doc).update(num_bytes=2**70), "num_bytes must be an integer"),
        (lambda doc: first_shard(doc).update(num_examples=10**6), "cannot fit in"),
        (lambda doc: first_shard(doc).update(sha256=[1]), "sha256 must be a hex string"),
    ],
)
def test_a_wrong_type_or_number_is_one_line(copy, change, words):
    edit(copy, change)
    status, text = verify(copy)
    assert status == inspect_tool.EXIT_PROBLEMS and "Traceback" not in text, text
    assert [line for line in text.splitlines() if line.startswith("error: ")], text
    assert words in text, text
    if "rejected" in words or "features" in words:
        return  # RecordSource has no use for those blocks
    with pytest.raises(DatasetError, match=words):
        RecordSource(str(copy), "train")


def test_an_unsupported_format_version_reads_as_a_sentence(copy):
    edit(copy, lambda doc: doc.update(format_version=99))
    with pytest.raises(DatasetError) as raised:
        RecordSource(str(copy), "train")
    message = str(raised.value)
    assert "format_version 99 is not supported" in message
    assert "format_version 99; this imagerecords reads 1, 2, 3" in message


@pytest.mark.parametrize(
    "line",
    [b"9" * 5000 + b" 100", b"0 " + str(2**70).encode(), b"0 1_000", b"+0 1000", b"0 \xd9\xa1"],
)
def test_an_index_line_out_of_range_is_one_line(copy, line):
    doc = json.loads((copy / INFO).read_text())
    index = copy / first_shard(doc)["index"]
    index.write_bytes(line + b"\n" + index.read_bytes().split(b"\n", 1)[1])
    with pytest.raises(DatasetError, match=re.escape(str(index))):  # too long, or not numbers
        RecordSource(str(copy), "train")
    status, text = verify(copy)
    assert status == inspect_tool.EXIT_PROBLEMS and "Traceback" not in text
    assert f"FAIL {index.name}: " in text


def test_record_source_errors_name_the_file(copy):
    doc = json.loads((copy / INFO).read_text())
    index = copy / first_shard(doc)["index"]
    index.rename(copy / "kept.idx")
    index.mkdir()  # IsADirectoryError before
    with pytest.raises(DatasetError, match=f"'{index.name}' is a folder, not a regular file"):
        RecordSource(str(copy), "train")
    index.rmdir()
    (copy / "kept.idx").rename(index)
    edit(copy, lambda doc: first_shard(doc).pop("num_bytes"))  # KeyError before
    with pytest.raises(DatasetError, match="shard 0: no num_bytes"):
        RecordSource(str(copy), "train")
    edit(copy, lambda doc: doc.update(classes=None))
    with pytest.raises(DatasetError, match="'classes' must be a list of names"):
        RecordSource(str(copy), "val")


def test_an_untouched_dataset_still_reads_and_verifies(dataset):
    assert len(RecordSource(str(dataset), "train")) == 8
    status, text = verify(dataset)
    assert status == inspect_tool.EXIT_OK and "verify: OK" in text, text


# 14, first bullet: reader.inspect outside the venv.


def test_inspect_without_the_dependencies_says_so_in_one_line():
    result = subprocess.run(
        [sys.executable, "-S", "-m", "reader.inspect", "somewhere"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    assert result.stderr.startswith("error: imagerecords is not installed for this Python")
    assert "source .venv/bin/activate" in result.stderr


def test_inspect_without_tensorflow_says_so_in_one_line(dataset):
    # A Python where TensorFlow cannot be imported (as in a Grain-only install).
    code = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "from reader import inspect\n"
        f"sys.exit(inspect.main([{str(dataset)!r}]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: reader.inspect needs TensorFlow"), result.stderr

"""A manifest's columns: a CSV header read by name, one white-space rule for CSV and JSONL."""

from __future__ import annotations

import csv
import json

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core.errors import UsageError
from beam_pipeline.storage import manifest
from tests import contract
from tests.image_factory import jpeg_bytes, photo


def _csv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return str(path)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def _read(path):
    return [tuple(row)[1:] for row in manifest.read_manifest(path, "/data")]


@pytest.mark.parametrize(
    "cells, columns",
    [
        (["path", "label"], ["path", "label"]),
        (["Path", " label ", "GROUP"], ["path", "label", "group"]),
        (["label", "group", "split", "path"], ["label", "group", "split", "path"]),
        (["a.jpg", "cat"], None),  # no column name: a row
        (["a.jpg", "cat", "train", "p7"], None),
    ],
)
def test_a_header_is_a_first_row_that_names_a_column(cells, columns):
    assert manifest.header_columns(cells) == columns


@pytest.mark.parametrize(
    "cells, message",
    [
        (["path", "label", "subject"], "unknown column 'subject'"),
        (["file", "label"], "unknown column 'file'"),
        (["path", "label", "path"], "names the column 'path' twice"),
        (["path", "group"], "no 'label' column"),
    ],
)
def test_a_header_that_names_another_column_is_refused(cells, message):
    with pytest.raises(ValueError, match=message):
        manifest.header_columns(cells)


@pytest.mark.parametrize(
    "value, name, path",
    [
        ("cat", "cat", "cat"),
        (" cat ", "cat", " cat "),  # a name is trimmed, a path kept as written
        ("   ", None, None),  # all white space: no value, in either
        ("", None, None),
        (None, None, None),
    ],
)
def test_one_white_space_rule(value, name, path):
    assert manifest.name_value(value) == name
    assert manifest.path_value(value) == path


def test_a_csv_header_names_its_columns_in_any_order(tmp_path):
    rows = [["path", "label", "group"], ["a.jpg", "cat", "subject-41223-77"]]
    assert _read(_csv(tmp_path / "m.csv", rows)) == [
        ("/data/a.jpg", "cat", None, "subject-41223-77")
    ]
    rows = [["group", "split", "path", "label"], ["p7", "", "b.jpg", "dog"], ["", "val", "c.jpg"]]
    with pytest.raises(UsageError, match=r"m2.csv:3: needs a path and a label"):
        _read(_csv(tmp_path / "m2.csv", rows))
    rows = rows[:2]
    assert _read(_csv(tmp_path / "m3.csv", rows)) == [("/data/b.jpg", "dog", None, "p7")]


def test_without_a_header_the_columns_keep_their_places(tmp_path):
    rows = [["a.jpg", "cat"], ["b.jpg", "dog", "val"], ["c.jpg", "dog", "", "p7"]]
    assert _read(_csv(tmp_path / "m.csv", rows)) == [
        ("/data/a.jpg", "cat", None, None),
        ("/data/b.jpg", "dog", "val", None),
        ("/data/c.jpg", "dog", None, "p7"),
    ]
    with pytest.raises(UsageError, match=r"m2.csv:3: expected path,label\[,split\[,group\]\]"):
        _read(_csv(tmp_path / "m2.csv", [*rows, ["d.jpg", "cat", "", "", "extra"]][1:]))


def test_an_unknown_column_is_refused_with_its_line(tmp_path, capsys):
    path = _csv(tmp_path / "m.csv", [[], ["path", "label", "subject"], ["a.jpg", "cat", "s1"]])
    assert main(["--manifest", path, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --manifest {path}:2: unknown column 'subject'"), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
    with pytest.raises(UsageError, match=r"m.jsonl:1: unknown key 'subject'"):
        _read(_jsonl(tmp_path / "m.jsonl", [{"path": "a.jpg", "label": "cat", "subject": "s"}]))
    rows = [["path", "label"], ["a.jpg", "cat", "train"]]
    with pytest.raises(UsageError, match=r"m2.csv:2: expected path,label, got"):
        _read(_csv(tmp_path / "m2.csv", rows))


def test_csv_and_jsonl_give_the_same_values_for_the_same_rows(tmp_path):
    rows = [
        {"path": "a.jpg", "label": "cat", "split": "", "group": " "},  # white space: no group
        {"path": "b.jpg", "label": " dog ", "split": " val", "group": "p7 "},
        {"path": "c.jpg ", "label": "dog", "split": "train", "group": "p7"},  # a name ending in " "
    ]
    header = list(rows[0])
    from_csv = _read(_csv(tmp_path / "m.csv", [header, *([r[k] for k in header] for r in rows)]))
    assert from_csv == _read(_jsonl(tmp_path / "m.jsonl", rows))
    assert from_csv == [
        ("/data/a.jpg", "cat", None, None),
        ("/data/b.jpg", "dog", "val", "p7"),
        ("/data/c.jpg ", "dog", "train", "p7"),
    ]


def test_a_file_name_with_spaces_at_its_ends_can_be_converted(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    names = [" lead.jpg", "trail.jpg ", "plain.jpg"]
    for seed, name in enumerate(names):
        (images / name).write_bytes(jpeg_bytes(photo(64, 48, seed=seed)))
    path = _csv(tmp_path / "m.csv", [["path", "label"], *([n, "cat"] for n in names)])
    argv = ["--manifest", path, "--input", str(images), "--output", str(tmp_path / "o")]
    assert main([*argv, "--quiet", "--splits", "train=1.0"]) == 0
    info = contract.load_info(str(tmp_path / "o"))
    assert info["splits"]["train"]["num_examples"] == 3
    assert info["rejected"]["count"] == 0

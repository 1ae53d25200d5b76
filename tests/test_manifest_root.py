"""Where a manifest's relative paths start: --input when given, else the manifest's folder."""

import csv

from beam_pipeline.__main__ import main
from tests import contract
from tests.image_factory import make_class_folders


def _manifest(path, rows):
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([["path", "label"], *rows])


def test_input_is_the_root_of_a_manifests_relative_paths(tmp_path):
    images = tmp_path / "images"
    ids = make_class_folders(str(images), classes=("x", "y"), per_class=4, nested=False)
    lists = tmp_path / "lists"
    lists.mkdir()
    _manifest(lists / "all.csv", [(i, i.split("/")[0]) for i in ids])
    argv = ["--manifest", str(lists / "all.csv"), "--input", str(images), "--quiet"]
    assert main([*argv, "--output", str(tmp_path / "o")]) == 0
    by_split = contract.check_output(str(tmp_path / "o"), str(images))
    assert sorted(i for rows in by_split.values() for i in contract.ids(rows)) == sorted(ids)
    assert contract.load_info(str(tmp_path / "o"))["rejected"]["count"] == 0


def test_without_input_relative_paths_start_at_the_manifest(tmp_path):
    ids = make_class_folders(str(tmp_path / "x"), classes=("a",), per_class=3, nested=False)
    _manifest(tmp_path / "m.csv", [(f"x/{i}", "a") for i in ids])
    argv = ["--manifest", str(tmp_path / "m.csv"), "--quiet", "--output", str(tmp_path / "o")]
    assert main(argv) == 0
    info = contract.load_info(str(tmp_path / "o"))
    assert sum(s["num_examples"] for s in info["splits"].values()) == 3


def test_manifest_with_a_missing_input_folder_is_refused(tmp_path, capsys):
    _manifest(tmp_path / "m.csv", [("a.jpg", "a")])
    argv = ["--manifest", str(tmp_path / "m.csv"), "--input", str(tmp_path / "nope")]
    assert main([*argv, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --input") and "relative paths start from" in err

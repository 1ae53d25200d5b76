"""Files that are not images to convert: skipped, listed, never rejected, never failing the job."""

import json
import os

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.storage import listing
from tests import contract
from tests.image_factory import jpeg_bytes, make_class_folders, photo


@pytest.mark.parametrize(
    "path, reason",
    [
        ("cat/LICENSE.txt", "not an image file (.txt)"),
        ("cat/labels.CSV", "not an image file (.csv)"),
        ("cat/sub/meta.json", "not an image file (.json)"),
        ("cat/README.md", "not an image file (.md)"),
        ("cat/page.html", "not an image file (.html)"),
        ("cat/x.xml", "not an image file (.xml)"),
        ("cat/scrape.py", "not an image file (.py)"),
        ("cat/a.jpg", None),
        ("cat/no_extension", None),  # recognised by content, or rejected with a reason
        ("cat/photo.txt.jpg", None),
        ("cat/notes.dat", None),
    ],
)
def test_skip_reason(path, reason):
    assert listing.skip_reason(path) == reason


def _write(path, data: bytes):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_loose_and_non_image_files_are_skipped_and_listed(tmp_path, capsys):
    root = tmp_path / "in"
    ids = make_class_folders(str(root), per_class=8)
    skipped = {
        "README.md": "not inside a class folder",
        "stray.jpg": "not inside a class folder",  # an image, but of no class
        "cat/LICENSE.txt": "not an image file (.txt)",
        "dog/batch0/meta.json": "not an image file (.json)",
        "fish/labels.csv": "not an image file (.csv)",
    }
    for rel in skipped:
        _write(str(root / rel), jpeg_bytes(photo(50, 40, seed=1)) if rel.endswith("jpg") else b"x")
    # 5 of 29 files would be 17% rejected: the default 1% limit would fail the job.
    assert main(["--input", str(root), "--output", str(tmp_path / "o"), "--quiet"]) == 0
    info = contract.load_info(str(tmp_path / "o"))
    assert info["skipped"] == {
        "count": 5,
        "file": "skipped.jsonl",
        "by_reason": {
            "not an image file (.csv)": 1,
            "not an image file (.json)": 1,
            "not an image file (.txt)": 1,
            "not inside a class folder": 2,
        },
    }
    with open(tmp_path / "o" / "skipped.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert rows == [
        {"path": str(root / rel), "reason": reason} for rel, reason in sorted(skipped.items())
    ]
    assert info["rejected"]["count"] == 0 and not contract.read_rejects(str(tmp_path / "o"))
    written = [
        i
        for rows in contract.check_output(str(tmp_path / "o")).values()
        for i in contract.ids(rows)
    ]
    assert sorted(written) == sorted(ids)
    out = capsys.readouterr().out
    assert "skipped 5 files" in out and "2 not inside a class folder" in out


def test_presplit_files_outside_class_folders_are_skipped(tmp_path):
    root = tmp_path / "in"
    make_class_folders(str(root / "train"), classes=("a", "b"), per_class=4, nested=False)
    make_class_folders(str(root / "val"), classes=("a", "b"), per_class=2, nested=False)
    _write(str(root / "train" / "notes.jpg"), jpeg_bytes(photo(50, 40, seed=1)))
    _write(str(root / "info.yaml"), b"x")
    assert main(["--input", str(root), "--output", str(tmp_path / "o"), "--quiet"]) == 0
    info = contract.load_info(str(tmp_path / "o"))
    assert info["skipped"]["by_reason"] == {"not inside a class folder": 2}
    assert sum(s["num_examples"] for s in info["splits"].values()) == 12


@pytest.mark.parametrize("layout", ["classes", "presplit"])
def test_a_symlink_loop_outside_the_class_folders_is_a_skipped_row(tmp_path, layout):
    root = tmp_path / "in"
    top = root / "train" if layout == "presplit" else root
    make_class_folders(str(top), classes=("a", "b"), per_class=3, nested=False)
    if layout == "presplit":
        make_class_folders(str(root / "val"), classes=("a", "b"), per_class=1, nested=False)
    os.symlink("loop", top / "loop")  # a link to itself: following it fails with ELOOP
    assert main(["--input", str(root), "--output", str(tmp_path / "o"), "--quiet"]) == 0
    with open(tmp_path / "o" / "skipped.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert rows == [{"path": str(top / "loop"), "reason": "not inside a class folder"}]
    info = contract.load_info(str(tmp_path / "o"))
    assert sum(s["num_examples"] for s in info["splits"].values()) == (
        8 if layout == "presplit" else 6
    )


def test_a_folder_of_only_non_images_is_refused_before_work(tmp_path, capsys):
    root = tmp_path / "in"
    _write(str(root / "cat" / "LICENSE.txt"), b"x")
    assert main(["--input", str(root), "--output", str(tmp_path / "o")]) == 2
    assert "no image files" in capsys.readouterr().err


def test_files_but_no_class_folders_say_so(tmp_path, capsys):
    root = tmp_path / "in"
    _write(str(root / "a.jpg"), jpeg_bytes(photo(50, 40, seed=1)))
    assert main(["--input", str(root), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no class folders" in err and "1 files must be inside class folders" in err

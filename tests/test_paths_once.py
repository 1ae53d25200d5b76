"""A location is made a place once, where it enters the run, and used as it is after.

``arguments.parse_args`` resolves --input, --manifest, --output and --reuse
(``paths.place``); a manifest's rows are normalised where they are read. No
other module normalises a path again: every spelling of a folder gives the
same dataset, byte for byte.
"""

import ast
import os
from pathlib import Path

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.cli import arguments
from beam_pipeline.storage import paths
from tests.image_factory import make_class_folders

PACKAGE = Path(__file__).resolve().parent.parent / "beam_pipeline"
NORMALISERS = {"normalize_root", "resolve", "place"}
# Where a location enters the run, and the module that defines the normalisers.
ENTRY_POINTS = {
    "cli/arguments.py": {"place"},  # the flags
    "storage/manifest.py": {"normalize_root"},  # a manifest's rows, as they are read
    "storage/paths.py": NORMALISERS,
}


def normaliser_calls(source: str) -> list[tuple[int, str]]:
    """(line, name) of each call of a normaliser in ``source``, by any spelling."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in NORMALISERS:
                found.append((node.lineno, name))
    return found


@pytest.mark.parametrize(
    "source, expected",
    [
        ("paths.normalize_root(x)", [(1, "normalize_root")]),
        ("normalize_root(x)", [(1, "normalize_root")]),
        ("from a import resolve as r\nr(x)\npaths.resolve(y)", [(3, "resolve")]),
        ("paths.place(p)", [(1, "place")]),
        ("paths.join(a, b)\nnormalize_root", []),  # named, not called
    ],
)
def test_normaliser_calls_are_found(source, expected):
    assert normaliser_calls(source) == expected


def test_only_the_entry_points_normalise_a_path():
    misplaced = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        allowed = ENTRY_POINTS.get(module, set())
        for line, name in normaliser_calls(path.read_text()):
            if name not in allowed:
                misplaced.append(f"beam_pipeline/{module}:{line} {name}")
    assert not misplaced, "normalised again after the entry point: " + ", ".join(misplaced)


def test_every_location_flag_is_a_place_once_parsed(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    command = arguments.parse_args(
        ["--input", "link/", "--output", "real/../out/", "--reuse", "./link/old"]
    )
    assert command.options.input == str(tmp_path / "real")
    assert command.config.output == str(tmp_path / "out")
    assert command.config.reuse == str(tmp_path / "real" / "old")
    gcs = arguments.parse_args(["--manifest", "gs://b/m.csv", "--output", "gs://b/out/"])
    assert (gcs.options.manifest, gcs.config.output) == ("gs://b/m.csv", "gs://b/out")
    assert paths.place("gs://b/out/") == "gs://b/out"


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.e2e
def test_every_spelling_of_the_input_gives_the_same_bytes(tmp_path, monkeypatch):
    """A trailing slash, a ``..`` and a symbolic link to the folder: one dataset."""
    images = tmp_path / "images"
    make_class_folders(str(images), classes=("a", "b"), per_class=4, nested=False)
    (tmp_path / "latest").symlink_to(images)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    spellings = {
        "plain": str(images),
        "slash": "images/",
        "dotdot": os.path.join("sub", "..", "images"),
        "link": "latest",
    }
    made = {}
    for name, spelling in spellings.items():
        out = tmp_path / f"out-{name}"
        argv = ["--input", spelling, "--output", str(out), "--quiet", "--local_processes", "1"]
        assert main(argv) == 0
        made[name] = _files(out)
    assert "imagerecords.json" in made["plain"]
    for name in spellings:
        assert made[name] == made["plain"], name

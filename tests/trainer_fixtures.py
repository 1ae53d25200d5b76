"""A small dataset written by the real converter, for the Grain and PyTorch loaders' tests."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

from imagerecords import RecordSource
from tests.image_factory import make_class_folders

REPO = Path(__file__).resolve().parent.parent
CLASSES = ("cat", "dog", "fish")


def convert(base: Path) -> types.SimpleNamespace:
    """39 images in 3 classes -> ``base/records`` (3 shards a split, index files).

    The train split's size is what the tests need: not a multiple of 2 or 3
    hosts, nor of their batch sizes, so that hosts get unequal shares and padding.
    """
    root, out = base / "images", base / "records"
    make_class_folders(str(root), classes=CLASSES, per_class=13, size_range=(40, 160))
    subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "--input", str(root), "--output", str(out)]
        + ["--min_shards", "3", "--index_files", "--quiet", "--splits", "train=0.8,val=0.2"],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    return types.SimpleNamespace(path=str(out), root=root)


def split_names(path: str, split: str) -> list[str]:
    """The split's file names in shard order."""
    source = RecordSource(path, split)
    return [record["filename"] for record in source]

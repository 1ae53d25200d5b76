"""End to end: the real converter (``python -m beam_pipeline``) -> the reader reads it all back."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import reader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLOURS = {"ant": (200, 30, 30), "bee": (30, 200, 30), "cow": (30, 30, 200)}


@pytest.mark.e2e
@pytest.mark.slow
def test_converter_output_reads_back_exactly(tmp_path):
    source = tmp_path / "images"
    written = {}
    for label, (name, colour) in enumerate(sorted(COLOURS.items())):
        (source / name).mkdir(parents=True)
        for i in range(10):
            # Varying sizes and aspect ratios; the converter resizes the shorter side.
            Image.new("RGB", (40 + 7 * i, 30 + 5 * (i % 4)), colour).save(
                source / name / f"{i:02d}.jpg", quality=92
            )
            written[f"{name}/{i:02d}.jpg"] = label
    output = tmp_path / "records"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "beam_pipeline",
            "--input",
            str(source),
            "--output",
            str(output),
            "--image_size",
            "32",
            "--splits",
            "train=0.7,val=0.3",
            "--min_shards",
            "2",
            "--direct_running_mode=in_memory",
            "--overwrite",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    info = reader.load_info(str(output))
    assert info.classes == tuple(sorted(COLOURS))
    assert sum(info.num_examples(s) for s in info.splits) == len(written)
    seen = {}
    for split in info.splits:
        ds = reader.make_dataset(
            str(output), split, 4, 16, training=False, return_dict=True, eval_crop="resize"
        )
        labels, names = [], []
        for batch in ds:
            labels += batch["label"].numpy().tolist()
            names += [n.decode() for n in batch["filename"].numpy()]
            for image, label in zip(batch["image"].numpy(), batch["label"].numpy(), strict=True):
                colour = COLOURS[info.classes[label]]
                assert np.abs(image.mean(axis=(0, 1)) - colour).max() < 10
        assert len(names) == info.num_examples(split)
        histogram = collections.Counter(info.classes[i] for i in labels)
        assert histogram == collections.Counter(info.class_counts(split))
        seen.update(zip(names, labels, strict=True))
    assert seen == written  # every image once, under its own label, in exactly one split

    x, y = next(iter(reader.make_dataset(str(output), "train", 4, 16, training=True, seed=0)))
    assert x.shape == (4, 16, 16, 3) and y.shape == (4,)

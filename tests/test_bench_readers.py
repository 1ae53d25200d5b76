"""bench.read.readers.ratio_lines: the reader ratios a run prints (images/s and CPU per image)."""

from __future__ import annotations

import pytest

from bench.read.readers import RATIOS, ReaderResult, ratio_lines


def _row(variant, images_per_s, cpu_ms, ok=True):
    return ReaderResult(variant, ok=ok, images_per_s=images_per_s, cpu_ms_per_image=cpu_ms)


@pytest.mark.parametrize(
    "rows, expected",
    [
        (
            [_row("imagerecords_train", 900.0, 0.8), _row("floor_crop_decode", 1000.0, 0.6)],
            ["training / crop-decode floor (goal >= 0.9x): 0.90x images/s, 0.75x CPU per image"],
        ),
        (
            [_row("imagerecords_eval", 1200.0, 0.5), _row("floor_full_decode", 1000.0, 0.6)],
            ["eval / full-decode floor (goal >= 0.9x): 1.20x images/s, 1.20x CPU per image"],
        ),
        (  # a baseline that failed leaves its ratios out
            [_row("imagerecords_train", 900.0, 0.8), _row("keras_dir", 300.0, 2.4, ok=False)],
            [],
        ),
        ([], []),
    ],
)
def test_ratio_lines(rows, expected):
    assert ratio_lines(rows) == expected


def test_every_ratio_names_pipelines_the_bench_runs():
    from bench.read.pipelines import VARIANTS

    for _, pipeline, baseline in RATIOS:
        assert pipeline in VARIANTS and baseline in VARIANTS

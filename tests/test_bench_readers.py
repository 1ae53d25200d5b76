"""bench.read: the reader ratios a run prints (images/s and CPU per image), the variants
it refuses without imagerecords output, the random window of the crop pipelines."""

from __future__ import annotations

import pytest
import tensorflow as tf  # at collection: importing it starts a program

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


def test_without_imagerecords_output_every_variant_that_reads_it_is_refused(tmp_path):
    from bench.read.pipelines import FILE_VARIANTS, RECORD_VARIANTS, VARIANTS
    from bench.read.readers import run_readers

    assert sorted((*FILE_VARIANTS, *RECORD_VARIANTS)) == sorted(VARIANTS)
    for records_dir in (None, tmp_path / "empty"):  # none written, or no info file in it
        results = run_readers(
            tmp_path, records_dir, batch=4, warmup=0, epochs=1, one_process=True,
            log_dir=tmp_path / "logs", timeout_s=60, variants=RECORD_VARIANTS,
        )  # fmt: skip
        assert [r.variant for r in results] == list(RECORD_VARIANTS)
        assert {(r.ok, r.note) for r in results} == {(False, "no imagerecords output to read")}
    assert not (tmp_path / "logs").exists()  # refused before any child ran


def test_random_window_lies_in_the_image_and_a_seed_fixes_it():
    from bench.read.pipelines import random_window
    from tests.image_factory import jpeg_bytes, photo

    encoded = tf.constant(jpeg_bytes(photo(120, 80, seed=1)))
    windows = set()
    for seed in range(20):
        y, x, height, width = random_window(encoded, tf.constant([seed, 7], tf.int64)).numpy()
        assert 0 <= y and y + height <= 80 and 0 <= x and x + width <= 120
        assert height * width >= 0.07 * 80 * 120  # the reader's smallest area, 8%, rounded
        again = random_window(encoded, tf.constant([seed, 7], tf.int64)).numpy()
        assert (y, x, height, width) == tuple(again)
        windows.add((y, x, height, width))
    assert len(windows) > 1
    y, x, height, width = random_window(encoded).numpy()  # the stateful op, no seed
    assert 0 <= y and y + height <= 80 and 0 <= x and x + width <= 120
    image = tf.io.decode_and_crop_jpeg(encoded, random_window(encoded), channels=3)
    assert image.shape[2] == 3

"""The GPU part's pure arithmetic and its report (bench/read/gpu_step.py, bench/report.py)."""

import pytest

from bench import report
from bench.read import gpu_step


@pytest.mark.parametrize(
    "model_step_s, steps, wall_s, expected",
    [
        (0.025, 100, 2.5, 0.0),  # the input kept up: the model-only time
        (0.025, 100, 5.0, 0.5),  # half of the wall clock waiting for input
        (0.025, 100, 10.0, 0.75),
        (0.025, 100, 2.4, 0.0),  # a little faster than synthetic (noise): clamped
    ],
)
def test_idle_fraction(model_step_s, steps, wall_s, expected):
    assert gpu_step.idle_fraction(model_step_s, steps, wall_s) == pytest.approx(expected)


@pytest.mark.parametrize("wall_s, steps", [(0.0, 10), (1.0, 0), (-1.0, 10)])
def test_idle_fraction_rejects_nonsense(wall_s, steps):
    with pytest.raises(ValueError):
        gpu_step.idle_fraction(0.01, steps, wall_s)


@pytest.mark.parametrize(
    "text, available, expected",
    [
        ("2,all", 16, [2, 16]),
        ("all", 2, [2]),
        ("2,all", 2, [2]),  # no duplicate row when "all" is 2 cores
        ("1,4,64", 16, [1, 4]),  # more than the machine has: dropped
    ],
)
def test_parse_cpu_counts(text, available, expected):
    assert gpu_step.parse_cpu_counts(text, available) == expected


@pytest.mark.parametrize("text", ["0", "two", "-1", "2,x"])
def test_parse_cpu_counts_rejects(text):
    with pytest.raises(ValueError, match="--host-cpus"):
        gpu_step.parse_cpu_counts(text, 8)


def test_report_table_shows_every_row_and_errors():
    gpu = {
        "skipped": "",
        "backend": "jax",
        "device": "NVIDIA H200",
        "batch": 128,
        "steps": 60,
        "warmup": 8,
        "rows": [
            {"variant": "synthetic", "host_cpus": 2, "images_per_s": 3000.0, "step_ms": 42.7,
             "host_wait_ms": 0.0, "accelerator_idle_fraction": 0.0},
            {"variant": "keras_dir", "host_cpus": 2, "images_per_s": 1000.0, "step_ms": 128.0,
             "host_wait_ms": 120.0, "accelerator_idle_fraction": 2 / 3},
            {"variant": "imagerecords_train_uint8", "host_cpus": 16, "error": "exit 1: boom"},
        ],
    }  # fmt: skip
    text = "\n".join(report._gpu_lines(gpu))
    assert "NVIDIA H200" in text and "Keras on jax" in text
    assert f"| 2 | {gpu_step.LABELS['keras_dir']} | 1,000.0 | 128.0 | 66.7% | 120.0 |" in text
    assert f"| 16 | {gpu_step.LABELS['imagerecords_train_uint8']} | - |" in text
    assert "exit 1: boom" in text


def test_report_says_why_skipped():
    text = "\n".join(report._gpu_lines({"skipped": "skipped: no GPU (x)", "rows": []}))
    assert text.endswith("skipped: no GPU (x)")

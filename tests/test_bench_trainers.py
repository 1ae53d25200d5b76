"""bench.trainers' loaders run on a small converted dataset and yield what is timed;
``python -m bench --only trainers`` writes their table beside the other parts'."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.common.epochs import read_results
from bench.train import pipelines as trainer_pipelines
from bench.train import trainers
from tests.image_factory import make_class_folders

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    base = tmp_path_factory.mktemp("bench-trainers")
    make_class_folders(str(base / "images"), per_class=8)
    out = base / "out"
    subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "--input", str(base / "images")]
        + ["--output", str(out), "--min_shards", "2", "--quiet"],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    return out


def _worker(variant, records, python=sys.executable):
    return subprocess.run(
        [python, "-m", "bench.train.worker", "--variant", variant]
        + ["--records", str(records), "--batch", "4", "--image-size", "32"]
        + ["--warmup", "0", "--epochs", "2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def _result(done) -> dict:
    (result,) = read_results(done.stdout).values()
    return result


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("variant", trainer_pipelines.VARIANTS)
def test_each_loader_yields_full_uint8_batches(records, variant):
    python = trainers.interpreter(variant)
    if python is None:
        pytest.skip("no torch venv (make test-torch builds it): the torch rows cannot run")
    done = _worker(variant, records, python)
    assert done.returncode == 0, done.stderr[-3000:]
    result = _result(done)
    assert result["ok"], result.get("note")
    train = json.loads((records / "imagerecords.json").read_text())["splits"]["train"]
    assert all(n >= train["num_examples"] for n in result["epoch_images"])
    assert result["images_per_s"] > 0 and result["cpu_ms_per_image"] > 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.e2e
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None, reason="torch is installed in this venv"
)
@pytest.mark.parametrize("variant", sorted(trainer_pipelines.TORCH_VARIANTS))
def test_a_torch_row_without_torch_says_so_in_one_line(records, variant):
    done = _worker(variant, records)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert _result(done) == {
        "variant": variant,
        "ok": False,
        "skipped": True,
        "note": f"not run: torch is not installed in {sys.executable}",
    }


def test_the_torch_rows_run_in_the_torch_venv_or_are_skipped(tmp_path):
    torch_python = tmp_path / "bin" / "python"
    assert trainers.interpreter("grain_workers", torch_python) == sys.executable
    assert trainers.interpreter("torch_workers", torch_python) is None
    torch_python.parent.mkdir()
    torch_python.touch()
    assert trainers.interpreter("torch_in_process", torch_python) == str(torch_python)
    skipped = trainers.not_installed("torch_workers")
    row = trainers.summarize("torch_workers", [skipped, skipped])
    assert not row["ok"] and row["skipped"] and row["note"] == skipped["note"]
    assert "make test-torch builds it" in row["note"]
    failed = trainers.summarize("crop_loop", [{"variant": "crop_loop", "ok": False, "note": "x"}])
    assert not failed["skipped"]
    assert trainers.succeeded({"rows": [row]}) and not trainers.succeeded({"rows": [row, failed]})
    text = trainers.table({"rounds": 2, "rows": [row]})
    assert f"| {trainer_pipelines.LABELS['torch_workers']} | n/a: not run: torch is not" in text


@pytest.mark.e2e
def test_the_floor_loop_makes_the_loaders_crops(records):
    """``crop_loop`` does per image what the loaders do: the same crop for a record and epoch."""
    from imagerecords import RecordSource, streams, transforms

    source = RecordSource(str(records), "train", parse=False)
    images, labels = next(iter(trainer_pipelines.crop_loop(records, 4, 32).dataset))
    assert images.shape == (4, 32, 32, 3) and images.dtype == np.uint8
    for i in range(4):
        rng = streams.crop_rng(trainer_pipelines.SHUFFLE_SEED, 0, i)
        expected = transforms.train_crop(source[i], rng, 32)
        assert np.array_equal(images[i], expected["image"]) and labels[i] == expected["label"]


@pytest.mark.e2e
def test_the_converted_folder_is_what_tfds_reads(records):
    """The converter writes TFDS's files beside the shards: the bench reads the folder itself."""
    from beam_pipeline.core import tfds_metadata

    tfds_info = json.loads((records / tfds_metadata.DATASET_INFO_FILE).read_text())
    assert tfds_info["fileFormat"] == "tfrecord"


def _round(images_per_s, cpu_ms, rss=100):
    return {"ok": True, "images_per_s": images_per_s, "cpu_ms_per_image": cpu_ms,
            "peak_tree_rss_mb": rss}  # fmt: skip


def test_a_row_is_the_best_round_and_a_ratio_to_the_reader_and_a_failure_says_why():
    rounds = [_round(400.0, 3.0), _round(500.0, 2.5, 120), _round(450.0, 2.7)]
    row = trainers.summarize("grain_workers", rounds)
    assert row["images_per_s"] == 500.0 and row["cpu_ms_per_image"] == 2.5
    assert row["cpu_ms_range"] == [2.5, 3.0] and row["peak_tree_rss_mb"] == 120
    reader = trainers.summarize("reader_uint8", [_round(900.0, 0.6), _round(800.0, 0.5)])
    failed = {"variant": "tfds_as_dataset", "ok": False, "note": "exit 1: ImportError: tfds"}
    half = trainers.summarize("tfds_as_dataset", [failed, _round(300.0, 1.5)])
    assert half["ok"] and half["rounds_ok"] == 1 and half["cpu_ms_range"] == [1.5, 1.5]
    none = trainers.summarize("tfds_as_dataset", [failed])
    assert not none["ok"] and none["note"] == failed["note"]
    assert trainers.cpu_ratios([reader, row, none]) == {"reader_uint8": 1.0, "grain_workers": 5.0}
    assert trainers.cpu_ratios([row]) == {}  # no reader measured: no ratio
    result = {"rounds": 3, "rows": [reader, row, none]}
    text = trainers.table(result)
    assert "| images/s (best of 3) | CPU ms per image (best of 3; range) |" in text
    assert f"| {trainer_pipelines.LABELS['reader_uint8']} | 900 | 0.50 (0.50-0.60) | 1.00 |" in text
    assert (
        f"| {trainer_pipelines.LABELS['grain_workers']} | 500 | 2.50 (2.50-3.00) | 5.00 | 120 |"
        in text
    )
    assert f"| {trainer_pipelines.LABELS['tfds_as_dataset']} | n/a: exit 1: " in text
    assert "n/a" in trainers.table({"rounds": 3, "rows": [row]}).splitlines()[-1]


@pytest.mark.e2e
@pytest.mark.slow
def test_make_bench_only_trainers_writes_trainers_md_and_json(tmp_path):
    """The part of ``make bench``: its own files, every loader measured, nothing else written."""
    pytest.importorskip("skimage")  # the web set is made from scikit-image's photos
    from bench import __main__ as bench_main

    results = tmp_path / "results"
    argv = ["--quick", "--only", "trainers", "--cache-dir", str(tmp_path / "cache")]
    assert bench_main.main(argv + ["--results-dir", str(results)]) == 0
    assert sorted(p.name for p in results.iterdir()) == ["trainers.json", "trainers.md"]
    raw = json.loads((results / "trainers.json").read_text())
    assert [r["variant"] for r in raw["rows"]] == list(trainer_pipelines.VARIANTS)
    # Every row measured; the torch ones only where the torch venv is.
    no_torch = trainers.interpreter("torch_workers") is None
    skipped = trainer_pipelines.TORCH_VARIANTS if no_torch else frozenset()
    measured = [r for r in raw["rows"] if r["variant"] not in skipped]
    assert all(r["ok"] and r["images_per_s"] > 0 and r["cpu_ms_per_image"] > 0 for r in measured)
    assert all(len(r["rounds"]) == raw["rounds"] == 1 for r in raw["rows"])
    # The timed batches outnumber, twice over, what a worker row's loader holds made
    # ahead: else the warm-up made the timed epochs and their CPU reads near 0.
    timed_batches = raw["epochs"] * math.ceil(raw["train_images"] / raw["batch"])
    assert timed_batches >= 2 * trainer_pipelines.batches_ahead()
    text = (results / "trainers.md").read_text()
    for label in trainer_pipelines.LABELS.values():
        assert f"| {label} | " in text
    assert trainers.table(raw) in text

"""bench.train.trainers' loaders run on a small converted dataset and yield what is timed;
``python -m bench --only trainers`` writes their table beside the other parts'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("variant", trainer_pipelines.VARIANTS)
def test_each_loader_yields_full_uint8_batches(records, variant):
    done = subprocess.run(
        [sys.executable, "-m", "bench.train.worker", "--variant", variant]
        + ["--records", str(records), "--batch", "4", "--image-size", "32"]
        + ["--warmup", "0", "--epochs", "2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("BENCH_RESULT "))
    result = json.loads(line[len("BENCH_RESULT ") :])
    assert result["ok"], result.get("note")
    train = json.loads((records / "imagerecords.json").read_text())["splits"]["train"]
    assert all(n >= train["num_examples"] for n in result["epoch_images"])
    assert result["images_per_s"] > 0 and result["cpu_ms_per_image"] > 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.e2e
def test_pipelines_yield_images_and_labels_in_process(records):
    """Shapes and dtypes of a batch (Grain's in-process form; TF ones are checked above)."""
    import grain

    from imagerecords import RecordSource

    source = RecordSource(str(records), "train")
    crop = trainer_pipelines.grain_crop
    batch = (
        grain.MapDataset.source(source)
        .random_map(lambda record, rng: crop(record, rng, size=32), seed=0)
        .batch(4)
        .map(trainer_pipelines.as_pair)[0]
    )
    images, labels = batch
    assert images.shape == (4, 32, 32, 3) and images.dtype.name == "uint8"
    assert list(labels) == [source[i]["label"] for i in range(4)]


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
    row = trainers.summarize("grain_source", rounds)
    assert row["images_per_s"] == 500.0 and row["cpu_ms_per_image"] == 2.5
    assert row["cpu_ms_range"] == [2.5, 3.0] and row["peak_tree_rss_mb"] == 120
    reader = trainers.summarize("reader_uint8", [_round(900.0, 0.6), _round(800.0, 0.5)])
    failed = {"variant": "tfds_as_dataset", "ok": False, "note": "exit 1: ImportError: tfds"}
    half = trainers.summarize("tfds_as_dataset", [failed, _round(300.0, 1.5)])
    assert half["ok"] and half["rounds_ok"] == 1 and half["cpu_ms_range"] == [1.5, 1.5]
    none = trainers.summarize("tfds_as_dataset", [failed])
    assert not none["ok"] and none["note"] == failed["note"]
    assert trainers.cpu_ratios([reader, row, none]) == {"reader_uint8": 1.0, "grain_source": 5.0}
    assert trainers.cpu_ratios([row]) == {}  # no reader measured: no ratio
    result = {"rounds": 3, "rows": [reader, row, none]}
    text = trainers.table(result)
    assert "| images/s (best of 3) | CPU ms per image (best of 3; range) |" in text
    assert f"| {trainer_pipelines.LABELS['reader_uint8']} | 900 | 0.50 (0.50-0.60) | 1.00 |" in text
    assert (
        f"| {trainer_pipelines.LABELS['grain_source']} | 500 | 2.50 (2.50-3.00) | 5.00 | 120 |"
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
    assert all(r["ok"] and r["images_per_s"] > 0 and r["cpu_ms_per_image"] > 0 for r in raw["rows"])
    assert all(len(r["rounds"]) == raw["rounds"] == 1 for r in raw["rows"])
    text = (results / "trainers.md").read_text()
    for label in trainer_pipelines.LABELS.values():
        assert f"| {label} | " in text
    assert trainers.table(raw) in text

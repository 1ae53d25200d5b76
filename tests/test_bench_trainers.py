"""bench.trainers' loaders run on a small converted dataset and yield what is timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import trainer_pipelines
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


@pytest.mark.slow
@pytest.mark.parametrize("variant", trainer_pipelines.VARIANTS)
def test_each_loader_yields_full_uint8_batches(records, variant):
    done = subprocess.run(
        [sys.executable, "-m", "bench.trainer_worker", "--variant", variant]
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


def test_the_converted_folder_is_what_tfds_reads(records):
    """The converter writes TFDS's files beside the shards: the bench reads the folder itself."""
    from beam_pipeline import tfds_metadata

    tfds_info = json.loads((records / tfds_metadata.DATASET_INFO_FILE).read_text())
    assert tfds_info["fileFormat"] == "tfrecord"

"""The converter quality figure (bench/convert/quality.py): found in real TFRecords, no TensorFlow."""

import io
import math

import numpy as np
import pytest
from PIL import Image

from bench.common.data import ImageSet
from bench.convert import quality
from bench.convert.imageops import convert_to_jpeg
from imagerecords import codec


def _photo_like(seed: int, size=(400, 300)) -> Image.Image:
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 4 * np.pi, size[0])
    y = np.linspace(0, 3 * np.pi, size[1])[:, None]
    base = 127 + 60 * np.sin(x + seed) * np.cos(y)
    pixels = base[..., None] + rng.normal(0, 6, (size[1], size[0], 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


@pytest.fixture
def image_set(tmp_path):
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    for i in range(3):
        _photo_like(i).save(root / ("a" if i < 2 else "b") / f"{i}.jpg", quality=92)
    _photo_like(9).save(root / "b" / "9.png")  # not a JPEG: never sampled
    return ImageSet("web", root, 4, 0, 0.12, {})


def _write_records(path, image_set, convert):
    with open(path, "wb") as f:
        for source in quality.sample_sources(image_set):
            name = str(source.relative_to(image_set.path))
            jpeg = convert(source.read_bytes())
            f.write(codec.frame_record(codec.make_example(
                {"image/encoded": jpeg, "image/filename": name, "image/class/label": 0}
            )))  # fmt: skip


def test_sample_is_the_jpeg_sources_in_file_order(image_set):
    names = [str(p.relative_to(image_set.path)) for p in quality.sample_sources(image_set)]
    assert names == ["a/0.jpg", "a/1.jpg", "b/2.jpg"]
    assert len(quality.sample_sources(image_set, limit=2)) == 2


def test_records_are_found_by_filename_and_scored(image_set, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _write_records(out / "train-00000-of-00001.tfrecord", image_set, convert_to_jpeg)
    found = quality.stored_jpegs(out, {"a/0.jpg", "b/2.jpg", "missing.jpg"})
    assert sorted(found) == ["a/0.jpg", "b/2.jpg"]
    assert Image.open(io.BytesIO(found["a/0.jpg"])).format == "JPEG"

    stored_psnr, stored_ssim = quality.converter_quality("imagerecords", image_set, out)
    floor_psnr, _ = quality.converter_quality("floor", image_set, None)
    # The records hold exactly the floor's JPEGs: the same figure by both routes.
    assert stored_psnr == pytest.approx(floor_psnr)
    assert 25 < stored_psnr < 60 and 0.5 < stored_ssim <= 1


def test_a_blurrier_converter_scores_lower(image_set, tmp_path):
    def blurry(data):
        small = Image.open(io.BytesIO(data)).convert("RGB").resize((50, 38))
        out = io.BytesIO()
        small.resize((341, 256), Image.Resampling.NEAREST).save(out, "JPEG", quality=90)
        return out.getvalue()

    sharp_dir, blurry_dir = tmp_path / "sharp", tmp_path / "blurry"
    sharp_dir.mkdir()
    blurry_dir.mkdir()
    _write_records(sharp_dir / "x.tfrecord", image_set, convert_to_jpeg)
    _write_records(blurry_dir / "x.tfrecord", image_set, blurry)
    sharp = quality.converter_quality("naive", image_set, sharp_dir)[0]
    soft = quality.converter_quality("naive", image_set, blurry_dir)[0]
    assert sharp > soft + 3


def test_no_output_gives_nan(image_set, tmp_path):
    assert all(math.isnan(v) for v in quality.converter_quality("naive", image_set, None))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert all(math.isnan(v) for v in quality.converter_quality("naive", image_set, empty))


def test_psnr_of_identical_and_known_error():
    a = np.zeros((4, 4, 3))
    assert quality.psnr(a, a) == math.inf
    assert quality.psnr(a, a + 25.5) == pytest.approx(20.0)  # MSE 255^2 / 100

"""--resample: the converter's downscaling filter (bicubic default, bilinear, lanczos)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from beam_pipeline import __main__ as cli
from beam_pipeline.core import images


def _photo() -> bytes:
    """A detailed 1200x900 JPEG (a real photo, upscaled, plus grain): filters differ on it."""
    from skimage import data as skdata

    rng = np.random.default_rng(0)
    pixels = np.asarray(Image.fromarray(skdata.astronaut()).resize((1200, 900)), np.int16)
    pixels = np.clip(pixels + rng.normal(0, 6, pixels.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * np.log10(255.0**2 / mse)


def test_each_filter_stores_the_same_size_and_sharpness_follows_the_filter():
    data = _photo()
    with Image.open(io.BytesIO(data)) as source:
        reference = np.asarray(source.convert("RGB").resize((341, 256), Image.Resampling.LANCZOS))
    quality = {}
    outputs = {}
    for name in images.RESAMPLE_FILTERS:
        out = images.convert(data, images.ImageSpec(resample=name))
        assert (out.width, out.height) == (341, 256)
        decoded = np.asarray(Image.open(io.BytesIO(out.jpeg)).convert("RGB"))
        quality[name] = _psnr(reference, decoded)
        outputs[name] = out.jpeg
    assert len(set(outputs.values())) == 3  # the flag reaches the resize
    # Against a full-decode Lanczos reference: the softer the filter, the lower the PSNR.
    assert quality["bilinear"] < quality["bicubic"] < quality["lanczos"], quality
    # The default is bicubic: unchanged output for everyone who does not pass the flag.
    assert images.convert(data, images.ImageSpec()).jpeg == outputs["bicubic"]
    # Deterministic: the same bytes again.
    assert images.convert(data, images.ImageSpec(resample="lanczos")).jpeg == outputs["lanczos"]


def test_unknown_filter_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="--resample must be one of bicubic, bilinear, lanczos"):
        images.ImageSpec(resample="nearest")
    status = cli.main(
        ["--input", str(tmp_path), "--output", str(tmp_path / "o"), "--resample", "box"]
    )
    assert status == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--resample" in err
    assert not (tmp_path / "o").exists()

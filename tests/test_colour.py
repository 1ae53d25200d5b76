"""Embedded colour profiles -> sRGB, asserted on pixels (profiles from tests/icc_profiles.py)."""

import io

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageCms

from beam_pipeline.core import colour, images
from tests import icc_profiles as icc

NONE = images.ImageSpec(resize="none")
SRGB = ImageCms.createProfile("sRGB")


def _saturated() -> Image.Image:
    """Saturated hues and greys: where wide-gamut numbers read as sRGB go most wrong."""
    hue = np.linspace(0, 255, 192, dtype=np.uint8)
    hsv = np.stack(
        [
            np.tile(hue, (64, 1)),
            np.full((64, 192), 200, np.uint8),
            np.full((64, 192), 220, np.uint8),
        ],
        -1,
    )
    colours = np.asarray(Image.fromarray(hsv, "HSV").convert("RGB"))
    grey = np.repeat(np.tile(hue, (32, 1))[..., None], 3, axis=-1)
    return Image.fromarray(np.concatenate([colours, grey]))


def _diff(a, b) -> float:
    return float(np.abs(np.asarray(a, float) - np.asarray(b, float)).mean())


def _out(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(images.convert(data, NONE).jpeg)).convert("RGB")


def _encode(image: Image.Image, fmt: str = "JPEG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "definition, name", [(icc.DISPLAY_P3, "Display P3"), (icc.ADOBE_RGB, "Adobe RGB")]
)
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_wide_gamut_images_come_out_as_their_srgb_original(definition, name, fmt):
    original = _saturated()
    profile = icc.rgb_profile(definition, name)
    to_wide = ImageCms.buildTransform(
        SRGB, ImageCms.ImageCmsProfile(io.BytesIO(profile)), "RGB", "RGB"
    )
    wide = ImageCms.applyTransform(original, to_wide)
    options = {"quality": 95} if fmt == "JPEG" else {}
    converted = _out(_encode(wide, fmt, icc_profile=profile, **options))
    dropped = _diff(wide, original)  # what ignoring the profile gives
    assert _diff(converted, original) < 2.5
    assert dropped > 3 * _diff(converted, original)


def test_an_srgb_profile_costs_no_transform_and_allows_pass_through():
    srgb_bytes = ImageCms.ImageCmsProfile(SRGB).tobytes()
    handmade = icc.rgb_profile(icc.SRGB, "sRGB (hand-made)")
    assert colour.is_srgb(srgb_bytes) and colour.is_srgb(handmade)
    assert not colour.is_srgb(icc.rgb_profile(icc.DISPLAY_P3, "P3"))
    data = _encode(_saturated(), quality=90, icc_profile=handmade)
    converted = images.convert(data, NONE)
    assert converted.passed_through and converted.jpeg == data


def test_a_wide_gamut_jpeg_is_never_passed_through():
    profile = icc.rgb_profile(icc.DISPLAY_P3, "P3")
    data = _encode(_saturated(), quality=90, icc_profile=profile)
    converted = images.convert(data, NONE)
    assert not converted.passed_through
    assert "icc_profile" not in Image.open(io.BytesIO(converted.jpeg)).info


def _cmyk_of(original: Image.Image) -> np.ndarray:
    """Ink fractions under the test profile's model, as 8-bit CMYK."""
    ink = icc.ink_model_cmyk(np.asarray(original, float) / 255)
    return np.round(ink * 255).astype(np.uint8)


def test_cmyk_jpeg_with_a_profile_uses_it():
    original = _saturated()
    cmyk = Image.frombytes("CMYK", original.size, _cmyk_of(original).tobytes())
    data = _encode(cmyk, quality=95, icc_profile=icc.cmyk_profile())  # Adobe, inverted
    converted = _out(data)
    assert _diff(converted, original) < 4
    assert _diff(cmyk.convert("RGB"), original) > 5 * _diff(converted, original)


def test_ycck_jpeg_with_adobe_inverted_ink_and_a_profile():
    original = _saturated()
    # Photoshop stores CMYK inverted (0 = full ink); libjpeg-turbo writes it as YCCK.
    inverted = np.ascontiguousarray(255 - _cmyk_of(original))
    ycck = simplejpeg.encode_jpeg(inverted, quality=95, colorspace="CMYK")
    assert simplejpeg.decode_jpeg_header(ycck)[2] == "YCCK"
    converted = _out(icc.with_icc_segment(ycck, icc.cmyk_profile()))
    assert _diff(converted, original) < 4


@pytest.mark.parametrize("ycck", [False, True], ids=["cmyk", "ycck"])
def test_cmyk_jpeg_without_a_profile_uses_pillows_conversion(ycck):
    original = _saturated()
    cmyk = original.convert("CMYK")  # Pillow's own (naive) separation
    if ycck:
        raw = np.ascontiguousarray(255 - np.asarray(cmyk))
        data = simplejpeg.encode_jpeg(raw, quality=95, colorspace="CMYK")
    else:
        data = _encode(cmyk, quality=95)
    assert _diff(_out(data), original) < 3


def test_grey_image_with_a_grey_profile():
    ramp = Image.linear_gradient("L").resize((64, 64))
    grey_profile = ImageCms.ImageCmsProfile(SRGB)  # an RGB profile on a grey image: bad
    data = _encode(ramp, quality=95, icc_profile=grey_profile.tobytes())
    converted = images.convert(data, NONE)
    assert converted.bad_profile
    assert _diff(Image.open(io.BytesIO(converted.jpeg)).convert("L"), ramp) < 2


@pytest.mark.parametrize("profile", [b"not a profile at all", b"\0" * 200], ids=["junk", "zeros"])
def test_an_unparseable_profile_keeps_the_pixels_and_is_counted(profile):
    original = _saturated()
    data = _encode(original, "PNG", icc_profile=profile)
    converted = images.convert(data, NONE)
    assert converted.bad_profile and not converted.passed_through
    assert _diff(Image.open(io.BytesIO(converted.jpeg)), original) < 2.5


def test_alpha_image_with_a_profile_is_composited_then_converted():
    original = _saturated()
    profile = icc.rgb_profile(icc.DISPLAY_P3, "P3")
    to_wide = ImageCms.buildTransform(
        SRGB, ImageCms.ImageCmsProfile(io.BytesIO(profile)), "RGB", "RGB"
    )
    rgba = ImageCms.applyTransform(original, to_wide).convert("RGBA")
    converted = _out(_encode(rgba, "PNG", icc_profile=profile))
    assert _diff(converted, original) < 2.5

"""Pillow conversion: modes, orientation, resize modes, draft, rejections."""

import io

import pytest
from PIL import Image, ImageChops, ImageOps, ImageStat

from beam_pipeline.core import images
from beam_pipeline.core.orientation import UPRIGHT_TRANSPOSE
from tests.image_factory import jpeg_bytes, photo

SPEC = images.ImageSpec()


def _encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _decode(converted: images.EncodedImage) -> Image.Image:
    image = Image.open(io.BytesIO(converted.jpeg))
    assert image.format == "JPEG" and image.mode == "RGB"
    assert not image.info.get("progressive")
    assert image.size == (converted.width, converted.height)
    return image


def _mean(image: Image.Image):
    return tuple(round(v) for v in ImageStat.Stat(image.convert("RGB")).mean)


def _close(a, b, tolerance=6):
    return all(abs(x - y) <= tolerance for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "mode, colour, expected",
    [
        ("L", 128, (128, 128, 128)),
        ("1", 1, (255, 255, 255)),
        ("CMYK", (0, 255, 255, 0), (255, 0, 0)),  # pure red in CMYK
        ("RGBA", (0, 0, 255, 0), (255, 255, 255)),  # fully transparent -> white
        ("RGBA", (0, 0, 255, 255), (0, 0, 255)),
        ("LA", (0, 0), (255, 255, 255)),
    ],
)
def test_modes_become_rgb_with_right_colours(mode, colour, expected):
    image = Image.new(mode, (40, 30), colour)
    fmt = "TIFF" if mode == "CMYK" else "PNG"
    converted = images.convert(_encode(image, fmt), SPEC)
    assert _close(_mean(_decode(converted)), expected), _mean(_decode(converted))


def test_cmyk_jpeg():
    image = Image.new("CMYK", (64, 48), (0, 255, 255, 0))
    converted = images.convert(_encode(image, "JPEG", quality=95), SPEC)
    assert _close(_mean(_decode(converted)), (255, 0, 0), tolerance=12)


def test_palette_with_transparency_goes_onto_white():
    image = Image.new("P", (30, 30), 0)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    image.paste(1, (0, 0, 15, 30))  # left half red, right half index 0 = transparent
    data = _encode(image, "PNG", transparency=0)
    out = _decode(images.convert(data, SPEC))
    assert _close(out.getpixel((3, 15)), (255, 0, 0), 12)
    assert _close(out.getpixel((27, 15)), (255, 255, 255), 12)


def test_16_bit_grey_is_scaled_not_clipped():
    image = Image.new("I;16", (32, 32), 32768)  # mid grey in 16 bits
    out = _decode(images.convert(_encode(image, "PNG"), SPEC))
    assert _close(_mean(out), (128, 128, 128), 3)


def test_animated_gif_uses_first_frame():
    frames = [Image.new("RGB", (40, 40), c) for c in ((255, 0, 0), (0, 0, 255))]
    data = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert _close(_mean(_decode(images.convert(data, SPEC))), (255, 0, 0), 10)


@pytest.mark.parametrize(
    "orientation, upright_size", [(1, (60, 40)), (6, (40, 60)), (8, (40, 60)), (3, (60, 40))]
)
def test_exif_orientation_gives_upright_output(orientation, upright_size):
    # Stored 60x40 with a red left half; orientation 6 = rotate 90 CW for display.
    image = Image.new("RGB", (60, 40), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 30, 40))
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = jpeg_bytes(image, quality=95, exif=exif.tobytes())
    out = _decode(images.convert(data, SPEC))
    assert out.size == upright_size
    expected = ImageChopsTranspose.apply(image, orientation)
    assert _close(out.getpixel((2, 2)), expected.getpixel((2, 2)), 30)
    assert _close(
        out.getpixel((out.width - 3, out.height - 3)),
        expected.getpixel((expected.width - 3, expected.height - 3)),
        30,
    )


class ImageChopsTranspose:
    @staticmethod
    def apply(image, orientation):
        method = {
            3: Image.Transpose.ROTATE_180,
            6: Image.Transpose.ROTATE_270,
            8: Image.Transpose.ROTATE_90,
        }.get(orientation)
        return image.transpose(method) if method else image


@pytest.mark.parametrize("orientation", range(1, 10))
def test_upright_transpose_is_pillows_exif_transpose(orientation):
    # The table the converter and the benchmark's floor both apply, against
    # Pillow's own reading of the tag (9: not a valid value, left as stored).
    image = Image.new("RGB", (3, 2))
    image.putdata([(i * 40, 0, 0) for i in range(6)])
    exif = Image.Exif()
    exif[0x0112] = orientation
    tagged = Image.open(io.BytesIO(_png(image, exif)))
    method = UPRIGHT_TRANSPOSE.get(orientation)
    ours = image.transpose(method) if method is not None else image
    assert list(ours.getdata()) == list(ImageOps.exif_transpose(tagged).getdata())


def _png(image: Image.Image, exif: Image.Exif) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", exif=exif)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "resize, size, source, upscale, expected",
    [
        ("shorter", 256, (1024, 768), False, (341, 256)),
        ("shorter", 256, (768, 1024), False, (256, 341)),
        ("shorter", 256, (200, 100), False, (200, 100)),  # never upscale by default
        ("shorter", 256, (200, 100), True, (512, 256)),
        ("longer", 256, (1024, 768), False, (256, 192)),
        ("crop", 128, (400, 300), False, (128, 128)),
        ("crop", 128, (100, 300), False, (128, 128)),  # too small: enlarged, then cropped
        ("crop", 128, (63, 35), False, (128, 128)),
        ("crop", 128, (300, 127), False, (128, 128)),
        ("pad", 128, (400, 200), False, (128, 128)),
        ("pad", 128, (60, 40), False, (128, 128)),
        ("none", 128, (400, 300), False, (400, 300)),
    ],
)
def test_resize_modes(resize, size, source, upscale, expected):
    spec = images.ImageSpec(resize=resize, size=size, upscale=upscale)
    data = _encode(photo(*source, seed=3), "PNG")
    converted = images.convert(data, spec)
    assert (converted.width, converted.height) == expected


@pytest.mark.slow
@pytest.mark.parametrize("resize", ["crop", "pad"])
@pytest.mark.parametrize("upscale", [False, True])
def test_crop_and_pad_always_give_size_by_size(resize, upscale):
    """Whatever the source: tiny or huge, grey, rotated by EXIF, draft-decoded JPEG."""
    import random

    rng = random.Random(f"{resize}{upscale}")
    for _ in range(40):
        width, height = rng.choice([1, 7, 35, 127, 128, 129, 500, 1999]), rng.randint(1, 1500)
        size = rng.choice([1, 31, 127, 128, 224, 256])
        exif = Image.Exif()
        exif[0x0112] = rng.choice([1, 3, 6, 8])
        image = Image.new(rng.choice(["RGB", "L"]), (width, height), 90)
        data = _encode(image, rng.choice(["JPEG", "PNG"]), exif=exif.tobytes())
        spec = images.ImageSpec(resize=resize, size=size, upscale=upscale)
        converted = images.convert(data, spec)
        assert (converted.width, converted.height) == (size, size), (width, height, size)


def test_target_size_gives_the_scaling_side_exactly():
    for width in range(1, 700, 7):
        for height in range(1, 700, 11):
            for size in (64, 127, 128, 299):
                w, h = images.target_size(width, height, images.ImageSpec("crop", size))
                assert min(w, h) == size and max(w, h) >= size
                w, h = images.target_size(width, height, images.ImageSpec("longer", size, True))
                assert max(w, h) == size


def test_crop_enlarges_a_small_image():
    image = Image.new("RGB", (40, 20), (200, 30, 30))
    image.paste((30, 200, 30), (10, 0, 30, 20))  # a green middle
    out = _decode(images.convert(_encode(image, "PNG"), images.ImageSpec(resize="crop", size=64)))
    assert out.size == (64, 64)
    assert _close(out.getpixel((32, 32)), (30, 200, 30), 12)  # the middle, not black bars


def test_pad_letterboxes_with_black_bars():
    image = Image.new("RGB", (400, 200), (255, 255, 255))
    out = _decode(images.convert(_encode(image, "PNG"), images.ImageSpec(resize="pad", size=128)))
    assert _close(out.getpixel((64, 5)), (0, 0, 0), 10)  # top bar
    assert _close(out.getpixel((64, 64)), (255, 255, 255), 10)


def test_draft_on_large_jpeg_is_exact_enough():
    large = photo(3000, 2000, seed=11)
    data = jpeg_bytes(large, quality=92)
    fast = _decode(images.convert(data, SPEC))
    reference = large.resize(fast.size, Image.Resampling.LANCZOS)
    diff = ImageChops.difference(fast, reference)
    mse = sum(v * v * n for v, n in zip(range(256), diff.convert("L").histogram(), strict=True)) / (
        fast.width * fast.height
    )
    assert fast.size == (384, 256)
    assert mse < 10, mse  # PSNR > 38 dB against a full-resolution Lanczos resize


def test_baseline_rgb_jpeg_of_right_size_passes_through():
    data = jpeg_bytes(photo(256, 200, seed=2), quality=80)
    converted = images.convert(data, SPEC)
    assert converted.passed_through and converted.jpeg == data
    progressive = jpeg_bytes(photo(256, 200, seed=2), quality=80, progressive=True)
    converted = images.convert(progressive, SPEC)
    assert not converted.passed_through and converted.jpeg != progressive


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "empty file"),
        (b"hello world, not an image", "not an image"),
        (b"\xff\xd8\xff\xe0 broken jpeg", "corrupt image"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "corrupt image"),
    ],
)
def test_bad_bytes_are_rejected_with_reason(data, reason):
    with pytest.raises(images.Rejected, match=reason):
        images.convert(data, SPEC)


def test_truncated_jpeg_is_rejected():
    data = jpeg_bytes(photo(300, 200, seed=5))
    with pytest.raises(images.Rejected, match="corrupt image"):
        images.convert(data[: len(data) // 2], SPEC)


def test_decompression_bomb_limit_is_kept(monkeypatch):
    data = _encode(Image.new("L", (200, 200)), "PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    with pytest.raises(images.Rejected, match="decompression bomb"):
        images.convert(data, SPEC)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"resize": "stretch"}, "--resize"),
        ({"jpeg_quality": 0}, "--jpeg_quality"),
        ({"jpeg_quality": 101}, "--jpeg_quality"),
        ({"size": 0}, "--image_size"),
    ],
)
def test_spec_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        images.ImageSpec(**kwargs)


@pytest.mark.parametrize("fmt", ["TIFF", "PNG", "WEBP"])
def test_orientation_in_other_formats_is_applied_once(fmt):
    image = Image.new("RGB", (60, 40), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 30, 40))
    if fmt == "TIFF":
        data = _encode(image, fmt, tiffinfo={0x0112: 6})
    else:
        exif = Image.Exif()
        exif[0x0112] = 6
        data = _encode(image, fmt, exif=exif.tobytes())
    out = _decode(images.convert(data, SPEC))
    assert out.size == (40, 60)
    # Rotated 90 degrees clockwise for display: the red left half is now on top.
    assert _close(out.getpixel((20, 5)), (255, 0, 0), 40)
    assert _close(out.getpixel((20, 55)), (0, 0, 255), 40)

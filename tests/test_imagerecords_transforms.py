"""imagerecords.transforms against the tf.data reader: the same windows, the same pixels, no raise.

The reader's side is its own code (``reader.decode``, ``reader.parser.Parser``),
run here with TensorFlow; the transforms themselves import none.
"""

from __future__ import annotations

import copy
import inspect
import io
import re

import numpy as np
import pytest
import simplejpeg
import tensorflow as tf
from PIL import Image
from scipy import stats

from beam_pipeline.core import images
from imagerecords import RecordSource, transforms
from imagerecords.transforms import Window
from reader import decode
from reader.config import AugmentConfig
from reader.parser import Parser
from tests.image_factory import jpeg_bytes, photo
from tests.shard_fixtures import CLASS_COLOURS, write_dataset

JPEG_LIMIT = 65500  # the largest side a JPEG (and --image_size) can have


def converted(source: Image.Image, **spec) -> bytes:
    """The record's JPEG the converter stores for ``source`` under ``ImageSpec(**spec)``."""
    return images.convert(jpeg_bytes(source, quality=95), images.ImageSpec(**spec)).jpeg


def smooth(width: int, height: int, period: float = 160.0) -> Image.Image:
    """Slow sinusoids: no detail a DCT-scaled decode could lose, steep enough to show a shift."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    wave = lambda phase: 127.5 + 120 * np.sin(2 * np.pi * (x + 0.7 * y) / period + phase)  # noqa: E731
    pixels = np.stack([wave(0.0), wave(2.0), wave(4.0)], axis=-1)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def reader_pixels(encoded: bytes, window: Window, size: int, whole: bool = False) -> np.ndarray:
    """The reader's uint8 result for ``window``: its crop decode, bilinear resize and cast.

    ``whole``: slice the window out of a full decode instead of
    ``decode_and_crop_jpeg`` (which differs at the window's edge columns).
    """
    if whole:
        image = tf.io.decode_jpeg(encoded, channels=3)
        image = image[window.y : window.y + window.height, window.x : window.x + window.width]
    else:
        image = tf.io.decode_and_crop_jpeg(encoded, list(window), channels=3)
    resized = decode.resize(image, (size, size), "bilinear")
    return decode.normalize(resized, "0_255", tf.uint8).numpy()


def differences(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    assert ours.shape == theirs.shape and ours.dtype == np.uint8
    return np.abs(ours.astype(np.int16) - theirs.astype(np.int16))


# -- the reader's settings --------------------------------------------------------------


def test_defaults_are_the_readers():
    augment = AugmentConfig()
    assert transforms.AREA_RANGE == augment.crop_area_range
    assert transforms.ASPECT_RATIO_RANGE == augment.crop_aspect_ratio_range
    assert transforms.CENTER_CROP_FRACTION == augment.center_crop_fraction
    assert augment.eval_crop == "center" and augment.resize_method == "bilinear"
    parameters = inspect.signature(decode.random_crop_window).parameters
    assert transforms.MAX_ATTEMPTS == parameters["max_attempts"].default
    assert transforms.MIN_OBJECT_COVERED == parameters["min_object_covered"].default


# -- windows ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "height, width, size",
    [
        (256, 341, 224),
        (341, 256, 224),
        (256, 256, 224),
        (224, 224, 224),
        (1, 1, 224),
        (1, 1, 1),
        (1, JPEG_LIMIT, 224),
        (JPEG_LIMIT, 1, 3),
        (JPEG_LIMIT, JPEG_LIMIT, 224),
        (5, 3, 7),
        (300, 7, 64),
        (1023, 1025, 299),
        (17, 4000, 1),
    ],
)
def test_center_window_is_the_readers(height, width, size):
    theirs = decode.center_crop_window(
        tf.constant([height, width, 3]), (size, size), transforms.CENTER_CROP_FRACTION
    )
    assert transforms.center_window(height, width, size) == tuple(theirs.numpy().tolist())


def reader_windows(height: int, width: int, count: int, seed: int) -> np.ndarray:
    """``count`` windows of the reader's sampler, one per stateless seed ``(i, seed)``."""
    shape = tf.constant([height, width, 3])
    windows = tf.data.Dataset.range(count).map(
        lambda i: decode.random_crop_window(
            shape,
            tf.stack([i, tf.constant(seed, tf.int64)]),
            transforms.AREA_RANGE,
            transforms.ASPECT_RATIO_RANGE,
        )
    )
    return next(iter(windows.batch(count))).numpy()


@pytest.mark.parametrize(
    "height, width",
    [(256, 341), (341, 256), (100, 1000), (37, 23), (10, 10), (3, 40), (1, 2), (1000, 7)],
)
def test_random_window_has_the_readers_distribution(height, width):
    """Both samplers' windows: the same fallback rate, and each coordinate alike (KS test).

    Seeded on both sides, so the verdict is the same on every run; a sampler
    drawing the area uniformly, or the aspect ratio log-uniformly, or falling
    back to a centred square, fails it.
    """
    count = 4000
    theirs = reader_windows(height, width, count, seed=7)
    rng = np.random.default_rng(7)
    ours = np.array([transforms.random_window(height, width, rng) for _ in range(count)])
    whole = np.array([0, 0, height, width])
    assert abs((theirs == whole).all(1).mean() - (ours == whole).all(1).mean()) < 0.02
    for column in range(4):
        if np.ptp(theirs[:, column]) == 0:
            assert (ours[:, column] == theirs[0, column]).all()
        else:
            assert (
                stats.ks_2samp(theirs[:, column], ours[:, column], method="asymp").pvalue > 1e-3
            ), column


def test_random_windows_never_leave_the_image():
    """100,000+ windows over the shapes a record can have, checked against the sampler's rules."""
    rng = np.random.default_rng(0)
    extremes = [(1, 1), (1, 2), (2, 1), (1, JPEG_LIMIT), (JPEG_LIMIT, 1), (2, JPEG_LIMIT)]
    extremes += [(JPEG_LIMIT, JPEG_LIMIT), (3, 4), (7, 5), (256, 341), (341, 256), (256, 9000)]
    sides = np.exp(rng.uniform(0, np.log(JPEG_LIMIT), size=(400, 2))).astype(int)
    shapes = extremes + [(int(h), int(w)) for h, w in sides]
    draws, fallbacks = 0, 0
    for height, width in shapes:
        for _ in range(250):
            y, x, h, w = transforms.random_window(height, width, rng)
            draws += 1
            assert 0 <= y and 0 <= x and 1 <= h and 1 <= w, (height, width)
            assert y + h <= height and x + w <= width, (height, width, y, x, h, w)
            if (h, w) == (height, width):
                fallbacks += 1
                continue
            # An attempt that was kept: at least 10% of the image (the coverage
            # rule), at most all of it, and a width that rounds h * ratio.
            assert h * w >= 0.1 * height * width * (1 - 1e-6), (height, width, h, w)
            assert 0.75 * h - 0.5 <= w <= 4 / 3 * h + 0.5 + 1e-3, (height, width, h, w)
            # The sampler never puts a window against the bottom or right edge
            # unless it fills that side (the kernel draws offsets in [0, free)).
            assert y + h < height or h == height
            assert x + w < width or w == width
    assert draws >= 100_000
    # Long thin shapes (most of the log-uniform ones) fit no window of ratio 3/4..4/3.
    assert 0 < fallbacks < draws


@pytest.mark.parametrize(
    "window, size, height, width, scale",
    [
        (Window(0, 0, 256, 341), 224, 256, 341, 1),
        (Window(0, 0, 448, 448), 224, 448, 448, 2),
        (Window(0, 0, 447, 4000), 224, 448, 4000, 1),
        (Window(10, 10, 900, 1000), 224, 1000, 1100, 4),
        (Window(0, 0, 2000, 1800), 224, 2000, 1800, 8),
        (Window(0, 0, 65500, 65500), 224, 65500, 65500, 8),
        (Window(0, 0, 8, 8), 1, 8, 8, 1),  # too small to be sure of libjpeg's choice
        (Window(0, 0, 16, 16), 1, 16, 16, 8),
        (Window(0, 0, 1, 16), 1, 1, 16, 1),
    ],
)
def test_dct_scale(window, size, height, width, scale):
    assert transforms.dct_scale(window, size, height, width) == scale


# -- never raises -----------------------------------------------------------------------


def converted_records() -> list[bytes]:
    """JPEGs as the converter stores them: any aspect ratio, sides of 1 pixel, 65,500 pixels
    long, and the web photos at shorter side 256 on which the old crop failed. (A
    65500 x 65500 record, ``--resize pad --image_size 65500``, takes seconds a decode:
    its windows are in the test above.)"""
    out = [converted(photo(341, 256, seed), size=256) for seed in range(4)]
    out += [converted(photo(256, 341, 9), size=256)]
    out += [
        converted(photo(1, 1, 1), resize="none"),
        converted(photo(5000, 3, 2), size=1),  # shorter side 1: 1 x 1667
        converted(photo(3, 5000, 3), size=1),
        converted(photo(4000, 10, 4), resize="longer", size=1),  # 1 x 1
        converted(photo(40, 3000, 5), resize="longer", size=4000, upscale=True),
        converted(photo(65500, 460, 6), resize="none"),  # decoded at 1/2: 32,750 wide
        converted(photo(97, 61, 7), resize="crop", size=1),
        converted(photo(1999, 1501, 8), size=JPEG_LIMIT),  # stored as it is
    ]
    return out


def test_train_crop_never_raises_on_converted_records():
    """Every record, output sizes from 1 up: uint8 [size, size, 3], every decode scale used."""
    rng = np.random.default_rng(1)
    scales, draws = set(), 0
    for encoded in converted_records():
        height, width = transforms.jpeg_shape(encoded)
        big = height * width > 1_000_000
        for size in (1, 2, 7, 128, 224, 513):
            for _ in range(3 if big else 80 if size == 128 else 25):
                # A copy of the generator draws the same window train_crop draws.
                window = transforms.random_window(height, width, copy.deepcopy(rng))
                scales.add(transforms.dct_scale(window, size, height, width))
                out = transforms.train_crop({"image": encoded, "label": np.int64(4)}, rng, size)
                draws += 1
                assert out["image"].shape == (size, size, 3) and out["image"].dtype == np.uint8
                assert out["label"] == 4 and type(out["label"]) is int
            out = transforms.eval_crop({"image": encoded, "label": 4}, size)
            assert out["image"].shape == (size, size, 3) and out["image"].dtype == np.uint8
    assert scales == {1, 2, 4, 8}
    assert draws > 2000


@pytest.mark.parametrize("size", [0, -3, 2.5, True, "224", None])
def test_a_bad_size_is_refused(size):
    record = {"image": converted(photo(40, 30, 1), size=30), "label": 0}
    with pytest.raises(ValueError, match="size must be a positive int"):
        transforms.train_crop(record, np.random.default_rng(), size)
    with pytest.raises(ValueError, match="size must be a positive int"):
        transforms.eval_crop(record, size)


# -- the reader's pixels ----------------------------------------------------------------


def photos_at(shorter: int) -> list[bytes]:
    """Real photos (scikit-image's), stored as the converter stores them."""
    from skimage import data

    sources = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]
    return [converted(Image.fromarray(s), size=shorter) for s in sources]


def test_pixels_are_the_readers_for_the_same_window():
    """A window decoded at full scale: within one level of the reader's resize of the same pixels
    (OpenCV's fixed-point weights against TensorFlow's float32: a tenth of them one off).

    The reader's ``decode_and_crop_jpeg`` differs from a full decode in the
    window's first and last columns (libjpeg upsamples the chroma there from
    the crop alone), which leaves the output columns sampled from them up to
    ~20 levels off: a tail, bounded here over all the pixels compared.
    """
    rng = np.random.default_rng(3)
    worst, pooled = 0, []
    for encoded in photos_at(256) + [converted(photo(30, 20, 5), size=20)]:
        height, width = transforms.jpeg_shape(encoded)
        for size in (224, 64, 1):
            for _ in range(20):
                window = transforms.random_window(height, width, rng)
                if transforms.dct_scale(window, size, height, width) != 1:
                    continue
                ours = transforms.crop_resize(encoded, window, size)
                exact = differences(ours, reader_pixels(encoded, window, size, whole=True))
                worst = max(worst, int(exact.max()))
                pooled.append(differences(ours, reader_pixels(encoded, window, size)).ravel())
    assert len(pooled) > 100
    assert worst <= 1
    pooled = np.concatenate(pooled)
    assert pooled.mean() < 0.2 and (pooled > 1).mean() < 0.005


def test_scaled_decodes_sample_where_the_reader_samples():
    """Windows >= 2, 4, 8 x the output are decoded at 1/2, 1/4, 1/8 and sampled where the
    reader samples the full image: on smooth content (little for the scaled decode to
    average away) within a level or two of the reader's pixels, and several times closer
    than the same window moved by half a decoded pixel."""
    encoded = converted(smooth(2400, 1800), resize="none")
    rng = np.random.default_rng(4)
    seen = set()
    # One fixed window per scale, then drawn ones.
    windows = [(Window(50, 60, 500, 600), 224), (Window(9, 21, 1000, 1100), 224)]
    windows += [(Window(100, 7, 1700, 2001), 201)]
    windows += [(transforms.random_window(1800, 2400, rng), s) for s in (224, 112, 64) * 5]
    for window, size in windows:
        scale = transforms.dct_scale(window, size, 1800, 2400)
        seen.add(scale)
        theirs = reader_pixels(encoded, window, size, whole=True)
        error = differences(transforms.crop_resize(encoded, window, size), theirs).mean()
        assert error < 2.0, (window, size, scale)
        if scale == 1:
            continue
        half = scale // 2
        moved = [
            window._replace(y=window.y + dy, x=window.x + dx)
            for dy, dx in ((half, 0), (-half, 0), (0, half), (0, -half))
        ]
        for other in moved:
            if 0 <= other.y and other.y + other.height <= 1800:
                if 0 <= other.x and other.x + other.width <= 2400:
                    moved_error = differences(
                        transforms.crop_resize(encoded, other, size), theirs
                    ).mean()
                    assert error < moved_error / 2, (window, other, size)
    assert seen >= {2, 4, 8}


def test_eval_crop_is_the_readers_evaluation_image():
    parser = Parser(AugmentConfig(), (224, 224))
    for encoded in photos_at(256) + [converted(photo(500, 120, 2), size=120)]:
        theirs = decode.normalize(parser.eval_image(encoded), "0_255", tf.uint8).numpy()
        diff = differences(
            transforms.eval_crop({"image": encoded, "label": 0}, 224)["image"], theirs
        )
        assert diff.mean() < 0.2 and (diff > 1).mean() < 0.005


def test_train_crop_mirrors_half_the_time_and_repeats_for_a_seed():
    encoded = photos_at(256)[0]
    height, width = transforms.jpeg_shape(encoded)
    record = {"image": encoded, "label": 1}
    rng = np.random.default_rng(5)
    mirrored = 0
    for _ in range(300):
        window = transforms.random_window(height, width, copy.deepcopy(rng))
        plain = transforms.crop_resize(encoded, window, 32)
        image = transforms.train_crop(record, rng, 32)["image"]
        if not np.array_equal(image, plain):
            # The reader mirrors the window before the resize, these after: the same
            # pixels (a half-pixel-centred resize commutes with the flip) up to rounding.
            assert differences(image, plain[:, ::-1]).max() <= 1
            mirrored += 1
    assert 120 < mirrored < 180
    first = [transforms.train_crop(record, np.random.default_rng(9), 64)["image"] for _ in "ab"]
    assert np.array_equal(*first)


def test_records_of_a_record_source(tmp_path):
    """Through the real source: each class's solid colour survives the crop."""
    dataset = write_dataset(tmp_path / "ds", per_class=6, min_side=1, max_side=80)
    source = RecordSource(dataset.path, "train")
    rng = np.random.default_rng(6)
    for index in range(len(source)):
        record = source[index]
        for out in (transforms.train_crop(record, rng, 24), transforms.eval_crop(record, 24)):
            assert out["image"].shape == (24, 24, 3) and out["label"] == record["label"]
            # The fixture's images are the class colour but for a small random patch.
            colour = np.median(out["image"].reshape(-1, 3), axis=0)
            assert np.abs(colour - CLASS_COLOURS[record["label"]]).max() < 40


def test_a_serialized_record_crops_as_its_dict(tmp_path):
    """``RecordSource(..., parse=False)``'s bytes: the same image and label as the parsed dict."""
    dataset = write_dataset(tmp_path / "ds", per_class=3)
    parsed = RecordSource(dataset.path, "train")
    serialized = RecordSource(dataset.path, "train", parse=False)
    for index in range(len(parsed)):
        assert isinstance(serialized[index], bytes)
        for crop in (
            lambda r, seed=index: transforms.train_crop(r, np.random.default_rng(seed), 32),
            lambda r: transforms.eval_crop(r, 32),
        ):
            ours, theirs = crop(serialized[index]), crop(parsed[index])
            assert ours["label"] == theirs["label"] and type(ours["label"]) is int
            assert np.array_equal(ours["image"], theirs["image"])


def test_a_grey_jpeg_comes_out_rgb():
    """Not what the converter writes (always RGB), but a JPEG all the same."""
    grey = simplejpeg.encode_jpeg(np.full((40, 50, 1), 90, np.uint8), colorspace="GRAY")
    out = transforms.train_crop({"image": grey, "label": 0}, np.random.default_rng(), 16)
    assert out["image"].shape == (16, 16, 3) and np.abs(out["image"].astype(int) - 90).max() <= 2


def test_pillow_reads_what_simplejpeg_decodes():
    """The records are Pillow's JPEGs (the converter encodes with Pillow): same header shape."""
    encoded = converted(photo(333, 111, 3), size=111)
    assert transforms.jpeg_shape(encoded) == Image.open(io.BytesIO(encoded)).size[::-1]


@pytest.mark.parametrize("size", [1, 7, 32, 200])
def test_out_takes_the_image_in_place_the_same_pixels(tmp_path, size):
    """``out=``: a loader's row of its batch array is written, not a new array made
    (1/8 to whole-image decodes: the records are up to 1,600 pixels on a side)."""
    dataset = write_dataset(tmp_path / "ds", per_class=3, min_side=20, max_side=1600)
    source = RecordSource(dataset.path, "train", parse=False)
    batch = np.full((2, size, size, 3), 7, np.uint8)
    for index in range(len(source)):
        for seed in range(4):  # a flip or not
            crop = transforms.train_crop(source[index], np.random.default_rng(seed), size)
            into = transforms.train_crop(
                source[index], np.random.default_rng(seed), size, out=batch[1]
            )
            assert into["image"] is batch[1] or np.shares_memory(into["image"], batch[1])
            assert np.array_equal(batch[1], crop["image"]) and into["label"] == crop["label"]
        transforms.eval_crop(source[index], size, out=batch[0])
        assert np.array_equal(batch[0], transforms.eval_crop(source[index], size)["image"])


@pytest.mark.parametrize(
    "out, problem",
    [
        (np.zeros((16, 16, 3), np.float32), "float32 (16, 16, 3)"),
        (np.zeros((16, 15, 3), np.uint8), "uint8 (16, 15, 3)"),
        (np.zeros((16, 32, 3), np.uint8)[:, ::2], "uint8 (16, 16, 3)"),  # not contiguous
        ([[0]], "list None"),
    ],
)
def test_out_that_opencv_would_not_fill_is_refused(out, problem):
    record = {"image": jpeg_bytes(photo(40, 30, 1)), "label": 0}
    with pytest.raises(ValueError, match=r"out must be a writable C-contiguous uint8 array"):
        transforms.train_crop(record, np.random.default_rng(), 16, out=out)
    with pytest.raises(ValueError, match=re.escape(problem)):
        transforms.eval_crop(record, 16, out=out)

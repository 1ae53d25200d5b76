"""The tf.data reader's training and evaluation crops, for records of ``RecordSource``.

``train_crop`` and ``eval_crop`` give what ``reader.make_dataset`` gives, without
TensorFlow (docs/trainers.md, "Decoding and augmenting"). Nothing the converter can
write makes them raise.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import simplejpeg

from imagerecords.codec import Example
from imagerecords.source import FIELD_NAMES

try:
    import cv2
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError(
        "imagerecords.transforms needs OpenCV for its resize: "
        'pip install opencv-python-headless (or pip install -e ".[trainers]")'
    ) from error

# The reader's defaults (reader.config.AugmentConfig, reader.decode.random_crop_window),
# which cannot be imported here (they load TensorFlow);
# tests/test_imagerecords_transforms.py checks that they agree.
AREA_RANGE = (0.08, 1.0)
ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
MAX_ATTEMPTS = 10
MIN_OBJECT_COVERED = 0.1
CENTER_CROP_FRACTION = 0.875

# libjpeg-turbo's power-of-two DCT scales: its others (7/8, 5/8, ...) take longer
# than a full decode.
DCT_SCALES = (8, 4, 2)
# simplejpeg picks the smallest M/8 scale whose output is at least the size
# asked for; on an image whose sides are all under this, a smaller M/8 can give
# the same output size as 1/2 or 1/4, and the pixels' geometry would then not
# be the one assumed. Such images are small: decoded at full scale.
MIN_SCALED_SIDE = 16

_F32 = np.float32

# The record keys of the two fields a crop needs (docs/format.md section 6).
_KEYS = {name: key for key, name in FIELD_NAMES.items()}
IMAGE_KEY, LABEL_KEY = _KEYS["image"], _KEYS["label"]


class Window(NamedTuple):
    """A crop window in pixels of the stored image: ``[y, x, height, width]`` as the reader's."""

    y: int
    x: int
    height: int
    width: int


def _lrint(value: np.float32) -> int:
    """C's ``lrintf``: to the nearest integer, halves to even (numpy's ``rint``)."""
    return int(np.rint(value))


def _attempt(
    height: int,
    width: int,
    area_range: tuple[np.float32, np.float32],
    aspect_ratio: np.float32,
    rng: np.random.Generator,
) -> Window | None:
    """One attempt of ``sample_distorted_bounding_box``: a window of ``aspect_ratio``, or None.

    The arithmetic is float32 as in TensorFlow's kernel, so that the same
    draws give the same window, rounding included.
    """
    image_area = _F32(width) * _F32(height)
    min_area = area_range[0] * image_area
    max_area = area_range[1] * image_area
    crop_h = _lrint(np.sqrt(min_area / aspect_ratio))
    max_h = _lrint(np.sqrt(max_area / aspect_ratio))
    if _lrint(_F32(max_h) * aspect_ratio) > width:
        # The tallest window whose rounded width still fits (in double, as the kernel).
        max_h = int((width + 0.5 - float(_F32(1e-7))) / float(aspect_ratio))
        if _lrint(_F32(max_h) * aspect_ratio) > width:
            max_h -= 1
    max_h = min(max_h, height)
    if crop_h >= max_h:
        crop_h = max_h
    else:
        crop_h += int(rng.integers(0, max_h - crop_h + 1))
    crop_w = _lrint(_F32(crop_h) * aspect_ratio)
    area = _F32(crop_w * crop_h)
    # Rounding may leave the area just outside the range: one step each way.
    if area < min_area:
        crop_h += 1
        crop_w = _lrint(_F32(crop_h) * aspect_ratio)
        area = _F32(crop_w * crop_h)
    if area > max_area:
        crop_h -= 1
        crop_w = _lrint(_F32(crop_h) * aspect_ratio)
        area = _F32(crop_w * crop_h)
    if not (min_area <= area <= max_area and 0 < crop_w <= width and 0 < crop_h <= height):
        return None
    # The kernel's offsets are uniform over [0, free) (never the last position
    # but when the window fills that side).
    y = int(rng.integers(0, height - crop_h)) if crop_h < height else 0
    x = int(rng.integers(0, width - crop_w)) if crop_w < width else 0
    return Window(y, x, crop_h, crop_w)


def random_window(
    height: int,
    width: int,
    rng: np.random.Generator,
    *,
    area_range: tuple[float, float] = AREA_RANGE,
    aspect_ratio_range: tuple[float, float] = ASPECT_RATIO_RANGE,
    max_attempts: int = MAX_ATTEMPTS,
    min_object_covered: float = MIN_OBJECT_COVERED,
) -> Window:
    """The reader's random training window of an image of ``height`` x ``width`` pixels.

    Always inside the image and at least one pixel: the whole image when no
    attempt gives a window of the ranges covering ``min_object_covered`` of it.
    """
    if height < 1 or width < 1:
        raise ValueError(f"an image of {height} x {width} pixels has no window")
    low_ratio, high_ratio = _F32(aspect_ratio_range[0]), _F32(aspect_ratio_range[1])
    areas = (_F32(area_range[0]), _F32(area_range[1]))
    image_area = _F32(width * height)
    min_covered = _F32(min_object_covered)
    for _ in range(max_attempts):
        ratio = rng.random(dtype=np.float32) * (high_ratio - low_ratio) + low_ratio
        window = _attempt(height, width, areas, ratio, rng)
        # The window lies inside the image: the part of it covered is its own area.
        if window is not None and _F32(window.height * window.width) / image_area >= min_covered:
            return window
    return Window(0, 0, height, width)


def center_window(
    height: int, width: int, size: int, fraction: float = CENTER_CROP_FRACTION
) -> Window:
    """The reader's evaluation window: the largest centred square, times ``fraction``.

    float32 arithmetic and round-half-to-even as ``reader.decode.center_crop_window``.
    """
    scale = _F32(fraction) * min(_F32(height) / _F32(size), _F32(width) / _F32(size))
    crop = _lrint(scale * _F32(size))
    crop_h, crop_w = min(max(crop, 1), height), min(max(crop, 1), width)
    return Window((height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w)


def dct_scale(window: Window, size: int, height: int, width: int) -> int:
    """The denominator (1, 2, 4 or 8) of the smallest decode scale leaving ``window`` >= ``size``."""
    if max(height, width) < MIN_SCALED_SIDE:
        return 1
    short = min(window.height, window.width)
    return next((k for k in DCT_SCALES if short >= k * size), 1)


def jpeg_shape(encoded: bytes) -> tuple[int, int]:
    """``(height, width)`` from the JPEG's header (the record's own fields are not trusted)."""
    height, width, _, _ = simplejpeg.decode_jpeg_header(encoded)
    return height, width


def _decode(encoded: bytes, scale: int, height: int, width: int) -> tuple[np.ndarray, int]:
    """RGB pixels at 1/``scale`` (or whole, if libjpeg chose otherwise) and the scale used."""
    if scale > 1:
        want = (-(-height // scale), -(-width // scale))
        # fastdct: libjpeg's fast integer IDCT, TensorFlow's default, so the pixels
        # are the reader's. strict=False: a libjpeg warning is no reason to stop a
        # training run; the source checked the record's CRCs, and the converter
        # writes only JPEGs that decode without one.
        pixels = simplejpeg.decode_jpeg(
            encoded, "RGB", fastdct=True, min_height=want[0], min_width=want[1], strict=False
        )
        if pixels.shape[:2] == want:
            return pixels, scale
    return simplejpeg.decode_jpeg(encoded, "RGB", fastdct=True, strict=False), 1


def crop_resize(encoded: bytes, window: Window, size: int) -> np.ndarray:
    """``window`` of a JPEG, resized to ``size`` x ``size`` as the reader does: uint8 RGB."""
    return _crop_resize(encoded, jpeg_shape(encoded), window, size)


def _check_out(out: np.ndarray | None, size: int) -> np.ndarray | None:
    """``out``, if given, as OpenCV writes into it in place: uint8, ``[size, size, 3]``, contiguous.

    Anything else would make OpenCV allocate an array of its own and leave
    ``out`` as it was, so it is refused instead.
    """
    if out is not None and not (
        isinstance(out, np.ndarray)
        and out.shape == (size, size, 3)
        and out.dtype == np.uint8
        and out.flags.c_contiguous
        and out.flags.writeable
    ):
        shape = getattr(out, "shape", None)
        dtype = getattr(out, "dtype", type(out).__name__)
        raise ValueError(
            f"out must be a writable C-contiguous uint8 array of shape ({size}, {size}, 3), "
            f"got {dtype} {shape}"
        )
    return out


def _crop_resize(
    encoded: bytes,
    shape: tuple[int, int],
    window: Window,
    size: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    height, width = shape
    pixels, scale = _decode(encoded, dct_scale(window, size, height, width), height, width)
    if scale == 1:
        # cv2.resize maps output pixel o to input (o + 0.5) * in / out - 0.5 and clamps
        # at the window's edges, as tf.image.resize does with half-pixel centres.
        # Its 11-bit fixed-point weights leave a tenth of the pixels one level from
        # TensorFlow's float32 result; resizing a float32 copy instead matches it
        # but for float rounding, for a quarter more resize time.
        crop = pixels[window.y : window.y + window.height, window.x : window.x + window.width]
        return cv2.resize(crop, (size, size), dst=out, interpolation=cv2.INTER_LINEAR)
    # Decoded pixel i covers stored pixels [i * scale, (i + 1) * scale): the
    # reader's sample point p (in stored pixels) is (p + 0.5) / scale - 0.5 here.
    # A window at least size * scale pixels wide keeps every sample inside it.
    step_y = window.height / (size * scale)
    step_x = window.width / (size * scale)
    matrix = np.array(
        [
            [step_x, 0.0, (window.x + 0.5 * window.width / size) / scale - 0.5],
            [0.0, step_y, (window.y + 0.5 * window.height / size) / scale - 0.5],
        ]
    )
    return cv2.warpAffine(
        pixels,
        matrix,
        (size, size),
        dst=out,
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_REPLICATE,
    )


def image_and_label(record: dict | bytes) -> tuple[bytes, int]:
    """The JPEG and the label of a record of ``RecordSource``: its dict, or with
    ``parse=False`` the serialized Example, of which only these two are parsed
    (half the parse, and Grain then measures the record's size in one step)."""
    if isinstance(record, dict):
        return record["image"], int(record["label"])
    features = Example.FromString(record).features.feature
    return features[IMAGE_KEY].bytes_list.value[0], int(features[LABEL_KEY].int64_list.value[0])


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size must be a positive int (pixels), got {size!r}")
    return int(size)


def train_crop(
    record: dict | bytes, rng: np.random.Generator, size: int, *, out: np.ndarray | None = None
) -> dict:
    """Training: the reader's random window, resized to ``size`` x ``size``, mirrored half the time.

    Args:
        record: a record of ``RecordSource``: the dict (its ``image`` and ``label``),
            or the serialized Example of ``RecordSource(..., parse=False)``.
        rng: the draws' source (Grain's ``random_map`` passes one per record).
        size: output side in pixels.
        out: a uint8 ``[size, size, 3]`` C-contiguous array to write the image
            into (a loader's slot of its batch: no copy into the batch after);
            by default a new array.

    Returns:
        ``{"image": uint8 [size, size, 3], "label": int}`` (``image`` is ``out`` when given).
    """
    size = _check_size(size)
    out = _check_out(out, size)
    encoded, label = image_and_label(record)
    shape = jpeg_shape(encoded)
    image = _crop_resize(encoded, shape, random_window(*shape, rng), size, out)
    if rng.random() < 0.5:
        # In place: OpenCV's flip swaps the columns pairwise.
        image = cv2.flip(image, 1, dst=image)
    return {"image": image, "label": label}


def eval_crop(record: dict | bytes, size: int, *, out: np.ndarray | None = None) -> dict:
    """Evaluation: the reader's centre window (0.875 of the largest square), resized; no draw.

    ``out`` as in ``train_crop``.
    """
    size = _check_size(size)
    out = _check_out(out, size)
    encoded, label = image_and_label(record)
    shape = jpeg_shape(encoded)
    image = _crop_resize(encoded, shape, center_window(*shape, size), size, out)
    return {"image": image, "label": label}

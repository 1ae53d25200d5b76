"""The fingerprint as phash19-v4 first computed it, kept to check the faster code
against (tests/test_fingerprint_identical.py): grey folded into one product over
the RGB pixels, then the rows' transform, and the texture rule in numpy."""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image

from beam_pipeline.features.near import hashes as nd
from beam_pipeline.features.near import texture as near_texture


class Layout:
    def __init__(self, windows):
        self.rows = tuple(sorted({(top, bottom) for _, top, _, bottom in windows}))
        self.cols = tuple(sorted({(left, right) for left, _, right, _ in windows}))
        row_of = np.array([self.rows.index((t, b)) for _, t, _, b in windows])
        col_of = np.array([self.cols.index((left, r)) for left, _, r, _ in windows])
        k = np.arange(8)
        rows_at = (row_of[:, None] * 8 + k)[:, :, None] * (len(self.cols) * 8)
        self.take = (rows_at + (col_of[:, None] * 8 + k)[:, None, :]).reshape(len(windows), 64)

    @functools.cache  # noqa: B019 (a test helper, kept for the process)
    def row_transform(self, n):
        return nd._side_transform(n, self.rows)

    @functools.cache  # noqa: B019
    def pixel_transform(self, n):
        cols = nd._side_transform(n, self.cols).T
        spans = cols.shape[1]
        found = np.zeros((n, 3, spans + 3))
        found[:, :, :spans] = cols[:, None, :] * nd._GREY_WEIGHTS[None, :, None]
        found[:, np.arange(3), spans + np.arange(3)] = 1
        return found.reshape(3 * n, spans + 3)


def passes(ac, median, grey_level):
    t = near_texture
    units = np.abs(ac) // t._ENERGY_UNIT
    if units @ units < round(t.TEXTURE_ENERGY * grey_level / t._ENERGY_UNIT) ** 2:
        return False
    steady = np.count_nonzero(np.abs(ac - median) > t.TEXTURE_MARGIN * grey_level)
    return int(steady) >= t.TEXTURE_COEFFICIENTS


def blank(grey):
    middle = grey.size // 2
    median = np.partition(grey, middle)[middle]
    near = np.count_nonzero(np.abs(grey - median) <= near_texture.BLANK_LEVELS * 1000)
    return bool(near > near_texture.BLANK_SHARE * grey.size)


def hash_bits(pixels, layout):
    h, w, _ = pixels.shape
    per_row = pixels.reshape(h, 3 * w) @ layout.pixel_transform(w)
    low = (layout.row_transform(h) @ per_row[:, :-3]).ravel().take(layout.take)
    median = np.partition(low[:, 1:], 31, axis=1)[:, 31:32]
    bits = np.packbits(low > median, axis=1)
    textured = passes(low[0, 1:], float(median[0, 0]), nd._GREY_LEVEL) and not (
        blank((pixels[::2, ::2] @ nd._GREY_WEIGHTS).ravel())
    )
    flag = np.uint8(0x80) if textured else np.uint8(0)
    bits[0, 0] = (bits[0, 0] & np.uint8(0x7F)) | flag
    return bits, per_row[:, -3:].sum(axis=0)


def base(img):
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    factor, width, height = nd.base_plan(*rgb.size)
    if factor >= nd.SAMPLED_FROM:
        box = (0, 0, width * factor, height * factor)
        size = (width * nd.SAMPLES, height * nd.SAMPLES)
        small = rgb.resize(size, Image.Resampling.NEAREST, box=box).reduce(nd.SAMPLES)
    elif factor > 1:
        small = rgb.reduce(factor)
    else:
        small = rgb
    pixels = np.frombuffer(small.tobytes(), np.uint8).reshape(small.height, small.width, 3)
    return pixels.astype(np.float64)


@functools.lru_cache(maxsize=8)
def layout(windows):
    return Layout(windows)


def packed(img, windows=nd.WINDOWS):
    """``near_duplicates.packed`` (any windows) as phash19-v4 first computed it."""
    bits, sums = hash_bits(base(img), layout(tuple(windows)))
    return bits.tobytes(), nd._chromaticity(sums)

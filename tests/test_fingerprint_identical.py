"""The fingerprint's faster products give phash19-v4's bits exactly: every hash, the
texture flag and the colour, against tests/fingerprint_reference.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from PIL import Image, ImageDraw

from beam_pipeline.features.near import hashes as nd
from beam_pipeline.features.near import search as near_search
from bench.common import data
from tests import fingerprint_reference as reference

pytest.importorskip("skimage")  # its photos

_PHOTOS = sorted(
    p
    for p in data.skimage_data_dir().iterdir()
    if p.suffix in (".png", ".jpg") and p.stat().st_size
)


def _photos() -> list[Image.Image]:
    """Every photo scikit-image ships, at the size a conversion stores (shorter
    side 256), at its own, and at sizes around the base's factor thresholds."""
    found = []
    for path in _PHOTOS:
        with Image.open(path) as im:
            im.load()
            found.append(im.copy())
            rgb = im.convert("RGB")
        w, h = rgb.size
        for short in (256, 255, 64, 63, 40):
            scale = short / min(w, h)
            found.append(rgb.resize((max(1, round(w * scale)), max(1, round(h * scale)))))
        found.append(rgb.crop((w // 7, h // 5, w - w // 9, h - h // 11)))  # odd sizes
    return found


def _synthetic() -> list[Image.Image]:
    """Low-texture and odd images: flat, gradients, stripes, shapes, text, every mode,
    one pixel, and strips far wider or taller than they are long."""
    ramp = np.linspace(0, 255, 300).astype(np.uint8)
    found = [Image.new("RGB", (300, 200), colour) for colour in ((255,) * 3, (128,) * 3, (3,) * 3)]
    found += [Image.new("RGB", (256, 256)), Image.new("RGB", (1, 1), (9, 200, 31))]
    found += [
        Image.fromarray(np.tile(ramp, (200, 1))),  # left to right, grey ("L")
        Image.fromarray(np.tile(ramp[:200, None], (1, 300))),  # top to bottom
        Image.fromarray(np.add.outer(ramp[:200] // 2, ramp // 2)),  # diagonal
        Image.fromarray(np.tile(((np.arange(300) // 32) % 2 * 255).astype(np.uint8), (300, 1))),
    ]
    shapes = Image.new("RGB", (256, 256), "white")
    ImageDraw.Draw(shapes).ellipse((40, 40, 200, 200), fill="black")
    page = Image.new("RGB", (600, 800), "white")
    for line in range(12):
        ImageDraw.Draw(page).text((40, 40 + 50 * line), "Invoice no. 1234 total 56.78 EUR", "black")
    found += [shapes, page]
    rng = np.random.default_rng(45)
    for w, h in ((3, 4000), (4000, 3), (1, 700), (700, 1), (65, 2), (1000, 33), (31, 31)):
        found.append(Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)))
    noise = rng.integers(0, 256, (150, 220, 4), dtype=np.uint8)
    found += [Image.fromarray(noise, "RGBA"), Image.fromarray(noise[..., 0], "L")]
    found += [Image.fromarray(noise[..., :3]).convert("P"), Image.fromarray(noise[..., :2], "LA")]
    # A photo on every other row or column of a white page, at a size that is
    # its own base: the blank test's samples land on the white or on the photo.
    with Image.open(_PHOTOS[0]) as im:
        photo = np.asarray(im.convert("RGB").resize((60, 60)))
    for rows, cols in ((slice(0, None, 2), slice(None)), (slice(None), slice(1, None, 2))):
        interlaced = np.full_like(photo, 255)
        interlaced[rows, cols] = photo[rows, cols]
        found.append(Image.fromarray(interlaced))
    # White at every pixel: the largest products there are.
    found += [Image.new("RGB", size, (255,) * 3) for size in ((2048, 1536), (64, 5000))]
    return found


IMAGES = _photos() + _synthetic()


def test_the_images_cover_both_flags_every_base_path_and_every_mode():
    # The comparison means something only if it meets textured and untextured
    # images, every way the base is made, and modes that need a conversion.
    flags = {reference.packed(im)[0][0] >> 7 for im in IMAGES}
    factors = {nd.base_plan(*im.size)[0] for im in IMAGES}
    assert flags == {0, 1}
    assert 1 in factors and any(1 < f < nd.SAMPLED_FROM for f in factors)
    assert max(factors) >= nd.SAMPLED_FROM
    assert {"RGB", "L", "RGBA", "P", "LA"} <= {im.mode for im in IMAGES}
    assert len(IMAGES) > 150


@pytest.mark.parametrize("index", range(len(IMAGES)))
def test_packed_is_phash19_v4_bit_for_bit(index):
    im = IMAGES[index]
    assert nd.packed(im) == reference.packed(im), f"{im.mode} {im.size}"


def test_the_fingerprint_and_the_record_bytes_are_phash19_v4s():
    for im in IMAGES[::5]:
        hashes, colour = reference.packed(im)
        fp = nd.fingerprint(im)
        assert b"".join(h.to_bytes(8, "big") for h in fp.hashes) == hashes
        assert fp.colour == colour
        assert near_search.pack_image(im) == hashes + bytes(colour)


@pytest.mark.parametrize(
    "windows",
    [((0.0, 0.0, 1.0, 1.0),), ((0.08, 0.0, 1.0, 0.92), (0.0, 0.1, 0.5, 0.6))],
    ids=["whole", "lopsided"],
)
def test_other_windows_give_phash19_v4s_bits_too(windows):
    for im in itertools.islice(IMAGES, 0, None, 7):
        hashes = b"".join(h.to_bytes(8, "big") for h in nd.fingerprint(im, windows=windows).hashes)
        assert hashes == reference.packed(im, windows)[0]


def _at_the_boundaries(rng: np.random.Generator, middle: float, edge: float, unit: float):
    """Exact integers around ``middle``: some at ``middle +- edge`` exactly, some a
    unit either side of it, the rest anywhere (the texture rule's ties)."""
    ties = middle + edge * rng.choice([-1.0, 1.0], 40) + rng.choice([-unit, 0.0, unit], 40)
    return np.concatenate([ties, middle + np.round(rng.normal(0, 3 * edge, 60))])


@pytest.mark.parametrize("seed", range(40))
def test_the_texture_rule_is_phash19_v4s_at_its_ties(seed):
    from beam_pipeline.features.near import texture as t

    rng = np.random.default_rng(seed)
    level = float(nd._GREY_LEVEL)
    # Far enough from 0 that the energy passes, so the steady count decides.
    median = float(np.round(rng.choice([-1, 1]) * rng.uniform(2, 40) * level))
    pool = _at_the_boundaries(rng, median, t.TEXTURE_MARGIN * level, 1.0)
    for count in (20, 23, 24, 25, 30):
        ac = np.concatenate([rng.choice(pool, count), np.full(63 - count, median)])
        assert t.passes(ac, median, level) == reference.passes(ac, median, level)
    grey_median = float(rng.integers(3000, 250_000))
    pool = _at_the_boundaries(rng, grey_median, t.BLANK_LEVELS * 1000, 1.0)
    for near_share in (0.90, 0.93, 0.94, 0.96):
        size = 300
        near = round(near_share * size)
        grey = np.concatenate([rng.choice(pool[:40], near), rng.choice(pool[40:], size - near)])
        grey = np.concatenate([grey, np.full(size, grey_median)])[: 2 * size - 1]
        assert t.blank(grey) == reference.blank(grey)


@pytest.mark.parametrize("tie", [-1.0, 1.0], ids=["below", "above"])
@pytest.mark.parametrize("past", [0.0, 1.0], ids=["on the margin", "one past it"])
def test_a_coefficient_on_the_margin_is_not_steady_one_past_it_is(tie, past):
    from beam_pipeline.features.near import texture as t

    level = float(nd._GREY_LEVEL)
    median = 5 * level
    edge = median + tie * (t.TEXTURE_MARGIN * level + past)
    steady = [median + 3 * level] * (t.TEXTURE_COEFFICIENTS - 1)
    ac = np.array(steady + [edge] + [median] * (63 - t.TEXTURE_COEFFICIENTS))
    assert t.passes(ac, median, level) == reference.passes(ac, median, level) == bool(past)

"""near_duplicates.py: hashes of real photos, band keys, verification, groups."""

import itertools
import random

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from beam_pipeline.core import near_duplicates as nd
from beam_pipeline.core.near_duplicates import Fingerprint

skimage = pytest.importorskip("skimage")
from bench.common import data  # noqa: E402  (needs skimage's photos)
from bench.near import calibration as near_data  # noqa: E402  (needs skimage's photos)


def _photo(name: str) -> Image.Image:
    with Image.open(data.skimage_data_dir() / name) as im:
        return im.convert("RGB")


def _resized(img, scale):
    return img.resize((round(img.width * scale), round(img.height * scale)), Image.BICUBIC)


def _cropped(img, left, top, right, bottom):
    w, h = img.size
    return img.crop((round(left * w), round(top * h), round(w - right * w), round(h - bottom * h)))


COPIES = {
    "resized 60%": lambda im: _resized(im, 0.6),
    "jpeg q50": lambda im: near_data._jpeg(im, 50),
    "cropped 8% left, 2% bottom": lambda im: _cropped(im, 0.08, 0, 0, 0.02),
    "cropped 4% each side": lambda im: _cropped(im, 0.04, 0.04, 0.04, 0.04),
    "brighter 10%": lambda im: ImageEnhance.Brightness(im).enhance(1.1),
    "darker, resized, q70": lambda im: near_data._jpeg(
        _resized(ImageEnhance.Brightness(im).enhance(0.9), 0.7), 70
    ),
}


@pytest.mark.parametrize("make_copy", COPIES.values(), ids=COPIES.keys())
@pytest.mark.parametrize("photo", ["astronaut.png", "coffee.png", "chelsea.png"])
def test_a_near_copy_is_found(photo, make_copy):
    original = _photo(photo)
    fps = [nd.fingerprint(original), nd.fingerprint(make_copy(original))]
    assert nd.verify(*fps) is not None
    assert [(i, j) for i, j, _ in nd.find_pairs(fps)] == [(0, 1)]


@pytest.mark.parametrize(
    "a, b",
    [
        ("astronaut.png", "coffee.png"),
        ("chelsea.png", "coffee.png"),
        ("motorcycle_left.png", "rocket.jpg"),
        ("camera.png", "moon.png"),
    ],
)
def test_distinct_photos_are_not_a_pair(a, b):
    fps = [nd.fingerprint(_photo(a)), nd.fingerprint(_photo(b))]
    assert nd.verify(*fps) is None
    assert nd.find_pairs(fps) == []


def test_neither_half_of_a_photo_is_a_near_copy_of_the_other():
    img = _photo("astronaut.png")
    left = img.crop((0, 0, img.width // 2, img.height))
    right = img.crop((img.width // 2, 0, img.width, img.height))
    assert nd.verify(nd.fingerprint(left), nd.fingerprint(right)) is None


def test_the_colour_check_parts_a_grey_copy_from_its_colour_original():
    img = _photo("coffee.png")
    colour, grey = nd.fingerprint(img), nd.fingerprint(img.convert("L"))
    assert nd.distance(colour, grey) <= nd.THRESHOLD  # the same layout
    assert nd.verify(colour, grey) is None


@pytest.mark.parametrize(
    "bits, expected",
    [
        (np.zeros(64, bool), 0),
        (np.r_[True, np.zeros(63, bool)], 1 << 63),
        (np.ones(64, bool), 2**64 - 1),
    ],
    ids=["zeros", "first-bit-is-the-highest", "ones"],
)
def test_bits_to_int(bits, expected):
    assert nd._bits_to_int(bits) == expected


@pytest.mark.parametrize(
    "kind, thumb, expected",
    [
        ("dhash", np.tile(np.arange(9, dtype=np.float32), (8, 1)), 2**64 - 1),
        ("dhash", np.tile(np.arange(9, 0, -1, dtype=np.float32), (8, 1)), 0),
        ("ahash", np.r_[np.ones((4, 8)), np.zeros((4, 8))].astype(np.float32), 2**64 - 2**32),
    ],
    ids=["dhash-rising", "dhash-falling", "ahash-top-half"],
)
def test_small_hashes_of_known_thumbnails(kind, thumb, expected):
    assert nd.HASH_KINDS[kind].of(thumb) == expected


def test_phash_keeps_the_lowest_frequencies_strongest_first():
    # A bright thumbnail with one horizontal cosine: DC and the (0, 1)
    # coefficient are the two largest, the highest bits of the hash.
    x = np.arange(32)
    thumb = np.tile(2 + np.cos(np.pi * (2 * x + 1) / 64), (32, 1)).astype(np.float32)
    assert nd.phash_of(thumb) >> 62 == 0b11


def test_phash_ignores_brightness_and_contrast():
    thumb = np.random.default_rng(0).uniform(0, 255, size=(32, 32)).astype(np.float32)
    assert nd.phash_of(thumb * 1.2 + 9) == nd.phash_of(thumb)


FP = Fingerprint((0x0123_4567_89AB_CDEF, 0xFFFF_0000_FFFF_0000), (85, 85, 85))


def test_band_keys_are_the_bands_of_every_hash_whole_marked():
    keys = nd.band_keys(FP)
    assert keys == sorted(keys)
    assert nd.band_keys(FP) == keys  # deterministic
    assert (0 << 16 | 0xCDEF, True) in keys and (3 << 16 | 0x0123, True) in keys
    assert (0 << 16 | 0x0000, False) in keys and (1 << 16 | 0xFFFF, False) in keys
    # The window's band 0 (0x0000) and band 2 (0x0000) differ by their band index.
    assert (2 << 16 | 0x0000, False) in keys
    assert len(keys) == 8


def test_a_key_both_hashes_have_is_whole():
    fp = Fingerprint((0x1111, 0x1111), (85, 85, 85))
    assert nd.band_keys(fp) == [(0x1111, True), (1 << 16, True), (2 << 16, True), (3 << 16, True)]


@pytest.mark.parametrize(
    "members, expected",
    [
        ([(0, True), (1, False)], [(0, 1)]),
        ([(3, False), (1, False)], []),  # two windows never meet
        ([(2, False), (1, True), (0, False)], [(1, 2), (0, 1)]),
        ([(1, True), (1, False)], []),  # an image does not pair with itself
    ],
)
def test_bucket_pairs(members, expected):
    assert list(nd.bucket_pairs(members)) == expected


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ((0b1111, 0), (0b1111,), 0),
        ((0b1111, 0), (0,), 0),  # b's whole image is a's window
        ((0b1111, 0b1110), (0b0111, 0b1111), 0),  # b's window is a's whole image
        ((0b0001, 0b1111), (0b0010, 0b1111), 2),  # windows alone never count
    ],
)
def test_distance_compares_a_whole_image_with_every_hash(a, b, expected):
    grey = (85, 85, 85)
    assert nd.distance(Fingerprint(a, grey), Fingerprint(b, grey)) == expected


def test_groups_join_pairs_and_do_not_depend_on_their_order():
    pairs = [("c", "d"), ("a", "b"), ("e", "b"), ("x", "y"), ("d", "f")]
    expected = [["a", "b", "e"], ["c", "d", "f"], ["x", "y"]]
    rng = random.Random(0)
    for order in itertools.islice(itertools.permutations(pairs), 0, None, 7):
        flipped = [(b, a) if rng.random() < 0.5 else (a, b) for a, b in order]
        assert nd.groups(flipped) == expected
    assert nd.groups([]) == []


def test_the_benchmarks_array_search_finds_what_the_core_finds():
    from bench.near import duplicates as bench_near

    hashes, planted = bench_near.synthetic_hashes(3000, 40, seed=1)
    prints = [Fingerprint(tuple(int(h) for h in row), (85, 85, 85)) for row in hashes]
    core = {(i, j) for i, j, _ in nd.find_pairs(prints)}
    found, candidates = bench_near.search(hashes, chunk=700)
    assert candidates > len(found) > 0
    assert found <= core  # it verifies only the pair of hashes that met
    assert {tuple(p) for p in planted.tolist()} & found == {
        tuple(p) for p in planted.tolist()
    } & core


@pytest.mark.e2e
def test_the_near_part_writes_its_table(tmp_path):
    from bench import __main__ as bench_main

    args = ["--quick", "--only", "near", "--repeats", "1", "--near-scale", "3000"]
    args += ["--cache-dir", str(tmp_path / "cache"), "--results-dir", str(tmp_path / "r")]
    assert bench_main.main(args) == 0
    table = (tmp_path / "r" / "near.md").read_text()
    assert "| phash 18 windows |" in table and "| 3,000 | 21 |" in table


def test_the_folded_products_are_the_phash_of_each_windows_box_thumbnail():
    base = np.random.default_rng(2).uniform(0, 255, size=(nd.BASE_SIDE, nd.BASE_SIDE))
    base = base.astype(np.float32)
    window = (0.08, 0.0, 1.0, 0.92)  # lopsided: rows and columns swapped would differ
    left, top, right, bottom = window
    thumb = (
        nd._area_matrix(top, bottom, nd.BASE_SIDE, 32)
        @ base
        @ nd._area_matrix(left, right, nd.BASE_SIDE, 32).T
    )
    assert nd._phashes(base, [window]) == [nd.phash_of(thumb)]
    assert nd._phashes(base, [window]) != [nd.phash_of(thumb.T)]


@pytest.mark.parametrize(
    "low, high, n_in, n_out", [(0.0, 1.0, 64, 32), (0.04, 1.0, 64, 32), (0.0, 0.5, 10, 3)]
)
def test_area_matrix_rows_average_their_share_of_the_pixels(low, high, n_in, n_out):
    m = nd._area_matrix(low, high, n_in, n_out)
    assert m.shape == (n_out, n_in) and np.allclose(m.sum(axis=1), 1)
    assert np.allclose(m.sum(axis=0)[: int(low * n_in)], 0)  # nothing left of the window
    assert np.isclose(m.sum(), n_out)
    if (low, high, n_in, n_out) == (0.0, 1.0, 64, 32):
        assert np.allclose(m[0, :2], 0.5) and np.allclose(m[0, 2:], 0)


def test_the_calibration_set_is_the_same_bytes_every_time(tmp_path):
    first = near_data.ensure_near_set(tmp_path / "a")
    second = near_data.ensure_near_set(tmp_path / "b")
    assert first.originals == second.originals and first.copies == second.copies
    assert len(first.originals) > 200 and {k for _, _, k in first.copies} == set(near_data.KINDS)
    for name in first.names[::25]:
        assert first.image_path(name).read_bytes() == second.image_path(name).read_bytes()
    # Distinct means no shared pixels: tiles of one photo never overlap.
    boxes: dict[str, list[tuple[int, int]]] = {}
    for name in first.originals:
        photo, x, y = name.rsplit("_", 2)
        boxes.setdefault(photo, []).append((int(x), int(y)))
    for corners in boxes.values():
        for (x0, y0), (x1, y1) in itertools.combinations(corners, 2):
            assert abs(x0 - x1) >= near_data.TILE or abs(y0 - y1) >= near_data.TILE

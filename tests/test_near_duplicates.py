"""features/near/hashes.py: hashes of real photos, band keys, verification, groups."""

import itertools
import random

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from beam_pipeline.features.near import hashes as nd
from beam_pipeline.features.near.hashes import Fingerprint

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


@pytest.mark.parametrize(
    "count, expected", [(5, (0, 13, 26, 38, 51)), (4, (0, 16, 32, 48)), (3, (0, 21, 43)), (1, (0,))]
)
def test_band_offsets_are_evenly_spaced_around_the_hash(count, expected):
    assert nd.band_offsets(count) == expected


@pytest.mark.parametrize(
    "h, offset, bits, expected",
    [
        (0x0123_4567_89AB_CDEF, 0, 21, 0x0BCDEF),
        (0x0123_4567_89AB_CDEF, 0, 16, 0xCDEF),
        (0x0123_4567_89AB_CDEF, 48, 16, 0x0123),
        # Past the highest bit the band goes on from bit 0: 0x24 is bits 51-63,
        # 0xEF the lowest byte above them.
        (0x0123_4567_89AB_CDEF, 51, 21, 0xEF << 13 | 0x24),
        (1 << 63, 60, 8, 0b1000),
    ],
    ids=["first", "first-16", "last-16", "wraps", "top-bit"],
)
def test_band_of(h, offset, bits, expected):
    assert nd.band_of(h, offset, bits) == expected


FP = Fingerprint((0x0123_4567_89AB_CDEF, 0xFFFF_0000_FFFF_0000), (85, 85, 85))


def test_band_keys_are_the_bands_of_every_hash_whole_marked():
    bits = 21  # the values below are five bands of this width
    keys = nd.band_keys(FP, bits, band_count=5)
    assert keys == sorted(keys)
    assert nd.band_keys(FP, bits, band_count=5) == keys  # deterministic
    assert (0 << bits | 0x0BCDEF, True) in keys and (4 << bits | 0x1DE024, True) in keys
    assert (0 << bits | 0x1F0000, False) in keys and (2 << bits | 0x3F, False) in keys
    assert len(keys) == 5 * 2


def test_band_keys_of_disjoint_bands_are_the_hashes_cut_in_pieces():
    keys = nd.band_keys(FP, band_bits=16, band_count=4)
    assert (0 << 16 | 0xCDEF, True) in keys and (3 << 16 | 0x0123, True) in keys
    # The window's band 0 (0x0000) and band 2 (0x0000) differ by their band index.
    assert (0 << 16 | 0x0000, False) in keys and (2 << 16 | 0x0000, False) in keys
    assert len(keys) == 8


def test_a_key_both_hashes_have_is_whole():
    fp = Fingerprint((0x1111, 0x1111), (85, 85, 85))
    bits = 20  # five bands of 20 bits: offsets 0, 13, 26, 38, 51
    assert nd.band_keys(fp, bits, band_count=5) == [
        (0x1111, True),
        (1 << bits, True),
        (2 << bits, True),
        (3 << bits, True),
        (4 << bits | 0x11 << 13, True),
    ]


@pytest.mark.parametrize(
    "members, expected",
    [
        ([(0, True), (1, False)], [(0, 1)]),
        ([(3, False), (1, False)], []),  # two homes never meet
        ([(3, True), (1, True)], []),  # nor two probes
        ([(2, False), (1, True), (0, False)], [(1, 2), (1, 0)]),
        ([(1, True), (1, False)], []),  # an image does not pair with itself
    ],
)
def test_bucket_pairs(members, expected):
    assert list(nd.bucket_pairs(members)) == expected


def test_probe_keys_are_each_band_s_whole_key_and_its_one_bit_flips():
    keys = nd.probe_keys(FP, band_bits=16, band_count=4)
    assert keys == sorted(keys) and len(set(keys)) == 4 * 17
    assert (0 << 16 | 0xCDEF) in keys and (0 << 16 | 0xCDEF ^ 1 << 15) in keys
    assert (3 << 16 | 0x0123 ^ 1) in keys
    assert not any(k >> 16 == 0 and (k ^ 0xCDEF).bit_count() > 1 for k in keys)
    assert nd.probe_keys(FP, 16, 4, flips=0) == [
        0xCDEF,
        1 << 16 | 0x89AB,
        2 << 16 | 0x4567,
        3 << 16 | 0x0123,
    ]


# A whole hash and the bands of 27 bits at offsets 0, 11, 21, 32, 43, 53 (6 bands).
_H = 0x0123_4567_89AB_CDEF


def _bits_at(*positions: int) -> int:
    return sum(1 << p for p in positions)


@pytest.mark.parametrize(
    "flipped, found",
    [
        # Six bits apart, placed so that every 27-bit band holds at least
        # one (no exact key in common) and the bands at 43 and 53 only one.
        ((10, 20, 30, 35, 40, 50), True),
        # Seven bits apart: beyond the threshold, whatever meets.
        ((10, 20, 25, 30, 35, 40, 50), False),
        # Six bits, three in every band: no band within one flip.
        ((0, 11, 21, 32, 43, 53), False),
    ],
)
def test_a_pair_that_shares_only_a_one_flip_key_is_found_within_the_threshold(flipped, found):
    a = Fingerprint((_H | nd.TEXTURE_BIT,), (85, 85, 85))
    b = Fingerprint(((_H ^ _bits_at(*flipped)) | nd.TEXTURE_BIT,), (85, 85, 85))
    assert nd.band_offsets() == (0, 11, 21, 32, 43, 53) and nd.BAND_BITS == 27
    exact = {k for k, _ in nd.band_keys(a)} & {k for k, _ in nd.band_keys(b)}
    assert not exact  # no band key in common: today's exact index missed it
    assert (nd.candidate_pairs([a, b]) == {(0, 1)}) is found
    assert (nd.find_pairs([a, b]) != []) is found


def test_a_meeting_at_a_pairing_beyond_the_threshold_is_not_a_candidate():
    # b's window shares a's whole key in band 0 but is 10 bits away; b's whole
    # hash is 6 bits from a's but in bands none of a's probes reach.
    grey = (85, 85, 85)
    far = _H ^ _bits_at(30, 35, 40, 45, 50, 55, 60, 62, 28, 33)
    near = _H ^ _bits_at(0, 11, 21, 32, 43, 53)  # every band holds three of them
    assert nd.hamming(_H, far) == 10 and nd.band_of(far, 0, 27) == nd.band_of(_H, 0, 27)
    a = Fingerprint((_H | nd.TEXTURE_BIT,), grey)
    b = Fingerprint((near | nd.TEXTURE_BIT, far), grey)
    key = nd.band_of(_H, 0, 27)
    assert key in nd.probe_keys(a) and key in {k for k, _ in nd.band_keys(b)}
    assert not nd.meets(a, b, key)  # the pairing that met is 10 apart
    assert nd.distance(a, b) <= nd.THRESHOLD  # though the pair is close by another
    assert nd.candidate_pairs([a, b]) == set()


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
    layout = f"{nd.BAND_COUNT}x{nd.BAND_BITS}"
    assert "| phash 18 windows |" in table and f"| 3,000 | {layout} |" in table


def test_the_folded_products_are_the_phash_of_each_windows_box_thumbnail():
    side = 64
    pixels = np.random.default_rng(2).integers(0, 256, size=(side, side, 3)).astype(np.float64)
    grey = pixels @ nd._GREY_WEIGHTS
    window = (0.08, 0.0, 1.0, 0.92)  # lopsided: rows and columns swapped would differ
    left, top, right, bottom = window
    thumb = nd._area_matrix(top, bottom, side, 32) @ grey @ nd._area_matrix(left, right, side, 32).T
    bits, sums = nd._hash_bits(pixels, nd._layout((window,)))
    assert bits.view(">u8").ravel().tolist() == [nd.phash_of(thumb)]
    assert bits.view(">u8").ravel().tolist() != [nd.phash_of(thumb.T)]
    assert sums.tolist() == pixels.reshape(-1, 3).sum(axis=0).tolist()


def _exact_products(pixels: np.ndarray) -> np.ndarray:
    # numpy's int64 products do not go through BLAS: exact, in a fixed order.
    layout = nd._DEFAULT_LAYOUT
    h, w, _ = pixels.shape
    whole = pixels.astype(np.int64)
    grey = whole @ nd._GREY_WEIGHTS.astype(np.int64)
    low = layout.row_transform(h).astype(np.int64) @ grey @ layout.col_transform(w).astype(np.int64)
    return np.concatenate([low.ravel(), whole.reshape(-1, 3).sum(axis=0)])


def _products(pixels: np.ndarray) -> np.ndarray:
    layout = nd._DEFAULT_LAYOUT
    h, w, _ = pixels.shape
    grey = pixels @ nd._GREY_WEIGHTS
    low = layout.row_transform(h) @ (grey @ layout.col_transform(w))
    return np.concatenate([low.ravel(), layout.ones(h * w) @ pixels.reshape(-1, 3)])


@pytest.mark.parametrize(
    "shape", [(32, 42), (63, 32), (32, 4000), (1, 1)], ids=["web", "portrait", "strip", "pixel"]
)
@pytest.mark.parametrize("fill", ["random", "white"])
def test_the_products_are_exact_integers_whatever_the_order(shape, fill):
    # Exact means the same bits from any BLAS build or CPU: the products of
    # integers held in float64 never round, so the order of the sums cannot
    # matter. White is the largest value every pixel can have.
    rng = np.random.default_rng(3)
    pixels = (
        rng.integers(0, 256, size=(*shape, 3)) if fill == "random" else np.full((*shape, 3), 255)
    )
    pixels = pixels.astype(np.float64)
    exact = _exact_products(pixels)
    assert np.array_equal(_products(pixels), exact)
    assert np.array_equal(_products(np.asfortranarray(pixels)), exact)
    assert np.abs(exact).max() < 2**53
    # What the fingerprint takes from them: the same hash bits and channel sums.
    bits, sums = nd._hash_bits(pixels, nd._DEFAULT_LAYOUT)
    assert np.array_equal(sums, exact[-3:])
    assert bits.shape == (len(nd.WINDOWS), 8)


def test_the_fingerprint_of_a_fixed_image_is_the_same_on_every_machine():
    # A record keeps the fingerprint it was written with, so any machine (a
    # Dataflow worker, another BLAS) must compute these bits for this image;
    # a change of the scheme has to be a deliberate one.
    blocks = np.random.default_rng(20261201).integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    fp = nd.fingerprint(Image.fromarray(blocks.repeat(40, axis=0).repeat(40, axis=1)))
    assert fp.hashes[:3] == (0x9B532D01516F6F91, 0x9BF32F01714EB191, 0x9BD32F01514F4F91)
    assert fp.colour == (85, 83, 87)
    assert len(fp.hashes) == len(nd.WINDOWS)


@pytest.mark.parametrize(
    "size, expected",
    [
        ((341, 256), (42, 32)),  # sampled: the last partial block of 5 columns left out
        ((256, 341), (32, 42)),
        ((255, 255), (37, 37)),  # a full reduce by 7 (its partial blocks averaged too)
        ((64, 64), (32, 32)),
        ((40, 90), (40, 90)),
    ],
)
def test_the_base_is_the_image_reduced_by_a_whole_factor(size, expected):
    base = nd._base(Image.new("RGB", size, (10, 20, 30)))
    assert base.shape == (expected[1], expected[0], 3)
    assert np.all(base == (10, 20, 30))


def test_a_large_image_s_base_averages_two_picked_pixels_a_side_of_each_block():
    # Factor 8: of each 8x8 block only the pixels NEAREST picks for a 2x2
    # grid (offsets 2 and 6) are read, then averaged; a full reduce would
    # average all 64, which on random pixels lands far from these four.
    pixels = np.random.default_rng(7).integers(0, 256, size=(256, 320, 3), dtype=np.uint8)
    base = nd._base(Image.fromarray(pixels))
    picked = pixels[2::4, 2::4].astype(np.float64)
    expected = (
        picked[0::2, 0::2] + picked[0::2, 1::2] + picked[1::2, 0::2] + picked[1::2, 1::2]
    ) / 4
    assert base.shape == (32, 40, 3)
    assert np.abs(base - expected).max() <= 0.5 + 1e-9  # Pillow rounds the average


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


def test_the_band_index_keeps_the_calibration_copies(tmp_path):
    # The goal the band layout is chosen for: the copies the default split
    # puts in another split than their original are what leaks, and at least
    # 95% of them must meet their original in some bucket and verify.
    from bench.near import duplicates as bench_near

    near = near_data.ensure_near_set(tmp_path)
    got = bench_near.calibrate(near, "phash", nd.WINDOWS)
    row = got["rows"][nd.THRESHOLD]
    assert row["cross_split_recall"] >= 0.95 and row["recall"] >= 0.95
    assert row["false_pairs"] == 0


def _random_prints(count: int, seed: int) -> list[Fingerprint]:
    rng = random.Random(seed)
    return [
        Fingerprint(
            tuple(rng.getrandbits(64) for _ in nd.WINDOWS), tuple(rng.randrange(256) for _ in "rgb")
        )
        for _ in range(count)
    ]


def _hash_array(prints: list[Fingerprint]) -> np.ndarray:
    return np.array([fp.hashes for fp in prints], dtype=np.uint64)


def test_known_keys_hold_exactly_the_keys_given():
    rng = np.random.default_rng(7)
    bits = nd.BAND_BITS
    top = 1 << bits
    # Both ends of the key space, neighbours of each other, and random keys.
    given = np.array([0, 1, 7, 8, 9, top - 1, top - 8] + rng.integers(0, top, 500).tolist())
    known = nd.KnownKeys.of([given[:300].astype(np.uint64), given[300:].astype(np.uint64)], bits)
    asked = np.concatenate([given, given + 1, given - 1, rng.integers(0, top, 2000)])
    asked = asked[(asked >= 0) & (asked < top)].astype(np.uint64).reshape(-1, 1)
    given_set = set(given.tolist())
    assert known.has(asked).tolist() == [[k in given_set] for k in asked.ravel().tolist()]
    assert known.bits.nbytes == top // 8


def test_distances_and_colours_of_arrays_are_each_pair_s():
    prints = _random_prints(30, 5)
    # Near copies: the whole hash of one is a window of another, a few bits off.
    for n in range(0, 30, 3):
        a, b = prints[n], prints[n + 1]
        near = a.hashes[7] ^ (0b1011 << (n % 50))
        colour = tuple(min(255, c + n % 14) for c in a.colour)
        prints[n + 1] = Fingerprint((near,) + b.hashes[1:], colour)
    pairs = list(itertools.combinations(range(30), 2))
    i, j = (np.array(side) for side in zip(*pairs, strict=True))
    hashes = _hash_array(prints)
    colours = np.array([fp.colour for fp in prints], dtype=np.uint8)
    got = nd.distances(hashes[i], hashes[j]).tolist()
    assert got == [nd.distance(prints[a], prints[b]) for a, b in pairs]
    second = nd.supports(hashes[i], hashes[j]).tolist()
    assert second == [nd.support(prints[a], prints[b]) for a, b in pairs]
    assert min(got) <= 3  # the planted copies are there to compare
    agree = nd.colours_agree_rows(colours[i], colours[j]).tolist()
    assert agree == [nd.colours_agree(prints[a], prints[b]) for a, b in pairs]
    assert any(agree) and not all(agree)


@pytest.mark.parametrize("size", [(32, 32), (341, 256), (40, 300), (3, 2)])
def test_the_converter_s_packed_fingerprint_is_the_packed_tuple(size):
    from beam_pipeline.features.near import search as near_search

    rng = np.random.default_rng(size[0])
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    assert near_search.pack_image(img) == near_search.pack(nd.fingerprint(img))
    assert near_search.unpack(near_search.pack_image(img)) == nd.fingerprint(img)

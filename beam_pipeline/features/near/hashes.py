"""Near duplicates: perceptual hashes of a decoded image, their band keys, the pairs.

A ``Fingerprint`` is a pHash of the image and of 18 sub-windows plus its mean
chromaticity; the whole hash's first bit says whether the image has the texture a hash
needs (``textured``). How the search uses them: docs/architecture.md, "Near-duplicate
search". Pure: numpy and Pillow only.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np
from PIL import Image

from beam_pipeline.features.near import texture as near_texture

HASH_BITS = 64
# Sub-windows hashed besides the whole image, as (left, top, right, bottom)
# fractions: squares of 96% and 92% of each side, each at the nine offsets
# of a 3x3 grid, so a copy cropped by up to 10% of each side's length lines
# up with one of them to within about 2% (the 90% centre and corners alone
# left nearly half of the crops beyond the threshold).
WINDOW_CUTS = (0.04, 0.08)
WINDOWS: tuple[tuple[float, float, float, float], ...] = ((0.0, 0.0, 1.0, 1.0),) + tuple(
    (x * cut, y * cut, 1 - cut + x * cut, 1 - cut + y * cut)
    for cut in WINDOW_CUTS
    for x in (0.0, 0.5, 1.0)
    for y in (0.0, 0.5, 1.0)
)
# The band index: BAND_COUNT bands of BAND_BITS bits, evenly spaced around the
# hash read as a ring (``band_offsets``), so bands overlap. Every hash of an
# image is filed under its band keys (its "homes"); the whole hash also looks
# up its keys with up to PROBE_FLIPS bits flipped (its "probes"), and a probe
# that meets a home keeps the pair only when that pairing (the whole hash
# against the home's hash) is within THRESHOLD (``meets``). Six differing bits
# leave an exact 23-bit band clean for 6% of pairings; a 27-bit band holding
# at most one of them is 19%, so one-flip probes of wide bands find the crops
# exact bands lose (bench/results/2026-12-03-near-recall.md: the held-out
# set reaches the fingerprint's ceiling at 6 x 27, for 1.4x today's search).
BAND_BITS = 27
BAND_COUNT = 6
PROBE_FLIPS = 1
# Calibrated by bench/near/duplicates.py on real photos (docs/performance.md).
THRESHOLD = 6
# A pair also needs a second pairing of its hashes within SUPPORT (``support``):
# a copy lies close to its original under neighbouring windows too (on the
# calibration set every copy's second distance is 10 or less), where two
# distinct look-alikes meet under one pairing alone (the one false pair at
# THRESHOLD there, two tiles of a starfield: 6, then 12).
SUPPORT = 10
# Largest difference of mean chromaticity (0-255 scale, per channel) of a pair.
COLOUR_TOLERANCE = 12

_PHASH_SIDE = 32  # pHash: DCT of a 32x32 thumbnail, the 8x8 lowest frequencies kept

# The first bit of a pHash compares the DC coefficient with the median of the
# others: set in every image, so it carries nothing. The whole hash's holds
# the texture flag instead; the windows' keep theirs.
TEXTURE_BIT = 1 << (HASH_BITS - 1)


class Fingerprint(NamedTuple):
    """What the search keeps of one image.

    Attributes:
        hashes: 64-bit hashes, the whole image's first, then one per window.
        colour: mean chromaticity (r, g, b shares of the sum, 0-255).
    """

    hashes: tuple[int, ...]
    colour: tuple[int, int, int]


def _bits_to_int(bits: np.ndarray) -> int:
    return int.from_bytes(np.packbits(bits.ravel().astype(np.uint8)).tobytes(), "big")


def _dct_matrix(n: int) -> np.ndarray:
    k = np.arange(n)[:, None]
    x = np.arange(n)[None, :]
    return np.cos(np.pi * (2 * x + 1) * k / (2 * n))


_DCT = _dct_matrix(_PHASH_SIDE)[:8]


def phash_of(thumb: np.ndarray) -> int:
    """pHash of a 32x32 grey thumbnail: the 8x8 lowest DCT frequencies against their median."""
    low = _DCT @ thumb @ _DCT.T
    flat = low.ravel()
    return _bits_to_int(flat > np.median(flat[1:]))


def dhash_of(thumb: np.ndarray) -> int:
    """dHash of a 9x8 (width x height) grey thumbnail: each pixel brighter than its left."""
    return _bits_to_int(thumb[:, 1:] > thumb[:, :-1])


def ahash_of(thumb: np.ndarray) -> int:
    """aHash of an 8x8 grey thumbnail: each pixel brighter than the mean."""
    return _bits_to_int(thumb > thumb.mean())


class HashKind(NamedTuple):
    thumb_size: tuple[int, int]
    of: Callable[[np.ndarray], int]


HASH_KINDS: dict[str, HashKind] = {
    "phash": HashKind((_PHASH_SIDE, _PHASH_SIDE), phash_of),
    "dhash": HashKind((9, 8), dhash_of),
    "ahash": HashKind((8, 8), ahash_of),
}
DEFAULT_KIND = "phash"
# Every window is cut from one small copy of the image (its shorter side 32
# to 63 pixels), so the cost per image hardly depends on the image's own size.
BASE_SIDE = 32


def _area_matrix(low: float, high: float, n_in: int, n_out: int) -> np.ndarray:
    """``(n_out, n_in)`` weights that average ``[low, high)`` of ``n_in`` pixels
    (fractions of the side) into ``n_out`` equal bins, like a box resize."""
    edges = np.linspace(low * n_in, high * n_in, n_out + 1)
    pixel = np.arange(n_in)
    overlap = np.clip(
        np.minimum(edges[1:, None], pixel[None, :] + 1) - np.maximum(edges[:-1, None], pixel),
        0,
        None,
    )
    return overlap / overlap.sum(axis=1, keepdims=True)


# The products run on integers held in float64: the base's grey values
# (below 2**18), the transforms scaled by 2**_SCALE_BITS and rounded. Every
# partial sum stays below 2**53 (a transform row's absolute sum is at most
# 32 units of scale and half a unit per pixel: 2**(18 + 2 * 16) with room), so
# each product and sum is exact and the result is the same whatever order a
# BLAS build or CPU adds in, or however the products are grouped: the same bits
# everywhere.
_SCALE_BITS = 11
_GREY_WEIGHTS = np.array([299.0, 587.0, 114.0])  # ITU-R 601 in thousandths, Pillow's "L" unrounded


def _side_transform(n: int, spans: tuple[tuple[float, float], ...]) -> np.ndarray:
    """``(8 * len(spans), n)``: per span of a side, the rows that take ``n`` pixels
    to the 8 lowest DCT frequencies of the span's 32-bin box average, scaled
    and rounded to integers (one side of the separable 2-D transform)."""
    folded = [_DCT @ _area_matrix(low, high, n, _PHASH_SIDE) for low, high in spans]
    return np.rint(np.concatenate(folded) * 2**_SCALE_BITS)


class _Layout:
    """The windows' distinct spans per side and each side's transform by its length."""

    def __init__(self, windows: tuple[tuple[float, float, float, float], ...]):
        # Windows share spans (a 3x3 grid has three per side and cut), so each
        # side's transform is one product over the distinct spans.
        self.rows = tuple(sorted({(top, bottom) for _, top, _, bottom in windows}))
        self.cols = tuple(sorted({(left, right) for left, _, right, _ in windows}))
        row_of = np.array([self.rows.index((t, b)) for _, t, _, b in windows])
        col_of = np.array([self.cols.index((left, r)) for left, _, r, _ in windows])
        # Where each window's 8x8 block lies in the raveled product of every
        # row span by every column span, coefficient by coefficient.
        k = np.arange(8)
        rows_at = (row_of[:, None] * 8 + k)[:, :, None] * (len(self.cols) * 8)
        self.take = (rows_at + (col_of[:, None] * 8 + k)[:, None, :]).reshape(len(windows), 64)
        self._rows: dict[int, np.ndarray] = {}
        self._cols: dict[int, np.ndarray] = {}
        self._ones: dict[int, np.ndarray] = {}

    def row_transform(self, n: int) -> np.ndarray:
        """``(8 * row spans, n)``: the transform of a column of ``n`` grey values."""
        found = self._rows.get(n)
        if found is None:
            found = self._rows[n] = _side_transform(n, self.rows)
        return found

    def col_transform(self, n: int) -> np.ndarray:
        """``(n, 8 * column spans)``: the transform of a row of ``n`` grey values."""
        found = self._cols.get(n)
        if found is None:
            found = self._cols[n] = np.ascontiguousarray(_side_transform(n, self.cols).T)
        return found

    def ones(self, n: int) -> np.ndarray:
        """``(n,)`` ones: a product with them sums ``n`` pixels' channels (numpy's
        strided sum over the pixel axis costs several times more)."""
        found = self._ones.get(n)
        if found is None:
            found = self._ones[n] = np.ones(n)
        return found


@functools.lru_cache(maxsize=64)
def _layout(windows: tuple[tuple[float, float, float, float], ...]) -> _Layout:
    return _Layout(windows)


def _hash_bits(pixels: np.ndarray, layout: _Layout) -> tuple[np.ndarray, np.ndarray]:
    """``(windows, 8)`` uint8, each window's pHash big-endian (the first's first
    bit its texture flag), and the ``(3,)`` channel sums, of ``(h, w, 3)``
    pixels: exact integer products (see above)."""
    h, w, _ = pixels.shape
    # Grey first, then each side's transform: the fewest steps and the smallest
    # arrays. The fingerprint runs between two conversions, whose work pushes
    # numpy's and Pillow's code and state out of the caches, so each step
    # costs about twice what it does run after run: the steps cost, not the
    # arithmetic (bench/results/2026-12-03-fingerprint-cost.md).
    flat = pixels.reshape(h * w, 3)
    grey = (flat @ _GREY_WEIGHTS).reshape(h, w)
    low = (layout.row_transform(h) @ (grey @ layout.col_transform(w))).ravel().take(layout.take)
    # The median of the 63 coefficients after DC is the 32nd smallest; sorted
    # rather than partitioned, so the texture rule takes the whole image's in order.
    ranked = np.sort(low[:, 1:], axis=1)
    median = ranked[:, 31:32]
    bits = np.packbits(low > median, axis=1)
    # The blank test on every other pixel of every other row: a quarter of the
    # cost, the same answer for a page or a photo.
    textured = near_texture.passes(ranked[0], float(median[0, 0]), _GREY_LEVEL) and not (
        near_texture.blank(grey[::2, ::2])
    )
    if textured:
        bits[0, 0] |= 0x80
    else:
        bits[0, 0] &= 0x7F
    return bits, layout.ones(h * w) @ flat


# One grey level of a coefficient in the products' units (``near_texture``):
# the two side transforms' scale, the grey weights' thousandths, and the
# 16 x 16 a cosine of amplitude one sums to over the 32 x 32 bins.
_GREY_LEVEL = 2 ** (2 * _SCALE_BITS) * 1000 * 256


_DEFAULT_LAYOUT = _Layout(WINDOWS)


# From a reduce factor of SAMPLED_FROM on, the base is not a full reduce: a
# NEAREST pick of SAMPLES x SAMPLES pixels of each factor x factor block,
# then their box average. The pick reads a fraction of the rows and pixels a
# full reduce reads (the fingerprint's largest cost), and the windows' 32-bin
# box averages over the base smooth what the sparser samples alias. Below
# SAMPLED_FROM (stored images under 256 pixels a side) the full reduce reads
# few pixels anyway and stays exact. Both calibrated by bench/near/duplicates.py.
SAMPLES = 2
SAMPLED_FROM = 8


def base_plan(width: int, height: int) -> tuple[int, int, int]:
    """``(factor, base width, base height)``: the integer factor that takes the
    shorter side to ``BASE_SIDE`` to ``2 * BASE_SIDE - 1`` pixels (1 when smaller)."""
    factor = max(1, min(width, height) // BASE_SIDE)
    return factor, width // factor, height // factor


def _base(img: Image.Image) -> np.ndarray:
    """``(h, w, 3)`` float64 pixels of ``img`` reduced by an integer factor to a
    shorter side of ``BASE_SIDE`` to ``2 * BASE_SIDE - 1`` pixels (or its own, if smaller)."""
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    # No resize to a fixed size: the windows' box averages are folded into the
    # transforms for whatever size comes out.
    factor, width, height = base_plan(*rgb.size)
    if factor >= SAMPLED_FROM:
        box = (0, 0, width * factor, height * factor)
        picked = rgb.resize((width * SAMPLES, height * SAMPLES), Image.Resampling.NEAREST, box=box)
        small = picked.reduce(SAMPLES)
    elif factor > 1:
        small = rgb.reduce(factor)
    else:
        small = rgb
    pixels = np.frombuffer(small.tobytes(), np.uint8).reshape(small.height, small.width, 3)
    return pixels.astype(np.float64)


def fingerprint(
    img: Image.Image,
    kind: str = DEFAULT_KIND,
    windows: Sequence[tuple[float, float, float, float]] = WINDOWS,
) -> Fingerprint:
    """The hashes and colour of a decoded image (any mode)."""
    pixels = _base(img)
    if kind == "phash":
        bits, sums = _hash_bits(pixels, _layout_of(windows))
        return Fingerprint(tuple(bits.view(">u8").ravel().tolist()), _chromaticity(sums))
    else:  # the other kinds, for the benchmark's comparison: one thumbnail per window
        grey = pixels @ _GREY_WEIGHTS
        spec = HASH_KINDS[kind]
        base = Image.fromarray((grey / 1000).round().astype(np.uint8))
        hashes = []
        for left, top, right, bottom in windows:
            box = (left * base.width, top * base.height, right * base.width, bottom * base.height)
            thumb = base.resize(spec.thumb_size, Image.Resampling.BOX, box=box)
            hashes.append(spec.of(np.asarray(thumb, dtype=np.float32)))
    # A product with ones: numpy's strided sum over the pixel axis costs 5x more.
    return Fingerprint(tuple(hashes), _chromaticity(np.ones(grey.size) @ pixels.reshape(-1, 3)))


def packed(img: Image.Image) -> tuple[bytes, tuple[int, int, int]]:
    """:func:`fingerprint`'s pHash of the default windows as big-endian bytes (8 a
    hash), and its colour: what a record stores, without the tuple of ints."""
    bits, sums = _hash_bits(_base(img), _DEFAULT_LAYOUT)
    return bits.tobytes(), _chromaticity(sums)


def _layout_of(windows) -> _Layout:
    return _DEFAULT_LAYOUT if windows is WINDOWS else _layout(tuple(windows))


def _chromaticity(sums: np.ndarray) -> tuple[int, int, int]:
    """Mean chromaticity from the channel sums: each channel's share, 0-255."""
    r, g, b = sums.tolist()
    scale = 255 / max(r + g + b, 1.0)
    return round(r * scale), round(g * scale), round(b * scale)


def textured(fp: Fingerprint) -> bool:
    """Whether the image has the texture its hashes need to be paired (the flag
    its whole hash holds)."""
    return bool(fp.hashes[0] & TEXTURE_BIT)


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def distance(a: Fingerprint, b: Fingerprint) -> int:
    """The least distance of either whole-image hash to any hash of the other.

    Window against window is not compared: a copy's whole image is what
    matches a window of its original, and leaving the other pairings out
    keeps distinct photos that share one corner from meeting.
    """
    best = min(hamming(a.hashes[0], h) for h in b.hashes)
    return min(best, min(hamming(b.hashes[0], h) for h in a.hashes))


def support(a: Fingerprint, b: Fingerprint) -> int:
    """The second least distance of :func:`distance`'s pairings (whole against
    whole counted once; a fingerprint of the whole image alone has one, its own)."""
    pairings = [hamming(a.hashes[0], h) for h in b.hashes]
    pairings += [hamming(b.hashes[0], h) for h in a.hashes[1:]]
    return sorted(pairings)[min(1, len(pairings) - 1)]


def colours_agree(a: Fingerprint, b: Fingerprint, tolerance: int = COLOUR_TOLERANCE) -> bool:
    return max(abs(x - y) for x, y in zip(a.colour, b.colour, strict=True)) <= tolerance


def verify(
    a: Fingerprint,
    b: Fingerprint,
    threshold: int = THRESHOLD,
    tolerance: int = COLOUR_TOLERANCE,
) -> int | None:
    """The pair's distance if they are near copies, else None (always for an
    image without texture: its hash says too little to pair it)."""
    if not (textured(a) and textured(b)):
        return None
    d = distance(a, b)
    if d > threshold or support(a, b) > SUPPORT:
        return None
    return d if colours_agree(a, b, tolerance) else None


def distances(hashes_a: np.ndarray, hashes_b: np.ndarray) -> np.ndarray:
    """:func:`distance` of each row pair of two ``(pairs, slots)`` uint64 arrays."""
    return np.bitwise_count(_pairings(hashes_a, hashes_b)).min(axis=1)


def supports(hashes_a: np.ndarray, hashes_b: np.ndarray) -> np.ndarray:
    """:func:`support` of each row pair of two ``(pairs, slots)`` uint64 arrays."""
    counts = np.bitwise_count(_pairings(hashes_a, hashes_b))
    second = min(1, counts.shape[1] - 1)
    return np.partition(counts, second, axis=1)[:, second]


def _pairings(hashes_a: np.ndarray, hashes_b: np.ndarray) -> np.ndarray:
    """Both directions' XORs side by side, whole against whole once: ``(pairs, 2 * slots - 1)``."""
    slots = hashes_a.shape[1]
    xor = np.empty((len(hashes_a), 2 * slots - 1), np.uint64)
    np.bitwise_xor(hashes_a[:, :1], hashes_b, out=xor[:, :slots])
    np.bitwise_xor(hashes_b[:, :1], hashes_a[:, 1:], out=xor[:, slots:])
    return xor


def colours_agree_rows(
    colour_a: np.ndarray, colour_b: np.ndarray, tolerance: int = COLOUR_TOLERANCE
) -> np.ndarray:
    """:func:`colours_agree` of each row pair of two ``(pairs, 3)`` integer arrays."""
    return np.abs(colour_a.astype(np.int16) - colour_b).max(axis=1) <= tolerance


def key_bits(band_bits: int = BAND_BITS, band_count: int = BAND_COUNT) -> int:
    """Bits of a band key: the band's index above its ``band_bits`` bits."""
    return band_bits + max(1, int(band_count - 1).bit_length())


def band_rows(hashes: np.ndarray, offset: int, band_bits: int = BAND_BITS) -> np.ndarray:
    """:func:`band_of` of every hash of a uint64 array (any shape), as uint64."""
    ring = hashes >> np.uint64(offset)
    if offset:
        ring |= hashes << np.uint64(HASH_BITS - offset)
    return ring & np.uint64((1 << band_bits) - 1)


def band_key_grid(
    hashes: np.ndarray, band_bits: int = BAND_BITS, band_count: int = BAND_COUNT
) -> np.ndarray:
    """``(images, bands, slots)`` uint64: the band key of every hash of an
    ``(images, slots)`` uint64 array in every band (``band_keys``' keys, not deduplicated)."""
    images, slots = hashes.shape
    keys = np.empty((images, band_count, slots), np.uint64)
    for band, offset in enumerate(band_offsets(band_count)):
        keys[:, band] = band_rows(hashes, offset, band_bits) | np.uint64(band << band_bits)
    return keys


def flip_masks(band_bits: int = BAND_BITS, flips: int = PROBE_FLIPS) -> np.ndarray:
    """uint64 XOR masks of a probe: no bit, then every set of up to ``flips`` bits."""
    masks = [
        sum(1 << b for b in bits)
        for r in range(flips + 1)
        for bits in itertools.combinations(range(band_bits), r)
    ]
    return np.array(masks, np.uint64)


class KnownKeys:
    """A set of keys below ``2**bits``, one bit a key (the local search's index of
    band keys some hash has): 16 MB at 27 bits,
    and a lookup in it stays in cache far more often than a bool a key."""

    def __init__(self, bits: np.ndarray):
        self.bits = bits  # uint8, little-endian: key k is bit k % 8 of byte k // 8

    @classmethod
    def of(cls, key_chunks: Iterable[np.ndarray], bits: int) -> KnownKeys:
        """The set of every key in ``key_chunks`` (uint64 arrays), through a bool
        table of ``2**bits`` held while it is made (128 MB at 27 bits)."""
        seen = np.zeros(1 << bits, bool)
        for keys in key_chunks:
            seen[keys.ravel()] = True
        return cls(np.packbits(seen, bitorder="little"))

    def has(self, keys: np.ndarray) -> np.ndarray:
        """A bool per key of a uint64 array (any shape): is it in the set."""
        at = keys.view(np.int64)
        return ((self.bits[at >> 3] >> (at & 7).astype(np.uint8)) & 1).astype(bool)


def band_offsets(band_count: int = BAND_COUNT) -> tuple[int, ...]:
    """The first bit (from the lowest) of each band: evenly spaced around the 64."""
    return tuple(round(band * HASH_BITS / band_count) for band in range(band_count))


def band_of(h: int, offset: int, band_bits: int) -> int:
    """Bits ``offset .. offset + band_bits - 1`` of ``h``, wrapping past the highest bit."""
    ring = (h >> offset) | (h << (HASH_BITS - offset))
    return ring & ((1 << band_bits) - 1)


def band_keys(
    fp: Fingerprint, band_bits: int = BAND_BITS, band_count: int = BAND_COUNT
) -> list[tuple[int, bool]]:
    """The keys an image is filed under (its homes): ``(key, whole)``, sorted.

    A key is a band's index and its bits. The whole image's hash and the
    windows' share one key space, since a copy's whole image matches its
    original's window; ``whole`` says the whole image's hash has that band.
    """
    found: dict[int, bool] = {}
    for band, offset in enumerate(band_offsets(band_count)):
        for slot, h in enumerate(fp.hashes):
            key = (band << band_bits) | band_of(h, offset, band_bits)
            found[key] = found.get(key, False) or slot == 0
    return sorted(found.items())


def probe_keys(
    fp: Fingerprint,
    band_bits: int = BAND_BITS,
    band_count: int = BAND_COUNT,
    flips: int = PROBE_FLIPS,
) -> list[int]:
    """The keys an image's whole hash looks up (its probes): in each band its own
    key and that key with up to ``flips`` bits flipped, sorted."""
    masks = flip_masks(band_bits, flips).tolist()
    return sorted(
        (band << band_bits) | (band_of(fp.hashes[0], offset, band_bits) ^ m)
        for band, offset in enumerate(band_offsets(band_count))
        for m in masks
    )


def meets(
    prober: Fingerprint,
    home: Fingerprint,
    key: int,
    band_bits: int = BAND_BITS,
    band_count: int = BAND_COUNT,
    threshold: int = THRESHOLD,
) -> bool:
    """Whether ``prober``'s whole hash, looking up ``key``, meets ``home`` there: a
    hash of ``home`` has the key and is within ``threshold`` of that whole hash.

    Only the pairing that met counts: a far pairing that shares a key by luck
    brings no candidate (the verification's distance is the pair's best).
    """
    offset = band_offsets(band_count)[key >> band_bits]
    bits = key & ((1 << band_bits) - 1)
    whole = prober.hashes[0]
    return any(
        band_of(h, offset, band_bits) == bits and hamming(whole, h) <= threshold
        for h in home.hashes
    )


def bucket_pairs(members: Sequence[tuple[int, bool]]) -> Iterable[tuple[int, int]]:
    """The meetings ``(prober, home)`` of one key's bucket of ``(index, probe)``
    entries: each probe against each home of another image."""
    for a, probe_a in members:
        if probe_a:
            for b, probe_b in members:
                if not probe_b and a != b:
                    yield a, b


def candidate_pairs(
    fingerprints: Sequence[Fingerprint],
    band_bits: int = BAND_BITS,
    band_count: int = BAND_COUNT,
    flips: int = PROBE_FLIPS,
) -> set[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, whose probe and home meet (``meets``): the
    in-memory GroupByKey."""
    buckets: dict[int, list[tuple[int, bool]]] = {}
    for index, fp in enumerate(fingerprints):
        for key, _ in band_keys(fp, band_bits, band_count):
            buckets.setdefault(key, []).append((index, False))
        for key in probe_keys(fp, band_bits, band_count, flips):
            buckets.setdefault(key, []).append((index, True))
    pairs: set[tuple[int, int]] = set()
    for key, members in buckets.items():
        for a, b in bucket_pairs(members):
            if meets(fingerprints[a], fingerprints[b], key, band_bits, band_count):
                pairs.add((min(a, b), max(a, b)))
    return pairs


def find_pairs(
    fingerprints: Sequence[Fingerprint],
    threshold: int = THRESHOLD,
    tolerance: int = COLOUR_TOLERANCE,
) -> list[tuple[int, int, int]]:
    """Verified pairs ``(i, j, distance)``, sorted."""
    found = []
    for i, j in sorted(candidate_pairs(fingerprints)):
        d = verify(fingerprints[i], fingerprints[j], threshold, tolerance)
        if d is not None:
            found.append((i, j, d))
    return found


def groups(pairs: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Near-duplicate groups from verified pairs of IDs, by union-find.

    Each group is sorted, and the groups by their first ID, so the result is
    the same whatever order the pairs come in.
    """
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            # The smaller ID becomes the root: the outcome is order-independent anyway
            # (groups are sorted below), this only keeps the trees' shape stable.
            parent[max(ra, rb)] = min(ra, rb)
    members: dict[str, list[str]] = {}
    for x in parent:
        members.setdefault(root(x), []).append(x)
    return sorted(sorted(m) for m in members.values())

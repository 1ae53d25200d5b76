"""Near duplicates: perceptual hashes of a decoded image, their band keys, the pairs.

A near copy (the same photo resized, re-encoded, lightly cropped or
brightened) has another SHA-256, so ``duplicates.py`` cannot see it. Here an
image becomes a ``Fingerprint``: a 64-bit perceptual hash (pHash) of the
whole image plus one of each of 18 sub-windows (a crop of the original is
close to one of its windows), and its mean chromaticity, a cheap check that keeps a
grey photo and a colour one of the same layout apart.

The search never compares all pairs: each hash is cut into bands
(``band_keys``), images that share a band key are candidates (on Beam a
``GroupByKey`` on the key, here ``candidate_pairs``), and a candidate is a
pair only if ``verify`` finds a whole-image hash of one within the calibrated
Hamming distance of any hash of the other. Verified pairs are joined into
groups by union-find (``groups``), in an order that does not depend on the
order the pairs arrived in.

Pure: numpy and Pillow only, no Beam, no storage.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np
from PIL import Image

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
BAND_BITS = 16
# Calibrated by bench/near/duplicates.py on real photos (docs/performance.md).
THRESHOLD = 6
# Largest difference of mean chromaticity (0-255 scale, per channel) of a pair.
COLOUR_TOLERANCE = 12

_PHASH_SIDE = 32  # pHash: DCT of a 32x32 thumbnail, the 8x8 lowest frequencies kept


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
# Every window is cut from one small grey copy of the image, so the cost per
# image hardly depends on the image's own size.
BASE_SIDE = 64


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


def _window_transforms(windows, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Per window, the rows (8 x side) that take the base straight to its 8x8 lowest
    DCT frequencies: the DCT of the window's 32x32 box thumbnail, in one product."""
    rows = [_DCT @ _area_matrix(top, bottom, side, _PHASH_SIDE) for _, top, _, bottom in windows]
    cols = [_DCT @ _area_matrix(left, right, side, _PHASH_SIDE) for left, _, right, _ in windows]
    return np.stack(rows).astype(np.float32), np.stack(cols).astype(np.float32).transpose(0, 2, 1)


_TRANSFORMS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
_GREY = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R 601, Pillow's "L"


def _phashes(base: np.ndarray, windows) -> list[int]:
    key = (tuple(windows), base.shape[0])
    if key not in _TRANSFORMS:
        _TRANSFORMS[key] = _window_transforms(windows, base.shape[0])
    rows, cols = _TRANSFORMS[key]
    low = (rows @ base @ cols).reshape(len(windows), 64)
    # The median of the 63 coefficients after DC is the 32nd smallest.
    median = np.partition(low[:, 1:], 31, axis=1)[:, 31:32]
    bits = low > median
    return np.packbits(bits, axis=1).view(">u8").ravel().tolist()


def fingerprint(
    img: Image.Image,
    kind: str = DEFAULT_KIND,
    windows: Sequence[tuple[float, float, float, float]] = WINDOWS,
) -> Fingerprint:
    """The hashes and colour of a decoded image (any mode)."""
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    # An integer reduce first: a box resize straight from a large image costs
    # several times more for the same 64x64 average.
    small = rgb.reduce(max(1, min(rgb.size) // BASE_SIDE))
    small = small.resize((BASE_SIDE, BASE_SIDE), Image.Resampling.BOX)
    pixels = np.asarray(small, dtype=np.float32)
    base = pixels @ _GREY
    if kind == "phash":
        hashes = _phashes(base, windows)
    else:  # the other kinds, for the benchmark's comparison: one thumbnail per window
        spec = HASH_KINDS[kind]
        grey = Image.fromarray(base.round().astype(np.uint8))
        hashes = []
        for left, top, right, bottom in windows:
            box = (left * BASE_SIDE, top * BASE_SIDE, right * BASE_SIDE, bottom * BASE_SIDE)
            thumb = grey.resize(spec.thumb_size, Image.Resampling.BOX, box=box)
            hashes.append(spec.of(np.asarray(thumb, dtype=np.float32)))
    # A product with ones: numpy's strided sum over the pixel axis costs 20x more.
    sums = np.ones(BASE_SIDE * BASE_SIDE, np.float32) @ pixels.reshape(-1, 3)
    shares = sums / max(float(sums.sum()), 1e-9) * 255
    return Fingerprint(tuple(hashes), tuple(int(round(s)) for s in shares))


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


def colours_agree(a: Fingerprint, b: Fingerprint, tolerance: int = COLOUR_TOLERANCE) -> bool:
    return max(abs(x - y) for x, y in zip(a.colour, b.colour, strict=True)) <= tolerance


def verify(
    a: Fingerprint,
    b: Fingerprint,
    threshold: int = THRESHOLD,
    tolerance: int = COLOUR_TOLERANCE,
) -> int | None:
    """The pair's distance if they are near copies, else None."""
    d = distance(a, b)
    return d if d <= threshold and colours_agree(a, b, tolerance) else None


def band_keys(fp: Fingerprint, band_bits: int = BAND_BITS) -> list[tuple[int, bool]]:
    """The keys under which an image meets its candidates: ``(key, whole)``, sorted.

    A key is a band's index and its bits. The whole image's hash and the
    windows' share one key space, since a copy's whole image matches its
    original's window; ``whole`` says the whole image's hash has that band,
    and a bucket pairs only entries of which one at least is whole (two
    windows are never compared, ``distance``), which keeps the candidates
    to about one image's hash against every hash rather than all against all.
    """
    mask = (1 << band_bits) - 1
    found: dict[int, bool] = {}
    for slot, h in enumerate(fp.hashes):
        for band in range(HASH_BITS // band_bits):
            key = (band << band_bits) | ((h >> (band * band_bits)) & mask)
            found[key] = found.get(key, False) or slot == 0
    return sorted(found.items())


def bucket_pairs(members: Sequence[tuple[int, bool]]) -> Iterable[tuple[int, int]]:
    """The candidate pairs ``(i, j)``, ``i < j``, of one band key's bucket of ``(index, whole)``."""
    for (a, whole_a), (b, whole_b) in itertools.combinations(members, 2):
        if (whole_a or whole_b) and a != b:
            yield (a, b) if a < b else (b, a)


def candidate_pairs(
    fingerprints: Sequence[Fingerprint], band_bits: int = BAND_BITS
) -> set[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, that share a band key (the in-memory GroupByKey)."""
    buckets: dict[int, list[tuple[int, bool]]] = {}
    for index, fp in enumerate(fingerprints):
        for key, whole in band_keys(fp, band_bits):
            buckets.setdefault(key, []).append((index, whole))
    pairs: set[tuple[int, int]] = set()
    for members in buckets.values():
        pairs.update(bucket_pairs(members))
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

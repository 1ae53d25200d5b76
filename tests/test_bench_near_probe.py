"""bench/tools/near_probe.py: the one-flip index finds what exact bands lose, and the
product's candidates are the tool's reading of the rule."""

from __future__ import annotations

import numpy as np

from beam_pipeline.features.near import hashes as nd
from bench.tools import near_probe


def _lost_by_exact_bands(rng) -> int:
    """Six flipped bits that leave every exact 23-bit band of phash19-v4's layout
    dirty, but one band of the product's with one flip at most."""
    while True:
        bits = rng.choice(nd.HASH_BITS - 1, size=6, replace=False)
        mask = sum(1 << int(b) for b in bits)
        exact = [nd.band_of(mask, o, 23) for o in nd.band_offsets(8)]
        wide = [nd.band_of(mask, o, nd.BAND_BITS) for o in nd.band_offsets()]
        if all(exact) and min(w.bit_count() for w in wide) <= 1:
            return mask


def _hashes(rng, images: int) -> np.ndarray:
    hashes = rng.integers(0, 2**63, size=(images, len(nd.WINDOWS)), dtype=np.int64)
    return hashes.view(np.uint64) | np.uint64(nd.TEXTURE_BIT)


def test_one_flip_finds_a_pair_no_exact_band_holds():
    rng = np.random.default_rng(7)
    hashes = _hashes(rng, 40)
    # Image 1's whole hash is image 0's third window with six bits flipped.
    hashes[1, 0] = hashes[0, 2] ^ np.uint64(_lost_by_exact_bands(rng))
    fps = [nd.Fingerprint(tuple(int(h) for h in row), (85, 85, 85)) for row in hashes]
    assert (0, 1) not in near_probe.exact_candidates(fps, 8, 23)
    assert (0, 1) in near_probe.flip_candidates(fps, nd.BAND_COUNT, nd.BAND_BITS)
    assert (0, 1) in nd.candidate_pairs(fps)


def test_the_product_pairs_what_the_tool_s_rule_pairs():
    rng = np.random.default_rng(11)
    hashes = _hashes(rng, 300)
    for k in range(30):  # near copies at 0 to 8 bits, some within the threshold
        a, b = 2 * k, 2 * k + 1
        flips = rng.choice(nd.HASH_BITS - 1, size=k % 9, replace=False)
        hashes[b, 0] = hashes[a, 1 + k % 18] ^ np.uint64(sum(1 << int(f) for f in flips))
    fps = [nd.Fingerprint(tuple(int(h) for h in row), (85, 85, 85)) for row in hashes]
    rule = near_probe.flip_candidates(fps, nd.BAND_COUNT, nd.BAND_BITS)
    assert nd.candidate_pairs(fps) == rule
    assert len(rule) >= 20  # most copies within the threshold are found

"""The texture rule of the near-duplicate fingerprint: whether an image's pHash
says enough about it to pair it.

A flat, gradient, striped, line-art or mostly blank picture hashes to nearly
the same bits as any other such picture, so ``near_duplicates`` sets its
texture flag only where :func:`passes` and not :func:`blank`; an image
without it is never searched. Pure: numpy only.
"""

from __future__ import annotations

import bisect

import numpy as np

# Calibrated by bench/near/texture.py on the low-texture cases and the photo
# calibration set. The whole image's 63 lowest AC DCT coefficients, in grey
# levels (a cosine of amplitude A across the image is about A): an image is
# textured when their root sum of squares is at least TEXTURE_ENERGY and at
# least TEXTURE_COEFFICIENTS of them lie more than TEXTURE_MARGIN from their
# median (the bits a small change cannot flip), and no more than BLANK_SHARE
# of the fingerprint's base lies within BLANK_LEVELS grey levels of the
# base's median. Flat images have none of it; gradients, stripes and simple
# shapes have a handful of strong coefficients (at most 15); a page of a few
# lines of text is blank where the base's samples miss its thin strokes
# (95-99%), so a faint hash of its layout would pair it with any other such
# page. The photos' least are 34 coefficients, energy 11.7 and 89% blank.
TEXTURE_ENERGY = 10
TEXTURE_COEFFICIENTS = 24
TEXTURE_MARGIN = 0.25
BLANK_SHARE = 0.93
BLANK_LEVELS = 2

# The energy is summed on integers (exact, so the same flag whatever order
# the product adds in): each AC coefficient's magnitude (below 2**50) in
# whole units of 2**27, so 63 squares stay below 2**53.
_ENERGY_UNIT = 2.0**27


def passes(ac: np.ndarray, median: float, grey_level: float) -> bool:
    """Whether a whole image's 63 AC coefficients (exact integers, ``grey_level``
    of them to one grey level, any order) have the energy and the steady coefficients."""
    # On a sorted list rather than in numpy: between two conversions each numpy
    # step costs several microseconds (near_duplicates._hash_bits), a loop over
    # 63 numbers no more, and the fingerprint hands them over already sorted.
    values = sorted(ac.tolist())
    energy = 0.0
    for value in values:
        units = abs(value) // _ENERGY_UNIT
        energy += units * units
    if energy < round(TEXTURE_ENERGY * grey_level / _ENERGY_UNIT) ** 2:
        return False
    # |value - median| > margin, counted on the sorted values: exact, as the
    # values, the median and the margin are integers below 2**53.
    margin = TEXTURE_MARGIN * grey_level
    below = bisect.bisect_left(values, median - margin)
    above = len(values) - bisect.bisect_right(values, median + margin)
    return below + above >= TEXTURE_COEFFICIENTS


def blank(grey: np.ndarray) -> bool:
    """Whether more than ``BLANK_SHARE`` of grey values (exact, in thousandths of
    a level; any shape) lie within ``BLANK_LEVELS`` of their median."""
    values = np.sort(grey, axis=None).tolist()
    median = values[len(values) // 2]
    within = BLANK_LEVELS * 1000
    near = bisect.bisect_right(values, median + within) - bisect.bisect_left(
        values, median - within
    )
    return near > BLANK_SHARE * len(values)

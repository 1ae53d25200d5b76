"""The EXIF orientation tag's meaning: the transpose that shows an image upright.

A module of its own, with Pillow's ``Image`` as its only import, so that a
client that wants only this table (the benchmark's codec floor, which must
start as fast as a careful hand-written converter) does not import the rest
of ``core/images.py``.
"""

from __future__ import annotations

from PIL import Image

# EXIF orientation -> the transpose that shows the image upright (the table of
# ImageOps.exif_transpose); 1 (upright) and unknown values need none.
UPRIGHT_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}

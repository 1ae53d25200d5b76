"""The codec study's conversion paths: one image's bytes -> a JPEG, shorter side 256, q90.

Every path produces the same thing as the codec floor (``bench.convert.imageops``):
the upright image (EXIF orientation applied), RGB, shorter side
``TARGET_SHORTER_SIDE`` rounded the same way (``shorter_side_size``), JPEG
quality ``JPEG_QUALITY`` with 4:2:0 chroma. They differ only in the decoder,
the resize filter and how much of the downscale happens inside the JPEG
decoder (DCT-domain scaling by 1/2, 1/4 or 1/8):

* ``pillow_bicubic``: the codec floor itself (draft to the target, bicubic,
  ``reducing_gap=3``): what ``beam_pipeline.core.images`` does today.
* ``pillow_bilinear``: the same with bilinear.
* ``pillow_draft2x_bicubic`` / ``pillow_draft2x_bilinear``: draft only to twice
  the target, so the final filter sees twice the pixels (sharper, slower).
* ``pillow_lanczos``: draft to the target, Lanczos.
* ``vips_thumbnail``: libvips (``pyvips`` + the ``pyvips-binary`` wheel)
  ``thumbnail_buffer``: shrink-on-load in the decoder, then its own
  (Lanczos3-based) reduce; ``jpegsave`` q90, 4:2:0, no metadata.
* ``simplejpeg_pillow``: ``simplejpeg`` (libjpeg-turbo) decode with DCT
  scaling to the target, Pillow bicubic, ``simplejpeg`` encode.
* ``simplejpeg_cv2``: the same decode and encode, OpenCV ``INTER_AREA`` resize.

Only JPEG inputs take the path under study: every other format (PNG, the odd
BMP) goes through ``pillow_bicubic`` in every path, as an adoption would keep
Pillow for the formats where another codec does not win. Each path runs on
one thread (libvips and OpenCV are told so), like one worker process per core.

Importing this module imports only Pillow; each other codec is imported on
first use, so ``python -m bench.convert.codec_worker`` also runs under an interpreter
that has Pillow-SIMD and nothing else.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable

from PIL import Image

from beam_pipeline.core.orientation import UPRIGHT_TRANSPOSE
from bench.common.settings import JPEG_QUALITY, TARGET_SHORTER_SIDE
from bench.convert.imageops import convert_to_jpeg as _pillow_floor
from bench.convert.imageops import shorter_side_size

CODECS = (
    "pillow_bicubic",
    "pillow_bilinear",
    "pillow_draft2x_bicubic",
    "pillow_draft2x_bilinear",
    "pillow_lanczos",
    "vips_thumbnail",
    "simplejpeg_pillow",
    "simplejpeg_cv2",
)
LABELS = {
    "pillow_bicubic": "Pillow: draft to target + bicubic (the codec floor)",
    "pillow_bilinear": "Pillow: draft to target + bilinear",
    "pillow_draft2x_bicubic": "Pillow: draft to 2x target + bicubic",
    "pillow_draft2x_bilinear": "Pillow: draft to 2x target + bilinear",
    "pillow_lanczos": "Pillow: draft to target + Lanczos",
    "vips_thumbnail": "libvips thumbnail (pyvips-binary), shrink-on-load",
    "simplejpeg_pillow": "simplejpeg decode (DCT scaling) + Pillow bicubic + simplejpeg encode",
    "simplejpeg_cv2": "simplejpeg decode (DCT scaling) + OpenCV INTER_AREA + simplejpeg encode",
}
_JPEG_MAGIC = b"\xff\xd8\xff"


def _pillow(resample: Image.Resampling, draft_scale: int) -> Callable[[bytes], bytes]:
    return lambda data: _pillow_floor(data, resample=resample, draft_scale=draft_scale)


def _orientation(data: bytes) -> int:
    """EXIF orientation of a JPEG, read only when it has an Exif block (most have none)."""
    if b"Exif\x00\x00" not in data[:65536]:
        return 1
    with Image.open(io.BytesIO(data)) as image:
        return int(image.getexif().get(0x0112, 1) or 1)


def _upright_target(width: int, height: int, orientation: int) -> tuple[int, int]:
    """(w, h) of the stored image, i.e. after the orientation is applied."""
    if orientation >= 5:
        width, height = height, width
    return shorter_side_size(width, height, TARGET_SHORTER_SIDE)


_vips = None


def _vips_module():
    global _vips
    if _vips is None:
        os.environ.setdefault("VIPS_CONCURRENCY", "1")
        import pyvips

        pyvips.cache_set_max(0)  # a benchmark converts each file once: nothing to reuse
        _vips = pyvips
    return _vips


def vips_thumbnail(data: bytes) -> bytes:
    if not data.startswith(_JPEG_MAGIC):
        return _pillow_floor(data)
    pyvips = _vips_module()
    header = pyvips.Image.new_from_buffer(data, "", access="sequential")
    orientation = header.get("orientation") if header.get_typeof("orientation") else 1
    width, height = _upright_target(header.width, header.height, orientation)
    # size="force": exactly the floor's (w, h), not libvips' own rounding of the ratio.
    image = pyvips.Image.thumbnail_buffer(data, width, height=height, size="force")
    if image.bands == 1:
        image = image.colourspace("srgb")
    return image.jpegsave_buffer(Q=JPEG_QUALITY, subsample_mode="on", keep="none")


_simplejpeg = None
_cv2 = None


def _decode_scaled(data: bytes):
    """simplejpeg decode with DCT scaling to >= the target; returns (pixels, orientation, target)."""
    global _simplejpeg
    if _simplejpeg is None:
        import simplejpeg

        _simplejpeg = simplejpeg
    height, width, _, _ = _simplejpeg.decode_jpeg_header(data)
    orientation = _orientation(data)
    target = _upright_target(width, height, orientation)
    tw, th = target[::-1] if orientation >= 5 else target  # as stored in the file
    # Only 1/2, 1/4, 1/8, as Pillow's draft: libjpeg-turbo also scales by M/8
    # (e.g. 6/8 for 500x375 -> 341x256), but those sample positions are shifted
    # by a fraction of a pixel, which costs far more sharpness than it saves
    # time (docs/performance.md, "Codec study").
    scale = next((s for s in (8, 4, 2) if -(-width // s) >= tw and -(-height // s) >= th), 1)
    pixels = _simplejpeg.decode_jpeg(
        data, colorspace="RGB", min_height=-(-height // scale), min_width=-(-width // scale)
    )
    return pixels, orientation, (tw, th)


def _finish_simplejpeg(image: Image.Image, orientation: int) -> bytes:
    import numpy as np

    if orientation in UPRIGHT_TRANSPOSE:
        image = image.transpose(UPRIGHT_TRANSPOSE[orientation])
    return _simplejpeg.encode_jpeg(
        np.ascontiguousarray(np.asarray(image)), quality=JPEG_QUALITY, colorsubsampling="420"
    )


def simplejpeg_pillow(data: bytes) -> bytes:
    if not data.startswith(_JPEG_MAGIC):
        return _pillow_floor(data)
    pixels, orientation, size = _decode_scaled(data)
    image = Image.fromarray(pixels)
    if image.size != size:
        image = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
    return _finish_simplejpeg(image, orientation)


def simplejpeg_cv2(data: bytes) -> bytes:
    global _cv2
    if not data.startswith(_JPEG_MAGIC):
        return _pillow_floor(data)
    if _cv2 is None:
        import cv2

        cv2.setNumThreads(1)
        _cv2 = cv2
    pixels, orientation, size = _decode_scaled(data)
    if (pixels.shape[1], pixels.shape[0]) != size:
        pixels = _cv2.resize(pixels, size, interpolation=_cv2.INTER_AREA)
    return _finish_simplejpeg(Image.fromarray(pixels), orientation)


PATHS: dict[str, Callable[[bytes], bytes]] = {
    "pillow_bicubic": _pillow(Image.Resampling.BICUBIC, 1),
    "pillow_bilinear": _pillow(Image.Resampling.BILINEAR, 1),
    "pillow_draft2x_bicubic": _pillow(Image.Resampling.BICUBIC, 2),
    "pillow_draft2x_bilinear": _pillow(Image.Resampling.BILINEAR, 2),
    "pillow_lanczos": _pillow(Image.Resampling.LANCZOS, 1),
    "vips_thumbnail": vips_thumbnail,
    "simplejpeg_pillow": simplejpeg_pillow,
    "simplejpeg_cv2": simplejpeg_cv2,
}


def unavailable(codec: str) -> str:
    """Why ``codec`` cannot run in this interpreter ("" when it can)."""
    needs = {
        "vips_thumbnail": ("pyvips",),
        "simplejpeg_pillow": ("simplejpeg",),
        "simplejpeg_cv2": ("simplejpeg", "cv2"),
    }.get(codec, ())
    for module in needs:
        try:
            if module == "pyvips":
                _vips_module()
            else:
                __import__(module)
        except Exception as error:  # ImportError, or pyvips without its library
            return f"{module} unavailable: {type(error).__name__}: {error}"[:200]
    return ""

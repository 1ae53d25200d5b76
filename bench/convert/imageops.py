"""The codec floor's per-image work: Pillow decode -> resize -> JPEG encode.

Written independently of ``beam_pipeline.core.images`` on purpose (the floor must
not inherit the converter's mistakes; only the EXIF orientation table, a fact of
the EXIF standard rather than a choice, is the product's
``beam_pipeline.core.orientation``), but with the same best-known
operations a careful engineer would use, so that "converter / floor"
measures framework overhead and not a choice of algorithm:

1. read the file's bytes; ``Image.open`` on them;
2. for a JPEG, ``Image.draft(mode, request)``: libjpeg-turbo's DCT-domain
   downscale by 1/2, 1/4 or 1/8 while decoding, choosing the largest factor
   that keeps both sides >= the final size, so the last step still only
   downscales (docs/format.md section 4; this is what makes 6 MP photos cheap);
3. resize so the shorter side is 256 (never upscale) with
   ``Image.resize(..., BICUBIC, reducing_gap=3.0)``, Pillow's integer
   box-reduce before the bicubic pass for large factors;
4. only *then* convert to RGB (if not RGB already: skipping ``convert`` on an
   RGB image avoids a full copy; converting after the resize touches 1/k^2 of
   the pixels) with alpha composited onto white;
5. only then apply the EXIF orientation with one ``transpose`` of the small
   image (the shorter side is the same either way round, so resizing first is
   exact);
6. encode baseline JPEG, quality 90, Pillow's default 4:2:0 subsampling.

It returns only the encoded size: no hashing, no protobuf, no file writing.
"""

from __future__ import annotations

import io

from PIL import Image

from beam_pipeline.core.orientation import UPRIGHT_TRANSPOSE
from bench.common.settings import JPEG_QUALITY, TARGET_SHORTER_SIDE

_WHITE = (255, 255, 255)


def shorter_side_size(width: int, height: int, side: int) -> tuple[int, int]:
    """(w, h) with the shorter side equal to ``side``; unchanged if already smaller."""
    scale = side / min(width, height)
    if scale >= 1.0:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, _WHITE)
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def convert_to_jpeg(
    data: bytes,
    resample: Image.Resampling = Image.Resampling.BICUBIC,
    draft_scale: int = 1,
) -> bytes:
    """Decodes, resizes and re-encodes one image; returns the JPEG.

    ``resample`` and ``draft_scale`` (draft to that multiple of the target, so
    the filter sees more pixels) exist for the codec study
    (``bench.convert.codec_paths``); the floor uses the defaults.
    """
    with Image.open(io.BytesIO(data)) as image:
        orientation = image.getexif().get(0x0112, 1)
        target = shorter_side_size(image.width, image.height, TARGET_SHORTER_SIDE)
        if image.format == "JPEG" and target != image.size:
            image.draft(image.mode, (target[0] * draft_scale, target[1] * draft_scale))
        image.load()
        small = image
        target = shorter_side_size(image.width, image.height, TARGET_SHORTER_SIDE)
        if target != image.size:
            small = image.resize(target, resample, reducing_gap=3.0)
        small = to_rgb(small)
        if orientation in UPRIGHT_TRANSPOSE:
            small = small.transpose(UPRIGHT_TRANSPOSE[orientation])
        out = io.BytesIO()
        small.save(out, format="JPEG", quality=JPEG_QUALITY)
        return out.getvalue()


def convert_bytes(data: bytes) -> int:
    """Decodes, resizes and re-encodes one image; returns the JPEG's size in bytes."""
    return len(convert_to_jpeg(data))


def convert_file(path: str) -> tuple[int, int]:
    """Converts the file at ``path``; returns (input bytes, output bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    return len(data), convert_bytes(data)

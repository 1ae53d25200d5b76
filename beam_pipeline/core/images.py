"""Decode, orient, convert, resize and JPEG-encode one image with Pillow only.

The single entry point is :func:`convert`. It never lets an exception other
than :class:`Rejected` escape for a bad input, so the Beam step can turn every
failure into a rejection record with a reason (docs/format.md section 4).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import ClassVar, NamedTuple

from PIL import Image, UnidentifiedImageError

from beam_pipeline.core import colour, flags, jpeg, settings
from beam_pipeline.core.orientation import UPRIGHT_TRANSPOSE

RESIZE_MODES = flags.RESIZE_MODES
# --resample: the downscaling filter, each Pillow's of its name. Bicubic is the
# default; bilinear is faster and softer, Lanczos sharper and slower
# (docs/performance.md, "Codec study").
RESAMPLE_FILTERS = {name: Image.Resampling[name.upper()] for name in flags.RESAMPLE_NAMES}

# Formats recognised by content (docs/format.md section 2). Camera MPO files open
# through the JPEG plugin and are read as their first frame.
_PIL_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF")
_MAGIC = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"II+\x00", "TIFF"),
    (b"MM\x00+", "TIFF"),
)
_WHITE = (255, 255, 255)

# Image.open(formats=...) looks each format up in Pillow's registry and loads
# *every* plugin (Image.init(): AVIF, PDF, EPS, ...) when one is missing, a
# start-up cost paid by every run (docs/performance.md, "Measurements behind
# code choices").
# Registering just the plugins of _PIL_FORMATS, plus MPO (multi-picture JPEGs
# from phones, opened by the JPEG plugin), keeps that off the start of every run.
from PIL import (  # noqa: E402, F401  (imported to register the formats)
    BmpImagePlugin,
    GifImagePlugin,
    JpegImagePlugin,
    MpoImagePlugin,
    PngImagePlugin,
    TiffImagePlugin,
    WebPImagePlugin,
)

assert all(name in Image.OPEN for name in _PIL_FORMATS), "a plugin of _PIL_FORMATS is missing"
_PAD_COLOUR = (0, 0, 0)


class Rejected(Exception):
    """An input that cannot become a record; ``str()`` is the reason."""


class PixelHook(NamedTuple):
    """What a feature makes of each stored image's pixels: the near-duplicate
    fingerprint every record holds (features/near/feature.py's ``PIXELS``).
    Module-level functions only: it travels to pool processes and Beam workers."""

    scheme: str  # recorded as the SCHEME_SETTING image setting
    earlier: tuple[str, ...]  # earlier schemes a --reuse takes
    same: tuple[str, ...]  # of those, the ones whose fingerprints are this one's
    draft_side: int  # a pass-through JPEG's check decode covers this side
    fingerprint: Callable[[Image.Image], bytes]  # the image as stored -> packed bytes
    features: Callable[[bytes], tuple[bytes, bytes]]  # packed -> the record's features


# The image setting that names the hook's scheme (the resume key, imagerecords.json).
SCHEME_SETTING = "near_scheme"


def _scheme(spec: ImageSpec) -> str | None:
    return spec.near_scheme


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """How every image is stored (``--resize``, ``--image_size``, ...).

    Each field declares whether it decides a record's bytes, its flag's name
    and its place in imagerecords.json (``settings.py``: the resume key, the
    ``image`` block and the settings the dry run and summary print come from
    these declarations).
    """

    recorded_in: ClassVar[str] = "image"  # imagerecords.json's block of these settings
    resize: str = settings.decides(flags.Table.resize, recorded=True)
    size: int = settings.decides(flags.Table.image_size, recorded=True)
    upscale: bool = settings.decides(flags.Table.upscale, recorded=True)
    jpeg_quality: int = settings.decides(flags.Table.jpeg_quality, recorded=True)
    resample: str = settings.decides(flags.Table.resample, recorded=True)
    # What convert computes from the pixels; recorded as its scheme's name (None:
    # no fingerprint, for tests and benches that need none; every run gives one).
    pixels: PixelHook | None = settings.decides(
        recorded=True, key=SCHEME_SETTING, value=_scheme, default=None
    )
    # Not part of how images are stored, but it travels with them to every
    # converting process: the per-image time limit (--image_timeout_s; 0: none).
    timeout_s: float = settings.does_not_decide(
        "it decides only which images are given up on, which depends on the machine's "
        "load as much as on the image: a timed-out image is retried by a resumed run",
        flag=flags.Table.image_timeout_s,
        limit=True,
    )

    @property
    def near_scheme(self) -> str | None:
        """The scheme of the fingerprints its records hold (None: they hold none)."""
        return self.pixels.scheme if self.pixels else None

    def __post_init__(self):
        # No size to check when images keep theirs.
        skip = (flags.Table.image_size,) if self.resize == "none" else ()
        settings.check_flags(self, skip)


@dataclasses.dataclass(frozen=True)
class EncodedImage:
    """One image as a record stores it: the JPEG bytes and what converting it found."""

    jpeg: bytes
    height: int
    width: int
    passed_through: bool = False
    # A JPEG whose only problem was extra bytes the decoder skips, re-encoded clean.
    repaired: bool = False
    # The embedded colour profile was unusable; the pixels were kept as they are.
    bad_profile: bool = False
    # The near-duplicate fingerprint of the stored image (PixelHook.fingerprint),
    # and the record's features of it (None: no hook).
    near: bytes = b""
    near_features: tuple[bytes, bytes] | None = None


def sniff_format(data: bytes) -> str | None:
    """The image format named by the file's first bytes, or None."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def target_size(width: int, height: int, spec: ImageSpec) -> tuple[int, int]:
    """The size the image is resized to before any crop or pad.

    The side that sets the scale (the shorter one for ``shorter`` and ``crop``,
    the longer one for ``longer`` and ``pad``) becomes exactly ``spec.size``,
    not a rounded product, so ``crop`` and ``pad`` always end at size x size.
    ``crop`` enlarges a smaller image whatever ``upscale`` says: its output
    size is fixed. ``pad`` letterboxes a smaller image instead (``_resize``).
    """
    if spec.resize == "none":
        return width, height
    by_shorter = spec.resize in ("shorter", "crop")
    side = min(width, height) if by_shorter else max(width, height)
    if side == spec.size or (side < spec.size and not spec.upscale and spec.resize != "crop"):
        return width, height
    scale = spec.size / side
    # Ties (a square) go to the width; either way both sides get spec.size.
    if (width <= height) == by_shorter:
        return spec.size, max(1, round(height * scale))
    return max(1, round(width * scale)), spec.size


def _open(data: bytes) -> Image.Image:
    if not data:
        raise Rejected("empty file")
    sniffed = sniff_format(data)
    try:
        image = Image.open(io.BytesIO(data), formats=_PIL_FORMATS)
    except Image.DecompressionBombError as error:
        raise Rejected(f"decompression bomb: {error}") from None
    except UnidentifiedImageError:
        if sniffed is None:
            raise Rejected(
                "not an image: content is not JPEG, PNG, GIF, BMP, WebP or TIFF"
            ) from None
        lacks = _tiff_unsupported(data) if sniffed == "TIFF" else ""
        if lacks:
            raise Rejected(f"unsupported: {lacks}") from None
        raise Rejected(f"corrupt image: {sniffed} header cannot be read") from None
    except Exception as error:  # Pillow raises many types on malformed headers.
        raise Rejected(f"corrupt image: {type(error).__name__}: {error}") from None
    width, height = image.size
    # Pillow raises only above twice its limit; its limit itself is what we keep.
    if Image.MAX_IMAGE_PIXELS and width * height > Image.MAX_IMAGE_PIXELS:
        raise Rejected(
            f"decompression bomb: {width}x{height} = {width * height} pixels exceeds "
            f"Pillow's limit of {Image.MAX_IMAGE_PIXELS}"
        )
    return image


def _tiff_unsupported(data: bytes) -> str:
    """What Pillow lacks to open a TIFF whose first directory reads: a compression it
    has no decoder for (JPEG 2000, JPEG XL, ...), or a pixel layout it has no mode
    for; "" when the directory itself is broken (a corrupt file, not an unsupported one)."""
    try:
        big = data[2:4] in (b"+\x00", b"\x00+")  # BigTIFF's header is 16 bytes
        ifd = TiffImagePlugin.ImageFileDirectory_v2(data[: 16 if big else 8])
        stream = io.BytesIO(data)
        stream.seek(ifd.next)
        ifd.load(stream)
    except Exception:
        return ""
    compression = ifd.get(TiffImagePlugin.COMPRESSION, 1)
    if compression not in TiffImagePlugin.COMPRESSION_INFO:
        return f"TIFF compression {compression}, which Pillow has no decoder for"
    try:
        TiffImagePlugin.TiffImageFile(io.BytesIO(data))
    except SyntaxError as error:
        if str(error) == "unknown pixel mode":  # Pillow's words for a layout it cannot hold
            return (
                f"TIFF pixel layout (photometric {ifd.get(262)}, bits per sample "
                f"{ifd.get(258)}, sample format {ifd.get(339, 1)}), which Pillow cannot read"
            )
    except Exception:
        pass
    return ""


def _orientation(image: Image.Image) -> int:
    # getexif() has a fixed cost even when there is nothing to parse (most web
    # JPEGs): skip it unless the file carries EXIF (TIFF keeps it in its tags).
    if "exif" not in image.info and image.format != "TIFF":
        return 1
    try:
        return int(image.getexif().get(0x0112, 1) or 1)
    except Exception:  # A broken EXIF block must not reject an otherwise good image.
        return 1


def _to_rgb(image: Image.Image) -> Image.Image:
    """Any Pillow mode to 8-bit RGB; alpha composited onto white."""
    mode = image.mode
    if mode == "RGB":
        return image  # convert() would copy the whole image for nothing.
    if mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        # 16-bit grey: keep the high byte (convert("L") would clip at 255).
        return image.convert("I").point(lambda v: v * (1 / 256)).convert("L").convert("RGB")
    if mode in ("I", "F"):
        low, high = image.getextrema()
        span = (high - low) or 1
        grey = image.convert("F").point(lambda v: (v - low) * (255.0 / span))
        return grey.convert("L").convert("RGB")
    has_alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, _WHITE)
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def _resize(image: Image.Image, spec: ImageSpec) -> Image.Image:
    width, height = image.size
    new_size = target_size(width, height, spec)
    if new_size != (width, height):
        # reducing_gap lets Pillow box-reduce by an integer factor first: same
        # quality for large downscales at a fraction of the cost.
        image = image.resize(new_size, RESAMPLE_FILTERS[spec.resample], reducing_gap=3.0)
    if spec.resize == "crop":
        width, height = image.size  # both >= spec.size (target_size)
        left, top = (width - spec.size) // 2, (height - spec.size) // 2
        if (width, height) != (spec.size, spec.size):
            image = image.crop((left, top, left + spec.size, top + spec.size))
    elif spec.resize == "pad":
        width, height = image.size  # both <= spec.size (target_size, or a small image)
        if (width, height) != (spec.size, spec.size):
            canvas = Image.new("RGB", (spec.size, spec.size), _PAD_COLOUR)
            canvas.paste(image, ((spec.size - width) // 2, (spec.size - height) // 2))
            image = canvas
    return image


def _can_pass_through(image: Image.Image, spec: ImageSpec, orientation: int) -> bool:
    """A baseline RGB JPEG already of the stored size can be kept byte for byte."""
    if image.format != "JPEG" or image.mode != "RGB" or orientation != 1:
        return False
    if image.info.get("progressive") or image.info.get("progression"):
        return False
    width, height = image.size
    if target_size(width, height, spec) != (width, height):
        return False
    if spec.resize in ("crop", "pad") and (width, height) != (spec.size, spec.size):
        return False
    return True


def _decode(image: Image.Image, data: bytes, spec: ImageSpec, orientation: int, passthrough: bool):
    """Loads the pixels; a JPEG strictly (see jpeg.py). Returns (image, repaired)."""
    if image.format != "JPEG":
        image.load()  # decodes, so a truncated file is rejected
        return image, False
    request = None
    if passthrough:
        # The verdict, and the pixels the fingerprint is hashed from: a
        # DCT-scaled decode still reads every entropy-coded bit, so it sees
        # every warning, for a fraction of the IDCT.
        request = pass_through_check(spec.pixels)
    elif spec.resize != "none":
        # DCT-domain downscale while decoding: the cheapest large-JPEG speed-up.
        # The scale keeps both sides >= the request, so the final resize still
        # only downscales.
        width, height = image.size
        if orientation >= 5:  # 90-degree rotations swap the axes
            width, height = height, width
        request = target_size(width, height, spec)
        if orientation >= 5:
            request = request[::-1]
        if request == image.size:
            request = None
    try:
        decoded = jpeg.decode(data, image, request)
    except jpeg.CorruptData as error:
        raise Rejected(f"corrupt image data: {error}") from None
    except ValueError as error:  # libjpeg refused the stream outright
        raise Rejected(f"corrupt image: {error}") from None
    decoded.image.info.update(image.info)
    return decoded.image, decoded.repaired


def _to_srgb(image: Image.Image) -> tuple[Image.Image, bool]:
    """The image in sRGB per its embedded profile; (image, profile_was_bad).

    Runs before resizing, as docs/images.md promises.
    """
    icc = image.info.get("icc_profile")
    if not icc:
        return image, False
    if image.mode not in ("RGB", "L", "CMYK"):
        image = _to_rgb(image)  # alpha composited, 16-bit reduced, palette expanded
    try:
        return colour.to_srgb(image, icc), False
    except colour.BadProfile:
        return image, True


def _pass_through_profile_ok(image: Image.Image) -> bool:
    try:
        return colour.is_srgb(image.info.get("icc_profile"))
    except colour.BadProfile:
        return False  # re-encode: the stored JPEG then carries no broken profile


def pass_through_check(pixels: PixelHook | None) -> tuple[int, int]:
    """The scale a pass-through JPEG is check-decoded at: the smallest that covers
    the fingerprint's base, so the check's pixels are the ones hashed and a small
    image is not decoded twice (the largest scale-down, 1/8, for most)."""
    side = pixels.draft_side if pixels else 1
    return side, side


def _near(image: Image.Image, pixels: PixelHook | None) -> dict:
    """The EncodedImage fields of ``image``'s fingerprint (none without a hook)."""
    if pixels is None:
        return {}
    packed = pixels.fingerprint(image)
    return {"near": packed, "near_features": pixels.features(packed)}


def near_of_stored(data: bytes, pixels: PixelHook) -> bytes:
    """The fingerprint of a stored JPEG, the way a pass-through one is hashed.

    Raises:
        Rejected: the bytes are not a JPEG this module wrote or passed through.
    """
    image = _open(data)
    try:
        draft = jpeg.decode(data, image, pass_through_check(pixels)).image
    except (jpeg.CorruptData, ValueError) as error:
        raise Rejected(f"corrupt stored image: {error}") from None
    return pixels.fingerprint(draft)


def convert(data: bytes, spec: ImageSpec) -> EncodedImage:
    """Turns source file bytes into a stored baseline sRGB JPEG.

    Raises:
        Rejected: the bytes are not a usable image; ``str(error)`` says why.
    """
    image = _open(data)
    try:
        orientation = _orientation(image)
        passthrough = _can_pass_through(image, spec, orientation) and _pass_through_profile_ok(
            image
        )
        loaded, repaired = _decode(image, data, spec, orientation, passthrough)
        if passthrough and not repaired:
            # Hashed from the check's pixels (pass_through_check): one decode, never at full size.
            near = _near(loaded, spec.pixels)
            return EncodedImage(data, image.height, image.width, passed_through=True, **near)
        if passthrough:  # the pixels came from a scaled check: decode them properly
            loaded, _ = _decode(image, data, spec, orientation, False)
        if image.format == "TIFF":
            orientation = _orientation(loaded)  # Pillow's TIFF decoder turns it on load
        image, bad_profile = _to_srgb(loaded)
        # Resize first, then convert and rotate the (much smaller) result: every
        # resize mode is symmetric under 90-degree turns, so the order does not
        # change the output size, and grey images are resized on one channel.
        if image.mode in ("RGB", "L"):
            image = _to_rgb(_resize(image, spec))
        else:
            image = _resize(_to_rgb(image), spec)
        if orientation in UPRIGHT_TRANSPOSE:
            image = image.transpose(UPRIGHT_TRANSPOSE[orientation])
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=spec.jpeg_quality)
        return EncodedImage(
            buffer.getvalue(),
            image.height,
            image.width,
            repaired=repaired,
            bad_profile=bad_profile,
            **_near(image, spec.pixels),
        )
    except Rejected:
        raise
    except Image.DecompressionBombError as error:
        raise Rejected(f"decompression bomb: {error}") from None
    except Exception as error:  # truncated data, bad tiles, unsupported modes, ...
        raise Rejected(f"corrupt image: {type(error).__name__}: {error}") from None

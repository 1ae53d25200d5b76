"""Embedded ICC colour profiles -> sRGB (Pillow's ImageCms, i.e. LittleCMS).

Why and with which intent: docs/images.md, "Colour profiles". Each distinct profile is
parsed once per process; one that maps sRGB onto itself becomes no transform. Pure.
"""

from __future__ import annotations

import io
import threading

from PIL import Image, ImageCms

_SRGB = ImageCms.createProfile("sRGB")
_SPACE_OF_MODE = {"RGB": "RGB", "L": "GRAY", "CMYK": "CMYK"}
_IDENTITY_TOLERANCE = 2  # 8-bit levels: rounding inside LittleCMS, not a colour change
_MAX_CACHED = 256  # distinct profiles kept per process (a few KB to a MB each)

_lock = threading.Lock()
# (profile bytes, mode) -> ImageCms transform, None (already sRGB) or BadProfile
_cache: dict[tuple[bytes, str], object] = {}


class BadProfile(Exception):
    """The embedded profile cannot be parsed or does not fit the image; ``str()`` says why."""


def _probe(mode: str) -> Image.Image:
    """Test colours for the identity check: a cube of each channel's levels."""
    if mode == "L":
        return Image.frombytes("L", (256, 1), bytes(range(256)))
    levels = range(0, 256, 15)  # 18 levels: 5,832 colours
    data = bytes(v for r in levels for g in levels for b in levels for v in (r, g, b))
    return Image.frombytes("RGB", (len(data) // 3, 1), data)


def _is_identity(transform, mode: str) -> bool:
    probe = _probe(mode)
    out = ImageCms.applyTransform(probe, transform)
    reference = probe.convert("RGB").tobytes()
    return (
        max(abs(a - b) for a, b in zip(out.tobytes(), reference, strict=True))
        <= _IDENTITY_TOLERANCE
    )


def _build(icc: bytes, mode: str):
    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        space = profile.profile.xcolor_space.strip()
    except Exception as error:  # LittleCMS raises OSError / PyCMSError on junk
        return BadProfile(f"cannot parse: {error}")
    if space != _SPACE_OF_MODE[mode]:
        return BadProfile(f"a {space} profile on a {mode} image")
    try:
        transform = ImageCms.buildTransform(
            profile,
            _SRGB,
            mode,
            "RGB",
            renderingIntent=ImageCms.Intent.PERCEPTUAL,
            # Transforms are shared by a worker's threads; LittleCMS's
            # one-pixel cache inside a transform is not thread-safe.
            flags=ImageCms.Flags.NOCACHE,
        )
    except Exception as error:
        return BadProfile(f"cannot build a transform: {error}")
    if mode in ("RGB", "L") and _is_identity(transform, mode):
        return None
    return transform


def transform_for(icc: bytes, mode: str):
    """The cached transform of ``icc`` for a ``mode`` image into sRGB, or None if none is needed.

    Raises:
        BadProfile: the profile is unusable for this image.
    """
    key = (icc, mode)
    found = _cache.get(key, _cache)
    if found is _cache:
        found = _build(icc, mode)
        with _lock:
            if len(_cache) >= _MAX_CACHED:
                _cache.clear()
            _cache[key] = found
    if isinstance(found, BadProfile):
        raise found
    return found


def is_srgb(icc: bytes | None, mode: str = "RGB") -> bool:
    """Whether an image with this profile needs no colour conversion (no profile, or sRGB).

    Raises:
        BadProfile: the profile is unusable for this image.
    """
    return not icc or transform_for(icc, mode) is None


def to_srgb(image: Image.Image, icc: bytes) -> Image.Image:
    """``image`` (mode RGB, L or CMYK) converted from its profile ``icc`` to sRGB.

    Returns the image itself when it is already sRGB; a converted image is RGB.
    A grey image held as RGB (16-bit grey sources) with a grey profile is
    converted as grey.

    Raises:
        BadProfile: the profile is unusable for this image; the caller keeps the pixels.
    """
    mode = image.mode
    if mode == "RGB" and icc[16:20] == b"GRAY":  # the ICC header's colour space field
        mode, image = "L", image.convert("L")
    transform = transform_for(icc, mode)
    if transform is None:
        return image
    return ImageCms.applyTransform(image, transform)

"""Decode a JPEG once, strictly: libjpeg's warnings become visible.

simplejpeg's stop-on-warning decode gives the pixels and the first warning: invented
pixels are a :class:`CorruptData` rejection, skipped junk a cleaned, re-encoded image
(docs/images.md, "Corrupt files"). Pure: imports neither Beam nor TensorFlow.
"""

from __future__ import annotations

import re

import numpy as np
import simplejpeg
from PIL import Image

# libjpeg-turbo's own recommendation for untrusted input (its tjbench and
# djpeg -strict use the same figure): real progressive JPEGs have about ten
# scans; thousands of tiny scans are a known way to stall a decoder.
MAX_SCANS = 500
_MAX_CLEAN_PASSES = 4  # each pass removes one kind of junk; more means a mess

_EXTRANEOUS = re.compile(rb"(\d+) extraneous bytes before marker 0x([0-9a-f]{2})")
_SOS = b"\xff\xda"
_EOI = b"\xff\xd9"
# Markers that stand alone (no length field): TEM, RST0-7, SOI, EOI.
_STANDALONE = {0x01, *range(0xD0, 0xDA)}


class CorruptData(Exception):
    """The entropy-coded data is missing or damaged; ``str()`` says how."""


class Decoded:
    """A strictly decoded JPEG: the Pillow image and whether junk was removed.

    The image's pixels are the decoder's buffer, shared, not copied
    (``_rgb_sharing``).
    """

    __slots__ = ("image", "repaired")

    def __init__(self, image: Image.Image, repaired: bool):
        self.image = image
        self.repaired = repaired


def draft_size(width: int, height: int, request: tuple[int, int]) -> tuple[int, int]:
    """The largest 1/2**k (k <= 3) DCT-scaled size whose sides both cover ``request``.

    The same choice as Pillow's ``Image.draft``: the final resize then only
    ever scales down, and power-of-two IDCTs are the fast ones.
    """
    scale = 1
    while scale < 8:
        nxt = scale * 2
        if -(-width // nxt) < request[0] or -(-height // nxt) < request[1]:
            break
        scale = nxt
    return -(-width // scale), -(-height // scale)


def _to_image(pixels: np.ndarray, rawmode: str) -> Image.Image:
    height, width, channels = pixels.shape
    if channels == 1:
        return Image.frombuffer("L", (width, height), pixels, "raw", "L", 0, 1)
    if rawmode.startswith("CMYK"):
        # Pillow's JPEG plugin reads every CMYK JPEG with Adobe's inverted
        # polarity ("CMYK;I"); keep its convention so colours match.
        return Image.frombuffer("CMYK", (width, height), pixels, "raw", rawmode, 0, 1)
    return _rgb_sharing(pixels)


def _rgb_sharing(pixels: np.ndarray) -> Image.Image:
    """An RGB image over ``[height, width, 4]`` RGBX pixels, sharing their memory.

    Pillow keeps RGB as 4 bytes a pixel, the layout libjpeg-turbo writes for
    RGBX, so the decoder's buffer can be the image. ``Image.fromarray`` of an
    RGB array instead copies every pixel into a new image: a whole-image pass
    (its cost: docs/performance.md). ``frombuffer`` shares
    memory only as mode RGBX, which Pillow then resamples on all 4 channels
    (a third more work than RGB), so this maps the buffer as RGB the way
    ``frombuffer`` maps it as RGBX. If a Pillow version refuses that, the
    pixels are copied as before.
    """
    height, width, _ = pixels.shape
    try:
        core = Image.core.map_buffer(pixels, (width, height), "raw", 0, ("RGB", 0, 1))
    except (AttributeError, TypeError, ValueError):
        # The copy, as before (fromarray of RGB does not map the buffer).
        return Image.fromarray(np.ascontiguousarray(pixels[..., :3]), "RGB")
    image = Image.new("RGB", (0, 0))._new(core)
    image.readonly = 1  # as frombuffer's images: Pillow copies before writing
    return image


def _decode(data: bytes, colorspace: str, size: tuple[int, int] | None) -> np.ndarray:
    height = width = 0
    if size is not None:
        width, height = size
    # A scaled decode is a draft on its way to a resize: the fast integer IDCT
    # and plain upsampling, as Pillow's draft mode chooses.
    fast = size is not None
    return simplejpeg.decode_jpeg(
        data,
        colorspace,
        fastdct=fast,
        fastupsample=fast,
        min_height=height,
        min_width=width,
        strict=True,
    )


def _header_end(data: bytes) -> tuple[bytes, int]:
    """Walks the marker segments up to the first SOS, dropping bytes between them.

    Returns the cleaned header and the offset of the first SOS in ``data``.
    """
    out = [data[:2]]
    pos = 2
    while True:
        start = data.find(b"\xff", pos)
        if start < 0:
            raise CorruptData("no start-of-scan marker")
        while start + 1 < len(data) and data[start + 1] == 0xFF:  # fill bytes
            start += 1
        if start + 1 >= len(data):
            raise CorruptData("no start-of-scan marker")
        marker = data[start + 1]
        if marker == 0x00:  # a stray 0xFF in junk: keep looking
            pos = start + 2
            continue
        if marker == 0xDA:
            return b"".join(out), start
        if marker in _STANDALONE:
            out.append(data[start : start + 2])
            pos = start + 2
            continue
        length = int.from_bytes(data[start + 2 : start + 4], "big")
        out.append(data[start : start + 2 + length])
        pos = start + 2 + length


def _clean(data: bytes, message: str) -> bytes | None:
    """``data`` without the junk a warning complained about, or None if it is damage."""
    if "unknown JFIF revision" in message or "bad ICC marker" in message:
        return _clean_jfif(data) if "JFIF" in message else _drop_icc(data)
    found = _EXTRANEOUS.search(message.encode())
    if not found:
        return None
    count, marker = int(found.group(1)), int(found.group(2), 16)
    header, sos = _header_end(data)
    if len(header) < sos:  # junk between header segments: drop it
        return header + data[sos:]
    if marker == 0xD9:
        # After the last scan, before EOI. Zero padding is what some encoders
        # and tools write; anything else is entropy data the decoder never
        # reached, i.e. a desynchronised (damaged) stream. libjpeg's count can
        # be a few bytes short (its bit buffer reads ahead), never long.
        end = data.rfind(_EOI)
        junk = data[max(0, end - count) : end]
        if end > sos and not junk.strip(b"\0"):
            return data[: end - count] + data[end:]
    return None


def _clean_jfif(data: bytes) -> bytes | None:
    """Rewrites a JFIF APP0 whose version libjpeg does not know to 1.02."""
    index = data.find(b"JFIF\x00", 0, 64)
    if index < 0:
        return None
    return data[: index + 5] + b"\x01\x02" + data[index + 7 :]


def _drop_icc(data: bytes) -> bytes | None:
    """Drops the ICC_PROFILE APP2 segments (libjpeg could not assemble them)."""
    header, sos = _header_end(data)
    kept, pos = [header[:2]], 2
    while pos < len(header):
        marker = header[pos + 1]
        if marker in _STANDALONE:
            kept.append(header[pos : pos + 2])
            pos += 2
            continue
        length = int.from_bytes(header[pos + 2 : pos + 4], "big")
        segment = header[pos : pos + 2 + length]
        if not (marker == 0xE2 and segment[4:16] == b"ICC_PROFILE\x00"):
            kept.append(segment)
        pos += 2 + length
    return b"".join(kept) + data[sos:]


def decode(data: bytes, image: Image.Image, size: tuple[int, int] | None = None) -> Decoded:
    """Decodes the JPEG ``data`` that Pillow opened as ``image``, strictly.

    Args:
        data: the whole file.
        image: ``Image.open`` of it (header parsed, pixels not loaded).
        size: decode at the smallest 1/2**k scale covering this (width, height);
            None for full size.

    Raises:
        CorruptData: the decoder would have to invent pixels.
        ValueError: libjpeg cannot decode the stream at all (an error, not a warning).
    """
    # Only a progressive stream can stall the decoder with scans: a sequential
    # one is read once, whatever it holds (libjpeg-turbo limits progressive
    # scans only, too). Counting reads the whole source (docs/performance.md),
    # so baseline JPEGs, nearly all of them, skip it.
    progressive = image.info.get("progressive") or image.info.get("progression")
    if progressive and data.count(_SOS) > MAX_SCANS:
        raise CorruptData(f"more than {MAX_SCANS} scans (a stalling progressive JPEG)")
    colorspace = {"L": "GRAY", "CMYK": "CMYK"}.get(image.mode, "RGBX")
    rawmode = image.mode
    if image.tile and isinstance(image.tile[0][3], tuple):
        rawmode = image.tile[0][3][0]  # ("CMYK;I", "") for Adobe polarity
    if size is not None:
        size = draft_size(image.width, image.height, size)
        if size == image.size:
            size = None
    repaired = False
    for _ in range(_MAX_CLEAN_PASSES):
        try:
            return Decoded(_to_image(_decode(data, colorspace, size), rawmode), repaired)
        except ValueError as error:
            message = str(error)
            if not _is_warning(message):
                raise
            cleaned = _clean(data, message)
            if cleaned is None or cleaned == data:
                raise CorruptData(message) from None
            data, repaired = cleaned, True
    raise CorruptData("junk in too many places")


# libjpeg-turbo's warning messages (jerror.h, JWRN_*): everything else it
# raises is an error that stops decoding whatever the flags say.
_WARNINGS = (
    "Corrupt JPEG data",  # extraneous bytes, premature end, bad Huffman/arithmetic code, RST
    "Premature end of JPEG file",
    "Warning: unknown JFIF revision",
    "Inconsistent progression sequence",
    "Invalid SOS parameters for sequential JPEG",
    "Unknown Adobe color transform code",
    "Application transferred too many scanlines",
)


def _is_warning(message: str) -> bool:
    return message.startswith(_WARNINGS)

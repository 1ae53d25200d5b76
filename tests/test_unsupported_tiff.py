"""A valid TIFF that Pillow cannot open is "unsupported", not "corrupt image".

The files are real TIFFs written by Pillow, with one tag of their first
directory changed to a value Pillow has no decoder or mode for.
"""

import io
import struct

import pytest
from PIL import Image

from beam_pipeline.core import images

SPEC = images.ImageSpec(size=8)
COMPRESSION, PHOTOMETRIC = 259, 262


def _tiff(tags: dict[int, int], big: bool = False) -> bytes:
    """An 8x8 RGB TIFF with the SHORT ``tags`` of its first directory set."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buffer, format="TIFF", big_tiff=big)
    data = bytearray(buffer.getvalue())
    assert data[:2] == b"II"
    head, count, entry, value_at = ("<Q", "<Q", 20, 12) if big else ("<I", "<H", 12, 8)
    start = 8 if big else 4
    offset = struct.unpack_from(head, data, start)[0]
    entries = struct.unpack_from(count, data, offset)[0]
    first = offset + struct.calcsize(count)
    for n in range(entries):
        at = first + n * entry
        tag, kind = struct.unpack_from("<HH", data, at)
        if tag in tags:
            assert kind == 3  # SHORT
            struct.pack_into("<H", data, at + value_at, tags.pop(tag))
    assert not tags, f"tags not in the file: {tags}"
    return bytes(data)


def _reason(data: bytes) -> str:
    with pytest.raises(images.Rejected) as rejected:
        images.convert(data, SPEC)
    return str(rejected.value)


@pytest.mark.parametrize(
    "tags, says",
    [
        ({COMPRESSION: 34712}, "unsupported: TIFF compression 34712, which Pillow has no decoder"),
        ({COMPRESSION: 50002}, "unsupported: TIFF compression 50002"),  # JPEG XL
        ({COMPRESSION: 34892}, "unsupported: TIFF compression 34892"),  # DNG's lossy JPEG
        ({PHOTOMETRIC: 9}, "unsupported: TIFF pixel layout (photometric 9, bits per sample"),
    ],
)
@pytest.mark.parametrize("big", [False, True], ids=["tiff", "bigtiff"])
def test_a_tiff_pillow_cannot_open_is_unsupported(tags, says, big):
    assert _reason(_tiff(dict(tags), big)).startswith(says)


def test_the_same_tiff_unchanged_converts():
    assert images.convert(_tiff({}), SPEC).width == 8


@pytest.mark.parametrize(
    "data",
    [
        b"II*\x00" + struct.pack("<I", 10**6) + b"\x00" * 16,  # its directory is past the end
        b"II*\x00\x08\x00\x00\x00\xff\xff",  # a directory cut off
        _tiff({})[:40],  # cut off inside the directory
    ],
)
def test_a_tiff_whose_header_cannot_be_read_is_still_corrupt(data):
    assert _reason(data).startswith("corrupt image")

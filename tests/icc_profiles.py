"""ICC profiles built from their published definitions, for the colour tests.

No Python package ships Display P3, Adobe RGB or a CMYK profile, so these
write ICC v2 profiles by hand: RGB as matrix/TRC (primaries and white point
from the specifications, Bradford-adapted to the D50 connection space), CMYK
as an 8-bit lookup table to CIELAB computed from a simple ink model.
"""

from __future__ import annotations

import struct

import numpy as np

D50 = np.array([0.9642, 1.0, 0.8249])
D65_XY = (0.3127, 0.3290)
_BRADFORD = np.array(
    [[0.8951, 0.2664, -0.1614], [-0.7502, 1.7135, 0.0367], [0.0389, -0.0685, 1.0296]]
)

DISPLAY_P3 = {"primaries": ((0.680, 0.320), (0.265, 0.690), (0.150, 0.060)), "trc": "srgb"}
ADOBE_RGB = {"primaries": ((0.640, 0.330), (0.210, 0.710), (0.150, 0.060)), "trc": 563 / 256}
SRGB = {"primaries": ((0.640, 0.330), (0.300, 0.600), (0.150, 0.060)), "trc": "srgb"}


def _xyz(xy) -> np.ndarray:
    x, y = xy
    return np.array([x / y, 1.0, (1 - x - y) / y])


def rgb_to_xyz_d50(primaries, white_xy=D65_XY) -> np.ndarray:
    """The RGB -> XYZ (D50) matrix of linear RGB with these primaries."""
    columns = np.stack([_xyz(p) for p in primaries], axis=1)
    white = _xyz(white_xy)
    matrix = columns * np.linalg.solve(columns, white)
    cone_src, cone_dst = _BRADFORD @ white, _BRADFORD @ D50
    adapt = np.linalg.inv(_BRADFORD) @ np.diag(cone_dst / cone_src) @ _BRADFORD
    return adapt @ matrix


def _s15(value: float) -> bytes:
    return struct.pack(">i", round(value * 65536))


def _xyz_tag(xyz) -> bytes:
    return b"XYZ \0\0\0\0" + b"".join(_s15(v) for v in xyz)


def _desc_tag(text: str) -> bytes:
    ascii_ = text.encode() + b"\0"
    return (
        b"desc\0\0\0\0"
        + struct.pack(">I", len(ascii_))
        + ascii_
        + struct.pack(">II", 0, 0)
        + struct.pack(">HB", 0, 0)
        + b"\0" * 67
    )


def _trc_tag(trc) -> bytes:
    if trc == "srgb":  # IEC 61966-2-1 as a parametric curve (type 3)
        params = (2.4, 1 / 1.055, 0.055 / 1.055, 1 / 12.92, 0.04045)
        return b"para\0\0\0\0" + struct.pack(">HH", 3, 0) + b"".join(_s15(p) for p in params)
    return b"curv\0\0\0\0" + struct.pack(">IH", 1, round(trc * 256))


def _assemble(device_class: bytes, space: bytes, pcs: bytes, tags: list[tuple[bytes, bytes]]):
    table_size = 4 + 12 * len(tags)
    offset = 128 + table_size
    entries, blobs = [], []
    for signature, data in tags:
        data += b"\0" * (-len(data) % 4)
        entries.append(struct.pack(">4sII", signature, offset, len(data)))
        blobs.append(data)
        offset += len(data)
    header = bytearray(128)
    struct.pack_into(">I", header, 0, offset)
    header[8:12] = b"\x02\x10\0\0"
    header[12:16], header[16:20], header[20:24] = device_class, space, pcs
    struct.pack_into(">6H", header, 24, 2024, 1, 1, 0, 0, 0)
    header[36:40] = b"acsp"
    header[68:80] = b"".join(_s15(v) for v in D50)
    return bytes(header) + struct.pack(">I", len(tags)) + b"".join(entries) + b"".join(blobs)


def rgb_profile(definition: dict, name: str) -> bytes:
    """A matrix/TRC display profile (as phones and cameras embed)."""
    matrix = rgb_to_xyz_d50(definition["primaries"])
    trc = _trc_tag(definition["trc"])
    return _assemble(
        b"mntr",
        b"RGB ",
        b"XYZ ",
        [
            (b"desc", _desc_tag(name)),
            (b"wtpt", _xyz_tag(D50)),
            (b"rXYZ", _xyz_tag(matrix[:, 0])),
            (b"gXYZ", _xyz_tag(matrix[:, 1])),
            (b"bXYZ", _xyz_tag(matrix[:, 2])),
            (b"rTRC", trc),
            (b"gTRC", trc),
            (b"bTRC", trc),
            (b"cprt", b"text\0\0\0\0test\0"),
        ],
    )


def srgb_decode(values: np.ndarray) -> np.ndarray:
    """sRGB-encoded 0..1 -> linear light."""
    return np.where(values <= 0.04045, values / 12.92, ((values + 0.055) / 1.055) ** 2.4)


def ink_model_rgb(cmyk: np.ndarray) -> np.ndarray:
    """The test CMYK profile's ink model: ink fractions -> sRGB 0..1.

    Deliberately unlike Pillow's naive ``255 - C - K`` conversion, so a test
    can tell whether the profile was applied.
    """
    c, m, y, k = np.moveaxis(cmyk, -1, 0)
    return np.stack([(1 - c) ** 2 * (1 - k), (1 - m) ** 2 * (1 - k), (1 - y) ** 2 * (1 - k)], -1)


def ink_model_cmyk(rgb: np.ndarray) -> np.ndarray:
    """The inverse of :func:`ink_model_rgb` with no black ink: sRGB 0..1 -> CMYK fractions."""
    cmy = 1 - np.sqrt(rgb)
    return np.concatenate([cmy, np.zeros(rgb.shape[:-1] + (1,))], axis=-1)


def _lab_d50(rgb: np.ndarray) -> np.ndarray:
    xyz = srgb_decode(rgb) @ rgb_to_xyz_d50(SRGB["primaries"]).T / D50
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack(
        [116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1
    )


def cmyk_profile(grid: int = 9) -> bytes:
    """A CMYK output-device profile whose A2B0 table follows :func:`ink_model_rgb`."""
    axis = np.linspace(0.0, 1.0, grid)
    nodes = np.stack(np.meshgrid(axis, axis, axis, axis, indexing="ij"), -1).reshape(-1, 4)
    lab = _lab_d50(ink_model_rgb(nodes))
    encoded = np.stack([lab[:, 0] * 255 / 100, lab[:, 1] + 128, lab[:, 2] + 128], -1)
    clut = np.clip(np.round(encoded), 0, 255).astype(np.uint8).tobytes()
    identity = bytes(range(256))
    matrix = b"".join(_s15(v) for v in (1, 0, 0, 0, 1, 0, 0, 0, 1))
    lut = b"mft1\0\0\0\0" + bytes([4, 3, grid, 0]) + matrix + identity * 4 + clut + identity * 3
    return _assemble(
        b"prtr",
        b"CMYK",
        b"Lab ",
        [(b"desc", _desc_tag("test ink model")), (b"wtpt", _xyz_tag(D50)), (b"A2B0", lut)],
    )


def with_icc_segment(jpeg: bytes, icc: bytes) -> bytes:
    """``jpeg`` with ``icc`` embedded as one APP2 ICC_PROFILE segment after SOI."""
    payload = b"ICC_PROFILE\0\x01\x01" + icc
    return jpeg[:2] + b"\xff\xe2" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]

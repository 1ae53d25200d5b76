"""imagerecords/codec.py: the TFRecord frame and its checks, and what importing it loads.

Every reader of the framing (the converter's spill files, --reuse, --verify,
reader.inspect, RecordSource) relies on these checks; TensorFlow parsing the
converter's shards is tested elsewhere (tests/test_reader_pinned.py).
"""

import io
import os
import struct
import subprocess
import sys

import pytest

from imagerecords import codec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = b"an Example's bytes"
FRAMED = codec.frame_record(DATA)


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def tfrecord_mask(crc: int) -> int:
    """TensorFlow's crc32c::Mask (tensorflow/core/lib/hash/crc32c.h)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def test_masked_crc_of_the_crc32c_check_value():
    # 0xE3069283: CRC32C of "123456789" (RFC 3720, the Castagnoli check value).
    assert codec.masked_crc(b"123456789") == tfrecord_mask(0xE3069283)


def test_a_frame_is_length_its_crc_data_its_crc():
    assert len(FRAMED) == len(DATA) + codec.FRAME_OVERHEAD
    assert FRAMED[:8] == struct.pack("<Q", len(DATA))
    assert FRAMED[8:12] == struct.pack("<I", codec.masked_crc(FRAMED[:8]))
    assert FRAMED[12:-4] == DATA == codec.payload(FRAMED)
    assert FRAMED[-4:] == struct.pack("<I", codec.masked_crc(DATA))
    assert codec.stated_length(FRAMED[: codec.FRAME_HEAD]) == len(DATA)


@pytest.mark.parametrize(
    "framed, intact",
    [
        (FRAMED, True),
        (codec.frame_record(b""), True),
        (FRAMED[:-1], False),  # cut short
        (FRAMED + b"\0", False),  # a byte past the frame
        (FRAMED[:15], False),  # shorter than any frame
        (flip(FRAMED, 0), False),  # the length changed
        (flip(FRAMED, 9), False),  # the length's CRC changed
        (flip(FRAMED, 14), False),  # the data changed
        (flip(FRAMED, len(FRAMED) - 1), False),  # the data's CRC changed
    ],
)
def test_is_intact(framed, intact):
    assert codec.is_intact(framed) is intact


def test_the_header_and_the_data_checks_each_see_their_own_damage():
    head, data, foot = FRAMED[:12], FRAMED[12:-4], FRAMED[-4:]
    assert codec.header_intact(head) and codec.data_intact(data, foot)
    assert not codec.header_intact(flip(head, 3))
    assert not codec.header_intact(flip(head, 10))
    assert not codec.header_intact(head[:11])
    assert codec.data_intact(data, foot) and not codec.data_intact(flip(data, 0), foot)
    assert not codec.data_intact(data, foot[:3])


@pytest.mark.parametrize(
    "stream, max_length, error",
    [
        (FRAMED[:5], None, "truncated TFRecord header"),
        (flip(FRAMED, 2), None, "length CRC mismatch"),
        (FRAMED, 4, f"length {len(DATA)} over 4"),
        (FRAMED[:-2], None, "truncated TFRecord$"),
        (flip(FRAMED, 13), None, "data CRC mismatch"),
    ],
)
def test_read_frame_names_the_damage(stream, max_length, error):
    with pytest.raises(codec.DamagedRecord, match=error):
        codec.read_frame(io.BytesIO(stream), max_length)


def test_read_frame_reads_frames_in_turn_then_none():
    stream = io.BytesIO(FRAMED + codec.frame_record(b"") + codec.frame_record(b"2"))
    assert list(codec.iter_records(stream)) == [DATA, b"", b"2"]
    assert codec.read_frame(stream) is None


@pytest.mark.e2e
def test_importing_the_codec_loads_no_crc_library_tensorflow_or_beam_before_a_crc():
    # The reader imports the codec for the file names: a tf.data job never needs
    # google_crc32c, and the bottom package loads nothing of the packages above it.
    code = (
        "import sys\n"
        "import imagerecords.codec as codec\n"
        "names = ('google_crc32c', 'tensorflow', 'apache_beam', 'beam_pipeline', 'reader')\n"
        "print(sorted(n for n in names if n in sys.modules))\n"
        "codec.masked_crc(b'x')\n"
        "print('google_crc32c' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO
    )
    assert out.stdout.split("\n")[:2] == ["[]", "True"]

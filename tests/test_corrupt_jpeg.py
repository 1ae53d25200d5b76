"""Corrupt JPEG data never reaches a record: rejected, or repaired when only extra bytes."""

import io

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from beam_pipeline.core import images, jpeg
from tests.image_factory import jpeg_bytes, photo

# The default spec at a size these photos already have: clean ones pass through.
SPEC = images.ImageSpec(resize="shorter", size=240)


@pytest.fixture(scope="module")
def clean() -> bytes:
    return jpeg_bytes(photo(320, 240, seed=3), quality=90)


def _strictly_clean(data: bytes) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, strict=True)  # raises on any libjpeg warning


def _reason(data: bytes) -> str:
    with pytest.raises(images.Rejected) as caught:
        images.convert(data, SPEC)
    return str(caught.value)


def test_a_clean_jpeg_of_the_right_size_passes_through(clean):
    converted = images.convert(clean, SPEC)
    assert converted.passed_through and converted.jpeg == clean


def _flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x10]) + data[position + 1 :]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d[: len(d) // 2] + b"\xff\xd9", "premature end of data segment"),
        (lambda d: _flip(d, 1056), "premature end of data segment"),
        (lambda d: _flip(d, 7090), "bad Huffman code"),
        # This flip desynchronises the Huffman decoder: it ends early and
        # libjpeg calls the rest "extraneous bytes", but they are image data.
        (lambda d: _flip(d, 2029), "extraneous bytes"),
    ],
    ids=["cut-with-eoi", "flip-hits-marker", "flip-bad-code", "flip-desync"],
)
def test_damaged_image_data_that_pillow_accepts_is_rejected(clean, damage, message):
    damaged = damage(clean)
    Image.open(io.BytesIO(damaged)).load()  # Pillow alone fills in made-up pixels
    reason = _reason(damaged)
    assert reason.startswith("corrupt image data: ") and message in reason


def test_a_cut_jpeg_is_rejected_as_missing_data(clean):
    reason = _reason(clean[: len(clean) // 2])
    assert reason == "corrupt image data: Premature end of JPEG file"


def test_padding_before_the_end_marker_is_repaired(clean):
    padded = clean[:-2] + b"\x00" * 240 + clean[-2:]
    with pytest.raises(ValueError, match=r"\d+ extraneous bytes before marker 0xd9"):
        _strictly_clean(padded)
    converted = images.convert(padded, SPEC)
    assert converted.repaired and not converted.passed_through
    out = _strictly_clean(converted.jpeg)
    diff = np.abs(out.astype(float) - _strictly_clean(clean).astype(float)).mean()
    assert diff < 3  # the same picture, re-encoded once


def test_junk_between_header_segments_is_repaired(clean):
    table = clean.index(b"\xff\xdb")
    junked = clean[:table] + b"JUNK" + clean[table:]
    converted = images.convert(junked, SPEC)
    assert converted.repaired
    _strictly_clean(converted.jpeg)


def test_junk_in_the_header_does_not_hide_damage_behind_it(clean):
    table = clean.index(b"\xff\xdb")
    cut = clean[: len(clean) // 2] + b"\xff\xd9"
    both = cut[:table] + b"JUNK" + cut[table:]
    assert "premature end of data segment" in _reason(both)


def test_a_stalling_progressive_jpeg_is_refused_by_its_scan_count():
    progressive = jpeg_bytes(photo(320, 240, seed=3), quality=90, progressive=True)
    scans = progressive.count(b"\xff\xda")
    assert 1 < scans <= jpeg.MAX_SCANS  # a normal progressive JPEG passes
    assert images.convert(progressive, images.ImageSpec())
    many = progressive[:-2] + b"\xff\xda" * (jpeg.MAX_SCANS + 1 - scans) + progressive[-2:]
    assert "scans" in _reason(many)


def test_a_baseline_jpeg_with_many_scan_markers_is_rejected_as_corrupt(clean):
    """Scans are counted for progressive JPEGs only; a baseline one is read once anyway
    (the decoder's speed on it is libjpeg-turbo's business, not asserted here)."""
    many = clean[:-2] + b"\xff\xda" * (jpeg.MAX_SCANS * 20) + clean[-2:]
    reason = _reason(many)
    assert reason.startswith("corrupt image"), reason
    assert "scans" not in reason


def test_draft_size_matches_pillow_draft():
    for width, height, request in [
        (4000, 3000, (256, 192)),
        (640, 480, (300, 225)),
        (99, 77, (1, 1)),
    ]:
        image = Image.open(io.BytesIO(jpeg_bytes(photo(width, height, seed=1))))
        image.draft("RGB", request)
        assert jpeg.draft_size(width, height, request) == image.size


def test_a_colour_jpeg_decodes_to_rgb_sharing_the_decoders_buffer(clean):
    # jpeg._rgb_sharing: the RGB image is the RGBX buffer itself, with the
    # same pixels as Pillow's own decode, and resizes to the same bytes.
    source = Image.open(io.BytesIO(clean))
    decoded = jpeg.decode(clean, source).image
    pillow = Image.open(io.BytesIO(clean)).convert("RGB")
    assert decoded.mode == "RGB" and decoded.tobytes() == pillow.tobytes()
    resized = (100, 75)
    assert (
        decoded.resize(resized, Image.BICUBIC, reducing_gap=3.0).tobytes()
        == pillow.resize(resized, Image.BICUBIC, reducing_gap=3.0).tobytes()
    )
    pixels = simplejpeg.decode_jpeg(clean, "RGBX")
    shared = jpeg._rgb_sharing(pixels)
    pixels[0, 0, :3] = (1, 2, 3)  # a copy would not see this
    assert shared.getpixel((0, 0)) == (1, 2, 3)


def test_a_pillow_that_refuses_the_mapping_gets_a_copy(clean, monkeypatch):
    pixels = simplejpeg.decode_jpeg(clean, "RGBX")
    expected = jpeg._rgb_sharing(pixels).tobytes()

    def refuse(*args):
        raise ValueError("unknown raw mode")

    monkeypatch.setattr(jpeg.Image.core, "map_buffer", refuse)
    copied = jpeg._rgb_sharing(pixels)
    assert copied.mode == "RGB" and copied.tobytes() == expected
    pixels[0, 0, :3] = (1, 2, 3)
    assert copied.getpixel((0, 0)) != (1, 2, 3)  # a copy, not the buffer


@pytest.mark.e2e
def test_fuzzed_corpus_every_file_accounted_for_and_no_record_makes_tf_warn(tmp_path, capfd):
    from beam_pipeline.__main__ import main
    from tests import contract
    from tests.fuzz_corpus import write_corpus

    root, out = tmp_path / "fuzzed", tmp_path / "out"
    ids = write_corpus(str(root), 150, seed=7)
    argv = ["--input", str(root), "--output", str(out), "--quiet", "--max_reject_fraction", "1"]
    assert main([*argv, "--image_size", "240", "--direct_running_mode=in_memory"]) == 0
    capfd.readouterr()
    rows = [r for split in contract.check_output(str(out)).values() for r in split]
    # check_output decoded every record with tf.io.decode_jpeg; libjpeg prints
    # its warnings ("Corrupt JPEG data: ...") straight to file descriptor 2.
    stderr = capfd.readouterr().err
    assert "Corrupt JPEG" not in stderr and "Premature end" not in stderr, stderr
    rejects = contract.read_rejects(str(out))
    assert sorted(contract.ids(rows) + [r["id"] for r in rejects]) == sorted(ids)
    reasons = [r["reason"] for r in rejects]
    assert any(r.startswith("corrupt image data: ") for r in reasons)
    clean = [i for i in ids if "-clean." in i]
    assert set(clean) <= set(contract.ids(rows))  # undamaged files all become records

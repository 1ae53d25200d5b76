"""Distinct low-texture pictures are never near copies: the texture flag, the pair
rule, and a real conversion with --dedupe near on both engines."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.features.near import hashes as near_duplicates
from beam_pipeline.features.near import search as near_search
from beam_pipeline.features.near import stage as near
from bench.near import texture
from tests import contract

CASES = texture.cases()
PRINTS = {name: near_duplicates.fingerprint(img) for name, img in CASES.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_low_texture_picture_has_no_texture_flag(name):
    assert not near_duplicates.textured(PRINTS[name])
    assert not near_search.searched(near_search.pack(PRINTS[name]))


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(sorted(CASES), 2)))
def test_no_two_low_texture_pictures_pair(a, b):
    assert near_duplicates.verify(PRINTS[a], PRINTS[b]) is None


def test_the_hash_alone_would_pair_them():
    # What the texture flag guards against: without it, most of these pairs verify
    # (white, grey and a gradient at distance 0; the two pages; square and circle).
    pairs = {(a, b) for a, b, _ in texture.measure(CASES)["hash_pairs"]}
    assert len(pairs) > 40
    for pair in [
        ("pattern/grey.png", "pattern/gradient_left_to_right.png"),
        ("documents/invoice.png", "documents/letter.png"),
        ("documents/blank_page.png", "shapes/white.png"),
        ("shapes/black_circle.png", "shapes/black_square.png"),
    ]:
        assert pair in pairs or pair[::-1] in pairs


def test_the_search_leaves_them_out_and_counts_them(tmp_path):
    from beam_pipeline.core.elements import RecordBatch, ShardEntry

    entries = tuple(
        ShardEntry(0, name, 0, 0, b"", near=near_search.pack(fp))
        for name, fp in sorted(PRINTS.items())
    )
    found = near.find_local([RecordBatch("train", entries)], str(tmp_path))
    assert found == near.Found([], [], len(CASES))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("texture") / "images"
    for name, img in CASES.items():
        os.makedirs(root / os.path.dirname(name), exist_ok=True)
        img.save(root / name)
    return str(root)


@pytest.mark.e2e
@pytest.mark.parametrize("runner", ["local", "DirectRunner"])
def test_dedupe_near_drops_none_of_them(folder, tmp_path, capsys, runner):
    out = str(tmp_path / "out")
    extra = [] if runner == "local" else ["--runner", runner]
    assert main(["--input", folder, "--output", out, "--dedupe", "near", *extra]) == 0
    assert contract.read_rejects(out) == []
    with open(os.path.join(out, near_search.NEAR_FILE)) as f:
        assert f.read() == ""
    block = contract.load_info(out)["near_duplicates"]
    assert block["groups"] == 0 and block["untextured"] == len(CASES)
    assert (
        f"near duplicates: {len(CASES)} images have too little texture" in capsys.readouterr().out
    )
    assert json.loads(json.dumps(block))["scheme"] == near_search.SCHEME


def _hubble_tile(x: int, y: int):
    pytest.importorskip("skimage")
    from PIL import Image

    from bench.common import data

    with Image.open(data.skimage_data_dir() / "hubble_deep_field.jpg") as im:
        tile = im.convert("RGB").crop((x, y, x + 128, y + 128))
    return tile.resize((256, 256), Image.Resampling.BICUBIC)  # the size a conversion stores


def test_two_look_alike_photos_meeting_under_one_pairing_alone_do_not_pair():
    # Two tiles of a starfield (the calibration set's one false pair at the
    # threshold): one pairing of their hashes at 6, the next at 12.
    a, b = (near_duplicates.fingerprint(_hubble_tile(*at)) for at in ((384, 0), (640, 512)))
    assert near_duplicates.textured(a) and near_duplicates.textured(b)
    assert near_duplicates.distance(a, b) <= near_duplicates.THRESHOLD
    assert near_duplicates.support(a, b) > near_duplicates.SUPPORT
    assert near_duplicates.verify(a, b) is None
    # A copy is close under its neighbouring windows too: cropped and brightened.
    from PIL import ImageEnhance

    original = _hubble_tile(384, 0)
    copy = ImageEnhance.Brightness(original.crop((10, 6, 246, 250))).enhance(1.08)
    c = near_duplicates.fingerprint(copy)
    assert near_duplicates.support(a, c) <= near_duplicates.SUPPORT
    assert near_duplicates.verify(a, c) is not None


@pytest.mark.parametrize(
    ("levels", "blank"),
    [
        ([255] * 100, True),  # flat
        ([255] * 94 + [0] * 6, True),  # a few lines of text: 94% background
        ([255] * 92 + [0] * 8, False),
        ([250, 251, 252, 253, 254] * 20, True),  # noise within 2 levels of the median
        (list(range(100)), False),  # a ramp
    ],
)
def test_blank_is_the_share_within_two_levels_of_the_median(levels, blank):
    from beam_pipeline.features.near import texture as near_texture

    grey = np.array(levels, dtype=np.float64) * 1000  # thousandths, as the base's
    assert near_texture.blank(grey) is blank


@pytest.mark.parametrize(
    ("amplitudes", "textured"),
    [
        ([0.0] * 63, False),  # flat
        ([40.0] * 4 + [0.0] * 59, False),  # a gradient: a few strong, the rest at the median
        ([3.0] * 63, True),  # energy 23.8, every coefficient away from the median (0)
        ([1.0] * 63, False),  # steady, but energy 7.9 < 10
        ([2.0] * 30 + [0.1] * 33, True),  # 30 steady, energy 11
        ([2.0] * 20 + [0.1] * 43, False),  # 20 steady < 24
    ],
)
def test_the_texture_test_needs_energy_and_steady_coefficients(amplitudes, textured):
    from beam_pipeline.features.near import texture as near_texture

    level = 1000.0 * 2**22 * 256  # one grey level in the products' units
    signs = np.resize([1.0, -1.0], 63)
    ac = np.round(np.array(amplitudes) * signs * level)
    assert near_texture.passes(ac, 0.0, level) is textured

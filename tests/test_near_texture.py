"""Distinct low-texture pictures are never near copies: the texture flag, the pair
rule, and a real conversion with --dedupe near on both engines."""

from __future__ import annotations

import itertools
import json
import os

import pytest

from beam_pipeline.__main__ import main
from beam_pipeline.core import near_duplicates, near_search
from beam_pipeline.stages import near
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

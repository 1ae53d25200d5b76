"""Near duplicates in the conversion: the fingerprint in every record, the search on
every engine, after a resume and a --reuse, the report, and --dedupe near."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re

import numpy as np
import pytest
from PIL import Image

from beam_pipeline.__main__ import main
from beam_pipeline.core import counters, images, metadata, spill
from beam_pipeline.core.elements import RecordBatch, ShardEntry
from beam_pipeline.features.dedupe.duplicates import Member
from beam_pipeline.features.near import hashes as near_duplicates
from beam_pipeline.features.near import search as near_search
from beam_pipeline.features.near import stage as near
from beam_pipeline.features.near.feature import PIXELS
from imagerecords import codec
from tests import contract

pytest.importorskip("skimage")
from tests import near_fixtures  # noqa: E402  (needs skimage's photos)

# ------------------------------------------------------------------ pure parts


def _fingerprint(seed: int) -> near_duplicates.Fingerprint:
    hashes = tuple(
        int.from_bytes(hashlib.sha256(f"{seed}-{n}".encode()).digest()[:8], "big")
        for n in range(19)
    )
    return near_duplicates.Fingerprint(hashes, (85, 85, 85))


def test_a_fingerprint_packs_into_the_two_features_and_back():
    fp = _fingerprint(1)
    packed = near_search.pack(fp)
    phash, colour = near_search.features(packed)
    assert (len(phash), len(colour)) == (152, 3)
    assert phash[:8] == fp.hashes[0].to_bytes(8, "big")
    assert near_search.unpack(packed) == fp


@pytest.mark.parametrize(
    "members, kept",
    [
        ([("b", "val"), ("a", "test"), ("c", "train")], "c"),  # train first, whatever the ID
        ([("b", "test"), ("c", "val")], "c"),  # val before test
        ([("b", "train"), ("a", "train")], "a"),  # then the smallest ID
        ([("b", "extra"), ("a", "zzz"), ("c", "test")], "c"),  # other splits last, by name
    ],
)
def test_dedupe_near_keeps_the_first_split_then_the_smallest_id(members, kept):
    found = [Member(image_id, split, 0) for image_id, split in members]
    assert near_search.keeper(found).image_id == kept


def test_an_oversized_bucket_is_reported_not_paired():
    # One hash shared by thousands, with the texture flag (a flat image's lacks
    # it and is never searched: a crowd like this is rare, but possible).
    one = near_duplicates.TEXTURE_BIT
    flat = near_search.pack(near_duplicates.Fingerprint((one,) * 19, (85, 85, 85)))
    key = 0  # the hash's key in band 0 (its low 27 bits), probed and filed under
    entries = [
        near_search.Entry(Member(f"{n:05d}", "train", 0), probe, flat)
        for n in range(near_search.MAX_BUCKET + 1)
        for probe in (False, True)
    ]
    images = near_search.MAX_BUCKET + 1  # each image twice: a probe and a home
    assert near_search.bucket(key, entries) == near_search.Oversized(key, images)
    assert len(near_search.bucket(key, entries[:6])) == 3  # a small one: every pair at distance 0
    # No probe looks the key up, or no hash has it: nothing to pair, at any
    # size, and nothing reported.
    for probe in (False, True):
        alone = [e._replace(probe=probe) for e in entries]
        assert near_search.bucket(key, alone) == [] and near_search.bucket(key, alone[:6]) == []


def _batches(prints: dict[str, tuple[str, bytes]]) -> list[RecordBatch]:
    by_split: dict[str, list[ShardEntry]] = {}
    for image_id, (split, packed) in sorted(prints.items()):
        entry = ShardEntry(0, image_id, 0, 0, b"", near=packed)
        by_split.setdefault(split, []).append(entry)
    return [RecordBatch(split, tuple(entries)) for split, entries in by_split.items()]


def _near_prints() -> dict[str, tuple[str, bytes]]:
    """Fingerprints of the fixture's photos and copies, by ID, and many flat images."""
    prints = {}
    for name, where, copies in near_fixtures.PHOTOS:
        photo = near_fixtures._photo(name)
        prints[f"{where}/{name}"] = (where.split("/")[0], near_search.pack(_fp(photo)))
        for copy_where, kind in copies:
            copy = near_fixtures.COPIES[kind][0](photo)
            prints[f"{copy_where}/{kind}-{name}"] = (copy_where.split("/")[0], _pack(copy))
    # Flat images of many tints: one hash, each its own fingerprint (the colour),
    # given the texture flag a flat image lacks, so that the search takes them
    # (a crowd of one textured hash: rare, but the bucket limit must hold).
    hashes = _fp(Image.new("RGB", (64, 64), (90, 90, 90))).hashes
    hashes = (hashes[0] | near_duplicates.TEXTURE_BIT, *hashes[1:])
    for n in range(near_search.MAX_BUCKET + 1):
        tint = (40 + n % 70, 40 + n // 70, 90)
        prints[f"flat/{n:05d}"] = (
            "train",
            near_search.pack(near_duplicates.Fingerprint(hashes, tint)),
        )
    return prints


def _fp(image):
    return near_duplicates.fingerprint(image)


def _pack(image) -> bytes:
    return near_search.pack(_fp(image))


def _assert_the_beam_graph_finds(batches: list[RecordBatch], local: near.Found) -> None:
    """The Beam graph (DirectRunner) over ``batches`` gives the local search's ``local``."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from beam_pipeline.features.near.beam import FindNearDuplicates

    def same(found):
        assert list(found) == [local], found

    with beam.Pipeline("DirectRunner") as pipeline:
        made = pipeline | beam.Create(batches, reshuffle=False)
        found = made | FindNearDuplicates(dedupe_near=False)
        assert_that(found["found"], same)


def test_the_local_search_in_partitions_finds_what_the_beam_graph_finds(tmp_path):
    batches = _batches(_near_prints())
    local = near.find_local(batches, str(tmp_path / "work"))
    assert os.listdir(tmp_path / "work") == []  # the run files are gone
    groups = [[m.image_id for m in g.members] for g in local.groups]
    assert len(groups) == 4 and all(not g[0].startswith("flat/") for g in groups)
    # The flat images share every band key: each bucket their whole hash probes
    # and a hash of theirs is filed under reported, none paired.
    flat = near_search.unpack(_pack(Image.new("RGB", (64, 64), (90, 90, 90))))
    flat = flat._replace(hashes=(flat.hashes[0] | near_duplicates.TEXTURE_BIT, *flat.hashes[1:]))
    homes = {key for key, _ in near_duplicates.band_keys(flat)}
    assert len(local.oversized) == len(homes & set(near_duplicates.probe_keys(flat)))
    # (a real photo may share one band with them: a bucket of one more)
    assert all(o.images > near_search.MAX_BUCKET for o in local.oversized)
    _assert_the_beam_graph_finds(batches, local)


# ------------------------------------------------------------ the conversion


def test_a_stored_jpeg_is_hashed_as_its_pass_through_was():
    photo = near_fixtures._photo("coffee.png").resize((200, 133))
    buffer = io.BytesIO()
    photo.save(buffer, "JPEG", quality=90)
    data = buffer.getvalue()
    stored = images.convert(data, images.ImageSpec(pixels=PIXELS))
    assert stored.passed_through and stored.jpeg == data
    assert stored.near == images.near_of_stored(data, PIXELS)
    # A re-encoded image is hashed before its encode, of the pixels it stores.
    resized = images.convert(data, images.ImageSpec(size=100, pixels=PIXELS))
    assert not resized.passed_through and len(resized.near) == 155
    decoded = Image.open(io.BytesIO(resized.jpeg))
    assert (
        near_duplicates.distance(near_search.unpack(resized.near), _fp(decoded))
        <= near_duplicates.THRESHOLD
    )


def test_a_spilled_record_keeps_its_fingerprint(tmp_path):
    packed = near_search.pack(_fingerprint(3))
    entry = spill.encode(
        spill.RECORD, "train", "a/x.jpg", 5, 0, codec.frame_record(b"x"), "", "ab" * 32, packed
    )
    path = tmp_path / "one.spill"
    path.write_bytes(entry)
    (item,) = spill.scan(str(path))
    assert item.near == packed
    index = spill.Index([str(path)])
    assert index["a/x.jpg"].near == packed and index["a/x.jpg"].sha256 == "ab" * 32


def test_a_format_2_dataset_still_reads(tmp_path):
    import reader
    from imagerecords import RecordSource
    from tests.shard_fixtures import write_dataset

    for version in (2, 3):
        write_dataset(tmp_path / f"v{version}", per_class=3, format_version=version)
        info = reader.load_info(tmp_path / f"v{version}")
        assert info.format_version == version
        record = RecordSource(str(tmp_path / f"v{version}"), "train")[0]
        assert record["image"][:2] == b"\xff\xd8" and "image/near/phash" not in record


def _records(out) -> list[dict]:
    rows = []
    for name in sorted(os.listdir(out)):
        if name.endswith(".tfrecord"):
            with open(os.path.join(out, name), "rb") as f:
                rows += [codec.parse_example(data) for data in codec.iter_records(f)]
    return rows


def _counted(text: str) -> dict[str, int]:
    line = next(line for line in text.splitlines() if line.startswith("counters: "))
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return near_fixtures.near_folder(str(tmp_path_factory.mktemp("near") / "images"))


def _convert(folder, out, *extra) -> int:
    return main(["--input", folder, "--output", str(out), *extra])


@pytest.mark.e2e
def test_the_local_engine_pairs_the_near_copies_across_splits(folder, tmp_path, capsys):
    assert _convert(folder, tmp_path / "out") == 0
    counted = _counted(capsys.readouterr().out)
    assert counted[counters.NEAR_HASHED] == near_fixtures.IMAGES
    assert near_fixtures.near_groups(tmp_path / "out") == near_fixtures.GROUPS
    block = contract.load_info(str(tmp_path / "out"))["near_duplicates"]
    assert block["groups"] == 4 and block["cross_split"] == 3 and block["images"] == 9
    assert block["scheme"] == near_search.SCHEME and block["oversized_buckets"] == 0
    assert counted[counters.NEAR_PAIRS] == block["pairs"] == 6
    rows = [json.loads(line) for line in open(tmp_path / "out" / "near_duplicates.jsonl")]
    astronaut = rows[0]
    assert [p["a"] for p in astronaut["pairs"]][0] == "test/b/astronaut_crop.png"
    assert all(0 <= p["distance"] <= near_duplicates.THRESHOLD for p in astronaut["pairs"])
    # Every record holds its fingerprint, as the format says.
    records = _records(tmp_path / "out")
    assert len(records) == near_fixtures.IMAGES
    assert all(
        len(r["image/near/phash"]) == 152 and len(r["image/near/colour"]) == 3 for r in records
    )
    # inspect shows the block.
    from reader import inspect

    assert inspect.main([str(tmp_path / "out")]) == 0
    shown = capsys.readouterr().out
    assert "near duplicates: pairs 6, groups 4, images 9, cross-split 3" in shown


@pytest.mark.e2e
def test_directrunner_writes_the_local_engines_bytes_and_pairs(folder, tmp_path, capsys):
    assert _convert(folder, tmp_path / "local", "--quiet") == 0
    assert _convert(folder, tmp_path / "beam", "--quiet", "--runner", "DirectRunner") == 0
    assert (
        _convert(
            folder,
            tmp_path / "shuffle",
            "--quiet",
            "--runner",
            "DirectRunner",
            "--local_processes",
            "1",
        )
        == 0
    )
    local = contract.all_files(str(tmp_path / "local"))
    assert contract.all_files(str(tmp_path / "beam")) == local
    assert contract.all_files(str(tmp_path / "shuffle")) == local
    assert near_fixtures.near_groups(tmp_path / "beam") == near_fixtures.GROUPS


@pytest.mark.e2e
def test_a_resume_takes_the_fingerprints_from_the_spilled_records(tmp_path, capsys):
    folder = near_fixtures.near_folder(str(tmp_path / "images"), broken=True)
    # The broken file is one rejection of 12: over the limit, so Finalize stops
    # before imagerecords.json and the output is an unfinished run.
    assert _convert(folder, tmp_path / "out", "--max_reject_fraction", "0") != 0
    assert not (tmp_path / "out" / metadata.INFO_FILE).exists()
    capsys.readouterr()
    assert _convert(folder, tmp_path / "out", "--max_reject_fraction", "0.5") == 0
    counted = _counted(capsys.readouterr().out)
    assert counted[counters.RESUMED] == near_fixtures.IMAGES + 1
    assert counters.NEAR_HASHED not in counted  # none computed again
    assert near_fixtures.near_groups(tmp_path / "out") == near_fixtures.GROUPS
    assert _convert(folder, tmp_path / "fresh", "--max_reject_fraction", "0.5") == 0
    assert contract.all_files(str(tmp_path / "out")) == contract.all_files(str(tmp_path / "fresh"))


def _downgrade(old) -> None:
    """OLD as format 2 wrote it: records without the fingerprint, no near block or file."""
    info_path = old / metadata.INFO_FILE
    info = json.loads(info_path.read_text())
    for split in info["splits"].values():
        for shard in split["shards"]:
            path = old / shard["file"]
            with open(path, "rb") as f:
                records = [codec.parse_example(data) for data in codec.iter_records(f)]
            data = b"".join(
                codec.frame_record(
                    codec.make_example({k: v for k, v in r.items() if k not in codec.NEAR_FEATURES})
                )
                for r in records
            )
            path.write_bytes(data)
            shard["sha256"], shard["num_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
        split["num_bytes"] = sum(s["num_bytes"] for s in split["shards"])
    info["format_version"] = 2
    del info["near_duplicates"], info["image"]["near_scheme"]
    for key in codec.NEAR_FEATURES:
        del info["features"][key]
    info_path.write_text(metadata.dumps(info).decode())
    (old / codec.NEAR_DUPLICATES_FILE).unlink()


@pytest.mark.e2e
def test_reuse_takes_the_fingerprints_from_old_or_from_its_stored_jpegs(folder, tmp_path, capsys):
    assert _convert(folder, tmp_path / "old") == 0
    capsys.readouterr()
    assert _convert(folder, tmp_path / "new", "--reuse", str(tmp_path / "old")) == 0
    counted = _counted(capsys.readouterr().out)
    assert counted[counters.REUSED] == near_fixtures.IMAGES
    assert counters.NEAR_HASHED not in counted
    old, new = (contract.all_files(str(tmp_path / n)) for n in ("old", "new"))
    assert [name for name in old if old[name] != new[name]] == [metadata.INFO_FILE]
    # OLD of format 2: each record is hashed from its own stored JPEG, never the source.
    _downgrade(tmp_path / "old")
    assert _convert(folder, tmp_path / "from_v2", "--reuse", str(tmp_path / "old")) == 0
    counted = _counted(capsys.readouterr().out)
    assert counted[counters.REUSED] == counted[counters.NEAR_HASHED] == near_fixtures.IMAGES
    assert counters.CONVERTED not in counted
    records = _records(tmp_path / "from_v2")
    stored = {
        r["image/filename"].decode(): images.near_of_stored(r["image/encoded"], PIXELS)
        for r in records
    }
    assert [r["image/near/phash"] + r["image/near/colour"] for r in records] == [
        stored[r["image/filename"].decode()] for r in records
    ]
    # The groups are the search's over those fingerprints. They are the stored
    # JPEG's, not the pixels a conversion hashes before the encode, so a copy
    # can be a few bits further off: here the astronaut's crop, at distance 4
    # with a differing bit in every band, is not found.
    searched = near.find_local(
        _batches({i: (i.split("/")[0], packed) for i, packed in stored.items()}),
        str(tmp_path / "work"),
    )
    groups = near_fixtures.near_groups(tmp_path / "from_v2")
    assert groups == [[m.image_id for m in g.members] for g in searched.groups]
    assert len([g for g in groups if g in near_fixtures.GROUPS]) >= len(near_fixtures.GROUPS) - 1


@pytest.mark.e2e
def test_the_dry_run_says_a_format_2_olds_records_are_fingerprinted_not_relabelled(
    folder, tmp_path, capsys
):
    assert _convert(folder, tmp_path / "old") == 0
    _downgrade(tmp_path / "old")
    capsys.readouterr()
    argv = ["--reuse", str(tmp_path / "old"), "--dry_run"]
    assert _convert(folder, tmp_path / "new", *argv) == 0
    out = capsys.readouterr().out
    images = near_fixtures.IMAGES
    assert (
        f"reused {images} unchanged ({images} of format 2, fingerprinted from their stored JPEG)"
    ) in out
    assert "with a new label" not in out


@pytest.mark.e2e
def test_dedupe_near_keeps_the_train_member_of_each_group(folder, tmp_path, capsys):
    # 5 of 11 images are near drops: they count towards --max_reject_fraction.
    assert _convert(folder, tmp_path / "refused", "--dedupe", "near", "--quiet") != 0
    assert "too many rejected images: 5 of 11" in capsys.readouterr().err
    allow = ("--max_reject_fraction", "0.5")
    assert _convert(folder, tmp_path / "out", "--dedupe", "near", "--quiet", *allow) == 0
    out = str(tmp_path / "out")
    rejects = {r["id"]: r["reason"] for r in contract.read_rejects(out)}
    # Each group keeps its member in train (train/a before train/b for the rocket).
    assert rejects == {
        "test/b/astronaut_crop.png": "near duplicate of train/a/astronaut.jpg",
        "val/a/astronaut_small.jpg": "near duplicate of train/a/astronaut.jpg",
        "val/a/coffee_small.jpg": "near duplicate of train/a/coffee.jpg",
        "test/b/chelsea_crop.png": "near duplicate of train/b/chelsea.jpg",
        "train/b/rocket_q50.jpg": "near duplicate of train/a/rocket.jpg",
    }
    written = {r["image/filename"].decode() for r in _records(out)}
    assert len(written) == near_fixtures.IMAGES - len(rejects) and not written & set(rejects)
    info = contract.load_info(out)
    # The report describes the input.
    assert info["near_duplicates"]["groups"] == 4 and info["config"]["dedupe"] == "near"
    assert near_fixtures.near_groups(out) == near_fixtures.GROUPS
    beam = ("--runner", "DirectRunner")
    assert _convert(folder, tmp_path / "beam", "--dedupe", "near", "--quiet", *allow, *beam) == 0
    assert contract.all_files(str(tmp_path / "beam")) == contract.all_files(out)


def test_inspect_shows_the_near_block_and_the_groups_block():
    from reader import overview

    near_block = {
        "pairs": 6,
        "groups": 4,
        "images": 9,
        "cross_split": 3,
        "file": "n.jsonl",
        "scheme": "s-v1",
        "threshold": 6,
        "oversized_buckets": 2,
        "bucket_limit": 10,
    }
    assert overview.near_lines(near_block) == [
        "near duplicates: pairs 6, groups 4, images 9, cross-split 3 (see n.jsonl); "
        "scheme s-v1, threshold 6",
        "near duplicates: 2 band keys shared by more than 10 images were not paired "
        "(flat or blank images)",
    ]
    groups_block = {
        "group_by": "^([^/]+)_",
        "groups": 12,
        "by_split": {
            "train": {"groups": 10, "fraction": 0.8},
            "val": {"groups": 2, "fraction": 0.2},
        },
        "straddling": {"count": 1, "shown": {}},
        "lumpy": {"val": "its fraction 0.2 is off 0.1"},
    }
    assert overview.groups_lines(groups_block) == [
        "groups: 12 by ^([^/]+)_: train 10 (80.0% of images), val 2 (20.0% of images)",
        "groups: 1 span more than one split",
        "groups: val is lumpy: its fraction 0.2 is off 0.1",
    ]
    assert overview.near_lines(None) == overview.groups_lines(None) == []  # older datasets


def _crowded_prints(count: int) -> dict[str, tuple[str, bytes]]:
    """Fingerprints that share band keys often: a few base hashes with bits
    flipped, some pairs within the threshold, most not, over three splits."""
    rng = random.Random(11)
    bases = [rng.getrandbits(64) for _ in range(6)]
    prints = {}
    for n in range(count):
        hashes = []
        for _ in near_duplicates.WINDOWS:
            h = rng.choice(bases)
            for _ in range(rng.choice((0, 1, 2, 3, 8, 20))):
                h ^= 1 << rng.randrange(64)
            hashes.append(h)
        colour = tuple(80 + rng.randrange(20) for _ in "rgb")
        split = ("train", "val", "test")[n % 3]
        prints[f"{split}/{n:04d}"] = (
            split,
            near_search.pack(near_duplicates.Fingerprint(tuple(hashes), colour)),
        )
    return prints


def test_the_local_search_s_arrays_give_every_bucket_s_pairs(tmp_path):
    # The reference is near_search.bucket over each band key's entries (what
    # the Beam graph runs per GroupByKey bucket); buckets here hold up to a few
    # hundred images, many sharing more than one key.
    batches = _batches(_crowded_prints(600))
    by_print: dict[bytes, list] = {}
    for batch in batches:
        for packed, member in near.fingerprints(batch):
            by_print.setdefault(packed, []).append(member)
    buckets: dict[int, list[near_search.Entry]] = {}
    pairs, oversized = [], []
    for item in by_print.items():
        first, joined = near.twins(item)
        pairs += joined
        for key, entry in near.keyed(first):
            buckets.setdefault(key, []).append(entry)
    for key, entries in buckets.items():
        if len(entries) > 1:
            result = near_search.bucket(key, entries)
            if isinstance(result, near_search.Oversized):
                oversized.append(result)
            else:
                pairs += result
    # About half the random whole hashes lack the texture flag: left out, counted.
    untextured = sum(near.untextured(b) for b in batches)
    assert 200 < untextured < 400
    expected = near.found_of(pairs, oversized, untextured)
    assert sum(len(g.pairs) for g in expected.groups) > 100  # many verified, many more not
    assert near.find_local(batches, str(tmp_path)) == expected


def test_records_of_one_fingerprint_join_their_first_and_only_it_is_searched():
    packed = near_search.pack(near_duplicates.Fingerprint(tuple(range(19)), (85, 85, 85)))
    members = [Member(i, "train", 0) for i in ("c", "a", "b")]
    first, joined = near.twins((packed, members))
    assert first == (packed, Member("a", "train", 0))
    assert joined == [near_search.Pair(first[1], m, 0) for m in (members[2], members[0])]


def _twin_prints() -> dict[str, tuple[str, bytes]]:
    """Copies of one picture past the bucket limit (one fingerprint, other bytes),
    copies of another, and a near copy of the second."""
    prints = {}
    # A placeholder with texture (an untextured one is never searched).
    one = near_duplicates.TEXTURE_BIT | 0x5A5A
    blank = near_search.pack(near_duplicates.Fingerprint((one,) * 19, (85, 85, 85)))
    for n in range(near_search.MAX_BUCKET + 10):
        prints[f"{('train', 'val')[n % 2]}/blank{n:05d}"] = (("train", "val")[n % 2], blank)
    photo = near_fixtures._photo("astronaut.png")
    for n in range(5):
        prints[f"test/astronaut{n}"] = ("test", _pack(photo))
    small = photo.resize((photo.width // 2, photo.height // 2))
    prints["train/astronaut_small"] = ("train", _pack(small))
    return prints


def test_twins_make_one_group_a_pair_each_on_both_engines(tmp_path, monkeypatch):
    monkeypatch.setattr(near_search, "MAX_BUCKET", 40)  # a small limit, a small test
    batches = _batches(_twin_prints())
    local = near.find_local(batches, str(tmp_path / "work"))
    by_first = {g.members[0].image_id: g for g in local.groups}
    blanks = by_first["train/blank00000"]
    # Past the bucket limit, and still one group: each copy paired with the first once.
    assert len(blanks.members) == near_search.MAX_BUCKET + 10
    assert len(blanks.pairs) == len(blanks.members) - 1
    assert {p.distance for p in blanks.pairs} == {0}
    astronauts = by_first["test/astronaut0"]
    ids = [m.image_id for m in astronauts.members]
    assert ids == [f"test/astronaut{n}" for n in range(5)] + ["train/astronaut_small"]
    assert len(astronauts.pairs) == 4 + 1  # four copies to the first, the first to the near copy
    assert not local.oversized
    _assert_the_beam_graph_finds(batches, local)


def test_keys_only_windows_share_pair_nothing_and_are_not_reported_on_both_engines(
    tmp_path, monkeypatch
):
    # Images whose windows share one hash past the bucket limit, each whole hash
    # its own: the local engine never writes those window entries, and the Beam
    # graph's bucket of them pairs and reports nothing either.
    monkeypatch.setattr(near_search, "MAX_BUCKET", 40)
    rng = np.random.default_rng(5)
    prints = {}
    for n in range(60):
        whole = int(rng.integers(1, 2**63)) | 1 << 63
        fp = near_duplicates.Fingerprint((whole,) + (0x5A5A_5A5A_5A5A_5A5A,) * 18, (85, 85, 85))
        prints[f"train/{n:03d}"] = ("train", near_search.pack(fp))
    batches = _batches(prints)
    local = near.find_local(batches, str(tmp_path / "work"))
    assert local == near.Found([], [])
    _assert_the_beam_graph_finds(batches, local)


def test_the_local_search_refuses_fingerprints_of_two_widths(tmp_path):
    prints = _crowded_prints(4)
    split, packed = prints["val/0001"]
    prints["val/0001"] = (split, packed[8:])
    with pytest.raises(ValueError, match="val/0001: a fingerprint of 147 bytes among ones of 155"):
        near.find_local(_batches(prints), str(tmp_path))


_H = 0x0123_4567_89AB_CDEF | near_duplicates.TEXTURE_BIT


@pytest.mark.parametrize(
    "flipped, found",
    [
        # Six bits apart, every 27-bit band holding one at least (no exact key
        # in common), the bands at 43 and 53 only one: a one-flip probe meets.
        ((10, 20, 30, 35, 40, 50), True),
        # Seven: one pairing past the threshold, though a probe meets.
        ((10, 20, 25, 30, 35, 40, 50), False),
    ],
)
def test_both_engines_find_a_pair_that_shares_only_a_one_flip_key(tmp_path, flipped, found):
    grey = (85, 85, 85)
    other = _H ^ sum(1 << b for b in flipped)
    prints = {
        "train/a": ("train", near_search.pack(near_duplicates.Fingerprint((_H,), grey))),
        "test/b": ("test", near_search.pack(near_duplicates.Fingerprint((other,), grey))),
    }
    a, b = (near_search.unpack(p) for _, p in prints.values())
    assert not {k for k, _ in near_duplicates.band_keys(a)} & {
        k for k, _ in near_duplicates.band_keys(b)
    }
    batches = _batches(prints)
    local = near.find_local(batches, str(tmp_path))
    assert [[m.image_id for m in g.members] for g in local.groups] == (
        [["test/b", "train/a"]] if found else []
    )
    _assert_the_beam_graph_finds(batches, local)

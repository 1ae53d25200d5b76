"""The Beam transforms under TestPipeline + assert_that (in-process DirectRunner)."""

import json
import os

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipeline import images, keys, listing, pipeline, records
from tests.image_factory import add_bad_files, make_class_folders

SPLITS = {"train": 0.8, "val": 0.1, "test": 0.1}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("images"))
    ids = make_class_folders(root, per_class=8)
    bad = add_bad_files(root)
    os.makedirs(os.path.join(root, "dog", ".hidden"))
    with open(os.path.join(root, "dog", ".hidden", "x.jpg"), "wb") as f:
        f.write(b"skipped")
    with open(os.path.join(root, "dog", ".DS_Store"), "wb") as f:
        f.write(b"skipped")
    return root, ids, bad


def _config(root, output="/nonexistent", **kwargs):
    layout = listing.discover(root)
    return pipeline.JobConfig(layout=layout, output=output, splits=SPLITS, **kwargs)


def test_list_images_lists_every_visible_file_once_with_its_split(folder):
    root, ids, bad = folder
    config = _config(root)
    expected = [
        (i, config.layout.classes.index(i.split("/")[0]), keys.assign_split(42, i, SPLITS))
        for i in ids + list(bad)
    ]
    with BeamTestPipeline() as p:
        refs = (p | pipeline.ListImages(config))["refs"]
        got = refs | beam.Map(lambda r: (r.image_id, r.label, r.split))
        assert_that(got, equal_to(expected), label="EveryFileOnce")
        paths_ok = refs | beam.Map(lambda r: r.path == os.path.join(root, r.image_id))
        assert_that(paths_ok | beam.Distinct(), equal_to([True]), label="FullPaths")


def test_convert_images_splits_records_and_rejections(folder):
    root, ids, bad = folder
    config = _config(root)
    refs = [listing.ImageRef(i, os.path.join(root, i), 0, "train") for i in ids[:5] + list(bad)]
    refs.append(listing.ImageRef("gone.jpg", os.path.join(root, "gone.jpg"), 0, "train"))
    with BeamTestPipeline() as p:
        out = p | beam.Create(refs) | pipeline.ConvertImages(config)
        parsed = out.records | beam.Map(
            lambda r: (r.image_id, records.parse_example(r.payload)["image/filename"].decode())
        )
        assert_that(parsed, equal_to([(i, i) for i in ids[:5]]), label="Records")
        reasons = out[pipeline.REJECTED] | beam.Map(lambda r: (r.image_id, r.reason.split(":")[0]))
        assert_that(
            reasons,
            equal_to([(i, reason) for i, reason in bad.items()] + [("gone.jpg", "cannot read")]),
            label="Rejections",
        )


def _write(p, config, recs, refs, rejections=()):
    return {
        "records": p | "Records" >> beam.Create(recs),
        "listed": p | "Listed" >> beam.Create(refs),
        "rejected": p | "Rejected" >> beam.Create(list(rejections)),
    } | pipeline.WriteShards(config)


def _record(split, image_id, size=100):
    return pipeline.Record(split, keys.order_key(42, image_id), image_id, 0, b"x" * size)


def _run_write_shards(tmp_path, recs, **config_args):
    """Runs WriteShards, then Finalize's renaming; returns the placed shard infos."""
    layout = listing.Layout(kind="classes", root="/in", classes=("a",))
    out_dir = tmp_path / "out"
    config = pipeline.JobConfig(layout=layout, output=str(out_dir), splits=SPLITS, **config_args)
    refs = [listing.ImageRef(r.image_id, "/in/" + r.image_id, 0, r.split) for r in recs]
    infos_dir = tmp_path / "infos"
    infos_dir.mkdir()

    def keep(info):
        (infos_dir / f"{info['split']}-{info['range']}.json").write_text(json.dumps(info))

    with BeamTestPipeline() as p:
        out = _write(p, config, recs, refs)
        out.shards | beam.Map(keep)
        listed = out[pipeline.BOOKS] | beam.Map(lambda b: b[1]) | beam.CombineGlobally(sum)
        assert_that(listed, equal_to([len(recs)]), label="Listed")
        problems = out[pipeline.BOOKS] | beam.Map(lambda b: b[2]) | "P" >> beam.CombineGlobally(sum)
        assert_that(problems, equal_to([0]), label="Balanced")
    assert not [f for f in os.listdir(out_dir) if f.endswith(".tfrecord")], (
        "final name before Finalize"
    )
    infos = [json.loads(f.read_text()) for f in infos_dir.iterdir()]
    placed = pipeline._move_into_place(infos, str(out_dir))
    assert pipeline._move_into_place(infos, str(out_dir)) == placed  # a retried Finalize
    return out_dir, placed


def test_write_shards_sizes_by_target_and_never_writes_empty_shards(tmp_path):
    recs = [_record("train", f"t{i}") for i in range(50)] + [
        _record("val", f"v{i}") for i in range(3)
    ]
    # train: 50 * 116 bytes = 5800 -> 6 shards; val: 348 bytes -> 1 shard
    out_dir, placed = _run_write_shards(tmp_path, recs, target_shard_bytes=1000, min_shards=1)
    assert sorted(s["file"] for s in placed) == [
        keys.shard_filename("train", i, 6) for i in range(6)
    ] + ["val-00000-of-00001.tfrecord"]
    train = sorted(out_dir.glob("train-*.tfrecord"))
    read = [list(records.iter_records(open(f, "rb"))) for f in train]
    assert all(read), "an empty shard was written"
    assert sum(len(r) for r in read) == 50
    assert not list((out_dir / pipeline.TMP_DIR).glob("*")), "temp files left behind"


def test_write_shards_renumbers_around_empty_hash_ranges(tmp_path):
    recs = [_record("train", f"t{i}") for i in range(5)]  # 5 records, 64 hash ranges
    out_dir, placed = _run_write_shards(tmp_path, recs, target_shard_bytes=10**9, min_shards=64)
    shards = sorted(f for f in os.listdir(out_dir) if f.endswith(".tfrecord"))
    assert shards == [keys.shard_filename("train", i, len(shards)) for i in range(len(shards))]
    assert 1 <= len(shards) <= 5
    assert len({s["range"] for s in placed}) == len(shards)
    sizes = [len(list(records.iter_records(open(out_dir / f, "rb")))) for f in shards]
    assert sum(sizes) == 5 and min(sizes) > 0
    # Numbered by hash range: shard i holds smaller keys than shard i + 1.
    by_file = {s["file"]: s["range"] for s in placed}
    assert [by_file[f] for f in shards] == sorted(by_file.values())


@pytest.mark.parametrize(
    "kinds, expected",
    [
        (["listed", "record"], []),
        (["listed", "rejected"], []),
        (["listed"], ["lost"]),
        (["listed", "record", "record"], ["doubled"]),
        (["listed", "record", "rejected"], ["doubled"]),
        (["record"], ["not"]),
        (["listed", "listed", "record"], ["listed"]),
    ],
)
def test_balance_names_lost_and_doubled_ids(kinds, expected):
    entries = [(kind, 7, "cat/1.jpg", 0, b"") for kind in kinds]
    entries += [("listed", 9, "dog/2.jpg", 1, b""), ("record", 9, "dog/2.jpg", 1, b"x")]
    listed, count, problems = pipeline.balance(entries)
    assert listed == kinds.count("listed") + 1
    assert count == len(expected)
    assert [p.split(" ")[0] for p in problems] == expected
    assert all("cat/1.jpg" in p for p in problems)


def test_write_shards_checks_books_per_key_range(tmp_path):
    """A listed image that is neither written nor rejected is named; rejections balance."""
    layout = listing.Layout(kind="classes", root="/in", classes=("a",))
    config = pipeline.JobConfig(layout=layout, output=str(tmp_path), splits=SPLITS)
    recs = [_record("train", f"t{i}") for i in range(6)]
    refs = [listing.ImageRef(f"t{i}", f"/in/t{i}", 0, "train") for i in range(8)]
    refs.append(listing.ImageRef("v0", "/in/v0", 0, "val"))
    rejections = [
        pipeline.Rejection("t6", "/in/t6", "train", "corrupt"),
        pipeline.Rejection("v0", "/in/v0", "val", "x"),
    ]
    with BeamTestPipeline() as p:
        out = _write(p, config, recs, refs, rejections)
        problems = out[pipeline.BOOKS] | beam.FlatMap(lambda b: b[3])
        assert_that(problems, equal_to(["lost (neither written nor rejected): t7"]), label="Lost")
        ranges = out.shards | beam.Map(lambda s: (s["split"], s["num_examples"]))
        assert_that(ranges, equal_to([("train", 6)]), label="NoFileForRejectsOnly")


def test_image_spec_travels_with_config():
    spec = images.ImageSpec(resize="crop", size=64)
    layout = listing.Layout(kind="classes", root="/in", classes=("a",))
    assert (
        pipeline.JobConfig(layout=layout, output="/o", splits=SPLITS, image=spec).image.size == 64
    )


def test_local_files_for_converting_ahead_respect_both_bounds(folder):
    root, ids, bad = folder
    layout = listing.discover(root)
    everything = listing.local_files(layout, 10**6, 10**12)
    assert sorted(os.path.relpath(p, root) for p in everything) == sorted(ids + list(bad))
    assert len(listing.local_files(layout, 5, 10**12)) == 5
    sizes = [os.path.getsize(p) for p in everything]
    budget = sum(sizes[:3])
    assert listing.local_files(layout, 10**6, budget) == everything[:3]
